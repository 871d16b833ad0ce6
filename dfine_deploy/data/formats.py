"""The dataset layouts we read, one row each: how the layout is recognised from a folder or from a
file, where its splits' annotations and images are, and which reader turns a split into validated
annotations.

Every entry point (`dfine-data validate`, the training config's img_folder/ann_file, `dfine-bench
--data`, the export gate's --data and INT8 calibration) opens a dataset with `open_dataset` and
prints the line `Dataset.describe` makes, so a labelling tool's export is read where it stands:

| row | recognised by | images |
|---|---|---|
| roboflow-coco | `<split>/_annotations.coco.json` (train/ valid/ test/) | beside the json |
| roboflow-box-list | `<split>/_annotations.csv` or `<split>/_annotations.createml.json` | beside it |
| cvat-coco | `annotations/instances_<subset>.json` + `images/` | `images/<subset>/` or `images/` |
| cvat-xml | `annotations.xml` (CVAT for images 1.1) + `images/` | `images/<subset>/` or `images/` |
| label-studio-coco | `result.json` + `images/` (file_name `images/...`) | the json's folder, or |
|  |  | `images/` for `/data/upload/1/<name>` |
| label-studio-yolo | `classes.txt` + `images/` + `labels/`, no data.yaml | `images/` |
| cvat-yolo | `obj.data` + `obj.names` (CVAT YOLO 1.1, Darknet) | `obj_<subset>_data/`, labels beside |
| yolo-beside | `classes.txt` or `_darknet.labels` + images, each label file beside its image | that folder |
| yolo | `data.yaml` (Ultralytics, Roboflow) | each split's folder in it |
| voc | `Annotations/*.xml` + `JPEGImages/` (+ `ImageSets/Main/<split>.txt`) | `JPEGImages/` |
| voc-beside | VOC `*.xml` beside the images (labelImg; Roboflow: train/ valid/) | beside each XML |
| labelme | a LabelMe `.json` beside each image (LabelMe, X-AnyLabeling) | beside each json |
| coco | any other COCO json; `annotations.json` (or `<split>/annotations.json`), | the json's folder |
|  | `annotations/instances_<x>.json` + `<x>/` (COCO's own) | or `images/` beside it, as its names say |

Rows are tried in that order (the tool exports first: their file names are their own); the
documented layouts they follow are named in docs/train.md. Split names are read as train, val
and test (`valid`, `validation` and `val2017` are val).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dfine_deploy.compat import remove_prefix
from dfine_deploy.data import cvat
from dfine_deploy.data.box_lists import CREATEML_NAME, CSV_NAME, box_list_kind, labels_of, load_box_list
from dfine_deploy.data.coco import AnnotationSet, load_coco, read_json, refuse_foreign_json
from dfine_deploy.data.labelme import is_labelme_json, labelme_labels, load_labelme, read_labelme
from dfine_deploy.data.validation import ValidationPolicy
from dfine_deploy.data.voc import (
    ANNOTATIONS,
    IMAGES,
    is_voc_xml,
    load_voc,
    load_voc_beside,
    object_names,
    voc_xmls,
)
from dfine_deploy.data.yolo import (
    OBJ_DATA,
    SPLITS,
    YOLO_YAML_NAMES,
    darknet_names,
    darknet_subsets,
    images_base,
    load_yolo_images,
    read_data_yaml,
    split_images_dirs,
)
from dfine_deploy.errors import DatasetError
from dfine_deploy.images import IMAGE_SUFFIXES

SPLIT_ALIASES = {
    "valid": "val",
    "validation": "val",
    "val2017": "val",
    "train2017": "train",
    "test2017": "test",
}
COCO_NAME = "annotations.json"  # what dfine-data writes in each split folder


def split_name(name: str) -> str:
    """train, val or test for the names tools give them; any other name as it is."""
    return SPLIT_ALIASES.get(name.lower(), name.lower())


def is_split_name(text: str) -> bool:
    """A split's name (train, val, test, or a tool's word for one), not a folder path."""
    return split_name(text) in SPLITS


@dataclass(frozen=True)
class Split:
    """One split of a dataset: its name (train, val, test, or '' for a one-split export), the file it
    is read from and its image folder; `or_images`: another folder its file names may be relative
    to (a plain COCO json's own folder, beside its `images/`), chosen by them when it is read."""

    name: str
    source: Path
    images: Path
    or_images: tuple[Path, ...] = ()
    folders: tuple[Path, ...] = ()  # a YOLO split listed as several images folders; `images` holds them
    key: str = ""  # the split's own name in its file where `name` is ours for it (a CVAT subset)


@dataclass(frozen=True)
class DatasetFormat:
    """A layout: `in_folder` and `of_file` give the splits a folder or a file holds (none: not this
    layout); `load` reads one split into validated annotations; `seen_by` says what marks it.
    `takes_img_folder`: its files do not
    say where its images are, so an image folder may be given (a plain COCO json); every other layout
    knows its own, and one given is refused."""

    name: str
    title: str
    in_folder: Callable[[Path], list[Split]]
    of_file: Callable[[Path], list[Split]]
    load: Callable[[Split, ValidationPolicy | None], AnnotationSet]
    takes_img_folder: bool = False
    seen_by: str = ""  # what a folder of this layout holds, for the refusal of a folder of none


@dataclass(frozen=True)
class Dataset:
    """A dataset as found at `path`: its layout and splits."""

    path: Path
    format: DatasetFormat
    splits: tuple[Split, ...]

    def split(self, wanted: str | None) -> Split:
        """The split asked for (None: val, else the only one); a one-split export serves any name."""
        if len(self.splits) == 1 and (wanted is None or self.splits[0].name in ("", split_name(wanted))):
            return self.splits[0]
        name = split_name(wanted or "val")
        for split in self.splits:
            if split.name == name:
                return split
        if self.format.name == "yolo" and wanted is not None:  # an images folder, as YOLODetection takes
            yaml_path = self.splits[0].source
            return _yolo_split(wanted, yaml_path, wanted)
        if len(self.splits) == 1:
            return self.splits[0]
        names = ", ".join(s.name for s in self.splits)
        raise DatasetError(
            f"{self.path}: a {self.format.title} with the splits {names}, none of them {name}; "
            f"name one of them (the dataset's split, dfine-data validate --split)"
        )

    def chosen_split(self, wanted: str, option: str = "--split") -> Split:
        """The split a user named (`option`): refused where the dataset has one split of no name,
        which a name cannot choose."""
        if len(self.splits) == 1 and not self.splits[0].name:
            raise DatasetError(
                f"{option} {wanted}: {self.path} is a {self.format.title} of one split; leave {option} "
                "out (it chooses among the splits of an export that has several)"
            )
        return self.split(wanted)

    def describe(self, split: Split) -> str:
        """The one line every entry point prints: the layout read, the split, its files."""
        which = f"split {split.name}" if split.name else "its one split"
        return (
            f"data: {self.path} read as a {self.format.title} ({which}: {split.source}, "
            f"images in {split.images})"
        )

    def load(
        self, wanted: str | None = None, *, policy: ValidationPolicy | None = None, chosen: bool = False
    ) -> AnnotationSet:
        """The validated annotations of one split, with the layout line and what reading noted;
        `chosen`: the user named the split (`chosen_split`), not an entry point's default."""
        split = self.chosen_split(wanted) if chosen and wanted is not None else self.split(wanted)
        annotations = self.format.load(split, policy)
        annotations.layout = self.describe(dataclasses.replace(split, images=annotations.img_folder))
        annotations.notes += empty_categories(annotations)
        return annotations


def empty_categories(annotations: AnnotationSet) -> list[str]:
    """One line naming the categories with no box in this split (a class the model cannot learn or be
    scored on here)."""
    used = {int(c) for r in annotations.records for c in r.category_ids.tolist()}
    empty = [f"{c['id']} {c['name']!r}" for c in annotations.categories if c["id"] not in used]
    if not empty:
        return []
    return [
        f"{annotations.source}: {len(empty)} of {len(annotations.categories)} categories have no box here "
        f"({', '.join(empty[:8])}{', ...' if len(empty) > 8 else ''})"
    ]


# ------------------------------------------------------------------------------------------ the rows
def _load_coco(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:
    return load_coco(split.source, split.images, policy=policy, or_folders=split.or_images)


def _one(path: Path, name: str, images: Path) -> list[Split]:
    return [Split(name, path, images)]


# Roboflow "COCO JSON": train/ valid/ test/, each with _annotations.coco.json beside its images
ROBOFLOW_JSON = "_annotations.coco.json"


def _split_files(folder: Path, name: str) -> list[Split]:
    """Roboflow's splits: the file `name` in each of train/ valid/ test/ beside its images (or in the
    split folder given itself)."""
    if (folder / name).is_file():
        return _split_file(folder / name, name)
    found = sorted(p for p in folder.glob(f"*/{name}") if p.is_file())
    return [Split(split_name(p.parent.name), p, p.parent) for p in found]


def _split_file(path: Path, name: str) -> list[Split]:
    return _one(path, split_name(path.parent.name), path.parent) if path.name == name else []


def _roboflow_folder(folder: Path) -> list[Split]:
    return _split_files(folder, ROBOFLOW_JSON)


def _roboflow_file(path: Path) -> list[Split]:
    return _split_file(path, ROBOFLOW_JSON)


# Roboflow "Tensorflow Object Detection CSV" and "CreateML JSON": the same splits, each with one box list
def _box_list_folder(folder: Path) -> list[Split]:
    return _split_files(folder, CSV_NAME) or _split_files(folder, CREATEML_NAME)


def _box_list_file(path: Path) -> list[Split]:
    return _one(path, split_name(path.parent.name), path.parent) if box_list_kind(path) else []


def _load_box_list(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:
    name = split.source.name
    folders = _export_splits(split.source.parent, lambda p: (p / name).is_file())
    return load_box_list(split.source, labels_of([folder / name for folder in folders]), policy=policy)


# CVAT "COCO 1.0": annotations/instances_<subset>.json, images in images/<subset>/ or images/
def _cvat_file(path: Path) -> list[Split]:
    root = path.parent.parent
    if path.parent.name != "annotations" or not path.name.startswith("instances_") or path.suffix != ".json":
        return []
    if not (root / "images").is_dir():
        return []
    subset = remove_prefix(path.stem, "instances_")
    images = root / "images" / subset
    return _one(path, split_name(subset), images if images.is_dir() else root / "images")


def _cvat_folder(folder: Path) -> list[Split]:
    return [s for p in sorted((folder / "annotations").glob("instances_*.json")) for s in _cvat_file(p)]


# CVAT "CVAT for images 1.1": annotations.xml + images/ (a project's: a subset per split, images/<subset>/)
def _cvat_xml_file(path: Path) -> list[Split]:
    if path.suffix.lower() != ".xml" or not cvat.is_cvat_xml(path):
        return []
    if not (path.parent / cvat.IMAGES).is_dir():
        raise DatasetError(
            f"{path}: a CVAT for images export without its images (no {cvat.IMAGES}/ beside it); export "
            "it again from CVAT with 'Save images' ticked, or unpack the whole zip here"
        )
    subsets = cvat.subsets(cvat.parse(path), path)
    return [Split(split_name(s), path, cvat.images_folder(path.parent, s), key=s) for s in subsets]


def _cvat_xml_folder(folder: Path) -> list[Split]:
    xml = folder / cvat.XML_NAME
    return _cvat_xml_file(xml) if xml.is_file() else []


def _load_cvat_xml(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:
    return cvat.load_cvat_xml(split.source, split.key, split.images, policy=policy)


# Label Studio "COCO": result.json, file_name "images/<name>" relative to it, or the server path of an
# image the export did not copy (`/data/upload/1/<name>`), whose file is in images/ by its name
def _label_studio_coco_file(path: Path) -> list[Split]:
    ok = path.name == "result.json" and (path.parent / "images").is_dir()
    return [Split("", path, path.parent, or_images=(path.parent / "images",))] if ok else []


def _label_studio_coco_folder(folder: Path) -> list[Split]:
    return _label_studio_coco_file(folder / "result.json") if (folder / "result.json").is_file() else []


# Label Studio "YOLO": classes.txt (one name a line), images/, labels/, notes.json; no data.yaml
def _label_studio_yolo_file(path: Path) -> list[Split]:
    root = path.parent
    ok = path.name == "classes.txt" and (root / "images").is_dir() and (root / "labels").is_dir()
    return _one(path, "", root / "images") if ok and not _yolo_folder(root) else []


def _label_studio_yolo_folder(folder: Path) -> list[Split]:
    return _label_studio_yolo_file(folder / "classes.txt") if (folder / "classes.txt").is_file() else []


def _load_label_studio_yolo(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:

    return load_yolo_images([split.images], _names_file(split.source), str(split.source), policy=policy)


# labelImg's YOLO save (classes.txt), Roboflow's "YOLO Darknet" export (train/ valid/ test/, each with
# _darknet.labels): each image's label file beside it, and the class list in the same folder
NAMES_BESIDE = ("classes.txt", "_darknet.labels")


def _names_beside(folder: Path) -> Path | None:
    """The class list of a folder of images with their label files beside them, if it is one."""
    if not folder.is_dir():
        return None
    for name in NAMES_BESIDE:
        if (folder / name).is_file() and any(p.suffix.lower() in IMAGE_SUFFIXES for p in folder.iterdir()):
            return folder / name
    return None


def _split_folders(folder: Path) -> list[Path]:
    """The subfolders of `folder` named as splits (train/ valid/ test/ ...); none where it is no folder."""
    return (
        sorted(p for p in folder.iterdir() if p.is_dir() and is_split_name(p.name)) if folder.is_dir() else []
    )


def _yolo_beside_folder(folder: Path) -> list[Split]:
    names = _names_beside(folder)
    if names is not None:
        return _one(names, split_name(folder.name) if is_split_name(folder.name) else "", folder)
    return [
        Split(split_name(p.name), listed, p) for p in _split_folders(folder) if (listed := _names_beside(p))
    ]


def _yolo_beside_file(path: Path) -> list[Split]:
    return _yolo_beside_folder(path.parent) if path.name in NAMES_BESIDE else []


def _load_yolo_beside(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:
    names = _names_file(split.source)
    return load_yolo_images(
        [split.images], names, str(split.source), policy=policy, labels_beside=True, names_file=split.source
    )


def _names_file(path: Path) -> list[str]:
    """classes.txt, _darknet.labels: one class name a line (Label Studio, labelImg, Roboflow)."""
    return [line.strip() for line in path.read_text(encoding="utf-8-sig").splitlines() if line.strip()]


# CVAT "YOLO 1.1" (Darknet): obj.data, obj.names, <subset>.txt, obj_<subset>_data/ with each label
# file beside its image; the subset's folder is read (its list names the same images)
def _cvat_yolo_file(path: Path) -> list[Split]:
    if path.name != OBJ_DATA:
        return []
    return [
        Split(split_name(subset), path, folder, key=subset)
        for subset, folder in darknet_subsets(path).items()
        if folder.is_dir()
    ]


def _cvat_yolo_folder(folder: Path) -> list[Split]:
    return _cvat_yolo_file(folder / OBJ_DATA) if (folder / OBJ_DATA).is_file() else []


def _load_cvat_yolo(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:
    names = darknet_names(split.source)
    source = f"{split.source} [{split.key}]"
    return load_yolo_images([split.images], names, source, policy=policy, labels_beside=True)


# Ultralytics / Roboflow YOLO: data.yaml naming each split's images folder (or a list of them)
def _yolo_split(name: str, yaml_path: Path, key: str) -> Split:
    folders = split_images_dirs(yaml_path, read_data_yaml(yaml_path), key)
    return Split(name, yaml_path, images_base(folders), folders=tuple(folders))


def _yolo_file(path: Path) -> list[Split]:

    if path.suffix.lower() not in (".yaml", ".yml"):
        return []
    data = read_data_yaml(path)
    keys = [k for k in ("train", "val", "validation", "test") if isinstance(data.get(k), (str, list))]
    splits = []
    for key in keys:  # a split the yaml names and the export lacks (Roboflow's test/) is left out
        try:
            splits.append(_yolo_split(split_name(key), path, key))
        except DatasetError:
            continue
    if keys and not splits:  # none there: the first one's message says where it was looked for
        _yolo_split(keys[0], path, keys[0])
    return splits


def _yolo_folder(folder: Path) -> list[Split]:
    for name in YOLO_YAML_NAMES:
        if (folder / name).is_file():
            return _yolo_file(folder / name)
    return []


def _load_yolo(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:

    names = read_data_yaml(split.source)["names"]
    folders = list(split.folders) or [split.images]
    return load_yolo_images(folders, names, f"{split.source} [{split.name}]", policy=policy)


# Pascal VOC: Annotations/*.xml, JPEGImages/, ImageSets/Main/<split>.txt
def _voc_root(folder: Path) -> bool:
    return (folder / ANNOTATIONS).is_dir() and (folder / IMAGES).is_dir()


def _voc_folder(folder: Path) -> list[Split]:
    if not _voc_root(folder):
        return []
    lists = sorted(p for p in (folder / "ImageSets" / "Main").glob("*.txt") if "_" not in p.stem)
    if not lists:  # no split lists: every XML is one split
        return _one(folder / ANNOTATIONS, "", folder / IMAGES)
    return [Split(split_name(p.stem), p, folder / IMAGES) for p in lists]


def _voc_file(path: Path) -> list[Split]:
    root = path.parents[2] if len(path.parents) > 2 else path.parent
    if path.suffix == ".txt" and path.parent.name == "Main" and _voc_root(root):
        return _one(path, split_name(path.stem), root / IMAGES)
    if path.suffix == ".xml" and path.parent.name == ANNOTATIONS and _voc_root(path.parent.parent):
        return _voc_folder(path.parent.parent)
    return []


def _load_voc(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:

    root = split.images.parent
    return load_voc(root, split.source.stem if split.source.suffix == ".txt" else None, policy=policy)


# VOC XMLs beside their images, no Annotations/: labelImg's default (one folder), Roboflow's "Pascal
# VOC" export (train/ valid/ test/)
VOC_SAMPLED = 3  # XML files looked at to recognise a folder of them


def _voc_beside_folder(folder: Path) -> list[Split]:
    if voc_xmls(folder, VOC_SAMPLED):
        return [Split(split_name(folder.name) if is_split_name(folder.name) else "", folder, folder)]
    return [Split(split_name(p.name), p, p) for p in _split_folders(folder) if voc_xmls(p, VOC_SAMPLED)]


def _voc_beside_file(path: Path) -> list[Split]:
    if path.suffix.lower() != ".xml" or path.parent.name == ANNOTATIONS or not is_voc_xml(path):
        return []
    return _voc_beside_folder(path.parent)


def _load_voc_beside(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:
    folders = _export_splits(split.source, lambda p: bool(voc_xmls(p, VOC_SAMPLED)))
    names = object_names([xml for folder in folders for xml in voc_xmls(folder)])
    return load_voc_beside(split.source, names, policy=policy)


def _export_splits(folder: Path, holds: Callable[[Path], bool]) -> list[Path]:
    """For the layouts with no class list: the split folders of the export that `folder` is a split
    of (its siblings that `holds` the same layout), whose labels together are the classes, so that
    every split numbers them alike; `folder` alone where it is no split of one."""
    splits = [p for p in _split_folders(folder.parent) if holds(p)]
    return splits if is_split_name(folder.name) and folder in splits else [folder]


# LabelMe (and X-AnyLabeling, AnyLabeling): a json per image beside it; one folder, or train/ valid/
# test/ of them
LABELME_SAMPLED = 3  # json files looked at to recognise a folder of them


def _labelme_folder(folder: Path) -> list[Split]:
    if read_labelme(folder, LABELME_SAMPLED):
        return [Split(split_name(folder.name) if is_split_name(folder.name) else "", folder, folder)]
    return [
        Split(split_name(p.name), p, p) for p in _split_folders(folder) if read_labelme(p, LABELME_SAMPLED)
    ]


def _labelme_file(path: Path) -> list[Split]:
    return _labelme_folder(path.parent) if path.suffix.lower() == ".json" and is_labelme_json(path) else []


def _load_labelme(split: Split, policy: ValidationPolicy | None) -> AnnotationSet:
    folders = _export_splits(split.source, lambda p: bool(read_labelme(p, LABELME_SAMPLED)))
    documents = {folder: read_labelme(folder) for folder in folders}  # each json read once
    names = labelme_labels([d for folder in folders for d in documents[folder]])
    return load_labelme(split.source, documents[split.source], names, policy=policy)


# plain COCO: annotations.json (in the folder or per split folder), COCO's own annotations/ + <split>/
def _coco_file(path: Path) -> list[Split]:
    if path.suffix.lower() != ".json":
        return []
    images = path.parent / "images"
    name = split_name(path.parent.name) if path.name == COCO_NAME else ""
    name = name if name in SPLITS else ""
    if not images.is_dir():
        return _one(path, name, path.parent)
    return [Split(name, path, images, or_images=(path.parent,))]  # its file names say which


def _coco_folder(folder: Path) -> list[Split]:
    if (folder / COCO_NAME).is_file():
        return _coco_file(folder / COCO_NAME)
    splits = [
        Split(split_name(p.parent.name), p, p.parent)
        for p in sorted(folder.glob(f"*/{COCO_NAME}"))
        if p.is_file()
    ]
    for ann in sorted((folder / "annotations").glob("instances_*.json")):
        images = folder / remove_prefix(ann.stem, "instances_")
        if images.is_dir():
            splits.append(Split(split_name(images.name), ann, images))
    return splits


FORMATS: tuple[DatasetFormat, ...] = (
    DatasetFormat(
        "roboflow-coco",
        "Roboflow COCO export",
        _roboflow_folder,
        _roboflow_file,
        _load_coco,
        seen_by=f"train/ valid/ test/ with {ROBOFLOW_JSON}",
    ),
    DatasetFormat(
        "roboflow-box-list",
        "Roboflow Tensorflow CSV or CreateML export",
        _box_list_folder,
        _box_list_file,
        _load_box_list,
        seen_by=f"train/ valid/ test/ with {CSV_NAME} or {CREATEML_NAME}",
    ),
    DatasetFormat(
        "cvat-coco",
        "CVAT COCO 1.0 export",
        _cvat_folder,
        _cvat_file,
        _load_coco,
        seen_by="annotations/instances_default.json + images/",
    ),
    DatasetFormat(
        "cvat-xml",
        "CVAT for images 1.1 export",
        _cvat_xml_folder,
        _cvat_xml_file,
        _load_cvat_xml,
        seen_by=f"{cvat.XML_NAME} + {cvat.IMAGES}/",
    ),
    DatasetFormat(
        "label-studio-coco",
        "Label Studio COCO export",
        _label_studio_coco_folder,
        _label_studio_coco_file,
        _load_coco,
        seen_by="result.json + images/",
    ),
    DatasetFormat(
        "label-studio-yolo",
        "Label Studio YOLO export",
        _label_studio_yolo_folder,
        _label_studio_yolo_file,
        _load_label_studio_yolo,
        seen_by="classes.txt + images/ + labels/",
    ),
    DatasetFormat(
        "cvat-yolo",
        "CVAT YOLO 1.1 export",
        _cvat_yolo_folder,
        _cvat_yolo_file,
        _load_cvat_yolo,
        seen_by=f"{OBJ_DATA} + obj.names",
    ),
    DatasetFormat(
        "yolo-beside",
        "labelImg or Roboflow Darknet YOLO export",
        _yolo_beside_folder,
        _yolo_beside_file,
        _load_yolo_beside,
        seen_by=f"{' or '.join(NAMES_BESIDE)} + images, each label file beside its image",
    ),
    DatasetFormat(
        "yolo",
        "YOLO dataset (data.yaml)",
        _yolo_folder,
        _yolo_file,
        _load_yolo,
        seen_by=", ".join(YOLO_YAML_NAMES) + " naming each split's images",
    ),
    DatasetFormat(
        "voc",
        "Pascal VOC dataset",
        _voc_folder,
        _voc_file,
        _load_voc,
        seen_by=f"{ANNOTATIONS}/ + {IMAGES}/",
    ),
    DatasetFormat(
        "voc-beside",
        "labelImg or Roboflow Pascal VOC export",
        _voc_beside_folder,
        _voc_beside_file,
        _load_voc_beside,
        seen_by="images with a VOC .xml beside each, or train/ valid/ test/ of them",
    ),
    DatasetFormat(
        "labelme",
        "LabelMe or X-AnyLabeling folder",
        _labelme_folder,
        _labelme_file,
        _load_labelme,
        seen_by="images with a LabelMe .json beside each, or train/ valid/ test/ of them",
    ),
    DatasetFormat(
        "coco",
        "COCO dataset",
        _coco_folder,
        _coco_file,
        _load_coco,
        takes_img_folder=True,
        seen_by=f"{COCO_NAME}, or annotations/instances_<split>.json + <split>/",
    ),
)


def open_dataset(
    path: str | os.PathLike,
    *,
    img_folder: str | os.PathLike | None = None,
    img_folder_option: str | None = None,
) -> Dataset:
    """The dataset at `path` (a folder or an annotation file), by the first row that recognises it.

    `img_folder` (a config's img_folder, --img-folder: `img_folder_option` names it) is the image
    folder of a plain COCO json, whose file names do not say where they are relative to; the rows
    that know theirs refuse another one."""
    path = Path(path)
    if not path.exists():
        raise DatasetError(f"dataset {path} not found; give the export's folder or its annotation file")
    dataset = recognise(path, img_folder=img_folder, img_folder_option=img_folder_option)
    if dataset is not None:
        return dataset
    if path.is_file():
        raise DatasetError(
            f"{path}: not an annotation file of a layout we read ({', '.join(f.title for f in FORMATS)}); "
            "give a COCO json, a data.yaml, a VOC split list or the export's folder"
        )
    _refuse_foreign_folder(path)
    expected = "; ".join(f"a {f.title}: {f.seen_by}" for f in FORMATS)
    raise DatasetError(f"{path}: no dataset found in this folder; expected one of: {expected}")


# how many jsons of a folder no row recognises are looked at for another tool's export
FOREIGN_SAMPLED = 3


def _refuse_foreign_folder(folder: Path) -> None:
    """A folder of another tool's export (Datumaro's annotations/default.json, LabelMe's json beside
    each image, a Label Studio JSON or JSON-MIN file) is named as that tool's, with the export to
    choose, as its json given alone is (`refuse_foreign_json`)."""
    for place in (folder, folder / "annotations"):
        for json_file in sorted(place.glob("*.json"))[:FOREIGN_SAMPLED]:
            try:
                data = read_json(json_file)
            except DatasetError:  # not JSON at all: not a tool's export we know
                continue
            refuse_foreign_json(data, str(json_file))


def recognise(
    path: Path, *, img_folder: str | os.PathLike | None = None, img_folder_option: str | None = None
) -> Dataset | None:
    """`open_dataset`'s answer, or None where no row recognises `path` (a plain folder of images).

    An `img_folder` the user named with `img_folder_option` for a layout that knows its own images
    (`takes_img_folder` False) is refused, unless it is that very folder; without the option (a
    training config's img_folder left beside an export's ann_file) the layout's own images are read."""
    if not path.exists():  # no row is asked about what is not there
        return None
    for fmt in FORMATS:
        try:
            splits = fmt.of_file(path) if path.is_file() else fmt.in_folder(path)
        except DatasetError:
            if img_folder is not None and img_folder_option and not fmt.takes_img_folder:
                raise _own_images(path, fmt, img_folder, img_folder_option) from None
            raise
        if not splits:
            continue
        if img_folder is not None:
            if fmt.takes_img_folder:
                splits = [Split(s.name, s.source, Path(img_folder)) for s in splits]
            elif img_folder_option and not any(
                _same_place(s.images, img_folder) or _same_place(path, img_folder) for s in splits
            ):
                raise _own_images(path, fmt, img_folder, img_folder_option)
        return Dataset(path, fmt, tuple(splits))
    return None


def _same_place(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


def _own_images(path: Path, fmt: DatasetFormat, img_folder: str | os.PathLike, option: str) -> DatasetError:
    return DatasetError(
        f"{option} {img_folder}: {path} is a {fmt.title}, which says where its images are; leave "
        f"{option} out (it is for a plain COCO json)"
    )
