"""EMA: warm-up ramp, float-only averaging, and a restart decay that really applies."""

import math

import pytest
import torch
from torch import nn

from dfine_deploy.training.ema import ModelEMA


def _model(value: float) -> nn.Module:
    model = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)
    return model


def test_ramp_matches_formula_on_every_float_entry():
    model = _model(0.0)
    ema = ModelEMA(model, decay=0.9, warmups=3)
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(1.0)
        model[1].running_mean.fill_(1.0)
        model[1].num_batches_tracked.fill_(7)
    ema.update(model)
    d = 0.9 * (1 - math.exp(-1 / 3))
    state = ema.module.state_dict()
    assert state["0.weight"][0, 0].item() == pytest.approx(1 - d)
    assert state["1.running_mean"][0].item() == pytest.approx(1 - d)
    assert state["1.num_batches_tracked"].item() == 7  # integers are copied
    assert not any(p.requires_grad for p in ema.module.parameters())


def test_assigned_decay_is_used():
    """The official ModelEMA ignores `ema.decay = ...`; ours must not."""
    model = _model(1.0)
    ema = ModelEMA(model, decay=0.5, warmups=0)
    ema.decay = 0.0  # restart decay: follow the model exactly
    with torch.no_grad():
        model[0].weight.fill_(3.0)
    ema.update(model)
    assert ema.module[0].weight[0, 0].item() == pytest.approx(3.0)
    ema.decay = 1.0  # frozen average
    with torch.no_grad():
        model[0].weight.fill_(5.0)
    ema.update(model)
    assert ema.module[0].weight[0, 0].item() == pytest.approx(3.0)


def test_state_round_trip_keeps_updates_and_decay():
    ema = ModelEMA(_model(1.0), decay=0.99, warmups=10)
    ema.update(_model(2.0))
    ema.decay = 0.95
    state = ema.state_dict()
    assert set(state) >= {"module", "updates"}
    other = ModelEMA(_model(0.0), decay=0.5, warmups=1)
    other.load_state_dict(state)
    assert other.updates == 1 and other.decay == 0.95 and other.warmups == 10
    assert torch.equal(other.module[0].weight, ema.module[0].weight)
