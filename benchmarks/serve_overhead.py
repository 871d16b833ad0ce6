"""What the stream server costs: frames/s through dfine-serve's pipeline vs raw Detector.predict.

    python benchmarks/serve_overhead.py MODEL [--backend onnxruntime] [--streams 4] [--seconds 10]

Both sides run the same Detector on the same frames at saturation (file sources looped as fast as
they decode, so the detector never waits for a camera):
  raw     Detector.predict on batches of --streams pre-decoded frames, back to back
  served  the StreamPipeline of dfine-serve (reader threads decoding the video, batching, output thread
          building JSON results) with --streams looped file sources
Overhead = 1 - served / raw. Decoding is part of serving and competes for the same CPU cores as the
model on a CPU backend, so on few cores expect it to show; on a GPU backend it overlaps with
inference. Each side is measured --repeats times after a warm-up; min/median/max are printed.
Loopback only, bounded in time: (warm-up + seconds) x repeats x 2.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from dfine_deploy.runtime import Detector
from dfine_deploy.serve.metrics import ServeMetrics
from dfine_deploy.serve.pipeline import StreamPipeline
from dfine_deploy.serve.settings import ServeSettings, StreamSpec


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


def raw_throughput(detector: Detector, frames: list[np.ndarray], batch: int, warmup: float, seconds: float) -> float:
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


def served_throughput(
    detector: Detector, video: Path, streams: int, batch: int, warmup: float, seconds: float
) -> tuple[float, dict[str, float]]:
    """Stream frames/s through the pipeline, counted between two batch completions (whole batches)."""
    settings = ServeSettings(max_batch=batch, max_streams=streams)
    pipeline = StreamPipeline(detector, settings, ServeMetrics())
    pipeline.start()
    try:
        for i in range(streams):
            pipeline.add_stream(StreamSpec(url=str(video), name=f"s{i}", loop=True, realtime=False), trusted=True)
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
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)

    detector = Detector.open(args.model, backend=args.backend, device=args.device, score_threshold=0.25)
    batch = min(args.streams, detector.max_batch)
    with tempfile.TemporaryDirectory() as tmp:
        video = Path(tmp) / "bench.mp4"
        frames = make_video(video, 100, args.width, args.height)
        raw, served, extras = [], [], []
        for _ in range(args.repeats):
            raw.append(raw_throughput(detector, frames, batch, args.warmup, args.seconds))
            fps, extra = served_throughput(detector, video, args.streams, batch, args.warmup, args.seconds)
            served.append(fps)
            extras.append(extra)
    overhead = 1 - statistics.median(served) / statistics.median(raw)
    print(f"model {args.model}  backend {detector.backend_name} ({detector.provider})  "
          f"{args.streams} streams of {args.width}x{args.height}, batch <= {batch}")  # fmt: skip
    print(f"raw Detector.predict   frames/s  {spread(raw)}")
    print(f"served (pipeline)      frames/s  {spread(served)}")
    print(f"mean batch {statistics.median(e['mean_batch'] for e in extras):.2f}  "
          f"results published per run {statistics.median(e['published'] for e in extras):.0f}  "
          f"stale frames dropped per run {statistics.median(e['dropped_stale'] for e in extras):.0f}")  # fmt: skip
    print(f"overhead (median) {overhead * 100:.1f} %  (goal < 10 %)")
    if args.json:
        args.json.write_text(
            json.dumps({"raw_fps": raw, "served_fps": served, "extras": extras, "overhead": overhead}, indent=2)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
