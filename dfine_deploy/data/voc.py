"""Pascal VOC data (``Annotations/*.xml`` + ``JPEGImages/`` + ``ImageSets/Main/<split>.txt``, or each
image's XML beside it) in the same form as COCO.

Each XML names its image (``filename``), size and objects (``name``, ``bndbox`` with 1-based
``xmin ymin xmax ymax``, ``difficult``). Boxes become COCO pixels as Detectron2's VOC reader
makes them (``xmin - 1, ymin - 1`` to ``xmax, ymax``); ``difficult`` objects become crowd regions:
ignored by evaluation, as VOC's own evaluation ignores them, and not trained on. Class names come
from ``labelmap.txt`` when the export has one (CVAT writes it), else from the XMLs in alphabetical
order (VOC's own 20 classes are listed so). The dict is then validated exactly as a COCO json.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

from dfine_deploy.data.coco import AnnotationSet, annotation_record
from dfine_deploy.data.validation import ValidationPolicy, validate_coco_dict
from dfine_deploy.errors import DatasetError

ANNOTATIONS, IMAGES, SPLIT_LISTS, LABELMAP = "Annotations", "JPEGImages", "ImageSets/Main", "labelmap.txt"


def _parse_all(paths: list[Path]) -> list[tuple[Path, ElementTree.Element]]:
    """(path, root) of each XML, in order (a split list naming one twice keeps both, for validation
    to count); the files that are no readable XML are refused together, each with the parser's line
    and column (the first one alone was, and the next run found the next)."""
    roots, broken = [], []
    for path in paths:
        try:
            roots.append((path, ElementTree.parse(path).getroot()))
        except ElementTree.ParseError as exc:
            broken.append(f"  {path}: {exc}")
    if broken:
        raise DatasetError(
            f"{len(broken)} of {len(paths)} VOC annotation file(s) are not readable XML; re-export them:\n"
            + "\n".join(broken[:20])
            + (f"\n  ... and {len(broken) - 20} more" if len(broken) > 20 else "")
        )
    return roots


def _text(node: ElementTree.Element, tag: str, path: Path) -> str:
    found = node.find(tag)
    if found is None or found.text is None:
        raise DatasetError(f"{path}: <{node.tag}> has no <{tag}>; a VOC annotation names it for every object")
    return found.text.strip()


def _number(node: ElementTree.Element, tag: str, path: Path) -> float:
    text = _text(node, tag, path)
    try:
        return float(text)
    except ValueError:
        raise DatasetError(f"{path}: <{tag}> is {text!r}, expected a number") from None


def split_stems(root: Path, split: str | None) -> list[str]:
    """The image ids of ImageSets/Main/<split>.txt (first field of each line), or every XML's stem."""
    if split is None:
        return sorted(p.stem for p in (root / ANNOTATIONS).glob("*.xml"))
    listing = root / SPLIT_LISTS / f"{split}.txt"
    try:
        lines = listing.read_text(encoding="utf-8-sig").splitlines()
    except OSError as exc:
        raise DatasetError(f"{listing}: cannot read the split list ({exc.strerror or exc})") from None
    return [line.split()[0] for line in lines if line.strip()]


def class_names(root: Path) -> list[str]:
    """labelmap.txt's names (``name:colour:parts:actions`` lines, '#' comments; background left out),
    else every object name of every XML, sorted."""
    labelmap = root / LABELMAP
    if labelmap.is_file():
        lines = labelmap.read_text(encoding="utf-8-sig").splitlines()
        names = [line.split(":")[0].strip() for line in lines if line.strip() and not line.startswith("#")]
        return [n for n in names if n and n != "background"]
    return object_names(sorted((root / ANNOTATIONS).glob("*.xml")))


def object_names(paths: list[Path]) -> list[str]:
    """Every object name of these XMLs, sorted (VOC's own 20 classes are listed so)."""
    names = set()
    for path, xml in _parse_all(paths):
        names.update(_text(obj, "name", path) for obj in xml.iter("object"))
    return sorted(names)


def is_voc_xml(path: Path) -> bool:
    """An XML file whose first element is VOC's <annotation> (CVAT's annotations.xml starts with
    <annotations>); read up to that element only."""
    try:
        for _, element in ElementTree.iterparse(path, events=("start",)):
            return element.tag == "annotation"
    except (ElementTree.ParseError, OSError):
        return False
    return False


def voc_xmls(folder: Path, sampled: int | None = None) -> list[Path]:
    """The VOC annotation files in `folder` (not below it), sorted; `sampled`: look at that many XML
    files only and return those that are VOC's (enough to recognise a layout)."""
    xmls = sorted(p for p in folder.glob("*.xml") if p.is_file())
    return [p for p in xmls[:sampled] if is_voc_xml(p)]


def voc_split_to_coco(root: Path, split: str | None, names: list[str]) -> dict[str, Any]:
    """The XMLs of one split as a COCO dict in pixels (file_name relative to JPEGImages/)."""
    paths = [root / ANNOTATIONS / f"{stem}.xml" for stem in split_stems(root, split)]
    for path in paths:
        if not path.is_file():
            raise DatasetError(f"{path}: listed in {SPLIT_LISTS}/{split}.txt but not there; re-export")
    return _to_coco(paths, names, f"{LABELMAP} ({', '.join(names)})")


def _to_coco(paths: list[Path], names: list[str], names_source: str) -> dict[str, Any]:
    category_of = {name: i for i, name in enumerate(names)}
    images, annotations = [], []
    for image_id, (path, xml) in enumerate(_parse_all(paths), start=1):
        size = xml.find("size")
        width, height = (
            (int(_number(size, "width", path)), int(_number(size, "height", path)))
            if size is not None
            else (None, None)
        )
        file_name = xml.findtext("filename") or f"{path.stem}.jpg"
        images.append({"id": image_id, "file_name": file_name.strip(), "width": width, "height": height})
        for obj in xml.iter("object"):
            name = _text(obj, "name", path)
            if name not in category_of:
                raise DatasetError(f"{path}: object {name!r} is not in {names_source}")
            box = obj.find("bndbox")
            if box is None:
                raise DatasetError(f"{path}: an object {name!r} has no <bndbox>")
            x1, y1, x2, y2 = (_number(box, tag, path) for tag in ("xmin", "ymin", "xmax", "ymax"))
            xywh = [x1 - 1, y1 - 1, x2 - x1 + 1, y2 - y1 + 1]
            difficult = (obj.findtext("difficult") or "0").strip() == "1"
            annotations.append(
                annotation_record(len(annotations) + 1, image_id, category_of[name], xywh, crowd=difficult)
            )
    categories = [{"id": i, "name": n} for i, n in enumerate(names)]
    return {"images": images, "annotations": annotations, "categories": categories}


def load_voc(root: Path, split: str | None, *, policy: ValidationPolicy | None = None) -> AnnotationSet:
    """Validated annotations of one VOC split (None: every XML of Annotations/)."""
    coco = voc_split_to_coco(root, split, class_names(root))
    source = f"{root / SPLIT_LISTS / f'{split}.txt'}" if split else str(root / ANNOTATIONS)
    images = root / IMAGES
    records, categories, report = validate_coco_dict(coco, images, source=source, policy=policy)
    return AnnotationSet(records, categories, images, source, report)


def load_voc_beside(
    folder: Path, names: list[str], *, policy: ValidationPolicy | None = None
) -> AnnotationSet:
    """Validated annotations of a folder holding each image's VOC XML beside it (labelImg's default,
    Roboflow's "Pascal VOC" export); `names`: the classes of the whole export, so that every split
    numbers them alike."""
    coco = _to_coco(voc_xmls(folder), names, f"the export's classes ({', '.join(names)})")
    records, categories, report = validate_coco_dict(coco, folder, source=str(folder), policy=policy)
    return AnnotationSet(records, categories, folder, str(folder), report)
