"""The parity gate's arithmetic, and that it catches what a scores-only check would miss."""

from __future__ import annotations

import numpy as np
import pytest

from dfine_deploy.boxes import postprocess_numpy
from dfine_deploy.errors import ParityError
from dfine_deploy.export import parity


def _detections(seed: int, batch: int = 2, k: int = 30, classes: int = 4):
    rng = np.random.default_rng(seed)
    xy = rng.uniform(0, 400, (batch, k, 2))
    wh = rng.uniform(20, 200, (batch, k, 2))
    boxes = np.concatenate([xy, xy + wh], -1).astype(np.float32)
    scores = np.sort(rng.uniform(0.05, 0.95, (batch, k)), axis=1)[:, ::-1].astype(np.float32).copy()
    labels = rng.integers(0, classes, (batch, k)).astype(np.int64)
    return labels, boxes, scores


def test_identical_outputs_pass_with_perfect_figures():
    out = _detections(0)
    report = parity.compare_outputs([out], [out], parity.FP32_GATE)
    assert report.passed, report.failures
    assert report.box_agreement == 1.0 and report.label_agreement == 1.0
    assert report.pseudo_ap == pytest.approx(100.0)
    assert report.score_max_abs == 0.0


def test_reordered_queries_still_match():
    """Near-tied scores may swap places between runtimes; matching is by IoU, not by position."""
    labels, boxes, scores = _detections(1)
    perm = np.random.default_rng(2).permutation(boxes.shape[1])
    shuffled = (labels[:, perm], boxes[:, perm], scores[:, perm])
    report = parity.compare_outputs([(labels, boxes, scores)], [shuffled], parity.FP32_GATE)
    assert report.box_agreement == 1.0 and report.passed


def test_moved_boxes_with_identical_scores_fail_the_gate():
    """The TensorRT GridSample failure mode: scores unchanged, boxes off. Scores-only would pass."""
    labels, boxes, scores = _detections(3)
    moved = boxes.copy()
    moved[..., 2:] += 25.0  # grow every box by 25 px to the bottom right
    report = parity.compare_outputs([(labels, boxes, scores)], [(labels, moved, scores)], parity.FP32_GATE)
    assert report.score_max_abs == 0.0  # a scores-only check would call this perfect
    assert not report.passed
    assert report.box_agreement < 0.5
    assert any("boxes" in f for f in report.failures)
    with pytest.raises(ParityError, match="boxes"):
        parity.enforce(report, force=False)
    parity.enforce(report, force=True)  # --force keeps it


def test_label_flips_are_reported_as_labels():
    labels, boxes, scores = _detections(4)
    flipped = (labels + 1) % 4
    report = parity.compare_outputs([(labels, boxes, scores)], [(flipped, boxes, scores)], parity.FP32_GATE)
    assert report.label_agreement == 0.0 and not report.passed
    assert any("labels agree" in f for f in report.failures)


def test_postprocess_numpy_picks_top_query_class_pairs():
    logits = np.full((1, 3, 2), -5.0, dtype=np.float32)
    logits[0, 1, 0] = 3.0  # query 1, class 0 is the best
    logits[0, 2, 1] = 1.0  # query 2, class 1 second
    boxes = np.array([[[0.5, 0.5, 0.2, 0.2], [0.25, 0.5, 0.5, 1.0], [0.5, 0.5, 1.0, 1.0]]], np.float32)
    labels, xyxy, scores = postprocess_numpy(logits, boxes, np.array([[200, 100]]), 2)
    assert labels.tolist() == [[0, 1]]
    np.testing.assert_allclose(xyxy[0, 0], [0, 0, 100, 100], atol=1e-4)
    np.testing.assert_allclose(scores[0, 0], 1 / (1 + np.exp(-3.0)), rtol=1e-6)


def test_synthetic_scenes_are_deterministic_and_batched():
    a, b = parity.synthetic_scenes(3, seed=7), parity.synthetic_scenes(3, seed=7)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    batches = parity.make_batches(parity.synthetic_scenes(7), 64, 96, (1, 2, 4))
    assert [bt.images.shape for bt in batches] == [(1, 3, 64, 96), (2, 3, 64, 96), (4, 3, 64, 96)]
    assert batches[1].orig_sizes.dtype == np.int64 and batches[0].orig_sizes.tolist() == [[640, 480]]
    assert batches[2].images.min() >= 0.0 and batches[2].images.max() <= 1.0


def test_near_tied_reference_scores_do_not_gate_the_ranking_metric():
    """Random weights put every score near the prior: ranks are noise, boxes still must match."""
    labels, boxes, _ = _detections(6)
    tied = (
        np.full(labels.shape, 0.0100, dtype=np.float32)
        + np.linspace(0, 1e-5, labels.shape[1], dtype=np.float32)[::-1]
    )
    noisy = tied + np.random.default_rng(0).normal(0, 2e-5, tied.shape).astype(np.float32)
    report = parity.compare_outputs([(labels, boxes, tied)], [(labels, boxes, noisy)], parity.FP16_GATE)
    assert not report.pseudo_ap_gated and report.passed, report.summary()
    assert "not gated" in report.summary()


def test_rank_free_gate_tolerates_vanishing_detections_but_not_moved_boxes():
    labels, boxes, scores = _detections(7)
    half = (labels.copy(), boxes.copy(), scores.copy())
    half[1][:, ::2] += 300.0  # every other detection is replaced by an unrelated one
    strict = parity.compare_outputs([(labels, boxes, scores)], [half], parity.FP16_GATE)
    free = parity.compare_outputs([(labels, boxes, scores)], [half], parity.FP16_GATE, rank_free=True)
    assert not strict.passed and strict.box_agreement < 0.6
    assert free.passed and free.box_precision >= 0.9
    moved = (labels, boxes + np.array([0, 0, 30, 30], np.float32), scores)
    assert not parity.compare_outputs(
        [(labels, boxes, scores)], [moved], parity.FP16_GATE, rank_free=True
    ).passed


def test_a_reference_at_its_class_prior_is_gated_rank_free():
    """A model trained for an epoch scores every query the same to 1e-8: which queries make its top-k
    is rounding, so run_gate compares it as it compares random weights (boxes found must still agree)."""
    labels, boxes, _ = _detections(7)
    prior = np.full(labels.shape, 0.0121, dtype=np.float32)
    shuffled = (labels, np.roll(boxes, 3, axis=1), prior)  # other queries made the top-k
    batch = parity.ParityBatch(np.zeros((1, 3, 8, 8), np.float32), np.array([[8, 8]]), [0])
    strict = parity.compare_outputs([(labels, boxes, prior)], [shuffled], parity.INT8_GATE)
    assert not strict.passed
    assert parity.ranks_nothing([(labels, boxes, prior)], 20)
    report = parity.run_gate(
        lambda *_: (labels, boxes, prior),
        lambda *_: shuffled,
        [batch],
        parity.INT8_GATE,
        reference_name="one epoch",
        candidate_name="int8",
    )
    assert report.rank_free and "ranks nothing" in report.summary()
    _, _, ranked = _detections(7)
    assert not parity.ranks_nothing([(labels, boxes, ranked)], 20)


def test_near_duplicate_boxes_do_not_inflate_the_score_noise():
    """A trained detector often puts a weaker near-duplicate on an object. Pairing a detection with
    that duplicate (by IoU alone) read the duplicate's score gap as noise, left nothing decisive and
    let moved boxes pass with "box agreement nan"; the twin is the nearest score instead."""
    box = np.array([100.0, 100.0, 200.0, 200.0], np.float32)
    boxes = np.stack([box, box + [1, 1, 1, 1]] + [box + 300 + 40 * i for i in range(8)])[None]  # [1, 10, 4]
    labels = np.zeros((1, 10), np.int64)
    scores = np.array([[0.9, 0.3, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.35, 0.02]], np.float32)
    candidate_boxes = boxes.copy()
    candidate_boxes[0, 0] = box + [2, 2, 2, 2]  # IoU 0.92 with its own box, the duplicate's 0.96
    candidate_scores = scores + np.float32(0.01)
    report = parity.compare_outputs(
        [(labels, boxes, scores)], [(labels, candidate_boxes, candidate_scores)], parity.BF16_GATE
    )
    assert report.score_noise == pytest.approx(0.01, abs=1e-6)
    assert report.decisive >= 8 and report.box_agreement == 1.0 and report.passed, report.summary()
    moved = candidate_boxes.copy()
    moved[0, 2:] += [0, 0, 30, 30]  # every other object's box grows by 30 px: must fail
    assert not parity.compare_outputs(
        [(labels, boxes, scores)], [(labels, moved, candidate_scores)], parity.BF16_GATE
    ).passed


def test_scores_are_bounded_at_the_99th_percentile_not_by_one_detection():
    """One sensitive detection may move its score a lot (INT8 on a trained model: 0.3) while the
    objects and the mAP are kept; a shift of every score is what the bound is for."""
    labels, boxes, _ = _detections(5, batch=8, k=100)
    scores = np.tile(np.linspace(0.6, 0.05, 100, dtype=np.float32), (8, 1))
    scores[0, 0] = 0.95
    one_moved = scores.copy()
    one_moved[0, 0] = 0.65  # still that image's best detection, 0.3 lower
    report = parity.compare_outputs([(labels, boxes, scores)], [(labels, boxes, one_moved)], parity.INT8_GATE)
    assert report.score_max_abs == pytest.approx(0.3) and report.score_p99_abs == 0.0
    assert report.passed, report.failures
    shifted = np.clip(scores - 0.2, 0.0, 1.0)
    report = parity.compare_outputs([(labels, boxes, scores)], [(labels, boxes, shifted)], parity.INT8_GATE)
    assert not report.passed and any("99th percentile" in f for f in report.failures)


def _low_scoring_boxes_moved(moved_ranks: tuple[int, ...]):
    """Four images whose five top detections are decisive and whose other 25 sit near the prior; the
    candidate keeps the scores (noise 0.003) and moves the boxes of `moved_ranks` to IoU ~0.87."""
    rng = np.random.default_rng(5)
    batch, k = 4, 30
    xy = rng.uniform(0, 400, (batch, k, 2))
    wh = rng.uniform(40, 200, (batch, k, 2))
    boxes = np.concatenate([xy, xy + wh], -1).astype(np.float32)
    high = np.linspace(0.9, 0.7, 5)[None].repeat(batch, 0)
    scores = -np.sort(-np.concatenate([high, rng.uniform(0.05, 0.06, (batch, k - 5))], 1), axis=1)
    labels = rng.integers(0, 4, (batch, k)).astype(np.int64)
    moved = boxes.copy()
    for rank in moved_ranks:
        moved[:, rank, 0::2] += 0.07 * (boxes[:, rank, 2:3] - boxes[:, rank, 0:1])
    noisy = scores + rng.normal(0, 0.003, scores.shape)
    return (labels, boxes, scores.astype(np.float32)), (labels, moved, noisy.astype(np.float32))


def test_int8_holds_low_scoring_boxes_to_its_own_precision_bound():
    """INT8 moves the low-scoring boxes of the top-20 most (docs/export.md): a fifth of the found
    boxes under IoU 0.9, every decisive one kept, passes INT8's 75 % and fails FP16's 90 %; two
    fifths fail INT8 too."""
    reference, candidate = _low_scoring_boxes_moved((8, 11, 14, 17))
    int8 = parity.compare_outputs([reference], [candidate], parity.INT8_GATE)
    assert int8.passed and int8.box_agreement == 1.0 and int8.box_precision == pytest.approx(0.8)
    fp16 = parity.compare_outputs([reference], [candidate], parity.FP16_GATE)
    assert any("80.0% of the detections found in both" in f and "needed 90%" in f for f in fp16.failures)
    reference, candidate = _low_scoring_boxes_moved((6, 8, 10, 11, 13, 14, 16, 17))
    int8 = parity.compare_outputs([reference], [candidate], parity.INT8_GATE)
    assert not int8.passed and any("needed 75%" in f for f in int8.failures), int8.failures
