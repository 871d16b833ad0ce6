"""The ONNX graphs of an artifact: the `write` function of each row of `export/recipes.py`.

Graphs per backend: the default (gather-sampler) graph and its typed FP16 twin are for GPUs and
TensorRT, which mis-compiles GridSample in D-FINE. The CPU runtimes (onnxruntime's CPU provider,
OpenVINO) compute GridSample correctly and faster, so a second FP32 graph with GridSample
(`model.grid.onnx`) is written and gated for them, and `--int8` quantizes that one. OpenVINO's BF16
run of the CPU graph is gated too ("bf16:openvino"), or recorded as not run with the reason (no
OpenVINO, no BF16 units). A `--target` export (TensorRT 10.x/11.x) with `--int8` quantizes the
target's own gather graph instead (signed symmetric INT8 for TensorRT's explicit quantization), gated
in onnxruntime against that FP32 graph.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfine_deploy import cpu
from dfine_deploy.artifact import BF16_GATE_KEY, GATE_BACKEND, GraphInfo
from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.errors import BackendError, ExportError
from dfine_deploy.export import fp16 as fp16_export
from dfine_deploy.export import int8 as int8_export
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export import parity
from dfine_deploy.export.gate_inputs import calibration_feeds
from dfine_deploy.export.run import PYTORCH, ExportRun, GraphRecipe, Recorded, Written
from dfine_deploy.files import sha256_file
from dfine_deploy.model.dfine import graph_input_step
from dfine_deploy.model.spec import EXPORT_SAMPLER
from dfine_deploy.runtime.tensorrt_plan import artifact_profile, plan_build, trtexec_command

log = logging.getLogger(__name__)

OPENVINO = BackendName.OPENVINO
GATHER = EXPORT_SAMPLER  # the sampler TensorRT needs: no GridSample node


class RawOutputs(torch.nn.Module):
    """The bare network as images -> (pred_logits, pred_boxes), for --no-postprocess graphs; the
    images are RGB in [0, 1] as for every graph, the family's normalisation inside."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.normalise = graph_input_step(model)
        self.model = model.deploy()

    def forward(self, images: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.model(self.normalise(images))
        return out["pred_logits"], out["pred_boxes"]


@contextlib.contextmanager
def _sampler(run: ExportRun, sampler: str) -> Iterator[None]:
    """The model switched to `sampler` for one trace, and back to the export's."""
    if sampler == run.settings.sampler:
        yield
        return
    run.loaded.model.set_sampler(sampler)
    try:
        yield
    finally:
        run.loaded.model.set_sampler(run.settings.sampler)


def _graph_info(
    run: ExportRun, recipe: GraphRecipe, *, recipe_record: dict[str, Any] | None = None
) -> GraphInfo:
    path = run.staging / recipe.file
    return GraphInfo(
        recipe.file,
        sha256_file(path),
        recipe.precision,
        run.settings.opset,
        recipe=recipe_record or {},
        sampler=run.sampler(recipe),
    )


def _save_checked(
    model: Any, path: Path, *, postprocess: bool = True, dtypes: dict[str, str] | None = None
) -> None:
    onnx_export.check_model(model, source=str(path))
    onnx_export.verify_interface(model, source=str(path), postprocess=postprocess, dtypes=dtypes)
    onnx_export.save(model, path)


def traced_graph(run: ExportRun, recipe: GraphRecipe) -> Written:
    """The model traced to ONNX with the recipe's sampler, gated against PyTorch."""
    opts = run.settings
    sampler = run.sampler(recipe)
    path = run.staging / recipe.file
    start = time.perf_counter()
    with _sampler(run, sampler):
        onnx_export.export_onnx(
            run.module,
            path,
            height=opts.imgsz[0],
            width=opts.imgsz[1],
            opset=opts.opset,
            postprocess=opts.postprocess,
            io_dtypes=run.io_dtypes,
            min_opset=run.min_opset,
        )
    grid_nodes = onnx_export.op_counts(onnx_export.load(path)).get("GridSample", 0)
    if sampler == GATHER and grid_nodes:
        raise ExportError(
            f"the gather-sampler graph still has {grid_nodes} GridSample nodes; TensorRT mis-compiles "
            "them inside D-FINE. This is a bug in the model's sampler switch: please report it."
        )
    log.info("exported %s in %.1f s", recipe.file, time.perf_counter() - start)
    names = (run.name(recipe.reference), recipe.file)
    report = run.gate(run.reference(recipe), run.runner(path), recipe.thresholds, names)
    return Written(recipe.key, (Recorded(recipe.key, _graph_info(run, recipe), {GATE_BACKEND: report}),))


def fp16_graph(run: ExportRun, recipe: GraphRecipe) -> Written:
    """The source graph converted to typed FP16 with FP32 islands, gated against its reference."""
    opts, dtypes = run.settings, run.io_dtypes
    first = run.batches[0]
    if opts.postprocess:
        sizes_dtype = dtypes["orig_target_sizes"] if dtypes else "int64"
        feeds = [{"images": first.images, "orig_target_sizes": first.orig_sizes.astype(sizes_dtype)}]
    else:
        feeds = [{"images": first.images}]
    result = fp16_export.convert(onnx_export.load(run.path(recipe.source)), calibration=feeds)
    path = run.staging / recipe.file
    _save_checked(result.model, path, postprocess=opts.postprocess, dtypes=dtypes)
    names = (run.name(recipe.reference), recipe.file)
    report = run.gate(run.reference(recipe), run.runner(path), recipe.thresholds, names)
    graph = _graph_info(run, recipe, recipe_record=result.summary())
    return Written(
        recipe.key, (Recorded(recipe.key, graph, {GATE_BACKEND: report}),), fp32_islands=result.kept
    )


def tensorrt_int8_graph(run: ExportRun, recipe: GraphRecipe) -> Written:
    """Quantize the target's FP32 gather graph for TensorRT and gate it in onnxruntime against FP32."""
    opts, profile = run.settings, run.profile
    start = time.perf_counter()
    sizes_dtype = profile.io_dtypes["orig_target_sizes"]
    feeds = [
        {"images": f["images"], "orig_target_sizes": f["orig_target_sizes"].astype(sizes_dtype)}
        for f in calibration_feeds(opts)
    ]
    source = run.path(recipe.source)
    # the conservative recipe: no INT8 engine has been timed or checked on a GPU here (docs/performance.md)
    result = int8_export.quantize(onnx_export.load(source), feeds, for_tensorrt=True, recipe="stem-fp32")
    path = run.staging / recipe.file
    _save_checked(result.model, path, dtypes=dict(profile.io_dtypes))
    log.info(
        "quantized %s to INT8 for TensorRT with %s on %d images in %.1f s",
        source.name,
        result.quantizer,
        result.calibration_images,
        time.perf_counter() - start,
    )
    names = (run.name(recipe.reference), recipe.file)
    report = run.gate(run.reference(recipe), run.runner(path), recipe.thresholds, names)
    record = dict(
        result.summary(),
        calibration_data=str(Path(opts.data).resolve()),
        calibration_size=list(opts.imgsz),
        source_graph=source.name,
        scheme="signed symmetric INT8 (TensorRT explicit quantization)",
        file_mb={
            Precision.FP32: round(source.stat().st_size / 1e6, 2),
            Precision.INT8: round(path.stat().st_size / 1e6, 2),
        },
    )
    graph = _graph_info(run, recipe, recipe_record=record)
    return Written(
        recipe.key,
        (Recorded(recipe.key, graph, {GATE_BACKEND: report}),),
        target={"int8_plan": _int8_plan_record(run, recipe)},
    )


def _int8_plan_record(run: ExportRun, recipe: GraphRecipe) -> dict[str, Any]:
    """How the target's TensorRT builds the INT8 engine: Python flags and the trtexec line."""
    plan = plan_build(run.profile.tensorrt, int8=True)
    shapes = artifact_profile(run.settings.batch, *run.settings.imgsz)
    return {
        "graph": recipe.file,
        "strongly_typed": plan.strongly_typed,
        "builder_flags": [],  # no FP16/INT8 flag: precision comes from the graph's types and Q/DQ
        "trtexec": " ".join(trtexec_command(recipe.file, "model.engine", plan, shapes)),
        "python": "python -m dfine_deploy.export.tensorrt ARTIFACT_DIR --int8",
    }


def cpu_graph(run: ExportRun, recipe: GraphRecipe) -> Written:
    """The FP32 graph the CPU backends run (GridSample), gated against PyTorch in onnxruntime and,
    where it compiles, OpenVINO, which is gated in BF16 too. With --sampler grid model.onnx is that
    graph already: it is gated on OpenVINO and routed under its own key (the precision's)."""
    if run.settings.sampler == recipe.sampler:
        traced, path = Written(str(recipe.precision)), run.path(recipe.precision)
    else:
        traced, path = traced_graph(run, recipe), run.staging / recipe.file
    problem = _openvino_problem(path, run.settings.threads)
    if problem is not None:
        bf16 = Recorded(Precision.BF16, None, {OPENVINO: _not_run(problem)})
        return traced + Written(traced.key, (bf16,), unavailable={OPENVINO: problem})
    names = (run.name(PYTORCH), f"{path.name} on OpenVINO")
    report = run.gate(
        run.runner(PYTORCH), _openvino_runner(path, run.settings.threads), recipe.thresholds, names
    )
    gates = (
        Recorded(traced.key, None, {OPENVINO: report}),
        Recorded(Precision.BF16, None, {OPENVINO: _bf16_gate(run, path)}),
    )
    return traced + Written(traced.key, gates)


def _openvino_runner(path: Path, threads: int, precision: str = Precision.FP32) -> parity.Runner:
    """A parity Runner on OpenVINO's CPU plugin, through the runtime's own backend."""
    from dfine_deploy.runtime.openvino_backend import OpenVinoBackend

    # use_cache=False: the gates ship no compiled blobs
    backend = OpenVinoBackend(path, device="cpu", threads=threads, use_cache=False, precision=precision)

    def run(images: np.ndarray, orig_sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        out = backend.run({"images": images, "orig_target_sizes": orig_sizes})
        return out["labels"], out["boxes"], out["scores"]

    return run


def _openvino_problem(path: Path, threads: int) -> str | None:
    """Why OpenVINO's gates cannot run on `path` here (None: they can)."""
    if importlib.util.find_spec("openvino") is None:
        log.warning(
            "OpenVINO is not installed (pip install -e '.[cpu]'): its gate is not run "
            "and model.json lists no graph for it"
        )
        return "OpenVINO is not installed (pip install -e '.[cpu]')"
    if not _openvino_compiles(path, threads):
        return f"OpenVINO cannot compile {path.name} on this CPU ({cpu.isa_class()})"
    return None


def _openvino_compiles(path: Path, threads: int) -> bool:
    """Whether OpenVINO's CPU plugin compiles `path` on this CPU. Where it cannot (OpenVINO 2026.4's
    TopK under oneDNN's SSE4.1 cap: "bad combination"), a warning says so and why, its gates are not
    run and model.json lists no graph for it; the export goes on for onnxruntime."""
    from dfine_deploy.runtime.openvino_backend import OpenVinoBackend

    try:
        OpenVinoBackend(path, device="cpu", threads=threads, use_cache=False).prepare_batches(1)
    except BackendError as exc:
        log.warning("%s: its gates are not run and model.json lists no graph for it", exc)
        return False
    return True


# Both outcomes below are said at INFO, not as warnings: nothing is lost (BF16 is an extra the
# runtime offers only where its gate passed, and every other graph is unaffected) and nothing is for
# the user to do; one who asks for precision bf16 gets the refusal with its reason then.
def _not_run(reason: str) -> dict[str, Any]:
    log.info("%s gate not run: %s; precision bf16 will be refused for this artifact", BF16_GATE_KEY, reason)
    return {"run": False, "passed": False, "reason": reason}


def _bf16_gate(run: ExportRun, path: Path) -> dict[str, Any]:
    """OpenVINO running the graph `path` in BF16 against PyTorch; a failure refuses BF16, not the export."""
    from dfine_deploy.runtime.openvino_backend import bf16_unsupported_reason

    reason = bf16_unsupported_reason()
    if reason:
        return _not_run(reason)
    names = (run.name(PYTORCH), f"{path.name} on OpenVINO BF16")
    runner = _openvino_runner(path, run.settings.threads, precision=Precision.BF16)
    report = run.gate(run.runner(PYTORCH), runner, parity.BF16_GATE, names, force=True)
    if not report.passed:
        log.info("%s gate failed: precision bf16 will be refused (FP32 is not affected)", BF16_GATE_KEY)
    return dict(report.to_dict(), run=True)


def cpu_int8_graph(run: ExportRun, recipe: GraphRecipe) -> Written:
    """Quantize the CPU graph with the fastest INT8 recipe whose graph passes the INT8 gate against
    it, in onnxruntime and (where it compiles) OpenVINO; the export stops when no backend's gate
    passed (unless --force). `recipes.backend_graphs` offers INT8 where its gate passed."""
    opts = run.settings
    source = run.path(recipe.source)
    path = run.staging / recipe.file
    backends = [b for b in recipe.gated_on if b not in run.unavailable]
    result, reports, declined, speed = _quantize_for_cpus(run, recipe, backends)
    if not any(report.passed for report in reports.values()):  # refused everywhere: stop unless forced
        for report in reports.values():
            parity.enforce(report, force=opts.force)
    record = dict(
        result.summary(),
        declined_recipes=declined,
        # per backend, INT8 time / FP32 time measured at export on this ISA class (`isa`)
        time_vs_fp32=speed,
        calibration_data=str(Path(opts.data).resolve()),
        calibration_size=list(opts.imgsz),
        source_graph=source.name,
        file_mb={
            Precision.FP32: round(source.stat().st_size / 1e6, 2),
            Precision.INT8: round(path.stat().st_size / 1e6, 2),
        },
    )
    return Written(
        recipe.key, (Recorded(recipe.key, _graph_info(run, recipe, recipe_record=record), reports),)
    )


def _quantize_for_cpus(
    run: ExportRun, recipe: GraphRecipe, backends: list[str]
) -> tuple[int8_export.Int8Result, dict[str, parity.ParityReport], dict[str, str], dict[str, float]]:
    """Try the INT8 recipes in the order the CPU's ISA class sets until one passes on every backend;
    the last one's reports are returned either way, for the caller to enforce. Returns (result,
    reports by backend, {declined recipe: why}, {backend: INT8 time / FP32 time})."""
    source, path = run.path(recipe.source), run.staging / recipe.file
    fp32_model = onnx_export.load(source)
    declined: dict[str, str] = {}
    attempts = int8_export.cpu_attempts(cpu.isa_class())
    feeds = calibration_feeds(run.settings)  # read (and its count checked) once for every recipe
    for attempt, quantizer in attempts:
        start = time.perf_counter()
        result = int8_export.quantize(fp32_model, feeds, quantizer=quantizer, recipe=attempt)
        _save_checked(result.model, path)
        log.info(
            "quantized %s to INT8 (recipe %s) with %s on %d images in %.1f s",
            source.name,
            attempt,
            result.quantizer,
            result.calibration_images,
            time.perf_counter() - start,
        )
        runners = {GATE_BACKEND: (run.reference(recipe), run.runner(path), (source.name, recipe.file))}
        if OPENVINO in backends:
            runners[OPENVINO] = (
                _openvino_runner(source, run.settings.threads),
                _openvino_runner(path, run.settings.threads),
                (f"{source.name} on OpenVINO", f"{recipe.file} on OpenVINO"),
            )
        reports = {
            backend: run.gate(ref, cand, recipe.thresholds, names, force=True)
            for backend, (ref, cand, names) in runners.items()
        }
        failed = [f"{r.candidate}: {'; '.join(r.failures)}" for r in reports.values() if not r.passed]
        if not failed or (attempt, quantizer) == attempts[-1]:
            break
        tried = f"{attempt} ({quantizer})"
        declined[tried] = " | ".join(failed)
        log.info("INT8 recipe %s failed the gate (%s); trying the next one", tried, declined[tried])
    first = run.batches[0]
    speed = {
        backend.partition(":")[0]: _time_ratio(ref, cand, first)
        for backend, (ref, cand, _) in runners.items()
    }
    log.info("INT8 time / FP32 time on batch %d here: %s", len(first.images), speed)
    return result, reports, declined, speed


def _time_ratio(
    reference: parity.Runner, candidate: parity.Runner, batch: parity.ParityBatch, rounds: int = 5
) -> float:
    """Median over interleaved rounds of candidate time / reference time on one batch (after a warm-up
    run each), so a slow phase of the machine hits both: whether INT8 is faster on this CPU class."""
    ratios = []
    for i in range(rounds + 1):
        times = []
        for runner in (reference, candidate):
            start = time.perf_counter()
            runner(batch.images, batch.orig_sizes)
            times.append(time.perf_counter() - start)
        if i:  # round 0 warms both up
            ratios.append(times[1] / times[0])
    return round(statistics.median(ratios), 3)
