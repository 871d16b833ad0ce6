from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import torch

from dfine_deploy.data.coco import DetectionDataset, load_coco
from dfine_deploy.data.synthetic import CLASS_NAMES, SyntheticSpec, generate
from dfine_deploy.data.validation import ValidationPolicy
from dfine_deploy.data.yolo import convert_yolo, load_yolo
from dfine_deploy.errors import DatasetError


def coco_to_yolo(coco_folder: Path, yolo_root: Path, split: str, names_as_dict: bool = False) -> None:
    """Write the same annotations in YOLO form (an independent conversion, full float precision)."""
    data = json.loads((coco_folder / "annotations.json").read_text())
    images_dir, labels_dir = yolo_root / "images" / split, yolo_root / "labels" / split
    images_dir.mkdir(parents=True)
    labels_dir.mkdir(parents=True)
    for img in data["images"]:
        shutil.copy(coco_folder / img["file_name"], images_dir / img["file_name"])
        w, h = img["width"], img["height"]
        lines = []
        for a in data["annotations"]:
            if a["image_id"] == img["id"]:
                x, y, bw, bh = a["bbox"]
                lines.append(
                    f"{a['category_id']} {(x + bw / 2) / w!r} {(y + bh / 2) / h!r} {bw / w!r} {bh / h!r}"
                )
        if lines:  # an image without objects gets no label file, as YOLO tools write it
            (labels_dir / Path(img["file_name"]).with_suffix(".txt")).write_text("\n".join(lines) + "\n")
    names = dict(enumerate(CLASS_NAMES)) if names_as_dict else list(CLASS_NAMES)
    (yolo_root / "data.yaml").write_text(
        json.dumps({"path": ".", "train": "images/train", "val": "images/val", "names": names})
    )


@pytest.fixture(scope="module")
def twin(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("twin")
    generate(root / "coco", SyntheticSpec(images=10, seed=5, size=96, val_images=3))
    for split in ("train", "val"):
        coco_to_yolo(root / "coco" / split, root / "yolo", split, names_as_dict=True)
    return root / "coco", root / "yolo"


def targets(dataset: DetectionDataset) -> dict[str, dict]:
    out = {}
    for i, rec in enumerate(dataset.records):
        image, target = dataset.load_item(i)
        out[rec.file_name] = {"image": image, **{k: target[k] for k in ("boxes", "labels", "orig_size")}}
    return out


def test_coco_and_yolo_loading_give_identical_targets(twin):
    coco, yolo = twin
    for split in ("train", "val"):
        a = load_coco(coco / split / "annotations.json", coco / split)
        b = load_yolo(yolo / "data.yaml", split)
        assert [c["name"] for c in a.categories] == [c["name"] for c in b.categories]
        ta = targets(DetectionDataset(a, a.class_map(remap=False)))
        tb = targets(DetectionDataset(b, b.class_map(remap=False)))
        assert ta.keys() == tb.keys() and len(ta) > 0
        for name in ta:
            torch.testing.assert_close(
                ta[name]["boxes"].as_subclass(torch.Tensor), tb[name]["boxes"].as_subclass(torch.Tensor)
            )
            assert torch.equal(ta[name]["labels"], tb[name]["labels"])
            assert torch.equal(ta[name]["orig_size"], tb[name]["orig_size"])
            assert torch.equal(ta[name]["image"], tb[name]["image"])


def test_convert_yolo_writes_an_equivalent_coco_folder(twin, tmp_path):
    coco, yolo = twin
    converted = convert_yolo(yolo, tmp_path / "out")
    assert set(converted) == {"train", "val"}
    back = load_coco(tmp_path / "out" / "train" / "annotations.json", tmp_path / "out" / "train")
    orig = load_coco(coco / "train" / "annotations.json", coco / "train")
    assert [r.file_name for r in back.records] == [r.file_name for r in orig.records]
    for r1, r2 in zip(back.records, orig.records):
        torch.testing.assert_close(torch.from_numpy(r1.boxes), torch.from_numpy(r2.boxes))
        assert r1.category_ids.tolist() == r2.category_ids.tolist()


@pytest.fixture
def tiny_yolo(tmp_path, jpeg_writer) -> Path:
    write_jpeg = jpeg_writer
    write_jpeg(tmp_path / "images" / "a.jpg", 100, 50)
    write_jpeg(tmp_path / "images" / "b.jpg", 100, 50)
    (tmp_path / "labels").mkdir()
    (tmp_path / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.4\n1 0.1 0.1 0.3 0.1 0.3 0.3\n")
    (tmp_path / "data.yaml").write_text("train: images\nnames: [box, tri]\n")
    return tmp_path


def test_polygons_background_images_and_pixels(tiny_yolo):
    ann = load_yolo(tiny_yolo, "train")
    a, b = ann.records
    torch.testing.assert_close(
        torch.from_numpy(a.boxes), torch.tensor([[40.0, 15.0, 60.0, 35.0], [10.0, 5.0, 30.0, 15.0]])
    )
    assert a.category_ids.tolist() == [0, 1]
    assert len(b.boxes) == 0 and ann.report.counts["empty_image"] == 1
    # the polygon read as its box is counted (it was not), as CVAT's polygons are; 'error' refuses it
    assert ann.report.counts["shape_as_box"] == 1
    with pytest.raises(DatasetError, match=r"shape_as_box \(1\)"):
        load_yolo(tiny_yolo, "train", policy=ValidationPolicy(shape_as_box="error"))


def test_bad_label_line_names_file_and_line(tiny_yolo):
    (tiny_yolo / "labels" / "a.txt").write_text("0 0.5 0.5 0.2 0.4\n0 0.5 0.5\n")
    with pytest.raises(DatasetError, match=r"a\.txt:2"):
        load_yolo(tiny_yolo, "train")


def test_class_index_beyond_names_is_an_unknown_category(tiny_yolo):
    (tiny_yolo / "labels" / "a.txt").write_text("5 0.5 0.5 0.2 0.4\n")
    with pytest.raises(DatasetError, match="unknown_category"):
        load_yolo(tiny_yolo, "train")
    ann = load_yolo(tiny_yolo, "train", policy=ValidationPolicy(unknown_category="skip"))
    assert ann.report.counts["unknown_category"] == 1


def test_data_yaml_problems(tiny_yolo):
    (tiny_yolo / "data.yaml").write_text("train: images\nnames: [a, b]\nnc: 3\n")
    with pytest.raises(DatasetError, match="nc is 3"):
        load_yolo(tiny_yolo, "train")
    (tiny_yolo / "data.yaml").write_text("train: images\n")
    with pytest.raises(DatasetError, match="'names'"):
        load_yolo(tiny_yolo, "train")
    (tiny_yolo / "data.yaml").write_text("train: images\nnames: {0: a, 1: b, 0: c}\n")
    with pytest.raises(DatasetError, match="data.yaml is not valid YAML: line 2: key '0' is set twice"):
        load_yolo(tiny_yolo, "train")
    (tiny_yolo / "data.yaml").unlink()
    with pytest.raises(DatasetError, match="no data.yaml"):
        load_yolo(tiny_yolo, "train")


def test_every_bad_label_line_is_reported_in_yolo_terms(twin, tmp_path):
    """Not only the first bad file, and by label file and line, not by converted COCO annotation ids."""
    _, yolo = twin
    root = tmp_path / "yolo"
    shutil.copytree(yolo, root)
    labels = sorted((root / "labels" / "train").glob("*.txt"))
    first, second, third = labels[0], labels[1], labels[2]
    first.write_text(first.read_text() + "0 0.5 zero 0.1 0.1\n")
    second.write_text("1 0.5 0.5 0.1\n" + second.read_text())
    with pytest.raises(DatasetError) as unreadable:
        load_yolo(root / "data.yaml", "train")
    text = str(unreadable.value)
    n_first = len(first.read_text().splitlines())
    assert f"{first}:{n_first}: '0 0.5 zero 0.1 0.1'" in text and f"{second}:1: '1 0.5 0.5 0.1'" in text
    assert "2 label line(s)" in text

    first.write_text("".join(line + "\n" for line in first.read_text().splitlines()[:-1]))
    second.write_text("".join(line + "\n" for line in second.read_text().splitlines()[1:]))
    third.write_text("9 0.5 0.5 0.2 0.2\n" + third.read_text())
    second.write_text(second.read_text() + "0 0.5 0.5 -0.2 0.2\n")
    with pytest.raises(DatasetError) as wrong:
        load_yolo(root / "data.yaml", "train")
    text = str(wrong.value)
    assert f"{third}:1: '9 0.5 0.5 0.2 0.2': class 9 is not in names (0..3)" in text
    n_second = len(second.read_text().splitlines())
    assert f"{second}:{n_second}: '0 0.5 0.5 -0.2 0.2'" in text
    assert not re.search(r"annotation \d+|bbox \[", text)  # no converted COCO annotation ids or pixel boxes


def test_a_split_given_as_a_list_of_folders_reads_them_all(twin, tmp_path):
    """Ultralytics takes `train: [folder, folder]`: every reader reads both, its file names relative to
    their common folder, and convert-yolo writes them all."""
    from dfine_deploy.data.formats import open_dataset

    _, yolo = twin
    root = tmp_path / "yolo"
    shutil.copytree(yolo, root)
    (root / "data.yaml").write_text(
        json.dumps({"train": ["images/train", "images/val"], "val": "images/val", "names": list(CLASS_NAMES)})
    )
    both = load_yolo(root / "data.yaml", "train")
    train, val = load_yolo(yolo / "data.yaml", "train"), load_yolo(yolo / "data.yaml", "val")
    assert both.img_folder == root / "images"
    assert [r.file_name for r in both.records] == [f"train/{r.file_name}" for r in train.records] + [
        f"val/{r.file_name}" for r in val.records
    ]
    assert both.report.annotations_kept == train.report.annotations_kept + val.report.annotations_kept
    read = open_dataset(root).load("train")
    assert [r.file_name for r in read.records] == [r.file_name for r in both.records]
    assert read.layout.endswith(f"images in {root / 'images'})")
    converted = convert_yolo(root, tmp_path / "out")
    assert converted["train"].report.images_kept == len(both.records)


def test_a_root_path_relative_to_the_working_folder_is_read_from_there(twin, tmp_path, monkeypatch):
    """Ultralytics reads a relative `path:` from the working folder: where it is not below the
    data.yaml's folder, it is read from there (below it first, as `path: .` means)."""
    _, yolo = twin
    shutil.copytree(yolo, tmp_path / "datasets" / "shapes")
    (tmp_path / "configs").mkdir()
    data = {
        "path": "datasets/shapes",
        "train": "images/train",
        "val": "images/val",
        "names": list(CLASS_NAMES),
    }
    (tmp_path / "configs" / "shapes.yaml").write_text(json.dumps(data))
    monkeypatch.chdir(tmp_path)
    read = load_yolo(tmp_path / "configs" / "shapes.yaml", "val")
    assert read.img_folder == tmp_path / "datasets" / "shapes" / "images" / "val"
    assert read.report.images_kept == load_yolo(yolo / "data.yaml", "val").report.images_kept
