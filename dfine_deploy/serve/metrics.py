"""Prometheus metrics of one server, in a registry of its own (several apps can live in one process).

Every labelled counter has its series at 0 from the moment its labels are known (a stream added, a
store, recorder or bus publisher created): `increase()` and `rate()` compare two samples, so a series
born at 1 with its first event shows no increase, and a dashboard shows "No data" until then. The
methods `start_*` below create them; the label values that exist in advance are tables here. Only
`line_crossings{class}` is born with its first crossing: a class is known once an object of it
crossed (creating every class of the model per line and direction would be thousands of series).
"""

from __future__ import annotations

import contextlib
from collections import Counter as ClassCounts
from collections.abc import Collection, Mapping

from prometheus_client import (
    CONTENT_TYPE_LATEST,  # noqa: F401  (re-exported for the /metrics route)
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

DROP_REASONS = ("stale",)  # frames_dropped{reason}
RETENTION_REASONS = ("age", "size")  # events_deleted and recording_deleted_segments {reason}
# every answer POST /v1/detect gives (routes/detect.py, the body limit in app.py)
DETECT_STATUSES = ("200", "400", "413", "415", "500", "503", "504")
EVENTS_SUBSCRIBERS = "(events)"  # the subscriber_dropped{stream} of /v1/events/live: no stream has this name
OPEN_LABELS = {"dfine_serve_line_crossings": "class"}  # counters born with their first event (see above)

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)


class ServeMetrics:
    """Per-stream counters and the pipeline's latency and batching histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.frames_in = Counter(
            "dfine_serve_frames_in", "Frames decoded from a stream", ["stream"], registry=r
        )
        self.frames_processed = Counter(
            "dfine_serve_frames_processed", "Frames that went through the detector", ["stream"], registry=r
        )
        self.frames_dropped = Counter(
            "dfine_serve_frames_dropped",
            "Frames never detected: stale (a newer frame replaced them before the detector was free)",
            ["stream", "reason"],
            registry=r,
        )
        self.reconnects = Counter(
            "dfine_serve_reconnects", "Reconnect attempts after a failure", ["stream"], registry=r
        )
        self.stream_up = Gauge(
            "dfine_serve_stream_up",
            "1 while a stream is live (at least live_frames frames in the last live_window_s), else 0",
            ["stream"],
            registry=r,
        )
        self.decode_seconds = Histogram(
            "dfine_serve_decode_seconds",
            "Time to grab and decode one frame",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.inference_seconds = Histogram(
            "dfine_serve_inference_seconds",
            "Time of one Detector.predict call",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.end_to_end_seconds = Histogram(
            "dfine_serve_frame_latency_seconds",
            "From frame decoded to its result published",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "dfine_serve_batch_size",
            "Frames per Detector.predict call",
            buckets=(1, 2, 3, 4, 6, 8, 12, 16, 32),
            registry=r,
        )
        self.queue_depth = Gauge(
            "dfine_serve_queue_depth", "Items waiting in a pipeline queue", ["queue"], registry=r
        )
        self.subscriber_dropped = Counter(
            "dfine_serve_subscriber_dropped", "Results a slow client never received", ["stream"], registry=r
        )
        self.detect_requests = Counter(
            "dfine_serve_detect_requests", "POST /v1/detect requests by HTTP status", ["status"], registry=r
        )
        self.line_crossings = Counter(
            "dfine_serve_line_crossings",
            "Tracked objects that crossed a counting line, by direction and class",
            ["stream", "line", "direction", "class"],
            registry=r,
        )
        self.zone_occupancy = Gauge(
            "dfine_serve_zone_occupancy",
            "Objects inside a zone in the latest frame, by class",
            ["stream", "zone", "class"],
            registry=r,
        )
        self.tracker_seconds = Histogram(
            "dfine_serve_tracker_seconds",
            "Time to track and count one frame's detections",
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.labels_folded = Counter(
            "dfine_serve_labels_folded",
            "Detections not published as objects: the same box again under a lower-scored label "
            "(D-FINE's top-K is over (query, class) pairs); kept in raw_detections with --raw-detections",
            ["stream"],
            registry=r,
        )
        self.recording_segments = Counter(
            "dfine_serve_recording_segments",
            "Recording segments finished (complete, playable files)",
            ["stream"],
            registry=r,
        )
        self.recording_deleted = Counter(
            "dfine_serve_recording_deleted_segments",
            "Finished recording segments deleted by retention, by the limit that took them (age, size)",
            ["reason"],
            registry=r,
        )
        self.events = Counter(
            "dfine_serve_events",
            "Events (a line crossed, a zone entered or left by one object), by stream and kind",
            ["stream", "kind"],
            registry=r,
        )
        self.events_deleted = Counter(
            "dfine_serve_events_deleted",
            "Stored events deleted by retention, by the limit that took them (age, size)",
            ["reason"],
            registry=r,
        )
        self.bus_published = Counter(
            "dfine_serve_bus_published",
            "Messages the broker acknowledged, by bus (mqtt, redis) and channel (events, detections)",
            ["bus", "channel"],
            registry=r,
        )
        self.bus_dropped = Counter(
            "dfine_serve_bus_dropped",
            "Messages never delivered: the oldest, dropped when the bus buffer was full, or left at shutdown",
            ["bus"],
            registry=r,
        )
        self.bus_buffered = Gauge(
            "dfine_serve_bus_buffered",
            "Messages waiting for the broker's acknowledgement",
            ["bus"],
            registry=r,
        )
        self.bus_connected = Gauge(
            "dfine_serve_bus_connected", "1 while connected to the broker, else 0", ["bus"], registry=r
        )
        self.bus_reconnects = Counter(
            "dfine_serve_bus_reconnects",
            "Connections to the broker made again after a failure",
            ["bus"],
            registry=r,
        )
        self.shard = Gauge(
            "dfine_serve_shard",
            "1, labelled with this worker's shard (--shard INDEX/COUNT; 0/1 when not sharded)",
            ["index", "count"],
            registry=r,
        )
        self.unverified_engine = Gauge(
            "dfine_serve_unverified_engine",
            "1 when the engine is served without a passing dfine-verify result on this device (--unverified)",
            registry=r,
        )
        self._zone_classes: dict[str, set[tuple[str, str]]] = {}  # (zone, class) series per stream
        for status in DETECT_STATUSES:
            self.detect_requests.labels(status)
        self.subscriber_dropped.labels(EVENTS_SUBSCRIBERS)

    def start_stream(self, stream: str, event_kinds: Collection[str], recorded: bool) -> None:
        """A stream's counters at 0: the frames, drops, reconnects, slow clients, folded labels, the
        events it can make (`event_kinds`) and, when it is recorded, its segments."""
        for metric in (
            self.frames_in,
            self.frames_processed,
            self.reconnects,
            self.subscriber_dropped,
            self.labels_folded,
        ):
            metric.labels(stream)
        for reason in DROP_REASONS:
            self.frames_dropped.labels(stream, reason)
        for kind in event_kinds:
            self.events.labels(stream, kind)
        if recorded:
            self.recording_segments.labels(stream)

    def start_retention(self, counter: Counter) -> None:
        """A retention counter at 0 for every reason (events_deleted, recording_deleted)."""
        for reason in RETENTION_REASONS:
            counter.labels(reason)

    def start_bus(self, bus: str, channels: Collection[str]) -> None:
        """A bus publisher's counters at 0: published per channel, dropped, reconnects."""
        for channel in channels:
            self.bus_published.labels(bus, channel)
        self.bus_dropped.labels(bus)
        self.bus_reconnects.labels(bus)

    def set_zone_occupancy(self, stream: str, occupancy: Mapping[str, ClassCounts[str]]) -> None:
        """Publish the zones' counts.

        A class that left a zone drops to 0 instead of keeping its last value.
        """
        seen = self._zone_classes.setdefault(stream, set())
        current = {(zone, cls) for zone, counts in occupancy.items() for cls in counts}
        for zone, cls in seen - current:
            self.zone_occupancy.labels(stream, zone, cls).set(0)
        for zone, counts in occupancy.items():
            for cls, n in counts.items():
                self.zone_occupancy.labels(stream, zone, cls).set(n)
        seen |= current

    def forget_stream(self, stream: str) -> None:
        """Remove a deleted stream's series so /metrics does not grow with every stream ever added."""
        for metric in (
            self.frames_in,
            self.frames_processed,
            self.reconnects,
            self.stream_up,
            self.subscriber_dropped,
            self.recording_segments,
            self.labels_folded,
        ):
            with contextlib.suppress(KeyError):
                metric.remove(stream)
        for reason in DROP_REASONS:
            with contextlib.suppress(KeyError):
                self.frames_dropped.remove(stream, reason)
        for family in self.events.collect():  # this stream's kinds, read from the samples
            for kind in {s.labels["kind"] for s in family.samples if s.labels.get("stream") == stream}:
                self.events.remove(stream, kind)
        self.forget_counting(stream)

    def forget_counting(
        self, stream: str, keep_lines: Collection[str] = (), keep_zones: Collection[str] = ()
    ) -> None:
        """Remove a stream's line and zone series (the stream is gone, or its counting was redefined),
        except those of the lines and zones that a redefinition kept counting."""
        kept_zone_series = set()
        for zone, cls in self._zone_classes.pop(stream, set()):
            if zone in keep_zones:
                kept_zone_series.add((zone, cls))
            else:
                self.zone_occupancy.remove(stream, zone, cls)
        if kept_zone_series:
            self._zone_classes[stream] = kept_zone_series
        crossings = {  # the series of this stream, read from the samples (lines and classes vary)
            (s.labels["line"], s.labels["direction"], s.labels["class"])
            for family in self.line_crossings.collect()
            for s in family.samples
            if s.labels.get("stream") == stream and s.labels["line"] not in keep_lines
        }
        for labels in crossings:
            self.line_crossings.remove(stream, *labels)

    def render(self) -> bytes:
        return generate_latest(self.registry)
