"""ONNX export, interface checks and the typed FP16 conversion on the toy detector (seconds)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch

from dfine_deploy.errors import ExportError, ModelError
from dfine_deploy.export import fp16, parity
from dfine_deploy.export import onnx as onnx_export


def _torch_runner(model):
    def run(images, sizes):
        with torch.no_grad():
            return tuple(t.numpy() for t in model(torch.from_numpy(images), torch.from_numpy(sizes)))

    return run


def test_export_has_official_interface_and_dynamic_batch(toy_onnx):
    model = onnx_export.load(toy_onnx)
    interface = onnx_export.verify_interface(model, source=str(toy_onnx))
    assert interface["images"] == ("float32", ["N", 3, 320, 320])
    assert interface["orig_target_sizes"][0] == "int64"
    assert interface["labels"][0] == "int64" and interface["boxes"][0] == "float32"
    assert onnx_export.opset_of(model) == 17
    assert not any(init.data_location == onnx.TensorProto.EXTERNAL for init in model.graph.initializer)
    session = onnx_export.ort_session(toy_onnx)
    for batch in (1, 3, 8):
        images = np.random.default_rng(batch).random((batch, 3, 320, 320), dtype=np.float32)
        sizes = np.array([[640, 480]] * batch, dtype=np.int64)
        labels, boxes, scores = session.run(None, {"images": images, "orig_target_sizes": sizes})
        assert labels.shape[0] == boxes.shape[0] == scores.shape[0] == batch


def test_onnxruntime_matches_torch(toy_model, toy_onnx, scene_batches):
    runner = onnx_export.ort_runner(onnx_export.ort_session(toy_onnx))
    report = parity.run_gate(
        _torch_runner(toy_model),
        runner,
        scene_batches,
        parity.FP32_GATE,
        reference_name="torch",
        candidate_name="onnx",
    )
    assert report.passed, report.summary()
    assert report.score_max_abs < 1e-4 and report.batch_sizes == [1, 2, 4]


def test_low_opset_is_refused_with_the_reason(toy_model, tmp_path):
    with pytest.raises(ExportError, match="LayerNorm"):
        onnx_export.export_onnx(toy_model, tmp_path / "m.onnx", height=320, width=320, opset=16)
    assert not (tmp_path / "m.onnx").exists()


def test_input_size_not_multiple_of_32_is_refused(toy_model, tmp_path):
    with pytest.raises(ModelError, match="--imgsz 320 320"):
        onnx_export.export_onnx(toy_model, tmp_path / "m.onnx", height=330, width=320)


def test_graph_without_expected_tensors_is_refused(tmp_path):
    x = onnx.helper.make_tensor_value_info("input", onnx.TensorProto.FLOAT, [1, 3])
    y = onnx.helper.make_tensor_value_info("output", onnx.TensorProto.FLOAT, [1, 3])
    graph = onnx.helper.make_graph([onnx.helper.make_node("Relu", ["input"], ["output"])], "g", [x], [y])
    path = tmp_path / "other.onnx"
    onnx.save(onnx.helper.make_model(graph), path)
    with pytest.raises(ExportError, match=r"missing inputs \['images', 'orig_target_sizes'\]"):
        onnx_export.verify_interface(onnx_export.load(path), source=str(path))


def test_fp16_graph_is_typed_keeps_fp32_io_and_passes_the_gate(toy_onnx, scene_batches):
    fp32 = onnx_export.load(toy_onnx)
    feeds = [{"images": scene_batches[0].images, "orig_target_sizes": scene_batches[0].orig_sizes}]
    result = fp16.convert(fp32, calibration=feeds)
    assert fp16.is_typed_fp16(result.model)
    assert result.fp32_nodes.get("op:LayerNormalization") == 1 and result.fp32_nodes.get("op:Softmax") == 1
    onnx_export.verify_interface(result.model, source="fp16")  # float32 in, float32 out
    kept = {n.name for n in result.model.graph.node if n.op_type == "LayerNormalization"}
    ln_input_types = {vi.name: vi.type.tensor_type.elem_type for vi in result.model.graph.value_info}
    for node in result.model.graph.node:
        if node.name in kept:
            assert ln_input_types.get(node.output[0], onnx.TensorProto.FLOAT) == onnx.TensorProto.FLOAT
    path = toy_onnx.parent / "model.fp16.onnx"
    onnx_export.save(result.model, path)
    runner16 = onnx_export.ort_runner(onnx_export.ort_session(path))
    runner32 = onnx_export.ort_runner(onnx_export.ort_session(toy_onnx))
    report = parity.run_gate(
        runner32,
        runner16,
        scene_batches,
        parity.FP16_GATE,
        reference_name="onnx-fp32",
        candidate_name="onnx-fp16",
    )
    assert report.passed, report.summary()
    assert 0 < report.score_max_abs < 5e-3


def test_large_activations_stay_fp32(toy_onnx, scene_batches):
    model = onnx_export.load(toy_onnx)
    feeds = [{"images": scene_batches[0].images, "orig_target_sizes": scene_batches[0].orig_sizes}]
    # Pixel boxes of a 640-wide image exceed 100 but the normalised ones do not.
    hot = fp16.large_activation_nodes(model, feeds, data_max=100.0)
    ops = {n.name: n.op_type for n in model.graph.node}
    assert hot and all(
        ops[name] in {"Mul", "GatherElements", "Concat", "Add", "Sub", "Tile", "Cast", "Gather"}
        for name in hot
    ), hot
    assert not fp16.large_activation_nodes(model, feeds, data_max=1e6)


def test_no_postprocess_graph_has_raw_outputs_and_runs_through_the_numpy_postprocessor(tmp_path):
    class Raw(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 9, 32, stride=32)

        def forward(self, images):
            out = self.conv(images).flatten(2).transpose(1, 2)  # [B, Q, 9]
            return out[..., :5], out[..., 5:].sigmoid()  # logits [B,Q,5], cxcywh [B,Q,4]

    path = tmp_path / "raw.onnx"
    onnx_export.export_onnx(Raw().eval(), path, height=64, width=96, postprocess=False)
    interface = onnx_export.verify_interface(onnx_export.load(path), source=str(path), postprocess=False)
    assert sorted(interface) == ["images", "pred_boxes", "pred_logits"]
    with pytest.raises(ExportError, match="missing inputs"):
        onnx_export.verify_interface(onnx_export.load(path), source=str(path), postprocess=True)
    run = onnx_export.ort_runner(onnx_export.ort_session(path), postprocess=False, num_top_queries=4)
    images = np.random.default_rng(0).random((2, 3, 64, 96), dtype=np.float32)
    labels, boxes, scores = run(images, np.array([[96, 64], [192, 128]], dtype=np.int64))
    assert labels.shape == (2, 4) and boxes.shape == (2, 4, 4) and np.all(np.diff(scores, axis=1) <= 0)
    assert boxes[1].max() > boxes[0].max()  # scaled to each image's own size
