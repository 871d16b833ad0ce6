"""Boxes on the numpy side: IoU, greedy matching and COCO-style AP, without torch.

One implementation for everything that compares detections outside the training graph: the export
parity gate (`export/parity.py`), backend agreement (`runtime/compare.py`) and the confusion matrix
(`evaluation.py`). Boxes are xyxy pixels unless a name says otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dfine_deploy.compat import zip_strict

__all__ = ["COCO_IOU_THRESHOLDS", "average_precision", "box_iou", "match_greedy", "xywh_to_xyxy"]

COCO_IOU_THRESHOLDS = tuple(float(t) for t in np.linspace(0.5, 0.95, 10))  # AP@[.50:.95]


def xywh_to_xyxy(boxes: np.ndarray) -> np.ndarray:
    """[N, 4] (x, y, w, h), COCO json's box format -> [N, 4] xyxy."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    return np.concatenate([boxes[:, :2], boxes[:, :2] + boxes[:, 2:]], axis=1)


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pairwise IoU of xyxy boxes: [N, 4] x [M, 4] -> [N, M]; 0 where both boxes are empty."""
    area_a = np.prod(np.clip(a[:, 2:] - a[:, :2], 0, None), axis=1)
    area_b = np.prod(np.clip(b[:, 2:] - b[:, :2], 0, None), axis=1)
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])  # [N, M, 2]
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.prod(np.clip(bottom_right - top_left, 0, None), axis=-1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.where(union > 0, inter / np.maximum(union, 1e-12), 0.0)


def match_greedy(
    ref_boxes: np.ndarray,
    cand_boxes: np.ndarray,
    iou_threshold: float,
    *,
    ref_labels: np.ndarray | None = None,
    cand_labels: np.ndarray | None = None,
    exclusive: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """Pair each reference box, in the order given (sort by score first), with a candidate.

    The partner is the candidate of highest IoU, of the same label when labels are given, and not
    yet taken when `exclusive` (COCO's one-to-one rule); pairs below `iou_threshold` are dropped.
    Returns (candidate index per reference box or -1 [N], the pair's IoU or 0 [N]).
    """
    n = len(ref_boxes)
    index = np.full(n, -1, dtype=np.int64)
    matched_iou = np.zeros(n, dtype=np.float64)
    if not n or not len(cand_boxes):
        return index, matched_iou
    iou = box_iou(ref_boxes, cand_boxes)  # [N, M]
    if ref_labels is not None and cand_labels is not None:
        iou[np.asarray(ref_labels)[:, None] != np.asarray(cand_labels)[None, :]] = -1.0
    taken = np.zeros(len(cand_boxes), dtype=bool)
    for row in range(n):
        ious = np.where(taken, -1.0, iou[row]) if exclusive else iou[row]
        column = int(np.argmax(ious))
        if ious[column] >= iou_threshold:
            index[row], matched_iou[row] = column, ious[column]
            taken[column] = exclusive
    return index, matched_iou


def average_precision(
    gt: Sequence[tuple[np.ndarray, np.ndarray]],
    dets: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    iou_thresholds: Sequence[float] = COCO_IOU_THRESHOLDS,
) -> float:
    """COCO-style mAP (0..100, 101-point interpolation) of detections against ground truth.

    gt: per image (labels [G], boxes [G, 4]); dets: per image (labels, boxes, scores).
    Classes absent from the ground truth are skipped, as in COCO.
    """
    classes = sorted({int(c) for labels, _ in gt for c in labels})
    if not classes:
        return 100.0
    aps = []
    for cls in classes:
        for threshold in iou_thresholds:
            records: list[tuple[float, bool]] = []
            n_gt = 0
            for (g_labels, g_boxes), (d_labels, d_boxes, d_scores) in zip_strict(gt, dets):
                truth = g_boxes[g_labels == cls]
                n_gt += len(truth)
                keep = d_labels == cls
                order = np.argsort(-d_scores[keep], kind="stable")
                boxes, scores = d_boxes[keep][order], d_scores[keep][order]
                hits, _ = match_greedy(boxes, truth, threshold)
                records += [(float(s), bool(h >= 0)) for s, h in zip_strict(scores, hits)]
            records.sort(key=lambda r: -r[0])
            hit = np.array([r[1] for r in records], dtype=np.float64)
            tp = np.cumsum(hit)
            fp = np.cumsum(1.0 - hit)
            recall = tp / max(n_gt, 1)
            precision = tp / np.maximum(tp + fp, 1e-12)
            precision = np.maximum.accumulate(precision[::-1])[::-1] if len(precision) else precision
            points = np.searchsorted(recall, np.linspace(0, 1, 101), side="left")
            sampled = [precision[i] if i < len(precision) else 0.0 for i in points]
            aps.append(float(np.mean(sampled)))
    return 100.0 * float(np.mean(aps))


def postprocess_numpy(
    logits: np.ndarray, boxes_cxcywh: np.ndarray, orig_sizes: np.ndarray, num_top_queries: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The deploy postprocessor in numpy, for graphs exported with --no-postprocess.

    logits [B,Q,C], boxes [B,Q,4] normalised cxcywh, orig_sizes [B,2] (w,h) ->
    labels [B,K], boxes [B,K,4] xyxy px, scores [B,K] (sigmoid scores, top-K over Q*C).
    """
    b, q, c = logits.shape
    scores = 1.0 / (1.0 + np.exp(-logits.reshape(b, q * c)))  # [B, Q*C]
    k = min(num_top_queries, q * c)
    index = np.argsort(-scores, axis=1, kind="stable")[:, :k]  # [B, K]
    top_scores = np.take_along_axis(scores, index, axis=1)
    labels = index % c
    query = index // c
    cx, cy, w, h = np.moveaxis(boxes_cxcywh, -1, 0)
    xyxy = np.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)  # [B, Q, 4]
    xyxy = xyxy * np.tile(orig_sizes, 2)[:, None, :].astype(np.float32)
    picked = np.take_along_axis(xyxy, query[..., None].repeat(4, -1), axis=1)  # [B, K, 4]
    return labels.astype(np.int64), picked.astype(np.float32), top_scores.astype(np.float32)
