"""The artifact's graphs, each written, checked and gated against its reference.

Graphs per backend: the default (gather-sampler) graph and its typed FP16 twin are for GPUs and
TensorRT, which mis-compiles GridSample in D-FINE. The CPU runtimes (onnxruntime's CPU provider,
OpenVINO) compute GridSample correctly and faster, so a second FP32 graph with GridSample
(`model.grid.onnx`) is written and gated for them, and `--int8` quantizes that one. The sidecar's
`backend_graphs` says which graph each backend runs. OpenVINO's BF16 run of the CPU graph is gated
too ("bf16:openvino"), or recorded as not run with the reason (no OpenVINO, no BF16 units).
A `--target` export (TensorRT 10.x/11.x) with `--int8` quantizes the target's own gather graph
instead (`model.int8.trt.onnx`, signed symmetric INT8 for TensorRT's explicit quantization), gated in
onnxruntime against that FP32 graph; `backend_graphs["tensorrt"]["int8"]` names it.
"""

from __future__ import annotations

import logging
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from dfine_deploy import cpu
from dfine_deploy.artifact import BF16_GATE_KEY, ArtifactInfo, GraphInfo
from dfine_deploy.errors import BackendError, ExportError
from dfine_deploy.export import fp16 as fp16_export
from dfine_deploy.export import int8 as int8_export
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export import parity
from dfine_deploy.export.gate_inputs import calibration_feeds
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.export.sidecar import artifact_info, target_record
from dfine_deploy.files import sha256_file
from dfine_deploy.runtime.tensorrt_plan import INT8_GRAPH, artifact_profile, plan_build, trtexec_command

log = logging.getLogger(__name__)

FP32_NAME, FP16_NAME = "model.onnx", "model.fp16.onnx"
GRID_NAME, INT8_NAME = "model.grid.onnx", "model.int8.onnx"
TRT_INT8_NAME = "model.int8.trt.onnx"  # the Q/DQ graph TensorRT builds INT8 engines from
CPU_TARGETS = ("onnxruntime:cpu", "openvino")


def _torch_runner(module, postprocess: bool, num_top_queries: int):
    def run(images: np.ndarray, orig_sizes: np.ndarray):
        with torch.no_grad():
            if postprocess:
                out = module(torch.from_numpy(images), torch.from_numpy(orig_sizes))
                return tuple(t.numpy() for t in out)
            out = module(torch.from_numpy(images))
            return parity.postprocess_numpy(out[0].numpy(), out[1].numpy(), orig_sizes, num_top_queries)

    return run


class RawOutputs(torch.nn.Module):
    """The bare network as images -> (pred_logits, pred_boxes), for --no-postprocess graphs."""

    def __init__(self, model):
        super().__init__()
        self.model = model.deploy()

    def forward(self, images):
        out = self.model(images)
        return out["pred_logits"], out["pred_boxes"]


def write_graphs(
    staging: Path, opts: ExportSettings, module, loaded, batches, scorer, profile=None
) -> ArtifactInfo:
    spec = loaded.spec
    height, width = opts.imgsz
    k = spec.num_top_queries
    fp32_path = staging / FP32_NAME
    start = time.perf_counter()
    onnx_export.export_onnx(
        module,
        fp32_path,
        height=height,
        width=width,
        opset=opts.opset,
        postprocess=opts.postprocess,
        io_dtypes=dict(profile.io_dtypes) if profile else None,
        min_opset=profile.opset if profile else onnx_export.MIN_OPSET,
    )
    fp32_model = onnx_export.load(fp32_path)
    grid_nodes = onnx_export.op_counts(fp32_model).get("GridSample", 0)
    if opts.sampler == "gather" and grid_nodes:
        raise ExportError(
            f"the gather-sampler graph still has {grid_nodes} GridSample nodes; TensorRT mis-compiles "
            "them inside D-FINE. This is a bug in the model's sampler switch: please report it."
        )
    log.info("exported %s in %.1f s", fp32_path.name, time.perf_counter() - start)

    reference = _torch_runner(module, opts.postprocess, k)
    session = onnx_export.ort_session(fp32_path, opts.threads)
    fp32_runner = onnx_export.ort_runner(session, postprocess=opts.postprocess, num_top_queries=k)
    reports = {
        "fp32": _gate(
            reference,
            fp32_runner,
            batches,
            parity.FP32_GATE,
            ("pytorch", FP32_NAME),
            scorer,
            loaded,
            opts.force,
        )
    }
    graphs = {"fp32": GraphInfo(FP32_NAME, sha256_file(fp32_path), "fp32", opts.opset, sampler=opts.sampler)}
    fp32_island_nodes: dict[str, str] = {}

    if opts.fp16:
        sizes_dtype = profile.io_dtypes["orig_target_sizes"] if profile else "int64"
        sizes = batches[0].orig_sizes.astype(sizes_dtype)
        feeds = [{"images": batches[0].images, "orig_target_sizes": sizes}]
        if not opts.postprocess:
            feeds = [{"images": batches[0].images}]
        result = fp16_export.convert(fp32_model, calibration=feeds)
        fp16_path = staging / FP16_NAME
        onnx_export.check_model(result.model, source=str(fp16_path))
        onnx_export.verify_interface(
            result.model,
            source=str(fp16_path),
            postprocess=opts.postprocess,
            dtypes=dict(profile.io_dtypes) if profile else None,
        )
        onnx_export.save(result.model, fp16_path)
        fp16_runner = onnx_export.ort_runner(
            onnx_export.ort_session(fp16_path, opts.threads), postprocess=opts.postprocess, num_top_queries=k
        )
        reports["fp16"] = _gate(
            fp32_runner,
            fp16_runner,
            batches,
            parity.FP16_GATE,
            (FP32_NAME, FP16_NAME),
            scorer,
            loaded,
            opts.force,
        )
        graphs["fp16"] = GraphInfo(
            FP16_NAME,
            sha256_file(fp16_path),
            "fp16",
            opts.opset,
            recipe=result.summary(),
            sampler=opts.sampler,
        )
        fp32_island_nodes = result.kept

    if opts.int8 and profile is not None:
        graphs[INT8_GRAPH], reports[INT8_GRAPH] = _tensorrt_int8_graph(
            staging, opts, fp32_model, fp32_runner, profile, batches, scorer, loaded
        )
    target = target_record(profile, staging, graphs, fp32_model, fp32_island_nodes) if profile else {}
    if INT8_GRAPH in graphs:
        target["int8_plan"] = _int8_plan_record(profile, opts)
    info = artifact_info(opts, loaded, graphs, reports, target)
    if INT8_GRAPH in graphs:
        info.backend_graphs = {"tensorrt": {"int8": INT8_GRAPH}}
    return info


def _int8_plan_record(profile, opts) -> dict:
    """How the target's TensorRT builds the INT8 engine: Python flags and the trtexec line."""
    plan = plan_build(profile.tensorrt, int8=True)
    shapes = artifact_profile(opts.batch, *opts.imgsz)
    return {
        "graph": TRT_INT8_NAME,
        "strongly_typed": plan.strongly_typed,
        "builder_flags": [],  # no FP16/INT8 flag: precision comes from the graph's types and Q/DQ
        "trtexec": " ".join(trtexec_command(TRT_INT8_NAME, "model.engine", plan, shapes)),
        "python": "python -m dfine_deploy.export.tensorrt ARTIFACT_DIR --int8",
    }


def _tensorrt_int8_graph(staging: Path, opts, fp32_model, fp32_runner, profile, batches, scorer, loaded):
    """Quantize the target's FP32 gather graph for TensorRT and gate it in onnxruntime against FP32."""
    start = time.perf_counter()
    sizes_dtype = profile.io_dtypes["orig_target_sizes"]
    feeds = [
        {"images": f["images"], "orig_target_sizes": f["orig_target_sizes"].astype(sizes_dtype)}
        for f in calibration_feeds(opts)
    ]
    # the conservative recipe: no INT8 engine has been timed or checked on a GPU here (docs/performance.md)
    result = int8_export.quantize(fp32_model, feeds, for_tensorrt=True, recipe="stem-fp32")
    path = staging / TRT_INT8_NAME
    onnx_export.check_model(result.model, source=str(path))
    onnx_export.verify_interface(result.model, source=str(path), dtypes=dict(profile.io_dtypes))
    onnx_export.save(result.model, path)
    log.info(
        "quantized %s to INT8 for TensorRT with %s on %d images in %.1f s",
        FP32_NAME,
        result.quantizer,
        result.calibration_images,
        time.perf_counter() - start,
    )
    k = loaded.spec.num_top_queries
    runner = onnx_export.ort_runner(onnx_export.ort_session(path, opts.threads), num_top_queries=k)
    report = _gate(
        fp32_runner, runner, batches, parity.INT8_GATE, (FP32_NAME, TRT_INT8_NAME), scorer, loaded, opts.force
    )
    recipe = dict(
        result.summary(),
        calibration_data=str(Path(opts.data).resolve()),
        calibration_size=list(opts.imgsz),
        source_graph=FP32_NAME,
        scheme="signed symmetric INT8 (TensorRT explicit quantization)",
        file_mb={
            "fp32": round((staging / FP32_NAME).stat().st_size / 1e6, 2),
            "int8": round(path.stat().st_size / 1e6, 2),
        },
    )
    info = GraphInfo(
        TRT_INT8_NAME, sha256_file(path), "int8", opts.opset, recipe=recipe, sampler=opts.sampler
    )
    return info, report


def _openvino_runner(path: Path, threads: int, precision: str = "fp32"):
    """A parity Runner on OpenVINO's CPU plugin, through the runtime's own backend."""
    from dfine_deploy.runtime.openvino_backend import OpenVinoBackend

    # use_cache=False: the gates ship no compiled blobs
    backend = OpenVinoBackend(path, device="cpu", threads=threads, use_cache=False, precision=precision)

    def run(images: np.ndarray, orig_sizes: np.ndarray):
        out = backend.run({"images": images, "orig_target_sizes": orig_sizes})
        return out["labels"], out["boxes"], out["scores"]

    return run


def _openvino_installed() -> bool:
    import importlib.util

    if importlib.util.find_spec("openvino") is None:
        log.warning(
            "OpenVINO is not installed (pip install 'dfine-deploy[cpu]'): its gate is not run "
            "and model.json lists no graph for it"
        )
        return False
    return True


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


def _cpu_int8_graph(cpu_path: Path, int8_path: Path, opts, batches, scorer, loaded, openvino: bool):
    """Quantize `cpu_path` with the fastest INT8 recipe whose graph passes the INT8 gate against FP32,
    in onnxruntime and (when installed) OpenVINO; the last recipe's reports are returned either way,
    for the caller to enforce. Returns (result, gate reports by parity key, {declined recipe: why},
    {backend: INT8 time / FP32 time})."""
    k = loaded.spec.num_top_queries
    fp32_model = onnx_export.load(cpu_path)
    fp32_runner = onnx_export.ort_runner(onnx_export.ort_session(cpu_path, opts.threads), num_top_queries=k)
    declined: dict[str, str] = {}
    attempts = int8_export.cpu_attempts(cpu.isa_class())
    feeds = calibration_feeds(opts)  # read (and its count checked) once for every recipe
    for recipe, quantizer in attempts:
        start = time.perf_counter()
        result = int8_export.quantize(fp32_model, feeds, quantizer=quantizer, recipe=recipe)
        onnx_export.check_model(result.model, source=str(int8_path))
        onnx_export.verify_interface(result.model, source=str(int8_path))
        onnx_export.save(result.model, int8_path)
        log.info(
            "quantized %s to INT8 (recipe %s) with %s on %d images in %.1f s",
            cpu_path.name,
            recipe,
            result.quantizer,
            result.calibration_images,
            time.perf_counter() - start,
        )
        int8_runner = onnx_export.ort_runner(
            onnx_export.ort_session(int8_path, opts.threads), num_top_queries=k
        )
        runners = {"int8": (fp32_runner, int8_runner, (cpu_path.name, INT8_NAME))}
        if openvino:
            names = (f"{cpu_path.name} on OpenVINO", f"{INT8_NAME} on OpenVINO")
            runners["int8:openvino"] = (
                _openvino_runner(cpu_path, opts.threads),
                _openvino_runner(int8_path, opts.threads),
                names,
            )
        reports = {
            key: _gate(ref, cand, batches, parity.INT8_GATE, names, scorer, loaded, force=True)
            for key, (ref, cand, names) in runners.items()
        }
        failed = [f"{r.candidate}: {'; '.join(r.failures)}" for r in reports.values() if not r.passed]
        if not failed or (recipe, quantizer) == attempts[-1]:
            break
        tried = f"{recipe} ({quantizer})"
        declined[tried] = " | ".join(failed)
        log.info("INT8 recipe %s failed the gate (%s); trying the next one", tried, declined[tried])
    first = batches[0]
    speed = {
        key.partition(":")[2] or "onnxruntime": _time_ratio(ref, cand, first)
        for key, (ref, cand, _) in runners.items()
    }
    log.info("INT8 time / FP32 time on batch %d here: %s", len(first.images), speed)
    return result, reports, declined, speed


def _time_ratio(reference, candidate, batch, rounds: int = 5) -> float:
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


def _gate(reference, candidate, batches, thresholds, names, scorer, loaded, force: bool):
    """Run one parity gate, log its summary line, and refuse a failure unless `force`."""
    report = parity.run_gate(
        reference,
        candidate,
        batches,
        thresholds,
        reference_name=names[0],
        candidate_name=names[1],
        dataset_scorer=scorer,
        rank_free=loaded.random_weights,
    )
    log.info("%s", report.summary())
    parity.enforce(report, force=force)
    return report


def _not_run(reason: str) -> dict:
    log.warning(
        "%s gate not run: %s; precision bf16 will be refused for this artifact", BF16_GATE_KEY, reason
    )
    return {"run": False, "passed": False, "reason": reason}


def _bf16_gate(reference, cpu_path: Path, batches, scorer, loaded, threads: int) -> dict:
    """OpenVINO running `cpu_path` in BF16 against PyTorch; a failure refuses BF16, not the export."""
    from dfine_deploy.runtime.openvino_backend import bf16_unsupported_reason

    reason = bf16_unsupported_reason()
    if reason:
        return _not_run(reason)
    names = ("pytorch", f"{cpu_path.name} on OpenVINO BF16")
    runner = _openvino_runner(cpu_path, threads, precision="bf16")
    report = _gate(reference, runner, batches, parity.BF16_GATE, names, scorer, loaded, force=True)
    if not report.passed:
        log.warning("%s gate failed: precision bf16 will be refused (FP32 is not affected)", BF16_GATE_KEY)
    return dict(report.to_dict(), run=True)


def write_cpu_graphs(
    staging: Path, info: ArtifactInfo, opts: ExportSettings, module, loaded, batches, scorer
) -> None:
    """Add the CPU graph (GridSample) and optionally its INT8 twin, each gated on every CPU backend.

    Adds to `info`: graphs "fp32-grid" / "int8", their parity reports (and BF16_GATE_KEY's), and
    `backend_graphs`.
    """
    k = loaded.spec.num_top_queries
    installed = _openvino_installed()
    reference = _torch_runner(module, True, k)
    if opts.sampler == "grid":
        cpu_key, cpu_path = "fp32", staging / FP32_NAME
    else:
        cpu_key, cpu_path = "fp32-grid", staging / GRID_NAME
        loaded.model.set_sampler("grid")
        try:
            onnx_export.export_onnx(
                module, cpu_path, height=opts.imgsz[0], width=opts.imgsz[1], opset=opts.opset
            )
        finally:
            loaded.model.set_sampler(opts.sampler)
        runner = onnx_export.ort_runner(onnx_export.ort_session(cpu_path, opts.threads), num_top_queries=k)
        info.parity[cpu_key] = _gate(
            reference, runner, batches, parity.FP32_GATE, ("pytorch", GRID_NAME), scorer, loaded, opts.force
        ).to_dict()
        info.graphs[cpu_key] = GraphInfo(GRID_NAME, sha256_file(cpu_path), "fp32", opts.opset, sampler="grid")
    openvino = installed and _openvino_compiles(cpu_path, opts.threads)
    if openvino:
        report = _gate(
            reference,
            _openvino_runner(cpu_path, opts.threads),
            batches,
            parity.FP32_GATE,
            ("pytorch", f"{cpu_path.name} on OpenVINO"),
            scorer,
            loaded,
            opts.force,
        )
        info.parity[f"{cpu_key}:openvino"] = report.to_dict()
        info.parity[BF16_GATE_KEY] = _bf16_gate(reference, cpu_path, batches, scorer, loaded, opts.threads)
    else:
        info.parity[BF16_GATE_KEY] = _not_run(
            f"OpenVINO cannot compile {cpu_path.name} on this CPU ({cpu.isa_class()})"
            if installed
            else "OpenVINO is not installed (pip install 'dfine-deploy[cpu]')"
        )
    targets = [t for t in CPU_TARGETS if openvino or t != "openvino"]
    info.backend_graphs = {t: {"fp32": cpu_key} for t in targets}
    if info.parity[BF16_GATE_KEY]["passed"]:
        info.backend_graphs["openvino"]["bf16"] = cpu_key
    if not opts.int8:
        return

    int8_path = staging / INT8_NAME
    result, reports, declined, speed = _cpu_int8_graph(
        cpu_path, int8_path, opts, batches, scorer, loaded, openvino
    )
    passed = {key for key, report in reports.items() if report.passed}
    for key, report in reports.items():
        info.parity[key] = report.to_dict()
        if not passed:  # INT8 refused everywhere: the export stops unless forced
            parity.enforce(report, force=opts.force)
    recipe = dict(
        result.summary(),
        declined_recipes=declined,
        # per backend, INT8 time / FP32 time measured at export on this ISA class (`isa`)
        time_vs_fp32=speed,
        calibration_data=str(Path(opts.data).resolve()),
        calibration_size=list(opts.imgsz),
        source_graph=cpu_path.name,
        file_mb={
            "fp32": round(cpu_path.stat().st_size / 1e6, 2),
            "int8": round(int8_path.stat().st_size / 1e6, 2),
        },
    )
    info.graphs["int8"] = GraphInfo(
        INT8_NAME, sha256_file(int8_path), "int8", opts.opset, recipe=recipe, sampler="grid"
    )
    for target in targets:
        key = "int8" if target == "onnxruntime:cpu" else f"int8:{target}"
        if key in passed or opts.force:
            info.backend_graphs[target]["int8"] = "int8"
        else:  # another backend's gate passed: INT8 is offered there only
            log.warning(
                "INT8 is not offered on %s: its gate failed on this CPU (class %s: %s); model.json "
                "lists the INT8 graph for %s only",
                target,
                reports[key].isa,
                "; ".join(reports[key].failures[:1]),
                ", ".join(t for t in targets if t != target),
            )
