"""The network-level rules trtexec applies to --layerPrecisions / --layerOutputTypes, emulated on an
ONNX graph as TensorRT 8.5/8.6's ONNX parser imports it (the only versions our lines pin layers on).

An independent reading of NVIDIA's sources, kept apart from dfine_deploy/export/targets.py on
purpose (the product must not grade itself). The rules and the lines they come from are listed in
docs/tensorrt.md ("How trtexec lines are verified"):

- layer names (onnx-tensorrt ImporterContext::registerLayer and generateUniqueName): every layer an
  importer registers for a node gets the node's name; the first keeps it, later ones become
  `<node>_<n>`, n from one counter shared by the whole network. So the layer named exactly like a
  node is that node's first registered layer.
- Constant makes no layer (registerLayer: "No layer will be added for Constant nodes").
- importers that never call registerLayer leave their layer with TensorRT's default name, so no
  layer carries the node's name: 8.6's LayerNormalization (onnx-tensorrt release/8.6-GA, commit
  6ba67d3428e0, builtin_op_importers.cpp: addNormalization, then RETURN_FIRST_OUTPUT with no
  registerLayer; registered from commit 73f629e04a68, June 2024, after 8.6). UNNAMED below.
- Split registers one single-output slice layer per output (builtin_op_importers.cpp, Split).
- every other node's first layer has the node's outputs.
- trtexec (samples/common/sampleEngines.cpp, setLayerPrecisions / setLayerOutputTypes) matches
  exact layer names only on 8.x; a layer given k output types needs k == 1 (broadcast) or k == its
  output count, else "Invalid --layerOutputTypes flag."; a name that matches no layer is ignored.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

NO_LAYER = frozenset({"Constant"})
ONE_LAYER_PER_OUTPUT = frozenset({"Split"})
FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16})
# TensorRT major.minor -> node types whose importer there registers no layer under the node's name
UNNAMED: dict[str, frozenset[str]] = {"8.5": frozenset(), "8.6": frozenset({"LayerNormalization"})}


def first_layers(model: onnx.ModelProto, tensorrt: str = "8.5") -> dict[str, tuple[int, list[int | None]]]:
    """Node name -> (outputs, ONNX element types of those outputs) of the layer named like the node,
    as TensorRT `tensorrt`'s (8.5 or 8.6) ONNX parser names its layers."""
    inferred = onnx.shape_inference.infer_shapes(model)
    types = {
        v.name: v.type.tensor_type.elem_type
        for v in [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    }
    layers: dict[str, tuple[int, list[int | None]]] = {}
    for node in model.graph.node:
        if node.op_type in NO_LAYER or node.op_type in UNNAMED[tensorrt]:
            continue
        outputs = [name for name in node.output if name]
        if node.op_type in ONE_LAYER_PER_OUTPUT:
            outputs = outputs[:1]
        layers[node.name] = (len(outputs), [types.get(name) for name in outputs])
    return layers


def _specs(argv: Sequence[str], flag: str) -> dict[str, list[str]]:
    """`--flag=a:fp32,b:fp32+fp16` -> {"a": ["fp32"], "b": ["fp32", "fp16"]} (trtexec's own split)."""
    out: dict[str, list[str]] = {}
    for arg in argv:
        if arg.startswith(flag + "="):
            for item in arg.split("=", 1)[1].split(","):
                name, _, types = item.rpartition(":")
                out[name] = types.split("+")
    return out


def layer_flag_problems(model: onnx.ModelProto, argv: Sequence[str], tensorrt: str = "8.5") -> list[str]:
    """What TensorRT `tensorrt`'s (8.5 or 8.6) trtexec would do wrong with these layer flags on this
    graph: its own errors (the output-type count), and names that pin nothing or a non-float layer."""
    layers = first_layers(model, tensorrt)
    problems: list[str] = []
    for flag in ("--layerPrecisions", "--layerOutputTypes"):
        for name, types in _specs(argv, flag).items():
            if name not in layers:
                problems.append(f"{flag}: '{name}' names no layer of the network: it pins nothing")
                continue
            count, elem_types = layers[name]
            if flag == "--layerOutputTypes" and len(types) != 1 and len(types) != count:
                problems.append(
                    f"Layer {name} has {count} outputs but {len(types)} output types are given in "
                    "--layerOutputTypes flag. Invalid --layerOutputTypes flag."
                )
            if any(t not in FLOAT_TYPES for t in elem_types):
                problems.append(f"{flag}: '{name}' is an integer layer; FP32 cannot be forced on it")
    return problems
