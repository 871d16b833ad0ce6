"""FAKE for tests; models the documented 10.x and 11.x API surface; no real TensorRT.

Only what dfine_deploy.export.tensorrt touches exists, under NVIDIA's documented names, with the
documented version differences:

* 11.x: `BuilderFlag` has no FP16/INT8/BF16/... members (removed, not deprecated); every network
  is strongly typed (`NetworkDefinitionCreationFlag.STRONGLY_TYPED` still exists and is ignored;
  `EXPLICIT_BATCH` is gone); the inspector JSON writes "DataType" separately from "Format".
* 10.x: `BuilderFlag.FP16` exists; networks are weakly typed unless created STRONGLY_TYPED, and
  setting FP16 on a strongly typed network fails the build; inspector JSON uses "Format/Datatype".

"Building" does no optimisation: the plan is JSON describing the engine TensorRT would make
(I/O dtypes from the ONNX graph, one layer per ONNX node, each layer's precision from the graph's
own types when strongly typed, else FP16 when the FP16 flag is set, else FP32). Use
`set_version("10.13.0")` / `set_version("11.4.0")` before use; `LAST_BUILD` records what the last
build saw so tests can assert on flags, profiles and cache use.
"""

from __future__ import annotations

import enum
import json
from typing import Any

__version__ = "11.4.0.106"
LAST_BUILD: dict[str, Any] = {}

# ONNX TensorProto element type -> TensorRT DataType name
_ONNX_TO_TRT = {1: "FLOAT", 10: "HALF", 6: "INT32", 7: "INT64", 9: "BOOL", 3: "INT8", 16: "BF16"}

DataType = enum.IntEnum("DataType", ["FLOAT", "HALF", "INT8", "INT32", "BOOL", "UINT8", "FP8", "BF16", "INT64"], start=0)
TensorIOMode = enum.IntEnum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"], start=0)
MemoryPoolType = enum.IntEnum("MemoryPoolType", ["WORKSPACE", "DLA_MANAGED_SRAM", "DLA_LOCAL_DRAM", "DLA_GLOBAL_DRAM", "TACTIC_DRAM"], start=0)
ProfilingVerbosity = enum.IntEnum("ProfilingVerbosity", ["LAYER_NAMES_ONLY", "NONE", "DETAILED"], start=0)
LayerInformationFormat = enum.IntEnum("LayerInformationFormat", ["ONELINE", "JSON"], start=0)
BuilderFlag: Any = None
NetworkDefinitionCreationFlag: Any = None


def set_version(version: str) -> None:
    """Switch the modelled API between the 10.x and 11.x surfaces."""
    global __version__, BuilderFlag, NetworkDefinitionCreationFlag
    __version__ = version
    major = int(version.split(".")[0])
    if major >= 11:
        BuilderFlag = enum.IntEnum("BuilderFlag", ["GPU_FALLBACK", "REFIT", "DISABLE_TIMING_CACHE", "TF32",
                                                   "SPARSE_WEIGHTS", "SAFETY_SCOPE", "VERSION_COMPATIBLE"], start=0)
        NetworkDefinitionCreationFlag = enum.IntEnum(
            "NetworkDefinitionCreationFlag", ["STRONGLY_TYPED", "PREFER_AOT_PYTHON_PLUGINS", "PREFER_JIT_PYTHON_PLUGINS"], start=0)
    else:
        BuilderFlag = enum.IntEnum("BuilderFlag", ["FP16", "INT8", "DEBUG", "GPU_FALLBACK", "REFIT",
                                                   "DISABLE_TIMING_CACHE", "TF32", "SPARSE_WEIGHTS", "BF16",
                                                   "FP8", "VERSION_COMPATIBLE", "DIRECT_IO"], start=0)
        NetworkDefinitionCreationFlag = enum.IntEnum(
            "NetworkDefinitionCreationFlag", ["EXPLICIT_BATCH", "STRONGLY_TYPED"], start=0)


set_version(__version__)


def _major() -> int:
    return int(__version__.split(".")[0])


class ILogger:
    """Base class of custom loggers: subclasses call ILogger.__init__ and implement log()."""

    Severity = enum.IntEnum("Severity", ["INTERNAL_ERROR", "ERROR", "WARNING", "INFO", "VERBOSE"], start=0)

    def __init__(self):
        pass

    def log(self, severity, msg: str) -> None:
        raise NotImplementedError


class Logger(ILogger):
    INTERNAL_ERROR, ERROR, WARNING, INFO, VERBOSE = ILogger.Severity

    def __init__(self, min_severity=ILogger.Severity.WARNING):
        super().__init__()
        self.min_severity = min_severity
        self.messages: list[str] = []

    def log(self, severity, msg: str) -> None:
        self.messages.append(msg)


class ITensor:
    def __init__(self, name: str, shape: tuple[int, ...], dtype: DataType):
        self.name, self.shape, self.dtype = name, shape, dtype


class INetworkDefinition:
    def __init__(self, flags: int):
        self.flags = flags
        self._inputs: list[ITensor] = []
        self._outputs: list[ITensor] = []
        self.layers: list[tuple[str, str]] = []  # (name, dtype name of its first output)

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, i: int) -> ITensor:
        return self._inputs[i]

    def get_output(self, i: int) -> ITensor:
        return self._outputs[i]

    @property
    def strongly_typed(self) -> bool:
        if _major() >= 11:
            return True
        return bool(self.flags & (1 << int(NetworkDefinitionCreationFlag.STRONGLY_TYPED)))


class OnnxParser:
    """Parses with the real `onnx` package, to learn I/O names, shapes, dtypes and node types."""

    def __init__(self, network: INetworkDefinition, logger: Logger):
        self.network, self.logger = network, logger
        self._errors: list[str] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, i: int) -> str:
        return self._errors[i]

    def parse(self, model: bytes) -> bool:
        import onnx

        try:
            proto = onnx.load_from_string(model)
        except Exception as exc:  # noqa: BLE001 - the parser reports, never raises
            self._errors.append(f"ModelImporter: failed to parse ONNX: {exc}")
            return False
        shapes = onnx.shape_inference.infer_shapes(proto)
        types = {v.name: v.type.tensor_type.elem_type
                 for v in list(shapes.graph.value_info) + list(shapes.graph.input) + list(shapes.graph.output)}
        inits = {i.name for i in proto.graph.initializer}
        for vi in proto.graph.input:
            if vi.name in inits:
                continue
            dims = tuple(d.dim_value if d.dim_value else -1 for d in vi.type.tensor_type.shape.dim)
            self.network._inputs.append(ITensor(vi.name, dims, DataType[_ONNX_TO_TRT[vi.type.tensor_type.elem_type]]))
        for vi in proto.graph.output:
            dims = tuple(d.dim_value if d.dim_value else -1 for d in vi.type.tensor_type.shape.dim)
            self.network._outputs.append(ITensor(vi.name, dims, DataType[_ONNX_TO_TRT[vi.type.tensor_type.elem_type]]))
        for node in proto.graph.node:
            elem = types.get(node.output[0], 1)
            self.network.layers.append((node.name or node.op_type, _ONNX_TO_TRT.get(elem, "FLOAT")))
        return True


class IOptimizationProfile:
    def __init__(self):
        self.shapes: dict[str, tuple] = {}

    def set_shape(self, name: str, min: tuple, opt: tuple, max: tuple) -> None:
        if not (len(min) == len(opt) == len(max)) or any(a > b for a, b in zip(min, opt)) or any(
            a > b for a, b in zip(opt, max)
        ):
            raise ValueError(f"invalid profile for {name}: {min} {opt} {max}")
        self.shapes[name] = (tuple(min), tuple(opt), tuple(max))

    def get_shape(self, name: str):
        return self.shapes[name]


class ITimingCache:
    def __init__(self, entries: dict[str, str]):
        self.entries = dict(entries)

    def serialize(self) -> bytes:
        return b"FAKE-TRT-CACHE" + json.dumps({"version": __version__, "entries": self.entries}).encode()

    def combine(self, other: ITimingCache, ignore_mismatch: bool) -> bool:
        self.entries.update(other.entries)
        return True

    def reset(self) -> bool:
        self.entries.clear()
        return True


class IBuilderConfig:
    def __init__(self):
        self.flags: set[str] = {"TF32"}  # TF32 is on by default in 10.x and 11.x
        self.memory_limits: dict[str, int] = {}
        self.profiles: list[IOptimizationProfile] = []
        self.profiling_verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY
        self._cache: ITimingCache | None = None

    def set_flag(self, flag) -> None:
        self.flags.add(BuilderFlag(flag).name)

    def clear_flag(self, flag) -> None:
        self.flags.discard(BuilderFlag(flag).name)

    def get_flag(self, flag) -> bool:
        return BuilderFlag(flag).name in self.flags

    def set_memory_pool_limit(self, pool, pool_size: int) -> None:
        self.memory_limits[MemoryPoolType(pool).name] = int(pool_size)

    def get_memory_pool_limit(self, pool) -> int:
        return self.memory_limits.get(MemoryPoolType(pool).name, 0)

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self.profiles.append(profile)
        return len(self.profiles) - 1

    def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache:
        data = bytes(serialized_timing_cache)
        if not data:
            return ITimingCache({})
        if not data.startswith(b"FAKE-TRT-CACHE"):
            raise RuntimeError("timing cache: not a serialized cache")
        return ITimingCache(json.loads(data[len(b"FAKE-TRT-CACHE"):])["entries"])

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        self._cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache | None:
        return self._cache


class IHostMemory(bytes):
    """Serialized plan; like TensorRT's, it supports the buffer protocol (here by being bytes)."""

    @property
    def nbytes(self) -> int:
        return len(self)


class Builder:
    def __init__(self, logger: Logger):
        self.logger = logger
        if _major() < 11:
            self.platform_has_fast_fp16 = True

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        return INetworkDefinition(flags)

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> IHostMemory | None:
        LAST_BUILD.clear()
        LAST_BUILD.update(network_flags=network.flags, strongly_typed=network.strongly_typed,
                          config_flags=set(config.flags), memory_limits=dict(config.memory_limits),
                          profiles=[dict(p.shapes) for p in config.profiles], cache_hits=0)
        if network.strongly_typed and "FP16" in config.flags:
            self.logger.log(ILogger.Severity.ERROR, "FP16 builder flag is not allowed on a strongly typed network")
            return None
        for tensor in network._inputs:
            if any(d < 0 for d in tensor.shape) and not any(tensor.name in p.shapes for p in config.profiles):
                self.logger.log(ILogger.Severity.ERROR, f"{tensor.name}: dynamic input without optimization profile")
                return None
        layers = []
        for name, dtype in network.layers:
            if not network.strongly_typed:  # weak typing: the builder chooses
                dtype = "HALF" if ("FP16" in config.flags and dtype == "FLOAT") else dtype
            layers.append((name, dtype))
        if any(dtype == "HALF" and ("ReduceMean" in name or "/Pow" in name) for name, dtype in layers):
            self.logger.log(ILogger.Severity.WARNING, "Running layernorm after self-attention with FP16 Reduce or "
                            "Pow may cause overflow. Forcing Reduce or Pow Layers in FP32 precision, or exporting "
                            "the model to use INormalizationLayer (available with ONNX opset >= 17) can help.")
        cache = config.get_timing_cache()
        if cache is not None:
            for name, _ in layers:
                key = f"{name}@{__version__}"
                LAST_BUILD["cache_hits"] += key in cache.entries
                cache.entries[key] = "tactic-0"
        plan = {
            "version": __version__,
            "io": [(t.name, "INPUT", t.dtype.name, t.shape) for t in network._inputs]
            + [(t.name, "OUTPUT", t.dtype.name, t.shape) for t in network._outputs],
            "layers": layers,
            "verbosity": int(config.profiling_verbosity),
            "profile": {k: v for p in config.profiles for k, v in p.shapes.items()},
        }
        return IHostMemory(json.dumps(plan).encode())


class EngineInspector:
    def __init__(self, engine: ICudaEngine):
        self.engine = engine

    def get_engine_information(self, format: LayerInformationFormat) -> str:
        plan = self.engine._plan
        if plan["verbosity"] != int(ProfilingVerbosity.DETAILED):
            return json.dumps({"Layers": [name for name, _ in plan["layers"]]})
        layers = []
        for name, dtype in plan["layers"]:
            if _major() >= 11:
                out = {"Name": name + "_out", "Format": "Row major linear", "DataType": {"HALF": "Half", "FLOAT": "Float"}.get(dtype, dtype.title())}
            else:
                fmt = {"HALF": "FP16", "FLOAT": "FP32"}.get(dtype, dtype.title())
                out = {"Name": name + "_out", "Format/Datatype": f"Row major linear {fmt} format"}
            layers.append({"Name": name, "LayerType": "Fake", "Outputs": [out]})
        return json.dumps({"Layers": layers})


class ICudaEngine:
    def __init__(self, plan: dict):
        self._plan = plan

    @property
    def num_io_tensors(self) -> int:
        return len(self._plan["io"])

    def get_tensor_name(self, index: int) -> str:
        return self._plan["io"][index][0]

    def _io(self, name: str):
        return next(t for t in self._plan["io"] if t[0] == name)

    def get_tensor_mode(self, name: str) -> TensorIOMode:
        return TensorIOMode[self._io(name)[1]]

    def get_tensor_dtype(self, name: str) -> DataType:
        return DataType[self._io(name)[2]]

    def get_tensor_profile_shape(self, name: str, profile_index: int):
        return self._plan["profile"][name]

    def create_engine_inspector(self) -> EngineInspector:
        return EngineInspector(self)


class Runtime:
    def __init__(self, logger: Logger):
        self.logger = logger

    def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None:
        plan = json.loads(bytes(serialized_engine))
        if plan["version"] != __version__:
            return None  # engines do not cross TensorRT versions
        return ICudaEngine(plan)
