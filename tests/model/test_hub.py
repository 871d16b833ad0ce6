"""One way to name a model: size names, config files, checkpoints (ours and official)."""

from __future__ import annotations

from dataclasses import asdict
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
    with pytest.raises(ModelError, match="unknown model 'dfine-q'.*dfine-n.*\\.yml.*\\.pth"):
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
