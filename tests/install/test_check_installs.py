"""scripts/check_installs.py against PyPI: the `[gpu]` install gets onnxruntime-gpu alone, and the
check catches the old layout (onnxruntime in the base dependencies beside the `gpu` extra).

Needs PyPI (CI has it): unreachable, the test fails with one line saying so. About 20-60 s per case
with pip's cache warm (it downloads each wheel once: PyPI's proxy here serves no PEP 658 metadata).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "check_installs.py"


def _check(tmp_path: Path, *args: str) -> tuple[int, list[dict], str]:
    out = tmp_path / "results.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--json", str(out), *args], capture_output=True, text=True, timeout=900
    )
    if proc.returncode == 2 and "PyPI is unreachable" in proc.stderr:
        pytest.fail(proc.stderr.strip().splitlines()[-1], pytrace=False)
    results = json.loads(out.read_text()) if out.exists() else []
    return proc.returncode, results, proc.stdout + proc.stderr


@pytest.mark.slow
def test_gpu_extra_resolves_onnxruntime_gpu_alone(tmp_path):
    rc, results, printed = _check(tmp_path, "--case", "x86-cuda12:gpu")
    assert rc == 0, printed
    (result,) = results
    assert "onnxruntime-gpu" in result["resolved"] and "onnxruntime" not in result["resolved"]


@pytest.mark.slow
def test_the_check_fails_when_onnxruntime_sits_in_the_base(tmp_path):
    """The layout before the `cpu`/`gpu` split: base onnxruntime + `gpu` onnxruntime-gpu."""
    text = (ROOT / "pyproject.toml").read_text()
    old = re.sub(r"dependencies = \[\n", 'dependencies = [\n    "onnxruntime>=1.17",\n', text, count=1)
    assert old != text
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(old)
    rc, results, printed = _check(tmp_path, "--pyproject", str(pyproject), "--case", "x86-cuda12:gpu")
    assert rc == 1, printed
    assert any("beside onnxruntime-gpu" in f for f in results[0]["failed"]), results
