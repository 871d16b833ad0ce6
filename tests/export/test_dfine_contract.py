"""D-FINE's input contract (RGB, /255, stretched to the network size, no mean/std) checked against
the official D-FINE's own image inference, its preprocessing included, recorded from its code by
benchmarks/dfine_vs_official_images.py (tests/data/dfine/official_images.json)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from benchmarks.dfine_vs_official_images import RECORD, detecting_model
from benchmarks.official_parity import contract_images
from dfine_deploy.artifact import read_artifact
from dfine_deploy.export.pipeline import export_artifact
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.model import contracts
from dfine_deploy.runtime.compare import compare_detections
from dfine_deploy.runtime.detections import Detections
from dfine_deploy.runtime.detector import Detector

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::torch.jit.TracerWarning")

OFFICIAL = json.loads(RECORD.read_text())
MATCH_IOU = 0.99


@pytest.fixture(scope="module")
def detecting_dfine(tmp_path_factory):
    """The recorded weights as an official checkpoint file, and their artifact at 640 x 640 (the size
    the official script resizes to)."""
    folder = tmp_path_factory.mktemp("dfine_contract")
    checkpoint = folder / "dfine_n.pth"
    torch.save({"model": detecting_model().state_dict()}, checkpoint)
    out = folder / "artifact"
    export_artifact(
        ExportSettings(model=str(checkpoint), output=out, batch=(1, 1, 1), fp16=False, cpu_graph=False)
    )
    return checkpoint, out


def _agreement(detector: Detector):
    images = contract_images()
    assert [[im.shape[0], im.shape[1]] for im in images] == [
        [im["height"], im["width"]] for im in OFFICIAL["images"]
    ]
    names = [str(i) for i in range(80)]
    official = [
        Detections.build(np.array(im["boxes"]), np.array(im["scores"]), np.array(im["labels"]), names)
        for im in OFFICIAL["images"]
    ]
    ours = detector.predict(images, color="RGB")
    return compare_detections(official, ours, top_k=OFFICIAL["top"], iou_threshold=MATCH_IOU)


def test_pytorch_finds_the_official_scripts_own_detections(detecting_dfine):
    """Our Detector on the checkpoint finds each of the official script's top-50 per image (PIL
    resize, ToTensor, nothing else), same label, IoU >= 0.99."""
    checkpoint, _ = detecting_dfine
    agreement = _agreement(Detector.open(checkpoint, backend="torch", device="cpu"))
    assert agreement.matched == agreement.compared == 2 * OFFICIAL["top"], agreement.to_dict()


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_exported_graph_finds_the_official_scripts_own_detections(detecting_dfine, backend):
    _, artifact = detecting_dfine
    agreement = _agreement(Detector.open(artifact, backend=backend, device="cpu"))
    assert agreement.matched == agreement.compared == 2 * OFFICIAL["top"], agreement.to_dict()
    assert read_artifact(artifact).input == contracts.input_contract("dfine").to_dict()


def test_dfine_fed_imagenet_mean_and_std_misses_the_official_detections(detecting_dfine, monkeypatch):
    """The comparison can fail: D-FINE's contract given ECDet's ImageNet mean/std (the opposite of
    the mistake ECDet suffered) moves the same weights' boxes off the official ones."""
    checkpoint, _ = detecting_dfine
    monkeypatch.setitem(
        contracts.INPUT_CONTRACTS,
        "dfine",
        contracts.InputContract(
            "dfine", contracts.INPUT_CONTRACTS["ecdet"].network, contracts.STRETCH, sources=()
        ),
    )
    agreement = _agreement(Detector.open(checkpoint, backend="torch", device="cpu"))
    assert agreement.match_rate < 0.5, agreement.to_dict()
