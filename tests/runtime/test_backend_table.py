"""The backend table: every row names a real class of its own name, and what reads the table (the
--backend help, the backend parser, the install check) follows its rows."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dfine_deploy.backend_names import GRAPH_PRECISIONS, BackendName, Precision
from dfine_deploy.bench.cli import check_backend_installed
from dfine_deploy.errors import BackendError, BenchError
from dfine_deploy.runtime.backend import Backend
from dfine_deploy.runtime.backends import BACKEND_HELP, BACKENDS, BY_NAME, openers, split_backend


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
