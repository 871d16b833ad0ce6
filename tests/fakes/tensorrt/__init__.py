"""FAKE `tensorrt` for tests: NVIDIA's Python API surface per version, with no real TensorRT behind it.

The surface is data, not memory: `surface/<version>.json` is extracted by scripts/trt_surface.py
from NVIDIA/TensorRT's binding sources (pyFoundationalTypes.cpp, pyCore.cpp, pyGraph.cpp,
pyOnnx.cpp and the NvInfer*.h / NvOnnxParser.h enums) at the ref written inside each file.
`set_version("8.5.2.2")` (or 8.6, 10.3, 10.13, 10.14, 11.x) rebuilds the module from that data:

* every enum has exactly that version's members and values (8.5 has no INT64 DataType and no
  STRONGLY_TYPED flag; 11.x has no BuilderFlag.FP16 and no EXPLICIT_BATCH);
* the fake classes answer only the methods and properties that version binds, and refuse keyword
  arguments it does not name (a real pybind11 TypeError), so code written against one version's
  names fails here as it would on the real one.

The behaviour is modelled where versions differ in ways that matter to a build:

* the ONNX parser refuses ops missing from the version's importer table (the onnx-tensorrt
  operators.md tables vendored in dfine_deploy/export/trt_operators),
  needs an explicit-batch network on 8.x, and turns INT64 graph inputs/outputs into INT32 below
  9.0 (TensorRT 8.x has no INT64 tensors); QuantizeLinear/DequantizeLinear must be symmetric signed
  INT8 (an INT8 zero point of all zeros), the only INT8 scheme TensorRT's explicit quantization has
  (https://docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/work-quantized-types.html),
  so a UINT8 or asymmetric Q/DQ graph is refused; Q outputs are INT8 tensors;
* the builder fuses the graph into a few large layers, as Myelin does: a fused layer lists the
  graph outputs it produces (FP32 boxes, INT64 labels) before its FP16 internals, so a reader that
  looks only at first outputs calls an FP16 engine FP32;
* the inspector writes each version's JSON: 8.x/10.x `"Format/Datatype": "Row major linear FP16
  format"` and a "Bindings" name list; 11.x a split `"Format"` + `"Datatype": "Half"` per tensor and
  an "I/O Tensors" section with `"DataType"`;
* timing caches: `create_timing_cache` returns None for a blob it cannot read, and
  `set_timing_cache(cache, ignore_mismatch=False)` returns False for a cache made by another
  TensorRT version or GPU (`FAKE_GPU` names the fake device).

An engine runs on the CPU: the plan carries the ONNX graph it was parsed from, and the execution
context (`IExecutionContext`: set_input_shape, get_tensor_shape, set_tensor_address,
execute_async_v3, the named-tensor API of the surface) computes it with onnxruntime, reading inputs
from and writing outputs to the addresses it was given: host addresses, as the fake CUDA runtime
(tests/fakes/cuda) hands out. Output shapes follow the batch of the first input, as D-FINE's do.
`benchmarks/gpu_check.sh --dry` puts tests/fakes first on PYTHONPATH, so every TensorRT path of
gpu_check runs here end to end. `LAST_BUILD` records what the last build saw (flags, profiles,
cache hits) for tests to assert on.
"""

from __future__ import annotations

import base64
import ctypes
import enum
import json
from pathlib import Path
from typing import Any

SURFACE_DIR = Path(__file__).parent / "surface"
SURFACES = {"8.5": "8.5", "8.6": "8.6", "10.3": "10.3", "10.13": "10.13", "10.14": "10.14", "11": "11"}
FAKE_GPU = {"name": "Fake T4", "compute_capability": "7.5"}
LAST_BUILD: dict[str, Any] = {}
FUSED_LAYER_SIZE = 6  # ONNX nodes per fused layer

__version__ = ""
SURFACE: dict[str, Any] = {}
_ENUM_NAMES: list[str] = []

# ONNX TensorProto element type -> TensorRT DataType name
_ONNX_TO_TRT = {1: "FLOAT", 10: "HALF", 6: "INT32", 7: "INT64", 9: "BOOL", 3: "INT8", 2: "UINT8", 16: "BF16"}
_INSPECTOR_10 = {
    "FLOAT": "FP32",
    "HALF": "FP16",
    "INT32": "Int32",
    "INT64": "Int64",
    "BOOL": "Bool",
    "BF16": "BF16",
    "INT8": "Int8",
    "UINT8": "UInt8",
}
_INSPECTOR_11 = {
    "FLOAT": "Float",
    "HALF": "Half",
    "INT32": "Int32",
    "INT64": "Int64",
    "BOOL": "Bool",
    "BF16": "BFloat16",
    "INT8": "Int8",
    "UINT8": "UInt8",
}


def surface_label(version: str) -> str:
    """'10.13.0.35' -> '10.13', '11.4.0' -> '11'; a version without a surface file is refused."""
    parts = version.split(".")
    for label in (".".join(parts[:2]), parts[0]):
        if label in SURFACES:
            return SURFACES[label]
    raise ValueError(f"the fake has no TensorRT {version} surface; have {sorted(SURFACES)}")


def _major() -> int:
    return int(__version__.split(".")[0])


def _below_9() -> bool:
    return _major() < 9


def set_version(version: str) -> None:
    """Rebuild the module's enums and class surfaces from the version's binding data."""
    global __version__, SURFACE
    label = surface_label(version)
    SURFACE = json.loads((SURFACE_DIR / f"{label}.json").read_text())
    __version__ = version
    namespace = globals()
    for name in _ENUM_NAMES:
        namespace.pop(name, None)
    _ENUM_NAMES.clear()
    for key, members in SURFACE["enums"].items():
        owner, _, name = key.rpartition(".")
        values = {m: v for m, v in members.items() if v is not None}
        values.update({m: i for i, (m, v) in enumerate(members.items()) if v is None})
        made = enum.IntEnum(name, values)
        if owner:
            setattr(_CLASSES[owner], name, made)
            for member in made.__members__:
                setattr(_CLASSES[owner], member, made[member])
        else:
            namespace[name] = made
            _ENUM_NAMES.append(name)
    LAST_BUILD.clear()


# ------------------------------------------------------------------------------------------------
# Surface enforcement: a fake object answers only what the current version binds.


def _members(trt_name: str) -> dict[str, Any]:
    classes = SURFACE["classes"]
    found: dict[str, Any] = {}
    while trt_name in classes:
        for name, member in classes[trt_name]["members"].items():
            found.setdefault(name, member)
        bases = classes[trt_name]["bases"]
        trt_name = bases[0] if bases else ""
    return found


def _check_call(trt_name: str, name: str, member: dict, args: tuple, kwargs: dict) -> None:
    for signature in member.get("signatures", [[]]):
        names = [n for n, _ in signature]
        required = {n for n, has_default in signature if not has_default}
        if len(args) > len(names):
            continue
        given = set(names[: len(args)]) | set(kwargs)
        if set(kwargs) <= set(names[len(args) :]) and required <= given:
            return
    raise TypeError(
        f"{name}(): incompatible function arguments for tensorrt.{trt_name} {__version__} "
        f"(got {len(args)} positional, keywords {sorted(kwargs)}; bound signatures "
        f"{member.get('signatures')})"
    )


class _Surfaced:
    """Base of the fake classes: attribute access is checked against the version's bindings."""

    _trt_name = ""

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if name.startswith("_"):
            return value
        cls = type(self)
        fakes = _CLASSES.values()
        if cls not in fakes:  # a user subclass (a logger) owns its own attributes
            own = object.__getattribute__(self, "__dict__") if hasattr(self, "__dict__") else {}
            if name in own or any(
                name in k.__dict__ for k in cls.__mro__ if k not in fakes and k is not object
            ):
                return value
            cls = next(k for k in cls.__mro__ if k in fakes)
        members = _members(cls._trt_name)
        if name not in members:
            raise AttributeError(
                f"'tensorrt.{cls._trt_name}' has no attribute '{name}' in TensorRT {__version__}"
            )
        member = members[name]
        if member["kind"] in ("method", "static") and callable(value):
            trt_name = cls._trt_name

            def checked(*args, **kwargs):
                _check_call(trt_name, name, member, args, kwargs)
                return value(*args, **kwargs)

            return checked
        return value


def _init_checked(trt_name: str, args: tuple, kwargs: dict) -> None:
    member = _members(trt_name).get("__init__")
    if member is not None:
        _check_call(trt_name, "__init__", member, args, kwargs)


# ------------------------------------------------------------------------------------------------
# Loggers


class ILogger(_Surfaced):
    """Base class of custom loggers: subclasses call ILogger.__init__ and implement log()."""

    _trt_name = "ILogger"

    def __init__(self):
        pass

    def log(self, severity, msg: str) -> None:
        raise NotImplementedError


class Logger(ILogger):
    _trt_name = "Logger"

    def __init__(self, min_severity=None):
        super().__init__()
        self.min_severity = ILogger.Severity.WARNING if min_severity is None else min_severity
        self._messages: list[str] = []

    def log(self, severity, msg: str) -> None:
        self._messages.append(msg)


def _log(logger, severity_name: str, msg: str) -> None:
    logger.log(ILogger.Severity[severity_name], msg)


# ------------------------------------------------------------------------------------------------
# Network, layers and the ONNX parser


class Dims(tuple):
    """A shape; the real one converts from and compares with lists and tuples."""

    def __new__(cls, shape=()):
        return super().__new__(cls, (int(d) for d in shape))


class ITensor(_Surfaced):
    _trt_name = "ITensor"

    def __init__(self, name: str, shape: tuple[int, ...], dtype):
        self.name, self.shape, self.dtype = name, shape, dtype


class ILayer(_Surfaced):
    """One parsed ONNX node: its op, input and output tensors, and precision constraints."""

    _trt_name = "ILayer"

    def __init__(self, name: str, op: str, inputs: list[ITensor], outputs: list[ITensor]):
        self.name = name
        self._op, self._inputs, self._outputs = op, inputs, outputs
        self._precision = None
        self._output_types: dict[int, Any] = {}

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    def get_input(self, index: int) -> ITensor:
        return self._inputs[index]

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]

    @property
    def precision(self):
        return self._precision if self._precision is not None else DataType.FLOAT  # noqa: F821

    @precision.setter
    def precision(self, dtype) -> None:
        self._precision = dtype

    @property
    def precision_is_set(self) -> bool:
        return self._precision is not None

    def set_output_type(self, index: int, dtype) -> None:
        self._output_types[index] = dtype

    def get_output_type(self, index: int):
        return self._output_types.get(index, self._outputs[index].dtype)


class INetworkDefinition(_Surfaced):
    _trt_name = "INetworkDefinition"

    def __init__(self, flags: int):
        self._flags = flags
        self._inputs: list[ITensor] = []
        self._outputs: list[ITensor] = []
        self._layers: list[ILayer] = []

    @property
    def num_inputs(self) -> int:
        return len(self._inputs)

    @property
    def num_outputs(self) -> int:
        return len(self._outputs)

    @property
    def num_layers(self) -> int:
        return len(self._layers)

    def get_input(self, index: int) -> ITensor:
        return self._inputs[index]

    def get_output(self, index: int) -> ITensor:
        return self._outputs[index]

    def get_layer(self, index: int) -> ILayer:
        return self._layers[index]

    def _flag(self, name: str) -> bool:
        flags = NetworkDefinitionCreationFlag  # noqa: F821 - set by set_version
        return name in flags.__members__ and bool(self._flags & (1 << int(flags[name])))

    @property
    def _strongly_typed(self) -> bool:
        return _major() >= 11 or self._flag("STRONGLY_TYPED")

    @property
    def _explicit_batch(self) -> bool:
        return _major() >= 10 or self._flag("EXPLICIT_BATCH")


def supported_ops(version: str) -> set[str]:
    """The ONNX ops this version's parser imports: the project's vendored onnx-tensorrt tables."""
    from dfine_deploy.export.targets import supported_onnx_ops

    return set(supported_onnx_ops(version))


class ParserError(_Surfaced):
    _trt_name = "ParserError"

    def __init__(self, desc: str, node_operator: str = ""):
        self._desc, self._op = desc, node_operator

    def desc(self) -> str:
        return self._desc

    def node_operator(self) -> str:
        return self._op

    def __str__(self) -> str:
        return self._desc


class OnnxParser(_Surfaced):
    """Reads the graph with the real `onnx` package: I/O names, shapes, dtypes, nodes and types."""

    _trt_name = "OnnxParser"

    def __init__(self, network: INetworkDefinition, logger):
        _init_checked("OnnxParser", (network, logger), {})
        self._network, self._logger = network, logger
        self._errors: list[ParserError] = []

    @property
    def num_errors(self) -> int:
        return len(self._errors)

    def get_error(self, index: int) -> ParserError:
        return self._errors[index]

    def supports_operator(self, op_name: str) -> bool:
        return op_name in supported_ops(__version__)

    def _fail(self, desc: str, op: str = "") -> bool:
        self._errors.append(ParserError(desc, op))
        return False

    def parse(self, model: bytes, path: str | None = None) -> bool:
        import onnx

        network = self._network
        network._onnx = bytes(model)
        if not network._explicit_batch:
            return self._fail(
                "ModelImporter: the ONNX parser only supports networks with an explicit batch "
                "dimension (create the network with EXPLICIT_BATCH)"
            )
        try:
            proto = onnx.load_from_string(bytes(model))
        except Exception as exc:  # the parser reports, never raises
            return self._fail(f"ModelImporter: failed to parse ONNX: {exc}")
        supported = supported_ops(__version__)
        for node in proto.graph.node:
            if node.domain not in ("", "ai.onnx") or node.op_type not in supported:
                return self._fail(
                    f"In node {node.name or node.op_type} (importer): UNSUPPORTED_NODE: No importer "
                    f"registered for op: {node.op_type}",
                    node.op_type,
                )
        problem = _qdq_problem(proto.graph)
        if problem:
            return self._fail(problem[1], problem[0])
        inferred = onnx.shape_inference.infer_shapes(proto)
        graph = inferred.graph
        elem = {
            v.name: v.type.tensor_type.elem_type for v in [*graph.value_info, *graph.input, *graph.output]
        }
        for init in graph.initializer:
            elem[init.name] = init.data_type
        tensors: dict[str, ITensor] = {}

        def dtype_of(name: str, io: bool):
            kind = _ONNX_TO_TRT.get(elem.get(name, 1), "FLOAT")
            if kind == "INT64" and _below_9():
                if io:
                    _log(
                        self._logger, "WARNING", f"{name}: INT64 is not supported natively; casting to INT32"
                    )
                kind = "INT32"
            return DataType[kind]  # noqa: F821

        def tensor(name: str, io: bool = False) -> ITensor:
            if name not in tensors:
                tensors[name] = ITensor(name, (), dtype_of(name, io))
            return tensors[name]

        inits = {i.name for i in graph.initializer}
        for vi in graph.input:
            if vi.name in inits:
                continue
            dims = tuple(d.dim_value if d.dim_value else -1 for d in vi.type.tensor_type.shape.dim)
            t = tensor(vi.name, io=True)
            t.shape = dims
            network._inputs.append(t)
        for vi in graph.output:
            dims = tuple(d.dim_value if d.dim_value else -1 for d in vi.type.tensor_type.shape.dim)
            t = tensor(vi.name, io=True)
            t.shape = dims
        for node in graph.node:
            ins = [tensor(n) for n in node.input if n]
            outs = [tensor(n) for n in node.output if n]
            network._layers.append(ILayer(node.name or node.op_type, node.op_type, ins, outs))
        network._outputs.extend(tensors[vi.name] for vi in graph.output)
        return True


def _qdq_problem(graph) -> tuple[str, str] | None:
    """(op, error) for the first Q/DQ node that is not symmetric signed INT8, else None."""
    from onnx import numpy_helper

    inits = {i.name: i for i in graph.initializer}
    consts = {
        n.output[0]: a.t
        for n in graph.node
        if n.op_type == "Constant"
        for a in n.attribute
        if a.name == "value"
    }
    for node in graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear"):
            continue
        if len(node.input) < 3 or not node.input[2]:
            if node.op_type == "DequantizeLinear":
                continue  # its type is its input's, checked at that input's QuantizeLinear
            return node.op_type, f"In node {node.name} (QuantDequantLinear): no zero point means UINT8"
        zero = inits.get(node.input[2]) or consts.get(node.input[2])
        if zero is None:
            return (
                node.op_type,
                f"In node {node.name} (QuantDequantLinear): the zero point must be a constant",
            )
        values = numpy_helper.to_array(zero)
        if zero.data_type != 3 or values.any():  # TensorProto.INT8
            return node.op_type, (
                f"In node {node.name} (QuantDequantLinear): UNSUPPORTED_NODE: TensorRT supports only "
                f"symmetric INT8 quantization (zero point of type INT8 and all zeros); got element type "
                f"{zero.data_type}"
            )
    return None


# ------------------------------------------------------------------------------------------------
# Builder, config, profiles, timing cache


class IOptimizationProfile(_Surfaced):
    _trt_name = "IOptimizationProfile"

    def __init__(self):
        self._shapes: dict[str, tuple] = {}

    def set_shape(self, input: str, min, opt, max) -> None:  # NVIDIA's argument names
        if (
            not (len(min) == len(opt) == len(max))
            or any(a > b for a, b in zip(min, opt, strict=True))
            or any(a > b for a, b in zip(opt, max, strict=True))
        ):
            raise ValueError(f"invalid profile for {input}: {min} {opt} {max}")
        self._shapes[input] = (tuple(min), tuple(opt), tuple(max))

    def get_shape(self, input: str):
        return self._shapes[input]


_CACHE_MAGIC = b"FAKE-TRT-CACHE"


class ITimingCache(_Surfaced):
    _trt_name = "ITimingCache"

    def __init__(self, entries: dict[str, str], made_by: dict[str, str]):
        self._entries = dict(entries)
        self._made_by = dict(made_by)

    def serialize(self) -> IHostMemory:
        blob = {"made_by": self._made_by, "entries": self._entries}
        return IHostMemory(_CACHE_MAGIC + json.dumps(blob).encode())

    def combine(self, input_cache: ITimingCache, ignore_mismatch: bool) -> bool:
        if input_cache._made_by != self._made_by and not ignore_mismatch:
            return False
        self._entries.update(input_cache._entries)
        return True

    def reset(self) -> bool:
        self._entries.clear()
        return True


def _this_device() -> dict[str, str]:
    return {"tensorrt": __version__, **FAKE_GPU}


class IBuilderConfig(_Surfaced):
    _trt_name = "IBuilderConfig"

    def __init__(self):
        self._flags: set[str] = {"TF32"}  # TF32 is on by default
        self._memory_limits: dict[str, int] = {}
        self._profiles: list[IOptimizationProfile] = []
        self._verbosity = ProfilingVerbosity.LAYER_NAMES_ONLY  # noqa: F821
        self._cache: ITimingCache | None = None

    @property
    def profiling_verbosity(self):
        return self._verbosity

    @profiling_verbosity.setter
    def profiling_verbosity(self, value) -> None:
        self._verbosity = ProfilingVerbosity(value)  # noqa: F821

    def set_flag(self, flag) -> None:
        self._flags.add(BuilderFlag(flag).name)  # noqa: F821

    def clear_flag(self, flag) -> None:
        self._flags.discard(BuilderFlag(flag).name)  # noqa: F821

    def get_flag(self, flag) -> bool:
        return BuilderFlag(flag).name in self._flags  # noqa: F821

    def set_memory_pool_limit(self, pool, pool_size: int) -> None:
        self._memory_limits[MemoryPoolType(pool).name] = int(pool_size)  # noqa: F821

    def get_memory_pool_limit(self, pool) -> int:
        return self._memory_limits.get(MemoryPoolType(pool).name, 0)  # noqa: F821

    def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
        self._profiles.append(profile)
        return len(self._profiles) - 1

    def create_timing_cache(self, serialized_timing_cache) -> ITimingCache | None:
        data = bytes(serialized_timing_cache)
        if not data:
            return ITimingCache({}, _this_device())
        try:
            if not data.startswith(_CACHE_MAGIC):
                raise ValueError("no magic")
            blob = json.loads(data[len(_CACHE_MAGIC) :])
            return ITimingCache(blob["entries"], blob["made_by"])
        except (ValueError, KeyError):
            return None  # TensorRT logs an error and returns a null cache

    def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
        if cache._made_by != _this_device() and not ignore_mismatch:
            return False
        self._cache = cache
        return True

    def get_timing_cache(self) -> ITimingCache | None:
        return self._cache


class IHostMemory(bytes, _Surfaced):
    """Serialized plan or cache; like TensorRT's, it supports the buffer protocol."""

    _trt_name = "IHostMemory"

    @property
    def nbytes(self) -> int:
        return len(self)


def _kind(dtype_name: str, weak_fp16: bool, pinned: bool) -> str:
    if weak_fp16 and dtype_name == "FLOAT" and not pinned:
        return "HALF"
    return dtype_name


class Builder(_Surfaced):
    _trt_name = "Builder"

    def __init__(self, logger):
        _init_checked("Builder", (logger,), {})
        self._logger = logger

    @property
    def platform_has_fast_fp16(self) -> bool:
        return True

    def create_network(self, flags: int = 0) -> INetworkDefinition:
        return INetworkDefinition(flags)

    def create_builder_config(self) -> IBuilderConfig:
        return IBuilderConfig()

    def create_optimization_profile(self) -> IOptimizationProfile:
        return IOptimizationProfile()

    def build_serialized_network(
        self, network: INetworkDefinition, config: IBuilderConfig
    ) -> IHostMemory | None:
        LAST_BUILD.clear()
        LAST_BUILD.update(
            network_flags=network._flags,
            strongly_typed=network._strongly_typed,
            config_flags=set(config._flags),
            memory_limits=dict(config._memory_limits),
            profiles=[dict(p._shapes) for p in config._profiles],
            cache_hits=0,
            cache_used=config._cache is not None,
        )
        if network._strongly_typed and config._flags & {"FP16", "BF16", "INT8"}:
            _log(self._logger, "ERROR", "precision builder flags are not allowed on a strongly typed network")
            return None
        for t in network._inputs:
            if any(d < 0 for d in t.shape) and not any(t.name in p._shapes for p in config._profiles):
                _log(self._logger, "ERROR", f"{t.name}: dynamic input without optimization profile")
                return None
        weak_fp16 = not network._strongly_typed and "FP16" in config._flags
        obey = "OBEY_PRECISION_CONSTRAINTS" in config._flags
        chosen: dict[str, str] = {t.name: t.dtype.name for t in [*network._inputs, *network._outputs]}
        io_names = set(chosen)
        pinned_layers = []
        for layer in network._layers:
            pinned = obey and layer._precision is not None and layer._precision.name == "FLOAT"
            pinned_layers.append(pinned)
            for index, t in enumerate(layer._outputs):
                if t.name in io_names:
                    continue
                forced = layer._output_types.get(index) if obey else None
                chosen[t.name] = forced.name if forced is not None else _kind(t.dtype.name, weak_fp16, pinned)
            if (
                not network._strongly_typed
                and layer._op in ("ReduceMean", "Pow")
                and not pinned
                and any(chosen.get(t.name) == "HALF" for t in layer._outputs)
            ):
                _log(
                    self._logger,
                    "WARNING",
                    "Running layernorm after self-attention with FP16 Reduce or Pow may cause overflow. "
                    "Forcing Reduce or Pow Layers in FP32 precision, or exporting the model to use "
                    "INormalizationLayer (available with ONNX opset >= 17) can help.",
                )
        if network._strongly_typed:
            for layer in network._layers:
                if layer._op in ("ReduceMean", "Pow") and any(t.dtype.name == "HALF" for t in layer._outputs):
                    _log(
                        self._logger,
                        "WARNING",
                        "Running layernorm after self-attention with FP16 Reduce or Pow may cause overflow. "
                        "Forcing Reduce or Pow Layers in FP32 precision, or exporting the model to use "
                        "INormalizationLayer (available with ONNX opset >= 17) can help.",
                    )
        layers = _fuse(network, chosen)
        cache = config._cache
        if cache is not None:
            for layer in layers:
                key = f"{layer['name']}@{__version__}"
                LAST_BUILD["cache_hits"] += key in cache._entries
                cache._entries[key] = "tactic-0"
        plan = {
            "version": __version__,
            "io": [(t.name, "INPUT", t.dtype.name, t.shape) for t in network._inputs]
            + [(t.name, "OUTPUT", t.dtype.name, t.shape) for t in network._outputs],
            "layers": layers,
            "verbosity": int(config._verbosity),
            "profile": {k: v for p in config._profiles for k, v in p._shapes.items()},
            "onnx": base64.b64encode(network._onnx).decode(),
        }
        return IHostMemory(json.dumps(plan).encode())


def _fuse(network: INetworkDefinition, chosen: dict[str, str]) -> list[dict]:
    """Group the nodes into fused layers; each lists graph outputs first, then its other outputs."""
    graph_outputs = [t.name for t in network._outputs]
    nodes = network._layers
    groups = [nodes[i : i + FUSED_LAYER_SIZE] for i in range(0, len(nodes), FUSED_LAYER_SIZE)]
    layers = []
    for g, group in enumerate(groups):
        produced = [t.name for layer in group for t in layer._outputs]
        inside = set(produced)
        inputs = [
            t.name for layer in group for t in layer._inputs if t.name not in inside and t.name in chosen
        ]
        used_later = {t.name for later in groups[g + 1 :] for layer in later for t in layer._inputs}
        outs = [n for n in graph_outputs if n in inside]
        outs += [n for n in produced if n in used_later and n not in outs]
        outs += [n for n in produced if n not in outs][:2]  # internals TensorRT reports for the fused node
        # graph outputs and FP32/INT tensors (casts out of the FP16 region) are listed first
        outs.sort(key=lambda n: (n not in graph_outputs, chosen.get(n, "FLOAT") == "HALF"))
        layers.append(
            {
                "name": f"{{ForeignNode[{group[0].name}...{group[-1].name}]}}",
                "inputs": [(n, chosen.get(n, "FLOAT")) for n in dict.fromkeys(inputs)],
                "outputs": [(n, chosen.get(n, "FLOAT")) for n in outs],
            }
        )
    return layers


# ------------------------------------------------------------------------------------------------
# Runtime, engine, inspector


class EngineInspector(_Surfaced):
    _trt_name = "EngineInspector"

    def __init__(self, engine: ICudaEngine):
        self._engine = engine

    def get_engine_information(self, format) -> str:  # NVIDIA's argument name
        plan = self._engine._plan
        io = plan["io"]
        if plan["verbosity"] != int(ProfilingVerbosity.DETAILED):  # noqa: F821
            layers: list[Any] = [layer["name"] for layer in plan["layers"]]
        else:
            layers = [
                {
                    "Name": layer["name"],
                    "LayerType": "Myelin",
                    "Inputs": [_tensor_json(n, d) for n, d in layer["inputs"]],
                    "Outputs": [_tensor_json(n, d) for n, d in layer["outputs"]],
                    "TacticName": "fake",
                }
                for layer in plan["layers"]
            ]
        if _major() >= 11:
            section = [
                {
                    "Name": n,
                    "IOMode": mode.title(),
                    "DataType": _INSPECTOR_11.get(d, d.title()),
                    "Dimensions": list(s),
                    "Location": "Device",
                }
                for n, mode, d, s in io
            ]
            return json.dumps({"Layers": layers, "I/O Tensors": section})
        return json.dumps({"Layers": layers, "Bindings": [n for n, *_ in io]})


def _tensor_json(name: str, dtype: str) -> dict[str, Any]:
    if _major() >= 11:
        return {
            "Name": name,
            "Location": "Device",
            "Dimensions": [-1],
            "Format": "Row major linear",
            "Datatype": _INSPECTOR_11.get(dtype, dtype.title()),
        }
    suffix = " format" if _major() >= 10 else ""
    return {
        "Name": name,
        "Location": "Device",
        "Dimensions": [-1],
        "Format/Datatype": f"Row major linear {_INSPECTOR_10.get(dtype, dtype.title())}{suffix}",
    }


class ICudaEngine(_Surfaced):
    _trt_name = "ICudaEngine"

    def __init__(self, plan: dict):
        self._plan = plan

    @property
    def num_io_tensors(self) -> int:
        return len(self._plan["io"])

    def get_tensor_name(self, index: int) -> str:
        return self._plan["io"][index][0]

    def _io(self, name: str):
        return next(t for t in self._plan["io"] if t[0] == name)

    def get_tensor_mode(self, name: str):
        return TensorIOMode[self._io(name)[1]]  # noqa: F821

    def get_tensor_dtype(self, name: str):
        return DataType[self._io(name)[2]]  # noqa: F821

    def get_tensor_profile_shape(self, name: str, profile_index: int):
        return self._plan["profile"][name]

    def create_engine_inspector(self) -> EngineInspector:
        return EngineInspector(self)

    def create_execution_context(self) -> IExecutionContext:
        return IExecutionContext(self)


class Runtime(_Surfaced):
    _trt_name = "Runtime"

    def __init__(self, logger):
        _init_checked("Runtime", (logger,), {})
        self._logger = logger

    def deserialize_cuda_engine(self, serialized_engine) -> ICudaEngine | None:
        plan = json.loads(bytes(serialized_engine))
        if plan["version"] != __version__:
            return None  # engines do not cross TensorRT versions
        return ICudaEngine(plan)


_NUMPY = {"FLOAT": "float32", "HALF": "float16", "INT32": "int32", "INT64": "int64", "BOOL": "bool"}
_NUMPY.update(INT8="int8", UINT8="uint8")
_ORT_NUMPY = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(int64)": "int64"}
_ORT_NUMPY.update({"tensor(int32)": "int32", "tensor(bool)": "bool"})


class IExecutionContext(_Surfaced):
    """Runs the engine's ONNX graph with onnxruntime on the CPU, through named tensor addresses."""

    _trt_name = "IExecutionContext"

    def __init__(self, engine: ICudaEngine):
        import onnxruntime

        self._engine = engine
        model = base64.b64decode(engine._plan["onnx"])
        self._session = onnxruntime.InferenceSession(model, providers=["CPUExecutionProvider"])
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._addresses: dict[str, int] = {}
        self._executions = 0  # for tests

    def set_input_shape(self, name: str, shape) -> bool:
        mode, _, _ = self._engine._io(name)[1:]
        low, _, high = self._engine._plan["profile"][name]
        shape = tuple(int(d) for d in shape)
        if mode != "INPUT" or len(shape) != len(low):
            return False
        if any(not lo <= d <= hi for d, lo, hi in zip(shape, low, high)):
            return False
        self._shapes[name] = shape
        return True

    def get_tensor_shape(self, name: str) -> Dims:
        if name in self._shapes:
            return Dims(self._shapes[name])
        first = next(n for n, mode, *_ in self._engine._plan["io"] if mode == "INPUT")
        batch = self._shapes.get(first, (-1,))[0]
        return Dims(batch if d < 0 else d for d in self._engine._io(name)[3])

    def set_tensor_address(self, name: str, memory: int) -> bool:
        self._addresses[name] = int(memory)
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        import numpy as np

        feeds = {}
        wanted = {i.name: i.type for i in self._session.get_inputs()}
        for name, mode, dtype, _ in self._engine._plan["io"]:
            if mode != "INPUT":
                continue
            shape = self._shapes[name]
            count = int(np.prod(shape)) * np.dtype(_NUMPY[dtype]).itemsize
            raw = (ctypes.c_uint8 * count).from_address(self._addresses[name])
            array = np.frombuffer(raw, _NUMPY[dtype]).reshape(shape)
            feeds[name] = array.astype(_ORT_NUMPY[wanted[name]])  # 8.x: INT32 engine I/O, INT64 graph
        names = [o.name for o in self._session.get_outputs()]
        for name, value in zip(names, self._session.run(names, feeds)):
            out = np.ascontiguousarray(value, dtype=_NUMPY[self._engine._io(name)[2]])
            ctypes.memmove(self._addresses[name], out.ctypes.data, out.nbytes)
        self._executions += 1
        return True


_CLASSES: dict[str, type] = {
    cls._trt_name: cls
    for cls in (
        ILogger,
        Logger,
        ITensor,
        ILayer,
        INetworkDefinition,
        ParserError,
        OnnxParser,
        IOptimizationProfile,
        ITimingCache,
        IBuilderConfig,
        IHostMemory,
        Builder,
        EngineInspector,
        ICudaEngine,
        Runtime,
        IExecutionContext,
    )
}

set_version("11.1.0.106")
