"""The GPU checks of the deployment backends: onnxruntime's CUDA and TensorRT providers, the Python
TensorRT build and trtexec (export/jetson/build_engine.sh), and the engine run with each buffer kind."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu_checks.common import (
    FP16_GATE,
    FP32_GATE,
    NotInstalled,
    Skip,
    agreement,
    needs_artifact,
    require_distribution,
    run_command,
    tensorrt_version,
    torch_sees_cuda,
)
from dfine_deploy.artifact import ENGINE_FILES, read_artifact
from dfine_deploy.backend_names import Precision
from dfine_deploy.errors import BackendError
from dfine_deploy.export.targets import JETPACK_TRTEXEC
from dfine_deploy.runtime import Detector
from dfine_deploy.runtime.onnxruntime_backend import load_tensorrt_libraries


def check_ort_cuda(ctx) -> dict[str, Any]:
    import onnxruntime as ort

    require_distribution("onnxruntime-gpu")  # first: "not installed" says more than "no artifact"
    needs_artifact(ctx)
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" not in available:
        raise AssertionError(f"onnxruntime {ort.__version__} offers {available}: install onnxruntime-gpu")
    out: dict[str, Any] = {"onnxruntime": ort.__version__, "available": available}
    for precision, gate in ((Precision.FP32, FP32_GATE), (Precision.FP16, FP16_GATE)):
        try:
            det = Detector.open(ctx["artifact"], backend="onnxruntime:cuda", precision=precision)
        except Exception as exc:  # e.g. no fp16 graph in the artifact
            out[precision] = f"not run: {exc}"
            continue
        if det.provider != "CUDAExecutionProvider":
            raise AssertionError(f"asked for CUDA, onnxruntime runs {det.provider}")
        out[precision] = {
            "provider": det.provider,
            "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), gate),
        }
    ctx["backends"].append("onnxruntime:cuda")
    return out


def _ort_tensorrt_ep(ctx, precision: str) -> dict[str, Any]:
    import onnxruntime as ort

    require_distribution("onnxruntime-gpu")
    needs_artifact(ctx)
    if "TensorrtExecutionProvider" not in ort.get_available_providers():
        raise Skip(f"onnxruntime {ort.__version__} has no TensorRT provider here")
    try:  # what the session does first: the library its provider links, from pip or the loader's path
        load_tensorrt_libraries()
    except BackendError as exc:
        raise NotInstalled(str(exc)) from None
    det = Detector.open(ctx["artifact"], backend="onnxruntime:tensorrt", precision=precision)
    if det.provider != "TensorrtExecutionProvider":
        raise AssertionError(f"asked for the TensorRT provider, onnxruntime runs {det.provider}")
    gate = FP16_GATE if precision == Precision.FP16 else FP32_GATE
    return {
        "onnxruntime": ort.__version__,
        "provider": det.provider,
        "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), gate),
    }


def check_ort_trt_ep_fp32(ctx) -> dict[str, Any]:
    return _ort_tensorrt_ep(ctx, Precision.FP32)


def check_ort_trt_ep_fp16(ctx) -> dict[str, Any]:
    return _ort_tensorrt_ep(ctx, Precision.FP16)


def check_tensorrt_build(ctx) -> dict[str, Any]:
    version = tensorrt_version()
    needs_artifact(ctx)
    from dfine_deploy.export.tensorrt import build_for_artifact

    first = build_for_artifact(ctx["artifact"])
    second = build_for_artifact(ctx["artifact"])  # the keyed timing cache must be reused
    ctx["engine_built"] = True
    out = {
        "tensorrt": version,
        "source_graph": first.source_graph,
        "builder": first.builder,
        "io_dtypes": first.io_dtypes,
        "verification": first.verification,
        "build_s": first.build_seconds,
        "rebuild_s": second.build_seconds,
        "rebuild_timing_cache": second.builder.get("timing_cache_status"),
    }
    if second.builder.get("timing_cache_status") != "reused":
        raise AssertionError(f"the second build did not reuse the timing cache: {out}")
    return out


def check_trtexec_build(ctx) -> dict[str, Any]:
    import shutil

    candidates = (JETPACK_TRTEXEC, shutil.which("trtexec"))
    trtexec = next((p for p in candidates if p and Path(p).is_file()), None)
    if trtexec is None:
        raise NotInstalled(f"no trtexec on this machine (JetPack: {JETPACK_TRTEXEC})")
    needs_artifact(ctx)
    from dfine_deploy.export.pipeline import ARTIFACT
    from dfine_deploy.ownership import replacing

    copy = ctx["work"] / "artifact_trtexec"
    with replacing(copy, ARTIFACT, option="--work") as staging:  # an earlier run's copy only
        ignore = shutil.ignore_patterns("*.engine", "*.cache")
        shutil.copytree(ctx["artifact"], staging, ignore=ignore, dirs_exist_ok=True)
    script = ["bash", "export/jetson/build_engine.sh", str(copy)]
    # the script's python3 (which records the engine in model.json) is this interpreter
    env = {**os.environ, "PATH": os.pathsep.join((str(Path(sys.executable).parent), os.environ["PATH"]))}
    result = run_command(script, timeout=max(60, ctx["left"]() - 30), env=env)
    if not (copy / ENGINE_FILES[Precision.FP16]).is_file():
        raise AssertionError(f"build_engine.sh exited 0 but wrote no engine: {result['output_tail'][-800:]}")
    # by the folder: model.json must record the engine. Opened unverified: this check holds the engine
    # to the agreement gate itself (random weights); dfine-verify's export gate is verify_tensorrt's
    det = Detector.open(copy, backend="tensorrt", precision=Precision.FP16, unverified=True)
    record = read_artifact(copy).engine_for(Precision.FP16)
    return {
        "trtexec": trtexec,
        "build": result,
        "record": {
            k: getattr(record, k) for k in ("tensorrt_version", "gpu_name", "precision", "verification")
        },
        "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), FP16_GATE),
    }


def _tensorrt_run(ctx, memory: str) -> dict[str, Any]:
    tensorrt_version()
    needs_artifact(ctx)
    if not ctx.get("engine_built"):
        raise Skip("the tensorrt_build check built no engine")
    if ctx["dry"] and memory == "torch" and not torch_sees_cuda():
        raise Skip(
            "dry run: torch sees no CUDA device and its buffers need one; trt_run_cudart runs the same "
            "engine path on the fake CUDA runtime"
        )
    # unverified: each buffer kind is held to the agreement gate here, so that a failing dfine-verify
    # (its own check, verify_tensorrt) never hides what either kind of buffer does
    det = Detector.open(ctx["artifact"], backend="tensorrt", memory=memory, unverified=True)
    if "tensorrt" not in ctx["backends"]:
        ctx["backends"].append("tensorrt")
    return {
        "provider": det.provider,
        "max_batch": det.max_batch,
        "agreement": agreement(ctx["reference"], det.predict(ctx["frames"]), FP16_GATE),
    }


def check_trt_run_torch(ctx) -> dict[str, Any]:
    return _tensorrt_run(ctx, "torch")


def check_trt_run_cudart(ctx) -> dict[str, Any]:
    return _tensorrt_run(ctx, "cuda-python")
