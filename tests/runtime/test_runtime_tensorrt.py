"""TensorRT backend logic against the fake `tensorrt` module (tests/fakes/tensorrt).

The fake models building and inspecting engines, not running them. What running needs is added
HERE, without touching the fake, as two clearly named test doubles:
- `FakeExecutionContext`: TensorRT's named-tensor execution API (set_input_shape, get_tensor_shape,
  set_tensor_address, execute_async_v3). It refuses shapes outside the profile like TensorRT, reads
  inputs from and writes outputs to the addresses it was given, and computes with real
  onnxruntime on the graph the engine was built from.
- `HostMemory`: the `CudaMemory` interface over plain host arrays (there is no GPU here).
The engine file itself is built by the real `dfine_deploy.export.tensorrt.build_for_artifact`.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from dfine_deploy.artifact import read_artifact, write_artifact
from dfine_deploy.errors import BackendError
from dfine_deploy.files import sha256_file
from dfine_deploy.runtime import Detector, tensorrt_backend
from dfine_deploy.runtime.cuda_memory import Buffer, CudaMemory
from tests.runtime.test_runtime_detector import frames, make_artifact

FAKE = Path(__file__).parents[1] / "fakes" / "tensorrt" / "__init__.py"


class HostMemory(CudaMemory):
    """CudaMemory over host arrays: 'device' buffers are numpy arrays addressed by pointer."""

    kind = "host test double"

    def __init__(self):
        self.allocations = 0

    @property
    def stream_handle(self) -> int:
        return 0

    def allocate(self, nbytes: int) -> Buffer:
        self.allocations += 1
        host, device = np.zeros(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
        return Buffer(host, device.ctypes.data, nbytes, owners=(device,))

    def upload(self, buffer: Buffer, nbytes: int) -> None:
        buffer.owners[0][:nbytes] = buffer.host[:nbytes]

    def download(self, buffer: Buffer, nbytes: int) -> None:
        buffer.host[:nbytes] = buffer.owners[0][:nbytes]

    def synchronize(self) -> None:
        pass


class FakeExecutionContext:
    """TensorRT's IExecutionContext named-tensor API, computing with onnxruntime (test double)."""

    def __init__(self, engine, graph: Path):
        self.engine = engine
        self.session = ort.InferenceSession(str(graph), providers=["CPUExecutionProvider"])
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.addresses: dict[str, int] = {}
        self.executions = 0

    def _dtype(self, name: str) -> np.dtype:
        return np.dtype(tensorrt_backend.numpy_dtype(self.engine.get_tensor_dtype(name)))

    def set_input_shape(self, name: str, shape) -> bool:
        low, _, high = self.engine.get_tensor_profile_shape(name, 0)
        if len(shape) != len(low) or any(not lo <= d <= hi for d, lo, hi in zip(shape, low, high)):
            return False
        self.shapes[name] = tuple(shape)
        return True

    def _inputs(self) -> list[str]:
        return [
            n
            for n in (self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors))
            if self.engine.get_tensor_mode(n).name == "INPUT"
        ]

    def _feeds(self, read: bool) -> dict[str, np.ndarray]:
        feeds = {}
        for name in self._inputs():
            shape, dtype = self.shapes[name], self._dtype(name)
            if read:
                nbytes = int(np.prod(shape)) * dtype.itemsize
                raw = (ctypes.c_uint8 * nbytes).from_address(self.addresses[name])
                feeds[name] = np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
            else:
                feeds[name] = np.ones(shape, dtype)
        return feeds

    def get_tensor_shape(self, name: str):
        if name in self.shapes:
            return self.shapes[name]
        names = [o.name for o in self.session.get_outputs()]
        return self.session.run([name], self._feeds(read=False))[0].shape if name in names else ()

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True

    def execute_async_v3(self, stream_handle: int) -> bool:
        names = [o.name for o in self.session.get_outputs()]
        outputs = self.session.run(names, self._feeds(read=True))
        for name, value in zip(names, outputs):
            value = np.ascontiguousarray(value, dtype=self._dtype(name))
            ctypes.memmove(self.addresses[name], value.ctypes.data, value.nbytes)
        self.executions += 1
        return True


@pytest.fixture
def trt_artifact(tmp_path, monkeypatch):
    """An artifact with an engine built by the export code on the fake TensorRT 11."""
    spec = importlib.util.spec_from_file_location("tensorrt", FAKE)
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    fake.set_version("11.4.0.106")
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    from dfine_deploy.export import tensorrt as trt_export
    from dfine_deploy.runtime.tensorrt_plan import GpuInfo

    monkeypatch.setattr(trt_export, "gpu_info", lambda: GpuInfo("Fake T4", "7.5"))
    folder = make_artifact(tmp_path / "art", batch_max=4)
    trt_export.build_for_artifact(folder, fp16=False, batch=(1, 2, 4))
    # reverse the engine's I/O order: the runtime must look tensors up by name, not position
    plan = json.loads((folder / "model.engine").read_bytes())
    plan["io"] = plan["io"][::-1]
    (folder / "model.engine").write_bytes(json.dumps(plan).encode())
    info = read_artifact(folder)  # the sidecar vouches for the engine's bytes: record the edited ones
    info.engine.sha256 = sha256_file(folder / "model.engine")
    write_artifact(folder, info)
    memory = HostMemory()
    monkeypatch.setattr(tensorrt_backend, "open_memory", lambda index, prefer="auto": memory)
    graph = folder / "model.onnx"
    monkeypatch.setattr(
        fake.ICudaEngine,
        "create_execution_context",
        lambda engine: FakeExecutionContext(engine, graph),
        raising=False,
    )
    return folder, fake, memory


def test_engine_detections_match_onnxruntime(trt_artifact):
    folder, _, memory = trt_artifact
    engine = Detector.open(folder, backend="tensorrt", unverified=True)  # dfine-verify: tests/verify
    reference = Detector.open(folder, backend="onnxruntime", device="cpu")
    assert engine.backend_name == "tensorrt" and engine.provider.startswith("TensorRT 11.4.0.106")
    assert engine.max_batch == 4 and engine.input_size == (64, 64)
    assert engine.backend.profile["images"] == ((1, 3, 64, 64), (2, 3, 64, 64), (4, 3, 64, 64))
    batch = frames(6)  # more than the profile's max: two chunks (4 + 2)
    got, want = engine.predict(batch), reference.predict(batch)
    assert engine.backend.context.executions == 2
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.boxes, b.boxes, rtol=1e-6, atol=1e-4)
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)
    context = engine.backend.context
    assert set(context.addresses) == {"images", "orig_target_sizes", "labels", "boxes", "scores"}
    assert memory.allocations == 5  # the 4-image chunk came first: no regrowth for the 2-image one


def test_auto_never_swaps_an_unverified_engine_for_onnxruntime(trt_artifact):
    folder, _, _ = trt_artifact  # a GPU and TensorRT are there: the engine must prove itself first
    with pytest.raises(BackendError, match=rf"has not proved itself on this device.*`dfine-verify {folder}"):
        Detector.open(folder)


def test_buffers_grow_for_a_larger_batch(trt_artifact):
    folder, _, memory = trt_artifact
    engine = Detector.open(folder, backend="tensorrt", unverified=True)  # dfine-verify: tests/verify
    one = engine.predict(frames(1))
    first = dict(engine.backend.context.addresses)
    four = engine.predict(frames(4))
    assert memory.allocations == 10  # every binding reallocated once for the larger batch
    assert engine.backend.context.addresses["images"] != first["images"]
    np.testing.assert_allclose(four[0].boxes, one[0].boxes, rtol=1e-6, atol=1e-4)


def test_batch_outside_the_profile_is_refused(trt_artifact):
    folder, _, _ = trt_artifact
    backend = Detector.open(folder, backend="tensorrt", unverified=True).backend
    images = np.zeros((5, 3, 64, 64), np.float32)
    sizes = np.full((5, 2), 64, np.int64)
    with pytest.raises(BackendError, match=r"outside the engine's optimisation profile.*at most 4"):
        backend.run({"images": images, "orig_target_sizes": sizes})


def test_engine_from_another_tensorrt_version_names_the_fix(trt_artifact):
    folder, fake, _ = trt_artifact
    fake.set_version("10.13.0")
    with pytest.raises(
        BackendError, match=r"built with TensorRT 11.4.0.106 on Fake T4.*rebuild it on this machine"
    ) as error:
        Detector.open(folder / "model.engine")
    assert (
        "install the TensorRT that built it (TensorRT 11.4.0: pip install 'tensorrt-cu12==11.4.0.*'"
        in str(error.value)
    )


def test_bench_refuses_a_batch_beyond_the_engine_profile(trt_artifact, capsys):
    from dfine_deploy.bench.cli import main

    folder, _, _ = trt_artifact
    code = main(
        ["--model", str(folder), "--backend", "tensorrt", "--device", "t4", "--batch", "8", "--runs", "1"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "takes at most 4 images per call" in err and "optimisation profile" in err
