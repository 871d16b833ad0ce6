"""A damaged or hand-edited model.json is refused in one line naming the field, before any graph runs:
a sidecar without a `sha256` or naming a graph that is not in the folder ended in a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dfine_deploy.bench.cli import main as bench_main
from dfine_deploy.errors import BackendError
from dfine_deploy.runtime import Detector
from tests.runtime.test_runtime_detector import make_artifact


def _edited(tmp_path: Path, edit) -> Path:
    folder = make_artifact(tmp_path / "art")
    sidecar = json.loads((folder / "model.json").read_text())
    edit(sidecar)
    (folder / "model.json").write_text(json.dumps(sidecar))
    return folder


def _engine(sidecar):
    sidecar["engines"] = {"fp16": {"file": "model.engine", "sha256": "0" * 64}}


EDITS = {
    "no sha256": (lambda s: s["graphs"]["fp32"].pop("sha256"), "graphs.fp32.sha256 is missing"),
    "sha256 not hex": (lambda s: s["graphs"]["fp32"].update(sha256="xyz"), "graphs.fp32.sha256 'xyz' is not"),
    "sha256 a number": (lambda s: s["graphs"]["fp32"].update(sha256=7), "graphs.fp32.sha256 must be str"),
    "file outside": (
        lambda s: s["graphs"]["fp32"].update(file="../model.onnx"),
        "graphs.fp32.file '../model.onnx' must be a file name inside the artifact folder",
    ),
    "graph not an object": (lambda s: s["graphs"].update(fp32="model.onnx"), "graphs.fp32 must be an object"),
    "no fp32 graph": (lambda s: s.update(graphs={}), "no fp32 graph among []"),
    "size a string": (lambda s: s.update(input_height="64"), "input_height must be int, found '64'"),
    "size zero": (
        lambda s: s.update(input_width=0),
        "input size 64 x 0: both must be positive multiples of 32",
    ),
    "size off stride": (lambda s: s.update(input_width=48), "input size 64 x 48"),
    "batch order": (lambda s: s.update(batch_min=4, batch_max=2), "batch range 4 1 2"),
    "no classes": (lambda s: s.update(num_classes=0), "num_classes 0"),
    "flag a number": (lambda s: s.update(postprocess=1), "postprocess must be bool, found 1"),
    "unknown field": (lambda s: s.update(colour="RGB"), "unknown field colour"),
    "missing field": (lambda s: s.pop("num_classes"), "num_classes is missing"),
    "engine incomplete": (_engine, "engines.fp16.source_graph is missing"),
    "other colour": (lambda s: s.update(color="BGR"), "color 'BGR'"),
    "backend map": (
        lambda s: s.update(backend_graphs={"openvino": ["fp32"]}),
        "backend_graphs.openvino must map",
    ),
}


@pytest.mark.parametrize("name", list(EDITS))
def test_every_sidecar_field_is_checked_when_it_is_read(tmp_path, name):
    edit, words = EDITS[name]
    folder = _edited(tmp_path, edit)
    with pytest.raises(BackendError) as caught:
        Detector.open(folder, backend="onnxruntime", device="cpu")
    message = str(caught.value)
    assert words in message and "re-export" in message and "\n" not in message


def test_a_sidecar_that_is_not_json_or_not_an_object(tmp_path):
    folder = make_artifact(tmp_path / "art")
    for content, words in (
        (b"\xff\xfe not text", "unreadable sidecar"),
        (b"[1, 2]", "the sidecar must be a JSON object, found list"),
    ):
        (folder / "model.json").write_bytes(content)
        with pytest.raises(BackendError) as caught:
            Detector.open(folder, backend="onnxruntime", device="cpu")
        assert words in str(caught.value)


def test_a_sidecar_saved_with_a_byte_order_mark_is_read(tmp_path):
    """An editor on Windows saves model.json with a UTF-8 byte-order mark; configs with one are read,
    and so is the sidecar (it was refused with "re-export")."""
    folder = make_artifact(tmp_path / "art")
    sidecar = folder / "model.json"
    sidecar.write_bytes(b"\xef\xbb\xbf" + sidecar.read_bytes())
    detector = Detector.open(folder, backend="onnxruntime", device="cpu")
    assert detector.class_names


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_a_graph_the_sidecar_names_but_the_folder_lacks(tmp_path, backend):
    folder = make_artifact(tmp_path / "art")
    (folder / "model.onnx").unlink()
    with pytest.raises(
        BackendError, match=r"model.onnx: model.json names this file, and it is not in the folder"
    ):
        Detector.open(folder, backend=backend, device="cpu")


def test_openvino_checks_the_graph_hash_too(tmp_path):
    """OpenVINO opened a swapped graph without comparing it to the sidecar's sha256."""
    folder = make_artifact(tmp_path / "art")
    with open(folder / "model.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(BackendError, match="its sha256 .* is not the one model.json records"):
        Detector.open(folder, backend="openvino", device="cpu")


@pytest.mark.parametrize("name", ["no sha256", "graph not an object", "size a string"])
def test_the_commands_print_one_line(tmp_path, capsys, name):
    folder = _edited(tmp_path, EDITS[name][0])
    assert bench_main(["--model", str(folder), "--device", "cpu", "--runs", "1"]) == 2
    err = capsys.readouterr().err
    assert EDITS[name][1] in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err
