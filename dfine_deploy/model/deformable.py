"""Multi-scale deformable attention with per-level point counts (D-FINE's variant).

There are no value/output projections: the raw memory is sampled. Two samplers give the same
numbers: "grid" uses F.grid_sample (as the official code); "gather" does the bilinear
interpolation with index arithmetic and torch.gather so exported graphs have no GridSample node.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dfine_deploy.errors import ModelError
from dfine_deploy.model.spec import SAMPLERS


def check_sampler(sampler: str) -> str:
    if sampler not in SAMPLERS:
        raise ModelError(f"unknown sampler '{sampler}': expected one of {', '.join(SAMPLERS)}")
    return sampler


def sample_grid(
    value: torch.Tensor,
    spatial_shapes: list[list[int]],
    locations: torch.Tensor,
    weights: torch.Tensor,
    points_per_level: list[int],
) -> torch.Tensor:
    """Weighted bilinear samples with F.grid_sample (zeros padding, align_corners=False).

    value [B*heads, c, sum(HW)], locations [B*heads, Q, P, 2] in [0, 1] (x, y),
    weights [B*heads, Q, P] -> [B*heads, c, Q].
    """
    grids = (2 * locations - 1).split(points_per_level, dim=2)
    per_level = value.split([h * w for h, w in spatial_shapes], dim=-1)
    samples = []
    for (h, w), level_value, grid in zip(spatial_shapes, per_level, grids):
        level_value = level_value.reshape(value.shape[0], value.shape[1], h, w)
        samples.append(
            F.grid_sample(level_value, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        )  # [N, c, Q, P_l]
    return (torch.cat(samples, dim=-1) * weights[:, None]).sum(-1)


def _point_geometry(
    spatial_shapes: list[list[int]], points_per_level: list[int], like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per sampling point: map size (w, h) as floats, and the level's first index in the flat value."""
    sizes, starts, start = [], [], 0
    for (h, w), n in zip(spatial_shapes, points_per_level):
        sizes += [[w, h]] * n
        starts += [start] * n
        start = start + h * w  # not +=: under tracing h, w are tensors and += would alias every entry
    size = torch.tensor(sizes, dtype=like.dtype, device=like.device)  # [P, 2]
    first = torch.tensor(starts, dtype=torch.int64, device=like.device)  # [P]
    return size, size.to(torch.int64), first


def sample_gather(
    value: torch.Tensor,
    spatial_shapes: list[list[int]],
    locations: torch.Tensor,
    weights: torch.Tensor,
    points_per_level: list[int],
) -> torch.Tensor:
    """Same result as `sample_grid`, from four gathered neighbours per point, all levels at once."""
    size, size_int, first = _point_geometry(spatial_shapes, points_per_level, locations)
    # grid_sample's unnormalisation for align_corners=False: ((2*loc - 1) + 1) * size - 1) / 2.
    pixel = ((2 * locations - 1 + 1) * size - 1) / 2  # [N, Q, P, 2]
    low = pixel.floor()
    high = low + 1
    frac_high = pixel - low  # weight of the higher neighbour along each axis
    frac_low = high - pixel
    x0, y0 = low[..., 0].to(torch.int64), low[..., 1].to(torch.int64)
    wx = torch.stack([frac_low[..., 0], frac_high[..., 0], frac_low[..., 0], frac_high[..., 0]], dim=-1)
    wy = torch.stack([frac_low[..., 1], frac_low[..., 1], frac_high[..., 1], frac_high[..., 1]], dim=-1)
    xs = torch.stack([x0, x0 + 1, x0, x0 + 1], dim=-1)  # [N, Q, P, 4]
    ys = torch.stack([y0, y0, y0 + 1, y0 + 1], dim=-1)
    width, height = size_int[:, 0, None], size_int[:, 1, None]  # [P, 1]
    inside = (xs >= 0) & (xs < width) & (ys >= 0) & (ys < height)
    corner_weight = wx * wy * inside.to(wx.dtype) * weights[..., None]  # [N, Q, P, 4]
    xs = torch.minimum(torch.clamp(xs, min=0), width - 1)
    ys = torch.minimum(torch.clamp(ys, min=0), height - 1)
    n, c, total = value.shape
    q = locations.shape[1]
    # One flat row per (sample, token): a plain Gather of whole c-vectors, so the index is c times
    # smaller than a GatherElements index expanded over the channels.
    rows = value.transpose(1, 2).reshape(n * total, c)  # [N*sum(HW), c]
    sample_start = torch.arange(n, device=value.device).reshape(n, 1, 1, 1) * total
    index = sample_start + first[:, None] + ys * width + xs  # [N, Q, P, 4] into the flat rows
    gathered = rows[index.reshape(-1)].reshape(n, q, -1, c)  # [N, Q, P*4, c]
    sampled = (gathered * corner_weight.reshape(n, q, -1, 1)).sum(2)  # [N, Q, c]
    return sampled.transpose(1, 2)  # [N, c, Q]


_SAMPLE_FUNCTIONS = {"grid": sample_grid, "gather": sample_gather}


class MSDeformableAttention(nn.Module):
    """Deformable cross-attention: each query samples `num_points[l]` points per level and head."""

    def __init__(
        self,
        embed_dim: int = 256,
        num_heads: int = 8,
        num_levels: int = 3,
        num_points: tuple[int, ...] | int = 4,
        offset_scale: float = 0.5,
        sampler: str = "grid",
    ):
        super().__init__()
        if embed_dim % num_heads:
            raise ModelError(f"decoder hidden_dim {embed_dim} must be divisible by nhead {num_heads}")
        points = list(num_points) if isinstance(num_points, (list, tuple)) else [num_points] * num_levels
        if len(points) != num_levels:
            raise ModelError(f"decoder num_points {points} must have one entry per level ({num_levels})")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_levels = num_levels
        self.points_per_level = points
        self.total_points = sum(points)
        self.offset_scale = offset_scale
        self.sampler = check_sampler(sampler)
        scale = [1.0 / n for n in points for _ in range(n)]
        self.register_buffer("num_points_scale", torch.tensor(scale, dtype=torch.float32))
        self.sampling_offsets = nn.Linear(embed_dim, num_heads * self.total_points * 2)
        self.attention_weights = nn.Linear(embed_dim, num_heads * self.total_points)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Offsets start on rays in each head's direction, k = 1..n_l steps out; weights uniform."""
        nn.init.constant_(self.sampling_offsets.weight, 0)
        angles = torch.arange(self.num_heads, dtype=torch.float32) * (2.0 * math.pi / self.num_heads)
        direction = torch.stack([angles.cos(), angles.sin()], -1)
        direction = direction / direction.abs().max(-1, keepdim=True).values
        steps = torch.cat([torch.arange(1, n + 1) for n in self.points_per_level]).reshape(1, -1, 1)
        bias = direction.reshape(self.num_heads, 1, 2).tile(1, self.total_points, 1) * steps
        self.sampling_offsets.bias.copy_(bias.flatten())
        nn.init.constant_(self.attention_weights.weight, 0)
        nn.init.constant_(self.attention_weights.bias, 0)

    def forward(
        self,
        query: torch.Tensor,
        reference_points: torch.Tensor,
        value: torch.Tensor,
        spatial_shapes: list[list[int]],
    ) -> torch.Tensor:
        """query [B, Q, C]; reference_points [B, Q, 1, 4] cxcywh; value [B*heads, C/heads, sum(HW)]."""
        batch, num_queries = query.shape[:2]
        heads, points = self.num_heads, self.total_points
        offsets = self.sampling_offsets(query).reshape(batch, num_queries, heads, points, 2)
        weights = self.attention_weights(query).reshape(batch, num_queries, heads, points)
        weights = F.softmax(weights, dim=-1)  # jointly over the points of all levels
        point_scale = self.num_points_scale.to(query.dtype).unsqueeze(-1)  # [P, 1]
        offset = offsets * point_scale * reference_points[:, :, None, :, 2:] * self.offset_scale
        locations = reference_points[:, :, None, :, :2] + offset  # [B, Q, heads, P, 2]
        locations = locations.permute(0, 2, 1, 3, 4).flatten(0, 1)  # [B*heads, Q, P, 2]
        weights = weights.permute(0, 2, 1, 3).flatten(0, 1)  # [B*heads, Q, P]
        sampled = _SAMPLE_FUNCTIONS[self.sampler](
            value, spatial_shapes, locations, weights, self.points_per_level
        )  # [B*heads, c, Q]
        return sampled.reshape(batch, self.embed_dim, num_queries).permute(0, 2, 1)
