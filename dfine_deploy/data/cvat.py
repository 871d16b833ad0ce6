"""CVAT's own XML export, "CVAT for images 1.1" (``annotations.xml`` + ``images/``), in the same form
as COCO.

The layout (CVAT's documentation, "XML annotation format", version 1.1)::

    annotations.xml   <annotations><version>1.1</version><meta>(task|project|job)<labels>...</meta>
                      <image id name width height [subset task_id]>   (subset: a project export)
                        <box label xtl ytl xbr ybr [rotation] occluded z_order .../>
                        <polygon label points="x,y;x,y;..."/> <polyline/> <points/> <ellipse/> ...
    images/<name>     a task's images; a project's under images/<subset>/ where that folder exists

Corners are pixels as COCO's (no 1-based shift). Class names are the meta's labels in their order,
else every label the shapes name, sorted. A rotated box and a polygon are read as the upright box
that holds them (`shape_as_box`); shapes that are no area of an object (polylines, points, cuboids,
skeletons, tags, ellipses, masks) are left out (`shape_not_box`), both counted by validation. The
"CVAT for video 1.1" export (tracks, no images) is refused with the export to choose instead.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ElementTree
from collections import Counter
from pathlib import Path
from typing import Any

from dfine_deploy.data.coco import AnnotationSet, annotation_record
from dfine_deploy.data.validation import ValidationPolicy, validate_coco_dict
from dfine_deploy.errors import DatasetError

XML_NAME, IMAGES = "annotations.xml", "images"
EXPORT_TO_CHOOSE = "export 'CVAT for images 1.1' (or 'COCO 1.0') with images from CVAT instead"
NOT_BOXES = ("polyline", "points", "cuboid", "skeleton", "tag", "ellipse", "mask")


def parse(path: Path) -> ElementTree.Element:
    """The root of a CVAT XML file; one line where it is no readable XML."""
    try:
        return ElementTree.parse(path).getroot()
    except ElementTree.ParseError as exc:
        raise DatasetError(f"{path}: not a readable CVAT XML file ({exc}); export it again") from None
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read ({exc.strerror or exc})") from None


def is_cvat_xml(path: Path) -> bool:
    """An XML file whose first element is CVAT's <annotations> (read without parsing it whole)."""
    try:
        for _, element in ElementTree.iterparse(path, events=("start",)):
            return element.tag == "annotations"
    except (ElementTree.ParseError, OSError):
        return False
    return False


def subsets(root: ElementTree.Element, path: Path) -> list[str]:
    """The subsets the images name, in first-seen order ([''] for a task export, which names none);
    a "CVAT for video" export is refused."""
    if root.find("image") is None and root.find("track") is not None:
        raise DatasetError(
            f"{path}: a CVAT for video 1.1 export (tracks of frames, no images); {EXPORT_TO_CHOOSE}"
        )
    names = list(dict.fromkeys(image.get("subset") or "" for image in root.iter("image")))
    return names or [""]


def images_folder(root: Path, subset: str) -> Path:
    """images/<subset>/ where a project export has it, else images/."""
    per_subset = root / IMAGES / subset
    return per_subset if subset and per_subset.is_dir() else root / IMAGES


def class_names(root: ElementTree.Element) -> list[str]:
    """The meta's labels in their order (a task's, a project's or a job's), else those the shapes
    name, sorted."""
    meta = root.find("meta")
    labels = meta.find("*/labels") if meta is not None else None
    if labels is not None:
        names = [label.findtext("name", "").strip() for label in labels.findall("label")]
        if any(names):
            return [n for n in names if n]
    return sorted({shape.get("label", "") for image in root.iter("image") for shape in image} - {""})


def _number(shape: ElementTree.Element, key: str, where: str) -> float:
    text = shape.get(key)
    try:
        return float(text) if text is not None else math.nan
    except ValueError:
        raise DatasetError(f"{where}: {key}={text!r}, expected a number; export the task again") from None


def _rotated_envelope(x1: float, y1: float, x2: float, y2: float, degrees: float) -> list[float]:
    """The upright box holding a box turned by `degrees` about its centre (CVAT's rotation)."""
    cx, cy, half_w, half_h = (x1 + x2) / 2, (y1 + y2) / 2, (x2 - x1) / 2, (y2 - y1) / 2
    cos, sin = abs(math.cos(math.radians(degrees))), abs(math.sin(math.radians(degrees)))
    reach_x, reach_y = half_w * cos + half_h * sin, half_w * sin + half_h * cos
    return [cx - reach_x, cy - reach_y, cx + reach_x, cy + reach_y]


def _polygon_envelope(points: str, where: str) -> list[float]:
    try:
        pairs = [tuple(float(v) for v in pair.split(",")) for pair in points.split(";") if pair.strip()]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 for p in pairs):
        raise DatasetError(f"{where}: points={points!r}, expected 'x,y;x,y;...'; export the task again")
    xs, ys = [p[0] for p in pairs], [p[1] for p in pairs]
    return [min(xs), min(ys), max(xs), max(ys)]


def _box_of(shape: ElementTree.Element, where: str) -> tuple[list[float], str | None]:
    """(xyxy, the problem reading it so is) of a box or polygon."""
    if shape.tag == "polygon":
        return _polygon_envelope(shape.get("points", ""), where), "shape_as_box"
    x1, y1, x2, y2 = (_number(shape, key, where) for key in ("xtl", "ytl", "xbr", "ybr"))
    rotation = _number(shape, "rotation", where) if shape.get("rotation") is not None else 0.0
    if rotation % 360 == 0:
        return [x1, y1, x2, y2], None
    return _rotated_envelope(x1, y1, x2, y2, rotation), "shape_as_box"


def cvat_xml_to_coco(
    root: ElementTree.Element, path: Path, subset: str
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """One subset of a CVAT for images XML (`root`, read from `path`) as a COCO dict in pixels (not
    yet validated), and the shapes read as their box or left out, as (problem, where) for validation
    to count."""
    names = class_names(root)
    category_of = {name: i for i, name in enumerate(names)}
    images, annotations, found = [], [], []
    for image in root.iter("image"):
        if (image.get("subset") or "") != subset:
            continue
        image_id = len(images) + 1
        name = image.get("name", "")
        width, height = (_number(image, key, f"{path}: image {name!r}") for key in ("width", "height"))
        images.append(
            {
                "id": image_id,
                "file_name": name,
                "width": int(width) if math.isfinite(width) else None,
                "height": int(height) if math.isfinite(height) else None,
            }
        )
        left_out: Counter[str] = Counter()
        for shape in image:
            if shape.tag in NOT_BOXES:
                left_out[shape.tag] += 1
                continue
            if shape.tag not in ("box", "polygon"):
                continue
            label = shape.get("label", "")
            where = f"{path}: image {name!r} <{shape.tag} label={label!r}>"
            if label not in category_of:
                raise DatasetError(
                    f"{where}: label {label!r} is not among the task's labels ({', '.join(names)})"
                )
            (x1, y1, x2, y2), problem = _box_of(shape, where)
            if problem:
                found.append((problem, where))
            box = [x1, y1, x2 - x1, y2 - y1]
            annotations.append(annotation_record(len(annotations) + 1, image_id, category_of[label], box))
        for tag, count in sorted(left_out.items()):
            found.append(("shape_not_box", f"{path}: image {name!r}: {count} {tag}"))
    categories = [{"id": i, "name": n} for i, n in enumerate(names)]
    return {"images": images, "annotations": annotations, "categories": categories}, found


def load_cvat_xml(
    path: Path, subset: str, images: Path, *, policy: ValidationPolicy | None = None
) -> AnnotationSet:
    """Validated annotations of one subset ('' for a task export) of a CVAT for images XML."""
    coco, found = cvat_xml_to_coco(parse(path), path, subset)
    source = f"{path} [{subset}]" if subset else str(path)
    records, categories, report = validate_coco_dict(coco, images, source=source, policy=policy, found=found)
    return AnnotationSet(records, categories, images, source, report)
