"""Small ONNX graphs with the exact tensor interfaces the runtime meets, built with onnx.helper.

`dfine_like`: inputs images float32 [N,3,H,W] + orig_target_sizes int64 [N,2] (w,h) -> labels int64
[N,K], boxes float32 [N,K,4] xyxy px, scores float32 [N,K]; every output depends on the image's
mean colour per channel, so frames, channel order and batch position all change the result.
`yolo_like`: images [N,3,H,W] -> output0 [N,4+C,A], a fixed prediction table (plus 0 x input so that
the batch dimension stays dynamic).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _const(name: str, array: np.ndarray):
    return numpy_helper.from_array(np.asarray(array), name)


def dfine_like(
    path: Path, *, queries: int = 6, classes: int = 5, size: int | None = None, batch: int | str = "N"
) -> Path:
    """Write the D-FINE-interface graph; `size` fixes H=W, `batch` fixes N when an int."""
    rng = np.random.default_rng(0)
    spatial = [size, size] if size else ["H", "W"]
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["mean"], axes=[2, 3], keepdims=0),  # [N, 3]
        helper.make_node("MatMul", ["mean", "w_box"], ["box_raw"]),  # [N, K*4]
        helper.make_node("Sigmoid", ["box_raw"], ["box_sig"]),
        helper.make_node("Reshape", ["box_sig", "shape_box"], ["cxcywh"]),  # [N, K, 4] normalised
        helper.make_node("Slice", ["cxcywh", "s0", "s2", "s_axis"], ["center"]),  # [N, K, 2]
        helper.make_node("Slice", ["cxcywh", "s2", "s4", "s_axis"], ["wh"]),
        helper.make_node("Mul", ["wh", "half"], ["half_wh"]),
        helper.make_node("Sub", ["center", "half_wh"], ["top_left"]),
        helper.make_node("Add", ["center", "half_wh"], ["bottom_right"]),
        helper.make_node("Concat", ["top_left", "bottom_right"], ["xyxy"], axis=2),  # [N, K, 4]
        helper.make_node("Cast", ["orig_target_sizes"], ["sizes_f"], to=TensorProto.FLOAT),  # [N, 2]
        helper.make_node("Concat", ["sizes_f", "sizes_f"], ["whwh"], axis=1),  # [N, 4]
        helper.make_node("Unsqueeze", ["whwh", "axis1"], ["whwh3"]),  # [N, 1, 4]
        helper.make_node("Mul", ["xyxy", "whwh3"], ["boxes"]),
        helper.make_node("MatMul", ["mean", "w_score"], ["score_raw"]),  # [N, K]
        helper.make_node("Sigmoid", ["score_raw"], ["scores"]),
        helper.make_node("MatMul", ["mean", "w_cls"], ["cls_raw"]),  # [N, K*C]
        helper.make_node("Reshape", ["cls_raw", "shape_cls"], ["cls_logits"]),  # [N, K, C]
        # the class head's bias under the name an exported D-FINE graph keeps (zero: no effect)
        helper.make_node("Add", ["cls_logits", "model.decoder.enc_score_head.bias"], ["cls"]),
        helper.make_node("ArgMax", ["cls"], ["labels"], axis=2, keepdims=0),  # [N, K] int64
    ]
    inits = [
        _const("w_box", rng.normal(0, 2, (3, queries * 4)).astype(np.float32)),
        _const("shape_box", np.array([0, queries, 4], np.int64)),
        _const("s0", np.array([0], np.int64)),
        _const("s2", np.array([2], np.int64)),
        _const("s4", np.array([4], np.int64)),
        _const("s_axis", np.array([2], np.int64)),
        _const("half", np.array(0.5, np.float32)),
        _const("axis1", np.array([1], np.int64)),
        _const("w_score", rng.normal(0, 3, (3, queries)).astype(np.float32)),
        _const("w_cls", rng.normal(0, 3, (3, queries * classes)).astype(np.float32)),
        _const("shape_cls", np.array([0, queries, classes], np.int64)),
        _const("model.decoder.enc_score_head.bias", np.zeros(classes, np.float32)),
    ]
    graph = helper.make_graph(
        nodes,
        "dfine_like",
        [
            helper.make_tensor_value_info("images", TensorProto.FLOAT, [batch, 3, *spatial]),
            helper.make_tensor_value_info("orig_target_sizes", TensorProto.INT64, [batch, 2]),
        ],
        [
            helper.make_tensor_value_info("labels", TensorProto.INT64, [batch, queries]),
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, [batch, queries, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, [batch, queries]),
        ],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def yolo_like(path: Path, table: np.ndarray, size: int, names: dict[int, str] | None = None) -> Path:
    """Write a YOLO-layout graph whose output0 is `table` [4+C, A] for every image."""
    nodes = [
        helper.make_node("ReduceMean", ["images"], ["mean"], axes=[1, 2, 3], keepdims=1),  # [N,1,1,1]
        helper.make_node("Squeeze", ["mean", "axis3"], ["mean3"]),  # [N, 1, 1]
        helper.make_node("Mul", ["mean3", "zero"], ["zeros"]),
        helper.make_node("Add", ["zeros", "table"], ["output0"]),  # [N, 4+C, A]
    ]
    inits = [
        _const("axis3", np.array([3], np.int64)),
        _const("zero", np.array(0.0, np.float32)),
        _const("table", table[None].astype(np.float32)),
    ]
    graph = helper.make_graph(
        nodes,
        "yolo_like",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, size, size])],
        [helper.make_tensor_value_info("output0", TensorProto.FLOAT, ["N", *table.shape])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    if names is not None:
        helper.set_model_props(model, {"names": repr(names)})
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path
