"""Tiles: detect small objects in a large frame by detecting overlapping crops, then merge.

A detector sees a frame at its input size (640, or 256 for the quickstart model), so a 1080p frame
shrinks 4-8x and a 16-pixel object becomes 2-4 pixels. A 3x2 grid of crops shrinks each crop 3x
less. The crops of one frame are just more images of one `Detector.predict` batch (dfine-serve puts
them in its cross-stream batch; dfine-bench --tiles times them as one batch).

Merging, class by class: neighbouring crops overlap by `overlap` of a crop, so an object on a seam
is whole in one crop and cut in the other. A box that touches a crop edge inside the frame is *cut*.
Whole boxes are kept first (best score first); a box that overlaps a kept box of its class is the
same object: a cut piece under a whole box is dropped, two cut pieces are joined into their union
(an object wider than the overlap is cut in both crops), and two whole boxes are one object when
their IoU passes `SAME_OBJECT` (non-maximum suppression). A cut piece is compared by intersection
over the smaller box, since a piece is small beside the object it belongs to. From the whole frame
only objects larger than the overlap band are taken (`small_in_whole`): a smaller one is whole in some
crop and seen there at a finer scale, while the whole frame's box of it is coarse and would not
match the crop's box, so it would be counted twice.

Used by dfine_deploy/serve (per stream: `tiles:`), dfine_deploy/bench/tiles.py and the dense mode of
dfine_deploy/data/synthetic.py (which places objects on the seams).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from dfine_deploy.runtime.detections import Detections

Window = tuple[int, int, int, int]  # x1, y1, x2, y2 (exclusive) in frame pixels; typing: 3.8 evaluates it

SAME_OBJECT = 0.5  # IoU of two whole boxes, or intersection over the smaller box with a cut piece
EDGE_PX = 2.0  # a box this close to a crop edge inside the frame is cut by it
GRID_FORM = re.compile(r"^(\d{1,2})x(\d{1,2})$")


@dataclass(frozen=True)
class TileSpec:
    """How to cut a frame: `grid` (columns, rows), neighbours overlapping by `overlap` of a crop, and
    with `full_frame` the whole frame too (large objects are whole only there)."""

    grid: tuple[int, int] = (3, 2)
    overlap: float = 0.2
    full_frame: bool = True

    def __post_init__(self) -> None:
        cols, rows = self.grid
        if not (1 <= cols <= 16 and 1 <= rows <= 16) or cols * rows < 2:
            raise ValueError(f"grid {list(self.grid)}: give [columns, rows], each 1-16, at least 2 crops")
        if not 0.0 <= self.overlap <= 0.5:
            raise ValueError(f"overlap {self.overlap!r}: give a fraction of a crop in [0, 0.5]")

    @property
    def images(self) -> int:
        """Detector inputs per frame."""
        return self.grid[0] * self.grid[1] + int(self.full_frame)

    @classmethod
    def from_text(cls, text: str, overlap: float = 0.2, full_frame: bool = True) -> TileSpec:
        """'3x2' -> TileSpec((3, 2), ...)."""
        match = GRID_FORM.match(text.strip())
        if not match:
            raise ValueError(f"{text!r}: give COLUMNSxROWS, e.g. 3x2")
        return cls((int(match.group(1)), int(match.group(2))), overlap, full_frame)

    @classmethod
    def from_mapping(cls, data: Any) -> TileSpec:
        """The stream list's `tiles: {grid: [3, 2], overlap: 0.2, full_frame: true}`; ValueError names
        the key."""
        if not isinstance(data, dict):
            raise ValueError(
                f"expected a mapping {{grid: [3, 2], overlap: 0.2, full_frame: true}}, got {data!r}"
            )
        unknown = sorted(set(data) - {"grid", "overlap", "full_frame"})
        if unknown:
            raise ValueError(f"unknown key '{unknown[0]}' (valid keys: full_frame, grid, overlap)")
        grid = data.get("grid", [3, 2])
        if not (
            isinstance(grid, (list, tuple))
            and len(grid) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in grid)
        ):
            raise ValueError(f"grid {grid!r}: give [columns, rows] as two integers, e.g. [3, 2]")
        overlap = data.get("overlap", 0.2)
        if isinstance(overlap, bool) or not isinstance(overlap, (int, float)):
            raise ValueError(f"overlap {overlap!r}: give a fraction of a crop in [0, 0.5]")
        full = data.get("full_frame", True)
        if not isinstance(full, bool):
            raise ValueError(f"full_frame {full!r}: give true or false")
        return cls((grid[0], grid[1]), float(overlap), full)

    def to_dict(self) -> dict[str, Any]:
        return {"grid": list(self.grid), "overlap": self.overlap, "full_frame": self.full_frame}


def _spans(length: int, count: int, overlap: float) -> list[tuple[int, int]]:
    """`count` equal spans covering [0, length), neighbours sharing `overlap` of a span."""
    if count == 1:
        return [(0, length)]
    span = length / (count - (count - 1) * overlap)
    step = span * (1 - overlap)
    starts = [round(i * step) for i in range(count)]
    return [(s, min(length, round(s + span))) if i < count - 1 else (length - round(span), length)
            for i, s in enumerate(starts)]  # fmt: skip


def tile_windows(width: int, height: int, spec: TileSpec) -> list[Window]:
    """The crops of a `width` x `height` frame, row by row, then the whole frame with `full_frame`."""
    cols, rows = spec.grid
    windows = [
        (x1, y1, x2, y2)
        for y1, y2 in _spans(height, rows, spec.overlap)
        for x1, x2 in _spans(width, cols, spec.overlap)
    ]
    if spec.full_frame:
        windows.append((0, 0, width, height))
    return windows


def seams(width: int, height: int, spec: TileSpec) -> tuple[list[int], list[int]]:
    """The x and y positions of crop edges inside the frame (where objects get cut)."""
    xs = sorted({e for x1, _, x2, _ in tile_windows(width, height, spec) for e in (x1, x2)} - {0, width})
    ys = sorted({e for _, y1, _, y2 in tile_windows(width, height, spec) for e in (y1, y2)} - {0, height})
    return xs, ys


def small_in_whole(width: int, height: int, spec: TileSpec) -> tuple[float, float]:
    """(w, h): a box of the whole frame narrower and lower than this is left to the crops (the band
    two neighbouring crops share)."""
    x1, y1, x2, y2 = tile_windows(width, height, spec)[0]
    cols, rows = spec.grid
    return ((x2 - x1) * spec.overlap if cols > 1 else 0.0, (y2 - y1) * spec.overlap if rows > 1 else 0.0)


def crops(image: np.ndarray, windows: Sequence[Window]) -> list[np.ndarray]:
    """The windows of `image` as contiguous arrays (what a detector's batch holds)."""
    return [np.ascontiguousarray(image[y1:y2, x1:x2]) for x1, y1, x2, y2 in windows]


def _cut(boxes: np.ndarray, window: Window, width: int, height: int) -> np.ndarray:
    """[N] bool: boxes (frame pixels) touching an edge of `window` that lies inside the frame."""
    x1, y1, x2, y2 = window
    cut = np.zeros(len(boxes), bool)
    for axis, edge, inside in ((0, x1, x1 > 0), (1, y1, y1 > 0), (2, x2, x2 < width), (3, y2, y2 < height)):
        if inside:
            cut |= np.abs(boxes[:, axis] - edge) <= EDGE_PX
    return cut


def _overlaps(box: np.ndarray, others: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """IoU and intersection over the smaller box of `box` [4] with each of `others` [M, 4]."""
    ix = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    iy = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = ix * iy
    area = max(float((box[2] - box[0]) * (box[3] - box[1])), 1e-6)
    areas = np.maximum((others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1]), 1e-6)
    return inter / (area + areas - inter), inter / np.minimum(area, areas)


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
    kept: list[int] = []
    kept_boxes = np.zeros((0, 4), np.float32)
    kept_cut: list[bool] = []
    for i in order.tolist():
        same = [k for k, j in enumerate(kept) if all_labels[j] == all_labels[i]]
        if same:
            iou, ios = _overlaps(all_boxes[i], kept_boxes[same])
            match = None
            for k, a, b in zip(same, iou, ios):
                whole_pair = not all_cut[i] and not kept_cut[k]
                if (a if whole_pair else b) >= SAME_OBJECT:
                    match = k
                    break
            if match is not None:
                if kept_cut[match] and all_cut[i]:  # two pieces of one object: their union
                    a, b = kept_boxes[match], all_boxes[i]
                    kept_boxes[match] = [min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3])]
                continue
        kept.append(i)
        kept_boxes = np.concatenate([kept_boxes, all_boxes[i : i + 1]])
        kept_cut.append(bool(all_cut[i]))
    result = Detections(kept_boxes, all_scores[kept], all_labels[kept], [names[i] for i in kept])
    by_score = np.argsort(-result.scores, kind="stable")
    return Detections(
        result.boxes[by_score], result.scores[by_score], result.labels[by_score],
        [result.names[i] for i in by_score],
    )  # fmt: skip
