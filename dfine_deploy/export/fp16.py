"""Typed FP16 ONNX: FP16 weights and activations, with FP32 islands where D-FINE needs them.

A *typed* graph carries its precision in the tensors themselves, which is what TensorRT 10's
`--stronglyTyped` and TensorRT 11 (strong typing only, no FP16 builder flag) build from. The
conversion is onnxconverter-common's `convert_float_to_float16(keep_io_types=True)` (inputs and
outputs stay float32) plus our block list of nodes that stay FP32:

* FDR box decoding: the decoder's own ops (reference points, `distance2bbox`, the integral over the
  corner distribution and its softmax, LQE) and the box heads, whose errors FDR accumulates layer
  after layer;
* the deformable attention (`cross_attn`): sampling offsets -> pixel coordinates -> bilinear weights.
  In FP16 a coordinate of 600 px has a spacing of 0.5 px, so the bilinear weights would be
  quantised to halves;
* query selection (encoder scores, anchors, top-k): FP16 ties would change which queries survive;
* the postprocessor (sigmoid, top-k over queries x classes, box scaling to pixels);
* normalisations that overflow in FP16: LayerNormalization, every node of a LayerNorm that opset 16
  decomposes (ReduceMean/Sub/Pow/Add/Sqrt/Div in a `norm` scope, --target trt8.5), Softmax, and
  the converter's own default block list (TopK, Resize, Range, ...);
* data-driven: any node whose output exceeds `data_max` in magnitude on the calibration images
  (the idea of ModelOpt AutoCast's `data_max`), so an unexpected large activation is not clipped.

The node names come from the legacy exporter's module scopes (`/model/decoder/decoder/layers.0/
cross_attn/...`), which follow the official state_dict names this project keeps.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from dfine_deploy.errors import ExportError, MissingDependency

if TYPE_CHECKING:
    from onnx import ModelProto

# Scopes (regular expressions searched in node names) that stay FP32, by reason.
FP32_SCOPES: dict[str, str] = {
    "postprocessor": r"(^|/)postprocessor(/|$)",
    "fdr_box_decoding": r"/decoder/decoder/(?!layers\.)",  # TransformerDecoder's own ops, integral, LQE
    "box_heads": r"/decoder/(dec_bbox_head|pre_bbox_head|enc_bbox_head)",
    "deformable_sampling": r"/cross_attn/",
    "query_selection": r"/decoder/(enc_score_head|enc_output)/|/decoder/[^/]+$",
    # a LayerNorm module (norm1, norm3, gateway/norm) that opset 16 decomposed into elementwise ops
    "layer_norm": r"/norm\d*/(ReduceMean|Sub|Pow|Add|Sqrt|Div|Mul)(_\d+)?$",
}
# Operator types that stay FP32 wherever they are.
FP32_OP_TYPES: tuple[str, ...] = (
    "LayerNormalization",
    "ReduceMean",
    "ReduceSumSquare",
    "Pow",
    "Sqrt",
    "Softmax",
    "GridSample",
)
DATA_MAX = 4096.0  # |activation| above which a node stays FP32 (FP16 max is 65504; spacing there is 32)


@dataclass
class Fp16Recipe:
    """What `convert` keeps in FP32; stored in the sidecar so the graph can be rebuilt."""

    scopes: dict[str, str] = field(default_factory=lambda: dict(FP32_SCOPES))
    op_types: tuple[str, ...] = FP32_OP_TYPES
    data_max: float | None = DATA_MAX

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Fp16Result:
    model: Any  # onnx.ModelProto
    fp32_nodes: dict[str, int]  # reason -> node count
    total_nodes: int
    recipe: dict[str, Any]
    kept: dict[str, str] = field(default_factory=dict)  # node name -> reason it stays FP32

    def summary(self) -> dict[str, Any]:
        kept = sum(self.fp32_nodes.values())
        return {
            "recipe": self.recipe,
            "fp32_nodes": self.fp32_nodes,
            "fp32_fraction": round(kept / max(self.total_nodes, 1), 4),
            "total_nodes": self.total_nodes,
        }


def island_nodes(model: ModelProto, recipe: Fp16Recipe) -> dict[str, str]:
    """Node name -> reason, for every node the recipe keeps FP32 by scope or operator type."""
    patterns = {reason: re.compile(rx) for reason, rx in recipe.scopes.items()}
    keep: dict[str, str] = {}
    for node in model.graph.node:
        for reason, rx in patterns.items():
            if rx.search(node.name):
                keep[node.name] = reason
                break
        else:
            if node.op_type in recipe.op_types:
                keep[node.name] = f"op:{node.op_type}"
    return keep


def large_activation_nodes(
    model: ModelProto, feeds: Sequence[dict[str, np.ndarray]], data_max: float
) -> list[str]:
    """Nodes with a float output above `data_max` in magnitude on the given inputs (FP32 run)."""
    import onnx
    import onnxruntime as ort

    inferred = onnx.shape_inference.infer_shapes(model)
    float_values = {
        vi.name
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output)
        if vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    }
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    existing = {o.name for o in probe.graph.output}
    producer = {}
    for node in probe.graph.node:
        for out in node.output:
            if out in float_values:
                producer[out] = node.name
                if out not in existing:
                    probe.graph.output.append(
                        onnx.helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, None)
                    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # see every tensor
    options.log_severity_level = 3
    session = ort.InferenceSession(probe.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    hot: set[str] = set()
    for feed in feeds:
        for name, value in zip(names, session.run(names, feed)):
            floating = name in producer and value.size and np.issubdtype(value.dtype, np.floating)
            if floating and float(np.nanmax(np.abs(value))) > data_max:
                hot.add(producer[name])
    return sorted(hot)


def convert(
    model: ModelProto,
    recipe: Fp16Recipe | None = None,
    *,
    calibration: Sequence[dict[str, np.ndarray]] = (),
) -> Fp16Result:
    """Convert an FP32 graph into a typed FP16 graph with FP32 islands and FP32 inputs/outputs."""
    try:
        from onnxconverter_common import float16
    except ImportError as exc:
        raise MissingDependency("onnxconverter_common", "train", "the typed FP16 export") from exc

    recipe = recipe or Fp16Recipe()
    keep = island_nodes(model, recipe)
    if recipe.data_max is not None and calibration:
        for name in large_activation_nodes(model, calibration, recipe.data_max):
            keep.setdefault(name, "large_activation")
    unnamed = [n for n in model.graph.node if not n.name]
    if unnamed:
        raise ExportError(
            f"{len(unnamed)} graph nodes have no name, so the FP32 islands cannot be placed; "
            "export the FP32 graph with dfine-export (the legacy exporter names every node)"
        )
    model = _split_shared_initializers(model, set(keep))
    _drop_interface_value_info(model)
    converted = float16.convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=list(float16.DEFAULT_OP_BLOCK_LIST) + list(recipe.op_types),
        node_block_list=sorted(keep),
        disable_shape_infer=False,
    )
    _align_cast_targets(converted, {n.name for n in model.graph.node if n.op_type == "Cast"})
    _restore_float_outputs(converted, model)
    counts: dict[str, int] = {}
    for reason in keep.values():
        counts[reason] = counts.get(reason, 0) + 1
    return Fp16Result(converted, counts, len(model.graph.node), recipe.to_dict(), keep)


def _drop_interface_value_info(model: ModelProto) -> None:
    """Remove value_info entries that repeat a graph input or output (in place).

    onnxslim leaves them in the opset-16 graph, and onnxconverter-common then types such an output
    float16 and raises "The downstream node of the second cast node should be graph output".
    """
    interface = {v.name for v in [*model.graph.input, *model.graph.output]}
    kept = [v for v in model.graph.value_info if v.name not in interface]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)


def _split_shared_initializers(model: ModelProto, fp32_nodes: set[str]):
    """Give FP32-island nodes their own copy of initializers they share with FP16 nodes.

    onnxslim merges identical constants (zero biases, scales), and the converter types a shared
    initializer once: whichever side loses then sees the wrong type and onnxruntime refuses the graph.
    """
    import onnx

    model_copy = onnx.ModelProto()
    model_copy.CopyFrom(model)
    inits = {init.name: init for init in model_copy.graph.initializer}
    consumers: dict[str, set[bool]] = {}
    for node in model_copy.graph.node:
        for name in node.input:
            if name in inits:
                consumers.setdefault(name, set()).add(node.name in fp32_nodes)
    shared = {name for name, sides in consumers.items() if len(sides) == 2}
    for name in sorted(shared):
        twin = onnx.TensorProto()
        twin.CopyFrom(inits[name])
        twin.name = f"{name}__fp32"
        model_copy.graph.initializer.append(twin)
    for node in model_copy.graph.node:
        if node.name in fp32_nodes:
            for i, name in enumerate(node.input):
                if name in shared:
                    node.input[i] = f"{name}__fp32"
    return model_copy


def _align_cast_targets(model: ModelProto, original_casts: set[str]) -> None:
    """Make every Cast agree with the type recorded for its output.

    onnxconverter-common leaves two kinds of mismatch: the graph's own FP16-side `Cast(to=FLOAT)`
    (int -> float) gets a float16 output type but keeps `to=FLOAT` (the type is right, the
    attribute is fixed), and the casts it inserts after FP32 islands keep a stale float32 output
    type (the attribute is right, the type is fixed). onnxruntime refuses either.
    """
    import onnx

    infos = {vi.name: vi for vi in model.graph.value_info}
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)
    for node in model.graph.node:
        info = infos.get(node.output[0]) if node.op_type == "Cast" else None
        if info is None:
            continue
        recorded = info.type.tensor_type
        for attr in node.attribute:
            if attr.name != "to" or attr.i not in floats or recorded.elem_type not in floats:
                continue
            if node.name in original_casts:
                attr.i = recorded.elem_type
            else:
                recorded.elem_type = attr.i


def _restore_float_outputs(converted: ModelProto, original: ModelProto) -> None:
    """Give back float32 to graph outputs that the converter left in float16.

    With keep_io_types the converter still casts a blocked node's output (TopK's scores) back to
    float16 when that output is also a graph output; the interface promises float32.
    """
    import onnx

    want = {o.name: o.type.tensor_type.elem_type for o in original.graph.output}
    for out in converted.graph.output:
        tensor_type = out.type.tensor_type
        if want.get(out.name) != onnx.TensorProto.FLOAT or tensor_type.elem_type != onnx.TensorProto.FLOAT16:
            continue
        producer = next(n for n in converted.graph.node if out.name in n.output)
        if producer.op_type == "Cast":
            for attr in producer.attribute:
                if attr.name == "to":
                    attr.i = onnx.TensorProto.FLOAT
        else:
            half = out.name + "_fp16"
            producer.output[list(producer.output).index(out.name)] = half
            converted.graph.node.append(
                onnx.helper.make_node(
                    "Cast", [half], [out.name], name=out.name + "_to_fp32", to=onnx.TensorProto.FLOAT
                )
            )
        tensor_type.elem_type = onnx.TensorProto.FLOAT


def precision_counts(model: ModelProto) -> dict[str, int]:
    """Float tensor element types of a graph's initializers: {'float16': n, 'float32': m}."""
    import onnx

    counts: dict[str, int] = {}
    for init in model.graph.initializer:
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16):
            key = "float16" if init.data_type == onnx.TensorProto.FLOAT16 else "float32"
            counts[key] = counts.get(key, 0) + (int(np.prod(init.dims)) if init.dims else 1)
    return counts


def is_typed_fp16(model: ModelProto) -> bool:
    """True when most float weights are FP16 (the graph encodes its own precision)."""
    counts = precision_counts(model)
    return counts.get("float16", 0) > counts.get("float32", 0)
