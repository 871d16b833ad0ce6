"""Thresholds per class at export: each gate's own detections on --data choose them, model.json keeps
them per graph and backend, and the DeepStream config and Triton's config carry one per class
(frigate.yml its own, measured inside Frigate's post-processing). The suite's trained model, exported
once with --data (`trained_export`), is read, never re-exported: a model that detects chooses a
threshold for every class."""

from __future__ import annotations

import json
import shutil

import yaml

from dfine_deploy.artifact import GATE_BACKEND, read_artifact
from dfine_deploy.export import deepstream, frigate, triton
from dfine_deploy.thresholds import MATCH_IOU, MIN_INSTANCES

# Frigate's FilterConfig (frigate/config/camera/objects.py, read at commit 0b02fe0): its fields, each
# `objects.filters.<label>` may hold only these (FrigateBaseModel forbids others); min_score and threshold
# are floats
FRIGATE_FILTER_FIELDS = {"min_area", "max_area", "min_ratio", "max_ratio", "threshold", "min_score", "mask"}


def test_the_export_records_thresholds_for_each_graph_on_each_backend_its_gate_ran(
    trained_export, trained_model
):
    info = read_artifact(trained_export)
    val_images = len(json.loads((trained_model.val / "annotations.json").read_text())["images"])
    ran = {key for key, gate in info.parity.items() if gate.get("run") is not False}
    assert set(info.thresholds) == ran  # one entry per gate that ran: a graph on a backend
    for key, record in info.thresholds.items():
        assert (record["rule"], record["images"], record["iou"]) == ("f1", val_images, MATCH_IOU), key
        assert set(record["classes"]) == set(info.class_names), key  # the trained model finds every class
        for name, choice in record["classes"].items():
            assert 0 < choice["threshold"] < 1, (key, name, choice)
            assert choice["f1"] > 0.3 and choice["instances"] >= MIN_INSTANCES, (key, name, choice)


def test_deepstream_and_triton_configs_carry_one_threshold_per_class_and_frigates_only_measured_ones(
    trained_export, tmp_path
):
    folder = tmp_path / "artifact"
    shutil.copytree(trained_export, folder)
    info = read_artifact(folder)
    on_fp32 = info.chosen_thresholds("model.onnx", GATE_BACKEND)
    assert len(on_fp32) == len(info.class_names)

    # frigate.yml's filters are not our runtime's thresholds: chosen inside Frigate's post-processing
    # (tests/export/test_frigate_thresholds.py), and valid FilterConfig fields
    objects = yaml.safe_load((folder / frigate.SNIPPET_NAME).read_text())["objects"]
    assert set(objects["track"]) == set(info.class_names)
    assert set(objects.get("filters", {})) <= set(info.class_names)
    for entry in objects.get("filters", {}).values():
        assert set(entry) <= FRIGATE_FILTER_FIELDS
        assert entry["min_score"] == entry["threshold"] and 0.5 <= entry["threshold"] < 1

    deepstream.write_config(folder)
    config = (folder / deepstream.CONFIG_NAME).read_text()
    engine_graph = "model.fp16.onnx"  # nvinfer builds from the typed FP16 graph: its thresholds
    assert f"onnx-file={engine_graph}" in config
    # a class's own threshold only where the one chosen on half of the data beat the default on the
    # other half (tests/export/test_deepstream_config.py reads the file as nvinfer does)
    held_out = info.threshold_record(engine_graph, GATE_BACKEND)["held_out"]["classes"]
    for index, name in enumerate(info.class_names):
        written = f"[class-attrs-{index}]\n" in config
        assert written == held_out[name]["kept"], name
        if written:
            section = config.split(f"[class-attrs-{index}]\n", 1)[1].split("\n", 1)[0]
            assert section == f"pre-cluster-threshold={held_out[name]['threshold']:.4f}"
    assert "[class-attrs-all]\npre-cluster-threshold=0.25" in config  # for a class without one

    text = triton.config_text(
        info, name="dfine_onnx", platform="onnxruntime_onnx", options=triton.TritonSettings()
    )
    parsed = triton.validate_config_text(text)  # Triton's own schema (tritonclient, a dev dependency)
    assert {k: float(v.string_value) for k, v in parsed.parameters.items()} == {
        f"{triton.THRESHOLD_PARAMETER}{name}": on_fp32[name] for name in info.class_names
    }


def test_a_threshold_target_without_annotated_data_or_outside_0_1_is_refused_in_one_line(tmp_path, capsys):
    import cv2
    import numpy as np

    from dfine_deploy.export.cli import main

    plain = tmp_path / "plain"
    plain.mkdir()
    cv2.imwrite(str(plain / "a.jpg"), np.full((64, 64, 3), 90, np.uint8))
    option = "give a precision in (0, 1], e.g. 0.9, with --data DIR holding annotations"
    for extra, target, says in (
        ([], "0.9", option),
        (["--data", str(plain)], "1.5", option),
        (["--data", str(plain)], "0.9", f"--data {plain} holds no annotations to choose thresholds on"),
    ):
        args = ["dfine-n", "-o", str(tmp_path / "out"), "--imgsz", "256", "256", "--threshold-target", target]
        assert main([*args, *extra]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()[-1:]
        assert line.startswith(f"error: --threshold-target {float(target)}: ") and says in line, line
    assert not (tmp_path / "out").exists()


def test_the_holdout_benchmark_runs_on_the_trained_export(trained_export, trained_model):
    """benchmarks/thresholds_holdout.py on the trained model: thresholds chosen on half of the
    validation images are scored on the other half, beside the default threshold."""
    from benchmarks.thresholds_holdout import holdout

    val_images = len(json.loads((trained_model.val / "annotations.json").read_text())["images"])
    rows = holdout(trained_export, trained_model.val.parent, "fp32", None)
    assert [r["chosen_on"] for r in rows] == ["even", "odd"]
    for row in rows:
        assert (
            sum(row["images"]) == val_images and row["graph"] == "model.grid.onnx"
        )  # onnxruntime's CPU graph
        assert set(row["thresholds"]) >= {"rectangle", "ellipse", "triangle", "ring"}, row["thresholds"]
        assert 0.3 < row["macro_f1_default"] <= 1 and 0.3 < row["macro_f1_chosen"] <= 1, row
