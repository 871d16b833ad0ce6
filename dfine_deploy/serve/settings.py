"""Typed settings of the server and of each stream, and the stream list YAML.

A stream list (see serve/streams.example.yaml) is trusted input, like the command line: it may name
local files and cameras. Streams added over the API are not, and go through `sources.check_url`.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from dfine_deploy.errors import ServeError


@dataclass
class StreamSpec:
    """One video source and how to read it.

    url          rtsp://, rtsps://, http(s):// (MJPEG or progressive video), a file path or file://
                 (trusted input only), a V4L2 device (/dev/videoN or an int; when cameras are allowed)
    every_frame  hand every decoded frame to the detector instead of only the newest (files, audits)
    vid_stride   keep one frame in `vid_stride` (the others are grabbed but never decoded)
    max_fps      at most this many frames per second reach the detector (0: no limit)
    loop         files only: start again at the end instead of stopping
    realtime     files only: read at the file's native frame rate (False: as fast as possible)
    record       annotated video to the server's record folder: None follows the server (--record DIR
                 records every stream), False never, True requires a record folder
    """

    url: str | int
    name: str = ""
    every_frame: bool = False
    vid_stride: int = 1
    max_fps: float = 0.0
    loop: bool = False
    realtime: bool = True
    record: bool | None = None
    open_timeout_s: float = 10.0
    read_timeout_s: float = 5.0
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0

    def __post_init__(self) -> None:
        if self.vid_stride < 1:
            raise ServeError(f"stream {self.name or self.url!r}: vid_stride must be >= 1, got {self.vid_stride}")
        if self.max_fps < 0:
            raise ServeError(
                f"stream {self.name or self.url!r}: max_fps must be >= 0 (0 = no limit), got {self.max_fps}"
            )
        for key in ("open_timeout_s", "read_timeout_s", "backoff_initial_s", "backoff_max_s"):
            if getattr(self, key) <= 0:
                raise ServeError(f"stream {self.name or self.url!r}: {key} must be > 0, got {getattr(self, key)}")


@dataclass
class ServeSettings:
    """Everything `create_app` needs; the CLI fills it from flags, tests build it directly."""

    model: str = ""
    backend: str = "auto"
    device: str = "auto"
    score_threshold: float = 0.25
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_streams: int = 16
    max_upload_mb: float = 10.0
    max_image_pixels: int = 40_000_000  # a 40 MP photo; decompression bombs are refused before decoding
    allow_devices: bool = False  # may API clients open local cameras (/dev/videoN)?
    max_batch: int = 8  # cap on frames per Detector.predict call (the detector's own limit also applies)
    max_pending_uploads: int = 32  # /v1/detect requests waiting for the detector; more get 503
    upload_timeout_s: float = 30.0
    subscriber_queue: int = 32  # results buffered per WebSocket/SSE/MJPEG client; older ones drop
    record_dir: Path | None = None  # when set, every stream is recorded there (annotated)
    output_json: Path | None = None  # when set, every result is appended there (JSON Lines)
    streams: list[StreamSpec] = field(default_factory=list)
    jpeg_quality: int = 80

    def __post_init__(self) -> None:
        if self.max_streams < 1:
            raise ServeError(f"max_streams must be >= 1, got {self.max_streams}")
        if self.max_upload_mb <= 0:
            raise ServeError(f"max_upload_mb must be > 0, got {self.max_upload_mb}")
        if self.max_batch < 1:
            raise ServeError(f"max_batch must be >= 1, got {self.max_batch}")

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)


_STREAM_KEYS = {f.name for f in fields(StreamSpec)}


def stream_from_dict(entry: dict[str, Any], where: str) -> StreamSpec:
    """Build a StreamSpec, naming the nearest valid key when one is misspelt."""
    if not isinstance(entry, dict):
        raise ServeError(f"{where}: expected a mapping with at least 'url', got {type(entry).__name__}")
    unknown = set(entry) - _STREAM_KEYS
    if unknown:
        key = sorted(unknown)[0]
        near = difflib.get_close_matches(key, sorted(_STREAM_KEYS), n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else f" (valid keys: {', '.join(sorted(_STREAM_KEYS))})"
        raise ServeError(f"{where}: unknown key '{key}'{hint}")
    if "url" not in entry:
        raise ServeError(f"{where}: every stream needs a 'url' (rtsp://..., http://..., a file path or a camera)")
    try:
        return StreamSpec(**entry)
    except TypeError as exc:
        raise ServeError(f"{where}: {exc}") from exc


def load_streams_file(path: str | Path) -> list[StreamSpec]:
    """Read a stream list: a YAML mapping with a `streams:` list of stream entries."""
    path = Path(path)
    if not path.is_file():
        raise ServeError(f"stream list {path} does not exist; pass a YAML file like serve/streams.example.yaml")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ServeError(f"stream list {path} is not valid YAML: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("streams"), list):
        raise ServeError(f"stream list {path}: expected a top-level 'streams:' list, got {type(data).__name__}")
    extra = set(data) - {"streams"}
    if extra:
        raise ServeError(f"stream list {path}: unknown top-level key(s) {sorted(extra)}; only 'streams' is read")
    specs = [stream_from_dict(entry, f"{path}: streams[{i}]") for i, entry in enumerate(data["streams"])]
    names = [s.name for s in specs if s.name]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ServeError(f"stream list {path}: stream names must be unique, repeated: {duplicates}")
    return specs
