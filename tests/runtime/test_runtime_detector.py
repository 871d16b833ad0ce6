"""Detector over onnxruntime on graphs with the exact export interface (real onnxruntime, no fakes)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import cv2
import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from dfine_deploy.artifact import ArtifactInfo, GraphInfo, write_artifact
from dfine_deploy.errors import BackendError, MissingDependency
from dfine_deploy.files import sha256_file
from dfine_deploy.images import resize_as_trained
from dfine_deploy.runtime import Detections, Detector
from dfine_deploy.runtime.preprocess import letterbox_batch, resize_batch
from tests.runtime.tiny_graphs import dfine_like, yolo_like

SIZE = 64


def make_artifact(folder: Path, batch_max: int = 8, classes: int = 5) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    graph = dfine_like(folder / "model.onnx", classes=classes)
    info = ArtifactInfo(
        model="custom",
        num_classes=classes,
        class_names=[f"thing{i}" for i in range(classes)],
        input_height=SIZE,
        input_width=SIZE,
        batch_max=batch_max,
        graphs={"fp32": GraphInfo(file="model.onnx", sha256=sha256_file(graph), precision="fp32", opset=17)},
    )
    write_artifact(folder, info)
    return folder


def frames(count: int, seed: int = 1) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = [(48, 80), (120, 90), (64, 64), (33, 101), (200, 150), (70, 40)]
    return [rng.integers(0, 256, (*shapes[i % len(shapes)], 3), dtype=np.uint8) for i in range(count)]


def reference_outputs(graph: Path, frame_bgr: np.ndarray) -> dict[str, np.ndarray]:
    """The tiny graph's arithmetic redone in numpy from its stored weights (independent of ORT)."""
    weights = {t.name: numpy_helper.to_array(t) for t in onnx.load(graph).graph.initializer}
    rgb = cv2.cvtColor(resize_as_trained(frame_bgr, (SIZE, SIZE)), cv2.COLOR_BGR2RGB)
    mean = rgb.reshape(-1, 3).mean(axis=0) / 255.0  # [3] per RGB channel
    cxcywh = 1 / (1 + np.exp(-(mean @ weights["w_box"]))).reshape(-1, 4)
    xyxy = np.concatenate([cxcywh[:, :2] - cxcywh[:, 2:] / 2, cxcywh[:, :2] + cxcywh[:, 2:] / 2], 1)
    height, width = frame_bgr.shape[:2]
    scores = 1 / (1 + np.exp(-(mean @ weights["w_score"])))
    classes = (mean @ weights["w_cls"]).reshape(len(scores), -1)
    return {"boxes": xyxy * [width, height, width, height], "scores": scores, "labels": classes.argmax(1)}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("artifact"))


def test_preprocess_resizes_swaps_and_scales_in_one_pass():
    batch = frames(3)
    images, sizes = resize_batch(batch, (32, 48), "BGR")
    assert images.shape == (3, 3, 32, 48) and images.dtype == np.float32
    assert sizes.tolist() == [[f.shape[1], f.shape[0]] for f in batch]  # (w, h)
    for image, frame in zip(images, batch):
        rgb = cv2.cvtColor(resize_as_trained(frame, (48, 32)), cv2.COLOR_BGR2RGB)
        expected = rgb.transpose(2, 0, 1) / 255.0
        np.testing.assert_allclose(image, expected, atol=1e-6)
    rgb_images, _ = resize_batch([cv2.cvtColor(f, cv2.COLOR_BGR2RGB) for f in batch], (32, 48), "RGB")
    np.testing.assert_array_equal(rgb_images, images)


def test_letterbox_transform_maps_network_pixels_back_to_the_frame():
    frame = np.zeros((100, 200, 3), np.uint8)
    frame[40:60, 50:150] = 255  # a white bar
    images, transforms = letterbox_batch([frame], (64, 64))
    gain, pad_x, pad_y = (float(v) for v in transforms[0])
    assert gain == pytest.approx(64 / 200) and pad_x == 0 and pad_y == 16
    ys, xs = np.nonzero(images[0, 0] > 0.99)  # fully white network pixels
    assert (xs.min() - pad_x) / gain == pytest.approx(50, abs=1 / gain + 1e-3)
    assert (ys.min() - pad_y) / gain == pytest.approx(40, abs=1 / gain + 1e-3)
    assert images[0, :, 0, 0] == pytest.approx(114 / 255)  # padding grey


def test_onnxruntime_detector_matches_numpy_reference(artifact):
    detector = Detector.open(artifact, backend="onnxruntime", device="cpu")
    assert detector.provider == "CPUExecutionProvider" and detector.backend_name == "onnxruntime"
    assert detector.input_size == (SIZE, SIZE)
    batch = frames(4)
    results = detector.predict(batch)
    assert len(results) == 4
    for frame, result in zip(batch, results):
        ref = reference_outputs(artifact / "model.onnx", frame)
        assert isinstance(result, Detections)
        assert result.boxes.dtype == np.float32 and result.labels.dtype == np.int64
        np.testing.assert_allclose(result.boxes, ref["boxes"], rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(result.scores, ref["scores"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(result.labels, ref["labels"])
        assert result.names == [f"thing{i}" for i in ref["labels"]]
        assert result.class_names is result.names


def test_colour_convention_bgr_default(artifact):
    detector = Detector.open(artifact, device="cpu")
    frame = np.zeros((40, 40, 3), np.uint8)
    frame[..., 0] = 255  # pure blue in OpenCV's BGR order
    as_bgr = detector.predict([frame])[0]
    as_rgb = detector.predict([frame[..., ::-1].copy()], color="RGB")[0]
    wrong = detector.predict([frame], color="RGB")[0]  # blue read as red
    np.testing.assert_array_equal(as_bgr.boxes, as_rgb.boxes)
    assert not np.allclose(as_bgr.scores, wrong.scores)


def test_batches_are_split_into_chunks_of_max_batch(tmp_path):
    small = make_artifact(tmp_path / "b2", batch_max=2)
    detector = Detector.open(small, device="cpu")
    assert detector.max_batch == 2 and "model.json" in detector.info["max_batch_source"]
    batch = frames(5)
    together = detector.predict(batch)
    alone = [detector.predict([f])[0] for f in batch]
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-3)
        np.testing.assert_array_equal(a.labels, b.labels)


def test_score_threshold_filters(artifact):
    batch = frames(3)
    full = Detector.open(artifact, device="cpu").predict(batch)
    threshold = float(np.median(np.concatenate([r.scores for r in full])))
    kept = Detector.open(artifact, device="cpu", score_threshold=threshold).predict(batch)
    for a, b in zip(full, kept):
        mask = a.scores > threshold
        np.testing.assert_array_equal(b.scores, a.scores[mask])
        np.testing.assert_array_equal(b.boxes, a.boxes[mask])
        assert len(b.names) == len(b)


def test_plain_onnx_without_sidecar_uses_requested_size_and_coco_names(tmp_path):
    graph = dfine_like(tmp_path / "bare.onnx", classes=80)
    detector = Detector.open(graph, imgsz=(96, 128))
    assert detector.input_size == (96, 128) and detector.class_names[0] == "person"
    # names follow the graph's class count: COCO only for 80 classes, else class_<i>, with a note
    other = Detector.open(dfine_like(tmp_path / "seven.onnx", classes=7), imgsz=(96, 128))
    assert other.class_names == [f"class_{i}" for i in range(7)]
    assert "class_<index>" in other.class_names_note
    fixed = dfine_like(tmp_path / "fixed.onnx", size=64)
    with pytest.raises(BackendError, match="re-export"):
        Detector.open(fixed, imgsz=(96, 96))


def test_options_an_artifact_cannot_take_are_refused_not_ignored(artifact):
    """An artifact folder holds D-FINE at its recorded size: another adapter or another size is one
    clear refusal (before, both were dropped without a word); the recorded size itself is accepted."""
    with pytest.raises(BackendError, match=r"adapter='yolo': .* D-FINE artifact.*leave adapter out"):
        Detector.open(artifact, adapter="yolo")
    with pytest.raises(BackendError, match=rf"takes \[{SIZE}, {SIZE}\] .*not the requested \[96, 96\]"):
        Detector.open(artifact, imgsz=(96, 96))
    assert Detector.open(artifact, imgsz=(SIZE, SIZE)).input_size == (SIZE, SIZE)
    with pytest.raises(BackendError, match="adapter='yolo': dfine-n is a D-FINE size"):
        Detector.open("dfine-n", backend="torch", adapter="yolo")


def test_yolo_adapter_decodes_letterboxed_boxes_with_nms(tmp_path):
    size, classes = 64, 3
    # four anchors: two overlapping class-1 boxes (NMS keeps the better), one class-2, one below threshold
    table = np.zeros((4 + classes, 4), np.float32)
    table[:4, 0] = [32, 32, 20, 20]
    table[:4, 1] = [33, 32, 20, 20]
    table[:4, 2] = [10, 40, 8, 8]
    table[:4, 3] = [50, 50, 4, 4]
    table[4 + 1, 0], table[4 + 1, 1], table[4 + 2, 2], table[4 + 0, 3] = 0.9, 0.8, 0.6, 0.1
    graph = yolo_like(tmp_path / "yolo.onnx", table, size, names={0: "a", 1: "b", 2: "c"})
    detector = Detector.open(graph, adapter="yolo", device="cpu")
    assert detector.class_names == ["a", "b", "c"]
    wide, tall = np.zeros((100, 200, 3), np.uint8), np.zeros((128, 64, 3), np.uint8)
    results = detector.predict([wide, tall])
    # wide: gain 64/200 = 0.32, pad (0, 16); tall: gain 0.5, pad (16, 0)
    for result, (gain, px, py), (h, w) in zip(
        results, [(0.32, 0, 16), (0.5, 16, 0)], [(100, 200), (128, 64)]
    ):
        assert result.names == ["b", "c"]
        np.testing.assert_allclose(result.scores, [0.9, 0.6], rtol=1e-6)
        expected = np.array([[22, 22, 42, 42], [6, 36, 14, 44]], np.float32)
        expected = ((expected - [px, py, px, py]) / gain).clip(0, [w, h, w, h])
        np.testing.assert_allclose(result.boxes, expected, rtol=1e-5, atol=1e-3)


def test_bad_inputs_say_what_to_do(tmp_path, artifact):
    with pytest.raises(BackendError, match="missing.onnx: no such file or folder"):
        Detector.open(tmp_path / "missing.onnx")
    with pytest.raises(BackendError, match="no model.json"):
        Detector.open(tmp_path)
    with pytest.raises(BackendError, match="backend 'tensorflow' is unknown"):
        Detector.open(artifact, backend="tensorflow")
    with pytest.raises(BackendError, match="onnxruntime-gpu"):
        Detector.open(artifact, backend="onnxruntime:cuda")
    with pytest.raises(BackendError, match="no TensorRT engine"):
        Detector.open(artifact, backend="tensorrt")
    for threads in (0, -2, 1.5, 10**12):
        with pytest.raises(BackendError, match=rf"threads={threads!r}: expected a whole number in 1\.\.1024"):
            Detector.open(artifact, threads=threads)
    graph = artifact / "model.onnx"
    for backend, precision in (("auto", "int8"), ("onnxruntime", "fp16"), ("openvino", "int8")):
        with pytest.raises(BackendError, match=r"precision='\w+' chooses a graph of an artifact folder"):
            Detector.open(graph, backend=backend, precision=precision)  # one file: nothing to choose
    yolo = yolo_like(tmp_path / "y.onnx", np.zeros((6, 3), np.float32), 32)
    with pytest.raises(BackendError, match="adapter='yolo'"):
        Detector.open(yolo)
    detector = Detector.open(artifact, device="cpu")
    with pytest.raises(BackendError, match="uint8"):
        detector.predict([np.zeros((10, 10, 3), np.float32)])
    with pytest.raises(BackendError, match="HxWx3"):
        detector.predict([np.zeros((10, 10), np.uint8)])
    with pytest.raises(BackendError, match="channel order"):
        detector.predict(frames(1), color="BRG")


@pytest.mark.parametrize(
    ("frame", "said"),
    [
        (None, "frame 0: got None, not an image (cv2.imread returns None for a file it cannot read"),
        ([np.zeros((8, 8, 3), np.uint8), None], "frame 1: got None"),
        ("photo.jpg", "frame 0: got the path 'photo.jpg', not an image; read it first"),
        (np.zeros((10, 12), np.uint8), "got shape (10, 12); convert grayscale"),
        (np.zeros((10, 12, 4), np.uint8), "got shape (10, 12, 4); drop the alpha channel"),
        (np.zeros((3, 10, 12), np.uint8), "got shape (3, 10, 12); it is channels-first"),
    ],
    ids=["none", "none-in-a-list", "path", "gray", "bgra", "chw"],
)
def test_a_frame_that_is_no_image_is_named_with_its_fix(artifact, frame, said):
    """`predict(cv2.imread(missing))` was a TypeError traceback; a grayscale frame was reported as
    frames of shape (W,), and a BGRA or channels-first frame got the grayscale advice."""
    detector = Detector.open(artifact, device="cpu")
    with pytest.raises(BackendError) as refused:
        detector.predict(frame)
    assert said in str(refused.value), refused.value


def test_tensorrt_backend_without_tensorrt_names_the_extra(tmp_path, monkeypatch):
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"not an engine")
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails as when it is not installed
    with pytest.raises(MissingDependency, match=r"-e '\.\[trt-cu12\]'.*trt-cu13.*python3-libnvinfer"):
        Detector.open(engine)


def test_cuda_python_memory_without_a_driver_is_a_clear_error():
    pytest.importorskip("cuda.bindings.runtime")
    from dfine_deploy.runtime.cuda_memory import CudartMemory

    rt = __import__("cuda.bindings.runtime", fromlist=["x"])
    if rt.cudaGetDeviceCount()[0] == rt.cudaError_t.cudaSuccess:
        pytest.skip("a CUDA device is present")
    with pytest.raises(BackendError, match="CUDA failed while selecting GPU 0"):
        CudartMemory(0)


def predict_in_a_fresh_process(artifact: Path, **open_args: str) -> dict:
    """One frame through `Detector.open(artifact, **open_args)` in a new interpreter: how many
    detections came out, and whether torch was imported on the way."""
    code = textwrap.dedent(
        f"""
        import json, sys
        import numpy as np
        from dfine_deploy.runtime import Detector
        det = Detector.open({str(artifact)!r}, **{open_args!r})
        out = det.predict([np.zeros((50, 60, 3), np.uint8)])
        print(json.dumps({{"n": len(out[0]), "torch": "torch" in sys.modules}}))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_runtime_and_onnxruntime_predict_import_no_torch(artifact):
    assert predict_in_a_fresh_process(artifact, device="cpu") == {"n": 6, "torch": False}


def test_a_graph_swapped_inside_the_artifact_is_refused(tmp_path, monkeypatch):
    """The sidecar's sha256 is checked when the artifact opens (cached by size+mtime)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = make_artifact(tmp_path / "a", classes=5)
    with Detector.open(folder, backend="onnxruntime") as det:  # the untouched folder opens
        assert det.class_names[0] == "thing0"
    assert (tmp_path / "cache" / "dfine-deploy" / "sha256.json").is_file()  # the cheap path for next time
    dfine_like(tmp_path / "other.onnx", classes=5, queries=7)  # same interface, another graph
    (folder / "model.onnx").write_bytes((tmp_path / "other.onnx").read_bytes())
    for target in (folder, folder / "model.onnx"):
        with pytest.raises(BackendError, match=r"model.onnx: its sha256 .* not the one model.json records"):
            Detector.open(target, backend="onnxruntime")


def test_the_hash_cache_is_used_only_for_the_same_file_state(tmp_path, monkeypatch):
    from dfine_deploy import files as files_module

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    path = tmp_path / "blob.bin"
    path.write_bytes(b"a" * 1000)
    first = files_module.cached_sha256(path)
    calls = []
    monkeypatch.setattr(files_module, "sha256_file", lambda p: calls.append(p) or "recomputed")
    assert files_module.cached_sha256(path) == first and not calls  # unchanged: no hashing
    path.write_bytes(b"b" * 1001)
    assert files_module.cached_sha256(path) == "recomputed" and len(calls) == 1
