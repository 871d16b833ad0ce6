"""Fixtures shared by the export tests: a toy detector exported once per session."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from toy import ToyDetector


@pytest.fixture(scope="session")
def toy_model():
    return ToyDetector().eval()


@pytest.fixture(scope="session")
def toy_onnx(tmp_path_factory, toy_model):
    from dfine_deploy.export import onnx as onnx_export

    path = tmp_path_factory.mktemp("toy") / "model.onnx"
    onnx_export.export_onnx(toy_model, path, height=320, width=320)
    return path


@pytest.fixture(scope="session")
def scene_batches():
    from dfine_deploy.export.parity import make_batches, synthetic_scenes

    return make_batches(synthetic_scenes(7), 320, 320, (1, 2, 4))
