"""The suite's trained model: its file is what its provenance says, it detects, and the accuracy
guard refuses a verdict from a model that does not (the one-epoch quickstart model)."""

from __future__ import annotations

import hashlib

import pytest

from tests.support.trained_model import (
    MIN_AP50,
    SAFETENSORS,
    NotADetectingModel,
    artifact_ap50,
    guard_artifact,
    provenance,
)


def test_the_fixture_is_the_file_its_provenance_describes():
    record = provenance()
    assert SAFETENSORS.name == record["file"]
    assert hashlib.sha256(SAFETENSORS.read_bytes()).hexdigest() == record["sha256"]
    assert SAFETENSORS.stat().st_size == record["bytes"] <= 10 * 1024 * 1024
    assert record["validation"]["AP50"] >= 0.6  # the quickstart's promise, on the FP16-rounded weights
    assert record["made_by"].startswith("python tests/fixtures/make_trained_model.py")


def test_the_exported_trained_model_detects_as_its_training_evaluation_said(trained_export, trained_model):
    """The FP32 graph on onnxruntime, scored by COCOeval against the ground truth, reaches what the
    PyTorch evaluation recorded when the fixture was made (other resize, other runtime: 0.03)."""
    ap50 = artifact_ap50(trained_export, trained_model.val)
    assert ap50 >= provenance()["validation"]["AP50"] - 0.03, ap50


def test_an_accuracy_verdict_from_the_one_epoch_model_is_refused_in_one_line(quickstart_run):
    with pytest.raises(NotADetectingModel) as refused:
        guard_artifact(quickstart_run / "export", quickstart_run / "data" / "val")
    message = str(refused.value)
    assert "\n" not in message and f"is under {MIN_AP50}" in message, message
    assert str(quickstart_run / "export") in message and "trained_model" in message
