"""A small detector with D-FINE's deploy interface, so export logic is tested in seconds.

It is a real network (convolutions, LayerNorm, a softmax distribution integrated into box sides,
sigmoid/top-k postprocessing), not a stub: the exporter, ORT and the gate run on it for real. The
acceptance tests run the actual D-FINE sizes.
"""

from __future__ import annotations

import torch
from torch import nn


class ToyDetector(nn.Module):
    def __init__(self, num_classes: int = 5, reg_max: int = 8, top_k: int = 30):
        super().__init__()
        torch.manual_seed(0)
        self.num_classes, self.reg_max, self.top_k = num_classes, reg_max, top_k
        self.backbone = nn.Sequential(
            nn.Conv2d(3, 16, 3, stride=4, padding=1),
            nn.GELU(),
            nn.Conv2d(16, 32, 3, stride=4, padding=1),
            nn.GELU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1),
        )
        self.norm = nn.LayerNorm(64)
        self.score_head = nn.Linear(64, num_classes)
        self.center_head = nn.Linear(64, 2)
        self.corner_head = nn.Linear(64, 4 * (reg_max + 1))
        self.register_buffer("project", torch.linspace(0.0, 0.5, reg_max + 1))

    def forward(self, images: torch.Tensor, orig_target_sizes: torch.Tensor):
        feats = self.backbone(images).flatten(2).transpose(1, 2)  # [B, Q = HW/1024, 64]
        feats = self.norm(feats)
        logits = self.score_head(feats)  # [B, Q, C]
        center = self.center_head(feats).sigmoid()  # [B, Q, 2]
        corners = self.corner_head(feats).reshape(*feats.shape[:2], 4, self.reg_max + 1)
        sides = (corners.softmax(-1) * self.project).sum(-1)  # [B, Q, 4] distances l,t,r,b
        boxes = torch.cat([center - sides[..., :2], center + sides[..., 2:]], -1)  # [B, Q, 4] xyxy
        boxes = boxes * orig_target_sizes.repeat(1, 2).unsqueeze(1)
        scores = logits.sigmoid().flatten(1)  # [B, Q*C]
        top, index = scores.topk(self.top_k, dim=1)
        labels = index - index // self.num_classes * self.num_classes
        query = index // self.num_classes
        boxes = boxes.gather(1, query.unsqueeze(-1).repeat(1, 1, 4))
        return labels, boxes, top
