"""The criterion on the real model in train mode reproduces the official recorded losses.

Weights, images and targets follow the recording rule of tests/data/parity_*.json (see
tests/support/parity.py); the official run used `num_denoising: 0`, so no dn terms exist.

Tolerances: every term and the total within a relative 1e-4, except the FGL terms, which get 1e-3.
FGL is float32-ill-conditioned here: with random weights the corner logits jump by several units
between neighbouring bins only 0.076 apart, so the FGL target's interpolation turns ~1e-6 relative
rounding in the reference boxes into ~1e-4 in the loss. Measured on D-FINE-S (the official
criterion code applied to our model's outputs gives our numbers to 2e-7, so the criterion is not
the source): as run here (no_grad, 2 threads) FGL is 3.8e-5 off the record (N 5.1e-5, M 7.2e-5)
while every other term is within 1e-5; with autograd on it is 1.3e-4 off; 1 instead of 2 threads
moves our own loss_fgl by 1.7e-4 (loss_bbox by 3e-5), and images perturbed by 1e-7 relative move it
by 2e-3. Another CPU's kernels can therefore put FGL past 1e-4 without any real difference.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from dfine_deploy.model.dfine import build_model
from dfine_deploy.model.spec import SIZES
from dfine_deploy.training.criterion import build_criterion
from tests.support.parity import (
    PARITY_TARGETS,
    compare_losses,
    deterministic_images,
    fill_deterministic,
    load_parity,
)

RTOL = 1e-4
RTOL_FGL = 1e-3


@pytest.fixture
def two_threads():
    """Same intra-op split as where the tolerances were measured, whatever the machine's core count."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.slow
@pytest.mark.parametrize("size", ["n", "s"])
def test_train_losses_match_the_official_record(size: str, two_threads) -> None:
    spec = SIZES[size]
    spec = dataclasses.replace(spec, decoder=dataclasses.replace(spec.decoder, num_denoising=0))
    model = build_model(spec)
    fill_deterministic(model)
    model.train()
    targets = [dict(t) for t in PARITY_TARGETS]
    with torch.no_grad():
        outputs = model(deterministic_images(), targets)
        losses = build_criterion(spec)(outputs, targets, epoch=0, step=0, global_step=0, epoch_step=1)

    recorded = load_parity(size)
    loose = compare_losses(recorded, losses, rtol=RTOL_FGL)  # same key set, everything within 1e-3
    assert loose.ok, loose.report()
    expected = recorded["train_losses"]
    strict = {name: value for name, value in expected.items() if not name.startswith("loss_fgl")}
    strict["total"] = recorded["train_total_weighted"]
    ours = {name: float(losses[name]) for name in expected} | {"total": float(sum(losses.values()))}
    off = {name: abs(ours[name] - value) / abs(value) for name, value in strict.items()}
    assert max(off.values()) <= RTOL, {name: f"{rel:.2e}" for name, rel in off.items() if rel > RTOL}
