"""dfine-bench --data computes its mAP on what it names: categories meet the model's
labels by name whatever their ids, --data-limit scores the images it says against their own
annotations, and every count printed is the count used. Real onnxruntime on a tiny YOLO-layout graph."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.bench.test_bench_cli import run_cli, table_cells
from tests.runtime.tiny_graphs import yolo_like

pytest.importorskip("faster_coco_eval")

NAMES = ("a", "b", "c", "d", "e")  # the model's classes, in label order


def _box(label: int) -> list[float]:
    """xywh, in pixels of a 64x64 frame, of the one box the graph finds for class `label`."""
    return [2.0 + 12 * label, 27.0, 10.0, 10.0]


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> Path:
    """A graph that finds one box per class, each at its own place, and names its classes."""
    table = np.zeros((4 + len(NAMES), len(NAMES)), np.float32)
    for label in range(len(NAMES)):
        x, y, w, h = _box(label)
        table[:4, label] = [x + w / 2, y + h / 2, w, h]
        table[4 + label, label] = 0.9
    names = dict(enumerate(NAMES))
    return yolo_like(tmp_path_factory.mktemp("model") / "named.onnx", table, 64, names=names)


def _dataset(folder: Path, categories: dict[int, str], images: int = 3) -> Path:
    """`images` 64x64 images, each holding one object of every category, where the model finds the
    class of that name (a category named outside NAMES gets a box of its own)."""
    import cv2

    folder.mkdir(parents=True)
    records, annotations = [], []
    for i in range(images):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((64, 64, 3), 30 * i, np.uint8))
        records.append({"id": i + 1, "file_name": f"{i}.png", "width": 64, "height": 64})
        for category_id, name in categories.items():
            box = _box(NAMES.index(name)) if name in NAMES else [40.0, 2.0, 10.0, 10.0]
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": i + 1,
                    "category_id": category_id,
                    "bbox": box,
                    "area": box[2] * box[3],
                    "iscrowd": 0,
                }
            )
    cats = [{"id": k, "name": n} for k, n in categories.items()]
    (folder / "annotations.json").write_text(
        json.dumps({"images": records, "annotations": annotations, "categories": cats})
    )
    return folder


def _bench(capsys, model: Path, data: Path, *extra: str) -> tuple[int, str, str, dict]:
    report = data.parent / f"{data.name}.json"
    code, out, err = run_cli(
        capsys,
        *("--model", str(model), "--adapter", "yolo", "--device", "cpu", "--runs", "1", "--warmup", "0"),
        *("--data", str(data), "--json", str(report)),
        *extra,
    )
    return code, out, err, json.loads(report.read_text()) if code == 0 else {}


@pytest.mark.parametrize(
    "categories",
    [
        dict(enumerate(NAMES)),  # ids 0..4 in label order: the reference
        {k + 1: n for k, n in enumerate(NAMES)},  # numbered from 1
        {1: "c", 2: "e", 3: "a", 4: "d", 5: "b"},  # numbered from 1, another order
        {7: "b", 30: "e", 12: "a", 99: "d", 5: "c"},  # ids with gaps, listed unsorted
        {1: "d", 2: "b"},  # a subset of the model's classes
    ],
    ids=["ids-0-4", "ids-1-5", "shuffled", "gaps", "subset"],
)
def test_categories_meet_labels_by_name_whatever_their_ids(capsys, tmp_path, model, categories):
    code, out, err, report = _bench(capsys, model, _dataset(tmp_path / "data", categories))
    assert code == 0, err
    assert report["rows"][0]["map50_95"] == pytest.approx(1.0, abs=1e-6)
    assert table_cells(out)[0][5] == "1.0000"
    assert f"{len(categories)} categories matched by name to the model's 5 classes" in err


@pytest.mark.parametrize(
    "categories, named",
    [({1: "a", 2: "zebra"}, "'zebra'"), ({0: "A", 1: "B"}, "'A', 'B'"), ({3: "c", 4: "cat"}, "'cat'")],
)
def test_categories_the_model_does_not_name_are_refused_in_one_line(
    capsys, tmp_path, model, categories, named
):
    code, out, err, _ = _bench(capsys, model, _dataset(tmp_path / "data", categories))
    assert code == 2 and "Traceback" not in err and not table_cells(out)
    line = next(line for line in err.splitlines() if "not among the model's 5 class names" in line)
    assert named in line and "--names FILE" in line


@pytest.mark.parametrize(
    "categories, reason", [({1: "a", 2: "a"}, "given twice"), ({1: "a", 2: "b\nc"}, "line break")]
)
def test_categories_that_cannot_be_told_apart_are_refused(capsys, tmp_path, model, categories, reason):
    code, out, err, _ = _bench(capsys, model, _dataset(tmp_path / "data", categories))
    assert code == 2 and reason in err and "Traceback" not in err and not table_cells(out)


def test_a_model_with_assumed_names_is_matched_by_count_with_a_warning(capsys, tmp_path):
    """No names in the graph: COCO's are assumed; the dataset's are not COCO's, so the old count rule
    applies (raw id = label here) and one line says so and how to match by name instead."""
    table = np.zeros((4 + 3, 1), np.float32)
    table[:4, 0], table[4 + 1, 0] = [32, 32, 20, 20], 0.9
    unnamed = yolo_like(tmp_path / "unnamed.onnx", table, 64)
    folder = _dataset(tmp_path / "data", {0: "a", 1: "b"})
    coco = json.loads((folder / "annotations.json").read_text())
    for ann in coco["annotations"]:
        ann["bbox"] = [22.0, 22.0, 20.0, 20.0] if ann["category_id"] == 1 else [0.0, 0.0, 4.0, 4.0]
    (folder / "annotations.json").write_text(json.dumps(coco))
    code, _, err, report = _bench(capsys, unnamed, folder)
    assert code == 0, err
    assert report["rows"][0]["map50_95"] == pytest.approx(0.5, abs=1e-6)  # b found, a never
    warning = next(line for line in err.splitlines() if line.startswith("warning: --data: classes:"))
    assert "matched by count (category id = label)" in warning and "--names FILE" in warning


def test_data_limit_scores_the_images_it_prints_against_their_own_annotations(capsys, tmp_path, model):
    data = _dataset(tmp_path / "data", dict(enumerate(NAMES)), images=4)
    code, out, err, report = _bench(capsys, model, data, "--data-limit", "2")
    assert code == 0, err
    # the two images left out must not count as missed objects (they did: mAP 0.5)
    assert report["rows"][0]["map50_95"] == pytest.approx(1.0, abs=1e-6)
    assert "data: mAP50-95 on 2 of 4 images" in err
    line = next(n for n in report["notes"] if n.startswith("mAP50-95 of"))
    assert "2 of the 4 images of" in line and line in out
    code, _, err, _ = _bench(capsys, model, data, "--data-limit", "10")
    assert code == 0 and "data: mAP50-95 on 4 of 4 images" in err
    for limit in ("-1", "0"):
        code, out, err, _ = _bench(capsys, model, data, "--data-limit", limit)
        assert code == 2 and f"--data-limit {limit}: give N >= 1" in err and not table_cells(out)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--runs", "2", "--rounds", "5"], "--rounds 5 with --runs 2: give 1 to 2 rounds"),
        (["--runs", "2", "--rounds", "0"], "--rounds 0 with --runs 2"),
        (["--data-limit", "3"], "--data-limit 3: give N >= 1 with --data"),
        (["--train", "--train-images", "0"], "--train-images 0: each value must be at least 1"),
        (["--train", "--train-batch", "-1"], "--train-batch -1: each value must be at least 1"),
    ],
)
def test_counts_that_would_be_cut_are_refused(capsys, model, argv, message):
    code, _, err = run_cli(capsys, "--model", str(model), "--adapter", "yolo", "--device", "cpu", *argv)
    assert code == 2 and message in err and "Traceback" not in err


def test_rounds_printed_are_the_rounds_measured(capsys, model):
    code, out, _ = run_cli(
        capsys, "--model", str(model), "--adapter", "yolo", "--device", "cpu", "--runs", "2", "--warmup", "0"
    )
    assert code == 0 and "+ 2 timed calls in 2 rounds per row" in out


def test_precision_and_recall_per_class_are_printed_at_the_thresholds_served(capsys, tmp_path, model):
    code, out, err, report = _bench(capsys, model, _dataset(tmp_path / "data", {1: "d", 2: "b"}))
    assert code == 0, err
    notes = report["notes"]
    start = next(i for i, n in enumerate(notes) if n.startswith("per class, at the thresholds dfine-serve"))
    rows = notes[start + 1 : start + 1 + len(NAMES)]
    # a graph without model.json has no chosen thresholds: the default; its b and d find the 3 objects
    # of their class, a, c and e find what the data does not annotate
    assert rows == [
        f"  {name}: threshold 0.25 (default), precision {found:.3f}, recall {found:.3f} "
        f"over {objects} objects"
        for name, found, objects in (("a", 0, 0), ("b", 1, 3), ("c", 0, 0), ("d", 1, 3), ("e", 0, 0))
    ]
    assert all(row in out for row in rows)
