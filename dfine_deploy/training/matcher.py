"""Hungarian matching of predicted queries to ground-truth boxes (one-to-one, per image).

The cost of pairing query q with ground truth g is

    C[q, g] = w_bbox * L1(box_q, box_g) + w_class * focal_cost(p_q[label_g]) - w_giou * GIoU(box_q, box_g)

with boxes in normalised cxcywh (L1) and xyxy (GIoU), and `focal_cost(p)` the difference of the positive
and negative focal terms, as the official D-FINE matcher computes it. NaN costs become 1.0 and each
image's block of the cost matrix is solved exactly with scipy's `linear_sum_assignment` on the CPU.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn
from torchvision.ops import generalized_box_iou

from dfine_deploy.errors import ConfigError
from dfine_deploy.model.box_ops import box_cxcywh_to_xyxy
from dfine_deploy.settings import MATCH_COST_WEIGHTS, MatcherSettings

MatchIndices = list[tuple[Tensor, Tensor]]
"""Per image: (query indices, target indices), both int64 [n_matched], pairwise aligned."""

_FOCAL_EPS = 1e-8  # keeps log() finite at p = 0 or 1 (the official constant)


class HungarianMatcher(nn.Module):
    """Optimal one-to-one assignment of queries to targets under the D-FINE matching cost."""

    def __init__(self, settings: MatcherSettings | None = None) -> None:
        """Built from `settings` (`Config.train.criterion.matcher`; default: official), which holds
        every knob and its default."""
        super().__init__()
        self.settings = MatcherSettings() if settings is None else settings
        weights = dict(self.settings.weight_dict)
        missing = sorted(set(MATCH_COST_WEIGHTS) - set(weights))
        unknown = sorted(set(weights) - set(MATCH_COST_WEIGHTS))
        if missing or unknown:
            raise ConfigError(
                f"HungarianMatcher.weight_dict: expected the keys {sorted(MATCH_COST_WEIGHTS)}, got "
                f"{sorted(weights)} (missing {missing}, unknown {unknown}); "
                "write e.g. {cost_class: 2, cost_bbox: 5, cost_giou: 2}"
            )
        if not any(weights.values()):
            raise ConfigError(
                "HungarianMatcher.weight_dict: all three costs are 0, so every assignment costs the "
                "same; give at least one of cost_class, cost_bbox, cost_giou a non-zero weight"
            )
        self.cost_class = float(weights["cost_class"])
        self.cost_bbox = float(weights["cost_bbox"])
        self.cost_giou = float(weights["cost_giou"])

    def cost_matrix(self, outputs: Mapping[str, Tensor], targets: Sequence[Mapping[str, Tensor]]) -> Tensor:
        """Matching cost of every query of the batch against every target of the batch.

        Returns [B, Q, sum(n_targets)]; image b's block is the columns of its own targets.
        """
        logits = outputs["pred_logits"].flatten(0, 1).float()  # [B*Q, C]; float32 also under AMP
        boxes = outputs["pred_boxes"].flatten(0, 1).float()  # [B*Q, 4] cxcywh
        target_labels = torch.cat([t["labels"] for t in targets])  # [T]
        target_boxes = torch.cat([t["boxes"] for t in targets]).to(boxes.dtype)  # [T, 4] cxcywh

        prob = logits.sigmoid()[:, target_labels]  # [B*Q, T]
        alpha, gamma = self.settings.alpha, self.settings.gamma
        positive = alpha * (1 - prob) ** gamma * -(prob + _FOCAL_EPS).log()
        negative = (1 - alpha) * prob**gamma * -(1 - prob + _FOCAL_EPS).log()
        cost_class = positive - negative

        cost_bbox = torch.cdist(boxes, target_boxes, p=1)  # [B*Q, T]
        cost_giou = -generalized_box_iou(box_cxcywh_to_xyxy(boxes), box_cxcywh_to_xyxy(target_boxes))
        cost = self.cost_bbox * cost_bbox + self.cost_class * cost_class + self.cost_giou * cost_giou
        batch, queries = outputs["pred_logits"].shape[:2]
        return cost.view(batch, queries, -1)

    @torch.no_grad()
    def forward(self, outputs: Mapping[str, Tensor], targets: Sequence[Mapping[str, Tensor]]) -> MatchIndices:
        """Match `outputs` (pred_logits [B,Q,C], pred_boxes [B,Q,4] cxcywh) to `targets`.

        Returns one (query_idx, target_idx) pair of int64 CPU tensors per image, sorted by query
        index, of length min(Q, n_targets).
        """
        cost = torch.nan_to_num(self.cost_matrix(outputs, targets).cpu(), nan=1.0)  # [B, Q, T]
        sizes = [len(t["boxes"]) for t in targets]
        indices: MatchIndices = []
        for image, block in enumerate(cost.split(sizes, dim=-1)):
            rows, cols = linear_sum_assignment(block[image].numpy())
            indices.append(
                (torch.as_tensor(rows, dtype=torch.int64), torch.as_tensor(cols, dtype=torch.int64))
            )
        return indices
