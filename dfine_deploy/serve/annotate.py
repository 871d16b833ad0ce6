"""Drawing detections on frames and JPEG encoding for the MJPEG view (recordings: recording.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import cv2
import numpy as np

from dfine_deploy.errors import ServeError
from dfine_deploy.serve.settings import CountingLine, CountingZone


def _colour(label: int) -> tuple[int, int, int]:
    """A stable, well-spread BGR colour per class (golden-ratio hue steps)."""
    hue = int((label * 0.618033988749895 % 1.0) * 180)
    hsv = np.array([[[hue, 200, 255]]], dtype=np.uint8)
    b, g, r = cv2.cvtColor(hsv, cv2.COLOR_HSV2BGR)[0, 0]
    return int(b), int(g), int(r)


def draw(
    image: np.ndarray,
    detections: list[dict[str, Any]],
    lines: Sequence[CountingLine] = (),
    zones: Sequence[CountingZone] = (),
) -> np.ndarray:
    """A copy of a BGR frame with the zones, the counting lines, and boxes captioned '#track name score'
    (detections in result JSON form)."""
    out = image.copy()
    thickness = max(1, round(min(out.shape[:2]) / 300))
    for zone in zones:
        points = np.round(np.asarray(zone.polygon)).astype(np.int32).reshape(-1, 1, 2)
        cv2.polylines(out, [points], True, (255, 200, 0), thickness, cv2.LINE_AA)
    for line in lines:
        start, end = (tuple(int(round(v)) for v in p) for p in (line.start, line.end))
        cv2.line(out, start, end, (0, 255, 255), thickness + 1, cv2.LINE_AA)
    for det in detections:
        x1, y1, x2, y2 = (int(round(v)) for v in det["box"])
        colour = _colour(int(det["label"]))
        cv2.rectangle(out, (x1, y1), (x2, y2), colour, thickness)
        track = f"#{det['track_id']} " if det.get("track_id") is not None else ""
        caption = f"{track}{det['name']} {det['score']:.2f}"
        (tw, th), base = cv2.getTextSize(caption, cv2.FONT_HERSHEY_SIMPLEX, 0.4 * thickness, 1)
        top = max(y1 - th - base - 2, 0)
        cv2.rectangle(out, (x1, top), (x1 + tw + 2, top + th + base + 2), colour, -1)
        cv2.putText(
            out,
            caption,
            (x1 + 1, top + th + 1),
            cv2.FONT_HERSHEY_SIMPLEX,
            0.4 * thickness,
            (0, 0, 0),
            1,
            cv2.LINE_AA,
        )
    return out


def encode_jpeg(image: np.ndarray, quality: int = 80) -> bytes:
    ok, buf = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    if not ok:
        raise ServeError("OpenCV could not encode a frame as JPEG")
    return buf.tobytes()
