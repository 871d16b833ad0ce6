"""An EdgeCrafter ECDet-S checkpoint in the official layout through the export pipeline and its gate,
then served by the runtime from the artifact (as any D-FINE artifact is); and ECDet's input contract
(ImageNet mean/std, inside the graph) checked against EdgeCrafter's own inference, recorded from its
code by benchmarks/ecdet_vs_official.py (tests/data/ecdet/official.json, `inference`)."""

from __future__ import annotations

import json

import cv2
import numpy as np
import pytest
import torch

from benchmarks.ecdet_vs_official import RECORD, fill_ecdet_detecting
from benchmarks.official_parity import contract_images
from dfine_deploy.artifact import read_artifact
from dfine_deploy.errors import BackendError
from dfine_deploy.export.pipeline import export_artifact
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.model import contracts
from dfine_deploy.model.ecdet import build_ecdet
from dfine_deploy.model.ecdet_spec import ECDET_SIZES
from dfine_deploy.runtime.compare import compare_detections
from dfine_deploy.runtime.detections import Detections
from dfine_deploy.runtime.detector import Detector

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::torch.jit.TracerWarning")

OFFICIAL_INFERENCE = json.loads(RECORD.read_text())["sizes"]["s"]["inference"]
MATCH_IOU = 0.99


def test_ecdet_s_checkpoint_exports_passes_the_gate_and_serves(tmp_path):
    model = build_ecdet(ECDET_SIZES["s"])
    # decisive scores and boxes spread over the image, so the gate compares boxes, labels and scores
    # in full (under the plain parity fill every box collapses onto a corner, a few pixels wide)
    fill_ecdet_detecting(model)
    checkpoint = tmp_path / "ecdet_s.pth"
    torch.save({"model": model.state_dict()}, checkpoint)  # as EdgeCrafter releases its files
    out = tmp_path / "ecdet_s"
    info = export_artifact(
        ExportSettings(
            model=str(checkpoint), output=out, imgsz=(256, 256), batch=(1, 1, 1), fp16=False, cpu_graph=False
        )
    )
    assert info.model == "ecdet-s" and info.num_classes == 80
    gate = info.parity["fp32"]
    assert gate["passed"] and gate["rank_free"] is False, gate
    assert read_artifact(out).model == "ecdet-s"

    detector = Detector.open(out)
    frame = (np.random.default_rng(0).random((192, 256, 3)) * 255).astype(np.uint8)
    (detections,) = detector.predict([frame])
    assert detections.boxes.shape == (len(detections), 4)
    assert all(name in info.class_names for name in detections.names)


@pytest.fixture(scope="module")
def detecting_ecdet(tmp_path_factory):
    """The recorded weights (`fill_ecdet_detecting`) as EdgeCrafter's checkpoint file, and their
    artifact exported at EdgeCrafter's eval size (640 x 640)."""
    folder = tmp_path_factory.mktemp("ecdet_contract")
    model = build_ecdet(ECDET_SIZES["s"])
    assert fill_ecdet_detecting(model) == OFFICIAL_INFERENCE["filled_tensors"]
    checkpoint = folder / "ecdet_s.pth"
    torch.save({"model": model.state_dict()}, checkpoint)
    out = folder / "artifact"
    export_artifact(
        ExportSettings(model=str(checkpoint), output=out, batch=(1, 1, 1), fp16=False, cpu_graph=False)
    )
    return checkpoint, out


def _official() -> list[Detections]:
    names = [str(i) for i in range(80)]
    return [
        Detections.build(np.array(im["boxes"]), np.array(im["scores"]), np.array(im["labels"]), names)
        for im in OFFICIAL_INFERENCE["images"]
    ]


def _agreement(detector: Detector):
    images = contract_images()
    assert [[im.shape[0], im.shape[1]] for im in images] == [
        [im["height"], im["width"]] for im in OFFICIAL_INFERENCE["images"]
    ]
    ours = detector.predict(images, color="RGB")
    return compare_detections(_official(), ours, top_k=OFFICIAL_INFERENCE["top"], iou_threshold=MATCH_IOU)


@pytest.mark.parametrize("backend", ["onnxruntime", "openvino"])
def test_ecdet_graph_finds_edgecrafters_own_detections(detecting_ecdet, backend):
    """Our exported graph, through Detector (what dfine-serve runs), finds each of EdgeCrafter's own
    top-50 detections per image (its preprocessing: resize, ToTensor, ImageNet mean/std) with the
    same label at IoU >= 0.99."""
    _, artifact = detecting_ecdet
    agreement = _agreement(Detector.open(artifact, backend=backend, device="cpu"))
    assert agreement.compared == 2 * OFFICIAL_INFERENCE["top"]
    assert agreement.matched == agreement.compared, agreement.to_dict()
    assert read_artifact(artifact).input == contracts.input_contract("ecdet").to_dict()


def test_ecdet_pytorch_finds_edgecrafters_own_detections(detecting_ecdet):
    checkpoint, _ = detecting_ecdet
    agreement = _agreement(Detector.open(checkpoint, backend="torch", device="cpu"))
    assert agreement.matched == agreement.compared == 2 * OFFICIAL_INFERENCE["top"], agreement.to_dict()


def test_ecdet_without_its_mean_and_std_misses_edgecrafters_detections(detecting_ecdet, monkeypatch):
    """The comparison above can fail: with ECDet's contract replaced by D-FINE's (RGB / 255, no
    mean/std, what was fed before), the same weights find almost none of EdgeCrafter's detections."""
    checkpoint, _ = detecting_ecdet
    monkeypatch.setitem(
        contracts.INPUT_CONTRACTS,
        "ecdet",
        contracts.InputContract("ecdet", contracts.GRAPH_INPUT, contracts.STRETCH, sources=()),
    )
    agreement = _agreement(Detector.open(checkpoint, backend="torch", device="cpu"))
    assert agreement.match_rate < 0.1, agreement.to_dict()


def test_an_ecdet_artifact_without_the_input_contract_is_refused(detecting_ecdet, tmp_path):
    """model.json written before the contract: its ECDet graph has no mean/std step, so it is
    refused (one line, naming the family's normalisation) instead of serving wrong detections."""
    _, artifact = detecting_ecdet
    data = json.loads((artifact / "model.json").read_text())
    del data["input"]
    (tmp_path / "model.json").write_text(json.dumps(data))
    with pytest.raises(BackendError, match="without ecdet's input normalisation") as refused:
        read_artifact(tmp_path)
    assert "\n" not in str(refused.value)


def test_dfine_serve_answers_with_edgecrafters_own_detections(detecting_ecdet):
    """POST /v1/detect with each image as a PNG (decoded by dfine-serve, BGR, as a camera frame):
    its raw detections hold each of EdgeCrafter's own top-50, same label, IoU >= 0.99."""
    from fastapi.testclient import TestClient

    from dfine_deploy.serve.app import create_app
    from dfine_deploy.serve.settings import ServeSettings

    _, artifact = detecting_ecdet
    settings = ServeSettings(model=str(artifact), raw_detections=True, score_threshold=0.0)
    detector = Detector.open(artifact, backend="onnxruntime", device="cpu")
    names = [str(i) for i in range(80)]
    served = []
    with TestClient(create_app(settings, detector=detector), base_url="http://127.0.0.1") as client:
        for pixels in contract_images():
            encoded, png = cv2.imencode(".png", cv2.cvtColor(pixels, cv2.COLOR_RGB2BGR))
            assert encoded
            reply = client.post("/v1/detect", content=png.tobytes(), headers={"Content-Type": "image/png"})
            assert reply.status_code == 200, reply.text
            raw = reply.json()["raw_detections"]
            served.append(
                Detections.build(
                    np.array([d["box"] for d in raw]),
                    np.array([d["score"] for d in raw]),
                    np.array([d["label"] for d in raw]),
                    names,
                )
            )
    agreement = compare_detections(
        _official(), served, top_k=OFFICIAL_INFERENCE["top"], iou_threshold=MATCH_IOU
    )
    assert agreement.matched == agreement.compared == 2 * OFFICIAL_INFERENCE["top"], agreement.to_dict()
