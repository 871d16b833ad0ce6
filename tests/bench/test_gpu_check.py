"""benchmarks/gpu_check.sh stops at once, clearly, on a machine without an NVIDIA GPU."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "gpu_check.sh"


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
