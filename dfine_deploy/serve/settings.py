"""Typed settings of the server and of each stream, and the stream list YAML.

A stream list (see serve/streams.example.yaml) is trusted input, like the command line: it may name
local files and cameras. Streams added over the API are not, and go through `sources.classify_source`.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from dfine_deploy.errors import ServeError
from dfine_deploy.numbers import AT_LEAST_1, FRACTION, POSITIVE, Range
from dfine_deploy.serve.recording import RecordingPolicy
from dfine_deploy.serve.regions import DetectSpec
from dfine_deploy.text_files import load_yaml
from dfine_deploy.tiles import TileSpec

# Points of lines and zones are frame pixels, from 0 to this: 8K video is 7680 x 4320. A zone becomes a
# mask as large as its farthest point (supervision's PolygonZone), so a bound is what keeps a point at
# (10^6, 10^6) from asking for a 931 GiB mask.
MAX_FRAME_SIDE = 8192
COORDINATE = Range(0, MAX_FRAME_SIDE)

# names of streams, counting lines and zones: they appear in URLs, file names and metric labels
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")
HOST_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*\.?$")


def _api(description: str) -> dict[str, Any]:
    """Field metadata: API clients may set this field (POST /v1/streams); the others are trusted-only."""
    return {"api": True, "description": description}


@dataclass
class CountingLine:
    """A line that counts tracked objects crossing it, per class and direction.

    `start` and `end` are points in frame pixels (x right, y down). Standing on the picture at `start`
    and facing `end`, an object that crosses from your right-hand side to your left-hand side is
    counted `in`, the other way `out`: a line drawn downwards counts objects moving right as `in`. This
    is supervision's `LineZone` convention; `in_direction` gives the side. An object counts once per
    crossing, when its whole box has passed the line, and only between the two perpendiculars through
    its ends (serve/tracking.py, `LineCounter`).
    """

    name: str
    start: tuple[float, float]
    end: tuple[float, float]

    def in_direction(self) -> tuple[float, float]:
        """The unit vector, in frame pixels, pointing to the side an object crosses to when it counts
        `in` (what the annotated frame's arrow shows)."""
        dx, dy = self.end[0] - self.start[0], self.end[1] - self.start[1]
        length = math.hypot(dx, dy)
        return dy / length, -dx / length


@dataclass
class CountingZone:
    """A polygon (frame pixels, at least 3 points) whose occupancy is counted per class in every frame.

    An object is inside when the bottom centre of its box is.
    """

    name: str
    polygon: list[tuple[float, float]]


NETWORK_SCHEMES = ("rtsp", "rtsps", "http", "https")
DEVICE_PATH = re.compile(r"^/dev/video(\d+)$")


def is_live(url: str | int) -> bool:
    """A camera or a network stream: a source that cannot loop or be read faster than it comes."""
    text = str(url).strip()
    return text.isdigit() or bool(DEVICE_PATH.match(text)) or urlsplit(text).scheme.lower() in NETWORK_SCHEMES


@dataclass
class StreamSpec:
    """One video source, how to read it, and whether to track and count objects in it.

    This dataclass is the one schema of a stream: the stream list YAML and `POST /v1/streams` are both
    read through `stream_from_dict`, and the API's request model is derived from the fields marked
    `api` (see `app.StreamRequest`); unknown keys are refused both ways.

    url          rtsp://, rtsps://, http(s):// (MJPEG or progressive video), a file path or file://
                 (trusted input only), a V4L2 device (/dev/videoN or an int; when cameras are allowed)
    loop         files only: start again at the end instead of stopping
    realtime     files and clips over HTTP: read at the video's own pace, from its frames' timestamps
                 (False: files as fast as possible)
    record       annotated video to the server's record folder: None follows the server (--record DIR
                 records every stream), False never, True requires a record folder
    live_frames, live_window_s
                 the health rule: a stream is live while its connection delivered at least live_frames
                 frames in the last live_window_s seconds (default 5 in 5 s, i.e. 1 fps); fewer is
                 connecting (never reached it) or stalled (fell below it); see sources.py
    backoff_initial_s, backoff_max_s, backoff_reset_s
                 reconnect delays double from initial to max (with jitter), and start again from
                 initial only after a connection stayed live for backoff_reset_s
    tiles        {grid: [3, 2], overlap: 0.2, full_frame: true}: detect overlapping crops of each frame
                 (small objects), merged into one result (dfine_deploy/tiles.py, runtime/tile_merge.py)
    detect       {motion: true, fps: 5}: detect only where something moved, at most fps times a second
                 (dfine_deploy/serve/regions.py)
    """

    url: str | int = field(
        metadata=_api("rtsp://, rtsps://, http:// or https:// (MJPEG or progressive video)")
    )
    name: str = field(default="", metadata=_api("letters, digits, '_', '-', '.'; generated when left out"))
    every_frame: bool = field(default=False, metadata=_api("detect every frame instead of only the newest"))
    vid_stride: int = field(default=1, metadata=_api("keep one frame in vid_stride"))
    max_fps: float = field(default=0.0, metadata=_api("at most this many frames per second (0: no limit)"))
    track: bool = field(
        default=False, metadata=_api("give every detection a track_id that follows the object")
    )
    lines: list[CountingLine] = field(
        default_factory=list, metadata=_api("counting lines (need track): {name, start: [x, y], end: [x, y]}")
    )
    zones: list[CountingZone] = field(
        default_factory=list,
        metadata=_api("zones whose occupancy is counted: {name, polygon: [[x, y], ...]}"),
    )
    loop: bool = False
    realtime: bool = True
    record: bool | None = None
    open_timeout_s: float = 10.0
    read_timeout_s: float = field(default=5.0, metadata=_api("a stream without frames this long reconnects"))
    live_frames: int = field(
        default=5, metadata=_api("live only while at least this many frames arrived in live_window_s")
    )
    live_window_s: float = field(default=5.0, metadata=_api("the window of live_frames, in seconds"))
    backoff_initial_s: float = 0.5
    backoff_max_s: float = 30.0
    backoff_reset_s: float = 30.0
    tiles: TileSpec | None = None
    detect: DetectSpec | None = None

    def __post_init__(self) -> None:
        # the name goes into URLs, folders and metric labels: checked here, so that a stream list
        # is refused in one line before the server starts, as a POST is
        if self.name != "" and not (isinstance(self.name, str) and NAME_PATTERN.match(self.name)):
            raise ServeError(
                f"stream name {self.name!r}: use 1-64 letters, digits, '_', '-' or '.', starting with a "
                "letter or digit (e.g. front-door)"
            )
        where = f"stream {self.name or redact(self.url)!r}"
        check_ranges(self, where, _STREAM_RANGES)
        for key, kind in (("tiles", TileSpec), ("detect", DetectSpec)):
            value = getattr(self, key)
            if value is not None and not isinstance(value, kind):
                try:
                    setattr(self, key, kind.from_mapping(value))
                except ValueError as exc:
                    raise ServeError(f"{where}: {key}: {exc}") from None
        self.lines = [_counting_line(entry, f"{where}: lines[{i}]") for i, entry in enumerate(self.lines)]
        self.zones = [_counting_zone(entry, f"{where}: zones[{i}]") for i, entry in enumerate(self.zones)]
        if self.lines and not self.track:
            raise ServeError(
                f"{where}: counting lines follow tracks; set track: true (or --track) to use them"
            )
        file_only = [
            key for key, given in (("loop", self.loop), ("realtime: false", not self.realtime)) if given
        ]
        if file_only and is_live(self.url):  # ignored for a live source, without a word
            raise ServeError(
                f"{where}: {' and '.join(file_only)}: for video files only, and {redact(str(self.url))} is "
                "a live source; leave it out"
            )
        names = [c.name for c in self.lines + self.zones]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            raise ServeError(
                f"{where}: line and zone names must be unique within a stream, repeated: {repeated}"
            )


def _point(value: Any, where: str) -> tuple[float, float]:
    if not (isinstance(value, (list, tuple)) and len(value) == 2 and all(COORDINATE.holds(v) for v in value)):
        raise ServeError(
            f"{where}: expected a point [x, y] in frame pixels, each {COORDINATE.describe()}, "
            f"got {list(value) if isinstance(value, tuple) else value!r}"
        )
    return float(value[0]), float(value[1])


def _is_number(value: Any) -> bool:
    """A finite int or float: NaN and infinity are no place in a frame (JSON would store them as null)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _polygon_problem(points: list[tuple[float, float]]) -> str:
    """Why `points` is no simple polygon with an area ('' when it is one): a zone whose edges cross
    or that encloses nothing counts nothing, or what no one meant."""
    n = len(points)
    edges = [(points[i], points[(i + 1) % n]) for i in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            if j == i + 1 or (i == 0 and j == n - 1):
                continue  # neighbours share a corner
            if _segments_meet(*edges[i], *edges[j]):
                return f"its edges {i} and {j} cross (points {i}-{(i + 1) % n} and {j}-{(j + 1) % n})"
    twice_area = sum(
        points[i][0] * points[(i + 1) % n][1] - points[(i + 1) % n][0] * points[i][1] for i in range(n)
    )
    if abs(twice_area) < 1e-9:
        return "it encloses no area (its points lie on one line or repeat)"
    return ""


def _segments_meet(a: tuple, b: tuple, c: tuple, d: tuple) -> bool:
    """Whether the closed segments ab and cd share a point."""

    def side(p: tuple, q: tuple, r: tuple) -> float:
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])

    def within(p: tuple, q: tuple, r: tuple) -> bool:  # r on the line pq: between p and q
        return min(p[0], q[0]) <= r[0] <= max(p[0], q[0]) and min(p[1], q[1]) <= r[1] <= max(p[1], q[1])

    d1, d2, d3, d4 = side(c, d, a), side(c, d, b), side(a, b, c), side(a, b, d)
    if ((d1 > 0) != (d2 > 0)) and d1 != 0 and d2 != 0 and ((d3 > 0) != (d4 > 0)) and d3 != 0 and d4 != 0:
        return True
    return (
        (d1 == 0 and within(c, d, a))
        or (d2 == 0 and within(c, d, b))
        or (d3 == 0 and within(a, b, c))
        or (d4 == 0 and within(a, b, d))
    )


def _checked_keys(entry: Any, cls: type, where: str) -> dict[str, Any]:
    """The entry as a dict, refusing unknown keys (naming the nearest valid one) and missing ones."""
    if isinstance(entry, cls):
        return {f.name: getattr(entry, f.name) for f in fields(cls)}
    valid = sorted(f.name for f in fields(cls))
    if not isinstance(entry, dict):
        raise ServeError(f"{where}: expected a mapping with keys {valid}, got {type(entry).__name__}")
    unknown = sorted(set(entry) - set(valid))
    if unknown:
        near = difflib.get_close_matches(unknown[0], valid, n=1)
        hint = f" (did you mean '{near[0]}'?)" if near else f" (valid keys: {', '.join(valid)})"
        raise ServeError(f"{where}: unknown key '{unknown[0]}'{hint}")
    required = [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]
    missing = [k for k in required if k not in entry]
    if missing:
        raise ServeError(f"{where}: missing key(s) {missing}")
    return dict(entry)


def _counting_line(entry: Any, where: str) -> CountingLine:
    data = _checked_keys(entry, CountingLine, where)
    start, end = _point(data["start"], f"{where}.start"), _point(data["end"], f"{where}.end")
    if start == end:
        raise ServeError(
            f"{where}: start and end are the same point {start}; a line needs two distinct points"
        )
    return CountingLine(_counting_name(data["name"], where), start, end)


def _counting_zone(entry: Any, where: str) -> CountingZone:
    data = _checked_keys(entry, CountingZone, where)
    polygon = data["polygon"]
    if not isinstance(polygon, (list, tuple)) or len(polygon) < 3:
        raise ServeError(f"{where}.polygon: expected at least 3 points [[x, y], ...], got {polygon!r}")
    points = [_point(p, f"{where}.polygon[{i}]") for i, p in enumerate(polygon)]
    problem = _polygon_problem(points)
    if problem:
        raise ServeError(
            f"{where}.polygon {points}: {problem}; a zone is a simple polygon with an area: list its "
            "corners in order around it"
        )
    return CountingZone(_counting_name(data["name"], where), points)


def _counting_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ServeError(f"{where}.name: use 1-64 letters, digits, '_', '-' or '.', got {name!r}")
    return name


DEFAULT_EVENTS_MAX_GB = 1.0
"""Retention of an events folder unless --events-max-size says otherwise: about 50 000 events with
their snapshots (20 KB each is typical). The index is on disk, so memory does not grow with it."""


@dataclass(frozen=True)
class EventPolicy:
    """Retention of the events folder (None: keep everything)."""

    max_age_s: float | None = None
    max_bytes: int | None = None


@dataclass
class ServeSettings:
    """Everything `create_app` needs; the CLI fills it from flags, tests build it directly."""

    model: str = ""
    names: Path | None = None  # class-names file overriding the model's (--names)
    backend: str = "auto"
    precision: str = "auto"  # which graph of an artifact folder (Detector.open)
    unverified: bool = False  # serve an engine without a passing dfine-verify result here (--unverified)
    threads: int | None = None  # CPU threads of the detector; None: the backend's default
    device: str = "auto"
    # one score for every class (--score-threshold); None: each class's chosen by dfine-export --data for
    # the graph served, else thresholds.DEFAULT_SCORE_THRESHOLD. class_thresholds (--class-threshold) win.
    score_threshold: float | None = None
    class_thresholds: dict[str, float] = field(default_factory=dict)
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
    record_dir: Path | None = None  # when set, every stream is recorded there (annotated; recording.py)
    record_segment_s: float = 60.0  # a segment is finished after this much video or wall-clock time
    record_max_age_h: float | None = None  # retention: delete finished segments older than this
    record_max_gb: float | None = None  # retention: keep the record folder under this size (oldest go)
    output_json: Path | None = None  # when set, every result is appended there (JSON Lines)
    events_dir: Path | None = None  # when set, events and their snapshots are kept there (events.py)
    events_max_age_h: float | None = None  # retention: delete events older than this
    events_max_gb: float = DEFAULT_EVENTS_MAX_GB  # retention: keep the events folder under this size
    mqtt_url: str | None = None  # mqtt://[user:password@]host[:port]: events (and detections) go there
    mqtt_prefix: str = "dfine"  # the first level of every topic
    redis_url: str | None = None  # redis://[user:password@]host[:port][/db]: Redis Streams
    redis_prefix: str = "dfine"  # the first part of every stream key
    redis_maxlen: int = 100_000  # entries kept per Redis stream key (MAXLEN ~)
    bus_detections: bool = False  # also publish every frame's result, not only events
    bus_buffer: int = 10_000  # messages waiting per bus; when full the oldest go (counted)
    shard: tuple[int, int] = (0, 1)  # (index, count) from --shard (shard.py): for the metrics and client id
    # results carry one label per object (the best of each box): what counting, tracking and the live
    # view use. True adds `raw_detections`, the model's top-K (query, class) pairs as they came.
    raw_detections: bool = False
    streams: list[StreamSpec] = field(default_factory=list)
    jpeg_quality: int = 80
    # browsers (security.py): Host names accepted besides IP addresses, localhost, this machine's name
    # and `host`; Origins accepted besides the server's own ("*" in either: any)
    allowed_hosts: list[str] = field(default_factory=list)
    allowed_origins: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        check_ranges(self, "server settings", _SERVER_RANGES)
        for name, value in self.class_thresholds.items():
            FRACTION.check(value, f"--class-threshold {name}", ServeError)
        for name in self.allowed_hosts:
            if name != "*" and not HOST_NAME.match(name):
                raise ServeError(
                    f"--allowed-host {name!r}: give a host name like cams.example.com "
                    "(no scheme, port or path), or *"
                )
        for origin in self.allowed_origins:
            parts = urlsplit(origin)
            if origin != "*" and not (
                parts.scheme in ("http", "https") and parts.hostname and parts.path in ("", "/")
            ):
                raise ServeError(
                    f"--allowed-origin {origin!r}: give scheme://host[:port] "
                    "like https://ops.example.com, or *"
                )
        for key, flag, optional, low in (  # optional: None keeps everything
            ("record_segment_s", "--record-segment", False, 1.0),
            ("record_max_age_h", "--record-max-age", True, 0.0),
            ("record_max_gb", "--record-max-size", True, 0.0),
            ("events_max_age_h", "--events-max-age", True, 0.0),
            ("events_max_gb", "--events-max-size", False, 0.0),
        ):
            value = getattr(self, key)
            if not (optional and value is None) and not (
                _is_number(value) and low <= value < math.inf and value > 0
            ):
                raise ServeError(
                    f"{key} ({flag}) must be a finite number {'>= 1' if low else '> 0'}, got {value!r}"
                )

        if self.mqtt_url is not None:
            broker_address(self.mqtt_url, MQTT_SCHEMES, "--mqtt")
        if self.redis_url is not None:
            broker_address(self.redis_url, REDIS_SCHEMES, "--redis")
        for key, flag in (("mqtt_prefix", "--mqtt-prefix"), ("redis_prefix", "--redis-prefix")):
            if not NAME_PATTERN.match(getattr(self, key)):
                raise ServeError(
                    f"{flag} {getattr(self, key)!r}: use 1-64 letters, digits, '_', '-' or '.' "
                    "(no '/', '#', '+' or ':', which the topic and key layouts use)"
                )

    @property
    def max_upload_bytes(self) -> int:
        return int(self.max_upload_mb * 1024 * 1024)

    @property
    def events_policy(self) -> EventPolicy:
        return EventPolicy(
            max_age_s=None if self.events_max_age_h is None else self.events_max_age_h * 3600,
            max_bytes=int(self.events_max_gb * 1e9),
        )

    @property
    def recording_policy(self) -> RecordingPolicy:
        return RecordingPolicy(
            segment_s=self.record_segment_s,
            max_age_s=None if self.record_max_age_h is None else self.record_max_age_h * 3600,
            max_bytes=None if self.record_max_gb is None else int(self.record_max_gb * 1e9),
        )


def broker_address(url: str, schemes: dict[str, int], flag: str) -> tuple[str, int, str | None, str | None]:
    """Host, port, user and password of a broker URL; one line naming the flag when it is not one."""
    parts = urlsplit(url)
    try:
        port = parts.port
    except ValueError:
        port = -1
    if parts.scheme not in schemes or not parts.hostname or port == -1:
        example = f"{next(iter(schemes))}://broker.local:{next(iter(schemes.values()))}"
        raise ServeError(
            f"{flag} {redact(url)!r}: give {'|'.join(schemes)}://[user:password@]host[:port], e.g. {example}"
        )
    return parts.hostname, port or schemes[parts.scheme], parts.username, parts.password


MQTT_SCHEMES = {"mqtt": 1883}
REDIS_SCHEMES = {"redis": 6379, "rediss": 6380}


_SECRET_PARAM = re.compile(r"pass|pwd|secret|token|key|auth|sig|cred", re.IGNORECASE)
"""Query parameters whose value is masked: cameras take `?user=admin&pwd=...`, `?token=...`,
signed URLs `?signature=...`; a name holding any of these parts is treated as a secret."""


def redact(url: str | int) -> str:
    """The URL without its password or secret query values, safe to show in listings, logs and errors.

    The password is everything between the first ':' after `scheme://` and the last '@' before the
    query, so a password with an unescaped '/', '#' or '@' in it (which urlsplit would misread as a
    path, fragment or host) is hidden whole.
    """
    if isinstance(url, int):
        return str(url)
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    query_at = rest.find("?")
    userinfo_end = rest.rfind("@", 0, query_at if query_at >= 0 else len(rest))
    if userinfo_end >= 0 and ":" in rest[:userinfo_end]:
        user = rest[: rest.index(":")]
        rest = f"{user}:***{rest[userinfo_end:]}"
        query_at = rest.find("?")
    if query_at < 0:
        return f"{scheme}://{rest}"
    query, hash_sign, fragment = rest[query_at + 1 :].partition("#")
    masked = [
        f"{name}=***" if eq and _SECRET_PARAM.search(name) else f"{name}{eq}{value}"
        for name, eq, value in (pair.partition("=") for pair in query.split("&"))
    ]
    return f"{scheme}://{rest[: query_at + 1]}{'&'.join(masked)}{hash_sign}{fragment}"


@dataclass(frozen=True)
class WholeRange(Range):
    """A Range of whole numbers: a count or a stride of 2.5 means nothing."""

    def holds(self, value: Any) -> bool:
        return isinstance(value, int) and super().holds(value)

    def describe(self) -> str:
        if self.low is None or self.high is None:
            return super().describe().replace("a finite number", "a whole number")
        return f"a whole number from {self.low:.0f} to {self.high:.0f}"


def check_ranges(settings: Any, where: str, ranges: dict[str, Range]) -> None:
    """Refuse a field outside its range, or not a finite number (None means unset: left alone)."""
    for key, rule in ranges.items():
        value = getattr(settings, key)
        if value is not None:
            rule.check(value, f"{where}: {key}", ServeError)


HOUR_S = 3600.0
# A wait or a window in seconds is at least this long and at most HOUR_S: shorter than a frame of any
# camera is no window, and a timeout past an hour is a stream never declared dead (and a 1e308 s one
# overflows the waits of the reader thread).
SECONDS = Range(0.01, HOUR_S)
MAX_FRAMES_PER_S = 1000.0  # no camera or file delivers more; max_fps above it is no limit at all

_STREAM_RANGES = {
    "vid_stride": WholeRange(1, 10_000),
    "max_fps": Range(0, MAX_FRAMES_PER_S),  # 0: no limit
    "open_timeout_s": SECONDS,
    "read_timeout_s": SECONDS,
    "backoff_initial_s": SECONDS,
    "backoff_max_s": SECONDS,
    "backoff_reset_s": SECONDS,
    "live_window_s": SECONDS,
    "live_frames": WholeRange(1, round(HOUR_S * MAX_FRAMES_PER_S)),
}
_SERVER_RANGES = {
    "threads": AT_LEAST_1,
    "score_threshold": FRACTION,
    "port": Range(0, 65535),  # 0: any free port
    "max_streams": AT_LEAST_1,
    "max_upload_mb": POSITIVE,
    "max_image_pixels": AT_LEAST_1,
    "max_batch": AT_LEAST_1,
    "max_pending_uploads": AT_LEAST_1,
    "upload_timeout_s": SECONDS,
    "subscriber_queue": AT_LEAST_1,
    "jpeg_quality": Range(1, 100),
    "redis_maxlen": AT_LEAST_1,
    "bus_buffer": Range(100, 10_000_000),
}


API_FIELDS = tuple(f.name for f in fields(StreamSpec) if f.metadata.get("api"))
COUNTING_FIELDS = ("track", "lines", "zones")  # what a running stream may change (PATCH /v1/streams/{name})


def stream_from_dict(entry: Any, where: str, *, api: bool = False) -> StreamSpec:
    """Build a StreamSpec from a YAML entry or an API request, naming the nearest valid key when one is
    misspelt; with `api`, keys only trusted input may set (files, recording, ...) are refused too."""
    if isinstance(entry, dict) and "url" not in entry:
        raise ServeError(
            f"{where}: every stream needs a 'url' (rtsp://..., http://..., a file path or a camera)"
        )
    data = _checked_keys(entry, StreamSpec, where)
    if api:
        trusted_only = sorted(set(data) - set(API_FIELDS))
        if trusted_only:
            raise ServeError(
                f"{where}: '{trusted_only[0]}' can only be set in the stream list or on the command line; "
                f"API clients may set {', '.join(API_FIELDS)}"
            )
    try:
        return StreamSpec(**data)
    except TypeError as exc:
        raise ServeError(f"{where}: {exc}") from exc


def load_streams_file(path: str | Path) -> list[StreamSpec]:
    """Read a stream list: a YAML mapping with a `streams:` list of stream entries."""
    path = Path(path)
    data = load_yaml(path, "stream list", ServeError, "pass a YAML file like serve/streams.example.yaml")
    if not isinstance(data, dict) or not isinstance(data.get("streams"), list):
        raise ServeError(
            f"stream list {path}: expected a top-level 'streams:' list, got {type(data).__name__}"
        )
    extra = set(data) - {"streams"}
    if extra:
        raise ServeError(
            f"stream list {path}: unknown top-level key(s) {sorted(extra)}; only 'streams' is read"
        )
    specs = [stream_from_dict(entry, f"{path}: streams[{i}]") for i, entry in enumerate(data["streams"])]
    names = [s.name for s in specs if s.name]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ServeError(f"stream list {path}: stream names must be unique, repeated: {duplicates}")
    return specs
