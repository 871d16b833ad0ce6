"""Exports that list every box of a split in one file beside its images, with no class list, in the
same form as COCO: Roboflow's "Tensorflow Object Detection CSV" (`_annotations.csv`) and "CreateML
JSON" (`_annotations.createml.json`, Apple's Create ML layout).

- CSV: a header `filename,width,height,class,xmin,ymin,xmax,ymax` and one row per box, corners in
  pixels (TensorFlow's object detection API reads them so), and its image's width and height (checked
  against the file); an image without boxes has no row: the folder's other images are read as
  images without boxes (validation counts them, `empty_image`).
- CreateML: a list of `{"image": NAME, "annotations": [{"label": ..., "coordinates": {"x", "y",
  "width", "height"}}]}`, `x y` the box's centre in pixels (Apple's "Object Detection" data format).

Neither lists its classes: they are the labels of every split of the export, sorted, so that each
split numbers them alike (the caller passes them). The dict is then validated as a COCO json.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, NamedTuple

from dfine_deploy.data.coco import AnnotationSet, annotation_record, read_json
from dfine_deploy.data.validation import ValidationPolicy, validate_coco_dict
from dfine_deploy.errors import DatasetError
from dfine_deploy.images import IMAGE_SUFFIXES
from dfine_deploy.text_files import read_text

CSV_NAME = "_annotations.csv"
CREATEML_NAME = "_annotations.createml.json"
CSV_COLUMNS = ("filename", "width", "height", "class", "xmin", "ymin", "xmax", "ymax")


class Box(NamedTuple):
    image: str  # its image's file name
    label: str
    xywh: list[float]  # pixels
    where: str  # the file and row it is written in


def _number(text: Any, where: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise DatasetError(f"{where}: {text!r} is not a number") from None
    return value if math.isfinite(value) else math.nan  # named by validation as an invalid box


def csv_boxes(path: Path) -> tuple[dict[str, Any], list[Box]]:
    """The images a CSV names (in order of first mention), with the width and height its first row
    of each says (validation compares them with the file), then the folder's other images, and the
    boxes."""
    text = read_text(path, "box list", DatasetError)
    rows = list(csv.reader(io.StringIO(text, newline="")))
    if not rows or [c.strip() for c in rows[0]] != list(CSV_COLUMNS):
        found = f"the header is {','.join(rows[0])!r}" if rows else "the file is empty"
        raise DatasetError(
            f"{path}: {found}; a Tensorflow Object Detection CSV starts with "
            f"{','.join(CSV_COLUMNS)} (export it again from Roboflow)"
        )
    images: dict[str, Any] = {}
    boxes: list[Box] = []
    for number, row in enumerate(rows[1:], start=2):
        if not any(cell.strip() for cell in row):
            continue
        where = f"{path}:{number}"
        if len(row) != len(CSV_COLUMNS):
            raise DatasetError(
                f"{where}: {len(row)} fields; each row has {len(CSV_COLUMNS)} ({','.join(CSV_COLUMNS)})"
            )
        name, width, height, label = (cell.strip() for cell in row[:4])
        x1, y1, x2, y2 = (
            _number(cell, f"{where} ({column})") for cell, column in zip(row[4:], CSV_COLUMNS[4:])
        )
        images.setdefault(name, {"width": width, "height": height})
        boxes.append(Box(name, label, [x1, y1, x2 - x1, y2 - y1], where))
    unnamed = sorted(p.name for p in path.parent.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    return {**images, **{name: {} for name in unnamed if name not in images}}, boxes


def createml_boxes(path: Path) -> tuple[dict[str, Any], list[Box]]:
    """The images a CreateML json lists (those without boxes too) and its boxes."""
    data = read_json(path)
    if not _createml_items(data):
        raise DatasetError(
            f'{path}: not a CreateML json (a list of {{"image": ..., "annotations": [...]}}); export it '
            "again from Roboflow"
        )
    images: dict[str, Any] = {}
    boxes: list[Box] = []
    for item in data:
        name = str(item["image"])
        images.setdefault(name, {})
        for number, box in enumerate(item.get("annotations") or []):
            where = f"{path}: image {name!r} annotation {number}"
            coordinates = box.get("coordinates") if isinstance(box, dict) else None
            if not isinstance(coordinates, dict) or "label" not in box:
                raise DatasetError(
                    f'{where}: expected {{"label": ..., "coordinates": {{x, y, width, height}}}}'
                )
            x, y, w, h = (
                _number(coordinates.get(k), f"{where} ({k})") for k in ("x", "y", "width", "height")
            )
            boxes.append(Box(name, str(box["label"]), [x - w / 2, y - h / 2, w, h], where))
    return images, boxes


def box_list_kind(path: Path) -> str | None:
    """The form of a box list, "csv" or "createml", under any name (Roboflow's, or a file a user
    named: a CSV that starts with the header, a json list of {"image", "annotations"} items); None for
    any other file. Reads a json only where it starts with '[' (a COCO json is an object)."""
    if path.name == CSV_NAME or path.name == CREATEML_NAME:
        return "csv" if path.name == CSV_NAME else "createml"
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".json") or not path.is_file():
        return None
    try:
        with path.open("rb") as stream:
            head = stream.read(4096).decode("utf-8-sig", errors="replace")
    except OSError:
        return None
    if suffix == ".csv":
        first = head.splitlines()[0] if head else ""
        return "csv" if [c.strip() for c in first.split(",")] == list(CSV_COLUMNS) else None
    if not head.lstrip().startswith("["):
        return None
    try:
        data = read_json(path)
    except DatasetError:
        return None
    return "createml" if _createml_items(data) else None


def _createml_items(data: Any) -> bool:
    """Every item an {"image", "annotations": [...]} object (Label Studio's JSON-MIN list has "image"
    too, without "annotations")."""
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(i, dict) and "image" in i and isinstance(i.get("annotations"), list) for i in data)
    )


READERS = {"csv": csv_boxes, "createml": createml_boxes}


def read_box_list(path: Path) -> tuple[dict[str, Any], list[Box]]:
    """The images of a box list by file name (with the sizes it declares, if any) and its boxes."""
    kind = box_list_kind(path)
    if kind is None:
        raise DatasetError(f"{path}: not a Tensorflow CSV or CreateML json")
    return READERS[kind](path)


def labels_of(paths: list[Path]) -> list[str]:
    """Every label of these files, sorted: the export's classes."""
    return sorted({box.label for path in paths for box in read_box_list(path)[1]})


def load_box_list(path: Path, names: list[str], *, policy: ValidationPolicy | None = None) -> AnnotationSet:
    """Validated annotations of one split's box list; `names`: the classes of the whole export."""
    declared, boxes = read_box_list(path)
    image_id = {name: i for i, name in enumerate(declared, start=1)}
    category_of = {name: i for i, name in enumerate(names)}
    annotations = []
    for box in boxes:
        if box.label not in category_of:
            raise DatasetError(
                f"{box.where}: class {box.label!r} is not one of the export's ({', '.join(names)})"
            )
        record = annotation_record(
            len(annotations) + 1, image_id[box.image], category_of[box.label], box.xywh
        )
        annotations.append(record)
    coco = {
        "images": [{"id": i, "file_name": name, **declared[name]} for name, i in image_id.items()],
        "annotations": annotations,
        "categories": [{"id": i, "name": n} for i, n in enumerate(names)],
    }
    records, categories, report = validate_coco_dict(coco, path.parent, source=str(path), policy=policy)
    return AnnotationSet(records, categories, path.parent, str(path), report)
