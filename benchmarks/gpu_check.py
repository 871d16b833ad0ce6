"""Every GPU-only check of dfine-deploy in one run, written to one JSON report.

Started by benchmarks/gpu_check.sh (which refuses a machine without an NVIDIA GPU). Each check
records status ok / failed / skipped (with why), its seconds and its figures; the report is
rewritten after every check, so a run cut short still leaves what it measured.

    torch_cuda       D-FINE-N training step on CUDA (forward + loss + backward, FP16 autocast)
    trainer          dfine-train for one short epoch on CUDA (synthetic data, AMP)
    export           dfine-export of a D-FINE-N checkpoint (the artifact the rest uses), with the
                     --target of the installed TensorRT when it imports
    ort_cuda         onnxruntime CUDA provider really active; detections vs the CPU provider
    ort_trt_ep_fp32  onnxruntime TensorRT provider on model.onnx (profiles for both inputs)
    ort_trt_ep_fp16  the same on the typed model.fp16.onnx (no trt_fp16_enable: its types decide)
    tensorrt_build   the Python build (export.tensorrt.build_for_artifact): plan, verification
                     record (verified / unverified and why), timing cache status, then a second
                     build that must reuse the keyed timing cache
    trtexec_build    export/jetson/build_engine.sh (trtexec) on a copy of the artifact, when trtexec
                     is on this machine (JetPack's /usr/src/tensorrt/bin/trtexec or PATH)
    trt_run_torch    the Python-built engine through the TensorRT backend with torch buffers
    trt_run_cudart   the same with cuda-python buffers (each buffer kind is its own check, so one
                     failure never hides the other)
    torch_detector   Detector on torch CUDA (FP16 autocast) vs onnxruntime CPU
    bench_t4         dfine-bench --device t4 over every backend that loaded, --json

The report starts with the versions that decide each cell of the support matrix (docs/targets.md):
TensorRT, onnxruntime, cuda-python, torch, the driver and the GPU.

Agreement is IoU-matched (dfine_deploy.runtime.compare): FP32 paths need >= 95 % of the top-20
detections matched at IoU 0.9; FP16 paths >= 80 % at IoU 0.8 (random weights make near-tied scores).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu_checks.backends import (  # noqa: E402
    check_ort_cuda,
    check_ort_trt_ep_fp16,
    check_ort_trt_ep_fp32,
    check_tensorrt_build,
    check_trt_run_cudart,
    check_trt_run_torch,
    check_trtexec_build,
)
from benchmarks.gpu_checks.common import Skip, versions  # noqa: E402
from benchmarks.gpu_checks.torch_side import (  # noqa: E402
    check_bench,
    check_export,
    check_torch_cuda,
    check_torch_detector,
    check_trainer,
)
from dfine_deploy.artifact import atomic_write_bytes  # noqa: E402
from dfine_deploy.bench.hardware import detect  # noqa: E402

CHECKS: list[tuple[str, Callable[[dict], dict], float]] = [
    ("torch_cuda", check_torch_cuda, 30),
    ("export", check_export, 60),
    ("ort_cuda", check_ort_cuda, 20),
    ("ort_trt_ep_fp32", check_ort_trt_ep_fp32, 60),
    ("ort_trt_ep_fp16", check_ort_trt_ep_fp16, 60),
    ("tensorrt_build", check_tensorrt_build, 90),
    ("trt_run_torch", check_trt_run_torch, 15),
    ("trt_run_cudart", check_trt_run_cudart, 15),
    ("trtexec_build", check_trtexec_build, 90),
    ("torch_detector", check_torch_detector, 20),
    ("bench_t4", check_bench, 40),
    ("trainer", check_trainer, 90),
]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--work", type=Path, default=Path("runs/gpu_check"))
    parser.add_argument("--budget", type=float, default=900, help="seconds for all checks together")
    parser.add_argument("--only", nargs="+", default=None, help="run only these checks")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - started)  # noqa: E731
    ctx: dict[str, Any] = {"work": args.work.resolve(), "left": left}
    report: dict[str, Any] = {
        "hardware": detect().to_dict(),
        "python": sys.version.split()[0],
        "versions": versions(),
        "checks": {},
    }
    for name, check, needs in CHECKS:
        if args.only and name not in args.only:
            continue
        entry: dict[str, Any]
        if left() < needs:
            entry = {
                "status": "skipped",
                "why": f"time budget: {left():.0f} s left, needs about {needs:.0f} s",
            }
        else:
            t0 = time.perf_counter()
            try:
                entry = {"status": "ok", **check(ctx)}
            except Skip as exc:
                entry = {"status": "skipped", "why": str(exc)}
            except Exception as exc:  # every failure is recorded; the next check still runs
                entry = {
                    "status": "failed",
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-2000:],
                }
            entry["seconds"] = round(time.perf_counter() - t0, 1)
        report["checks"][name] = entry
        report["seconds"] = round(time.perf_counter() - started, 1)
        atomic_write_bytes(args.out, json.dumps(report, indent=2, default=str).encode())
        print(
            f"{name:<16} {entry['status']:<8} {entry.get('seconds', 0):>6} s  "
            f"{entry.get('why', entry.get('error', ''))[:150]}",
            flush=True,
        )
    failed = [n for n, e in report["checks"].items() if e["status"] == "failed"]
    print(f"report: {args.out} ({'failed: ' + ', '.join(failed) if failed else 'no failures'})")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
