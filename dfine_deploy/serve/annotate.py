"""Drawing detections on frames, JPEG encoding for the MJPEG view, and annotated recordings."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
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


class VideoRecorder:
    """Writes annotated frames to DIR/NAME.mp4 (MPEG-4 part 2, 'mp4v') or .avi (MJPG).

    The file is written under a temporary name and renamed when closed, so a crash never leaves a
    truncated video under the final name. H.264 is not offered: OpenCV's wheels ship no encoder for it.
    """

    FOURCC = {".mp4": "mp4v", ".avi": "MJPG"}

    def __init__(self, path: Path, fps: float):
        suffix = path.suffix.lower()
        if suffix not in self.FOURCC:
            raise ServeError(f"recording {path}: use a .mp4 (mp4v) or .avi (MJPG) file name, got '{suffix}'")
        self.path = path
        self.fps = fps if 0 < fps <= 240 else 10.0
        self._partial = path.with_name(f".{path.stem}.partial{suffix}")
        self._writer: cv2.VideoWriter | None = None
        self._size: tuple[int, int] | None = None
        self.frames = 0

    def write(self, image: np.ndarray) -> None:
        h, w = image.shape[:2]
        if self._writer is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._size = (w, h)
            fourcc = cv2.VideoWriter_fourcc(*self.FOURCC[self.path.suffix.lower()])
            self._writer = cv2.VideoWriter(str(self._partial), fourcc, self.fps, self._size)
            if not self._writer.isOpened():
                raise ServeError(
                    f"could not open {self._partial} for writing "
                    f"(codec {self.FOURCC[self.path.suffix.lower()]})"
                )
        if (w, h) != self._size:  # a camera changed resolution: keep the file playable
            image = cv2.resize(image, self._size)
        self._writer.write(image)
        self.frames += 1

    def close(self) -> Path | None:
        """Finish the file and move it to its final name; None when nothing was written."""
        if self._writer is None:
            return None
        self._writer.release()
        self._writer = None
        os.replace(self._partial, self.path)
        return self.path
