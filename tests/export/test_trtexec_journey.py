"""The trtexec journey: `dfine-export --target`, `build_engine.sh` with trtexec, then `Detector.open`.

Real dfine-n exports (jetpack6 at 256 px; jetpack5 at 320, the session's in conftest.py) are built
by `export/jetson/build_engine.sh` with a stub `trtexec` on PATH (tests/support/stub_trtexec.py: it
builds on the FAKE tensorrt module and prints what real trtexec prints), and each folder and its
`.engine` are then opened by the runtime with the fake module: the sidecar's engine record (sha256,
TensorRT version, GPU, profile) must be the new engine's, through the same code that records a
Python-built engine.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dfine_deploy.artifact import read_artifact, write_artifact
from dfine_deploy.errors import BackendError
from dfine_deploy.export.tensorrt_record import main as record_main
from dfine_deploy.files import sha256_file
from dfine_deploy.runtime import Detector, tensorrt_backend
from dfine_deploy.runtime import tensorrt_plan as trt_plan
from dfine_deploy.verify.cli import main as verify_main
from tests.runtime.test_runtime_tensorrt import HostMemory
from tests.support.jetson_script import GPU as GPU_OPTION
from tests.support.jetson_script import SCRIPT, script_env

ROOT = Path(__file__).parents[2]
STUB = ROOT / "tests" / "support" / "stub_trtexec.py"
FAKE = ROOT / "tests" / "fakes" / "tensorrt" / "__init__.py"
SIZE = 256  # conftest.py jetpack6_artifact: the smallest square dfine-n takes
GPU = trt_plan.GpuInfo("Fake T4", "7.5")  # the fake's device (tests/fakes/tensorrt FAKE_GPU)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::torch.jit.TracerWarning")


@pytest.fixture
def folder(jetpack6_artifact, tmp_path) -> Path:
    """A copy of the session's `--target jetpack6` export (conftest.py): the build writes into it."""
    copy = tmp_path / "art"
    shutil.copytree(jetpack6_artifact, copy)
    return copy


def run_script(
    folder: Path,
    tmp_path: Path,
    version: str = "10.3.0.26",
    *extra: str,
    gpu: str = GPU_OPTION,
    **env: str,
) -> subprocess.CompletedProcess:
    """build_engine.sh with the stub trtexec first on PATH, then this interpreter's python3."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    stub = bin_dir / "trtexec"
    stub.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STUB}" "$@"\n')
    stub.chmod(0o755)
    env = script_env(version, gpu=gpu, path_first=bin_dir, STUB_TRT_VERSION=version, **env)
    return subprocess.run(
        ["bash", str(SCRIPT), str(folder), *extra], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.fixture
def fake_runtime(monkeypatch):
    """The fake `tensorrt` for the runtime (its execution context runs the engine's graph with
    onnxruntime) and host buffers."""

    def install(version: str):
        spec = importlib.util.spec_from_file_location("tensorrt", FAKE)
        fake = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(fake)
        fake.set_version(version)
        monkeypatch.setitem(sys.modules, "tensorrt", fake)
        monkeypatch.setattr(tensorrt_backend, "open_memory", lambda index, prefer="auto": HostMemory())
        return fake

    return install


@pytest.mark.parametrize("version", ["10.3.0.26", "11.1.0.106"])  # --stronglyTyped; 11.x: always typed
def test_a_trtexec_engine_is_recorded_and_opens_by_folder_and_by_file(
    folder, tmp_path, fake_runtime, version
):
    done = run_script(folder, tmp_path, version)
    assert done.returncode == 0, done.stderr[-2000:]
    engine_file = folder / "model.engine"
    record = read_artifact(folder).engine_for("fp16")
    assert record is not None, done.stderr
    assert record.sha256 == sha256_file(engine_file)
    assert record.tensorrt_version == version and record.source_graph == "model.fp16.onnx"
    assert (record.gpu_name, record.compute_capability) == (GPU.name, GPU.compute_capability)
    assert record.profile == trt_plan.artifact_profile((1, 1, 2), SIZE, SIZE)
    assert record.precision == "fp16" and record.builder["strongly_typed"] is True
    assert record.io_dtypes == trt_plan.interface_dtypes("INT64")
    assert record.verification["status"] in ("verified", "unverified")
    assert not list(folder.glob("*.tmp")) and not list(folder.glob(".trtexec*"))

    assert ("--stronglyTyped" in done.stdout) == version.startswith("10.")
    fake_runtime(version)
    with pytest.raises(BackendError, match=r"has not proved itself on this device.*Run `dfine-verify"):
        Detector.open(engine_file)
    # the engine proves itself against the artifact's reference pack, then it opens
    assert verify_main([str(folder), "--backend", "tensorrt", "--runs", "5"]) == 0
    by_folder = Detector.open(folder, backend="tensorrt")
    by_file = Detector.open(engine_file)
    # the fake engine runs the graph it was built from, the typed FP16 one: the same graph on the CPU
    reference = Detector.open(folder, backend="onnxruntime", device="cpu", precision="fp16")
    frame = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), dtype=np.uint8)
    for det in (by_folder, by_file):
        assert det.backend_name == "tensorrt" and det.max_batch == 2
        (got,), (want,) = det.predict([frame]), reference.predict([frame])
        np.testing.assert_allclose(got.scores, want.scores, rtol=1e-5, atol=1e-6)


def test_a_rebuild_replaces_the_record_of_an_earlier_engine(folder, tmp_path, fake_runtime):
    assert run_script(folder, tmp_path, "10.3.0.26").returncode == 0
    first = read_artifact(folder).engine_for("fp16")
    done = run_script(folder, tmp_path, "10.3.0.26", "--batch", "1", "2", "2")
    assert done.returncode == 0, done.stderr[-2000:]
    second = read_artifact(folder).engine_for("fp16")
    assert second.sha256 == sha256_file(folder / "model.engine") and second.sha256 != first.sha256
    assert second.profile["images"][1] == [2, 3, SIZE, SIZE]
    fake_runtime("10.3.0.26")
    rebuilt = Detector.open(folder / "model.engine", unverified=True)  # the record, not its proof
    assert rebuilt.max_batch == 2  # not "replaced or damaged"


def test_the_timing_cache_is_keyed_by_tensorrt_version_and_gpu(folder, tmp_path):
    keyed = trt_plan.timing_cache_name("10.3.0.26", GPU)
    foreign = folder / trt_plan.timing_cache_name("10.3.0.26", trt_plan.GpuInfo("Orin", "8.7"))
    foreign.write_bytes(b"a cache timed on another GPU")
    done = run_script(folder, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"--timingCacheFile={folder}/{keyed}" in done.stdout
    assert "timing cache hits: 0)" in done.stdout and (folder / keyed).is_file()
    assert read_artifact(folder).engine_for("fp16").builder["timing_cache"] == keyed
    again = run_script(folder, tmp_path)
    assert "timing cache hits: 0)" not in again.stdout  # the second build reused the keyed cache
    cache = (folder / keyed).read_bytes()
    newer = run_script(folder, tmp_path, "10.13.0.35")  # another TensorRT: its own cache, from scratch
    assert newer.returncode == 0, newer.stderr[-2000:]
    assert "timing cache hits: 0)" in newer.stdout
    assert (folder / trt_plan.timing_cache_name("10.13.0.35", GPU)).is_file()
    assert (folder / keyed).read_bytes() == cache
    assert foreign.read_bytes() == b"a cache timed on another GPU"  # never used, never touched


def test_an_unknown_gpu_builds_without_a_cache_and_says_so(folder, tmp_path):
    done = run_script(folder, tmp_path, "10.3.0.26", "--dry-run", gpu="")
    assert done.returncode == 0, done.stderr
    assert "--timingCacheFile" not in done.stdout and "no timing cache" in done.stderr


def test_an_engine_the_evidence_refuses_is_not_kept_nor_recorded(folder, tmp_path):
    """A weakly typed FP16 build (10.x, FP32 graph + --fp16) whose inspector types every float
    tensor FP32 is positive evidence of an FP32 engine: refused in one line, nothing kept."""
    info = read_artifact(folder)
    del info.graphs["fp16"]  # an export with --no-fp16: 10.x builds model.onnx with --fp16
    write_artifact(folder, info)
    before = (folder / "model.json").read_bytes()
    done = run_script(folder, tmp_path, STUB_TRT_DROP_FP16="1")
    assert done.returncode == 2
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("error: ") and "did not build an FP16 engine" in error, done.stderr
    assert not (folder / "model.engine").exists() and not list(folder.glob("*.tmp"))
    assert (folder / "model.json").read_bytes() == before


def test_a_tensorrt_8_5_engine_is_recorded_with_the_targets_int32_interface(
    jetpack5_artifact, tmp_path, fake_runtime
):
    """`--target jetpack5` (TensorRT 8.5): INT32 I/O, FP32 layers held by precision constraints (the
    session's jetpack5 export, conftest.py, copied: the build writes into the folder)."""
    folder = tmp_path / "art5"
    shutil.copytree(jetpack5_artifact, folder)
    done = run_script(folder, tmp_path, "8.5.2.2")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--fp16" in done.stdout and "--precisionConstraints=obey" in done.stdout
    engine = read_artifact(folder).engine_for("fp16")
    assert engine.source_graph == "model.onnx" and engine.precision == "fp16"
    assert engine.builder["strongly_typed"] is False and engine.builder["fp16_flag"] is True
    assert engine.io_dtypes == trt_plan.interface_dtypes("INT32")  # what the jetpack5 target records
    assert engine.verification["decided_by"] == "FP16 builder flag"
    asked = len(read_artifact(folder).target["fp32_layers"])  # what the export asked for FP32
    outcome = engine.verification["fp32_layers"]  # how they ran, by the engine inspector
    assert outcome["asked"] == asked == sum(outcome[k] for k in ("fp32", "not_fp32", "fused", "not_found"))
    assert f"FP32 layers: {outcome['fp32']} of {asked} asked ran in FP32" in done.stderr
    fake_runtime("8.5.2.2")
    assert Detector.open(folder, backend="tensorrt", unverified=True).backend_name == "tensorrt"


def test_recording_refuses_a_missing_engine_or_a_log_without_its_device_in_one_line(folder, capsys):
    log = folder / "trtexec.log"
    log.write_text("[12/01/2026-10:00:00] [I] TensorRT version: 10.3.0\n")  # no device lines
    (folder / "built.tmp").write_bytes(b"plan")
    before = (folder / "model.json").read_bytes()
    common = ["--log", str(log), "--layer-info", str(folder / "none.json"), "--tensorrt-version", "10.3.0.26"]
    line = ["--", "trtexec", f"--onnx={folder}/model.fp16.onnx"]
    assert record_main(["record", str(folder), "--built", str(folder / "nothing.tmp"), *common, *line]) == 2
    assert "wrote no engine" in capsys.readouterr().err
    assert record_main(["record", str(folder), "--built", str(folder / "built.tmp"), *common, *line]) == 2
    err = capsys.readouterr().err.strip()
    assert "'Selected Device:'" in err and len(err.splitlines()) == 1
    assert (folder / "model.json").read_bytes() == before
