"""Eager PyTorch CPU latency of the D-FINE deploy model, per size: batch 1, 2 threads by default.

    python benchmarks/model_latency.py                     # dfine-n and dfine-s at 640x640
    python benchmarks/model_latency.py --sizes n s m l x --runs 30 --sampler gather

The goal: no slower than the official implementation on the same machine (official eager
D-FINE-N about 150 ms median here, D-FINE-S about 300 ms). Each size runs `--warmup` untimed
forward passes first, then `--runs` timed ones under torch.inference_mode; the table gives
min / median / p90 / max in milliseconds. Weights are random: latency does not depend on them.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

from dfine_deploy.model.spec import SAMPLERS, SIZES


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    ordered = sorted(values)
    rank = max(1, round(q / 100 * len(ordered)))
    return ordered[rank - 1]


def time_size(size: str, imgsz: int, sampler: str, warmup: int, runs: int) -> list[float]:
    import torch

    from dfine_deploy.hub.loader import load_model
    from dfine_deploy.model.dfine import DeployModel

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # random weights: fine for timing
        loaded = load_model(f"dfine-{size}", imgsz=(imgsz, imgsz), sampler=sampler)
    module = DeployModel(loaded.model, loaded.postprocessor).eval().for_eager(torch.device("cpu"))
    images = torch.rand(1, 3, imgsz, imgsz)
    sizes = torch.tensor([[imgsz, imgsz]])
    times = []
    with torch.inference_mode():
        for _ in range(warmup):
            module(images, sizes)
        for _ in range(runs):
            start = time.perf_counter()
            module(images, sizes)
            times.append((time.perf_counter() - start) * 1000.0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", nargs="+", default=["n", "s"], choices=list(SIZES))
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--sampler", default="grid", choices=SAMPLERS)
    args = parser.parse_args()

    import torch

    torch.manual_seed(0)
    torch.set_num_threads(args.threads)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch 1, "
        f"{args.imgsz}x{args.imgsz}, sampler {args.sampler}, {args.warmup} warm-up + {args.runs} timed runs"
    )
    print(f"{'model':<9}{'min ms':>9}{'median':>9}{'p90':>9}{'max':>9}")
    for size in args.sizes:
        times = time_size(size, args.imgsz, args.sampler, args.warmup, args.runs)
        print(
            f"dfine-{size:<3}{min(times):9.1f}{statistics.median(times):9.1f}"
            f"{percentile(times, 90):9.1f}{max(times):9.1f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
