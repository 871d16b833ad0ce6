"""AdamW parameter groups from the config's regular expressions, warm-up and LR schedules.

The official configs select groups with patterns such as `^(?=.*backbone)(?=.*norm|bn).*$`.
Python reads `(?=.*norm|bn)` as "`.*norm` OR `bn` at the current position", so the group meant
for backbone norm layers matches nothing and every BatchNorm weight gets weight decay. We read
the pattern as its authors meant it: an alternation inside a `(?=.*...)`/`(?!.*...)` look-ahead
applies to the whole look-ahead, i.e. `(?=.*(?:norm|bn))`. `fix_lookahead_precedence` makes
that rewrite visibly (it is logged with the group sizes), and each parameter lands in exactly one
group: the first pattern that matches, else the default group.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import torch
from torch import nn

from dfine_deploy.errors import ConfigError
from dfine_deploy.settings import ParamGroupSettings

# A look-ahead whose body starts with `.*` and has a top-level `|` but no nested group.
_LOOKAHEAD = re.compile(r"\(\?([=!])\.\*([^()]*\|[^()]*)\)")


def fix_lookahead_precedence(pattern: str) -> str:
    """`(?=.*a|b)` -> `(?=.*(?:a|b))`; patterns without the slip come back unchanged."""
    return _LOOKAHEAD.sub(lambda m: f"(?{m.group(1)}.*(?:{m.group(2)}))", pattern)


@dataclass
class GroupReport:
    pattern: str  # as written in the config ("<default>" for the rest)
    effective_pattern: str  # after the precedence fix
    tensors: int
    params: int
    options: dict[str, Any]

    def line(self) -> str:
        fixed = "" if self.pattern == self.effective_pattern else f" (read as {self.effective_pattern})"
        opts = ", ".join(f"{k}={v}" for k, v in sorted(self.options.items()))
        return f"  {self.pattern}{fixed}: {self.tensors} tensors, {self.params:,} params; {opts or 'defaults'}"


def _group_options(spec: ParamGroupSettings) -> dict[str, Any]:
    """The per-group options an `optimizer.params` entry sets (read and checked by the config)."""
    return {k: getattr(spec, k) for k in ("lr", "weight_decay") if getattr(spec, k) is not None}


def build_param_groups(
    model: nn.Module, group_specs: Sequence[ParamGroupSettings] | None
) -> tuple[list[dict[str, Any]], list[GroupReport]]:
    """Split trainable parameters into optimizer groups; first matching pattern wins.

    `group_specs` is the config's `optimizer.params` list (`Config.train.optimizer.params`). The
    last group holds the unmatched parameters with the optimizer's defaults.
    """
    specs = [(spec.pattern, _group_options(spec)) for spec in group_specs or []]
    compiled = []
    for i, (pattern, _) in enumerate(specs):
        try:
            compiled.append(re.compile(fix_lookahead_precedence(pattern)))
        except re.error as exc:
            raise ConfigError(f"optimizer.params[{i}].params: invalid regex {pattern!r}: {exc}") from exc
    buckets: list[list[nn.Parameter]] = [[] for _ in range(len(specs) + 1)]
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        index = next((i for i, rx in enumerate(compiled) if rx.search(name)), len(specs))
        buckets[index].append(param)
    groups, reports = [], []
    for i, params in enumerate(buckets):
        if i < len(specs):
            (pattern, options), effective = specs[i], compiled[i].pattern
        else:
            options, pattern, effective = {}, "<default>", "<default>"
        reports.append(GroupReport(pattern, effective, len(params), sum(p.numel() for p in params), options))
        if params:
            groups.append({"params": params, **options})
    return groups, reports


def build_optimizer(
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float,
    betas: Sequence[float] = (0.9, 0.999),
    group_specs: Sequence[ParamGroupSettings] | None = None,
    lr_scale: float = 1.0,
) -> tuple[torch.optim.AdamW, list[GroupReport]]:
    """AdamW over the regex groups; `lr_scale` multiplies every learning rate (linear scaling)."""
    groups, reports = build_param_groups(model, group_specs)
    for group in groups:
        if "lr" in group:
            group["lr"] = float(group["lr"]) * lr_scale
    optimizer = torch.optim.AdamW(
        groups, lr=float(lr) * lr_scale, betas=tuple(betas), weight_decay=float(weight_decay)
    )
    return optimizer, reports


def linear_lr_scale(global_batch: int, reference_batch: int | None) -> float:
    """Factor for linear LR scaling: the config's lr was tuned for `reference_batch` images."""
    if not reference_batch:
        return 1.0
    return global_batch / float(reference_batch)


class LinearWarmup:
    """Per-iteration linear warm-up: lr = min(1, (step+1)/duration) * target, as official.

    The target is each group's lr at construction (after the main scheduler set it), and is
    re-read from the main scheduler's view at every step so the two compose.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, duration: int):
        self.optimizer = optimizer
        self.duration = int(duration)
        self.step_count = 0
        self.targets = [g["lr"] for g in optimizer.param_groups]
        self._apply()

    @property
    def finished(self) -> bool:
        return self.step_count >= self.duration

    def factor(self) -> float:
        if self.duration <= 0:
            return 1.0
        return min(1.0, (self.step_count + 1) / self.duration)

    def _apply(self) -> None:
        if self.finished:
            return
        for group, target in zip(self.optimizer.param_groups, self.targets):
            group["lr"] = target * self.factor()

    def step(self) -> None:
        self.step_count += 1
        if self.step_count == self.duration:  # hand over to the main schedule exactly once
            for group, target in zip(self.optimizer.param_groups, self.targets):
                group["lr"] = target
        else:
            self._apply()

    def state_dict(self) -> dict[str, Any]:
        return {"step_count": self.step_count, "duration": self.duration, "targets": list(self.targets)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step_count = int(state["step_count"])
        self.targets = list(state.get("targets", self.targets))
        self._apply()


class FlatCosine:
    """Per-iteration flat-then-cosine: base lr until `flat_iters`, cosine down to
    `min_ratio * base` at `decay_end_iters`, then held (the no-augmentation tail)."""

    def __init__(self, optimizer: torch.optim.Optimizer, flat_iters: int, decay_end_iters: int, min_ratio: float):
        self.optimizer = optimizer
        self.flat_iters = int(flat_iters)
        self.decay_end_iters = max(int(decay_end_iters), self.flat_iters + 1)
        self.min_ratio = float(min_ratio)
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.iteration = 0

    def factor(self, iteration: int) -> float:
        if iteration <= self.flat_iters:
            return 1.0
        progress = min(1.0, (iteration - self.flat_iters) / (self.decay_end_iters - self.flat_iters))
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))

    def lrs(self) -> list[float]:
        return [base * self.factor(self.iteration) for base in self.base_lrs]

    def step(self) -> None:
        self.iteration += 1

    def state_dict(self) -> dict[str, Any]:
        return {"iteration": self.iteration, "base_lrs": list(self.base_lrs)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.iteration = int(state["iteration"])
        self.base_lrs = list(state.get("base_lrs", self.base_lrs))


class Schedule:
    """One object the loop steps per iteration and per epoch: warm-up x main schedule.

    kind "multistep": MultiStepLR stepped per epoch once warm-up is over (official).
    kind "flatcosine": FlatCosine per iteration, with warm-up multiplied on top.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        *,
        kind: str = "multistep",
        warmup_iters: int = 0,
        milestones: Iterable[int] = (),
        gamma: float = 0.1,
        iters_per_epoch: int = 1,
        flat_epochs: int = 0,
        decay_end_epochs: int = 1,
        min_ratio: float = 0.5,
    ):
        self.optimizer = optimizer
        self.kind = kind
        if kind == "multistep":
            self.main: Any = torch.optim.lr_scheduler.MultiStepLR(optimizer, list(milestones), gamma)
        elif kind == "flatcosine":
            self.main = FlatCosine(
                optimizer, flat_epochs * iters_per_epoch, decay_end_epochs * iters_per_epoch, min_ratio
            )
        else:
            raise ConfigError(
                f"lr_scheduler: unknown kind {kind!r}; expected 'multistep' (MultiStepLR) or 'flatcosine'"
            )
        self.warmup = LinearWarmup(optimizer, warmup_iters)

    def _set(self) -> None:
        if self.kind == "flatcosine":
            factor = 1.0 if self.warmup.finished else self.warmup.factor()
            for group, lr in zip(self.optimizer.param_groups, self.main.lrs()):
                group["lr"] = lr * factor

    def step_iteration(self) -> None:
        """After every optimizer step."""
        self.warmup.step()
        if self.kind == "flatcosine":
            self.main.step()
            self._set()

    def step_epoch(self) -> None:
        """At the end of every epoch (MultiStepLR only moves once warm-up is done, as official)."""
        if self.kind == "multistep" and self.warmup.finished:
            self.main.step()

    def current_lr(self) -> float:
        return max(g["lr"] for g in self.optimizer.param_groups)

    def state_dict(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.main.state_dict(), self.warmup.state_dict()

    def load_state_dict(self, main_state: dict[str, Any], warmup_state: dict[str, Any] | None) -> None:
        self.main.load_state_dict(main_state)
        if warmup_state:
            self.warmup.load_state_dict(warmup_state)
        self._set()
