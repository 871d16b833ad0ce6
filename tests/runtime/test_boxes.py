"""The numpy box module shared by the parity gate, backend agreement and the confusion matrix."""

from __future__ import annotations

import numpy as np
import pytest

from dfine_deploy.boxes import average_precision, box_iou, match_greedy, xywh_to_xyxy


def test_box_iou_against_hand_computed_values():
    a = np.array([[0, 0, 10, 10]], dtype=np.float32)
    b = np.array([[0, 0, 10, 10], [5, 0, 15, 10], [20, 20, 30, 30]], dtype=np.float32)
    np.testing.assert_allclose(box_iou(a, b), [[1.0, 50 / 150, 0.0]], rtol=1e-6)
    empty = np.zeros((1, 4), dtype=np.float32)
    assert box_iou(empty, empty)[0, 0] == 0.0  # no division by zero


def test_xywh_to_xyxy():
    np.testing.assert_allclose(xywh_to_xyxy(np.array([[10, 20, 5, 6]])), [[10, 20, 15, 26]])


def test_greedy_match_is_one_to_one_unless_told_otherwise():
    ref = np.array([[0, 0, 10, 10], [0, 0, 10, 10.5]], dtype=np.float32)
    cand = np.array([[0, 0, 10, 10]], dtype=np.float32)
    index, iou = match_greedy(ref, cand, 0.5)
    assert index.tolist() == [0, -1] and iou[0] == pytest.approx(1.0) and iou[1] == 0.0
    index, _ = match_greedy(ref, cand, 0.5, exclusive=False)
    assert index.tolist() == [0, 0]


def test_greedy_match_respects_labels_and_threshold():
    ref = np.array([[0, 0, 10, 10], [20, 20, 30, 30]], dtype=np.float32)
    cand = np.array([[0, 0, 10, 10], [22, 20, 32, 30]], dtype=np.float32)
    index, _ = match_greedy(ref, cand, 0.5, ref_labels=np.array([0, 1]), cand_labels=np.array([1, 1]))
    assert index.tolist() == [-1, 1]  # the first pair has the wrong label
    index, _ = match_greedy(ref, cand, 0.9)
    assert index.tolist() == [0, -1]  # IoU 8/12 is below 0.9
    index, _ = match_greedy(ref, cand[:0], 0.5)
    assert index.tolist() == [-1, -1]


def test_average_precision_drops_when_half_the_detections_are_lost():
    rng = np.random.default_rng(5)
    xy = rng.uniform(0, 400, (20, 2))
    boxes = np.concatenate([xy, xy + rng.uniform(20, 200, (20, 2))], -1)
    scores = np.sort(rng.uniform(0.05, 0.95, 20))[::-1]
    labels = rng.integers(0, 4, 20)
    gt = [(labels, boxes)]
    full = average_precision(gt, [(labels, boxes, scores)])
    half = average_precision(gt, [(labels[:10], boxes[:10], scores[:10])])
    assert full == pytest.approx(100.0)
    assert 30.0 < half < 70.0


def test_one_label_per_box_keeps_the_best_class_of_each_query():
    from dfine_deploy.runtime.detections import Detections

    box_a, box_b = [10, 10, 50, 40], [60, 5, 90, 30]
    dets = Detections.build(
        np.array([box_a, box_b, box_a, [10, 10, 50, 41]]),  # the last box differs: another object
        np.array([0.3, 0.8, 0.6, 0.4]),
        np.array([2, 1, 0, 2]),
        ["rectangle", "ellipse", "triangle"],
    )
    kept = dets.one_label_per_box()
    assert kept.scores.tolist() == pytest.approx([0.8, 0.6, 0.4])
    assert kept.names == ["ellipse", "rectangle", "triangle"] and kept.labels.tolist() == [1, 0, 2]
    assert kept.boxes.tolist() == [box_b, box_a, [10, 10, 50, 41]]
    assert len(Detections.build(np.zeros((0, 4)), [], [], []).one_label_per_box()) == 0
