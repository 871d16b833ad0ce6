"""ONNX Runtime CPU latency of the exported D-FINE graphs: gather sampler (default) vs grid sampler.

    python benchmarks/export_latency.py                   # dfine-n, 640x640, batch 1, 2 threads
    python benchmarks/export_latency.py --size s --runs 50 --fp16
    python benchmarks/export_latency.py --profile --graph before=old/model.onnx   # sampler kernels

The goal: the default graph no slower than the official export (D-FINE-N about 58 ms median
on these machines), and the gather sampler within 5 % of GridSample. Both graphs come from the
same weights and are timed in alternation; warm-up runs are discarded; min / median / max are
printed. `--graph NAME=PATH` adds a graph exported elsewhere (e.g. before a change) to the
alternation.

`--profile` also runs each graph in a profiling onnxruntime session (the gather sampler against
the GridSample node, kernel by kernel) and prints the deformable sampler's kernel time per graph and by
operator: every node of a `cross_attn` scope except the two projections and the softmax, each
node's fastest run summed (on a shared machine a node's slower runs are mostly waiting).
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import numpy as np


def _feeds(session, images: np.ndarray, sizes: np.ndarray) -> dict[str, np.ndarray]:
    """orig_target_sizes in the graph's own integer type (INT32 in --target trt8.x graphs)."""
    declared = next(i.type for i in session.get_inputs() if i.name == "orig_target_sizes")
    return {
        "images": images,
        "orig_target_sizes": sizes.astype(np.int32 if "int32" in declared else np.int64),
    }


def measure(
    paths: dict[str, Path], images: np.ndarray, sizes: np.ndarray, threads: int, warmup: int, runs: int
) -> dict[str, list[float]]:
    """Time the graphs in alternation, run by run, so load changes on a shared machine hit all alike."""
    from dfine_deploy.export.onnx import ort_session

    sessions = {name: ort_session(path, threads) for name, path in paths.items()}
    feeds = {name: _feeds(session, images, sizes) for name, session in sessions.items()}
    for name, session in sessions.items():
        for _ in range(warmup):
            session.run(None, feeds[name])
    times: dict[str, list[float]] = {name: [] for name in sessions}
    for _ in range(runs):
        for name, session in sessions.items():
            start = time.perf_counter()
            session.run(None, feeds[name])
            times[name].append((time.perf_counter() - start) * 1000.0)
    return times


def _is_sampler_node(name: str) -> bool:
    return "/cross_attn/" in name and not any(
        part in name for part in ("/sampling_offsets/", "/attention_weights/", "/Softmax")
    )


def profile_sampler(
    paths: dict[str, Path], images: np.ndarray, sizes: np.ndarray, threads: int, runs: int, tmp: Path
) -> dict[str, collections.Counter]:
    """Graph name -> operator -> sampler kernel ms per run (each node's fastest run, summed)."""
    import onnxruntime as ort

    sessions = {}
    for name, path in paths.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1  # as `ort_session`, plus profiling
        options.enable_profiling = True
        options.profile_file_prefix = str(tmp / f"profile-{name}")
        sessions[name] = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    feeds = {name: _feeds(session, images, sizes) for name, session in sessions.items()}
    for _ in range(runs):
        for name, session in sessions.items():
            session.run(None, feeds[name])
    result = {}
    for name, session in sessions.items():
        fastest: dict[str, float] = {}
        op_type: dict[str, str] = {}
        for event in json.loads(Path(session.end_profiling()).read_text()):
            node = event["name"].removesuffix("_kernel_time")
            if event.get("cat") != "Node" or node == event["name"] or not _is_sampler_node(node):
                continue
            ms = event["dur"] / 1000.0
            fastest[node] = min(ms, fastest.get(node, ms))
            op_type[node] = event["args"]["op_name"]
        by_op: collections.Counter = collections.Counter()
        for node, ms in fastest.items():
            by_op[op_type[node]] += ms
        result[name] = by_op
    return result


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
    parser.add_argument(
        "--graph", action="append", default=[], metavar="NAME=PATH", help="another graph to alternate with"
    )
    parser.add_argument("--profile", action="store_true", help="also profile the sampler's kernels")
    args = parser.parse_args()
    extra = dict(item.split("=", 1) for item in args.graph)

    import torch

    from dfine_deploy.export import fp16 as fp16_export
    from dfine_deploy.export import onnx as onnx_export
    from dfine_deploy.hub.loader import load_model
    from dfine_deploy.model.dfine import DeployModel

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
        graphs.update({name: Path(path) for name, path in extra.items()})
        results = measure(graphs, images, sizes, args.threads, args.warmup, args.runs)
        for name, path in graphs.items():
            ops = onnx_export.op_counts(onnx_export.load(path))
            t = results[name]
            print(
                f"dfine-{args.size} {args.imgsz}px b1 {args.threads} threads  {name:12s} "
                f"GridSample nodes {ops.get('GridSample', 0):2d}  min {min(t):7.1f}  "
                f"median {statistics.median(t):7.1f}  max {max(t):7.1f} ms  ({args.runs} runs)"
            )
        if args.profile:
            kernels = profile_sampler(graphs, images, sizes, args.threads, args.runs, Path(tmp))
    cost = statistics.median(results["gather"]) / statistics.median(results["grid"]) - 1.0
    best = min(results["gather"]) / min(results["grid"]) - 1.0
    print(f"gather sampler vs GridSample: {cost:+.1%} median, {best:+.1%} min latency (goal: < +5 %)")
    if args.profile:
        grid_ms = sum(kernels["grid"].values())
        for name, by_op in kernels.items():
            total = sum(by_op.values())
            top = ", ".join(f"{op} {ms:.2f}" for op, ms in by_op.most_common(6))
            print(f"sampler kernels {name:12s} {total:6.2f} ms ({total / grid_ms:.2f}x grid): {top}")


if __name__ == "__main__":
    main()
