"""TensorRT engine backend, on the named-tensor API of TensorRT 10 and 11 (8.5+ has it too).

One run: check the batch against the engine's optimisation profile -> `set_input_shape` for every
input -> copy inputs into pinned host buffers and upload on our CUDA stream -> `set_tensor_address`
for every input and output -> `execute_async_v3(stream)` -> download outputs -> synchronise.
Tensors are looked up by name, never by binding position (the output order of an engine is not
guaranteed). Device memory comes from `cuda_memory` (torch or cuda-python; never pycuda).
"""

from __future__ import annotations

import importlib
import os
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

import numpy as np

from dfine_deploy.backend_names import BackendName
from dfine_deploy.compat import zip_strict
from dfine_deploy.errors import BackendError, MissingDependency
from dfine_deploy.files import no_file
from dfine_deploy.runtime.backend import Backend
from dfine_deploy.runtime.backends import BY_NAME
from dfine_deploy.runtime.cuda_memory import Buffer, CudaMemory, open_memory
from dfine_deploy.runtime.onnxruntime_backend import parse_device
from dfine_deploy.runtime.tensorrt_plan import install_hint

# TensorRT DataType name -> numpy dtype. BF16 and the FP8/INT4/FP4 types have no numpy equivalent
# of the same size, so an engine with such an I/O tensor is refused rather than sized wrong.
DTYPES = {
    "FLOAT": np.float32,
    "HALF": np.float16,
    "INT8": np.int8,
    "UINT8": np.uint8,
    "INT32": np.int32,
    "INT64": np.int64,
    "BOOL": np.bool_,
}


def numpy_dtype(trt_dtype: Any) -> np.dtype:
    name = getattr(trt_dtype, "name", str(trt_dtype).rsplit(".", 1)[-1])
    if name not in DTYPES:
        raise BackendError(
            f"engine tensor type {name} has no numpy equivalent of the same size; D-FINE engines have "
            f"{sorted(DTYPES)} I/O only: rebuild the engine from our model.onnx / model.fp16.onnx"
        )
    return np.dtype(DTYPES[name])


def load_tensorrt(purpose: str, version: str | None = None) -> ModuleType:
    """Import NVIDIA's `tensorrt`, refusing look-alikes; `version`: the TensorRT an engine needs.

    A `tensorrt` folder holding only type stubs (the `tensorrt-stubs` package) imports as an empty
    namespace package; the pip `tensorrt` front end without its libraries fails on import.
    """
    row = BY_NAME[BackendName.TENSORRT]
    try:
        module = importlib.import_module(row.requires)
    except ImportError as exc:
        raise MissingDependency(row.requires, row.extra, purpose, install_hint(version)) from exc
    if not hasattr(module, "Builder") or not hasattr(module, "__version__"):
        where = ", ".join(getattr(module, "__path__", [])) or str(getattr(module, "__file__", "?"))
        raise MissingDependency(
            row.requires,
            row.extra,
            f"{purpose} (the `tensorrt` at {where} has no bindings: type stubs only?)",
            install_hint(version),
        )
    return module


class TensorRTBackend(Backend):
    name = "tensorrt"

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        device: str = "auto",
        memory: str = "auto",
        built_with: dict[str, Any] | None = None,
    ):
        built = (built_with or {}).get("tensorrt_version")
        trt = load_tensorrt(
            f"{Path(path).name} (built with TensorRT {built})" if built else "The TensorRT backend", built
        )
        path = Path(path)
        if not path.is_file():
            raise BackendError(f"{path}: {no_file(path)} (an engine was expected)")
        kind, index = parse_device(device)
        if kind == "cpu":
            raise BackendError("the TensorRT backend runs on a GPU only; use device='cuda' or 'auto'")
        self._trt = trt
        self._memory: CudaMemory = open_memory(index, prefer=memory)
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self.engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            where = ""
            if built_with:
                where = (
                    f" It was built with TensorRT {built_with.get('tensorrt_version')} on "
                    f"{built_with.get('gpu_name')}."
                )
            other = (
                f", or install the TensorRT that built it ({install_hint(built)})"
                if built and str(built).split(".")[:3] != str(trt.__version__).split(".")[:3]
                else ""
            )
            raise BackendError(
                f"{path}: TensorRT {trt.__version__} cannot load this engine.{where} Engines only "
                "run on the TensorRT version and GPU they were built for: rebuild it on this "
                f"machine with `dfine-export ... --trt` (or export/jetson/build_engine.sh){other}"
            )
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        is_input = {n: self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT for n in names}
        self.input_names = tuple(n for n in names if is_input[n])
        self.output_names = tuple(n for n in names if not is_input[n])
        self._dtypes = {n: numpy_dtype(self.engine.get_tensor_dtype(n)) for n in names}
        # input name -> (min, opt, max) shapes of profile 0
        self.profile = {
            n: tuple(tuple(int(d) for d in s) for s in self.engine.get_tensor_profile_shape(n, 0))
            for n in self.input_names
        }
        self.max_batch = min(shapes[2][0] for shapes in self.profile.values())
        self.max_batch_source = f"{path.name}'s optimisation profile (batch max {self.max_batch})"
        first = self.profile[self.input_names[0]][2]
        if len(first) == 4:
            self.input_size = (first[2], first[3])
        self._buffers: dict[str, Buffer] = {}
        self.path = path
        self.device = f"cuda:{index}"
        self.provider = f"TensorRT {trt.__version__} ({self._memory.kind} buffers)"
        self.declared_precision = str((built_with or {}).get("precision", ""))
        typed = (built_with or {}).get("strongly_typed")
        self.strongly_typed = typed if isinstance(typed, bool) else None

    def engine_inspector(self) -> str | None:
        """Per-layer types: detailed only in an engine built with ProfilingVerbosity.DETAILED (ours and
        build_engine.sh's are); otherwise names only, which `inspector_precisions` reports."""
        inspector = self.engine.create_engine_inspector()
        return str(inspector.get_engine_information(self._trt.LayerInformationFormat.JSON))

    def _buffer(self, name: str, nbytes: int) -> Buffer:
        buffer = self._buffers.get(name)
        if buffer is None or buffer.nbytes < nbytes:
            if buffer is not None:
                self._memory.release(buffer)
            buffer = self._buffers[name] = self._memory.allocate(max(nbytes, 1))
        return buffer

    def check_shapes(self, feeds: dict[str, np.ndarray]) -> None:
        """Refuse shapes outside the optimisation profile with a message that says what to do."""
        for name, (low, _, high) in self.profile.items():
            if name not in feeds:
                raise BackendError(
                    f"{self.path.name}: input {name!r} missing; the engine needs {list(self.profile)}"
                )
            shape = tuple(feeds[name].shape)
            if len(shape) != len(low) or any(not lo <= d <= hi for d, lo, hi in zip_strict(shape, low, high)):
                raise BackendError(
                    f"{self.path.name}: input {name!r} has shape {list(shape)}, outside the engine's "
                    f"optimisation profile min {list(low)} .. max {list(high)}; use a batch of at most "
                    f"{high[0]}, or rebuild the engine with a larger --batch MIN OPT MAX"
                )

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.check_shapes(feeds)
        for name in self.input_names:
            array = np.ascontiguousarray(feeds[name], dtype=self._dtypes[name])
            if not self.context.set_input_shape(name, array.shape):
                raise BackendError(f"TensorRT refused shape {list(array.shape)} for input {name!r}")
            buffer = self._buffer(name, array.nbytes)
            np.copyto(buffer.host_view(array.shape, array.dtype), array)
            self._memory.upload(buffer, array.nbytes)
        shapes = {}
        for name in self.output_names:
            shapes[name] = tuple(int(d) for d in self.context.get_tensor_shape(name))
            nbytes = int(np.prod(shapes[name])) * self._dtypes[name].itemsize
            self._buffer(name, nbytes)
        for name, buffer in self._buffers.items():  # a buffer that grew has a new address
            self.context.set_tensor_address(name, buffer.device_ptr)
        if not self.context.execute_async_v3(self._memory.stream_handle):
            raise BackendError(f"{self.path.name}: TensorRT execution failed (see the log above)")
        for name in self.output_names:
            nbytes = int(np.prod(shapes[name])) * self._dtypes[name].itemsize
            self._memory.download(self._buffers[name], nbytes)
        self._memory.synchronize()
        return {
            name: self._buffers[name].host_view(shapes[name], self._dtypes[name]).copy()
            for name in self.output_names
        }

    def engine_only(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        """`execute_async_v3` and the stream's wait alone, on inputs `run` has put on the device."""
        self.run(feeds)  # uploads the inputs, sizes the outputs and sets every tensor's address

        def execute() -> None:
            if not self.context.execute_async_v3(self._memory.stream_handle):
                raise BackendError(f"{self.path.name}: TensorRT execution failed (see the log above)")
            self._memory.synchronize()

        return execute

    def close(self) -> None:
        for buffer in self._buffers.values():
            self._memory.release(buffer)
        self._buffers.clear()
        self._memory.close()

    def describe(self) -> dict:
        info = super().describe()
        info["profile"] = {n: [list(s) for s in shapes] for n, shapes in self.profile.items()}
        info["memory"] = self._memory.kind
        return info
