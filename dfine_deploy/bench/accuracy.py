"""mAP50-95 of the very graph/engine being timed (fast-but-wrong FP16 engines are the known failure).

`--data` takes any layout of `dfine_deploy/data/formats.py`, as its folder or its annotation file
(a COCO json, a Roboflow, CVAT or Label Studio export, a YOLO data.yaml, a Pascal VOC folder); its
val split is scored (a one-split export: that split), and one line says which layout was read.
Categories meet the model's labels by name (`ClassMap.for_model`), whatever their ids; a model that
names its classes and a dataset with other names are refused. `--data-limit N` scores the first N
images against their own annotations only, and the line printed says how many were scored.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from dfine_deploy.boxes import xywh_to_xyxy
from dfine_deploy.errors import BenchError, DatasetError, require
from dfine_deploy.images import read_image
from dfine_deploy.runtime.detector import Detector
from dfine_deploy.thresholds import gather_evidence, precision_recall, resolve_thresholds


@dataclass
class DataScore:
    """The mAP of one detector on --data, and what it was computed on."""

    map50_95: float
    images: int  # scored
    images_kept: int  # the dataset's images that passed validation
    classes: str  # how categories met the model's labels (ClassMap.for_model)
    source: str  # the annotation file (the split's source)
    # precision and recall per class at the thresholds dfine-serve applies to this graph by default
    per_class: list[str] = field(default_factory=list)

    def line(self) -> str:
        """One line for the report: what was scored and how classes were matched."""
        return f"{self.images} of the {self.images_kept} images of {self.source}; {self.classes}"


def coco_map(detector: Detector, data: Path, limit: int | None = None) -> DataScore:
    """COCO mAP50-95 (the 'AP' of COCOeval) of `detector` on the first `limit` (None: all) images
    of the dataset at `data`, scored against those images' annotations only."""
    require("faster_coco_eval", "train", "--data (COCO evaluation)")
    from dfine_deploy.data.classmap import ClassMap
    from dfine_deploy.data.formats import open_dataset
    from dfine_deploy.evaluation import CocoEvaluator

    if limit is not None and limit < 1:
        raise BenchError(f"--data-limit {limit}: give N >= 1 images, or leave it out to score them all")
    # the training loader's validation and default policy: a truncated image, an unknown category or
    # a negative box stops here instead of silently changing the mAP; fixes and skips are reported
    annotations = open_dataset(data).load("val")
    ann_file, folder = annotations.source, annotations.img_folder
    for line in annotations.lines():
        print(line, file=sys.stderr)
    print(f"data: {annotations.report.summary_line()}", file=sys.stderr)
    try:
        match = ClassMap.for_model(
            annotations.categories, detector.class_names, names_note=detector.class_names_note
        )
    except DatasetError as exc:
        raise BenchError(f"--data {ann_file}: {exc}") from None
    print(f"data: {match.line}" if match.by_name else f"warning: --data: {match.line}", file=sys.stderr)
    gt = annotations.coco_dict()
    kept = gt.get("images", [])
    if not kept:
        raise BenchError(f"--data {ann_file}: no images listed")
    images = kept[:limit]
    if len(images) < len(kept):  # the images left out must not count as missed detections
        ids = {im["id"] for im in images}
        gt = dict(gt, images=images, annotations=[a for a in gt["annotations"] if a["image_id"] in ids])
    score = DataScore(0.0, len(images), len(kept), match.line, ann_file)
    print(f"data: mAP50-95 on {score.images} of {score.images_kept} images", file=sys.stderr)
    evaluator = CocoEvaluator(gt, match.class_map)
    detections = []
    for start in range(0, len(images), detector.max_batch):
        chunk = images[start : start + detector.max_batch]
        frames = [read_image(folder / record["file_name"]) for record in chunk]  # as training reads them
        results = detector.predict(frames, color="RGB")
        evaluator.update(
            [int(r["id"]) for r in chunk],
            [{"boxes": d.boxes, "scores": d.scores, "labels": d.labels} for d in results],
        )
        detections += [(d.labels, d.boxes, d.scores) for d in results]
    score.map50_95 = float(evaluator.summarize(per_class=False)["AP"])
    score.per_class = per_class_lines(detector, detections, annotated_truth(gt, images, match.class_map))
    return score


def annotated_truth(gt: dict, images: list[dict], class_map) -> list[tuple]:
    """Each scored image's annotations as (labels of the model, boxes xyxy px)."""
    by_image: dict[int, list[dict]] = {int(im["id"]): [] for im in images}
    for annotation in gt["annotations"]:
        by_image.setdefault(int(annotation["image_id"]), []).append(annotation)
    return [
        (
            class_map.labels_of([a["category_id"] for a in by_image[int(im["id"])]]),
            xywh_to_xyxy([a["bbox"] for a in by_image[int(im["id"])]]),
        )
        for im in images
    ]


def per_class_lines(detector: Detector, detections: list[tuple], truth: list[tuple]) -> list[str]:
    """Precision and recall of each class at the threshold dfine-serve applies to this graph by default
    (the one chosen at export, else the default), what the bench ran it at (yours) beside them."""
    names = detector.class_names
    served = resolve_thresholds(names, detector.thresholds.chosen)
    evidence = gather_evidence(detections, truth, len(names))
    lines = []
    for label, (name, row) in enumerate(zip(names, served.table(names))):
        if not evidence[label].instances and not len(evidence[label].scores):
            continue
        precision, recall, _ = precision_recall(evidence[label], row["threshold"])
        lines.append(
            f"  {name}: threshold {row['threshold']:.2f} ({row['source']}), precision {precision:.3f}, "
            f"recall {recall:.3f} over {evidence[label].instances} objects"
        )
    return lines
