r"""`dfine-serve`: detections for video streams and uploaded images over HTTP.

Examples:
    dfine-serve artifacts/dfine-s --streams serve/streams.example.yaml
    dfine-serve model.onnx --source rtsp://cam.local/stream --host 0.0.0.0 --api-key "$KEY"
    # a few seconds of a local video: annotated copy and JSON Lines detections, then exit
    dfine-serve model.onnx --source video.mp4 --every-frame --duration 10 --port 0 \
        --record out/ --output-json out/detections.jsonl
    # track objects in a camera; open http://127.0.0.1:8000/ for the dashboard
    dfine-serve model.onnx --source rtsp://cam.local/stream --track
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import itertools
import logging
import os
import re
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.class_names import name_key
from dfine_deploy.cli import (
    MODEL_HELP,
    ArgumentParser,
    check_option_owners,
    configure_logging,
    friendly_errors,
    model_argument,
    option_dest,
)
from dfine_deploy.errors import ServeError
from dfine_deploy.files import user_path
from dfine_deploy.numbers import AT_LEAST_1, POSITIVE
from dfine_deploy.ownership import check_writable_place
from dfine_deploy.runtime.backends import BACKEND_HELP, PRECISION_HELP
from dfine_deploy.serve import require_serve_extra
from dfine_deploy.serve.recording import recording_folder
from dfine_deploy.serve.regions import DetectSpec
from dfine_deploy.serve.settings import DEFAULT_EVENTS_MAX_GB, ServeSettings, StreamSpec, load_streams_file
from dfine_deploy.serve.shard import parse_shard, shard_streams
from dfine_deploy.serve.sources import SourceKind, StreamState, classify_source, probe_source
from dfine_deploy.thresholds import DEFAULT_SCORE_THRESHOLD
from dfine_deploy.tiles import TileSpec

log = logging.getLogger("dfine_deploy.serve")
GRACE_S = 3  # seconds open streaming responses get on shutdown before they are cut
STOP_TIMEOUT_S = 20.0  # a stop not over by then is a hang: logged and ended (server.py)


def get_args_parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog="dfine-serve", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "model", type=model_argument, help=f"an artifact folder, .onnx or .engine file, or {MODEL_HELP}"
    )
    p.add_argument(
        "--names",
        type=user_path,
        metavar="FILE",
        help="class names, one per line (or a JSON/YAML list): overrides the model's",
    )
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8000, help="port (0: any free port)")
    p.add_argument("--backend", default=BackendName.AUTO, help=BACKEND_HELP)
    p.add_argument("--precision", default=Precision.AUTO, choices=list(Precision), help=PRECISION_HELP)
    p.add_argument(
        "--unverified",
        action="store_true",
        help="serve an engine, or an INT8 graph gated on another CPU class, that has no passing "
        "dfine-verify result on this device (/metrics and the dashboard say so)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads of the detector (default: the cores this process may use, CPU quota included)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument(
        "--score-threshold",
        type=float,
        default=None,
        help="one score threshold for every class (default: each class's chosen by dfine-export --data for "
        f"the graph served, else {DEFAULT_SCORE_THRESHOLD})",
    )
    p.add_argument(
        "--class-threshold",
        action="append",
        default=[],
        metavar="NAME=SCORE",
        help="one class's score threshold (repeatable); wins over --score-threshold and the chosen ones",
    )
    p.add_argument("--streams", type=user_path, help="YAML stream list (see serve/streams.example.yaml)")
    p.add_argument(
        "--source", action="append", default=[], help="a stream URL, video file or camera (repeatable)"
    )
    p.add_argument("--loop", action="store_true", help="--source files start again at their end")
    p.add_argument(
        "--fast", action="store_true", help="read --source files as fast as possible, not at their frame rate"
    )
    p.add_argument(
        "--every-frame", action="store_true", help="--source streams: detect every frame, drop none"
    )
    p.add_argument(
        "--track", action="store_true", help="--source streams: give every detection a track_id (ByteTrack)"
    )
    p.add_argument(
        "--tiles",
        metavar="COLSxROWS",
        help="--source streams: detect overlapping crops of each frame too, e.g. 3x2 (small objects; "
        "docs/serve.md)",
    )
    p.add_argument(
        "--tile-overlap",
        type=float,
        default=None,
        metavar="F",
        help="--tiles: neighbouring crops share this fraction of a crop "
        f"(0-0.5, default {TileSpec.overlap:g})",
    )
    p.add_argument(
        "--tiles-no-full", action="store_true", help="--tiles: leave out the whole frame (crops only)"
    )
    p.add_argument(
        "--motion",
        action="store_true",
        help="--source streams: detect only where something moved (the motion gate; docs/serve.md)",
    )
    p.add_argument(
        "--detect-fps",
        type=float,
        default=None,
        metavar="N",
        help="--motion: at most N detections a second while there is motion (default 0: every frame)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("DFINE_API_KEY"),
        help="require this X-API-Key (default: $DFINE_API_KEY)",
    )
    p.add_argument(
        "--max-streams",
        type=int,
        default=16,
        help="at most this many streams (raised to the number given at start)",
    )
    p.add_argument("--max-upload-mb", type=float, default=10.0)
    p.add_argument("--max-batch", type=int, default=8, help="frames per Detector.predict call at most")
    p.add_argument(
        "--max-pending-uploads", type=int, default=32, help="/v1/detect images waiting at most; more get 503"
    )
    p.add_argument("--allow-devices", action="store_true", help="let API clients open local cameras")
    p.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="also accept this Host name (repeatable; * any): besides IP addresses, localhost, this "
        "machine's name and --host, e.g. the name a proxy serves this under",
    )
    p.add_argument(
        "--allowed-origin",
        action="append",
        default=[],
        metavar="URL",
        help="also accept requests and WebSockets from pages of this origin, scheme://host[:port] "
        "(repeatable; * any); the server's own origin is always accepted",
    )
    p.add_argument(
        "--record",
        type=user_path,
        metavar="DIR",
        help="record every stream's annotated video as segments DIR/STREAM/STREAM-<UTC start>.mp4; "
        "never replaces a file, keeps everything unless a retention limit is given",
    )
    p.add_argument(
        "--record-segment",
        type=float,
        default=60.0,
        metavar="S",
        help="finish a segment after S seconds of video or of wall-clock time (default 60); "
        "a crash loses at most the segment being written",
    )
    p.add_argument(
        "--record-max-age",
        type=float,
        metavar="HOURS",
        help="retention: delete finished segments older than HOURS (default: keep)",
    )
    p.add_argument(
        "--record-max-size",
        type=float,
        metavar="GB",
        help="retention: delete the oldest finished segments while DIR holds more than GB (default: keep)",
    )
    p.add_argument(
        "--output-json",
        type=user_path,
        metavar="FILE",
        help="append every stream result to FILE (JSON Lines)",
    )
    p.add_argument(
        "--raw-detections",
        action="store_true",
        help="add raw_detections to every result: the model's top-K (query, class) pairs as they came, "
        "where one box can carry several labels (detections, counts and tracks keep one label per object)",
    )
    p.add_argument(
        "--duration",
        type=float,
        metavar="S",
        help="exit after S seconds (or when every file source has ended)",
    )
    events = p.add_argument_group("events and the message bus (docs/serving-fleet.md)")
    events.add_argument(
        "--events",
        type=user_path,
        metavar="DIR",
        help="keep every event (line crossed, zone entered or left) and its snapshot in DIR/STREAM/; "
        "GET /v1/events lists them. The oldest go once DIR holds --events-max-size",
    )
    events.add_argument(
        "--events-max-age", type=float, metavar="HOURS", help="retention: delete older events"
    )
    events.add_argument(
        "--events-max-size",
        type=float,
        default=DEFAULT_EVENTS_MAX_GB,
        metavar="GB",
        help=f"retention: delete the oldest while DIR holds more (default {DEFAULT_EVENTS_MAX_GB:g})",
    )
    events.add_argument(
        "--mqtt", metavar="URL", help="publish events to this MQTT broker, mqtt://[user:password@]host[:port]"
    )
    events.add_argument(
        "--mqtt-prefix", default="dfine", help="first level of every MQTT topic (default dfine)"
    )
    events.add_argument(
        "--redis",
        metavar="URL",
        help="add events to Redis Streams at redis://[user:password@]host[:port][/db]",
    )
    events.add_argument(
        "--redis-prefix", default="dfine", help="first part of every Redis key (default dfine)"
    )
    events.add_argument(
        "--redis-maxlen", type=int, default=100_000, help="entries kept per Redis stream key (MAXLEN ~)"
    )
    events.add_argument(
        "--bus-detections", action="store_true", help="publish every frame's result too, not only events"
    )
    events.add_argument(
        "--bus-buffer",
        type=int,
        default=10_000,
        metavar="N",
        help="messages held per bus while the broker is away; beyond N the oldest are dropped (counted)",
    )
    p.add_argument(
        "--shard",
        default="0/1",
        metavar="INDEX/COUNT",
        help="serve only the stream-list entries whose name hashes to INDEX of COUNT workers "
        "(sha1 of the name mod COUNT), e.g. 0/3, 1/3, 2/3 with one shared --streams file",
    )
    p.add_argument(
        "--stop-timeout",
        type=float,
        default=STOP_TIMEOUT_S,
        metavar="S",
        help="a stop (SIGTERM, SIGHUP, Ctrl-C, --duration) not over after S seconds is logged with the "
        f"threads it still waits for and exits non-zero (default {STOP_TIMEOUT_S:g}: within "
        "Kubernetes' 30 s grace)",
    )
    p.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    return p


def _settings(args: argparse.Namespace) -> ServeSettings:
    # needs the serve extra: checked by main first
    from dfine_deploy.serve.events import check_events_folder
    from dfine_deploy.serve.outputs import check_results_file

    specs = load_streams_file(args.streams) if args.streams else []
    taken = {spec.name for spec in specs}
    tiles, detect = source_regions(args)
    for url in args.source:
        name = _name_for(url, taken)
        taken.add(name)
        specs.append(
            StreamSpec(
                url=url,
                name=name,
                loop=args.loop,
                realtime=not args.fast,
                every_frame=args.every_frame,
                track=args.track,
                tiles=tiles,
                detect=detect,
            )
        )
    check_bind_address(args.host)
    # checked as given: the settings hold it raised to the streams at start, which hid a -1 as 0
    AT_LEAST_1.check(args.max_streams, "--max-streams", ServeError)
    shard = parse_shard(args.shard)
    specs = shard_streams(specs, shard)
    settings = ServeSettings(
        model=args.model,
        names=args.names,
        backend=args.backend,
        precision=args.precision,
        unverified=args.unverified,
        threads=args.threads,
        device=args.device,
        score_threshold=args.score_threshold,
        class_thresholds=parse_class_thresholds(args.class_threshold),
        host=args.host,
        port=args.port,
        api_key=args.api_key or None,
        max_streams=max(args.max_streams, len(specs)),
        max_upload_mb=args.max_upload_mb,
        max_batch=args.max_batch,
        max_pending_uploads=args.max_pending_uploads,
        allow_devices=args.allow_devices,
        allowed_hosts=args.allowed_host,
        allowed_origins=args.allowed_origin,
        record_dir=args.record,
        record_segment_s=args.record_segment,
        record_max_age_h=args.record_max_age,
        record_max_gb=args.record_max_size,
        output_json=args.output_json,
        raw_detections=args.raw_detections,
        events_dir=args.events,
        events_max_age_h=args.events_max_age,
        events_max_gb=args.events_max_size,
        mqtt_url=args.mqtt,
        mqtt_prefix=args.mqtt_prefix,
        redis_url=args.redis,
        redis_prefix=args.redis_prefix,
        redis_maxlen=args.redis_maxlen,
        bus_detections=args.bus_detections,
        bus_buffer=args.bus_buffer,
        shard=shard,
        streams=specs,
    )
    if settings.output_json is not None:  # fail here, in one line, not inside the server's start-up
        check_results_file(settings.output_json)
    if settings.events_dir is not None:
        check_events_folder(settings.events_dir)
    if settings.record_dir is not None:  # streams added later through the API record there too
        check_writable_place(settings.record_dir, f"--record {settings.record_dir}", ServeError)
    for spec in specs:
        kind, target = classify_source(spec.url, trusted=True, allow_devices=True)
        if spec.name:
            recording_folder(
                settings.record_dir, spec.name, spec.record, str(target) if kind is SourceKind.FILE else None
            )
        probe_source(kind, target, spec)
    return settings


# options that shape another option's output, and the options they belong to: given alone they would
# be ignored without a word (dfine_deploy.cli.check_option_owners)
OPTION_OWNERS = {
    "--record-segment": ("--record",),
    "--record-max-age": ("--record",),
    "--record-max-size": ("--record",),
    "--events-max-age": ("--events",),
    "--events-max-size": ("--events",),
    "--mqtt-prefix": ("--mqtt",),
    "--redis-prefix": ("--redis",),
    "--redis-maxlen": ("--redis",),
    "--bus-detections": ("--mqtt", "--redis"),
    "--bus-buffer": ("--mqtt", "--redis"),
    "--shard": ("--streams",),
}

# the flags that set the --source streams, and each one's field in a --streams list
SOURCE_FLAGS = {
    "--tiles": "tiles:",
    "--motion": "detect:",
    "--loop": "loop: true",
    "--fast": "realtime: false",
    "--every-frame": "every_frame: true",
    "--track": "track: true",
}


def source_regions(args: argparse.Namespace) -> tuple[TileSpec | None, DetectSpec | None]:
    """The --source streams' `tiles` and `detect` from --tiles, --tile-overlap, --tiles-no-full,
    --motion and --detect-fps: the stream list's settings, checked the same way."""
    given = [flag for flag in SOURCE_FLAGS if getattr(args, option_dest(flag))]
    if given and not args.source:  # the flag would be ignored without a word
        raise ServeError(
            f"{given[0]} applies to --source streams; give a --source, or set it per stream in the "
            f"--streams list ({SOURCE_FLAGS[given[0]]}, docs/serve.md)"
        )
    if not args.tiles and (args.tile_overlap is not None or args.tiles_no_full):
        flag = "--tile-overlap" if args.tile_overlap is not None else "--tiles-no-full"
        raise ServeError(f"{flag} shapes the tiles of --tiles; add --tiles COLSxROWS (e.g. --tiles 3x2)")
    if args.detect_fps is not None and not args.motion:
        raise ServeError(f"--detect-fps {args.detect_fps:g} caps the motion gate's detections; add --motion")
    tiles = detect = None
    if args.tiles:
        overlap = TileSpec.overlap if args.tile_overlap is None else args.tile_overlap
        try:
            tiles = TileSpec.from_text(args.tiles, overlap, not args.tiles_no_full)
        except ValueError as exc:
            flag = "--tile-overlap" if str(exc).startswith("overlap") else "--tiles"
            raise ServeError(f"{flag}: {exc}") from None
    if args.motion:
        given_fps = {} if args.detect_fps is None else {"fps": args.detect_fps}
        try:
            detect = DetectSpec.from_mapping({"motion": True, **given_fps})
        except ValueError as exc:
            raise ServeError(f"--detect-fps: {exc}") from None
    return tiles, detect


def parse_class_thresholds(pairs: list[str]) -> dict[str, float]:
    """--class-threshold NAME=SCORE values as {name: score} (a name may hold '='; the last one splits).
    A class given twice is refused: which of two scores was meant is not ours to guess."""
    out: dict[str, float] = {}
    given: dict[str, str] = {}  # by name_key: the pair that named the class first
    for pair in pairs:
        name, sep, value = pair.rpartition("=")
        try:
            out[name] = float(value)
        except ValueError:
            sep = ""
        if not sep or not name:
            raise ServeError(f"--class-threshold {pair!r}: give NAME=SCORE, e.g. person=0.5")
        if name_key(name) in given:
            raise ServeError(
                f"--class-threshold {pair!r}: class {name!r} is already given ({given[name_key(name)]!r}); "
                "give each class once"
            )
        given[name_key(name)] = pair
    return out


def check_bind_address(host: str) -> None:
    """Refuse, before the model loads, a --host that names no address (a typo, a name no resolver
    knows): uvicorn would find out only when it binds, after the model has loaded."""
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ServeError(
            f"--host {host!r}: no address of that name ({reason}); give an IP address such as "
            "127.0.0.1 (this machine only) or 0.0.0.0 (every interface), or a name that resolves"
        ) from None


def _name_for(source: str, taken: set[str]) -> str:
    """A file source is named after its file (clip.mp4 -> 'clip', recorded in DIR/clip/).

    Other sources are named stream-N.
    """
    kind, target = classify_source(source, trusted=True, allow_devices=True)
    base = (
        re.sub(r"[^A-Za-z0-9_.-]", "-", Path(str(target)).stem).lstrip("-_.")[:60]
        if kind is SourceKind.FILE
        else ""
    )
    base = base or "stream"
    for suffix in itertools.count(1):
        name = base if (suffix == 1 and base != "stream") else f"{base}-{suffix}"
        if name not in taken:
            return name
    raise AssertionError("unreachable")


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def _stop_when_done(server, app, duration: float, failed: dict[str, str]) -> None:
    """Ask uvicorn to shut down after `duration`, or once every source has ended or failed. Streams that
    failed, or never delivered a frame, are left in `failed` with the reason."""
    start = time.monotonic()
    pipeline = None
    while not server.should_exit:
        time.sleep(0.1)
        pipeline = getattr(app.state, "pipeline", None)
        if time.monotonic() - start >= duration:
            log.info("--duration %.1f s reached, shutting down", duration)
            break
        if pipeline is not None and pipeline.all_finished():
            log.info("every file source has ended or failed, shutting down")
            break
    for handle in pipeline.list() if pipeline is not None else []:
        if handle.reader.state is StreamState.FAILED:
            failed[handle.name] = handle.reader.last_error or "failed"
        elif handle.frames_processed == 0:
            failed[handle.name] = (
                f"no frame in {duration:g} s ({handle.reader.last_error or 'nothing received'})"
            )
    server.should_exit = True


@friendly_errors
def command(argv: Sequence[str] | None = None) -> int:
    """The `dfine-serve` command (pyproject.toml): `main`, and the process's exit that follows is
    part of the stop, which the deadline (`--stop-timeout`) covers too."""
    return _serve(argv, exit_follows=True)


@friendly_errors
def main(argv: Sequence[str] | None = None) -> int:
    """dfine-serve called in-process: the stop deadline's watch ends when it returns, so it cannot
    end the caller later."""
    return _serve(argv, exit_follows=False)


def _serve(argv: Sequence[str] | None, exit_follows: bool) -> int:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    configure_logging(args.log_level, server=True)
    require_serve_extra()
    import uvicorn

    from dfine_deploy.serve.app import create_app, load_detector
    from dfine_deploy.serve.auth import install_redaction
    from dfine_deploy.serve.server import Server

    if args.duration is not None:  # before the model loads
        POSITIVE.check(args.duration, "--duration (seconds)", ServeError)
    POSITIVE.check(args.stop_timeout, "--stop-timeout (seconds)", ServeError)
    settings = _settings(args)  # each value checked first, then what it belongs to
    check_option_owners(parser, argv, OPTION_OWNERS, ServeError)
    if not _is_loopback(settings.host) and not settings.api_key:
        log.warning(
            "binding %s without an API key: anyone who can reach this port can use the server", settings.host
        )
    detector = load_detector(settings)  # here, not in the lifespan, so a bad model path is a one-line error
    app = create_app(settings, detector=detector)
    # Server ends the live clients when a shutdown starts; the grace limit still bounds a client that
    # does not read its end (without it uvicorn would wait for it forever).
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=args.log_level,
        timeout_graceful_shutdown=GRACE_S,
    )  # configures uvicorn's loggers, so the redaction goes on after it
    install_redaction(settings.api_key)
    server = Server(config, stop_deadline_s=args.stop_timeout)
    failed: dict[str, str] = {}
    if args.duration is not None:
        threading.Thread(
            target=_stop_when_done, args=(server, app, args.duration, failed), daemon=True
        ).start()
    with contextlib.suppress(SystemExit):  # uvicorn exits (status 3) when it cannot bind: said below
        try:
            server.run()
        finally:
            if not exit_follows:
                server.stop_over()
    if not server.started:
        raise ServeError(
            f"the server did not start on {settings.host}:{settings.port}; "
            "the log above says why (port in use?)"
        )
    if failed:
        name, reason = next(iter(failed.items()))
        raise ServeError(f"{len(failed)} stream(s) failed, e.g. {name!r}: {reason}")
    for path in (settings.output_json, settings.record_dir):
        if path is not None and path.exists():
            print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(command())
