"""What Frigate's own post-processing of D-FINE drops: objects our graph reports that Frigate does not.

    python benchmarks/frigate_nms_cost.py --frigate ../frigate --model runs/quickstart/export \
        --data runs/quickstart/data/val

D-FINE needs no NMS, but Frigate's `post_process_dfine` (frigate/util/model.py) runs OpenCV's
`cv2.dnn.NMSBoxes` on the graph's output, across classes, at IoU 0.4, on boxes given as (x1, y1, x2,
y2) where OpenCV reads (x, y, width, height). This script runs `model.onnx` of an export on each image
of --data (a COCO folder: images and annotations.json) as Frigate feeds it (the image resized to the
model's size, RGB, /255, sizes as (height, width)) and passes the outputs to Frigate's own function,
imported from the Frigate checkout at --frigate (a clone of github.com/blakeblackshear/frigate:
nothing of Frigate is kept in this repository). It prints the detections above Frigate's score
threshold (0.4) before and after, and the annotated objects found (a detection of their class at
IoU >= 0.5, one each) before and after: the objects Frigate's step loses, and on how many images our
own redoing of that step (dfine_deploy/export/frigate_post.py `detector_rows`, which frigate.yml's
filters are chosen through) gives Frigate's rows exactly. Needs Frigate's light imports only (numpy,
cv2, onnxruntime).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path

import cv2
import numpy as np

from dfine_deploy.export.frigate_post import detector_rows
from dfine_deploy.images import read_image

FRIGATE_SCORE = 0.4  # the threshold post_process_dfine applies before its NMS
MATCH_IOU = 0.5


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of box `a` against each row of `b`, corners (x1, y1, x2, y2)."""
    w = np.clip(np.minimum(a[2], b[:, 2]) - np.maximum(a[0], b[:, 0]), 0, None)
    h = np.clip(np.minimum(a[3], b[:, 3]) - np.maximum(a[1], b[:, 1]), 0, None)
    inter = w * h
    area = (a[2] - a[0]) * (a[3] - a[1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    return inter / np.maximum(area - inter, 1e-9)


def found(
    truth: list[tuple[int, np.ndarray]], labels: np.ndarray, boxes: np.ndarray, scores: np.ndarray
) -> int:
    """Annotated objects matched by a detection of their class at IoU >= 0.5, best scores first."""
    free = np.ones(len(boxes), bool)
    hits = 0
    for label, box in truth:
        for i in np.argsort(-scores):
            if free[i] and labels[i] == label and _iou(box, boxes[i : i + 1])[0] >= MATCH_IOU:
                free[i] = False
                hits += 1
                break
    return hits


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--frigate", type=Path, required=True, help="a checkout of Frigate's repository")
    p.add_argument("--model", type=Path, required=True, help="an export folder (its model.onnx is run)")
    p.add_argument("--data", type=Path, required=True, help="a folder of images")
    args = p.parse_args()
    if not (args.frigate / "frigate" / "util" / "model.py").is_file():
        p.error(f"--frigate {args.frigate}: no frigate/util/model.py there; give a clone of Frigate")
    sys.path.insert(0, str(args.frigate))
    post_process_dfine = importlib.import_module("frigate.util.model").post_process_dfine

    import onnxruntime as ort

    session = ort.InferenceSession(str(args.model / "model.onnx"), providers=["CPUExecutionProvider"])
    height, width = session.get_inputs()[0].shape[2:]
    coco = json.loads((args.data / "annotations.json").read_text())
    index = {c["id"]: i for i, c in enumerate(sorted(coco["categories"], key=lambda c: c["id"]))}
    truth: dict[int, list[tuple[int, np.ndarray]]] = {image["id"]: [] for image in coco["images"]}
    for ann in coco["annotations"]:
        x, y, w, h = ann["bbox"]
        truth[ann["image_id"]].append((index[ann["category_id"]], np.array([x, y, x + w, y + h], np.float32)))
    counts = dict.fromkeys(("objects", "graph", "frigate", "found_graph", "found_frigate", "same_rows"), 0)
    for image in coco["images"]:
        scale = np.array([width / image["width"], height / image["height"]] * 2, np.float32)
        objects = [(label, box * scale) for label, box in truth[image["id"]]]
        rgb = cv2.resize(read_image(args.data / image["file_name"]), (width, height))
        tensor = (rgb.transpose(2, 0, 1)[None] / 255.0).astype(np.float32)
        sizes = np.array([[height, width]], np.int64)
        labels, boxes, scores = [
            o[0] for o in session.run(None, {"images": tensor, "orig_target_sizes": sizes})
        ]
        above = scores > FRIGATE_SCORE
        rows = post_process_dfine([labels, boxes, scores], width, height)
        counts["same_rows"] += int(np.array_equal(rows, detector_rows(labels, boxes, scores, width, height)))
        rows = rows[rows[:, 1] > 0]  # (class, score, y1, x1, y2, x2), divided by (h, w, h, w)
        kept = rows[:, [3, 2, 5, 4]] * np.array([height, width, height, width], np.float32)
        counts["objects"] += len(objects)
        counts["graph"] += int(above.sum())
        counts["frigate"] += len(rows)
        counts["found_graph"] += found(objects, labels[above], boxes[above], scores[above])
        counts["found_frigate"] += found(objects, rows[:, 0].astype(int), kept, rows[:, 1])
    c = counts
    lost = c["found_graph"] - c["found_frigate"]
    print(
        f"{len(coco['images'])} images at {width}x{height}, {c['objects']} annotated objects\n"
        f"detections above {FRIGATE_SCORE}: graph {c['graph']}, "
        f"after Frigate's post_process_dfine {c['frigate']}\n"
        f"objects found (class, IoU >= {MATCH_IOU}): graph {c['found_graph']}, "
        f"after Frigate {c['found_frigate']}: "
        f"Frigate loses {lost} ({100 * lost / max(c['found_graph'], 1):.1f} % of those found)\n"
        f"frigate_post.detector_rows gives Frigate's rows exactly on {c['same_rows']} of "
        f"{len(coco['images'])} images"
    )


if __name__ == "__main__":
    main()
