"""TensorRT build logic against the FAKE tensorrt module (tests/fakes/tensorrt), 10.x and 11.x."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from dfine_deploy.errors import ExportError
from dfine_deploy.export import fp16 as fp16_export
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export import tensorrt as trt_export

FAKE = Path(__file__).parents[1] / "fakes" / "tensorrt" / "__init__.py"
PROFILE = trt_export.artifact_profile((1, 1, 8), 320, 320)


def _load_fake(version: str):
    spec = importlib.util.spec_from_file_location("tensorrt", FAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.set_version(version)
    return module


@pytest.fixture
def fake_trt(monkeypatch):
    """Install the fake as `tensorrt` for one test, with a fake GPU; returns a version switcher."""

    def install(version: str):
        module = _load_fake(version)
        monkeypatch.setitem(sys.modules, "tensorrt", module)
        monkeypatch.setattr(trt_export, "gpu_info", lambda: trt_export.GpuInfo("Fake T4", "7.5"))
        return module

    return install


@pytest.fixture(scope="module")
def graphs(tmp_path_factory, toy_onnx):
    folder = tmp_path_factory.mktemp("trt")
    fp16_path = folder / "model.fp16.onnx"
    onnx_export.save(fp16_export.convert(onnx_export.load(toy_onnx)).model, fp16_path)
    return {"fp32": toy_onnx, "fp16": fp16_path, "folder": folder}


def test_trt11_is_strongly_typed_and_never_uses_the_fp16_flag(fake_trt, graphs, tmp_path):
    trt = fake_trt("11.4.0.106")
    assert not hasattr(trt.BuilderFlag, "FP16")  # the fake models the removal
    engine = trt_export.build_engine(graphs["fp16"], tmp_path / "model.engine", profile=PROFILE,
                                     timing_cache=tmp_path / "timing.cache")
    build = trt.LAST_BUILD
    assert build["strongly_typed"]
    assert build["network_flags"] & (1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    assert "TF32" not in build["config_flags"]  # TF32 off unless asked
    assert build["memory_limits"] == {"WORKSPACE": trt_export.DEFAULT_WORKSPACE_MB << 20}
    assert engine.precision == "fp16" and engine.layer_precisions["fp16"] > 0
    assert engine.io_dtypes == trt_export.EXPECTED_IO_DTYPES
    assert engine.builder["fp16_flag"] is False and engine.tensorrt_version == "11.4.0.106"
    assert engine.gpu_name == "Fake T4" and engine.compute_capability == "7.5"
    assert (tmp_path / "model.engine").is_file()


def test_profiles_cover_both_inputs(fake_trt, graphs, tmp_path):
    trt = fake_trt("11.4.0.106")
    trt_export.build_engine(graphs["fp16"], tmp_path / "e.engine", profile=PROFILE)
    (profile,) = trt.LAST_BUILD["profiles"]
    assert profile["images"] == ((1, 3, 320, 320), (1, 3, 320, 320), (8, 3, 320, 320))
    assert profile["orig_target_sizes"] == ((1, 2), (1, 2), (8, 2))


def test_missing_profile_for_a_dynamic_input_is_an_error(fake_trt, graphs, tmp_path):
    fake_trt("11.4.0.106")
    with pytest.raises(ExportError, match="'orig_target_sizes' has a dynamic shape"):
        trt_export.build_engine(graphs["fp16"], tmp_path / "e.engine", profile={"images": PROFILE["images"]})


def test_timing_cache_round_trip(fake_trt, graphs, tmp_path):
    trt = fake_trt("10.13.0.35")
    cache = tmp_path / "timing.cache"
    trt_export.build_engine(graphs["fp16"], tmp_path / "a.engine", profile=PROFILE, timing_cache=cache)
    assert trt.LAST_BUILD["cache_hits"] == 0 and cache.read_bytes().startswith(b"FAKE-TRT-CACHE")
    first = cache.read_bytes()
    trt_export.build_engine(graphs["fp16"], tmp_path / "b.engine", profile=PROFILE, timing_cache=cache)
    assert trt.LAST_BUILD["cache_hits"] == len(json.loads(first[len(b"FAKE-TRT-CACHE"):])["entries"]) > 0


def test_trt10_typed_graph_strongly_typed_fp32_graph_uses_fp16_flag(fake_trt, graphs, tmp_path):
    trt = fake_trt("10.3.0.30")
    trt_export.build_engine(graphs["fp16"], tmp_path / "a.engine", profile=PROFILE, typed_graph=True)
    assert trt.LAST_BUILD["strongly_typed"] and "FP16" not in trt.LAST_BUILD["config_flags"]
    engine = trt_export.build_engine(graphs["fp32"], tmp_path / "b.engine", profile=PROFILE, typed_graph=False)
    assert not trt.LAST_BUILD["strongly_typed"] and "FP16" in trt.LAST_BUILD["config_flags"]
    assert engine.builder["fp16_flag"] and engine.layer_precisions.get("fp16", 0) > 0


def test_an_fp32_only_engine_is_not_called_fp16(fake_trt, graphs, tmp_path):
    """The RF-DETR/Ultralytics failure: FP32 graph, strongly typed build, engine called FP16."""
    fake_trt("11.4.0.106")
    with pytest.raises(ExportError, match="no FP16 layers"):
        trt_export.build_engine(graphs["fp32"], tmp_path / "model.engine", profile=PROFILE, typed_graph=True)
    assert not (tmp_path / "model.engine").exists()
    engine = trt_export.build_engine(graphs["fp32"], tmp_path / "model.engine", profile=PROFILE, fp16=False,
                                     typed_graph=False)
    assert engine.precision == "fp32" and "fp16" not in engine.layer_precisions


def test_trt11_refuses_fp16_from_an_untyped_graph():
    with pytest.raises(ExportError, match="no FP16 builder flag"):
        trt_export.plan_build("11.4.0", fp16=True, have_typed_graph=False)


def test_version_plans_and_trtexec_lines():
    profile = trt_export.artifact_profile((1, 1, 8), 640, 640)
    jp5 = trt_export.plan_build("8.5.2", fp16=True, have_typed_graph=True)
    assert (jp5.graph, jp5.fp16_flag, jp5.explicit_batch_flag, jp5.strongly_typed) == ("fp32", True, True, False)
    line5 = trt_export.trtexec_command("model.onnx", "model.engine", jp5, profile)
    assert "--fp16" in line5 and "--stronglyTyped" not in line5
    assert "--minShapes=images:1x3x640x640,orig_target_sizes:1x2" in line5
    assert "--maxShapes=images:8x3x640x640,orig_target_sizes:8x2" in line5
    jp6 = trt_export.plan_build("10.3.0", fp16=True, have_typed_graph=True)
    line6 = trt_export.trtexec_command("model.fp16.onnx", "model.engine", jp6, profile)
    assert "--stronglyTyped" in line6 and "--fp16" not in line6 and "--noTF32" in line6
    jp72 = trt_export.plan_build("11.4.1", fp16=True, have_typed_graph=True)
    line11 = trt_export.trtexec_command("model.fp16.onnx", "model.engine", jp72, profile)
    assert "--fp16" not in line11 and "--stronglyTyped" not in line11
    with pytest.raises(ExportError, match="too old"):
        trt_export.plan_build("8.2.1")


def test_without_tensorrt_the_error_says_what_is_missing_and_how_to_build(monkeypatch, graphs, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails as when it is not installed
    with pytest.raises(ExportError) as info:
        trt_export.build_engine(graphs["fp16"], tmp_path / "model.engine", profile=PROFILE)
    message = str(info.value)
    assert "TensorRT Python package cannot be imported" in message
    assert "export/jetson/build_engine.sh" in message and "trtexec --onnx=model.fp16.onnx" in message
    assert not (tmp_path / "model.engine").exists()


def test_no_gpu_is_a_clear_error(fake_trt, monkeypatch, graphs, tmp_path):
    fake_trt("11.4.0.106")
    monkeypatch.setattr(trt_export, "gpu_info", lambda: None)
    with pytest.raises(ExportError, match="no CUDA GPU is visible"):
        trt_export.build_engine(graphs["fp16"], tmp_path / "model.engine", profile=PROFILE)


def test_layer_precisions_reads_both_inspector_layouts():
    v10 = {"Layers": [{"Outputs": [{"Format/Datatype": "Row major linear FP16 format"}]},
                      {"Outputs": [{"Format/Datatype": "Row major linear FP32 format"}]}]}
    v11 = {"Layers": [{"Outputs": [{"Format": "Row major linear", "DataType": "Half"}]},
                      {"Outputs": [{"Format": "Row major linear", "DataType": "Int64"}]}]}
    assert trt_export.layer_precisions(json.dumps(v10)) == {"fp16": 1, "fp32": 1}
    assert trt_export.layer_precisions(json.dumps(v11)) == {"fp16": 1, "int": 1}


def test_build_for_artifact_records_the_engine_in_the_sidecar(fake_trt, graphs, tmp_path, capsys):
    import shutil

    from dfine_deploy.artifact import ArtifactInfo, GraphInfo, read_artifact, sha256_file, write_artifact

    folder = tmp_path / "artifact"
    folder.mkdir()
    for key in ("fp32", "fp16"):
        shutil.copyfile(graphs[key], folder / graphs[key].name)
    write_artifact(folder, ArtifactInfo(
        model="custom", num_classes=5, class_names=list("abcde"), input_height=320, input_width=320,
        batch_min=1, batch_opt=2, batch_max=4, num_top_queries=30,
        graphs={k: GraphInfo(graphs[k].name, sha256_file(graphs[k]), k, 17) for k in ("fp32", "fp16")},
    ))
    fake_trt("11.4.0.106")
    assert trt_export.main([str(folder)]) == 0
    info = read_artifact(folder)
    assert info.engine.source_graph == "model.fp16.onnx" and info.engine.precision == "fp16"
    assert info.engine.profile["orig_target_sizes"] == [[1, 2], [2, 2], [4, 2]]
    assert (folder / "timing.cache").is_file() and (folder / "model.engine").is_file()
    assert '"tensorrt_version": "11.4.0.106"' in capsys.readouterr().out


def test_tensorrt_layernorm_overflow_warning_fails_the_build(fake_trt, tmp_path):
    """TensorRT's warning about FP16 Reduce/Pow after attention (decomposed LayerNorm) is fatal."""
    import onnx

    x = onnx.helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT16, ["N", 4])
    y = onnx.helper.make_tensor_value_info("mean", onnx.TensorProto.FLOAT16, ["N", 1])
    node = onnx.helper.make_node("ReduceMean", ["images"], ["mean"], name="/encoder/norm/ReduceMean", axes=[1])
    path = tmp_path / "decomposed.onnx"
    onnx.save(onnx.helper.make_model(onnx.helper.make_graph([node], "g", [x], [y]),
                                     opset_imports=[onnx.helper.make_opsetid("", 17)]), path)
    fake_trt("10.13.0.35")
    with pytest.raises(ExportError, match="LayerNorm runs in FP16"):
        trt_export.build_engine(path, tmp_path / "e.engine", profile={"images": [[1, 4], [1, 4], [2, 4]]})
    assert not (tmp_path / "e.engine").exists()
