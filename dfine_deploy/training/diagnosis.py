"""The known reasons a detector learns nothing, checked in one order by the smoke test and the alarm.

Each check reads what the run already holds (the train split's validated annotations and load
report, the class map, the optimizer's groups, the model's trainable parameters) and returns at most
one `Finding`: a line naming the cause and its fix. A *certain* finding means the run cannot learn the
right boxes whatever the loss does (the smoke test fails on it); a *suspect* is named as a likely
cause only once the model has shown it does not learn.

The order (docs/fine-tuning.md, "Smoke test"): labels outside num_classes, boxes that look xyxy in a
COCO json, all boxes tiny or huge, the learning rate, frozen parameters.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

# boxes look like x1 y1 x2 y2 corners read as x y w h: nearly all have w > x and h > y, and many end
# past the image's right or bottom edge (x1 + x2 > width for every box right of the middle)
CORNER_LIKE_SHARE = 0.95
PAST_EDGE_SHARE = 0.10
MIN_BOXES_FOR_SHAPE = 10  # fewer boxes than this say nothing about the format
# a box's side relative to its image's: sqrt(box area / image area)
TINY_SIDE = 0.01  # 6 px of a 640 input: below what the stride-8 features resolve
HUGE_SIDE = 0.95
BOX_SHARE = 0.95  # "all" boxes: this share of them
# AdamW learning rates outside these bounds do not train a DETR-style head in the official recipes'
# range (2.5e-6 for the X backbone .. 8e-4 for the N heads)
LR_LOW = 1e-6
LR_HIGH = 1e-2
# where the parameters of each part start (the score and box heads live in the decoder: model/weights.py)
PARTS = {"head": "decoder.", "backbone": "backbone."}


@dataclass(frozen=True)
class Finding:
    cause: str  # labels | box_format | box_size | learning_rate | frozen
    line: str
    certain: bool


def check_labels(class_map: Any, num_classes: int) -> Finding | None:
    """Every label the data gives must be a class of the model (the matcher indexes scores by it)."""
    labels = list(class_map.labels)
    if not labels or (min(labels) >= 0 and max(labels) < num_classes):
        return None
    rule = (
        "remap_mscoco_category is False, so the raw category id is the label"
        if not class_map.remap
        else "labels are the categories in id order"
    )
    return Finding(
        "labels",
        f"labels outside num_classes: the data gives labels up to {max(labels)} but the model has "
        f"{num_classes} classes ({rule}); set num_classes: {max(labels) + 1}, or "
        "remap_mscoco_category: True",
        certain=True,
    )


def check_box_format(report: Any, dataset_type: str) -> Finding | None:
    """Boxes of a COCO json written as x1 y1 x2 y2 (COCO's bbox is x y w h)."""
    if dataset_type == "YOLODetection":  # converted from normalised centres: the format is ours
        return None
    past_edge = report.counts.get("box_outside_image", 0) + report.counts.get("box_entirely_outside", 0)
    boxes = report.sized_boxes
    if boxes < MIN_BOXES_FOR_SHAPE:
        return None
    corner_like = report.corner_like_boxes / boxes
    if corner_like < CORNER_LIKE_SHARE or past_edge / boxes < PAST_EDGE_SHARE:
        return None
    return Finding(
        "box_format",
        f"boxes look xyxy in a COCO json ({report.source}): {corner_like:.0%} of the bboxes have w > x and "
        f"h > y and {past_edge / boxes:.0%} end past the image's edge (box_outside_image), as "
        "[x1, y1, x2, y2] read as [x, y, w, h] do; write bbox as [x, y, width, height]",
        certain=True,
    )


def relative_sides(records: list[Any]) -> np.ndarray:
    """sqrt(box area / image area) of every non-crowd training box."""
    sides = []
    for rec in records:
        boxes = rec.boxes[~rec.iscrowd]
        if len(boxes):
            area = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
            sides.append(np.sqrt(np.clip(area, 0, None) / float(rec.width * rec.height)))
    return np.concatenate(sides) if sides else np.zeros(0)


def check_box_sizes(records: list[Any]) -> Finding | None:
    """Nearly all boxes tiny (normalised coordinates stored as pixels) or nearly all the whole image
    (pixel coordinates read as normalised, then clamped)."""
    sides = relative_sides(records)
    if len(sides) < MIN_BOXES_FOR_SHAPE:
        return None
    if np.quantile(sides, BOX_SHARE) < TINY_SIDE:
        what = f"tiny: {BOX_SHARE:.0%} of the boxes are under {TINY_SIDE:.0%} of the image side"
        fix = "boxes in 0..1 where pixels were meant? COCO bbox is in pixels"
    elif np.quantile(sides, 1 - BOX_SHARE) > HUGE_SIDE:
        what = f"huge: {BOX_SHARE:.0%} of the boxes cover over {HUGE_SIDE:.0%} of the image side"
        fix = "pixel coordinates where YOLO expects 0..1, or boxes clamped to the image?"
    else:
        return None
    median = float(np.median(sides))
    return Finding("box_size", f"all boxes {what} (median {median:.3f}): {fix}", certain=False)


def check_learning_rates(
    optimizer: torch.optim.Optimizer, names: dict[int, str], base_lrs: list[float] | None = None
) -> Finding | None:
    """A group at lr 0 never moves its parameters; far outside the usual range, nothing trains.
    `base_lrs`: each group's lr before the schedule's factor (default: the groups' lr now)."""
    zero, low, high = [], [], []
    lrs = base_lrs if base_lrs is not None else [g["lr"] for g in optimizer.param_groups]
    for index, (group, lr) in enumerate(zip(optimizer.param_groups, lrs)):
        lr = float(lr)
        where = f"group {index} ({_group_span(group, names)}) lr {lr:g}"
        if lr == 0:
            zero.append(where)
        elif lr < LR_LOW:
            low.append(where)
        elif lr > LR_HIGH:
            high.append(where)
    if zero:
        return Finding(
            "learning_rate",
            f"learning rate 0: {'; '.join(zero)} never changes; set optimizer.lr (or that group's lr) > 0 "
            "(to freeze a part on purpose use HGNetv2.freeze_at, or run with --no-smoke)",
            certain=True,
        )
    if low or high:
        return Finding(
            "learning_rate",
            f"learning rate extreme: {'; '.join(low + high)}; AdamW trains D-FINE between "
            f"{LR_LOW:g} and {LR_HIGH:g} (official heads 2.5e-4)",
            certain=False,
        )
    return None


def check_frozen(model: nn.Module) -> Finding | None:
    """No trainable parameter in the class/box heads (certain) or in the whole backbone (suspect)."""
    trainable = {"head": 0, "backbone": 0}
    present = {"head": 0, "backbone": 0}
    for name, param in model.named_parameters():
        part = next((k for k, prefix in PARTS.items() if name.startswith(prefix)), "")
        if part:
            present[part] += 1
            trainable[part] += bool(param.requires_grad)
    if present["head"] and not trainable["head"]:
        return Finding(
            "frozen",
            f"frozen parameters: none of the decoder's {present['head']} tensors (score and box heads) "
            "has requires_grad, so nothing can learn the classes",
            certain=True,
        )
    if present["backbone"] and not trainable["backbone"]:
        return Finding(
            "frozen",
            f"frozen parameters: the whole backbone ({present['backbone']} tensors) has no requires_grad; "
            "lower HGNetv2.freeze_at (-1 trains every stage)",
            certain=False,
        )
    return None


def diagnose(
    dataset: Any,
    dataset_type: str,
    num_classes: int,
    optimizer: torch.optim.Optimizer,
    model: nn.Module,
    base_lrs: list[float] | None = None,
) -> list[Finding]:
    """Every check, in the documented order; `dataset` is the train split's DetectionDataset and
    `base_lrs` the groups' lr before the schedule (default: their lr now)."""
    names = {id(p): n for n, p in model.named_parameters()}
    annotations = dataset.annotations
    found = [
        check_labels(dataset.class_map, num_classes),
        check_box_format(annotations.report, dataset_type),
        check_box_sizes(annotations.records),
        check_learning_rates(optimizer, names, base_lrs),
        check_frozen(model),
    ]
    return [f for f in found if f is not None]


def _group_span(group: dict[str, Any], names: dict[int, str]) -> str:
    """What a group holds, by its first parameter's name and its size."""
    params = group["params"]
    first = names.get(id(params[0]), "?") if params else "empty"
    return f"{len(params)} tensors from {first}"


# ------------------------------------------------------------------------------- the alarm
AP50_NEAR_ZERO = 0.005  # a model that learned nothing scores about 0 (the quickstart passes 0.01 at 30 %)


def alarm_due(history: list[dict[str, Any]], epochs: int, share: float) -> bool:
    """True once, at the first validated epoch end where `share` of the run is done, no validation so
    far reached AP50 `AP50_NEAR_ZERO`, and no earlier record (a resumed run's too) holds the alarm.
    An epoch that was not validated (`eval_freq`) waits for the next one that is."""
    if share <= 0 or not history or any("alarm" in r for r in history):
        return False
    if not isinstance(history[-1].get("val_AP50"), (int, float)):
        return False
    if len(history) < math.ceil(share * epochs):
        return False
    scored = [r["val_AP50"] for r in history if isinstance(r.get("val_AP50"), (int, float))]
    return bool(scored) and max(scored) < AP50_NEAR_ZERO


def alarm_record(
    history: list[dict[str, Any]], epochs: int, findings: list[Finding], class_map: Any
) -> dict[str, Any]:
    """What the alarm says (the text to print) and stores (log.jsonl, TensorBoard)."""
    best = max(r["val_AP50"] for r in history if isinstance(r.get("val_AP50"), (int, float)))
    head = (
        f"alarm: validation AP50 has stayed below {AP50_NEAR_ZERO} for {len(history)} of {epochs} epochs "
        f"(best {best:.4f}): the model is not learning these boxes."
    )
    causes = [f"  - {f.line}" for f in findings] or [
        "  - none of the known causes (labels, box format, box sizes, learning rate, frozen parameters) "
        "was found"
    ]
    text = "\n".join(
        [
            head,
            "likely causes, in the order checked:",
            *causes,
            "class map:",
            class_map.table(),
            "run the smoke test (train/main.py -c CONFIG --smoke) to check in a minute whether this data, "
            "class map and learning rate can be learned at all",
        ]
    )
    return {
        "kind": "ap50_near_zero",
        "epochs_done": len(history),
        "best_AP50": best,
        "findings": [f.line for f in findings],
        "class_map": class_map.to_dict(),
        "text": text,
    }
