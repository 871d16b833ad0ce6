"""The suite's trained model (tests/fixtures/dfine_n_synthetic.*) and the guard on accuracy verdicts.

An accuracy test is only worth its verdict when its model detects: comparing two empty outputs
passes whatever the comparison checks. So every accuracy test runs on the trained fixture, and
`require_detecting` refuses, in one line, to judge with a model whose AP50 on its own validation
set is under `MIN_AP50` (for example the suite's one-epoch quickstart model, which finds nothing).

The fixture is stored as FP16 safetensors with our checkpoint meta in its metadata (no pickle in
git); `materialise` writes it back as the `.pth` checkpoint every command takes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SAFETENSORS = FIXTURES / "dfine_n_synthetic.safetensors"
PROVENANCE = FIXTURES / "dfine_n_synthetic.json"
MIN_AP50 = 0.5  # below this a model is not trusted to give an accuracy verdict


class NotADetectingModel(AssertionError):
    """An accuracy verdict was asked of a model that does not detect."""


@dataclass(frozen=True)
class TrainedModel:
    """The trained fixture as a command takes it: a checkpoint, its validation set, its input side."""

    checkpoint: Path
    val: Path  # a COCO folder: annotations.json and the images
    imgsz: int


def provenance() -> dict[str, Any]:
    """How the fixture was made and what it reached (written by tests/fixtures/make_trained_model.py)."""
    return json.loads(PROVENANCE.read_text(encoding="utf-8"))


def data_recipe() -> dict[str, int]:
    """The `dfine-data synth` numbers of the fixture's training and validation sets."""
    data = provenance()["data"]
    return {key: data[key] for key in ("images", "val_images", "size", "seed")}


def materialise(source: Path = SAFETENSORS, target: Path | None = None) -> Path:
    """Write the safetensors fixture as a `.pth` checkpoint ({'model': FP32 weights, 'meta': ...});
    returns its path (default: beside a temporary name the caller chooses)."""
    import torch
    from safetensors import safe_open

    target = target or source.with_suffix(".pth")
    with safe_open(str(source), framework="pt") as f:
        meta = json.loads((f.metadata() or {})["meta"])
        names = f.keys()  # safe_open is not iterable itself
        weights = {key: f.get_tensor(key).to(torch.float32) for key in names}
    target.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"model": weights, "meta": meta}, target)
    return target


def require_detecting(ap50: float, model: str) -> None:
    """Refuse an accuracy verdict from a model whose AP50 on its own validation set is under MIN_AP50."""
    if not ap50 >= MIN_AP50:
        raise NotADetectingModel(
            f"{model}: validation AP50 {ap50:.3f} is under {MIN_AP50}; an accuracy test needs a model that "
            "detects (use the trained_model fixture, tests/fixtures/dfine_n_synthetic.safetensors)"
        )


def artifact_ap50(artifact: Path, val: Path) -> float:
    """AP50 of an artifact folder's FP32 graph (onnxruntime) against `val`'s ground truth, the images
    read as training reads them."""
    from dfine_deploy.data.classmap import ClassMap
    from dfine_deploy.data.formats import open_dataset
    from dfine_deploy.evaluation import CocoEvaluator
    from dfine_deploy.images import read_image
    from dfine_deploy.runtime import Detector

    annotations = open_dataset(val).load("val")
    truth = annotations.coco_dict()
    with Detector.open(str(artifact), backend="onnxruntime", score_threshold=0.0) as detector:
        match = ClassMap.for_model(annotations.categories, detector.class_names)
        evaluator = CocoEvaluator(truth, match.class_map)
        for image in truth["images"]:
            frame = read_image(annotations.img_folder / image["file_name"])
            found = detector.predict([frame], color="RGB")[0]
            evaluator.update(
                [image["id"]], [{"boxes": found.boxes, "scores": found.scores, "labels": found.labels}]
            )
    return float(evaluator.summarize(per_class=False)["AP50"])


def guard_artifact(artifact: Path, val: Path) -> float:
    """The accuracy guard for an exported model: its AP50 on `val`, refused under MIN_AP50."""
    ap50 = artifact_ap50(artifact, val)
    require_detecting(ap50, str(artifact))
    return ap50
