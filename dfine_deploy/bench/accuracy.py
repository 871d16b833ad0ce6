"""mAP50-95 of the very graph/engine being timed (fast-but-wrong FP16 engines are the known failure).

`--data` takes a COCO-layout dataset in any of these forms:
    DIR/annotations.json + images in DIR            (dfine-data synthetic and YOLO conversions)
    DIR/annotations/instances_val2017.json + DIR/val2017/   (COCO itself)
    FILE.json                                       (images beside it, or in an `images/` folder)
Labels are mapped to category ids with the dataset's sorted categories when their number equals
the model's classes (the official COCO remapping), else the category id is the label.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dfine_deploy.errors import BenchError, DatasetError, require
from dfine_deploy.images import read_image
from dfine_deploy.runtime.detector import Detector


def find_annotations(data: Path) -> tuple[Path, Path]:
    """(annotation json, image folder) of a dataset path, or a BenchError listing what was tried."""
    data = Path(data)
    if data.is_file():
        images = data.parent / "images"
        return data, images if images.is_dir() else data.parent
    candidates = [(data / "annotations.json", data)]
    candidates += [
        (ann, data / ann.stem.removeprefix("instances_"))
        for ann in sorted((data / "annotations").glob("instances_*.json"))
    ]
    for ann, folder in candidates:
        if ann.is_file() and folder.is_dir():
            return ann, folder
    raise BenchError(
        f"--data {data}: no COCO dataset found; expected DIR/annotations.json with the images, "
        "DIR/annotations/instances_val2017.json with DIR/val2017/, or the path of the json"
    )


def coco_map(detector: Detector, data: Path, limit: int | None = None) -> float:
    """COCO mAP50-95 (the 'AP' of COCOeval) of `detector` on the dataset at `data`."""
    require("faster_coco_eval", "train", "--data (COCO evaluation)")
    from dfine_deploy.data.classmap import ClassMap
    from dfine_deploy.data.coco import load_coco
    from dfine_deploy.evaluation import CocoEvaluator

    ann_file, folder = find_annotations(data)
    # the training loader's validation and default policy: a truncated image, an unknown category or
    # a negative box stops here instead of silently changing the mAP; fixes and skips are reported
    annotations = load_coco(ann_file, folder)
    print(f"data: {annotations.report.summary_line()}", file=sys.stderr)
    gt = annotations.coco_dict()
    categories = annotations.categories
    num_classes = len(detector.class_names)
    remap = len(categories) == num_classes
    ids = [int(c["id"]) for c in categories]
    size = num_classes if remap else max(num_classes, max(ids, default=-1) + 1)
    try:
        class_map = ClassMap.from_categories(categories, remap=remap, num_classes=size)
    except DatasetError as exc:
        raise BenchError(f"--data {ann_file}: its categories do not fit this model ({exc})") from exc
    evaluator = CocoEvaluator(gt, class_map)
    images = gt.get("images", [])[:limit]
    if not images:
        raise BenchError(f"--data {ann_file}: no images listed")
    for start in range(0, len(images), detector.max_batch):
        chunk = images[start : start + detector.max_batch]
        frames = [read_image(folder / record["file_name"]) for record in chunk]  # as training reads them
        results = detector.predict(frames, color="RGB")
        evaluator.update(
            [int(r["id"]) for r in chunk],
            [{"boxes": d.boxes, "scores": d.scores, "labels": d.labels} for d in results],
        )
    return float(evaluator.summarize(per_class=False)["AP"])
