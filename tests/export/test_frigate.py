"""Frigate runs our graphs: each target's export is fed the way Frigate's dfine detector feeds it
(frigate/detectors/plugins/onnx.py, read at Frigate commit e3fa701 and redone here in our own code;
its post_process_dfine is dfine_deploy/export/frigate_post.py's detector_rows), and gives the
detections our runtime gives. The artifact folder carries a frigate.yml with the exact model block and
a label map that Frigate's label reader (frigate/util/builtin.py load_labels, same commit, redone here)
reads back name for name, and is readable by any user."""

from __future__ import annotations

import stat
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest
import torch
import yaml

from dfine_deploy.artifact import read_artifact, write_artifact
from dfine_deploy.export import deepstream, frigate
from dfine_deploy.export.frigate_post import DETECTOR_ROWS, DETECTOR_SCORE, detector_rows
from dfine_deploy.export.pipeline import export_artifact
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.runtime import Detector

SIZE = 256  # the smallest square D-FINE-N takes with its 300 queries
SCORE_TOLERANCE = {"onnx": 1e-5, "openvino": 1e-4}  # OpenVINO's CPU kernels round a little differently
BOX_TOLERANCE = 2e-3  # of the input side
# OpenVINO's CPU plugin runs a graph compiled with no precision hint in BF16 where the CPU has BF16 units
# (AVX512-BF16, AMX), and Frigate's openvino detector gives none: there Frigate runs our graph in BF16,
# whose accuracy the export's own bf16:openvino gate measures. Its detections then match ours within
# BF16's rounding (8 bits of mantissa: a score to about 0.01, a box edge to about 1 px at 256).
BF16_TOLERANCE = {"score": 0.02, "box": 1.5 / SIZE}


def openvino_default_precision() -> str:
    """The precision OpenVINO's CPU plugin runs an unhinted graph at on this CPU ("bf16" or "f32")."""
    import openvino as ov

    return str(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT").to_string())


def _export(folder, target: str | None, model: str = "dfine-n"):
    """The smallest export of `target`: what Frigate reads does not depend on the batch range or FP16."""
    torch.manual_seed(0)
    export_artifact(
        ExportSettings(
            model=model,
            output=folder,
            imgsz=(SIZE, SIZE),
            batch=(1, 1, 1),
            fp16=False,
            cpu_graph=False,
            target=target,
        )
    )
    return folder


def frigate_tensor(region_rgb: np.ndarray, width: int, height: int) -> np.ndarray:
    """What Frigate hands its detector with input_tensor nchw, input_dtype float: the region resized to
    the model size, RGB, [1, H, W, 3] uint8 transposed to [1, 3, H, W], as float32 divided by 255."""
    resized = cv2.resize(region_rgb, (width, height))[None]  # [1, H, W, 3]
    return np.transpose(resized, (0, 3, 1, 2)).astype(np.float32) / 255


def frigate_inputs(tensor: np.ndarray, width: int, height: int) -> dict[str, np.ndarray]:
    """Both of Frigate's dfine detectors feed the inputs by name, the sizes int64 [[height, width]]."""
    return {"images": tensor, "orig_target_sizes": np.array([[height, width]], np.int64)}


def frigate_openvino_outputs(path: Path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Frigate's openvino detector (OpenVINOModelRunner in frigate/detectors/detection_runners.py):
    the ONNX file compiled as it is on the device, each input set by its port's index after a cast to
    the port's element type, the outputs taken by index."""
    import openvino as ov

    compiled = ov.Core().compile_model(model=str(path), device_name="CPU")
    request = compiled.create_infer_request()
    for index, port in enumerate(compiled.inputs):
        data = inputs[port.get_any_name()].astype(port.get_element_type().to_dtype())
        request.set_input_tensor(index, ov.Tensor(data))
    request.infer()
    return [request.get_output_tensor(i).data.copy() for i in range(len(compiled.outputs))]


def frigate_label_map(path: Path) -> dict[int, str]:
    """What Frigate's load_labels makes of a label file: indices 0-90 prefilled with "unknown"; when
    the first line's text before its first space is all digits, every line is "INDEX NAME" (split at
    the first space, the name stripped), else line i is the name of class i (stripped)."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    if not lines:
        return {}
    labels = dict.fromkeys(range(91), "unknown")
    if lines[0].split(" ", 1)[0].isdigit():
        for line in lines:
            index, name = line.split(" ", 1)  # a line without a space makes Frigate fail to start
            labels[int(index)] = name.strip()
    else:
        labels.update((i, line.strip()) for i, line in enumerate(lines))
    return labels


def frigate_tracked(track: list[str], labels: dict[int, str]) -> list[str]:
    """Frigate's verify_objects_track: a tracked object the label map does not name is dropped."""
    return [name for name in track if name in labels.values()]


@pytest.mark.parametrize(
    "names",
    [
        ["3 wheeler", "car"],  # a plain list starting so reads as an indexed map: Frigate fails to load
        ["2 door car", "4 door car", "van"],  # ... or, every line so, the wrong names
        ["person", "traffic light"],
        ["0", "1", "2"],
    ],
    ids=["digit-word-first", "every-line-digit-word", "plain", "numbers"],
)
def test_frigate_reads_each_class_name_back_from_the_label_map_its_snippet_names(artifact, names):
    info = read_artifact(artifact)
    info.class_names, info.num_classes = names, len(names)
    write_artifact(artifact, info)
    deepstream.write_config(artifact)  # as dfine-export writes the folder: labels.txt first
    frigate.write_snippet(artifact, info, "yard")
    model = yaml.safe_load((artifact / frigate.SNIPPET_NAME).read_text())
    where, file = model["model"]["labelmap_path"].rsplit("/", 1)
    assert where == "/config/model_cache/yard"
    try:
        labels = frigate_label_map(artifact / file)
    except ValueError as exc:
        pytest.fail(f"Frigate cannot read {file}: {exc}")
    assert [labels[i] for i in range(len(names))] == names
    assert frigate_tracked(model["objects"]["track"], labels) == names  # none dropped
    assert (artifact / "labels.txt").read_text().splitlines() == names  # DeepStream's plain list stays


@pytest.fixture(scope="module")
def scene():
    from dfine_deploy.data.moving import DemoVideo

    return cv2.cvtColor(DemoVideo(width=320, height=240).render(30), cv2.COLOR_BGR2RGB)  # Frigate's RGB


@pytest.mark.slow
@pytest.mark.parametrize("target", [None, "trt10.3", "trt10.14", "trt11"])
def test_frigate_runs_each_graph_it_can_and_finds_what_our_runtime_finds(
    tmp_path, target, scene, trained_model
):
    """The trained model's graph of each target, run by Frigate's own detector code at Frigate's own
    score threshold, finds what our runtime finds (class, score and box)."""
    profile = {"trt10.3": "jetpack6"}.get(target, target)  # JetPack 6 ships TensorRT 10.3
    folder = _export(tmp_path / "dfine-n-frigate", profile, str(trained_model.checkpoint))
    info = read_artifact(folder)
    assert (info.target["profile"]["name"] if target else None) == target
    snippet = yaml.safe_load((folder / frigate.SNIPPET_NAME).read_text())
    model = snippet["model"]
    assert model == {
        "model_type": "dfine",
        "width": SIZE,
        "height": SIZE,
        "input_tensor": "nchw",
        "input_pixel_format": "rgb",
        "input_dtype": "float",
        "path": f"/config/model_cache/{folder.name}/model.onnx",  # the folder's name, as Frigate mounts it
        "labelmap_path": f"/config/model_cache/{folder.name}/frigate_labelmap.txt",
    }
    labels = frigate_label_map(folder / frigate.LABELMAP_NAME)
    assert [labels[i] for i in range(len(info.class_names))] == info.class_names
    assert frigate_tracked(snippet["objects"]["track"], labels) == info.class_names

    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    assert [(i.name, i.type, i.shape[1:]) for i in session.get_inputs()] == [
        ("images", "tensor(float)", [3, SIZE, SIZE]),
        ("orig_target_sizes", "tensor(int64)", [2]),
    ]
    assert [o.name for o in session.get_outputs()] == [
        "labels",
        "boxes",
        "scores",
    ]  # Frigate reads by position
    tensor = frigate_tensor(scene, model["width"], model["height"])
    ours = Detector.open(folder, backend="onnxruntime", device="cpu").predict(
        [cv2.resize(scene, (SIZE, SIZE))], color="RGB"
    )[0]
    threshold = DETECTOR_SCORE
    assert (ours.scores > threshold).sum() >= 3, np.sort(ours.scores)[-5:]  # the trained model detects
    inputs = frigate_inputs(tensor, model["width"], model["height"])
    runs = {
        "onnx": session.run(None, inputs),
        "openvino": frigate_openvino_outputs(folder / "model.onnx", inputs),  # `type: openvino`
    }
    for detector, outputs in runs.items():
        rows = detector_rows(*outputs, SIZE, SIZE)  # Frigate's post_process_dfine (frigate_post.py)
        found = rows[rows[:, 1] > 0]
        assert len(found) >= 3, detector
        score_tolerance, box_tolerance = SCORE_TOLERANCE[detector], BOX_TOLERANCE
        if detector == "openvino" and openvino_default_precision() == "bf16":
            score_tolerance, box_tolerance = BF16_TOLERANCE["score"], BF16_TOLERANCE["box"]
        for label, score, y1, x1, y2, x2 in found:  # each is one of ours: class, score and box
            same = (
                (ours.labels == label)
                & np.isclose(ours.scores, score, atol=score_tolerance)
                & (np.abs(ours.boxes / SIZE - [x1, y1, x2, y2]).max(axis=1) < box_tolerance)
            )
            box = [x1, y1, x2, y2]
            assert same.any(), (
                f"Frigate's {detector} detection {label:.0f} {score:.4f} {box} is not among ours"
            )
        assert len(rows) == DETECTOR_ROWS

    assert stat.S_IMODE(folder.stat().st_mode) == 0o755
    for path in folder.iterdir():  # a container's non-root user can read a plain copy
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path.name


def test_a_tensorrt8_export_gets_a_snippet_that_refuses_and_says_why(tmp_path):
    from dfine_deploy.artifact import ArtifactInfo
    from dfine_deploy.export import targets

    profile = targets.get_profile("jetpack5")
    info = ArtifactInfo(
        model="n", num_classes=2, class_names=["a", "b"], input_height=SIZE, input_width=SIZE,
        target={"profile": profile.to_dict()},
    )  # fmt: skip
    refusal = frigate.frigate_refusal(info)
    assert refusal and "int32" in refusal and "without --target" in refusal
    text = frigate.snippet_text(info, "jp5")
    assert "Frigate cannot run it" in text and yaml.safe_load(text) is None  # comments only, no model block
    assert frigate.write_snippet(tmp_path, info, "jp5") == [tmp_path / frigate.SNIPPET_NAME]  # no label map
    assert frigate.frigate_refusal(ArtifactInfo(model="n", num_classes=2, class_names=["a", "b"],
                                                input_height=SIZE, input_width=SIZE)) is None  # fmt: skip


@pytest.mark.slow
def test_frigates_onnx_detector_cannot_feed_a_tensorrt8_graph_and_its_openvino_detector_can(
    jetpack5_artifact,
):
    """What the TensorRT 8 refusal says, by the runtimes themselves: onnxruntime refuses the int64 sizes
    of Frigate's onnx detector for the graph's int32 input; Frigate's openvino path casts them and runs."""
    folder = jetpack5_artifact
    info = read_artifact(folder)
    assert "onnx detector" in (frigate.frigate_refusal(info) or "")
    width, height = info.input_width, info.input_height
    inputs = frigate_inputs(np.zeros((1, 3, height, width), np.float32), width, height)
    session = ort.InferenceSession(str(folder / "model.onnx"), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match=r"(?i)unexpected input data type.*int64.*int32"):
        session.run(None, inputs)
    labels, boxes, scores = frigate_openvino_outputs(folder / "model.onnx", inputs)
    assert boxes.shape == (1, info.num_top_queries, 4) and labels.shape == scores.shape == (
        1,
        info.num_top_queries,
    )
