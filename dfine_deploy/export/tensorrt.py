"""TensorRT engines from the exported graphs, gated by TensorRT version, verified after the build.

    TensorRT 11.x   strongly typed only: build from the typed FP16 graph (model.fp16.onnx);
                    `BuilderFlag.FP16` no longer exists, and an FP32 graph would give an FP32 engine.
    TensorRT 10.x   typed graph -> STRONGLY_TYPED network (adding the FP16 flag would discard the
                    graph's types); an FP32 graph -> the legacy FP16 builder flag.
    TensorRT 8.5/8.6 (JetPack 5)  EXPLICIT_BATCH network + FP16 flag on the FP32 graph.

Whatever the path, the built engine is deserialised and its real I/O dtypes and layer precisions
are read back: an engine is called FP16 only if it has FP16 layers (tools that guard the removed
flag silently ship FP32 engines on TensorRT 11; anchors.md §0.2). Every dynamic input gets an
optimisation profile (images *and* orig_target_sizes), the timing cache is reused across builds,
and TF32 is off unless asked for.

Run on the target: `python -m dfine_deploy.export.tensorrt ARTIFACT_DIR` (needs the `tensorrt`
Python package and a GPU) or `export/jetson/build_engine.sh ARTIFACT_DIR` (trtexec).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dfine_deploy.artifact import (
    EngineInfo,
    atomic_write_bytes,
    read_artifact,
    sha256_file,
    write_artifact,
)
from dfine_deploy.errors import ExportError

ENGINE_NAME = "model.engine"
TIMING_CACHE_NAME = "timing.cache"
DEFAULT_WORKSPACE_MB = 4096
EXPECTED_IO_DTYPES = {
    "images": "FLOAT", "orig_target_sizes": "INT64", "labels": "INT64", "boxes": "FLOAT", "scores": "FLOAT",
}
_BUILD_HINT = (
    "Build the engine on the target machine instead: copy the artifact folder there and run "
    "`bash export/jetson/build_engine.sh ARTIFACT_DIR` (trtexec; any JetPack or x86 TensorRT) or "
    "`python -m dfine_deploy.export.tensorrt ARTIFACT_DIR` (TensorRT Python package), e.g.\n  {command}"
)


@dataclass(frozen=True)
class BuildPlan:
    """How one TensorRT version must be driven for an FP16 (or FP32) engine."""

    version: str
    major: int
    strongly_typed: bool  # network created with STRONGLY_TYPED (11.x: always, flag ignored)
    fp16_flag: bool  # legacy BuilderFlag.FP16 (never on 11.x)
    explicit_batch_flag: bool  # 8.x only
    graph: str  # "fp16" (model.fp16.onnx) or "fp32" (model.onnx)


@dataclass(frozen=True)
class GpuInfo:
    name: str
    compute_capability: str


def parse_version(version: str) -> tuple[int, int]:
    parts = (version.split(".") + ["0"])[:2]
    try:
        return int(parts[0]), int(parts[1])
    except ValueError as exc:
        raise ExportError(f"unrecognised TensorRT version '{version}'") from exc


def plan_build(version: str, *, fp16: bool = True, have_typed_graph: bool = True) -> BuildPlan:
    """Choose network flags, builder flags and source graph for a TensorRT version."""
    major, minor = parse_version(version)
    if major >= 11:
        if fp16 and not have_typed_graph:
            raise ExportError(
                f"TensorRT {version} builds strongly typed networks only and has no FP16 builder flag: "
                "an FP16 engine needs the typed graph model.fp16.onnx. Export it with --fp16 "
                "(the default) or build an FP32 engine with --no-fp16."
            )
        return BuildPlan(version, major, True, False, False, "fp16" if fp16 else "fp32")
    if major == 10:
        if fp16 and have_typed_graph:
            return BuildPlan(version, major, True, False, False, "fp16")
        return BuildPlan(version, major, False, fp16, False, "fp32")
    if major == 9 or (major == 8 and minor >= 5):
        # 8.5/8.6 have no strongly typed networks: FP32 graph + FP16 flag (JetPack 5 recipe).
        return BuildPlan(version, major, False, fp16, True, "fp32")
    raise ExportError(
        f"TensorRT {version} is too old: D-FINE needs TensorRT >= 8.5 (opset 17 LayerNormalization, "
        "GridSample-free graph). On Jetson that is JetPack 5.1 or newer."
    )


def trtexec_command(
    onnx_file: str, engine_file: str, plan: BuildPlan, profile: dict[str, Sequence[Sequence[int]]],
    *, workspace_mb: int = DEFAULT_WORKSPACE_MB, timing_cache: str = TIMING_CACHE_NAME, tf32: bool = False,
) -> list[str]:
    """The trtexec line equivalent to `build_engine` for a version (what build_engine.sh runs)."""

    def shapes(index: int) -> str:
        return ",".join(f"{name}:{'x'.join(str(d) for d in dims[index])}" for name, dims in profile.items())

    cmd = [
        "trtexec", f"--onnx={onnx_file}", f"--saveEngine={engine_file}",
        f"--minShapes={shapes(0)}", f"--optShapes={shapes(1)}", f"--maxShapes={shapes(2)}",
        f"--memPoolSize=workspace:{workspace_mb}M", f"--timingCacheFile={timing_cache}",
        "--profilingVerbosity=detailed",
    ]
    if plan.major == 10 and plan.strongly_typed:
        cmd.append("--stronglyTyped")  # 11.x: always on (the flag is a no-op there), so not added
    if plan.fp16_flag:
        cmd.append("--fp16")
    if not tf32:
        cmd.append("--noTF32")
    return cmd


def artifact_profile(batch: Sequence[int], height: int, width: int) -> dict[str, list[list[int]]]:
    """min/opt/max shapes for both dynamic inputs (D-FINE#18: a missing batch range breaks engines)."""
    return {
        "images": [[b, 3, height, width] for b in batch],
        "orig_target_sizes": [[b, 2] for b in batch],
    }


def import_tensorrt(command_hint: str = ""):
    try:
        import tensorrt as trt
    except ImportError as exc:  # the pip wheel without NVIDIA's libraries also lands here
        raise ExportError(
            f"--trt: the TensorRT Python package cannot be imported here ({exc}). It needs an NVIDIA "
            "GPU with its driver and `pip install 'dfine-deploy[trt]'` (TensorRT >= 8.5). The ONNX "
            "graphs were checked and can still be written without --trt. "
            + _BUILD_HINT.format(command=command_hint or "trtexec --onnx=model.fp16.onnx ...")
        ) from exc
    return trt


def gpu_info() -> GpuInfo | None:
    """Name and compute capability of CUDA device 0, or None when no GPU is visible."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return GpuInfo(torch.cuda.get_device_name(0), f"{major}.{minor}")
    except ImportError:
        pass
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return None
    err, count = cudart.cudaGetDeviceCount()
    if int(err) != 0 or count < 1:
        return None
    err, props = cudart.cudaGetDeviceProperties(0)
    if int(err) != 0:
        return None
    name = props.name.decode(errors="replace").rstrip("\x00") if isinstance(props.name, bytes) else str(props.name)
    return GpuInfo(name, f"{props.major}.{props.minor}")


def _dtype_name(dtype: Any) -> str:
    return getattr(dtype, "name", str(dtype).split(".")[-1]).upper()


def layer_precisions(inspector_json: str) -> dict[str, int]:
    """Count layers by the data type of their first output, from the engine inspector's JSON.

    TensorRT 10 writes "Format/Datatype": "Row major linear FP16 format"; TensorRT 11 splits it
    into "Format" and "DataType": "Half". Both are understood.
    """
    try:
        data = json.loads(inspector_json)
    except json.JSONDecodeError:
        return {}
    counts: dict[str, int] = {}
    for layer in data.get("Layers", []):
        if not isinstance(layer, dict):  # LAYER_NAMES_ONLY verbosity: names only
            counts["unknown"] = counts.get("unknown", 0) + 1
            continue
        outputs = layer.get("Outputs") or [{}]
        text = str(outputs[0].get("DataType") or outputs[0].get("Format/Datatype") or "").lower()
        if "fp16" in text or "half" in text:
            kind = "fp16"
        elif "bf16" in text:
            kind = "bf16"
        elif "fp8" in text or "int8" in text:
            kind = "int8/fp8"
        elif "fp32" in text or "float" in text:
            kind = "fp32"
        elif "int" in text or "bool" in text:
            kind = "int"
        else:
            kind = "unknown"
        counts[kind] = counts.get(kind, 0) + 1
    return counts


def build_engine(
    onnx_path: str | Path,
    engine_path: str | Path,
    *,
    profile: dict[str, Sequence[Sequence[int]]],
    fp16: bool = True,
    typed_graph: bool = True,
    workspace_mb: int = DEFAULT_WORKSPACE_MB,
    timing_cache: str | Path | None = None,
    tf32: bool = False,
) -> EngineInfo:
    """Build, verify and atomically write an engine; returns its sidecar entry."""
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    hint_plan = BuildPlan("11", 11, True, False, False, "fp16")
    hint = " ".join(trtexec_command(onnx_path.name, engine_path.name, hint_plan, profile))
    trt = import_tensorrt(hint)
    gpu = gpu_info()
    if gpu is None:
        raise ExportError("--trt: TensorRT is installed but no CUDA GPU is visible. " + _BUILD_HINT.format(command=hint))
    plan = plan_build(trt.__version__, fp16=fp16, have_typed_graph=typed_graph)

    logger = _capturing_logger(trt)
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(trt, plan))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"{onnx_path}: TensorRT {plan.version} cannot parse the graph: {errors}")

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # so layer precisions can be read back
    if not tf32:
        config.clear_flag(trt.BuilderFlag.TF32)
    if plan.fp16_flag:
        config.set_flag(trt.BuilderFlag.FP16)  # plan_build never asks for it on 11.x
    _add_profile(trt, builder, network, config, profile, onnx_path)
    cache_path = Path(timing_cache) if timing_cache else None
    cache = config.create_timing_cache(cache_path.read_bytes() if cache_path and cache_path.is_file() else b"")
    config.set_timing_cache(cache, ignore_mismatch=False)

    start = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    build_seconds = time.perf_counter() - start
    if serialized is None:
        raise ExportError(f"{onnx_path}: TensorRT {plan.version} failed to build an engine (see its log above)")
    overflow = [m for m in logger.messages if "layernorm" in m.lower() and "overflow" in m.lower()]
    if overflow and fp16:
        # TensorRT's own warning for the failure behind D-FINE#44/#98 (engines with no detections).
        raise ExportError(
            f"{onnx_path}: TensorRT {plan.version} warns that a LayerNorm runs in FP16 and may overflow "
            f"({overflow[0].strip()}). Export with opset >= 17 (native LayerNormalization) and the typed "
            "FP16 graph, whose normalisations stay FP32. Nothing was written."
        )
    if cache_path is not None:
        atomic_write_bytes(cache_path, bytes(memoryview(config.get_timing_cache().serialize())))

    engine = trt.Runtime(logger).deserialize_cuda_engine(bytes(memoryview(serialized)))
    io_dtypes = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        io_dtypes[name] = _dtype_name(engine.get_tensor_dtype(name))
    precisions = layer_precisions(
        engine.create_engine_inspector().get_engine_information(trt.LayerInformationFormat.JSON)
    )
    verify_engine(io_dtypes, precisions, fp16=fp16, source=str(onnx_path), version=plan.version)

    atomic_write_bytes(engine_path, bytes(memoryview(serialized)))
    return EngineInfo(
        file=engine_path.name, sha256=sha256_file(engine_path), source_graph=onnx_path.name,
        tensorrt_version=plan.version, gpu_name=gpu.name, compute_capability=gpu.compute_capability,
        profile={k: [list(s) for s in v] for k, v in profile.items()}, io_dtypes=io_dtypes,
        layer_precisions=precisions, build_seconds=round(build_seconds, 2),
        precision="fp16" if fp16 else "fp32",
        builder={
            "strongly_typed": plan.strongly_typed, "fp16_flag": plan.fp16_flag, "tf32": tf32,
            "workspace_mb": workspace_mb, "timing_cache": cache_path.name if cache_path else None,
        },
    )


def _capturing_logger(trt):
    """A TensorRT logger that prints warnings and errors and keeps every message for checks."""

    class CapturingLogger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity, msg):
            self.messages.append(str(msg))
            if int(severity) <= int(trt.ILogger.Severity.WARNING):
                print(f"[TensorRT] {msg}", file=sys.stderr)

    return CapturingLogger()


def _network_flags(trt, plan: BuildPlan) -> int:
    flags = 0
    names = trt.NetworkDefinitionCreationFlag
    if plan.explicit_batch_flag:
        flags |= 1 << int(names.EXPLICIT_BATCH)
    if plan.strongly_typed and hasattr(names, "STRONGLY_TYPED"):
        flags |= 1 << int(names.STRONGLY_TYPED)  # required on 10.x; accepted and ignored on 11.x
    return flags


def _add_profile(trt, builder, network, config, profile, onnx_path: Path) -> None:
    opt_profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        dynamic = any(int(d) < 0 for d in tensor.shape)
        if tensor.name not in profile:
            if dynamic:
                raise ExportError(
                    f"{onnx_path}: input '{tensor.name}' has a dynamic shape {tuple(tensor.shape)} but no "
                    f"optimisation profile; profiles were given for {sorted(profile)}"
                )
            continue
        lo, opt, hi = (tuple(int(d) for d in s) for s in profile[tensor.name])
        opt_profile.set_shape(tensor.name, lo, opt, hi)
    config.add_optimization_profile(opt_profile)


def verify_engine(
    io_dtypes: dict[str, str], precisions: dict[str, int], *, fp16: bool, source: str, version: str
) -> None:
    """Refuse an engine whose interface or precision is not what it will be called."""
    wrong = {n: d for n, d in io_dtypes.items() if n in EXPECTED_IO_DTYPES and d != EXPECTED_IO_DTYPES[n]}
    missing = [n for n in EXPECTED_IO_DTYPES if n not in io_dtypes]
    if wrong or missing:
        raise ExportError(
            f"{source}: the TensorRT {version} engine's I/O is not the D-FINE interface "
            f"(wrong dtypes {wrong}, missing {missing}; expected {EXPECTED_IO_DTYPES})"
        )
    if fp16 and precisions.get("fp16", 0) == 0:
        raise ExportError(
            f"{source}: TensorRT {version} built an engine with no FP16 layers ({precisions}), so it is "
            "not an FP16 engine. On TensorRT 11 build from the typed graph model.fp16.onnx; on 10.x "
            "use the typed graph with a strongly typed network. Nothing was written."
        )


# ----------------------------------------------------------------------------------------------
# `python -m dfine_deploy.export.tensorrt ARTIFACT_DIR`: build on the target from an artifact folder


def build_for_artifact(
    folder: str | Path, *, fp16: bool = True, workspace_mb: int = DEFAULT_WORKSPACE_MB, tf32: bool = False,
    batch: Sequence[int] | None = None,
) -> EngineInfo:
    folder = Path(folder)
    info = read_artifact(folder)
    graph_key = "fp16" if fp16 and "fp16" in info.graphs else "fp32"
    if graph_key not in info.graphs:
        raise ExportError(f"{folder}: the sidecar lists no {graph_key} graph; re-export with dfine-export")
    batch = tuple(batch or (info.batch_min, info.batch_opt, info.batch_max))
    profile = artifact_profile(batch, info.input_height, info.input_width)
    engine = build_engine(
        folder / info.graphs[graph_key].file, folder / ENGINE_NAME, profile=profile, fp16=fp16,
        typed_graph=graph_key == "fp16", workspace_mb=workspace_mb,
        timing_cache=folder / TIMING_CACHE_NAME, tf32=tf32,
    )
    info.engine = engine
    write_artifact(folder, info)
    return engine


def main(argv: Sequence[str] | None = None) -> int:
    from dfine_deploy.cli import friendly_errors

    @friendly_errors
    def run(args_list):
        parser = argparse.ArgumentParser(
            prog="python -m dfine_deploy.export.tensorrt",
            description="Build and verify a TensorRT engine for an artifact folder made by dfine-export.",
        )
        parser.add_argument("artifact", help="folder with model.json, model.onnx and model.fp16.onnx")
        parser.add_argument("--no-fp16", dest="fp16", action="store_false", help="build an FP32 engine")
        parser.add_argument("--workspace-mb", type=int, default=DEFAULT_WORKSPACE_MB)
        parser.add_argument("--tf32", action="store_true", help="allow TF32 (off by default)")
        parser.add_argument("--batch", type=int, nargs=3, metavar=("MIN", "OPT", "MAX"))
        args = parser.parse_args(args_list)
        engine = build_for_artifact(args.artifact, fp16=args.fp16, workspace_mb=args.workspace_mb,
                                    tf32=args.tf32, batch=args.batch)
        print(json.dumps(asdict(engine), indent=2))
        return 0

    return run(argv)


if __name__ == "__main__":
    raise SystemExit(main())
