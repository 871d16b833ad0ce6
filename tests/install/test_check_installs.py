"""scripts/check_installs.py against PyPI: `[gpu-cu12]` gets onnxruntime-gpu alone, built for CUDA 12,
and `[gpu-cu13]` one built for 13; the check catches the old layouts (onnxruntime in the base beside
onnxruntime-gpu; an unbounded onnxruntime-gpu, which is CUDA 13's on a CUDA 12 host), and runs with a
fresh venv's own pip (23.2 on Python 3.11), which wants `--target` beside `--platform`.

Needs PyPI (CI has it): unreachable, the test fails with one line saying so. About 20-60 s per case
with pip's cache warm (it downloads each wheel once: PyPI's proxy here serves no PEP 658 metadata).
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_installs.py"
spec = importlib.util.spec_from_file_location("check_installs", SCRIPT)
check_installs = importlib.util.module_from_spec(spec)
sys.modules["check_installs"] = check_installs
spec.loader.exec_module(check_installs)


def _check(tmp_path: Path, *args: str) -> tuple[int, list[dict], str]:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out), *args], capture_output=True, text=True, timeout=900
    )
    if proc.returncode == 2 and "PyPI is unreachable" in proc.stderr:
        pytest.fail(proc.stderr.strip().splitlines()[-1], pytrace=False)
    results = json.loads(out.read_text()) if out.exists() else []
    return proc.returncode, results, proc.stdout + proc.stderr


def _failures_with_pyproject(tmp_path: Path, pattern: str, replacement: str) -> list[str]:
    """The x86 CUDA 12 case's failures, checked against this pyproject.toml with the first match of
    `pattern` replaced (an old layout of the extras): the check must exit 1."""
    text = (ROOT / "pyproject.toml").read_text()
    changed = re.sub(pattern, replacement, text, count=1)
    assert changed != text, f"{pattern!r} no longer matches pyproject.toml"
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(changed)
    rc, results, printed = _check(tmp_path, "--pyproject", str(pyproject), "--case", "x86-cuda12:gpu-cu12")
    assert rc == 1, printed
    return results[0]["failed"]


@pytest.mark.slow
def test_gpu_extras_resolve_onnxruntime_gpu_of_their_cuda_major_alone(tmp_path):
    rc, results, printed = _check(tmp_path, "--case", "x86-cuda12:gpu-cu12", "x86-cuda13:gpu-cu13")
    assert rc == 0, printed
    for result, major in zip(results, (12, 13), strict=True):
        assert "onnxruntime" not in result["resolved"], result
        assert result["resolved"]["onnxruntime-gpu"].endswith(f"(CUDA {major})"), result
        (runtime,) = [v for k, v in result["resolved"].items() if k.startswith("nvidia-cuda-runtime")]
        assert runtime.startswith(f"{major}."), result


@pytest.mark.slow
def test_the_check_fails_an_unbounded_onnxruntime_gpu_on_a_cuda_12_host(tmp_path):
    """The `gpu` extra before the split: no upper bound, so PyPI's newest build, made for CUDA 13."""
    failed = _failures_with_pyproject(
        tmp_path,
        r'gpu-cu12 = \["onnxruntime-gpu\[cuda,cudnn\][^"]*"\]',
        'gpu-cu12 = ["onnxruntime-gpu[cuda,cudnn]>=1.21"]',
    )
    assert any("is built for CUDA 13, not 12" in f for f in failed), failed


@pytest.mark.slow
def test_a_fresh_venvs_own_pip_runs_the_check(tmp_path):
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(tmp_path / "venv")], check=True, timeout=300)
    rc, results, printed = _check(
        tmp_path, "--pip", str(tmp_path / "venv" / "bin" / "python"), "--case", "jetpack6:jetpack6"
    )
    assert rc == 0, printed
    assert results[0]["resolved"]["numpy"].startswith("1."), results


def test_the_cuda_major_is_read_from_the_wheels_own_cuda_extra():
    """Requires-Dist lines as onnxruntime-gpu 1.26.0 and 1.28.0 declare them."""
    cu12 = [
        'nvidia-cuda-nvrtc-cu12~=12.0; extra == "cuda"',
        'nvidia-cuda-runtime-cu12~=12.0; extra == "cuda"',
    ]
    cu13 = ['nvidia-cuda-runtime~=13.0; extra == "cuda"', 'nvidia-cudnn-cu13~=9.0; extra == "cudnn"']
    assert check_installs.onnxruntime_gpu_cuda(["numpy>=1.21.6", *cu12]) == 12
    assert check_installs.onnxruntime_gpu_cuda(cu13) == 13
    assert check_installs.onnxruntime_gpu_cuda(["numpy>=1.21.6"]) is None  # before 1.21: no such extra


@pytest.mark.slow
def test_the_check_fails_when_onnxruntime_sits_in_the_base(tmp_path):
    """The layout before the `cpu`/`gpu` split: onnxruntime in the base beside onnxruntime-gpu."""
    failed = _failures_with_pyproject(
        tmp_path, r"dependencies = \[\n", 'dependencies = [\n    "onnxruntime>=1.17",\n'
    )
    assert any("beside onnxruntime-gpu" in f for f in failed), failed


def test_the_install_table_names_the_tensorrt_each_jetpack_ships():
    """JetPack's apt TensorRT is what its releases ship (the jetpack7 row: 10.13 on 7.0/7.1, 10.16 on
    7.2), not the version whose parser rules the target is checked by (10.14)."""
    assert check_installs.apt_tensorrt("jetpack7") == "10.13 or 10.16"
    assert check_installs.apt_tensorrt("jetpack6") == "10.3"
    assert check_installs.apt_tensorrt("jetpack5") == "8.5"
