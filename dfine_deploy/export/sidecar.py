"""The sidecar record (model.json) of an export: the model, its graphs and gates, the checkpoint,
the package versions and, for a `--target` export, the target's parser checks and FP32 layers.
"""

from __future__ import annotations

import importlib.metadata
import logging
from pathlib import Path
from typing import Any

from dfine_deploy.artifact import ArtifactInfo
from dfine_deploy.backend_names import Precision
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export import targets as trt_targets
from dfine_deploy.export.run import ExportRun
from dfine_deploy.files import sha256_file
from dfine_deploy.model.contracts import input_contract
from dfine_deploy.runtime.tensorrt_plan import LAYER_CONSTRAINTS

log = logging.getLogger(__name__)


def artifact_info(
    run: ExportRun, *, target: dict[str, Any], backend_graphs: dict[str, dict[str, str]]
) -> ArtifactInfo:
    """The sidecar of the run's gated graphs, before the engine is added."""
    opts, loaded = run.settings, run.loaded
    spec = loaded.spec
    height, width = opts.imgsz
    k = spec.num_top_queries
    checkpoint: dict[str, Any] = {"ref": loaded.ref, "random_weights": bool(loaded.random_weights)}
    weights_file = opts.weights or loaded.weights_file
    if weights_file is not None and Path(weights_file).is_file():
        checkpoint.update(path=str(Path(weights_file).resolve()), sha256=sha256_file(weights_file))
    lo, opt, hi = opts.batch
    return ArtifactInfo(
        model=f"{spec.family}-{spec.size}" if spec.size else "custom",
        num_classes=spec.num_classes,
        class_names=list(loaded.class_names),
        class_names_note=loaded.class_names_note,
        input_height=height,
        input_width=width,
        input=input_contract(spec.family).to_dict(),
        batch_min=lo,
        batch_opt=opt,
        batch_max=hi,
        sampler=opts.sampler,
        postprocess=opts.postprocess,
        num_top_queries=k,
        graphs=dict(run.graphs),
        backend_graphs=backend_graphs,
        checkpoint=checkpoint,
        parity=dict(run.parity),
        thresholds=dict(run.thresholds),
        versions=_versions(),
        target=target,
    )


def _versions() -> dict[str, str]:
    out = {}
    for dist in (
        "dfine-deploy",
        "torch",
        "onnx",
        "onnxruntime",
        "onnxslim",
        "onnxconverter-common",
        "openvino",
        "nncf",
    ):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def target_record(run: ExportRun) -> dict[str, Any]:
    """Check every written graph against the target's ONNX parser (refusing on failure) and record
    the profile, the checks and, for a precision-constraint build, the FP32 layers."""
    profile = run.profile
    checks = {}
    for graph in run.graphs.values():
        model = onnx_export.load(run.staging / graph.file)
        report = trt_targets.require_parser_support(model, profile, source=graph.file)
        checks[graph.file] = report.to_dict()
        log.info(
            "%s: TensorRT %s's ONNX parser imports every node (static check against %s)",
            graph.file,
            profile.tensorrt,
            report.table_ref,
        )
    record: dict[str, Any] = {"profile": profile.to_dict(), "parser_check": checks}
    if profile.precision == LAYER_CONSTRAINTS and run.fp32_islands:
        fp32_model = onnx_export.load(run.path(Precision.FP32))
        layers = trt_targets.constrained_layers(fp32_model, run.fp32_islands)
        record["fp32_layers"] = layers
        record["fp32_lookalike_nodes"] = trt_targets.lookalike_nodes(fp32_model, layers)
        record["trtexec_layer_flags"] = trt_targets.trtexec_layer_flags(layers)  # read by build_engine.sh
    return record
