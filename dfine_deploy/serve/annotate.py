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


def _caption(
    out: np.ndarray, rows: Sequence[str], left: int, top: int, colour: tuple[int, int, int], scale: float
) -> None:
    """Black text rows on a filled box of `colour` with its top-left corner at (left, top), moved
    inside the frame where it would stick out."""
    row_h = _row_height(rows, scale)
    width = max(cv2.getTextSize(r, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][0] for r in rows) + 2
    height = row_h * len(rows)
    h, w = out.shape[:2]
    left = min(max(left, 0), max(w - width, 0))
    top = min(max(top, 0), max(h - height, 0))
    cv2.rectangle(out, (left, top), (left + width, top + height), colour, -1)
    for i, row in enumerate(rows):
        text_h = cv2.getTextSize(row, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)[0][1]
        baseline = (left + 1, top + i * row_h + text_h + 1)
        cv2.putText(out, row, baseline, cv2.FONT_HERSHEY_SIMPLEX, scale, (0, 0, 0), 1, cv2.LINE_AA)


def line_rows(name: str, crossings: dict[str, dict[str, int]] | None) -> list[str]:
    """A line's caption: its name, then 'class in N out M' per class that crossed it."""
    by_direction = crossings or {}
    classes = sorted({*by_direction.get("in", {}), *by_direction.get("out", {})})
    if not classes:
        return [f"{name}: none crossed"]
    rows = [name]
    for cls in classes:
        rows.append(
            f"{cls} in {by_direction.get('in', {}).get(cls, 0)} out {by_direction.get('out', {}).get(cls, 0)}"
        )
    return rows


def zone_rows(name: str, inside: dict[str, int] | None) -> list[str]:
    """A zone's caption: its name, then 'class N' per class inside it now."""
    if not inside:
        return [f"{name}: empty"]
    return [name, *(f"{cls} {n}" for cls, n in sorted(inside.items()))]


def draw(
    image: np.ndarray,
    detections: list[dict[str, Any]],
    lines: Sequence[CountingLine] = (),
    zones: Sequence[CountingZone] = (),
    counts: dict[str, Any] | None = None,
) -> np.ndarray:
    """A copy of a BGR frame with the zones, the counting lines with an arrow to their "in" side, the
    counts per class beside each line and zone (`counts` as in a result), and boxes captioned
    '#track name score' (detections in result JSON form)."""
    out = image.copy()
    thickness = max(1, round(min(out.shape[:2]) / 300))
    scale = 0.4 * thickness
    counts = counts or {}
    for zone in zones:
        points = np.round(np.asarray(zone.polygon)).astype(np.int32).reshape(-1, 1, 2)
        cv2.polylines(out, [points], True, ZONE_COLOUR, thickness, cv2.LINE_AA)
        x, y = points.reshape(-1, 2).min(axis=0)
        rows = zone_rows(zone.name, counts.get("zones", {}).get(zone.name))
        _caption(out, rows, int(x) + 2, int(y) + 2, ZONE_COLOUR, scale)
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
        rows = line_rows(line.name, counts.get("lines", {}).get(line.name))
        _caption(out, rows, start[0] + 2, start[1] + 2, LINE_COLOUR, scale)
    for det in detections:
        x1, y1, x2, y2 = (int(round(v)) for v in det["box"])
        colour = _colour(int(det["label"]))
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, thickness)
        track = f"#{det['track_id']} " if det.get("track_id") is not None else ""
        rows = [f"{track}{det['name']} {det['score']:.2f}"]
        _caption(out, rows, x1, y1 - _caption_height(rows, scale), colour, scale)
    return out


def encode_jpeg(image: np.ndarray, quality: int = 80) -> bytes:
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ServeError("OpenCV could not encode a frame as JPEG")
    return buf.tobytes()
