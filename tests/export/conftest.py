"""Fixtures shared by the export tests: a toy detector exported once per session, an artifact of it,
and the real D-FINE-N exports that several test files read (each made once per session, read-only:
a test that changes one works on its own copy)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from toy import ToyDetector

from dfine_deploy.artifact import ArtifactInfo, GraphInfo, write_artifact
from dfine_deploy.files import sha256_file


@pytest.fixture(scope="session", autouse=True)
def slim_each_graph_once():
    """onnxslim (`export.onnx.simplify`) is a pure function of the graph it is given, and many exports
    here trace the very same graph (D-FINE-N on torch seed 0 at 256 px: Frigate's targets, the
    jetpack6 and TensorRT INT8 exports, the CPU graphs), each paying its ~8 CPU seconds. Each distinct
    traced graph (by the sha256 of its bytes) is slimmed once per session, and every export gets its
    own copy of that real result, which it then checks, writes and gates as before. The memo stays
    for the rest of the session (pytest ends session fixtures last); it changes no result."""
    import hashlib

    import onnx

    from dfine_deploy.export import onnx as onnx_export

    real, slimmed = onnx_export.simplify, {}

    def simplify(model):
        key = hashlib.sha256(model.SerializeToString()).hexdigest()
        if key not in slimmed:
            slimmed[key] = real(model).SerializeToString()
        return onnx.load_from_string(slimmed[key])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(onnx_export, "simplify", simplify)
        yield


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


JETPACK5_IMGSZ = 320  # the size of the trtexec lines recorded in tests/data/trt_oracle_verdicts.json


@pytest.fixture(scope="session")
def jetpack5_artifact(tmp_path_factory) -> Path:
    """`dfine-export dfine-n --target jetpack5 --imgsz 320 320 --batch 1 1 2` (the CLI, end to end), on
    the random weights of torch seed 0: TensorRT 8.5's graph (opset 16, LayerNorm decomposed, INT32 I/O)
    and its FP32 layer list. Read by test_trt_targets.py and test_trtexec_journey.py."""
    import torch

    from dfine_deploy.export.cli import main as export_main

    out = tmp_path_factory.mktemp("jetpack5") / "jp5"
    size = [str(JETPACK5_IMGSZ)] * 2
    torch.manual_seed(0)
    argv = ["dfine-n", "--target", "jetpack5", "-o", str(out), "--imgsz", *size, "--batch", "1", "1", "2"]
    assert export_main(argv) == 0
    return out


@pytest.fixture(scope="session")
def jetpack6_artifact(tmp_path_factory) -> Path:
    """`dfine-export dfine-n --target jetpack6 --imgsz 256 256 --batch 1 1 2` on the random weights of
    torch seed 0: TensorRT 10.3's graphs, the typed FP16 one too. Read by test_trtexec_journey.py and
    test_frigate.py."""
    import torch

    from dfine_deploy.export.pipeline import export_artifact
    from dfine_deploy.export.settings import ExportSettings

    out = tmp_path_factory.mktemp("jetpack6") / "dfine-n-jetpack6"
    torch.manual_seed(0)
    export_artifact(
        ExportSettings(model="dfine-n", output=out, imgsz=(256, 256), batch=(1, 1, 2), target="jetpack6")
    )
    return out


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
