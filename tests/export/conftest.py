"""Fixtures shared by the export tests: a toy detector exported once per session, an artifact of it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from toy import ToyDetector

from dfine_deploy.artifact import ArtifactInfo, GraphInfo, write_artifact
from dfine_deploy.files import sha256_file


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


@pytest.fixture
def artifact(tmp_path, toy_onnx):
    """An artifact folder as dfine-export writes it (FP32 and FP16 graphs, the sidecar), of the toy."""
    folder = tmp_path / "artifact"
    folder.mkdir()
    for name in ("model.onnx", "model.fp16.onnx"):
        shutil.copyfile(toy_onnx, folder / name)
    info = ArtifactInfo(
        model="custom",
        num_classes=5,
        class_names=[f"c{i}" for i in range(5)],
        input_height=320,
        input_width=480,
        batch_min=1,
        batch_opt=4,
        batch_max=8,
        num_top_queries=30,
        graphs={
            k: GraphInfo(f, sha256_file(folder / f), k, 17)
            for k, f in (("fp32", "model.onnx"), ("fp16", "model.fp16.onnx"))
        },
    )
    write_artifact(folder, info)
    return folder
