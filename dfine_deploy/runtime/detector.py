"""`Detector`: one way to run a detector, whatever file it comes from and whatever runs it.

    det = Detector.open("runs/export/dfine-n")            # artifact folder from dfine-export
    det = Detector.open("model.onnx", backend="onnxruntime:cuda")
    det = Detector.open("model.engine")                    # TensorRT
    det = Detector.open("best.pth", backend="torch")       # checkpoint / .yml / size name
    det = Detector.open("yolo11n.onnx", adapter="yolo")    # a foreign ONNX detector
    results = det.predict([cv2.imread("a.jpg")])           # BGR frames (OpenCV's order)
    results = det.predict([read_image("a.jpg")], color="RGB")  # dfine_deploy.images: as trained

`backend` is "auto", "torch", "onnxruntime" (optionally ":cpu", ":cuda", ":tensorrt" to pick the
execution provider), "openvino" (CPU) or "tensorrt". An artifact's sidecar says which of its graphs
each backend runs (`backend_graphs`: the GridSample graph on the CPU, the gather graph on GPUs).
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
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy import cpu
from dfine_deploy.artifact import BF16_GATE_KEY, ArtifactInfo, read_artifact, verify_file
from dfine_deploy.errors import BackendError, DfineError
from dfine_deploy.model.reference import classify_model_ref, model_ref_forms
from dfine_deploy.runtime.adapters import ADAPTERS, Adapter, make_adapter
from dfine_deploy.runtime.backend import Backend
from dfine_deploy.runtime.classes import graph_class_names
from dfine_deploy.runtime.detections import Detections
from dfine_deploy.runtime.preprocess import check_frames

log = logging.getLogger(__name__)

BACKENDS = ("auto", "torch", "onnxruntime", "openvino", "tensorrt")
DEFAULT_IMGSZ = (640, 640)
PRECISIONS = ("auto", "fp32", "fp16", "int8", "bf16")
# the command-line help of every --backend and --precision option (dfine-bench, dfine-serve)
BACKEND_HELP = "auto, torch, onnxruntime[:cpu|:cuda|:tensorrt], openvino or tensorrt"
PRECISION_HELP = (
    "which graph of an artifact folder to run (int8: dfine-export --int8; bf16: OpenVINO on CPUs "
    "with BF16 units, when the export's bf16 gate passed); a single .onnx or .engine runs as it is"
)


def split_backend(backend: str) -> tuple[str, str | None]:
    """'onnxruntime:cuda' -> ('onnxruntime', 'cuda'); the provider part is onnxruntime's only."""
    name, _, provider = backend.partition(":")
    if name not in BACKENDS or (provider and name != "onnxruntime"):
        raise BackendError(
            f"backend {backend!r} is unknown; expected one of {list(BACKENDS)} "
            "(onnxruntime may name its provider: onnxruntime:cpu, onnxruntime:cuda, onnxruntime:tensorrt)"
        )
    return name, provider or None


def _gpu_wanted(device: str, provider: str | None) -> bool:
    if provider == "cpu" or device == "cpu":
        return False
    if provider in ("cuda", "tensorrt") or device.startswith("cuda"):
        return True
    if device == "auto":
        import onnxruntime as ort

        return "CUDAExecutionProvider" in ort.get_available_providers()
    return False


def _require_bf16_gate(artifact: ArtifactInfo | None, source: str, graph: str | None = None) -> None:
    """Refuse BF16 unless the export's "bf16:openvino" gate passed (on `graph`, when one is named):
    like an ungated INT8 graph."""
    gate = artifact.parity.get(BF16_GATE_KEY) if artifact else None
    if gate and gate.get("passed"):
        gated = artifact.graph_for("openvino", "bf16", source=source).file
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


def warn_about_cpu_fit(
    artifact: ArtifactInfo | None, graph: Path, backend: str, bf16: bool = False
) -> str | None:
    """INT8 and BF16 depend on the CPU's ISA class (`dfine_deploy/cpu.py`). Warn once per graph, backend
    and class, and return the warning, when the graph's gate ran on another class than this CPU's, or
    when INT8 ran slower than FP32 on `backend` at export on this class (INT8 is offered where faster)."""
    info = next((g for g in artifact.graphs.values() if g.file == graph.name), None) if artifact else None
    if info is not None and info.precision == "int8":
        what, gated, bits = "INT8", info.recipe.get("isa"), info.recipe.get("weight_bits", 8)
    elif bf16 and artifact is not None:
        what, gated, bits = "BF16", artifact.parity.get(BF16_GATE_KEY, {}).get("isa"), None
    else:
        return None
    here = cpu.isa_class()
    key = (str(graph), backend, here)
    if key in _CPU_FIT_WARNED:
        return None
    if gated != here:
        message = (
            f"{graph}: its {what} gate ran on a CPU of class {gated or 'unrecorded'}, this one is {here}; "
            "its accuracy was not checked on this class: `dfine-bench --data DIR` measures it here"
        )
        if bits == 8 and not cpu.has_vnni(here):
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


class Detector:
    """A backend plus the adapter of its model family; see the module docstring."""

    def __init__(
        self,
        backend: Backend,
        adapter: Adapter,
        *,
        input_size: tuple[int, int],
        score_threshold: float = 0.0,
        source: str = "",
        artifact: ArtifactInfo | None = None,
        class_names_note: str = "",
    ):
        self.backend = backend
        self.adapter = adapter
        self.input_size = input_size
        self.score_threshold = float(score_threshold)
        self.source = source
        self.artifact = artifact
        # how the class names were chosen when the model carries none ("" when it does)
        self.class_names_note = class_names_note

    # -- opening -------------------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        path: str | os.PathLike,
        backend: str = "auto",
        device: str = "auto",
        score_threshold: float = 0.0,
        *,
        adapter: str = "dfine",
        imgsz: tuple[int, int] | None = None,
        precision: str = "auto",
        threads: int | None = None,
        memory: str = "auto",
        names: str | os.PathLike | None = None,
        spin_wait: bool = True,
    ) -> Detector:
        """Open any model reference (`dfine_deploy.model.reference`): artifact folder, .onnx,
        .engine, or on torch a checkpoint, config or size name.

        `names`: a class-names file (dfine_deploy.runtime.classes.read_names_file) that overrides the
        names the model carries or the ones assumed from its class count; it must hold one name per
        class of the model. `spin_wait=False`: onnxruntime's CPU threads sleep between runs instead
        of busy-waiting (`onnxruntime_backend.SPINNING_OFF`; dfine-serve), other backends ignore it."""
        return cls._open_any(
            path,
            backend,
            device,
            score_threshold,
            adapter=adapter,
            imgsz=imgsz,
            precision=precision,
            threads=threads,
            memory=memory,
            names=names,
            spin_wait=spin_wait,
        )

    @classmethod
    def _open_any(
        cls, path, backend, device, score_threshold, *, adapter, imgsz, precision, threads, memory, names,
        spin_wait
    ) -> Detector:  # fmt: skip
        name, provider = split_backend(backend)
        ref = str(path)
        target = Path(path)
        if precision not in PRECISIONS:
            raise BackendError(f"precision={precision!r}: expected one of {list(PRECISIONS)}")
        if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
            raise BackendError(
                f"threads={threads!r}: expected a whole number >= 1 (or none: the backend's default)"
            )
        if precision == "bf16" and name != "openvino":
            raise BackendError(
                f"precision='bf16' with backend {backend!r}: BF16 runs on backend='openvino' only "
                "(on CPUs with BF16 units); elsewhere use fp32, fp16 or int8"
            )
        model_ref = classify_model_ref(ref)
        if model_ref.kind == "artifact":
            return cls._open_artifact(
                target, name, provider, device, score_threshold, imgsz, precision, threads, memory, names,
                spin_wait
            )  # fmt: skip
        # one file is one graph: only OpenVINO still chooses how to run it (its f32 or bf16 hint)
        if precision != "auto" and not (name == "openvino" and precision in ("fp32", "bf16")):
            raise BackendError(
                f"precision={precision!r} chooses a graph of an artifact folder, and {ref} is a single "
                "model that runs as it is: open the folder dfine-export wrote, or leave precision 'auto'"
            )
        if model_ref.kind == "unknown" or (model_ref.kind != "size" and not model_ref.exists):
            what = "not a model reference" if model_ref.exists else "not found"
            raise BackendError(f"{ref}: {what}. Expected {model_ref_forms()}")
        if model_ref.runs_on_torch:
            if name not in ("auto", "torch"):
                raise BackendError(
                    f"{ref} is a checkpoint/config/size name, which runs on the torch backend only; "
                    f"to use {name}, export it first: dfine-export {ref} -o DIR, then open DIR"
                )
            return cls._open_torch(ref, device, score_threshold, imgsz, None, names)
        sidecar_path = target.parent / "model.json"
        artifact = read_artifact(target.parent) if sidecar_path.is_file() else None
        if model_ref.kind == "onnx":
            if name not in ("auto", "onnxruntime", "openvino"):
                raise BackendError(
                    f"{ref} is an ONNX graph: open it with backend='onnxruntime', 'openvino' or 'auto'; "
                    "a TensorRT engine is built from it with dfine-export --trt"
                )
            if name == "openvino":
                if precision == "bf16":
                    _require_bf16_gate(artifact, ref, target.name)
                return cls._open_openvino(
                    target, device, score_threshold, imgsz, artifact, threads, adapter, precision, names
                )
            return cls._open_onnx(
                target, provider, device, score_threshold, imgsz, artifact, threads, adapter, names, spin_wait
            )
        if name not in ("auto", "tensorrt"):
            raise BackendError(f"{ref} is a TensorRT engine: open it with backend='tensorrt'")
        return cls._open_engine(target, device, score_threshold, artifact, memory, names)

    @classmethod
    def _open_artifact(
        cls, folder, name, provider, device, threshold, imgsz, precision, threads, memory, names, spin_wait
    ):
        artifact = read_artifact(folder)
        engine = folder / artifact.engine.file if artifact.engine else None
        if name == "torch":
            checkpoint = artifact.checkpoint.get("path")
            if not checkpoint or not Path(checkpoint).is_file():
                raise BackendError(
                    f"{folder}: the torch backend needs the checkpoint this artifact was exported "
                    f"from, and model.json names {checkpoint!r}, which is not there; open the .pth directly"
                )
            return cls._open_torch(checkpoint, device, threshold, imgsz, artifact, names)
        if name == "tensorrt" or (
            name == "auto" and engine is not None and engine.is_file() and device != "cpu"
        ):
            if engine is None or not engine.is_file():
                raise BackendError(
                    f"{folder}: no TensorRT engine in this artifact; build one on the target with "
                    "`dfine-export ... --trt`, or use backend='onnxruntime'"
                )
            try:
                return cls._open_engine(engine, device, threshold, artifact, memory, names)
            except (DfineError, ImportError, OSError) as exc:
                if name == "tensorrt":
                    raise
                log.info("TensorRT engine not usable here (%s); using onnxruntime", exc)
        if name == "openvino":
            precision = "fp32" if precision == "auto" else precision
            if precision == "bf16":
                _require_bf16_gate(artifact, str(folder))
            graph = folder / artifact.graph_for("openvino", precision, source=str(folder)).file
            return cls._open_openvino(
                graph, device, threshold, imgsz, artifact, threads, "dfine", precision, names
            )
        gpu = _gpu_wanted(device, provider)
        if precision == "auto":
            precision = "fp16" if "fp16" in artifact.graphs and gpu else "fp32"
        target_name = "onnxruntime:" + (provider or ("cuda" if gpu else "cpu"))
        graph = folder / artifact.graph_for(target_name, precision, source=str(folder)).file
        return cls._open_onnx(
            graph, provider, device, threshold, imgsz, artifact, threads, "dfine", names, spin_wait
        )

    @classmethod
    def _open_onnx(
        cls, graph, provider, device, threshold, imgsz, artifact, threads, adapter_name, names, spin_wait
    ):
        from dfine_deploy.runtime.onnxruntime_backend import OnnxRuntimeBackend

        if artifact:
            verify_file(graph.parent, artifact, graph.name)
            if not _gpu_wanted(device, provider):
                warn_about_cpu_fit(artifact, graph, "onnxruntime")
        source = "model.json batch_max (the batch range dfine-export verified)" if artifact else ""
        trt_profile = None
        if artifact and provider == "tensorrt":
            from dfine_deploy.export.tensorrt_plan import artifact_profile

            batch = (artifact.batch_min, artifact.batch_opt, artifact.batch_max)
            trt_profile = artifact_profile(batch, artifact.input_height, artifact.input_width)
        backend = OnnxRuntimeBackend(
            graph,
            device=device,
            provider=provider,
            threads=threads,
            default_max_batch=artifact.batch_max if artifact else 32,
            max_batch_source=source,
            trt_profile=trt_profile,
            spin_wait=spin_wait,
        )
        chosen = graph_class_names(graph, artifact, backend.metadata(), names)
        adapter = make_adapter(adapter_name, chosen.names)
        adapter.check(backend.input_names, backend.output_names, str(graph))
        size = _input_size(backend, artifact, imgsz, str(graph))
        return cls(
            backend,
            adapter,
            input_size=size,
            score_threshold=threshold,
            source=str(graph),
            artifact=artifact,
            class_names_note=chosen.note,
        )

    @classmethod
    def _open_openvino(
        cls, graph, device, threshold, imgsz, artifact, threads, adapter_name, precision, names
    ):
        from dfine_deploy.runtime.openvino_backend import OpenVinoBackend

        if artifact:
            verify_file(graph.parent, artifact, graph.name)
        source = "model.json batch_max (the batch range dfine-export verified)" if artifact else ""
        warn_about_cpu_fit(artifact, graph, "openvino", bf16=precision == "bf16")
        adapter_class = ADAPTERS.get(adapter_name)
        backend = OpenVinoBackend(
            graph,
            device=device,
            threads=threads,
            default_max_batch=artifact.batch_max if artifact else 32,
            max_batch_source=source,
            precision="bf16" if precision == "bf16" else "fp32",  # an INT8 graph runs under the f32 hint
            # the image conversion runs inside OpenVINO
            raw_pixels_input=adapter_class.raw_pixels_input if adapter_class else None,
        )
        chosen = graph_class_names(graph, artifact, backend.metadata(), names)
        adapter = make_adapter(adapter_name, chosen.names)
        adapter.check(backend.input_names, backend.output_names, str(graph))
        size = _input_size(backend, artifact, imgsz, str(graph))
        return cls(
            backend,
            adapter,
            input_size=size,
            score_threshold=threshold,
            source=str(graph),
            artifact=artifact,
            class_names_note=chosen.note,
        )

    @classmethod
    def _open_engine(cls, engine, device, threshold, artifact, memory, names):
        from dfine_deploy.runtime.tensorrt_backend import TensorRTBackend

        built_with = None
        if artifact:
            verify_file(engine.parent, artifact, engine.name)
        if artifact and artifact.engine:
            built_with = {
                "tensorrt_version": artifact.engine.tensorrt_version,
                "gpu_name": artifact.engine.gpu_name,
            }
        backend = TensorRTBackend(engine, device=device, memory=memory, built_with=built_with)
        chosen = graph_class_names(engine, artifact, {}, names)
        adapter = make_adapter("dfine", chosen.names)
        adapter.check(backend.input_names, backend.output_names, str(engine))
        size = _input_size(backend, artifact, None, str(engine))
        return cls(
            backend,
            adapter,
            input_size=size,
            score_threshold=threshold,
            source=str(engine),
            artifact=artifact,
            class_names_note=chosen.note,
        )

    @classmethod
    def _open_torch(cls, ref, device, threshold, imgsz, artifact, names):
        from dfine_deploy.runtime.torch_backend import TorchBackend

        if artifact is not None and imgsz is None:
            imgsz = (artifact.input_height, artifact.input_width)
        backend = TorchBackend(ref, device=device, imgsz=imgsz, names=names)
        adapter = make_adapter("dfine", backend.loaded.class_names)
        return cls(
            backend,
            adapter,
            input_size=backend.input_size,
            score_threshold=threshold,
            source=ref,
            artifact=artifact,
            class_names_note=backend.loaded.class_names_note,
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
        return results

    def prepare(self, frames: Sequence[np.ndarray], color: str = "BGR") -> tuple[dict[str, np.ndarray], Any]:
        """The backend's feeds for at most `max_batch` frames, and what the adapter's decode needs."""
        return self.adapter.prepare(frames, self.input_size, color, raw_pixels=self.backend.raw_pixels)

    def close(self) -> None:
        self.backend.close()

    def __enter__(self) -> Detector:
        return self

    def __exit__(self, *exc) -> None:
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
            max_batch_source=self.backend.max_batch_source,
        )
        if self.artifact is not None:
            info["model"] = self.artifact.model
        return info

    def __repr__(self) -> str:
        return f"Detector({self.source!r}, backend={self.backend_name}, provider={self.provider!r})"


def _input_size(backend: Backend, artifact: ArtifactInfo | None, imgsz, source: str) -> tuple[int, int]:
    """The graph's fixed size wins; then the sidecar; then the request; then 640."""
    if backend.input_size is not None:
        if imgsz is not None and tuple(imgsz) != tuple(backend.input_size):
            raise BackendError(
                f"{source}: the graph takes {list(backend.input_size)} (H, W), not the requested "
                f"{list(imgsz)}; re-export at that size with dfine-export --imgsz"
            )
        return tuple(backend.input_size)
    if artifact is not None:
        return (artifact.input_height, artifact.input_width)
    size = tuple(imgsz) if imgsz is not None else DEFAULT_IMGSZ
    if any(s % 32 for s in size):
        raise BackendError(f"imgsz {list(size)}: both sides must be multiples of 32")
    return size
