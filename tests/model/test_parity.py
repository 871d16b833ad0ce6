"""Numerical parity with the official D-FINE, from outputs recorded with the official code.

Weights and input follow benchmarks/official_parity/; N and S run here, M/L/X in
benchmarks/parity_all_sizes.py (too slow for CI on two cores).
"""

from __future__ import annotations

import copy
import functools
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from benchmarks.official_parity import (
    ORIG_SIZES,
    deterministic_images,
    fill_deterministic,
    load_parity,
    match_deploy,
    match_eval_slices,
)
from dfine_deploy.model import SIZES, DeployModel, PostProcessor, build_model

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


@functools.lru_cache(maxsize=2)
def eval_outputs(size: str) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
    """Eval logits and boxes, then deploy (labels, boxes, scores), on the parity input."""
    model = parity_model(size).eval()
    images = deterministic_images()
    with torch.no_grad():
        out = model(images)
        deployed = DeployModel(model, PostProcessor(80))(images, ORIG_SIZES)
    return out["pred_logits"], out["pred_boxes"], deployed


@pytest.mark.parametrize("size", ["n", "s"])
def test_eval_and_deploy_match_official(size):
    recorded = load_parity(size)
    logits, boxes, (det_labels, det_boxes, det_scores) = eval_outputs(size)
    assert logits.shape == (2, 300, 80) and boxes.shape == (2, 300, 4)
    eval_cmp = match_eval_slices(recorded["eval"], logits, boxes)
    assert eval_cmp.ok, eval_cmp.report()
    deploy_cmp = match_deploy(recorded["deploy"], det_labels, det_boxes, det_scores)
    assert deploy_cmp.ok, deploy_cmp.report()


def test_parity_comparisons_detect_small_differences():
    """The set comparisons are not vacuous: a 3e-4 shift in one recorded value fails them."""
    recorded = copy.deepcopy(load_parity("n"))
    logits, boxes, (det_labels, det_boxes, det_scores) = eval_outputs("n")
    recorded["eval"]["pred_logits_slice"][5] += 3e-4
    recorded["deploy"]["scores"][7] += 3e-4
    recorded["deploy"]["boxes"][3] += 0.05
    assert not match_eval_slices(recorded["eval"], logits, boxes).ok
    deploy_cmp = match_deploy(recorded["deploy"], det_labels, det_boxes, det_scores)
    assert len(deploy_cmp.problems) == 2, deploy_cmp.report()


@pytest.mark.parametrize("size", ALL_SIZES)
def test_state_dict_matches_official_keys(size):
    """Names, order, shapes and dtypes, in train and in deploy form."""
    model = build_model(SIZES[size])
    ours = [(k, str(tuple(v.shape)), str(v.dtype)) for k, v in model.state_dict().items()]
    assert ours == _official_keys(f"keys_{size}.txt")
    model.deploy()
    deployed = [(k, str(tuple(v.shape))) for k, v in model.state_dict().items()]
    assert deployed == _official_keys(f"deploy_keys_{size}.txt")
