"""Do two backends give the same detections? IoU-matched agreement of two result lists.

Numerical differences between backends (FP32 kernels, FP16 autocast, TensorRT tactics) reorder
near-tied scores, so detections are matched, not compared position by position: each of the
reference's top detections is paired with the other side's same-label detection of highest IoU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dfine_deploy.runtime.detections import Detections


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes: [A, 4] x [B, 4] -> [A, B]."""
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])  # [A, B, 2]
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=2)
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    return inter / np.maximum(area_a[:, None] + area_b[None, :] - inter, 1e-9)


@dataclass
class Agreement:
    compared: int  # reference detections looked at
    matched: int  # of those, found on the other side (same label, IoU >= iou_threshold)
    iou_threshold: float
    min_iou: float  # worst IoU among the matched
    max_box_diff_px: float  # worst coordinate difference among the matched
    max_score_diff: float

    @property
    def match_rate(self) -> float:
        return self.matched / self.compared if self.compared else 1.0

    def to_dict(self) -> dict:
        data = asdict(self)
        data["match_rate"] = round(self.match_rate, 4)
        return data


def compare_detections(
    reference: list[Detections], other: list[Detections], *, top_k: int = 20, iou_threshold: float = 0.9
) -> Agreement:
    """Match the reference's `top_k` highest-scoring detections per frame against `other`."""
    compared = matched = 0
    min_iou, box_diff, score_diff = 1.0, 0.0, 0.0
    for ref, oth in zip(reference, other, strict=True):
        order = np.argsort(-ref.scores, kind="stable")[:top_k]
        compared += len(order)
        if not len(order) or not len(oth):
            continue
        ious = box_iou(ref.boxes[order], oth.boxes)  # [k, M]
        ious[ref.labels[order][:, None] != oth.labels[None, :]] = 0.0
        best = ious.argmax(axis=1)
        for row, (index, column) in enumerate(zip(order, best)):
            iou = float(ious[row, column])
            if iou < iou_threshold:
                continue
            matched += 1
            min_iou = min(min_iou, iou)
            box_diff = max(box_diff, float(np.abs(ref.boxes[index] - oth.boxes[column]).max()))
            score_diff = max(score_diff, float(abs(ref.scores[index] - oth.scores[column])))
    return Agreement(
        compared, matched, iou_threshold, round(min_iou, 4), round(box_diff, 3), round(score_diff, 5)
    )
