"""Device and pinned host memory for the TensorRT backend, from torch or from cuda-python.

Both implementations use the CUDA runtime's primary context, so they share the GPU with torch,
video decoders and onnxruntime without the context clashes that pycuda's own context causes
(which is why pycuda is never used here). torch is preferred when it sees a CUDA GPU (it is
already loaded in training and benchmark processes); the lean Jetson/server image without
torch, or with a torch built without CUDA, uses cuda-python (`cuda.bindings.runtime`, or the older
`cuda.cudart` module).

Each binding of an engine gets one `Buffer`: a pinned host array plus a device allocation of
the same size, grown when a larger batch arrives and reused otherwise.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dfine_deploy.errors import BackendError, MissingDependency


@dataclass
class Buffer:
    host: np.ndarray  # uint8 [nbytes], pinned
    device_ptr: int
    nbytes: int
    owners: tuple[Any, ...] = field(default=(), repr=False)  # what keeps the memory alive

    def host_view(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.host[:nbytes].view(dtype).reshape(shape)


class CudaMemory(ABC):
    """Allocation, copies and one stream on one GPU."""

    kind: str = ""

    @property
    @abstractmethod
    def stream_handle(self) -> int:
        """The raw cudaStream_t, as `execute_async_v3` wants it."""

    @abstractmethod
    def allocate(self, nbytes: int) -> Buffer: ...

    @abstractmethod
    def upload(self, buffer: Buffer, nbytes: int) -> None:
        """Asynchronous host -> device copy on the stream."""

    @abstractmethod
    def download(self, buffer: Buffer, nbytes: int) -> None:
        """Asynchronous device -> host copy on the stream."""

    @abstractmethod
    def synchronize(self) -> None: ...

    def release(self, buffer: Buffer) -> None:  # noqa: B027 - optional: torch frees with the owners
        """Free a buffer now (torch frees when the owners are dropped)."""

    def close(self) -> None:  # noqa: B027 - optional: nothing to free for torch
        """Free the stream."""


class TorchMemory(CudaMemory):
    kind = "torch"

    def __init__(self, device_index: int):
        import torch

        if not torch.cuda.is_available():
            raise BackendError(
                "the TensorRT backend needs a CUDA GPU, and torch sees none "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda or 'no'})"
            )
        count = torch.cuda.device_count()
        if device_index >= count:
            raise BackendError(f"cuda:{device_index} asked for, but torch sees {count} GPU(s)")
        self._torch = torch
        self._device = torch.device("cuda", device_index)
        # TensorRT deserialises and runs on the *current* device: make it ours before the engine loads
        torch.cuda.set_device(self._device)
        self._stream = torch.cuda.Stream(device=self._device)

    @property
    def stream_handle(self) -> int:
        return int(self._stream.cuda_stream)

    def allocate(self, nbytes: int) -> Buffer:
        torch = self._torch
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        device = torch.empty(nbytes, dtype=torch.uint8, device=self._device)
        return Buffer(host.numpy(), int(device.data_ptr()), nbytes, owners=(host, device))

    def upload(self, buffer: Buffer, nbytes: int) -> None:
        host, device = buffer.owners
        with self._torch.cuda.stream(self._stream):
            device[:nbytes].copy_(host[:nbytes], non_blocking=True)

    def download(self, buffer: Buffer, nbytes: int) -> None:
        host, device = buffer.owners
        with self._torch.cuda.stream(self._stream):
            host[:nbytes].copy_(device[:nbytes], non_blocking=True)

    def synchronize(self) -> None:
        self._stream.synchronize()


def native_handle(cuda_object: Any) -> int:
    """The raw address behind a cuda-python handle (a cudaStream_t, ...).

    `int(handle)` is deprecated in cuda-bindings 13; `cuda.bindings.utils.get_cuda_native_handle`
    replaces it where present.
    """
    try:
        from cuda.bindings.utils import get_cuda_native_handle
    except ImportError:
        return int(cuda_object)
    return int(get_cuda_native_handle(cuda_object))


def import_cudart():
    """cuda-python's runtime module: `cuda.bindings.runtime` (12.8+), else `cuda.cudart` (older)."""
    for name in ("cuda.bindings.runtime", "cuda.cudart"):
        try:
            return importlib.import_module(name)
        except ImportError:
            continue
    raise MissingDependency(
        "cuda-python",
        "trt-cu12",
        "The TensorRT backend without torch",
        "pip install -e '.[trt-cu12]' or '[trt-cu13]' (cuda-python of the driver's CUDA major)",
    )


class CudartMemory(CudaMemory):
    kind = "cuda-python"

    def __init__(self, device_index: int):
        self._rt = import_cudart()
        self._check(self._rt.cudaSetDevice(device_index), f"selecting GPU {device_index}")
        self._stream = self._check(self._rt.cudaStreamCreate(), "creating a CUDA stream")
        self._allocations: list[tuple[int, int]] = []  # (host ptr, device ptr)

    def _check(self, result: tuple, what: str):
        err, *values = result if isinstance(result, tuple) else (result,)
        if int(err) != 0:
            _, message = self._rt.cudaGetErrorString(err)
            text = message.decode() if isinstance(message, bytes) else str(message)
            raise BackendError(
                f"CUDA failed while {what}: {getattr(err, 'name', err)} ({text}). The TensorRT "
                "backend needs an NVIDIA GPU with a driver matching the installed cuda-python"
            )
        return values[0] if len(values) == 1 else (values or None)

    @property
    def stream_handle(self) -> int:
        return native_handle(self._stream)

    def allocate(self, nbytes: int) -> Buffer:
        device_ptr = int(self._check(self._rt.cudaMalloc(nbytes), f"allocating {nbytes} B on the GPU"))
        host_ptr = int(self._check(self._rt.cudaMallocHost(nbytes), f"pinning {nbytes} B of host memory"))
        self._allocations.append((host_ptr, device_ptr))
        host = np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(host_ptr))
        return Buffer(host, device_ptr, nbytes, owners=(host_ptr,))

    def upload(self, buffer: Buffer, nbytes: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._check(
            self._rt.cudaMemcpyAsync(buffer.device_ptr, buffer.owners[0], nbytes, kind, self._stream),
            "copying inputs to the GPU",
        )

    def download(self, buffer: Buffer, nbytes: int) -> None:
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._check(
            self._rt.cudaMemcpyAsync(buffer.owners[0], buffer.device_ptr, nbytes, kind, self._stream),
            "copying outputs from the GPU",
        )

    def synchronize(self) -> None:
        self._check(self._rt.cudaStreamSynchronize(self._stream), "waiting for the CUDA stream")

    def release(self, buffer: Buffer) -> None:
        pair = (buffer.owners[0], buffer.device_ptr)
        if pair in self._allocations:
            self._allocations.remove(pair)
            self._rt.cudaFreeHost(pair[0])
            self._rt.cudaFree(pair[1])

    def close(self) -> None:
        for host_ptr, device_ptr in self._allocations:
            self._rt.cudaFreeHost(host_ptr)
            self._rt.cudaFree(device_ptr)
        self._allocations.clear()
        self._rt.cudaStreamDestroy(self._stream)


def open_memory(device_index: int = 0, prefer: str = "auto") -> CudaMemory:
    """torch when it sees a CUDA GPU (or is asked for), else cuda-python.

    "auto" asks torch for a GPU rather than only importing it: a torch without CUDA (PyPI's CPU
    wheel, which is what `pip install torch` gives on a Jetson) beside an installed cuda-python would
    otherwise stand between the engine and the GPU.
    """
    if prefer not in ("auto", "torch", "cuda-python"):
        raise BackendError(f"memory={prefer!r}: expected 'auto', 'torch' or 'cuda-python'")
    has_torch = importlib.util.find_spec("torch") is not None
    if prefer == "torch" and not has_torch:
        raise MissingDependency("torch", "train", "TensorRT buffers from torch")
    if prefer == "torch" or (prefer == "auto" and has_torch and (_torch_sees_cuda() or not _has_cudart())):
        return TorchMemory(device_index)  # without a GPU its error says what torch lacks
    return CudartMemory(device_index)


def _torch_sees_cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _has_cudart() -> bool:
    try:
        import_cudart()
    except MissingDependency:
        return False
    return True
