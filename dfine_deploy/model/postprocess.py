"""From network outputs to detections: sigmoid top-K over query x class, boxes in original pixels."""

from __future__ import annotations

import torch
from torch import nn


class PostProcessor(nn.Module):
    """`forward(outputs, orig_target_sizes [B, 2] (w, h))` -> list of {labels, boxes, scores}.

    A query may appear several times with different classes; there is no NMS and no threshold.
    After `deploy()` it returns the tuple (labels int64 [B, K], boxes float32 [B, K, 4], scores [B, K]).
    """

    def __init__(self, num_classes: int, num_top_queries: int = 300):
        super().__init__()
        self.num_classes = num_classes
        self.num_top_queries = num_top_queries
        self.deploy_mode = False

    def deploy(self) -> PostProcessor:
        self.eval()
        self.deploy_mode = True
        return self

    def forward(self, outputs: dict[str, torch.Tensor], orig_target_sizes: torch.Tensor):
        logits, boxes = outputs["pred_logits"], outputs["pred_boxes"]
        center, size = boxes[..., :2], boxes[..., 2:]
        corners = torch.cat([center - 0.5 * size, center + 0.5 * size], dim=-1)  # [B, Q, 4] xyxy
        corners = corners * orig_target_sizes.repeat(1, 2).unsqueeze(1).to(corners.dtype)
        scores = torch.sigmoid(logits)
        k = min(self.num_top_queries, scores.shape[1] * scores.shape[2])
        scores, index = torch.topk(scores.flatten(1), k, dim=-1)  # over query x class
        # `index - index // C * C` rather than `%`: exports to ops every TensorRT version has.
        labels = index - index // self.num_classes * self.num_classes
        query = index // self.num_classes
        picked = corners.gather(1, query.unsqueeze(-1).expand(-1, -1, 4))  # [B, K, 4]
        if self.deploy_mode:
            return labels, picked, scores
        return [{"labels": lab, "boxes": box, "scores": sco} for lab, box, sco in zip(labels, picked, scores)]

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, num_top_queries={self.num_top_queries}, "
            f"deploy={self.deploy_mode}"
        )
