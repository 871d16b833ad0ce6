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


# The zero border around each level's map in the gather sampler: one row/column before, two after.
# Coordinates are clamped onto it, so an off-map neighbour reads a zero instead of being masked.
_BORDER_BEFORE, _BORDER_AFTER = 1, 2


def _point_geometry(
    spatial_shapes: list[list[int]], points_per_level: list[int], like: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """Per sampling point, with each level's map bordered and the maps laid end to end: map size
    (w, h) and flat-index steps (1, row length) as floats [P, 2]; the flat offsets [4, P] of the four
    neighbours (x0y0, x1y0, x0y1, x1y1) from the top-left one's position; one sample's flat length.
    """
    border = _BORDER_BEFORE + _BORDER_AFTER
    sizes, steps, corners, start = [], [], [], 0
    for (h, w), n in zip(spatial_shapes, points_per_level):
        row = w + border
        origin = start + _BORDER_BEFORE * row + _BORDER_BEFORE  # where the map's pixel (0, 0) sits
        sizes += [[w, h]] * n
        steps += [[1, row]] * n
        corners += [[origin, origin + 1, origin + row, origin + row + 1]] * n
        start = start + (h + border) * row  # not +=: under tracing h, w are tensors and += would alias
    size = torch.tensor(sizes, dtype=like.dtype, device=like.device)
    step = torch.tensor(steps, dtype=like.dtype, device=like.device)
    corner = torch.tensor(corners, dtype=torch.int64, device=like.device).T
    return size, step, corner, start


def sample_gather(
    value: torch.Tensor,
    spatial_shapes: list[list[int]],
    locations: torch.Tensor,
    weights: torch.Tensor,
    points_per_level: list[int],
) -> torch.Tensor:
    """Same result as `sample_grid`, from four gathered neighbours per point, all levels at once.

    Built for cheap exported graphs: each level's map gets a zero border and every coordinate is
    clamped onto it, so off-map neighbours read zeros (grid_sample's zeros padding) without
    validity masks; the neighbours of all points come from one Gather and are summed by one
    batched MatMul; the neighbour axis sits before the point axis, so no elementwise op broadcasts
    along the innermost axis (slow in onnxruntime).
    """
    n, c, _ = value.shape
    q = locations.shape[1]
    size, step, corner, total = _point_geometry(spatial_shapes, points_per_level, locations)
    pad = (_BORDER_BEFORE, _BORDER_AFTER, _BORDER_BEFORE, _BORDER_AFTER)
    levels = value.split([h * w for h, w in spatial_shapes], dim=-1)
    bordered = [
        F.pad(level.reshape(n, c, h, w), pad).flatten(2) for (h, w), level in zip(spatial_shapes, levels)
    ]
    rows = torch.cat(bordered, dim=-1).transpose(1, 2).reshape(-1, c)  # [N*total, c]
    # grid_sample's unnormalisation for align_corners=False, in its order of operations so the
    # roundings match: ((2*loc - 1) + 1) * size - 1) / 2. A point more than a pixel off the map has
    # both neighbours off it on that axis; clamped to -1 or size, they land on the border.
    pixel = ((2 * locations - 1 + 1) * size - 1) / 2
    pixel = torch.minimum(pixel.clamp(min=-1), size)  # [N, Q, P, 2]
    low = pixel.floor()
    frac_x, frac_y = (pixel - low).unbind(-1)  # [N, Q, P]: weights of the higher neighbours
    top_left = (low * step).sum(-1).to(torch.int64)  # [N, Q, P]: within one sample's maps
    sample_start = torch.arange(n, device=value.device).reshape(n, 1, 1) * total
    index = (top_left + sample_start).unsqueeze(2) + corner  # [N, Q, 4, P]
    row_low, row_high = (1 - frac_y) * weights, frac_y * weights
    corner_weight = torch.stack(
        [(1 - frac_x) * row_low, frac_x * row_low, (1 - frac_x) * row_high, frac_x * row_high], dim=2
    )  # [N, Q, 4, P], in the order of `index`
    gathered = rows[index.reshape(-1)].reshape(n * q, -1, c)  # [N*Q, 4*P, c]
    sampled = torch.matmul(corner_weight.reshape(n * q, 1, -1), gathered)  # [N*Q, 1, c]
    return sampled.reshape(n, q, c).transpose(1, 2)  # [N, c, Q]


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
        # Operands shaped [P, 2] and [B, Q, 1, P, 2], not [P, 1] and [B, Q, 1, 1, 2]: a broadcast
        # along the innermost axes is slow in onnxruntime.
        point_scale = self.num_points_scale.to(query.dtype).unsqueeze(-1).expand(-1, 2)
        reference = reference_points.unsqueeze(2).expand(-1, -1, -1, points, -1)  # [B, Q, 1, P, 4]
        offset = offsets * point_scale * reference[..., 2:] * self.offset_scale
        locations = reference[..., :2] + offset  # [B, Q, heads, P, 2]
        locations = locations.permute(0, 2, 1, 3, 4).flatten(0, 1)  # [B*heads, Q, P, 2]
        weights = weights.permute(0, 2, 1, 3).flatten(0, 1)  # [B*heads, Q, P]
        sampled = _SAMPLE_FUNCTIONS[self.sampler](
            value, spatial_shapes, locations, weights, self.points_per_level
        )  # [B*heads, c, Q]
        return sampled.reshape(batch, self.embed_dim, num_queries).permute(0, 2, 1)
