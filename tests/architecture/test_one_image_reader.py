"""One image reader for every stage (docs/ARCHITECTURE.md, docs/images.md).

- No module decodes an image file but dfine_deploy/images.py (the source is scanned, so a new
  loader is caught too).
- Every stage's loader (training and evaluation datasets with each cache, validation, `dfine-bench
  --data`, the export gate and calibration images, serve uploads) gives the same pixels for every
  kind of file, and those are the pixels a viewer shows.
- Acceptance: the same photos, saved turned with EXIF orientations 1..8, score the same AP as their
  upright copies in training's own evaluation (what `--test-only` runs) and in `dfine-bench --data`,
  with a detector that finds the objects from the pixels it is given.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dfine_deploy.images import read_image
from tests.support.images import (
    CASE_NAMES,
    SCENE_SIZE,
    close_enough,
    find_boxes,
    scene,
    write_cases,
    write_oriented,
)

ROOT = Path(__file__).resolve().parents[2]
READER = ROOT / "dfine_deploy" / "images.py"
SCANNED = ("dfine_deploy", "scripts", "benchmarks", "train", "export", "serve")
CLASSES = ("red", "blue")
MEDIA = {".jpg": "image/jpeg", ".png": "image/png", ".webp": "image/webp"}  # what uploads accept


IMAGE_LIBRARIES = ("PIL", "imageio", "skimage.io", "torchvision.io")
OPENCV_READS = ("imread", "imdecode", "imreadmulti")
# Files that import PIL only to resize arrays, never to open a file: named with the reason, and held
# to it (a call of Image.open there is still found).
PIL_RESIZE_ONLY = {
    "benchmarks/runtime_overhead.py": "times PIL's BILINEAR resize, the filter the runtime's resize replaced",
}


def _decoders_in(path: Path, pil_resize_only: bool = False) -> list[str]:
    """Image decoding in one file: an image library imported, or OpenCV's image reads called; with
    `pil_resize_only`, PIL may be imported but its Image.open may not be called."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules = []
        if isinstance(node, ast.ImportFrom):
            modules = [node.module or ""] + [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            modules = [a.name for a in node.names]
        libraries = IMAGE_LIBRARIES[1:] if pil_resize_only else IMAGE_LIBRARIES
        if any(m == lib or m.startswith(lib + ".") for m in modules for lib in libraries):
            found.append(f"line {node.lineno}: imports {modules[0]}")
        is_call = isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
        if (
            pil_resize_only
            and is_call
            and node.func.attr == "open"
            and getattr(node.func.value, "id", "") == "Image"
        ):
            found.append(f"line {node.lineno}: Image.open")
        if is_call and node.func.attr in OPENCV_READS and getattr(node.func.value, "id", "") == "cv2":
            found.append(f"line {node.lineno}: cv2.{node.func.attr}")
    return found


def test_no_module_but_the_reader_decodes_image_files():
    offenders = {}
    for folder in SCANNED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = str(path.relative_to(ROOT))
            if path != READER and (hits := _decoders_in(path, name in PIL_RESIZE_ONLY)):
                offenders[name] = hits
    assert offenders == {}, f"decode images with dfine_deploy.images.read_image: {offenders}"
    assert _decoders_in(READER)  # the scan does see a decoder where there is one
    assert all((ROOT / name).is_file() for name in PIL_RESIZE_ONLY), "a PIL_RESIZE_ONLY file is gone: drop it"


def test_a_resize_only_file_that_opens_an_image_is_found(tmp_path):
    opener = tmp_path / "opener.py"
    opener.write_text("from PIL import Image\nImage.fromarray(x).resize((2, 2))\nImage.open('a.jpg')\n")
    assert _decoders_in(opener, pil_resize_only=True) == ["line 3: Image.open"]
    assert _decoders_in(opener) == ["line 1: imports PIL"]


# ---------------------------------------------------------------------------------------------- stages


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """A COCO folder of every kind of file, sizes as shown, one box each; (cases, annotation file)."""
    folder = tmp_path_factory.mktemp("every-kind")
    cases = write_cases(folder)
    images, annotations = [], []
    for i, case in enumerate(cases, start=1):
        h, w = case.expected.shape[:2]
        images.append({"id": i, "file_name": case.path.name, "width": w, "height": h})
        annotations.append({"id": i, "image_id": i, "category_id": 1, "bbox": [2, 2, w - 4, h - 4]})
    categories = [{"id": 1, "name": "red"}, {"id": 2, "name": "blue"}]
    ann_file = folder / "annotations.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return cases, ann_file


def data_settings(ann_file: Path, **extra):
    from dfine_deploy.settings import DataSettings

    return DataSettings(
        img_folder=str(ann_file.parent),
        ann_file=str(ann_file),
        num_classes=len(CLASSES),
        remap_mscoco_category=True,
        total_batch_size=2,
        num_workers=0,
        **extra,
    )


class RecordingDetector:
    """What `dfine-bench --data` is given, as RGB; it detects nothing (or what `detect` finds)."""

    class_names = CLASSES
    class_names_note = ""  # the names are its own, not assumed from a class count
    max_batch = 4
    thresholds = SimpleNamespace(chosen={})  # no thresholds chosen at export (Detector.thresholds)

    def __init__(self, detect=None):
        self.frames: list[np.ndarray] = []
        self.detect = detect

    def predict(self, frames, *, color="BGR"):
        rgb = [f if color == "RGB" else f[:, :, ::-1] for f in frames]
        self.frames += rgb
        return [_detections(self.detect(f) if self.detect else []) for f in rgb]


def _detections(found: list[tuple[str, list[float]]]) -> SimpleNamespace:
    return SimpleNamespace(
        boxes=np.array([box for _, box in found], dtype=np.float32).reshape(-1, 4),
        scores=np.ones(len(found), dtype=np.float32),
        labels=np.array([CLASSES.index(name) for name, _ in found], dtype=np.int64),
    )


def stage_pixels(cases, ann_file: Path, tmp_path: Path) -> dict[str, list[np.ndarray]]:
    """Each stage's pixels of every case, RGB, in the dataset's order."""
    from dfine_deploy.bench.accuracy import coco_map
    from dfine_deploy.data.formats import recognise
    from dfine_deploy.data.loader import build_dataset
    from dfine_deploy.export import gate_inputs, parity
    from dfine_deploy.serve.uploads import decode_upload

    out = {}
    for cache in ("off", "ram", str(tmp_path / "cache")):
        for epoch in (0, 1):  # the second pass of the RAM and folder caches serves cached pixels
            data = build_dataset(data_settings(ann_file, cache=cache))
            items = [data.load_item(i)[0].permute(1, 2, 0).numpy() for i in range(len(data))]
            out[f"training dataset, cache {Path(cache).name}, pass {epoch}"] = items
    recording = RecordingDetector()
    coco_map(recording, ann_file)
    out["dfine-bench --data"] = recording.frames
    gate_images, _, _ = gate_inputs._dataset_images(recognise(ann_file), len(cases))
    out["export gate (COCO --data)"] = gate_images
    by_path = dict(zip(sorted(c.path for c in cases), parity.load_folder_images(ann_file.parent, len(cases))))
    out["export gate and INT8 calibration (image folder)"] = [by_path[c.path] for c in cases]
    out["serve upload"] = [
        decode_upload(c.path.read_bytes(), MEDIA[c.path.suffix], 10**6)[:, :, ::-1]
        if c.path.suffix in MEDIA
        else None
        for c in cases
    ]
    return out


def test_every_stage_reads_the_same_pixels_as_a_viewer_shows(dataset, tmp_path):
    from dfine_deploy.data.coco import load_coco

    cases, ann_file = dataset
    records = load_coco(ann_file, ann_file.parent).records  # what dfine-data validate settles
    assert [(r.width, r.height) for r in records] == [c.expected.shape[1::-1] for c in cases]
    for stage, pixels in stage_pixels(cases, ann_file, tmp_path).items():
        assert len(pixels) == len(cases), stage
        for case, image in zip(cases, pixels):
            if image is None:  # not a format the stage takes (uploads: no TIFF)
                continue
            assert close_enough(case, image), f"{stage}: {case.name} is not what a viewer shows"
            assert np.array_equal(image, read_image(case.path)), f"{stage}: {case.name} differs"
    assert len(cases) == len(CASE_NAMES)


# ---------------------------------------------------------------------------------------- acceptance


def photo_set(folder: Path, turned: bool) -> Path:
    """Eight scenes as JPEG photos, upright or saved turned with EXIF orientations 1..8; the
    annotations are the same in both sets: the objects as a viewer shows them."""
    images, annotations = [], []
    for image_id in range(1, 9):
        shown, objects = scene(image_id)
        write_oriented(folder / f"photo{image_id}.jpg", shown, image_id if turned else 1)
        images.append({"id": image_id, "file_name": f"photo{image_id}.jpg", "width": 96, "height": 64})
        for name, (x1, y1, x2, y2) in objects:
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": CLASSES.index(name) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                }
            )
    categories = [{"id": i + 1, "name": n} for i, n in enumerate(CLASSES)]
    ann_file = folder / "annotations.json"
    ann_file.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return ann_file


def training_evaluation_ap(ann_file: Path) -> float:
    """AP of training's own evaluation loop (`--test-only` and each epoch's validation run it) with a
    model that finds the objects in the batch it is given."""
    import torch

    from dfine_deploy.data.loader import build_dataloader, build_dataset
    from dfine_deploy.evaluation import CocoEvaluator
    from dfine_deploy.settings import TransformOp, TransformsSettings
    from dfine_deploy.training.steps import evaluate

    w, h = SCENE_SIZE
    ops = (
        TransformOp("Resize", {"size": [h, w]}),
        TransformOp("ConvertPILImage", {"dtype": "float32", "scale": True}),
    )
    settings = data_settings(ann_file, transforms=TransformsSettings(ops=ops))
    val_set = build_dataset(settings)
    loader = build_dataloader(settings, val_set, rank=0, world_size=1)

    class PixelModel(torch.nn.Module):
        def forward(self, images):  # [B, 3, H, W] in [0, 1] -> what each image shows, normalised
            rgb = (images.permute(0, 2, 3, 1) * 255).round().to(torch.uint8).numpy()
            return [[(n, np.array(b) / [w, h, w, h]) for n, b in find_boxes(im)] for im in rgb]

    def postprocess(outputs, sizes):  # normalised boxes -> the original image's pixels
        return [
            vars(_detections([(n, (box * np.tile(size.numpy(), 2)).tolist()) for n, box in found]))
            for found, size in zip(outputs, sizes)
        ]

    evaluator = CocoEvaluator(val_set.coco_gt(), val_set.class_map)
    metrics = evaluate(
        PixelModel(),
        postprocess,
        loader,
        evaluator,
        device=torch.device("cpu"),
        use_amp=False,
        amp_dtype=torch.float32,
    )
    return float(metrics["AP"])


def test_turned_photos_score_as_upright_ones_in_training_evaluation_and_bench(tmp_path):
    from dfine_deploy.bench.accuracy import coco_map

    scores = {}
    for turned in (False, True):
        ann_file = photo_set(tmp_path / ("turned" if turned else "upright"), turned)
        scores[("--test-only / training validation", turned)] = training_evaluation_ap(ann_file)
        scores[("dfine-bench --data", turned)] = coco_map(RecordingDetector(find_boxes), ann_file).map50_95
    assert all(abs(ap - 1.0) <= 0.01 for ap in scores.values()), scores  # a perfect detector: AP 1
