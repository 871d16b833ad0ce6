"""The checks the smoke test and the alarm share (training/diagnosis.py), each on data made to trip it
and on data that must pass."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dfine_deploy.data.classmap import ClassMap
from dfine_deploy.data.validation import ValidationPolicy, validate_coco_dict
from dfine_deploy.training import diagnosis


def coco(boxes: list[list[float]], size: int = 100) -> dict:
    images = [
        {"id": i + 1, "file_name": f"{i}.jpg", "width": size, "height": size} for i in range(len(boxes))
    ]
    annotations = [
        {"id": i + 1, "image_id": i + 1, "category_id": 0, "bbox": box, "iscrowd": 0}
        for i, box in enumerate(boxes)
    ]
    return {"images": images, "annotations": annotations, "categories": [{"id": 0, "name": "thing"}]}


def report_of(boxes: list[list[float]]):
    records, _, report = validate_coco_dict(
        coco(boxes), "/nonexistent", source="train.json", policy=ValidationPolicy(check_images="none")
    )
    return records, report


rng = np.random.default_rng(0)
XYWH = [[float(x), float(y), 20.0, 15.0] for x, y in rng.uniform(0, 78, (40, 2))]  # all inside the image


def test_xyxy_boxes_are_found_and_xywh_boxes_pass():
    _, good = report_of(XYWH)
    assert diagnosis.check_box_format(good, "CocoDetection") is None
    corners = [[x, y, x + w, y + h] for x, y, w, h in XYWH]
    _, bad = report_of(corners)
    found = diagnosis.check_box_format(bad, "CocoDetection")
    assert found is not None and found.certain and "boxes look xyxy in a COCO json (train.json)" in found.line
    assert diagnosis.check_box_format(bad, "YOLODetection") is None  # converted by us: never xyxy


def test_tiny_and_huge_boxes_are_suspects():
    tiny, _ = report_of([[x, y, 0.5, 0.5] for x, y, _, _ in XYWH])  # 0..1 numbers in a pixel field
    found = diagnosis.check_box_sizes(tiny)
    assert found is not None and not found.certain and "tiny" in found.line
    huge, _ = report_of([[0, 0, 100, 100]] * 20)
    assert "huge" in diagnosis.check_box_sizes(huge).line
    normal, _ = report_of(XYWH)
    assert diagnosis.check_box_sizes(normal) is None


def test_labels_beyond_the_model_classes_are_certain():
    class_map = ClassMap.from_categories([{"id": 0, "name": "a"}, {"id": 7, "name": "b"}], remap=False)
    found = diagnosis.check_labels(class_map, num_classes=4)
    assert found.certain and "labels up to 7" in found.line and "num_classes: 8" in found.line
    assert diagnosis.check_labels(class_map, num_classes=8) is None


class Tiny(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Linear(2, 2)
        self.decoder = nn.Linear(2, 2)


@pytest.mark.parametrize(
    ("lrs", "expected", "certain"),
    [
        ((1e-4, 0.0), "learning rate 0", True),
        ((1e-4, 1e-8), "extreme", False),
        ((1e-4, 0.5), "extreme", False),
    ],
)
def test_learning_rates(lrs, expected, certain):
    model = Tiny()
    groups = [{"params": list(model.backbone.parameters()), "lr": lrs[0]}]
    groups.append({"params": list(model.decoder.parameters()), "lr": lrs[1]})
    optimizer = torch.optim.AdamW(groups)
    names = {id(p): n for n, p in model.named_parameters()}
    found = diagnosis.check_learning_rates(optimizer, names)
    assert expected in found.line and found.certain is certain and "decoder.weight" in found.line
    assert diagnosis.check_learning_rates(optimizer, names, [1e-4, 1e-4]) is None  # the base lrs decide


def test_frozen_heads_are_certain_a_frozen_backbone_a_suspect():
    model = Tiny()
    assert diagnosis.check_frozen(model) is None
    model.backbone.requires_grad_(False)
    assert not diagnosis.check_frozen(model).certain
    model.decoder.requires_grad_(False)
    assert diagnosis.check_frozen(model).certain


def test_the_alarm_is_due_once_after_its_share():
    zero = [{"val_AP50": 0.0}] * 3
    assert not diagnosis.alarm_due(zero[:2], epochs=12, share=0.25)  # 2 of 12 done: not yet
    assert diagnosis.alarm_due(zero, epochs=12, share=0.25)
    assert not diagnosis.alarm_due([*zero[:2], {"val_AP50": 0.02}], epochs=12, share=0.25)  # it learns
    assert not diagnosis.alarm_due([{"val_AP50": 0.0, "alarm": {}}, *zero], epochs=12, share=0.25)  # said
    assert not diagnosis.alarm_due(zero, epochs=12, share=0)  # off
    assert not diagnosis.alarm_due([{"train_loss": 1.0}] * 3, epochs=12, share=0.25)  # no validation
    # eval_freq skipped the epoch at the share: the alarm waits for the next validated epoch
    skipped = [{"val_AP50": 0.0}, {"train_loss": 1.0}, {"train_loss": 1.0}]
    assert not diagnosis.alarm_due(skipped, epochs=12, share=0.25)
    assert diagnosis.alarm_due([*skipped, {"val_AP50": 0.0}], epochs=12, share=0.25)
    assert not diagnosis.alarm_due([*skipped, {"val_AP50": 0.09}], epochs=12, share=0.25)
