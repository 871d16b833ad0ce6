"""Class names for models that carry none (official checkpoints) and the --names override."""

from __future__ import annotations

import json

import pytest
import torch

from dfine_deploy.class_names import coco_names, default_class_names, objects365_names, read_names_file
from dfine_deploy.errors import ConfigError


def test_names_follow_the_official_label_order():
    coco = coco_names()
    assert len(coco) == 80 and coco[0] == "person" and coco[79] == "toothbrush"
    # the official obj365_ids map COCO labels into Objects365 labels: person 0, bicycle 46, car 5
    obj365 = objects365_names()
    assert (obj365[0], obj365[46], obj365[5]) == ("Person", "Bicycle", "Car")
    assert len(obj365) == 365 and len(set(obj365)) == 365


@pytest.mark.parametrize(
    "count, first, note",
    [(80, "person", "80 = COCO"), (366, "class_0", "366 = Objects365"), (4, "class_0", "names no classes")],
)
def test_names_assumed_from_the_class_count_say_so(count, first, note):
    assumed = default_class_names(count)
    assert len(assumed.names) == count and assumed.names[0] == first and note in assumed.note


def test_objects365_outputs_are_category_ids():
    """An official 366-class model's label is the Objects365 category id (1..365; output 0 unused): the
    official solver reads COCO label i from row obj365_ids[i] + 1, so person (obj365_ids 0) is output 1."""
    names = default_class_names(366).names
    assert (names[1], names[47], names[6], names[365]) == ("Person", "Bicycle", "Car", objects365_names()[-1])


def _official_checkpoint(tmp_path, num_classes):
    from dfine_deploy.model.families import build_model
    from dfine_deploy.model.spec import size_spec

    path = tmp_path / f"dfine_n_{num_classes}.pth"
    torch.save({"model": build_model(size_spec("n").with_classes(num_classes)).state_dict()}, path)
    return path


def test_official_366_class_checkpoint_loads_with_objects365_names(tmp_path):
    from dfine_deploy.hub.loader import load_model

    loaded = load_model(_official_checkpoint(tmp_path, 366), imgsz=(320, 320))
    assert loaded.class_names[:3] == ["class_0", "Person", "Sneakers"] and len(loaded.class_names) == 366
    assert "Objects365" in loaded.class_names_note


@pytest.mark.parametrize(
    "suffix, text",
    [
        (".txt", "cat\ndog\n\nbird\n"),
        (".json", json.dumps(["cat", "dog", "bird"])),
        (".yaml", "names:\n  0: cat\n  1: dog\n  2: bird\n"),
    ],
)
def test_names_files_in_each_form(tmp_path, suffix, text):
    path = tmp_path / f"names{suffix}"
    path.write_text(text)
    assert read_names_file(path, 3) == ["cat", "dog", "bird"]


def test_a_names_file_of_the_wrong_length_is_one_clear_error(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("cat\ndog\n")
    with pytest.raises(ConfigError, match=r"names.txt: has 2 names but the model has 80 classes"):
        read_names_file(path, 80)
    with pytest.raises(ConfigError, match="--names not found: .*absent.txt"):
        read_names_file(tmp_path / "absent.txt", 80)


def test_detector_names_override_and_note(tmp_path):
    from dfine_deploy.runtime import Detector

    ckpt = _official_checkpoint(tmp_path, 80)
    with Detector.open(str(ckpt), backend="torch", imgsz=(256, 256)) as det:
        assert det.class_names[0] == "person" and "COCO" in det.class_names_note
    names = tmp_path / "mine.txt"
    names.write_text("".join(f"thing{i}\n" for i in range(80)))
    with Detector.open(str(ckpt), backend="torch", imgsz=(256, 256), names=names) as det:
        assert det.class_names[0] == "thing0" and det.class_names_note == ""


# A valid list (class_names.check_class_names): exactly num_classes distinct, non-empty, single-line
# names at every entry. Each bad list is for a 5-class model; the match is the one-line reason the
# check gives.
BAD_NAMES = {
    "newline": (["a", "b\nc", "d", "e", "f"], "line break"),
    "carriage return": (["a", "b", "c\r", "d", "e"], "line break"),
    "duplicate": (["a", "b", "a", "d", "e"], r"'a' is given twice \(names 0 and 2\)"),
    "empty": (["a", "", "c", "d", "e"], "name 1 is empty"),
    "blank": (["a", "b", "   ", "d", "e"], "name 2 is empty"),
    "padded": (["a", "b", "c", " d", "e"], "spaces around it"),
    "too few": (["a", "b", "c", "d"], "has 4 names but the model has 5 classes"),
    "too many": (["a", "b", "c", "d", "e", "f"], "has 6 names but the model has 5 classes"),
    "not text": (["a", "b", None, "d", "e"], "name 2 is NoneType"),
}
BAD = pytest.mark.parametrize("bad, reason", BAD_NAMES.values(), ids=BAD_NAMES.keys())
GOOD = ["cat", "dog", "traffic light", "bird", "cow"]


def _artifact_with_names(folder, names, num_classes=5):
    from tests.runtime.test_runtime_detector import make_artifact

    make_artifact(folder, classes=5)
    sidecar = json.loads((folder / "model.json").read_text())
    sidecar.update(class_names=names, num_classes=num_classes)
    (folder / "model.json").write_text(json.dumps(sidecar))
    return folder


def _names_file(tmp_path, names):
    path = tmp_path / "names.json"
    path.write_text(json.dumps(names))
    return path


@BAD
def test_a_names_file_with_bad_names_is_refused_in_one_line(tmp_path, bad, reason):
    with pytest.raises(ConfigError, match=reason) as err:
        read_names_file(_names_file(tmp_path, bad), 5)
    assert "names.json" in str(err.value) and "\n" not in str(err.value).replace("\\n", "")


@pytest.mark.parametrize(
    "text, reason",
    [
        ("a\nb\na\nc\nd\n", "'a' is given twice"),
        ("a\nb\nc\n", "has 3 names"),
        ("a\nb\x0bx\nc\nd\ne\n", "control"),
    ],
)
def test_a_text_names_file_is_split_on_newlines_only_and_checked(tmp_path, text, reason):
    path = tmp_path / "names.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=reason):
        read_names_file(path, 5)


@BAD
def test_a_sidecar_with_bad_names_or_another_class_count_is_refused(tmp_path, bad, reason):
    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.errors import BackendError
    from dfine_deploy.export import deepstream
    from dfine_deploy.runtime import Detector

    folder = _artifact_with_names(tmp_path / "art", bad)
    with pytest.raises(BackendError, match=reason):
        read_artifact(folder)
    with pytest.raises(BackendError, match=r"model.json: class_names"):
        Detector.open(folder, backend="onnxruntime", device="cpu")
    with pytest.raises(BackendError, match=reason):
        deepstream.write_config(folder)  # labels.txt would be shifted by a name with a line break
    assert not (folder / "labels.txt").exists()


def test_a_sidecar_whose_count_and_names_disagree_is_not_trusted(tmp_path):
    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.errors import BackendError

    for count, reason in ((6, "has 5 names but the model has 6 classes"), (0, "num_classes 0")):
        with pytest.raises(BackendError, match=reason):
            read_artifact(_artifact_with_names(tmp_path / f"c{count}", GOOD, num_classes=count))
    assert read_artifact(_artifact_with_names(tmp_path / "ok", GOOD)).class_names == GOOD


@pytest.fixture(scope="module")
def five_class_weights(tmp_path_factory):
    return torch.load(_official_checkpoint(tmp_path_factory.mktemp("ckpt"), 5))["model"]


@BAD
def test_checkpoint_meta_with_bad_names_is_refused(tmp_path, five_class_weights, bad, reason):
    from dfine_deploy.errors import CheckpointError
    from dfine_deploy.hub.loader import load_model

    path = tmp_path / "bad_names.pth"
    torch.save({"model": five_class_weights, "meta": {"class_names": bad}}, path)
    with pytest.raises(CheckpointError, match=rf"bad_names.pth: meta class_names: .*{reason}"):
        load_model(path, imgsz=(256, 256))


def test_checkpoint_meta_names_are_used_replaced_by_a_file_or_dropped_with_the_heads(
    tmp_path, five_class_weights
):
    from dfine_deploy.hub.loader import load_model

    path = tmp_path / "named.pth"
    torch.save({"model": five_class_weights, "meta": {"class_names": ["x"] * 5}}, path)
    assert load_model(path, imgsz=(256, 256), names=_names_file(tmp_path, GOOD)).class_names == GOOD
    torch.save({"model": five_class_weights, "meta": {"class_names": GOOD}}, path)
    assert load_model(path, imgsz=(256, 256)).class_names == GOOD
    with pytest.warns(UserWarning, match="re-initialised"):
        loaded = load_model(path, imgsz=(256, 256), num_classes=3)
    assert (
        loaded.class_names == ["class_0", "class_1", "class_2"]
        and "names no classes" in loaded.class_names_note
    )


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
@pytest.mark.parametrize("classes", [80, 5])
def test_a_bare_onnx_takes_a_correct_names_file_on_every_backend(tmp_path, backend, classes):
    """OpenVINO's opener once handed the adapter a (names, note) pair: two "names", so every names
    file of the right length was refused."""
    from dfine_deploy.errors import BackendError
    from dfine_deploy.runtime import Detector
    from dfine_deploy.runtime.adapters import make_adapter
    from tests.runtime.tiny_graphs import dfine_like

    graph = dfine_like(tmp_path / "bare.onnx", classes=classes)
    plain = Detector.open(graph, backend=backend, device="cpu")
    assert len(plain.class_names) == classes and all(isinstance(n, str) for n in plain.class_names)
    assert plain.class_names_note  # assumed names say so
    mine = [f"thing {i}" for i in range(classes)]
    named = Detector.open(graph, backend=backend, device="cpu", names=_names_file(tmp_path, mine))
    assert named.class_names == mine and named.class_names_note == ""
    with pytest.raises(ConfigError, match=f"has {classes + 1} names but the model has {classes} classes"):
        Detector.open(graph, backend=backend, device="cpu", names=_names_file(tmp_path, [*mine, "extra"]))
    with pytest.raises(ConfigError, match="is given twice"):
        Detector.open(graph, backend=backend, device="cpu", names=_names_file(tmp_path, ["x"] * classes))
    with pytest.raises(BackendError, match="line break"):
        make_adapter("dfine", ["a", "b\nc"])


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_names_in_a_graphs_metadata_are_read_and_checked_on_every_backend(tmp_path, backend):
    import numpy as np

    from dfine_deploy.errors import BackendError
    from dfine_deploy.runtime import Detector
    from tests.runtime.tiny_graphs import yolo_like

    table = np.zeros((4 + 3, 2), np.float32)

    def open_with(names, name):
        graph = yolo_like(tmp_path / f"{name}.onnx", table, 32, names=names)
        return Detector.open(graph, backend=backend, device="cpu", adapter="yolo")

    assert open_with({0: "a", 1: "b", 2: "c"}, "good").class_names == ["a", "b", "c"]
    for names, reason in (({0: "a", 1: "a", 2: "c"}, "given twice"), ({0: "a", 2: "c"}, "keys 0..N-1")):
        with pytest.raises(BackendError, match=reason):
            open_with(names, reason.split()[0])


def test_dataset_categories_with_bad_names_are_refused_before_training(tmp_path):
    from dfine_deploy.data.classmap import ClassMap
    from dfine_deploy.errors import DatasetError

    for bad, reason in (("a\nb", "line break"), ("", "empty"), ("car", "given twice")):
        categories = [{"id": 1, "name": "car"}, {"id": 2, "name": bad}]
        with pytest.raises(DatasetError, match=rf"dataset categories.*{reason}"):
            ClassMap.from_categories(categories, remap=True)


def test_export_and_bench_refuse_a_bad_names_file_in_one_line_before_any_work(tmp_path, capsys):
    from dfine_deploy.bench.cli import main as bench_main
    from dfine_deploy.errors import DfineError
    from dfine_deploy.export.pipeline import export_artifact
    from dfine_deploy.export.settings import ExportSettings

    bad = _names_file(tmp_path, ["a", "b", "a", "d", "e"])
    out = tmp_path / "out"
    with pytest.raises(DfineError, match="given twice"):
        export_artifact(ExportSettings(model=str(_official_checkpoint(tmp_path, 5)), output=out, names=bad))
    assert not out.exists() and not list(tmp_path.glob(".out.*"))
    art = _artifact_with_names(tmp_path / "art", GOOD)
    code = bench_main(["--model", str(art), "--runs", "1", "--warmup", "0", "--names", str(bad)])
    err = capsys.readouterr().err
    assert code == 2 and "given twice" in err and "Traceback" not in err


def test_serve_loads_a_correct_names_file_and_refuses_a_bad_one(tmp_path):
    from dfine_deploy.serve.app import load_detector
    from dfine_deploy.serve.settings import ServeSettings
    from tests.runtime.tiny_graphs import dfine_like

    graph = str(dfine_like(tmp_path / "bare.onnx", classes=5))
    good = load_detector(ServeSettings(model=graph, backend="openvino", names=_names_file(tmp_path, GOOD)))
    assert good.class_names == GOOD
    for bad, reason in (["a", "b", "c", "d\ne", "f"], "line break"), (["a"] * 5, "given twice"):
        with pytest.raises(ConfigError, match=reason):
            load_detector(ServeSettings(model=graph, backend="openvino", names=_names_file(tmp_path, bad)))
