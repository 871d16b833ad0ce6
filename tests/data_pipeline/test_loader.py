from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import torch

from dfine_deploy.data.loader import (
    build_dataloader,
    build_dataset,
    per_rank_batch_size,
)
from dfine_deploy.data.synthetic import SyntheticSpec, generate
from dfine_deploy.errors import ConfigError, DatasetError
from dfine_deploy.settings import (
    CollateSettings,
    DataSettings,
    TransformOp,
    TransformPolicy,
    TransformsSettings,
)

STRONG = ("RandomPhotometricDistort", "RandomZoomOut", "RandomIoUCrop")


def train_ops(size: int) -> tuple[TransformOp, ...]:
    return (
        TransformOp("RandomPhotometricDistort", {"p": 0.5}),
        TransformOp("RandomZoomOut", {"fill": 0}),
        TransformOp("RandomIoUCrop", {"p": 0.8}),
        TransformOp("SanitizeBoundingBoxes", {"min_size": 1}),
        TransformOp("RandomHorizontalFlip"),
        TransformOp("Resize", {"size": [size, size]}),
        TransformOp("SanitizeBoundingBoxes", {"min_size": 1}),
        TransformOp("ConvertPILImage", {"dtype": "float32", "scale": True}),
        TransformOp("ConvertBoxes", {"fmt": "cxcywh", "normalize": True}),
    )


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("loader")
    generate(out, SyntheticSpec(images=12, seed=2, size=96, val_images=4))
    return out


@pytest.fixture
def settings(synth) -> DataSettings:
    return DataSettings(
        dataset_type="SyntheticDetection",
        img_folder=str(synth / "train"),
        ann_file=str(synth / "train" / "annotations.json"),
        num_classes=4,
        transforms=TransformsSettings(ops=train_ops(64), policy=TransformPolicy("stop_epoch", 2, STRONG)),
        total_batch_size=4,
        num_workers=0,
        shuffle=True,
        drop_last=True,
    )


def batches(loader, epoch: int):
    loader.set_epoch(epoch)
    return [(images.clone(), [dict(t) for t in targets]) for images, targets in loader]


def same(a, b) -> bool:
    return len(a) == len(b) and all(
        torch.equal(x[0], y[0]) and all(torch.equal(s["boxes"], t["boxes"]) for s, t in zip(x[1], y[1]))
        for x, y in zip(a, b)
    )


def test_batches_have_the_training_contract(settings):
    dataset = build_dataset(settings)
    loader = build_dataloader(settings, dataset, seed=0)
    images, targets = next(iter(loader))
    assert images.shape == (4, 3, 64, 64) and images.dtype == torch.float32
    assert len(targets) == 4
    for t in targets:
        assert t["labels"].dtype == torch.int64 and t["boxes"].shape == (len(t["labels"]), 4)
        assert t["orig_size"].tolist() == [96, 96]
    assert len(loader) == 3  # 12 images, batch 4, drop_last


def test_same_seed_same_batches_other_seed_other_batches_and_resume_matches(settings):
    dataset = build_dataset(settings)
    first = build_dataloader(settings, dataset, seed=7)
    run = [batches(first, e) for e in range(3)]
    again = build_dataloader(settings, dataset, seed=7)
    assert same(run[0], batches(again, 0))
    other = build_dataloader(settings, dataset, seed=8)
    assert not same(run[0], batches(other, 0))
    resumed = build_dataloader(settings, dataset, seed=7)
    assert same(run[2], batches(resumed, 2))  # a resumed run sees the data of the unbroken one


def test_distributed_ranks_split_the_batch_and_the_data(settings):
    settings = dataclasses.replace(settings, transforms=TransformsSettings(ops=train_ops(64)[3:]))
    dataset = build_dataset(settings)
    seen = []
    for rank in (0, 1):
        loader = build_dataloader(settings, dataset, seed=0, rank=rank, world_size=2)
        loader.set_epoch(1)
        assert loader.batch_size == 2
        seen.append([int(t["idx"]) for _, targets in loader for t in targets])
    assert set(seen[0]).isdisjoint(seen[1]) and sorted(seen[0] + seen[1]) == list(range(12))


def test_total_batch_size_must_divide_over_ranks():
    assert per_rank_batch_size(32, 4) == 8
    with pytest.raises(ConfigError, match="total_batch_size 10 does not divide over 4 processes"):
        per_rank_batch_size(10, 4)


def test_persistent_workers_follow_set_epoch(settings):
    """Policy and multi-scale both switch off at stop_epoch even inside long-lived workers."""
    settings = dataclasses.replace(
        settings,
        transforms=TransformsSettings(
            ops=(TransformOp("RandomZoomOut", {"fill": 0, "p": 1.0}),) + train_ops(64)[5:],
            policy=TransformPolicy("stop_epoch", 1, ("RandomZoomOut",)),
        ),
        collate=CollateSettings(base_size=64, base_size_repeat=0, stop_epoch=1),
        num_workers=1,
        persistent_workers=True,
    )
    dataset = build_dataset(settings)
    loader = build_dataloader(settings, dataset, seed=0)
    assert loader.collate_fn.scales == [32, 64]  # generate_scales(64, 0)
    early = batches(loader, 0)
    late = batches(loader, 1)
    assert 32 in {b[0].shape[-1] for b in early}  # seeded: this draw includes the small scale
    assert {b[0].shape[-1] for b in late} == {64}
    # zoom-out (p=1) shrinks every box while it runs; after the stop epoch it no longer does

    def mean_w(bs):
        return torch.cat([t["boxes"][:, 2] for _, ts in bs for t in ts]).mean()

    assert mean_w(early) < 0.7 * mean_w(late)


def test_unsupported_worker_settings(settings):
    with pytest.raises(ConfigError, match="num_workers > 0"):
        build_dataloader(dataclasses.replace(settings, prefetch_factor=2), build_dataset(settings))
    with pytest.raises(DatasetError, match="num_classes is 3"):
        build_dataset(dataclasses.replace(settings, num_classes=3))


def test_yolo_settings_and_class_names(settings, tmp_path, jpeg_writer):
    jpeg_writer(tmp_path / "images" / "val" / "a.jpg", 40, 30)
    (tmp_path / "labels" / "val").mkdir(parents=True)
    (tmp_path / "labels" / "val" / "a.txt").write_text("1 0.5 0.5 0.5 0.5\n")
    (tmp_path / "data.yaml").write_text("val: images/val\nnames: [rectangle, ellipse, triangle, ring]\n")
    yolo = dataclasses.replace(
        settings,
        dataset_type="YOLODetection",
        ann_file=str(tmp_path / "data.yaml"),
        img_folder="val",
        transforms=TransformsSettings(),
    )
    train = build_dataset(settings)
    val = build_dataset(yolo, class_map=train.class_map)
    image, target = val[0]
    assert image.shape == (3, 30, 40) and target["labels"].tolist() == [1]
    renamed = build_dataset(dataclasses.replace(yolo, class_names=("a", "b", "c", "d")))
    assert renamed.class_map.names == ("a", "b", "c", "d")
    with pytest.raises(ConfigError, match="class_names lists 2 names"):
        build_dataset(dataclasses.replace(yolo, class_names=("a", "b")))
    (tmp_path / "data.yaml").write_text(
        "val: images/val\nnames: [rectangle, ellipse, triangle, ring, star]\n"
    )
    with pytest.raises(DatasetError, match=r"\('star'\) are not among the model's 4 class names"):
        build_dataset(dataclasses.replace(yolo, num_classes=5), class_map=train.class_map)


def test_an_image_damaged_after_validation_stops_a_worker_with_our_one_line(settings, tmp_path):
    """torch re-raises a worker's error with its traceback as the message (an ImageError even as a
    RuntimeError); the loader gives the worker's own line instead."""
    folder = tmp_path / "copy"
    shutil.copytree(Path(settings.img_folder), folder)
    settings = dataclasses.replace(
        settings, img_folder=str(folder), ann_file=str(folder / "annotations.json"), num_workers=1
    )
    dataset = build_dataset(settings)  # validated while every image is whole
    damaged = folder / dataset.records[0].file_name
    damaged.write_bytes(b"replaced by a text file")
    loader = build_dataloader(settings, dataset, seed=0)
    with pytest.raises(DatasetError) as err:
        batches(loader, 0)
    assert str(err.value).startswith(f"cannot read image {damaged}: Pillow cannot identify it as an image")
    assert "\n" not in str(err.value) and "Traceback" not in str(err.value)


def test_num_classes_above_what_the_categories_need_is_said_with_the_number_to_set(settings):
    """A template's `num_classes: 777` left for 4 categories trains 773 heads that never see a box."""
    dataset = build_dataset(dataclasses.replace(settings, num_classes=777, transforms=TransformsSettings()))
    assert (
        f"num_classes is 777, and the 4 categories of {settings.ann_file} need 4 labels: 773 class heads "
        "will never see a box; set num_classes: 4 in the dataset config"
    ) in dataset.annotations.lines()
    assert not any("num_classes" in line for line in build_dataset(settings).annotations.lines())


def test_a_class_with_boxes_in_val_and_none_in_train_is_named_with_its_count(settings, synth, tmp_path):
    import json

    from dfine_deploy.data.loader import classes_missing_from_train

    data = json.loads((synth / "train" / "annotations.json").read_text())
    data["annotations"] = [a for a in data["annotations"] if a["category_id"] != 3]  # no 'ring' in train
    shutil.copytree(synth / "train", tmp_path / "train")
    (tmp_path / "train" / "annotations.json").write_text(json.dumps(data))
    plain = TransformsSettings()
    train = build_dataset(
        dataclasses.replace(
            settings,
            ann_file=str(tmp_path / "train" / "annotations.json"),
            img_folder=str(tmp_path / "train"),
            transforms=plain,
        )
    )
    val_settings = dataclasses.replace(
        settings,
        ann_file=str(synth / "val" / "annotations.json"),
        img_folder=str(synth / "val"),
        transforms=plain,
    )
    val = build_dataset(val_settings, class_map=train.class_map)
    rings = sum(int((r.category_ids == 3).sum()) for r in val.annotations.records)
    assert rings > 0
    assert classes_missing_from_train(train.annotations, val.annotations) == [
        f"{val.annotations.source}: 1 of its classes have boxes here and none in the train split "
        f"{train.annotations.source}: 'ring' ({rings} boxes); the model cannot learn them and their AP "
        "will be 0: add training images of them, or leave them out of val"
    ]
    assert classes_missing_from_train(val.annotations, val.annotations) == []
