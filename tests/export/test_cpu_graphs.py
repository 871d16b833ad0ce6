"""CPU graphs: the GridSample graph and the INT8 QDQ graph, each gated in onnxruntime and OpenVINO."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dfine_deploy.artifact import BF16_GATE_KEY, read_artifact
from dfine_deploy.data.synthetic import write_split
from dfine_deploy.export import int8 as int8_export
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export.cli import main as export_main
from dfine_deploy.export.fp16 import Fp16Recipe, island_nodes
from dfine_deploy.export.pipeline import ExportSettings, export_artifact
from dfine_deploy.runtime import Detector, openvino_backend

pytestmark = [
    pytest.mark.filterwarnings("ignore::UserWarning", "ignore::torch.jit.TracerWarning"),
    pytest.mark.run_last,  # see tests/conftest.py
]
SIZE = 256  # the smallest square D-FINE-N takes with 300 queries (16x16 + 8x8 tokens)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    write_split(root, "val", 8, seed=3, size=SIZE)
    return root


@pytest.fixture(scope="module")
def artifact(tmp_path_factory, data):
    torch.manual_seed(0)
    out = tmp_path_factory.mktemp("cpu") / "dfine_n"
    export_artifact(
        ExportSettings(
            model="dfine-n",
            output=out,
            imgsz=(SIZE, SIZE),
            batch=(1, 1, 2),
            fp16=False,
            int8=True,
            data=data,
            calibration_images=4,
        )
    )
    return out


def test_cpu_graphs_are_written_gated_and_named_per_backend(artifact, data):
    info = read_artifact(artifact)
    assert {"model.onnx", "model.grid.onnx", "model.int8.onnx"} <= {p.name for p in artifact.iterdir()}
    assert info.graphs["fp32"].sampler == "gather" and info.graphs["fp32-grid"].sampler == "grid"
    bf16 = info.parity[BF16_GATE_KEY]  # random weights: run rank-free where the CPU has BF16 units
    bf16_graph = {"bf16": "fp32-grid"} if bf16["passed"] else {}
    assert info.backend_graphs == {
        "onnxruntime:cpu": {"fp32": "fp32-grid", "int8": "int8"},
        "openvino": {"fp32": "fp32-grid", "int8": "int8", **bf16_graph},
    }
    if "BF16" in openvino_backend.cpu_capabilities():
        assert bf16["run"] and bf16["rank_free"] and bf16["candidate"] == "model.grid.onnx on OpenVINO BF16"
    else:
        assert bf16 == {"run": False, "passed": False, "reason": openvino_backend.bf16_unsupported_reason()}
    for key in ("fp32", "fp32-grid", "fp32-grid:openvino", "int8", "int8:openvino"):
        assert info.parity[key]["passed"], (key, info.parity[key]["failures"])
        assert set(info.parity[key]["dataset_ap"]) == {"reference", "candidate"}  # mAP compared (COCO --data)
    assert info.parity["fp32-grid:openvino"]["box_precision"] == 1.0
    recipe = info.graphs["int8"].recipe
    assert recipe["quantizer"].startswith("nncf") and recipe["calibration_images"] == 4
    assert recipe["calibration_data"] == str(data.resolve()) and recipe["source_graph"] == "model.grid.onnx"
    assert recipe["file_mb"]["int8"] < 0.5 * recipe["file_mb"]["fp32"]
    assert recipe["fp32_islands"]["deformable_sampling"] > 0 and recipe["quantized_ops"]["Conv"] > 0
    assert recipe["recipe"] == "stem1-fp32" and recipe["declined_recipes"] == {}  # the fastest one passed
    assert recipe["fp32_islands"]["input_conv"] > 0
    assert (
        not list(artifact.glob("**/*.blob")) and not (artifact / "ov_cache").exists()
    )  # gates ship no cache


def test_gridsample_only_in_the_cpu_graph_and_no_quantizer_inside_the_fp32_islands(artifact):
    gather = onnx_export.op_counts(onnx_export.load(artifact / "model.onnx"))
    grid = onnx_export.op_counts(onnx_export.load(artifact / "model.grid.onnx"))
    assert gather.get("GridSample", 0) == 0 and grid["GridSample"] > 0
    quantized = onnx_export.load(artifact / "model.int8.onnx")
    islands = island_nodes(quantized, Fp16Recipe(scopes=dict(int8_export.INT8_RECIPES["stem1-fp32"])))
    dequantized = {o for n in quantized.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    inside = [n.name for n in quantized.graph.node if n.name in islands and dequantized & set(n.input)]
    assert islands and not inside
    stem_convs = [n.name for n in quantized.graph.node if "/backbone/stem/" in n.name and n.op_type == "Conv"]
    first = [name for name in stem_convs if "/stem1/" in name]
    assert first and set(first) <= set(islands)  # the convolution that sees raw pixels stays FP32
    int8_convs = {n.name for n in quantized.graph.node if n.op_type == "Conv" and dequantized & set(n.input)}
    assert set(stem_convs) - set(first) <= int8_convs  # the rest of the stem runs in INT8


def test_both_cpu_backends_run_the_int8_graph_and_agree(artifact):
    frame = (np.indices((200, 300)).sum(0) % 256).astype(np.uint8)[..., None].repeat(3, -1)
    results = {}
    for backend in ("onnxruntime", "openvino"):
        detector = Detector.open(artifact, backend=backend, device="cpu", precision="int8")
        assert detector.source.endswith("model.int8.onnx")
        results[backend] = detector.predict([frame])[0]
    ort, ov = results["onnxruntime"], results["openvino"]
    assert len(ort) == len(ov) == 300
    assert np.abs(ort.scores - ov.scores).max() < 0.05  # the same INT8 arithmetic up to kernel order


def test_onnxruntime_quantizer_is_the_fallback_and_keeps_the_islands(toy_onnx, scene_batches, tmp_path):
    model = onnx_export.load(toy_onnx)
    feeds = [{"images": b.images, "orig_target_sizes": b.orig_sizes} for b in scene_batches]
    result = int8_export.quantize(model, feeds, quantizer="onnxruntime")
    assert result.quantizer.startswith("onnxruntime") and result.quantized_ops.get("Conv", 0) == 3
    assert not {"LayerNormalization", "Softmax"} & set(result.quantized_ops)  # operator-type islands
    onnx_export.save(result.model, tmp_path / "int8.onnx")
    session = onnx_export.ort_session(tmp_path / "int8.onnx")
    labels, boxes, scores = session.run(None, feeds[0])
    assert boxes.shape == (1, 30, 4) and np.isfinite(scores).all()


def test_a_recipe_that_fails_the_gate_gives_way_to_the_next(tmp_path, data, monkeypatch):
    """The fastest recipe's graph is refused by the gate (here: made to fail), so the export falls
    back to the next recipe, and model.json says which one was declined and why."""
    from dfine_deploy.export import graphs

    real_gate, quantized_with = graphs._gate, []
    real_quantize = int8_export.quantize

    def quantize(*args, recipe, **kwargs):
        quantized_with.append(recipe)
        return real_quantize(*args, recipe=recipe, **kwargs)

    def gate(reference, candidate, batches, thresholds, names, *rest, **kwargs):
        report = real_gate(reference, candidate, batches, thresholds, names, *rest, **kwargs)
        if thresholds is graphs.parity.INT8_GATE and quantized_with[-1] == "stem1-fp32":
            report.failures.append("dataset mAP 1.4 below the reference (made to fail)")
            report.passed = False
        return report

    monkeypatch.setattr(int8_export, "quantize", quantize)
    monkeypatch.setattr(graphs, "_gate", gate)
    out = tmp_path / "fallback"
    torch.manual_seed(0)
    settings = dict(model="dfine-n", imgsz=(SIZE, SIZE), batch=(1, 1, 1), fp16=False, int8=True, data=data)
    export_artifact(ExportSettings(output=out, calibration_images=2, **settings))
    recipe = read_artifact(out).graphs["int8"].recipe
    assert quantized_with == ["stem1-fp32", "stem-fp32"] and recipe["recipe"] == "stem-fp32"
    assert "made to fail" in recipe["declined_recipes"]["stem1-fp32"]
    assert recipe["fp32_islands"]["input_stem"] > 0


def test_int8_without_data_is_one_clear_error(tmp_path, capsys):
    assert export_main(["dfine-n", "-o", str(tmp_path / "x"), "--int8"]) == 2
    err = capsys.readouterr().err
    assert "--int8 needs --data DIR" in err and "Traceback" not in err


def test_bf16_gate_not_run_on_a_cpu_without_bf16_units_is_recorded_and_printed(
    monkeypatch, caplog, capsys, tmp_path
):
    from dfine_deploy.artifact import ArtifactInfo
    from dfine_deploy.export import graphs, pipeline

    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ("FP32", "INT8"))
    with caplog.at_level("WARNING"):
        record = graphs._bf16_gate(None, tmp_path / "model.grid.onnx", [], None, None, threads=1)
    reason = "this CPU has no BF16 units (OpenVINO's CPU OPTIMIZATION_CAPABILITIES are ['FP32', 'INT8']"
    assert record["run"] is False and not record["passed"] and record["reason"].startswith(reason)
    assert f"{BF16_GATE_KEY} gate not run: {reason}" in caplog.text and "will be refused" in caplog.text
    info = ArtifactInfo("custom", 1, ["a"], 256, 256, parity={BF16_GATE_KEY: record})
    monkeypatch.setattr(pipeline, "export_artifact", lambda settings: info)  # the printing, not the export
    assert export_main(["dfine-n", "-o", str(tmp_path / "x")]) == 0
    assert f"  {BF16_GATE_KEY}: not run: {reason}" in capsys.readouterr().out
