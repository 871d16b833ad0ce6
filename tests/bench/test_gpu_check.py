"""benchmarks/gpu_check.sh stops at once, clearly, on a machine without an NVIDIA GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_check.sh"
TENSORRT_CHECKS = ("tensorrt_build", "trt_run_torch", "trt_run_cudart", "verify_tensorrt", "trtexec_build")


def test_gpu_check_bails_out_without_a_gpu(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi exists: this machine may have a GPU")
    report = tmp_path / "report.json"
    result = subprocess.run(["bash", str(SCRIPT), str(report)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert (
        "no NVIDIA GPU on this machine" in result.stderr
        and "run this script on a GPU machine" in result.stderr
    )
    assert not report.exists()


def _tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel of one module, to see gpu_check.sh install its wheel folder."""
    import zipfile

    folder.mkdir()
    wheel = folder / "gpu_check_probe-0.1-py3-none-any.whl"
    info = "gpu_check_probe-0.1.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("gpu_check_probe.py", "ANSWER = 42\n")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: gpu-check-probe\nVersion: 0.1\n")
        zf.writestr(
            f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
        )
        zf.writestr(f"{info}/RECORD", "")
    return wheel


@pytest.mark.slow
def test_dry_mode_runs_every_check_within_its_budget(tmp_path):
    """--dry: the wheel folder is installed to the scratch path, every check runs its plumbing on the
    CPU, packages this machine lacks are "not installed" (not failed), and one JSON report comes out
    within the dry budget (240 s of checks, killed at 290 s). On a loaded 2-core machine one CPU
    training step takes over a minute, so the checks that do not fit are skipped for time, and say so."""
    import json
    import os
    import time

    _tiny_wheel(tmp_path / "wheels")
    report = tmp_path / "report.json"
    env = {
        **os.environ,
        "PYTHON": sys.executable,  # the test's interpreter, whichever venv runs the suite
        "GPU_CHECK_WHEELS": str(tmp_path / "wheels"),
        "GPU_CHECK_WORK": str(tmp_path / "work"),
        # torch on one thread: the plumbing needs no speed, and two threads on a loaded 2-core machine
        # (the suite under xdist -n 2) spin at every barrier (tests/training/test_smoke.py: x5 its work)
        "OMP_NUM_THREADS": "1",
    }
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry", str(report)], capture_output=True, text=True, timeout=330, env=env
    )
    seconds = time.monotonic() - started
    assert "1 wheels of" in result.stdout, result.stdout + result.stderr
    assert (tmp_path / "work" / "site" / "gpu_check_probe.py").is_file()
    data = json.loads(report.read_text())
    assert data["dry"] is True
    checks = data["checks"]
    expected = {"train_step_fp16", "train_step_bf16", "eager_fp16", "export", "ort_cuda", "tensorrt_build"}
    expected |= {"trt_run_torch", "trt_run_cudart", "verify_tensorrt", "trtexec_build", "torch_detector"}
    expected |= {"bench_t4", "trainer"}
    assert expected <= set(checks), sorted(checks)
    failed = {name: entry for name, entry in checks.items() if entry["status"] == "failed"}
    assert not failed, json.dumps(failed, indent=1)[:3000]
    assert checks["ort_cuda"]["status"] == "not installed"  # onnxruntime-gpu is not installed here
    assert checks["train_step_fp16"]["status"] == "ok", checks["train_step_fp16"]
    export_cut = checks["export"].get("why", "").startswith("time budget")
    for name, entry in checks.items():  # on a loaded CPU later checks may run out of the dry budget
        why = entry.get("why", "") if entry["status"] == "skipped" else ""
        # the checks of the artifact skip with it when the export itself was cut for time
        for_time = why.startswith("time budget")
        for_export = export_cut and why == "the export check did not produce an artifact"
        # the fake TensorRT is there: a TensorRT check is never "not installed" in a dry run
        dry_skip = why.startswith("dry run: torch sees no CUDA device")
        assert entry["status"] in ("ok", "not installed") or for_time or for_export or dry_skip, (name, entry)
        assert not (name in TENSORRT_CHECKS and entry["status"] == "not installed"), (name, entry)
    ran = [n for n, e in checks.items() if e["status"] == "ok"]
    print(f"dry run: {seconds:.0f} s; ok: {', '.join(ran)}")  # shown with -s: what fitted this machine
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert seconds < 305, f"dry run took {seconds:.0f} s"  # killed at 290 s (+10 s grace) otherwise


@pytest.mark.slow
def test_dry_mode_runs_every_tensorrt_check_to_its_end_on_the_fake_tensorrt(tmp_path):
    """--dry with the fake TensorRT and CUDA runtime of tests/fakes and the stub trtexec: the export,
    the Python build, the engine run with cuda-python buffers, dfine-verify of the engine and the
    trtexec build all finish "ok". An engine opened without a dfine-verify result (UnverifiedEngine)
    fails them here, as it would on the first GPU host."""
    import json
    import os

    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHON": sys.executable, "GPU_CHECK_WORK": str(tmp_path / "work")}
    env.update(OMP_NUM_THREADS="1", GPU_CHECK_WHEELS=str(tmp_path / "no_wheels"))
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry", str(report), "--only", "export", *TENSORRT_CHECKS],
        capture_output=True,
        text=True,
        timeout=330,
        env=env,
    )
    checks = json.loads(report.read_text())["checks"]
    assert result.returncode == 0, json.dumps(checks, indent=1)[:3000] + result.stderr[-2000:]
    assert list(checks) == ["export", *TENSORRT_CHECKS[:4], "trtexec_build"]
    for name in ("export", "tensorrt_build", "trt_run_cudart", "verify_tensorrt", "trtexec_build"):
        assert checks[name]["status"] == "ok", (name, checks[name])
    assert "--target trt11" in checks["export"]["export"]["command"]  # the fake's TensorRT 11
    assert checks["tensorrt_build"]["verification"]["status"] == "verified"
    cudart = checks["trt_run_cudart"]
    assert cudart["provider"].endswith("(cuda-python buffers)") and cudart["agreement"]["passed"]
    verified = checks["verify_tensorrt"]
    assert verified["passed"] and verified["device"]["backend"] == "tensorrt"
    assert verified["layer_precision"]["status"] == "verified", verified["layer_precision"]
    assert checks["trtexec_build"]["record"]["gpu_name"] == "Fake T4"
    assert checks["trtexec_build"]["agreement"]["passed"]
    # torch's buffers need a CUDA device torch sees: in a dry run it says so instead of failing
    assert checks["trt_run_torch"]["status"] == "skipped"
    assert checks["trt_run_torch"]["why"].startswith("dry run: torch sees no CUDA device")


def test_a_python_without_the_runtime_packages_is_refused_in_one_line(tmp_path):
    """Every check imports the runtime: an interpreter lacking numpy/OpenCV/... is named at once."""
    import venv

    venv.create(tmp_path / "empty", with_pip=False)
    env = {"PATH": "/usr/bin:/bin", "PYTHON": str(tmp_path / "empty" / "bin" / "python")}
    result = subprocess.run(
        ["bash", str(SCRIPT), "--dry", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert "lacks numpy opencv-python-headless pyyaml pillow torch" in line and "gpu_wheels.py" in line
    assert not (tmp_path / "r.json").exists()


def test_a_verify_check_reads_the_entry_its_own_run_wrote(tmp_path, monkeypatch):
    """verify.json keeps every file's and device's results: an earlier failed entry of the same backend
    (another engine, listed first) is not this run's, and a run that verified another file than the
    engine it was asked about fails the check."""
    from benchmarks.gpu_checks import verify as verify_checks
    from dfine_deploy.runtime.verify_record import read_results, write_result

    engine = tmp_path / "model.engine"
    device = {"backend": "tensorrt", "gpu": "Fake T4"}
    earlier = {"file": str(tmp_path / "model.int8.engine"), "sha256": "a" * 64, "device": device}
    write_result(tmp_path, {**earlier, "passed": False, "failure": "INT8 is 3% slower"})
    verified = [str(engine)]

    def dfine_verify(cmd, timeout):  # what `dfine-verify` leaves: its one entry added
        write_result(tmp_path, {"file": verified[0], "sha256": "b" * 64, "device": device, "passed": True})
        return {"command": " ".join(cmd), "seconds": 1.0}

    monkeypatch.setattr(verify_checks, "run_command", dfine_verify)
    ctx = {"artifact": tmp_path}
    entry = verify_checks._verify(ctx, "tensorrt", "cuda", tmp_path, engine)
    assert entry["passed"] and entry["file"] == str(engine) and len(read_results(tmp_path)) == 2
    verified[0] = str(tmp_path / "model.fp32.engine")
    with pytest.raises(AssertionError, match=r"verified .*model.fp32.engine, not .*model.engine"):
        verify_checks._verify(ctx, "tensorrt", "cuda", tmp_path, engine)
