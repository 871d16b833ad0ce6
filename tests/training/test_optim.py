"""Parameter groups (with the official regex slip fixed), warm-up and schedules."""

import math
import re

import pytest
import torch
from torch import nn

from dfine_deploy.config import Config
from dfine_deploy.errors import ConfigError
from dfine_deploy.settings import ParamGroupSettings
from dfine_deploy.training.optim import (
    LRSchedule,
    build_optimizer,
    build_param_groups,
    fix_lookahead_precedence,
    linear_lr_scale,
    set_lr,
)

OFFICIAL_NSM_GROUPS = [
    ParamGroupSettings("^(?=.*backbone)(?!.*norm|bn).*$", lr=4e-4),
    ParamGroupSettings("^(?=.*backbone)(?=.*norm|bn).*$", lr=4e-4, weight_decay=0.0),
    ParamGroupSettings("^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$", weight_decay=0.0),
]


class Tiny(nn.Module):
    """Names shaped like D-FINE's: backbone conv + bn, encoder norm/bias, a head."""

    def __init__(self):
        super().__init__()
        self.backbone = nn.ModuleDict({"conv": nn.Conv2d(3, 4, 3, bias=False), "bn": nn.BatchNorm2d(4)})
        self.encoder = nn.ModuleDict({"proj": nn.Linear(4, 4), "norm": nn.LayerNorm(4)})
        self.head = nn.Linear(4, 2)


def test_precedence_fix_means_either_word_anywhere():
    fixed = fix_lookahead_precedence("^(?=.*backbone)(?=.*norm|bn).*$")
    assert fixed == "^(?=.*backbone)(?=.*(?:norm|bn)).*$"
    name = "backbone.stages.0.blocks.0.bn.weight"
    assert re.search(fixed, name)
    assert not re.search("^(?=.*backbone)(?=.*norm|bn).*$", name)  # the official slip
    # patterns already written correctly are left alone
    same = "^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$"
    assert fix_lookahead_precedence(same) == same


def test_groups_partition_every_parameter_once():
    model = Tiny()
    groups, reports = build_param_groups(model, OFFICIAL_NSM_GROUPS)
    names = {id(p): n for n, p in model.named_parameters()}
    per_group = [[names[id(p)] for p in g["params"]] for g in groups]
    flat = [n for g in per_group for n in g]
    assert sorted(flat) == sorted(names.values())
    assert per_group[0] == ["backbone.conv.weight"]
    assert sorted(per_group[1]) == ["backbone.bn.bias", "backbone.bn.weight"]  # empty in official
    assert groups[1]["weight_decay"] == 0.0
    assert sorted(per_group[2]) == ["encoder.norm.bias", "encoder.norm.weight", "encoder.proj.bias"]
    assert sorted(per_group[3]) == ["encoder.proj.weight", "head.bias", "head.weight"]
    assert [r.tensors for r in reports] == [1, 2, 3, 3]
    assert "read as" in reports[1].line()


def test_first_match_wins_and_frozen_params_skipped():
    model = Tiny()
    model.head.bias.requires_grad_(False)
    overlapping = [ParamGroupSettings(pattern="head", lr=1.0), ParamGroupSettings(pattern="weight", lr=2.0)]
    groups, reports = build_param_groups(model, overlapping)
    assert [p.shape for p in groups[0]["params"]] == [model.head.weight.shape]
    assert all(p is not model.head.weight for p in groups[1]["params"])
    assert reports[0].tensors == 1  # the frozen bias is in no group


def test_bad_group_spec_is_a_config_error():
    with pytest.raises(ConfigError, match="optimizer.params.0"):
        Config.from_dict({"optimizer": {"params": [{"lr": 1.0}]}})
    with pytest.raises(ConfigError, match="invalid regex"):
        build_param_groups(Tiny(), [ParamGroupSettings("(unclosed")])


def test_lr_scaling_applies_to_every_group():
    opt, _ = build_optimizer(
        Tiny(), lr=1e-3, weight_decay=1e-4, group_specs=OFFICIAL_NSM_GROUPS, lr_scale=linear_lr_scale(64, 32)
    )
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([8e-4, 8e-4, 2e-3, 2e-3])


def test_cpu_optimizer_is_fused_and_steps_like_the_reference_loop():
    torch.manual_seed(0)
    fused_model, loop_model = Tiny(), Tiny()
    loop_model.load_state_dict(fused_model.state_dict())
    fused, _ = build_optimizer(fused_model, lr=1e-2, weight_decay=1e-2, group_specs=OFFICIAL_NSM_GROUPS)
    assert fused.defaults["fused"] is True
    groups, _ = build_param_groups(loop_model, OFFICIAL_NSM_GROUPS)
    reference = torch.optim.AdamW(groups, lr=1e-2, weight_decay=1e-2, foreach=False)
    for _ in range(3):
        for model, optimizer in ((fused_model, fused), (loop_model, reference)):
            optimizer.zero_grad()
            hidden = model.encoder["norm"](model.encoder["proj"](torch.ones(2, 4)))
            model.head(hidden).square().sum().backward()
            optimizer.step()
    for (name, a), b in zip(fused_model.named_parameters(), loop_model.parameters(), strict=True):
        assert torch.allclose(a, b, atol=1e-6), name


def _schedule(**kw):
    base = {"kind": "MultiStepLR", "warmup_steps": 0, "steps_per_epoch": 1, "epochs": 10}
    return LRSchedule(**{**base, **kw})


def test_linear_warmup_then_multistep_per_epoch():
    sched = _schedule(warmup_steps=4, milestones=(2,), gamma=0.1, steps_per_epoch=5)
    assert [sched.lr_factor(s, 0) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])
    # warm-up ends inside epoch 0, so epochs 0 and 1 both count: the milestone 2 is reached at epoch 2
    assert sched.lr_factor(10, 1) == pytest.approx(1.0)
    assert sched.lr_factor(10, 2) == pytest.approx(0.1)


def test_multistep_counts_only_epochs_ending_after_warmup():
    """Official: MultiStepLR steps at an epoch end only once warm-up has finished."""
    sched = _schedule(warmup_steps=25, milestones=(2,), gamma=0.1, steps_per_epoch=10)
    # epoch ends 0 and 1 (steps 10, 20) fall inside warm-up; epoch 2's end (step 30) is the first counted
    assert sched.lr_factor(40, 3) == pytest.approx(1.0)
    assert sched.lr_factor(40, 4) == pytest.approx(0.1)
    assert sched.lr_factor(2, 0) == pytest.approx(3 / 25)  # warm-up multiplies on top


def test_flat_cosine_shape_is_a_pure_function_of_the_step():
    sched = LRSchedule(
        kind="FlatCosineLR", warmup_steps=0, steps_per_epoch=10, epochs=3, flat_epochs=1, min_lr_ratio=0.1
    )
    lrs = [2.0 * sched.lr_factor(s, s // 10) for s in range(30)]
    assert lrs[:11] == pytest.approx([2.0] * 11)
    assert lrs[20] == pytest.approx(0.2 + 1.8 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert all(a >= b for a, b in zip(lrs, lrs[1:]))
    assert 2.0 * sched.lr_factor(35, 3) == pytest.approx(0.2)  # held at the floor after the decay
    # accumulation: the same schedule over fewer optimizer steps per epoch keeps its shape in epochs
    half = LRSchedule(
        kind="FlatCosineLR", warmup_steps=0, steps_per_epoch=5, epochs=3, flat_epochs=1, min_lr_ratio=0.1
    )
    assert half.lr_factor(10, 2) == pytest.approx(sched.lr_factor(20, 2))


def test_set_lr_scales_every_group_from_its_base():
    params = [nn.Parameter(torch.zeros(1)), nn.Parameter(torch.zeros(1))]
    opt = torch.optim.SGD([{"params": [params[0]], "lr": 1.0}, {"params": [params[1]], "lr": 0.5}])
    assert set_lr(opt, [1.0, 0.5], 0.1) == pytest.approx(0.1)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([0.1, 0.05])


def test_unknown_schedule_is_a_config_error():
    from dfine_deploy.settings import LrSchedulerSettings, TrainSettings

    with pytest.raises(ConfigError, match="lr_scheduler"):
        LRSchedule.from_settings(TrainSettings(lr_scheduler=LrSchedulerSettings(type="cosine-ish")), 10)
