"""TensorRT backend logic against the fake `tensorrt` module (tests/fakes/tensorrt).

The fake's execution context runs the engine's graph with onnxruntime, reading and writing the
addresses it was given; `HostMemory` here is the `CudaMemory` interface over plain host arrays
(there is no GPU here).
The engine file itself is built by the real `dfine_deploy.export.tensorrt.build_for_artifact`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
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
ROOT = Path(__file__).parents[2]


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
    engine = trt_export.build_for_artifact(folder, fp16=False, batch=(1, 2, 4))
    assert engine.file == "model.fp32.engine"  # an FP32 engine: its own file
    # reverse the engine's I/O order: the runtime must look tensors up by name, not position
    plan = json.loads((folder / engine.file).read_bytes())
    plan["io"] = plan["io"][::-1]
    (folder / engine.file).write_bytes(json.dumps(plan).encode())
    info = read_artifact(folder)  # the sidecar vouches for the engine's bytes: record the edited ones
    info.engines["fp32"].sha256 = sha256_file(folder / engine.file)
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
    record = read_artifact(folder).engine_for()
    assert record.builder["strongly_typed"] is True  # TensorRT 11 builds strongly typed networks only
    assert Detector.open(folder, backend="tensorrt", unverified=True).backend.strongly_typed is True
    del record.builder["strongly_typed"]
    info = read_artifact(folder)
    info.engines[record.precision] = record
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
        Detector.open(folder / "model.fp32.engine")
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


def _nvidia_libs_wheel(site: Path) -> Path:
    """NVIDIA's pip layout of TensorRT's libraries (python/packaging/libs_wheel of NVIDIA/TensorRT): a
    `tensorrt_libs` package holding libnvinfer.so.10, which its __init__ loads with ctypes. The library
    here is an empty one of that soname, built with the system compiler."""
    package = site / "tensorrt_libs"
    package.mkdir(parents=True)
    source = site / "empty.c"
    source.write_text("int dfine_test_nvinfer_stand_in(void) { return 10; }\n")
    library = package / "libnvinfer.so.10"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-Wl,-soname,libnvinfer.so.10", "-o", str(library), str(source)],
        check=True,
    )
    (package / "__init__.py").write_text(
        "import ctypes, glob, os\n"
        "for lib in glob.glob(os.path.join(os.path.dirname(__file__), '*.so*')):\n"
        "    ctypes.CDLL(lib)\n"
    )
    return package


# An onnxruntime that offers the TensorRT provider; each session records whether NVIDIA's libraries were
# imported before it was made, then the CPU onnxruntime here runs it on the CPU.
_PROVIDER_SESSIONS = """
import sys
import onnxruntime as ort

made = []
real = ort.InferenceSession
ort.get_available_providers = lambda: [
    "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"
]


def session(path, options, providers):
    made.append("tensorrt_libs" in sys.modules)
    return real(path, options, providers=["CPUExecutionProvider"])


ort.InferenceSession = session
from dfine_deploy.errors import BackendError
from dfine_deploy.runtime.onnxruntime_backend import OnnxRuntimeBackend

try:
    OnnxRuntimeBackend(sys.argv[1], provider="tensorrt", device="cuda")
except BackendError as exc:
    print("refused:", exc)
print("sessions made after tensorrt_libs:", made)
"""


def _provider_sessions(graph: Path, site: Path | None) -> list[str]:
    """Run _PROVIDER_SESSIONS in a fresh interpreter (a loaded library stays loaded), `site` first."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*([str(site)] if site else []), str(ROOT)])}
    done = subprocess.run(
        [sys.executable, "-c", _PROVIDER_SESSIONS, str(graph)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip().splitlines()


def test_a_tensorrt_provider_session_loads_nvidias_pip_libraries_first(tmp_path):
    """onnxruntime's TensorRT provider links libnvinfer.so.10 without a RUNPATH and preload_dlls loads
    no TensorRT: the session is made after `tensorrt_libs` was imported and the library loads by its
    soname. (Here the CPU onnxruntime then runs the graph itself, which an explicit provider refuses.)"""
    _nvidia_libs_wheel(tmp_path / "site")
    graph = make_artifact(tmp_path / "art") / "model.onnx"
    refused, made = _provider_sessions(graph, tmp_path / "site")
    assert "TensorrtExecutionProvider was requested but onnxruntime runs" in refused, refused
    assert made.endswith("[True]"), made


def test_without_tensorrt_libraries_a_provider_session_is_one_line_naming_ld_library_path(tmp_path):
    graph = make_artifact(tmp_path / "art") / "model.onnx"
    refused, made = _provider_sessions(graph, None)
    assert "libnvinfer.so.10" in refused and "tensorrt_libs" in refused, refused
    assert "LD_LIBRARY_PATH" in refused, refused
    assert made.endswith("[]"), made  # refused before onnxruntime could fall back without a word
