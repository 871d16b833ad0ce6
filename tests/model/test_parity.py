"""Numerical parity with the official D-FINE, from outputs recorded with the official code.

Weights and input follow tests/support/parity.py; N and S run here, M/L/X in
benchmarks/parity_all_sizes.py (too slow for CI on two cores).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch

from dfine_deploy.model import SIZES, DeployModel, PostProcessor, build_model
from tests.support.parity import (
    ORIG_SIZES, deterministic_images, fill_deterministic, load_parity, match_deploy, match_eval_slices,
)

KEYS_DIR = Path(__file__).resolve().parents[1] / "data" / "official_keys"
ALL_SIZES = ["n", "s", "m", "l", "x"]


def _official_keys(name: str) -> list[tuple[str, ...]]:
    return [tuple(line.split("\t")) for line in (KEYS_DIR / name).read_text().splitlines() if line]


def parity_model(size: str):
    """The size's network with num_denoising 0 (as recorded) and the deterministic weights."""
    spec = SIZES[size]
    model = build_model(replace(spec, decoder=replace(spec.decoder, num_denoising=0)))
    filled = fill_deterministic(model)
    assert filled == load_parity(size)["filled_tensors"]
    return model


@pytest.mark.parametrize("size", ["n", "s"])
def test_eval_and_deploy_match_official(size):
    recorded = load_parity(size)
    model = parity_model(size).eval()
    images = deterministic_images()
    with torch.no_grad():
        out = model(images)
        assert out["pred_logits"].shape == (2, 300, 80) and out["pred_boxes"].shape == (2, 300, 4)
        eval_cmp = match_eval_slices(recorded["eval"], out["pred_logits"], out["pred_boxes"])
        assert eval_cmp.ok, eval_cmp.report()

        labels, boxes, scores = DeployModel(model, PostProcessor(80))(images, ORIG_SIZES)
    deploy_cmp = match_deploy(recorded["deploy"], labels, boxes, scores)
    assert deploy_cmp.ok, deploy_cmp.report()


def test_parity_comparison_detects_a_wrong_model():
    """The set comparison is not vacuous: a slightly perturbed network fails it."""
    recorded = load_parity("n")
    model = parity_model("n").eval()
    with torch.no_grad():
        model.decoder.dec_score_head[-1].bias.add_(1e-3)
        out = model(deterministic_images())
    assert not match_eval_slices(recorded["eval"], out["pred_logits"], out["pred_boxes"]).ok


@pytest.mark.parametrize("size", ALL_SIZES)
def test_state_dict_matches_official_keys(size):
    """Names, order, shapes and dtypes, in train and in deploy form."""
    model = build_model(SIZES[size])
    ours = [(k, str(tuple(v.shape)), str(v.dtype)) for k, v in model.state_dict().items()]
    assert ours == _official_keys(f"keys_{size}.txt")
    model.deploy()
    deployed = [(k, str(tuple(v.shape))) for k, v in model.state_dict().items()]
    assert deployed == _official_keys(f"deploy_keys_{size}.txt")
