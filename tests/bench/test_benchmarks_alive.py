"""Every script in benchmarks/ runs in its tiny form, as a user runs it: `python benchmarks/NAME.py ...`
from the repository root, in a subprocess, relative paths. Seconds each, not minutes; no download, no GPU.
An import or an option that changed under a script breaks this suite instead of the next user.

The tiny forms are small sizes and single runs of each script's own options (the figures printed are
not measurements). A script whose work needs what a test machine lacks (a checkout of another project,
the network, TensorRT and an NVIDIA GPU) is run up to that need: its imports and its options are real,
and the refusal it gives is checked. `test_every_script_has_a_tiny_form` fails for a script added
without an entry here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.runtime.test_runtime_detector import make_artifact

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"

# Covered elsewhere: gpu_check.py is started by gpu_check.sh, whose --dry run is its suite test.
COVERED_ELSEWHERE = {"gpu_check.py": "tests/bench/test_gpu_check.py (gpu_check.sh --dry)"}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> dict[str, str]:
    """What the tiny forms take, made once: a 5-class artifact with D-FINE's interface (a graph of a few
    hundred weights, tests/runtime/tiny_graphs.py) and a COCO val folder with the artifact's classes."""
    root = tmp_path_factory.mktemp("benchmarks")
    artifact = make_artifact(root / "artifact", batch_max=4)
    data = root / "data"
    import cv2
    import numpy as np

    val = data / "val"
    val.mkdir(parents=True)
    images, annotations = [], []
    for i in range(4):
        name = f"{i}.jpg"
        cv2.imwrite(str(val / name), np.full((48, 64, 3), 40 * i, np.uint8))
        images.append({"id": i, "file_name": name, "width": 64, "height": 48})
        annotations.append(
            {"id": i, "image_id": i, "category_id": i % 5, "bbox": [8, 8, 20, 16], "area": 320, "iscrowd": 0}
        )
    categories = [{"id": c, "name": f"thing{c}"} for c in range(5)]
    coco = {"images": images, "annotations": annotations, "categories": categories}
    (val / "annotations.json").write_text(json.dumps(coco))
    return {"artifact": str(artifact), "data": str(data), "val": str(val), "root": str(root)}


# script -> (arguments of its tiny form, exit status, a fragment its output must hold). {name} is filled
# from the `tiny` fixture.
TINY: dict[str, tuple[list[str], int, str]] = {
    "data_cache.py": (
        ["--images", "4", "--image-size", "64", "--input-size", "64", "--batch", "2", "--repeats", "1"],
        0,
        "4 images from",
    ),
    "events_soak.py": (["--minutes", "0.03", "--streams", "1", "--sample-s", "1"], 0, "RSS"),
    "export_accuracy.py": (["--sizes", "n", "--imgsz", "256"], 0, "fp16"),
    "export_latency.py": (["--imgsz", "256", "--warmup", "1", "--runs", "2"], 0, "median"),
    "model_latency.py": (["--sizes", "n", "--imgsz", "256", "--warmup", "0", "--runs", "1"], 0, "median"),
    "parity_all_sizes.py": (["n"], 0, "n"),
    "recording_cost.py": (["--size", "160x120", "--frames", "8", "--repeats", "2"], 0, "per frame"),
    "runtime_overhead.py": (
        ["--model", "{artifact}", "--backend", "onnxruntime", "--frame", "160", "120", "--batch", "1"]
        + ["--runs", "2", "--warmup", "1"],
        0,
        "predict",
    ),
    "serve_load.py": (
        ["{artifact}", "--backend", "onnxruntime", "--clients", "1", "--streams", "1", "--seconds", "1"]
        + ["--settle", "0", "--width", "160", "--height", "120", "--max-requests", "20"],
        0,
        "p50",
    ),
    "serve_overhead.py": (
        ["{artifact}", "--backend", "onnxruntime", "--streams", "1", "--width", "160", "--height", "120"]
        + ["--seconds", "0.5", "--warmup", "0.2", "--repeats", "1", "--tracker-frames", "5"],
        0,
        "tracked",
    ),
    # no round: the rounds are the signal tests the suite runs itself; this checks that it finds them
    "stress_signals.py": (["--rounds", "0"], 0, "test_sighup_finishes_the_segment_in_progress"),
    "spin_wait.py": (["{artifact}", "--fps", "20", "--seconds", "0.5", "--rounds", "1"], 0, "spin"),
    "thresholds_holdout.py": (["{artifact}", "{data}"], 0, "macro-F1"),
    "tracker_settings.py": (
        ["--model", "{artifact}", "--frames", "20", "--lost", "1", "--confident", "0.5"],
        0,
        "crossings",
    ),
    "frigate_thresholds.py": (["{artifact}", "{val}"], 0, "inside Frigate's post-processing"),
    "train_step.py": (["--sizes", "256", "--batch", "1", "--steps", "1", "--warmup", "0"], 0, "256"),
    # eager-n, the cheapest job; train_step.py's own row runs the training step vs_official's train jobs take
    "vs_official.py": (
        ["--tiny", "--jobs", "eager-n", "--work", "{root}/vs_official"],
        0,
        "official side RECORDED",
    ),
    # Needs a clone of Frigate (nothing of it is kept here): run up to the check of --frigate.
    "frigate_nms_cost.py": (
        ["--frigate", "{root}/no-frigate", "--model", "{artifact}", "--data", "{val}"],
        2,
        "give a clone of Frigate",
    ),
    # Needs a clone of EdgeCrafter: run up to the check that the folder is a git checkout.
    "ecdet_vs_official.py": (["{root}/no-edgecrafter"], 2, "not a git checkout"),
    # Needs a clone of D-FINE: run up to the check that the folder holds its inference script.
    "dfine_vs_official_images.py": (["{root}/no-dfine"], 2, "not a D-FINE checkout"),
    # Its work is `pip download` (the network): run up to its refusal of a folder it did not write.
    "gpu_wheels.py": (["--out", "{root}"], 2, "holds files this script did not write"),
    # Needs TensorRT and an NVIDIA GPU: the tiny artifact is handed to the build, which refuses in one line.
    "trt_build.py": (["--artifact", "{artifact}", "--runs", "1"], 2, "error: --trt: the TensorRT Python"),
}


def run_script(script: str, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess:
    """`python benchmarks/SCRIPT ARGS` from the repository root, as a user types it."""
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="2")
    return subprocess.run(
        [sys.executable, f"benchmarks/{script}", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.parametrize("script", sorted(TINY))
def test_benchmark_runs_in_its_tiny_form(script, tiny):
    args, status, fragment = TINY[script]
    done = run_script(script, [a.format(**tiny) for a in args])
    output = done.stdout + done.stderr
    assert done.returncode == status, f"{script} exited {done.returncode}:\n{output[-3000:]}"
    assert fragment in output, output[-3000:]
    assert "Traceback" not in output, output[-3000:]


def test_every_script_has_a_tiny_form():
    scripts = {path.name for path in BENCHMARKS.glob("*.py")}
    missing = scripts - set(TINY) - set(COVERED_ELSEWHERE)
    assert not missing, f"benchmarks without a tiny form in {Path(__file__).name}: {sorted(missing)}"
    assert not (set(TINY) | set(COVERED_ELSEWHERE)) - scripts, "entries for scripts that are gone"


def test_vs_official_names_a_job_without_a_recorded_official_figure():
    done = run_script("vs_official.py", ["--tiny", "--jobs", "eager-s"])
    assert done.returncode == 1
    assert "no recorded official figure for eager-s" in done.stderr and "--official DIR" in done.stderr
