"""Box format conversions shared by the decoder, the postprocessor and the criterion."""

from __future__ import annotations

import torch


def box_cxcywh_to_xyxy(boxes: torch.Tensor) -> torch.Tensor:
    """[..., 4] cxcywh -> xyxy; negative widths/heights are treated as 0 (as the official code)."""
    center, size = boxes[..., :2], boxes[..., 2:].clamp(min=0.0)
    return torch.cat([center - 0.5 * size, center + 0.5 * size], dim=-1)


def box_xyxy_to_cxcywh(boxes: torch.Tensor) -> torch.Tensor:
    """[..., 4] xyxy -> cxcywh (no clamping: a flipped box keeps its negative size)."""
    top_left, bottom_right = boxes[..., :2], boxes[..., 2:]
    return torch.cat([(top_left + bottom_right) / 2, bottom_right - top_left], dim=-1)


def inverse_sigmoid(x: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    """logit(x) with x clipped to [0, 1] and both odds terms kept >= eps, so 0 and 1 stay finite."""
    x = x.clip(min=0.0, max=1.0)
    return torch.log(x.clip(min=eps) / (1 - x).clip(min=eps))
