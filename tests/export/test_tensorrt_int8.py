"""INT8 TensorRT engines by explicit quantization (10.x, 11.x) against the FAKE tensorrt module.

The fake (tests/fakes/tensorrt) binds each version's real surface, so a wrong flag fails here as it
would there: 11.x has no BuilderFlag.INT8/FP16, and any precision flag on a strongly typed network
makes the build fail. Its parser refuses Q/DQ that is not symmetric signed INT8, as TensorRT does.
Nothing here runs on a GPU: the numbers are checked by the onnxruntime gate of the Q/DQ graph.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from dfine_deploy.artifact import ENGINE_FILES, GraphInfo, read_artifact, write_artifact
from dfine_deploy.data.synthetic import write_split
from dfine_deploy.errors import BackendError, ExportError
from dfine_deploy.export import int8 as int8_export
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export import tensorrt as trt_export
from dfine_deploy.export import tensorrt_verify as trt_verify
from dfine_deploy.export.cli import main as export_main
from dfine_deploy.export.pipeline import export_artifact
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.files import sha256_file
from dfine_deploy.runtime import Detector, tensorrt_backend
from dfine_deploy.runtime import tensorrt_plan as trt_plan
from tests.support.jetson_script import script_env

FAKE = Path(__file__).parents[1] / "fakes" / "tensorrt" / "__init__.py"
PROFILE = trt_plan.artifact_profile((1, 1, 8), 320, 320)
VERSIONS = ["10.3.0.26", "10.14.1.48", "11.1.0.106"]
SIZE = 256  # the smallest square D-FINE-N takes


@pytest.fixture
def fake_trt(monkeypatch):
    """Install the fake as `tensorrt` at a version, with a fake GPU."""

    def install(version: str):
        spec = importlib.util.spec_from_file_location("tensorrt", FAKE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.set_version(version)
        monkeypatch.setitem(sys.modules, "tensorrt", module)
        gpu = module.FAKE_GPU
        monkeypatch.setattr(
            trt_export, "gpu_info", lambda: trt_plan.GpuInfo(gpu["name"], gpu["compute_capability"])
        )
        return module

    return install


@pytest.fixture(scope="module")
def qdq(tmp_path_factory, toy_onnx, scene_batches):
    """The toy detector quantized for TensorRT (symmetric INT8) and with the CPU recipe (UINT8)."""
    folder = tmp_path_factory.mktemp("int8")
    feeds = [{"images": b.images, "orig_target_sizes": b.orig_sizes} for b in scene_batches]
    paths = {}
    for name, kwargs in (("trt", {"for_tensorrt": True}), ("cpu", {"quantizer": "onnxruntime"})):
        result = int8_export.quantize(onnx_export.load(toy_onnx), feeds, **kwargs)
        paths[name] = folder / f"{name}.onnx"
        onnx_export.save(result.model, paths[name])
    return paths


def _zero_point_types(path: Path) -> set[int]:
    model = onnx.load(path)
    inits = {i.name: i for i in model.graph.initializer}
    return {
        inits[n.input[2]].data_type
        for n in model.graph.node
        if n.op_type in ("QuantizeLinear", "DequantizeLinear") and len(n.input) > 2
    }


def test_int8_plans_per_version():
    for version in VERSIONS:
        plan = trt_plan.plan_build(version, int8=True)
        assert plan.strongly_typed and not plan.fp16_flag and not plan.explicit_batch_flag
        assert plan.graph == trt_plan.INT8_GRAPH
        line = trt_plan.trtexec_command("model.int8.trt.onnx", "model.engine", plan, PROFILE)
        assert "--fp16" not in line and "--int8" not in line
        assert ("--stronglyTyped" in line) == (plan.major == 10)  # 11.x: always strongly typed
    for version in ("8.5.2.2", "8.6.2"):
        with pytest.raises(ExportError, match=r"explicit quantization .* use --target trt10\.3"):
            trt_plan.plan_build(version, int8=True)


def test_the_tensorrt_graph_is_symmetric_signed_int8(qdq):
    assert _zero_point_types(qdq["trt"]) == {onnx.TensorProto.INT8}
    assert onnx.TensorProto.UINT8 in _zero_point_types(qdq["cpu"])  # the CPU recipe differs
    zeros = [
        onnx.numpy_helper.to_array(i)
        for i in onnx.load(qdq["trt"]).graph.initializer
        if i.name.endswith("_zero_point")
    ]
    assert zeros and not any(z.any() for z in zeros)


@pytest.mark.parametrize("version", VERSIONS)
def test_fake_int8_builds_strongly_typed_without_precision_flags(fake_trt, qdq, tmp_path, version):
    trt = fake_trt(version)
    engine = trt_export.build_engine(
        qdq["trt"], tmp_path / "e.engine", profile=PROFILE, int8=True, timing_cache_dir=tmp_path
    )
    build = trt.LAST_BUILD
    assert build["strongly_typed"]
    assert build["network_flags"] & (1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    assert not build["config_flags"] & {"FP16", "INT8", "BF16"}
    assert hasattr(trt.BuilderFlag, "INT8") == (version.startswith("10."))  # gone in 11
    assert engine.precision == "int8" and engine.source_graph == "trt.onnx"
    assert engine.verification["status"] == "verified" and engine.layer_precisions["int8/fp8"] > 0
    assert engine.verification["network"]["int8/fp8"] > 0
    assert engine.builder["fp16_flag"] is False and engine.builder["int8_flag"] is False
    assert engine.io_dtypes == trt_plan.interface_dtypes("INT64")


def test_fake_parser_refuses_the_cpu_recipe_graph(fake_trt, qdq, tmp_path):
    fake_trt("10.14.1.48")
    with pytest.raises(ExportError, match="cannot parse the graph: .*symmetric INT8"):
        trt_export.build_engine(qdq["cpu"], tmp_path / "e.engine", profile=PROFILE, int8=True)
    assert not (tmp_path / "e.engine").exists()


def test_int8_from_a_graph_without_qdq_is_refused_before_the_build(fake_trt, toy_onnx, tmp_path):
    trt = fake_trt("11.1.0.106")
    with pytest.raises(ExportError, match="no INT8 tensors .* no Q/DQ layers"):
        trt_export.build_engine(toy_onnx, tmp_path / "e.engine", profile=PROFILE, int8=True)
    assert trt.LAST_BUILD == {}  # refused before building


def test_int8_verdicts():
    judge = trt_verify.judge_precision
    net = {"int8/fp8": 4, "fp32": 10}
    ok = judge(
        fp16=True, strongly_typed=True, network=net, inspector={"int8/fp8": 2}, inspector_gap="", int8=True
    )
    assert ok["status"] == "verified" and ok["precision"] == "int8"
    # strongly typed: the Q/DQ layers decide; an inspector without INT8 only fails to corroborate
    silent = judge(
        fp16=True, strongly_typed=True, network=net, inspector={"fp32": 9}, inspector_gap="", int8=True
    )
    assert silent["status"] == "unverified" and "none is INT8" in silent["reason"]
    none = judge(
        fp16=True, strongly_typed=True, network={"fp32": 9}, inspector={}, inspector_gap="", int8=True
    )
    assert none["status"] == "refused" and "no Q/DQ layers" in none["reason"]
    gap = judge(
        fp16=True, strongly_typed=True, network=net, inspector={}, inspector_gap="names only", int8=True
    )
    assert gap["status"] == "unverified" and "names only" in gap["reason"]
    with pytest.raises(ExportError, match="did not build an INT8 engine"):
        trt_verify.verify_engine({}, none, expected_io={}, source="m.onnx", version="11.1")


def test_an_inspector_without_types_records_int8_unverified(fake_trt, qdq, tmp_path, monkeypatch):
    trt = fake_trt("10.3.0.26")
    monkeypatch.setattr(
        trt.EngineInspector,
        "get_engine_information",
        lambda self, format: json.dumps({"Layers": ["a"], "Bindings": []}),
    )
    with pytest.warns(UserWarning, match="precision unverified.*layer names only"):
        engine = trt_export.build_engine(qdq["trt"], tmp_path / "e.engine", profile=PROFILE, int8=True)
    assert engine.verification["status"] == "unverified" and engine.precision == "int8"


def test_int8_trt_option_errors_are_one_line(tmp_path, capsys):
    assert (
        export_main(
            ["dfine-n", "--target", "jetpack5", "--int8", "--data", str(tmp_path), "-o", str(tmp_path / "a")]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "--int8 with --target jetpack5: INT8 for TensorRT 8.5" in err and "--target trt10.3" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert (
        export_main(["dfine-n", "--int8", "--trt", "--data", str(tmp_path), "-o", str(tmp_path / "b")]) == 2
    )
    assert "--int8 --trt needs --target" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::UserWarning", "ignore::torch.jit.TracerWarning")
def test_export_int8_trt10_3_builds_from_the_gated_gather_qdq_graph(fake_trt, tmp_path):
    """`dfine-export dfine-n --target trt10.3 --int8 --data DIR --trt`, end to end on the fake; on few
    images (2 to calibrate, 3 for the gates: one batch of each gate batch size), as the numbers are
    not what this test checks."""
    data = tmp_path / "data"
    write_split(data, "val", 3, seed=3, size=SIZE)
    trt = fake_trt("10.3.0.26")
    torch.manual_seed(0)
    out = tmp_path / "art"
    export_artifact(
        ExportSettings(
            model="dfine-n",
            output=out,
            imgsz=(SIZE, SIZE),
            batch=(1, 1, 2),
            target="trt10.3",
            fp16=False,
            int8=True,
            data=data,
            calibration_images=2,
            gate_images=3,
            trt=True,
        )
    )
    info = read_artifact(out)
    graph = info.graphs[trt_plan.INT8_GRAPH]
    assert graph.file == "model.int8.trt.onnx" and graph.sampler == "gather" and graph.precision == "int8"
    model = onnx.load(out / graph.file)
    ops = {n.op_type for n in model.graph.node}
    assert "GridSample" not in ops and {"QuantizeLinear", "DequantizeLinear"} <= ops
    assert _zero_point_types(out / graph.file) == {onnx.TensorProto.INT8}
    assert graph.recipe["source_graph"] == "model.onnx" and graph.recipe["fp32_islands"]
    assert graph.recipe["calibration_images"] == 2
    gate = info.parity[trt_plan.INT8_GRAPH]  # onnxruntime: the Q/DQ graph against the FP32 graph
    assert gate["passed"] and gate["reference"] == "model.onnx" and np.isfinite(gate["score_max_abs"])
    assert info.backend_graphs == {"tensorrt": {"int8": trt_plan.INT8_GRAPH}}
    assert info.graph_for("tensorrt", "int8").file == "model.int8.trt.onnx"
    assert "model.int8.trt.onnx" in info.target["parser_check"]
    plan = info.target["int8_plan"]
    assert plan["strongly_typed"] and plan["builder_flags"] == []
    assert "--onnx=model.int8.trt.onnx" in plan["trtexec"] and "--stronglyTyped" in plan["trtexec"]
    assert "--fp16" not in plan["trtexec"] and "--int8" not in plan["trtexec"]
    engine = info.engine_for("int8")
    assert engine.file == "model.int8.engine" and (out / "model.int8.engine").is_file()
    assert engine.source_graph == "model.int8.trt.onnx" and engine.precision == "int8"
    assert engine.verification["status"] == "verified" and engine.tensorrt_version == "10.3.0.26"
    assert info.engine_for("fp16") is None and not (out / "model.engine").exists()
    assert trt.LAST_BUILD["strongly_typed"] and not trt.LAST_BUILD["config_flags"] & {"FP16", "INT8"}


def test_an_int8_build_leaves_the_fp16_engine_and_its_record(fake_trt, qdq, artifact, monkeypatch):
    """Each precision has its own engine file and model.json record: an INT8 build after the FP16 one
    (the fake TensorRT that gpu_check.sh --dry runs) writes model.int8.engine beside model.engine and
    leaves model.engine's bytes and record as they were; the folder opens either by its precision."""
    from tests.runtime.test_runtime_tensorrt import HostMemory

    shutil.copyfile(qdq["trt"], artifact / "model.int8.trt.onnx")
    info = read_artifact(artifact)
    info.graphs[trt_plan.INT8_GRAPH] = GraphInfo(
        "model.int8.trt.onnx", sha256_file(artifact / "model.int8.trt.onnx"), "int8", 17
    )
    info.graphs.pop("fp16")  # 10.3 builds FP16 from model.onnx with the FP16 flag
    info.backend_graphs = {"tensorrt": {"int8": trt_plan.INT8_GRAPH}}
    write_artifact(artifact, info)
    fake_trt("10.3.0.26")
    fp16 = trt_export.build_for_artifact(artifact)
    fp16_bytes, fp16_record = (
        (artifact / "model.engine").read_bytes(),
        read_artifact(artifact).engines["fp16"],
    )
    int8 = trt_export.build_for_artifact(artifact, int8=True)
    after = read_artifact(artifact)
    assert (fp16.file, int8.file) == ("model.engine", "model.int8.engine")
    assert (artifact / "model.engine").read_bytes() == fp16_bytes and after.engines["fp16"] == fp16_record
    assert set(after.engines) == {"fp16", "int8"} and after.engine_for() == fp16_record  # FP16 by default
    assert after.engines["int8"].sha256 == sha256_file(artifact / "model.int8.engine")
    assert after.engines["int8"].source_graph == "model.int8.trt.onnx"
    monkeypatch.setattr(tensorrt_backend, "open_memory", lambda index, prefer="auto": HostMemory())
    for precision, file in (
        ("auto", "model.engine"),
        ("fp16", "model.engine"),
        ("int8", "model.int8.engine"),
    ):
        opened = Detector.open(artifact, backend="tensorrt", precision=precision, unverified=True)
        assert Path(opened.source).name == file and opened.backend.declared_precision == (
            "int8" if file == "model.int8.engine" else "fp16"
        )
    with pytest.raises(
        BackendError, match=r"no fp32 TensorRT engine in this artifact \(engines: fp16 \(model"
    ):
        Detector.open(artifact, backend="tensorrt", precision="fp32", unverified=True)


def test_a_sidecar_with_one_engine_record_reads_as_that_precisions_engine(artifact):
    """model.json written when an artifact held one engine (`engine`, an INT8 build under model.engine
    included) is read with that record under its precision, and written back so."""
    import json

    data = json.loads((artifact / "model.json").read_text())
    (artifact / "model.engine").write_bytes(b"plan")
    record = {"file": "model.engine", "sha256": sha256_file(artifact / "model.engine")}
    record.update(source_graph="model.int8.trt.onnx", tensorrt_version="10.3.0.26", gpu_name="Orin")
    record.update(compute_capability="8.7", profile={}, io_dtypes={}, layer_precisions={}, build_seconds=1.0)
    del data["engines"]  # as written then
    data["engine"] = {**record, "precision": "int8"}
    (artifact / "model.json").write_text(json.dumps(data))
    info = read_artifact(artifact)
    assert list(info.engines) == ["int8"] and info.engine_for("int8").file == "model.engine"
    assert info.engine_for("fp16") is None and info.engine_named("model.engine").precision == "int8"
    write_artifact(artifact, info)
    written = json.loads((artifact / "model.json").read_text())
    assert "engine" not in written and written["engines"]["int8"]["file"] == "model.engine"


def _build_script(folder: Path, version: str, *extra: str) -> subprocess.CompletedProcess:
    script = Path(__file__).parents[2] / "export" / "jetson" / "build_engine.sh"
    return subprocess.run(
        ["bash", str(script), str(folder), "--dry-run", *extra],
        env=script_env(version),
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_jetson_script_builds_int8_from_the_qdq_graph_on_10_and_11_only(tmp_path):
    sidecar = {
        "input_height": 256,
        "input_width": 256,
        "batch_min": 1,
        "batch_opt": 1,
        "batch_max": 2,
        "graphs": {"fp32": {"file": "model.onnx"}, "int8-trt": {"file": "model.int8.trt.onnx"}},
        "backend_graphs": {"tensorrt": {"int8": "int8-trt"}},
        "target": {"profile": {"name": "trt10.3"}},
    }
    (tmp_path / "model.json").write_text(json.dumps(sidecar))
    for version, typed in (("10.3.0.30", True), ("11.1.0", False)):
        run = _build_script(tmp_path, version, "--int8")
        assert run.returncode == 0, run.stderr
        line = run.stdout.split()
        assert f"--onnx={tmp_path}/model.int8.trt.onnx" in line
        assert ("--stronglyTyped" in line) == typed and not {"--fp16", "--int8"} & set(line)
    assert "--int8" in _build_script(tmp_path, "10.14.1", "--int8", "--python").stdout.split()
    # the names the script gives each precision's engine are dfine_deploy's (ENGINE_FILES)
    script = (Path(__file__).parents[2] / "export" / "jetson" / "build_engine.sh").read_text()
    case = re.search(r'case "\$precision" in (.+) esac', script)[1]
    named = dict(re.findall(r"(\w+)\) engine_name=(\S+) ;;", case.replace("*)", "fp16)")))
    assert named == ENGINE_FILES, named
    sidecar["target"] = {"profile": {"name": "trt8.6"}}
    (tmp_path / "model.json").write_text(json.dumps(sidecar))
    run = _build_script(tmp_path, "8.6.2", "--int8")
    assert run.returncode == 2 and "TensorRT 10 or newer" in run.stderr
    del sidecar["backend_graphs"]
    sidecar["target"] = {"profile": {"name": "trt11"}}
    (tmp_path / "model.json").write_text(json.dumps(sidecar))
    run = _build_script(tmp_path, "11.1.0", "--int8")
    assert run.returncode == 2 and "no INT8 graph for TensorRT; re-export with" in run.stderr
