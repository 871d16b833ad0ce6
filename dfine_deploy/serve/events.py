"""Events: what happened to one object (a counting line crossed, a zone entered or left), with a snapshot.

    DIR/<stream>/<event id>.json    the event, written atomically (temporary name, then renamed)
    DIR/<stream>/<event id>.jpg     its snapshot: the object's box with a margin, cut from the frame as
                                    decoded (no drawing on it)

The tracker says what happened in each frame (`Occurrence`, below); `EventHub.emit`, called by the
pipeline's output thread, turns that into events, stores them with `--events DIR`, and hands them to
the server-sent events clients and the message bus (bus.py), which never block it. Ids follow Frigate's
form, `<unix time>-<6 random characters>`, so they sort by time and never repeat; a bus consumer
drops an id it has seen (QoS 1 and Redis can deliver twice after a lost acknowledgement).

Retention keeps the folder under `max_bytes` (the server's default: `DEFAULT_EVENTS_MAX_GB` in
settings.py) and, when set, `max_age_s`: the oldest events (their JSON and snapshot files) go first,
counted per reason and logged; only files named like our events, in stream folders, are read or
deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import sqlite3
import string
import threading
import time
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
from dfine_deploy.serve.settings import NAME_PATTERN, EventPolicy, ServeSettings, StreamSpec

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


def event_kinds(spec: StreamSpec) -> tuple[str, ...]:
    """The kinds of event a stream can make: crossings need its lines (which need tracking), zone
    changes its zones and tracking."""
    kinds = (LINE_CROSS,) if spec.lines else ()
    return kinds + ((ZONE_ENTER, ZONE_LEAVE) if spec.zones and spec.track else ())


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


INDEX_NAME = ".index.sqlite3"  # in the events folder: one row per stored event


class EventStore:
    """The events folder: every event's JSON and snapshot, an index on disk, and retention.

    The files are the record; the index (SQLite, `DIR/.index.sqlite3`) holds each event's id,
    stream, time, kind, class, line or zone, the size of its files and its JSON, so listing and
    filtering read the disk and memory stays flat however many events are kept. At start the index
    is brought in line with the folder by name: events whose files are gone leave it, files it
    lacks (an index deleted, a crash between a file and its row) are read into it.
    """

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
        self.unreadable = 0  # event files found at start that could not be read (left as they are)
        check_events_folder(self.root)
        self.root.mkdir(parents=True, exist_ok=True)
        # one connection, used under the lock by the output thread and the API's threads
        self._db = sqlite3.connect(str(self.root / INDEX_NAME), check_same_thread=False)
        self._db.executescript(
            """
            PRAGMA journal_mode = WAL;
            PRAGMA synchronous = NORMAL;
            PRAGMA cache_size = -256;  -- KiB of pages kept in memory: a fixed, small cost
            CREATE TABLE IF NOT EXISTS events (
                id TEXT PRIMARY KEY, stream TEXT NOT NULL, time REAL NOT NULL, kind TEXT NOT NULL,
                class TEXT, place TEXT, bytes INTEGER NOT NULL, snapshot INTEGER NOT NULL,
                json TEXT NOT NULL);
            CREATE INDEX IF NOT EXISTS events_by_time ON events (time);
            """
        )
        self._load()
        self._bytes = self._db.execute("SELECT COALESCE(SUM(bytes), 0) FROM events").fetchone()[0]
        self.enforce_retention()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _load(self) -> None:
        """Bring the index in line with the files, by their names."""
        on_disk: dict[str, Path] = {}
        for folder in self.root.iterdir():
            if folder.is_dir() and NAME_PATTERN.match(folder.name):
                with os.scandir(folder) as entries:
                    for entry in entries:
                        stem, dot, suffix = entry.name.rpartition(".")
                        if dot and suffix == "json" and EVENT_ID.match(stem):
                            on_disk[stem] = Path(entry.path)
        indexed = {row[0] for row in self._db.execute("SELECT id FROM events")}
        gone = indexed - set(on_disk)
        self._db.executemany("DELETE FROM events WHERE id = ?", [(i,) for i in gone])
        for event_id in set(on_disk) - indexed:
            path = on_disk[event_id]
            try:
                event = json.loads(path.read_text())
                self._insert(event, path, path.with_suffix(".jpg"))
            except (OSError, ValueError, KeyError, TypeError, sqlite3.Error):
                self.unreadable += 1
        self._db.commit()
        if self.unreadable:
            log.warning(
                "events in %s: %d unreadable event file(s) left as they are", self.root, self.unreadable
            )

    def _insert(self, event: dict[str, Any], *files: Path) -> int:
        present = [f for f in files if f.is_file()]
        size = sum(f.stat().st_size for f in present)
        self._db.execute(
            "INSERT OR REPLACE INTO events VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                event["id"],
                event["stream"],
                float(event["time"]),
                event["kind"],
                event["class"],
                event["line"] if event["kind"] == LINE_CROSS else event["zone"],
                size,
                len(present) > 1,
                json.dumps(event),
            ),
        )
        return size

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
            self._bytes += self._insert(event, record, *files)
            self._db.commit()
        self.enforce_retention()

    def get(self, event_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute("SELECT json FROM events WHERE id = ?", (event_id,)).fetchone()
        return None if row is None else json.loads(row[0])

    def snapshot(self, event_id: str) -> Path | None:
        event = self.get(event_id)
        path = self.root / event["stream"] / f"{event_id}.jpg" if event else None
        return path if path is not None and path.is_file() else None

    def __len__(self) -> int:
        with self._lock:
            return self._db.execute("SELECT COUNT(*) FROM events").fetchone()[0]

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
        conditions = [
            (column, value)
            for column, value in (
                ("stream = ?", stream),
                ("kind = ?", kind),
                ("class = ?", class_name),
                ("place = ?", where),
                ("time >= ?", since),
                ("time <= ?", until),
            )
            if value is not None
        ]
        sql = "SELECT json FROM events"
        if conditions:
            sql += " WHERE " + " AND ".join(column for column, _ in conditions)
        sql += " ORDER BY time DESC, id DESC LIMIT ?"
        with self._lock:
            rows = self._db.execute(sql, [value for _, value in conditions] + [limit]).fetchall()
        return [json.loads(row[0]) for row in rows]

    def enforce_retention(self) -> int:
        """Delete the oldest events over the age or size limit (their files); log and count."""
        policy = self.policy
        if policy.max_age_s is None and policy.max_bytes is None:
            return 0
        deleted = {"age": 0, "size": 0}
        now = time.time()
        with self._lock:
            while True:
                doomed = []
                total = self._bytes
                oldest = self._db.execute(
                    "SELECT id, stream, time, bytes, snapshot FROM events ORDER BY time, id LIMIT 500"
                ).fetchall()
                for event_id, stream, at, size, has_snapshot in oldest:
                    if policy.max_age_s is not None and now - at > policy.max_age_s:
                        reason = "age"
                    elif policy.max_bytes is not None and total > policy.max_bytes:
                        reason = "size"
                    else:
                        break
                    doomed.append((event_id, stream, has_snapshot, reason))
                    total -= size
                if not doomed:
                    break
                for event_id, stream, has_snapshot, reason in doomed:
                    for suffix in (".json", ".jpg") if has_snapshot else (".json",):
                        with contextlib.suppress(FileNotFoundError):  # someone removed it already
                            (self.root / stream / f"{event_id}{suffix}").unlink()
                    deleted[reason] += 1
                self._db.executemany("DELETE FROM events WHERE id = ?", [(d[0],) for d in doomed])
                self._db.commit()
                self._bytes = total
                if len(doomed) < len(oldest):
                    break
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
            metrics.start_retention(metrics.events_deleted)
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
