"""Every GPU-only check of dfine-deploy in one run, written to one JSON report.

Started by benchmarks/gpu_check.sh (which refuses a machine without an NVIDIA GPU, unless --dry).
Each check records status ok / failed / skipped / not installed (with why), its seconds and its
figures; the report is rewritten after every check, so a run cut short still leaves what it
measured. A package the host lacks (TensorRT, onnxruntime-gpu, or any module a check imports) is
"not installed", never "failed".

    train_step_fp16  D-FINE-N training step on CUDA (forward + loss + backward), AMP fp16 + GradScaler
    train_step_bf16  the same with AMP bf16
    eager_fp16       eager D-FINE latency per size n..x, batch 1 at 640, FP16 autocast
    trainer          dfine-train for one epoch on CUDA (synthetic data, --use-amp --auto-batch, NVML)
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
                     failure never hides the other). These and trtexec_build hold the engine to the
                     agreement gate themselves, so they open it without a dfine-verify result
    verify_tensorrt  dfine-verify of the Python-built engine (the export gate, layer precision),
                     as a user runs it before dfine-serve
    torch_detector   Detector on torch CUDA (FP16 autocast) vs onnxruntime CPU
    verify_ort_cuda  dfine-verify with onnxruntime's CUDA provider: the artifact's reference pack at
                     batch 1 and its largest batch, the export gate's thresholds, p50/p99 (verify.json)
    verify_torch     dfine-verify with the torch CUDA backend (FP16 autocast) on the checkpoint
    bench_t4         dfine-bench --device t4 over every backend that loaded, --json

The report starts with the versions that decide each cell of the support matrix (docs/targets.md):
TensorRT, onnxruntime, cuda-python, torch, the driver and the GPU.

--dry runs every check's plumbing on the CPU at a tiny size and budget (tests/bench/test_gpu_check.py):
the control flow, the statuses and the report, not GPU figures. gpu_check.sh --dry puts the fake
TensorRT and CUDA runtime of tests/fakes (NVIDIA's recorded API surface; engines run their graph
with onnxruntime) first on PYTHONPATH and a stub trtexec (tests/support/stub_trtexec.py) on PATH,
so the TensorRT checks, dfine-verify of the engine included, run to their end.

Agreement is IoU-matched (dfine_deploy.runtime.compare): FP32 paths need >= 95 % of the top-20
detections matched at IoU 0.9; FP16 paths >= 80 % at IoU 0.8 (random weights make near-tied scores).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from importlib import metadata
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
from benchmarks.gpu_checks.common import NotInstalled, Skip, tensorrt_missing, versions  # noqa: E402
from benchmarks.gpu_checks.torch_side import (  # noqa: E402
    check_bench,
    check_eager_fp16,
    check_export,
    check_torch_detector,
    check_train_step_bf16,
    check_train_step_fp16,
    check_trainer,
)
from benchmarks.gpu_checks.verify import (  # noqa: E402
    check_verify_ort_cuda,
    check_verify_tensorrt,
    check_verify_torch,
)
from dfine_deploy.bench.hardware import detect  # noqa: E402
from dfine_deploy.export.targets import JETPACK_TRTEXEC  # noqa: E402
from dfine_deploy.files import atomic_write_bytes  # noqa: E402

# (name, check, seconds it needs on the GPU host, what it needs installed); the run ends within 8 minutes
CHECKS: list[tuple[str, Callable[[dict], dict], float, str]] = [
    ("train_step_fp16", check_train_step_fp16, 30, ""),
    ("train_step_bf16", check_train_step_bf16, 30, ""),
    ("eager_fp16", check_eager_fp16, 40, ""),
    ("export", check_export, 60, ""),
    ("ort_cuda", check_ort_cuda, 20, "onnxruntime-gpu"),
    ("ort_trt_ep_fp32", check_ort_trt_ep_fp32, 60, "onnxruntime-gpu"),
    ("ort_trt_ep_fp16", check_ort_trt_ep_fp16, 60, "onnxruntime-gpu"),
    ("tensorrt_build", check_tensorrt_build, 90, "tensorrt"),
    ("trt_run_torch", check_trt_run_torch, 15, "tensorrt"),
    ("trt_run_cudart", check_trt_run_cudart, 15, "tensorrt"),
    ("verify_tensorrt", check_verify_tensorrt, 20, "tensorrt"),
    ("trtexec_build", check_trtexec_build, 90, "trtexec"),
    ("torch_detector", check_torch_detector, 20, ""),
    ("verify_ort_cuda", check_verify_ort_cuda, 20, "onnxruntime-gpu"),
    ("verify_torch", check_verify_torch, 25, ""),
    ("bench_t4", check_bench, 40, ""),
    ("trainer", check_trainer, 90, ""),
]
DRY_BUDGET = 240  # seconds for --dry on a loaded 2-core CPU (tests/bench/test_gpu_check.py)


def not_installed(requires: str) -> str:
    """Why `requires` (a distribution, or "tensorrt"/"trtexec") is missing here; "" when present."""
    if not requires:
        return ""
    if requires == "trtexec":
        found = Path(JETPACK_TRTEXEC).is_file() or shutil.which("trtexec")
        return "" if found else f"no trtexec on this machine (JetPack: {JETPACK_TRTEXEC})"
    if requires == "tensorrt":
        return tensorrt_missing()
    try:
        metadata.version(requires)
    except metadata.PackageNotFoundError:
        return f"{requires} is not installed"
    return ""


def failed(exc: BaseException) -> dict[str, Any]:
    return {
        "status": "failed",
        "error": f"{type(exc).__name__}: {exc}",
        "traceback": traceback.format_exc()[-2000:],
    }


def run_check(
    check: Callable[[dict], dict], ctx: dict[str, Any], left: Callable[[], float]
) -> dict[str, Any]:
    """One check's entry: ok with its figures, or why not (every failure is recorded, never raised)."""
    try:
        return {"status": "ok", **check(ctx)}
    except NotInstalled as exc:
        return {"status": "not installed", "why": str(exc)}
    except ModuleNotFoundError as exc:
        if (exc.name or "").split(".")[0] in ("dfine_deploy", "benchmarks"):
            return failed(exc)  # our own code: a bug, not a missing package
        return {"status": "not installed", "why": f"{exc.name} is not installed"}
    except Skip as exc:
        return {"status": "skipped", "why": str(exc)}
    except subprocess.TimeoutExpired as exc:
        if left() > 15:
            return failed(exc)
        return {"status": "skipped", "why": f"time budget: cut after {exc.timeout:.0f} s, at its end"}
    except Exception as exc:  # the next check still runs
        return failed(exc)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--work", type=Path, default=Path("runs/gpu_check"))
    parser.add_argument("--budget", type=float, default=420, help="seconds for all checks together")
    parser.add_argument("--only", nargs="+", default=None, help="run only these checks")
    parser.add_argument("--dry", action="store_true", help="every check's plumbing on the CPU, tiny sizes")
    args = parser.parse_args()
    if args.dry:
        args.budget = min(args.budget, DRY_BUDGET)
    needs_scale = 0.1 if args.dry else 1.0
    args.work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    left = lambda: args.budget - (time.perf_counter() - started)  # noqa: E731
    ctx: dict[str, Any] = {"work": args.work.resolve(), "left": left, "dry": args.dry}
    report: dict[str, Any] = {
        "dry": args.dry,
        "hardware": detect().to_dict(),
        "python": sys.version.split()[0],
        "versions": versions(),
        "checks": {},
    }
    for name, check, needs, requires in CHECKS:
        if args.only and name not in args.only:
            continue
        entry: dict[str, Any]
        needs *= needs_scale
        missing = not_installed(requires)
        if missing:
            entry = {"status": "not installed", "why": missing}
        elif left() < needs:
            entry = {
                "status": "skipped",
                "why": f"time budget: {left():.0f} s left, needs about {needs:.0f} s",
            }
        else:
            t0 = time.perf_counter()
            entry = run_check(check, ctx, left)
            entry["seconds"] = round(time.perf_counter() - t0, 1)
        report["checks"][name] = entry
        report["seconds"] = round(time.perf_counter() - started, 1)
        atomic_write_bytes(args.out, json.dumps(report, indent=2, default=str).encode())
        print(
            f"{name:<16} {entry['status']:<13} {entry.get('seconds', 0):>6} s  "
            f"{entry.get('why', entry.get('error', ''))[:150]}",
            flush=True,
        )
    failed = [n for n, e in report["checks"].items() if e["status"] == "failed"]
    print(f"report: {args.out} ({'failed: ' + ', '.join(failed) if failed else 'no failures'})")
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
