"""IoU-matched agreement between two backends' detections."""

from __future__ import annotations

import numpy as np
import pytest

from dfine_deploy.runtime.compare import compare_detections
from dfine_deploy.runtime.detections import Detections


def dets(boxes, scores, labels) -> Detections:
    return Detections.build(np.array(boxes, np.float32), np.array(scores), np.array(labels), ["a", "b"])


def test_agreement_tolerates_reordering_and_reports_worst_differences():
    ref = dets([[0, 0, 100, 100], [200, 200, 300, 300], [50, 50, 60, 60]], [0.9, 0.5, 0.4999], [0, 1, 1])
    # the other backend: near-tied scores swapped in order, one box 1 px off, a score 0.001 off
    other = dets(
        [[50, 50, 60, 60], [0, 0, 101, 100], [200, 200, 300, 300]], [0.5001, 0.899, 0.4998], [1, 0, 1]
    )
    agreement = compare_detections([ref], [other], top_k=3, iou_threshold=0.9)
    assert agreement.compared == 3 and agreement.matched == 3 and agreement.match_rate == 1.0
    assert agreement.max_box_diff_px == pytest.approx(1.0)
    assert agreement.max_score_diff == pytest.approx(0.001, abs=1e-6)


def test_a_changed_label_or_moved_box_is_not_a_match():
    ref = dets([[0, 0, 100, 100], [200, 200, 300, 300]], [0.9, 0.8], [0, 1])
    other = dets([[0, 0, 100, 100], [230, 200, 330, 300]], [0.9, 0.8], [1, 1])
    agreement = compare_detections([ref], [other], top_k=2)
    assert agreement.matched == 0 and agreement.match_rate == 0.0
    with pytest.raises(ValueError):
        compare_detections([ref], [ref, ref])
