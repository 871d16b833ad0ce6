"""onnxruntime backend: CPU, CUDA and TensorRT execution providers.

onnxruntime silently falls back to the CPU when a GPU provider cannot load (missing CUDA
libraries, no GPU, the CPU-only wheel): the provider that really runs is read back from
`session.get_providers()` and reported, never taken from the request. An explicit request
(`device="cuda"` or provider "cuda"/"tensorrt") that did not take effect is an error.

Before the first CUDA or TensorRT session, `onnxruntime.preload_dlls()` (onnxruntime >= 1.21) loads
the CUDA and cuDNN libraries that the `gpu-cu12`/`gpu-cu13` extras install as nvidia-* wheels: the
CUDA provider does not look for them there by itself.

The TensorRT provider's library links `libnvinfer.so.10` and has no RUNPATH, and `preload_dlls` loads
no TensorRT: before a TensorRT-provider session `load_tensorrt_libraries` imports NVIDIA's
`tensorrt_libs` (the pip wheel's library package, which loads its libraries as NVIDIA's own
`tensorrt/__init__.py` has it do), then checks that the loader finds `libnvinfer.so.10` (apt's
TensorRT and JetPack's are on its path); else one line naming LD_LIBRARY_PATH.

The TensorRT provider keeps the engines it builds in `trt_cache/<graph hash>/` beside the graph:
onnxruntime names an engine after the graph's file name and structure, not its weights, so a graph
re-exported at the same path would otherwise run the old weights' engine.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import importlib
import io
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dfine_deploy.compat import zip_strict
from dfine_deploy.errors import BackendError
from dfine_deploy.files import cached_sha256, no_file
from dfine_deploy.runtime.backend import Backend

log = logging.getLogger(__name__)

TRT_CACHE_FOLDER = "trt_cache"  # beside the graph: the TensorRT provider's engines

# onnxruntime's CPU thread pools busy-wait for the next piece of work after each run: that shaves the
# wake-up of a benchmark's back-to-back runs, but a server whose frames arrive at camera rate pays a
# spinning core between them (one 10 fps stream: 91 % of a core spinning, 34 % without, for the same
# detections). dfine-serve turns it off; dfine-bench keeps onnxruntime's default.
SPINNING_OFF = {"session.intra_op.allow_spinning": "0", "session.inter_op.allow_spinning": "0"}

# what onnxruntime-gpu's TensorRT provider links (both CUDA builds; docs/install.md), and NVIDIA's pip
# package that carries it (github.com/NVIDIA/TensorRT python/packaging/libs_wheel/tensorrt_libs)
TRT_PROVIDER_NVINFER = "libnvinfer.so.10"
TENSORRT_LIBS_MODULE = "tensorrt_libs"

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "cuda": "CUDAExecutionProvider",
    "tensorrt": "TensorrtExecutionProvider",
}


def parse_device(device: str) -> tuple[str, int]:
    """'auto' | 'cpu' | 'cuda' | 'cuda:N' -> (kind, index)."""
    kind, _, index = device.partition(":")
    if kind not in ("auto", "cpu", "cuda") or (index and not index.isdigit()):
        raise BackendError(f"device={device!r}: expected 'auto', 'cpu', 'cuda' or 'cuda:N'")
    return kind, int(index or 0)


def engine_cache_dir(graph: Path) -> Path:
    """Where the TensorRT provider keeps the engines of `graph`: a folder per content hash."""
    return graph.parent / TRT_CACHE_FOLDER / cached_sha256(graph)[:16]


def provider_chain(
    provider: str | None,
    device: str,
    available: list[str],
    cache_dir: Path | None,
    *,
    trt_profile: Mapping[str, Sequence[Sequence[int]]] | None = None,
    trt_fp16_flag: bool = False,
) -> list:
    """The providers to ask for, best first, ending with the CPU.

    `cache_dir` (the TensorRT provider's engine cache, `engine_cache_dir`) is used by "tensorrt" only.
    The TensorRT provider gets the optimisation profile of every dynamic input (`trt_profile`:
    name -> min/opt/max shapes; without it TensorRT builds for the first shape it meets and
    rebuilds on every new batch size). `trt_fp16_flag` asks for a weakly typed FP16 build of an
    FP32 graph; it stays off for the typed FP16 graph, whose own types decide.
    """
    kind, index = parse_device(device)
    if provider is None:
        if kind == "cpu":
            provider = "cpu"
        elif kind == "cuda" or PROVIDERS["cuda"] in available:
            provider = "cuda"
        else:
            provider = "cpu"
    if provider not in PROVIDERS:
        raise BackendError(
            f"onnxruntime provider {provider!r} is unknown; expected one of {sorted(PROVIDERS)}"
        )
    chain: list = []
    if provider == "tensorrt":
        options: dict[str, object] = {
            "device_id": index,
            "trt_engine_cache_enable": True,
            "trt_engine_cache_path": str(cache_dir),
        }
        if trt_fp16_flag:
            options["trt_fp16_enable"] = True
        if trt_profile:
            for key, position in (("min", 0), ("opt", 1), ("max", 2)):
                options[f"trt_profile_{key}_shapes"] = ",".join(
                    f"{name}:{'x'.join(str(int(d)) for d in shapes[position])}"
                    for name, shapes in trt_profile.items()
                )
        chain.append((PROVIDERS["tensorrt"], options))
    if provider in ("tensorrt", "cuda"):
        chain.append((PROVIDERS["cuda"], {"device_id": index}))
    chain.append(PROVIDERS["cpu"])
    return chain


def load_tensorrt_libraries() -> None:
    """Make TensorRT's libraries loadable for onnxruntime's TensorRT provider, or say in one line how.

    NVIDIA's pip wheel keeps libnvinfer in the `tensorrt_libs` package, whose import loads them; the
    provider then finds TRT_PROVIDER_NVINFER by its soname. Without the wheel, apt's or JetPack's
    TensorRT must be on the loader's path."""
    with contextlib.suppress(ImportError):
        importlib.import_module(TENSORRT_LIBS_MODULE)
    try:
        ctypes.CDLL(TRT_PROVIDER_NVINFER)
    except OSError as exc:
        raise BackendError(
            f"onnxruntime's TensorRT provider needs {TRT_PROVIDER_NVINFER} (TensorRT 10), and neither "
            f"NVIDIA's pip wheel ({TENSORRT_LIBS_MODULE}: pip install -e '.[trt-cu12]', or 'tensorrt-cu13"
            f">=10.13,<11' with gpu-cu13) nor the loader's path has it ({exc}); install one, or add the "
            "folder holding it to LD_LIBRARY_PATH"
        ) from None


@functools.lru_cache(maxsize=None)
def preload_gpu_libraries(ort) -> None:
    """onnxruntime.preload_dlls(), once per process, where this onnxruntime has it (1.21+; the CPU
    build's returns at once). It reports a library it cannot load with print(): that goes to the log."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is None:
        return
    said = io.StringIO()
    try:
        with contextlib.redirect_stdout(said):
            preload()
    except Exception as exc:  # onnxruntime raises plain RuntimeError/OSError here
        said.write(f"{type(exc).__name__}: {exc}")
    if said.getvalue().strip():
        log.warning("onnxruntime.preload_dlls: %s", " ".join(said.getvalue().split()))


class OnnxRuntimeBackend(Backend):
    name = "onnxruntime"

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        device: str = "auto",
        provider: str | None = None,
        threads: int | None = None,
        default_max_batch: int = 32,
        max_batch_source: str = "",
        trt_profile: Mapping[str, Sequence[Sequence[int]]] | None = None,
        trt_fp16_flag: bool = False,
        spin_wait: bool = True,
    ):
        """`spin_wait=False` lets the CPU thread pools sleep between runs (`SPINNING_OFF`)."""
        import onnxruntime as ort

        path = Path(path)
        if not path.is_file():
            raise BackendError(f"{path}: {no_file(path)} (an ONNX graph was expected)")
        available = ort.get_available_providers()
        chain = provider_chain(
            provider,
            device,
            available,
            engine_cache_dir(path) if provider == "tensorrt" else None,
            trt_profile=trt_profile,
            trt_fp16_flag=trt_fp16_flag,
        )
        wanted = chain[0][0] if isinstance(chain[0], tuple) else chain[0]
        explicit = provider is not None or parse_device(device)[0] == "cuda"
        if explicit and wanted not in available:
            raise BackendError(
                f"onnxruntime provider {wanted} was requested but this onnxruntime "
                f"({ort.__version__}) offers only {available}; on a machine with an NVIDIA GPU install "
                "onnxruntime-gpu instead of onnxruntime: pip install -e '.[gpu-cu12]' for a CUDA 12 "
                "driver, '[gpu-cu13]' for CUDA 13 (nvidia-smi shows it)"
            )
        if wanted == PROVIDERS["tensorrt"]:
            load_tensorrt_libraries()
        if wanted != PROVIDERS["cpu"]:
            preload_gpu_libraries(ort)
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3  # errors only: fallbacks are reported by us
        if threads:
            options.intra_op_num_threads = threads
        if not spin_wait:
            for key, value in SPINNING_OFF.items():
                options.add_session_config_entry(key, value)
        self.spin_wait = spin_wait
        try:
            self.session = ort.InferenceSession(str(path), options, providers=chain)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            raise BackendError(f"{path}: onnxruntime cannot load this graph: {exc}") from exc
        active = self.session.get_providers()
        self.provider = active[0]
        if explicit and self.provider != wanted:
            built_for = getattr(ort, "cuda_version", "") or "an unknown CUDA"
            raise BackendError(
                f"{path}: {wanted} was requested but onnxruntime runs {self.provider} (the GPU provider "
                f"failed to load: onnxruntime-gpu {ort.__version__} is built for CUDA {built_for}; check "
                "that the driver runs that CUDA major (nvidia-smi) and the CUDA/cuDNN libraries "
                "(docs/install.md))"
            )
        if self.provider != wanted:
            log.info("onnxruntime: %s unavailable, running %s", wanted, self.provider)
        self.device = "cpu" if self.provider == PROVIDERS["cpu"] else f"cuda:{parse_device(device)[1]}"
        self.path = path
        inputs = self.session.get_inputs()
        self.input_names = tuple(i.name for i in inputs)
        self.output_names = tuple(o.name for o in self.session.get_outputs())
        image_shape = inputs[0].shape  # e.g. ['N', 3, 640, 640]
        if len(image_shape) == 4 and all(isinstance(d, int) for d in image_shape[2:]):
            self.input_size = (int(image_shape[2]), int(image_shape[3]))
        if image_shape and isinstance(image_shape[0], int):
            self.max_batch = int(image_shape[0])
            self.max_batch_source = f"{path.name} has a fixed batch dimension of {self.max_batch}"
        else:
            self.max_batch = default_max_batch
            self.max_batch_source = max_batch_source or "the default chunk size of the runtime"
        self._dtypes = {i.name: _numpy_dtype(i.type) for i in inputs}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        typed = {
            name: np.ascontiguousarray(feeds[name], dtype=self._dtypes[name]) for name in self.input_names
        }
        outputs = self.session.run(list(self.output_names), typed)
        return dict(zip_strict(self.output_names, outputs))

    def metadata(self) -> dict[str, str]:
        """Custom metadata stored in the graph (Ultralytics keeps class names there)."""
        return dict(self.session.get_modelmeta().custom_metadata_map)

    def describe(self) -> dict:
        info = super().describe()
        info["available_providers"] = self.session.get_providers()
        info["file"] = str(self.path)
        info["spin_wait"] = self.spin_wait
        return info


def _numpy_dtype(onnx_type: str) -> np.dtype:
    """'tensor(float)' -> float32 etc."""
    table = {
        "tensor(float)": np.float32,
        "tensor(float16)": np.float16,
        "tensor(double)": np.float64,
        "tensor(int64)": np.int64,
        "tensor(int32)": np.int32,
        "tensor(uint8)": np.uint8,
        "tensor(bool)": np.bool_,
    }
    return np.dtype(table.get(onnx_type, np.float32))
