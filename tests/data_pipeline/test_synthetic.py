from __future__ import annotations

import hashlib
import json
from pathlib import Path

import cv2
import numpy as np
import pytest

from dfine_deploy.data.coco import load_coco
from dfine_deploy.data.synthetic import CLASS_NAMES, SyntheticSpec, generate
from dfine_deploy.errors import DatasetError


def tree_hash(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "a"
    generate(out, SyntheticSpec(images=12, seed=3, size=128, val_images=4))
    return out


def test_same_seed_same_bytes_other_seed_other_bytes(synth, tmp_path):
    generate(tmp_path / "b", SyntheticSpec(images=12, seed=3, size=128, val_images=4))
    generate(tmp_path / "c", SyntheticSpec(images=12, seed=4, size=128, val_images=4))
    assert tree_hash(synth) == tree_hash(tmp_path / "b")
    assert tree_hash(synth) != tree_hash(tmp_path / "c")
    # train and val are different scenes
    assert (synth / "train" / "000001.jpg").read_bytes() != (synth / "val" / "000001.jpg").read_bytes()


def test_a_rerun_with_fewer_images_leaves_no_stale_files(tmp_path):
    generate(tmp_path, SyntheticSpec(images=5, seed=0, size=96, val_images=1))
    generate(tmp_path, SyntheticSpec(images=3, seed=0, size=96, val_images=1))
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == [
        "000001.jpg",
        "000002.jpg",
        "000003.jpg",
        "annotations.json",
    ]


def test_written_folder_is_a_valid_coco_dataset(synth):
    for split, count in (("train", 12), ("val", 4)):
        ann = load_coco(synth / split / "annotations.json", synth / split)
        assert not ann.report.counts, ann.report.format()  # no problems of any kind
        assert ann.report.images_kept == count
        assert [c["name"] for c in ann.categories] == list(CLASS_NAMES)
        per_image = [len(r.boxes) for r in ann.records]
        assert min(per_image) >= 1 and max(per_image) <= 6


def test_boxes_lie_in_the_image_and_hold_their_visible_pixels(synth):
    data = json.loads((synth / "train" / "annotations.json").read_text())
    assert {a["category_id"] for a in data["annotations"]} <= set(range(len(CLASS_NAMES)))
    for ann in data["annotations"]:
        x, y, w, h = ann["bbox"]
        assert w > 0 and h > 0 and x >= 0 and y >= 0 and x + w <= 128 and y + h <= 128
        assert 0 < ann["area"] <= w * h  # visible pixels within the box


def test_classes_are_balanced_enough_to_learn(tmp_path):
    generate(tmp_path, SyntheticSpec(images=60, seed=1, size=96, val_images=0))
    data = json.loads((tmp_path / "train" / "annotations.json").read_text())
    counts = np.bincount([a["category_id"] for a in data["annotations"]], minlength=4)
    assert counts.min() > 0.5 * counts.mean()
    assert not (tmp_path / "val").exists()
    image = cv2.imread(str(tmp_path / "train" / "000001.jpg"))
    assert image.shape == (96, 96, 3) and image.std() > 10  # textured, not flat


def test_bad_spec_is_refused():
    with pytest.raises(DatasetError, match="--images"):
        SyntheticSpec(images=0)
    with pytest.raises(DatasetError, match="--size"):
        SyntheticSpec(images=1, size=16)
    with pytest.raises(DatasetError, match=r"--dense-size 30 8: give MIN MAX pixels"):
        SyntheticSpec(images=1, dense=True, dense_size=(30, 8))


@pytest.mark.parametrize("size", [(8.0, 24.0), (30.0, 80.0)])
def test_dense_objects_take_the_size_asked(tmp_path, size):
    """`--dense-size`: the boxes of a dense scene follow the range (a rotated or three-cornered shape's
    box is not its extent, hence the slack), and the default is the 8-24 px of small objects."""
    extra = {} if size == (8.0, 24.0) else {"dense_size": size}
    generate(tmp_path, SyntheticSpec(images=1, val_images=0, dense=True, **extra))
    data = json.loads((tmp_path / "train" / "annotations.json").read_text())
    sides = np.array([np.sqrt(a["bbox"][2] * a["bbox"][3]) for a in data["annotations"]])
    assert len(sides) >= 150, len(sides)
    assert 0.75 * size[0] <= sides.min() and sides.max() <= 1.5 * size[1], (sides.min(), sides.max())
    assert np.median(sides) > 1.2 * size[0]
    assert f"objects of {size[0]:g}-{size[1]:g} px" in data["info"]["description"]
