"""What every GPU check shares: the Skip signal, the agreement gates, the test frames, running a
command, and the versions that decide a support-matrix cell (the runner is benchmarks/gpu_check.py)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy.runtime.compare import compare_detections

ROOT = Path(__file__).resolve().parents[2]

FP32_GATE = (0.95, 0.9)  # (match rate, IoU)
FP16_GATE = (0.80, 0.8)


class Skip(Exception):
    """A check that cannot run here (says why)."""


class NotInstalled(Skip):
    """A check whose package is not on this host (TensorRT, onnxruntime-gpu): reported, not failed."""


def require_distribution(name: str) -> str:
    """The installed version of a pip distribution, or NotInstalled."""
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        raise NotInstalled(f"{name} is not installed") from None


def agreement(reference, other, gate) -> dict[str, Any]:
    rate, iou = gate
    result = compare_detections(reference, other, top_k=20, iou_threshold=iou).to_dict()
    result["gate"] = {"match_rate": rate, "iou": iou}
    result["passed"] = result["match_rate"] >= rate
    if not result["passed"]:
        raise AssertionError(f"detections disagree: {result}")
    return result


def frames(count: int = 4) -> list[np.ndarray]:
    import cv2

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        small = rng.integers(0, 256, (9, 16, 3), dtype=np.uint8)
        frame = cv2.resize(small, (1280, 720), interpolation=cv2.INTER_CUBIC)
        for _ in range(5):
            x, y = int(rng.integers(0, 1100)), int(rng.integers(0, 560))
            cv2.rectangle(
                frame,
                (x, y),
                (x + int(rng.integers(40, 180)), y + int(rng.integers(40, 160))),
                tuple(int(c) for c in rng.integers(0, 256, 3)),
                -1,
            )
        out.append(frame)
    return out


def run_command(cmd: list[str], timeout: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    result = {
        "command": " ".join(cmd),
        "returncode": proc.returncode,
        "seconds": round(time.perf_counter() - started, 1),
        "output_tail": (proc.stdout + proc.stderr)[-3000:],
    }
    if proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}: {result['output_tail'][-800:]}")
    return result


def needs_artifact(ctx) -> None:
    if "reference" not in ctx:
        raise Skip("the export check did not produce an artifact")


def tensorrt_missing() -> str:
    """Why TensorRT's Python package is absent ("" when a real one is there). tensorrt-stubs alone
    leaves a `tensorrt` directory of .pyi files: a namespace package, not TensorRT."""
    import importlib.util

    spec = importlib.util.find_spec("tensorrt")
    if spec is None:
        return "tensorrt is not installed"
    if spec.origin is None:
        return "tensorrt is not installed (only a namespace directory, e.g. tensorrt-stubs)"
    return ""


def torch_sees_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def tensorrt_version() -> str:
    from dfine_deploy.runtime.tensorrt_backend import load_tensorrt

    missing = tensorrt_missing()
    if missing:
        raise NotInstalled(missing)
    try:
        return str(load_tensorrt("gpu_check").__version__)
    except Exception as exc:  # stubs only, or its libraries do not load
        raise Skip(f"tensorrt does not import here ({exc})") from None


def versions() -> dict[str, Any]:
    """Versions that decide the support-matrix cell this run speaks for."""
    from importlib import metadata

    found: dict[str, Any] = {}
    for name in (
        "tensorrt",
        "tensorrt-cu12",
        "tensorrt-cu13",
        "onnxruntime-gpu",
        "onnxruntime",
        "cuda-python",
        "cuda-bindings",
        "torch",
    ):
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        found["nvidia-smi"] = smi.stdout.strip().splitlines()
    except (OSError, subprocess.TimeoutExpired) as exc:
        found["nvidia-smi"] = f"not run: {exc}"
    return found
