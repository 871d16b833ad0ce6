"""Datasets as users' tools write them: each odd entry is read, or counted, or refused in one line.

COCO jsons with a byte-order mark, numbers written as strings, entries that are not objects, paths
written on Windows; YOLO label files with a byte-order mark or in another encoding, label files whose
image is in a format not read (or gone) or that serve two images, images that are links to nothing;
file names with a newline. Nothing here leaves the dataset unsaid.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import yaml
from PIL import Image

from dfine_deploy.data.cli import main as data_main
from dfine_deploy.data.coco import load_coco
from dfine_deploy.data.formats import open_dataset, recognise
from dfine_deploy.data.validation import ValidationPolicy
from dfine_deploy.data.yolo import load_yolo
from dfine_deploy.errors import DatasetError, ImageError
from dfine_deploy.images import read_image

CATEGORIES = [{"id": 1, "name": "cat"}]


@pytest.fixture
def photo(tmp_path: Path) -> Path:
    """A 60x40 JPEG in tmp_path."""
    Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(tmp_path / "a.jpg")
    return tmp_path / "a.jpg"


def write_json(folder: Path, annotations: list, images: list | None = None, text: str | None = None) -> Path:
    images = [{"id": 1, "file_name": "a.jpg", "width": 60, "height": 40}] if images is None else images
    data = {"images": images, "annotations": annotations, "categories": CATEGORIES}
    (folder / "annotations.json").write_text(text if text is not None else json.dumps(data), encoding="utf-8")
    return folder / "annotations.json"


def box(**fields) -> dict:
    return {"id": 1, "image_id": 1, "category_id": 1, "bbox": [5, 5, 10, 20], **fields}


# ---------------------------------------------------------------------------------------------- COCO


def test_a_json_with_a_byte_order_mark_is_read_by_training_and_the_export_gate(photo):
    data = {"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [box()], "categories": CATEGORIES}
    ann_file = write_json(photo.parent, [], text="\ufeff" + json.dumps(data))  # as Windows editors save
    assert load_coco(ann_file, photo.parent).report.annotations_kept == 1
    assert recognise(photo.parent).load().report.annotations_kept == 1  # the export gate's reader


@pytest.mark.parametrize("key", ["images", "annotations", "categories"])
def test_an_entry_that_is_not_a_json_object_is_one_line(photo, key):
    data = {"images": [{"id": 1, "file_name": "a.jpg"}], "annotations": [box()], "categories": CATEGORIES}
    data[key] = [*data[key], [1, 2, 3]]
    ann_file = write_json(photo.parent, [], text=json.dumps(data))
    with pytest.raises(
        DatasetError, match=rf"{key}\[1\] is \[1, 2, 3\]; each entry of '{key}' is a json object"
    ):
        load_coco(ann_file, photo.parent)


def test_iscrowd_written_as_a_string_means_what_it_says(photo):
    """bool("0") is True: a "0" must not turn an object into a crowd region that training ignores."""
    ann_file = write_json(
        photo.parent, [box(id=1, iscrowd="0"), box(id=2, iscrowd="1"), box(id=3, iscrowd=0)]
    )
    (record,) = load_coco(ann_file, photo.parent).records
    assert record.iscrowd.tolist() == [False, True, False]
    write_json(photo.parent, [box(iscrowd="yes")])
    with pytest.raises(DatasetError, match=r"a.jpg annotation 1: iscrowd 'yes'; COCO's iscrowd is 0 .* or 1"):
        load_coco(ann_file, photo.parent)


@pytest.mark.parametrize("width, height", [("60", "40"), (60.0, 40.0)])
def test_whole_number_sizes_written_as_strings_or_floats_match_the_file(photo, width, height):
    images = [{"id": 1, "file_name": "a.jpg", "width": width, "height": height}]
    ann_set = load_coco(write_json(photo.parent, [box()], images), photo.parent)
    assert not ann_set.report.counts and (ann_set.records[0].width, ann_set.records[0].height) == (60, 40)


def test_an_area_that_is_no_size_is_replaced_by_the_box_area_and_counted(photo):
    annotations = [
        box(id=1, area=float("nan")),
        box(id=2, area="big"),
        box(id=3, area=-4),
        box(id=4, area=150),
    ]
    ann_set = load_coco(write_json(photo.parent, annotations), photo.parent)
    assert ann_set.records[0].areas.tolist() == [200, 200, 200, 150]
    assert ann_set.report.counts["invalid_area"] == 3 and ann_set.report.actions["invalid_area"] == "fix"
    assert "a.jpg annotation 1: area nan" in ann_set.report.format()
    with pytest.raises(DatasetError, match=r"invalid_area \(3\)"):
        load_coco(
            photo.parent / "annotations.json", photo.parent, policy=ValidationPolicy(invalid_area="error")
        )


def test_a_polygon_with_no_bbox_is_read_as_its_box_and_counted(photo):
    """Tools that write COCO polygons only (no bbox) were refused as 'invalid_box: bbox None'."""
    polygon = {
        "id": 1,
        "image_id": 1,
        "category_id": 1,
        "segmentation": [[4, 6, 30, 6, 30, 26], [2, 10, 8, 12]],
    }
    ann_file = write_json(photo.parent, [polygon, {**polygon, "id": 2, "segmentation": {"counts": [1]}}])
    loaded = load_coco(ann_file, photo.parent, policy=ValidationPolicy(invalid_box="skip"))
    (record,) = loaded.records
    assert record.boxes.tolist() == [[2.0, 6.0, 30.0, 26.0]]
    assert loaded.report.counts["shape_as_box"] == 1 and loaded.report.counts["invalid_box"] == 1  # a mask
    with pytest.raises(DatasetError, match=r"shape_as_box \(1\)"):
        load_coco(ann_file, photo.parent, policy=ValidationPolicy(shape_as_box="error", invalid_box="skip"))


def _runs(mask: np.ndarray) -> list[int]:
    """COCO's uncompressed run lengths of a 0/1 mask: column by column, background first."""
    flat = mask.flatten(order="F")
    edges = np.flatnonzero(np.diff(flat)) + 1
    runs = np.diff(np.concatenate([[0], edges, [flat.size]])).tolist()
    return [0, *runs] if flat[0] else runs


def test_a_run_length_mask_with_no_bbox_is_read_as_pycocotools_boxes_it(photo):
    """A COCO run-length mask with no bbox was refused as 'invalid_box: bbox None'; its box is read
    from the runs, both forms (a list of run lengths, COCO's compressed string), as pycocotools does."""
    from pycocotools import mask as mask_api  # the reference: the dev extra installs it

    rng = np.random.default_rng(0)
    masks = []
    for _ in range(30):
        mask = np.zeros((40, 60), np.uint8)
        for _ in range(rng.integers(1, 4)):
            x, y = rng.integers(0, 55), rng.integers(0, 35)
            mask[y : y + rng.integers(1, 12), x : x + rng.integers(1, 12)] = 1
        masks.append(mask)
    single = np.zeros((40, 60), np.uint8)
    single[39, 59] = 1
    full_column = np.zeros((40, 60), np.uint8)
    full_column[:, 7] = 1
    masks += [single, full_column, np.ones((40, 60), np.uint8)]
    annotations = []
    for index, mask in enumerate(masks):
        compressed = mask_api.encode(np.asfortranarray(mask))
        counts = compressed["counts"].decode() if index % 2 else _runs(mask)
        segmentation = {"size": [40, 60], "counts": counts}
        annotations.append({"id": index + 1, "image_id": 1, "category_id": 1, "segmentation": segmentation})
    other_size = {
        "id": 99,
        "image_id": 1,
        "category_id": 1,
        "segmentation": {"size": [60, 40], "counts": [2400]},
    }
    loaded = load_coco(
        write_json(photo.parent, [*annotations, other_size]),
        photo.parent,
        policy=ValidationPolicy(invalid_box="skip", duplicate_box="keep"),
    )
    (record,) = loaded.records
    expected = np.array([mask_api.toBbox(mask_api.encode(np.asfortranarray(m))) for m in masks])
    expected[:, 2:] += expected[:, :2]  # xywh -> xyxy, as records hold them
    np.testing.assert_array_equal(record.boxes, expected)
    assert loaded.report.counts["shape_as_box"] == len(masks) and loaded.report.counts["invalid_box"] == 1
    assert "annotation 2: no bbox; the box of its segmentation run-length mask" in loaded.report.format()


def test_true_and_false_are_no_box_coordinates(photo):
    ann_file = write_json(photo.parent, [box(bbox=[True, 5, 10, 20])])
    with pytest.raises(DatasetError, match=r"invalid_box \(1\)"):
        load_coco(ann_file, photo.parent)


def test_a_file_of_several_pages_is_counted_as_read_from_its_first(tmp_path):
    pages = [Image.fromarray(np.full((40, 60, 3), 40 * i, np.uint8)) for i in range(3)]
    pages[0].save(tmp_path / "a.tiff", save_all=True, append_images=pages[1:])
    images = [{"id": 1, "file_name": "a.tiff", "width": 60, "height": 40}]
    report = load_coco(write_json(tmp_path, [box()], images), tmp_path).report
    assert report.counts["multi_frame"] == 1 and report.actions["multi_frame"] == "keep"
    assert "a.tiff: 3 frames in a TIFF" in report.format()
    with pytest.raises(DatasetError, match=r"multi_frame \(1\)"):
        load_coco(tmp_path / "annotations.json", tmp_path, policy=ValidationPolicy(multi_frame="error"))


# ---------------------------------------------------------------------------------------------- YOLO


def yolo_set(root: Path, images: dict[str, str], labels: dict[str, bytes]) -> Path:
    """images/val/<name> (format by the value: JPEG, PNG, GIF) and labels/val/<name>; the data.yaml."""
    (root / "images" / "val").mkdir(parents=True)
    (root / "labels" / "val").mkdir(parents=True)
    for name, fmt in images.items():
        Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(root / "images" / "val" / name, format=fmt)
    for name, data in labels.items():
        (root / "labels" / "val" / name).write_bytes(data)
    (root / "data.yaml").write_text(yaml.safe_dump({"val": "images/val", "names": ["cat", "dog"]}))
    return root / "data.yaml"


def test_a_label_file_with_a_byte_order_mark_and_crlf_is_read(tmp_path):
    data_yaml = yolo_set(tmp_path, {"a.jpg": "JPEG"}, {"a.txt": "\ufeff0 0.5 0.5 0.2 0.5\r\n\r\n".encode()})
    (record,) = load_yolo(data_yaml, "val").records
    np.testing.assert_allclose(record.boxes, [[24, 10, 36, 30]], atol=1e-4)


def test_a_label_file_in_another_encoding_is_one_line(tmp_path):
    data_yaml = yolo_set(
        tmp_path, {"a.jpg": "JPEG"}, {"a.txt": "0 0.5 0.5 0.2 0.5 # café\n".encode("latin-1")}
    )
    with pytest.raises(
        DatasetError, match=r"labels/val/a.txt: byte 23 is not UTF-8 text; .* save it as UTF-8"
    ):
        load_yolo(data_yaml, "val")


def test_label_files_without_an_image_are_counted_and_name_what_is_there(tmp_path):
    label = b"1 0.5 0.5 0.2 0.5\n"
    data_yaml = yolo_set(
        tmp_path,
        {"a.jpg": "JPEG", "moving.gif": "GIF"},
        {"a.txt": label, "moving.txt": label, "gone.txt": label},
    )
    ann_set = load_yolo(data_yaml, "val")
    assert ann_set.report.images_kept == 1 and ann_set.report.annotations_kept == 1
    assert ann_set.report.counts["label_without_image"] == 2
    assert ann_set.report.actions["label_without_image"] == "skip"
    text = ann_set.report.format()
    assert "labels/val/moving.txt: no image" in text and "(moving.gif there: not .jpg" in text
    assert "labels/val/gone.txt: no image" in text
    with pytest.raises(DatasetError, match=r"label_without_image \(2\)"):
        load_yolo(data_yaml, "val", policy=ValidationPolicy(label_without_image="error"))


def test_an_image_that_links_to_nothing_is_missing_not_gone(tmp_path):
    data_yaml = yolo_set(tmp_path, {"a.jpg": "JPEG"}, {"b.txt": b"0 0.5 0.5 0.2 0.5\n"})
    os.symlink(tmp_path / "elsewhere.jpg", tmp_path / "images" / "val" / "b.jpg")
    with pytest.raises(DatasetError, match=r"missing_image \(1\)"):
        load_yolo(data_yaml, "val")
    skipped = load_yolo(data_yaml, "val", policy=ValidationPolicy(missing_image="skip")).report
    assert (skipped.images_in, skipped.images_kept, skipped.annotations_of_dropped_images) == (2, 1, 1)


def test_a_file_name_with_windows_backslashes_is_missing_and_says_why(photo):
    (photo.parent / "images").mkdir()
    photo.rename(photo.parent / "images" / "a.jpg")
    ann_file = write_json(photo.parent, [box()], [{"id": 1, "file_name": "images\\a.jpg"}])
    with pytest.raises(DatasetError, match=r"missing_image \(1\)") as err:
        load_coco(ann_file, photo.parent)
    assert f"the json parts folders with '\\'; write '/' ({photo.parent / 'images' / 'a.jpg'} exists)" in str(
        err.value
    )


@pytest.mark.parametrize("file_name", ["images/a.jpg", "a.jpg"])
def test_a_json_beside_images_is_read_with_the_folder_its_file_names_are_relative_to(photo, file_name):
    """A plain json beside `images/` may name `a.jpg` (in it) or `images/a.jpg` (beside it): every reader
    that opens a dataset (dfine-data validate, dfine-bench --data, the export gate) reads the folder
    the names are found under, and says which."""
    (photo.parent / "images").mkdir()
    photo.rename(photo.parent / "images" / "a.jpg")
    ann_file = write_json(photo.parent, [box()], [{"id": 1, "file_name": file_name}])
    annotations = open_dataset(ann_file).load("val")
    folder = photo.parent / "images" if file_name == "a.jpg" else photo.parent
    assert annotations.report.images_kept == 1 and annotations.img_folder == folder
    assert annotations.layout.endswith(f"images in {folder})")


def test_windows_backslashes_are_hinted_by_every_reader_whatever_folder_it_reads(photo, capsys):
    """`images\\a.jpg` beside `images/`: joined under the json's folder, where '/' finds the file, and
    hinted; under a folder the user names, hinted without a file to show."""
    (photo.parent / "images").mkdir()
    photo.rename(photo.parent / "images" / "a.jpg")
    ann_file = write_json(photo.parent, [box()], [{"id": 1, "file_name": "images\\a.jpg"}])
    hint = f"the json parts folders with '\\'; write '/' ({photo.parent / 'images' / 'a.jpg'} exists)"
    with pytest.raises(DatasetError, match=r"missing_image \(1\)") as err:
        open_dataset(ann_file).load("val")  # dfine-bench --data, dfine-export --data
    assert f"{photo.parent / 'images'}\\a.jpg: {hint}" in str(err.value)
    assert data_main(["validate", str(ann_file)]) != 0
    assert hint in capsys.readouterr().err
    assert data_main(["validate", str(ann_file), "--img-folder", str(photo.parent / "images")]) != 0
    assert "images\\a.jpg: the json parts folders with '\\'; write '/'\n" in capsys.readouterr().err


def test_one_label_file_for_two_images_of_one_name_is_counted(tmp_path):
    data_yaml = yolo_set(tmp_path, {"a.jpg": "JPEG", "a.png": "PNG"}, {"a.txt": b"0 0.5 0.5 0.2 0.5\n"})
    ann_set = load_yolo(data_yaml, "val")
    assert ann_set.report.annotations_kept == 2 and ann_set.report.counts["label_shared"] == 1
    assert "labels/val/a.txt: the labels of a.jpg and a.png" in ann_set.report.format()
    with pytest.raises(DatasetError, match=r"label_shared \(1\)"):
        load_yolo(data_yaml, "val", policy=ValidationPolicy(label_shared="error"))


def test_a_newline_in_a_file_name_keeps_each_report_line_and_error_one_line(tmp_path):
    (tmp_path / "new\nline.jpg").write_bytes(b"no image")
    with pytest.raises(ImageError) as err:
        read_image(tmp_path / "new\nline.jpg")
    assert "\n" not in str(err.value) and "new\\nline.jpg" in str(err.value)
    images = [{"id": 1, "file_name": "new\nline.jpg", "width": 60, "height": 40}]
    with pytest.raises(DatasetError) as err:
        load_coco(write_json(tmp_path, [], images), tmp_path)
    report_lines = [line.strip() for line in str(err.value).splitlines()]
    named = f"{tmp_path}/new\\nline.jpg: Pillow cannot identify it as an image"
    assert any(line.startswith(named) for line in report_lines), report_lines


def test_a_url_encoded_file_name_is_read_as_the_file_it_names_and_counted(photo):
    """A tool that writes file names as URLs gives `a%20b.jpg` for `a b.jpg`."""
    photo.rename(photo.parent / "a b.jpg")
    ann_file = write_json(photo.parent, [box()], [{"id": 1, "file_name": "a%20b.jpg"}])
    annotations = open_dataset(ann_file).load("val")
    assert [r.file_name for r in annotations.records] == ["a b.jpg"]
    assert annotations.report.counts["url_encoded_name"] == 1
    assert f"a%20b.jpg -> {photo.parent / 'a b.jpg'}" in annotations.report.format()
    with pytest.raises(DatasetError, match=r"url_encoded_name \(1\)"):
        load_coco(ann_file, photo.parent, policy=ValidationPolicy(url_encoded_name="error"))
