"""The backend table: one row per inference backend, read by `Detector.open`, the `--backend` option
of dfine-bench and dfine-serve (its help), dfine-bench's install check and export, the precision
rules, verify.json's device facts and each backend module's missing-library message.

A row says which module and class run the backend, which model files it opens, where it runs, which
precisions it applies itself, and how to install it; its `build` maps one `OpenRequest` onto the
class's constructor (the only per-backend code `Detector.open` has). docs/ARCHITECTURE.md, "Adding a
backend", is the recipe for a new row.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dfine_deploy.artifact import ArtifactInfo
from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.cores import pool_threads
from dfine_deploy.errors import BackendError
from dfine_deploy.model.reference import TORCH_KINDS
from dfine_deploy.runtime.adapters import ADAPTERS
from dfine_deploy.runtime.backend import Backend
from dfine_deploy.runtime.onnxruntime_backend import PROVIDERS as ONNXRUNTIME_PROVIDERS
from dfine_deploy.runtime.tensorrt_plan import artifact_profile


@dataclass(frozen=True)
class OpenRequest:
    """What `Detector.open` was asked for, checked once (`Detector.open` documents each field)."""

    backend: BackendName
    provider: str | None  # onnxruntime's execution provider: "cpu", "cuda", "tensorrt" or none
    device: str
    adapter: str
    imgsz: tuple[int, int] | None
    precision: Precision
    threads: int | None  # CPU threads asked for; None: the default (`dfine_deploy.cores.pool_threads`)
    memory: str
    names: str | os.PathLike | None
    spin_wait: bool  # onnxruntime's CPU threads busy-wait between runs (False: they sleep)
    unverified: bool = False  # serve a `needs_verify` engine without a passing dfine-verify result here
    class_thresholds: dict[str, float] = field(default_factory=dict)  # yours, by class name


@dataclass(frozen=True)
class BackendInfo:
    """One backend: everything outside its own module needs to know about it."""

    name: BackendName
    label: str  # what reports call its format
    module: str  # the module that holds `class_name`, imported only when the backend is opened
    class_name: str
    opens: tuple[str, ...]  # the model reference kinds it runs (`dfine_deploy.model.reference`)
    devices: tuple[str, ...]  # "cpu", "cuda"
    # precisions it applies to any graph at run time (OpenVINO's inference precision hint); the
    # precision of an artifact's graph is chosen from the artifact's own graphs
    run_precisions: tuple[Precision, ...]
    extra: str  # the pip extra of dfine-deploy that installs it ("" when the base install has it)
    install_hint: str
    requires: str  # the third-party module it imports
    # builds the backend from its class, the file (or checkpoint reference) to open, the request and
    # the artifact the file belongs to (None for a bare file)
    build: Callable[[type, Path | str, OpenRequest, ArtifactInfo | None], Backend]
    providers: tuple[str, ...] = ()  # the ':provider' suffixes `--backend` may add
    # the function of `module` that imports `requires` and refuses look-alikes, for a library whose
    # native parts load at import (finding the module is not enough); None: finding it is enough
    loader: str | None = None
    # an engine built on the device: served only with a passing dfine-verify result for its bytes on
    # this device (runtime/verify_record.py), unless the caller says it serves it unverified
    needs_verify: bool = False
    # it runs on CPU threads that `threads` sets (torch, onnxruntime, OpenVINO); a GPU or NPU runtime
    # refuses a thread count instead of ignoring it
    takes_threads: bool = False
    # a dfine-verify result holds for this version of `requires` only: the library computes the outputs
    # (runtime/verify_record.py records it beside the device)
    verify_version: bool = False
    # the precisions an artifact folder opens at when none is asked, by where it runs ("cpu", "cuda"),
    # in order of preference: the first one the folder has a graph of for this backend
    folder_precisions: Mapping[str, tuple[Precision, ...]] = field(
        default_factory=lambda: {"cpu": (Precision.FP32,), "cuda": (Precision.FP32,)}
    )

    def load_class(self) -> type[Backend]:
        return getattr(importlib.import_module(self.module), self.class_name)

    def open(self, path: Path | str, request: OpenRequest, artifact: ArtifactInfo | None) -> Backend:
        if request.threads is not None and not self.takes_threads:
            raise BackendError(
                f"--threads {request.threads}: backend {self.name} runs on its device and sets no CPU "
                "threads; leave --threads out (it would be ignored)"
            )
        if self.takes_threads and request.threads is None:
            request = dataclasses.replace(request, threads=pool_threads())
        return self.build(self.load_class(), path, request, artifact)

    def route(self, provider: str | None, gpu: bool) -> str:
        """How `model.json` (`backend_graphs`, `thresholds`) names it: with its provider where it has
        some, the device's when none is asked ("onnxruntime:cuda")."""
        if not self.providers:
            return self.name
        return f"{self.name}:{provider or ('cuda' if gpu else 'cpu')}"

    @property
    def spelled(self) -> str:
        """How `--backend` names it, with its provider suffixes."""
        return self.name + (f"[:{'|:'.join(self.providers)}]" if self.providers else "")

    def install_problem(self) -> str | None:
        """Why the backend cannot load here (None when it can)."""
        try:
            if self.loader is not None:
                getattr(importlib.import_module(self.module), self.loader)(f"--backend {self.name}")
            elif importlib.util.find_spec(self.requires) is None:
                raise ImportError(self.requires)
        except Exception as exc:  # a broken native library raises anything from OSError up
            return f"{self.requires} is not installed or does not load here ({exc})"
        return None


def _batch_limits(artifact: ArtifactInfo | None) -> dict[str, Any]:
    """A graph's batch limit: the range dfine-export verified, else 32 for a bare graph."""
    if artifact is None:
        return {"default_max_batch": 32, "max_batch_source": ""}
    return {
        "default_max_batch": artifact.batch_max,
        "max_batch_source": "model.json batch_max (the batch range dfine-export verified)",
    }


def _build_onnxruntime(
    cls: type, path: Path | str, request: OpenRequest, artifact: ArtifactInfo | None
) -> Backend:
    trt_profile = None
    if artifact and request.provider == "tensorrt":
        batch = (artifact.batch_min, artifact.batch_opt, artifact.batch_max)
        trt_profile = artifact_profile(batch, artifact.input_height, artifact.input_width)
    return cls(
        path,
        device=request.device,
        provider=request.provider,
        threads=request.threads,
        trt_profile=trt_profile,
        spin_wait=request.spin_wait,
        **_batch_limits(artifact),
    )


def _build_openvino(
    cls: type, path: Path | str, request: OpenRequest, artifact: ArtifactInfo | None
) -> Backend:
    adapter_class = ADAPTERS.get(request.adapter)
    return cls(
        path,
        device=request.device,
        threads=request.threads,
        # an INT8 graph runs under the f32 hint
        precision=Precision.BF16 if request.precision == Precision.BF16 else Precision.FP32,
        # the image conversion runs inside OpenVINO
        raw_pixels_input=adapter_class.raw_pixels_input if adapter_class else None,
        **_batch_limits(artifact),
    )


def _build_tensorrt(
    cls: type, path: Path | str, request: OpenRequest, artifact: ArtifactInfo | None
) -> Backend:
    built_with = None
    record = artifact.engine_named(Path(path).name) if artifact else None  # this file's own record
    if record is not None:
        built_with = {
            "tensorrt_version": record.tensorrt_version,
            "gpu_name": record.gpu_name,
            "precision": record.precision,
            "strongly_typed": record.builder.get("strongly_typed"),
        }
    return cls(path, device=request.device, memory=request.memory, built_with=built_with)


def _build_rknn(cls: type, path: Path | str, request: OpenRequest, artifact: ArtifactInfo | None) -> Backend:
    """On a PC the simulator rebuilds an FP16 file from its source graph with the settings model.json
    recorded (`rknn_backend`'s docstring says why); a board loads the file itself."""
    name = Path(path).name
    graph = artifact.graph_named(name) if artifact else None
    if graph is None or graph.precision != Precision.FP16:
        return cls(path)
    if "build" not in graph.recipe:  # an ONNX graph of the folder, not a file rknn-toolkit2 built
        raise BackendError(
            f"{path}: backend rknn runs the model.rknn of an artifact exported for a Rockchip chip, and "
            f"{name} is not one; export with dfine-export MODEL --target rk3588 (or your chip), or pick "
            "another --backend"
        )
    return cls(
        path, settings=graph.recipe["build"], source_graph=Path(path).parent / graph.recipe["source_graph"]
    )


def _build_replay(
    cls: type, path: Path | str, request: OpenRequest, artifact: ArtifactInfo | None
) -> Backend:
    return cls(path)


def _build_torch(cls: type, ref: Path | str, request: OpenRequest, artifact: ArtifactInfo | None) -> Backend:
    imgsz = request.imgsz
    if artifact is not None and imgsz is None:
        imgsz = (artifact.input_height, artifact.input_width)
    return cls(str(ref), device=request.device, imgsz=imgsz, names=request.names, threads=request.threads)


# the order is the order of the help text; for a single file, `backend="auto"` picks the first row
# that opens its kind
BACKENDS: tuple[BackendInfo, ...] = (
    BackendInfo(
        name=BackendName.TORCH,
        takes_threads=True,
        label="PyTorch",
        module="dfine_deploy.runtime.torch_backend",
        class_name="TorchBackend",
        opens=TORCH_KINDS,
        devices=("cpu", "cuda"),
        run_precisions=(),
        extra="train",
        install_hint="pip install -e '.[train]' (torch and torchvision, see the Makefile)",
        requires="torch",
        verify_version=True,
        build=_build_torch,
    ),
    BackendInfo(
        name=BackendName.ONNXRUNTIME,
        takes_threads=True,
        label="ONNX",
        module="dfine_deploy.runtime.onnxruntime_backend",
        class_name="OnnxRuntimeBackend",
        opens=("onnx",),
        devices=("cpu", "cuda"),
        run_precisions=(),
        extra="cpu",  # or gpu-cu12 / gpu-cu13 (onnxruntime-gpu of the driver's CUDA major), never both
        install_hint="pip install -e '.[cpu]', or on an x86 NVIDIA GPU host '[gpu-cu12]' / "
        "'[gpu-cu13]' for a CUDA 12 / 13 driver (nvidia-smi shows it; docs/install.md)",
        requires="onnxruntime",
        verify_version=True,
        build=_build_onnxruntime,
        providers=tuple(ONNXRUNTIME_PROVIDERS),
        folder_precisions={"cpu": (Precision.FP32,), "cuda": (Precision.FP16, Precision.FP32)},
    ),
    BackendInfo(
        name=BackendName.OPENVINO,
        takes_threads=True,
        label="OpenVINO",
        module="dfine_deploy.runtime.openvino_backend",
        class_name="OpenVinoBackend",
        opens=("onnx",),
        devices=("cpu",),
        run_precisions=(Precision.FP32, Precision.BF16),
        extra="cpu",
        install_hint="pip install -e '.[cpu]' (OpenVINO, x86 or ARM CPUs)",
        requires="openvino",
        verify_version=True,
        build=_build_openvino,
    ),
    BackendInfo(
        name=BackendName.TENSORRT,
        label="TensorRT",
        module="dfine_deploy.runtime.tensorrt_backend",
        class_name="TensorRTBackend",
        opens=("engine",),
        devices=("cuda",),
        run_precisions=(),
        extra="trt-cu12",
        install_hint="pip install -e '.[trt-cu12]' (or [trt-cu13]) on a machine with an NVIDIA GPU "
        "(on a Jetson it comes with JetPack: python3-libnvinfer)",
        requires="tensorrt",
        verify_version=True,
        build=_build_tensorrt,
        loader="load_tensorrt",
        needs_verify=True,
    ),
    BackendInfo(
        name=BackendName.RKNN,
        label="RKNN",
        module="dfine_deploy.runtime.rknn_backend",
        class_name="RknnBackend",
        opens=("rknn",),
        devices=("cpu",),  # the NPU of a Rockchip SoC, fed from host memory; the PC simulator runs on the CPU
        run_precisions=(),
        extra="",  # not from pip extras: rknn-toolkit-lite2 on the board, rknn-toolkit2's venv on a PC
        install_hint="on a Rockchip board: pip install rknn-toolkit-lite2; on a PC, the simulator: "
        "make rknn-venv, then run from .venv-rknn (docs/export.md: Rockchip NPUs)",
        requires="rknnlite or rknn",
        build=_build_rknn,
        loader="load_rknn",
        folder_precisions={"cpu": (Precision.FP16,)},  # model.rknn
    ),
    BackendInfo(
        name=BackendName.REPLAY,
        label="Replay",
        module="dfine_deploy.runtime.replay_backend",
        class_name="ReplayBackend",
        opens=("replay",),
        devices=("cpu",),
        run_precisions=(),
        extra="",
        install_hint="nothing to install: it serves recorded outputs with numpy",
        requires="numpy",
        build=_build_replay,
        needs_verify=True,
    ),
)
BY_NAME: dict[str, BackendInfo] = {row.name: row for row in BACKENDS}

BACKEND_CHOICES = (BackendName.AUTO, *BY_NAME)
# the command-line help of every --backend option (dfine-bench, dfine-serve)
BACKEND_HELP = (
    ", ".join([BackendName.AUTO, *(r.spelled for r in BACKENDS[:-1])]) + f" or {BACKENDS[-1].spelled}"
)
# ... and of every --precision option
PRECISION_HELP = (
    "which graph of an artifact folder to run (int8: dfine-export --int8; bf16: OpenVINO on CPUs "
    "with BF16 units, when the export's bf16 gate passed); a single .onnx or .engine runs as it is"
)


def split_backend(backend: str) -> tuple[BackendName, str | None]:
    """'onnxruntime:cuda' -> (ONNXRUNTIME, 'cuda'); only a row with providers takes the suffix (the
    backend itself checks the provider's name)."""
    name, _, provider = str(backend).partition(":")
    row = BY_NAME.get(name)
    if (row is None and name != BackendName.AUTO) or (provider and not (row and row.providers)):
        with_providers = ", ".join(f"{r.name}:{p}" for r in BACKENDS for p in r.providers)
        raise BackendError(
            f"backend {backend!r} is unknown; expected one of {[str(b) for b in BACKEND_CHOICES]} "
            f"(onnxruntime may name its provider: {with_providers})"
        )
    return BackendName(name), provider or None


def openers(kind: str) -> list[BackendInfo]:
    """The rows that open a model reference of `kind`, the one `backend="auto"` picks first."""
    return [row for row in BACKENDS if kind in row.opens]


def run_precision_backends(precision: Precision) -> list[BackendName]:
    """The backends that apply `precision` themselves at run time (BF16: OpenVINO only)."""
    return [row.name for row in BACKENDS if precision in row.run_precisions]
