"""--data: validation images and COCO annotations feed the gate, and mAP is compared."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from dfine_deploy.data.synthetic import CLASS_NAMES, write_split
from dfine_deploy.errors import DatasetError
from dfine_deploy.export import parity
from dfine_deploy.export.gate_inputs import dataset_scorer, parity_inputs
from dfine_deploy.export.settings import ExportSettings


@pytest.fixture(scope="module")
def coco_val(tmp_path_factory):
    root = tmp_path_factory.mktemp("synthetic")
    write_split(root, "val", 7, seed=3, size=256)
    return root


def _outputs_from_annotations(batches, data, shift: float = 0.0):
    """Detections equal to the annotations (scaled to orig size already), optionally shifted."""
    outputs = []
    for batch in batches:
        labels, boxes, scores = [], [], []
        for image_id in batch.image_ids:
            anns = [a for a in data["annotations"] if a["image_id"] == image_id][:10]
            xywh = np.array([a["bbox"] for a in anns], dtype=np.float32).reshape(-1, 4)
            xyxy = np.concatenate([xywh[:, :2], xywh[:, :2] + xywh[:, 2:]], 1) + shift
            pad = 10 - len(anns)
            labels.append(np.array([a["category_id"] for a in anns] + [0] * pad, dtype=np.int64))
            boxes.append(np.concatenate([xyxy, np.zeros((pad, 4), np.float32)]))
            scores.append(np.array([0.9] * len(anns) + [0.0] * pad, dtype=np.float32))
        outputs.append((np.stack(labels), np.stack(boxes), np.stack(scores)))
    return outputs


def test_coco_folder_gives_real_images_ids_and_a_map_scorer(coco_val):
    opts = ExportSettings(model="dfine-n", output=coco_val / "out", imgsz=(128, 128), data=coco_val)
    batches, coco = parity_inputs(opts)
    assert [len(b.images) for b in batches] == [1, 2, 4]  # the 7 images there are
    assert sorted(i for b in batches for i in b.image_ids) == list(range(1, 8))
    assert batches[0].orig_sizes.tolist() == [[256, 256]]
    scorer = dataset_scorer(coco, CLASS_NAMES)
    _, data = coco
    perfect = scorer(batches, _outputs_from_annotations(batches, data))
    shifted = scorer(batches, _outputs_from_annotations(batches, data, shift=12.0))
    assert perfect == pytest.approx(100.0, abs=1e-6) and shifted < perfect - 10


def test_gate_runs_on_gate_images_of_the_data_after_the_parity_batches(tmp_path):
    """The mAP comparison needs more than the 7 images of the parity batches: the rest of --data
    follows one image at a time, up to --gate-images."""
    write_split(tmp_path, "val", 12, seed=4, size=128)
    opts = ExportSettings(model="dfine-n", output=tmp_path / "out", imgsz=(128, 128), data=tmp_path)
    batches, _ = parity_inputs(opts)  # default 100: every one of the 12
    assert [len(b.images) for b in batches] == [1, 2, 4, 1, 1, 1, 1, 1]
    assert sorted(i for b in batches for i in b.image_ids) == list(range(1, 13))
    batches, _ = parity_inputs(dataclasses.replace(opts, gate_images=9))
    assert [len(b.images) for b in batches] == [1, 2, 4, 1, 1]


def test_gate_reports_and_judges_dataset_map_drop(coco_val):
    opts = ExportSettings(model="dfine-n", output=coco_val / "out", imgsz=(128, 128), data=coco_val)
    batches, coco = parity_inputs(opts)
    scorer = dataset_scorer(coco, CLASS_NAMES)
    _, data = coco
    good = _outputs_from_annotations(batches, data)
    bad = _outputs_from_annotations(batches, data, shift=12.0)
    runs = iter(good + bad)
    report = parity.run_gate(
        lambda i, s: next(runs),
        lambda i, s: next(runs),
        batches,
        parity.FP16_GATE,
        reference_name="ref",
        candidate_name="cand",
        dataset_scorer=scorer,
    )
    assert report.dataset_ap["reference"] == pytest.approx(100.0, abs=1e-6)
    assert not report.passed and any("mAP on the dataset drops" in f for f in report.failures)


def test_a_dataset_with_splits_is_scored_on_its_val_split_and_says_so(tmp_path, capsys):
    """A folder holding train/ and val/ (what dfine-data synth writes) is read by the format table:
    the gate scores val, and one line names the layout and the split."""
    write_split(tmp_path, "val", 3, seed=3, size=64)
    write_split(tmp_path, "train", 3, seed=4, size=64)  # same base names 000001.jpg .. in another split
    opts = ExportSettings(
        model="dfine-n", output=tmp_path / "out", imgsz=(64, 64), batch=(1, 1, 1), data=tmp_path
    )
    batches, (ann_path, _) = parity_inputs(opts)
    assert ann_path == tmp_path / "val" / "annotations.json" and batches[0].image_ids == [1]
    assert f"data: {tmp_path} read as a COCO dataset (split val: {ann_path}" in capsys.readouterr().out
    # one annotation file at the root whose file names are paths relative to it
    data = json.loads(ann_path.read_text())
    for image in data["images"]:
        image["file_name"] = f"val/{image['file_name']}"
    (tmp_path / "val" / "annotations.json").unlink()
    (tmp_path / "train" / "annotations.json").unlink()
    (tmp_path / "annotations.json").write_text(json.dumps(data))
    batches, coco = parity_inputs(opts)
    assert batches[0].image_ids == [1] and coco[0] == tmp_path / "annotations.json"
    # its file names bare: the images are not beside it, and validation says so
    for image in data["images"]:
        image["file_name"] = image["file_name"].removeprefix("val/")
    (tmp_path / "annotations.json").write_text(json.dumps(data))
    with pytest.raises(DatasetError, match="missing_image"):
        parity_inputs(opts)


def test_missing_or_broken_images_are_not_silently_left_out_of_the_gate(coco_val, tmp_path, capsys):
    """The gate's mAP must cover what the annotations list: the training loader's validation applies."""
    import shutil

    folder = tmp_path / "val"
    shutil.copytree(coco_val / "val", folder)
    opts = ExportSettings(model="dfine-n", output=tmp_path / "out", imgsz=(128, 128), data=folder)
    parity_inputs(opts)
    assert "data: " in capsys.readouterr().out  # the load summary line
    names = [im["file_name"] for im in json.loads((folder / "annotations.json").read_text())["images"]]
    (folder / names[2]).unlink()
    with pytest.raises(DatasetError, match="missing_image"):
        parity_inputs(opts)


def test_the_gate_scores_categories_by_the_model_s_class_names(coco_val):
    """The same detections score the same whatever the dataset numbers its categories;
    a dataset naming other classes is refused before any graph is written."""
    opts = ExportSettings(model="dfine-n", output=coco_val / "out", imgsz=(128, 128), data=coco_val)
    batches, (ann_path, data) = parity_inputs(opts)
    outputs = _outputs_from_annotations(batches, data)  # labels = the synthetic ids 0..3 = label order
    renumber = {0: 7, 1: 2, 2: 30, 3: 1}  # ids from 1, with gaps, sorted in another order than the names
    shuffled = dict(
        data,
        categories=[dict(c, id=renumber[c["id"]]) for c in data["categories"]],
        annotations=[dict(a, category_id=renumber[a["category_id"]]) for a in data["annotations"]],
    )
    for coco in (data, shuffled):
        assert dataset_scorer((ann_path, coco), CLASS_NAMES)(batches, outputs) == pytest.approx(
            100.0, abs=1e-6
        )
    other = dict(data, categories=[dict(c, name=f"x{c['id']}") for c in data["categories"]])
    with pytest.raises(DatasetError, match=r"--data .*annotations.json: 4 of the 4 categories \('x0'"):
        dataset_scorer((ann_path, other), CLASS_NAMES)


@pytest.fixture(scope="module")
def forty_images(tmp_path_factory):
    root = tmp_path_factory.mktemp("calibration")
    write_split(root, "val", 40, seed=5, size=64)
    return root / "val"


@pytest.mark.parametrize(
    "available, asked, used, fix",
    [
        (1, 32, 1, "folder with at least 32 images"),  # one image warns too (it once did not)
        (5, 32, 5, "folder with at least 32 images"),
        (31, 100, 31, "folder with at least 32 images"),
        (40, 4, 4, "pass --calibration-images 32 or more"),
        (40, 1, 1, "pass --calibration-images 32 or more"),
    ],
)
def test_calibration_on_too_few_images_warns_in_one_line(
    forty_images, tmp_path, caplog, available, asked, used, fix
):
    from dfine_deploy.export.gate_inputs import calibration_feeds

    folder = tmp_path / "images"
    folder.mkdir()
    for path in sorted(forty_images.glob("*.jpg"))[:available]:
        (folder / path.name).write_bytes(path.read_bytes())
    opts = ExportSettings(model="dfine-n", output=tmp_path / "out", imgsz=(64, 64), data=folder)
    opts.calibration_images = asked
    with caplog.at_level("INFO"):
        feeds = calibration_feeds(opts)
    assert len(feeds) == used
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    image_word = "image" if used == 1 else "images"
    assert len(warnings) == 1 and f"calibrates on {used} {image_word} of {folder} only" in warnings[0]
    assert fix in warnings[0] and "\n" not in warnings[0]


def test_calibration_on_enough_images_says_only_how_many_it_found(forty_images, tmp_path, caplog):
    from dfine_deploy.export.gate_inputs import calibration_feeds

    opts = ExportSettings(model="dfine-n", output=tmp_path / "out", imgsz=(64, 64), data=forty_images)
    for asked, line in ((32, None), (40, None), (100, "calibrating on the 40 images of")):
        caplog.clear()
        opts.calibration_images = asked
        with caplog.at_level("INFO"):
            assert len(calibration_feeds(opts)) == min(asked, 40)
        assert not [r for r in caplog.records if r.levelname == "WARNING"]
        found = [r.getMessage() for r in caplog.records if "calibrating on" in r.getMessage()]
        assert (line in found[0] and "--calibration-images 100" in found[0]) if line else not found
