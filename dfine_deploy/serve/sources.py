"""Video sources: one reader thread per stream that decodes frames and keeps only the newest.

States of a stream:

    connecting ──live_frames in live_window_s──► live ──fewer──► stalled ──enough again──► live
        │                                          │                │
        ├──open fails / read fails or times out────┴────────────────┴──► retrying ──backoff──► connecting
    connecting ──a file that cannot be opened or decoded──► failed (final: retrying cannot help)
    any state ──stop() or a file that ended──► stopped

Health is judged from frames, not from the connection: a stream is live only while the current
connection has delivered at least `live_frames` frames in the last `live_window_s` seconds (time
spent waiting for a busy detector does not count against the source). A camera that sends one frame
after each reconnect and then stalls is therefore never live. The reconnect backoff starts again
from `backoff_initial_s` only after a connection stayed live for `backoff_reset_s`; a camera that
comes up and drops again keeps backing off.

Every failure is logged in one line naming the stream, the source (password redacted) and what
happens next.

Decoding uses OpenCV's FFmpeg backend (V4L2 for cameras). RTSP goes over TCP unless the user set
OPENCV_FFMPEG_CAPTURE_OPTIONS: UDP loses packets under load and shows as grey smears.

A file whose resolution changes mid-stream plays on: where its timestamps start again at the change
(files joined end to end), its media time goes on one frame later, as after a loop; frames that come
at another size are read on at it, said once in the log (OpenCV 5.1 scales them to the first size).

OpenCV and its FFmpeg print their own lines straight to stderr, past Python's logging
(`[tcp @ 0x...] Connection to tcp://cam:554 failed: Connection refused`, `[ WARN:0@1.4] ... can't
be used to capture by name`), each retry again, beside our one line that already says what failed.
Before a source opens they are set to our logger's level: shown (as they print them) only when it
is at DEBUG, silent otherwise. OPENCV_FFMPEG_LOGLEVEL and OPENCV_LOG_LEVEL, when set, win.
"""

from __future__ import annotations

import enum
import logging
import os
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import cv2
import numpy as np

from dfine_deploy.errors import ServeError
from dfine_deploy.files import user_path
from dfine_deploy.images import IMAGE_SUFFIXES
from dfine_deploy.serve.diagnose import (
    DIAGNOSE_TIMEOUT_S,
    device_failure,
    file_failure,
    frames_before_stall,
    network_failure,
    stalled_stream,
)
from dfine_deploy.serve.settings import DEVICE_PATH, NETWORK_SCHEMES, StreamSpec, redact

log = logging.getLogger("dfine_deploy.serve")

# how far a file's timestamps may go back, when its frame rate is unknown, before they count as
# starting again (a frame's own time otherwise)
RESTART_S = 0.5


class ForbiddenSource(ServeError):
    """A well-formed source that this caller may not open (a local file or camera from the API)."""


class SourceKind(str, enum.Enum):
    RTSP = "rtsp"
    HTTP = "http"
    FILE = "file"
    DEVICE = "device"


class StreamState(str, enum.Enum):
    CONNECTING = "connecting"
    LIVE = "live"
    STALLED = "stalled"  # connected and was live, but frames now arrive too slowly
    RETRYING = "retrying"
    STOPPED = "stopped"
    FAILED = "failed"


def classify_source(url: str | int, *, trusted: bool, allow_devices: bool) -> tuple[SourceKind, str | int]:
    """Check a source against the allow-list and return its kind and the value to open.

    Remote clients (trusted=False) may only name rtsp, rtsps, http and https URLs, and cameras when
    the server allows them; file paths and file:// come only from the command line or stream list.
    """
    if isinstance(url, int) or (isinstance(url, str) and url.strip().isdigit()):
        index = int(url)
        if not (trusted or allow_devices):
            raise ForbiddenSource(
                f"camera {index}: opening local cameras is disabled on this server "
                "(start it with --allow-devices)"
            )
        return SourceKind.DEVICE, index
    if not isinstance(url, str) or not url.strip():
        raise ServeError(f"stream url must be a non-empty string, got {url!r}")
    url = url.strip()
    device = DEVICE_PATH.match(url)
    if device:
        if not (trusted or allow_devices):
            raise ForbiddenSource(
                f"camera {url}: opening local cameras is disabled on this server "
                "(start it with --allow-devices)"
            )
        return SourceKind.DEVICE, int(device.group(1))
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme in ("", "file") or (len(scheme) == 1 and url[1:3] in (":\\", ":/")):  # also C:\ paths
        if not trusted:
            raise ForbiddenSource(
                f"stream url {url!r}: local files can only be served from the command line or the stream "
                f"list, not added over the API; use one of {', '.join(NETWORK_SCHEMES)}"
            )
        path = user_path(parts.path if scheme == "file" else url)  # `~`, and the same file from any folder
        if path.is_dir():
            raise ServeError(_folder_as_source(path))
        if not path.is_file():
            raise ServeError(f"video file {path} does not exist")
        if path.suffix.lower() in IMAGE_SUFFIXES:  # FFmpeg would show it unturned, as no viewer does
            raise ServeError(
                f"{path} is a still image, not a video; send it to POST /v1/detect, which reads images "
                "as every stage does (EXIF orientation applied)"
            )
        return SourceKind.FILE, str(path)
    if scheme not in NETWORK_SCHEMES:
        raise ServeError(
            f"stream url {redact(url)!r}: scheme '{scheme}' is not allowed; "
            f"use one of {', '.join(NETWORK_SCHEMES)}"
        )
    try:
        port = parts.port
    except ValueError:  # its text could hold a password that a '/' cut short: never shown
        raise ServeError(
            f"stream url {redact(url)!r}: the port is not a number 1-65535; a '/', '?', '#' or '@' in "
            "the user or password must be written %2F, %3F, %23 or %40"
        ) from None
    if not parts.hostname or any(ch.isspace() for ch in url) or (port is not None and port == 0):
        raise ServeError(f"stream url {redact(url)!r} is malformed: expected {scheme}://host[:port]/path")
    return (SourceKind.RTSP if scheme.startswith("rtsp") else SourceKind.HTTP), url


def _folder_as_source(folder: Path) -> str:
    """The refusal of a folder given as a video file, naming the videos it holds: each one is a
    stream of its own (a repeated --source, or a --streams list)."""
    try:
        videos = sorted(
            p.name for p in folder.iterdir() if p.is_file() and p.suffix.lower() not in IMAGE_SUFFIXES
        )
    except OSError:
        videos = []
    shown = f"; it holds {', '.join(videos[:4])}{' ...' if len(videos) > 4 else ''}" if videos else ""
    return (
        f"{folder} is a folder, not a video file{shown}: give each video as a --source of its own "
        "(or list them in a --streams file)"
    )


@dataclass
class Frame:
    """A decoded frame and where it came from."""

    stream: str
    index: int  # frames read from the source before this one, kept or not, across reconnects
    image: np.ndarray  # [H, W, 3] uint8 BGR
    captured_at: float  # time.time() when decoded
    decode_s: float
    # files and clips over HTTP: the frame's time in the video, in seconds, from its own timestamps
    # (right for variable frame rates, where index / fps is not), going on across loops; None for
    # live sources
    position_s: float | None = None


@dataclass
class ReaderCallbacks:
    """What the reader reports; the pipeline points these at its metrics and wake-up signal."""

    on_frame: Callable[[str, float], None] = lambda stream, decode_s: None
    on_drop: Callable[[str, str], None] = lambda stream, reason: None
    on_reconnect: Callable[[str], None] = lambda stream: None


# OpenCV's and FFmpeg's own log levels when our logger is, and is not, at DEBUG (module docstring)
NATIVE_LOG_LEVELS = {
    True: {"OPENCV_FFMPEG_LOGLEVEL": "40", "OPENCV_LOG_LEVEL": "DEBUG"},  # FFmpeg's AV_LOG_VERBOSE
    False: {"OPENCV_FFMPEG_LOGLEVEL": "-8", "OPENCV_LOG_LEVEL": "SILENT"},  # AV_LOG_QUIET
}


def _native_logs_at_our_level() -> None:
    """OpenCV reads OPENCV_FFMPEG_LOGLEVEL when it first opens an FFmpeg source, and its own level
    whenever it is set: both follow our logger's level now, unless the user set them."""
    chosen = NATIVE_LOG_LEVELS[log.isEnabledFor(logging.DEBUG)]
    for name, value in chosen.items():
        os.environ.setdefault(name, value)
    opencv_level = os.environ["OPENCV_LOG_LEVEL"].upper()
    cv2.utils.logging.setLogLevel(
        getattr(cv2.utils.logging, f"LOG_LEVEL_{opencv_level}", cv2.utils.logging.getLogLevel())
    )


def _open_capture(kind: SourceKind, target: str | int, spec: StreamSpec) -> cv2.VideoCapture:
    _native_logs_at_our_level()
    if kind is SourceKind.DEVICE:
        return cv2.VideoCapture(int(target), cv2.CAP_V4L2)
    if kind is SourceKind.RTSP:
        os.environ.setdefault("OPENCV_FFMPEG_CAPTURE_OPTIONS", "rtsp_transport;tcp")
    params = [
        cv2.CAP_PROP_OPEN_TIMEOUT_MSEC,
        int(spec.open_timeout_s * 1000),
        cv2.CAP_PROP_READ_TIMEOUT_MSEC,
        int(spec.read_timeout_s * 1000),
    ]
    return cv2.VideoCapture(str(target), cv2.CAP_FFMPEG, params)


class StreamReader:
    """Decodes one source in its own thread; the consumer takes the newest frame with `take()`.

    Latest-frame mode (the default for live sources) keeps one slot: a frame not taken before the next
    one arrives is dropped and counted as stale, so a slow detector never makes the stream fall behind
    real time. `every_frame`, and files read as fast as possible (realtime=False: there is no clock to
    fall behind), keep a short queue instead and make the reader wait for the consumer, so no frame
    is decoded in vain.
    """

    EVERY_FRAME_QUEUE = 4

    def __init__(
        self,
        name: str,
        spec: StreamSpec,
        kind: SourceKind,
        target: str | int,
        callbacks: ReaderCallbacks | None = None,
        wake: threading.Event | None = None,
    ):
        self.name = name
        self.spec = spec
        self.kind = kind
        self.target = target
        self.callbacks = callbacks or ReaderCallbacks()
        self._wake = wake or threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Condition()
        self.waits_for_consumer = spec.every_frame or (kind is SourceKind.FILE and not spec.realtime)
        self._frames: deque[Frame] = deque(maxlen=self.EVERY_FRAME_QUEUE if self.waits_for_consumer else 1)
        self._phase = StreamState.CONNECTING  # CONNECTING also while a connection delivers frames
        self.last_error: str | None = None
        self.frames_in = 0
        # every frame read since the stream was added: a reconnect goes on counting, so that
        # (stream, frame_index) names one frame for consumers that deduplicate by it
        self.frames_read = 0
        self.frames_dropped = 0
        self.reconnects = 0
        self.failures = 0  # failed connections in a row; the next backoff grows with it
        self.source_fps: float = 0.0
        self.finished = False  # a file that reached its end (not looped)
        self.size_changes = 0  # times this stream's frames came at another size than the ones before
        # health: arrival times of this connection's frames on a clock that stands still while the
        # reader waits for the consumer (a busy detector is not a stalled source). The newest
        # live_frames are all the rule reads; unbounded, live_window_s of that clock held thousands
        # of a fast file's frames per stream, and a long soak's memory kept rising by them
        self._health_lock = threading.Lock()
        self._arrivals: deque[float] = deque(maxlen=spec.live_frames)
        self._waited_s = 0.0
        self._waiting_since: float | None = None
        self._was_live = False  # this connection has been live
        self._healthy = False  # at the latest arrival
        self._live_since: float | None = None  # start of the current live run (source clock)
        self._thread = threading.Thread(target=self._run, name=f"reader-{name}", daemon=True)

    # -- consumer side ---------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def take(self) -> Frame | None:
        """The oldest waiting frame (the newest in latest-frame mode), or None."""
        with self._lock:
            if not self._frames:
                return None
            frame = self._frames.popleft()
            self._lock.notify_all()
            return frame

    def request_stop(self) -> None:
        """Ask the thread to end without waiting (to stop many readers in parallel)."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the thread to end, wait for it; the capture is released by the thread itself."""
        self.request_stop()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def thread_name(self) -> str:
        return self._thread.name

    @property
    def state(self) -> StreamState:
        """The stream's state now, with live judged from the frames of the last `live_window_s`."""
        phase = self._phase
        if phase is not StreamState.CONNECTING:
            return phase
        if self.recent_frames() >= self.spec.live_frames:
            return StreamState.LIVE
        return StreamState.STALLED if self._was_live else StreamState.CONNECTING

    def recent_frames(self) -> int:
        """Frames this connection delivered in the last `live_window_s` seconds (source clock)."""
        with self._health_lock:
            self._forget_old(self._source_clock())
            return len(self._arrivals)

    # -- health (reader thread writes, any thread reads) ----------------------------------------------
    def _source_clock(self) -> float:
        now = time.monotonic()
        waiting = now - self._waiting_since if self._waiting_since is not None else 0.0
        return now - self._waited_s - waiting

    def _forget_old(self, now: float) -> None:
        while self._arrivals and self._arrivals[0] <= now - self.spec.live_window_s:
            self._arrivals.popleft()

    def _new_connection(self) -> None:
        with self._health_lock:
            self._arrivals.clear()
            self._was_live = self._healthy = False
            self._live_since = None

    def _note_arrival(self) -> None:
        """A frame came from the source: update health, log its changes, and reset the backoff once
        the connection has been live for `backoff_reset_s` without a break."""
        with self._health_lock:
            now = self._source_clock()
            self._arrivals.append(now)
            self._forget_old(now)
            count = len(self._arrivals)
            healthy = count >= self.spec.live_frames
            became_live, became_stalled = healthy and not self._healthy, self._healthy and not healthy
            self._healthy = healthy
            self._was_live = self._was_live or healthy
            if not healthy:
                self._live_since = None
            elif self._live_since is None:
                self._live_since = now
            sustained = healthy and now - self._live_since >= self.spec.backoff_reset_s
        if became_live:
            if self.last_error is not None:
                log.info("stream %s is live again", self.name)
            self.last_error = None
        if became_stalled:
            self.last_error = (
                f"stalled: {count} frame(s) in the last {self.spec.live_window_s:g} s, "
                f"live needs {self.spec.live_frames}"
            )
            log.warning("stream %s (%s) %s", self.name, redact(self.target), self.last_error)
        if sustained:
            self.failures = 0  # the next failure waits backoff_initial_s again

    def _wait_for_consumer(self, wait: Callable[[], None]) -> None:
        """Run `wait()` (blocked on the consumer) with the health clock stopped."""
        with self._health_lock:
            self._waiting_since = time.monotonic()
        try:
            wait()
        finally:
            with self._health_lock:
                self._waited_s += time.monotonic() - self._waiting_since
                self._waiting_since = None

    # -- reader thread ---------------------------------------------------------------------------
    def _set_phase(self, phase: StreamState, error: str | None = None) -> None:
        self._phase = phase
        if error is not None:
            self.last_error = error

    def _backoff(self, attempt: int) -> float:
        """Exponential, capped, with jitter so that many cameras do not retry in lockstep."""
        delay = min(self.spec.backoff_max_s, self.spec.backoff_initial_s * (2 ** min(attempt, 30)))
        return delay * random.uniform(0.5, 1.0)

    def _run(self) -> None:
        final = StreamState.STOPPED
        while not self._stop.is_set():
            self._new_connection()
            self._set_phase(StreamState.CONNECTING)
            opening = time.monotonic()
            cap = _open_capture(self.kind, self.target, self.spec)
            got_frame = False
            try:
                if not cap.isOpened():
                    reason = "" if self.kind is SourceKind.FILE else self._open_failure(opening)
                    error = (
                        reason
                        if reason.startswith("stalled")
                        else f"could not open {redact(self.target)}" + (f": {reason}" if reason else "")
                    )
                else:
                    error, got_frame = self._read_loop(cap)
                if self.kind is SourceKind.FILE and not got_frame and not self._stop.is_set():
                    # the same bytes will fail the same way: final
                    final = StreamState.FAILED
                    self.last_error = file_failure(str(self.target), cap)
            finally:
                cap.release()
            if self._stop.is_set() or self.finished:
                break
            if final is StreamState.FAILED:
                log.error("stream %s failed: %s", self.name, self.last_error)
                break
            if got_frame and not self._was_live:
                error += f" (fewer than {self.spec.live_frames} frames in {self.spec.live_window_s:g} s)"
            self.failures += 1
            delay = self._backoff(self.failures - 1)
            self._set_phase(StreamState.RETRYING, error)
            log.warning(
                "stream %s (%s): %s; reconnecting in %.1f s", self.name, redact(self.target), error, delay
            )
            if self._stop.wait(delay):
                break
            self.reconnects += 1
            self.callbacks.on_reconnect(self.name)
        self._set_phase(final)
        self._wake.set()

    def _open_failure(self, opening: float) -> str:
        """Why a camera or network source did not open: checks the device, or asks a server that
        answered (one that let the open time out would only let the question time out too)."""
        if self.kind is SourceKind.DEVICE:
            return device_failure(int(self.target))
        if time.monotonic() - opening >= 0.9 * self.spec.open_timeout_s:
            if self.kind is SourceKind.HTTP:  # an MJPEG camera that froze after a frame or two?
                wait = min(self.spec.read_timeout_s, DIAGNOSE_TIMEOUT_S)
                frames = frames_before_stall(str(self.target), wait)
                if frames is not None:
                    return stalled_stream(wait, frames)
            return (
                f"nothing answered within open_timeout_s {self.spec.open_timeout_s:g} s (host down, wrong "
                "address or port, a firewall, or a server that accepts and never answers)"
            )
        return network_failure(str(self.target), self.spec.open_timeout_s)

    def _read_loop(self, cap: cv2.VideoCapture) -> tuple[str, bool]:
        """Read until the source fails, ends or we are stopped; returns (why it ended, got a frame)."""
        is_file = self.kind is SourceKind.FILE
        # a clip over HTTP has a length (a camera's stream has none): it is timed and paced as a file,
        # or it would pass in a flash, nearly all its frames dropped as stale
        timed = is_file or (self.kind is SourceKind.HTTP and cap.get(cv2.CAP_PROP_FRAME_COUNT) > 0)
        fps = cap.get(cv2.CAP_PROP_FPS) or 0.0
        self.source_fps = fps if 0 < fps < 1000 else 0.0
        # Files have no clock of their own: realtime ones are paced by their frames' timestamps
        # (variable frame rates and an fps field of 0 or 1000 included), and max_fps spaces kept frames.
        paced = timed and self.spec.realtime
        min_period = 1.0 / self.spec.max_fps if self.spec.max_fps else 0.0
        origin: float | None = None  # monotonic clock minus media time
        last_due = float("-inf")
        loops_s = 0.0  # media time of the loops already played
        position_s = 0.0
        gap_s = 1.0 / self.source_fps if self.source_fps else 0.0  # between the last two frames
        got_frame = False
        first = self.frames_read  # this connection's frames are those read from here on
        just_rewound = False
        size: tuple[int, int] | None = None  # (width, height) of the frames so far
        last_kept = time.monotonic()
        while not self._stop.is_set():
            keep = self.frames_read % self.spec.vid_stride == 0
            if keep and min_period and not timed and time.monotonic() - last_kept < min_period:
                keep = False  # live source above max_fps: grab the frame but never decode it
            t0 = time.perf_counter()
            ok = cap.grab()
            image = None
            if ok and keep:
                ok, image = cap.retrieve()
            decode_s = time.perf_counter() - t0
            if not ok:
                if is_file and got_frame:
                    if self.spec.loop and not just_rewound:
                        just_rewound = cap.set(cv2.CAP_PROP_POS_FRAMES, 0)
                        if just_rewound:
                            loops_s = position_s + gap_s
                            continue
                    self.finished = True
                    return "end of file", got_frame
                return self._read_failure(decode_s, self.frames_read - first), got_frame
            if timed:  # never backwards: a tracker measures dwell times with it
                media_s = loops_s + cap.get(cv2.CAP_PROP_POS_MSEC) / 1000
                if got_frame and media_s < position_s - (gap_s or RESTART_S):
                    # the timestamps start again (files joined end to end, often at a resolution
                    # change): the video goes on one frame later, as after a loop; held at the last
                    # time instead, its rest would pass unpaced, nearly all of it dropped as stale
                    loops_s += position_s + gap_s - media_s
                    media_s = position_s + gap_s
                now_s = max(media_s, position_s)
                gap_s = now_s - position_s if got_frame and now_s > position_s else gap_s
                position_s = now_s
            just_rewound = False
            self.frames_read += 1
            got_frame = True
            self._note_arrival()
            if image is None:
                continue
            height, width = image.shape[:2]
            if size is not None and (width, height) != size:
                self.size_changes += 1
                log.warning(
                    "stream %s (%s): the frames changed size from %dx%d to %dx%d at frame %d; read on at "
                    "the new size",
                    self.name,
                    redact(self.target),
                    *size,
                    width,
                    height,
                    self.frames_read - 1,
                )
            size = (width, height)
            if timed and (paced or min_period):
                now = time.monotonic()
                due = last_due + min_period
                if paced:
                    if origin is None or now - (origin + position_s) > 1.0:
                        origin = now - position_s  # the first frame, or over a second late: restart the clock
                    due = max(due, origin + position_s)
                if self._stop.wait(max(0.0, due - now)):
                    break
                last_due = due
            last_kept = time.monotonic()
            frame = Frame(self.name, self.frames_read - 1, image, time.time(), decode_s)
            frame.position_s = round(position_s, 6) if timed else None
            self._publish(frame)
        return "stopped", got_frame

    def _read_failure(self, waited_s: float, frames: int) -> str:
        """Why a read failed, from how long it waited: a read that ran into `read_timeout_s` met a
        source that keeps its connection open and sends nothing (stalled); one that failed at once
        met a source that closed it (after one frame: what a still image's URL does)."""
        timeout = self.spec.read_timeout_s
        if waited_s >= 0.8 * timeout and self.kind is not SourceKind.FILE:
            return stalled_stream(timeout, frames)
        if frames == 1 and self.kind is not SourceKind.FILE:
            return "the source ended after one frame (a snapshot URL? give its video URL)"
        return (
            "the source closed the stream or sent what FFmpeg cannot read"
            if frames
            else "no frame after opening"
        )

    def _publish(self, frame: Frame) -> None:
        self.frames_in += 1
        self.callbacks.on_frame(self.name, frame.decode_s)
        with self._lock:
            if self.waits_for_consumer:
                if len(self._frames) >= self.EVERY_FRAME_QUEUE:
                    self._wait_for_consumer(self._queue_has_room)
            elif self._frames:
                self.frames_dropped += 1
                self.callbacks.on_drop(self.name, "stale")
            self._frames.append(frame)
        self._wake.set()

    def _queue_has_room(self) -> None:
        while len(self._frames) >= self.EVERY_FRAME_QUEUE and not self._stop.is_set():
            self._lock.wait(0.1)


def probe_source(kind: SourceKind, target: str | int, spec: StreamSpec) -> None:
    """Refuse a file or camera that yields no frame, before a server starts on it (network sources are
    not probed: a camera may come up later, and the reader retries)."""
    if kind not in (SourceKind.FILE, SourceKind.DEVICE):
        return
    cap = _open_capture(kind, target, spec)
    try:
        if not (cap.isOpened() and cap.grab() and cap.retrieve()[0]):
            raise ServeError(
                file_failure(str(target), cap) if kind is SourceKind.FILE else device_failure(int(target))
            )
    finally:
        cap.release()
