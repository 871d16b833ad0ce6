"""The Rockchip NPU rows of `export/recipes.py` (`dfine-export --target rk3588` or another RKNPU2
chip): model.rknn (FP16) and, with --int8, model.int8.rknn (calibrated on --data by rknn-toolkit2's
own quantizer), each gated against PyTorch in rknn-toolkit2's simulator with the FP16 and INT8 gates
every other graph passes.

rknn-toolkit2 converts model.onnx, the gather-sampler graph, cut before its postprocessor (images ->
logits, boxes: `rknn_backend.network_cut`); the postprocessor runs on the board's CPU in numpy
(`runtime/rknn_backend.py` says why), in the gate exactly as on a board. The toolkit's pins clash
with the export's own (torch <= 2.4, numpy < 2, onnx <= 1.18), so it runs in its tool venv
(`make rknn-venv`) as a subprocess: `python -m dfine_deploy.runtime.rknn_backend` builds the file
and runs the gate's images in the simulator; the gate itself runs here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dfine_deploy.artifact import GraphInfo
from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.errors import ExportError
from dfine_deploy.export import parity
from dfine_deploy.export.gate_inputs import calibration_feeds
from dfine_deploy.export.run import ExportRun, GraphRecipe, Recorded, Written
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.files import sha256_file
from dfine_deploy.runtime import rknn_backend

log = logging.getLogger(__name__)

TOOL_VENV = Path(".venv-rknn")  # where `make rknn-venv` puts rknn-toolkit2, beside the checkout's .venv
PYTHON_VARIABLE = "DFINE_RKNN_PYTHON"  # another interpreter with rknn-toolkit2 and dfine-deploy installed
PATH_COSINE_BOUND = 0.98  # a failed INT8 gate names the first layer whose whole-path cosine is under it
WORST_LAYERS = 3  # ... and this many layers with the lowest cosine of their own
# a row of accuracy_analysis's table: [Op] tensor, then entire cos | euc, then single cos | euc (a
# layer fused into the next one has no figures of its own)
_ANALYSIS_ROW = re.compile(r"^\[(\w+)\]\s+(\S+)\s+([\d.]+)\s*\|\s*\S+\s+([\d.]+)\s*\|")


class LayerError(NamedTuple):
    """One layer of rknn-toolkit2's accuracy_analysis: its output's cosine to the FP32 one, along the
    whole quantized path (errors accumulate) and with FP32 inputs (the layer's own error)."""

    op: str
    tensor: str
    path_cosine: float
    own_cosine: float


def read_accuracy_analysis(text: str) -> list[LayerError]:
    """The layers of an accuracy_analysis table (its error_analysis.txt), in graph order; rows
    without figures (fused into the next layer) are left out."""
    rows = (_ANALYSIS_ROW.match(line) for line in text.splitlines())
    return [LayerError(m[1], m[2], float(m[3]), float(m[4])) for m in rows if m]


def where_accuracy_is_lost(layers: list[LayerError]) -> str:
    """One phrase for a failed INT8 gate: where the whole path first falls under PATH_COSINE_BOUND,
    and the WORST_LAYERS layers with the lowest cosine of their own."""
    if not layers:
        return "rknn-toolkit2's accuracy_analysis listed no layers"
    first = next((layer for layer in layers if layer.path_cosine < PATH_COSINE_BOUND), None)
    worst = sorted(layers, key=lambda layer: layer.own_cosine)[:WORST_LAYERS]
    return (
        "rknn-toolkit2's accuracy_analysis of the first gate image: "
        + (
            f"the INT8 path's cosine to FP32 first falls under {PATH_COSINE_BOUND} at "
            f"{first.op} {first.tensor} ({first.path_cosine:.4f})"
            if first
            else f"the INT8 path's cosine to FP32 stays at or above {PATH_COSINE_BOUND}"
        )
        + ", lowest single-layer cosines "
        + ", ".join(f"{layer.op} {layer.tensor} {layer.own_cosine:.4f}" for layer in worst)
    )


def tool_python() -> Path:
    """The interpreter that has rknn-toolkit2: $DFINE_RKNN_PYTHON, else ./.venv-rknn's."""
    chosen = os.environ.get(PYTHON_VARIABLE)
    path = Path(chosen) if chosen else TOOL_VENV / "bin" / "python"
    if not path.is_file():
        raise ExportError(
            f"--target rk*: rknn-toolkit2 runs in its own venv and {path} is not there; make it with "
            f"`make rknn-venv` (or `python3 -m venv .venv-rknn && .venv-rknn/bin/pip install "
            f"'{rknn_backend.TOOLKIT}' -e .`), or point {PYTHON_VARIABLE} at one"
        )
    return path


def _key(image: np.ndarray, size: np.ndarray) -> str:
    return hashlib.sha256(image.tobytes() + size.astype(np.int64).tobytes()).hexdigest()


def _simulate(
    run: ExportRun, recipe: GraphRecipe, settings: dict, dataset: Path | None, work: Path
) -> tuple[parity.Runner, str | None]:
    """Build the recipe's file from its source graph in the tool venv, run every gate image in the
    simulator, and return a parity Runner that answers each image with the simulator's outputs.
    An INT8 build (`dataset`) is also put through rknn-toolkit2's accuracy_analysis on the first
    gate image, in the same session (it needs the one that built the graph), whether or not the
    gate will pass: the second item is `where_accuracy_is_lost`'s phrase, for a refusal."""
    source, out = run.path(recipe.source), run.staging / recipe.file
    unique: dict[str, tuple[np.ndarray, np.ndarray]] = {}  # the gate's batch sizes repeat its images
    for batch in run.batches:
        for image, size in zip(batch.images, batch.orig_sizes.astype(np.int64)):
            unique.setdefault(_key(image, size), (image, size))
    images = np.stack([image for image, _ in unique.values()])
    sizes = np.stack([size for _, size in unique.values()])
    feeds, results, analysis = work / "feeds.npz", work / "results.npz", work / "analysis"
    np.savez(feeds, images=images, orig_target_sizes=sizes)
    command = [
        str(tool_python()),
        "-m",
        "dfine_deploy.runtime.rknn_backend",
        "--onnx",
        str(source),
        "--settings",
        json.dumps(settings),
        "--out",
        str(out),
        "--feeds",
        str(feeds),
        "--results",
        str(results),
        *(["--dataset", str(dataset), "--analysis", str(analysis)] if dataset else []),
    ]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not results.is_file():
        tail = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()][-3:]
        raise ExportError(f"rknn-toolkit2 could not build {out.name} from {source.name}: {' | '.join(tail)}")
    log.info(
        "rknn-toolkit2 built %s and simulated %d images%s in %.1f s",
        out.name,
        len(images),
        " (and analysed the first)" if dataset else "",
        time.perf_counter() - start,
    )
    loss = None
    if dataset:
        table = analysis / rknn_backend.ANALYSIS_FILE
        if table.is_file():
            loss = where_accuracy_is_lost(read_accuracy_analysis(table.read_text(encoding="utf-8")))
        else:
            said = [line for line in done.stderr.splitlines() if line.startswith("rknn: ")]
            loss = f"rknn-toolkit2's accuracy_analysis wrote no {table.name} ({' | '.join(said[-1:])})"
    with np.load(results) as answers:
        outputs = {name: answers[name] for name in rknn_backend.OUTPUTS}
    by_image = {key: i for i, key in enumerate(unique)}

    def run_images(batch_images: np.ndarray, orig_sizes: np.ndarray) -> tuple[np.ndarray, ...]:
        rows = [by_image[_key(img, size)] for img, size in zip(batch_images, orig_sizes.astype(np.int64))]
        return tuple(outputs[name][rows] for name in rknn_backend.OUTPUTS)

    return run_images, loss


def _calibration_list(opts: ExportSettings, work: Path) -> Path:
    """rknn-toolkit2's dataset file: one line per image, the .npy of the NPU graph's one input (the
    NCHW image), preprocessed exactly as the gate's and the runtime's inputs are."""
    lines = []
    for i, feed in enumerate(calibration_feeds(opts)):
        image = work / f"calib_{i}_images.npy"
        np.save(image, feed["images"].astype(np.float32))  # NCHW: what rknn-toolkit2 reads .npy as
        lines.append(str(image))
    dataset = work / "dataset.txt"
    dataset.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return dataset


def rknn_graph(run: ExportRun, recipe: GraphRecipe) -> Written:
    """The recipe's source graph built by rknn-toolkit2 for the --target chip (INT8: calibrated on
    --data), gated against the recipe's reference in the toolkit's simulator."""
    opts = run.settings
    settings = rknn_backend.build_settings(opts.target, *opts.imgsz, run.path(recipe.source))
    with tempfile.TemporaryDirectory(prefix="dfine-rknn-") as folder:
        work = Path(folder)
        dataset = _calibration_list(opts, work) if recipe.precision == Precision.INT8 else None
        runner, loss = _simulate(run, recipe, settings, dataset, work)
        calibrated = len(dataset.read_text(encoding="utf-8").splitlines()) if dataset else 0
    names = (run.name(recipe.reference), f"{recipe.file} in the rknn-toolkit2 simulator ({opts.target})")
    report = run.gate(run.reference(recipe), runner, recipe.thresholds, names, force=True)
    if not report.passed and loss:
        report.failures.append(loss)  # in the refusal and in model.json's record of the gate
    parity.enforce(report, force=opts.force)
    record: dict[str, object] = {
        "toolkit": rknn_backend.TOOLKIT,
        "build": settings,
        "source_graph": run.path(recipe.source).name,
        "gated_in": "rknn-toolkit2 simulator",
    }
    if calibrated:
        record.update(calibration_data=str(Path(opts.data).resolve()), calibration_images=calibrated)
    path = run.staging / recipe.file
    graph = GraphInfo(
        recipe.file,
        sha256_file(path),
        recipe.precision,
        opts.opset,
        recipe=record,
        sampler=run.sampler(recipe),
    )
    return Written(recipe.key, (Recorded(recipe.key, graph, {BackendName.RKNN: report}),))
