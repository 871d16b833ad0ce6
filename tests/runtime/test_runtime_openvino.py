"""Detector over OpenVINO (real OpenVINO CPU plugin), and the per-backend graph choice of model.json."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from dfine_deploy.artifact import ArtifactInfo, GraphInfo, sha256_file, write_artifact
from dfine_deploy.errors import BackendError, MissingDependency
from dfine_deploy.runtime import Detector
from tests.runtime.test_runtime_detector import SIZE, frames, make_artifact, reference_outputs
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
    cache = Path(detector.info["cache_dir"])
    assert cache == artifact / "ov_cache" and any(cache.iterdir())  # the compiled blob, reused next open
    again = Detector.open(artifact / "model.onnx", backend="openvino")
    np.testing.assert_array_equal(again.predict(batch[:1])[0].boxes, detector.predict(batch[:1])[0].boxes)


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
    with pytest.raises(MissingDependency, match=r"dfine-deploy\[cpu\]"):
        Detector.open(artifact, backend="openvino")


def test_openvino_backend_imports_no_torch(artifact):
    code = textwrap.dedent(
        f"""
        import json, sys
        import numpy as np
        from dfine_deploy.runtime import Detector
        det = Detector.open({str(artifact)!r}, backend="openvino")
        out = det.predict([np.zeros((50, 60, 3), np.uint8)])
        print(json.dumps({{"n": len(out[0]), "torch": "torch" in sys.modules}}))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"n": 6, "torch": False}
