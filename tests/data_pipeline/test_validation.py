"""Each bad-input case: the right error with defaults, the right count under skip/fix.

Nothing is silently lost.
"""

from __future__ import annotations

import numpy as np
import pytest

from dfine_deploy.data.coco import load_coco
from dfine_deploy.data.validation import ValidationPolicy
from dfine_deploy.errors import DatasetError

ANNOTATION_PROBLEMS = (
    "unknown_image_id",
    "unknown_category",
    "invalid_box",
    "negative_box",
    "zero_area_box",
    "box_entirely_outside",
)


def load(folder, **policy):
    """Load, and check that every annotation read is kept or counted somewhere (nothing vanishes)."""
    ann = load_coco(folder.ann_file, folder.root, policy=ValidationPolicy(**policy))
    r = ann.report
    dropped = sum(r.counts[p] for p in ANNOTATION_PROBLEMS) + r.annotations_of_dropped_images
    for problem in ("box_outside_image", "duplicate_box"):
        if r.actions.get(problem) == "skip":
            dropped += r.counts[problem]
    assert r.annotations_kept + dropped == r.annotations_in
    assert (
        r.images_kept
        + sum(
            r.counts[p] for p in ("missing_image", "unreadable_image", "corrupt_image", "duplicate_image_id")
        )
        + sum(r.counts[p] for p in ("empty_image", "duplicate_file_name") if r.actions.get(p) == "skip")
        == r.images_in
    )
    return ann


def test_clean_dataset_loads_with_no_problems(small_coco):
    ann = load(small_coco)
    assert not ann.report.counts
    assert ann.report.images_kept == 3 and ann.report.annotations_kept == 4
    rec = ann.records[0]
    np.testing.assert_array_equal(rec.boxes, [[4, 5, 24, 15], [30, 10, 42, 40]])  # xywh -> xyxy
    np.testing.assert_array_equal(rec.category_ids, [1, 3])


def _expect_error(folder, problem: str, where: str, **policy):
    with pytest.raises(DatasetError) as err:
        load(folder, **policy)
    text = str(err.value)
    assert f"{problem} (1)" in text, text
    assert where in text, text
    return text


def test_missing_image(small_coco):
    (small_coco.root / "img2.jpg").unlink()
    _expect_error(small_coco, "missing_image", "img2.jpg")
    ann = load(small_coco, missing_image="skip")
    assert ann.report.counts["missing_image"] == 1 and ann.report.images_kept == 2
    assert ann.report.annotations_kept == 3  # the image's one box went with it, counted with the image
    assert "img2.jpg" in ann.report.format()


def test_an_image_on_disk_in_other_letter_case_is_named_as_such(small_coco):
    """000001.jpg in the json, 000001.JPG on disk (Windows and macOS do not tell them apart)."""
    (small_coco.root / "img2.jpg").rename(small_coco.root / "img2.JPG")
    text = _expect_error(small_coco, "missing_image", "img2.jpg: on disk it is img2.JPG")
    assert "the names differ in letter case" in text and "rename the file or correct the name" in text


def test_an_exact_duplicate_annotation_is_dropped_counted_and_said(small_coco):
    """A label written twice (the same class and box) would be a second object to find: a model that
    finds it once scores a miss. Dropped and counted by default; `keep` keeps it, counted."""
    first = small_coco.data["annotations"][0]
    small_coco.data["annotations"].append({**first, "id": 99})
    small_coco.data["annotations"].append({**first, "id": 100, "category_id": 3})  # another class: kept
    small_coco.write()
    ann = load(small_coco)
    assert ann.report.counts["duplicate_box"] == 1 and ann.report.annotations_kept == 5
    assert "1 duplicate_box skipped" in ann.report.summary_line()
    assert "img1.jpg annotation 99: bbox [4, 5, 20, 10]: the same class and box as an earlier one" in (
        ann.report.format()
    )
    kept = load(small_coco, duplicate_box="keep")
    assert kept.report.annotations_kept == 6 and "1 duplicate_box kept" in kept.report.summary_line()


def test_a_yolo_label_line_written_twice_is_dropped_and_counted(tmp_path, jpeg_writer):
    from dfine_deploy.data.formats import open_dataset

    jpeg_writer(tmp_path / "images" / "val" / "a.jpg", 40, 30)
    (tmp_path / "labels" / "val").mkdir(parents=True)
    (tmp_path / "labels" / "val" / "a.txt").write_text(
        "1 0.5 0.5 0.5 0.5\n0 0.2 0.2 0.1 0.1\n1 0.5 0.5 0.5 0.5\n"
    )
    (tmp_path / "data.yaml").write_text("val: images/val\nnames: [a, b]\n")
    ann = open_dataset(tmp_path / "data.yaml").load("val")
    assert ann.report.counts["duplicate_box"] == 1 and ann.report.annotations_kept == 2
    assert "a.txt:3: " in ann.report.format(), ann.report.format()


def test_unreadable_image(small_coco):
    (small_coco.root / "img1.jpg").write_bytes(b"this is not an image at all")
    _expect_error(small_coco, "unreadable_image", "img1.jpg")
    assert load(small_coco, unreadable_image="skip").report.counts["unreadable_image"] == 1


@pytest.mark.parametrize("level", ["header", "decode"])
def test_truncated_jpeg_is_found(small_coco, level):
    path = small_coco.root / "img3.jpg"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) * 2 // 3])  # cut off: no end-of-image marker, missing scans
    _expect_error(small_coco, "corrupt_image", "img3.jpg", check_images=level)
    ann = load(small_coco, corrupt_image="skip", check_images=level)
    assert ann.report.counts["corrupt_image"] == 1
    assert [r.file_name for r in ann.records] == ["img1.jpg", "img2.jpg"]


def test_size_mismatch(small_coco):
    small_coco.data["images"][0]["width"] = 100
    small_coco.write()
    _expect_error(small_coco, "size_mismatch", "json says 100x48, file is 64x48")
    ann = load(small_coco, size_mismatch="fix")
    assert ann.records[0].width == 64 and ann.report.counts["size_mismatch"] == 1


def test_duplicate_image_id(small_coco):
    small_coco.data["images"][2]["id"] = 1
    small_coco.write()
    _expect_error(small_coco, "duplicate_image_id", "id 1: img3.jpg")
    # img3's annotation now points at id 3, which no image has any more: reported too
    ann = load(small_coco, duplicate_image_id="skip", unknown_image_id="skip")
    assert ann.report.counts["duplicate_image_id"] == 1 and ann.report.counts["unknown_image_id"] == 1
    assert [r.file_name for r in ann.records] == ["img1.jpg", "img2.jpg"]


def test_the_same_picture_listed_twice_is_an_error_and_skipped_or_kept_when_asked(small_coco):
    """Two exports put together list each picture twice under new ids: scored as two images, every
    box would be found (or missed) twice."""
    first = small_coco.data
    offset = len(first["images"])
    again = [dict(i, id=i["id"] + offset) for i in first["images"][:2]]
    again[1]["file_name"] = "./" + again[1]["file_name"]  # the same file, written another way
    boxes = [
        dict(a, id=a["id"] + 100, image_id=a["image_id"] + offset)
        for a in first["annotations"]
        if a["image_id"] <= 2
    ]
    small_coco.data = dict(first, images=first["images"] + again, annotations=first["annotations"] + boxes)
    small_coco.write()
    with pytest.raises(DatasetError, match=r"duplicate_file_name \(2\)") as err:
        load(small_coco)
    assert "img1.jpg: image ids 1 and 4" in str(err.value) and "./img2.jpg: image ids 2 and 5" in str(
        err.value
    )
    skipped = load(small_coco, duplicate_file_name="skip")
    assert [r.file_name for r in skipped.records] == ["img1.jpg", "img2.jpg", "img3.jpg"]
    assert skipped.report.counts["duplicate_file_name"] == 2
    assert skipped.report.annotations_of_dropped_images == len(boxes) == 3
    assert "duplicate_file_name: 2 skipped" in skipped.report.format()
    kept = load(small_coco, duplicate_file_name="keep")
    assert len(kept.records) == 5 and kept.report.counts["duplicate_file_name"] == 2


def test_a_voc_split_list_naming_an_image_twice_is_the_same_problem(tmp_path, jpeg_writer):
    from dfine_deploy.data.voc import load_voc

    jpeg_writer(tmp_path / "JPEGImages" / "a.jpg", 40, 30)
    (tmp_path / "Annotations").mkdir()
    (tmp_path / "Annotations" / "a.xml").write_text(
        "<annotation><filename>a.jpg</filename><size><width>40</width><height>30</height></size>"
        "<object><name>cat</name><bndbox><xmin>2</xmin><ymin>2</ymin><xmax>20</xmax><ymax>20</ymax>"
        "</bndbox></object></annotation>"
    )
    (tmp_path / "ImageSets" / "Main").mkdir(parents=True)
    (tmp_path / "ImageSets" / "Main" / "val.txt").write_text("a\na\n")
    with pytest.raises(DatasetError, match=r"duplicate_file_name \(1\)"):
        load_voc(tmp_path, "val")
    skipped = load_voc(tmp_path, "val", policy=ValidationPolicy(duplicate_file_name="skip"))
    assert (skipped.report.images_kept, skipped.report.annotations_kept) == (1, 1)


def test_every_voc_file_that_is_no_xml_is_named_at_once(tmp_path, jpeg_writer):
    """The first broken XML was refused alone; the next run found the next."""
    from dfine_deploy.data.voc import load_voc

    (tmp_path / "Annotations").mkdir()
    good = "<annotation><filename>{0}.jpg</filename><object><name>cat</name><bndbox><xmin>2</xmin>"
    good += "<ymin>2</ymin><xmax>20</xmax><ymax>20</ymax></bndbox></object></annotation>"
    for stem in "abcd":
        jpeg_writer(tmp_path / "JPEGImages" / f"{stem}.jpg", 40, 30)
        text = good.format(stem) if stem in "ac" else good.format(stem)[:-20]  # b and d cut short
        (tmp_path / "Annotations" / f"{stem}.xml").write_text(text)
    with pytest.raises(DatasetError) as refused:
        load_voc(tmp_path, None)
    lines = str(refused.value).splitlines()
    assert lines[0] == "2 of 4 VOC annotation file(s) are not readable XML; re-export them:", lines
    assert [line.split(": ")[0].strip() for line in lines[1:]] == [
        str(tmp_path / "Annotations" / "b.xml"),
        str(tmp_path / "Annotations" / "d.xml"),
    ]


def test_annotation_with_unknown_image_id(small_coco):
    small_coco.data["annotations"][3]["image_id"] = 42
    small_coco.write()
    _expect_error(small_coco, "unknown_image_id", "image_id 42")
    ann = load(small_coco, unknown_image_id="skip")
    assert ann.report.counts["unknown_image_id"] == 1 and ann.report.annotations_kept == 3


def test_unknown_category(small_coco):
    small_coco.data["annotations"][0]["category_id"] = 2
    small_coco.write()
    _expect_error(small_coco, "unknown_category", "img1.jpg annotation 1: category_id 2")
    ann = load(small_coco, unknown_category="skip")
    assert ann.report.counts["unknown_category"] == 1 and ann.report.annotations_kept == 3


@pytest.mark.parametrize("bbox", [[1, 2, 3], [1, 2, float("nan"), 4], ["a", 1, 2, 3], None])
def test_invalid_box(small_coco, bbox):
    small_coco.data["annotations"][0]["bbox"] = bbox
    small_coco.write()
    _expect_error(small_coco, "invalid_box", "img1.jpg annotation 1")


def test_negative_box(small_coco):
    small_coco.data["annotations"][1]["bbox"] = [30, 10, -12, 30]
    small_coco.write()
    _expect_error(small_coco, "negative_box", "img1.jpg annotation 2")
    ann = load(small_coco, negative_box="skip")
    assert ann.report.counts["negative_box"] == 1 and ann.report.annotations_kept == 3


def test_zero_area_box_is_skipped_and_counted_by_default(small_coco):
    small_coco.data["annotations"][3]["bbox"] = [10, 10, 0, 5]
    small_coco.write()
    ann = load(small_coco)
    assert ann.report.counts["zero_area_box"] == 1 and ann.report.actions["zero_area_box"] == "skip"
    assert ann.report.annotations_kept == 3
    assert "zero_area_box: 1 skipped" in ann.report.format()
    _expect_error(small_coco, "zero_area_box", "img3.jpg annotation 4", zero_area_box="error")


def test_box_outside_image_is_clamped_and_counted_by_default(small_coco):
    small_coco.data["annotations"][0]["bbox"] = [-4, 40, 20, 20]  # 64x48 image
    small_coco.write()
    ann = load(small_coco)
    assert ann.report.counts["box_outside_image"] == 1
    np.testing.assert_array_equal(ann.records[0].boxes[0], [0, 40, 16, 48])
    assert ann.report.annotations_kept == 4
    _expect_error(small_coco, "box_outside_image", "img1.jpg annotation 1", box_outside_image="error")
    assert load(small_coco, box_outside_image="skip").report.annotations_kept == 3


def test_box_entirely_outside_image(small_coco):
    small_coco.data["annotations"][0]["bbox"] = [0.1, 0.2, 0.3, 0.1]  # fine; the next one is not
    small_coco.data["annotations"][1]["bbox"] = [70, 10, 5, 5]  # x beyond the 64 px width
    small_coco.write()
    _expect_error(small_coco, "box_entirely_outside", "img1.jpg annotation 2")
    ann = load(small_coco, box_entirely_outside="skip")
    assert ann.report.counts["box_entirely_outside"] == 1 and ann.report.annotations_kept == 3


def test_images_without_annotations_are_kept_and_counted(small_coco):
    small_coco.data["annotations"] = [a for a in small_coco.data["annotations"] if a["image_id"] != 3]
    small_coco.write()
    ann = load(small_coco)
    assert ann.report.counts["empty_image"] == 1 and ann.report.images_kept == 3
    assert len(ann.records[2].boxes) == 0
    assert load(small_coco, empty_image="skip").report.images_kept == 2
    _expect_error(small_coco, "empty_image", "img3.jpg", empty_image="error")


def test_crowd_boxes_are_kept_for_evaluation_and_counted(small_coco):
    small_coco.data["annotations"][0]["iscrowd"] = 1
    small_coco.write()
    ann = load(small_coco)
    assert ann.report.crowd_annotations == 1 and ann.report.annotations_kept == 4
    assert ann.records[0].iscrowd.tolist() == [True, False]
    assert sum(a["iscrowd"] for a in ann.coco_dict()["annotations"]) == 1


def test_all_problems_are_reported_together(small_coco):
    (small_coco.root / "img2.jpg").unlink()
    small_coco.data["annotations"][0]["category_id"] = 7
    small_coco.write()
    with pytest.raises(DatasetError) as err:
        load(small_coco)
    assert "missing_image (1)" in str(err.value) and "unknown_category (1)" in str(err.value)


def test_policy_values_and_keys_are_checked():
    with pytest.raises(DatasetError, match="missing_image='fix' is not allowed"):
        ValidationPolicy(missing_image="fix")
    with pytest.raises(DatasetError, match="unknown validation policy key"):
        ValidationPolicy.from_mapping({"missing_images": "skip"})


def test_not_a_coco_file(tmp_path):
    (tmp_path / "a.json").write_text('{"images": []}')
    with pytest.raises(DatasetError, match="list under 'annotations'"):
        load_coco(tmp_path / "a.json", tmp_path)
    (tmp_path / "b.json").write_text("{not json")
    with pytest.raises(DatasetError, match="not valid JSON"):
        load_coco(tmp_path / "b.json", tmp_path)
    with pytest.raises(DatasetError, match="annotation file not found: .*c.json"):
        load_coco(tmp_path / "c.json", tmp_path)
