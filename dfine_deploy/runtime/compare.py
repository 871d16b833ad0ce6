"""Do two backends give the same detections? IoU-matched agreement of two result lists.

Numerical differences between backends (FP32 kernels, FP16 autocast, TensorRT tactics) reorder
near-tied scores, so detections are matched, not compared position by position: each of the
reference's top detections is paired with the other side's same-label detection of highest IoU.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from dfine_deploy.boxes import match_greedy
from dfine_deploy.compat import zip_strict
from dfine_deploy.runtime.detections import Detections


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
    for ref, oth in zip_strict(reference, other):
        order = np.argsort(-ref.scores, kind="stable")[:top_k]
        compared += len(order)
        if not len(order) or not len(oth):
            continue
        partner, ious = match_greedy(
            ref.boxes[order],
            oth.boxes,
            iou_threshold,
            ref_labels=ref.labels[order],
            cand_labels=oth.labels,
            exclusive=False,
        )
        for index, column, iou in zip_strict(order, partner, ious):
            if column < 0:
                continue
            matched += 1
            min_iou = min(min_iou, float(iou))
            box_diff = max(box_diff, float(np.abs(ref.boxes[index] - oth.boxes[column]).max()))
            score_diff = max(score_diff, float(abs(ref.scores[index] - oth.scores[column])))
    return Agreement(
        compared, matched, iou_threshold, round(min_iou, 4), round(box_diff, 3), round(score_diff, 5)
    )
