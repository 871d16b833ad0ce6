"""`Detector`: one way to run a detector, whatever file it comes from and whatever runs it.

    det = Detector.open("runs/export/dfine-n")            # artifact folder from dfine-export
    det = Detector.open("model.onnx", backend="onnxruntime:cuda")
    det = Detector.open("model.engine")                    # TensorRT
    det = Detector.open("best.pth", backend="torch")       # checkpoint / .yml / size name
    det = Detector.open("yolo11n.onnx", adapter="yolo")    # a foreign ONNX detector
    results = det.predict([cv2.imread("a.jpg")])           # BGR frames (OpenCV's order)
    results = det.predict([read_image("a.jpg")], color="RGB")  # dfine_deploy.images: as trained

`backend` is "auto", "torch", "onnxruntime" (optionally ":cpu", ":cuda", ":tensorrt" to pick the
execution provider), "openvino" (CPU) or "tensorrt": the rows of `runtime/backends.py`. An
artifact's sidecar says which of its graphs each backend runs (`backend_graphs`: the GridSample
graph on the CPU, the gather graph on GPUs).
`precision` picks among an artifact's graphs ("fp32", "fp16", "int8"); "bf16" runs OpenVINO's FP32
graph in BF16 on CPUs with BF16 units, only when the export's "bf16:openvino" gate passed.
"auto" picks the TensorRT engine of an artifact when TensorRT
and a GPU are there, else onnxruntime; checkpoints, configs and size names run on torch.
`Detector.provider` says what really ran. Frames are BGR unless `color="RGB"`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy import cpu
from dfine_deploy.artifact import (
    BF16_GATE_KEY,
    GATE_BACKEND,
    SIDECAR_NAME,
    ArtifactInfo,
    read_artifact,
    verify_file,
)
from dfine_deploy.backend_names import GRAPH_PRECISIONS, BackendName, Precision
from dfine_deploy.errors import BackendError, DfineError
from dfine_deploy.model.reference import TORCH_KINDS, classify_model_ref, model_ref_forms, names_nothing
from dfine_deploy.numbers import Range
from dfine_deploy.runtime.adapters import Adapter, make_adapter
from dfine_deploy.runtime.backend import Backend
from dfine_deploy.runtime.backends import (
    BY_NAME,
    BackendInfo,
    OpenRequest,
    openers,
    run_precision_backends,
    split_backend,
)
from dfine_deploy.runtime.classes import graph_class_names
from dfine_deploy.runtime.detections import Detections
from dfine_deploy.runtime.preprocess import check_frames
from dfine_deploy.runtime.verify_record import UnverifiedEngine, require_verified
from dfine_deploy.thresholds import ClassThresholds, by_label, resolve_thresholds

log = logging.getLogger(__name__)

DEFAULT_IMGSZ = (640, 640)
# CPU threads of a backend: the runtimes take a C int, and more threads than cores only slow a run down
THREADS = Range(1, 1024)


def _row_for(kind: str, name: BackendName, ref: str) -> BackendInfo:
    """The backend that runs a single model file of `kind`: the one asked for, or for "auto" the
    first row of the table that opens the kind."""
    rows = openers(kind)
    if name == BackendName.AUTO:
        return rows[0]
    if any(row.name == name for row in rows):
        return BY_NAME[name]
    if kind in TORCH_KINDS:
        raise BackendError(
            f"{ref} is a PyTorch model ({model_ref_forms((kind,))}), which runs on the torch backend only; "
            f"to use {name}, export it first: dfine-export {ref} -o DIR, then open DIR"
        )
    if kind == "onnx":
        allowed = ", ".join(f"{str(r.name)!r}" for r in rows)
        raise BackendError(
            f"{ref} is an ONNX graph: open it with backend={allowed} or 'auto'; "
            "a TensorRT engine is built from it with dfine-export --trt"
        )
    what = "a TensorRT engine" if kind == "engine" else model_ref_forms((kind,))
    raise BackendError(f"{ref} is {what}: open it with backend={str(rows[0].name)!r}")


def _gpu_wanted(device: str, provider: str | None) -> bool:
    if provider == "cpu" or device == "cpu":
        return False
    if provider in ("cuda", "tensorrt") or device.startswith("cuda"):
        return True
    if device == "auto":
        import onnxruntime as ort

        return "CUDAExecutionProvider" in ort.get_available_providers()
    return False


def _on_gpu(row: BackendInfo, request: OpenRequest) -> bool:
    """Does the row run on a GPU for this request? A row with one kind of device says so itself."""
    if len(row.devices) == 1:
        return row.devices[0] == "cuda"
    return _gpu_wanted(request.device, request.provider)


def _has_graph(artifact: ArtifactInfo, route: str, precision: Precision) -> bool:
    """Does the folder hold a graph `route` runs at `precision`?"""
    try:
        artifact.graph_for(route, precision)
    except BackendError:
        return False
    return True


def _require_bf16_gate(artifact: ArtifactInfo | None, source: str, graph: str | None = None) -> None:
    """Refuse BF16 unless the export's "bf16:openvino" gate passed (on `graph`, when one is named):
    like an ungated INT8 graph."""
    gate = artifact.parity.get(BF16_GATE_KEY) if artifact else None
    if gate and gate.get("passed"):
        gated = artifact.graph_for(BackendName.OPENVINO, Precision.BF16, source=source).file
        if graph is None or graph == gated:
            return
        raise BackendError(
            f"{source}: precision bf16 refused: the bf16 gate checked {gated}, not this graph; "
            f"open {gated} (or the artifact folder), or use precision fp32"
        )
    if gate is None:
        why = "model.json records no bf16 gate" if artifact else "no model.json beside it records a bf16 gate"
    elif gate.get("run") is False:
        why = f"its bf16 gate was not run at export ({gate.get('reason')})"
    else:
        why = f"its bf16 gate failed at export ({'; '.join(gate.get('failures', []))})"
    raise BackendError(
        f"{source}: precision bf16 refused: {why}. Re-export with dfine-export on a CPU with BF16 "
        "units (AVX512_BF16/AMX) and OpenVINO installed, or use precision fp32 or int8"
    )


_CPU_FIT_WARNED: set[tuple[str, str, str]] = set()


def int8_gated_elsewhere(artifact: ArtifactInfo | None, graph: Path) -> str | None:
    """Why an INT8 graph must prove itself here before it is served: its gate ran on another CPU class
    than this one (or model.json does not say which); None when it ran on this class, or the file is
    not an INT8 graph of the artifact. INT8 kernels differ by class: NNCF's graph that held on
    OpenVINO on an AMX Xeon lost 15-30 AP there on AVX2 and AVX-512 VNNI EPYCs (docs/export.md)."""
    info = artifact.graph_named(graph.name) if artifact else None
    if info is None or info.precision != Precision.INT8:
        return None
    gated, here = info.recipe.get("isa"), cpu.isa_class()
    if gated == here:
        return None
    return f"its INT8 gate ran on a CPU of class {gated or 'unrecorded'}, this one is {here}"


def warn_about_cpu_fit(
    artifact: ArtifactInfo | None, graph: Path, backend: str, bf16: bool = False, proved_here: bool = False
) -> str | None:
    """INT8 and BF16 depend on the CPU's ISA class (`dfine_deploy/cpu.py`). Warn once per graph, backend
    and class, and return the warning, when the graph's gate ran on another class than this CPU's and
    dfine-verify has not passed it here (`proved_here`), or when INT8 ran slower than FP32 on `backend`
    at export on this class (INT8 is offered where faster)."""
    info = artifact.graph_named(graph.name) if artifact else None
    if info is not None and info.precision == Precision.INT8:
        what, gated, bits = "INT8", info.recipe.get("isa"), info.recipe.get("weight_bits", 8)
    elif bf16 and artifact is not None:
        what, gated, bits = "BF16", artifact.parity.get(BF16_GATE_KEY, {}).get("isa"), None
    else:
        return None
    here = cpu.isa_class()
    key = (str(graph), backend, here)
    if key in _CPU_FIT_WARNED:
        return None
    if gated != here and proved_here:
        return None
    if gated != here:
        message = (
            f"{graph}: its {what} gate ran on a CPU of class {gated or 'unrecorded'}, this one is {here}; "
            "its accuracy was not checked on this class: `dfine-bench --data DIR` measures it here"
        )
        if bits == 8 and cpu.int8_saturates(here):
            message += (
                ". Its weights use all 8 bits and this CPU has no VNNI, so its INT8 kernels may saturate: "
                "re-export with --int8 on this CPU class (7-bit weights)"
            )
    elif what == "INT8" and (ratio := info.recipe.get("time_vs_fp32", {}).get(backend, 0)) >= 1:
        message = (
            f"{graph}: on {backend} INT8 took {ratio:.2f}x the FP32 time at export on this CPU class "
            f"({here}): precision fp32 is faster here"
        )
    else:
        return None
    _CPU_FIT_WARNED.add(key)
    log.warning("%s", message)
    return message


def _chosen(artifact: ArtifactInfo | None, file: str, target: str, precision: str = "") -> dict[int, float]:
    """The thresholds the export chose for `file` run by `target`, by label: a names file that renames
    the classes keeps them (`thresholds.by_label`)."""
    if artifact is None:
        return {}
    return by_label(artifact.chosen_thresholds(file, target, precision), artifact.class_names)


class Detector:
    """A backend plus the adapter of its model family; see the module docstring."""

    def __init__(
        self,
        backend: Backend,
        adapter: Adapter,
        *,
        input_size: tuple[int, int],
        score_threshold: float | None = 0.0,
        source: str = "",
        artifact: ArtifactInfo | None = None,
        class_names_note: str = "",
        verified: bool | None = None,
        class_thresholds: dict[str, float] | None = None,
        chosen: dict[int, float] | None = None,
    ):
        self.backend = backend
        self.adapter = adapter
        self.input_size = input_size
        # the score each class must pass: yours (score_threshold, class_thresholds), else the ones
        # dfine-export chose for this graph and backend (`chosen`), else the default (thresholds.py)
        self.thresholds: ClassThresholds = resolve_thresholds(
            adapter.class_names, chosen or {}, class_thresholds, score_threshold
        )
        self.score_threshold = float(self.thresholds.values.min())  # what the adapter's decode keeps
        self.source = source
        self.artifact = artifact
        # how the class names were chosen when the model carries none ("" when it does)
        self.class_names_note = class_names_note
        # an engine's dfine-verify standing: True passed here, False served unverified, None not an
        # engine (graphs are gated at export)
        self.verified = verified

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        backend: str = BackendName.AUTO,
        device: str = "auto",
        score_threshold: float | None = 0.0,
        *,
        class_thresholds: dict[str, float] | None = None,
        adapter: str = "dfine",
        imgsz: tuple[int, int] | None = None,
        precision: str = Precision.AUTO,
        threads: int | None = None,
        memory: str = "auto",
        names: str | os.PathLike | None = None,
        spin_wait: bool = True,
        unverified: bool = False,
    ) -> Detector:
        """Open any model reference (`dfine_deploy.model.reference`): artifact folder, .onnx,
        .engine, or on torch a checkpoint, config or size name.

        `names`: a class-names file (dfine_deploy.class_names.read_names_file) that overrides the
        names the model carries or the ones assumed from its class count; it must hold one name per
        class of the model. `spin_wait=False`: onnxruntime's CPU threads sleep between runs instead
        of busy-waiting (`onnxruntime_backend.SPINNING_OFF`; dfine-serve), other backends ignore it.
        An engine (TensorRT, replay) opens only with a passing `dfine-verify` result for its bytes on
        this device (`runtime/verify_record.py`); `unverified=True` opens it anyway, and says so
        (`Detector.verified`).

        Thresholds: a detection is kept when its score passes its class's threshold. `score_threshold`
        is one for every class (0.0, the default: keep all); None takes for each class the one
        dfine-export chose on --data for this graph and backend (model.json `thresholds`), else
        thresholds.DEFAULT_SCORE_THRESHOLD. `class_thresholds` ({class name: score}) win over both."""
        name, provider = split_backend(backend)
        if precision not in list(Precision):
            raise BackendError(f"precision={precision!r}: expected one of {[str(p) for p in Precision]}")
        chosen = Precision(precision)
        if threads is not None and (isinstance(threads, float) or not THREADS.holds(threads)):
            raise BackendError(
                f"threads={threads!r}: expected a whole number in 1..{THREADS.high:g} "
                "(or none: the backend's default)"
            )
        runners = run_precision_backends(chosen)
        if chosen not in GRAPH_PRECISIONS and runners and name not in runners:
            raise BackendError(
                f"precision={str(chosen)!r} with backend {backend!r}: {chosen.upper()} runs on "
                + " or ".join(f"backend={str(r)!r}" for r in runners)
                + " only (on CPUs with BF16 units); elsewhere use "
                + ", ".join(GRAPH_PRECISIONS[:-1])
                + f" or {GRAPH_PRECISIONS[-1]}"
            )
        request = OpenRequest(
            backend=name,
            provider=provider,
            device=device,
            adapter=adapter,
            imgsz=imgsz,
            precision=chosen,
            threads=threads,
            memory=memory,
            names=names,
            spin_wait=spin_wait,
            unverified=unverified,
            class_thresholds=dict(class_thresholds or {}),
        )
        ref = str(path)
        target = Path(path)
        model_ref = classify_model_ref(ref)
        if adapter != "dfine" and (model_ref.kind in ("artifact", "engine") or model_ref.runs_on_torch):
            raise BackendError(
                f"adapter={adapter!r}: {ref} is a D-FINE {model_ref.kind}, read by the 'dfine' adapter; "
                "another adapter reads a foreign bare .onnx only: leave adapter out"
            )
        if model_ref.kind == "artifact":
            return cls._open_artifact(target, request, score_threshold)
        # one file is one graph: only a backend that applies a precision itself still chooses one
        if chosen != Precision.AUTO and (
            name == BackendName.AUTO or chosen not in BY_NAME[name].run_precisions
        ):
            raise BackendError(
                f"precision={str(chosen)!r} chooses a graph of an artifact folder, and {ref} is a single "
                "model that runs as it is: open the folder dfine-export wrote, or leave precision 'auto'"
            )
        if model_ref.kind == "unknown" and model_ref.exists:
            raise BackendError(f"{ref}: not a model reference; expected {model_ref_forms()}")
        if model_ref.kind == "unknown" or (not model_ref.is_name and not model_ref.exists):
            raise BackendError(names_nothing(ref))
        row = _row_for(model_ref.kind, name, ref)
        if model_ref.runs_on_torch:
            return cls._open_torch(row, ref, request, score_threshold, None)
        sidecar_path = target.parent / SIDECAR_NAME
        artifact = read_artifact(target.parent) if sidecar_path.is_file() else None
        if chosen == Precision.BF16:
            _require_bf16_gate(artifact, ref, target.name)
        return cls._open_file(row, target, request, score_threshold, artifact)

    @classmethod
    def _open_artifact(cls, folder: Path, request: OpenRequest, threshold: float | None) -> Detector:
        """An artifact folder: what the backend's row opens of it (`opens`): its checkpoint, its engine,
        or the graph `backend_graphs` routes the backend to at the precision asked, else at the row's
        `folder_precisions`. "auto" takes the engine where one is there and a GPU is asked for, else
        the first row that opens graphs (onnxruntime)."""
        artifact = read_artifact(folder)
        record = artifact.engine_for(request.precision)  # each precision has its own engine file
        engine = folder / record.file if record else None
        if request.backend != BackendName.AUTO:
            row = BY_NAME[request.backend]
        else:
            row, engine_row = openers("onnx")[0], openers("engine")[0]
            if engine is not None and engine.is_file() and request.device != "cpu":
                try:
                    return cls._open_file(engine_row, engine, request, threshold, artifact)
                except UnverifiedEngine:
                    raise  # the engine is there and runs here: it must prove itself, not be swapped out
                except (DfineError, ImportError, OSError) as exc:
                    log.info("%s engine not usable here (%s); using %s", engine_row.label, exc, row.name)
        if any(kind in TORCH_KINDS for kind in row.opens):
            checkpoint = artifact.checkpoint.get("path")
            if not checkpoint or not Path(checkpoint).is_file():
                raise BackendError(
                    f"{folder}: the {row.name} backend needs the checkpoint this artifact was exported "
                    f"from, and model.json names {checkpoint!r}, which is not there; open the .pth directly"
                )
            return cls._open_torch(row, checkpoint, request, threshold, artifact)
        if "engine" in row.opens:
            if engine is None or not engine.is_file():
                built = ", ".join(f"{p} ({e.file})" for p, e in artifact.engines.items()) or "none"
                which = "" if request.precision == Precision.AUTO else f"{request.precision} "
                raise BackendError(
                    f"{folder}: no {which}{row.label} engine in this artifact (engines: {built}); "
                    "build one on the target with `dfine-export ... --trt`, or use backend='onnxruntime'"
                )
            return cls._open_file(row, engine, request, threshold, artifact)
        gpu = _on_gpu(row, request)
        route = row.route(request.provider, gpu)
        precision = request.precision
        if precision == Precision.AUTO:
            preferred = row.folder_precisions["cuda" if gpu else "cpu"]
            precision = next((p for p in preferred if _has_graph(artifact, route, p)), preferred[0])
        if precision == Precision.BF16:
            _require_bf16_gate(artifact, str(folder))
        graph = folder / artifact.graph_for(route, precision, source=str(folder)).file
        return cls._open_file(row, graph, replace(request, precision=precision), threshold, artifact)

    @classmethod
    def _open_file(
        cls,
        row: BackendInfo,
        path: Path,
        request: OpenRequest,
        threshold: float | None,
        artifact: ArtifactInfo | None,
    ) -> Detector:
        """The one open path of graphs and engines: verify the file against its sidecar, build the row's
        backend, require a passing dfine-verify result here of an engine and of an INT8 graph gated on
        another CPU class, warn when an INT8/BF16 gate ran on another CPU class and nothing proved the
        graph here, then the class names, the adapter and the input size, the same way on every
        backend."""
        if artifact:
            verify_file(path.parent, artifact, path.name)
        on_cpu = "cpu" in row.devices and not _on_gpu(row, request)
        int8_elsewhere = int8_gated_elsewhere(artifact, path) if on_cpu else None
        backend = row.open(path, request, artifact)
        verified = None
        if row.needs_verify or int8_elsewhere:
            verified = not request.unverified
            if verified:
                try:
                    require_verified(path, backend, because=int8_elsewhere)
                except BackendError:
                    backend.close()
                    raise
            else:
                log.warning("%s opened unverified (no dfine-verify result asked of it)", path)
        if on_cpu:
            bf16 = request.precision == Precision.BF16
            warn_about_cpu_fit(artifact, path, row.name, bf16=bf16, proved_here=verified is True)
        chosen = graph_class_names(path, artifact, backend.metadata(), request.names)
        adapter = make_adapter(request.adapter, chosen.names)
        adapter.check(backend.input_names, backend.output_names, str(path))
        target = row.route(request.provider, _on_gpu(row, request))
        return cls(
            backend,
            adapter,
            input_size=_input_size(backend, artifact, request.imgsz, str(path)),
            score_threshold=threshold,
            source=str(path),
            artifact=artifact,
            class_names_note=chosen.note,
            verified=verified,
            class_thresholds=request.class_thresholds,
            chosen=_chosen(artifact, path.name, target, request.precision),
        )

    @classmethod
    def _open_torch(
        cls,
        row: BackendInfo,
        ref: str,
        request: OpenRequest,
        threshold: float | None,
        artifact: ArtifactInfo | None,
    ) -> Detector:
        """A checkpoint, config or size name: the model carries its own names and input size. The
        checkpoint of an artifact takes the thresholds chosen for its FP32 graph (the same arithmetic)."""
        backend = row.open(ref, request, artifact)
        fp32 = artifact.graphs[Precision.FP32].file if artifact else ""
        return cls(
            backend,
            make_adapter("dfine", backend.loaded.class_names),
            input_size=backend.input_size,
            score_threshold=threshold,
            source=ref,
            artifact=artifact,
            class_names_note=backend.loaded.class_names_note,
            class_thresholds=request.class_thresholds,
            chosen=_chosen(artifact, fp32, GATE_BACKEND),
        )

    # -- running -------------------------------------------------------------------------------
    def predict(self, frames: Sequence[np.ndarray], *, color: str = "BGR") -> list[Detections]:
        """Detect objects in each frame; boxes come back in that frame's pixels.

        Frames are HxWx3 uint8, BGR by default (OpenCV); any number of them: they are run in
        chunks of at most `max_batch`.
        """
        frames = check_frames(frames)
        results: list[Detections] = []
        for start in range(0, len(frames), self.max_batch):
            chunk = frames[start : start + self.max_batch]
            feeds, state = self.prepare(chunk, color)
            outputs = self.backend.run(feeds)
            results.extend(self.adapter.decode(outputs, state, self.score_threshold))
        values = self.thresholds.values
        if values.max() > values.min():  # the decode kept the lowest class threshold: apply each
            labels = (np.clip(det.labels, 0, len(values) - 1) for det in results)
            results = [det.keep(det.scores > values[label]) for det, label in zip(results, labels)]
        return results

    def prepare(self, frames: Sequence[np.ndarray], color: str = "BGR") -> tuple[dict[str, np.ndarray], Any]:
        """The backend's feeds for at most `max_batch` frames, and what the adapter's decode needs."""
        return self.adapter.prepare(frames, self.input_size, color, raw_pixels=self.backend.raw_pixels)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> Detector:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what it is ----------------------------------------------------------------------------
    @property
    def max_batch(self) -> int:
        return self.backend.max_batch

    @property
    def backend_name(self) -> str:
        return self.backend.name

    @property
    def provider(self) -> str:
        """What really executes (read back from the backend, not the request)."""
        return self.backend.provider

    @property
    def class_names(self) -> list[str]:
        return self.adapter.class_names

    @property
    def info(self) -> dict[str, Any]:
        info = self.backend.describe()
        info.update(
            source=self.source,
            adapter=self.adapter.name,
            input_size=list(self.input_size),
            num_classes=len(self.class_names),
            score_threshold=self.score_threshold,
            class_thresholds=self.thresholds.table(self.class_names),
            max_batch_source=self.backend.max_batch_source,
        )
        if self.verified is not None:
            info["verified"] = self.verified
        if self.artifact is not None:
            info["model"] = self.artifact.model
        return info

    def __repr__(self) -> str:
        return f"Detector({self.source!r}, backend={self.backend_name}, provider={self.provider!r})"


def _input_size(
    backend: Backend, artifact: ArtifactInfo | None, imgsz: tuple[int, int] | None, source: str
) -> tuple[int, int]:
    """The graph's fixed size, else the sidecar's, else the request's, else 640. A requested size
    that differs from a fixed or recorded one is refused, not ignored."""
    fixed = backend.input_size
    if fixed is None and artifact is not None:
        fixed = (artifact.input_height, artifact.input_width)
    if fixed is not None:
        if imgsz is not None and tuple(imgsz) != tuple(fixed):
            raise BackendError(
                f"{source}: the model takes {list(fixed)} (H, W), not the requested "
                f"{list(imgsz)}; leave imgsz out, or re-export at that size with dfine-export --imgsz"
            )
        return tuple(fixed)
    size = tuple(imgsz) if imgsz is not None else DEFAULT_IMGSZ
    if any(s % 32 for s in size):
        raise BackendError(f"imgsz {list(size)}: both sides must be multiples of 32")
    return size
