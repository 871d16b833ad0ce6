"""`dfine-export` end to end: model -> the recipes' graphs, each gated -> artifact.

This module holds the checks of the options (`export.settings`) and the staging folder; the graphs
and their gates are the rows of `export.recipes`, the gate's images `export.gate_inputs`, the
sidecar record `export.sidecar`.

Everything is written into a hidden staging folder beside the destination and moved into place
only when every graph passed its gate (or --force), so a failure or a crash never leaves a
half-written artifact. The TensorRT engine, when asked for, is built after the move (it is
optional and target-specific) and written atomically by `export.tensorrt`.

`-o` must be new, empty, or an artifact folder of ours holding nothing else (replaced only with
--force): `ARTIFACT` says what an export writes, dfine_deploy/ownership.py enforces it.
"""

from __future__ import annotations

import logging
from pathlib import Path

from dfine_deploy.artifact import (
    ENGINE_FILES,
    SIDECAR_NAME,
    ArtifactInfo,
    is_sidecar,
    sidecar_files,
    write_artifact,
)
from dfine_deploy.errors import ExportError
from dfine_deploy.export import deepstream, frigate
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export import targets as trt_targets
from dfine_deploy.export.deploy_targets import DeployTarget, get_target
from dfine_deploy.export.gate_inputs import (
    annotated_images,
    dataset_scorer,
    gate_batch_sizes,
    ground_truth,
    parity_inputs,
)
from dfine_deploy.export.graphs import RawOutputs
from dfine_deploy.export.recipes import GRAPH_FILES, write_graphs
from dfine_deploy.export.run import ExportRun
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.memory import GIB, check_memory
from dfine_deploy.model.spec import SAMPLERS, ModelSpec
from dfine_deploy.ownership import Claim, replacing, share_folder
from dfine_deploy.runtime import tensorrt_plan as trt_plan
from dfine_deploy.runtime.onnxruntime_backend import TRT_CACHE_FOLDER
from dfine_deploy.runtime.openvino_backend import CACHE_FOLDER as OPENVINO_CACHE_FOLDER
from dfine_deploy.runtime.reference_pack import PACK_IMAGES, PACK_NAME, write_pack
from dfine_deploy.runtime.verify_record import VERIFY_NAME

log = logging.getLogger(__name__)

# Everything an export, an engine build (ours or export/jetson/build_engine.sh) and the runtimes' caches
# put in an artifact folder; the sidecar is the marker.
ARTIFACT = Claim(
    command="dfine-export",
    kind="an artifact folder",
    markers=(SIDECAR_NAME,),
    patterns=(
        *GRAPH_FILES,
        *ENGINE_FILES.values(),
        *(f"{name}.tmp" for name in ENGINE_FILES.values()),
        PACK_NAME,
        VERIFY_NAME,
        trt_plan.TIMING_CACHE_PATTERN,
        deepstream.CONFIG_NAME,
        deepstream.NVINFER_ENGINE_PATTERN,
        deepstream.APP_CONFIG_NAME,
        deepstream.LABELS_NAME,
        frigate.SNIPPET_NAME,
        frigate.LABELMAP_NAME,
        *(p for folder in (OPENVINO_CACHE_FOLDER, TRT_CACHE_FOLDER) for p in (folder, f"{folder}/*")),
    ),
    recognise=is_sidecar,
    listed=sidecar_files,
)

# At its peak an export holds about 1.75 times one inference pass of its largest gate batch (the
# trace, the PyTorch reference and onnxruntime's session; measured on dfine-n at 1280 and 1920 px,
# 2.4 and 5.6 GB): 1.5 keeps the estimate below the real need, so that only hopeless sizes are refused.
_EXPORT_PASSES = 1.5
_EXPORT_BASE_BYTES = GIB  # torch, onnxruntime and OpenVINO loaded


def _check_options(opts: ExportSettings) -> DeployTarget | None:
    """Validate the options; fills in `opts.opset` and returns the --target's row, if any."""
    target = get_target(opts.target) if opts.target else None
    if target is not None:
        target.check(opts)  # what it refuses, then its tool: before minutes of work
    fixed_opset = target.opset if target is not None else None
    if fixed_opset is not None:
        opts.opset = fixed_opset
        onnx_export.check_opset(opts.opset, minimum=fixed_opset)
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
    if opts.data is not None and not Path(opts.data).exists():
        raise ExportError(
            f"--data {opts.data}: no such file or folder; give validation images: a folder of them, or a "
            "dataset's folder or annotation file (docs/train.md lists the layouts read)"
        )
    if opts.int8 and opts.data is None:
        raise ExportError(
            "--int8 needs --data DIR: calibration images of your domain "
            "(for a demo, make some with `dfine-data synth --out DIR --images 100`)"
        )
    if opts.int8 and not opts.postprocess:
        raise ExportError("--int8 quantizes the graph with its postprocessor; drop --no-postprocess")
    if opts.int8 and opts.trt and target is None:
        raise ExportError(
            "--int8 --trt needs --target (trt10.3, trt10.14, trt11, ...): the INT8 graph TensorRT builds "
            "from is made for one TensorRT version; without --target, --int8 writes the CPU graph only"
        )
    if opts.int8 and opts.calibration_images < 1:
        raise ExportError(f"--calibration-images {opts.calibration_images}: need at least 1")
    if opts.threshold_target is not None and (opts.data is None or not 0 < opts.threshold_target <= 1):
        raise ExportError(
            f"--threshold-target {opts.threshold_target}: give a precision in (0, 1], e.g. 0.9, with --data "
            "DIR holding annotations (the thresholds per class are chosen on them)"
        )
    if opts.gate_images < 1:
        raise ExportError(f"--gate-images {opts.gate_images}: need at least 1")
    if opts.trt and not opts.fp16:
        log.info("--trt with --no-fp16: the engine will be FP32")
    return target


def export_memory_bytes(spec: ModelSpec, batch_max: int) -> int:
    """A lower bound of the memory an export of `spec` at its input size needs at its peak."""
    height, width = spec.eval_spatial_size
    passes = spec.activation_bytes(height, width, max(gate_batch_sizes(batch_max)))
    return int(_EXPORT_BASE_BYTES + _EXPORT_PASSES * passes)


def _check_memory(spec: ModelSpec, opts: ExportSettings) -> None:
    """Refuse an input size whose export cannot fit in memory, before minutes of work."""
    height, width = spec.eval_spatial_size
    check_memory(
        export_memory_bytes(spec, opts.batch[2]),
        f"exporting at {height} x {width}",
        "use a smaller --imgsz (the size the model will run at)",
        ExportError,
    )


def export_artifact(opts: ExportSettings) -> ArtifactInfo:
    """Make the artifact folder `opts.output`; raises ExportError/ParityError, writing nothing."""
    target = _check_options(opts)
    profile = target.profile if target is not None else None  # a TensorRT line: what --trt builds for
    if target is not None:
        log.info("%s", target.describe)
    if opts.trt:  # fail before minutes of work, not after
        from dfine_deploy.export import tensorrt as trt_export

        trt = trt_export.import_tensorrt()
        trt_targets.check_installed(profile, trt.__version__)
        if trt_export.gpu_info() is None:
            raise ExportError(
                "--trt: no CUDA GPU is visible here; export without --trt and build the "
                "engine on the target with export/jetson/build_engine.sh"
            )
    if opts.triton is not None:  # refuse model folders we may not replace before minutes of work
        from dfine_deploy.export import triton

        triton.check_repository(opts.triton, engine=opts.trt, force=opts.force)
    from dfine_deploy.hub.loader import load_model, resolve_spec
    from dfine_deploy.model.dfine import DeployModel

    _check_memory(resolve_spec(opts.model, imgsz=opts.imgsz, allow_pickle=opts.allow_pickle), opts)
    # a read-only or foreign -o fails here, first
    with replacing(opts.output, ARTIFACT, option="-o", force=opts.force, error=ExportError) as staging:
        loaded = load_model(
            opts.model,
            imgsz=opts.imgsz,
            sampler=opts.sampler,
            weights=opts.weights,
            allow_pickle=opts.allow_pickle,
            names=opts.names,
        )
        if loaded.class_names_note:
            log.info("class names: %s (--names FILE gives your own)", loaded.class_names_note)
        if opts.postprocess:
            module = DeployModel(loaded.model, loaded.postprocessor).eval()
        else:
            module = RawOutputs(loaded.model).eval()
        batches, coco = parity_inputs(opts)
        scorer = dataset_scorer(coco, loaded.class_names, loaded.class_names_note)
        truth = ground_truth(coco, loaded.class_names, loaded.class_names_note) if opts.postprocess else None
        if opts.data is not None and truth is None:
            if opts.threshold_target is not None:
                raise ExportError(
                    f"--threshold-target {opts.threshold_target}: --data {opts.data} holds no annotations to "
                    "choose thresholds on; give an annotated dataset (docs/train.md lists the layouts), "
                    "or drop it"
                )
            log.info("--data %s has no annotations: no thresholds per class are chosen", opts.data)
        run = ExportRun(staging, opts, module, loaded, batches, scorer, target, truth=truth)
        info = write_graphs(run)
        if opts.postprocess:  # dfine-verify compares labels, boxes, scores
            gate = [(b.images, b.orig_sizes, out) for b, out in run.pytorch_outputs(PACK_IMAGES)]
            info.reference_pack = write_pack(staging, gate, opts.batch[2], loaded.random_weights)
        write_artifact(staging, info)
        if opts.postprocess:  # labels, boxes, scores: what DeepStream's parser and Frigate read
            deepstream.write_config(staging)
            choice = None
            if truth is not None and frigate.frigate_refusal(info) is None:
                images, ids = annotated_images(opts)
                choice = frigate.choose_on_data(
                    staging, info, images, [truth[i] for i in ids], opts.threshold_target
                )
            frigate.write_snippet(staging, info, Path(opts.output).name, choice)
        share_folder(staging)
    output = Path(opts.output)
    if opts.trt:
        from dfine_deploy.export import tensorrt as trt_export

        built = trt_export.build_for_artifact(output, fp16=opts.fp16, int8=opts.int8)
        info.engines[built.precision] = built
        share_folder(output)
    if opts.triton is not None:
        triton.write_repository(output, opts.triton, force=opts.force)
    return info
