"""Recordings: each stream's annotated video, written as a series of H.264 MP4 segments.

    DIR/<stream>/<stream>-20260101T120000.000Z.mp4          finished segments (UTC start time)
    DIR/<stream>/<stream>-20260101T120100.000Z.mp4
    DIR/<stream>/.<stream>-20260101T120200.000Z.partial.mp4  the segment being written

The video is H.264 (libx264 from PyAV's wheels, preset `ultrafast`, no B-frames, a keyframe every
second) in a fragmented MP4: every browser plays H.264 in `<video>` (Chromium, Firefox, Safari), and
each second of video is a self-contained fragment written to disk as soon as it is complete, so the
segment being written plays up to its last second, and so does one left behind by a crash. (VP9 costs
several times the CPU per frame at real-time speed; SVT-AV1 makes its thread real-time as root, see
docs/development.md.)

Each segment is written under a hidden partial name and finished (last fragment written, synced to
disk, renamed to its final name) once it holds `segment_s` seconds of video or `segment_s` seconds
have passed, whichever comes first: a crash (SIGKILL, an OOM kill, a power cut) leaves every finished
segment whole and at most one partial file. Names carry the segment's start time and are never
reused, so re-adding a stream or restarting the server never replaces an earlier recording.

Retention is off by default (nothing is deleted). With `max_age_s` or `max_bytes` it deletes the
oldest finished segments of the record folder, across streams, that are older than the age or over
the total size; only files named like our segments are touched, and each pass is logged and counted.
A partial file left by a crash is reported when its stream records again, and never deleted.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from fractions import Fraction
from pathlib import Path

import numpy as np

from dfine_deploy.errors import ServeError
from dfine_deploy.ownership import check_writable_place

log = logging.getLogger("dfine_deploy.serve")

ENCODER = "libx264"
ENCODER_OPTIONS = {"preset": "ultrafast", "tune": "zerolatency"}  # zerolatency: no B-frames, no lookahead
# a fragment per keyframe, written as soon as it is complete; empty_moov: the header needs no sizes
MUXER_OPTIONS = {"movflags": "frag_keyframe+empty_moov+default_base_moof", "flush_packets": "1"}
SEGMENT_NAME = re.compile(r"^(?P<stream>[A-Za-z0-9][A-Za-z0-9_.-]{0,63})-\d{8}T\d{6}\.\d{3}Z(-\d+)?\.mp4$")
PARTIAL_NAME = re.compile(r"^\.[A-Za-z0-9][A-Za-z0-9_.-]{0,63}-\d{8}T\d{6}\.\d{3}Z(-\d+)?\.partial\.mp4$")


@dataclass(frozen=True)
class RecordingPolicy:
    """How a server records: segment length and retention limits (None: keep everything)."""

    segment_s: float = 60.0
    max_age_s: float | None = None
    max_bytes: int | None = None


def _fsync(path: Path) -> None:
    """Make a file (or a folder's entries) durable, so a power cut after a rename keeps both."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentRecorder:
    """Writes one stream's annotated frames as consecutive segments in its own folder.

    Only the pipeline's output thread writes; `close` may come from another thread (stream removed),
    so both hold a lock.
    """

    def __init__(self, folder: Path, stream: str, segment_s: float, on_finished: Callable[[Path], None]):
        self.folder = folder
        self.stream = stream
        self.segment_s = segment_s
        self.fps = 0.0  # set from the first frame's rate; every segment of the stream uses it
        self._on_finished = on_finished
        self._lock = threading.Lock()
        self._writer: _H264Writer | None = None
        self._partial: Path | None = None
        self._final: Path | None = None
        self._frames = 0  # in the current segment
        self._opened_at = 0.0
        self._closed = False
        self.segments = 0  # finished so far
        self._report_leftovers()

    def _report_leftovers(self) -> None:
        if not self.folder.is_dir():
            return
        prefix = f".{self.stream}-"
        left = sorted(
            p.name for p in self.folder.iterdir() if p.name.startswith(prefix) and PARTIAL_NAME.match(p.name)
        )
        if left:
            log.warning(
                "stream %s: %d unfinished segment(s) in %s from a run that was killed (they play up to "
                "about a second before the kill; left as they are, rename or delete them when you like): %s",
                self.stream,
                len(left),
                self.folder,
                ", ".join(left),
            )

    @property
    def current(self) -> Path | None:
        """The partial file being written, if any."""
        return self._partial

    def last_frame_at(self) -> tuple[Path, float] | None:
        """The segment holding the last frame written (its final name: the file appears there once the
        segment is finished) and that frame's time in it, in seconds; None before the first frame."""
        with self._lock:
            if self._final is None or self._frames == 0 or not self.fps:
                return None
            return self._final, (self._frames - 1) / self.fps

    def write(self, image: np.ndarray, fps: float) -> None:
        """Append a BGR frame; `fps` is used when the first segment opens. A folder or file that cannot
        be written stops this stream's recording with one error line (the stream itself goes on)."""
        with self._lock:
            if self._closed:
                return
            try:
                self._roll(image, fps)
            except (OSError, ServeError, ValueError) as exc:  # PyAV's errors are OSError or ValueError
                self._closed = True
                log.error("stream %s: recording stopped, %s", self.stream, exc)
                return
            assert self._writer is not None
            try:
                self._writer.write(image)
            except (OSError, ValueError) as exc:
                self._closed = True
                log.error("stream %s: recording stopped, %s", self.stream, exc)
                return
            self._frames += 1

    def _roll(self, image: np.ndarray, fps: float) -> None:
        """Open the first segment, or finish the current one and open the next when it is full."""
        if self._writer is None:
            self._open(image, fps)
        elif (
            self._frames >= self.segment_s * self.fps or time.monotonic() - self._opened_at >= self.segment_s
        ):
            self._finish()
            self._open(image, fps)

    def close(self) -> Path | None:
        """Finish the current segment; later writes are ignored. Returns the last finished file."""
        with self._lock:
            self._closed = True
            if self._writer is None:
                return None
            try:
                return self._finish()
            except OSError as exc:
                log.error("stream %s: the last segment could not be finished, %s", self.stream, exc)
                return None

    def _open(self, image: np.ndarray, fps: float) -> None:
        if not self.fps:
            self.fps = fps if 0 < fps <= 240 else 10.0
        self.folder.mkdir(parents=True, exist_ok=True)
        self._final, self._partial = self._free_names()
        self._writer = _H264Writer(self._partial, image.shape[1], image.shape[0], self.fps)
        self._frames = 0
        self._opened_at = time.monotonic()

    def _free_names(self) -> tuple[Path, Path]:
        """Final and partial names for a segment starting now that no file has, finished or not."""
        now = datetime.now(timezone.utc)
        stamp = now.strftime("%Y%m%dT%H%M%S.") + f"{now.microsecond // 1000:03d}Z"
        for n in range(1, 10_000):
            base = f"{self.stream}-{stamp}" + (f"-{n}" if n > 1 else "")
            final, partial = self.folder / f"{base}.mp4", self.folder / f".{base}.partial.mp4"
            if not final.exists() and not partial.exists():
                return final, partial
        raise ServeError(f"stream {self.stream}: no free segment name in {self.folder} for {stamp}")

    def _finish(self) -> Path:
        assert self._writer is not None and self._partial is not None and self._final is not None
        writer, self._writer = self._writer, None
        writer.close()  # the last fragment
        _fsync(self._partial)
        os.replace(self._partial, self._final)
        with contextlib.suppress(OSError):  # not every file system syncs a folder
            _fsync(self.folder)
        finished, self._partial = self._final, None
        self.segments += 1
        self._on_finished(finished)
        return finished


class _H264Writer:
    """One MP4 file of H.264 video, frames BGR at a constant rate; see the module docstring."""

    def __init__(self, path: Path, width: int, height: int, fps: float, options: dict = ENCODER_OPTIONS):
        import av  # the serve extra

        self.container = av.open(str(path), "w", format="mp4", options=MUXER_OPTIONS)
        try:
            rate = Fraction(round(fps * 1000), 1000)
            self.stream = self.container.add_stream(ENCODER, rate=rate)
            # 4:2:0 needs even sides: an odd row or column is scaled away; so is a camera's change of
            # resolution, which keeps the file playable
            self.stream.width, self.stream.height = max(width - width % 2, 2), max(height - height % 2, 2)
            self.stream.pix_fmt = "yuv420p"
            self.stream.options = {**options, "g": str(max(round(fps), 1))}  # a keyframe a second
            self.stream.codec_context.time_base = 1 / rate
        except BaseException:
            self.container.close()
            raise
        self._frame_type = av.VideoFrame
        self._pts = 0

    def write(self, image: np.ndarray) -> None:
        frame = self._frame_type.from_ndarray(image, format="bgr24")
        if (frame.width, frame.height) != (self.stream.width, self.stream.height):
            frame = frame.reformat(self.stream.width, self.stream.height)
        frame.pts = self._pts
        self._pts += 1
        self.container.mux(self.stream.encode(frame))

    def close(self) -> None:
        try:
            self.container.mux(self.stream.encode(None))  # what the encoder still holds
        finally:
            self.container.close()


class Recordings:
    """The record folder of one server: a SegmentRecorder per stream, and retention over all of them."""

    def __init__(
        self,
        root: Path,
        policy: RecordingPolicy,
        on_segment: Callable[[str], None] = lambda stream: None,
        on_deleted: Callable[[str, int], None] = lambda reason, count: None,
    ):
        self.root = root
        self.policy = policy
        self._on_segment = on_segment
        self._on_deleted = on_deleted
        self._lock = threading.Lock()

    def recorder(self, stream: str) -> SegmentRecorder:
        return SegmentRecorder(self.root / stream, stream, self.policy.segment_s, self._finished)

    def _finished(self, path: Path) -> None:
        match = SEGMENT_NAME.match(path.name)
        self._on_segment(match.group("stream") if match else path.parent.name)
        self.enforce_retention()

    def segments(self) -> list[tuple[Path, os.stat_result]]:
        """Every finished segment under the root (in stream folders, named as we name them), oldest first."""
        found = []
        if not self.root.is_dir():
            return found
        for folder in self.root.iterdir():
            if not folder.is_dir():
                continue
            for path in folder.iterdir():
                match = SEGMENT_NAME.match(path.name)
                if match and match.group("stream") == folder.name and path.is_file():
                    found.append((path, path.stat()))
        return sorted(found, key=lambda item: (item[1].st_mtime, item[0].name))

    def enforce_retention(self) -> list[Path]:
        """Delete the finished segments that are over the age or size limit, oldest first; log and count."""
        policy = self.policy
        if policy.max_age_s is None and policy.max_bytes is None:
            return []
        with self._lock:
            segments = self.segments()
            now = time.time()
            doomed: dict[Path, str] = {}
            if policy.max_age_s is not None:
                doomed.update({p: "age" for p, st in segments if now - st.st_mtime > policy.max_age_s})
            if policy.max_bytes is not None:
                total = sum(st.st_size for p, st in segments if p not in doomed)
                for path, st in segments:
                    if total <= policy.max_bytes:
                        break
                    if path not in doomed:
                        doomed[path] = "size"
                        total -= st.st_size
            deleted = []
            for path in doomed:
                try:
                    path.unlink()
                    deleted.append(path)
                except FileNotFoundError:  # another server sharing the folder deleted it first
                    continue
        if deleted:
            for reason in ("age", "size"):
                count = sum(1 for p in deleted if doomed[p] == reason)
                if count:
                    self._on_deleted(reason, count)
            log.info(
                "recordings in %s: retention deleted %d segment(s) (%s), oldest %s",
                self.root,
                len(deleted),
                _limits(policy),
                deleted[0].name,
            )
        return deleted


def _limits(policy: RecordingPolicy) -> str:
    parts = []
    if policy.max_age_s is not None:
        parts.append(f"older than {policy.max_age_s / 3600:g} h")
    if policy.max_bytes is not None:
        parts.append(f"beyond {policy.max_bytes / 1e9:g} GB in all")
    return " or ".join(parts)


def recording_folder(root: Path | None, stream: str, record: bool | None, source: str | None) -> Path | None:
    """Where a stream's segments go (None: not recorded). Refuses, in one line, a stream that asks to
    be recorded on a server without a record folder, a root that cannot be a writable folder, and a
    file source inside its own stream folder (retention there could delete it)."""
    if record and root is None:
        raise ServeError(
            f"stream {stream!r} asks to be recorded, but the server has no record folder (--record DIR)"
        )
    if root is None or record is False:
        return None
    folder = Path(root) / stream
    check_writable_place(folder, f"recording stream {stream!r} (--record {root})", ServeError)
    if source is not None and Path(source).resolve().parent == folder.resolve():
        raise ServeError(
            f"stream {stream!r} reads {source}, inside its own recording folder {folder}; "
            "record to another folder or move the video"
        )
    return folder
