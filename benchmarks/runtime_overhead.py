"""What the runtime adds around the network: preprocessing, decoding, and predict vs the bare call.

    .venv/bin/python benchmarks/runtime_overhead.py                        # pre/post only
    .venv/bin/python benchmarks/runtime_overhead.py --model runs/export/dfine-n --backend onnxruntime

Prints min/median/max over repeated rounds after warm-up, never one number. Preprocessing is
compared with the per-frame path many tools take (cvtColor, resize, transpose, divide per frame)
to show what the single vectorised pass saves, and the runtime's antialiased resize with PIL's
BILINEAR (torchvision's pixels to rounding), timed in turn in the same rounds. Target: the runtime's
resize at least RESIZE_TARGET times faster than PIL's at 1920x1080 -> 640x640 (it was PIL's until
2026-12-04, and then 90 % of preprocessing).
"""

from __future__ import annotations

import argparse
import time
from functools import partial

import cv2
import numpy as np
from PIL import Image

from dfine_deploy.images import resize_as_trained
from dfine_deploy.runtime import Detector
from dfine_deploy.runtime.adapters import DFineAdapter
from dfine_deploy.runtime.preprocess import resize_batch

RESIZE_TARGET = 2.0


def timed(call, warmup: int, runs: int) -> tuple[float, float, float]:
    for _ in range(warmup):
        call()
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        samples.append((time.perf_counter() - start) * 1000)
    return min(samples), float(np.median(samples)), max(samples)


def per_frame_preprocess(frames, size):
    """The common per-frame path, for comparison."""
    out = []
    for frame in frames:
        rgb = cv2.cvtColor(frame, cv2.COLOR_BGR2RGB)
        resized = cv2.resize(rgb, (size[1], size[0]))
        out.append(resized.transpose(2, 0, 1).astype(np.float32) / 255.0)
    return np.stack(out)


def side_by_side(calls: dict, rounds: int) -> dict[str, float]:
    """The fastest of `rounds` calls of each, the calls taken in turn so that load hits all alike."""
    best = {name: float("inf") for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            best[name] = min(best[name], (time.perf_counter() - start) * 1000)
    return best


def line(name: str, figures: tuple[float, float, float], batch: int) -> str:
    low, mid, high = figures
    return f"{name:<34} {low:8.2f} {mid:8.2f} {high:8.2f}   {mid / batch:7.2f} ms/frame"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default=None, help="artifact folder / .onnx / .engine (optional)")
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--frame", nargs=2, type=int, default=[1920, 1080], metavar=("W", "H"))
    parser.add_argument("--batch", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    width, height = args.frame
    frames = [rng.integers(0, 256, (height, width, 3), dtype=np.uint8) for _ in range(max(args.batch))]
    size = (args.imgsz, args.imgsz)
    detector = Detector.open(args.model, backend=args.backend) if args.model else None
    if detector is not None:
        size = detector.input_size
        print(f"model: {detector.source} on {detector.backend_name} ({detector.provider})")
    print(
        f"frames {width}x{height} BGR -> network {size[0]}x{size[1]}; {args.warmup} warm-up, {args.runs} runs"
    )
    print(f"{'step':<34} {'min':>8} {'median':>8} {'max':>8}   (ms per call)")
    size_wh = (size[1], size[0])
    best = side_by_side(
        {
            "resize_as_trained": partial(resize_as_trained, frames[0], size_wh),
            "PIL BILINEAR": lambda: np.asarray(Image.fromarray(frames[0]).resize(size_wh, Image.BILINEAR)),
        },
        args.runs,
    )
    ratio = best["PIL BILINEAR"] / best["resize_as_trained"]
    print(
        f"resize one frame (min of {args.runs}, in turn): runtime {best['resize_as_trained']:.2f} ms, "
        f"PIL {best['PIL BILINEAR']:.2f} ms: {ratio:.1f}x (target >= {RESIZE_TARGET:.0f}x at 1920x1080)"
    )
    adapter = DFineAdapter([f"c{i}" for i in range(80)])
    queries = 300
    for batch in args.batch:
        chunk = frames[:batch]
        print(f"-- batch {batch}")
        print(
            line(
                "preprocess, one vectorised pass",
                timed(partial(resize_batch, chunk, size), args.warmup, args.runs),
                batch,
            )
        )
        print(
            line(
                "preprocess, per-frame reference",
                timed(partial(per_frame_preprocess, chunk, size), args.warmup, args.runs),
                batch,
            )
        )
        outputs = {
            "labels": rng.integers(0, 80, (batch, queries)).astype(np.int64),
            "boxes": rng.uniform(0, 640, (batch, queries, 4)).astype(np.float32),
            "scores": rng.uniform(0, 1, (batch, queries)).astype(np.float32),
        }
        print(
            line(
                "decode (threshold 0.3, names)",
                timed(partial(adapter.decode, outputs, None, 0.3), args.warmup, args.runs),
                batch,
            )
        )
        if detector is not None and batch <= detector.max_batch:
            feeds, _ = detector.prepare(chunk)
            bare = timed(partial(detector.backend.run, feeds), args.warmup, args.runs)
            full = timed(partial(detector.predict, chunk), args.warmup, args.runs)
            print(line("backend.run (engine only)", bare, batch))
            print(line("Detector.predict (image->det)", full, batch))
            print(
                f"{'runtime overhead (median)':<34} {full[1] - bare[1]:8.2f} ms = "
                f"{100 * (full[1] - bare[1]) / full[1]:.1f} % of predict"
            )


if __name__ == "__main__":
    main()
