"""Session-wide test settings: the run's first line names the CPU's ISA class, and each xdist worker
gets its own cores.

Numeric tolerances and the INT8/BF16 paths depend on that class (dfine_deploy/cpu.py), so a report
from another machine is read against the class it ran on.

`make test` runs two workers (pytest-xdist). Each is pinned to its share of the cores before torch,
onnxruntime or OpenVINO make their thread pools, and `dfine_deploy/cores.py` sizes those pools from
the affinity mask (onnxruntime's own default does not read it), which every child process inherits.
Unpinned, each worker's two torch threads spin at every barrier while the other worker holds a core:
a 30-step smoke run took 255 s of CPU instead of 26 s (docs/development.md). A test that leaves the
worker real-time fails (`_time_shared_scheduling`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from dfine_deploy import cpu
from tests.support.trained_model import TrainedModel

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # "gw0", "gw1", ... in a worker, unset otherwise
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    cores = sorted(os.sched_getaffinity(0))
    if worker and len(cores) >= workers > 1:  # a worker replacing a crashed one counts on: gw2, gw3, ...
        os.sched_setaffinity(0, cores[int(worker.removeprefix("gw")) % workers :: workers])


def pytest_report_header(config: pytest.Config) -> str:
    return f"CPU ISA class: {cpu.describe()}"


@pytest.fixture(autouse=True)
def _time_shared_scheduling():
    """Fail the test that leaves this process real-time (SCHED_FIFO/RR), and put it back: every
    process and thread the worker starts after would inherit it, and on 2 cores a real-time spinner
    starves the rest. SVT-AV1 does this when run as root (tests/serve/user_videos.py)."""
    yield
    policy = os.sched_getscheduler(0)
    if policy != os.SCHED_OTHER:
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        pytest.fail(f"the test left this process real-time (scheduling policy {policy}); put it back")


@pytest.fixture(scope="session")
def session_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test session's folder, shared by its xdist workers (each has its own folder below it)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def quickstart_run(session_folder: Path) -> Path:
    """`scripts/quickstart.py --fast`, run once per test session and read by every test that needs a
    trained model and its files (tests/quickstart checks the run itself; tests/docs runs the docs'
    commands on it). xdist workers share it: the first one to ask runs it, under a file lock, in the
    session's folder above theirs. Read-only: a test that changes a file works on its own copy."""
    from filelock import FileLock

    out = session_folder / "quickstart-fast"
    with FileLock(str(session_folder / "quickstart-fast.lock")):
        if not (out / "summary.json").is_file():
            proc = subprocess.run(
                [sys.executable, str(REPO / "scripts" / "quickstart.py"), "--fast", "--out", str(out)],
                cwd=REPO,
                capture_output=True,
                text=True,
                timeout=880,
            )
            assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return out


@pytest.fixture(scope="session")
def trained_model(session_folder: Path) -> TrainedModel:
    """The suite's trained D-FINE-N (tests/fixtures/dfine_n_synthetic.safetensors) as the `.pth`
    checkpoint every command takes, and its own validation set (`dfine-data synth` with the recipe
    its provenance records). Made once per session under a file lock; read-only."""
    from filelock import FileLock

    from tests.support import trained_model as fixture

    folder = session_folder / "trained-model"
    recipe = fixture.data_recipe()
    with FileLock(str(session_folder / "trained-model.lock")):
        checkpoint = folder / "model.pth"
        if not checkpoint.is_file():
            synth = ["--images", "1", "--val-images", str(recipe["val_images"])]
            synth += ["--size", str(recipe["size"]), "--seed", str(recipe["seed"])]
            _run_tool("dfine-data", "synth", "--out", str(folder / "data"), *synth)
            fixture.materialise(fixture.SAFETENSORS, folder / "model.pth.partial")
            (folder / "model.pth.partial").rename(checkpoint)
    return TrainedModel(checkpoint=checkpoint, val=folder / "data" / "val", imgsz=recipe["size"])


@pytest.fixture(scope="session")
def trained_export(session_folder: Path, trained_model: TrainedModel) -> Path:
    """`dfine-export model.pth -o export --imgsz 256 256 --data VAL` (the quickstart's export line) on
    the trained model, its FP32 graph's AP50 on the validation set checked by the accuracy guard.
    Read-only: a test that changes a file works on its own copy."""
    from filelock import FileLock

    from tests.support.trained_model import guard_artifact

    out = session_folder / "trained-export"
    size = str(trained_model.imgsz)
    with FileLock(str(session_folder / "trained-export.lock")):
        if not (out / "model.json").is_file():
            _run_tool(
                "dfine-export",
                str(trained_model.checkpoint),
                "-o",
                str(out),
                "--imgsz",
                size,
                size,
                "--data",
                str(trained_model.val),
            )
    guard_artifact(out, trained_model.val)
    return out


def _run_tool(name: str, *args: str) -> None:
    """A console script of this venv, from the checkout, failing the test with its output's tail."""
    tool = str(Path(sys.executable).with_name(name))
    proc = subprocess.run([tool, *args], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"{name} {' '.join(args)}\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
