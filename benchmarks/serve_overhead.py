"""What the stream server costs: frames/s through dfine-serve's pipeline vs raw Detector.predict,
with and without tracking and counting, and the tracker's own time per frame at 50 objects.

    python benchmarks/serve_overhead.py MODEL [--backend onnxruntime] [--streams 4] [--seconds 10]

The sides run the same Detector on the same frames at saturation (file sources looped as fast as
they decode, so the detector never waits for a camera), interleaved within each repeat:
  raw      Detector.predict on batches of --streams pre-decoded frames, back to back
  served   the StreamPipeline of dfine-serve (reader threads decoding the video, batching, output thread
           building JSON results) with --streams looped file sources
  tracked  the same with tracking on and one counting line and one zone per stream
Goal: tracked / raw >= 0.9. Decoding is part of serving and competes for the same CPU cores as the
model on a CPU backend, so on few cores expect it to show; on a GPU backend it overlaps with
inference. Each side is measured --repeats times after a warm-up; min/median/max are printed.
Tracker: StreamTracker.update (ByteTrack + one line + one zone) on 50 synthetic moving boxes per frame,
median ms over --tracker-frames frames (goal <= 2 ms).
Loopback only, bounded in time: (warm-up + seconds) x repeats x 3, plus a few seconds.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import cv2
import numpy as np

from dfine_deploy.runtime import Detector
from dfine_deploy.serve.metrics import ServeMetrics
from dfine_deploy.serve.pipeline import StreamPipeline
from dfine_deploy.serve.settings import CountingLine, CountingZone, ServeSettings, StreamSpec


def make_video(path: Path, frames: int, width: int, height: int) -> list[np.ndarray]:
    """A synthetic street-like clip (moving rectangles on noise); returns the frames as decoded back."""
    rng = np.random.default_rng(0)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 25, (width, height))
    background = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    for i in range(frames):
        image = background.copy()
        for k in range(5):
            x = (i * (k + 2) * 3 + k * 97) % (width - 80)
            cv2.rectangle(image, (x, 40 + 60 * k), (x + 70, 90 + 60 * k), (40 * k, 255 - 40 * k, 128), -1)
        writer.write(image)
    writer.release()
    capture = cv2.VideoCapture(str(path))
    decoded = []
    while True:
        ok, image = capture.read()
        if not ok:
            break
        decoded.append(image)
    capture.release()
    return decoded


def raw_throughput(
    detector: Detector, frames: list[np.ndarray], batch: int, warmup: float, seconds: float
) -> float:
    def run(duration: float) -> int:
        done, i, end = 0, 0, time.perf_counter() + duration
        while time.perf_counter() < end:
            chunk = [frames[(i + k) % len(frames)] for k in range(batch)]
            detector.predict(chunk)
            done += batch
            i += batch
        return done

    run(warmup)
    start = time.perf_counter()
    done = run(seconds)
    return done / (time.perf_counter() - start)


def _next_batch(pipeline: StreamPipeline, timeout: float = 600) -> float:
    """Wait until the inference thread finishes a batch; returns that moment."""
    seen, deadline = pipeline.batches, time.perf_counter() + timeout
    while pipeline.batches == seen:
        if time.perf_counter() > deadline:
            raise SystemExit("the pipeline finished no batch in 10 minutes")
        time.sleep(0.0005)
    return time.perf_counter()


def _counting(width: int, height: int) -> dict:
    """Tracking on, a line across the middle and a zone over the left half."""
    return {
        "track": True,
        "lines": [CountingLine("middle", (width / 2, 0), (width / 2, height))],
        "zones": [CountingZone("left", [(0, 0), (width / 2, 0), (width / 2, height - 1), (0, height - 1)])],
    }


def served_throughput(
    detector: Detector, video: Path, streams: int, batch: int, warmup: float, seconds: float, counting: dict
) -> tuple[float, dict[str, float]]:
    """Stream frames/s through the pipeline, counted between two batch completions (whole batches)."""
    settings = ServeSettings(max_batch=batch, max_streams=streams)
    pipeline = StreamPipeline(detector, settings, ServeMetrics())
    pipeline.start()
    try:
        for i in range(streams):
            spec = StreamSpec(url=str(video), name=f"s{i}", loop=True, realtime=False, **counting)
            pipeline.add_stream(spec, trusted=True)
        time.sleep(warmup)
        start = _next_batch(pipeline)
        frames0, batches0 = pipeline.frames_detected, pipeline.batches
        time.sleep(seconds)
        end = _next_batch(pipeline)
        frames, batches = pipeline.frames_detected - frames0, pipeline.batches - batches0
        handles = pipeline.list()
        extra = {
            "mean_batch": frames / max(batches, 1),
            "published": float(sum(h.frames_processed for h in handles)),
            "dropped_stale": float(sum(h.reader.frames_dropped for h in handles)),
        }
    finally:
        pipeline.close()
    return frames / (end - start), extra


def tracker_ms(objects: int, frames: int) -> float:
    """Median ms of one StreamTracker.update with `objects` boxes moving on straight lines."""
    from dfine_deploy.serve.tracking import StreamTracker

    rng = np.random.default_rng(0)
    start = rng.uniform(0, 1800, (objects, 2))  # [N, 2] top-left px in a 1920x1080-ish frame
    velocity = rng.uniform(-4, 4, (objects, 2))  # px per frame
    tracker = StreamTracker(StreamSpec(url="rtsp://bench/x", **_counting(1920, 1080)))
    names = ["person"] * objects
    times = []
    for i in range(frames):
        corner = start + velocity * i
        det = SimpleNamespace(
            boxes=np.concatenate([corner, corner + 40], axis=1).astype(np.float32),  # [N, 4] xyxy
            scores=np.full(objects, 0.9, np.float32),
            labels=np.zeros(objects, np.int64),
            names=names,
        )
        t0 = time.perf_counter()
        tracker.update(det, i / 30)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def spread(values: list[float]) -> str:
    return f"min {min(values):7.1f}  median {statistics.median(values):7.1f}  max {max(values):7.1f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="artifact folder or .onnx/.engine file")
    p.add_argument("--backend", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--streams", type=int, default=4, help="streams served, and the raw batch size")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--warmup", type=float, default=3.0)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--tracker-frames", type=int, default=300, help="frames for the 50-object tracker timing")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)

    detector = Detector.open(args.model, backend=args.backend, device=args.device, score_threshold=0.25)
    batch = min(args.streams, detector.max_batch)
    counting = _counting(args.width, args.height)
    with tempfile.TemporaryDirectory() as tmp:
        video = Path(tmp) / "bench.mp4"
        frames = make_video(video, 100, args.width, args.height)
        raw, served, tracked, extras = [], [], [], []
        for _ in range(args.repeats):  # interleaved, so that machine noise hits every side alike
            raw.append(raw_throughput(detector, frames, batch, args.warmup, args.seconds))
            fps, extra = served_throughput(
                detector, video, args.streams, batch, args.warmup, args.seconds, {}
            )
            served.append(fps)
            extras.append(extra)
            fps, _ = served_throughput(
                detector, video, args.streams, batch, args.warmup, args.seconds, counting
            )
            tracked.append(fps)
    tracker = tracker_ms(50, args.tracker_frames)
    overhead = 1 - statistics.median(served) / statistics.median(raw)
    ratio = statistics.median(tracked) / statistics.median(raw)
    print(f"model {args.model}  backend {detector.backend_name} ({detector.provider})  "
          f"{args.streams} streams of {args.width}x{args.height}, batch <= {batch}")  # fmt: skip
    print(f"raw Detector.predict         frames/s  {spread(raw)}")
    print(f"served (pipeline)            frames/s  {spread(served)}")
    print(f"served, tracking + counting  frames/s  {spread(tracked)}")
    print(f"mean batch {statistics.median(e['mean_batch'] for e in extras):.2f}  "
          f"results published per run {statistics.median(e['published'] for e in extras):.0f}  "
          "stale frames dropped per run "
          f"{statistics.median(e['dropped_stale'] for e in extras):.0f}")  # fmt: skip
    print(f"overhead of serving (median) {overhead * 100:.1f} %")
    print(f"tracked / raw (median) {ratio:.3f}  (goal >= 0.9)")
    print(f"tracker + 1 line + 1 zone at 50 objects: {tracker:.2f} ms/frame median  (goal <= 2 ms)")
    if args.json:
        figures = {
            "raw_fps": raw,
            "served_fps": served,
            "tracked_fps": tracked,
            "extras": extras,
            "overhead": overhead,
            "tracked_over_raw": ratio,
            "tracker_ms_50_objects": tracker,
        }
        args.json.write_text(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
