"""Tiles: detect small objects in a large frame by detecting overlapping crops, then merge.

A detector sees a frame at its input size (640, or 256 for the quickstart model), so a 1080p frame
shrinks 4-8x and a 16-pixel object becomes 2-4 pixels. A 3x2 grid of crops shrinks each crop 3x
less. The crops of one frame are just more images of one `Detector.predict` batch (dfine-serve puts
them in its cross-stream batch; dfine-bench --tiles times them as one batch).

Merging the crops' detections into one frame's: dfine_deploy/runtime/tile_merge.py.

Used by dfine_deploy/serve (per stream: `tiles:`), dfine_deploy/bench/tiles.py and the dense mode of
dfine_deploy/data/synthetic.py (which places objects on the seams).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Tuple

import numpy as np

Window = Tuple[int, int, int, int]  # x1, y1, x2, y2 (exclusive) in frame pixels; an alias runs on 3.8

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
