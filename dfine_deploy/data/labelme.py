"""LabelMe data (LabelMe 5, and X-AnyLabeling and AnyLabeling, which save the same json): one json
per image beside it, in the same form as COCO.

Each json holds `imagePath` (relative to the json), `imageWidth`, `imageHeight` and `shapes`, each a
`label`, its `points` ([[x, y], ...], pixels) and a `shape_type`:

- `rectangle`: two opposite corners, in either order: the box;
- `polygon`, `rotation` (X-AnyLabeling's rotated box, its four corners) and `circle` (its centre and
  a point on its edge): the upright box that holds it, counted as `shape_as_box`;
- `point`, `line`, `linestrip`, `mask` and any other: no box, left out and counted as `shape_not_box`.

No file lists the classes: they are the labels of every split's jsons, sorted, so that each split
numbers them alike (the caller passes them). The dict is then validated as a COCO json.
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from dfine_deploy.data.coco import AnnotationSet, annotation_record, labelme_shaped, read_json
from dfine_deploy.data.validation import ValidationPolicy, validate_coco_dict
from dfine_deploy.errors import DatasetError

SHAPES_AS_BOX = ("polygon", "rotation", "circle")


PEEK_BYTES = 65536  # a LabelMe json names "shapes" near its start (imageData, if any, comes last)


def _read_if_labelme(path: Path) -> dict[str, Any] | None:
    """The json of `path` where it is a LabelMe json of one image, else None; read in full only where
    its start opens an object and names "shapes" (a COCO json of any size is passed over unread)."""
    try:
        with path.open("rb") as stream:
            head = stream.read(PEEK_BYTES)
    except OSError:
        return None
    if not head.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"{") or b'"shapes"' not in head:
        return None
    try:
        data = read_json(path)
    except DatasetError:  # not JSON: no LabelMe file
        return None
    return data if labelme_shaped(data) else None


def is_labelme_json(path: Path) -> bool:
    return _read_if_labelme(path) is not None


def read_labelme(folder: Path, sampled: int | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """The LabelMe jsons in `folder` (not below it), sorted, each read once: (path, its json);
    `sampled`: look at that many json files only (enough to recognise a folder of them)."""
    paths = sorted(p for p in folder.glob("*.json") if p.is_file())[:sampled]
    return [(path, data) for path in paths if (data := _read_if_labelme(path)) is not None]


def labelme_labels(documents: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Every shape label of these jsons, sorted: the classes of the export."""
    return sorted({str(s.get("label", "")) for path, data in documents for s in _shapes(data, path)})


def _shapes(data: dict[str, Any], path: Path) -> list[dict[str, Any]]:
    shapes = data.get("shapes")
    if not isinstance(shapes, list) or not all(isinstance(s, dict) for s in shapes):
        raise DatasetError(f"{path}: 'shapes' is not a list of shapes; save the file again from the tool")
    return shapes


def _points(shape: dict[str, Any], where: str) -> list[tuple[float, float]]:
    points = shape.get("points")
    try:
        pairs = [(float(x), float(y)) for x, y in points]
    except (TypeError, ValueError):
        raise DatasetError(f"{where}: points {points!r}, expected [[x, y], ...] in pixels") from None
    if not pairs:
        raise DatasetError(f"{where}: no points")
    return pairs


def _box(shape_type: str, points: list[tuple[float, float]], where: str) -> list[float]:
    """xyxy of a rectangle, or of the upright box holding a polygon, rotated box or circle."""
    if shape_type == "circle":
        if len(points) != 2:
            raise DatasetError(
                f"{where}: a circle is its centre and a point on its edge, found {len(points)} points"
            )
        (cx, cy), (px, py) = points
        radius = math.hypot(px - cx, py - cy)
        return [cx - radius, cy - radius, cx + radius, cy + radius]
    if shape_type == "rectangle" and len(points) != 2:
        raise DatasetError(f"{where}: a rectangle is two corners, found {len(points)} points")
    xs, ys = [x for x, _ in points], [y for _, y in points]
    return [min(xs), min(ys), max(xs), max(ys)]


def labelme_to_coco(
    documents: list[tuple[Path, dict[str, Any]]], folder: Path, names: list[str]
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """The jsons of one folder as a COCO dict in pixels (file names relative to `folder`), and the
    shapes read as their box or left out, as (problem, where) for validation to count."""
    category_of = {name: i for i, name in enumerate(names)}
    images, annotations, found = [], [], []
    for path, data in documents:
        image_id = len(images) + 1
        image_path = (path.parent / str(data.get("imagePath") or "")).resolve()
        try:
            file_name = image_path.relative_to(folder.resolve()).as_posix()
        except ValueError:  # an image outside the folder: named as written, for validation to report
            file_name = str(data.get("imagePath"))
        size = {
            key: int(data[field]) if isinstance(data.get(field), (int, float)) else None
            for key, field in (("width", "imageWidth"), ("height", "imageHeight"))
        }
        images.append({"id": image_id, "file_name": file_name, **size})
        left_out: Counter[str] = Counter()
        for index, shape in enumerate(_shapes(data, path)):
            label, shape_type = str(shape.get("label", "")), str(shape.get("shape_type") or "polygon")
            if shape_type != "rectangle" and shape_type not in SHAPES_AS_BOX:
                left_out[shape_type] += 1
                continue
            where = f"{path}: shape {index} ({label!r}, {shape_type})"
            if label not in category_of:
                raise DatasetError(
                    f"{where}: label {label!r} is not one of the export's ({', '.join(names)})"
                )
            x1, y1, x2, y2 = _box(shape_type, _points(shape, where), where)
            if shape_type in SHAPES_AS_BOX:
                found.append(("shape_as_box", where))
            box = [x1, y1, x2 - x1, y2 - y1]
            annotations.append(annotation_record(len(annotations) + 1, image_id, category_of[label], box))
        for shape_type, count in sorted(left_out.items()):
            found.append(("shape_not_box", f"{path}: {count} {shape_type}"))
    categories = [{"id": i, "name": n} for i, n in enumerate(names)]
    return {"images": images, "annotations": annotations, "categories": categories}, found


def load_labelme(
    folder: Path,
    documents: list[tuple[Path, dict[str, Any]]],
    names: list[str],
    *,
    policy: ValidationPolicy | None = None,
) -> AnnotationSet:
    """Validated annotations of a folder's LabelMe jsons (`read_labelme`); `names`: the classes of
    the whole export."""
    coco, found = labelme_to_coco(documents, folder, names)
    records, categories, report = validate_coco_dict(
        coco, folder, source=str(folder), policy=policy, found=found
    )
    return AnnotationSet(records, categories, folder, str(folder), report)
