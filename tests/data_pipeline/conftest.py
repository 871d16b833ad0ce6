"""Small COCO folders written on the fly: a few tiny JPEGs and an annotations dict to edit."""

from __future__ import annotations

import json
from pathlib import Path

import cv2
import numpy as np
import pytest


def write_jpeg(path: Path, width: int, height: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), pixels)
    return path


def coco_dict(
    sizes: list[tuple[int, int]], boxes: dict[int, list[tuple[list[float], int]]], categories=None
) -> dict:
    """images 1..n of the given (w, h), annotations {image_id: [(xywh, category_id), ...]}."""
    images = [
        {"id": i + 1, "file_name": f"img{i + 1}.jpg", "width": w, "height": h}
        for i, (w, h) in enumerate(sizes)
    ]
    annotations = []
    for image_id, items in boxes.items():
        for bbox, cat in items:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": cat,
                    "bbox": list(bbox),
                    "area": float(bbox[2] * bbox[3]) if len(bbox) == 4 else 0.0,
                    "iscrowd": 0,
                }
            )
    categories = categories or [{"id": 1, "name": "cat"}, {"id": 3, "name": "dog"}]
    return {"images": images, "annotations": annotations, "categories": categories}


class CocoFolder:
    """A folder with images and annotations.json; `data` may be edited, then `write()`."""

    def __init__(self, root: Path, data: dict):
        self.root = root
        self.data = data
        for i, img in enumerate(data["images"]):
            write_jpeg(root / img["file_name"], img["width"], img["height"], seed=i)
        self.write()

    @property
    def ann_file(self) -> Path:
        return self.root / "annotations.json"

    def write(self) -> Path:
        self.ann_file.write_text(json.dumps(self.data))
        return self.ann_file


@pytest.fixture
def small_coco(tmp_path: Path) -> CocoFolder:
    """3 images (64x48, 80x60, 64x64), categories 1 'cat' and 3 'dog', four boxes."""
    data = coco_dict(
        [(64, 48), (80, 60), (64, 64)],
        {1: [([4, 5, 20, 10], 1), ([30, 10, 12, 30], 3)], 2: [([0, 0, 80, 60], 3)], 3: [([10, 10, 5, 5], 1)]},
    )
    return CocoFolder(tmp_path / "coco", data)


@pytest.fixture
def jpeg_writer():
    """`write_jpeg(path, width, height, seed=0)` for tests that build their own folders."""
    return write_jpeg
