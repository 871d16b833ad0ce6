"""A generated detection dataset, so that the whole pipeline runs without downloads.

Scenes are textured backgrounds (gradients, stripes, blotchy noise, thin clutter lines) with 1-6
objects of four classes: rectangle, ellipse, triangle, ring; of random colour, size, rotation, with
overlap. Later objects occlude earlier ones; a placement that would leave an earlier object less
than `MIN_VISIBLE` visible is re-drawn, so every labelled object is clearly there. Boxes are the
visible extent. The output is a real COCO folder::

    OUT/train/000001.jpg ... OUT/train/annotations.json
    OUT/val/000001.jpg   ... OUT/val/annotations.json

Each split is written whole into a staging folder and swapped in; an existing OUT/<split> is replaced
only when it is a synthetic split of ours (`SPLIT`), so a real dataset there is refused, not mixed.

Deterministic: image i of a split draws from its own generator seeded with (seed, split, i), so the
bytes depend only on the seed (and the first images of a larger set equal a smaller set's).
Calibrated so D-FINE-N learns it on a CPU in minutes while
mAP stays far from 1.

`--dense` writes 1920x1080 scenes of 150-400 objects of 8-24 pixels (or `--dense-size MIN MAX`)
instead, a fifth of them across the seams of the default tiles: the set that measures tiled
detection (dfine-bench --tiles).
"""

from __future__ import annotations

import json
import math
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from dfine_deploy.cores import usable_cores
from dfine_deploy.data.coco import ANNOTATIONS_NAME, split_claim
from dfine_deploy.data.shapes import CLASS_NAMES
from dfine_deploy.errors import DatasetError
from dfine_deploy.files import atomic_write_bytes
from dfine_deploy.memory import check_memory
from dfine_deploy.ownership import Claim, claim_folder, replacing

MIN_VISIBLE = 0.4  # fraction of an object's pixels that must stay visible after later objects
MAX_OBJECTS = 6
JPEG_QUALITY = 90
SPLIT_IDS = {"train": 0, "val": 1}
DESCRIPTION = "dfine-deploy synthetic shapes"  # how our annotations.json begins its info.description
SPLIT: Claim = split_claim(
    "dfine-data synth", "a synthetic dataset split", DESCRIPTION, patterns=("[0-9]" * 6 + ".jpg",)
)


# float32 RGB image and noise while one image renders (_render); a JPEG of these scenes at
# JPEG_QUALITY takes about 0.55 bytes per pixel, and a quarter byte is the lower bound used
_RENDER_BYTES_PER_PIXEL = 24

DENSE_SIZE = (1920, 1080)  # width, height: a 1080p camera
DENSE_OBJECTS = (150, 400)  # objects per scene, inclusive
DENSE_EXTENT = (8.0, 24.0)  # object size in pixels (geometric mean of its sides before rotation)
DENSE_SIZE_LIMITS = (4, 200)  # what --dense-size accepts: a few pixels up to a crowd that still fits
DENSE_ON_SEAMS = 0.2  # share of objects centred on a seam of the default tiles (dfine_deploy/tiles.py)
DENSE_GAP = 3  # pixels kept free between two objects' boxes


@dataclass(frozen=True)
class SyntheticSpec:
    """What to generate; `size` is the square image side in pixels. `dense`: 1920x1080 scenes of
    150-400 small objects instead (`_render_dense`; `size` is not used), of `dense_size` pixels."""

    images: int
    seed: int = 0
    size: int = 320
    val_images: int | None = None  # None: a fifth of `images`, at least 1
    dense: bool = False
    dense_size: tuple[float, float] = DENSE_EXTENT  # smallest, largest object

    def __post_init__(self) -> None:
        if self.images < 1:
            raise DatasetError(f"synthetic dataset: --images must be at least 1, got {self.images}")
        if self.size < 64:
            raise DatasetError(f"synthetic dataset: --size must be at least 64 pixels, got {self.size}")
        if self.val_images is not None and self.val_images < 0:
            raise DatasetError(f"synthetic dataset: --val-images must be >= 0, got {self.val_images}")
        low, high = self.dense_size
        if not DENSE_SIZE_LIMITS[0] <= low <= high <= DENSE_SIZE_LIMITS[1]:
            raise DatasetError(
                f"synthetic dataset: --dense-size {low:g} {high:g}: give MIN MAX pixels with "
                f"{DENSE_SIZE_LIMITS[0]} <= MIN <= MAX <= {DENSE_SIZE_LIMITS[1]}, e.g. 8 24"
            )

    @property
    def n_val(self) -> int:
        return self.val_images if self.val_images is not None else max(1, self.images // 5)

    def memory_bytes(self, workers: int) -> int:
        """A lower bound of what `generate` holds at once: each worker's float32 image and noise, and
        the encoded JPEGs of the larger split, which are kept until the split is written whole."""
        pixels = DENSE_SIZE[0] * DENSE_SIZE[1] if self.dense else self.size * self.size
        return workers * _RENDER_BYTES_PER_PIXEL * pixels + max(self.images, self.n_val) * pixels // 4


# ---------------------------------------------------------------------------- backgrounds


def _background(rng: np.random.Generator, size: int, noise: np.ndarray) -> np.ndarray:
    """A textured [H, W, 3] float32 background in 0..255 (the shape of `noise`, unit variance;
    `size` is W, the side of a square scene).

    Built channel-first ([3, H, W]) because broadcasting over a last axis of 3 is slow in numpy.
    """
    height, width = noise.shape[:2]
    yy = (np.arange(height, dtype=np.float32) / width)[:, None]  # broadcast to [H, W]
    xx = (np.arange(width, dtype=np.float32) / width)[None, :]
    c1, c2, c3 = rng.uniform(0, 255, (3, 3, 1, 1)).astype(np.float32)  # [3, 1, 1] each
    angle = rng.uniform(0, 2 * math.pi)
    ramp = xx * math.cos(angle) + yy * math.sin(angle)  # [S, S]
    ramp = (ramp - ramp.min()) / max(float(np.ptp(ramp)), 1e-6)
    planes = c1 + ramp * (c2 - c1)  # [3, S, S] gradient

    weights = rng.dirichlet([1.0, 1.0, 1.0])  # how much stripes / blotches / fine noise
    freq = rng.uniform(2, 14)
    beta = rng.uniform(0, math.pi)
    stripes = np.sin(2 * math.pi * freq * (xx * math.cos(beta) + yy * math.sin(beta)) + rng.uniform(0, 6.3))
    planes += (weights[0] * 120.0 * stripes) * (c3 / 255.0 - 0.5)
    image = np.ascontiguousarray(planes.transpose(1, 2, 0))  # [S, S, 3]

    cells = int(rng.integers(4, 24))
    coarse = rng.standard_normal((cells, cells, 3), dtype=np.float32)
    blotches = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_LINEAR)
    # cv2.scaleAdd: image = a * x + image in one pass (numpy would take three)
    cv2.scaleAdd(blotches, float(weights[1] * 70.0), image, dst=image)
    cv2.scaleAdd(noise, float(weights[2] * 25.0), image, dst=image)

    for _ in range(int(rng.integers(0, 6))):  # thin clutter lines: edges that are not objects
        p1 = tuple(int(v) for v in rng.integers(0, (width, height)))
        p2 = tuple(int(v) for v in rng.integers(0, (width, height)))
        colour = tuple(float(v) for v in rng.uniform(0, 255, 3))
        cv2.line(image, p1, p2, colour, int(rng.integers(1, 3)), cv2.LINE_AA)
    return image


# ---------------------------------------------------------------------------- objects


def _shape_mask(rng: np.random.Generator, cls: int, size: int) -> np.ndarray:
    """Draw one object of class `cls` at a random place as a [S, S] uint8 mask (0/1)."""
    mask = np.zeros((size, size), np.uint8)
    extent = float(np.exp(rng.uniform(math.log(0.08 * size), math.log(0.42 * size))))  # log-uniform
    aspect = float(np.exp(rng.uniform(-0.5, 0.5)))
    w, h = extent * math.sqrt(aspect), extent / math.sqrt(aspect)
    margin = 0.35 * max(w, h)  # up to ~15 % of an object may leave the frame
    cx = rng.uniform(margin, size - margin)
    cy = rng.uniform(margin, size - margin)
    angle = float(rng.uniform(-35, 35))
    _draw_shape(rng, mask, CLASS_NAMES[cls], (cx, cy, w, h, extent), angle)
    return mask


def _draw_shape(
    rng: np.random.Generator,
    mask: np.ndarray,
    name: str,
    place: tuple[float, float, float, float, float],
    angle: float,
) -> None:
    """Fill one object of class `name` into `mask`; `place` is (cx, cy, w, h, extent): its centre, its
    size before rotation and the geometric mean of that size."""
    cx, cy, w, h, extent = place
    if name == "rectangle":
        corners = cv2.boxPoints(((cx, cy), (w, h), angle))
        cv2.fillPoly(mask, [np.round(corners).astype(np.int32)], 1)
    elif name == "ellipse":
        cv2.ellipse(mask, (round(cx), round(cy)), (round(w / 2), round(h / 2)), angle, 0, 360, 1, -1)
    elif name == "triangle":
        base = rng.uniform(0, 2 * math.pi)
        spread = rng.uniform(0.7, 1.3, 3) * (2 * math.pi / 3)
        thetas = base + np.cumsum(spread) - spread[0]
        pts = np.stack([cx + w / 2 * np.cos(thetas), cy + h / 2 * np.sin(thetas)], axis=1)  # [3, 2]
        cv2.fillPoly(mask, [np.round(pts).astype(np.int32)], 1)
    else:  # ring: a thick elliptic outline, kept roughly round so it reads as a ring
        r = extent / 2
        ry = r * float(rng.uniform(0.8, 1.0))
        thickness = max(2, round(r * float(rng.uniform(0.2, 0.4))))
        cv2.ellipse(
            mask,
            (round(cx), round(cy)),
            (round(r - thickness / 2), round(ry - thickness / 2)),
            angle,
            0,
            360,
            1,
            thickness,
        )


def _object_colour(rng: np.random.Generator, background_mean: np.ndarray) -> np.ndarray:
    """A random colour that differs enough from the local background to be seen."""
    for _ in range(20):
        colour = rng.uniform(0, 255, 3).astype(np.float32)
        if np.abs(colour - background_mean).mean() > 45:
            return colour
    return 255.0 - background_mean


def _render(rng: np.random.Generator, size: int) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One scene: uint8 BGR image and its objects (category_id, visible bbox, visible area).

    Mask work is done inside each new object's bounding rectangle; that is what keeps 400 images
    within seconds.
    """
    # uniform noise of unit variance: four times cheaper to draw than a normal, looks the same
    noise = (rng.random((size, size, 3), dtype=np.float32) - 0.5) * math.sqrt(12.0)
    image = _background(rng, size, noise)
    visible: list[np.ndarray] = []  # [S, S] uint8 0/1 per placed object
    full_area: list[int] = []
    visible_area: list[int] = []
    classes: list[int] = []
    for _ in range(int(rng.integers(1, MAX_OBJECTS + 1))):
        cls = int(rng.integers(len(CLASS_NAMES)))
        for _attempt in range(10):
            mask = _shape_mask(rng, cls, size)
            x, y, w, h = cv2.boundingRect(mask)
            area = cv2.countNonZero(mask[y : y + h, x : x + w]) if w and h else 0
            if area < 40:
                continue
            crop = mask[y : y + h, x : x + w]
            lost = [cv2.countNonZero(v[y : y + h, x : x + w] & crop) for v in visible]
            if all(va - lo >= MIN_VISIBLE * fa for va, lo, fa in zip(visible_area, lost, full_area)):
                break
        else:
            continue  # no placement keeps the others visible: leave this object out
        for v in visible:
            v[y : y + h, x : x + w] &= 1 - crop
        visible_area = [va - lo for va, lo in zip(visible_area, lost)]
        visible.append(mask)
        full_area.append(area)
        visible_area.append(area)
        classes.append(cls)
        region = image[y : y + h, x : x + w]  # [h, w, 3] view
        inside = crop.astype(bool)
        colour = _object_colour(rng, region[inside].mean(axis=0))
        ramp = 1.0 + 0.25 * rng.uniform(-1, 1) * (np.arange(w, dtype=np.float32) - w / 2) / max(size * 0.5, 1)
        shaded = np.clip(colour[None, None, :] * ramp[None, :, None], 0, 255)  # [1, w, 3] soft light
        region[inside] = np.broadcast_to(shaded, (h, w, 3))[inside]

    image = cv2.GaussianBlur(image, (3, 3), 0.7)
    cv2.scaleAdd(noise, 3.0, image, dst=image)  # sensor noise, on objects too
    pixels = np.clip(np.round(image), 0, 255).astype(np.uint8)

    objects = []
    for cls, vis, area in zip(classes, visible, visible_area):
        x, y, w, h = cv2.boundingRect(vis)
        objects.append({"category_id": cls, "bbox": [x, y, w, h], "area": int(area)})
    return pixels, objects


def _render_file(
    seed: int, split: str, index: int, size: int, dense: tuple[float, float] | None = None
) -> tuple[bytes, list[dict[str, Any]]]:
    """`dense`: None for a square scene of `size`, else a dense scene's object size range."""
    rng = np.random.default_rng([seed, SPLIT_IDS[split], index])
    pixels, objects = _render(rng, size) if dense is None else _render_dense(rng, dense)
    ok, encoded = cv2.imencode(".jpg", pixels, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise DatasetError("OpenCV could not encode a JPEG; is opencv-python-headless installed correctly?")
    return encoded.tobytes(), objects


def write_split(
    out: str | os.PathLike,
    split: str,
    count: int,
    *,
    seed: int,
    size: int,
    dense: tuple[float, float] | None = None,
) -> Path:
    """Write `count` images and annotations.json as OUT/split, replacing an earlier synthetic split
    whole (a larger run leaves no images behind); returns the json path. `dense`: the object size
    range of dense scenes, None for square ones."""
    target = Path(out) / split
    width, height = (size, size) if dense is None else DENSE_SIZE
    with ThreadPoolExecutor(max_workers=usable_cores()) as pool:
        rendered = list(pool.map(lambda i: _render_file(seed, split, i, size, dense), range(count)))
    with replacing(target, SPLIT, option="--out", error=DatasetError) as staging:
        images, annotations = [], []
        for i, (jpeg, objects) in enumerate(rendered):
            image_id = i + 1
            name = f"{image_id:06d}.jpg"
            (staging / name).write_bytes(jpeg)
            images.append({"id": image_id, "file_name": name, "width": width, "height": height})
            for obj in objects:
                annotations.append({"id": len(annotations) + 1, "image_id": image_id, "iscrowd": 0, **obj})
        coco = {
            "info": {
                "description": f"{DESCRIPTION}{_dense_words(dense)}, seed {seed}, {split}",
                "version": "1",
            },
            "images": images,
            "annotations": annotations,
            "categories": [{"id": i, "name": n, "supercategory": "shape"} for i, n in enumerate(CLASS_NAMES)],
        }
        atomic_write_bytes(staging / ANNOTATIONS_NAME, json.dumps(coco, indent=1).encode())
    return target / ANNOTATIONS_NAME


def generate(out: str | os.PathLike, spec: SyntheticSpec) -> dict[str, Path]:
    """Write the train and val splits; returns {split: annotations.json path}. Both are checked
    before either is written."""
    check_memory(
        spec.memory_bytes(os.cpu_count() or 1),
        f"dfine-data synth --images {spec.images} --size {spec.size}",
        "give fewer --images or a smaller --size",
        DatasetError,
    )
    for split in ("train", "val") if spec.n_val else ("train",):
        claim_folder(Path(out) / split, SPLIT, option="--out", error=DatasetError)
    sizes = {"seed": spec.seed, "size": spec.size, "dense": spec.dense_size if spec.dense else None}
    written = {"train": write_split(out, "train", spec.images, **sizes)}
    if spec.n_val:
        written["val"] = write_split(out, "val", spec.n_val, **sizes)
    return written


# ---------------------------------------------------------------------------- dense scenes


def _dense_words(dense: tuple[float, float] | None) -> str:
    """How annotations.json's description names a dense split (and its object size range)."""
    return "" if dense is None else f", dense, objects of {dense[0]:g}-{dense[1]:g} px"


def _render_dense(
    rng: np.random.Generator, extent_range: tuple[float, float]
) -> tuple[np.ndarray, list[dict[str, Any]]]:
    """One dense scene: 150-400 objects of the four classes, of `extent_range` pixels (the geometric
    mean of an object's sides before rotation), each in its class colour (those of the demo video,
    data/moving.py) on a muted textured background, none overlapping, a fifth of them across the
    seams of the default 3x2 tiles. Boxes are the whole object; an object that finds no free place
    is left out, so large sizes give fewer objects."""
    from dfine_deploy.data.moving import CLASS_COLOURS
    from dfine_deploy.tiles import TileSpec, seams

    width, height = DENSE_SIZE
    noise = (rng.random((height, width, 3), dtype=np.float32) - 0.5) * math.sqrt(12.0)
    image = _background(rng, width, noise)
    grey = image.mean(axis=2, keepdims=True)
    image = 0.3 * image + 0.7 * (0.5 * grey + 60.0)  # muted: the class colours stand out
    seam_x, seam_y = seams(width, height, TileSpec())
    taken = np.zeros((height, width), bool)
    objects = []
    for _ in range(int(rng.integers(DENSE_OBJECTS[0], DENSE_OBJECTS[1] + 1))):
        cls = int(rng.integers(len(CLASS_NAMES)))
        extent = float(np.exp(rng.uniform(*np.log(extent_range))))
        aspect = float(np.exp(rng.uniform(-0.4, 0.4)))
        w, h = extent * math.sqrt(aspect), extent / math.sqrt(aspect)
        half = int(math.ceil(0.75 * max(w, h))) + 2  # the patch the object is drawn in
        for _attempt in range(20):
            cx, cy = rng.uniform(half, width - half), rng.uniform(half, height - half)
            if rng.random() < DENSE_ON_SEAMS:  # on a seam: a tile edge runs through it
                if rng.random() < 0.5:
                    cx = float(rng.choice(seam_x)) + rng.uniform(-0.3, 0.3) * w
                else:
                    cy = float(rng.choice(seam_y)) + rng.uniform(-0.3, 0.3) * h
            left, top = int(cx) - half, int(cy) - half
            patch = np.zeros((2 * half, 2 * half), np.uint8)
            local = (cx - left, cy - top, w, h, extent)
            _draw_shape(rng, patch, CLASS_NAMES[cls], local, float(rng.uniform(-35, 35)))
            x, y, bw, bh = cv2.boundingRect(patch)
            x1, y1, x2, y2 = left + x, top + y, left + x + bw, top + y + bh
            if (
                bw
                and bh
                and not taken[
                    max(0, y1 - DENSE_GAP) : y2 + DENSE_GAP, max(0, x1 - DENSE_GAP) : x2 + DENSE_GAP
                ].any()
            ):
                break
        else:
            continue  # the scene is too full here: leave this object out
        taken[y1:y2, x1:x2] = True
        inside = patch.astype(bool)
        region = image[top : top + 2 * half, left : left + 2 * half]
        region[inside] = np.array(CLASS_COLOURS[CLASS_NAMES[cls]], np.float32)
        objects.append({"category_id": cls, "bbox": [x1, y1, bw, bh], "area": int(inside.sum())})
    image = cv2.GaussianBlur(image, (3, 3), 0.7)
    cv2.scaleAdd(noise, 3.0, image, dst=image)
    return np.clip(np.round(image), 0, 255).astype(np.uint8), objects
