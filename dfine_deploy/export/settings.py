"""`ExportSettings`: the options of one `dfine-export` run, as the CLI parsed them (`export.cli`);
`export.pipeline` checks and runs them, and the graph, gate and sidecar steps read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from dfine_deploy.cores import usable_cores
from dfine_deploy.model.spec import EXPORT_SAMPLER


@dataclass
class ExportSettings:
    model: str  # size name, config or checkpoint (dfine_deploy/model/reference.py)
    output: Path
    imgsz: tuple[int, int] = (640, 640)  # (H, W)
    batch: tuple[int, int, int] = (1, 1, 8)  # min, opt, max
    opset: int | None = None  # None: the target's opset, else onnx_export.DEFAULT_OPSET
    sampler: str = EXPORT_SAMPLER
    target: str | None = None  # a --target name, a row of export/deploy_targets.py: "jetpack5", "rk3588"
    postprocess: bool = True
    fp16: bool = True
    cpu_graph: bool = True  # also write the GridSample graph for CPU backends (gather exports only)
    int8: bool = False  # INT8 QDQ graph calibrated on --data (with --target: the one for TensorRT)
    calibration_images: int = 32
    trt: bool = False
    triton: Path | None = None
    force: bool = False
    data: Path | None = None
    weights: Path | None = None  # a .pth for a size name or config given as `model`
    allow_pickle: bool = False  # full unpickling of a trusted checkpoint (not weights_only)
    names: Path | None = None  # class-names file overriding the model's (class_names.read_names_file)
    # thresholds per class chosen on --data's annotations (dfine_deploy/thresholds.py): F1-optimal, or
    # with a target the most recall at that precision
    threshold_target: float | None = None
    gate_images: int = 100  # images of --data every gate compares (and scores for mAP)
    threads: int = field(default_factory=usable_cores)  # the gates' CPU sessions (onnxruntime, OpenVINO)
