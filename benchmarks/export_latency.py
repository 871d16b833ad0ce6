"""ONNX Runtime CPU latency of the exported D-FINE graphs: gather sampler (default) vs grid sampler.

    python benchmarks/export_latency.py                   # dfine-n, 640x640, batch 1, 2 threads
    python benchmarks/export_latency.py --size s --runs 50 --fp16

Goal (issue 5): the default graph no slower than the official export (D-FINE-N about 58 ms median
on these machines), and the gather sampler within 5 % of GridSample. Both graphs come from the
same weights and are timed in alternation; warm-up runs are discarded; min / median / max are
printed.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np


def measure(
    paths: dict[str, Path], images: np.ndarray, sizes: np.ndarray, threads: int, warmup: int, runs: int
) -> dict[str, list[float]]:
    """Time the graphs in alternation, run by run, so load changes on a shared machine hit all alike."""
    from dfine_deploy.export.onnx import ort_session

    sessions = {name: ort_session(path, threads) for name, path in paths.items()}
    feeds = {"images": images, "orig_target_sizes": sizes}
    for session in sessions.values():
        for _ in range(warmup):
            session.run(None, feeds)
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds)
            times[name].append((time.perf_counter() - start) * 1000.0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", default="n", help="n, s, m, l or x")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--fp16", action="store_true", help="also time the typed FP16 graph (CPU: informative)"
    )
    args = parser.parse_args()

    import torch

    from dfine_deploy.export import fp16 as fp16_export
    from dfine_deploy.export import onnx as onnx_export
    from dfine_deploy.model.dfine import DeployModel
    from dfine_deploy.model.hub import load_model

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = load_model(f"dfine-{args.size}", imgsz=(args.imgsz, args.imgsz), sampler="gather")
    module = DeployModel(loaded.model, loaded.postprocessor).eval()
    rng = np.random.default_rng(0)
    images = rng.random((1, 3, args.imgsz, args.imgsz), dtype=np.float32)
    sizes = np.array([[args.imgsz, args.imgsz]], dtype=np.int64)
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        graphs = {}
        for sampler in ("gather", "grid"):
            loaded.model.set_sampler(sampler)
            graphs[sampler] = Path(tmp) / f"{sampler}.onnx"
            onnx_export.export_onnx(module, graphs[sampler], height=args.imgsz, width=args.imgsz)
        if args.fp16:
            graphs["gather-fp16"] = Path(tmp) / "fp16.onnx"
            onnx_export.save(
                fp16_export.convert(onnx_export.load(graphs["gather"])).model, graphs["gather-fp16"]
            )
        results = measure(graphs, images, sizes, args.threads, args.warmup, args.runs)
        for name, path in graphs.items():
            ops = onnx_export.op_counts(onnx_export.load(path))
            t = results[name]
            print(
                f"dfine-{args.size} {args.imgsz}px b1 {args.threads} threads  {name:12s} "
                f"GridSample nodes {ops.get('GridSample', 0):2d}  min {min(t):7.1f}  "
                f"median {statistics.median(t):7.1f}  max {max(t):7.1f} ms  ({args.runs} runs)"
            )
    cost = statistics.median(results["gather"]) / statistics.median(results["grid"]) - 1.0
    best = min(results["gather"]) / min(results["grid"]) - 1.0
    print(f"gather sampler vs GridSample: {cost:+.1%} median, {best:+.1%} min latency (goal: < +5 %)")


if __name__ == "__main__":
    main()
