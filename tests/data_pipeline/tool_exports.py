"""One plain COCO split written again as each labelling tool exports it, after the tools' documented
layouts (the versions are named in docs/train.md): what a user downloads and points our commands at.

Each writer takes a COCO split folder (images + annotations.json, category id k = class k) and an
output folder, and returns (export root, the annotation file a user would name). Category ids,
their order, image ids from 0, renamed image files and extra keys follow each tool, so that every
reader has to undo them; the boxes stay the same pixels.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path


def _source(src: Path) -> tuple[dict, list[dict]]:
    data = json.loads((src / "annotations.json").read_text())
    return data, sorted(data["categories"], key=lambda c: c["name"])  # tools list names alphabetically


def _tag(name: str) -> str:
    return hashlib.sha1(name.encode()).hexdigest()[:8]


def _boxes_of(data: dict, image_id: int) -> list[dict]:
    return [a for a in data["annotations"] if a["image_id"] == image_id]


def roboflow_coco(src: Path, out: Path) -> tuple[Path, Path]:
    """Roboflow "COCO JSON": train/ valid/ test/, each `_annotations.coco.json` beside images named
    `<stem>_jpg.rf.<hash>.jpg`; category 0 the project name, the supercategory of the classes 1..K."""
    data, by_name = _source(src)
    project = "shapes-x1y2"
    categories = [{"id": 0, "name": project, "supercategory": "none"}]
    categories += [{"id": i + 1, "name": c["name"], "supercategory": project} for i, c in enumerate(by_name)]
    new_id = {c["id"]: i + 1 for i, c in enumerate(by_name)}
    for split in ("train", "valid"):
        folder = out / split
        folder.mkdir(parents=True)
        images, annotations = [], []
        for index, image in enumerate(data["images"]):
            stem = Path(image["file_name"]).stem
            name = f"{stem}_jpg.rf.{_tag(split + stem)}{_tag(stem)}.jpg"
            shutil.copyfile(src / image["file_name"], folder / name)
            images.append(
                {
                    "id": index,
                    "license": 1,
                    "file_name": name,
                    "height": image["height"],
                    "width": image["width"],
                    "date_captured": "2024-05-01T10:00:00+00:00",
                }
            )
            for a in _boxes_of(data, image["id"]):
                annotations.append(
                    {
                        "id": len(annotations),
                        "image_id": index,
                        "category_id": new_id[a["category_id"]],
                        "bbox": a["bbox"],
                        "area": a["bbox"][2] * a["bbox"][3],
                        "segmentation": [],
                        "iscrowd": 0,
                    }
                )
        coco = {
            "info": {"year": "2024", "version": "1", "description": "Exported from roboflow.com"},
            "licenses": [
                {"id": 1, "url": "https://creativecommons.org/licenses/by/4.0/", "name": "CC BY 4.0"}
            ],
            "categories": categories,
            "images": images,
            "annotations": annotations,
        }
        (folder / "_annotations.coco.json").write_text(json.dumps(coco))
    return out, out / "valid" / "_annotations.coco.json"


def _roboflow_splits(src: Path, out: Path, write) -> None:
    """Roboflow's train/ valid/ with renamed images (`<stem>_jpg.rf.<hash>.jpg`); train holds the first
    image only, so its classes are fewer than the export's. `write(split folder, [(image, new name)])`
    writes the split's box list."""
    data, _ = _source(src)
    for split, images in (("train", data["images"][:1]), ("valid", data["images"])):
        (out / split).mkdir(parents=True)
        named = []
        for image in images:
            stem = Path(image["file_name"]).stem
            name = f"{stem}_jpg.rf.{_tag(split + stem)}.jpg"
            shutil.copyfile(src / image["file_name"], out / split / name)
            named.append((image, name))
        write(out / split, named)


def roboflow_csv(src: Path, out: Path) -> tuple[Path, Path]:
    """Roboflow "Tensorflow Object Detection CSV": each split's `_annotations.csv`, one row a box
    (`filename,width,height,class,xmin,ymin,xmax,ymax`, pixel corners); no row for an image without
    boxes, no class list."""
    data, _ = _source(src)
    name_of = {c["id"]: c["name"] for c in data["categories"]}

    def write(folder: Path, named: list) -> None:
        rows = ["filename,width,height,class,xmin,ymin,xmax,ymax"]
        for image, name in named:
            for a in _boxes_of(data, image["id"]):
                x, y, w, h = a["bbox"]
                label = name_of[a["category_id"]]
                rows.append(f"{name},{image['width']},{image['height']},{label},{x},{y},{x + w},{y + h}")
        (folder / "_annotations.csv").write_text("\n".join(rows) + "\n")

    _roboflow_splits(src, out, write)
    return out, out / "valid" / "_annotations.csv"


def roboflow_createml(src: Path, out: Path) -> tuple[Path, Path]:
    """Roboflow "CreateML JSON": each split's `_annotations.createml.json`, a list of images, each box
    its label and centre x y, width, height in pixels (Apple's Create ML object detection layout)."""
    data, _ = _source(src)
    name_of = {c["id"]: c["name"] for c in data["categories"]}

    def write(folder: Path, named: list) -> None:
        items = []
        for image, name in named:
            boxes = []
            for a in _boxes_of(data, image["id"]):
                x, y, w, h = a["bbox"]
                centre = {"x": x + w / 2, "y": y + h / 2, "width": w, "height": h}
                boxes.append({"label": name_of[a["category_id"]], "coordinates": centre})
            items.append({"image": name, "annotations": boxes})
        (folder / "_annotations.createml.json").write_text(json.dumps(items))

    _roboflow_splits(src, out, write)
    return out, out / "valid" / "_annotations.createml.json"


def cvat_coco(src: Path, out: Path) -> tuple[Path, Path]:
    """CVAT "COCO 1.0" (task export with images): annotations/instances_default.json + images/,
    categories 1..K in the task's label order, `attributes` on each box."""
    data, _ = _source(src)
    (out / "annotations").mkdir(parents=True)
    (out / "images").mkdir()
    labels = list(reversed(data["categories"]))  # a task's own order, not the model's
    new_id = {c["id"]: i + 1 for i, c in enumerate(labels)}
    images, annotations = [], []
    for image in data["images"]:
        shutil.copyfile(src / image["file_name"], out / "images" / image["file_name"])
        images.append(dict(image, license=0, flickr_url="", coco_url="", date_captured=0))
        for a in _boxes_of(data, image["id"]):
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image["id"],
                    "category_id": new_id[a["category_id"]],
                    "segmentation": [],
                    "area": a["bbox"][2] * a["bbox"][3],
                    "bbox": a["bbox"],
                    "iscrowd": 0,
                    "attributes": {"occluded": False, "rotation": 0.0},
                }
            )
    coco = {
        "licenses": [{"name": "", "id": 0, "url": ""}],
        "info": {
            "contributor": "",
            "date_created": "",
            "description": "",
            "url": "",
            "version": "",
            "year": "",
        },
        "categories": [{"id": new_id[c["id"]], "name": c["name"], "supercategory": ""} for c in labels],
        "images": images,
        "annotations": annotations,
    }
    ann = out / "annotations" / "instances_default.json"
    ann.write_text(json.dumps(coco))
    return out, ann


def cvat_xml(src: Path, out: Path) -> tuple[Path, Path]:
    """CVAT "CVAT for images 1.1" (task export with images): annotations.xml (version, meta with the
    task's labels in its own order, one <image> per frame with ids from 0) + images/; corners to two
    decimals, as CVAT writes them. One box is written as a polygon of its four corners and one as
    a box turned by 90 degrees about its centre (width and height swapped), which hold the same
    upright box; a polyline and a tag are no boxes and are left out."""
    data, _ = _source(src)
    (out / "images").mkdir(parents=True)
    labels = list(reversed(data["categories"]))
    name_of = {c["id"]: c["name"] for c in labels}
    meta_labels = "".join(
        f"<label><name>{c['name']}</name><color>#aa0000</color><type>any</type></label>" for c in labels
    )
    frames = []
    for index, image in enumerate(data["images"]):
        shutil.copyfile(src / image["file_name"], out / "images" / image["file_name"])
        shapes = []
        for n, a in enumerate(_boxes_of(data, image["id"])):
            x, y, w, h = a["bbox"]
            common = f'label="{name_of[a["category_id"]]}" source="manual" occluded="0"'
            if index == 0 and n == 0:
                corners = [(x, y), (x + w, y), (x + w, y + h), (x, y + h)]
                points = ";".join(f"{px:.2f},{py:.2f}" for px, py in corners)
                shapes.append(f'<polygon {common} points="{points}" z_order="0"></polygon>')
            elif index == 1 and n == 0:
                cx, cy = x + w / 2, y + h / 2
                turned = (cx - h / 2, cy - w / 2, cx + h / 2, cy + w / 2)
                corners = 'xtl="{:.2f}" ytl="{:.2f}" xbr="{:.2f}" ybr="{:.2f}"'.format(*turned)
                shapes.append(f'<box {common} {corners} rotation="90.00" z_order="0"></box>')
            else:
                shapes.append(
                    f'<box {common} xtl="{x:.2f}" ytl="{y:.2f}" xbr="{x + w:.2f}" ybr="{y + h:.2f}" '
                    'z_order="0"><attribute name="truncated">false</attribute></box>'
                )
        if index == 2:
            shapes.append(
                f'<polyline label="{labels[0]["name"]}" source="manual" occluded="0" points="1,1;5,5" '
                'z_order="0"></polyline>'
            )
            shapes.append(f'<tag label="{labels[1]["name"]}" source="manual"></tag>')
        frames.append(
            f'<image id="{index}" name="{image["file_name"]}" width="{image["width"]}" '
            f'height="{image["height"]}">{"".join(shapes)}</image>'
        )
    xml = (
        '<?xml version="1.0" encoding="utf-8"?>\n<annotations><version>1.1</version><meta><task><id>7</id>'
        f"<name>shapes</name><size>{len(frames)}</size><mode>annotation</mode><overlap>0</overlap>"
        f"<labels>{meta_labels}</labels></task><dumped>2024-05-01 10:00:00+00:00</dumped></meta>"
        f"{''.join(frames)}</annotations>"
    )
    (out / "annotations.xml").write_text(xml)
    return out, out / "annotations.xml"


def cvat_yolo(src: Path, out: Path) -> tuple[Path, Path]:
    """CVAT "YOLO 1.1" (Darknet, with images): obj.names (the task's labels), obj.data naming it and
    train.txt, obj_train_data/ holding each image and its label file; paths under Darknet's data/."""
    data, _ = _source(src)
    labels = list(reversed(data["categories"]))
    class_of = {c["id"]: i for i, c in enumerate(labels)}
    (out / "obj_train_data").mkdir(parents=True)
    listed = []
    for image in data["images"]:
        shutil.copyfile(src / image["file_name"], out / "obj_train_data" / image["file_name"])
        label = (out / "obj_train_data" / image["file_name"]).with_suffix(".txt")
        label.write_text(_yolo_lines(data, image, class_of))
        listed.append(f"data/obj_train_data/{image['file_name']}\n")
    (out / "obj.names").write_text("".join(f"{c['name']}\n" for c in labels))
    (out / "obj.data").write_text(
        f"classes = {len(labels)}\ntrain = data/train.txt\nnames = data/obj.names\nbackup = backup/\n"
    )
    (out / "train.txt").write_text("".join(listed))
    return out, out / "obj.data"


def label_studio_coco(src: Path, out: Path) -> tuple[Path, Path]:
    """Label Studio "COCO" (label_studio_sdk converter): result.json, file_name `images/<hash>-<name>`,
    categories 0..K-1 alphabetically, image and annotation ids from 0."""
    data, by_name = _source(src)
    (out / "images").mkdir(parents=True)
    new_id = {c["id"]: i for i, c in enumerate(by_name)}
    images, annotations = [], []
    for index, image in enumerate(data["images"]):
        name = f"images/{_tag(image['file_name'])}-{image['file_name']}"
        shutil.copyfile(src / image["file_name"], out / name)
        images.append({"width": image["width"], "height": image["height"], "id": index, "file_name": name})
        for a in _boxes_of(data, image["id"]):
            annotations.append(
                {
                    "id": len(annotations),
                    "image_id": index,
                    "category_id": new_id[a["category_id"]],
                    "segmentation": [],
                    "bbox": a["bbox"],
                    "ignore": 0,
                    "iscrowd": 0,
                    "area": a["bbox"][2] * a["bbox"][3],
                }
            )
    coco = {
        "images": images,
        "categories": [{"id": i, "name": c["name"]} for i, c in enumerate(by_name)],
        "annotations": annotations,
        "info": {"year": 2024, "version": "1.0", "description": "", "contributor": "Label Studio", "url": ""},
    }
    (out / "result.json").write_text(json.dumps(coco, indent=2))
    return out, out / "result.json"


def _yolo_lines(data: dict, image: dict, class_of: dict[int, int]) -> str:
    lines = []
    for a in _boxes_of(data, image["id"]):
        x, y, w, h = a["bbox"]
        W, H = image["width"], image["height"]
        lines.append(f"{class_of[a['category_id']]} {(x + w / 2) / W} {(y + h / 2) / H} {w / W} {h / H}")
    return "\n".join(lines) + ("\n" if lines else "")


def label_studio_yolo(src: Path, out: Path) -> tuple[Path, Path]:
    """Label Studio "YOLO": classes.txt (alphabetical), notes.json, images/, labels/; no data.yaml."""
    data, by_name = _source(src)
    (out / "images").mkdir(parents=True)
    (out / "labels").mkdir()
    class_of = {c["id"]: i for i, c in enumerate(by_name)}
    for image in data["images"]:
        name = f"{_tag(image['file_name'])}-{image['file_name']}"
        shutil.copyfile(src / image["file_name"], out / "images" / name)
        (out / "labels" / Path(name).with_suffix(".txt")).write_text(_yolo_lines(data, image, class_of))
    (out / "classes.txt").write_text("".join(f"{c['name']}\n" for c in by_name))
    notes = {"categories": [{"id": i, "name": c["name"]} for i, c in enumerate(by_name)], "info": {}}
    (out / "notes.json").write_text(json.dumps(notes))
    return out, out / "classes.txt"


def labelimg_yolo(src: Path, out: Path) -> tuple[Path, Path]:
    """labelImg in YOLO mode: `<stem>.txt` beside each image in the folder it was opened on, and
    classes.txt there, in the order the classes were first used (not alphabetical)."""
    data, by_name = _source(src)
    out.mkdir(parents=True)
    order = list(reversed(by_name))
    class_of = {c["id"]: i for i, c in enumerate(order)}
    for image in data["images"]:
        shutil.copyfile(src / image["file_name"], out / image["file_name"])
        (out / Path(image["file_name"]).with_suffix(".txt")).write_text(_yolo_lines(data, image, class_of))
    (out / "classes.txt").write_text("".join(f"{c['name']}\n" for c in order))
    return out, out / "classes.txt"


def roboflow_darknet(src: Path, out: Path) -> tuple[Path, Path]:
    """Roboflow "YOLO Darknet": train/ valid/, each with its images (`<stem>_jpg.rf.<hash>.jpg`), each
    image's `.txt` beside it and `_darknet.labels` (the class list, alphabetical); no data.yaml."""
    data, by_name = _source(src)
    class_of = {c["id"]: i for i, c in enumerate(by_name)}
    for split in ("train", "valid"):
        (out / split).mkdir(parents=True)
        for image in data["images"]:
            stem = Path(image["file_name"]).stem
            name = f"{stem}_jpg.rf.{_tag(split + stem)}.jpg"
            shutil.copyfile(src / image["file_name"], out / split / name)
            (out / split / f"{Path(name).stem}.txt").write_text(_yolo_lines(data, image, class_of))
        (out / split / "_darknet.labels").write_text("".join(f"{c['name']}\n" for c in by_name))
    return out, out / "valid" / "_darknet.labels"


def roboflow_yolo(src: Path, out: Path) -> tuple[Path, Path]:
    """Roboflow "YOLOv8" (Ultralytics layout): data.yaml with `val: ../valid/images` (read from the
    root as Ultralytics does), train/ valid/ each with images/ and labels/, names alphabetical."""
    data, by_name = _source(src)
    class_of = {c["id"]: i for i, c in enumerate(by_name)}
    for split in ("train", "valid"):
        (out / split / "images").mkdir(parents=True)
        (out / split / "labels").mkdir()
        for image in data["images"]:
            stem = Path(image["file_name"]).stem
            name = f"{stem}_jpg.rf.{_tag(split + stem)}.jpg"
            shutil.copyfile(src / image["file_name"], out / split / "images" / name)
            (out / split / "labels" / f"{Path(name).stem}.txt").write_text(_yolo_lines(data, image, class_of))
    names = ", ".join(f"'{c['name']}'" for c in by_name)
    (out / "data.yaml").write_text(
        "train: ../train/images\nval: ../valid/images\ntest: ../test/images\n\n"
        f"nc: {len(by_name)}\nnames: [{names}]\n\nroboflow:\n  workspace: demo\n  project: shapes-x1y2\n"
        "  version: 1\n  license: CC BY 4.0\n  url: https://universe.roboflow.com/demo/shapes-x1y2/dataset/1\n"
    )
    return out, out / "data.yaml"


def _voc_xml(data: dict, image: dict, file_name: str, extra: str = "") -> str:
    """One image's VOC annotation: 1-based corners, as VOC2012, CVAT, labelImg and Roboflow write them."""
    name_of = {c["id"]: c["name"] for c in data["categories"]}
    objects = []
    for a in _boxes_of(data, image["id"]):
        x, y, w, h = a["bbox"]
        objects.append(
            f"<object><name>{name_of[a['category_id']]}</name><pose>Unspecified</pose>"
            "<truncated>0</truncated><difficult>0</difficult><bndbox>"
            f"<xmin>{x + 1}</xmin><ymin>{y + 1}</ymin><xmax>{x + w}</xmax><ymax>{y + h}</ymax>"
            "</bndbox></object>"
        )
    return (
        f"<annotation><folder>VOC</folder><filename>{file_name}</filename>{extra}"
        f"<size><width>{image['width']}</width><height>{image['height']}</height><depth>3</depth></size>"
        f"<segmented>0</segmented>{''.join(objects)}</annotation>"
    )


def pascal_voc(src: Path, out: Path) -> tuple[Path, Path]:
    """Pascal VOC (as VOC2012 and CVAT "PASCAL VOC 1.1" lay it out): Annotations/<stem>.xml with
    1-based corners, JPEGImages/, ImageSets/Main/{train,val}.txt, labelmap.txt (CVAT's)."""
    data, by_name = _source(src)
    for folder in ("Annotations", "JPEGImages", "ImageSets/Main"):
        (out / folder).mkdir(parents=True)
    stems = []
    for image in data["images"]:
        stem = Path(image["file_name"]).stem
        stems.append(stem)
        shutil.copyfile(src / image["file_name"], out / "JPEGImages" / image["file_name"])
        (out / "Annotations" / f"{stem}.xml").write_text(_voc_xml(data, image, image["file_name"]))
    for split in ("train", "val"):
        (out / "ImageSets" / "Main" / f"{split}.txt").write_text("".join(f"{s}\n" for s in stems))
    (out / "labelmap.txt").write_text(
        "# label:color_rgb:parts:actions\nbackground:0,0,0::\n"
        + "".join(f"{c['name']}:{40 * i},0,0::\n" for i, c in enumerate(by_name))
    )
    return out, out / "ImageSets" / "Main" / "val.txt"


def roboflow_voc(src: Path, out: Path) -> tuple[Path, Path]:
    """Roboflow "Pascal VOC XML": train/ valid/, each image `<stem>_jpg.rf.<hash>.jpg` with its
    `<stem>_jpg.rf.<hash>.xml` beside it, README.roboflow.txt at the root; no class list. The train
    split holds the first image only, so its classes are fewer than the export's."""
    data, _ = _source(src)
    out.mkdir(parents=True)
    (out / "README.roboflow.txt").write_text("Exported via roboflow.com\n")
    for split, images in (("train", data["images"][:1]), ("valid", data["images"])):
        (out / split).mkdir(parents=True)
        for image in images:
            stem = Path(image["file_name"]).stem
            name = f"{stem}_jpg.rf.{_tag(split + stem)}.jpg"
            shutil.copyfile(src / image["file_name"], out / split / name)
            source = "<source><database>roboflow.ai</database></source>"
            (out / split / f"{Path(name).stem}.xml").write_text(_voc_xml(data, image, name, source))
    first = sorted((out / "valid").glob("*.xml"))[0]
    return out, first


def labelimg(src: Path, out: Path) -> tuple[Path, Path]:
    """labelImg's default save: `<stem>.xml` beside each image in the one folder it was opened on,
    with the image's absolute `path` and `database` Unknown; no class list (classes.txt is YOLO's)."""
    data, _ = _source(src)
    out.mkdir(parents=True)
    for image in data["images"]:
        shutil.copyfile(src / image["file_name"], out / image["file_name"])
        extra = f"<path>{out / image['file_name']}</path><source><database>Unknown</database></source>"
        (out / f"{Path(image['file_name']).stem}.xml").write_text(
            _voc_xml(data, image, image["file_name"], extra)
        )
    return out, sorted(out.glob("*.xml"))[0]


def plain_coco(src: Path, out: Path) -> tuple[Path, Path]:
    """The plain COCO split itself (what `dfine-data synth` writes): the reference."""
    shutil.copytree(src, out)
    return out, out / "annotations.json"


def labelme(src: Path, out: Path) -> tuple[Path, Path]:
    """LabelMe 5: one json per image beside it (shapes of two corner points, imagePath)."""
    data, _ = _source(src)
    out.mkdir(parents=True)
    name_of = {c["id"]: c["name"] for c in data["categories"]}
    for image in data["images"]:
        shutil.copyfile(src / image["file_name"], out / image["file_name"])
        shapes = [
            {
                "label": name_of[a["category_id"]],
                "points": [a["bbox"][:2], [a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]],
            }
            | {"group_id": None, "description": "", "shape_type": "rectangle", "flags": {}}
            for a in _boxes_of(data, image["id"])
        ]
        doc = {"version": "5.4.1", "flags": {}, "shapes": shapes, "imagePath": image["file_name"]}
        doc |= {"imageData": None, "imageHeight": image["height"], "imageWidth": image["width"]}
        (out / Path(image["file_name"]).with_suffix(".json")).write_text(json.dumps(doc))
    return out, out / Path(data["images"][0]["file_name"]).with_suffix(".json")


EXPORTS = {
    "coco": plain_coco,
    "roboflow-coco": roboflow_coco,
    "roboflow-box-list": roboflow_csv,
    "cvat-coco": cvat_coco,
    "cvat-xml": cvat_xml,
    "cvat-yolo": cvat_yolo,
    "label-studio-coco": label_studio_coco,
    "label-studio-yolo": label_studio_yolo,
    "yolo-beside": roboflow_darknet,
    "yolo": roboflow_yolo,
    "voc": pascal_voc,
    "voc-beside": roboflow_voc,
    "labelme": labelme,
}


# Other tools' jsons, in the shapes their exports document, that we refuse by name (the export to
# choose instead): each writer gives (export root, the json a user would name).
def datumaro(src: Path, out: Path) -> tuple[Path, Path]:
    """Datumaro / CVAT "Datumaro 1.0": annotations/default.json (items, categories.label.labels)."""
    data, by_name = _source(src)
    (out / "annotations").mkdir(parents=True)
    label_of = {c["id"]: i for i, c in enumerate(by_name)}
    items = [
        {
            "id": Path(image["file_name"]).stem,
            "annotations": [
                {
                    "id": n,
                    "type": "bbox",
                    "attributes": {},
                    "group": 0,
                    "label_id": label_of[a["category_id"]],
                }
                | {"z_order": 0, "bbox": a["bbox"]}
                for n, a in enumerate(_boxes_of(data, image["id"]))
            ],
            "attr": {"frame": index},
            "image": {"path": image["file_name"], "size": [image["height"], image["width"]]},
        }
        for index, image in enumerate(data["images"])
    ]
    labels = [{"name": c["name"], "parent": "", "attributes": []} for c in by_name]
    doc = {"info": {}, "categories": {"label": {"labels": labels, "attributes": []}}, "items": items}
    (out / "annotations" / "default.json").write_text(json.dumps(doc))
    return out, out / "annotations" / "default.json"


def _label_studio_boxes(data: dict, image: dict) -> list[dict]:
    name_of = {c["id"]: c["name"] for c in data["categories"]}
    W, H = image["width"], image["height"]
    return [
        {"x": 100 * a["bbox"][0] / W, "y": 100 * a["bbox"][1] / H, "width": 100 * a["bbox"][2] / W}
        | {"height": 100 * a["bbox"][3] / H, "rotation": 0, "rectanglelabels": [name_of[a["category_id"]]]}
        | {"original_width": W, "original_height": H}
        for a in _boxes_of(data, image["id"])
    ]


def label_studio_json(src: Path, out: Path) -> tuple[Path, Path]:
    """Label Studio "JSON": a list of tasks, each with data.image and annotations[].result[]."""
    data, _ = _source(src)
    out.mkdir(parents=True)
    tasks = [
        {
            "id": index + 1,
            "annotations": [
                {
                    "id": index + 1,
                    "completed_by": 1,
                    "result": [
                        {"type": "rectanglelabels", "value": v} for v in _label_studio_boxes(data, image)
                    ],
                }
            ],
            "data": {"image": f"/data/upload/1/{_tag(image['file_name'])}-{image['file_name']}"},
        }
        for index, image in enumerate(data["images"])
    ]
    (out / "project-1.json").write_text(json.dumps(tasks))
    return out, out / "project-1.json"


def label_studio_json_min(src: Path, out: Path) -> tuple[Path, Path]:
    """Label Studio "JSON-MIN": a list of flat task objects, the boxes under the control's name."""
    data, _ = _source(src)
    out.mkdir(parents=True)
    tasks = [
        {"image": f"/data/upload/1/{_tag(image['file_name'])}-{image['file_name']}", "id": index + 1}
        | {"label": _label_studio_boxes(data, image), "annotator": 1, "annotation_id": index + 1}
        | {"created_at": "2024-05-01T10:00:00Z", "updated_at": "2024-05-01T10:00:00Z", "lead_time": 3.5}
        for index, image in enumerate(data["images"])
    ]
    (out / "project-1-min.json").write_text(json.dumps(tasks))
    return out, out / "project-1-min.json"


REFUSED = {
    "datumaro": (datumaro, "a Datumaro json", "export the dataset as COCO"),
    "label-studio-json": (label_studio_json, "a Label Studio JSON export", "export 'COCO' or 'YOLO'"),
    "label-studio-json-min": (
        label_studio_json_min,
        "a Label Studio JSON-MIN export",
        "export 'COCO' or 'YOLO'",
    ),
}
