"""Load-time checks of a detection dataset, with a policy per problem and a report.

Every annotation problem found in the official repository's custom-data issues has a name here.
Each has a policy: ``error`` (stop with the report), ``fix`` (repair and count), ``skip`` (drop the
annotation or image and count) or ``keep`` (use as is and count). Defaults stop on anything that
would otherwise lose data silently; the few that only repeat what the official loader does quietly
(clamping boxes, dropping zero-area boxes) are fixed or skipped, and always counted.

The input is a COCO-style dict (YOLO data is converted to one first), the output a list of
`ImageRecord` plus a `ValidationReport` that names files and counts.
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy.data.image_checks import inspect_all, located_name, match_size, note_conversions
from dfine_deploy.errors import DatasetError
from dfine_deploy.images import orient_boxes

# problem -> (allowed policies, what it means); the defaults are ValidationPolicy's fields
PROBLEMS: dict[str, tuple[tuple[str, ...], str]] = {
    "missing_image": (("error", "skip"), "image file does not exist"),
    "unreadable_image": (("error", "skip"), "file is not a readable image"),
    "corrupt_image": (("error", "skip"), "image data is truncated or corrupt"),
    "size_mismatch": (("error", "fix"), "width/height in the annotations differ from the file"),
    "size_as_stored": (
        ("error", "fix", "skip"),
        "width/height in the annotations fit the stored pixels, not the image as shown after its EXIF "
        "orientation: labelled where the orientation was ignored (fix = turn the boxes with the image)",
    ),
    "size_as_shown": (
        ("keep", "error"),
        "width/height in the annotations fit the image only as shown, after its EXIF orientation (used so)",
    ),
    "exif_orientation": (("keep", "error"), "EXIF orientation: read turned or mirrored, as viewers show it"),
    "high_bit_depth": (("keep", "error"), "16-bit samples, read as 8-bit (the high byte of each)"),
    "alpha_channel": (("keep", "error"), "transparency, dropped: the colour stored under it is read"),
    "converted_mode": (("keep", "error"), "grayscale, palette, CMYK or other non-RGB colours, read as RGB"),
    "multi_frame": (
        ("keep", "error"),
        "several frames or pages (animated, multi-page TIFF, MPO): the first is read",
    ),
    "url_encoded_name": (
        ("fix", "error"),
        "file_name is URL-encoded (%20 for a space) and only its decoded name is a file (fix = read that)",
    ),
    "server_path": (
        ("fix", "error"),
        "file_name is a Label Studio server path (/data/upload/<project>/<name>, /data/local-files/?d=...) "
        "(fix = the file of that name in the image folder)",
    ),
    "duplicate_image_id": (("error", "skip"), "two images share an id (later ones skipped)"),
    "duplicate_file_name": (
        ("error", "skip", "keep"),
        "two images name one file (two exports put together, a split list naming it twice): it would "
        "be trained on and scored as two images (skip = the later ones and their annotations)",
    ),
    "unknown_image_id": (("error", "skip"), "annotation refers to an image id not in images"),
    "unknown_category": (("error", "skip"), "annotation category_id not in categories"),
    "invalid_box": (("error", "skip"), "bbox is not 4 finite numbers"),
    "negative_box": (("error", "skip"), "bbox width or height is negative"),
    "zero_area_box": (("error", "skip"), "bbox width or height is zero (official drops these)"),
    "box_outside_image": (("error", "fix", "skip"), "bbox extends past the image (fix = clamp)"),
    "box_entirely_outside": (("error", "skip"), "bbox lies wholly outside the image"),
    "invalid_area": (
        ("fix", "error"),
        "area is not a finite number >= 0 (fix = the box's area, which COCO's area ranges then use)",
    ),
    "duplicate_box": (
        ("skip", "keep", "error"),
        "an annotation repeats another of its image exactly (class and box): a label written twice, "
        "which would count as a second object to find",
    ),
    "empty_image": (("keep", "skip", "error"), "image has no (non-crowd) annotations"),
    "shape_as_box": (
        ("fix", "error"),
        "a polygon (a YOLO segmentation line, a CVAT or LabelMe polygon, a COCO segmentation with no bbox: "
        "polygon or run-length mask), a rotated box (CVAT, X-AnyLabeling) or a LabelMe circle: read as the "
        "upright box that holds it (fix)",
    ),
    "shape_not_box": (
        ("skip", "error"),
        "a shape that outlines no box (CVAT's polyline, points, cuboid, skeleton, tag, ellipse, mask; "
        "LabelMe's point, line, linestrip, mask): left out",
    ),
    "label_shared": (("keep", "error"), "one YOLO label file serves two images of one name (a.jpg, a.png)"),
    "label_without_image": (
        ("skip", "error"),
        "YOLO label file with no image of a read format: its boxes are unused",
    ),
}

CHECK_LEVELS = ("none", "header", "decode")
_ACTION_WORDS = {"error": "errors", "fix": "fixed", "skip": "skipped", "keep": "kept"}


@dataclass(frozen=True)
class ValidationPolicy:
    """What to do about each problem (the defaults); `PROBLEMS` lists the allowed values."""

    missing_image: str = "error"
    unreadable_image: str = "error"
    corrupt_image: str = "error"
    size_mismatch: str = "error"
    size_as_stored: str = "error"
    size_as_shown: str = "keep"
    exif_orientation: str = "keep"
    high_bit_depth: str = "keep"
    alpha_channel: str = "keep"
    converted_mode: str = "keep"
    multi_frame: str = "keep"
    url_encoded_name: str = "fix"
    server_path: str = "fix"
    duplicate_image_id: str = "error"
    duplicate_file_name: str = "error"
    unknown_image_id: str = "error"
    unknown_category: str = "error"
    invalid_box: str = "error"
    negative_box: str = "error"
    zero_area_box: str = "skip"
    box_outside_image: str = "fix"
    box_entirely_outside: str = "error"
    invalid_area: str = "fix"
    duplicate_box: str = "skip"
    empty_image: str = "keep"
    label_without_image: str = "skip"
    label_shared: str = "keep"
    shape_as_box: str = "fix"
    shape_not_box: str = "skip"
    check_images: str = "header"  # none | header (size + end marker) | decode (full decode)

    def __post_init__(self) -> None:
        for name, (allowed, meaning) in PROBLEMS.items():
            value = getattr(self, name)
            if value not in allowed:
                raise DatasetError(
                    f"validation policy {name}={value!r} is not allowed; {name} ({meaning}) "
                    f"accepts {', '.join(allowed)}"
                )
        if self.check_images not in CHECK_LEVELS:
            raise DatasetError(
                f"validation policy check_images={self.check_images!r}; "
                f"expected one of {', '.join(CHECK_LEVELS)}"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, str] | None) -> ValidationPolicy:
        """Build from a config mapping; unknown keys are an error naming the valid ones."""
        values = dict(values or {})
        valid = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - valid)
        if unknown:
            raise DatasetError(
                f"unknown validation policy key(s) {unknown}; valid keys: {', '.join(sorted(valid))}"
            )
        return cls(**{k: str(v) for k, v in values.items()})


@dataclass
class ImageRecord:
    """One image and its annotations, validated. Boxes are xyxy pixels clamped to the image."""

    image_id: int
    file_name: str  # relative to the image folder
    width: int
    height: int
    boxes: np.ndarray  # [n, 4] float32 xyxy px
    category_ids: np.ndarray  # [n] int64
    iscrowd: np.ndarray  # [n] bool; crowd boxes are kept for evaluation, dropped for training
    areas: np.ndarray  # [n] float32, the annotation's `area` (segment area for COCO) or box area


@dataclass
class ValidationReport:
    """Counts and example file names per problem, plus totals; printable and JSON-able."""

    source: str
    images_in: int = 0
    annotations_in: int = 0
    images_kept: int = 0
    annotations_kept: int = 0
    crowd_annotations: int = 0
    annotations_of_dropped_images: int = 0  # went with an image that was skipped
    # of the boxes with a positive width and height (`sized_boxes`), those whose w and h exceed their x
    # and y, as x1 y1 x2 y2 corners read as x y w h always do: with many boxes past the image's edge,
    # the sign of a json written in xyxy (training/diagnosis.py)
    sized_boxes: int = 0
    corner_like_boxes: int = 0
    counts: Counter = field(default_factory=Counter)
    actions: dict[str, str] = field(default_factory=dict)
    examples: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    max_examples: int = 5

    def add(self, problem: str, action: str, where: str) -> None:
        self.counts[problem] += 1
        self.actions[problem] = action
        if action == "error" or len(self.examples[problem]) < self.max_examples:  # every error is named
            self.examples[problem].append(where.replace("\n", "\\n"))  # a file name's newline: one line

    @property
    def errors(self) -> dict[str, int]:
        return {p: n for p, n in self.counts.items() if self.actions.get(p) == "error"}

    def format(self) -> str:
        lines = [
            f"dataset {self.source}",
            f"  images: {self.images_in} read, {self.images_kept} kept",
            (
                f"  annotations: {self.annotations_in} read, {self.annotations_kept} kept "
                f"({self.crowd_annotations} crowd, kept for evaluation and ignored in training as official)"
            ),
        ]
        if self.annotations_of_dropped_images:
            lines.append(f"  annotations dropped with skipped images: {self.annotations_of_dropped_images}")
        if not self.counts:
            lines.append("  no problems found")
        for problem in PROBLEMS:
            if problem not in self.counts:
                continue
            action = "ERROR" if self.actions[problem] == "error" else _ACTION_WORDS[self.actions[problem]]
            lines.append(f"  {problem}: {self.counts[problem]} {action} ({PROBLEMS[problem][1]})")
            more = self.counts[problem] - len(self.examples[problem])
            for where in self.examples[problem]:
                lines.append(f"      {where}")
            if more > 0:
                lines.append(f"      ... and {more} more")
        return "\n".join(lines)

    def tally(self) -> dict[str, Any]:
        """What loading changed, without examples: for log.jsonl, eval.json and checkpoint meta."""
        changed: dict[str, dict[str, int]] = {}
        for problem, count in self.counts_by_problem():
            changed.setdefault(_ACTION_WORDS[self.actions[problem]], {})[problem] = count
        return {**self._kept(), **changed}

    def _kept(self) -> dict[str, Any]:
        """The source and what went in and was kept: the head of `tally` and `to_dict`."""
        return {
            "source": self.source,
            "images_in": self.images_in,
            "images_kept": self.images_kept,
            "annotations_in": self.annotations_in,
            "annotations_kept": self.annotations_kept,
        }

    def counts_by_problem(self) -> list[tuple[str, int]]:
        return [(p, self.counts[p]) for p in PROBLEMS if self.counts.get(p)]

    def summary_line(self) -> str:
        """One line for the start of every run that loads data: kept counts and every fix or skip."""
        changes = ", ".join(f"{n} {p} {_ACTION_WORDS[self.actions[p]]}" for p, n in self.counts_by_problem())
        return (
            f"{self.source}: {self.images_kept}/{self.images_in} images, {self.annotations_kept}/"
            f"{self.annotations_in} annotations kept; " + (changes or "nothing fixed or skipped")
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **self._kept(),
            "crowd_annotations": self.crowd_annotations,
            "annotations_of_dropped_images": self.annotations_of_dropped_images,
            "problems": {
                p: {"count": n, "action": self.actions[p], "examples": list(self.examples[p])}
                for p, n in self.counts.items()
            },
        }


# ------------------------------------------------------------------------------ the checks


def _coerce_int(value: Any, what: str, source: str) -> int:
    try:
        out = int(value)
    except (TypeError, ValueError):
        raise DatasetError(f"{source}: {what} must be an integer, got {value!r}") from None
    if out != value and not isinstance(value, str):
        raise DatasetError(f"{source}: {what} must be an integer, got {value!r}")
    return out


def _size_value(value: Any) -> Any:
    """A json width/height as an int where it is a whole number ("640" and 640.0 too); else as written,
    for the mismatch to name it."""
    if isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    return value


def _crowd(value: Any, where: str, source: str) -> bool:
    """COCO's iscrowd, 0 or 1 (a "0" string too): bool("0") would make a box a crowd region unsaid."""
    if value in (0, 1) or value in ("0", "1"):
        return bool(int(value))
    raise DatasetError(
        f"{source}: {where}: iscrowd {value!r}; COCO's iscrowd is 0 (an object) or 1 (a crowd)"
    )


def _entries(data: Mapping[str, Any], key: str, source: str) -> list[Mapping[str, Any]]:
    """The json objects under `key`, or one line naming the first entry that is not one."""
    for index, entry in enumerate(data[key]):
        if not isinstance(entry, Mapping):
            raise DatasetError(
                f"{source}: {key}[{index}] is {entry!r:.60}; each entry of '{key}' is a json object"
            )
    return data[key]


def _segmentation_box(segmentation: Any, image_size: tuple[int, int]) -> tuple[list[float], str] | None:
    """The xywh box holding a COCO segmentation, and its kind: a polygon list ([[x1, y1, x2, y2, ...],
    ...]) or a run-length mask ({"size": [h, w], "counts": ...}) of this image's (height, width);
    None for anything else (no segmentation, numbers that are not points, a mask of another size)."""
    if isinstance(segmentation, dict):
        box = _mask_box(segmentation, image_size)
        return None if box is None else (box, "run-length mask")
    if not isinstance(segmentation, list) or not segmentation:
        return None
    points = [v for polygon in segmentation if isinstance(polygon, list) for v in polygon]
    if (
        len(points) < 6
        or len(points) % 2
        or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in points
        )
    ):
        return None
    xs, ys = points[0::2], points[1::2]
    return [min(xs), min(ys), max(xs) - min(xs), max(ys) - min(ys)], "polygon"


def _mask_box(mask: Mapping[str, Any], image_size: tuple[int, int]) -> list[float] | None:
    """The box of a COCO run-length mask, read from its runs (no pixel array): the runs alternate
    background and object, column by column (column-major), starting with background; `counts` is a
    list of run lengths, or COCO's compressed string of them (_rle_counts)."""
    counts = mask.get("counts")
    if list(mask.get("size") or ()) != list(image_size):
        return None
    if isinstance(counts, str):
        counts = _rle_counts(counts)
    if not isinstance(counts, list) or not all(isinstance(n, int) and n >= 0 for n in counts):
        return None
    height, width = image_size
    if sum(counts) != height * width:
        return None
    x1 = y1 = math.inf
    x2 = y2 = -math.inf
    start = 0
    for index, run in enumerate(counts):
        if index % 2 and run:  # an object run: from pixel `start` to `start + run - 1`
            first_x, first_y = divmod(start, height)
            last_x, last_y = divmod(start + run - 1, height)
            x1, x2 = min(x1, first_x), max(x2, last_x)
            # a run that crosses into the next column covers the rows in between: the full height
            y1, y2 = (0, height - 1) if last_x > first_x else (min(y1, first_y), max(y2, last_y))
        start += run
    if x1 is math.inf:
        return None  # an empty mask: no object
    return [float(x1), float(y1), float(x2 - x1 + 1), float(y2 - y1 + 1)]


def _rle_counts(text: str) -> list[int] | None:
    """The run lengths of COCO's compressed RLE string (cocoapi's maskApi.c, rleFrString): each
    number in 5-bit groups, the low group first, one printable character per group (value + 48; 0x20
    says another group follows, 0x10 of the last group is the sign); from the third number on, each
    is written as its difference from the number two before it. None where the text is no such string."""
    counts: list[int] = []
    position = 0
    while position < len(text):
        value = shift = 0
        while True:
            if position >= len(text):
                return None
            group = ord(text[position]) - 48
            if not 0 <= group < 64:
                return None
            value |= (group & 0x1F) << shift
            shift += 5
            position += 1
            if not group & 0x20:
                if group & 0x10:
                    value -= 1 << shift
                break
        if len(counts) > 2:
            value += counts[-2]
        counts.append(value)
    return counts


def validate_coco_dict(
    data: Mapping[str, Any],
    img_folder: str | os.PathLike,
    *,
    source: str,
    policy: ValidationPolicy | None = None,
    found: Iterable[tuple[str, str]] = (),
) -> tuple[list[ImageRecord], list[dict[str, Any]], ValidationReport]:
    """Validate a COCO-style dict against its image folder; `found` holds (problem, where) that the
    reader of the source found before (YOLO's label files without an image), counted the same way.

    Returns (image records in file order, categories, report). Raises DatasetError carrying the
    full report when any problem whose policy is ``error`` occurred.
    """
    policy = policy or ValidationPolicy()
    folder = Path(img_folder)
    report = ValidationReport(source=source)
    for key in ("images", "annotations", "categories"):
        if not isinstance(data.get(key), list):
            raise DatasetError(
                f"{source}: expected a COCO instances json with a list under '{key}', "
                f"found {type(data.get(key)).__name__}. Is this a COCO detection annotation file?"
            )
    categories = []
    for cat in _entries(data, "categories", source):
        if "id" not in cat:
            raise DatasetError(f"{source}: category entry {cat!r} has no 'id'")
        categories.append(
            {"id": _coerce_int(cat["id"], "category id", source), "name": str(cat.get("name", cat["id"]))}
        )
    if len({c["id"] for c in categories}) != len(categories):
        raise DatasetError(f"{source}: duplicate category ids in 'categories'")
    known_categories = {c["id"] for c in categories}

    def act(problem: str, where: str) -> str:
        action = getattr(policy, problem)
        report.add(problem, action, where)
        return action

    for problem, where in found:
        act(problem, where)

    # images: ids, files, sizes
    images: dict[int, dict[str, Any]] = {}
    first_of_file: dict[str, int] = {}  # a file's normalised name -> the first image id naming it
    report.images_in = len(data["images"])
    for entry in _entries(data, "images", source):
        for key in ("id", "file_name"):
            if key not in entry:
                raise DatasetError(f"{source}: image entry {entry!r} has no '{key}'")
        image_id = _coerce_int(entry["id"], "image id", source)
        if image_id in images:
            act(
                "duplicate_image_id",
                f"id {image_id}: {entry['file_name']} (first: {images[image_id]['file_name']})",
            )
            continue
        file_name, mapped = located_name(folder, str(entry["file_name"]))
        if mapped and act(mapped, f"{entry['file_name']} -> {folder / file_name}") == "error":
            file_name = str(entry["file_name"])
        images[image_id] = {
            "file_name": file_name,
            "width": _size_value(entry.get("width")),
            "height": _size_value(entry.get("height")),
        }
        same_file = os.path.normpath(images[image_id]["file_name"])
        first = first_of_file.setdefault(same_file, image_id)
        if first != image_id:
            where = f"{images[image_id]['file_name']}: image ids {first} and {image_id}"
            images[image_id]["drop"] = act("duplicate_file_name", where) != "keep"

    ids = [i for i in images if not images[i].get("drop")]
    checks = inspect_all([folder / images[i]["file_name"] for i in ids], policy.check_images)
    for image_id, (problem, image, detail) in zip(ids, checks):
        info = images[image_id]
        path = folder / info["file_name"]
        if problem is not None:
            act(problem, f"{path}" + (f": {detail}" if detail else ""))
            info["drop"] = True
            continue
        if image is not None:
            note_conversions(image, path, act)
            if not match_size(info, image, path, act):
                info["drop"] = True
                continue
        if info["width"] is None or info["height"] is None:
            raise DatasetError(
                f"{source}: image {info['file_name']} has no width/height and images are not inspected "
                "(check_images=none); add width and height to the json or inspect the images"
            )
        info["width"], info["height"] = int(info["width"]), int(info["height"])

    # annotations
    per_image: dict[int, list[tuple[list[float], int, bool, float]]] = defaultdict(list)
    seen_boxes: set[tuple] = set()  # what the annotations kept say, but their ids
    report.annotations_in = len(data["annotations"])
    for ann in _entries(data, "annotations", source):
        ann_id = ann.get("id", "?")
        image_id = _coerce_int(ann.get("image_id"), "annotation image_id", source)
        if image_id not in images:
            act("unknown_image_id", f"annotation {ann_id}: image_id {image_id}")
            continue
        info = images[image_id]
        if info.get("drop"):
            report.annotations_of_dropped_images += 1
            continue
        # YOLO labels name their file and line, and the values as written there (normalised cx cy w h)
        line = ann.get("source_line")
        where = line or f"{info['file_name']} annotation {ann_id}"
        category_id = ann.get("category_id")
        if category_id not in known_categories:
            act(
                "unknown_category",
                f"{where}: "
                + (
                    f"class {category_id} is not in names (0..{len(categories) - 1})"
                    if line
                    else f"category_id {category_id!r}"
                ),
            )
            continue
        bbox = ann.get("bbox")
        size = (info["height"], info["width"])
        outline = _segmentation_box(ann.get("segmentation"), size) if bbox is None else None
        if outline is not None:  # a tool that writes shapes only: the box that holds them
            bbox, kind = outline
            if act("shape_as_box", f"{where}: no bbox; the box of its segmentation {kind}") != "fix":
                continue
        shown = "" if line else f": bbox {bbox!r}"
        if not (
            isinstance(bbox, (list, tuple))
            and len(bbox) == 4
            and all(
                isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in bbox
            )
        ):
            act("invalid_box", f"{where}{shown}")
            continue
        x, y, w, h = (float(v) for v in bbox)
        if w < 0 or h < 0:
            act("negative_box", f"{where}{shown}")
            continue
        if w == 0 or h == 0:
            act("zero_area_box", f"{where}{shown}")
            continue
        report.sized_boxes += 1
        report.corner_like_boxes += w > x and h > y
        W, H = info["width"], info["height"]
        x1, y1, x2, y2 = x, y, x + w, y + h
        if "turn" in info:  # drawn on the stored pixels: move the box to the image as shown
            x1, y1, x2, y2 = orient_boxes(np.array([[x1, y1, x2, y2]]), *info["turn"])[0].tolist()
        if x1 >= W or y1 >= H or x2 <= 0 or y2 <= 0:
            act("box_entirely_outside", f"{where}{shown}" + ("" if line else f" in a {W}x{H} image"))
            continue
        if x1 < 0 or y1 < 0 or x2 > W or y2 > H:
            if (
                act("box_outside_image", f"{where}{shown}" + ("" if line else f" in a {W}x{H} image"))
                == "skip"
            ):
                continue
            x1, y1, x2, y2 = max(x1, 0.0), max(y1, 0.0), min(x2, float(W)), min(y2, float(H))
        crowd = _crowd(ann.get("iscrowd", 0), where, source)
        area = ann.get("area")
        if area is None:
            area = (x2 - x1) * (y2 - y1)  # YOLO and hand-made jsons leave it out: the box's
        elif not (isinstance(area, (int, float)) and math.isfinite(area) and area >= 0):
            act("invalid_area", f"{where}: area {area!r}")
            area = (x2 - x1) * (y2 - y1)
        entry = ([x1, y1, x2, y2], int(category_id), crowd, float(area))
        # exactly as written (a YOLO line twice, a json entry copied): a written crowd flag or area
        # that differs makes it another annotation
        key = (image_id, entry[1], x, y, w, h, repr(ann.get("iscrowd", 0)), repr(ann.get("area")))
        twice = f"{where}{shown}: the same class and box as an earlier one"
        if key in seen_boxes and act("duplicate_box", twice) == "skip":
            continue
        seen_boxes.add(key)
        per_image[image_id].append(entry)

    records: list[ImageRecord] = []
    for image_id, info in images.items():
        if info.get("drop"):
            continue
        anns = per_image.get(image_id, [])
        has_objects = any(not crowd for _, _, crowd, _ in anns)
        if not has_objects and act("empty_image", str(folder / info["file_name"])) == "skip":
            report.annotations_of_dropped_images += len(anns)  # crowd regions only
            continue
        report.crowd_annotations += sum(crowd for _, _, crowd, _ in anns)
        records.append(
            ImageRecord(
                image_id=image_id,
                file_name=info["file_name"],
                width=info["width"],
                height=info["height"],
                boxes=np.array([a[0] for a in anns], dtype=np.float32).reshape(-1, 4),
                category_ids=np.array([a[1] for a in anns], dtype=np.int64),
                iscrowd=np.array([a[2] for a in anns], dtype=bool),
                areas=np.array([a[3] for a in anns], dtype=np.float32),
            )
        )
    report.images_kept = len(records)
    report.annotations_kept = sum(len(r.category_ids) for r in records)
    if report.errors:
        names = ", ".join(f"{p} ({n})" for p, n in report.errors.items())
        raise DatasetError(
            f"{source}: dataset has problems whose policy is 'error': {names}.\n{report.format()}\n"
            "Fix the data, or set the policy for that problem to skip/fix to continue with it counted"
        )
    return records, categories, report


def records_to_coco_dict(records: Iterable[ImageRecord], categories: list[dict[str, Any]]) -> dict[str, Any]:
    """The validated records as a COCO instances dict (xywh boxes, crowd kept): evaluation ground truth."""
    images, annotations = [], []
    for rec in records:
        images.append(
            {"id": rec.image_id, "file_name": rec.file_name, "width": rec.width, "height": rec.height}
        )
        for box, cat, crowd, area in zip(
            rec.boxes.tolist(), rec.category_ids.tolist(), rec.iscrowd.tolist(), rec.areas.tolist()
        ):
            x1, y1, x2, y2 = box
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": rec.image_id,
                    "category_id": cat,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": area,
                    "iscrowd": int(crowd),
                }
            )
    return {"images": images, "annotations": annotations, "categories": [dict(c) for c in categories]}
