"""The parity gate's inputs: image batches (synthetic scenes, a folder, or a COCO split under --data),
the dataset scorer when --data has annotations, and the INT8 calibration feeds.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy.data.coco import AnnotationSet
from dfine_deploy.data.formats import Dataset, recognise
from dfine_deploy.errors import DatasetError
from dfine_deploy.export import parity
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.images import read_image

log = logging.getLogger(__name__)

PARITY_BATCH_SIZES = (1, 2, 4)
# INT8 activation ranges are measured on the calibration images alone: below this many (the default
# --calibration-images, with which the INT8 figures of docs/export.md were measured) they can miss the range
# of the images the model will see, and the few images the gate compares need not show the loss.
MIN_CALIBRATION_IMAGES = 32


def gate_batch_sizes(batch_max: int) -> list[int]:
    """The batch sizes every gate runs (those of PARITY_BATCH_SIZES the artifact's range holds)."""
    return [b for b in PARITY_BATCH_SIZES if b <= batch_max] or [1]


def parity_inputs(opts: ExportSettings) -> tuple[list[parity.ParityBatch], Any]:
    """Batches of real-looking images, and a dataset scorer when --data has COCO annotations.

    Without --data: one batch of each parity batch size of generated scenes. With --data: those
    batches, then single images up to `gate_images`, so that the mAP comparison and the box counts
    rest on enough images: the quickstart model's INT8 graph lost 1.83 mAP points on the first 7
    validation images and 1.26 on all 80."""
    height, width = opts.imgsz
    sizes = gate_batch_sizes(opts.batch[2])
    if opts.data is None:
        return parity.make_batches(parity.synthetic_scenes(sum(sizes)), height, width, sizes), None
    sizes += [1] * max(0, opts.gate_images - sum(sizes))
    count = sum(sizes)
    dataset = recognise(Path(opts.data))
    if dataset is None:
        images = parity.load_folder_images(opts.data, count)
        sizes = _fit_sizes(sizes, len(images))
        return parity.make_batches(images, height, width, sizes), None
    images, ids, annotations = _dataset_images(dataset, count)
    sizes = _fit_sizes(sizes, len(images))
    batches = parity.make_batches(images, height, width, sizes)
    for batch in batches:
        batch.image_ids = [ids[i] for i in batch.image_ids]
    return batches, (Path(annotations.source), annotations.coco_dict())


def _fit_sizes(sizes: list[int], available: int) -> list[int]:
    out, used = [], 0
    for b in sizes:
        if used + b <= available:
            out.append(b)
            used += b
    return out or [1]


def _dataset_images(
    dataset: Dataset, count: int, *, report: bool = True
) -> tuple[list[np.ndarray], list[int], AnnotationSet]:
    """The first `count` images of the dataset's val split (a one-split export: that split), validated
    as training validates them (missing or truncated images, unknown categories, bad boxes: the
    default policy, so nothing silently leaves the gate's mAP); returns (RGB images, their ids, the
    annotations). `report`: print the validation's lines (once per export)."""
    annotations = dataset.load("val")
    if report:
        for line in annotations.lines():
            print(line, flush=True)
        print(f"data: {annotations.report.summary_line()}", flush=True)
    images, ids = [], []
    for record in annotations.records[:count]:
        images.append(read_image(annotations.img_folder / record.file_name))
        ids.append(record.image_id)
    if not images:
        raise DatasetError(f"--data {dataset.path}: {annotations.source} lists no usable images")
    return images, ids, annotations


def annotated_images(opts: ExportSettings) -> tuple[list[np.ndarray], list[int]]:
    """The gate's images of an annotated --data again (the first `gate_images`, RGB as read from disk)
    with their ids: what Frigate's filters are chosen on (`frigate.choose_on_data`), fed as Frigate
    feeds them."""
    dataset = recognise(Path(opts.data))
    if dataset is None:
        raise DatasetError(f"--data {opts.data}: no annotated dataset there to choose Frigate's filters on")
    count = max(sum(gate_batch_sizes(opts.batch[2])), opts.gate_images)
    images, ids, _ = _dataset_images(dataset, count, report=False)
    return images, ids


def dataset_scorer(
    coco: tuple[Path, dict[str, Any]] | None, class_names: Sequence[str], names_note: str = ""
):
    """mAP (0..100) of one runner's detections on the annotated parity images, the categories met by
    the model's class names (`ClassMap.for_model`: refused when they name other classes)."""
    if coco is None:
        return None
    from dfine_deploy.evaluation import CocoEvaluator

    ann_path, data = coco
    match = _class_match(coco, class_names, names_note)
    if match.by_name:
        log.info("data: %s", match.line)
    else:
        log.warning("--data: %s", match.line)

    def score(batches: Sequence[parity.ParityBatch], outputs: list) -> float:
        ids = [i for b in batches for i in b.image_ids]
        subset = dict(
            data,
            images=[im for im in data["images"] if im["id"] in set(ids)],
            annotations=[a for a in data["annotations"] if a["image_id"] in set(ids)],
        )
        evaluator = CocoEvaluator(subset, match.class_map)
        for batch, (labels, boxes, scores) in zip(batches, outputs, strict=True):
            evaluator.update(
                batch.image_ids,
                [{"labels": labels[i], "boxes": boxes[i], "scores": scores[i]} for i in range(len(labels))],
            )
        return 100.0 * float(evaluator.summarize(per_class=False)["AP"])

    return score


def _class_match(coco: tuple[Path, dict[str, Any]], class_names: Sequence[str], names_note: str):
    from dfine_deploy.data.classmap import ClassMap

    ann_path, data = coco
    try:
        return ClassMap.for_model(data["categories"], class_names, names_note=names_note)
    except DatasetError as exc:
        raise DatasetError(f"--data {ann_path}: {exc}") from None


def ground_truth(
    coco: tuple[Path, dict[str, Any]] | None, class_names: Sequence[str], names_note: str = ""
) -> dict[int, tuple[np.ndarray, np.ndarray]] | None:
    """--data's annotations by image id, as (labels in the model's classes, boxes xyxy px): what the
    thresholds per class are chosen against (`ExportRun.record`); None without annotations."""
    if coco is None:
        return None
    from dfine_deploy.boxes import xywh_to_xyxy

    _, data = coco
    class_map = _class_match(coco, class_names, names_note).class_map
    rows: dict[int, list[dict[str, Any]]] = {int(im["id"]): [] for im in data["images"]}
    for annotation in data["annotations"]:
        rows.setdefault(int(annotation["image_id"]), []).append(annotation)
    return {
        image_id: (
            class_map.labels_of(np.array([a["category_id"] for a in found], dtype=np.int64)),
            xywh_to_xyxy(np.array([a["bbox"] for a in found], dtype=np.float64).reshape(-1, 4)),
        )
        for image_id, found in rows.items()
    }


def calibration_feeds(opts: ExportSettings) -> list[dict[str, np.ndarray]]:
    """One batch-1 feed per image of --data (sorted, the first `calibration_images`); one line says
    how many were found when fewer than asked, and warns below `MIN_CALIBRATION_IMAGES`."""
    height, width = opts.imgsz
    images = calibration_images(Path(opts.data), opts.calibration_images)
    found = f"{len(images)} image{'s' if len(images) != 1 else ''} of {opts.data}"
    if len(images) < MIN_CALIBRATION_IMAGES:
        fix = (
            f"pass --calibration-images {MIN_CALIBRATION_IMAGES} or more"
            if len(images) == opts.calibration_images
            else f"give --data a folder with at least {MIN_CALIBRATION_IMAGES} images of your domain"
        )
        log.warning(
            "--int8 calibrates on %s only: with fewer than %d the INT8 activation ranges may "
            "miss what other images hold, and the accuracy lost need not show on the gate's images; %s",
            found,
            MIN_CALIBRATION_IMAGES,
            fix,
        )
    elif len(images) < opts.calibration_images:
        log.info(
            "--int8: calibrating on the %s there are (--calibration-images %d)",
            found,
            opts.calibration_images,
        )
    return [
        {"images": b.images, "orig_target_sizes": b.orig_sizes}
        for b in parity.make_batches(images, height, width, [1] * len(images))
    ]


def calibration_images(data: Path, count: int) -> list[np.ndarray]:
    """The first `count` images of a dataset's train split (a one-split export: that split), so that
    the gate's val images are not the ones the ranges were measured on; a plain folder: its images."""
    dataset = recognise(data)
    if dataset is None:
        return parity.load_folder_images(data, count)
    split = dataset.split("train" if any(s.name == "train" for s in dataset.splits) else None)
    log.info("%s; INT8 calibration reads its images", dataset.describe(split))
    return parity.load_folder_images(split.images, count)
