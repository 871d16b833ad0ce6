"""TensorRT backend logic against the fake `tensorrt` module (tests/fakes/tensorrt).

The fake's execution context runs the engine's graph with onnxruntime, reading and writing the
addresses it was given; `HostMemory` here is the `CudaMemory` interface over plain host arrays
(there is no GPU here).
The engine file itself is built by the real `dfine_deploy.export.tensorrt.build_for_artifact`.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
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
    assert engine.backend.context._executions == 2
    for a, b in zip(got, want):
        np.testing.assert_allclose(a.boxes, b.boxes, rtol=1e-6, atol=1e-4)
        np.testing.assert_array_equal(a.labels, b.labels)
        np.testing.assert_allclose(a.scores, b.scores, rtol=1e-6)
    context = engine.backend.context
    assert set(context._addresses) == {"images", "orig_target_sizes", "labels", "boxes", "scores"}
    assert memory.allocations == 5  # the 4-image chunk came first: no regrowth for the 2-image one


def test_the_engine_says_how_its_record_says_it_was_typed(trt_artifact):
    """dfine-verify reads the inspector by the engine's typing (export/tensorrt_verify.judge_precision):
    the backend takes it from model.json's engine record, and says None when nothing records it."""
    folder, _, _ = trt_artifact
    record = read_artifact(folder).engine
    assert record.builder["strongly_typed"] is True  # TensorRT 11 builds strongly typed networks only
    assert Detector.open(folder, backend="tensorrt", unverified=True).backend.strongly_typed is True
    del record.builder["strongly_typed"]
    info = read_artifact(folder)
    info.engine = record
    write_artifact(folder, info)
    assert Detector.open(folder, backend="tensorrt", unverified=True).backend.strongly_typed is None


def test_auto_never_swaps_an_unverified_engine_for_onnxruntime(trt_artifact):
    folder, _, _ = trt_artifact  # a GPU and TensorRT are there: the engine must prove itself first
    with pytest.raises(BackendError, match=rf"has not proved itself on this device.*`dfine-verify {folder}"):
        Detector.open(folder)


def test_buffers_grow_for_a_larger_batch(trt_artifact):
    folder, _, memory = trt_artifact
    engine = Detector.open(folder, backend="tensorrt", unverified=True)  # dfine-verify: tests/verify
    one = engine.predict(frames(1))
    first = dict(engine.backend.context._addresses)
    four = engine.predict(frames(4))
    assert memory.allocations == 10  # every binding reallocated once for the larger batch
    assert engine.backend.context._addresses["images"] != first["images"]
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
