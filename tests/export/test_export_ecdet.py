"""An EdgeCrafter ECDet-S checkpoint in the official layout through the export pipeline and its gate,
then served by the runtime from the artifact (as any D-FINE artifact is)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks.ecdet_vs_official import fill_ecdet
from dfine_deploy.artifact import read_artifact
from dfine_deploy.export.pipeline import export_artifact
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.model.ecdet import build_ecdet
from dfine_deploy.model.ecdet_spec import ECDET_SIZES
from dfine_deploy.runtime.detector import Detector

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::torch.jit.TracerWarning")


def test_ecdet_s_checkpoint_exports_passes_the_gate_and_serves(tmp_path):
    model = build_ecdet(ECDET_SIZES["s"])
    fill_ecdet(model)  # decisive scores, so the gate compares boxes, labels and scores in full
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
