"""The pipeline: reader threads → one batching inference thread → one output thread → subscribers.

    reader (per stream) ─newest frame─┐
    reader (per stream) ─newest frame─┼─► inference thread ─► output queue ─► output thread ─► subscribers
    POST /v1/detect ──bounded queue───┘   (one Detector.predict              (track, count,    (WebSocket,
                                           per batch)                         JSON, annotate,   SSE, MJPEG,
                                                                              record, latest)   JSON Lines)

Line crossings and zone changes found by the output thread become events (events.py): stored, sent
to SSE clients and handed to the message bus publishers (bus.py), which send from threads of their own.

Decoding, inference and output overlap: the inference thread only ever takes frames that are already
decoded, and hands results to the output thread, so drawing, encoding and recording never delay the
next batch. Every queue is bounded: readers keep only their newest frame, uploads beyond the limit
are refused (503), and a slow client loses its oldest results instead of slowing anyone else.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dfine_deploy.errors import DuplicateStream, MissingDependency, Overloaded, ServeError, StreamLimit
from dfine_deploy.serve.annotate import draw, encode_jpeg
from dfine_deploy.serve.events import EventHub, event_kinds
from dfine_deploy.serve.metrics import ServeMetrics
from dfine_deploy.serve.outputs import ResultSink
from dfine_deploy.serve.recording import Recordings, recording_folder
from dfine_deploy.serve.regions import FramePlan, StreamRegions
from dfine_deploy.serve.results import (
    SHUTTING_DOWN,
    STREAM_REMOVED,
    DetectionsLike,
    End,
    Subscriber,
    published,
)
from dfine_deploy.serve.settings import (
    COUNTING_FIELDS,
    ServeSettings,
    StreamSpec,
    stream_from_dict,
)
from dfine_deploy.serve.sources import (
    Frame,
    ReaderCallbacks,
    SourceKind,
    StreamReader,
    StreamState,
    classify_source,
)
from dfine_deploy.serve.stream_handle import StreamHandle

if TYPE_CHECKING:
    from dfine_deploy.runtime.detections import Detections
    from dfine_deploy.serve.tracking import StreamTracker

log = logging.getLogger("dfine_deploy.serve")
CLOSE_TIMEOUT_S = 10.0  # the most a close waits for readers, the inference and the output, together
END_CLIENTS_WAIT_S = 0.5  # the most the event loop waits for one stream when it ends the clients


class DetectorLike(Protocol):
    """What the server needs from `dfine_deploy.runtime.Detector` (any backend, or a test fake)."""

    max_batch: int | None
    backend_name: str

    def predict(self, frames: Sequence[np.ndarray], *, color: str = "BGR") -> Sequence[DetectionsLike]: ...


def batch_limit(detector: DetectorLike, settings: ServeSettings) -> int:
    """The most frames one Detector.predict call gets: the detector's limit and --max-batch."""
    limit = getattr(detector, "max_batch", None) or settings.max_batch
    return max(1, min(int(limit), settings.max_batch))


@dataclass
class _Upload:
    image: np.ndarray
    future: concurrent.futures.Future


def _timestamp(frame: Frame) -> float:
    """Files: media time (they may be read faster than real time); live sources: the wall clock."""
    return frame.position_s if frame.position_s is not None else frame.captured_at


def _plan(handle: StreamHandle, frame: Frame) -> FramePlan | None:
    """What the detector sees of the frame (None: the whole frame, the stream has no regions)."""
    return handle.regions.plan(frame.image, _timestamp(frame)) if handle.regions is not None else None


class _Planned:
    """A stream frame in a batch: its detector images, and how their results make its detections."""

    def __init__(self, handle: StreamHandle, frame: Frame, plan: FramePlan | None):
        self.handle, self.frame, self.plan = handle, frame, plan
        self.images = [frame.image] if plan is None else plan.images(frame.image)

    @property
    def predicted(self) -> bool:
        """Not detected though something moved (the motion gate's rate cap): the tracks predict."""
        return self.plan is not None and self.plan.predicted

    def result(self, results: list[DetectionsLike]) -> DetectionsLike:
        if self.plan is None:
            return results[0]
        det = self.plan.combine(results)
        assert self.handle.regions is not None
        self.handle.regions.detected(self.plan, det, _timestamp(self.frame))
        return det


class StreamPipeline:
    """The serving engine: owns the streams, batches their frames and uploads through one detector, and
    publishes the results; thread-safe for the API's calls (see the module docstring for the threads)."""

    def __init__(self, detector: DetectorLike, settings: ServeSettings, metrics: ServeMetrics | None = None):
        self.detector = detector
        self.settings = settings
        self.metrics = metrics or ServeMetrics()
        self.max_batch = batch_limit(detector, settings)
        thresholds = getattr(detector, "thresholds", None)  # what every stream's detections passed
        self.class_thresholds = thresholds.in_force(detector.class_names) if thresholds is not None else {}
        self._streams: dict[str, StreamHandle] = {}
        self._streams_lock = threading.Lock()
        self._uploads: deque[_Upload] = deque()
        self._uploads_lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._output: queue.Queue[tuple[StreamHandle, Frame, DetectionsLike, float, bool]] = queue.Queue(
            4 * self.max_batch
        )
        self._sinks: list[ResultSink] = []
        self.events = EventHub.for_settings(settings, self.metrics)  # crossings, zone entries and exits
        self.recordings = (
            Recordings(
                Path(settings.record_dir),
                settings.recording_policy,
                on_segment=lambda stream: self.metrics.recording_segments.labels(stream).inc(),
                on_deleted=lambda reason, count: self.metrics.recording_deleted.labels(reason).inc(count),
            )
            if settings.record_dir is not None
            else None
        )
        if self.recordings is not None:
            self.metrics.start_retention(self.metrics.recording_deleted)
        self._auto_names = itertools.count(1)
        self._round_robin = 0
        self._threads = [
            threading.Thread(target=self._inference_loop, name="dfine-inference", daemon=True),
            threading.Thread(target=self._output_loop, name="dfine-output", daemon=True),
        ]
        self.batches = 0  # Detector.predict calls so far (benchmarks read these two)
        self.frames_detected = 0  # stream frames among them (uploads not counted)

    # -- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self.recordings is not None:
            self.recordings.enforce_retention()  # a restart applies the limits before the first segment
        for thread in self._threads:
            thread.start()

    def close(self, timeout: float = CLOSE_TIMEOUT_S) -> list[str]:
        """Stop every reader (in parallel), drain the output, finish recordings, join all threads,
        close the sinks: all within `timeout` seconds together. A thread that does not stop in time
        (a decoder or a disk that hangs) is named in one ERROR line and left behind, and so is a
        recording it holds; returns the names of those threads."""
        deadline = time.monotonic() + timeout

        def left() -> float:
            return max(0.0, deadline - time.monotonic())

        with self._streams_lock:
            handles = list(self._streams.values())
            self._streams.clear()
        for handle in handles:
            handle.reader.request_stop()
        for handle in handles:
            handle.reader.stop(left())
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(left())
        stuck = [h.reader.thread_name for h in handles if h.reader.alive]
        stuck += [thread.name for thread in self._threads if thread.is_alive()]
        if stuck:
            log.error("shutdown: %s did not stop within %g s; left behind", ", ".join(stuck), timeout)
        for handle in handles:
            self._finish_stream(handle, SHUTTING_DOWN, wait_s=left())
        with self._uploads_lock:
            while self._uploads:
                self._uploads.popleft().future.set_exception(Overloaded("the server is shutting down"))
        sinks, self._sinks = self._sinks, []  # a second close closes nothing twice
        for sink in sinks:
            sink.close()
        if self.events.store is not None:
            self.events.store.close()
        return stuck

    def end_clients(self) -> None:
        """Tell every WebSocket, SSE and MJPEG client that the server is shutting down, so their
        responses end by themselves instead of being cut when the shutdown grace runs out. Runs on
        the event loop: a stream the output thread does not let go of within END_CLIENTS_WAIT_S is
        passed over (its clients are cut by the grace), so a stuck output never stops the shutdown."""
        for handle in self.list():
            if not handle.lock.acquire(timeout=END_CLIENTS_WAIT_S):
                log.warning("shutdown: the output thread holds stream %s; its clients are cut", handle.name)
                continue
            try:
                subscribers = handle.json_subscribers | handle.jpeg_subscribers
            finally:
                handle.lock.release()
            for sub in subscribers:
                sub.close(SHUTTING_DOWN)
        self.events.end_clients(SHUTTING_DOWN)

    def clients(self) -> int:
        """Subscribers of every stream together (WebSocket, SSE and MJPEG clients), and of the events."""
        return (
            sum(len(h.json_subscribers) + len(h.jpeg_subscribers) for h in self.list()) + self.events.clients
        )

    def add_sink(self, sink: ResultSink) -> None:
        """Hand every stream result to `sink` in the output thread (`serve/outputs.py` says what a sink
        may do there); `close` closes it after the output thread stopped."""
        self._sinks.append(sink)

    # -- streams ----------------------------------------------------------------------------------
    def add_stream(self, spec: StreamSpec, *, trusted: bool) -> StreamHandle:
        """Validate and start a stream; raises ServeError subclasses the API maps to statuses."""
        kind, target = classify_source(spec.url, trusted=trusted, allow_devices=self.settings.allow_devices)
        with self._streams_lock:
            if len(self._streams) >= self.settings.max_streams:
                raise StreamLimit(
                    f"this server already runs {len(self._streams)} streams "
                    f"(limit {self.settings.max_streams}); remove one with DELETE /v1/streams/{{name}} "
                    "or start the server with a higher --max-streams"
                )
            name = spec.name or self._free_name()  # a given name passed NAME_PATTERN in StreamSpec
            if name in self._streams:
                raise DuplicateStream(
                    f"a stream named {name!r} already exists; choose another name or delete it first"
                )
            spec.name = name
            callbacks = ReaderCallbacks(
                on_frame=self._on_frame,
                on_drop=self._on_drop,
                on_reconnect=self._on_reconnect,
            )
            reader = StreamReader(name, spec, kind, target, callbacks, self._wake)
            # read at every scrape: live is a matter of recent frames, not of the latest event
            self.metrics.stream_up.labels(name).set_function(lambda: float(reader.state is StreamState.LIVE))
            handle = StreamHandle(name, spec, kind, reader, class_thresholds=self.class_thresholds)
            if spec.track or spec.zones:
                handle.tracker = self._new_tracker(name, spec)
            if spec.tiles is not None or (spec.detect is not None and spec.detect.motion):
                handle.regions = StreamRegions(
                    spec.tiles, spec.detect, getattr(self.detector, "input_size", None)
                )
            source = str(target) if kind is SourceKind.FILE else None
            if recording_folder(self.settings.record_dir, name, spec.record, source) is not None:
                assert self.recordings is not None
                handle.recorder = self.recordings.recorder(name)
            self.metrics.start_stream(name, event_kinds(spec), recorded=handle.recorder is not None)
            self._streams[name] = handle
        reader.start()
        return handle

    def _new_tracker(self, name: str, spec: StreamSpec, first_id: int = 0) -> StreamTracker:
        try:  # supervision and trackers load only when used
            from dfine_deploy.serve.tracking import StreamTracker
        except ImportError as exc:  # the `tracking` extra needs Python >= 3.10 and NumPy >= 2
            raise MissingDependency(
                exc.name or "trackers",
                "tracking",
                f"stream {name!r}: tracking and counting",
                install="pip install -e '.[tracking]' (Python >= 3.10, NumPy >= 2; docs/install.md)",
            ) from exc

        def on_crossing(line: str, direction: str, class_name: str, count: int) -> None:
            self.metrics.line_crossings.labels(name, line, direction, class_name).inc(count)

        return StreamTracker(spec, on_crossing, first_id)

    def set_counting(self, name: str, changes: dict[str, Any]) -> StreamHandle:
        """Change a running stream's tracking, lines and zones (checked like a new stream). Tracks and
        the lines and zones left as they were keep counting (`StreamTracker.keep_from`); the changed
        and new ones start from zero. Raises KeyError for an unknown stream, ServeError for bad values.
        Whole or not at all: the new tracker is built before the stream's settings change, so a change
        refused on the way leaves the stream as it was."""
        handle = self.get(name)
        if handle is None:
            raise KeyError(name)
        current = {f: getattr(handle.spec, f) for f in COUNTING_FIELDS}
        # named, so a refusal names the stream and never its URL (which may carry credentials)
        updated = stream_from_dict(
            {"url": handle.spec.url, "name": name, **current, **changes}, f"stream {name!r}"
        )
        old = handle.tracker
        first_id = old.next_id if old else 0  # ids are never reused in a stream
        new = self._new_tracker(name, updated, first_id) if updated.track or updated.zones else None
        for key in COUNTING_FIELDS:
            setattr(handle.spec, key, getattr(updated, key))
        kept_lines, kept_zones = new.keep_from(old) if new and old else (set(), set())
        self.metrics.forget_counting(name, keep_lines=kept_lines, keep_zones=kept_zones)
        handle.tracker = new  # one reference swap: the output thread's next frame uses the new tracker
        self.metrics.start_stream(name, event_kinds(handle.spec), recorded=handle.recorder is not None)
        return handle

    def _free_name(self) -> str:
        while True:
            name = f"stream-{next(self._auto_names)}"
            if name not in self._streams:
                return name

    def remove_stream(self, name: str) -> bool:
        with self._streams_lock:
            handle = self._streams.pop(name, None)
        if handle is None:
            return False
        handle.reader.stop()
        self._finish_stream(handle, STREAM_REMOVED)
        self.metrics.forget_stream(name)
        return True

    def _finish_stream(self, handle: StreamHandle, end: End, wait_s: float | None = None) -> None:
        """Finish the stream's recording and end its clients; `wait_s` bounds the wait for the output
        thread to let go of the stream (None: as long as it takes)."""
        if not handle.lock.acquire(timeout=-1 if wait_s is None else wait_s):
            log.error(
                "shutdown: stream %s is still held by the output thread; its recording is left as it is",
                handle.name,
            )
            return
        try:
            if handle.recorder is not None:
                handle.recorder.close()
                handle.recorder = None  # results still queued for this stream must not reopen the file
            for sub in handle.json_subscribers | handle.jpeg_subscribers:
                sub.close(end)
        finally:
            handle.lock.release()

    def get(self, name: str) -> StreamHandle | None:
        with self._streams_lock:
            return self._streams.get(name)

    def list(self) -> list[StreamHandle]:
        with self._streams_lock:
            return list(self._streams.values())

    def all_finished(self) -> bool:
        """True when there are streams, each failed, or a file that reached its end and whose frames were
        all published."""
        handles = self.list()
        return bool(handles) and all(
            h.reader.state is StreamState.FAILED
            or (
                h.reader.finished
                and h.reader.state is StreamState.STOPPED
                and h.frames_processed + h.reader.frames_dropped >= h.reader.frames_in
            )
            for h in handles
        )

    def subscribe(self, name: str, loop: asyncio.AbstractEventLoop, *, jpeg: bool = False) -> Subscriber:
        handle = self.get(name)
        if handle is None:
            raise KeyError(name)
        sub = Subscriber(
            loop, self.settings.subscriber_queue, lambda: self.metrics.subscriber_dropped.labels(name).inc()
        )
        with handle.lock:
            (handle.jpeg_subscribers if jpeg else handle.json_subscribers).add(sub)
        return sub

    def unsubscribe(self, name: str, sub: Subscriber) -> None:
        handle = self.get(name)
        if handle is not None:
            with handle.lock:
                handle.json_subscribers.discard(sub)
                handle.jpeg_subscribers.discard(sub)

    # -- uploads ----------------------------------------------------------------------------------
    def submit_image(self, image: np.ndarray) -> concurrent.futures.Future:
        """Queue one BGR image for the next batch; raises Overloaded when the queue is full."""
        future: concurrent.futures.Future = concurrent.futures.Future()
        with self._uploads_lock:
            if len(self._uploads) >= self.settings.max_pending_uploads:
                raise Overloaded(
                    f"{len(self._uploads)} images are already waiting for the detector "
                    f"(limit {self.settings.max_pending_uploads}); retry shortly"
                )
            self._uploads.append(_Upload(image, future))
            self.metrics.queue_depth.labels("uploads").set(len(self._uploads))
        self._wake.set()
        return future

    # -- reader callbacks (reader threads) ------------------------------------------------------------
    def _on_frame(self, stream: str, decode_s: float) -> None:
        self.metrics.frames_in.labels(stream).inc()
        self.metrics.decode_seconds.observe(decode_s)

    def _on_drop(self, stream: str, reason: str) -> None:
        self.metrics.frames_dropped.labels(stream, reason).inc()

    def _on_reconnect(self, stream: str) -> None:
        self.metrics.reconnects.labels(stream).inc()
        handle = self.get(stream)
        if handle is not None and handle.tracker is not None:
            handle.tracker.request_reset()
        if handle is not None and handle.regions is not None:
            handle.regions.reset()

    # -- inference thread -------------------------------------------------------------------------
    def _take_uploads(self, limit: int) -> list[_Upload]:
        with self._uploads_lock:
            taken = [self._uploads.popleft() for _ in range(min(limit, len(self._uploads)))]
            self.metrics.queue_depth.labels("uploads").set(len(self._uploads))
        return [u for u in taken if u.future.set_running_or_notify_cancel()]

    def _collect_batch(self) -> tuple[list[_Upload], list[_Planned]]:
        """Up to half a batch of uploads, then one ready frame per stream (round robin), then uploads.
        A frame is as many detector images as its plan says (tiles: several; no motion: none); a
        frame's images are never split between batches, so a batch may hold more than max_batch
        images and is then detected in several calls."""
        uploads = self._take_uploads((self.max_batch + 1) // 2)
        frames: list[_Planned] = []
        items = len(uploads)
        handles = self.list()
        if handles:
            start = self._round_robin % len(handles)
            self._round_robin += 1
            for handle in handles[start:] + handles[:start]:
                if items >= self.max_batch:
                    break
                frame = handle.reader.take()
                if frame is not None:
                    planned = _Planned(handle, frame, _plan(handle, frame))
                    frames.append(planned)
                    items += len(planned.images)
        uploads += self._take_uploads(self.max_batch - items)
        return uploads, frames

    def _predict(self, images: list[np.ndarray]) -> list[DetectionsLike]:
        """Detect `images` in calls of at most max_batch."""
        results: list[DetectionsLike] = []
        for start in range(0, len(images), self.max_batch):
            chunk = images[start : start + self.max_batch]
            found = list(self.detector.predict(chunk, color="BGR"))
            if len(found) != len(chunk):
                raise ServeError(f"the detector returned {len(found)} results for {len(chunk)} images")
            self.batches += 1
            self.metrics.batch_size.observe(len(chunk))
            results += found
        return results

    def _inference_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()
            uploads, frames = self._collect_batch()
            if not uploads and not frames:
                self._wake.wait(0.05)
                continue
            images = [u.image for u in uploads] + [image for f in frames for image in f.images]
            t0 = time.perf_counter()
            try:
                results = self._predict(images) if images else []
            except Exception as exc:  # a bad batch must not kill the server
                log.exception("Detector.predict failed on a batch of %d", len(images))
                for upload in uploads:
                    upload.future.set_exception(exc)
                continue
            infer_s = time.perf_counter() - t0
            self.frames_detected += sum(1 for f in frames if f.images)
            if images:
                self.metrics.inference_seconds.observe(infer_s)
            # the results hold the uploads' first, then each stream frame's images in turn
            for upload, det in zip(uploads, results):
                upload.future.set_result(det)
            at = len(uploads)
            for planned in frames:
                handle, frame, count = planned.handle, planned.frame, len(planned.images)
                det = planned.result(results[at : at + count])
                at += count
                while not self._stop.is_set():
                    # back-pressure: if output lags, inference waits (readers drop stale frames meanwhile)
                    try:
                        self._output.put((handle, frame, det, infer_s, planned.predicted), timeout=0.1)
                        break
                    except queue.Full:
                        continue
            self.metrics.queue_depth.labels("output").set(self._output.qsize())

    # -- output thread ----------------------------------------------------------------------------
    def _output_loop(self) -> None:
        while not (self._stop.is_set() and self._output.empty()):
            try:
                handle, frame, det, infer_s, predicted = self._output.get(timeout=0.1)
            except queue.Empty:
                continue
            try:
                self._publish(handle, frame, det, infer_s, predicted)
            except Exception:  # one bad frame (e.g. a full disk while recording) must not stop the others
                log.exception("publishing a result of stream %s failed", handle.name)
            finally:
                # counted only once every sink has it: `all_finished` must not run ahead of the output
                handle.frames_processed += 1
                self.metrics.frames_processed.labels(handle.name).inc()

    def _track(
        self, handle: StreamHandle, tracker: StreamTracker, frame: Frame, det: Detections, predicted: bool
    ) -> tuple[Detections, np.ndarray]:
        """The frame's objects (one label per box; in a `predicted` frame, the tracks' predicted boxes)
        and their track ids; updates the counts and their metrics."""
        t0 = time.perf_counter()
        if predicted:
            height, width = frame.image.shape[:2]
            det, track_ids = tracker.predict(_timestamp(frame), (width, height))
        else:
            track_ids = tracker.update(det, _timestamp(frame))
        self.metrics.tracker_seconds.observe(time.perf_counter() - t0)
        self.metrics.set_zone_occupancy(handle.name, tracker.occupancy)
        return det, track_ids

    def _publish(
        self, handle: StreamHandle, frame: Frame, det: DetectionsLike, infer_s: float, predicted: bool = False
    ) -> None:
        h, w = frame.image.shape[:2]
        counting = handle.tracker  # one tracker for the whole frame, even if PATCH swaps it meanwhile
        tracker = (
            (lambda objects: self._track(handle, counting, frame, objects, predicted)) if counting else None
        )
        result = {
            "stream": handle.name,
            "frame_index": frame.index,
            "timestamp": frame.captured_at,
            "position_s": frame.position_s,
            "width": w,
            "height": h,
            "decode_ms": round(frame.decode_s * 1000, 3),
            "inference_ms": round(infer_s * 1000, 3),
            "detected": not predicted,
            **published(det, raw=self.settings.raw_detections, tracker=tracker),
        }
        folded = 0 if predicted else len(np.asarray(det.scores).reshape(-1)) - len(result["detections"])
        if folded:
            self.metrics.labels_folded.labels(handle.name).inc(folded)
        if counting is not None:
            result["counts"] = counting.counts()
        handle.latest = result
        now = time.time()
        handle.note_published(now, frame.captured_at)
        self.metrics.end_to_end_seconds.observe(max(0.0, now - frame.captured_at))
        with handle.lock:
            json_subs = list(handle.json_subscribers)
            jpeg_subs = list(handle.jpeg_subscribers)
            recorder = handle.recorder
            if recorder is not None or jpeg_subs:
                annotated = draw(
                    frame.image,
                    result["detections"],
                    handle.spec.lines,
                    handle.spec.zones,
                    result.get("counts"),
                )
                if recorder is not None:
                    # the rate frames reach the detector, when the source tells it
                    rate = handle.reader.source_fps / handle.spec.vid_stride
                    if handle.spec.max_fps:
                        rate = min(rate, handle.spec.max_fps) if rate else handle.spec.max_fps
                    recorder.write(annotated, rate)
        if counting is not None and counting.occurrences:
            clip = recorder.last_frame_at() if recorder is not None else None
            self.events.emit(
                handle.name, frame.index, frame.captured_at, frame.image, counting.occurrences, clip
            )
        for sub in json_subs:
            sub.write(result)
        if jpeg_subs:
            jpeg = encode_jpeg(annotated, self.settings.jpeg_quality)
            for sub in jpeg_subs:
                sub.write(jpeg)
        for sink in self._sinks:
            sink.write(result)
