"""The backend table: every row names a real class of its own name, and what reads the table (the
--backend help, the backend parser, the install check, a verify result's device, a missing library's
message, the bench's export) follows its rows."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import replace

import pytest

from dfine_deploy.backend_names import GRAPH_PRECISIONS, BackendName, Precision
from dfine_deploy.bench import runner
from dfine_deploy.bench.cli import check_backend_installed
from dfine_deploy.errors import BackendError, BenchError, MissingDependency
from dfine_deploy.runtime.backend import Backend
from dfine_deploy.runtime.backends import BACKEND_HELP, BACKENDS, BY_NAME, openers, split_backend
from dfine_deploy.runtime.openvino_backend import import_openvino
from dfine_deploy.runtime.tensorrt_backend import load_tensorrt
from dfine_deploy.runtime.verify_record import device_facts


@pytest.mark.parametrize("row", BACKENDS, ids=lambda row: str(row.name))
def test_each_row_names_a_backend_class_of_its_own_name(row):
    cls = row.load_class()  # the module imports without its third-party library
    assert issubclass(cls, Backend)
    assert cls.name == row.name
    assert row.opens and set(row.devices) <= {"cpu", "cuda"}
    assert row.install_hint and row.label


def test_every_backend_name_but_auto_has_one_row_and_the_help_names_each():
    assert [row.name for row in BACKENDS] == [b for b in BackendName if b != BackendName.AUTO]
    for row in BACKENDS:
        assert row.name in BACKEND_HELP
    assert "onnxruntime[:cpu|:cuda|:tensorrt]" in BACKEND_HELP


def test_names_print_and_serialise_as_their_text():
    assert f"{BackendName.TENSORRT}" == str(BackendName.TENSORRT) == "tensorrt"
    assert json.dumps({Precision.INT8: [Precision.BF16]}) == '{"int8": ["bf16"]}'
    assert Precision.BF16 not in GRAPH_PRECISIONS and "int8" in GRAPH_PRECISIONS


def test_auto_opens_each_file_kind_with_the_first_row_that_opens_it():
    assert openers("onnx")[0].name == BackendName.ONNXRUNTIME
    assert [r.name for r in openers("onnx")] == [BackendName.ONNXRUNTIME, BackendName.OPENVINO]
    assert openers("engine")[0].name == BackendName.TENSORRT
    assert openers("checkpoint")[0].name == BackendName.TORCH


@pytest.mark.parametrize("spelled", ["tensorflow", "openvino:cpu", "auto:cuda", "tensorrt:gpu", ""])
def test_unknown_backends_and_misplaced_providers_are_one_clear_error(spelled):
    with pytest.raises(BackendError, match=rf"backend {spelled!r} is unknown; expected one of"):
        split_backend(spelled)


def test_the_provider_part_belongs_to_onnxruntime():
    assert split_backend("onnxruntime:tensorrt") == (BackendName.ONNXRUNTIME, "tensorrt")
    assert split_backend("openvino") == (BackendName.OPENVINO, None)


def test_the_install_check_uses_the_rows_module_and_hint(monkeypatch):
    check_backend_installed("onnxruntime")  # a base dependency: always here
    row = BY_NAME[BackendName.OPENVINO]
    monkeypatch.setitem(BY_NAME, BackendName.OPENVINO, replace(row, requires="no_such_lib_x"))
    with pytest.raises(BenchError) as caught:
        check_backend_installed("openvino")
    message = str(caught.value)
    assert "no_such_lib_x is not installed" in message and row.install_hint in message


class _Running:
    """What `device_facts` reads of an open backend."""

    def __init__(self, name: str):
        self.name, self.provider, self.device = name, "cpu", "cpu"


@pytest.mark.parametrize("row", BACKENDS, ids=lambda row: str(row.name))
def test_a_verify_result_holds_for_the_rows_library_version_and_provider(row, monkeypatch):
    monkeypatch.setitem(BY_NAME, row.name, replace(row, requires="fake_lib_x"))
    monkeypatch.setitem(sys.modules, "fake_lib_x", types.SimpleNamespace(__version__="9.8.7"))
    facts = device_facts(_Running(row.name))
    assert facts["backend"] == row.name
    assert ("provider" in facts) == bool(row.providers)
    assert facts.get(str(row.name)) == ("9.8.7" if row.verify_version else None)
    # the libraries that compute the outputs count; numpy replaying recorded outputs does not
    assert row.verify_version == (row.name not in (BackendName.RKNN, BackendName.REPLAY))


def test_a_missing_backend_library_is_named_with_the_rows_module_and_extra(monkeypatch):
    for name, extra in ((BackendName.OPENVINO, "ov-x"), (BackendName.TENSORRT, "trt-x")):
        monkeypatch.setitem(BY_NAME, name, replace(BY_NAME[name], requires="no_such_lib_x", extra=extra))
    with pytest.raises(MissingDependency, match=r"'no_such_lib_x'.*pip install -e '\.\[ov-x\]'"):
        import_openvino()
    with pytest.raises(MissingDependency) as caught:
        load_tensorrt("a test")
    assert (caught.value.module, caught.value.extra) == ("no_such_lib_x", "trt-x")


@pytest.mark.parametrize(
    "row", [r for r in BACKENDS if r.name != BackendName.TORCH], ids=lambda r: str(r.name)
)
def test_the_bench_exports_an_engine_for_the_rows_that_open_one(row, tmp_path, monkeypatch):
    checkpoint = tmp_path / "best.pth"
    checkpoint.write_bytes(b"not read")
    asked = {}

    def export_for_bench(ref, imgsz, work_dir, fp16, trt):
        asked.update(fp16=fp16, trt=trt)
        raise BenchError("stop here")

    monkeypatch.setattr(runner, "export_for_bench", export_for_bench)
    request = types.SimpleNamespace(
        profile=types.SimpleNamespace(kind="cpu"), imgsz=(64, 64), work_dir=tmp_path
    )
    with pytest.raises(BenchError, match="stop here"):
        runner.open_detector(str(checkpoint), "dfine", row.name, request)
    engine = "engine" in row.opens
    assert asked == {"fp16": engine, "trt": engine}


def _folder_with_two_graphs(folder, fp16: bool = True):
    """An artifact folder of the tiny graph as model.onnx and (the same bytes) as model.fp16.onnx."""
    import shutil

    from dfine_deploy.artifact import GraphInfo, read_artifact, write_artifact
    from dfine_deploy.files import sha256_file
    from tests.runtime.test_runtime_detector import make_artifact

    make_artifact(folder)
    info = read_artifact(folder)
    if fp16:
        shutil.copy(folder / "model.onnx", folder / "model.fp16.onnx")
        digest = sha256_file(folder / "model.fp16.onnx")
        info.graphs["fp16"] = GraphInfo(file="model.fp16.onnx", sha256=digest, precision="fp16", opset=17)
    write_artifact(folder, info)
    return folder


def test_a_folder_opens_at_the_precision_the_row_prefers_on_its_device(tmp_path, monkeypatch):
    """No branch per backend opens a folder: onnxruntime on the CPU prefers FP32 because its row says
    so; a row that prefers FP16 there opens model.fp16.onnx, and FP32 where the folder has no FP16."""
    from dfine_deploy.runtime import Detector

    both = _folder_with_two_graphs(tmp_path / "both")
    only_fp32 = _folder_with_two_graphs(tmp_path / "fp32", fp16=False)
    row = BY_NAME[BackendName.ONNXRUNTIME]
    assert row.folder_precisions["cpu"] == (Precision.FP32,)
    assert row.folder_precisions["cuda"] == (Precision.FP16, Precision.FP32)
    assert Detector.open(both, backend="onnxruntime:cpu").source.endswith("model.onnx")
    prefers_fp16 = replace(row, folder_precisions={"cpu": (Precision.FP16, Precision.FP32)})
    monkeypatch.setitem(BY_NAME, BackendName.ONNXRUNTIME, prefers_fp16)
    assert Detector.open(both, backend="onnxruntime:cpu").source.endswith("model.fp16.onnx")
    assert Detector.open(only_fp32, backend="onnxruntime:cpu").source.endswith("model.onnx")
    asked = Detector.open(both, backend="onnxruntime:cpu", precision="fp32")
    assert asked.source.endswith("model.onnx")


def test_the_rows_say_what_a_folder_opens_at():
    assert BY_NAME[BackendName.RKNN].folder_precisions == {"cpu": (Precision.FP16,)}  # model.rknn
    assert BY_NAME[BackendName.OPENVINO].folder_precisions["cpu"] == (Precision.FP32,)


def test_opening_a_folder_names_no_backend():
    """`Detector._open_artifact` reads the rows (what each opens, its precisions, its route name): it
    compares the backend asked for with "auto" only, so a new row needs no branch there."""
    import ast
    import inspect
    import textwrap

    from dfine_deploy.runtime.detector import Detector

    for method in (Detector._open_artifact, Detector._open_file):
        tree = ast.parse(textwrap.dedent(inspect.getsource(method)))
        named = {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == "BackendName"
        }
        assert named <= {"AUTO"}, f"{method.__name__} branches on {sorted(named - {'AUTO'})}"


def _request(threads: int | None):
    from dfine_deploy.runtime.backends import OpenRequest

    return OpenRequest(
        backend=BackendName.AUTO,
        provider=None,
        device="cpu",
        adapter="dfine",
        imgsz=None,
        precision=Precision.AUTO,
        threads=threads,
        memory="auto",
        names=None,
        spin_wait=False,
    )


@pytest.mark.parametrize("row", [r for r in BACKENDS if not r.takes_threads], ids=lambda row: str(row.name))
def test_a_thread_count_for_a_backend_that_sets_none_is_refused_not_ignored(row):
    """`--threads 4 --backend tensorrt` (a CPU command copied to a Jetson) was ignored without a word."""
    with pytest.raises(BackendError, match=rf"--threads 4: backend {row.name} runs on its device"):
        row.open("model.file", _request(4), None)


def test_a_backend_on_cpu_threads_gets_the_pool_size_where_none_is_asked():
    from dfine_deploy.cores import pool_threads

    seen = {}
    row = replace(
        BY_NAME[BackendName.ONNXRUNTIME],
        build=lambda cls, path, request, artifact: seen.update(t=request.threads),
    )
    row.open("model.onnx", _request(None), None)
    assert seen["t"] == pool_threads()
    row.open("model.onnx", _request(3), None)
    assert seen["t"] == 3
    assert {r.name for r in BACKENDS if r.takes_threads} == {"torch", "onnxruntime", "openvino"}
