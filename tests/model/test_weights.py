"""Checkpoint reading and loading: layouts, safety, and one clear error per kind of bad file."""

from __future__ import annotations

import random
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from dfine_deploy.errors import CheckpointError
from dfine_deploy.model.families import build_model
from dfine_deploy.model.spec import SIZES
from dfine_deploy.model.weights import (
    DERIVED_KEYS,
    apply_state_dict,
    guess_size,
    infer_spec,
    load_checkpoint,
    spec_from_meta,
)

KEYS = Path(__file__).resolve().parents[1] / "data" / "official_keys"
DTYPES = {"torch.float32": torch.float32, "torch.int64": torch.int64, "torch.bool": torch.bool}


def official_state_dict(size: str, num_classes: int = 80) -> dict[str, torch.Tensor]:
    """Tensors with the names, shapes and dtypes recorded from the official code (80 classes)."""
    gen = torch.Generator().manual_seed(0)
    out = {}
    for line in (KEYS / f"keys_{size}.txt").read_text().splitlines():
        name, shape_text, dtype = line.split("\t")
        shape = [int(x) for x in shape_text.strip("()").split(",") if x.strip()]
        if (
            num_classes != 80
            and shape
            and shape[0] in (80, 81)
            and ("score_head" in name or "denoising_class_embed" in name)
        ):
            shape[0] += num_classes - 80
        if DTYPES[dtype] == torch.float32:
            out[name] = torch.randn(shape, generator=gen)
        elif DTYPES[dtype] == torch.int64:
            out[name] = torch.full(shape, 4, dtype=torch.int64)
        else:
            out[name] = torch.ones(shape, dtype=torch.bool)
    for shared in ("up", "reg_scale"):  # one parameter under two names, as in official files
        out[f"decoder.decoder.{shared}"] = out[f"decoder.{shared}"]
    return out


@pytest.fixture(scope="module")
def model_n():
    return build_model(SIZES["n"])


# ---------------------------------------------------------------------------- official names


@pytest.mark.parametrize("size", "nsmlx")
def test_official_state_dict_loads_strictly(size):
    """Names and shapes equal the official lists: every official tensor lands in our model."""
    model = build_model(SIZES[size])
    official = official_state_dict(size)
    assert list(model.state_dict()) == list(official)
    official["decoder.reg_scale"] = official["decoder.decoder.reg_scale"] = torch.tensor([7])  # int64
    report = apply_state_dict(model, official, source=f"official-{size}")
    assert report.reinitialised == [] and report.kept_derived == []
    assert set(report.loaded) == set(official)
    own = model.state_dict()
    assert torch.equal(own["backbone.stem.stem1.conv.weight"], official["backbone.stem.stem1.conv.weight"])
    assert float(own["decoder.reg_scale"]) == 7.0  # int64 in the file copies into our tensor
    spec = infer_spec(official)
    assert spec == SIZES[size]


def test_other_input_size_keeps_own_anchors():
    model = build_model(SIZES["n"].with_input_size(320, 320))
    anchors = model.state_dict()["decoder.anchors"].clone()
    report = apply_state_dict(model, official_state_dict("n"), source="n640")
    assert sorted(report.kept_derived) == ["decoder.anchors", "decoder.valid_mask"]
    assert torch.equal(model.state_dict()["decoder.anchors"], anchors)
    assert infer_spec(model.state_dict()).eval_spatial_size == (320, 320)


def test_class_count_change_reinitialises_only_class_heads():
    model = build_model(SIZES["n"].with_classes(4))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    official = official_state_dict("n")
    report = apply_state_dict(model, official, source="coco.pth")
    expected = {
        "decoder.enc_score_head.weight",
        "decoder.enc_score_head.bias",
        "decoder.denoising_class_embed.weight",
    }
    expected |= {f"decoder.dec_score_head.{i}.{p}" for i in range(3) for p in ("weight", "bias")}
    assert set(report.reinitialised) == expected
    assert (report.checkpoint_classes, report.model_classes) == (80, 4)
    after = model.state_dict()
    for key in expected:
        assert torch.equal(after[key], before[key])  # fresh init kept
    for key in set(after) - expected:
        assert torch.equal(after[key], official[key].to(after[key].dtype)), key
    assert "80 -> 4 classes" in report.summary()


def test_absent_class_heads_are_reinitialised_not_missing():
    """The fine-tune path drops the denoising embed when its class count differs."""
    model = build_model(SIZES["n"])
    sd = official_state_dict("n")
    del sd["decoder.denoising_class_embed.weight"]
    report = apply_state_dict(model, sd, source="no_embed.pth")
    assert report.reinitialised == ["decoder.denoising_class_embed.weight"]


# ------------------------------------------------------------------------------- bad inputs


def test_wrong_size_names_first_key_and_guess(tmp_path, model_n):
    path = tmp_path / "dfine_s.pth"
    torch.save({"model": official_state_dict("s")}, path)
    ckpt = load_checkpoint(path)
    with pytest.raises(CheckpointError) as info:
        apply_state_dict(model_n, ckpt.state_dict, source=ckpt.path)
    message = str(info.value)
    assert str(path) in message
    # the first key in model order whose shape differs, with both shapes
    first = next(
        k
        for k, v in model_n.state_dict().items()
        if tuple(ckpt.state_dict[k].shape) != tuple(v.shape) and k not in DERIVED_KEYS
    )
    assert f"'{first}'" in message
    assert str(list(ckpt.state_dict[first].shape)) in message
    assert str(list(model_n.state_dict()[first].shape)) in message
    assert "looks like dfine-s" in message and "model is dfine-n" in message


def test_missing_keys_are_listed(model_n):
    sd = official_state_dict("n")
    dropped = ["decoder.query_pos_head.layers.0.weight", "encoder.fpn_blocks.0.cv1.conv.weight"]
    for key in dropped:
        del sd[key]
    with pytest.raises(CheckpointError, match="2 weights of the model are missing") as info:
        apply_state_dict(model_n, sd, source="partial.pth")
    assert all(k in str(info.value) for k in dropped) and "partial.pth" in str(info.value)


def test_unexpected_keys_are_listed(model_n):
    sd = official_state_dict("n")
    sd["decoder.extra_head.weight"] = torch.zeros(2)
    with pytest.raises(CheckpointError, match="decoder.extra_head.weight"):
        apply_state_dict(model_n, sd, source="extra.pth")


@pytest.mark.parametrize(("key", "value"), [("decoder.reg_scale", 0.0), ("decoder.up", float("nan"))])
def test_a_zero_or_non_finite_distribution_scalar_is_refused_in_one_line(model_n, key, value):
    sd = official_state_dict("n")
    sd[key] = torch.full_like(sd[key], value)
    with pytest.raises(CheckpointError, match=rf"edited\.pth: {key} is \[(0|nan)\]; D-FINE needs"):
        apply_state_dict(model_n, sd, source="edited.pth")


@pytest.mark.parametrize("zip_format", [True, False])
def test_truncated_file(tmp_path, zip_format):
    full = tmp_path / "full.pth"
    torch.save({"model": official_state_dict("n")}, full, _use_new_zipfile_serialization=zip_format)
    data = full.read_bytes()
    for cut in (len(data) // 2, 100, 0):
        cut_path = tmp_path / f"cut{cut}.pth"
        cut_path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=rf"{cut_path}: truncated or not a PyTorch checkpoint"):
            load_checkpoint(cut_path)


def test_not_a_checkpoint(tmp_path):
    text = tmp_path / "notes.pth"
    text.write_text("these are not weights")
    with pytest.raises(CheckpointError, match="truncated or not a PyTorch checkpoint"):
        load_checkpoint(text)
    with pytest.raises(CheckpointError, match="not found"):
        load_checkpoint(tmp_path / "absent.pth")
    with pytest.raises(CheckpointError, match="folder"):
        load_checkpoint(tmp_path)
    other = tmp_path / "other.pth"
    torch.save({"epoch": 3, "notes": "x"}, other)
    with pytest.raises(CheckpointError, match="no weights found.*epoch, notes"):
        load_checkpoint(other)


def _rewritten_zip(source: Path, target: Path, edit) -> Path:
    """`source` (a torch.save zip) with every member's bytes passed through `edit(name, data)`."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as new:
        for info in old.infolist():
            new.writestr(info, edit(info.filename, old.read(info.filename)))
    return target


def test_an_onnx_graph_or_a_newer_pytorch_s_checkpoint_is_named_as_such_not_as_truncated(tmp_path):
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    renamed = tmp_path / "model.pth"
    onnx.save(helper.make_model(graph, producer_name="pytorch"), renamed)
    with pytest.raises(CheckpointError) as caught:
        load_checkpoint(renamed)
    assert str(caught.value).startswith(f"{renamed}: an ONNX graph, not a PyTorch checkpoint")
    assert "truncated" not in str(caught.value)

    saved = tmp_path / "saved.pth"
    torch.save({"model": {"w": torch.zeros(2)}}, saved)
    newer_format = _rewritten_zip(
        saved,
        tmp_path / "format.pth",
        lambda n, d: b"99\n" if n.endswith("/version") and "/." not in n else d,
    )
    with pytest.raises(
        CheckpointError, match=r"format.pth: written by a newer PyTorch \(file format version 99"
    ):
        load_checkpoint(newer_format)
    newer_name = _rewritten_zip(  # a rebuild function this torch lacks, as a later torch may add
        saved, tmp_path / "name.pth", lambda n, d: d.replace(b"_rebuild_tensor_v2", b"_rebuild_tensor_v9")
    )
    with pytest.raises(
        CheckpointError, match=r"name.pth: written by a newer PyTorch \(it refers to torch\._utils"
    ):
        load_checkpoint(newer_name)


class _RunsCode:
    """Unpickling this calls Path.touch on the marker file: proof that code ran."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_pickle_with_code_is_refused_and_not_run(tmp_path):
    marker = tmp_path / "code_ran"
    path = tmp_path / "evil.pth"
    torch.save({"model": {"w": torch.zeros(1)}, "payload": _RunsCode(marker)}, path)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "allow_pickle=True" in message and "--allow-pickle" in message
    assert "it refers to '" in message  # names the refused callable
    assert not marker.exists()
    # the explicit opt-in really unpickles (and so runs the payload)
    ckpt = load_checkpoint(path, allow_pickle=True)
    assert marker.exists() and ckpt.source_key == "model"


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_plain_pickle_with_objects_is_refused_naming_the_object(tmp_path, protocol):
    """A plain pickle (not torch.save's zip) was once called truncated, with torch's advice cut
    at "Re-running torch.load with weights_only set to False"."""
    import pickle
    import re

    marker = tmp_path / "code_ran"
    path = tmp_path / "plain.pth"
    with open(path, "wb") as fh:
        pickle.dump({"model": {"w": torch.zeros(2)}, "payload": _RunsCode(marker)}, fh, protocol=protocol)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "refused" in message and "Python objects" in message and "truncated" not in message
    assert re.search(r"it refers to .*'pathlib\.\w+", message)  # the object, by name
    assert "weights_only" not in message and "Re-running" not in message
    assert not marker.exists()


def test_allow_pickle_is_advised_only_by_tools_that_take_it():
    """The refusal names the CLIs that accept --allow-pickle: each of them really does."""
    import re

    from dfine_deploy.export.cli import get_args_parser as export_parser
    from dfine_deploy.hub.cli import _parser as info_parser
    from dfine_deploy.model.weights import PICKLE_OPTION

    named = set(re.findall(r"dfine-[a-z]+", PICKLE_OPTION))
    parsers = {"dfine-export": export_parser(), "dfine-info": info_parser()}
    assert named == set(parsers)
    for tool, parser in parsers.items():
        assert "--allow-pickle" in parser._option_string_actions, tool


# --------------------------------------------------------------------------------- layouts


def test_layouts_and_prefix(tmp_path):
    sd = {"a.weight": torch.ones(2), "b.bias": torch.zeros(3)}
    ema = {"a.weight": torch.full((2,), 5.0), "b.bias": torch.zeros(3)}
    cases = {
        "train.pth": (
            {"model": sd, "ema": {"module": ema, "updates": 7}, "meta": {"size": "n"}},
            "ema.module",
            5.0,
        ),
        "released.pth": ({"model": sd}, "model", 1.0),
        "bare.pth": (sd, "state_dict", 1.0),
        "ddp.pth": ({"model": {f"module.{k}": v for k, v in sd.items()}}, "model", 1.0),
    }
    for name, (obj, source_key, first) in cases.items():
        torch.save(obj, tmp_path / name)
        ckpt = load_checkpoint(tmp_path / name)
        assert ckpt.source_key == source_key
        assert set(ckpt.state_dict) == set(sd)
        assert float(ckpt.state_dict["a.weight"][0]) == first
    assert load_checkpoint(tmp_path / "train.pth").meta == {"size": "n"}
    assert load_checkpoint(tmp_path / "bare.pth").meta == {}


def test_our_training_checkpoint_reads_without_pickle(tmp_path):
    """Numpy RNG states and plain meta are allowed; nothing else is needed."""
    from dataclasses import asdict

    spec = SIZES["n"].with_classes(4).with_input_size(320, 320)
    path = tmp_path / "last.pth"
    torch.save(
        {
            "model": official_state_dict("n", 4),
            "ema": {"module": official_state_dict("n", 4), "updates": 3},
            "rng": {
                "python": random.getstate(),
                "numpy": np.random.get_state(),
                "torch": torch.get_rng_state(),
            },
            "meta": {"model_spec": asdict(spec), "class_names": ["a", "b", "c", "d"]},
        },
        path,
    )
    ckpt = load_checkpoint(path)
    assert ckpt.source_key == "ema.module"
    assert spec_from_meta(ckpt.meta, source=str(path)) == spec
    assert infer_spec(ckpt.state_dict).num_classes == 4


def test_infer_spec_refuses_unknown_weights():
    with pytest.raises(CheckpointError, match="do not match any official D-FINE size"):
        infer_spec({"x": torch.zeros(1)}, source="odd.pth")
    assert guess_size({"x": torch.zeros(1)}) is None
