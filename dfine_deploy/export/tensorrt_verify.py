"""Precision evidence for a TensorRT engine: the network before the build, the inspector after it.

Precision is decided from the network before the build: a strongly typed network's tensor types
are the engine's types (no FP16 tensor in it: refused before minutes of building); a weakly typed
build is FP16 because we set the flag. The engine inspector's JSON then corroborates, read in every
layout NVIDIA has used (8.x/10.x `Format/Datatype`, 11.x `Datatype`/`DataType`, the top-level
`Bindings` / `I/O Tensors` sections), counting every input and output of every layer: a fused
layer's first output is often an FP32 or INT64 graph output even in an FP16 engine. An engine is
refused only on positive evidence that it is not FP16: a strongly typed network without FP16
tensors, or a weakly typed build whose inspector types its float tensors and none is FP16 (the FP16
flag permits FP16, it does not force it). In a strongly typed build the network's types are the
engine's, so an inspector that shows no FP16 can only fail to corroborate: "unverified" and why,
as when it says nothing usable. INT8 engines (explicit quantization, TensorRT 10+, always strongly
typed) are judged the same way on INT8 tensors. trtexec builds (export/jetson/build_engine.sh) are
judged from the inspector JSON trtexec exports, without the network. No `tensorrt` import at run
time: the build hands its objects in.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dfine_deploy.backend_names import Precision
from dfine_deploy.errors import ExportError
from dfine_deploy.runtime.tensorrt_plan import fp16_build_hint

if TYPE_CHECKING:  # checked against NVIDIA's tensorrt-stubs (tests/export/test_tensorrt_types.py)
    import tensorrt as trt_types

PRECISION_WORDS = (  # (kind, words in an inspector type string), most specific first
    (Precision.BF16, ("bf16", "bfloat16")),
    (Precision.FP16, ("fp16", "half")),
    ("int8/fp8", ("fp8", "int8", "fp4", "int4", "e8m0")),
    (Precision.FP32, ("fp32", "float")),
    ("int", ("int32", "int64", "uint8", "bool")),
)
_TYPE_KEYS = ("format/datatype", "datatype")  # 8.x/10.x, and 11.x's split field (any capitalisation)


def precision_kind(text: str) -> str:
    """'Row major linear FP16 format' / 'Half' / 'HALF' -> 'fp16'; unknown -> 'unknown'."""
    low = text.lower()
    for kind, words in PRECISION_WORDS:
        if any(word in low for word in words):
            return kind
    return "unknown"


def network_precisions(network: trt_types.INetworkDefinition) -> dict[str, int]:
    """Count every output tensor of every layer of a parsed network by precision."""
    counts: dict[str, int] = {}
    for i in range(network.num_layers):
        layer = network.get_layer(i)
        for j in range(layer.num_outputs):
            kind = precision_kind(dtype_name(layer.get_output(j).dtype))
            counts[kind] = counts.get(kind, 0) + 1
    return counts


def _tensor_type(entry: Any) -> str | None:
    if not isinstance(entry, dict):
        return None
    for key, value in entry.items():
        if key.lower() in _TYPE_KEYS and isinstance(value, str):
            return value
    return None


def inspector_precisions(inspector_json: str) -> tuple[dict[str, int], str]:
    """Count every input and output of every layer, plus the top-level I/O section, by precision.

    Returns (counts, why-empty): counts is empty when the JSON carries no per-tensor types (names
    only, an unknown layout, not JSON), and the second item then says which.
    """
    try:
        data = json.loads(inspector_json)
    except (json.JSONDecodeError, TypeError):
        return {}, "the engine inspector's output is not JSON"
    if not isinstance(data, dict):
        return {}, "the engine inspector's JSON has no sections"
    counts: dict[str, int] = {}
    entries: list[Any] = []
    layers = data.get("Layers") or []
    for item in layers:
        if isinstance(item, dict):
            entries += list(item.get("Inputs") or []) + list(item.get("Outputs") or [])
    for key, section in data.items():  # 11.x "I/O Tensors" (10.x "Bindings" holds names only)
        if key != "Layers" and isinstance(section, list):
            entries += [e for e in section if isinstance(e, dict)]
    for entry in entries:
        text = _tensor_type(entry)
        if text is not None:
            kind = precision_kind(text)
            counts[kind] = counts.get(kind, 0) + 1
    if counts:
        return counts, ""
    if layers and all(isinstance(item, str) for item in layers):
        return {}, "the engine was built without detailed profiling: the inspector lists layer names only"
    return {}, f"no per-tensor data type found in the inspector JSON (sections: {sorted(data)})"


_DATA_TYPES = (  # (TensorRT DataType name, words in an inspector type string), most specific first
    ("BF16", ("bf16", "bfloat16")),
    ("HALF", ("fp16", "half")),
    ("FLOAT", ("fp32", "float")),
    ("INT64", ("int64",)),
    ("INT32", ("int32",)),
    ("UINT8", ("uint8",)),
    ("INT8", ("int8",)),
    ("BOOL", ("bool",)),
)


def inspector_io_dtypes(inspector_json: str, names: Iterable[str]) -> dict[str, str]:
    """The TensorRT DataType name of each named I/O tensor the inspector JSON types (trtexec builds).

    The top-level I/O section (11.x) is read first, then the layers' inputs and outputs, where the
    engine's I/O tensors appear under their own names; a name typed nowhere is left out.
    """
    try:
        data = json.loads(inspector_json)
    except (json.JSONDecodeError, TypeError):
        return {}
    if not isinstance(data, dict):
        return {}
    entries = [e for key, v in data.items() if key != "Layers" and isinstance(v, list) for e in v]
    for item in data.get("Layers") or []:
        if isinstance(item, dict):
            entries += list(item.get("Inputs") or []) + list(item.get("Outputs") or [])
    wanted = set(names)
    found: dict[str, str] = {}
    for entry in entries:
        text = _tensor_type(entry)
        if text is None or entry.get("Name") not in wanted:
            continue
        low = text.lower()
        kind = next((name for name, words in _DATA_TYPES if any(w in low for w in words)), None)
        if kind is not None:
            found.setdefault(entry["Name"], kind)
    return found


# an engine layer's name lists the network layers fused into it: "/a/Sqrt", "/a/Pow + /a/Add",
# "PWN(/a/Sub, /a/Div)", Myelin's "{ForeignNode[/first.../last]}" (first and last only)
_NAME_SEPARATORS = re.compile(r"\.\.\.|\s\+\s|[,()\[\]{}]|\s+")
_FOREIGN = "ForeignNode"
_REFORMAT = "Reformatting CopyNode"  # a copy TensorRT inserts; it names the layer it feeds


def fp32_layer_outcome(inspector_json: str, asked: Iterable[str]) -> dict[str, Any]:
    """How the layers a weakly typed build asked to hold in FP32 ran, by the engine inspector.

    `asked` are the layer names pinned by --layerPrecisions (model.json `target.fp32_layers`, 8.x
    targets). Each is found among the names of the engine's layers and counted as `fp32` (every
    float output of its engine layer is FP32), `not_fp32` (one is FP16/BF16/INT8), `fused` (inside
    a Myelin region, whose inside the inspector does not type) or `not_found` (fused away under
    another name, or not built). Returns the counts, `asked` (their total) and the names per kind
    other than `fp32`; {"asked": n, "unknown": why} when the inspector gives no per-layer types.
    """
    wanted = list(asked)
    try:
        data = json.loads(inspector_json)
    except (json.JSONDecodeError, TypeError):
        data = None
    layers = data.get("Layers") if isinstance(data, dict) else None
    if not layers or not all(isinstance(item, dict) for item in layers):
        return {"asked": len(wanted), "unknown": "the engine inspector gives no per-layer types"}
    kind_of: dict[str, str] = {}
    for layer in layers:
        name = str(layer.get("Name", ""))
        if name.startswith(_REFORMAT):
            continue
        if _FOREIGN in name:
            kind = "fused"
        else:
            outputs = [precision_kind(t) for t in map(_tensor_type, layer.get("Outputs") or []) if t]
            floats = [k for k in outputs if k not in ("int", "unknown")]
            kind = "fp32" if floats and all(k == Precision.FP32 for k in floats) else "not_fp32"
            if not floats:
                continue  # no typed float output: says nothing of its precision
        for token in filter(None, _NAME_SEPARATORS.split(name)):
            kind_of.setdefault(token, kind)
    outcome: dict[str, Any] = {"asked": len(wanted)}
    for kind in ("fp32", "not_fp32", "fused", "not_found"):
        names = [n for n in wanted if kind_of.get(n, "not_found") == kind]
        outcome[kind] = len(names)
        if kind != "fp32":
            outcome[f"{kind}_layers"] = names
    return outcome


def describe_fp32_outcome(outcome: Mapping[str, Any]) -> str:
    """One line for a person: how many of the layers asked for FP32 ran in FP32."""
    if "unknown" in outcome:
        return f"FP32 layers: {outcome['asked']} asked; how they ran is unknown ({outcome['unknown']})"
    return (
        f"FP32 layers: {outcome['fp32']} of {outcome['asked']} asked ran in FP32 by the engine inspector; "
        f"{outcome['not_fp32']} did not, {outcome['fused']} are inside fused regions it does not type, "
        f"{outcome['not_found']} are not named in the engine"
    )


def judge_precision(
    *,
    fp16: bool,
    strongly_typed: bool | None,
    network: Mapping[str, int],
    inspector: Mapping[str, int],
    inspector_gap: str,
    int8: bool = False,
) -> dict[str, Any]:
    """The precision verdict: {"status": verified | unverified | refused, "reason", evidence}.

    The network decides (a strongly typed network's types are the engine's; a weak build is FP16
    because the flag was set); the inspector corroborates. Only positive evidence refuses: a
    strongly typed network without FP16 (INT8: without INT8) tensors, or, in a weakly typed FP16
    build, an inspector that types float tensors and none of them FP16. `network` is empty when
    the network was not seen (a trtexec build). `strongly_typed` None: nothing recorded how the
    engine was typed (an engine dfine-verify meets without its build record, e.g. DeepStream's); an
    inspector without FP16 is then no proof of a weak FP32 build, since a strongly typed engine's
    inspector may show only its Myelin regions' FP32/INT64 edges: "unverified", never "refused".
    """
    record: dict[str, Any] = {"network": dict(network), "inspector": dict(inspector)}
    wanted = Precision.INT8 if int8 else (Precision.FP16 if fp16 else Precision.FP32)
    if strongly_typed is None:
        decided_by = "its declared precision (how its network was typed is not recorded)"
    elif strongly_typed:
        decided_by = "strongly typed network"
    else:
        decided_by = "FP16 builder flag" if fp16 else "no FP16 flag"
    record["decided_by"] = decided_by
    record["precision"] = wanted
    if int8:
        return _judge_int8(record, network, inspector, inspector_gap)
    if fp16 and strongly_typed and network and network.get(Precision.FP16, 0) == 0:
        return {
            **record,
            "status": "refused",
            "reason": f"the strongly typed network has no FP16 tensors ({dict(network)})",
        }
    floats = sum(inspector.get(p, 0) for p in (Precision.FP16, Precision.FP32, Precision.BF16))
    if fp16 and floats and inspector.get(Precision.FP16, 0) == 0:
        shown = f"the engine inspector shows float tensors and none in FP16 ({dict(inspector)})"
        if strongly_typed is False:  # the flag permits FP16 and the builder chose none: not FP16
            return {**record, "status": "refused", "reason": shown}
        # strongly typed, the graph's types are the engine's; unrecorded, no proof of a weak build:
        # either way the inspector only fails to corroborate
        return {**record, "status": "unverified", "reason": f"fp16 by {decided_by}; {shown}"}
    if not inspector:
        return {**record, "status": "unverified", "reason": f"{wanted} by {decided_by}; {inspector_gap}"}
    if fp16:
        return {
            **record,
            "status": "verified",
            "reason": f"fp16 by {decided_by}; the inspector shows {inspector[Precision.FP16]} FP16 tensors",
        }
    return {
        **record,
        "status": "verified",
        "reason": f"fp32 by {decided_by}; the inspector shows no FP16 need",
    }


def _judge_int8(
    record: dict[str, Any], network: Mapping[str, int], inspector: Mapping[str, int], inspector_gap: str
) -> dict[str, Any]:
    """Explicit quantization: the strongly typed network's Q/DQ layers make INT8 tensors."""
    quantized = "int8/fp8"  # precision_kind of INT8 tensors (the inspector may also name FP8)
    if network and network.get(quantized, 0) == 0:
        return {
            **record,
            "status": "refused",
            "reason": f"the strongly typed network has no INT8 tensors ({dict(network)}): no Q/DQ layers",
        }
    if inspector and inspector.get(quantized, 0) == 0:  # strongly typed: the Q/DQ layers decide
        return {
            **record,
            "status": "unverified",
            "reason": f"int8 by Q/DQ layers; the engine inspector types its tensors and none is INT8 "
            f"({dict(inspector)})",
        }
    if not inspector:
        return {**record, "status": "unverified", "reason": f"int8 by Q/DQ layers; {inspector_gap}"}
    return {
        **record,
        "status": "verified",
        "reason": f"int8 by Q/DQ layers in a strongly typed network; the inspector shows "
        f"{inspector[quantized]} INT8 tensors",
    }


def verify_engine(
    io_dtypes: Mapping[str, str],
    verdict: Mapping[str, Any],
    *,
    expected_io: Mapping[str, str],
    source: str,
    version: str,
) -> None:
    """Refuse an engine whose interface or precision is not what it will be called."""
    wrong = {n: d for n, d in io_dtypes.items() if n in expected_io and d != expected_io[n]}
    missing = [n for n in expected_io if n not in io_dtypes]
    if wrong or missing:
        raise ExportError(
            f"{source}: the TensorRT {version} engine's I/O is not the D-FINE interface "
            f"(wrong dtypes {wrong}, missing {missing}; expected {dict(expected_io)})"
        )
    if verdict["status"] == "refused" and verdict.get("precision") == Precision.INT8:
        raise ExportError(
            f"{source}: TensorRT {version} did not build an INT8 engine: {verdict['reason']}. Build from "
            "the Q/DQ graph made for TensorRT (dfine-export --int8 --data DIR --target trt10.3 or newer "
            "writes model.int8.trt.onnx). Nothing was written."
        )
    if verdict["status"] == "refused":
        raise ExportError(
            f"{source}: TensorRT {version} did not build an FP16 engine: {verdict['reason']}; "
            f"{fp16_build_hint(version)}. Nothing was written."
        )


def check_engine(
    io_dtypes: Mapping[str, str],
    inspector_json: str,
    *,
    precision: str,
    strongly_typed: bool,
    network: Mapping[str, int],
    expected_io: Mapping[str, str],
    source: str,
    version: str,
    fp32_layers: Iterable[str] = (),
) -> tuple[dict[str, int], dict[str, Any]]:
    """Judge a built engine (Python build or trtexec) and refuse it on positive evidence.

    Returns the inspector's tensor counts and the verdict; an "unverified" verdict is warned about.
    `fp32_layers`, the layers a weakly typed FP16 build pinned to FP32, adds the verdict's
    `fp32_layers` (fp32_layer_outcome): how many of them ran in FP32.
    """
    counts, gap = inspector_precisions(inspector_json)
    verdict = judge_precision(
        fp16=precision != Precision.FP32,
        strongly_typed=strongly_typed,
        network=network,
        inspector=counts,
        inspector_gap=gap,
        int8=precision == Precision.INT8,
    )
    verify_engine(io_dtypes, verdict, expected_io=expected_io, source=source, version=version)
    asked = list(fp32_layers)
    if asked:
        verdict["fp32_layers"] = fp32_layer_outcome(inspector_json, asked)
    if verdict["status"] == "unverified":
        warnings.warn(
            f"{source}: TensorRT {version} engine precision unverified: {verdict['reason']}", stacklevel=3
        )
    return counts, verdict


def dtype_name(dtype: Any) -> str:
    """A TensorRT DataType as its upper-case name (`DataType.HALF` -> "HALF")."""
    return str(getattr(dtype, "name", str(dtype).split(".")[-1])).upper()
