"""Drawing detections and counting on frames, and JPEG encoding for the MJPEG view (recordings use the
same pictures: recording.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from dfine_deploy.errors import ServeError
from dfine_deploy.serve.settings import CountingLine, CountingZone

LINE_COLOUR = (0, 255, 255)  # BGR yellow
ZONE_COLOUR = (255, 200, 0)  # BGR light blue
ARROW_FRACTION = 0.06  # the "in" arrow's length, as a fraction of the frame's shorter side
LEGEND_ALPHA = 0.6  # how much the counts legend darkens the picture under it
LEGEND_MIN_WIDTH = 120  # pixels a legend row may take before it wraps, on a small frame


def _colour(label: int) -> tuple[int, int, int]:
    """A stable, well-spread BGR colour per class (golden-ratio hue steps)."""
    hue = int((label * 0.618033988749895 % 1.0) * 180)
    hsv = np.array([[[hue, 200, 255]]], dtype=np.uint8)
    b, g, r = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0]
    return int(b), int(g), int(r)


def _caption_height(rows: Sequence[str], scale: float) -> int:
    return len(rows) * _row_height(rows, scale)


def _row_height(rows: Sequence[str], scale: float) -> int:
    return (
        max(
            th + base
            for (_, th), base in (cv2.getTextSize(r, cv2.FONT_HERSHEY_SIMPLEX, scale, 1) for r in rows)
        )
        + 2
    )


def _caption_rect(
    frame_hw: tuple[int, ...], rows: Sequence[str], left: int, top: int, scale: float
) -> tuple[int, int, int, int]:
    """Where `_caption` puts its box (x1, y1, x2, y2): at (left, top), moved inside the frame."""
    width = max(cv2.getTextSize(r, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][0] for r in rows) + 2
    height = _caption_height(rows, scale)
    h, w = frame_hw[:2]
    left = min(max(left, 0), max(w - width, 0))
    top = min(max(top, 0), max(h - height, 0))
    return left, top, left + width, top + height


def _caption(
    out: np.ndarray, rows: Sequence[str], left: int, top: int, colour: tuple[int, int, int], scale: float
) -> tuple[int, int, int, int]:
    """Black text rows on a filled box of `colour` with its top-left corner at (left, top), moved
    inside the frame where it would stick out; returns the box."""
    row_h = _row_height(rows, scale)
    rect = _caption_rect(out.shape, rows, left, top, scale)
    cv2.rectangle(out, rect[:2], rect[2:], colour, -1)
    for i, row in enumerate(rows):
        text_h = cv2.getTextSize(row, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][1]
        baseline = (rect[0] + 1, rect[1] + i * row_h + text_h + 1)
        cv2.putText(out, row, baseline, cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1, cv2.LINE_AA)
    return rect


def line_rows(name: str, crossings: dict[str, dict[str, int]] | None) -> str:
    """A line's legend row: 'name in/out: class N/M, ...' per class that crossed it."""
    by_direction = crossings or {}
    into, out = by_direction.get("in", {}), by_direction.get("out", {})
    classes = sorted({*into, *out})
    if not classes:
        return f"{name}: none crossed"
    return f"{name} in/out: " + ", ".join(f"{cls} {into.get(cls, 0)}/{out.get(cls, 0)}" for cls in classes)


def zone_rows(name: str, inside: dict[str, int] | None) -> str:
    """A zone's legend row: 'name: class N, ...' per class inside it now."""
    if not inside:
        return f"{name}: empty"
    return f"{name}: " + ", ".join(f"{cls} {n}" for cls, n in sorted(inside.items()))


def _wrapped(row: str, width: int, scale: float) -> list[str]:
    """`row` cut after its ": " and at its ", " into pieces no wider than `width` pixels where it can
    be; a piece after the first is indented."""
    head, colon, rest = row.partition(": ")
    parts = [head + colon.rstrip(), *rest.split(", ")] if rest else [row]
    pieces, current = [], ""
    for i, part in enumerate(parts):
        joined = f"{current}{' ' if i == 1 else ', '}{part}" if current else part
        if current and cv2.getTextSize(joined, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][0] > width:
            pieces.append(current + ("," if i > 1 else ""))
            joined = "  " + part
        current = joined
    return [*pieces, current]


def _legend_origin(
    frame_hw: tuple[int, int], size: tuple[int, int], boxes: list[tuple[int, ...]]
) -> tuple[int, int]:
    """The frame corner where a legend of `size` (w, h) covers the least box area (top-left on ties)."""
    h, w = frame_hw
    lw, lh = size
    corners = [(0, 0), (max(w - lw, 0), 0), (0, max(h - lh, 0)), (max(w - lw, 0), max(h - lh, 0))]

    def covered(corner: tuple[int, int]) -> int:
        x, y = corner
        return sum(
            max(0, min(x + lw, x2) - max(x, x1)) * max(0, min(y + lh, y2) - max(y, y1))
            for x1, y1, x2, y2 in boxes
        )

    return min(corners, key=covered)


def _legend(
    out: np.ndarray, rows: Sequence[tuple[str, tuple[int, int, int]]], boxes: list, scale: float
) -> None:
    """The counts as one compact block, each row in its line's or zone's colour on a dark ground, in
    the corner where it covers least of `boxes` (x1, y1, x2, y2); drawn before the detections' boxes,
    so that it is never over one."""
    h, w = out.shape[:2]
    wrap = min(w - 4, max(w // 2, LEGEND_MIN_WIDTH))  # a block that fits a corner, not a band
    lines = [(piece, colour) for row, colour in rows for piece in _wrapped(row, wrap, scale)]
    row_h = _row_height([text for text, _ in lines], scale)
    width = min(w, max(cv2.getTextSize(t, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][0] for t, _ in lines) + 4)
    height = min(h, row_h * len(lines) + 2)
    left, top = _legend_origin((h, w), (width, height), boxes)
    region = out[top : top + height, left : left + width]
    region[:] = (region * (1 - LEGEND_ALPHA)).astype(np.uint8)  # darkened, the scene still shows
    for i, (text, colour) in enumerate(lines):
        text_h = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][1]
        baseline = (left + 2, top + i * row_h + text_h + 2)
        cv2.putText(out, text, baseline, cv2.FONT_HERSHEY_SIMPLEX, scale, colour, 1, cv2.LINE_AA)


def draw(
    image: np.ndarray,
    detections: list[dict[str, Any]],
    lines: Sequence[CountingLine] = (),
    zones: Sequence[CountingZone] = (),
    counts: dict[str, Any] | None = None,
) -> np.ndarray:
    """A copy of a BGR frame with the zones and the counting lines (each tagged with its name, the lines
    with an arrow to their "in" side), the counts per class of every line and zone in one legend in the
    corner the detections cover least (`counts` as in a result), and boxes captioned '#track name
    score' (detections in result JSON form) drawn last, so that nothing covers them."""
    out = image.copy()
    thickness = max(1, round(min(out.shape[:2]) / 300))
    scale = 0.4 * thickness
    counts = counts or {}
    rows = [(line_rows(line.name, counts.get("lines", {}).get(line.name)), LINE_COLOUR) for line in lines]
    rows += [(zone_rows(zone.name, counts.get("zones", {}).get(zone.name)), ZONE_COLOUR) for zone in zones]
    covered: list[tuple[int, int, int, int]] = []  # what the legend should stay off: boxes, captions, tags
    for zone in zones:
        points = np.round(np.asarray(zone.polygon)).astype(np.int32).reshape(-1, 1, 2)
        cv2.polylines(out, [points], True, ZONE_COLOUR, thickness, cv2.LINE_AA)
        x, y = points.reshape(-1, 2).min(axis=0)
        covered.append(_caption(out, [zone.name], int(x) + 2, int(y) + 2, ZONE_COLOUR, scale))
    for line in lines:
        start, end = (tuple(int(round(v)) for v in p) for p in (line.start, line.end))
        cv2.line(out, start, end, LINE_COLOUR, thickness + 1, cv2.LINE_AA)
        length = ARROW_FRACTION * min(out.shape[:2])
        nx, ny = line.in_direction()
        middle = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
        tip = (round(middle[0] + nx * length), round(middle[1] + ny * length))
        cv2.arrowedLine(
            out, tuple(round(v) for v in middle), tip, LINE_COLOUR, thickness, cv2.LINE_AA, 0, 0.4
        )
        covered.append(_caption(out, [line.name], start[0] + 2, start[1] + 2, LINE_COLOUR, scale))
    boxes = []
    for det in detections:
        x1, y1, x2, y2 = (int(round(v)) for v in det["box"])
        track = f"#{det['track_id']} " if det.get("track_id") is not None else ""
        caption = [f"{track}{det['name']} {det['score']:.2f}"]
        boxes.append(((x1, y1, x2, y2), caption, _colour(int(det["label"]))))
        covered += [
            (x1, y1, x2, y2),
            _caption_rect(out.shape, caption, x1, y1 - _caption_height(caption, scale), scale),
        ]
    if rows:
        _legend(out, rows, covered, scale)
    for (x1, y1, x2, y2), caption, colour in boxes:
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, thickness)
        _caption(out, caption, x1, y1 - _caption_height(caption, scale), colour, scale)
    return out


def encode_jpeg(image: np.ndarray, quality: int = 80) -> bytes:
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ServeError("OpenCV could not encode a frame as JPEG")
    return buf.tobytes()
