"""dfine-verify on the GPU host: the artifact's reference pack through onnxruntime's CUDA provider,
the torch CUDA backend and the TensorRT engine the tensorrt_build check wrote, each held to its
precision's export gate (dfine_deploy/verify)."""

from __future__ import annotations

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
from dfine_deploy.artifact import ENGINE_FILES
from dfine_deploy.backend_names import Precision
from dfine_deploy.runtime.verify_record import VERIFY_NAME, read_results


def _verify(ctx, backend: str, dev: str, written_beside: Path, file: Path | None = None) -> dict[str, Any]:
    """Run `dfine-verify` as a user does; the verify.json entry this run wrote (a key that is new, or
    whose entry changed) is the check's figures, never an earlier run's or another file's entry of the
    same backend. `file`: the file it must have verified (the engine of this run's build)."""
    cmd = [sys.executable, "-m", "dfine_deploy.verify.cli", str(ctx["artifact"]), "--backend", backend]
    before = read_results(written_beside)
    result = run_command([*cmd, "--device", dev, "--runs", "10"], timeout=120)
    written = [entry for key, entry in read_results(written_beside).items() if before.get(key) != entry]
    if len(written) != 1:
        raise AssertionError(
            f"{result['command']} changed {len(written)} entries of {written_beside / VERIFY_NAME}; "
            "a run writes its one"
        )
    (entry,) = written
    if file is not None and Path(entry["file"]).resolve() != file.resolve():
        raise AssertionError(f"{result['command']} verified {entry['file']}, not {file}")
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
    artifact = Path(ctx["artifact"])
    return _verify(ctx, "tensorrt", "cuda", artifact, artifact / ENGINE_FILES[Precision.FP16])
