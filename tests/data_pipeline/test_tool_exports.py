"""Labelling tools' exports read where they stand (dfine_deploy/data/formats.py): each layout, given
its root folder or its annotation file, is recognised, says so in one line, and gives the very
boxes and names of the plain COCO split it was made from; `dfine-data validate`, `dfine-bench
--data`'s scorer and the export gate score the same detections to the same AP on every layout."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from PIL import Image

from dfine_deploy.data.formats import open_dataset
from dfine_deploy.data.synthetic import CLASS_NAMES, write_split
from dfine_deploy.data.validation import ValidationPolicy
from dfine_deploy.errors import DatasetError
from tests.data_pipeline.tool_exports import EXPORTS, REFUSED

CSV_HEADER = "filename,width,height,class,xmin,ymin,xmax,ymax\n"

TITLES = {
    "coco": "COCO dataset",
    "roboflow-coco": "Roboflow COCO export",
    "roboflow-box-list": "Roboflow Tensorflow CSV or CreateML export",
    "cvat-coco": "CVAT COCO 1.0 export",
    "cvat-xml": "CVAT for images 1.1 export",
    "cvat-yolo": "CVAT YOLO 1.1 export",
    "label-studio-coco": "Label Studio COCO export",
    "label-studio-yolo": "Label Studio YOLO export",
    "yolo-beside": "labelImg or Roboflow Darknet YOLO export",
    "yolo": "YOLO dataset (data.yaml)",
    "voc": "Pascal VOC dataset",
    "voc-beside": "labelImg or Roboflow Pascal VOC export",
    "labelme": "LabelMe or X-AnyLabeling folder",
}


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Six val scenes of the synthetic shapes, and every tool's export of them."""
    root = tmp_path_factory.mktemp("exports")
    write_split(root, "val", 6, seed=3, size=96)
    return {name: write(root / "val", root / name) for name, write in EXPORTS.items()}


def _content(annotations) -> list:
    """Per image (in pixel order, whatever the file is called): its size and its (name, box) pairs."""
    names = {c["id"]: c["name"] for c in annotations.categories}
    out = []
    for record in annotations.records:
        pixels = (annotations.img_folder / record.file_name).read_bytes()
        boxes = sorted(
            (names[int(c)], *np.round(b, 3).tolist())
            for c, b in zip(record.category_ids.tolist(), record.boxes)
        )
        out.append((hashlib.sha1(pixels).hexdigest(), record.width, record.height, boxes))
    return sorted(out)


@pytest.mark.parametrize("layout", list(EXPORTS))
@pytest.mark.parametrize("given", ["root", "file"])
def test_each_export_gives_the_plain_split_s_boxes_and_names(exports, layout, given):
    root, ann_file = exports[layout]
    dataset = open_dataset(root if given == "root" else ann_file)
    assert dataset.format.name == layout
    annotations = dataset.load("val")
    assert annotations.layout.startswith(
        f"data: {root if given == 'root' else ann_file} read as a {TITLES[layout]}"
    )
    assert _content(annotations) == _content(open_dataset(exports["coco"][0]).load("val"))
    assert sorted(c["name"] for c in annotations.categories) == sorted(CLASS_NAMES)


def test_the_roboflow_placeholder_is_left_out_and_another_empty_category_is_reported(exports, tmp_path):
    root, ann_file = exports["roboflow-coco"]
    annotations = open_dataset(root).load("val")
    assert [line for line in annotations.notes if "Roboflow project placeholder" in line] == [
        f"{ann_file}: category 0 'shapes-x1y2' is the Roboflow project placeholder (no boxes, the "
        "supercategory of the other 4): left out of the class map"
    ]
    assert 0 not in {c["id"] for c in annotations.categories}
    data = json.loads(ann_file.read_text())
    data["categories"].append({"id": 9, "name": "kite", "supercategory": "shapes-x1y2"})
    edited = tmp_path / "valid"
    edited.mkdir()
    for path in ann_file.parent.iterdir():
        (edited / path.name).write_bytes(path.read_bytes())
    (edited / "_annotations.coco.json").write_text(json.dumps(data))
    annotations = open_dataset(edited).load()
    assert any("Roboflow project placeholder" in line for line in annotations.notes)
    assert [line for line in annotations.notes if "have no box here" in line] == [
        f"{edited / '_annotations.coco.json'}: 1 of 5 categories have no box here (9 'kite')"
    ]
    # an empty category 0 that is not the others' supercategory is a class, and is reported, not dropped
    data["categories"][0]["name"] = "background"
    (edited / "_annotations.coco.json").write_text(json.dumps(data))
    annotations = open_dataset(edited).load()
    assert 0 in {c["id"] for c in annotations.categories}
    assert not any("Roboflow project placeholder" in line for line in annotations.notes)
    assert "(0 'background', 9 'kite')" in annotations.notes[-1]


@pytest.mark.parametrize("layout", list(EXPORTS))
def test_dfine_data_validate_reads_each_export_and_says_which_layout(exports, layout, capsys):
    from dfine_deploy.data.cli import main

    root, _ = exports[layout]
    assert main(["validate", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith(f"data: {root} read as a {TITLES[layout]}")
    assert "4 categories" in out


def _scored_detections(exports) -> dict[str, list]:
    """Detections for each val image (keyed by its pixels), made from the plain split's boxes moved
    by a few pixels each, so that the AP lies well inside (0, 1) and any box or class misread by a
    reader would change it: (name, xyxy, score), every score its own (a tie would be broken by image
    order, which differs between layouts)."""
    plain = open_dataset(exports["coco"][0]).load("val")
    rng = np.random.default_rng(0)
    table = {}
    for record in plain.records:
        pixels = (plain.img_folder / record.file_name).read_bytes()
        names = [CLASS_NAMES[c] for c in record.category_ids.tolist()]
        boxes = record.boxes + rng.uniform(-6, 6, record.boxes.shape)
        scores = rng.uniform(0.3, 0.95, len(names))
        table[hashlib.sha1(pixels).hexdigest()] = list(zip(names, boxes.tolist(), scores.tolist()))
    return table


class KeyedDetector:
    """A detector that finds, for each frame, the detections the table holds for its pixels (what a
    model would find in that image, whichever file it was read from)."""

    class_names = list(CLASS_NAMES)
    class_names_note = ""
    max_batch = 4
    thresholds = SimpleNamespace(chosen={})  # no thresholds chosen at export (Detector.thresholds)

    def __init__(self, table: dict, frames: dict):
        self.table, self.frames = table, frames

    def predict(self, frames, *, color="BGR"):
        out = []
        for frame in frames:
            found = self.table[self.frames[hashlib.sha1(np.ascontiguousarray(frame).tobytes()).hexdigest()]]
            out.append(
                SimpleNamespace(
                    boxes=np.array([b for _, b, _ in found], np.float32).reshape(-1, 4),
                    scores=np.array([s for _, _, s in found], np.float32),
                    labels=np.array([CLASS_NAMES.index(n) for n, _, _ in found], np.int64),
                )
            )
        return out


def _pixel_keys(exports) -> dict[str, str]:
    """sha1 of each image's decoded RGB pixels -> sha1 of its file bytes (the table's key)."""
    from dfine_deploy.images import read_image

    plain = open_dataset(exports["coco"][0]).load("val")
    keys = {}
    for record in plain.records:
        path = plain.img_folder / record.file_name
        keys[hashlib.sha1(read_image(path).tobytes()).hexdigest()] = hashlib.sha1(
            path.read_bytes()
        ).hexdigest()
    return keys


@pytest.mark.parametrize("layout", list(EXPORTS))
def test_dfine_bench_data_scores_each_export_as_the_plain_split(exports, layout, capsys):
    pytest.importorskip("faster_coco_eval")
    from dfine_deploy.bench.accuracy import coco_map

    detector = KeyedDetector(_scored_detections(exports), _pixel_keys(exports))
    reference = coco_map(detector, exports["coco"][0]).map50_95
    assert 0.1 < reference < 0.95
    root, ann_file = exports[layout]
    for given in (root, ann_file):
        assert coco_map(detector, given).map50_95 == pytest.approx(reference, abs=1e-4)
        assert f"data: {given} read as a {TITLES[layout]}" in capsys.readouterr().err


@pytest.mark.parametrize("layout", list(EXPORTS))
def test_the_export_gate_scores_each_export_as_the_plain_split(exports, layout, tmp_path, capsys):
    pytest.importorskip("faster_coco_eval")
    from dfine_deploy.export.gate_inputs import dataset_scorer, parity_inputs
    from dfine_deploy.export.settings import ExportSettings

    table = _scored_detections(exports)

    def score(data: Path) -> float:
        opts = ExportSettings(model="dfine-n", output=tmp_path / "out", imgsz=(96, 96), data=data)
        batches, coco = parity_inputs(opts)
        keys = {}  # the resized batch image -> the file it came from, via the plain split's order
        outputs = []
        for batch in batches:
            labels, boxes, scores = [], [], []
            for image in batch.images:
                found = table[keys.setdefault(image.tobytes(), _key_of(image, exports))]
                pad = 12 - len(found)
                labels.append(np.array([CLASS_NAMES.index(n) for n, _, _ in found] + [0] * pad, np.int64))
                boxes.append(np.array([b for _, b, _ in found] + [[0.0] * 4] * pad, np.float32))
                scores.append(np.array([s for _, _, s in found] + [0.0] * pad, np.float32))
            outputs.append((np.stack(labels), np.stack(boxes), np.stack(scores)))
        return dataset_scorer(coco, CLASS_NAMES)(batches, outputs)

    reference = score(exports["coco"][0])
    assert 10 < reference < 95
    root, ann_file = exports[layout]
    for given in (root, ann_file):
        assert score(given) == pytest.approx(reference, abs=1e-2)  # in percent: 1e-4 of AP
        assert f"data: {given} read as a {TITLES[layout]}" in capsys.readouterr().out


def _key_of(batch_image: np.ndarray, exports) -> str:
    """The file key of a resized batch image: the plain split's image that resizes to the same array."""
    from dfine_deploy.export import parity
    from dfine_deploy.images import read_image

    plain = open_dataset(exports["coco"][0]).load("val")
    for record in plain.records:
        path = plain.img_folder / record.file_name
        resized = parity.make_batches([read_image(path)], 96, 96, [1])[0].images[0]
        if np.array_equal(resized, batch_image):
            return hashlib.sha1(path.read_bytes()).hexdigest()
    raise AssertionError("a gate image that is none of the plain split's")


@pytest.mark.parametrize("layout", list(EXPORTS))
def test_the_format_table_says_which_layouts_take_an_image_folder_and_a_split_name(exports, layout, tmp_path):
    """Every entry point asks the row, not the file's suffix: only a plain COCO json takes an image
    folder (the others say where theirs are), and only a dataset of named splits takes a split name."""
    from dfine_deploy.data.formats import FORMATS
    from dfine_deploy.errors import DatasetError

    root, ann_file = exports[layout]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (row,) = [f for f in FORMATS if f.name == layout]
    for given in (root, ann_file):
        if row.takes_img_folder:
            dataset = open_dataset(given, img_folder=exports["coco"][0], img_folder_option="--img-folder")
            assert dataset.split(None).images == exports["coco"][0]
        else:
            with pytest.raises(DatasetError) as caught:
                open_dataset(given, img_folder=elsewhere, img_folder_option="--img-folder")
            assert str(caught.value) == (
                f"--img-folder {elsewhere}: {given} is a {TITLES[layout]}, which says where its images "
                "are; leave --img-folder out (it is for a plain COCO json)"
            )
            # a training config's img_folder left beside an export's ann_file: the export's own images
            assert open_dataset(given, img_folder=elsewhere).split(None).images != elsewhere
        dataset = open_dataset(given)
        if len(dataset.splits) == 1 and not dataset.splits[0].name:
            with pytest.raises(
                DatasetError, match=re.escape(f"--split train: {given} is a {TITLES[layout]} of one split")
            ):
                dataset.load("train", chosen=True)
        else:
            assert dataset.load("val", chosen=True).records


@pytest.mark.parametrize("layout", list(EXPORTS))
def test_test_only_s_data_path_scores_each_export_as_the_plain_split(exports, layout, capsys):
    """What `--test-only -u val_dataloader.dataset.ann_file=EXPORT` does with a model's detections:
    the val split read through the format table, met to the train split's labels by name
    (data/loader.build_dataset) and scored by the trainer's CocoEvaluator, for the export's root and
    its annotation file. The same detections per image (keyed by its pixels) give the plain split's AP."""
    pytest.importorskip("faster_coco_eval")
    from dfine_deploy.data.loader import build_dataset
    from dfine_deploy.evaluation import CocoEvaluator
    from dfine_deploy.settings import DataSettings

    table = _scored_detections(exports)
    plain = exports["coco"][0]
    train = build_dataset(
        DataSettings(ann_file=str(plain / "annotations.json"), img_folder=str(plain), num_classes=4)
    )
    labels = list(train.class_map.class_names)

    def score(given: Path) -> float:
        val = build_dataset(
            DataSettings(ann_file=str(given), img_folder=str(plain), split="val", num_classes=4),
            class_map=train.class_map,
        )
        evaluator = CocoEvaluator(val.coco_gt(), val.class_map)
        for record in val.annotations.records:
            found = table[
                hashlib.sha1((val.annotations.img_folder / record.file_name).read_bytes()).hexdigest()
            ]
            result = {
                "boxes": np.array([b for _, b, _ in found], np.float32).reshape(-1, 4),
                "scores": np.array([s for _, _, s in found], np.float32),
                "labels": np.array([labels.index(n) for n, _, _ in found], np.int64),
            }
            evaluator.update([record.image_id], [result])
        return evaluator.summarize(per_class=False)["AP"]

    reference = score(plain / "annotations.json")
    assert 0.1 < reference < 0.95
    root, ann_file = exports[layout]
    for given in (root, ann_file):
        assert score(given) == pytest.approx(reference, abs=1e-4)


@pytest.mark.parametrize("tool", list(REFUSED))
def test_another_tool_s_json_is_refused_by_name_with_the_export_to_choose(exports, tool, tmp_path, capsys):
    """Datumaro, LabelMe and Label Studio's own JSON exports are not COCO: each reader names the tool's
    format and the export that we read, in one line (they were "found NoneType" or "a list")."""
    from dfine_deploy.data.cli import main

    write, what, fix = REFUSED[tool]
    root, ann_file = write(exports["coco"][0], tmp_path / tool)
    for given in (ann_file, root):  # the json, or the export's folder (it was "no dataset found")
        with pytest.raises(DatasetError, match=re.escape(f"{ann_file}: {what}")) as err:
            open_dataset(given).load("val")
        assert fix in str(err.value) and "\n" not in str(err.value)
        assert main(["validate", str(given)]) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert what in line and fix in line


def test_label_studio_server_paths_are_read_from_images_by_name_and_counted(exports, tmp_path):
    """A Label Studio COCO export lists `/data/upload/<project>/<tag>-<name>` for images it did not
    copy: each is the file of that name in images/ (as uploaded, or without the tag), counted."""
    root, ann_file = exports["label-studio-coco"]
    edited = tmp_path / "ls"
    shutil.copytree(root, edited)
    data = json.loads(ann_file.read_text())
    for index, image in enumerate(data["images"]):
        name = Path(image["file_name"]).name
        image["file_name"] = f"/data/upload/1/{name}"
        if index == 0:  # the user's own copy, without Label Studio's tag
            (edited / "images" / name).rename(edited / "images" / name.split("-", 1)[1])
    (edited / "result.json").write_text(json.dumps(data))
    annotations = open_dataset(edited).load("val")
    assert _content(annotations) == _content(open_dataset(exports["coco"][0]).load("val"))
    report = annotations.report
    assert report.counts["server_path"] == len(data["images"]) and report.actions["server_path"] == "fix"
    assert (
        f"/data/upload/1/{Path(data['images'][1]['file_name']).name} -> {edited / 'images'}"
        in report.format()
    )
    with pytest.raises(DatasetError, match=r"server_path \(6\)"):
        open_dataset(edited).load("val", policy=ValidationPolicy(server_path="error"))


def test_cvat_xml_shapes_read_as_boxes_or_left_out_are_counted(exports):
    """CVAT for images: a polygon and a rotated box are read as the upright box that holds them, a
    polyline and a tag are left out; each is counted under its own problem, and `error` stops."""
    root, xml = exports["cvat-xml"]
    report = open_dataset(root).load().report
    assert report.counts["shape_as_box"] == 2 and report.actions["shape_as_box"] == "fix"
    assert report.counts["shape_not_box"] == 2 and report.actions["shape_not_box"] == "skip"
    assert f"{xml}: image '000003.jpg': 1 polyline" in report.format()
    for problem in ("shape_as_box", "shape_not_box"):
        with pytest.raises(DatasetError, match=rf"{problem} \(2\)"):
            open_dataset(root).load(policy=ValidationPolicy(**{problem: "error"}))


def test_a_cvat_project_export_gives_a_split_per_subset(exports, tmp_path):
    """A project's CVAT for images export names each image's subset (Train, Validation) and keeps
    its images under images/<subset>/: each subset is a split of ours."""
    root, xml = exports["cvat-xml"]
    project = tmp_path / "project"
    (project / "images").mkdir(parents=True)
    text = xml.read_text().replace("<task>", "<project>").replace("</task>", "</project>")
    for index, subset in enumerate(["Train", "Train", "Train", "Validation", "Validation", "Validation"]):
        name = f"{index + 1:06d}.jpg"
        (project / "images" / subset).mkdir(exist_ok=True)
        shutil.copyfile(root / "images" / name, project / "images" / subset / name)
        text = text.replace(f'<image id="{index}" ', f'<image id="{index}" subset="{subset}" task_id="3" ')
    (project / "annotations.xml").write_text(text)
    dataset = open_dataset(project)
    assert [(s.name, s.images) for s in dataset.splits] == [
        ("train", project / "images" / "Train"),
        ("val", project / "images" / "Validation"),
    ]
    train, val = dataset.load("train"), dataset.load("val")
    assert len(train.records) == 3 and len(val.records) == 3
    assert sorted(_content(train) + _content(val)) == _content(open_dataset(exports["coco"][0]).load("val"))


def test_cvat_exports_we_cannot_read_are_refused_by_name_with_the_export_to_choose(exports, tmp_path, capsys):
    """CVAT for video (tracks), an XML or a YOLO export saved without its images, and a box whose
    label the task does not list: one line each, naming the file and what to export instead."""
    from dfine_deploy.data.cli import main

    root, xml = exports["cvat-xml"]
    video = tmp_path / "video"
    (video / "images").mkdir(parents=True)
    (video / "annotations.xml").write_text(
        '<?xml version="1.0"?><annotations><version>1.1</version><meta><task><labels><label><name>car'
        '</name></label></labels></task></meta><track id="0" label="car" source="manual"><box frame="0" '
        'keyframe="1" outside="0" occluded="0" xtl="1" ytl="1" xbr="9" ybr="9" z_order="0"/></track>'
        "</annotations>"
    )
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copyfile(xml, bare / "annotations.xml")
    labels_only = tmp_path / "labels-only"
    shutil.copytree(exports["cvat-yolo"][0], labels_only)
    for image in (labels_only / "obj_train_data").glob("*.jpg"):
        image.unlink()
    unknown = tmp_path / "unknown"
    shutil.copytree(root, unknown)
    (unknown / "annotations.xml").write_text(
        xml.read_text().replace('label="ring" source', 'label="kite" source')
    )
    cases = {
        video: f"{video / 'annotations.xml'}: a CVAT for video 1.1 export (tracks of frames, no images); "
        "export 'CVAT for images 1.1' (or 'COCO 1.0') with images from CVAT instead",
        bare: f"{bare / 'annotations.xml'}: a CVAT for images export without its images (no images/ "
        "beside it); export it again from CVAT with 'Save images' ticked",
        labels_only: f"YOLO images folder {labels_only / 'obj_train_data'} holds no images",
        unknown: "label 'kite' is not among the task's labels",
    }
    for given, line in cases.items():
        with pytest.raises(DatasetError) as caught:
            open_dataset(given).load()
        assert line in str(caught.value) and "\n" not in str(caught.value)
        assert main(["validate", str(given)]) == 2
        assert line in capsys.readouterr().err
    with pytest.raises(DatasetError, match="label files only: export again with the images"):
        open_dataset(labels_only).load()


@pytest.mark.parametrize(
    ("writer", "layout", "title"),
    [
        ("labelimg", "voc-beside", "labelImg or Roboflow Pascal VOC export"),
        ("labelimg_yolo", "yolo-beside", "labelImg or Roboflow Darknet YOLO export"),
    ],
)
def test_a_labelimg_folder_is_one_split_read_where_it_stands(
    exports, tmp_path, capsys, writer, layout, title
):
    """labelImg saves each image's VOC XML (or YOLO .txt, with classes.txt) beside it in the folder
    it was opened on: that folder, or its annotation file, is a dataset of one split with the plain
    split's boxes and names."""
    from dfine_deploy.data.cli import main
    from tests.data_pipeline import tool_exports

    root, named = getattr(tool_exports, writer)(exports["coco"][0], tmp_path / "labelled")
    (root / "notes.xml").write_text("<notes>not an annotation</notes>")  # another file there is passed over
    for given in (root, named):
        dataset = open_dataset(given)
        assert dataset.format.name == layout and [s.name for s in dataset.splits] == [""]
        annotations = dataset.load("val")
        assert _content(annotations) == _content(open_dataset(exports["coco"][0]).load("val"))
    assert main(["validate", str(root)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"data: {root} read as a {title}")
    assert "no problems found" in out and "4 categories" in out


@pytest.mark.parametrize("writer", ["roboflow_csv", "roboflow_createml", "roboflow_voc"])
def test_an_export_without_a_class_list_numbers_the_classes_of_all_its_splits(exports, tmp_path, writer):
    """Roboflow's CSV, CreateML and Pascal VOC exports list no classes: the train split (one image
    here) and the val split get their ids from the labels of both, so that a class missing from one
    split does not shift the ids of the others; given a split folder, its sibling splits still count."""
    from tests.data_pipeline import tool_exports

    root, named = getattr(tool_exports, writer)(exports["coco"][0], tmp_path / writer)
    val = open_dataset(named).load()
    assert _content(val) == _content(open_dataset(exports["coco"][0]).load("val"))
    everywhere = [c["name"] for c in val.categories]
    train = open_dataset(root).load("train")
    assert [c["name"] for c in train.categories] == everywhere == sorted(CLASS_NAMES)
    assert len({int(c) for r in train.records for c in r.category_ids.tolist()}) < len(everywhere)
    assert [c["name"] for c in open_dataset(root / "train").load().categories] == everywhere


def test_a_csv_export_reads_the_images_it_has_no_row_for_as_images_without_boxes(exports, tmp_path):
    """Roboflow's CSV has no row for an image without boxes: the folder's other images are read, and
    validation counts them (empty_image), instead of leaving them out without a word."""
    from tests.data_pipeline.tool_exports import roboflow_csv

    root, csv_file = roboflow_csv(exports["coco"][0], tmp_path / "csv")
    Image.fromarray(np.full((96, 96, 3), 30, np.uint8)).save(root / "valid" / "background.jpg")
    loaded = open_dataset(root).load("val")
    assert len(loaded.records) == 7 and loaded.report.counts["empty_image"] == 1
    assert "background.jpg" in loaded.report.format()


def test_a_box_list_under_a_name_of_its_own_is_read_by_its_content(exports, tmp_path):
    """Create ML takes a json of any name, and a TensorFlow CSV is often `train_labels.csv`: each is
    read by its content (a json list of images, the CSV header), not Roboflow's file name alone."""
    from tests.data_pipeline.tool_exports import roboflow_createml, roboflow_csv

    for writer, name in ((roboflow_createml, "boxes.json"), (roboflow_csv, "valid_labels.csv")):
        root, named = writer(exports["coco"][0], tmp_path / name)
        renamed = named.rename(named.parent / name)
        dataset = open_dataset(renamed)
        assert dataset.format.name == "roboflow-box-list"
        assert _content(dataset.load()) == _content(open_dataset(exports["coco"][0]).load("val"))
    root, json_file = REFUSED["label-studio-json"][0](exports["coco"][0], tmp_path / "ls")
    with pytest.raises(DatasetError, match="Label Studio"):  # a json list of another tool: still named
        open_dataset(json_file).load()


def test_a_path_that_is_not_there_is_no_layout_of_any_row(tmp_path):
    """The export gate asks the table about --data before it looks for the folder: a row that listed
    a missing folder's contents ended the export in a FileNotFoundError traceback."""
    from dfine_deploy.data.formats import recognise

    assert recognise(tmp_path / "nowhere") is None
    assert recognise(tmp_path / "nowhere" / "classes.txt") is None


def test_labelme_shapes_read_as_boxes_or_left_out_are_counted(tmp_path):
    """X-AnyLabeling saves LabelMe's json with more shapes: a rectangle's corners in either order, a
    polygon, a rotated box (four corners) and a circle (centre, a point on its edge) are read as the
    upright box that holds them, the last three counted; points and lines are left out, counted. A
    train/ valid/ export numbers the classes of both splits."""
    shapes = [
        ("car", "rectangle", [[30, 20], [10, 5]]),
        ("car", "polygon", [[2, 30], [12, 28], [8, 39]]),
        ("bus", "rotation", [[40, 10], [50, 14], [46, 24], [36, 20]]),
        ("bus", "circle", [[20, 20], [23, 24]]),
        ("car", "point", [[5, 5]]),
        ("car", "linestrip", [[1, 1], [9, 9], [12, 3]]),
    ]
    for split, kept in (("train", shapes[:1]), ("valid", shapes)):
        (tmp_path / split).mkdir()
        Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(tmp_path / split / "a.jpg")
        document = {
            "version": "2.4.0",
            "flags": {},
            "shapes": [{"label": n, "shape_type": t, "points": p, "flags": {}} for n, t, p in kept],
            "imagePath": "a.jpg",
            "imageData": None,
            "imageHeight": 40,
            "imageWidth": 60,
        }
        (tmp_path / split / "a.json").write_text(json.dumps(document))
    train, val = (open_dataset(tmp_path).load(name) for name in ("train", "val"))
    assert [c["name"] for c in train.categories] == [c["name"] for c in val.categories] == ["bus", "car"]
    (record,) = val.records
    assert record.boxes.tolist() == [[10, 5, 30, 20], [2, 28, 12, 39], [36, 10, 50, 24], [15, 15, 25, 25]]
    assert record.category_ids.tolist() == [1, 1, 0, 0]
    assert val.report.counts["shape_as_box"] == 3 and val.report.counts["shape_not_box"] == 2
    assert f"{tmp_path / 'valid' / 'a.json'}: shape 3 ('bus', circle)" in val.report.format()
    with pytest.raises(DatasetError, match=r"shape_not_box \(2\)"):
        open_dataset(tmp_path).load("val", policy=ValidationPolicy(shape_not_box="error"))


@pytest.mark.parametrize(
    ("name", "text", "words"),
    [
        (
            "_annotations.csv",
            "file,w,h,label\n",
            "a Tensorflow Object Detection CSV starts with filename,width",
        ),
        ("_annotations.csv", CSV_HEADER + "a.jpg,60,40,car,1,2\n", ":2: 6 fields; each row has 8"),
        ("_annotations.csv", CSV_HEADER + "a.jpg,60,40,car,1,two,9,9\n", ":2 (ymin): 'two' is not a number"),
        ("_annotations.createml.json", '[{"image": "a.jpg", "annotations": [{"label": "car"}]}]', "expected"),
        ("_annotations.createml.json", '{"images": []}', "not a CreateML json"),
        ("a.json", '{"shapes": [{"label": "car", "points": 5}], "imagePath": "a.jpg"}', "points 5, expected"),
        (
            "a.json",
            '{"shapes": [{"label": "car", "points": [[1, 2]], "shape_type": "rectangle"}], '
            '"imagePath": "a.jpg"}',
            "a rectangle is two corners, found 1 points",
        ),
    ],
)
def test_a_broken_box_list_or_labelme_file_is_one_line_naming_the_file(tmp_path, name, text, words):
    """The readers of the layouts without a class list name the file, the row or shape and the fix."""
    folder = tmp_path / "valid"
    folder.mkdir()
    Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(folder / "a.jpg")
    (folder / name).write_text(text)
    with pytest.raises(DatasetError) as refused:
        open_dataset(folder / name).load()
    message = str(refused.value)
    assert "\n" not in message and str(folder / name) in message and words in message, message


def test_the_sizes_a_csv_declares_are_checked_against_the_images(tmp_path):
    """A CSV row says its image's width and height; where the file has another size, the boxes were
    drawn on another picture: size_mismatch, as for COCO, VOC and LabelMe."""
    folder = tmp_path / "valid"
    folder.mkdir()
    Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(folder / "a.jpg")
    (folder / "_annotations.csv").write_text(CSV_HEADER + "a.jpg,60,40,car,1,2,30,20\n")
    assert open_dataset(folder).load().records[0].boxes.tolist() == [[1, 2, 30, 20]]
    (folder / "_annotations.csv").write_text(CSV_HEADER + "a.jpg,640,480,car,1,2,30,20\n")
    with pytest.raises(DatasetError, match=r"size_mismatch \(1\)"):
        open_dataset(folder).load()
