"""TensorRT target profiles (`dfine-export --target`) and the offline ONNX-parser check.

A profile fixes, per TensorRT version, what the exported graph must look like for that version's
ONNX parser (opset, LayerNorm native or decomposed, INT32 or INT64 interface) and how the engine is
built from it; the profiles are the one table of TensorRT versions, `runtime/tensorrt_plan.py`
`PROFILES` (the runtime opens engines by it too), and `dfine-export --target NAME` prints its row.

Why: the 8.5 parser has no LayerNormalization importer (8.6 adds it), 8.x has no INT64 tensors (the
parser turns INT64 graph I/O into INT32), and 8.x has no strongly typed networks, so its FP32 islands
are held by per-layer precision constraints (OBEY_PRECISION_CONSTRAINTS, trtexec
`--precisionConstraints=obey --layerPrecisions --layerOutputTypes`). Every target uses the gather
sampler (no GridSample node).

What each parser imports comes from onnx/onnx-tensorrt `docs/operators.md` at the commit each
TensorRT release pins, vendored in `trt_operators/` (provenance inside each file; regenerate with
`scripts/update_trt_operator_tables.py`). `check_parser_support` reads a graph against that table:
opset range, operator names, and the restrictions of the table that concern our graphs (inputs that
must be initializers or constants, TopK's K and `sorted`, Resize modes). It is a static check from
NVIDIA's documentation; it proves nothing about a real build.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dfine_deploy.errors import ExportError
from dfine_deploy.runtime.tensorrt_plan import LAYER_CONSTRAINTS, PROFILES, TargetProfile

if TYPE_CHECKING:
    from onnx import ModelProto, NodeProto

TABLES = Path(__file__).with_name("trt_operators")
JETPACK_TRTEXEC = "/usr/src/tensorrt/bin/trtexec"  # where JetPack's own TensorRT puts trtexec
ALIASES: dict[str, str] = {alias: p.name for p in PROFILES.values() for alias in p.aliases}
TARGET_NAMES: tuple[str, ...] = (*ALIASES, *PROFILES)


def get_profile(target: str) -> TargetProfile:
    """The profile for a `--target` value (a JetPack name or a TensorRT version such as trt8.5)."""
    name = ALIASES.get(target, target)
    if name not in PROFILES:
        raise ExportError(f"--target {target}: unknown target; choose one of {', '.join(TARGET_NAMES)}")
    return PROFILES[name]


def _version_key(version: str) -> tuple[int, int]:
    parts = re.findall(r"\d+", version)
    if not parts:
        raise ExportError(f"unrecognised TensorRT version '{version}'")
    return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0


def profile_for_tensorrt(version: str) -> TargetProfile:
    """The profile whose rules hold for an installed TensorRT version (e.g. '10.13.3.9' -> trt10.3).

    Within a major version the newest profile not newer than `version` is used (parsers only gain
    operators); a version older than every profile of its major version gets the oldest one.
    """
    major, minor = _version_key(version)
    same_major = sorted(
        (p for p in PROFILES.values() if _version_key(p.tensorrt)[0] == major),
        key=lambda p: _version_key(p.tensorrt),
    )
    if not same_major:
        raise ExportError(
            f"TensorRT {version} is not a supported target; supported: "
            + ", ".join(f"{p.tensorrt} ({p.name})" for p in PROFILES.values())
        )
    older = [p for p in same_major if _version_key(p.tensorrt) <= (major, minor)]
    return older[-1] if older else same_major[0]


def check_installed(profile: TargetProfile | None, version: str) -> None:
    """Raise ExportError unless an artifact exported for `profile` (None: no --target) can be built
    by TensorRT `version` (the rules of export/jetson/build_engine.sh)."""
    installed = profile_for_tensorrt(version)
    major = _version_key(version)[0]
    ours = f"--target {profile.name}" if profile else "no --target"
    if major < 9 and (profile is None or _version_key(profile.tensorrt) > _version_key(installed.tensorrt)):
        raise ExportError(
            f"the export ({ours}) cannot be built by TensorRT {version}: its parser lacks operators or "
            f"INT64 tensors the graph needs; export with --target {installed.aliases[0]}"
        )
    if major >= 9 and profile is not None and _version_key(profile.tensorrt)[0] < 9:
        raise ExportError(
            f"the export (--target {profile.name}) is for TensorRT 8.x (INT32 I/O, FP32 layer "
            f"constraints) but TensorRT {version} is installed; export with --target {installed.name}"
        )


@cache
def operator_table(version: str) -> dict[str, Any]:
    """The vendored operators.md table for a TensorRT version ('8.5', '10.13.3', ...) with its source."""
    table = profile_for_tensorrt(version).operator_table
    return json.loads((TABLES / f"trt{table}.json").read_text())


def supported_onnx_ops(version: str) -> dict[str, str]:
    """ONNX operator -> restriction text ('' when none) that TensorRT `version`'s ONNX parser imports."""
    table = operator_table(version)
    return {op: table["restrictions"].get(op, "") for op in table["ops"]}


# --- the parser check ----------------------------------------------------------------------------

_CONSTANT_INPUT = re.compile(
    r"`(\w+)`(?: input)? must be (?:an initializer|a constant tensor|resolvable to a constant|"
    r"a build-time constant)"
)
_LESS_THAN = re.compile(r"`(\w+)` input must be less than (\d+)")
_MUST_EQUAL = re.compile(r"`(\w+)` must be (\d+)\b")
_RESIZE_LISTS = {
    "coordinate_transformation_mode": re.compile(r"transformation modes: ([^<]*)"),
    "mode": re.compile(r"resize modes: ([^<]*)"),
    "nearest_mode": re.compile(r"nearest modes: ([^<]*)"),
}
_RESIZE_DEFAULTS = {
    "coordinate_transformation_mode": "half_pixel",
    "mode": "nearest",
    "nearest_mode": "round_prefer_floor",
}


@dataclass
class ParserReport:
    """What `check_parser_support` found: empty `problems` means every node is importable."""

    tensorrt: str
    table_ref: str
    opset: int
    unsupported_ops: dict[str, int]  # op type -> node count
    problems: list[str]

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "tensorrt": self.tensorrt,
            "table": self.table_ref,
            "opset": self.opset,
            "ok": self.ok,
            "unsupported_ops": self.unsupported_ops,
            "problems": self.problems,
        }


def _constant_values(model: ModelProto) -> dict[str, Any]:
    """Tensor name -> numpy value for initializers and Constant node outputs."""
    from onnx import numpy_helper

    values = {init.name: numpy_helper.to_array(init) for init in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = numpy_helper.to_array(attr.t)
    return values


def _input_index(op_type: str, opset: int, name: str) -> int | None:
    import onnx

    try:
        schema = onnx.defs.get_schema(op_type, opset, "")
    except Exception:  # onnx raises SchemaError, unknown to type checkers
        return None
    names = [formal.name for formal in schema.inputs]
    lowered = [n.lower() for n in names]
    return lowered.index(name.lower()) if name.lower() in lowered else None


def _node_problems(node: NodeProto, restriction: str, opset: int, constants: Mapping[str, Any]) -> list[str]:
    import onnx

    found = []
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    for name in _CONSTANT_INPUT.findall(restriction):
        index = _input_index(node.op_type, opset, name)
        if (
            index is not None
            and index < len(node.input)
            and node.input[index]
            and node.input[index] not in constants
        ):
            found.append(f"{node.op_type} '{node.name}': input `{name}` is computed, but must be a constant")
    for name, limit in _LESS_THAN.findall(restriction):
        index = _input_index(node.op_type, opset, name)
        if index is not None and index < len(node.input) and node.input[index] in constants:
            value = int(constants[node.input[index]].reshape(-1)[0])
            if value >= int(limit):
                found.append(f"{node.op_type} '{node.name}': `{name}` = {value}, must be less than {limit}")
    for name, value in _MUST_EQUAL.findall(restriction):
        if name in attrs and not isinstance(attrs[name], (bytes, list)) and int(attrs[name]) != int(value):
            found.append(f"{node.op_type} '{node.name}': attribute `{name}` = {attrs[name]}, must be {value}")
    if node.op_type == "Resize":
        for attr, pattern in _RESIZE_LISTS.items():
            listed = pattern.search(restriction)
            if not listed:
                continue
            allowed = set(re.findall(r"`(\w+)`", listed.group(1)))
            raw = attrs.get(attr, _RESIZE_DEFAULTS[attr].encode())
            have = raw.decode() if isinstance(raw, bytes) else str(raw)
            if attr == "nearest_mode" and attrs.get("mode", b"nearest") != b"nearest":
                continue
            if have not in allowed:
                found.append(f"Resize '{node.name}': {attr} '{have}' is not one of {sorted(allowed)}")
    return found


def check_parser_support(
    model: ModelProto, version: str, *, io_dtypes: Mapping[str, str] | None = None
) -> ParserReport:
    """Read an ONNX model against TensorRT `version`'s documented ONNX parser support (static check).

    `io_dtypes`, when given, is what the engine must expose: on 8.x an INT64 graph input or output
    becomes INT32 in the engine, so an INT64 interface is reported when INT32 is expected.
    """
    table = operator_table(version)
    ops = supported_onnx_ops(version)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    problems: list[str] = []
    if not table["opset_min"] <= opset <= table["opset_max"]:
        problems.append(f"opset {opset} is outside {table['opset_min']}..{table['opset_max']}")
    unsupported: dict[str, int] = {}
    constants = _constant_values(model)
    for node in model.graph.node:
        op = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if op not in ops:
            unsupported[op] = unsupported.get(op, 0) + 1
        elif ops[op]:
            problems.extend(_node_problems(node, ops[op], opset, constants))
    if unsupported:
        problems.insert(
            0, "no importer for " + ", ".join(f"{op} ({n} nodes)" for op, n in sorted(unsupported.items()))
        )
    if io_dtypes is not None and _version_key(version)[0] < 9:
        import onnx

        for value in [*model.graph.input, *model.graph.output]:
            elem = value.type.tensor_type.elem_type
            if elem == onnx.TensorProto.INT64 and io_dtypes.get(value.name) != "int64":
                problems.append(
                    f"'{value.name}' is INT64; TensorRT {version} has no INT64 tensors (INT32 in the engine)"
                )
    ref = f"{table['source']}/blob/{table['ref']}/{table['path']}"
    return ParserReport(table["tensorrt"], ref, opset, unsupported, problems)


def suggest_target(model: ModelProto) -> str | None:
    """The oldest profile whose parser table imports every operator of `model` at its opset."""
    for profile in sorted(PROFILES.values(), key=lambda p: _version_key(p.tensorrt)):
        if check_parser_support(model, profile.tensorrt).ok:
            return profile.name
    return None


def require_parser_support(model: ModelProto, profile: TargetProfile, *, source: str) -> ParserReport:
    """Raise ExportError (one line: what cannot be parsed and the fix) unless `model` passes."""
    report = check_parser_support(model, profile.tensorrt, io_dtypes=profile.io_dtypes)
    if report.ok:
        return report
    fix = f"export with --target {profile.name} (it makes a graph this parser imports)"
    better = suggest_target(model)
    if better and better != profile.name:
        fix += f", or choose --target {better}, whose parser imports this graph"
    shown = "; ".join(report.problems[:3]) + (
        f"; and {len(report.problems) - 3} more" if len(report.problems) > 3 else ""
    )
    raise ExportError(
        f"{source}: TensorRT {profile.tensorrt}'s ONNX parser cannot import it: {shown}. Fix: {fix}"
    )


# --- precision constraints for 8.x builds ---------------------------------------------------------


def constrained_layers(model: ModelProto, fp32_nodes: Iterable[str]) -> dict[str, int]:
    """FP32-island node -> number of float outputs, for the nodes that become float TensorRT layers.

    Constant nodes make no layer, and nodes with a non-float output (TopK's indices, Shape) are left
    to TensorRT: forcing FP32 on an integer layer would fail an OBEY_PRECISION_CONSTRAINTS build.
    """
    import onnx

    inferred = onnx.shape_inference.infer_shapes(model)
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    }
    wanted = set(fp32_nodes)
    out: dict[str, int] = {}
    for node in model.graph.node:
        if node.name not in wanted or node.op_type == "Constant":
            continue
        kinds = [types.get(name) for name in node.output if name]
        if kinds and all(k == onnx.TensorProto.FLOAT for k in kinds):
            out[node.name] = len(kinds)
    return out


def lookalike_nodes(model: ModelProto, fp32_layers: Iterable[str]) -> list[str]:
    """The graph's other nodes named like a further layer of an FP32 node (`/cross_attn/Add_9` beside
    `/cross_attn/Add`): their own layers carry those names and must not be pinned."""
    island = set(fp32_layers)
    return sorted(
        node.name
        for node in model.graph.node
        if node.name not in island and is_constrained_layer(node.name, island, ())
    )


def is_constrained_layer(
    layer_name: str, fp32_layers: Mapping[str, int] | Iterable[str], other_nodes: Collection[str]
) -> bool:
    """Does a TensorRT layer belong to an FP32-island node?

    onnx-tensorrt names a node's first layer after the node and its further layers `<node>_<n>`
    (ImporterContext::generateUniqueName), so both forms match, except the name of another ONNX
    node (`other_nodes`, see `lookalike_nodes`): `/cross_attn/Add_9` is its own (integer) node, not
    a further layer of `/cross_attn/Add`.
    """
    names = fp32_layers if isinstance(fp32_layers, Mapping) else set(fp32_layers)
    if layer_name in names:
        return True
    if layer_name in other_nodes:
        return False
    base, sep, suffix = layer_name.rpartition("_")
    return bool(sep) and suffix.isdigit() and base in names


def trtexec_layer_flags(fp32_layers: Iterable[str]) -> list[str]:
    """trtexec's --layerPrecisions / --layerOutputTypes for the FP32 layers: the one source of that text.

    One output type per layer: trtexec broadcasts a single type to every output of a layer, and
    any other count must equal the layer's outputs or it aborts ("Invalid --layerOutputTypes
    flag.", samples/common/sampleEngines.cpp). A node's outputs are not its layer's (onnx-tensorrt
    imports Split as one single-output slice layer per output), so a count is never spelled.
    """
    names = list(fp32_layers)
    if not names:
        return []
    return [
        "--layerPrecisions=" + ",".join(f"{name}:fp32" for name in names),
        "--layerOutputTypes=" + ",".join(f"{name}:fp32" for name in names),
    ]


def trtexec_precision_flags(profile: TargetProfile, fp32_layers: Mapping[str, int]) -> list[str]:
    """The precision part of the trtexec line for `profile` (layer constraints for 8.x)."""
    flags = list(profile.trtexec_flags)
    if profile.precision == LAYER_CONSTRAINTS:
        flags += trtexec_layer_flags(fp32_layers)
    return flags
