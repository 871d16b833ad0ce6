"""The TensorRT build plan per version, and its trtexec line: pure, no torch and no `tensorrt` import.

    TensorRT 11.x   strongly typed only: build from the typed FP16 graph (model.fp16.onnx);
                    `BuilderFlag.FP16` no longer exists, and an FP32 graph would give an FP32 engine.
    TensorRT 10.x   typed graph -> STRONGLY_TYPED network, never with the FP16 flag (10.x's trtexec
                    drops --fp16 beside --stronglyTyped with an "Invalid usage" warning:
                    samples/common/sampleOptions.cpp); an FP32 graph -> the legacy FP16 builder flag.
    TensorRT 8.5/8.6 (JetPack 5, 6.0)  EXPLICIT_BATCH network + FP16 flag on the FP32 graph; the
                    parser turns INT64 graph inputs and outputs into INT32.

INT8 (10.x and 11.x only): explicit quantization from the Q/DQ graph made for TensorRT
(model.int8.trt.onnx: gather sampler, signed symmetric INT8), in a STRONGLY_TYPED network with no
precision builder flags: NVIDIA's explicit-quantization page pairs Q/DQ graphs with strong typing
and advises against precision flags (https://docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/quantized-types-explicit-quantization.html);
the binding data agrees (tests/fakes/tensorrt/surface: 11.x binds neither BuilderFlag.INT8 nor FP16).
8.5/8.6 would need the weak INT8 builder flag instead; that plan is not offered (`plan_build` refuses).

The Python build (`export.tensorrt`) and `export/jetson/build_engine.sh` (trtexec) follow the same plan.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from dfine_deploy.artifact import ENGINE_FILES
from dfine_deploy.backend_names import Precision
from dfine_deploy.errors import ExportError
from dfine_deploy.model.spec import EXPORT_SAMPLER

ENGINE_NAME = ENGINE_FILES[Precision.FP16]  # the FP16 engine: what a folder opens at by default
DEFAULT_WORKSPACE_MB = 4096
INT8_GRAPH = "int8-trt"  # model.json graphs key of the Q/DQ graph made for TensorRT
INDEX_TENSORS = ("orig_target_sizes", "labels")  # INT64 in our graphs; INT32 where a target needs it


def interface_dtypes(index_dtype: str = "INT64") -> dict[str, str]:
    """The D-FINE engine interface: TensorRT dtype name per tensor (INT32 index tensors on 8.x)."""
    dtypes = {
        "images": "FLOAT",
        "orig_target_sizes": "INT64",
        "labels": "INT64",
        "boxes": "FLOAT",
        "scores": "FLOAT",
    }
    return {name: index_dtype if name in INDEX_TENSORS else dtype for name, dtype in dtypes.items()}


def io_dtype_names(numpy_names: Mapping[str, str]) -> dict[str, str]:
    """A target profile's interface ({"labels": "int32", ...}) in TensorRT DataType names."""
    table = {"float32": "FLOAT", "float16": "HALF", "int32": "INT32", "int64": "INT64", "bool": "BOOL"}
    return {name: table[dtype] for name, dtype in numpy_names.items()}


def default_index_dtype(version: str) -> str:
    """TensorRT below 9.0 has no INT64 tensors: its ONNX parser makes INT64 graph I/O INT32."""
    return "INT32" if parse_version(version)[0] < 9 else "INT64"


def expected_interface(target_profile: Mapping[str, object], version: str) -> dict[str, str]:
    """The interface an engine built for an artifact must have: its `--target` profile's I/O
    dtypes where the export recorded them, else the D-FINE interface of that TensorRT version."""
    io = target_profile.get("io_dtypes")
    if isinstance(io, Mapping) and io:
        return io_dtype_names({str(k): str(v) for k, v in io.items()})
    return interface_dtypes(default_index_dtype(version))


INT64_IO = {
    "images": "float32",
    "orig_target_sizes": "int64",
    "labels": "int64",
    "boxes": "float32",
    "scores": "float32",
}
INT32_IO = {**INT64_IO, "orig_target_sizes": "int32", "labels": "int32"}
STRONGLY_TYPED, LAYER_CONSTRAINTS = "strongly-typed", "layer-constraints"  # TargetProfile.precision


@dataclass(frozen=True)
class TargetProfile:
    """One TensorRT release line: where it comes from, what its ONNX parser needs of a graph
    (`dfine-export --target`, export/targets.py checks a graph against it) and how its engines are
    built (`plan_build`). The one table of TensorRT versions: install, upgrade and rebuild hints
    (`install_hint`, `fp16_build_hint`) are written from it too."""

    name: str  # "trt8.5"
    tensorrt: str  # the version the operator table and flags are for
    first: tuple[int, int]  # (major, minor) of the line's first release: hints hold from it on
    aliases: tuple[str, ...]  # JetPack names that select this profile
    platforms: str  # where this TensorRT ships
    jetpack: str  # the JetPack releases that ship it (their python3-libnvinfer); "" for none
    pip: tuple[str, ...]  # PyPI distributions that publish it, by CUDA major (x86-64, SBSA)
    opset: int
    layernorm: str  # "native" (LayerNormalization node) or "decomposed" (ReduceMean/Sub/Pow/Sqrt/Div)
    io_dtypes: Mapping[str, str]  # graph and engine interface (numpy names)
    precision: str  # STRONGLY_TYPED (a typed graph sets the types) or LAYER_CONSTRAINTS (8.x)
    fp16_flag: bool  # BuilderFlag.FP16 (trtexec --fp16) exists: not on 11.x, strongly typed only
    engine_graph: str  # graphs key of what the FP16 engine is built from: fp16 (typed) or fp32
    trtexec_flags: tuple[str, ...]  # precision flags of this version's trtexec
    build_only_flag: str  # trtexec's "build, do not run" flag in this version
    operator_table: str  # export/trt_operators/trt<version>.json
    sampler: str = EXPORT_SAMPLER  # TensorRT mis-compiles GridSample in D-FINE: always gather
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["io_dtypes"] = dict(self.io_dtypes)
        return out

    @property
    def fp16_build(self) -> str:
        """How an FP16 engine is built on this line, in words (the fix a refused build names)."""
        if self.precision == LAYER_CONSTRAINTS:
            return (
                "from model.onnx with the FP16 flag and the FP32 layers model.json records held by "
                "precision constraints (export/jetson/build_engine.sh; 8.x has no strongly typed networks)"
            )
        if self.fp16_flag:
            return (
                "from the typed graph model.fp16.onnx in a strongly typed network, or from model.onnx with "
                "the FP16 flag (never both: with --stronglyTyped, trtexec drops --fp16 with a warning)"
            )
        return "from the typed graph model.fp16.onnx (11.x has strongly typed networks only, no FP16 flag)"

    def describe(self) -> str:
        build = (
            "strongly typed from model.fp16.onnx"
            if self.precision == STRONGLY_TYPED
            else "model.onnx with the FP16 flag and FP32 layers held by precision constraints"
        )
        return (
            f"--target {self.name}: TensorRT {self.tensorrt} ({self.platforms}); opset {self.opset}, "
            f"{self.layernorm} LayerNorm, {self.sampler} sampler, orig_target_sizes/labels "
            f"{self.io_dtypes['orig_target_sizes']}; engine {build}"
        )


_TYPED_FLAGS_10 = ("--stronglyTyped",)  # never with --fp16: trtexec drops it there with a warning
_CONSTRAINT_FLAGS = ("--fp16", "--precisionConstraints=obey")  # + --layerPrecisions/--layerOutputTypes
_JETPACK5 = "JetPack 5.1.x (Python 3.8: use export/jetson/build_engine.sh)"
_CUDA12, _CUDA12_13 = ("tensorrt-cu12",), ("tensorrt-cu12", "tensorrt-cu13")

# JetPack contents: NVIDIA's JetPack release notes; PyPI: the versions `pip index versions` lists for
# tensorrt-cu12 (10.0.1 .. 11.x) and tensorrt-cu13 (10.13.2.6 .. 11.x). JetPack 5's Python is 3.8,
# older than dfine-deploy's 3.10: there the engine is built with trtexec (build_engine.sh).
# Oldest first: `release_line` picks the newest line not newer than a version.
PROFILES: dict[str, TargetProfile] = {
    p.name: p
    for p in (
        TargetProfile(
            name="trt8.5",
            tensorrt="8.5",
            first=(8, 5),
            aliases=("jetpack5",),
            platforms="JetPack 5.1.x: Jetson AGX Xavier, Xavier NX, Orin on JP5",
            jetpack=_JETPACK5,
            pip=(),
            opset=16,
            layernorm="decomposed",
            io_dtypes=INT32_IO,
            precision=LAYER_CONSTRAINTS,
            fp16_flag=True,
            engine_graph=Precision.FP32,
            trtexec_flags=_CONSTRAINT_FLAGS,
            build_only_flag="--buildOnly",
            operator_table="8.5",
            notes=("8.5 has no LayerNormalization importer and no INT64 tensors",),
        ),
        TargetProfile(
            name="trt8.6",
            tensorrt="8.6",
            first=(8, 6),
            aliases=("jetpack6.0",),
            platforms="JetPack 6.0 (TensorRT 8.6.2)",
            jetpack="JetPack 6.0",
            pip=(),
            # the 8.5 graph: 8.6's LayerNormalization layer takes no node name, so no pin reaches it
            opset=16,
            layernorm="decomposed",
            io_dtypes=INT32_IO,
            precision=LAYER_CONSTRAINTS,
            fp16_flag=True,
            engine_graph=Precision.FP32,
            trtexec_flags=_CONSTRAINT_FLAGS,
            build_only_flag="--skipInference",
            operator_table="8.6",
            notes=(
                "8.6 has no INT64 tensors and no strongly typed networks",
                "8.6's LayerNormalization importer names no layer after its node (onnx-tensorrt "
                "release/8.6-GA; registered upstream from commit 73f629e, 2024), so FP32 pins by name "
                "cannot reach it: LayerNorm is decomposed as for 8.5",
            ),
        ),
        TargetProfile(
            name="trt10.3",
            tensorrt="10.3",
            first=(10, 0),
            aliases=("jetpack6",),
            platforms="JetPack 6.1/6.2; x86 with a CUDA 12 driver (e.g. T4)",
            jetpack="JetPack 6.1/6.2 (10.3)",
            pip=_CUDA12,
            opset=17,
            layernorm="native",
            io_dtypes=INT64_IO,
            precision=STRONGLY_TYPED,
            fp16_flag=True,
            engine_graph=Precision.FP16,
            trtexec_flags=_TYPED_FLAGS_10,
            build_only_flag="--skipInference",
            operator_table="10.3",
        ),
        # What NVIDIA ships with each release, from NVIDIA's release pages: DeepStream 9.0's release
        # README (github.com/NVIDIA/DeepStream README.md at v9.0.0, e91b3c5, "x86 dGPU" and "Jetson"
        # rows: JetPack 7.1 GA with CUDA 13.0 and TensorRT 10.13.x; x86 CUDA 13.1, TensorRT 10.14.x);
        # DeepStream 9.1's (README.md and build/BUILD.md at v9.1.0, 581889d: JetPack 7.2 GA with CUDA
        # 13.2 and TensorRT 10.16.x; x86 the same); JetPack 7.0 is Jetson Linux 38.2 and 7.1 Jetson
        # Linux 38.4 (developer.nvidia.com/embedded/jetpack/downloads/archive-7.0 and archive-7.1), one
        # CUDA 13.0 / TensorRT 10.13 line; JetPack 7.2 is the current developer.nvidia.com/embedded/jetpack
        # (the "JetPack 7.2 GA" DeepStream 9.1's deepstream_dockers/README.md links)
        TargetProfile(
            name="trt10.14",
            tensorrt="10.14",
            first=(10, 13),
            aliases=("jetpack7",),
            platforms="JetPack 7.0/7.1 (TensorRT 10.13) and 7.2 (10.16); DeepStream 9.0 (x86 10.14, "
            "Jetson JetPack 7.1) and 9.1 (10.16, JetPack 7.2)",
            jetpack="JetPack 7.0/7.1 (10.13), 7.2 (10.16)",
            pip=_CUDA12_13,
            opset=17,
            layernorm="native",
            io_dtypes=INT64_IO,
            precision=STRONGLY_TYPED,
            fp16_flag=True,
            engine_graph=Precision.FP16,
            trtexec_flags=_TYPED_FLAGS_10,
            build_only_flag="--skipInference",
            operator_table="10.14",
        ),
        TargetProfile(
            name="trt11",
            tensorrt="11.1",
            first=(11, 0),
            aliases=(),
            platforms="TensorRT 11.x (x86 or aarch64; PyPI builds for CUDA 12 and CUDA 13 drivers)",
            jetpack="",
            pip=_CUDA12_13,
            opset=17,
            layernorm="native",
            io_dtypes=INT64_IO,
            precision=STRONGLY_TYPED,
            fp16_flag=False,
            engine_graph=Precision.FP16,
            trtexec_flags=(),
            build_only_flag="--skipInference",
            operator_table="11.1",
            notes=("11.x is always strongly typed: trtexec has no --fp16 and no --stronglyTyped is needed",),
        ),
    )
}


def release_line(version: str) -> TargetProfile:
    """The release line a TensorRT version belongs to (the newest line not newer than it)."""
    key = parse_version(version)
    lines = [line for line in PROFILES.values() if line.first <= key]
    return lines[-1] if lines else next(iter(PROFILES.values()))


def install_hint(version: str | None = None) -> str:
    """How to install TensorRT's Python package: that exact version when it is known (an engine
    runs only on the TensorRT that built it), else the extras for each CUDA driver."""
    if version is None:
        return (
            "pip install -e '.[trt-cu12]' (TensorRT 10.x, a CUDA 12 driver) or "
            "'.[trt-cu13]' (TensorRT 11.x, a CUDA 13 driver r580+); on a Jetson, JetPack's own "
            "TensorRT: sudo apt install python3-libnvinfer"
        )
    line = release_line(version)
    release = ".".join(version.split(".")[:3])
    ways = [f"pip install '{name}=={release}.*'" for name in line.pip]
    if line.jetpack:
        ways.append(f"on a Jetson, {line.jetpack}: sudo apt install python3-libnvinfer")
    return f"TensorRT {release}: " + ("; or ".join(ways) or "see NVIDIA's TensorRT install guide")


def fp16_build_hint(version: str) -> str:
    """How an FP16 engine is built on this TensorRT version (the fix named by a refused build)."""
    return f"on TensorRT {version} an FP16 engine is built {release_line(version).fp16_build}"


@dataclass(frozen=True)
class BuildPlan:
    """How one TensorRT version must be driven for an FP16, INT8 (or FP32) engine."""

    version: str
    major: int
    strongly_typed: bool  # network created with STRONGLY_TYPED (11.x: always, flag ignored)
    fp16_flag: bool  # legacy BuilderFlag.FP16 (never on 11.x)
    explicit_batch_flag: bool  # 8.x only
    graph: str  # model.json graphs key: Precision.FP16, Precision.FP32 or INT8_GRAPH

    @property
    def precision(self) -> str:
        """What the engine is built as (its file: ENGINE_FILES): the typed graph's types, else the flag."""
        if self.graph == INT8_GRAPH:
            return Precision.INT8
        return Precision.FP16 if self.graph == Precision.FP16 or self.fp16_flag else Precision.FP32


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


def plan_build(
    version: str, *, fp16: bool = True, have_typed_graph: bool = True, int8: bool = False
) -> BuildPlan:
    """Choose network flags, builder flags and source graph for a TensorRT version (its line's row)."""
    major, _ = parse_version(version)
    line = release_line(version)
    typed = line.precision == STRONGLY_TYPED
    if int8:
        if not typed:
            raise ExportError(
                f"INT8 for TensorRT {version}: INT8 engines are built here only by explicit "
                "quantization in a strongly typed network (TensorRT 10 and newer; 8.x would need the "
                "INT8 builder flag, not supported); use --target trt10.3 (JetPack 6.1/6.2) or newer, "
                "or drop --int8 for an FP16 engine"
            )
        return BuildPlan(version, major, True, False, False, INT8_GRAPH)
    if parse_version(version) < line.first:  # older than the oldest line
        raise ExportError(
            f"TensorRT {version} is too old: the oldest export target is trt8.5 (JetPack 5.1, "
            "dfine-export --target jetpack5); on Jetson, upgrade to JetPack 5.1 or newer."
        )
    if typed and not line.fp16_flag:  # strongly typed networks only
        if fp16 and not have_typed_graph:
            raise ExportError(
                f"TensorRT {version} builds strongly typed networks only and has no FP16 builder flag: "
                "an FP16 engine needs the typed graph model.fp16.onnx. Export it with --fp16 "
                "(the default) or build an FP32 engine with --no-fp16."
            )
        return BuildPlan(version, major, True, False, False, Precision.FP16 if fp16 else Precision.FP32)
    if typed and fp16 and have_typed_graph:
        return BuildPlan(version, major, True, False, False, Precision.FP16)
    # an FP32 graph and the FP16 flag; 8.x networks also need EXPLICIT_BATCH (JetPack 5 recipe)
    return BuildPlan(version, major, False, fp16, not typed, Precision.FP32)


def trtexec_command(
    onnx_file: str,
    engine_file: str,
    plan: BuildPlan,
    profile: Mapping[str, Sequence[Sequence[int]]],
    *,
    workspace_mb: int = DEFAULT_WORKSPACE_MB,
    timing_cache: str = "timing.cache",
    tf32: bool = False,
) -> list[str]:
    """The trtexec line equivalent to `build_engine` for a version (what build_engine.sh runs)."""

    def shapes(index: int) -> str:
        return ",".join(f"{name}:{'x'.join(str(d) for d in dims[index])}" for name, dims in profile.items())

    cmd = [
        "trtexec",
        f"--onnx={onnx_file}",
        f"--saveEngine={engine_file}",
        f"--minShapes={shapes(0)}",
        f"--optShapes={shapes(1)}",
        f"--maxShapes={shapes(2)}",
        f"--memPoolSize=workspace:{workspace_mb}M",
        f"--timingCacheFile={timing_cache}",
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


TIMING_CACHE_PATTERN = "timing-trt*.cache"  # every name timing_cache_name makes


def timing_cache_name(tensorrt_version: str, gpu: GpuInfo) -> str:
    """`timing-trt10.3.0-orin-sm8.7.cache`: tactics timed on one TensorRT and GPU serve only those."""
    slug = re.sub(r"[^a-z0-9]+", "-", gpu.name.lower()).strip("-") or "gpu"
    return f"timing-trt{tensorrt_version}-{slug}-sm{gpu.compute_capability}.cache"
