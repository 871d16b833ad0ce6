"""One benchmark: every (model, backend, batch) measured engine-only and image-to-detections.

Scopes, as the report labels them:
- engine: the backend's call alone on prepared input arrays (host->device copies included for
  GPU backends, as an application pays them), no resizing and no decoding;
- image->det: `Detector.predict` on full frames (resize, colour swap, scale, run, decode), the span
  docs/performance.md defines once for every harness.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy import __version__
from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.bench.accuracy import DataScore, coco_map
from dfine_deploy.bench.hardware import Hardware, matches, measured_on, measured_on_line
from dfine_deploy.bench.measure import Timing, gpu_memory_mb, host_memory_mb, noise_reasons, time_calls
from dfine_deploy.bench.tables import MODEL_SIZES, Expectation, Profile, expected_for
from dfine_deploy.errors import BenchError
from dfine_deploy.files import cached_sha256
from dfine_deploy.memory import check_memory
from dfine_deploy.model.reference import SIDECAR_NAME, classify_model_ref, names_nothing
from dfine_deploy.runtime.backends import BY_NAME, openers, split_backend
from dfine_deploy.runtime.detector import Detector
from dfine_deploy.runtime.verify_record import verify_status

log = logging.getLogger(__name__)


FRAME_SIZE = (1280, 720)  # (w, h) of the synthetic camera frames every image->det figure times


@dataclass
class BenchSettings:
    models: list[str]
    adapters: list[str]
    backends: list[str]
    profile: Profile
    batches: list[int]
    imgsz: tuple[int, int] | None = None
    runs: int = 20
    warmup: int = 3
    rounds: int = 3
    frame_size: tuple[int, int] = FRAME_SIZE
    data: Path | None = None
    data_limit: int | None = None
    work_dir: Path = Path(".dfine_bench")
    threads: int | None = None
    names: Path | None = None  # class-names file overriding the model's (--names)
    precisions: list[str] = field(default_factory=lambda: [Precision.AUTO])  # artifact graphs to run


@dataclass
class Row:
    model: str
    format: str
    backend: str
    provider: str
    device: str
    batch: int
    scope: str  # "engine" | "image->det"
    size_mb: float | None
    map50_95: float | None
    timing: Timing
    noise: list[str]
    expected: Expectation
    memory: dict[str, float | None]
    input_size: tuple[int, int] = (640, 640)
    # dfine-verify's standing of the file on this device: passed, failed, not verified ("": torch)
    verify: str = ""

    @property
    def noisy(self) -> bool:
        return bool(self.noise)

    @property
    def ratio(self) -> float | None:
        return self.timing.fps / self.expected.fps if self.expected.fps else None


@dataclass
class BenchResult:
    hardware: Hardware
    profile: Profile
    request: BenchSettings
    rows: list[Row] = field(default_factory=list)
    measured_on: list[str] = field(default_factory=list)
    seconds: float = 0.0
    data_lines: list[str] = field(default_factory=list)  # what each mAP was computed on


def model_key(ref: str, detector: Detector | None = None) -> str:
    """'dfine-n' for anything that is a D-FINE size (sidecar first, then the name), else the stem."""
    if detector is not None and detector.artifact is not None and detector.artifact.model in MODEL_SIZES:
        return detector.artifact.model
    name = Path(ref).name.lower()
    for size in MODEL_SIZES:
        if name == size or name.startswith(size) or f"_{size[-1]}_" in name.replace("hgnetv2", ""):
            return size
    return Path(ref).stem or ref


def export_key(ref: str) -> str:
    """What an export of `ref` is made from: a checkpoint's bytes, a config's merged content (its
    includes and all), or a size name; plus this package's version, whose exporter made it."""
    kind = classify_model_ref(ref).kind
    if kind == "checkpoint":
        made_from = f"sha256 {cached_sha256(ref)}"
    elif kind == "config":
        from dfine_deploy.config.tree import load_tree

        tree, _ = load_tree(Path(ref))
        merged = json.dumps(tree, sort_keys=True, default=str).encode()
        made_from = f"config {hashlib.sha256(merged).hexdigest()}"
    else:
        made_from = f"size {ref}"
    return f"{made_from}|dfine-deploy {__version__}"


def export_for_bench(
    ref: str, imgsz: tuple[int, int] | None, work_dir: Path, *, fp16: bool, trt: bool
) -> Path:
    """Make (or reuse) an artifact folder for a checkpoint/config/size name via dfine-export.

    The folder is named by what the export is made from (`export_key`), never by the path alone: a
    checkpoint replaced at the same path gets a new export, not the old one's graphs and mAP.
    A size name has random weights: its near-tied scores can fail the FP16 parity gate for no
    real reason, so that gate is recorded, not enforced (--force). The CPU needs no FP16 graph.
    """
    try:
        from dfine_deploy.export.cli import main as export_main
    except ImportError as exc:
        raise BenchError(
            f"{ref}: benchmarking a checkpoint on onnxruntime/TensorRT needs dfine-export ({exc}); "
            "export it first and pass the artifact folder to --model"
        ) from exc
    size = imgsz or (640, 640)
    key = hashlib.sha256(f"{export_key(ref)}|{size}|{fp16}|{trt}".encode()).hexdigest()[:16]
    folder = work_dir / f"{Path(ref).stem}-{size[0]}x{size[1]}-{key}"
    if (folder / SIDECAR_NAME).is_file():
        return folder
    argv = [ref, "-o", str(folder), "--imgsz", str(size[0]), str(size[1])]
    argv += [] if fp16 else ["--no-fp16"]
    argv += ["--trt"] if trt else []
    argv += ["--force"] if classify_model_ref(ref).kind == "size" else []
    print(f"exporting {ref} at {size[0]}x{size[1]} to {folder} (once; reused next time)")
    code = export_main(argv)
    if code:
        raise BenchError(f"{ref}: dfine-export failed (exit {code}); see the message above")
    return folder


def open_detector(
    ref: str, adapter: str, backend: str, request: BenchSettings, precision: str = Precision.AUTO
) -> Detector:
    name, _ = split_backend(backend)
    device = "cpu" if request.profile.kind == "cpu" else "auto"
    source: str | Path = ref
    model_ref = classify_model_ref(ref)
    if not model_ref.is_name and not model_ref.exists:  # a size or weights name names no file
        raise BenchError(f"--model {names_nothing(ref)}")
    if model_ref.runs_on_torch and name != BackendName.TORCH:
        gpu = device != "cpu" and _onnxruntime_has_cuda()
        engine = name in [row.name for row in openers("engine")]  # it runs a TensorRT engine: build one
        source = export_for_bench(ref, request.imgsz, request.work_dir, fp16=gpu or engine, trt=engine)
    detector = Detector.open(
        source,
        backend=backend,
        device=device,
        adapter=adapter,
        imgsz=request.imgsz,
        threads=request.threads,
        names=request.names,
        precision=precision,
        unverified=True,  # measured, not served: the row shows its verify status
    )
    if detector.class_names_note:
        note = detector.class_names_note
        print(f"{ref}: class names: {note} (--names FILE gives your own)", file=sys.stderr)
    return detector


def _onnxruntime_has_cuda() -> bool:
    import onnxruntime as ort

    return "CUDAExecutionProvider" in ort.get_available_providers()


def verify_column(detector: Detector) -> str:
    """The file's dfine-verify result on this device (verify.json beside it), "" for torch."""
    path = Path(detector.source)
    return verify_status(path, detector.backend) if path.is_file() else ""


def size_mb(detector: Detector) -> float | None:
    path = Path(detector.source)
    if path.is_file():
        return round(path.stat().st_size / 1e6, 1)
    module = getattr(detector.backend, "module", None)
    if module is not None:  # torch: the weights' size in memory
        return round(sum(p.numel() * p.element_size() for p in module.parameters()) / 1e6, 1)
    return None


def format_name(detector: Detector) -> str:
    row = BY_NAME.get(detector.backend_name)
    label = row.label if row else detector.backend_name
    graph = Path(detector.source).name
    if row and "onnx" in row.opens:
        label += " FP16" if ".fp16." in graph else " INT8" if ".int8." in graph else ""
        label += " BF16" if detector.info.get("precision") == Precision.BF16 else ""
    if detector.adapter.name != "dfine":
        label += f" ({detector.adapter.name})"
    return label


def synthetic_frames(count: int, frame_size: tuple[int, int], seed: int = 0) -> list[np.ndarray]:
    """BGR uint8 frames of smooth random colour fields (less trivial for a detector than noise)."""
    rng = np.random.default_rng(seed)
    width, height = frame_size
    import cv2

    frames = []
    for _ in range(count):
        small = rng.integers(0, 256, (max(2, height // 40), max(2, width // 40), 3), dtype=np.uint8)
        frames.append(cv2.resize(small, (width, height), interpolation=cv2.INTER_CUBIC))
    return frames


def check_memory_up_front(request: BenchSettings) -> None:
    """Refuse a D-FINE model whose export or largest batch cannot fit in memory, before anything is
    exported or measured (an export at 8192 x 8192 ran four minutes before the kernel killed it)."""
    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.model.spec import size_key, size_spec

    batch = max(request.batches)
    exports = any(split_backend(b)[0] != BackendName.TORCH for b in request.backends)
    for ref, adapter in zip(request.models, request.adapters):
        model_ref = classify_model_ref(ref)
        if adapter != "dfine" or not (model_ref.exists or model_ref.kind == "size"):
            continue  # another detector, or a path open_detector reports as missing
        needed = 0
        if model_ref.runs_on_torch:
            from dfine_deploy.export.pipeline import export_memory_bytes
            from dfine_deploy.export.settings import ExportSettings
            from dfine_deploy.hub.loader import resolve_spec

            spec = resolve_spec(ref, imgsz=request.imgsz)
            needed = export_memory_bytes(spec, ExportSettings.batch[2]) if exports else 0
        elif model_ref.kind == "artifact":
            info = read_artifact(ref)
            if size_key(info.model) is None:
                continue  # a custom architecture: no table to estimate from
            spec = size_spec(info.model).with_input_size(info.input_height, info.input_width)
        else:
            continue
        height, width = spec.eval_spatial_size
        check_memory(
            max(needed, spec.activation_bytes(height, width, batch)),
            f"--model {ref} at {height} x {width} with batch {batch}",
            "use a smaller --imgsz or --batch",
            BenchError,
        )


def run_bench(request: BenchSettings, hardware: Hardware) -> BenchResult:
    started = time.perf_counter()
    check_memory_up_front(request)
    result = BenchResult(hardware=hardware, profile=request.profile, request=request)
    frames = synthetic_frames(max(request.batches), request.frame_size)
    for ref, adapter in zip(request.models, request.adapters):
        for backend, precision in [(b, p) for b in request.backends for p in request.precisions]:
            detector = open_detector(ref, adapter, backend, request, precision)
            try:
                too_big = [b for b in request.batches if b > detector.max_batch]
                if too_big:
                    raise BenchError(
                        f"--batch {too_big}: {detector.source} takes at most {detector.max_batch} "
                        f"images per call ({detector.info['max_batch_source']}); use smaller "
                        "batches or re-export with dfine-export --batch MIN OPT MAX"
                    )
                score = coco_map(detector, request.data, request.data_limit) if request.data else None
                rows = measure_detector(ref, detector, frames, request, hardware, score)
                result.rows.extend(rows)
                if score is not None:
                    what = f"{rows[0].model} {rows[0].format}"
                    result.data_lines.append(f"mAP50-95 of {what}: {score.line()}")
                    result.data_lines.append(f"per class, at the thresholds dfine-serve applies to {what}:")
                    result.data_lines += score.per_class
                line = measured_on_line(request.profile, hardware, detector.backend.device)
                if line not in result.measured_on:
                    result.measured_on.append(line)
            finally:
                detector.close()
    result.seconds = time.perf_counter() - started
    return result


def measure_detector(
    ref: str, detector: Detector, frames, request: BenchSettings, hardware: Hardware, score: DataScore | None
) -> list[Row]:
    """One row per batch size and scope; `score` is the detector's mAP on --data, when given."""
    key = model_key(ref, detector) if detector.adapter.name == "dfine" else Path(ref).stem
    expectation = expected_for(request.profile, key)
    map50_95 = score.map50_95 if score is not None else None
    sync = getattr(detector.backend, "synchronize", None)
    rows = []
    for batch in request.batches:
        chunk = frames[:batch]
        feeds, _ = detector.prepare(chunk)
        # partial binds this batch's inputs now (a lambda would read the loop variables when called)
        scopes: dict[str, Callable[[], Any]] = {
            "engine": partial(detector.backend.run, feeds),
            "image->det": partial(detector.predict, chunk),
        }
        for scope, call in scopes.items():
            load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
            timing = time_calls(
                call,
                batch=batch,
                warmup=request.warmup,
                runs=request.runs,
                rounds=request.rounds,
                synchronize=sync,
            )
            memory = host_memory_mb()
            memory["gpu_mb"] = gpu_memory_mb(detector.backend.device)
            rows.append(
                Row(
                    model=key,
                    format=format_name(detector),
                    backend=detector.backend_name,
                    provider=detector.provider,
                    device=detector.backend.device,
                    batch=batch,
                    scope=scope,
                    size_mb=size_mb(detector),
                    map50_95=map50_95,
                    timing=timing,
                    noise=noise_reasons(timing, load, hardware.cpu_count),
                    expected=expectation,
                    memory=memory,
                    input_size=tuple(detector.input_size),
                    verify=verify_column(detector),
                )
            )
    return rows


def summary(result: BenchResult) -> dict[str, Any]:
    """Everything the report prints, as plain data (the --json file)."""
    hw = result.hardware
    return {
        "profile": {"key": result.profile.key, "label": result.profile.label, "note": result.profile.note},
        "hardware": hw.to_dict(),
        "measured_on": result.measured_on,
        "matches_profile": [matches(result.profile, hw, d) for d in sorted({r.device for r in result.rows})],
        "devices": {d: measured_on(hw, d) for d in sorted({r.device for r in result.rows})},
        "settings": {
            "runs": result.request.runs,
            "warmup": result.request.warmup,
            "rounds": result.request.rounds,
            "batches": result.request.batches,
            "imgsz": list(result.request.imgsz) if result.request.imgsz else None,
            "frame_size": list(result.request.frame_size),
        },
        "seconds": round(result.seconds, 2),
    }
