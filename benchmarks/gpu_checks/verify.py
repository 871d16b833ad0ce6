"""dfine-verify on the GPU host: the artifact's reference pack through onnxruntime's CUDA provider,
the torch CUDA backend and the TensorRT engine the tensorrt_build check wrote, each held to its
precision's export gate (dfine_deploy/verify)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_checks.common import (
    Skip,
    needs_artifact,
    require_distribution,
    run_command,
    tensorrt_version,
)
from benchmarks.gpu_checks.torch_side import device
from dfine_deploy.runtime.verify_record import VERIFY_NAME


def _verify(ctx, backend: str, dev: str, written_beside: Path) -> dict[str, Any]:
    """Run `dfine-verify` as a user does; its verify.json entry is the check's figures."""
    cmd = [sys.executable, "-m", "dfine_deploy.verify.cli", str(ctx["artifact"]), "--backend", backend]
    result = run_command([*cmd, "--device", dev, "--runs", "10"], timeout=120)
    results = json.loads((written_beside / VERIFY_NAME).read_text())["results"]
    entry = next(r for r in results.values() if r["device"]["backend"] == backend.partition(":")[0])
    return {"command": result["command"], "seconds": result["seconds"], **entry}


def check_verify_ort_cuda(ctx) -> dict[str, Any]:
    require_distribution("onnxruntime-gpu")
    needs_artifact(ctx)
    return _verify(ctx, "onnxruntime:cuda", "cuda", Path(ctx["artifact"]))


def check_verify_torch(ctx) -> dict[str, Any]:
    """The checkpoint on torch (CUDA FP16 autocast; --dry: the CPU) against its own reference pack."""
    needs_artifact(ctx)
    return _verify(ctx, "torch", device(ctx), Path(ctx["checkpoint"]).parent)


def check_verify_tensorrt(ctx) -> dict[str, Any]:
    """The engine of the tensorrt_build check, as a user proves it before dfine-serve opens it."""
    tensorrt_version()
    needs_artifact(ctx)
    if not ctx.get("engine_built"):
        raise Skip("the tensorrt_build check built no engine")
    return _verify(ctx, "tensorrt", "cuda", Path(ctx["artifact"]))
