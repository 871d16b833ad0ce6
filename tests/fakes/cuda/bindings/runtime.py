"""FAKE `cuda.bindings.runtime`: the CUDA runtime calls dfine-deploy makes, over host memory.

There is no GPU behind it. Each call has the calling convention of cuda-python's runtime bindings
(https://nvidia.github.io/cuda-python/cuda-bindings/latest/module/runtime.html): it returns a tuple
whose first item is a `cudaError_t` and whose further items are the C call's out-parameters
(`cudaMalloc(size) -> (err, devPtr)`, `cudaStreamCreate() -> (err, stream)`,
`cudaGetDeviceProperties(device) -> (err, prop)` with `prop.name` bytes, `cudaGetErrorString(error)
-> (err, bytes)`). A "device" allocation is host memory, so a device pointer is a host address: the
fake TensorRT's execution context (tests/fakes/tensorrt) reads and writes tensors there. Copies
check their direction against the kind of both pointers, as the CUDA runtime documents for
cudaMemcpyAsync. The one device is the fake TensorRT's `FAKE_GPU` (a T4, compute capability 7.5).
"""

from __future__ import annotations

import ctypes
import enum
from types import SimpleNamespace


class cudaError_t(enum.IntEnum):
    cudaSuccess = 0
    cudaErrorInvalidValue = 1
    cudaErrorMemoryAllocation = 2
    cudaErrorInvalidDevice = 101
    cudaErrorInvalidMemcpyDirection = 21


class cudaMemcpyKind(enum.IntEnum):
    cudaMemcpyHostToHost = 0
    cudaMemcpyHostToDevice = 1
    cudaMemcpyDeviceToHost = 2
    cudaMemcpyDeviceToDevice = 3
    cudaMemcpyDefault = 4


class cudaStream_t:
    """A stream handle; `int()` is its address, as for cuda-python's handles."""

    _next = 0x1000

    def __init__(self) -> None:
        cudaStream_t._next += 0x10
        self._address = cudaStream_t._next

    def __int__(self) -> int:
        return self._address


_DEVICE = {"name": b"Fake T4", "major": 7, "minor": 5}  # tests/fakes/tensorrt FAKE_GPU
_ALLOCATIONS: dict[int, tuple[str, ctypes.Array]] = {}  # address -> ("device" | "host", its memory)
_ERRORS = {
    cudaError_t.cudaSuccess: b"no error",
    cudaError_t.cudaErrorInvalidValue: b"invalid argument",
    cudaError_t.cudaErrorMemoryAllocation: b"out of memory",
    cudaError_t.cudaErrorInvalidDevice: b"invalid device ordinal",
    cudaError_t.cudaErrorInvalidMemcpyDirection: b"invalid copy direction for memcpy",
}
_OK = cudaError_t.cudaSuccess


def cudaGetDeviceCount():
    return _OK, 1


def cudaGetDeviceProperties(device: int):
    if device != 0:
        return cudaError_t.cudaErrorInvalidDevice, None
    return _OK, SimpleNamespace(**_DEVICE)


def cudaSetDevice(device: int):
    return (_OK,) if device == 0 else (cudaError_t.cudaErrorInvalidDevice,)


def cudaGetErrorString(error):
    return _OK, _ERRORS.get(cudaError_t(int(error)), b"unknown error")


def cudaStreamCreate():
    return _OK, cudaStream_t()


def cudaStreamSynchronize(stream):
    return (_OK,)


def cudaStreamDestroy(stream):
    return (_OK,)


def _allocate(size: int, where: str):
    if size <= 0:
        return cudaError_t.cudaErrorInvalidValue, 0
    memory = (ctypes.c_uint8 * size)()
    address = ctypes.addressof(memory)
    _ALLOCATIONS[address] = (where, memory)
    return _OK, address


def cudaMalloc(size: int):
    return _allocate(size, "device")


def cudaMallocHost(size: int):
    return _allocate(size, "host")


def cudaFree(devPtr: int):
    return (_OK,) if _ALLOCATIONS.pop(int(devPtr), None) else (cudaError_t.cudaErrorInvalidValue,)


def cudaFreeHost(ptr: int):
    return cudaFree(ptr)


def _kind(address: int) -> str:
    """ "device" or "host" for an address inside one of our allocations; "pageable" otherwise."""
    for start, (where, memory) in _ALLOCATIONS.items():
        if start <= address < start + len(memory):
            return where
    return "pageable"


def cudaMemcpyAsync(dst: int, src: int, count: int, kind, stream):
    wanted = {
        cudaMemcpyKind.cudaMemcpyHostToDevice: ("device", "host"),
        cudaMemcpyKind.cudaMemcpyDeviceToHost: ("host", "device"),
        cudaMemcpyKind.cudaMemcpyDeviceToDevice: ("device", "device"),
    }.get(cudaMemcpyKind(int(kind)))
    if wanted is not None and (_kind(int(dst)), _kind(int(src))) != wanted:
        return (cudaError_t.cudaErrorInvalidMemcpyDirection,)
    ctypes.memmove(int(dst), int(src), int(count))
    return (_OK,)
