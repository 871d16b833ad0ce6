"""The runtime side (dfine-bench, dfine-serve, the onnxruntime/TensorRT backends) on Python 3.8, the
Python of JetPack 5 (docs/install.md).

1. vermin (a static reading of every module the runtime entry points import) finds nothing newer
   than 3.8;
2. on a real 3.8 interpreter, in a venv that pip fills from this pyproject (`[serve]` plus onnxruntime,
   as on JetPack 5), every runtime module imports, `dfine-bench --help` runs, `dfine-bench
   --device jetson` benchmarks a tiny ONNX graph on onnxruntime's CPU provider, and `dfine-serve`
   serves a video file and writes its detections.

The 3.8 interpreter: $DFINE_PYTHON38, else python3.8 on PATH, else pyenv's or uv's
(scripts/install-system-deps.sh fetches one with uv). Missing, the test skips and says so, except in
CI (CI=true), where it fails. The venv is kept in ~/.cache/dfine-deploy
(keyed by pyproject.toml); building it needs PyPI once (minutes).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from benchmarks.gpu_wheels import build_own_wheel

ROOT = Path(__file__).resolve().parents[2]
ENTRY_MODULES = (
    "dfine_deploy.runtime",
    "dfine_deploy.runtime.onnxruntime_backend",
    "dfine_deploy.runtime.tensorrt_backend",
    "dfine_deploy.runtime.openvino_backend",
    "dfine_deploy.bench.cli",
    "dfine_deploy.serve.cli",
    "dfine_deploy.serve.app",
    "dfine_deploy.artifact",
    "dfine_deploy.verify.cli",
    "dfine_deploy.verify.check",
)
IMPORT_ALL = """
import importlib, pkgutil, sys
failed = []
for name in ("dfine_deploy.runtime", "dfine_deploy.bench", "dfine_deploy.serve", "dfine_deploy.verify"):
    package = importlib.import_module(name)
    for info in pkgutil.walk_packages(package.__path__, name + "."):
        if info.name in ("dfine_deploy.serve.tracking", "dfine_deploy.bench.training"):
            continue  # trackers needs 3.10 (refused in one line); --train is the torch side
        try:
            importlib.import_module(info.name)
        except Exception as exc:
            failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
sys.exit(1 if failed else 0)
"""


def _runtime_files() -> list[str]:
    """Every dfine_deploy module the runtime entry points import, found by importing them."""
    code = (
        "import importlib, sys\n"
        f"for m in {ENTRY_MODULES!r}: importlib.import_module(m)\n"
        "print('\\n'.join(sorted(m.__file__ for n, m in sys.modules.items()"
        " if n.startswith('dfine_deploy') and getattr(m, '__file__', None))))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    return out.stdout.split()


def test_vermin_finds_nothing_newer_than_python_38():
    files = _runtime_files()
    assert any(f.endswith("serve/app.py") for f in files) and any("tensorrt_backend" in f for f in files)
    proc = subprocess.run(
        [str(Path(sys.executable).with_name("vermin")), "-q", "--no-tips", "--violations", "-t=3.8-", *files],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


PYTHON38_GLOBS = (".pyenv/versions/3.8*/bin/python3.8", ".local/share/uv/python/cpython-3.8*/bin/python3.8")


def _python38() -> str:
    candidates = [os.environ.get("DFINE_PYTHON38"), shutil.which("python3.8")]
    for pattern in PYTHON38_GLOBS:
        candidates += sorted(str(p) for p in Path.home().glob(pattern))
    for candidate in candidates:
        if candidate and Path(candidate).is_file():
            probe = subprocess.run(
                [candidate, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True
            )
            if probe.stdout.strip() == "(3, 8)":
                return candidate
    message = "no Python 3.8 interpreter (set DFINE_PYTHON38, or install python3.8 / pyenv 3.8)"
    if os.environ.get("CI") == "true":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def py38() -> Path:
    interpreter = _python38()
    key = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:12]
    venv = Path.home() / ".cache" / "dfine-deploy" / f"py38-{key}"
    python = venv / "bin" / "python"
    venv.parent.mkdir(parents=True, exist_ok=True)
    # The venv is shared by every checkout and test run on this machine (keyed by pyproject.toml):
    # one builds it while the others wait, so no run removes a venv another is building.
    with (venv.parent / f"{venv.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            shutil.rmtree(venv, ignore_errors=True)  # only our own half-built venv of this key
            subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
            # Our wheel is built here: setuptools >= 77 (PEP 639 license) has no Python 3.8 release, so
            # on JetPack 5 too the package is installed from a wheel (docs/install.md).
            wheels = venv / "wheel"
            built = build_own_wheel(wheels, venv / "src")
            assert built.returncode == 0, built.stderr[-3000:]
            (wheel,) = wheels.glob("dfine_deploy-*.whl")
            install = [str(python), "-m", "pip", "install", "-q", "--only-binary=:all:"]
            done = subprocess.run(
                [*install, f"{wheel}[serve]", "onnxruntime>=1.17"],
                capture_output=True,
                text=True,
                timeout=900,
            )
            assert done.returncode == 0, done.stderr[-3000:]
            (venv / ".complete").write_text("pip install done\n")
    return python


def _for_onnxruntime_119(path: Path) -> Path:
    """onnxruntime 1.19, the newest with Python 3.8 wheels, reads ONNX IR <= 10; today's onnx writes a
    newer IR by default. IR 8 holds opset 18 (the tiny graph's); dfine-export writes IR 8 too."""
    import onnx

    model = onnx.load(str(path))
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def _run(py38: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this tree, not the copy pip installed
    return subprocess.run(
        [str(py38), *args], capture_output=True, text=True, env=env, timeout=timeout, cwd=ROOT
    )


@pytest.mark.slow
def test_runtime_modules_import_on_python_38(py38):
    done = _run(py38, "-c", IMPORT_ALL)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (
        "torch"
        not in _run(py38, "-c", "import sys, dfine_deploy.serve.app; print(sorted(sys.modules))").stdout
    )


@pytest.mark.slow
def test_bench_on_python_38_with_device_jetson(py38, tmp_path):
    sys.path.insert(0, str(ROOT / "tests" / "serve"))
    from tiny_model import red_score_model

    model = _for_onnxruntime_119(red_score_model(tmp_path / "red.onnx"))
    assert _run(py38, "-m", "dfine_deploy.bench.cli", "--help").returncode == 0
    report = tmp_path / "bench.json"
    done = _run(
        py38, "-m", "dfine_deploy.bench.cli", "--model", str(model), "--backend", "onnxruntime",
        "--device", "jetson", "--batch", "1", "--runs", "5", "--warmup", "1", "--json", str(report),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(report.read_text())


@pytest.mark.slow
def test_serve_on_python_38_writes_detections(py38, tmp_path):
    import cv2
    import numpy as np

    sys.path.insert(0, str(ROOT / "tests" / "serve"))
    from tiny_model import red_score_model

    model = _for_onnxruntime_119(red_score_model(tmp_path / "red.onnx"))
    video = tmp_path / "clip.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    for i in range(8):
        frame = np.zeros((48, 64, 3), np.uint8)
        frame[..., 2 if i % 2 == 0 else 0] = 255  # red, blue, red, ...
        writer.write(frame)
    writer.release()
    out = tmp_path / "detections.jsonl"
    done = _run(
        py38, "-m", "dfine_deploy.serve.cli", str(model), "--backend", "onnxruntime", "--source", str(video),
        "--every-frame", "--fast", "--port", "0", "--duration", "60", "--output-json", str(out),
        "--log-level", "warning",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["frame_index"] for r in results] == list(range(8))
    scores = [r["detections"][0]["score"] if r["detections"] else 0.0 for r in results]
    assert scores[0] > 0.9 and scores[1] < 0.1, scores  # red scores ~1, blue ~0: BGR->RGB on 3.8 too


def test_compat_fallbacks_behave_like_the_newer_builtins():
    """The 3.8 branch of dfine_deploy.compat, run here too: the same answers as zip(strict=True)."""
    from dfine_deploy.compat import _zip_checked, remove_prefix

    assert list(_zip_checked([1, 2], "ab")) == list(zip([1, 2], "ab", strict=True))
    assert list(_zip_checked([], [])) == []
    with pytest.raises(ValueError, match="different lengths"):
        list(_zip_checked([1, 2], [1]))
    with pytest.raises(ValueError, match="different lengths"):
        list(_zip_checked([1], [1, 2]))
    assert remove_prefix("instances_val", "instances_") == "val" and remove_prefix("val", "x") == "val"
