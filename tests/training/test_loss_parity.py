"""The criterion on the real model in train mode reproduces the official recorded losses.

Weights, images and targets follow the recording rule of tests/data/parity_*.json (see
benchmarks/official_parity/); the official run used `num_denoising: 0`, so no dn terms exist.

Tolerances come from the platform spread, measured in the test itself: the record was made on one
CPU (tests/data/README.md), and another CPU's kernels sum floats in another order. Each loss term
is recomputed here with the images moved by one float32 rounding step (relative 1e-7) and with one
thread instead of two; the largest relative change of a term is its spread, and the term must match
the record within max(1e-4, 3 x spread). Most terms barely move (spread ~1e-6), so they are held to
1e-4. The FGL terms are float32-ill-conditioned with random weights: the corner logits jump by
several units between bins only 0.076 apart, so the FGL target's interpolation turns ~1e-6 rounding
in the reference boxes into ~1e-3 in the loss. Measured: on an AVX2-only AMD EPYC our loss_fgl
missed the AVX-512/AMX record by 1.3-2.1e-3 while the official code on that same EPYC gave our
numbers to 1e-7, and the perturbations moved it by a comparable amount; on the recording's Xeon it
is 5e-5 off. A failure therefore says whether the deviation is inside the spread measured here.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.official_parity import (
    PARITY_TARGETS,
    deterministic_images,
    fill_deterministic,
    hash_uniform,
    load_parity,
)
from dfine_deploy.model.families import build_model
from dfine_deploy.model.spec import SIZES
from dfine_deploy.training.criterion import build_criterion

RTOL = 1e-4
SPREAD_FACTOR = 3.0
PERTURBATIONS = 3  # images moved by one rounding step, each with another hashed sign pattern


def _losses(model, criterion, images: torch.Tensor, threads: int) -> dict[str, float]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        targets = [dict(t) for t in PARITY_TARGETS]
        with torch.no_grad():
            outputs = model(images, targets)
            losses = criterion(outputs, targets, epoch=0, step=0, global_step=0, epoch_step=1)
    finally:
        torch.set_num_threads(before)
    values = {name: float(value) for name, value in losses.items()}
    return values | {"total": sum(values.values())}


def _perturbed(images: torch.Tensor, k: int) -> torch.Tensor:
    noise = hash_uniform(f"perturbation-{k}", images.numel()).reshape(images.shape).to(torch.float32)
    return images * (1 + 1e-7 * noise)


@pytest.mark.slow
@pytest.mark.parametrize("size", ["n", "s"])
def test_train_losses_match_the_official_record(size: str) -> None:
    spec = SIZES[size]
    spec = dataclasses.replace(spec, decoder=dataclasses.replace(spec.decoder, num_denoising=0))
    model = build_model(spec)
    fill_deterministic(model)
    model.train()
    criterion = build_criterion(spec)
    images = deterministic_images()
    ours = _losses(model, criterion, images, threads=2)
    variants = [_losses(model, criterion, _perturbed(images, k), threads=2) for k in range(PERTURBATIONS)]
    variants.append(_losses(model, criterion, images, threads=1))

    recorded = load_parity(size)
    expected = recorded["train_losses"] | {"total": recorded["train_total_weighted"]}
    assert set(ours) == set(expected), (sorted(set(ours) ^ set(expected)), "loss keys differ from the record")
    problems = []
    for name, value in expected.items():
        spread = max(abs(v[name] - ours[name]) for v in variants) / abs(ours[name])
        off = abs(ours[name] - value) / abs(value)
        bound = max(RTOL, SPREAD_FACTOR * spread)
        if off > bound:
            problems.append(
                f"{name}: ours {ours[name]:.7g}, recorded {value:.7g}, rel {off:.2e} > bound {bound:.2e}: "
                f"{off / max(spread, 1e-12):.1f}x the platform spread measured here ({spread:.2e}), "
                "so more than float summation order"
            )
    assert not problems, "\n".join(problems)
