"""A tiny ONNX graph with D-FINE's interface whose answer a test can work out by hand.

images float32 [N,3,S,S] RGB in [0,1], orig_target_sizes int64 [N,2] (w,h) ->
labels int64 [N,1] = 0, boxes float32 [N,1,4] = (0, 0, w, h), scores float32 [N,1] = mean of the
red channel. A red frame scores ~1 and a blue one ~0, so the test also catches a BGR/RGB mix-up.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def red_score_model(path: Path, size: int = 64) -> Path:
    def const(name: str, value) -> onnx.TensorProto:
        return numpy_helper.from_array(np.asarray(value), name)

    nodes = [
        helper.make_node("ReduceMean", ["images", "hw_axes"], ["mean"], keepdims=0),  # [N, 3]
        helper.make_node("Slice", ["mean", "zero", "one", "one"], ["scores"]),  # [N, 1] red (RGB order)
        helper.make_node("Mul", ["scores", "zero_f"], ["zeros"]),  # [N, 1]
        helper.make_node("Cast", ["zeros"], ["labels"], to=TensorProto.INT64),  # [N, 1]
        helper.make_node("Cast", ["orig_target_sizes"], ["wh"], to=TensorProto.FLOAT),  # [N, 2]
        helper.make_node("Mul", ["wh", "zero_f"], ["origin"]),  # [N, 2]
        helper.make_node("Concat", ["origin", "wh"], ["xyxy"], axis=1),  # [N, 4]
        helper.make_node("Unsqueeze", ["xyxy", "one"], ["boxes"]),  # [N, 1, 4]
    ]
    graph = helper.make_graph(
        nodes,
        "red_score",
        [
            helper.make_tensor_value_info("images", TensorProto.FLOAT, ["N", 3, size, size]),
            helper.make_tensor_value_info("orig_target_sizes", TensorProto.INT64, ["N", 2]),
        ],
        [
            helper.make_tensor_value_info("labels", TensorProto.INT64, ["N", 1]),
            helper.make_tensor_value_info("boxes", TensorProto.FLOAT, ["N", 1, 4]),
            helper.make_tensor_value_info("scores", TensorProto.FLOAT, ["N", 1]),
        ],
        [
            const("hw_axes", np.array([2, 3], np.int64)),
            const("zero", np.array([0], np.int64)),
            const("one", np.array([1], np.int64)),
            const("zero_f", np.array(0.0, np.float32)),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, str(path))
    return path
