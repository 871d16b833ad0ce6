"""What one stream result is, and who receives it: the detections as the API publishes them and a
client's bounded mailbox (WebSocket, SSE, MJPEG), one of the result sinks of `serve/outputs.py`.

The pipeline's output thread fills these (dfine_deploy/serve/pipeline.py); a slow client loses its
oldest results instead of slowing anyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from dfine_deploy.compat import zip_strict
from dfine_deploy.runtime.detections import Detections


class DetectionsLike(Protocol):
    boxes: np.ndarray  # [N, 4] float32 xyxy pixels of the frame
    scores: np.ndarray  # [N]
    labels: np.ndarray  # [N] int64
    names: list[str]  # [N] class name per detection


def detections_to_json(det: DetectionsLike, track_ids: np.ndarray | None = None) -> list[dict[str, Any]]:
    """Detections as the API publishes them; `track_id` is None where no track follows the detection."""
    boxes = np.asarray(det.boxes, dtype=np.float32).reshape(-1, 4)  # [N, 4] xyxy px
    ids = [None] * len(boxes) if track_ids is None else [int(i) if i >= 0 else None for i in track_ids]
    return [
        {
            "box": [round(float(v), 2) for v in box],
            "score": round(float(score), 4),
            "label": int(label),
            "name": name,
            "track_id": track_id,
        }
        for box, score, label, name, track_id in zip(
            boxes, np.asarray(det.scores), np.asarray(det.labels), det.names, ids
        )
    ]


def one_label_per_object(det: DetectionsLike) -> Detections:
    """The frame's objects: D-FINE returns its top-K (query, class) pairs, so one object can come back
    under several labels with the very same box; this keeps the best-scoring label of each box (what
    counting, tracking and the pictures must see). Order: descending score."""
    labels = np.asarray(det.labels, dtype=np.int64).reshape(-1)
    return Detections(
        np.asarray(det.boxes, dtype=np.float32).reshape(-1, 4),  # [N, 4] xyxy px
        np.asarray(det.scores, dtype=np.float32).reshape(-1),
        labels,
        list(det.names),
    ).one_label_per_box()


def published(
    det: DetectionsLike,
    *,
    raw: bool,
    tracker: Callable[[Detections], tuple[Detections, np.ndarray]] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """`detections` (one label per object; `tracker`, when given, returns the objects it publishes
    and their track ids) and, with `raw`, also `raw_detections`: the model's output as it came, each
    pair with the track id of its box."""
    objects = one_label_per_object(det)
    track_ids = None
    if tracker is not None:
        objects, track_ids = tracker(objects)
    out = {"detections": detections_to_json(objects, track_ids)}
    if raw:
        raw_ids = None
        if track_ids is not None:
            by_box = {tuple(box): int(i) for box, i in zip_strict(objects.boxes.tolist(), track_ids)}
            boxes = np.asarray(det.boxes, dtype=np.float32).reshape(-1, 4).tolist()
            raw_ids = np.array([by_box.get(tuple(box), -1) for box in boxes], dtype=np.int64)
        out["raw_detections"] = detections_to_json(det, raw_ids)
    return out


@dataclass(frozen=True)
class End:
    """The last item a subscriber gets, and why: its WebSocket close code and reason."""

    code: int
    reason: str


STREAM_REMOVED = End(1000, "stream removed")
SHUTTING_DOWN = End(1001, "the server is shutting down")


class Subscriber:
    """A client's bounded mailbox, filled from pipeline threads, read from the event loop: a
    `ResultSink` (dfine_deploy/serve/outputs.py) whose items are results, JPEG frames or the `End`.

    `write` never blocks: when the mailbox is full the oldest item goes, and the drop is counted.
    `close` writes an `End`, the last item.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, maxsize: int, on_drop: Callable[[], None]):
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue(maxsize)
        self._on_drop = on_drop

    def write(self, item: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is closed: the client is gone
            self._loop.call_soon_threadsafe(self._put, item)

    def close(self, end: End = SHUTTING_DOWN) -> None:
        self.write(end)

    def _put(self, item: Any) -> None:
        if self._queue.full():
            self._queue.get_nowait()
            if not isinstance(item, End):
                self._on_drop()
        self._queue.put_nowait(item)

    async def get(self, timeout: float) -> Any:
        """The next item; raises TimeoutError when none came in `timeout` seconds."""
        return await asyncio.wait_for(self._queue.get(), timeout)

    @property
    def pending(self) -> int:
        return self._queue.qsize()
