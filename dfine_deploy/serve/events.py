"""Events: what happened to one object (a counting line crossed, a zone entered or left), with a snapshot.

    DIR/<stream>/<event id>.json    the event, written atomically (temporary name, then renamed)
    DIR/<stream>/<event id>.jpg     its snapshot: the object's box with a margin, cut from the frame as
                                    decoded (no drawing on it)

The tracker says what happened in each frame (`Occurrence`, below); `EventHub.emit`, called by the
pipeline's output thread, turns that into events, stores them with `--events DIR`, and hands them to
the server-sent events clients and the message bus (bus.py), which never block it. Ids follow Frigate's
form, `<unix time>-<6 random characters>`, so they sort by time and never repeat; a bus consumer
drops an id it has seen (QoS 1 and Redis can deliver twice after a lost acknowledgement).

Retention is off by default. With `max_age_s` or `max_bytes` the oldest events (their JSON and snapshot
files) go first, counted per reason and logged; only files named like our events, in stream folders,
are read or deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import string
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy.errors import ServeError
from dfine_deploy.ownership import check_writable_place
from dfine_deploy.serve.annotate import encode_jpeg
from dfine_deploy.serve.metrics import ServeMetrics
from dfine_deploy.serve.results import Subscriber
from dfine_deploy.serve.settings import NAME_PATTERN, EventPolicy, ServeSettings

log = logging.getLogger("dfine_deploy.serve")

EVENT_ID = re.compile(r"^\d{10}\.\d{6}-[a-z0-9]{6}$")
SNAPSHOT_MARGIN = 0.25  # of the box's width and height, on each side
MIN_SNAPSHOT_SIDE = 32  # px: a tiny box still gets a picture one can see


LINE_CROSS, ZONE_ENTER, ZONE_LEAVE = "line_cross", "zone_enter", "zone_leave"
KINDS = (LINE_CROSS, ZONE_ENTER, ZONE_LEAVE)


@dataclass(frozen=True)
class Occurrence:
    """One object crossed a line (`direction` "in" or "out") or entered or left a zone (`direction` None)."""

    kind: str  # LINE_CROSS, ZONE_ENTER or ZONE_LEAVE
    where: str  # the line's or the zone's name
    direction: str | None
    class_name: str
    track_id: int | None  # None: a line crossed by an object without a track id yet
    box: tuple[float, float, float, float]  # xyxy px of the frame where it happened (last seen, for a leave)
    score: float


def new_event_id(now: float) -> str:
    alphabet = string.ascii_lowercase + string.digits
    return f"{now:.6f}-" + "".join(secrets.choice(alphabet) for _ in range(6))


def snapshot_crop(image: np.ndarray, box: Sequence[float]) -> np.ndarray:
    """The box of a BGR frame with SNAPSHOT_MARGIN around it, clipped to the frame."""
    h, w = image.shape[:2]
    x1, y1, x2, y2 = box
    mx = max((x2 - x1) * SNAPSHOT_MARGIN, (MIN_SNAPSHOT_SIDE - (x2 - x1)) / 2, 0)
    my = max((y2 - y1) * SNAPSHOT_MARGIN, (MIN_SNAPSHOT_SIDE - (y2 - y1)) / 2, 0)
    left, top = max(int(x1 - mx), 0), max(int(y1 - my), 0)
    right, bottom = min(int(np.ceil(x2 + mx)), w), min(int(np.ceil(y2 + my)), h)
    if right <= left or bottom <= top:  # a box outside the frame: the whole frame
        return image
    return image[top:bottom, left:right]


def make_event(
    stream: str,
    frame_index: int,
    captured_at: float,
    size: tuple[int, int],
    occurrence: Occurrence,
    clip: tuple[str, float] | None,
) -> dict[str, Any]:
    """One event as every channel publishes it (REST, SSE, MQTT, Redis); docs/serving-fleet.md."""
    line = occurrence.kind == LINE_CROSS
    return {
        "id": new_event_id(captured_at),
        "stream": stream,
        "time": captured_at,
        "frame_index": frame_index,
        "kind": occurrence.kind,
        "line": occurrence.where if line else None,
        "zone": None if line else occurrence.where,
        "direction": occurrence.direction,
        "class": occurrence.class_name,
        "track_id": occurrence.track_id,
        "score": round(occurrence.score, 4),
        "box": list(occurrence.box),
        "frame_size": list(size),
        "snapshot": None,
        "clip": None if clip is None else {"segment": clip[0], "offset_s": round(clip[1], 3)},
    }


def check_events_folder(root: Path) -> None:
    """Refuse, in one line, an --events path that cannot be a folder we write in."""
    check_writable_place(root, f"--events {root}", ServeError)


def _write_atomically(path: Path, data: bytes) -> None:
    partial = path.with_name(f".{path.name}.partial")
    with open(partial, "wb") as fh:
        fh.write(data)
    os.replace(partial, path)


@dataclass
class _Stored:
    id: str
    stream: str
    time: float
    files: tuple[Path, ...]
    size: int


class EventStore:
    """The events folder: every event's JSON and snapshot, an index in memory, and retention."""

    def __init__(
        self,
        root: Path,
        policy: EventPolicy,
        on_deleted: Callable[[str, int], None] = lambda reason, count: None,
    ):
        self.root = root
        self.policy = policy
        self._on_deleted = on_deleted
        self._lock = threading.Lock()
        self._index: deque[_Stored] = deque()  # oldest first
        self._events: dict[str, dict[str, Any]] = {}
        self._bytes = 0
        self.unreadable = 0  # event files found at start that could not be read (left as they are)
        self._load()

    def _load(self) -> None:
        check_events_folder(self.root)
        if not self.root.is_dir():
            return
        found = []
        for folder in self.root.iterdir():
            if not (folder.is_dir() and NAME_PATTERN.match(folder.name)):
                continue
            for path in folder.glob("*.json"):
                if not EVENT_ID.match(path.stem):
                    continue
                try:
                    event = json.loads(path.read_text())
                    found.append((float(event["time"]), event, path))
                except (OSError, ValueError, KeyError, TypeError):
                    self.unreadable += 1
        for _, event, path in sorted(found, key=lambda item: item[0]):
            self._remember(event, path, path.with_suffix(".jpg"))
        if self.unreadable:
            log.warning(
                "events in %s: %d unreadable event file(s) left as they are", self.root, self.unreadable
            )
        self.enforce_retention()

    def _remember(self, event: dict[str, Any], *files: Path) -> None:
        present = tuple(f for f in files if f.is_file())
        size = sum(f.stat().st_size for f in present)
        self._index.append(_Stored(event["id"], event["stream"], float(event["time"]), present, size))
        self._events[event["id"]] = event
        self._bytes += size

    def add(self, event: dict[str, Any], snapshot: bytes | None) -> None:
        """Write one event (and its snapshot, when given), then apply the retention limits."""
        folder = self.root / event["stream"]
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        if snapshot is not None:
            jpg = folder / f"{event['id']}.jpg"
            _write_atomically(jpg, snapshot)
            event["snapshot"] = f"/v1/events/{event['id']}/snapshot"
            files.append(jpg)
        record = folder / f"{event['id']}.json"
        _write_atomically(record, json.dumps(event).encode())
        with self._lock:
            self._remember(event, record, *files)
        self.enforce_retention()

    def get(self, event_id: str) -> dict[str, Any] | None:
        with self._lock:
            return self._events.get(event_id)

    def snapshot(self, event_id: str) -> Path | None:
        event = self.get(event_id)
        path = self.root / event["stream"] / f"{event_id}.jpg" if event else None
        return path if path is not None and path.is_file() else None

    def query(
        self,
        *,
        stream: str | None = None,
        kind: str | None = None,
        class_name: str | None = None,
        where: str | None = None,
        since: float | None = None,
        until: float | None = None,
        limit: int = 100,
    ) -> list[dict[str, Any]]:
        """Events newest first, filtered by stream, kind, class, line or zone name and time."""
        self.enforce_retention()  # an idle server still ages its events out
        out = []
        with self._lock:
            for stored in reversed(self._index):
                event = self._events[stored.id]
                if (
                    (stream is None or event["stream"] == stream)
                    and (kind is None or event["kind"] == kind)
                    and (class_name is None or event["class"] == class_name)
                    and (where is None or where in (event["line"], event["zone"]))
                    and (since is None or event["time"] >= since)
                    and (until is None or event["time"] <= until)
                ):
                    out.append(event)
                    if len(out) >= limit:
                        break
        return out

    def enforce_retention(self) -> int:
        """Delete the oldest events over the age or size limit (their files); log and count."""
        policy = self.policy
        if policy.max_age_s is None and policy.max_bytes is None:
            return 0
        deleted = {"age": 0, "size": 0}
        now = time.time()
        with self._lock:
            while self._index:
                oldest = self._index[0]
                if policy.max_age_s is not None and now - oldest.time > policy.max_age_s:
                    reason = "age"
                elif policy.max_bytes is not None and self._bytes > policy.max_bytes:
                    reason = "size"
                else:
                    break
                self._index.popleft()
                self._events.pop(oldest.id, None)
                self._bytes -= oldest.size
                for path in oldest.files:
                    with contextlib.suppress(FileNotFoundError):  # someone removed it already
                        path.unlink()
                deleted[reason] += 1
        for reason, count in deleted.items():
            if count:
                self._on_deleted(reason, count)
                log.info("events in %s: retention deleted %d event(s) by %s", self.root, count, reason)
        return sum(deleted.values())


class EventHub:
    """Where the output thread's events go: the store, the SSE clients, and the bus publishers."""

    def __init__(
        self,
        store: EventStore | None,
        record_root: Path | None,
        on_event: Callable[[dict[str, Any]], None] = lambda event: None,
        jpeg_quality: int = 80,
    ):
        self.store = store
        self.record_root = record_root
        self._on_event = on_event  # metrics
        self.jpeg_quality = jpeg_quality
        self._sinks: list[Callable[[dict[str, Any]], None]] = []
        self._subscribers: set[Subscriber] = set()
        self._lock = threading.Lock()

    @classmethod
    def for_settings(cls, settings: ServeSettings, metrics: ServeMetrics) -> EventHub:
        """The hub of a server: a store when it has an events folder, events counted per stream and kind."""
        store = None
        if settings.events_dir is not None:
            store = EventStore(
                settings.events_dir,
                settings.events_policy,
                on_deleted=lambda reason, count: metrics.events_deleted.labels(reason).inc(count),
            )
        return cls(
            store,
            settings.record_dir,
            on_event=lambda event: metrics.events.labels(event["stream"], event["kind"]).inc(),
            jpeg_quality=settings.jpeg_quality,
        )

    @property
    def clients(self) -> int:
        with self._lock:
            return len(self._subscribers)

    def add_sink(self, sink: Callable[[dict[str, Any]], None]) -> None:
        """`sink(event)` for every event, in the output thread: it must not block (bus publishers)."""
        self._sinks.append(sink)

    def subscribe(
        self, loop: asyncio.AbstractEventLoop, maxsize: int, on_drop: Callable[[], None]
    ) -> Subscriber:
        sub = Subscriber(loop, maxsize, on_drop)
        with self._lock:
            self._subscribers.add(sub)
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        with self._lock:
            self._subscribers.discard(sub)

    def end_clients(self, item: Any) -> None:
        with self._lock:
            for sub in self._subscribers:
                sub.close(item)

    def emit(
        self,
        stream: str,
        frame_index: int,
        captured_at: float,
        image: np.ndarray,
        occurrences: Sequence[Occurrence],
        clip: tuple[Path, float] | None,
    ) -> None:
        """Events of one frame: stored with their snapshots, then offered to every client and sink."""
        h, w = image.shape[:2]
        where = None
        if clip is not None:
            path, offset = clip
            name = str(path.relative_to(self.record_root)) if self.record_root else path.name
            where = (name, offset)
        events = [make_event(stream, frame_index, captured_at, (w, h), o, where) for o in occurrences]
        for event in events:
            if self.store is not None:
                snapshot = encode_jpeg(snapshot_crop(image, event["box"]), self.jpeg_quality)
                self.store.add(event, snapshot)
            self._on_event(event)
            with self._lock:
                subscribers = list(self._subscribers)
            for sub in subscribers:
                sub.write(event)
            for sink in self._sinks:
                sink(event)
