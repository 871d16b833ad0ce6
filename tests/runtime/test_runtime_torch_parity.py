"""The real D-FINE-N on the torch backend and, exported, on onnxruntime: the same detections.
The torch backend runs channels-last convolutions on the CPU; the graph is NCHW.

Tolerance (FP32 on the CPU for both): of each frame's 50 highest-scoring torch detections, at
least 98 % have an onnxruntime detection of the same class with IoU >= 0.95, no matched box
differs by more than 0.5 px (frames are 320-640 px) and no matched score by more than 1e-3.
Both sides come from one saved checkpoint: torch loads the .pth, the graph is exported from it
by the export area's `export_onnx`.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from dfine_deploy.errors import BackendError
from dfine_deploy.runtime import Detector
from dfine_deploy.runtime.compare import compare_detections

torch = pytest.importorskip("torch")
SIZE = 320


def export_artifact(checkpoint: Path, folder: Path) -> Path:
    """The export area's `export_onnx` (trace, onnxslim, checker, interface check) + a sidecar."""
    from dfine_deploy.artifact import ArtifactInfo, GraphInfo, write_artifact
    from dfine_deploy.export.onnx import export_onnx
    from dfine_deploy.files import sha256_file
    from dfine_deploy.hub.loader import load_model
    from dfine_deploy.model.dfine import DeployModel

    folder.mkdir(parents=True)
    loaded = load_model(checkpoint, imgsz=(SIZE, SIZE))
    export_onnx(
        DeployModel(loaded.model, loaded.postprocessor), folder / "model.onnx", height=SIZE, width=SIZE
    )
    write_artifact(
        folder,
        ArtifactInfo(
            model="dfine-n",
            num_classes=loaded.spec.num_classes,
            class_names=loaded.class_names,
            input_height=SIZE,
            input_width=SIZE,
            graphs={"fp32": GraphInfo("model.onnx", sha256_file(folder / "model.onnx"), "fp32", 17)},
        ),
    )
    return folder


@pytest.fixture(scope="module")
def dfine_n(tmp_path_factory):
    from dfine_deploy.hub.loader import load_model

    folder = tmp_path_factory.mktemp("dfine_n")
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # random weights: said loudly by the hub
        loaded = load_model("dfine-n", imgsz=(SIZE, SIZE))
    checkpoint = folder / "dfine_n.pth"
    torch.save({"model": loaded.model.state_dict(), "meta": {"class_names": loaded.class_names}}, checkpoint)
    return checkpoint, export_artifact(checkpoint, folder / "artifact")


def scenes(count: int) -> list[np.ndarray]:
    """BGR frames of coloured rectangles on smooth backgrounds, several sizes."""
    import cv2

    rng = np.random.default_rng(3)
    frames = []
    for i in range(count):
        height, width = [(480, 640), (320, 320), (360, 500)][i % 3]
        small = rng.integers(0, 256, (6, 8, 3), dtype=np.uint8)
        frame = cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC)
        for _ in range(4):
            x, y = int(rng.integers(0, width - 60)), int(rng.integers(0, height - 60))
            cv2.rectangle(
                frame,
                (x, y),
                (x + int(rng.integers(20, 60)), y + int(rng.integers(20, 60))),
                tuple(int(c) for c in rng.integers(0, 256, 3)),
                -1,
            )
        frames.append(frame)
    return frames


@pytest.mark.slow
def test_torch_and_onnxruntime_backends_agree_on_dfine_n(dfine_n):
    checkpoint, artifact = dfine_n
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        on_torch = Detector.open(checkpoint, backend="torch", device="cpu", imgsz=(SIZE, SIZE))
    on_ort = Detector.open(artifact, backend="onnxruntime", device="cpu")
    assert on_torch.provider == "cpu fp32" and on_ort.provider == "CPUExecutionProvider"
    module = on_torch.backend.module
    kernels = [t for t in [*module.parameters(), *module.buffers()] if t.dim() == 4]  # incl. folded Conv+BN
    assert kernels and all(k.is_contiguous(memory_format=torch.channels_last) for k in kernels)
    assert on_torch.input_size == on_ort.input_size == (SIZE, SIZE)
    assert on_torch.class_names == on_ort.class_names
    frames = scenes(3)
    torch_results, ort_results = on_torch.predict(frames), on_ort.predict(frames)
    for frame, result in zip(frames, torch_results):
        assert len(result) == 300  # num_top_queries, no threshold
        height, width = frame.shape[:2]
        assert result.boxes[:, [0, 2]].mean() < width and result.boxes[:, [1, 3]].mean() < height
    agreement = compare_detections(torch_results, ort_results, top_k=50, iou_threshold=0.95)
    assert agreement.match_rate >= 0.98, agreement
    assert agreement.max_box_diff_px <= 0.5, agreement
    assert agreement.max_score_diff <= 1e-3, agreement


def test_a_size_name_runs_on_torch_only():
    with pytest.raises(BackendError, match="export it first: dfine-export dfine-n"):
        Detector.open("dfine-n", backend="onnxruntime")
