"""`dfine-bench --streams`: how many cameras of a given resolution and frame rate this box serves.

Each trial runs the server's own pipeline (`serve.pipeline.StreamPipeline`, no HTTP) on K copies of a
generated H.264 file (the demo video of `data/moving.py` at the camera's size and rate, looped and read
at its frame rate, as a camera delivers), with tracking on, so the decoder, the batching inference and
the tracker all do the work they do when serving. K streams are sustained when the frames served in
the measured window are at least `SUSTAINED` of the frames the cameras produced (served/raw, where
the one frame per camera that may be on its way between decoder and output when the window closes
counts as served: `Trial.served_ratio`, the figure the table shows and the verdict reads): the
server shows every camera live instead of skipping frames. K doubles until a trial fails, then a
bisection finds the largest K that holds.

`--motion` plays a scene that is empty 80 % of the time instead (`moving.idle_objects`: three objects
cross the frame in the middle fifth of each loop) and finds the capacity twice: every frame detected,
and with the motion gate (`detect: {motion: true}`, dfine_deploy/serve/regions.py). Each trial also
counts the crossings of the scene's middle line, so the gate's saving is shown beside what it counts.
"""

from __future__ import annotations

import argparse
import logging
import resource
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dfine_deploy.bench.hardware import Hardware, measured_on_line
from dfine_deploy.bench.report import render_table, write_json
from dfine_deploy.bench.runner import model_key
from dfine_deploy.bench.tables import Profile, expected_for
from dfine_deploy.data.moving import DemoVideo, idle_objects
from dfine_deploy.errors import BenchError, DatasetError
from dfine_deploy.model.reference import classify_model_ref
from dfine_deploy.serve import require_serve_extra

if TYPE_CHECKING:
    from dfine_deploy.runtime.detector import Detector

log = logging.getLogger(__name__)

SUSTAINED = 0.95  # served/raw a sustained load must reach (the share of camera frames that are served)
SUSTAINED_RULE = f"served/raw >= {SUSTAINED:g}"  # what every report says of its verdicts
RATIO_DIGITS = 3  # served/raw as the table prints it, and as the verdict reads it
SETTLE_S = 1.0  # seconds each trial runs before its window opens (readers connect, queues fill)


@dataclass
class Trial:
    streams: int
    seconds: float  # the measured window
    raw_frames: float  # what the cameras produced in it: streams x fps x seconds
    served_frames: int
    cpu_seconds: float  # this process's CPU time in the window (decode, inference, tracking)
    crossings: int = 0  # line crossings counted over the whole trial, all streams together
    inferred_frames: int = 0  # frames that reached the detector over the whole trial

    @property
    def served_ratio(self) -> float:
        """Served/raw to RATIO_DIGITS, the one frame per camera still on its way to the output when
        the window closes counted as served (at 1 fps over 8 s that frame alone is 12 %)."""
        if not self.raw_frames:
            return 0.0
        return round((self.served_frames + self.streams) / self.raw_frames, RATIO_DIGITS)

    @property
    def ratio_text(self) -> str:
        return f"{self.served_ratio:.{RATIO_DIGITS}f}"

    @property
    def sustained(self) -> bool:
        """The verdict reads the very figure the table shows, against the one threshold."""
        return self.served_ratio >= SUSTAINED

    @property
    def cpu_per_frame_ms(self) -> float:
        return 1000 * self.cpu_seconds / max(1, self.served_frames)

    def to_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "served_ratio": self.served_ratio,
            "sustained": self.sustained,
            "cpu_per_frame_ms": round(self.cpu_per_frame_ms, 2),
        }


def camera_video(width: int, height: int, fps: int, idle: bool = False) -> DemoVideo:
    """The camera stand-in: 10 s of the demo video at the camera's size and rate (`idle`: the scene
    empty 80 % of the time); a size H.264 4:2:0 cannot hold is refused naming --frame-size, before
    any model loads."""
    objects = idle_objects(10 * fps) if idle else ()
    try:
        return DemoVideo(width=width, height=height, fps=fps, frames=10 * fps, objects=objects)
    except DatasetError as exc:
        raise BenchError(f"--streams --frame-size {width} {height}: {exc}") from None


def camera_file(folder: Path, width: int, height: int, fps: int, idle: bool = False) -> Path:
    """`camera_video` written once as H.264 (PyAV) in `folder`."""
    path = folder / f"camera-{width}x{height}-{fps}fps{'-idle' if idle else ''}.mp4"
    if not path.is_file():
        camera_video(width, height, fps, idle).write(path, codec="h264")
    return path


def run_trial(
    detector: Any,
    video: Path,
    streams: int,
    fps: int,
    seconds: float,
    max_batch: int,
    detect: dict[str, Any] | None = None,
    line: dict[str, Any] | None = None,
) -> Trial:
    """Serve `streams` looped copies of `video` for SETTLE_S + `seconds`; count the window's frames.
    `detect`: each stream's `detect:` (the motion gate); `line`: a counting line on each."""
    from dfine_deploy.serve.pipeline import StreamPipeline
    from dfine_deploy.serve.settings import ServeSettings, StreamSpec

    settings = ServeSettings(max_streams=streams, max_batch=max_batch)
    pipeline = StreamPipeline(detector, settings)
    pipeline.start()
    crossings = 0
    try:
        for i in range(streams):
            spec = StreamSpec(
                url=str(video),
                name=f"camera-{i}",
                loop=True,
                realtime=True,
                track=True,
                lines=[line] if line else [],
                detect=detect,
            )
            pipeline.add_stream(spec, trusted=True)
        time.sleep(SETTLE_S)
        served_before = sum(h.frames_processed for h in pipeline.list())
        cpu_before, start = _cpu_seconds(), time.monotonic()
        time.sleep(seconds)
        served = sum(h.frames_processed for h in pipeline.list()) - served_before
        window, cpu = time.monotonic() - start, _cpu_seconds() - cpu_before
        crossings = sum(
            sum(sum(c.values()) for by_dir in h.tracker.counts()["lines"].values() for c in by_dir.values())
            for h in pipeline.list()
            if h.tracker is not None
        )
    finally:
        pipeline.close()
    return Trial(
        streams, round(window, 3), round(streams * fps * window, 1), served, round(cpu, 3), crossings,
        pipeline.frames_detected,
    )  # fmt: skip


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def find_capacity(trial: Callable[[int], Trial], max_streams: int) -> tuple[int, list[Trial]]:
    """The largest stream count whose trial is sustained (0: not even one), and every trial run:
    doubling from 1 until one fails or `max_streams` holds, then bisection below the failure."""
    trials: list[Trial] = []

    def holds(k: int) -> bool:
        result = trial(k)
        trials.append(result)
        log.info(
            "%d stream(s): served/raw %.3f, %.1f ms CPU per frame",
            k,
            result.served_ratio,
            result.cpu_per_frame_ms,
        )
        return result.sustained

    good, bad = 0, None
    k = 1
    while k <= max_streams:
        if not holds(k):
            bad = k
            break
        good = k
        if k == max_streams:
            break
        k = min(2 * k, max_streams)
    if bad is not None:
        while bad - good > 1:
            middle = (good + bad) // 2
            if holds(middle):
                good = middle
            else:
                bad = middle
    return good, trials


def open_as_served(args: argparse.Namespace, profile: Profile, option: str) -> Detector:
    """The one --model of `--streams` or `--tiles`, on its one --backend, opened as dfine-serve opens it."""
    if len(args.model) != 1 or len(args.backend) != 1 or len(args.precision) != 1:
        raise BenchError(
            f"{option} measures one --model on one --backend at one --precision; give one of each"
        )
    if classify_model_ref(args.model[0]).runs_on_torch:
        raise BenchError(
            f"{option} --model {args.model[0]}: give what dfine-serve runs, an artifact folder or "
            ".onnx/.engine"
        )
    require_serve_extra()
    from dfine_deploy.serve.app import load_detector
    from dfine_deploy.serve.settings import ServeSettings

    settings = ServeSettings(
        model=args.model[0],
        backend=args.backend[0],
        precision=args.precision[0],
        threads=args.threads,
        names=args.names,
        max_batch=args.max_batch,
        device="cpu" if profile.kind == "cpu" else "auto",
    )
    return load_detector(settings)


def served_report(
    args: argparse.Namespace,
    hardware: Hardware,
    profile: Profile,
    detector: Detector,
    lines: list[str],
    document: dict[str, Any],
) -> int:
    """Print the report of a model opened by `open_as_served` under the lines that say where it was
    measured and, with --json, write what it measured (`document`) with the facts every such report
    holds (`--streams`, `--streams --motion`, `--tiles`)."""
    lines = [
        measured_on_line(profile, hardware, detector.backend.device),
        f"load average at start {hardware.load_average[0]} on {hardware.cpu_count} CPUs",
        *lines,
    ]
    print("\n".join(lines))
    if args.json:
        facts = {"backend": detector.backend_name, "lines": lines, "hardware": hardware.to_dict()}
        write_json(Path(args.json), {**document, **facts, "profile": profile.key})
    return 0


def _camera(args: argparse.Namespace, **more: Any) -> dict[str, Any]:
    """The camera a --streams report ran: size, rate and codec (`more`: what a mode adds)."""
    (width, height), fps = args.frame_size, args.fps
    return {"width": width, "height": height, "fps": fps, "codec": "h264", **more}


def run_streams_bench(args: argparse.Namespace, hardware: Hardware, profile: Profile) -> int:
    """`dfine-bench --streams`: one --model on one --backend, opened as dfine-serve opens it."""
    (width, height), fps = args.frame_size, args.fps
    camera_video(width, height, fps)
    detector = open_as_served(args, profile, "--streams")
    args.work_dir.mkdir(parents=True, exist_ok=True)
    video = camera_file(args.work_dir, width, height, fps, idle=args.motion)
    line = camera_video(width, height, fps).line if args.motion else None
    modes = [("every frame", None), ("motion gate", {"motion": True})] if args.motion else [("", None)]
    results: dict[str, tuple[int, list[Trial]]] = {}
    try:
        for mode, detect in modes:
            results[mode] = find_capacity(
                lambda k, d=detect: run_trial(
                    detector, video, k, fps, args.stream_seconds, args.max_batch, d, line
                ),
                args.max_streams,
            )
    finally:
        detector.close()
    if args.motion:
        return _report_motion(args, hardware, profile, detector, results)
    capacity, trials = results[""]
    key = model_key(args.model[0], detector)
    expected = expected_for(profile, key)
    camera = f"{width}x{height} at {fps} fps"
    header = ["Streams", "Served/raw", "CPU ms/frame", "Sustained"]
    rows = [
        [str(t.streams), t.ratio_text, f"{t.cpu_per_frame_ms:.1f}", "yes" if t.sustained else "no"]
        for t in sorted(trials, key=lambda t: t.streams)
    ]
    capped = capacity == args.max_streams
    answer = (
        f"this machine sustains {capacity}{'+' if capped else ''} stream(s) of {camera} with {key} on "
        f"{detector.backend_name} ({SUSTAINED_RULE}; H.264 decode + inference + tracking"
        + (f"; --max-streams {args.max_streams} reached" if capped else "")
        + ")"
    )
    if expected.fps:
        table = (
            f"the hardware table's figure ({expected.source}): {expected.fps:g} FPS for {key} = "
            f"{int(expected.fps // fps)} streams at {fps} fps (inference only, batch 1)"
        )
    else:
        table = f"the hardware table has no figure for {key} on {profile.label} ({expected.source})"
    document = {
        "streams_sustained": capacity,
        "camera": _camera(args),
        "model": key,
        "threshold": SUSTAINED,
        "trials": [t.to_dict() for t in trials],
        "expected": {"fps": expected.fps, "streams": int(expected.fps // fps) if expected.fps else None,
                     "source": expected.source},
    }  # fmt: skip
    lines = ["", render_table(header, rows), "", answer, table]
    return served_report(args, hardware, profile, detector, lines, document)


def _report_motion(
    args: argparse.Namespace,
    hardware: Hardware,
    profile: Profile,
    detector: Detector,
    results: dict[str, tuple[int, list[Trial]]],
) -> int:
    """`--streams --motion`: the capacity with every frame detected and with the motion gate, on the
    scene that is empty 80 % of the time."""
    (width, height), fps = args.frame_size, args.fps
    key = model_key(args.model[0], detector)
    header = ["Mode", "Streams", "Served/raw", "CPU ms/frame", "Detected frames", "Crossings", "Sustained"]
    rows = [
        [mode, str(t.streams), t.ratio_text, f"{t.cpu_per_frame_ms:.1f}", str(t.inferred_frames),
         str(t.crossings), "yes" if t.sustained else "no"]
        for mode, (_, trials) in results.items()
        for t in sorted(trials, key=lambda t: t.streams)
    ]  # fmt: skip
    single = {mode: next(t for t in trials if t.streams == 1) for mode, (_, trials) in results.items()}
    always, gated = single["every frame"], single["motion gate"]
    answers = [
        f"{mode}: this machine sustains {capacity}{'+' if capacity == args.max_streams else ''} stream(s) of "
        f"{width}x{height} at {fps} fps with {key} on {detector.backend_name}"
        for mode, (capacity, _) in results.items()
    ]
    share = gated.cpu_per_frame_ms / max(always.cpu_per_frame_ms, 1e-9)
    lines = [
        "scene: objects in view 20 % of the time (data/moving.py idle_objects), looped; "
        f"{SUSTAINED_RULE} is sustained",
        "",
        render_table(header, rows),
        "",
        *answers,
        f"one stream: the gate costs {gated.cpu_per_frame_ms:.1f} ms CPU per frame, {100 * share:.0f} % of "
        f"{always.cpu_per_frame_ms:.1f} ms with every frame detected; crossings counted {gated.crossings} "
        f"(every frame: {always.crossings})",
    ]
    document = {
        "modes": {mode: {"streams_sustained": c, "trials": [t.to_dict() for t in trials]}
                  for mode, (c, trials) in results.items()},
        "camera": _camera(args, idle_share=0.8),
        "model": key,
    }  # fmt: skip
    return served_report(args, hardware, profile, detector, lines, document)
