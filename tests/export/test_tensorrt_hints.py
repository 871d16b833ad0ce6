"""Install, upgrade and rebuild hints name the TensorRT the target needs, from one table
(`tensorrt_plan.PROFILES`)."""

from __future__ import annotations

import sys

import pytest

from dfine_deploy.artifact import EngineInfo, read_artifact, write_artifact
from dfine_deploy.errors import BackendError, ExportError, MissingDependency
from dfine_deploy.export import tensorrt_verify as trt_verify
from dfine_deploy.files import sha256_file
from dfine_deploy.runtime import Detector
from dfine_deploy.runtime import tensorrt_plan as trt_plan
from tests.runtime.test_runtime_detector import make_artifact


@pytest.mark.parametrize(
    "version, present, absent",
    [
        ("8.5.2.2", ["TensorRT 8.5.2", "JetPack 5.1.x", "build_engine.sh"], ["pip install"]),
        ("8.6.2.3", ["JetPack 6.0: sudo apt install python3-libnvinfer"], ["pip install"]),
        (
            "10.3.0.26",
            ["pip install 'tensorrt-cu12==10.3.0.*'", "JetPack 6.1/6.2"],
            ["tensorrt-cu13", "JetPack 7"],
        ),
        ("10.14.1.48", ["'tensorrt-cu12==10.14.1.*'", "'tensorrt-cu13==10.14.1.*'", "JetPack 7.0"], ["6.1"]),
        # NVIDIA's DeepStream README: JetPack 7.1 GA ships 10.13.x (DeepStream 9.0), 7.2 GA 10.16.x (9.1)
        ("10.13.3.9", ["JetPack 7.0/7.1 (10.13), 7.2 (10.16)"], ["7.1 (10.14)"]),
        ("10.16.0.72", ["'tensorrt-cu13==10.16.0.*'", "7.2 (10.16)"], ["6.1"]),
        ("11.4.0.106", ["'tensorrt-cu12==11.4.0.*'", "'tensorrt-cu13==11.4.0.*'"], ["JetPack", "apt"]),
    ],
)
def test_install_hint_names_that_exact_release_and_where_it_ships(version, present, absent):
    hint = trt_plan.install_hint(version)
    assert all(p in hint for p in present) and not any(a in hint for a in absent), hint


def test_the_general_hint_says_which_tensorrt_each_extra_gives():
    hint = trt_plan.install_hint()
    assert "[trt-cu12]' (TensorRT 10.x" in hint and "[trt-cu13]' (TensorRT 11.x" in hint


@pytest.mark.parametrize(
    "version, fix, wrong",
    [
        ("8.5.2.2", "precision constraints", "strongly typed network, or"),
        ("10.3.0", "strongly typed network, or from model.onnx with the FP16 flag", "precision constraints"),
        ("11.1.0", "no FP16 flag", "precision constraints"),
    ],
)
def test_a_refused_fp16_engine_names_the_recipe_of_its_own_version(version, fix, wrong):
    refused = {"status": "refused", "reason": "the engine inspector shows float tensors and none in FP16"}
    with pytest.raises(ExportError) as error:
        trt_verify.verify_engine({}, refused, expected_io={}, source="model.onnx", version=version)
    assert fix in str(error.value) and wrong not in str(error.value)


def test_an_engine_without_tensorrt_here_names_the_tensorrt_that_built_it(tmp_path, monkeypatch):
    folder = make_artifact(tmp_path / "art")
    (folder / "model.engine").write_bytes(b"plan")
    info = read_artifact(folder)
    engine = EngineInfo("model.engine", "", "model.onnx", "10.3.0.26", "Orin", "8.7", {}, {}, {}, 1.0)
    engine.sha256 = sha256_file(folder / "model.engine")
    info.engines["fp16"] = engine
    write_artifact(folder, info)
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # not installed
    with pytest.raises(MissingDependency) as error:
        Detector.open(folder, backend="tensorrt")
    message = str(error.value)
    assert "built with TensorRT 10.3.0.26" in message and "tensorrt-cu12==10.3.0.*" in message
    assert "JetPack 6.1/6.2" in message and "trt-cu13" not in message


def test_an_engine_replaced_after_its_record_names_the_builds_that_record_it(tmp_path):
    folder = make_artifact(tmp_path / "art")
    (folder / "model.engine").write_bytes(b"plan")
    info = read_artifact(folder)
    engine = sha256_file(folder / "model.engine")
    info.engines["fp16"] = EngineInfo(
        "model.engine", engine, "model.onnx", "10.3.0.26", "Orin", "8.7", {}, {}, {}, 1.0
    )
    write_artifact(folder, info)
    (folder / "model.engine").write_bytes(b"another plan, never recorded")
    with pytest.raises(BackendError) as error:
        Detector.open(folder / "model.engine")
    assert "replaced or damaged" in str(error.value) and "build_engine.sh" in str(error.value)
    assert "Re-export" not in str(error.value)
