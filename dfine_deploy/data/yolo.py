"""YOLO-format data (``data.yaml`` + ``images/`` + ``labels/*.txt``) in the same form as COCO.

Layout (Ultralytics convention)::

    data.yaml            path: .  (optional)   train: images/train   val: images/val   names: [...]
                         (a split may list several folders: train: [images/a, images/b])
    images/train/a.jpg   labels/train/a.txt    one line per object: "class cx cy w h" (normalised)

Labels live where the last ``images`` folder of the path is replaced by ``labels``. An image without a
label file is a background image. Class index k becomes category id k (names from data.yaml), so
labels equal YOLO class indices with ``remap_mscoco_category: False``. Polygon lines
(``class x1 y1 x2 y2 ...``) are reduced to their bounding box. Normalised labels are taken relative
to the image as shown (EXIF orientation applied), as Ultralytics and labelling tools draw them.

The YOLO files are turned into a COCO dict in pixels, then validated exactly as a COCO json.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from pathlib import Path
from typing import Any

from dfine_deploy.data.coco import ANNOTATIONS_NAME, AnnotationSet, annotation_record, split_claim
from dfine_deploy.data.validation import ValidationPolicy, validate_coco_dict
from dfine_deploy.errors import DatasetError, ImageError
from dfine_deploy.files import atomic_write_bytes
from dfine_deploy.images import IMAGE_SUFFIXES, probe_image
from dfine_deploy.ownership import claim_folder, replacing
from dfine_deploy.text_files import load_yaml, read_text

SPLITS = ("train", "val", "test")
CONVERTED_DESCRIPTION = "converted by dfine-data convert-yolo from"  # our annotations.json's info
CONVERTED = split_claim("dfine-data convert-yolo", "a converted dataset split", CONVERTED_DESCRIPTION)


YOLO_YAML_NAMES = ("data.yaml", "data.yml", "dataset.yaml")  # the names a dataset's yaml goes by


def find_data_yaml(src: str | os.PathLike) -> Path:
    """SRC may be the yaml itself or the folder holding data.yaml."""
    src = Path(src)
    if src.is_file():
        return src
    for name in YOLO_YAML_NAMES:
        if (src / name).is_file():
            return src / name
    raise DatasetError(
        f"{src}: no data.yaml found; a YOLO dataset needs a data.yaml with 'names' and split folders"
    )


def read_data_yaml(path: Path) -> dict[str, Any]:
    data = load_yaml(path, "YOLO dataset file", DatasetError)
    if not isinstance(data, dict) or "names" not in data:
        raise DatasetError(f"{path}: expected a mapping with 'names' (the class names), found {data!r:.80}")
    names = data["names"]
    if isinstance(names, dict):
        try:
            by_index = {int(k): str(v) for k, v in names.items()}
        except ValueError:
            raise DatasetError(
                f"{path}: 'names' keys must be class indices 0..K-1, got {list(names)}"
            ) from None
        if sorted(by_index) != list(range(len(by_index))):
            raise DatasetError(f"{path}: 'names' keys must be 0..{len(by_index) - 1}, got {sorted(by_index)}")
        names = [by_index[k] for k in range(len(by_index))]
    elif isinstance(names, list):
        names = [str(n) for n in names]
    else:
        raise DatasetError(
            f"{path}: 'names' must be a list or a mapping index -> name, got {type(names).__name__}"
        )
    if "nc" in data and int(data["nc"]) != len(names):
        raise DatasetError(
            f"{path}: nc is {data['nc']} but 'names' lists {len(names)} classes; make them agree"
        )
    data["names"] = names
    return data


# Darknet's files, as CVAT's "YOLO 1.1" export writes them: obj.data names the class list and each
# subset's image list (`train = data/train.txt`, paths below Darknet's data/ folder: the export's root)
OBJ_DATA, OBJ_NAMES = "obj.data", "obj.names"
OBJ_DATA_KEYS = ("classes", "names", "backup")  # every other key is a subset


def read_obj_data(path: Path) -> dict[str, str]:
    """The `key = value` lines of a Darknet obj.data file ('#' starts a comment)."""
    entries = {}
    for number, line in enumerate(read_text(path, "Darknet obj.data file", DatasetError).splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            raise DatasetError(f"{path}:{number}: {line!r} is not 'key = value'; export the dataset again")
        entries[key.strip()] = value.strip()
    return entries


def darknet_path(root: Path, value: str) -> Path:
    """A path of obj.data or an image list (`data/obj_train_data/a.jpg`) below the export's root."""
    parts = Path(value.replace("\\", "/")).parts
    return root.joinpath(*parts[1:] if parts[:1] == ("data",) else parts)


def darknet_subsets(path: Path) -> dict[str, Path]:
    """Subset -> its images folder (`obj_<subset>_data/`, labels beside the images) of an obj.data."""
    return {key: path.parent / f"obj_{key}_data" for key in read_obj_data(path) if key not in OBJ_DATA_KEYS}


def darknet_names(path: Path) -> list[str]:
    """The class names of an obj.data (its `names` file, obj.names by default: one a line)."""
    names_file = darknet_path(path.parent, read_obj_data(path).get("names") or OBJ_NAMES)
    text = read_text(names_file, "class names file", DatasetError)
    return [line.strip() for line in text.splitlines() if line.strip()]


def _root(yaml_path: Path, data: dict[str, Any]) -> Path:
    """The dataset root: `path:` below the data.yaml's folder, or, where it is not there, from the
    working folder, as Ultralytics reads it (8.3, data/utils.py check_det_dataset)."""
    root = Path(os.path.expanduser(str(data.get("path") or ".")))
    if root.is_absolute():
        return root
    beside = yaml_path.parent / root
    return beside if beside.exists() or not root.exists() else root.absolute()


def split_images_dirs(yaml_path: Path, data: dict[str, Any], split_or_folder: str) -> list[Path]:
    """The images folders of a split name from data.yaml (train/val/test: one folder, or a list of
    them as Ultralytics allows) or of an images folder path."""
    root = _root(yaml_path, data)
    if split_or_folder in data and split_or_folder not in ("names", "nc", "path"):
        entry = data[split_or_folder]
        entries = entry if isinstance(entry, list) else [entry]
        if not entries or not all(isinstance(e, str) for e in entries):
            raise DatasetError(
                f"{yaml_path}: '{split_or_folder}' must be a folder path or a list of them, got {entry!r}"
            )
        folders = []
        for item in entries:
            folder = root / item
            # Ultralytics reads a missing '../x' as 'x' below the root: Roboflow's data.yaml says
            # `val: ../valid/images` for the valid/ beside it
            if not folder.exists() and item.startswith("../"):
                folder = root / item[3:]
            folders.append(folder)
    else:
        folder = Path(split_or_folder)
        folders = [folder if folder.is_absolute() or folder.exists() else root / folder]
    for folder in folders:
        if folder.suffix == ".txt":
            raise DatasetError(
                f"{folder}: image list files are not supported; point the split at an images folder"
            )
        if not folder.is_dir():
            raise DatasetError(
                f"YOLO images folder {folder} does not exist (from {yaml_path}, split {split_or_folder!r})"
            )
    return folders


def images_base(folders: list[Path]) -> Path:
    """The one folder the file names of a split's images folders are relative to (their common one)."""
    return folders[0] if len(folders) == 1 else Path(os.path.commonpath(folders))


def labels_dir_for(images_dir: Path) -> Path:
    parts = list(images_dir.parts)
    for i in range(len(parts) - 1, -1, -1):
        if parts[i] == "images":
            parts[i] = "labels"
            return Path(*parts)
    raise DatasetError(
        f"{images_dir}: a YOLO images folder must have 'images' in its path so that labels are found "
        "in the matching 'labels' folder (e.g. images/train and labels/train)"
    )


def _image_size(path: Path) -> tuple[int | None, int | None]:
    """(w, h) as shown (EXIF orientation applied), as YOLO's normalised labels are drawn."""
    try:
        return probe_image(path).size
    except ImageError:  # validation reports the broken file under its policy
        return None, None


def _parse_label_line(line: str) -> tuple[int, list[float], bool] | str:
    """'class cx cy w h' or 'class x1 y1 x2 y2 ...' (polygon) -> (class, normalised xyxy, whether it
    was a polygon), or what is wrong with the line."""
    fields = line.split()
    try:
        values = [float(v) for v in fields[1:]]
        cls = int(fields[0])
    except ValueError:
        return "expected 'class cx cy w h' with an integer class and numbers"
    if len(values) == 4:
        cx, cy, w, h = values
        return cls, [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], False
    if len(values) >= 6 and len(values) % 2 == 0:
        xs, ys = values[0::2], values[1::2]
        return cls, [min(xs), min(ys), max(xs), max(ys)], True
    return f"expected 5 values (class cx cy w h) or a polygon, got {len(fields)} values"


def _read_labels(label_file: Path) -> list[str]:
    """The lines of a label file; a byte-order mark (Windows editors write one) is no part of them."""
    try:
        return label_file.read_text(encoding="utf-8-sig").splitlines()
    except UnicodeDecodeError as exc:
        raise DatasetError(
            f"{label_file}: byte {exc.start} is not UTF-8 text; a label file holds 'class cx cy w h' "
            "lines: save it as UTF-8 (or plain ASCII)"
        ) from None


def _labels_without_image(images_dir: Path, labels_dir: Path, used: set[Path]) -> list[tuple[str, str]]:
    """(problem, where) for each label file that no image of a read format matches: its boxes would
    otherwise vanish unsaid (an image in another format, a renamed or deleted one)."""
    if not labels_dir.is_dir():
        return []
    found = []
    for label in sorted({p for p in labels_dir.rglob("*.txt") if p.is_file()} - used):
        stem = images_dir / label.relative_to(labels_dir).with_suffix("")
        others = (
            sorted(p.name for p in stem.parent.glob(f"{glob.escape(stem.name)}.*"))
            if stem.parent.is_dir()
            else []
        )
        beside = f" ({', '.join(others)} there: not {', '.join(IMAGE_SUFFIXES)})" if others else ""
        found.append(("label_without_image", f"{label}: no image {stem}.*{beside}"))
    return found


def yolo_split_to_coco(
    images_dirs: list[Path], names: list[str], *, labels_beside: bool = False, names_file: Path | None = None
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """Read one split's images folders and label files into a COCO dict in pixels (not yet
    validated; file names relative to `images_base`), and the label files that no image matches, as
    (problem, where) for validation to count.

    Each annotation carries `source_line` ("labels/x.txt:3: '0 0.5 0.5 0.2 0.1'") so that validation
    names problems by label file and line, in YOLO terms. Lines that cannot be parsed are all
    collected and refused together, each with its file and line. A link to no file is listed, so
    validation reports it missing instead of the image vanishing. `names_file`: a class list among
    the label files (labelImg's classes.txt), which is no image's labels.
    """
    base = images_base(images_dirs)
    images, annotations, unparsable = [], [], []
    found = []
    for images_dir in images_dirs:
        labels_dir = images_dir if labels_beside else labels_dir_for(images_dir)
        files = sorted(
            p for p in images_dir.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES and not p.is_dir()
        )
        if not files:
            suffixes = ", ".join(IMAGE_SUFFIXES)
            labels_only = labels_beside and any(images_dir.glob("*.txt"))
            raise DatasetError(
                f"YOLO images folder {images_dir} holds no images ({suffixes})"
                + (
                    "; it holds label files only: export again with the images (CVAT: 'Save images')"
                    if labels_only
                    else ""
                )
            )
        used: dict[Path, Path] = {}  # label file -> the first image it serves
        for path in files:
            image_id = len(images) + 1
            rel = path.relative_to(images_dir)
            width, height = _image_size(path)
            name = path.relative_to(base).as_posix()
            images.append({"id": image_id, "file_name": name, "width": width, "height": height})
            label_file = (labels_dir / rel).with_suffix(".txt")
            first = used.setdefault(label_file, rel)
            if not label_file.is_file():
                continue
            if first != rel:  # a.jpg and a.png: Ultralytics gives both these boxes too
                found.append(("label_shared", f"{label_file}: the labels of {first.name} and {rel.name}"))
            # an unreadable image (no size) is dropped by validation, which counts these boxes with it
            scale_w, scale_h = (width, height) if width is not None else (0, 0)
            for number, line in enumerate(_read_labels(label_file), start=1):
                if not line.strip():
                    continue
                where = f"{label_file}:{number}: {line.strip()!r}"
                parsed = _parse_label_line(line)
                if isinstance(parsed, str):
                    unparsable.append(f"  {where}: {parsed}")
                    continue
                cls, (x1, y1, x2, y2), polygon = parsed
                if polygon:  # a segmentation line, read as its box: counted, as CVAT's polygons are
                    found.append(("shape_as_box", where))
                box = [x1 * scale_w, y1 * scale_h, (x2 - x1) * scale_w, (y2 - y1) * scale_h]  # xywh px
                record = annotation_record(len(annotations) + 1, image_id, cls, box)
                annotations.append({**record, "source_line": where})
        found += _labels_without_image(images_dir, labels_dir, {*used, *([names_file] if names_file else [])})
    if unparsable:
        raise DatasetError(
            f"{', '.join(str(d if labels_beside else labels_dir_for(d)) for d in images_dirs)}: "
            f"{len(unparsable)} label line(s) "
            "cannot be read; each line is 'class cx cy w h' (normalised 0..1) or 'class x1 y1 x2 y2 ...' "
            "(a polygon):\n" + "\n".join(unparsable)
        )
    categories = [{"id": i, "name": n} for i, n in enumerate(names)]
    coco = {"images": images, "annotations": annotations, "categories": categories}
    return coco, found


def load_yolo(
    data_yaml: str | os.PathLike, split: str, *, policy: ValidationPolicy | None = None
) -> AnnotationSet:
    """Validated annotations of one YOLO split (`split`: train/val/test or an images folder)."""
    yaml_path = find_data_yaml(data_yaml)
    data = read_data_yaml(yaml_path)
    images_dirs = split_images_dirs(yaml_path, data, split)
    return load_yolo_images(images_dirs, data["names"], f"{yaml_path} [{split}]", policy=policy)


def load_yolo_images(
    images_dirs: list[Path],
    names: list[str],
    source: str,
    *,
    policy: ValidationPolicy | None = None,
    labels_beside: bool = False,
    names_file: Path | None = None,
) -> AnnotationSet:
    """Validated annotations of a split's YOLO images folders (labels in the matching labels/
    folders, or beside the images, where `names_file` may be too), its file names relative to their
    common folder."""
    coco, found = yolo_split_to_coco(images_dirs, names, labels_beside=labels_beside, names_file=names_file)
    base = images_base(images_dirs)
    records, categories, report = validate_coco_dict(coco, base, source=source, policy=policy, found=found)
    return AnnotationSet(records, categories, base, source, report)


def convert_yolo(
    src: str | os.PathLike, out: str | os.PathLike, *, policy: ValidationPolicy | None = None
) -> dict[str, AnnotationSet]:
    """Write every split of a YOLO dataset as OUT/<split>/ images + annotations.json (COCO). Each
    OUT/<split> is new, empty or an earlier conversion of ours (`CONVERTED`), replaced whole."""
    yaml_path = find_data_yaml(src)
    data = read_data_yaml(yaml_path)
    splits = [s for s in SPLITS if isinstance(data.get(s), (str, list))]
    if not splits:
        raise DatasetError(f"{yaml_path}: no split folders (train/val/test) to convert")
    for split in splits:  # every split checked before any is written
        claim_folder(Path(out) / split, CONVERTED, option="--out", error=DatasetError)
    converted = {}
    for split in splits:
        annotations = load_yolo(yaml_path, split, policy=policy)
        with replacing(Path(out) / split, CONVERTED, option="--out", error=DatasetError) as staging:
            for rec in annotations.records:
                target = staging / rec.file_name
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(annotations.img_folder / rec.file_name, target)
            coco = {"info": {"description": f"{CONVERTED_DESCRIPTION} {yaml_path} [{split}]"}}
            coco.update(annotations.coco_dict())
            atomic_write_bytes(staging / ANNOTATIONS_NAME, json.dumps(coco, indent=1).encode())
        converted[split] = annotations
    return converted
