"""Fine-grained Distribution Refinement: the bin values W(n), the integral and the box decoding.

Boxes are refined as four edge distances, each a distribution over `reg_max + 1` bins whose values
are spaced non-uniformly by `weighting_function`; the criterion uses the same functions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dfine_deploy.model.box_ops import box_xyxy_to_cxcywh


def weighting_function(reg_max: int, up: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """The `reg_max + 1` bin values: 0 in the middle, growing geometrically to +-2*|up*reg_scale|.

    Computed with tensor arithmetic (float32 like `up`) so that gradients-free training and eval
    match the official numbers bit for bit.
    """
    inner_bound = up[:1].abs() * reg_scale[:1].abs()  # [1], dtype of up
    outer_bound = inner_bound * 2
    step = (inner_bound + 1) ** (2 / (reg_max - 2))
    exponents = torch.arange(1, reg_max // 2, dtype=up.dtype, device=up.device)
    right = step**exponents - 1  # [reg_max/2 - 1]
    left = -(step ** exponents.flip(0)) + 1
    zero = torch.zeros_like(inner_bound)
    return torch.cat([-outer_bound, left, zero, right, outer_bound])


def weighting_constant(reg_max: int, up: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """`weighting_function` as a constant for deployed models, computed in Python floats like the
    official deploy path (it can differ from the tensor version in the last bit)."""
    inner_bound = float((up[:1].abs() * reg_scale[:1].abs()).item())
    step = (inner_bound + 1) ** (2 / (reg_max - 2))
    right = [step**i - 1 for i in range(1, reg_max // 2)]
    left = [-(step**i) + 1 for i in range(reg_max // 2 - 1, 0, -1)]
    values = [-2 * inner_bound, *left, 0.0, *right, 2 * inner_bound]
    return torch.tensor(values, dtype=up.dtype, device=up.device)


def integral(corners: torch.Tensor, project: torch.Tensor) -> torch.Tensor:
    """[..., 4*(reg_max+1)] logits -> [..., 4] expected distances under the softmax over bins."""
    bins = project.shape[0]
    prob = F.softmax(corners.reshape(-1, bins), dim=1)
    distances = F.linear(prob, project.to(prob.dtype))  # [N*4]
    return distances.reshape(*corners.shape[:-1], 4)


def distance2bbox(points: torch.Tensor, distance: torch.Tensor, reg_scale: torch.Tensor) -> torch.Tensor:
    """Move the edges of cxcywh `points` by `distance` (l, t, r, b) in units of size/reg_scale.

    A zero distance reproduces the reference box; returns cxcywh.
    """
    reg_scale = reg_scale.abs()
    half = 0.5 * reg_scale
    center, unit = points[..., :2], points[..., 2:] / reg_scale
    top_left = center - (half + distance[..., :2]) * unit
    bottom_right = center + (half + distance[..., 2:]) * unit
    return box_xyxy_to_cxcywh(torch.cat([top_left, bottom_right], dim=-1))
