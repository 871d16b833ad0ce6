"""Exponential moving average of the weights, with the official warm-up ramp.

d = decay * (1 - exp(-updates / warmups)); every floating-point entry of the state dict
(buffers included) moves as v = d * v + (1 - d) * model_v; integer buffers are copied.

Unlike the official ModelEMA, `decay` is read at every update, so assigning a new value (the
restart decay of the no-augmentation phase) really changes the average.
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import nn

from dfine_deploy.training.distributed import unwrap


class ModelEMA:
    def __init__(self, model: nn.Module, decay: float = 0.9999, warmups: int = 1000, start: int = 0):
        self.module = copy.deepcopy(unwrap(model)).eval()
        for param in self.module.parameters():
            param.requires_grad_(False)
        self.decay = float(decay)
        self.warmups = int(warmups)
        self.start = int(start)  # updates before this count copy the weights instead of averaging
        self.updates = 0

    def current_decay(self) -> float:
        if self.warmups <= 0:
            return self.decay
        return self.decay * (1.0 - math.exp(-self.updates / self.warmups))

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        self.updates += 1
        d = 0.0 if self.updates <= self.start else self.current_decay()
        source = unwrap(model).state_dict()
        for name, value in self.module.state_dict().items():
            new = source[name].detach()
            if value.dtype.is_floating_point:
                value.mul_(d).add_(new.to(value.dtype), alpha=1.0 - d)
            else:
                value.copy_(new)

    def state_dict(self) -> dict[str, Any]:
        """The official layout: {'module': weights, 'updates': n} (+ our decay settings)."""
        return {
            "module": self.module.state_dict(),
            "updates": self.updates,
            "decay": self.decay,
            "warmups": self.warmups,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.updates = int(state.get("updates", 0))
        self.decay = float(state.get("decay", self.decay))
        self.warmups = int(state.get("warmups", self.warmups))
