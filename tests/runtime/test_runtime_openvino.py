"""Detector over OpenVINO (real OpenVINO CPU plugin), and the per-backend graph choice of model.json."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dfine_deploy.artifact import BF16_GATE_KEY, ArtifactInfo, GraphInfo, read_artifact, write_artifact
from dfine_deploy.errors import BackendError, MissingDependency
from dfine_deploy.files import sha256_file
from dfine_deploy.runtime import Detector, openvino_backend
from tests.runtime.test_runtime_detector import (
    SIZE,
    frames,
    make_artifact,
    predict_in_a_fresh_process,
    reference_outputs,
)
from tests.runtime.tiny_graphs import dfine_like


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("ov_artifact"))


def test_openvino_detector_matches_numpy_reference_and_caches_the_compiled_graph(artifact):
    detector = Detector.open(artifact, backend="openvino", device="cpu")
    assert detector.backend_name == "openvino" and detector.provider.startswith("OpenVINO")
    assert detector.input_size == (SIZE, SIZE) and detector.max_batch == 8
    batch = frames(5)
    for frame, result in zip(batch, detector.predict(batch), strict=True):
        ref = reference_outputs(artifact / "model.onnx", frame)
        np.testing.assert_allclose(result.boxes, ref["boxes"], rtol=1e-4, atol=1e-3)
        np.testing.assert_allclose(result.scores, ref["scores"], rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(result.labels, ref["labels"])
    assert detector.info["raw_pixels"]  # resized uint8 BGR frames in; OpenVINO scales, swaps, transposes
    assert detector.info["compiled_batches"] == [1, 4]  # 5 images ran as chunks of 4 and 1
    rgb = [np.ascontiguousarray(f[..., ::-1]) for f in batch]
    for from_rgb, from_bgr in zip(detector.predict(rgb, color="RGB"), detector.predict(batch), strict=True):
        np.testing.assert_array_equal(from_rgb.boxes, from_bgr.boxes)
    cache = Path(detector.info["cache_dir"])
    assert cache == artifact / "ov_cache" and any(cache.iterdir())  # the compiled blob, reused next open
    again = Detector.open(artifact / "model.onnx", backend="openvino")
    np.testing.assert_array_equal(again.predict(batch[:1])[0].boxes, detector.predict(batch[:1])[0].boxes)


def test_batches_of_1_to_8_compile_each_size_once_and_never_again(artifact):
    """A server whose live stream count changes meets every batch size from 1 to its --max-batch: after
    `prepare_batches` no batch compiles anything, and each image's result is the one it gets alone."""
    detector = Detector.open(artifact, backend="openvino", device="cpu")
    backend = detector.backend
    assert backend.batch_sizes == (1, 2, 4, 8) and backend.compiles == 1  # batch 1, at open
    backend.prepare_batches(8)
    assert detector.info["compiled_batches"] == [1, 2, 4, 8] and backend.compiles == 4
    batch = frames(8)
    alone = [detector.predict([frame])[0] for frame in batch]
    for n in [5, 8, 3, 7, 1, 6, 2, 4, 7, 5]:
        for result, expected in zip(detector.predict(batch[:n]), alone, strict=False):
            np.testing.assert_allclose(result.boxes, expected.boxes, rtol=1e-5, atol=1e-4)
            np.testing.assert_array_equal(result.labels, expected.labels)
    assert backend.compiles == 4  # no batch size compiled again


def test_without_preparing_each_size_compiles_once_when_first_met(artifact):
    backend = Detector.open(artifact, backend="openvino", device="cpu").backend
    runs = [openvino_backend.split_batch(n, backend.batch_sizes) for n in range(1, 9)]
    assert runs[4] == [4, 1] and runs[6] == [4, 2, 1]  # chunks of compiled sizes, nothing padded
    feeds = {"images": np.zeros((8, SIZE, SIZE, 3), np.uint8), "orig_target_sizes": np.ones((8, 2), np.int64)}
    for _ in range(3):
        for n in range(1, 9):
            outputs = backend.run({name: value[:n] for name, value in feeds.items()})
            assert all(len(value) == n for value in outputs.values())
    assert backend.compiles == 4 and sorted(backend._compiled) == [1, 2, 4, 8]


@pytest.mark.parametrize(("largest", "sizes"), [(1, (1,)), (6, (1, 2, 4, 6)), (32, (1, 2, 4, 8, 16, 32))])
def test_batch_sizes_are_the_powers_of_two_below_the_largest(largest, sizes):
    assert openvino_backend.batch_sizes(largest) == sizes
    assert all(sum(openvino_backend.split_batch(n, sizes)) == n for n in range(1, largest + 1))


def test_a_fixed_batch_graph_runs_fewer_images_padded_and_drops_the_padding(tmp_path):
    graph = dfine_like(tmp_path / "fixed.onnx", size=SIZE, batch=4)
    detector = Detector.open(graph, backend="openvino", device="cpu")
    assert detector.max_batch == 4
    batch = frames(3)
    results = detector.predict(batch)
    assert len(results) == 3
    for frame, result in zip(batch, results, strict=True):
        ref = reference_outputs(graph, frame)
        np.testing.assert_allclose(result.boxes, ref["boxes"], rtol=1e-4, atol=1e-3)
    assert detector.backend.compiles == 1


def test_each_backend_runs_the_graph_model_json_names(tmp_path):
    folder = make_artifact(tmp_path / "a")
    grid = dfine_like(folder / "model.grid.onnx", classes=5)
    info = json.loads((folder / "model.json").read_text())
    info = ArtifactInfo.from_dict(info)
    info.graphs["fp32-grid"] = GraphInfo("model.grid.onnx", sha256_file(grid), "fp32", 17, sampler="grid")
    info.backend_graphs = {"onnxruntime:cpu": {"fp32": "fp32-grid"}, "openvino": {"fp32": "fp32-grid"}}
    write_artifact(folder, info)
    assert Path(Detector.open(folder, backend="openvino").source).name == "model.grid.onnx"
    assert Path(Detector.open(folder, backend="onnxruntime", device="cpu").source).name == "model.grid.onnx"
    assert Path(Detector.open(folder, backend="onnxruntime:cpu").source).name == "model.grid.onnx"
    with pytest.raises(BackendError, match=r"no int8 graph for openvino .*dfine-export --int8"):
        Detector.open(folder, backend="openvino", precision="int8")


def test_openvino_refuses_a_gpu_device_and_names_the_extra_when_missing(artifact, monkeypatch):
    with pytest.raises(BackendError, match="runs on the CPU"):
        Detector.open(artifact, backend="openvino", device="cuda")
    monkeypatch.setitem(sys.modules, "openvino", None)  # as if not installed
    with pytest.raises(MissingDependency, match=r"pip install -e '\.\[cpu\]'"):
        Detector.open(artifact, backend="openvino")


def test_openvino_backend_imports_no_torch(artifact):
    assert predict_in_a_fresh_process(artifact, backend="openvino") == {"n": 6, "torch": False}


def test_backends_released_first_opened_first_leave_signal_handlers_working(artifact):
    """Two graphs opened, then released in the order they were opened, then a Python-handled signal:
    with one OpenVINO Core per graph this process died with SIGSEGV here, faulthandler silent
    (openvino_backend.shared_core says why), as the one-process test suite did at a SIGCHLD."""
    graph = str(artifact / "model.onnx")
    code = textwrap.dedent(
        f"""
        import gc, os, signal
        from dfine_deploy.runtime.openvino_backend import OpenVinoBackend
        first = OpenVinoBackend({graph!r}, use_cache=False)
        second = OpenVinoBackend({graph!r}, use_cache=False)
        del first
        gc.collect()
        del second
        gc.collect()
        handled = []
        signal.signal(signal.SIGUSR1, lambda *_: handled.append(True))
        os.kill(os.getpid(), signal.SIGUSR1)
        print("handled" if handled else "not handled")
        """
    )
    result = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (result.returncode, result.stderr[-2000:])
    assert result.stdout.strip().splitlines()[-1] == "handled"


def with_bf16_gate(folder: Path, record: dict) -> Path:
    """Record a bf16 gate result in the artifact's model.json, as dfine-export does."""
    info = read_artifact(folder)
    info.parity[BF16_GATE_KEY] = record
    if record["passed"]:
        info.backend_graphs = {"openvino": {"fp32": "fp32", "bf16": "fp32"}}
    write_artifact(folder, info)
    return folder


PASSED = {"run": True, "passed": True, "failures": []}


@pytest.mark.parametrize(
    "record, message",
    [
        (None, "model.json records no bf16 gate"),
        ({"run": True, "passed": False, "failures": ["box agreement 0.5 < 0.9"]}, "gate failed at export"),
        ({"run": False, "passed": False, "reason": "this CPU has no BF16 units"}, "not run at export"),
    ],
)
def test_bf16_without_a_passed_gate_is_refused(tmp_path, record, message):
    folder = make_artifact(tmp_path / "a")
    if record is not None:
        with_bf16_gate(folder, record)
    for ref in (folder, folder / "model.onnx"):
        with pytest.raises(
            BackendError, match=rf"precision bf16 refused: .*{message}.*precision fp32 or int8"
        ):
            Detector.open(ref, backend="openvino", precision="bf16")
    with pytest.raises(BackendError, match="backend='openvino' only"):
        Detector.open(folder, backend="onnxruntime", precision="bf16")


def test_bf16_runs_where_the_cpu_has_bf16_units_and_is_refused_elsewhere(tmp_path):
    """The real CPU decides: a BF16 machine runs the graph in BF16, any other takes the refusal."""
    folder = with_bf16_gate(make_artifact(tmp_path / "a"), PASSED)
    batch = frames(3)
    if "BF16" not in openvino_backend.cpu_capabilities():
        with pytest.raises(
            BackendError, match=r"no BF16 units .*OPTIMIZATION_CAPABILITIES.*use precision fp32"
        ):
            Detector.open(folder, backend="openvino", precision="bf16")
        return
    bf16 = Detector.open(folder, backend="openvino", precision="bf16")
    fp32 = Detector.open(folder, backend="openvino")
    assert bf16.info["precision"] == "bf16" and fp32.info["precision"] == "fp32"
    for b, f in zip(bf16.predict(batch), fp32.predict(batch), strict=True):
        np.testing.assert_array_equal(b.labels, f.labels)
        np.testing.assert_allclose(b.boxes, f.boxes, atol=2.0)  # pixels of a <= 200 px frame
        np.testing.assert_allclose(b.scores, f.scores, atol=0.02)


def test_bf16_is_refused_on_a_cpu_without_bf16_units(tmp_path, monkeypatch):
    folder = with_bf16_gate(make_artifact(tmp_path / "a"), PASSED)
    monkeypatch.setattr(openvino_backend, "cpu_capabilities", lambda: ("FP32", "INT8", "EXPORT_IMPORT"))
    with pytest.raises(BackendError) as caught:
        Detector.open(folder, backend="openvino", precision="bf16")
    message = str(caught.value)
    assert "\n" not in message and "['FP32', 'INT8', 'EXPORT_IMPORT'], without BF16" in message
    assert "use precision fp32 (or int8)" in message
    assert Detector.open(folder, backend="openvino").info["precision"] == "fp32"  # fp32 never asks


def test_bf16_gate_covers_only_the_graph_it_checked(tmp_path):
    folder = with_bf16_gate(make_artifact(tmp_path / "a"), PASSED)
    dfine_like(folder / "other.onnx", classes=5)
    with pytest.raises(BackendError, match=r"the bf16 gate checked model.onnx, not this graph"):
        Detector.open(folder / "other.onnx", backend="openvino", precision="bf16")
