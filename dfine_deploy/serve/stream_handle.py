"""One running stream's state as the pipeline and the API see it: its reader, tracker, recorder,
latest result, rates and subscribers."""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from dfine_deploy.serve.recording import SegmentRecorder
from dfine_deploy.serve.regions import StreamRegions
from dfine_deploy.serve.results import Subscriber
from dfine_deploy.serve.settings import StreamSpec
from dfine_deploy.serve.sources import SourceKind, StreamReader, redact

if TYPE_CHECKING:
    from dfine_deploy.serve.tracking import StreamTracker


@dataclass
class StreamHandle:
    name: str
    spec: StreamSpec
    kind: SourceKind
    reader: StreamReader
    recorder: SegmentRecorder | None = None
    tracker: StreamTracker | None = None  # when the stream tracks or counts
    regions: StreamRegions | None = None  # when the stream has tiles or a motion gate
    latest: dict[str, Any] | None = None
    # the detector's per-class score thresholds in force (ClassThresholds.in_force); {} for a detector
    # without any (a test fake)
    class_thresholds: dict[str, dict[str, Any]] = field(default_factory=dict)
    frames_processed: int = 0
    latency_ms: float = 0.0  # from frame decoded to result published, of the latest result
    published_at: deque[float] = field(
        default_factory=lambda: deque(maxlen=32)
    )  # times of the latest results
    json_subscribers: set[Subscriber] = field(default_factory=set)
    jpeg_subscribers: set[Subscriber] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def info(self) -> dict[str, Any]:
        r = self.reader
        return {
            "name": self.name,
            "url": redact(self.spec.url),
            "kind": self.kind.value,
            "state": r.state.value,
            "last_error": r.last_error,
            "frames_in": r.frames_in,
            "frames_processed": self.frames_processed,
            "frames_dropped": r.frames_dropped,
            "reconnects": r.reconnects,
            "source_fps": r.source_fps,
            "fps": round(self.fps, 2),
            "latency_ms": round(self.latency_ms, 1),
            "every_frame": self.spec.every_frame,
            "track": self.spec.track,
            "lines": [asdict(line) for line in self.spec.lines],
            "zones": [asdict(zone) for zone in self.spec.zones],
            "counts": self.tracker.counts() if self.tracker else None,
            "recording": str(self.recorder.folder) if self.recorder else None,
            "tiles": self.spec.tiles.to_dict() if self.spec.tiles else None,
            "detect": self.spec.detect.to_dict() if self.spec.detect else None,
            "frames_without_inference": self.regions.frames_skipped if self.regions else 0,
            "class_thresholds": self.class_thresholds,
        }

    def note_published(self, now: float, captured_at: float) -> None:
        """Record a published result's time and latency (output thread)."""
        self.published_at.append(now)
        self.latency_ms = max(0.0, now - captured_at) * 1000

    @property
    def fps(self) -> float:
        """Results published per second over the latest 32, or 0 once none came for 2 s."""
        times = list(self.published_at)
        if len(times) < 2 or time.time() - times[-1] > 2.0:
            return 0.0
        return (len(times) - 1) / max(times[-1] - times[0], 1e-6)
