"""GPU plumbing that must be right before any GPU is reached, checked with stand-ins for the CUDA
modules (there is no GPU here): device selection, stream handles, cuda-python fallbacks, dtypes and
the onnxruntime TensorRT provider options."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np
import pytest

from dfine_deploy.errors import BackendError
from dfine_deploy.export import tensorrt as trt_export
from dfine_deploy.runtime import cuda_memory, tensorrt_backend
from dfine_deploy.runtime import tensorrt_plan as trt_plan
from dfine_deploy.runtime.onnxruntime_backend import provider_chain


def _install(monkeypatch, name: str, module: types.ModuleType | None) -> None:
    monkeypatch.setitem(sys.modules, name, module)


def test_torch_memory_makes_device_n_current(monkeypatch):
    import torch

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: chosen.append(str(device)))
    monkeypatch.setattr(torch.cuda, "Stream", lambda device: types.SimpleNamespace(device=device))
    memory = cuda_memory.TorchMemory(1)
    assert chosen == ["cuda:1"] and str(memory._stream.device) == "cuda:1"
    with pytest.raises(BackendError, match="cuda:2 asked for, but torch sees 2 GPU"):
        cuda_memory.TorchMemory(2)


def test_stream_handles_use_get_cuda_native_handle_where_cuda_bindings_has_it(monkeypatch):
    class Stream:  # cuda-bindings 13 deprecates int(stream)
        def __int__(self):
            raise AssertionError("int(stream) used although get_cuda_native_handle exists")

    utils = types.ModuleType("cuda.bindings.utils")
    utils.get_cuda_native_handle = lambda obj: 0x7F00
    _install(monkeypatch, "cuda.bindings.utils", utils)
    assert cuda_memory.native_handle(Stream()) == 0x7F00
    _install(monkeypatch, "cuda.bindings.utils", None)  # older cuda-python: int() is the way
    assert cuda_memory.native_handle(42) == 42


def test_gpu_info_falls_back_to_cuda_cudart_before_cuda_python_12_6_1(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    cudart = types.ModuleType("cuda.cudart")
    cudart.cudaGetDeviceCount = lambda: (0, 1)
    cudart.cudaGetDeviceProperties = lambda i: (
        0,
        types.SimpleNamespace(name=b"Orin\x00\x00", major=8, minor=7),
    )
    _install(monkeypatch, "cuda.bindings.runtime", None)  # not there before 12.6.1 / 12.8
    _install(monkeypatch, "cuda", types.ModuleType("cuda"))
    _install(monkeypatch, "cuda.cudart", cudart)
    assert trt_export.gpu_info() == trt_plan.GpuInfo("Orin", "8.7")
    _install(monkeypatch, "cuda.cudart", None)
    assert trt_export.gpu_info() is None


def test_bf16_engine_io_is_refused_not_sized_as_float32():
    assert tensorrt_backend.numpy_dtype(types.SimpleNamespace(name="HALF")) == np.float16
    with pytest.raises(BackendError, match="BF16 has no numpy equivalent of the same size"):
        tensorrt_backend.numpy_dtype(types.SimpleNamespace(name="BF16"))


def test_a_stubs_only_tensorrt_is_not_taken_for_tensorrt(monkeypatch):
    stub = types.ModuleType("tensorrt")
    stub.__path__ = ["/site-packages/tensorrt"]  # what tensorrt-stubs alone leaves: a namespace package
    _install(monkeypatch, "tensorrt", stub)
    with pytest.raises(Exception, match="has no bindings: type stubs only"):
        tensorrt_backend.load_tensorrt("The TensorRT backend")


def test_onnxruntime_tensorrt_provider_gets_both_profiles_and_no_forced_fp16(tmp_path: Path):
    profile = trt_plan.artifact_profile((1, 2, 8), 640, 480)
    chain = provider_chain("tensorrt", "cuda:1", [], tmp_path, trt_profile=profile)
    name, options = chain[0]
    assert name == "TensorrtExecutionProvider" and options["device_id"] == 1
    assert "trt_fp16_enable" not in options  # the typed FP16 graph decides its own types
    assert options["trt_profile_min_shapes"] == "images:1x3x640x480,orig_target_sizes:1x2"
    assert options["trt_profile_opt_shapes"] == "images:2x3x640x480,orig_target_sizes:2x2"
    assert options["trt_profile_max_shapes"] == "images:8x3x640x480,orig_target_sizes:8x2"
    weak = provider_chain("tensorrt", "cuda", [], tmp_path, trt_fp16_flag=True)[0][1]
    assert weak["trt_fp16_enable"] is True and "trt_profile_min_shapes" not in weak
    assert [p if isinstance(p, str) else p[0] for p in chain[1:]] == [
        "CUDAExecutionProvider",
        "CPUExecutionProvider",
    ]


def _memory_choice(monkeypatch, *, torch_cuda: bool, cudart: bool) -> str:
    """Which CudaMemory open_memory("auto") builds, with torch importable and cuda-python present or not."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: torch_cuda)
    monkeypatch.setattr(cuda_memory, "TorchMemory", lambda index: "torch")
    monkeypatch.setattr(cuda_memory, "CudartMemory", lambda index: "cuda-python")
    runtime = types.ModuleType("cuda.bindings.runtime") if cudart else None
    _install(monkeypatch, "cuda.bindings.runtime", runtime)
    _install(monkeypatch, "cuda.cudart", None)
    return cuda_memory.open_memory(0, prefer="auto")


def test_auto_memory_takes_cuda_python_when_torch_has_no_cuda(monkeypatch):
    """A CPU-only torch (PyPI's wheel on a Jetson) beside cuda-python must not take the engine's buffers."""
    assert _memory_choice(monkeypatch, torch_cuda=False, cudart=True) == "cuda-python"
    assert _memory_choice(monkeypatch, torch_cuda=True, cudart=True) == "torch"
    assert _memory_choice(monkeypatch, torch_cuda=False, cudart=False) == "torch"  # its error names the cause


def test_auto_memory_without_either_says_what_torch_lacks(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    _install(monkeypatch, "cuda.bindings.runtime", None)
    _install(monkeypatch, "cuda.cudart", None)
    with pytest.raises(BackendError, match="the TensorRT backend needs a CUDA GPU, and torch sees none"):
        cuda_memory.open_memory(0)


def test_gpu_libraries_are_preloaded_once_before_the_first_gpu_session(monkeypatch, tmp_path, caplog):
    import onnxruntime as ort

    from dfine_deploy.runtime import onnxruntime_backend

    calls = []

    def preload():
        calls.append("preload")
        print("Failed to load libcudnn.so.9: cannot open shared object file")  # as onnxruntime reports it

    class Session:  # stands in for the GPU session this machine cannot open
        def __init__(self, path, options, providers):
            calls.append(("session", providers[0] if isinstance(providers[0], str) else providers[0][0]))
            raise RuntimeError("no GPU here")

    monkeypatch.setattr(ort, "preload_dlls", preload, raising=False)
    monkeypatch.setattr(
        ort, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"]
    )
    monkeypatch.setattr(ort, "InferenceSession", Session)
    onnxruntime_backend.preload_gpu_libraries.cache_clear()
    graph = tmp_path / "m.onnx"
    graph.write_bytes(b"graph")
    for device in ("cpu", "cuda", "cuda"):
        with pytest.raises(BackendError, match="onnxruntime cannot load this graph"):
            onnxruntime_backend.OnnxRuntimeBackend(graph, device=device)
    assert calls == [
        ("session", "CPUExecutionProvider"),
        "preload",
        ("session", "CUDAExecutionProvider"),
        ("session", "CUDAExecutionProvider"),
    ]
    assert "onnxruntime.preload_dlls: Failed to load libcudnn.so.9" in caplog.text
    onnxruntime_backend.preload_gpu_libraries.cache_clear()
