"""TensorRT engines from the exported graphs with the Python API, verified after the build.

The version decides the network and builder flags and the source graph (`runtime.tensorrt_plan`);
the engine's interface and precision are checked before anything is written
(`export.tensorrt_verify`). Every dynamic input gets an optimisation profile (images *and*
orig_target_sizes), TF32 is off unless asked for, and the timing cache is keyed by TensorRT
version, GPU and compute capability: a foreign or unreadable cache is reported and rebuilt, never
fatal.

Run on the target: `python -m dfine_deploy.export.tensorrt ARTIFACT_DIR` (needs the `tensorrt`
Python package and a GPU) or `export/jetson/build_engine.sh ARTIFACT_DIR` (trtexec).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from dfine_deploy.artifact import ENGINE_FILES, EngineInfo, read_artifact, verify_file, write_artifact
from dfine_deploy.backend_names import Precision
from dfine_deploy.cli import friendly_errors
from dfine_deploy.errors import ExportError, MissingDependency
from dfine_deploy.export.tensorrt_verify import check_engine, dtype_name, network_precisions
from dfine_deploy.files import atomic_write_bytes, sha256_file
from dfine_deploy.runtime.tensorrt_plan import (
    DEFAULT_WORKSPACE_MB,
    BuildPlan,
    GpuInfo,
    artifact_profile,
    expected_interface,
    plan_build,
    timing_cache_name,
    trtexec_command,
)

if TYPE_CHECKING:  # checked against NVIDIA's tensorrt-stubs (tests/export/test_tensorrt_types.py)
    import tensorrt as trt_types

_BUILD_HINT = (
    "Build the engine on the target machine instead: copy the artifact folder there and run "
    "`bash export/jetson/build_engine.sh ARTIFACT_DIR` (trtexec; any JetPack or x86 TensorRT) or "
    "`python -m dfine_deploy.export.tensorrt ARTIFACT_DIR` (TensorRT Python package), e.g.\n  {command}"
)


def import_tensorrt(command_hint: str = "") -> ModuleType:
    """NVIDIA's `tensorrt` module, or an ExportError that says how to build the engine elsewhere."""
    from dfine_deploy.runtime.tensorrt_backend import load_tensorrt

    try:
        return load_tensorrt("Building a TensorRT engine")
    except MissingDependency as exc:  # also the pip wheel without NVIDIA's libraries
        raise ExportError(
            f"--trt: the TensorRT Python package cannot be imported here ({exc}); it needs an NVIDIA GPU "
            "with its driver too. The ONNX graphs were checked and can still be written without --trt. "
            + _BUILD_HINT.format(command=command_hint or "trtexec --onnx=model.fp16.onnx ...")
        ) from exc


def gpu_info(device_index: int = 0) -> GpuInfo | None:
    """Name and compute capability of a CUDA device, or None when no GPU is visible.

    torch when it is installed; otherwise cuda-python's runtime (`cuda.bindings.runtime`, or
    `cuda.cudart` before cuda-python 12.6.1).
    """
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(device_index)
            return GpuInfo(torch.cuda.get_device_name(device_index), f"{major}.{minor}")
    except ImportError:
        pass
    from dfine_deploy.runtime.cuda_memory import import_cudart

    try:
        cudart = import_cudart()
    except MissingDependency:
        return None
    err, count = cudart.cudaGetDeviceCount()
    if int(err) != 0 or count <= device_index:
        return None
    err, props = cudart.cudaGetDeviceProperties(device_index)
    if int(err) != 0:
        return None
    name = (
        props.name.decode(errors="replace").rstrip("\x00")
        if isinstance(props.name, bytes)
        else str(props.name)
    )
    return GpuInfo(name, f"{props.major}.{props.minor}")


# ----------------------------------------------------------------------------------------------
# The build


def build_engine(
    onnx_path: str | Path,
    engine_path: str | Path,
    *,
    profile: Mapping[str, Sequence[Sequence[int]]],
    fp16: bool = True,
    typed_graph: bool = True,
    workspace_mb: int = DEFAULT_WORKSPACE_MB,
    timing_cache_dir: str | Path | None = None,
    tf32: bool = False,
    expected_io: Mapping[str, str] | None = None,
    fp32_layers: Mapping[str, int] | Sequence[str] = (),
    other_nodes: Collection[str] = (),
    int8: bool = False,
) -> EngineInfo:
    """Build, verify and atomically write an engine; returns its sidecar entry.

    `expected_io` is the interface the engine must have (TensorRT dtype names); by default the
    D-FINE interface with INT64 index tensors, INT32 below TensorRT 9 (`io_dtype_names` converts
    a target profile's numpy names). `fp32_layers` names the ONNX nodes held in FP32 in a weakly
    typed FP16 build (the FP32 islands, e.g. a decomposed LayerNorm on 8.5; see
    `targets.constrained_layers`): their layers get FP32 precision and output types and the builder
    obeys them (`OBEY_PRECISION_CONSTRAINTS`); `other_nodes` are the graph's other nodes whose names
    look like further layers of those (`targets.lookalike_nodes`), never pinned. Strongly typed
    builds carry their islands in the graph's own types. `int8` builds by explicit quantization
    from a Q/DQ graph (TensorRT 10+, strongly typed, no precision flags; see `tensorrt_plan`).
    """
    onnx_path, engine_path = Path(onnx_path), Path(engine_path)
    hint_plan = BuildPlan("11", 11, True, False, False, Precision.FP16)
    hint = " ".join(trtexec_command(onnx_path.name, engine_path.name, hint_plan, profile))
    import_tensorrt(hint)
    import tensorrt as trt

    gpu = gpu_info()
    if gpu is None:
        raise ExportError(
            "--trt: TensorRT is installed but no CUDA GPU is visible. " + _BUILD_HINT.format(command=hint)
        )
    plan = plan_build(trt.__version__, fp16=fp16, have_typed_graph=typed_graph, int8=int8)
    expected = dict(expected_io) if expected_io is not None else expected_interface({}, plan.version)

    logger = _capturing_logger()
    builder = trt.Builder(logger)
    network = builder.create_network(_network_flags(plan))
    parser = trt.OnnxParser(network, logger)
    if not parser.parse(onnx_path.read_bytes()):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise ExportError(f"{onnx_path}: TensorRT {plan.version} cannot parse the graph: {errors}")
    before = network_precisions(network)
    if int8 and before.get("int8/fp8", 0) == 0:
        raise ExportError(
            f"{onnx_path}: the strongly typed TensorRT {plan.version} network has no INT8 tensors "
            f"({before}): the graph has no Q/DQ layers, so its engine could not be INT8. Build from "
            "model.int8.trt.onnx (dfine-export --int8 --data DIR --target trt10.3 or newer). "
            "Nothing was built."
        )
    if fp16 and not int8 and plan.strongly_typed and before.get(Precision.FP16, 0) == 0:
        raise ExportError(
            f"{onnx_path}: the strongly typed TensorRT {plan.version} network has no FP16 tensors "
            f"({before}), so its engine could not be FP16. Build from the typed graph model.fp16.onnx, "
            "or an FP32 engine with --no-fp16. Nothing was built."
        )

    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_mb << 20)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # so tensor precisions can be read back
    if not tf32:
        config.clear_flag(trt.BuilderFlag.TF32)
    if plan.fp16_flag:
        config.set_flag(trt.BuilderFlag.FP16)  # plan_build never asks for it on 11.x
        if fp32_layers and _hold_in_fp32(network, fp32_layers, other_nodes):
            config.set_flag(trt.BuilderFlag.OBEY_PRECISION_CONSTRAINTS)
    _add_profile(builder, network, config, profile, onnx_path)
    cache_path = Path(timing_cache_dir) / timing_cache_name(plan.version, gpu) if timing_cache_dir else None
    cache_status = _use_timing_cache(config, cache_path)

    start = time.perf_counter()
    serialized = builder.build_serialized_network(network, config)
    build_seconds = time.perf_counter() - start
    if serialized is None:
        raise ExportError(
            f"{onnx_path}: TensorRT {plan.version} failed to build an engine (see its log above)"
        )
    overflow = [m for m in logger.messages if "layernorm" in m.lower() and "overflow" in m.lower()]
    if overflow and (fp16 or int8):
        # TensorRT's own warning for the failure behind D-FINE#44/#98 (engines with no detections).
        raise ExportError(
            f"{onnx_path}: TensorRT {plan.version} warns that a LayerNorm runs in FP16 and may overflow "
            f"({overflow[0].strip()}). Export with opset >= 17 (native LayerNormalization) and the typed "
            "FP16 graph, whose normalisations stay FP32. Nothing was written."
        )

    engine = trt.Runtime(logger).deserialize_cuda_engine(bytes(memoryview(serialized)))
    if engine is None:
        raise ExportError(f"{onnx_path}: TensorRT {plan.version} cannot load the engine it just built")
    io_dtypes = {}
    for i in range(engine.num_io_tensors):
        name = engine.get_tensor_name(i)
        io_dtypes[name] = dtype_name(engine.get_tensor_dtype(name))
    precision = Precision.INT8 if int8 else (Precision.FP16 if fp16 else Precision.FP32)
    inspector = engine.create_engine_inspector()
    counts, verdict = check_engine(
        io_dtypes,
        inspector.get_engine_information(trt.LayerInformationFormat.JSON),
        precision=precision,
        strongly_typed=plan.strongly_typed,
        network=before,
        expected_io=expected,
        source=str(onnx_path),
        version=plan.version,
        fp32_layers=fp32_layers if plan.fp16_flag and not plan.strongly_typed else (),
    )

    atomic_write_bytes(engine_path, bytes(memoryview(serialized)))
    if cache_path is not None:
        written = config.get_timing_cache()
        if written is not None:
            atomic_write_bytes(cache_path, bytes(memoryview(written.serialize())))
    return EngineInfo(
        file=engine_path.name,
        sha256=sha256_file(engine_path),
        source_graph=onnx_path.name,
        tensorrt_version=plan.version,
        gpu_name=gpu.name,
        compute_capability=gpu.compute_capability,
        profile={k: [list(s) for s in v] for k, v in profile.items()},
        io_dtypes=io_dtypes,
        layer_precisions=counts,
        build_seconds=round(build_seconds, 2),
        precision=precision,
        verification=verdict,
        builder={
            "strongly_typed": plan.strongly_typed,
            "fp16_flag": plan.fp16_flag,
            "int8_flag": False,  # INT8 comes from the graph's Q/DQ layers (explicit quantization)
            "tf32": tf32,
            "workspace_mb": workspace_mb,
            "timing_cache": cache_path.name if cache_path else None,
            "timing_cache_status": cache_status,
        },
    )


def _hold_in_fp32(
    network: trt_types.INetworkDefinition,
    nodes: Mapping[str, int] | Sequence[str],
    other_nodes: Collection[str],
) -> int:
    """Pin the float layers of the named ONNX nodes to FP32 (precision and output types); how many.

    A layer with an integer output (a shape computation the importer made for the node) is left
    to TensorRT: FP32 forced on it would fail an OBEY_PRECISION_CONSTRAINTS build; so is the own
    layer of another node (`other_nodes`) whose name only looks like one of theirs.
    """
    import tensorrt as trt

    from dfine_deploy.export.targets import is_constrained_layer

    held = 0
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        kinds = [dtype_name(layer.get_output(j).dtype) for j in range(layer.num_outputs)]
        if not kinds or any(kind not in ("FLOAT", "HALF") for kind in kinds):
            continue
        if is_constrained_layer(layer.name, nodes, other_nodes):
            layer.precision = trt.DataType.FLOAT
            for j in range(layer.num_outputs):
                layer.set_output_type(j, trt.DataType.FLOAT)
            held += 1
    return held


def _use_timing_cache(config: trt_types.IBuilderConfig, cache_path: Path | None) -> str:
    """Attach the keyed timing cache; a foreign or unreadable one is reported and rebuilt, never fatal.

    `create_timing_cache` returns None for a blob it cannot read, and `set_timing_cache(...,
    ignore_mismatch=False)` returns False for a cache from another TensorRT version or device.
    """
    if cache_path is None:
        return "not used"
    blob = cache_path.read_bytes() if cache_path.is_file() else b""
    status = "reused" if blob else "new"
    try:
        cache = config.create_timing_cache(blob)
    except (RuntimeError, TypeError, ValueError):
        cache = None
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        why = "cannot be read" if cache is None else "was made by another TensorRT version or GPU"
        status = f"rebuilt: {cache_path.name} {why}"
        print(
            f"[TensorRT] warning: timing cache {cache_path} {why}; ignoring it, re-timing every tactic "
            "and writing a new one",
            file=sys.stderr,
        )
        fresh = config.create_timing_cache(b"")
        if fresh is None or not config.set_timing_cache(fresh, ignore_mismatch=False):
            print(
                "[TensorRT] warning: TensorRT refused an empty timing cache too; building without one",
                file=sys.stderr,
            )
            status += "; built without a cache"
    return status


def _capturing_logger() -> Any:
    """A TensorRT logger that prints warnings and errors and keeps every message for checks."""
    import tensorrt as trt

    class CapturingLogger(trt.ILogger):
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity: trt.ILogger.Severity, msg: str) -> None:
            self.messages.append(str(msg))
            if int(severity) <= int(trt.ILogger.Severity.WARNING):
                print(f"[TensorRT] {msg}", file=sys.stderr)

    return CapturingLogger()


def _network_flags(plan: BuildPlan) -> int:
    import tensorrt as trt

    flags = 0
    names = trt.NetworkDefinitionCreationFlag
    if plan.explicit_batch_flag:
        flags |= 1 << int(names.EXPLICIT_BATCH)  # 8.x only (deprecated in 10, gone in 11)
    if plan.strongly_typed and hasattr(names, "STRONGLY_TYPED"):
        flags |= 1 << int(names.STRONGLY_TYPED)  # required on 10.x; accepted and ignored on 11.x
    return flags


def _add_profile(
    builder: trt_types.Builder,
    network: trt_types.INetworkDefinition,
    config: trt_types.IBuilderConfig,
    profile: Mapping[str, Sequence[Sequence[int]]],
    onnx_path: Path,
) -> None:
    import tensorrt as trt

    opt_profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        tensor = network.get_input(i)
        shape = [int(tensor.shape[k]) for k in range(len(tensor.shape))]
        if tensor.name not in profile:
            if any(d < 0 for d in shape):
                raise ExportError(
                    f"{onnx_path}: input '{tensor.name}' has a dynamic shape {tuple(shape)} but no "
                    f"optimisation profile; profiles were given for {sorted(profile)}"
                )
            continue
        lo, opt, hi = (trt.Dims([int(d) for d in s]) for s in profile[tensor.name])
        opt_profile.set_shape(tensor.name, lo, opt, hi)
    config.add_optimization_profile(opt_profile)


# ----------------------------------------------------------------------------------------------
# `python -m dfine_deploy.export.tensorrt ARTIFACT_DIR`: build on the target from an artifact folder


def build_for_artifact(
    folder: str | Path,
    *,
    fp16: bool = True,
    workspace_mb: int = DEFAULT_WORKSPACE_MB,
    tf32: bool = False,
    batch: Sequence[int] | None = None,
    int8: bool = False,
) -> EngineInfo:
    """Build the engine of an artifact folder with the installed TensorRT, as its sidecar says.

    The graph follows the installed version's plan (8.x: model.onnx with the FP16 flag; 10.x/11.x:
    model.fp16.onnx strongly typed). A `--target` export (model.json `target`) also fixes the
    interface the engine must have (INT32 index tensors on 8.x) and the FP32 layers held by
    precision constraints. `int8`: the Q/DQ graph the sidecar names for TensorRT (`backend_graphs`).
    The engine gets its precision's own file and record (ENGINE_FILES: model.engine for FP16,
    model.int8.engine for INT8, model.fp32.engine for FP32); the other precisions' are left as they are.
    """
    folder = Path(folder)
    info = read_artifact(folder)
    if batch is not None and not (len(batch) == 3 and 1 <= batch[0] <= batch[1] <= batch[2]):
        raise ExportError(
            f"--batch {' '.join(map(str, batch))}: need 1 <= MIN <= OPT <= MAX, e.g. --batch 1 1 8"
        )
    if workspace_mb < 1:
        raise ExportError(f"--workspace-mb {workspace_mb}: give the builder at least 1 MB")
    trt = import_tensorrt(f"bash export/jetson/build_engine.sh {folder}")
    plan = plan_build(trt.__version__, fp16=fp16, have_typed_graph=Precision.FP16 in info.graphs, int8=int8)
    if plan.graph not in info.graphs:
        how = "dfine-export --int8 --data DIR --target trt10.3 (or newer)" if int8 else "dfine-export"
        raise ExportError(f"{folder}: the sidecar lists no {plan.graph} graph; re-export with {how}")
    expected_io = expected_interface(info.target.get("profile") or {}, plan.version)
    verify_file(folder, info, info.graphs[plan.graph].file)
    batch = tuple(batch or (info.batch_min, info.batch_opt, info.batch_max))
    profile = artifact_profile(batch, info.input_height, info.input_width)
    engine = build_engine(
        folder / info.graphs[plan.graph].file,
        folder / ENGINE_FILES[Precision(plan.precision)],
        profile=profile,
        fp16=fp16,
        typed_graph=plan.graph == Precision.FP16,
        workspace_mb=workspace_mb,
        timing_cache_dir=folder,
        tf32=tf32,
        expected_io=expected_io,
        fp32_layers={} if int8 else info.target.get("fp32_layers") or {},
        other_nodes=info.target.get("fp32_lookalike_nodes") or (),
        int8=int8,
    )
    record_engine(folder, engine)
    return engine


def record_engine(folder: str | Path, engine: EngineInfo) -> None:
    """Write `engine` as the artifact's record of its precision's engine: the one writer of engine
    records, for the Python build and for trtexec's (`tensorrt_record`). The sidecar is re-read, so
    nothing else in it changes, the other precisions' engines included."""
    expected = ENGINE_FILES[Precision(engine.precision)]
    if engine.file != expected:  # a caller's slip: each precision's engine has one name
        raise ExportError(f"a {engine.precision} engine is recorded as {expected}, not {engine.file}")
    info = read_artifact(folder)
    info.engines[engine.precision] = engine
    write_artifact(folder, info)


@friendly_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dfine_deploy.export.tensorrt",
        description="Build and verify a TensorRT engine for an artifact folder made by dfine-export.",
    )
    parser.add_argument("artifact", help="folder with model.json, model.onnx and model.fp16.onnx")
    parser.add_argument("--no-fp16", dest="fp16", action="store_false", help="build an FP32 engine")
    parser.add_argument(
        "--int8",
        action="store_true",
        help="INT8 engine from the Q/DQ graph made for TensorRT (model.int8.trt.onnx; 10.x/11.x)",
    )
    parser.add_argument("--workspace-mb", type=int, default=DEFAULT_WORKSPACE_MB)
    parser.add_argument("--tf32", action="store_true", help="allow TF32 (off by default)")
    parser.add_argument("--batch", type=int, nargs=3, metavar=("MIN", "OPT", "MAX"))
    args = parser.parse_args(argv)
    engine = build_for_artifact(
        args.artifact,
        fp16=args.fp16,
        workspace_mb=args.workspace_mb,
        tf32=args.tf32,
        batch=args.batch,
        int8=args.int8,
    )
    print(json.dumps(asdict(engine), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
