"""One frame's detections from the detections of its crops (the crops: dfine_deploy/tiles.py).

Merging, class by class: neighbouring crops overlap by `overlap` of a crop, so an object on a seam
is whole in one crop and cut in the other. A box that touches or crosses a crop edge inside the
frame is *cut*. Whole boxes are kept first (best score first); a box that overlaps a kept box of its
class is the same object: a cut piece under a whole box is dropped, two cut pieces are joined into
their union (an object wider than the overlap is cut in both crops), and two whole boxes are one
object when their IoU passes `SAME_OBJECT` (non-maximum suppression). A cut piece is compared by
intersection over the smaller box, since a piece is small beside the object it belongs to. From the
whole frame only objects larger than the overlap band are taken (`small_in_whole`): a smaller one is
whole in some crop and seen there at a finer scale, while the whole frame's box of it is coarse and
would not match the crop's box, so it would be counted twice.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dfine_deploy.runtime.detections import Detections
from dfine_deploy.tiles import Window

SAME_OBJECT = 0.5  # IoU of two whole boxes, or intersection over the smaller box with a cut piece
EDGE_PX = 2.0  # a box this close to a crop edge inside the frame is cut by it


def _cut(boxes: np.ndarray, window: Window, width: int, height: int) -> np.ndarray:
    """[N] bool: boxes (frame pixels) touching or crossing an edge of `window` that lies inside the
    frame. Crossing counts: a detector shown part of an object may draw its box a few pixels past the
    crop's edge (6 px on the quickstart model), and such a box is a piece, not a whole object."""
    x1, y1, x2, y2 = window
    cut = np.zeros(len(boxes), bool)
    if x1 > 0:
        cut |= boxes[:, 0] <= x1 + EDGE_PX
    if y1 > 0:
        cut |= boxes[:, 1] <= y1 + EDGE_PX
    if x2 < width:
        cut |= boxes[:, 2] >= x2 - EDGE_PX
    if y2 < height:
        cut |= boxes[:, 3] >= y2 - EDGE_PX
    return cut


def _same(a: np.ndarray, a_cut: np.ndarray, b: np.ndarray, b_cut: np.ndarray) -> np.ndarray:
    """[len(a), len(b)] bool: box pairs that are one object (IoU of two whole boxes, intersection
    over the smaller box where a cut piece is involved, at least SAME_OBJECT)."""
    ix = np.clip(np.minimum(a[:, None, 2], b[None, :, 2]) - np.maximum(a[:, None, 0], b[None, :, 0]), 0, None)
    iy = np.clip(np.minimum(a[:, None, 3], b[None, :, 3]) - np.maximum(a[:, None, 1], b[None, :, 1]), 0, None)
    inter = ix * iy
    area_a = np.maximum((a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]), 1e-6)[:, None]
    area_b = np.maximum((b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]), 1e-6)[None, :]
    iou, ios = inter / (area_a + area_b - inter), inter / np.minimum(area_a, area_b)
    whole = ~a_cut[:, None] & ~b_cut[None, :]
    return np.where(whole, iou, ios) >= SAME_OBJECT


def _merge_class(boxes: np.ndarray, cut: np.ndarray, group: np.ndarray) -> list[int]:
    """The kept indices among `group` (one class, in merge order); joined pieces are written into
    `boxes` as their union. Pairs are compared all at once; only a union is compared again."""
    same = _same(boxes[group], cut[group], boxes[group], cut[group])  # [n, n]
    kept = np.zeros(len(group), bool)
    for j in range(len(group)):
        hits = np.flatnonzero(same[j] & kept)
        if not len(hits):
            kept[j] = True
            continue
        k = int(hits[0])  # the first kept (best) box it matches
        if cut[group[k]] and cut[group[j]]:  # two pieces of one object: their union
            a, b = boxes[group[k]], boxes[group[j]]
            boxes[group[k]] = [min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])]
            row = _same(boxes[group[k : k + 1]], cut[group[k : k + 1]], boxes[group], cut[group])[0]
            same[k, :], same[:, k] = row, row
    return group[kept].tolist()


def merge(
    parts: Sequence[tuple[Window, Any]], width: int, height: int, small: tuple[float, float] = (0.0, 0.0)
) -> Detections:
    """One frame's detections from its crops' (`window`, detections in crop pixels); the module
    docstring gives the rule. `small`: boxes of the whole frame's window narrower and lower than
    this are dropped (`small_in_whole`). Order: descending score."""
    boxes, scores, labels, names, cut = [], [], [], [], []
    for window, det in parts:
        b = np.asarray(det.boxes, np.float32).reshape(-1, 4) + np.array(window[:2] * 2, np.float32)
        keep = np.ones(len(b), bool)
        if window == (0, 0, width, height):
            keep = ((b[:, 2] - b[:, 0]) >= small[0]) | ((b[:, 3] - b[:, 1]) >= small[1])
        boxes.append(b[keep])
        scores.append(np.asarray(det.scores, np.float32).reshape(-1)[keep])
        labels.append(np.asarray(det.labels, np.int64).reshape(-1)[keep])
        names.extend(n for n, k in zip(det.names, keep) if k)
        cut.append(_cut(b[keep], window, width, height))
    if not boxes or not sum(len(s) for s in scores):
        return Detections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), [])
    all_boxes, all_scores = np.concatenate(boxes), np.concatenate(scores)
    all_labels, all_cut = np.concatenate(labels), np.concatenate(cut)
    order = np.lexsort((-all_scores, all_cut))  # whole boxes first, each group best score first
    boxes_out, kept = all_boxes.copy(), []
    for label in np.unique(all_labels).tolist():
        group = order[all_labels[order] == label]  # this class, in the order above
        kept += _merge_class(boxes_out, all_cut, group)
    keep = np.array(kept, np.int64)
    result = Detections(boxes_out[keep], all_scores[keep], all_labels[keep], [names[i] for i in kept])
    by_score = np.argsort(-result.scores, kind="stable")
    return Detections(
        result.boxes[by_score], result.scores[by_score], result.labels[by_score],
        [result.names[i] for i in by_score],
    )  # fmt: skip
