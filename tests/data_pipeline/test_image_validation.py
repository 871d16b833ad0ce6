"""What validation says about images the reading policy changes, and sizes of turned photos.

`dfine-data validate` counts EXIF-oriented, 16-bit, transparent and non-RGB images, says when the
annotations' width/height fit a photo only as shown (used so) or only as stored (an error by
default; `fix` turns the boxes with the image), and the training dataset reads the pixels those
boxes are in.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml

from dfine_deploy.data.cli import main as data_main
from dfine_deploy.data.coco import load_coco
from dfine_deploy.data.validation import ValidationPolicy
from dfine_deploy.data.yolo import load_yolo
from dfine_deploy.errors import DatasetError
from dfine_deploy.images import read_image
from tests.support.images import find_boxes, scene, stored_for, write_cases, write_oriented

CATEGORIES = [{"id": 1, "name": "red"}, {"id": 2, "name": "blue"}]


def write_coco(folder, images, annotations=()):
    data = {"images": images, "annotations": list(annotations), "categories": CATEGORIES}
    (folder / "annotations.json").write_text(json.dumps(data))
    return folder / "annotations.json"


@pytest.fixture
def every_case(tmp_path):
    """A COCO folder of every kind of file, each declared at its size as shown."""
    cases = write_cases(tmp_path)
    images = []
    for i, case in enumerate(cases, start=1):
        h, w = case.expected.shape[:2]
        images.append({"id": i, "file_name": case.path.name, "width": w, "height": h})
    return cases, write_coco(tmp_path, images)


def test_the_report_counts_what_the_reader_changes(every_case, capsys):
    cases, ann_file = every_case
    report = load_coco(ann_file, ann_file.parent).report
    expected = {
        "exif_orientation": sum(c.exif for c in cases),  # exif2..8, the turned PNG, WebP and TIFF
        "size_as_shown": 7,  # exif5..8, gray16_exif6, webp_exif8, tiff_exif5: their sides swap
        "high_bit_depth": sum(c.wide for c in cases),
        "alpha_channel": sum(c.alpha for c in cases),
        "converted_mode": sum(c.converted for c in cases),
    }
    assert list(expected.values()) == [10, 7, 3, 3, 8]
    assert {p: report.counts[p] for p in expected} == expected
    assert report.images_kept == len(cases) and not report.errors
    assert data_main(["validate", str(ann_file)]) == 0
    out = capsys.readouterr().out
    for problem, count in expected.items():
        assert f"{problem}: {count} kept" in out, out
    assert "exif6.jpg: orientation 6, turned 90 degrees clockwise" in out
    assert "exif6.jpg: json says 48x32, the image as shown; stored 32x48 with EXIF orientation 6" in out
    assert "gray16.png: 16-bit I;16" in out and "palette_transparent.png: P" in out


def test_a_strict_policy_makes_them_errors(every_case):
    _, ann_file = every_case
    with pytest.raises(DatasetError, match=r"exif_orientation \(10\).*high_bit_depth \(3\)"):
        load_coco(
            ann_file,
            ann_file.parent,
            policy=ValidationPolicy(exif_orientation="error", high_bit_depth="error"),
        )


def turned_photos(tmp_path, declare_stored: bool):
    """Scenes saved as photos with EXIF orientations 5..8 (the ones that swap the sides), boxes and
    sizes either as shown or as a tool that ignores EXIF saw them (the stored pixels)."""
    images, annotations = [], []
    for image_id, orientation in enumerate((5, 6, 7, 8), start=1):
        shown, objects = scene(image_id)
        path = write_oriented(tmp_path / f"photo{orientation}.jpg", shown, orientation)
        seen = stored_for(shown, orientation) if declare_stored else shown
        h, w = seen.shape[:2]
        images.append({"id": image_id, "file_name": path.name, "width": w, "height": h})
        for name, (x1, y1, x2, y2) in find_boxes(seen):
            category = 1 if name == "red" else 2
            bbox = [x1, y1, x2 - x1, y2 - y1]
            annotations.append(
                {"id": len(annotations) + 1, "image_id": image_id, "category_id": category, "bbox": bbox}
            )
    return write_coco(tmp_path, images, annotations)


def boxes_by_image(ann_set):
    return {r.file_name: r.boxes.tolist() for r in ann_set.records}


def test_sizes_that_fit_only_the_stored_pixels_stop_then_fix_turns_the_boxes(tmp_path):
    ann_file = turned_photos(tmp_path, declare_stored=True)
    with pytest.raises(DatasetError) as err:
        load_coco(ann_file, tmp_path)
    text = str(err.value)
    assert "size_as_stored (4)" in text
    assert "photo6.jpg: json says 64x96, the stored pixels; viewers show 96x64 (turned 90 degrees" in text
    fixed = load_coco(ann_file, tmp_path, policy=ValidationPolicy(size_as_stored="fix"))
    assert fixed.report.counts["size_as_stored"] == 4 and fixed.report.actions["size_as_stored"] == "fix"
    for record in fixed.records:
        pixels = read_image(tmp_path / record.file_name)
        assert (record.width, record.height) == (pixels.shape[1], pixels.shape[0]) == (96, 64)
        assert record.boxes.tolist() == [box for _, box in find_boxes(pixels)], record.file_name
    shown = load_coco(turned_photos(tmp_path / "shown", declare_stored=False), tmp_path / "shown")
    assert boxes_by_image(shown) == boxes_by_image(fixed)  # the same objects as labelled upright
    skipped = load_coco(ann_file, tmp_path, policy=ValidationPolicy(size_as_stored="skip"))
    assert skipped.report.images_kept == 0 and skipped.report.annotations_of_dropped_images == 8


def test_sizes_as_shown_are_used_and_said(tmp_path):
    ann_set = load_coco(turned_photos(tmp_path, declare_stored=False), tmp_path)
    assert ann_set.report.counts["size_as_shown"] == 4 and ann_set.report.counts["exif_orientation"] == 4
    assert "(used so)" in ann_set.report.format()


def test_the_training_dataset_refuses_pixels_that_do_not_fit_unchecked_sizes(tmp_path):
    """With image checks off the json is trusted; the reader's pixels must still fit it."""
    from dfine_deploy.data.classmap import ClassMap
    from dfine_deploy.data.coco import DetectionDataset

    ann_file = turned_photos(tmp_path, declare_stored=True)
    ann_set = load_coco(ann_file, tmp_path, policy=ValidationPolicy(check_images="none"))
    dataset = DetectionDataset(ann_set, ClassMap.from_categories(ann_set.categories, remap=True))
    with pytest.raises(
        DatasetError, match=r"photo5.jpg: the image as shown .* is 96x64, the annotations say 64x96"
    ):
        dataset.load_item(0)


def test_yolo_labels_are_relative_to_the_image_as_shown(tmp_path):
    """Ultralytics and labelling tools normalise YOLO boxes by the upright image."""
    for split_index, orientation in enumerate((1, 3, 6, 8)):
        shown, objects = scene(split_index)
        write_oriented(tmp_path / "images" / "val" / f"p{orientation}.jpg", shown, orientation)
        w, h = 96, 64
        lines = []
        for name, (x1, y1, x2, y2) in objects:
            cx, cy = (x1 + x2) / 2 / w, (y1 + y2) / 2 / h
            lines.append(f"{0 if name == 'red' else 1} {cx} {cy} {(x2 - x1) / w} {(y2 - y1) / h}")
        label = tmp_path / "labels" / "val" / f"p{orientation}.txt"
        label.parent.mkdir(parents=True, exist_ok=True)
        label.write_text("\n".join(lines))
    (tmp_path / "data.yaml").write_text(yaml.safe_dump({"val": "images/val", "names": ["red", "blue"]}))
    ann_set = load_yolo(tmp_path / "data.yaml", "val")
    for record in ann_set.records:
        pixels = read_image(ann_set.img_folder / record.file_name)
        np.testing.assert_allclose(record.boxes, [box for _, box in find_boxes(pixels)], atol=1e-3)
