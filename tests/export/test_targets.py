"""Triton repository, DeepStream config and the Jetson build script, on a toy artifact folder."""

from __future__ import annotations

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

from dfine_deploy.artifact import read_artifact, write_artifact
from dfine_deploy.errors import ExportError, OwnershipError
from dfine_deploy.export import deepstream, triton
from dfine_deploy.files import sha256_file
from tests.support.folders import DEAD_PID, fill, snapshot
from tests.support.jetson_script import script_env

SCRIPT = Path(__file__).parents[2] / "export" / "jetson" / "build_engine.sh"


def test_triton_repository_layout_and_config(artifact, tmp_path):
    repo = tmp_path / "repo"
    (written,) = triton.write_repository(artifact, repo)  # no engine: the ONNX model only
    assert written == repo / "dfine_onnx" and (written / "1" / "model.onnx").is_file()
    text = (written / "config.pbtxt").read_text()
    assert 'platform: "onnxruntime_onnx"' in text and "max_batch_size: 8" in text
    assert re.search(r'name: "images" data_type: TYPE_FP32 dims: \[ 3, 320, 480 \]', text)
    assert re.search(r'name: "boxes" data_type: TYPE_FP32 dims: \[ 30, 4 \]', text)
    assert "preferred_batch_size: [ 4, 8 ]" in text and "kind: KIND_GPU" in text
    with pytest.raises(OwnershipError, match="--force"):  # ours: replaced with --force only
        triton.write_repository(artifact, repo)
    assert not [p for p in repo.iterdir() if p.name.startswith(".")]  # no staging left behind


def test_triton_model_folders_are_readable_by_every_user_whatever_the_umask(artifact, tmp_path):
    old = os.umask(0o077)  # a hardened shell: files 0600, folders 0700 unless we say otherwise
    try:
        (written,) = triton.write_repository(artifact, tmp_path / "repo")
    finally:
        os.umask(old)
    for path in [written, *written.rglob("*")]:
        assert stat.S_IMODE(path.stat().st_mode) == (0o755 if path.is_dir() else 0o644), path


def _model_folder(repo: Path, name: str, config: str) -> Path:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "config.pbtxt").write_text(config)
    (folder / "1" / "model.onnx").write_bytes(b"their graph")
    return folder


@pytest.mark.parametrize(
    "config, extra",
    [
        ('name: "dfine_onnx"\nplatform: "onnxruntime_onnx"\n', None),  # a user's own model of that name
        ("# my notes\n" + triton.MARKER_LINE + "\n", None),  # the line, but not where we write it
        (triton.MARKER_LINE + "\n", {"README.md": "their notes"}),  # ours, with a file of theirs in it
        (triton.MARKER_LINE + "\n", {"2/model.onnx": "their second version"}),
    ],
    ids=["a-users-model", "marker-not-first", "ours-plus-readme", "ours-plus-version-2"],
)
def test_triton_force_replaces_only_model_folders_of_ours(artifact, tmp_path, config, extra):
    repo = tmp_path / "repo"
    fill(_model_folder(repo, "dfine_onnx", config), extra or {})
    before = snapshot(repo)
    with pytest.raises(OwnershipError) as refused:
        triton.write_repository(artifact, repo, force=True)
    message = str(refused.value)
    assert "dfine_onnx" in message and "choose another folder" in message and "--force" not in message
    assert "\n" not in message
    assert snapshot(repo) == before and [p.name for p in repo.iterdir()] == ["dfine_onnx"]


def test_triton_force_replaces_ours_and_leaves_other_models_and_clears_a_killed_write(artifact, tmp_path):
    repo = tmp_path / "repo"
    _model_folder(repo, "yolo", 'name: "yolo"\n')  # another model of the repository: never touched
    triton.write_repository(artifact, repo)
    (repo / "dfine_onnx" / "1" / "model.onnx").write_bytes(b"stale")
    dead = DEAD_PID
    (repo / f".dfine_onnx.staging-{dead}-abc" / "1").mkdir(parents=True)  # a write killed mid-way
    fill(repo / f".dfine_onnx.staging-{dead}-def", {"notes.txt": "not ours"})
    (written,) = triton.write_repository(artifact, repo, force=True)
    assert (written / "1" / "model.onnx").read_bytes() == (artifact / "model.onnx").read_bytes()
    assert (repo / "yolo" / "1" / "model.onnx").read_bytes() == b"their graph"
    hidden = sorted(p.name for p in repo.iterdir() if p.name.startswith("."))
    assert hidden == [f".dfine_onnx.staging-{dead}-def"]  # ours removed; the one with a stranger's file kept


def test_export_refuses_a_triton_folder_not_ours_before_any_work(tmp_path, capsys):
    from dfine_deploy.export.cli import main as export_main

    repo = tmp_path / "repo"
    _model_folder(repo, "dfine_onnx", 'name: "dfine_onnx"\n')
    code = export_main(["dfine-n", "-o", str(tmp_path / "out"), "--triton", str(repo), "--force"])
    err = capsys.readouterr().err
    assert code == 2 and "is not a Triton model folder" in err and "--force" not in err
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out*"))


def _triton_server_refusal(message) -> str | None:
    """What Triton's server refuses in a parsed config beyond its schema, as its ValidateModelConfig
    and dimension checks say (triton-inference-server/core src/model_config_utils.cc at 73aad7c,
    June 2026; redone here): the platform, max_batch_size >= 0, each preferred batch size in
    [1, max_batch_size], each dimension >= 1 or -1."""
    if message.platform not in ("onnxruntime_onnx", "tensorrt_plan"):
        return f"platform {message.platform!r}"
    if message.max_batch_size < 0:
        return "max_batch_size < 0"
    for size in message.dynamic_batching.preferred_batch_size:
        if not 1 <= size <= message.max_batch_size:
            return f"preferred batch size {size} outside [1, {message.max_batch_size}]"
    for tensor in [*message.input, *message.output]:
        if any(d < 1 and d != -1 for d in tensor.dims):
            return f"{tensor.name} dims {list(tensor.dims)}"
    return None


@pytest.mark.parametrize(
    "batch, preferred",
    [((1, 4, 8), [4, 8]), ((1, 1, 1), [1]), ((2, 8, 8), [8])],
    ids=["opt-4-max-8", "one", "opt-is-max"],
)
def test_triton_config_passes_tritons_own_schema_and_server_checks(artifact, tmp_path, batch, preferred):
    assert triton.schema_available(), "tritonclient (the dev extra) holds Triton's model_config_pb2"
    info = read_artifact(artifact)
    info.batch_min, info.batch_opt, info.batch_max = batch
    write_artifact(artifact, info)
    repo = tmp_path / "repo"
    triton.write_repository(artifact, repo)
    message = triton.validate_config_text((repo / "dfine_onnx" / "config.pbtxt").read_text())
    assert message is not None and _triton_server_refusal(message) is None
    assert message.platform == "onnxruntime_onnx" and message.max_batch_size == batch[2]
    assert [i.name for i in message.input] == ["images", "orig_target_sizes"]
    assert [o.name for o in message.output] == ["labels", "boxes", "scores"]
    assert list(message.output[1].dims) == [30, 4]
    assert list(message.dynamic_batching.preferred_batch_size) == preferred
    with pytest.raises(ExportError, match="schema"):
        triton.validate_config_text('name: "x"\nmax_batch_size: 8\nno_such_field: 1\n')


_ONNX_TO_TRITON = {"tensor(float)": "TYPE_FP32", "tensor(int64)": "TYPE_INT64", "tensor(int32)": "TYPE_INT32"}


def _onnxruntime_backend_refusal(message, model_path: Path) -> str | None:
    """What Triton's onnxruntime backend refuses when it loads the model against its config
    (triton-inference-server/onnxruntime_backend src/onnxruntime.cc ValidateInputs/ValidateOutputs and
    onnxruntime_utils.cc CompareDimsSupported at 00fd3e8, June 2026; redone here): as many inputs as
    configured, each configured tensor in the model with the configured data type, and with batching
    (max_batch_size > 0) a model shape of [-1, *dims], where a model dimension of -1 matches any."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    model = {t.name: t for t in [*session.get_inputs(), *session.get_outputs()]}
    if len(session.get_inputs()) != len(message.input):
        return f"the config has {len(message.input)} inputs, the model {len(session.get_inputs())}"
    for tensor in [*message.input, *message.output]:
        found = model.get(tensor.name)
        if found is None:
            return f"{tensor.name}: not in the model"
        data_type = (
            tensor.DESCRIPTOR.fields_by_name["data_type"].enum_type.values_by_number[tensor.data_type].name
        )
        if _ONNX_TO_TRITON.get(found.type) != data_type:
            return f"{tensor.name}: config {data_type}, model {found.type}"
        shape = [d if isinstance(d, int) else -1 for d in found.shape]  # a named dimension is -1
        full = [-1, *tensor.dims] if message.max_batch_size > 0 else list(tensor.dims)
        if (message.max_batch_size > 0 and shape[:1] != [-1]) or len(shape) != len(full):
            return f"{tensor.name}: model shape {shape}, config {full}"
        if any(m != -1 and m != c for m, c in zip(shape, full)):
            return f"{tensor.name}: model shape {shape}, config {full}"
    return None


def test_tritons_onnxruntime_backend_would_load_our_model_with_our_config(artifact, tmp_path):
    info = read_artifact(artifact)
    info.input_width = 320  # the toy graph's own size (its batch dimension is the dynamic one)
    write_artifact(artifact, info)
    (written,) = triton.write_repository(artifact, tmp_path / "repo")
    message = triton.validate_config_text((written / "config.pbtxt").read_text())
    assert _onnxruntime_backend_refusal(message, written / "1" / "model.onnx") is None
    message.output[1].dims[1] = 5  # the oracle refuses what the backend would: boxes are [N, K, 4]
    assert "boxes: model shape" in (_onnxruntime_backend_refusal(message, written / "1" / "model.onnx") or "")


def test_a_triton_config_written_without_the_schema_says_so(artifact, tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(triton, "_schema_module_path", lambda: None)  # tritonclient not installed
    with caplog.at_level("WARNING", logger=triton.log.name):
        (written,) = triton.write_repository(artifact, tmp_path / "repo")
    assert (written / "config.pbtxt").is_file()
    assert "config.pbtxt not checked against Triton's ModelConfig schema: tritonclient is not" in caplog.text


def test_triton_config_takes_the_targets_integer_dtypes(artifact, tmp_path):
    _set_target(artifact, "jetpack5")
    (written,) = triton.write_repository(artifact, tmp_path / "repo")
    text = (written / "config.pbtxt").read_text()
    assert 'name: "orig_target_sizes" data_type: TYPE_INT32' in text
    assert 'name: "labels" data_type: TYPE_INT32' in text
    assert "TYPE_INT64" not in text


def test_triton_trt_model_written_when_engine_exists(artifact, tmp_path):
    from dfine_deploy.artifact import EngineInfo

    (artifact / "model.engine").write_bytes(b"plan")
    info = read_artifact(artifact)
    info.engines["fp16"] = EngineInfo(
        "model.engine",
        sha256_file(artifact / "model.engine"),
        "model.fp16.onnx",
        "10.3.0",
        "Orin",
        "8.7",
        {},
        {},
        {"fp16": 10},
        1.0,
    )
    write_artifact(artifact, info)
    written = triton.write_repository(artifact, tmp_path / "repo")
    assert [p.name for p in written] == ["dfine_onnx", "dfine_trt"]
    assert 'platform: "tensorrt_plan"' in (written[1] / "config.pbtxt").read_text()
    assert (written[1] / "1" / "model.plan").read_bytes() == b"plan"


def test_triton_unwritable_repository_is_a_clear_error(artifact, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")  # a folder cannot be made below a file, even by root
    with pytest.raises(ExportError, match="cannot write"):
        triton.write_repository(artifact, blocker / "repo")


def _settings(path):
    lines = path.read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line and not line.startswith("#"))


def test_deepstream_config_has_dfine_settings(artifact):
    config, app, labels = deepstream.write_config(artifact)
    settings = _settings(config)
    assert settings["cluster-mode"] == "4" and settings["maintain-aspect-ratio"] == "0"
    assert float(settings["net-scale-factor"]) == pytest.approx(1 / 255)
    assert settings["model-color-format"] == "0" and settings["num-detected-classes"] == "5"
    assert settings["onnx-file"] == "model.fp16.onnx" and settings["network-mode"] == "0"
    assert settings["infer-dims"] == "3;320;480" and settings["output-blob-names"] == "labels;boxes;scores"
    assert labels.read_text().split() == [f"c{i}" for i in range(5)]
    assert settings["custom-lib-path"] == "nvdsinfer_custom_impl_dfine/libnvdsinfer_custom_impl_dfine.so"
    assert settings["parse-bbox-func-name"] == "NvDsInferParseDfine"  # defined by the shipped library:
    source = (
        Path(__file__).parents[2]
        / "export"
        / "deepstream"
        / "nvdsinfer_custom_impl_dfine"
        / "nvdsinfer_custom_impl_dfine.cpp"
    ).read_text()
    assert 'extern "C" bool NvDsInferParseDfine(' in source
    app_settings = _settings(app)
    assert app_settings["config-file"] == config.name and app_settings["batch-size"] == "4"
    assert "[primary-gie]" in app.read_text() and "[sink0]" in app.read_text()


def test_deepstream_config_for_a_precision_constraint_target(artifact):
    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.export import targets as trt_targets

    info = read_artifact(artifact)
    info.target = {"profile": trt_targets.get_profile("jetpack5").to_dict()}
    write_artifact(artifact, info)
    config, _, _ = deepstream.write_config(artifact)
    settings = _settings(config)
    # the FP16 engine with FP32 layers comes from build_engine.sh; nvinfer's own fallback build is FP32
    assert settings["onnx-file"] == "model.onnx" and settings["network-mode"] == "0"


def _dry_run(artifact, version, *extra):
    env = script_env(version)
    done = subprocess.run(
        ["bash", str(SCRIPT), str(artifact), "--dry-run", *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def _set_target(artifact, name, fp32_layers=None):
    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.export import targets as trt_targets

    info = read_artifact(artifact)
    info.target = {"profile": trt_targets.get_profile(name).to_dict()}
    if fp32_layers:
        info.target["fp32_layers"] = fp32_layers
        info.target["trtexec_layer_flags"] = trt_targets.trtexec_layer_flags(fp32_layers)
    write_artifact(artifact, info)


def test_jetson_script_flags_per_tensorrt_version(artifact):
    jp6 = _dry_run(artifact, "10.3.0.30")  # an export without --target is the 10.x/11.x graph
    assert "model.fp16.onnx" in jp6 and "--stronglyTyped" in jp6 and "--fp16" not in jp6
    assert "--minShapes=images:1x3x320x480,orig_target_sizes:1x2" in jp6
    assert "--optShapes=images:4x3x320x480,orig_target_sizes:4x2" in jp6
    assert "--maxShapes=images:8x3x320x480,orig_target_sizes:8x2" in jp6
    jp72 = _dry_run(artifact, "11.4.1.2")
    assert "model.fp16.onnx" in jp72 and "--fp16" not in jp72 and "--stronglyTyped" not in jp72
    cache = "timing-trt11.4.1.2-fake-t4-sm7.5.cache"  # keyed by TensorRT version and GPU
    assert "--noTF32" in jp72 and f"--timingCacheFile={artifact}/{cache}" in jp72
    custom = _dry_run(artifact, "10.13.0", "--batch", "2", "2", "16")
    assert "--maxShapes=images:16x3x320x480" in custom
    python_path = _dry_run(artifact, "11.4.1", "--python")
    assert "dfine_deploy.export.tensorrt" in python_path and "--batch 1 4 8" in python_path

    _set_target(artifact, "jetpack5", {"/norm1/Sqrt": 1, "/decoder/Split": 2})
    for version in ("8.5.2.2", "8.6.2.3"):  # 8.6 parses the 8.5 graph too
        jp5 = _dry_run(artifact, version).split()
        assert f"--onnx={artifact}/model.onnx" in jp5 and "--stronglyTyped" not in jp5
        assert jp5[jp5.index("--fp16") + 1] == "--precisionConstraints=obey"
        assert "--layerPrecisions=/norm1/Sqrt:fp32,/decoder/Split:fp32" in jp5
        assert "--layerOutputTypes=/norm1/Sqrt:fp32,/decoder/Split:fp32" in jp5


def _refused(artifact, version):
    env = script_env(version)
    done = subprocess.run(
        ["bash", str(SCRIPT), str(artifact), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2, done.stdout
    return done.stderr


def test_jetson_script_refuses_an_artifact_for_another_tensorrt(artifact):
    assert "exported without --target; TensorRT 8.5 cannot parse" in _refused(artifact, "8.5.2.2")
    assert "--target jetpack6.0" in _refused(artifact, "8.6.2")
    _set_target(artifact, "jetpack6.0", {"/norm1/Sqrt": 1})
    assert "exported for --target trt8.6" in _refused(artifact, "8.5.2")
    assert "re-export with --target jetpack6, jetpack7 or trt11" in _refused(artifact, "10.3.0")
    from dfine_deploy.artifact import read_artifact

    info = read_artifact(artifact)  # an export that recorded FP32 layers but not their flags
    info.target = {"profile": info.target["profile"], "fp32_layers": {"/norm1/Sqrt": 1}}
    write_artifact(artifact, info)
    assert "records FP32 layers but not their trtexec flags" in _refused(artifact, "8.6.2")
    _set_target(artifact, "jetpack5")  # --no-fp16: no FP32 layers recorded
    assert "records no FP32 layers" in _refused(artifact, "8.5.2")
    assert "--fp16" not in _dry_run(artifact, "8.5.2", "--fp32")


def test_jetson_script_refuses_old_tensorrt_and_missing_artifact(artifact, tmp_path):
    env = dict(os.environ, DFINE_TRT_VERSION="8.2.1")
    old = subprocess.run(
        ["bash", str(SCRIPT), str(artifact), "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert old.returncode == 2 and "not a supported target" in old.stderr
    missing = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "nowhere")], env=env, capture_output=True, text=True, check=False
    )
    assert missing.returncode == 2 and "nowhere: no such folder" in missing.stderr
