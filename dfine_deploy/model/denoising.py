"""Contrastive denoising queries (training only): noised copies of the ground truth.

Each group holds one positive (small noise) and one negative (large noise) copy of every target;
groups cannot see each other and the matching queries cannot see any of them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dfine_deploy.model.box_ops import (
    box_cxcywh_to_xyxy,
    box_xyxy_to_cxcywh,
    inverse_sigmoid,
)


def denoising_attention_mask(
    num_denoising: int, group_size: int, num_queries: int, device: torch.device
) -> torch.Tensor:
    """[dn+Q, dn+Q] bool, True = blocked: dn groups see only themselves, queries see no dn."""
    total = num_denoising + num_queries
    group = torch.arange(total, device=device) // group_size  # dn groups first; queries after
    is_dn = torch.arange(total, device=device) < num_denoising
    mask = is_dn[None, :] & (group[:, None] != group[None, :])
    return mask  # [total, total]


def contrastive_denoising_group(
    targets: list[dict[str, torch.Tensor]],
    num_classes: int,
    num_queries: int,
    class_embed: nn.Embedding,
    num_denoising: int = 100,
    label_noise_ratio: float = 0.5,
    box_noise_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]] | tuple[None, None, None, None]:
    """Denoising content [B, dn, C], unactivated boxes [B, dn, 4], attention mask and dn_meta."""
    if num_denoising <= 0:
        return None, None, None, None
    counts = [len(t["labels"]) for t in targets]
    max_gt = max(counts, default=0)
    if max_gt == 0:
        return None, None, None, None
    device = targets[0]["labels"].device
    num_group = max(1, num_denoising // max_gt)
    batch = len(targets)

    labels = torch.full([batch, max_gt], num_classes, dtype=torch.int32, device=device)
    boxes = torch.zeros([batch, max_gt, 4], device=device)
    present = torch.zeros([batch, max_gt], dtype=torch.bool, device=device)
    for i, (target, n) in enumerate(zip(targets, counts)):
        if n:
            labels[i, :n] = target["labels"]
            boxes[i, :n] = target["boxes"]
            present[i, :n] = True
    # Layout per group: max_gt positives then max_gt negatives.
    labels = labels.tile(1, 2 * num_group)
    boxes = boxes.tile(1, 2 * num_group, 1)
    present = present.tile(1, 2 * num_group)
    negative = torch.zeros([batch, max_gt * 2, 1], device=device)
    negative[:, max_gt:] = 1
    negative = negative.tile(1, num_group, 1)  # [B, dn, 1]
    positive = (1 - negative).squeeze(-1) * present
    positive_idx = torch.nonzero(positive)[:, 1].split([n * num_group for n in counts])
    total_dn = max_gt * 2 * num_group

    if label_noise_ratio > 0:
        flip = torch.rand_like(labels, dtype=torch.float) < (label_noise_ratio * 0.5)
        random_labels = torch.randint_like(flip, 0, num_classes, dtype=labels.dtype)
        labels = torch.where(flip & present, random_labels, labels)

    if box_noise_scale > 0:
        corners = box_cxcywh_to_xyxy(boxes)
        half_size = (boxes[..., 2:] * 0.5).tile(1, 1, 2) * box_noise_scale
        sign = torch.randint_like(boxes, 0, 2) * 2.0 - 1.0
        magnitude = torch.rand_like(boxes)
        magnitude = (magnitude + 1.0) * negative + magnitude * (1 - negative)  # negatives in [1, 2)
        corners = (corners + sign * magnitude * half_size).clip(min=0.0, max=1.0)
        boxes = box_xyxy_to_cxcywh(corners)
        boxes = torch.where(boxes < 0, -boxes, boxes)
    boxes_unact = inverse_sigmoid(boxes)

    content = class_embed(labels)
    mask = denoising_attention_mask(total_dn, max_gt * 2, num_queries, device)
    dn_meta = {
        "dn_positive_idx": positive_idx,
        "dn_num_group": num_group,
        "dn_num_split": [total_dn, num_queries],
    }
    return content, boxes_unact, mask, dn_meta
