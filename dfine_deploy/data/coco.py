"""COCO-format detection data: a json of images, annotations and categories beside an image folder.

`load_coco` reads and validates the json (see validation.py); `DetectionDataset` turns the
validated records into training items. YOLO and synthetic data arrive in the same form, so this
dataset serves all three.

Official semantics kept: crowd annotations are ignored for training (and kept for evaluation),
boxes are xyxy clamped to the image, labels follow the `ClassMap` (remap or raw category id).

torch is imported only when a `DetectionDataset` is made, so `dfine-data validate` and the
annotation readers start fast and run without it.
"""

from __future__ import annotations

import functools
import json
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy.data.cache import NoCache
from dfine_deploy.data.classmap import ClassMap
from dfine_deploy.data.image_checks import folder_of_names
from dfine_deploy.data.validation import (
    ImageRecord,
    ValidationPolicy,
    ValidationReport,
    records_to_coco_dict,
    validate_coco_dict,
)
from dfine_deploy.errors import DatasetError
from dfine_deploy.images import read_image
from dfine_deploy.ownership import Claim
from dfine_deploy.text_files import load_json

ANNOTATIONS_NAME = "annotations.json"  # what dfine-data writes in each OUT/<split> folder


def annotation_record(
    annotation_id: int, image_id: int, category_id: int, box: list[float], *, crowd: bool = False
) -> dict[str, Any]:
    """One COCO annotation as every format's reader writes it: `box` is [x, y, w, h] in pixels; the
    area is 0 when a coordinate is not finite (the validator then names the box)."""
    return {
        "id": annotation_id,
        "image_id": image_id,
        "category_id": category_id,
        "bbox": box,
        "area": box[2] * box[3] if all(map(math.isfinite, box)) else 0.0,
        "iscrowd": int(crowd),
    }


@dataclass
class AnnotationSet:
    """Validated annotations of one split: records, categories, where the images are, the report."""

    records: list[ImageRecord]
    categories: list[dict[str, Any]]
    img_folder: Path
    source: str
    report: ValidationReport
    layout: str = ""  # the one line saying which dataset layout was read, and from where (formats.py)
    notes: list[str] = field(default_factory=list)  # what reading left out or found, one line each

    def lines(self) -> list[str]:
        """What every entry point prints when it loads the set: the layout read, then the notes."""
        return [line for line in (self.layout, *self.notes) if line]

    def coco_dict(self) -> dict[str, Any]:
        """COCO instances dict of the validated data (crowd included): evaluation ground truth."""
        return records_to_coco_dict(self.records, self.categories)

    def class_map(self, *, remap: bool, num_classes: int | None = None) -> ClassMap:
        return ClassMap.from_categories(self.categories, remap=remap, num_classes=num_classes)


def split_claim(command: str, kind: str, description: str, patterns: tuple[str, ...] = ()) -> Claim:
    """What a dfine-data command that writes OUT/<split> whole owns there: an annotations.json whose
    info.description starts with `description` (the marker), and the images it lists."""

    def annotations(path: Path) -> dict[str, Any]:
        data = json.loads(path.read_text(encoding="utf-8"))
        return data if isinstance(data, dict) else {}

    def recognise(path: Path) -> bool:
        info = annotations(path).get("info")
        return isinstance(info, dict) and str(info.get("description", "")).startswith(description)

    def listed(path: Path) -> list[str]:
        images = annotations(path).get("images") or []
        return [i["file_name"] for i in images if isinstance(i, dict) and isinstance(i.get("file_name"), str)]

    return Claim(command, kind, (ANNOTATIONS_NAME,), patterns, recognise, listed)


def read_json(path: str | os.PathLike) -> Any:
    return load_json(path, "annotation file", DatasetError, "check ann_file in the dataset config")


def _tasks(data: Any) -> list[dict[str, Any]]:
    """The entries of a json list when every one is an object (a labelling tool's task list)."""
    ok = isinstance(data, list) and data and all(isinstance(t, dict) for t in data)
    return data if ok else []


def _datumaro(data: Any) -> bool:
    items, categories = (data.get(k) if isinstance(data, dict) else None for k in ("items", "categories"))
    return isinstance(items, list) and isinstance(categories, dict)


def labelme_shaped(data: Any) -> bool:
    """A LabelMe json of one image (data/labelme.py reads a folder of them)."""
    return isinstance(data, dict) and isinstance(data.get("shapes"), list) and "imagePath" in data


def _label_studio_json(data: Any) -> bool:
    return any("annotations" in t and "data" in t for t in _tasks(data))


def _label_studio_json_min(data: Any) -> bool:
    return any("annotation_id" in t or "annotator" in t for t in _tasks(data))


_LABEL_STUDIO_INSTEAD = "export 'COCO' or 'YOLO' from Label Studio instead (its Export dialog)"

# Other tools' jsons of boxes, by their shape: (what it is, does this json look so, the export to
# choose instead). Read as COCO they were "found NoneType" or "a list".
FOREIGN_JSONS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    (
        "a Datumaro json (items, categories)",
        _datumaro,
        "export the dataset as COCO (CVAT: 'COCO 1.0'; Datumaro: datum convert -if datumaro -f coco)",
    ),
    ("a Label Studio JSON export (tasks with their annotations)", _label_studio_json, _LABEL_STUDIO_INSTEAD),
    ("a Label Studio JSON-MIN export (one object per task)", _label_studio_json_min, _LABEL_STUDIO_INSTEAD),
)


def refuse_foreign_json(data: Any, source: str) -> None:
    """One line naming another tool's json read as COCO, and the export to choose instead."""
    for what, looks_so, fix in FOREIGN_JSONS:
        if looks_so(data):
            raise DatasetError(f"{source}: {what}, not a COCO json; {fix}")


def without_placeholder(data: dict[str, Any], source: str) -> tuple[dict[str, Any], list[str]]:
    """The COCO dict without Roboflow's project placeholder, and a line saying so.

    Roboflow's COCO export lists its project name as category 0, the supercategory of every real
    class, with no box (a 4-class project has 5 categories): kept, it would become a class that no
    box teaches. Only a category that is all of that is left out; nothing else is."""
    categories = data.get("categories")
    annotations = data.get("annotations")
    if not isinstance(categories, list) or not isinstance(annotations, list) or len(categories) < 2:
        return data, []
    first = next((c for c in categories if isinstance(c, dict) and c.get("id") == 0), None)
    others = [c for c in categories if isinstance(c, dict) and c is not first]
    if (
        first is None
        or any(isinstance(a, dict) and a.get("category_id") == 0 for a in annotations)
        or not all(c.get("supercategory") == first.get("name") for c in others)
    ):
        return data, []
    line = (
        f"{source}: category 0 {first.get('name')!r} is the Roboflow project placeholder (no boxes, the "
        f"supercategory of the other {len(others)}): left out of the class map"
    )
    return dict(data, categories=others), [line]


def load_coco(
    ann_file: str | os.PathLike,
    img_folder: str | os.PathLike,
    *,
    policy: ValidationPolicy | None = None,
    or_folders: tuple[Path, ...] = (),
) -> AnnotationSet:
    """Read and validate a COCO instances json (Roboflow's placeholder category left out); raises
    DatasetError with the report on errors. `or_folders`: other folders its file names may be
    relative to; the one that holds most of them is read (`img_folder` on a tie)."""
    folder = Path(img_folder)
    if not folder.is_dir():
        raise DatasetError(f"image folder {folder} does not exist; check img_folder in the dataset config")
    data = read_json(ann_file)
    refuse_foreign_json(data, str(ann_file))
    if not isinstance(data, dict):
        raise DatasetError(f"{ann_file}: expected a COCO json object, found a {type(data).__name__}")
    if or_folders:
        folder = folder_of_names(data.get("images"), (folder, *or_folders))
    data, notes = without_placeholder(data, str(ann_file))
    records, categories, report = validate_coco_dict(data, folder, source=str(ann_file), policy=policy)
    return AnnotationSet(records, categories, folder, str(ann_file), report, notes=notes)


def read_record_image(path: Path, size: tuple[int, int]) -> np.ndarray:
    """[H, W, 3] uint8 RGB from the one reader (dfine_deploy.images: EXIF orientation applied),
    checked against the annotations' (w, h), since the boxes are in those pixels."""
    pixels = read_image(path)
    height, width = pixels.shape[:2]
    if (width, height) != size:
        raise DatasetError(
            f"{path}: the image as shown (EXIF orientation applied) is {width}x{height}, the annotations "
            f"say {size[0]}x{size[1]}; check the dataset with dfine-data validate (check_images: header)"
        )
    return pixels


Transform = Callable[[Any, dict[str, Any], int], tuple[Any, dict[str, Any]]]


class DetectionDataset:
    """Training/eval items from validated records.

    Item: ``(image, target)``. Without transforms the image is a uint8 ``tv_tensors.Image``
    [3, H, W] and boxes are xyxy pixels; the official pipeline turns them into float [0, 1] and
    normalised cxcywh. Target keys: boxes, labels (contiguous), image_id, orig_size [w, h], idx.

    The epoch lives in a shared-memory tensor so that persistent loader workers see `set_epoch`
    (the official loader copies it into workers only when they are re-created). A map-style
    dataset for torch's DataLoader (``__len__`` + ``__getitem__``).
    """

    def __init__(
        self,
        annotations: AnnotationSet,
        class_map: ClassMap,
        transforms: Transform | None = None,
        cache: Any = None,
    ):
        self.annotations = annotations
        self.records = annotations.records
        self.img_folder = annotations.img_folder
        self.class_map = class_map
        self.transforms = transforms
        self.cache = cache if cache is not None else NoCache()
        import torch

        self._labels = [class_map.labels_of(r.category_ids[~r.iscrowd]) for r in self.records]
        self._epoch = torch.zeros(1, dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch[0])

    def set_epoch(self, epoch: int) -> None:
        self._epoch[0] = int(epoch)

    def __len__(self) -> int:
        return len(self.records)

    def load_item(self, idx: int):
        """Decoded image and raw target (xyxy px boxes as tv_tensors.BoundingBoxes, crowd removed)."""
        import torch
        from torchvision import tv_tensors

        rec = self.records[idx]
        decode = functools.partial(read_record_image, size=(rec.width, rec.height))
        pixels = self.cache.load(idx, self.img_folder / rec.file_name, decode)  # [H, W, 3]
        height, width = pixels.shape[:2]
        image = tv_tensors.Image(torch.from_numpy(pixels).permute(2, 0, 1))  # [3, H, W]
        boxes = torch.from_numpy(rec.boxes[~rec.iscrowd])  # [n, 4] xyxy px
        target = {
            "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(height, width)),
            "labels": torch.from_numpy(self._labels[idx]),
            "image_id": torch.tensor(rec.image_id, dtype=torch.int64),
            "orig_size": torch.tensor([width, height], dtype=torch.int64),
            "idx": torch.tensor(idx, dtype=torch.int64),
        }
        return image, target

    def __getitem__(self, idx: int):
        image, target = self.load_item(idx)
        if self.transforms is not None:
            image, target = self.transforms(image, target, self.epoch)
        return image, target

    def coco_gt(self) -> dict[str, Any]:
        return self.annotations.coco_dict()
