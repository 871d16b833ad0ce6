"""One way to name a model: size names, config files, checkpoints (ours and official)."""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch

from dfine_deploy.errors import CheckpointError, ConfigError, ModelError
from dfine_deploy.hub.loader import load_model, resolve_spec
from dfine_deploy.model.spec import SIZES

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "configs" / "quickstart" / "dfine_n_synthetic.yml"


@pytest.fixture(scope="module")
def trained_like(tmp_path_factory):
    """An N model at 320 px with 4 classes, saved as our training checkpoint and as a bare dict."""
    folder = tmp_path_factory.mktemp("ckpt")
    from dfine_deploy.model.families import build_model

    spec = SIZES["n"].with_classes(4).with_input_size(320, 320)
    torch.manual_seed(1)
    model = build_model(spec)
    ours = folder / "best.pth"
    torch.save(
        {
            "model": model.state_dict(),
            "ema": {"module": model.state_dict(), "updates": 1},
            "meta": {"model_spec": asdict(spec), "class_names": ["rectangle", "ellipse", "triangle", "ring"]},
        },
        ours,
    )
    bare = folder / "bare.pth"
    torch.save(model.state_dict(), bare)
    return spec, model.state_dict(), ours, bare


def test_size_name_warns_random_weights():
    with pytest.warns(UserWarning, match="random weights.*meaningless"):
        loaded = load_model("dfine-n", imgsz=(320, 320))
    assert loaded.spec == SIZES["n"].with_input_size(320, 320)
    assert loaded.random_weights and not loaded.model.training
    # 80 classes and no names: COCO's, with a note saying they were assumed
    assert loaded.class_names[:2] == ["person", "bicycle"] and len(loaded.class_names) == 80
    assert "assumed" in loaded.class_names_note
    assert loaded.name == "dfine-n"
    for alias in ("N", "dfine_n", "n"):
        assert resolve_spec(alias) == SIZES["n"]


def test_config_reference_builds_its_spec_and_names():
    with pytest.warns(UserWarning, match="random weights"):
        loaded = load_model(str(QUICKSTART))
    assert loaded.spec.size == "n" and loaded.spec.num_classes == 4
    assert loaded.spec.eval_spatial_size == (256, 256)
    assert loaded.class_names == ["rectangle", "ellipse", "triangle", "ring"]


def test_our_checkpoint_carries_spec_and_names(trained_like):
    spec, state, ours, _ = trained_like
    loaded = load_model(ours)
    assert loaded.spec == spec and not loaded.random_weights
    assert loaded.class_names == ["rectangle", "ellipse", "triangle", "ring"]
    for key, value in state.items():
        assert torch.equal(loaded.model.state_dict()[key], value), key
    images = torch.rand(1, 3, 256, 256)  # 320 tokens: enough for 300 queries
    with torch.inference_mode():
        results = loaded.postprocessor(loaded.model(images), torch.tensor([[640, 480]]))
    assert results[0]["boxes"].shape[-1] == 4 and int(results[0]["labels"].max()) < 4


def test_bare_checkpoint_is_recognised_from_shapes(trained_like):
    spec, _, _, bare = trained_like
    loaded = load_model(bare)
    assert loaded.spec == spec  # size, 4 classes and 320 px all read from the tensors
    assert loaded.class_names == [f"class_{i}" for i in range(4)]


def test_config_with_weights_and_overrides(trained_like):
    _, state, ours, _ = trained_like
    loaded = load_model(QUICKSTART, weights=ours, imgsz=(256, 384))
    assert loaded.spec.eval_spatial_size == (256, 384)
    assert loaded.report.kept_derived  # anchors made for 256x384, the rest loaded
    key = "decoder.enc_output.proj.weight"
    assert torch.equal(loaded.model.state_dict()[key], state[key])
    with pytest.warns(UserWarning, match="class heads re-initialised for 7 classes"):
        loaded = load_model(ours, num_classes=7)
    assert loaded.spec.num_classes == 7 and loaded.class_names[-1] == "class_6"


def test_clear_errors(tmp_path):
    with pytest.raises(ModelError, match="dfine-q: no model has this name; expected .*dfine-n.*yml.*pth"):
        load_model("dfine-q")
    with pytest.raises(CheckpointError, match="checkpoint not found: .*absent.pth"):
        load_model(tmp_path / "absent.pth")
    with pytest.raises(ConfigError, match="config file not found"):
        load_model(tmp_path / "absent.yml")
    odd = tmp_path / "weights.bin"
    odd.write_bytes(b"x")
    with pytest.raises(ModelError, match="neither a config"):
        load_model(odd)
    with pytest.raises(ModelError, match="multiples of 32"):
        load_model("dfine-n", imgsz=(300, 320))


@pytest.mark.parametrize(
    ("ref", "kind"),
    [
        ("dfine-n", "size"),
        ("dfine_n", "size"),
        ("DFINE-S", "size"),
        ("x", "size"),
        ("cfg.yml", "config"),
        ("cfg.yaml", "config"),
        ("best.pth", "checkpoint"),
        ("best.pt", "checkpoint"),
        ("best.ckpt", "checkpoint"),
        ("model.onnx", "onnx"),
        ("model.engine", "engine"),
        ("model.plan", "engine"),
        ("dfine-q", "unknown"),
        ("dfine-s-coco", "weights"),
        ("dfine_l_obj365_e25", "weights"),
        ("dfine-n-obj365", "unknown"),  # the official zoo has no N Objects365 file
    ],
)
def test_one_classifier_names_every_model_form(ref, kind):
    from dfine_deploy.model.reference import classify_model_ref

    assert classify_model_ref(ref).kind == kind


def test_a_folder_with_config_json_is_a_transformers_model(tmp_path):
    from dfine_deploy.model.reference import classify_model_ref

    (tmp_path / "config.json").write_text("{}")
    assert classify_model_ref(tmp_path).kind == "hf"
    (tmp_path / "model.json").write_text("{}")  # dfine-export's folders hold model.json
    assert classify_model_ref(tmp_path).kind == "artifact"


@pytest.mark.filterwarnings("ignore:.*random weights")
def test_every_torch_form_opens_in_the_cli_loader_and_in_detector(tmp_path):
    """`dfine_n` and `.ckpt` mean the same to `load_model` (every CLI) and to `Detector.open`."""
    from dfine_deploy.runtime.detector import Detector

    ckpt = tmp_path / "best.ckpt"
    with pytest.warns(UserWarning, match="random weights"):
        loaded = load_model("dfine_n", imgsz=(256, 256))
    torch.save({"model": loaded.model.state_dict()}, ckpt)
    assert load_model(ckpt, imgsz=(256, 256)).spec.size == "n"
    by_size = Detector.open("dfine_n", device="cpu", imgsz=(256, 256))
    by_ckpt = Detector.open(ckpt, device="cpu", imgsz=(256, 256))
    assert by_size.backend_name == by_ckpt.backend_name == "torch"
    with pytest.raises(ModelError, match="a TensorRT engine .* holds no PyTorch weights"):
        load_model(tmp_path / "model.engine")


# ------------------------------------------------------------------ transformers folders, every version

HF_FACTS = json.loads((REPO / "tests" / "data" / "hf_config_types.json").read_text())["versions"]
# the versions docs/models.md names; each must have been recorded by scripts/record_hf_config_types.py
HF_VERSIONS_NAMED = ("4.57", "5.0", "5.25")


def _alternatives(annotation: str) -> list[str]:
    """`int | list[int]` -> ["int", "list[int]"], brackets respected."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(annotation):
        depth += char == "["
        depth -= char == "]"
        if char == "|" and depth == 0:
            parts.append(annotation[start:i].strip())
            start = i + 1
    return [*parts, annotation[start:].strip()]


def conforms(value, annotation: str) -> bool:
    """Whether a JSON value is of a type a transformers config class declares (its @strict check)."""
    for kind in _alternatives(annotation):
        if kind.startswith("list["):
            if isinstance(value, list) and all(conforms(v, kind[5:-1]) for v in value):
                return True
        elif kind.startswith("dict"):
            if isinstance(value, dict):
                return True
        elif kind.startswith(("tuple[", "Sequence[")) or kind == "PreTrainedConfig":
            continue  # JSON holds no tuples nor config objects
        elif kind in ("int", "float", "bool", "str", "None"):
            if (
                type(value)
                is {"int": int, "float": float, "bool": bool, "str": str, "None": type(None)}[kind]
            ):
                return True
        else:
            raise AssertionError(f"an annotation this check does not know: {kind!r} (in {annotation!r})")
    return False


def test_every_named_transformers_version_is_recorded():
    recorded = {".".join(v.split(".")[:2]) for v in HF_FACTS}
    assert set(HF_VERSIONS_NAMED) <= recorded
    assert any(HF_FACTS[v]["d_fine"]["declared"] for v in HF_FACTS), "no strict (declaring) version recorded"


@pytest.mark.parametrize("version", sorted(HF_FACTS))
@pytest.mark.parametrize("size", sorted(SIZES))
def test_written_config_has_the_types_each_transformers_wants(version, size):
    """Every field `--hf` writes is one the version's DFineConfig / HGNetV2Config knows, of the type it
    declares (5.25's strict dataclass refused `"reg_scale": 4`); also what is written as JSON."""
    from dfine_deploy.hub.hf import hf_config

    config = json.loads(json.dumps(hf_config(SIZES[size], ["a", "b"])))
    facts = HF_FACTS[version]
    for model_type, fields in (("d_fine", config), ("hgnet_v2", config["backbone_config"])):
        known, declared = set(facts[model_type]["known"]), facts[model_type]["declared"]
        for key, value in fields.items():
            if key == "model_type":
                continue  # a class attribute, not a field
            assert key in known, f"transformers {version} {model_type} has no field {key!r}"
            if declared:
                assert conforms(value, declared[key]), (
                    f"transformers {version} {model_type}.{key} wants {declared[key]}, written {value!r}"
                )


def test_a_lossy_config_value_is_refused_not_rounded():
    from dfine_deploy.hub.hf import hf_config

    odd = SIZES["n"]
    odd = replace(odd, decoder=replace(odd.decoder, nhead=7.5))
    with pytest.raises(CheckpointError, match=r"d_fine decoder_attention_heads = 7.5 is no int"):
        hf_config(odd, ["a"])


def _recorded_folder(folder: Path, version: str) -> dict:
    """A folder laid out as transformers `version`'s save_pretrained laid it out (its config.json, its
    tensor names, dtypes and shapes), filled with seeded values; returns the tensors."""
    from safetensors.torch import save_file

    saved = HF_FACTS[version]["saved"]
    generator = torch.Generator().manual_seed(3)
    dtypes = {"F32": torch.float32, "I64": torch.int64}
    tensors = {}
    for name, (dtype, shape) in saved["tensors"].items():
        if dtypes[dtype] is torch.int64:
            tensors[name] = torch.zeros(shape, dtype=torch.int64)
        else:
            tensors[name] = torch.rand(shape, generator=generator) + 0.5  # positive: BatchNorm variances
    folder.mkdir()
    save_file(tensors, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(saved["config"]))
    return tensors


def _file_head(tensors: dict, kind: str, layer: int, rest: str):
    """One decoder layer's head tensor in a transformers file, under either of its names, or None."""
    names = [f"{prefix}{kind}_embed.{layer}.{rest}" for prefix in ("", "model.decoder.")]
    return next((tensors[n] for n in names if n in tensors), None)


@pytest.mark.parametrize("version", sorted(HF_FACTS))
def test_a_folder_of_each_transformers_version_is_read(version, tmp_path, caplog):
    """5.0.0 ties every decoder layer's heads to the first's and saves those only: they are copied to
    each layer, and the copy is said; the other versions save every layer's own."""
    tensors = _recorded_folder(tmp_path / "hf", version)
    layers = HF_FACTS[version]["saved"]["config"]["decoder_layers"]
    with caplog.at_level(logging.INFO, logger="dfine_deploy.hub.hf"):
        loaded = load_model(tmp_path / "hf", imgsz=(256, 256))
    assert loaded.spec.size == "n" and loaded.class_names == ["cat", "dog", "bird"]
    assert not loaded.report.reinitialised
    shared = _file_head(tensors, "bbox", 1, "layers.0.weight") is None
    assert shared == (version == "5.0.0")
    state = loaded.model.state_dict()
    for layer in range(layers):
        for ours, kind, rest in (
            ("dec_bbox_head", "bbox", "layers.2.bias"),
            ("dec_score_head", "class", "weight"),
        ):
            expected = _file_head(tensors, kind, 0 if shared else layer, rest)
            assert torch.equal(state[f"decoder.{ours}.{layer}.{rest}"], expected), (ours, layer)
    said = [r.getMessage() for r in caplog.records if "copied to each layer" in r.getMessage()]
    if shared:
        assert len(said) == 1 and said[0].endswith(
            f"shared by all {layers} decoder layers (as transformers 5.0.0 saves it); copied to each layer "
            f"({(layers - 1) * 8} tensors)"
        )
    else:
        assert not said


def test_hf_export_refusal_leaves_no_folder_and_keeps_an_earlier_one(tmp_path, monkeypatch):
    """A folder transformers disagrees with is refused in one line; nothing of it is left beside the
    target, and an earlier export that --force would replace stays as it was."""
    import dfine_deploy.hub.hf as hf

    with pytest.warns(UserWarning, match="random weights"):
        loaded = load_model("dfine-n", num_classes=2, imgsz=(256, 256))
    target = tmp_path / "hf"
    hf.export_hf(loaded, target)
    before = {p.name: p.read_bytes() for p in target.iterdir()}
    real = hf.to_hf_state_dict

    def class_bias_off(state_dict):  # a writer bug: the class heads' biases written wrong
        out = real(state_dict)
        return {k: v + 1.0 if "class_embed." in k and k.endswith(".bias") else v for k, v in out.items()}

    monkeypatch.setattr(hf, "to_hf_state_dict", class_bias_off)
    with pytest.raises(
        CheckpointError, match=r"^--hf .*/hf: transformers \S+'s DFineForObjectDetection disagrees"
    ):
        hf.export_hf(loaded, target, force=True)
    assert {p.name: p.read_bytes() for p in target.iterdir()} == before
    with pytest.raises(CheckpointError, match="disagrees.*nothing was written"):
        hf.export_hf(loaded, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    monkeypatch.setattr(hf, "to_hf_state_dict", real)
    config = hf.hf_config
    monkeypatch.setattr(hf, "hf_config", lambda spec, names: {**config(spec, names), "d_model": "wide"})
    with pytest.raises(
        CheckpointError,
        match=r"^--hf .*/new: transformers \S+ refuses the folder written \(.+\); nothing was written$",
    ):
        hf.export_hf(loaded, tmp_path / "new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]


def test_hf_export_replaces_only_a_transformers_folder(tmp_path):
    from dfine_deploy.errors import OwnershipError
    from dfine_deploy.hub.hf import export_hf

    with pytest.warns(UserWarning, match="random weights"):
        loaded = load_model("dfine-n", num_classes=2, imgsz=(256, 256))
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(
        (CheckpointError, OwnershipError), match="--hf .*: is not a transformers D-FINE folder"
    ):
        export_hf(loaded, tmp_path, force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]
