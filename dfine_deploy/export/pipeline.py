"""`dfine-export` end to end: model -> checked ONNX -> parity gate -> typed FP16 -> CPU graphs -> artifact.

Graphs per backend: the default (gather-sampler) graph and its typed FP16 twin are for GPUs and
TensorRT, which mis-compiles GridSample in D-FINE. The CPU runtimes (onnxruntime's CPU provider,
OpenVINO) compute GridSample correctly and faster, so a second FP32 graph with GridSample
(`model.grid.onnx`) is written and gated for them, and `--int8` quantizes that one. The sidecar's
`backend_graphs` says which graph each backend runs.

Everything is written into a hidden staging folder beside the destination and moved into place
only when every graph passed its gate (or --force), so a failure or a crash never leaves a
half-written artifact. The TensorRT engine, when asked for, is built after the move (it is
optional and target-specific) and written atomically by `export.tensorrt`.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfine_deploy.artifact import ArtifactInfo, GraphInfo, sha256_file, write_artifact
from dfine_deploy.data.validation import IMAGE_SUFFIXES
from dfine_deploy.errors import DatasetError, ExportError
from dfine_deploy.export import fp16 as fp16_export
from dfine_deploy.export import int8 as int8_export
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export import parity
from dfine_deploy.export import targets as trt_targets
from dfine_deploy.model.reference import classify_model_ref
from dfine_deploy.model.spec import EXPORT_SAMPLER, SAMPLERS

log = logging.getLogger(__name__)

FP32_NAME, FP16_NAME = "model.onnx", "model.fp16.onnx"
GRID_NAME, INT8_NAME = "model.grid.onnx", "model.int8.onnx"
CPU_TARGETS = ("onnxruntime:cpu", "openvino")
PARITY_BATCH_SIZES = (1, 2, 4)


@dataclass
class ExportSettings:
    model: str  # size name, config or checkpoint (dfine_deploy/model/reference.py)
    output: Path
    imgsz: tuple[int, int] = (640, 640)  # (H, W)
    batch: tuple[int, int, int] = (1, 1, 8)  # min, opt, max
    opset: int | None = None  # None: the target's opset, else onnx_export.DEFAULT_OPSET
    sampler: str = EXPORT_SAMPLER
    target: str | None = None  # a TensorRT target profile (export/targets.py), e.g. "jetpack5"
    postprocess: bool = True
    fp16: bool = True
    cpu_graph: bool = True  # also write the GridSample graph for CPU backends (gather exports only)
    int8: bool = False  # INT8 QDQ graph calibrated on --data
    calibration_images: int = 32
    trt: bool = False
    triton: Path | None = None
    force: bool = False
    data: Path | None = None
    weights: Path | None = None  # a .pth for a size name or config given as `model`
    allow_pickle: bool = False  # full unpickling of a trusted checkpoint (not weights_only)
    names: Path | None = None  # class-names file overriding the model's (runtime.classes.read_names_file)
    parity_images: int = 7  # 1 + 2 + 4: one batch of each parity batch size
    threads: int = 2


def _check_options(opts: ExportSettings) -> trt_targets.TargetProfile | None:
    """Validate the options; fills in `opts.opset` and returns the target profile, if any."""
    profile = trt_targets.get_profile(opts.target) if opts.target else None
    if profile is not None:
        if opts.opset is not None and opts.opset != profile.opset:
            raise ExportError(f"--opset {opts.opset} with --target {opts.target}: the target fixes opset "
                              f"{profile.opset}; drop --opset")
        if opts.sampler != profile.sampler:
            raise ExportError(f"--sampler {opts.sampler} with --target {opts.target}: TensorRT targets need "
                              "the gather sampler (NVIDIA/TensorRT#4813); drop --sampler")
        opts.opset = profile.opset
        onnx_export.check_opset(opts.opset, minimum=profile.opset)
    else:
        opts.opset = onnx_export.DEFAULT_OPSET if opts.opset is None else opts.opset
        onnx_export.check_opset(opts.opset)
    # the input size is checked against the model's spec when it loads (stride and query count)
    lo, opt, hi = opts.batch
    if not 1 <= lo <= opt <= hi:
        raise ExportError(f"--batch {lo} {opt} {hi}: need 1 <= MIN <= OPT <= MAX, e.g. --batch 1 1 8")
    if opts.sampler not in SAMPLERS:
        raise ExportError(f"--sampler {opts.sampler}: use 'gather' (default, no GridSample node) or 'grid'")
    if opts.trt and not opts.postprocess:
        raise ExportError("--trt needs the postprocessor in the graph; drop --no-postprocess")
    if opts.int8 and opts.data is None:
        raise ExportError("--int8 needs --data DIR: calibration images of your domain "
                          "(for a demo, make some with `dfine-data synth --out DIR --images 100`)")
    if opts.int8 and not opts.postprocess:
        raise ExportError("--int8 quantizes the graph with its postprocessor; drop --no-postprocess")
    if opts.int8 and opts.target:
        raise ExportError(f"--int8 makes a graph for CPU runtimes, not for --target {opts.target}; drop one")
    if opts.int8 and opts.calibration_images < 1:
        raise ExportError(f"--calibration-images {opts.calibration_images}: need at least 1")
    if opts.trt and not opts.fp16:
        log.info("--trt with --no-fp16: the engine will be FP32")
    return profile


def _staging_folder(output: Path, force: bool) -> Path:
    if output.exists() and not output.is_dir():
        raise ExportError(f"-o {output}: exists and is not a folder; choose another output folder")
    if output.is_dir() and any(output.iterdir()) and not force:
        raise ExportError(f"-o {output}: folder exists and is not empty; pass --force to replace it")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(dir=output.parent, prefix=f".{output.name}.staging-"))
    except OSError as exc:
        raise ExportError(
            f"-o {output}: cannot write there ({exc.strerror or exc}); the folder or its parent is "
            "read-only or missing. Choose a writable output folder with -o."
        ) from exc


def _move_into_place(staging: Path, output: Path) -> None:
    """Swap the finished staging folder in; the old artifact (with --force) goes only after."""
    old = None
    if output.exists():
        old = output.with_name(f".{output.name}.old-{os.getpid()}")
        os.replace(output, old)
    os.replace(staging, output)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _versions() -> dict[str, str]:
    out = {}
    for dist in ("dfine-deploy", "torch", "onnx", "onnxruntime", "onnxslim", "onnxconverter-common",
                 "openvino", "nncf"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def _parity_inputs(opts: ExportSettings) -> tuple[list[parity.ParityBatch], Any]:
    """Batches of real-looking images, and a dataset scorer when --data has COCO annotations."""
    height, width = opts.imgsz
    sizes = [b for b in PARITY_BATCH_SIZES if b <= opts.batch[2]] or [1]
    count = sum(sizes)
    if opts.data is None:
        return parity.make_batches(parity.synthetic_scenes(count), height, width, sizes), None
    coco = _find_coco(opts.data)
    if coco is None:
        images = parity.load_folder_images(opts.data, count)
        sizes = _fit_sizes(sizes, len(images))
        return parity.make_batches(images, height, width, sizes), None
    ann_path, data = coco
    images, ids, data = _coco_images(opts.data, ann_path, data, count)
    sizes = _fit_sizes(sizes, len(images))
    batches = parity.make_batches(images, height, width, sizes)
    for batch in batches:
        batch.image_ids = [ids[i] for i in batch.image_ids]
    return batches, (ann_path, data)


def _fit_sizes(sizes: list[int], available: int) -> list[int]:
    out, used = [], 0
    for b in sizes:
        if used + b <= available:
            out.append(b)
            used += b
    return out or [1]


def _find_coco(folder: Path) -> tuple[Path, dict] | None:
    """The one COCO annotation file below `folder` (None: a plain image folder); several are refused."""
    found = []
    for path in sorted(Path(folder).rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(data, dict) and {"images", "annotations", "categories"} <= data.keys():
            found.append((path, data))
    if len(found) > 1:
        names = ", ".join(str(p.relative_to(folder)) for p, _ in found)
        raise DatasetError(
            f"--data {folder}: {len(found)} COCO annotation files below it ({names}); the gate needs one "
            "split: point --data at the folder that holds only the one to score (e.g. the val split)"
        )
    return found[0] if found else None


def _image_path(folder: Path, ann_path: Path, file_name: str, by_name: dict[str, list[Path]]) -> Path | None:
    """Where a COCO `file_name` is: relative to the annotation file's folder or to --data, else the one
    image below --data with that base name. Two candidates and no exact path are refused."""
    for root in (ann_path.parent, Path(folder)):
        if (root / file_name).is_file():
            return root / file_name
    candidates = by_name.get(Path(file_name).name, [])
    if len(candidates) > 1:
        shown = ", ".join(str(p.relative_to(folder)) for p in candidates[:3])
        raise DatasetError(
            f"--data {folder}: image '{file_name}' of {ann_path.name} is not at that path, and "
            f"{len(candidates)} files below --data have its name ({shown}); make file_name a path "
            f"relative to {ann_path.parent} so that it names one image"
        )
    return candidates[0] if candidates else None


def _coco_images(folder: Path, ann_path: Path, data: dict, count: int):
    """The first `count` images of the annotations, validated as training validates them (missing or
    truncated images, unknown categories, bad boxes: the default policy, so nothing silently leaves
    the gate's mAP); returns (RGB images, their ids, the validated COCO dict)."""
    import cv2

    from dfine_deploy.data.validation import records_to_coco_dict, validate_coco_dict

    by_name: dict[str, list[Path]] = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.suffix.lower() in IMAGE_SUFFIXES:
            by_name.setdefault(p.name, []).append(p)
    located = []
    for entry in data["images"]:
        path = _image_path(folder, ann_path, str(entry.get("file_name", "")), by_name)
        located.append(dict(entry, file_name=str(path)) if path is not None else entry)
    records, categories, report = validate_coco_dict(dict(data, images=located), ann_path.parent, source=str(ann_path))
    print(f"data: {report.summary_line()}", flush=True)
    images, ids = [], []
    for record in records[:count]:
        bgr = cv2.imread(str(ann_path.parent / record.file_name), cv2.IMREAD_COLOR)
        if bgr is None:
            raise DatasetError(f"{record.file_name}: unreadable image; remove it or replace it")
        images.append(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB))
        ids.append(record.image_id)
    if not images:
        raise DatasetError(f"--data {folder}: {ann_path} lists no usable images")
    return images, ids, records_to_coco_dict(records, categories)


def _dataset_scorer(coco, num_classes: int):
    """mAP (0..100) of one runner's detections on the annotated parity images."""
    if coco is None:
        return None
    from dfine_deploy.data.classmap import ClassMap
    from dfine_deploy.evaluation import CocoEvaluator

    _, data = coco

    def score(batches: Sequence[parity.ParityBatch], outputs: list) -> float:
        ids = [i for b in batches for i in b.image_ids]
        subset = dict(data, images=[im for im in data["images"] if im["id"] in set(ids)],
                      annotations=[a for a in data["annotations"] if a["image_id"] in set(ids)])
        class_map = ClassMap.from_categories(data["categories"], remap=True, num_classes=num_classes)
        evaluator = CocoEvaluator(subset, class_map)
        for batch, (labels, boxes, scores) in zip(batches, outputs):
            evaluator.update(batch.image_ids, [
                {"labels": labels[i], "boxes": boxes[i], "scores": scores[i]} for i in range(len(labels))
            ])
        return 100.0 * float(evaluator.summarize(per_class=False)["AP"])

    return score


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


def export_artifact(opts: ExportSettings) -> ArtifactInfo:
    """Make the artifact folder `opts.output`; raises ExportError/ParityError, writing nothing."""
    profile = _check_options(opts)
    if profile is not None:
        log.info("%s", profile.describe())
    if opts.trt:  # fail before minutes of work, not after
        from dfine_deploy.export import tensorrt as trt_export

        trt = trt_export.import_tensorrt()
        trt_targets.check_installed(profile, trt.__version__)
        if trt_export.gpu_info() is None:
            raise ExportError("--trt: no CUDA GPU is visible here; export without --trt and build the "
                              "engine on the target with export/jetson/build_engine.sh")
    from dfine_deploy.model.dfine import DeployModel
    from dfine_deploy.model.hub import load_model

    staging = _staging_folder(Path(opts.output), opts.force)  # a read-only target fails here, first
    try:
        loaded = load_model(opts.model, imgsz=opts.imgsz, sampler=opts.sampler, weights=opts.weights,
                            allow_pickle=opts.allow_pickle)
        if opts.names is not None:
            from dfine_deploy.runtime.classes import read_names_file

            loaded.class_names = read_names_file(opts.names, loaded.spec.num_classes)
            loaded.class_names_note = ""
        elif loaded.class_names_note:
            log.info("class names: %s (--names FILE gives your own)", loaded.class_names_note)
        if opts.postprocess:
            module = DeployModel(loaded.model, loaded.postprocessor).eval()
        else:
            module = RawOutputs(loaded.model).eval()
        batches, coco = _parity_inputs(opts)
        scorer = _dataset_scorer(coco, loaded.spec.num_classes)
        info = _export_into(staging, opts, module, loaded, batches, scorer, profile)
        if opts.postprocess and profile is None and (opts.cpu_graph or opts.int8):
            _cpu_graphs_into(staging, info, opts, module, loaded, batches, scorer)
        write_artifact(staging, info)
        if opts.postprocess:
            from dfine_deploy.export import deepstream

            deepstream.write_config(staging)
        _move_into_place(staging, Path(opts.output))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    output = Path(opts.output)
    if opts.trt:
        from dfine_deploy.export import tensorrt as trt_export

        info.engine = trt_export.build_for_artifact(output, fp16=opts.fp16)
    if opts.triton is not None:
        from dfine_deploy.export import triton

        triton.write_repository(output, opts.triton, force=opts.force)
    return info


def _export_into(
    staging: Path, opts: ExportSettings, module, loaded, batches, scorer, profile=None
) -> ArtifactInfo:
    spec = loaded.spec
    height, width = opts.imgsz
    k = spec.num_top_queries
    fp32_path = staging / FP32_NAME
    start = time.perf_counter()
    onnx_export.export_onnx(module, fp32_path, height=height, width=width, opset=opts.opset,
                            postprocess=opts.postprocess,
                            io_dtypes=dict(profile.io_dtypes) if profile else None,
                            min_opset=profile.opset if profile else onnx_export.MIN_OPSET)
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
    reports = {"fp32": parity.run_gate(reference, fp32_runner, batches, parity.FP32_GATE,
                                       reference_name="pytorch", candidate_name=FP32_NAME,
                                       dataset_scorer=scorer, rank_free=loaded.random_weights)}
    log.info("%s", reports["fp32"].summary())
    parity.enforce(reports["fp32"], force=opts.force)
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
        onnx_export.verify_interface(result.model, source=str(fp16_path), postprocess=opts.postprocess,
                                     dtypes=dict(profile.io_dtypes) if profile else None)
        onnx_export.save(result.model, fp16_path)
        fp16_runner = onnx_export.ort_runner(onnx_export.ort_session(fp16_path, opts.threads),
                                             postprocess=opts.postprocess, num_top_queries=k)
        reports["fp16"] = parity.run_gate(fp32_runner, fp16_runner, batches, parity.FP16_GATE,
                                          reference_name=FP32_NAME, candidate_name=FP16_NAME,
                                          dataset_scorer=scorer, rank_free=loaded.random_weights)
        log.info("%s", reports["fp16"].summary())
        parity.enforce(reports["fp16"], force=opts.force)
        graphs["fp16"] = GraphInfo(FP16_NAME, sha256_file(fp16_path), "fp16", opts.opset,
                                   recipe=result.summary(), sampler=opts.sampler)
        fp32_island_nodes = result.kept

    checkpoint: dict[str, Any] = {"ref": loaded.ref, "random_weights": bool(loaded.random_weights)}
    weights_file = opts.weights or (
        Path(loaded.ref) if classify_model_ref(loaded.ref).kind == "checkpoint" else None
    )
    if weights_file is not None:
        checkpoint.update(path=str(Path(weights_file).resolve()), sha256=sha256_file(weights_file))
    lo, opt, hi = opts.batch
    return ArtifactInfo(
        model=f"dfine-{spec.size}" if spec.size else "custom",
        num_classes=spec.num_classes,
        class_names=list(loaded.class_names),
        class_names_note=loaded.class_names_note,
        input_height=height,
        input_width=width,
        batch_min=lo,
        batch_opt=opt,
        batch_max=hi,
        sampler=opts.sampler,
        postprocess=opts.postprocess,
        num_top_queries=k,
        graphs=graphs,
        checkpoint=checkpoint,
        parity={key: report.to_dict() for key, report in reports.items()},
        versions=_versions(),
        target=_target_record(profile, staging, graphs, fp32_model, fp32_island_nodes) if profile else {},
    )


def _target_record(profile, staging: Path, graphs: dict[str, GraphInfo], fp32_model, island_nodes) -> dict:
    """Check every written graph against the target's ONNX parser (refusing on failure) and record
    the profile, the checks and, for a precision-constraint build, the FP32 layers."""
    checks = {}
    for key, graph in graphs.items():
        model = fp32_model if key == "fp32" else onnx_export.load(staging / graph.file)
        report = trt_targets.require_parser_support(model, profile, source=graph.file)
        checks[graph.file] = report.to_dict()
        log.info("%s: TensorRT %s's ONNX parser imports every node (static check against %s)",
                 graph.file, profile.tensorrt, report.table_ref)
    record: dict[str, Any] = {"profile": profile.to_dict(), "parser_check": checks}
    if profile.precision == "layer-constraints" and island_nodes:
        layers = trt_targets.constrained_layers(fp32_model, island_nodes)
        record["fp32_layers"] = layers
    return record


def _openvino_runner(path: Path, threads: int):
    """A parity Runner on OpenVINO's CPU plugin, through the runtime's own backend."""
    from dfine_deploy.runtime.openvino_backend import OpenVinoBackend

    backend = OpenVinoBackend(path, device="cpu", threads=threads, use_cache=False)  # nothing extra shipped

    def run(images: np.ndarray, orig_sizes: np.ndarray):
        out = backend.run({"images": images, "orig_target_sizes": orig_sizes})
        return out["labels"], out["boxes"], out["scores"]

    return run


def _openvino_installed() -> bool:
    import importlib.util

    if importlib.util.find_spec("openvino") is None:
        log.warning("OpenVINO is not installed (pip install 'dfine-deploy[cpu]'): its gate is not run "
                    "and model.json lists no graph for it")
        return False
    return True


def _gate(reference, candidate, batches, thresholds, names, scorer, loaded, force: bool):
    report = parity.run_gate(reference, candidate, batches, thresholds, reference_name=names[0],
                             candidate_name=names[1], dataset_scorer=scorer, rank_free=loaded.random_weights)
    log.info("%s", report.summary())
    parity.enforce(report, force=force)
    return report


def _calibration_feeds(opts: ExportSettings) -> list[dict[str, np.ndarray]]:
    """One batch-1 feed per image of --data (sorted, the first `calibration_images`)."""
    height, width = opts.imgsz
    images = parity.load_folder_images(opts.data, opts.calibration_images)
    return [{"images": b.images, "orig_target_sizes": b.orig_sizes}
            for b in parity.make_batches(images, height, width, [1] * len(images))]


def _cpu_graphs_into(staging: Path, info: ArtifactInfo, opts: ExportSettings, module, loaded, batches,
                     scorer) -> None:
    """Add the CPU graph (GridSample) and optionally its INT8 twin, each gated on every CPU backend.

    Adds to `info`: graphs "fp32-grid" / "int8", their parity reports, and `backend_graphs`.
    """
    k = loaded.spec.num_top_queries
    openvino = _openvino_installed()
    reference = _torch_runner(module, True, k)
    if opts.sampler == "grid":
        cpu_key, cpu_path = "fp32", staging / FP32_NAME
    else:
        cpu_key, cpu_path = "fp32-grid", staging / GRID_NAME
        loaded.model.set_sampler("grid")
        try:
            onnx_export.export_onnx(module, cpu_path, height=opts.imgsz[0], width=opts.imgsz[1],
                                    opset=opts.opset)
        finally:
            loaded.model.set_sampler(opts.sampler)
        runner = onnx_export.ort_runner(onnx_export.ort_session(cpu_path, opts.threads), num_top_queries=k)
        info.parity[cpu_key] = _gate(reference, runner, batches, parity.FP32_GATE, ("pytorch", GRID_NAME),
                                     scorer, loaded, opts.force).to_dict()
        info.graphs[cpu_key] = GraphInfo(GRID_NAME, sha256_file(cpu_path), "fp32", opts.opset, sampler="grid")
    if openvino:
        report = _gate(reference, _openvino_runner(cpu_path, opts.threads), batches, parity.FP32_GATE,
                       ("pytorch", f"{cpu_path.name} on OpenVINO"), scorer, loaded, opts.force)
        info.parity[f"{cpu_key}:openvino"] = report.to_dict()
    targets = [t for t in CPU_TARGETS if openvino or t != "openvino"]
    info.backend_graphs = {t: {"fp32": cpu_key} for t in targets}
    if not opts.int8:
        return

    start = time.perf_counter()
    result = int8_export.quantize(onnx_export.load(cpu_path), _calibration_feeds(opts))
    int8_path = staging / INT8_NAME
    onnx_export.check_model(result.model, source=str(int8_path))
    onnx_export.verify_interface(result.model, source=str(int8_path))
    onnx_export.save(result.model, int8_path)
    log.info("quantized %s to INT8 with %s on %d images in %.1f s", cpu_path.name, result.quantizer,
             result.calibration_images, time.perf_counter() - start)
    fp32_runner = onnx_export.ort_runner(onnx_export.ort_session(cpu_path, opts.threads), num_top_queries=k)
    int8_runner = onnx_export.ort_runner(onnx_export.ort_session(int8_path, opts.threads), num_top_queries=k)
    info.parity["int8"] = _gate(fp32_runner, int8_runner, batches, parity.INT8_GATE,
                                (cpu_path.name, INT8_NAME), scorer, loaded, opts.force).to_dict()
    if openvino:
        names = (f"{cpu_path.name} on OpenVINO", f"{INT8_NAME} on OpenVINO")
        report = _gate(_openvino_runner(cpu_path, opts.threads), _openvino_runner(int8_path, opts.threads),
                       batches, parity.INT8_GATE, names, scorer, loaded, opts.force)
        info.parity["int8:openvino"] = report.to_dict()
    recipe = dict(result.summary(), calibration_data=str(Path(opts.data).resolve()),
                  calibration_size=list(opts.imgsz), source_graph=cpu_path.name,
                  file_mb={"fp32": round(cpu_path.stat().st_size / 1e6, 2),
                           "int8": round(int8_path.stat().st_size / 1e6, 2)})
    info.graphs["int8"] = GraphInfo(INT8_NAME, sha256_file(int8_path), "int8", opts.opset, recipe=recipe,
                                    sampler="grid")
    for target in targets:
        info.backend_graphs[target]["int8"] = "int8"
