"""`dfine-export --target rk3588`: model.rknn built by rknn-toolkit2 and gated against PyTorch in its
simulator (the real toolkit, in its own venv: `make rknn-venv`, which `make test` builds), the runtime
row that opens it, and what the target refuses.

The export runs on random weights (torch seed 0), so the gates are the rank-free ones. It takes about
2.5 minutes on 2 loaded cores (the toolkit's build of D-FINE-N at its smallest size is most of it),
which is why one export serves every test here. model.int8.rknn is not built here: it fails its gate
in the simulator (docs/export.md: Rockchip NPUs).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from dfine_deploy.artifact import read_artifact
from dfine_deploy.backend_names import BackendName
from dfine_deploy.boxes import box_iou
from dfine_deploy.data.synthetic import write_split
from dfine_deploy.errors import ExportError
from dfine_deploy.export import parity
from dfine_deploy.export import rknn as rknn_export
from dfine_deploy.export.cli import main as export_main
from dfine_deploy.export.pipeline import export_artifact
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.runtime import rknn_backend

SIZE = 256  # the smallest square D-FINE-N takes
REPO = Path(__file__).parents[2]


def _tool_python() -> Path:
    """The tool venv's interpreter; CI must have it (`make test` builds it), elsewhere its absence skips."""
    path = REPO / rknn_export.TOOL_VENV / "bin" / "python"
    if not path.is_file():
        missing = f"{path} is missing (make rknn-venv)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{missing}; CI must have it")
        pytest.skip(missing)
    return path


@pytest.fixture(scope="module")
def rknn_artifact(tmp_path_factory) -> Path:
    """dfine-n at 256 px for rk3588, FP16, through the CLI."""
    python = _tool_python()
    folder = tmp_path_factory.mktemp("rknn")
    write_split(folder / "data", "val", 4, seed=3, size=SIZE)
    torch.manual_seed(0)
    out = folder / "art"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(rknn_export.PYTHON_VARIABLE, str(python))
        code = export_main(
            ["dfine-n", "--target", "rk3588", "--imgsz", str(SIZE), str(SIZE), "--batch", "1", "1", "1"]
            + ["--no-fp16", "--data", str(folder / "data" / "val")]
            + ["--gate-images", "2", "-o", str(out)]
        )
    assert code == 0
    return out


@pytest.mark.slow
def test_model_rknn_is_built_gated_in_the_simulator_and_routed(rknn_artifact):
    info = read_artifact(rknn_artifact)
    assert info.backend_graphs[BackendName.RKNN] == {"fp16": "rknn-fp16"}
    graph = info.graphs["rknn-fp16"]
    assert graph.file == "model.rknn" and (rknn_artifact / "model.rknn").stat().st_size > 1_000_000
    assert graph.recipe["build"]["target_platform"] == "rk3588"
    report = info.parity["rknn-fp16:rknn"]
    assert report["passed"] and report["reference"] == "pytorch" and "simulator" in report["candidate"]
    assert report["images"] == 2 and report["box_precision"] >= parity.FP16_GATE.box_agreement


@pytest.mark.slow
def test_the_runtime_row_runs_the_fp16_file_in_the_simulator_like_onnxruntime(rknn_artifact):
    """Detector.open(folder, backend="rknn") in the tool venv (the simulator rebuilds model.rknn's
    source graph) finds what onnxruntime finds in model.onnx on the same frame."""
    python = _tool_python()
    frame = (np.random.default_rng(5).random((SIZE, SIZE, 3)) * 255).astype(np.uint8)
    np.save(rknn_artifact.parent / "frame.npy", frame)
    script = (
        "import json, sys, numpy as np\n"
        "from dfine_deploy.runtime import Detector\n"
        "frame = np.load(sys.argv[2])\n"
        "out = {}\n"
        "for backend in ('rknn', 'onnxruntime'):\n"
        "    d = Detector.open(sys.argv[1], backend=backend, score_threshold=0.0)\n"
        "    r = d.predict([frame])[0]\n"
        "    out[backend] = [d.backend.provider, r.boxes.tolist(), r.labels.tolist()]\n"
        "print('RESULT', json.dumps(out))\n"
    )
    done = subprocess.run(
        [str(python), "-c", script, str(rknn_artifact), str(rknn_artifact.parent / "frame.npy")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # rknn-toolkit2 writes its own lines to stdout too, some after ours
    out = json.loads(next(line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")))
    assert out["rknn"][0] == "rknn-toolkit2 simulator (rk3588)"
    (_, ort_boxes, ort_labels), (_, rk_boxes, rk_labels) = out["onnxruntime"], out["rknn"]
    assert len(rk_boxes) == len(ort_boxes) > 20
    # random weights: near-tied scores may reorder, so each of onnxruntime's first 20 is looked for
    # among all of the simulator's, same label at IoU 0.9 (the FP16 gate's bar)
    iou = box_iou(np.array(ort_boxes[:20]), np.array(rk_boxes))
    same = np.array(ort_labels[:20])[:, None] == np.array(rk_labels)[None, :]
    assert ((iou >= 0.9) & same).any(axis=1).mean() >= parity.FP16_GATE.box_agreement


def test_a_missing_tool_venv_is_one_line_that_says_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.setenv(rknn_export.PYTHON_VARIABLE, str(tmp_path / "nope" / "python"))
    opts = ExportSettings(model="dfine-n", output=tmp_path / "out", target="rk3588")
    with pytest.raises(ExportError, match=r"rknn-toolkit2 runs in its own venv .*make rknn-venv"):
        export_artifact(opts)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "option"), [({"postprocess": False}, "--no-postprocess"), ({"trt": True}, "--trt")]
)
def test_options_an_rknn_export_cannot_take_are_refused_first(tmp_path, change, option):
    opts = ExportSettings(model="dfine-n", output=tmp_path / "out", target="rk3566", **change)
    with pytest.raises(ExportError, match=rf"^{re.escape(option)} with --target rk3566: .*drop"):
        export_artifact(opts)


def test_the_makefile_installs_the_toolkit_release_the_code_names():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert f'"{rknn_backend.TOOLKIT}"' in makefile
