"""DEIM's D-FINE checkpoints (github.com/ShihuaHuang95/DEIM): the same tensors as D-FINE's, SiLU in the
decoder, BatchNorm that trains. Checked against key listings and eval outputs recorded with DEIM's own
code (tests/data/deim, tests/data/README.md); no DEIM weights are needed."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks.official_parity import deterministic_images, fill_deterministic, match_eval_slices
from dfine_deploy.config import load_config
from dfine_deploy.errors import CheckpointError
from dfine_deploy.model import SIZES, build_model

REPO = Path(__file__).resolve().parents[2]
DEIM_DATA = REPO / "tests" / "data" / "deim"


def _record(name: str) -> dict:
    return json.loads((DEIM_DATA / f"{name}.json").read_text())


def _deim_spec(size: str):
    return load_config(str(REPO / "configs" / "deim" / f"deim_hgnetv2_{size}_coco.yml")).model_spec


def _listing(state: dict) -> list[str]:
    return [f"{k}\t{tuple(v.shape)}\t{v.dtype}" for k, v in state.items()]


@pytest.mark.parametrize("size", ["n", "s", "m", "l", "x"])
def test_our_deim_configs_build_deims_tensors(size):
    """Names, shapes, dtypes and order equal DEIM's own model's (the sha256 of its listing); L and X
    differ from official D-FINE by the backbone's BatchNorm counters, N/S/M not at all."""
    recorded = _record(f"deim_keys_{size}")
    spec = _deim_spec(size)
    assert (spec.decoder.activation, spec.decoder.mlp_act) == ("silu", "silu")
    assert spec.backbone.freeze_norm is recorded["config"]["HGNetv2.freeze_norm"]
    lines = _listing(build_model(spec).state_dict())
    assert len(lines) == recorded["count"]
    assert hashlib.sha256("\n".join(lines).encode()).hexdigest() == recorded["listing_sha256"]
    official = {line.split("\t")[0] for line in (REPO / recorded["official_keys"]).read_text().splitlines()}
    assert [line.split("\t") for line in lines if line.split("\t")[0] not in official] == recorded[
        "not_in_official"
    ]
    assert recorded["official_not_in_deim"] == []
    if size in "lx":
        assert recorded["not_in_official"] and all(
            k.endswith("num_batches_tracked") for k, _, _ in recorded["not_in_official"]
        )


def test_deims_objects365_x_is_official_d_fine_x():
    recorded = _record("deim_keys_x_obj2coco")
    assert recorded["config"]["DFINETransformer.activation"] == "relu"
    lines = _listing(build_model(SIZES["x"]).state_dict())
    assert hashlib.sha256("\n".join(lines).encode()).hexdigest() == recorded["listing_sha256"]


def test_deim_n_eval_outputs_match_deims_code_and_need_silu():
    """DEIM-N filled by the parity rule gives DEIM's recorded eval outputs; the same weights with
    D-FINE's ReLU do not (so the activations are what makes a DEIM file work)."""
    recorded = _record("parity_deim_n")
    spec = _deim_spec("n")
    results = {}
    for act in ("silu", "relu"):
        decoder = replace(spec.decoder, num_denoising=0, activation=act, mlp_act=act)
        model = build_model(replace(spec, decoder=decoder))
        assert fill_deterministic(model) == recorded["filled_tensors"]
        with torch.no_grad():
            out = model.eval()(deterministic_images())
        results[act] = match_eval_slices(recorded["eval"], out["pred_logits"], out["pred_boxes"])
    assert results["silu"].ok, results["silu"].report()
    assert not results["relu"].ok, results["relu"].report()


def _deim_n_state(classes: int = 80) -> dict:
    torch.manual_seed(0)
    return build_model(_deim_spec("n").with_classes(classes).with_input_size(320, 320)).state_dict()


@pytest.mark.parametrize("layout", ["solver", "converted", "ddp_prefix"])
def test_deim_checkpoint_layouts_load(tmp_path, layout):
    """DEIM's solver saves {date, last_epoch, model, ema: {module, updates}, optimizer, criterion, ...};
    its convert_weight.py keeps {model: EMA weights}; DDP-wrapped saves prefix 'module.'."""
    from dfine_deploy.hub.loader import load_model

    state = _deim_n_state()
    ema = {k: v + 1 if v.is_floating_point() else v for k, v in state.items()}
    if layout == "solver":
        payload = {
            "date": "2025-01-01T00:00:00",
            "last_epoch": 159,
            "model": state,
            "ema": {"module": ema, "updates": 10},
            "criterion": {},
            "postprocessor": {},
            "optimizer": {"state": {}, "param_groups": []},
        }
        expected = ema
    elif layout == "converted":
        payload, expected = {"model": ema}, ema
    else:
        payload, expected = {"model": {f"module.{k}": v for k, v in state.items()}}, state
    path = tmp_path / "deim_n.pth"
    torch.save(payload, path)
    loaded = load_model(
        str(REPO / "configs" / "deim" / "deim_hgnetv2_n_coco.yml"), weights=path, imgsz=(320, 320)
    )
    mine = loaded.model.state_dict()
    assert torch.equal(mine["decoder.enc_score_head.weight"], expected["decoder.enc_score_head.weight"])
    assert loaded.class_names[0] == "person" and loaded.spec.decoder.mlp_act == "silu"


def test_a_deim_l_file_into_official_d_fine_l_is_refused_in_one_line(tmp_path):
    """The L/X files carry backbone BatchNorm counters official D-FINE-L/X lack: named, with the fix."""
    from dfine_deploy.hub.loader import load_model

    state = build_model(SIZES["l"].with_input_size(320, 320)).state_dict()
    state.update({k: torch.tensor(0) for k, _, _ in _record("deim_keys_l")["not_in_official"]})
    path = tmp_path / "deim_l.pth"
    torch.save({"model": state}, path)
    with pytest.raises(CheckpointError) as info:
        load_model(path, imgsz=(320, 320))
    message = str(info.value)
    assert (
        "\n" not in message
        and "80 num_batches_tracked" in message
        and "configs/deim/deim_hgnetv2_<size>_coco.yml" in message
    )


def test_a_frozen_batchnorm_file_into_trained_batchnorm_keeps_the_counters_and_says_so(tmp_path):
    """DEIM's Objects365 D-FINE-X was trained with frozen BatchNorm, its COCO config trains it: the
    counters the file lacks start at 0 and the load report counts them."""
    from dfine_deploy.model.weights import apply_state_dict

    state = {k: v for k, v in _deim_n_state().items() if not k.endswith("num_batches_tracked")}
    model = build_model(_deim_spec("n").with_input_size(320, 320))
    counters = sum(k.endswith("num_batches_tracked") for k in model.state_dict())
    report = apply_state_dict(model, state, source="frozen.pth")
    assert len(report.kept_counters) == counters > 0
    assert f"{counters} BatchNorm num_batches_tracked counters are not in the file" in report.summary()


def test_fine_tuning_a_deim_checkpoint_carries_coco_heads_by_name(tmp_path):
    from dfine_deploy.training.heads import load_tuning_weights

    source = _deim_n_state()
    path = tmp_path / "deim_n.pth"
    torch.save({"model": source}, path)
    model = build_model(_deim_spec("n").with_classes(2).with_input_size(320, 320))
    transfer = load_tuning_weights(model, path, [(0, "car"), (1, "Person")])
    assert [m.source_row for m in transfer.matches] == [2, 0]
    assert torch.equal(
        model.state_dict()["decoder.dec_score_head.0.weight"][1], source["decoder.dec_score_head.0.weight"][0]
    )
