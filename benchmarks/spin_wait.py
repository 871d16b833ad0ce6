"""CPU time of a camera-rate stream on onnxruntime with its thread pools spinning (onnxruntime's default,
what dfine-bench keeps) and sleeping between runs (what dfine-serve opens: `spin_wait=False`).

    python benchmarks/spin_wait.py MODEL [--fps 10] [--seconds 20] [--rounds 2]

One frame every 1/fps seconds goes through `Detector.predict` on the CPU, as a stream's frames reach
the server; the process's CPU time (user + system, every thread) over the window is reported as the
share of one core, beside the share the inference itself needs (its wall time per frame x fps). The
two settings alternate for `--rounds`, so that a load change on the machine hits both alike.
"""

from __future__ import annotations

import argparse
import resource
import sys
import time

import numpy as np

from dfine_deploy.runtime import Detector


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def one_stream(detector: Detector, fps: float, seconds: float) -> tuple[float, float]:
    """(share of a core the process used, share of the time inference ran) over `seconds`."""
    frame = np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8)
    detector.predict([frame])  # warm
    cpu0, start, busy, frames = cpu_seconds(), time.monotonic(), 0.0, 0
    while time.monotonic() - start < seconds:
        t0 = time.perf_counter()
        detector.predict([frame])
        busy += time.perf_counter() - t0
        frames += 1
        time.sleep(max(0.0, start + frames / fps - time.monotonic()))
    wall = time.monotonic() - start
    return (cpu_seconds() - cpu0) / wall, busy / wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="artifact folder or .onnx file")
    p.add_argument("--fps", type=float, default=10.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args(argv)
    detectors = {
        spin: Detector.open(
            args.model, backend="onnxruntime", device="cpu", threads=args.threads, spin_wait=spin
        )
        for spin in (True, False)
    }
    results: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for spin, detector in detectors.items():
            results[spin].append(one_stream(detector, args.fps, args.seconds))
    for spin, runs in results.items():
        cores = [100 * c for c, _ in runs]
        busy = [100 * b for _, b in runs]
        label = "on " if spin else "off"
        print(f"spinning {label}: CPU {' / '.join(f'{c:.0f}' for c in cores)} % of a core; "
              f"inference runs {' / '.join(f'{b:.0f}' for b in busy)} % of the time "
              f"({args.fps:g} fps, {args.seconds:g} s per round)")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
