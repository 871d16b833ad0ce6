"""TensorRT build logic against the FAKE tensorrt module (tests/fakes/tensorrt), 8.5 to 11.x.

The fake's enums, classes, methods and argument names are NVIDIA's, per version, extracted from the
binding sources (tests/fakes/tensorrt/surface/*.json); its parser, builder, inspector and timing
cache model the version differences listed in its docstring.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dfine_deploy.errors import ExportError
from dfine_deploy.export import fp16 as fp16_export
from dfine_deploy.export import onnx as onnx_export
from dfine_deploy.export import targets
from dfine_deploy.export import tensorrt as trt_export
from dfine_deploy.export import tensorrt_verify as trt_verify
from dfine_deploy.runtime import tensorrt_plan as trt_plan

FAKE = Path(__file__).parents[1] / "fakes" / "tensorrt" / "__init__.py"
PROFILE = trt_plan.artifact_profile((1, 1, 8), 320, 320)


def _load_fake(version: str):
    spec = importlib.util.spec_from_file_location("tensorrt", FAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.set_version(version)
    return module


NORM_NODES = [
    f"/norm/{op}" for op in ("ReduceMean", "Sub", "Pow", "ReduceMean_1", "Add", "Sqrt", "Div", "Mul")
]


@pytest.fixture
def fake_trt(monkeypatch):
    """Install the fake as `tensorrt` for one test, with a fake GPU; returns a version switcher."""

    def install(version: str):
        module = _load_fake(version)
        monkeypatch.setitem(sys.modules, "tensorrt", module)
        gpu = module.FAKE_GPU
        monkeypatch.setattr(
            trt_export, "gpu_info", lambda: trt_plan.GpuInfo(gpu["name"], gpu["compute_capability"])
        )
        return module

    return install


def _decompose_layernorm(source: Path, target: Path) -> None:
    """Rewrite LayerNormalization into ops TensorRT 8.5 imports, nodes named '/norm/...' (test helper)."""
    import onnx
    from onnx import helper

    model = onnx.load(source)
    nodes = []
    for node in model.graph.node:
        if node.op_type != "LayerNormalization":
            nodes.append(node)
            continue
        x, scale, bias = node.input[:3]
        eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
        p = "/norm/"
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(eps, np.float32), p + "eps"))
        model.graph.initializer.append(onnx.numpy_helper.from_array(np.array(2.0, np.float32), p + "two"))
        nodes += [
            helper.make_node("ReduceMean", [x], [p + "mean"], name=p + "ReduceMean", axes=[-1]),
            helper.make_node("Sub", [x, p + "mean"], [p + "d"], name=p + "Sub"),
            helper.make_node("Pow", [p + "d", p + "two"], [p + "sq"], name=p + "Pow"),
            helper.make_node("ReduceMean", [p + "sq"], [p + "var"], name=p + "ReduceMean_1", axes=[-1]),
            helper.make_node("Add", [p + "var", p + "eps"], [p + "ve"], name=p + "Add"),
            helper.make_node("Sqrt", [p + "ve"], [p + "std"], name=p + "Sqrt"),
            helper.make_node("Div", [p + "d", p + "std"], [p + "n"], name=p + "Div"),
            helper.make_node("Mul", [p + "n", scale], [p + "s"], name=p + "Mul"),
            helper.make_node("Add", [p + "s", bias], [node.output[0]], name=p + "Add_1"),
        ]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    model.opset_import[0].version = 16
    onnx.save(model, target)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory, toy_onnx):
    folder = tmp_path_factory.mktemp("trt")
    fp16_path = folder / "model.fp16.onnx"
    onnx_export.save(fp16_export.convert(onnx_export.load(toy_onnx)).model, fp16_path)
    decomposed = folder / "model.opset16.onnx"
    _decompose_layernorm(toy_onnx, decomposed)
    return {"fp32": toy_onnx, "fp16": fp16_path, "fp32_opset16": decomposed, "folder": folder}


def test_trt11_is_strongly_typed_and_never_uses_the_fp16_flag(fake_trt, graphs, tmp_path):
    trt = fake_trt("11.4.0.106")
    assert not hasattr(trt.BuilderFlag, "FP16")  # the fake models the removal
    engine = trt_export.build_engine(
        graphs["fp16"], tmp_path / "model.engine", profile=PROFILE, timing_cache_dir=tmp_path
    )
    build = trt.LAST_BUILD
    assert build["strongly_typed"]
    assert build["network_flags"] & (1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    assert "TF32" not in build["config_flags"]  # TF32 off unless asked
    assert build["memory_limits"] == {"WORKSPACE": trt_plan.DEFAULT_WORKSPACE_MB << 20}
    assert engine.precision == "fp16" and engine.layer_precisions["fp16"] > 0
    assert engine.verification["status"] == "verified"
    assert engine.io_dtypes == trt_plan.interface_dtypes("INT64")
    assert engine.builder["fp16_flag"] is False and engine.tensorrt_version == "11.4.0.106"
    assert engine.gpu_name == "Fake T4" and engine.compute_capability == "7.5"
    assert (tmp_path / "model.engine").is_file()


def test_profiles_cover_both_inputs(fake_trt, graphs, tmp_path):
    trt = fake_trt("11.4.0.106")
    trt_export.build_engine(graphs["fp16"], tmp_path / "e.engine", profile=PROFILE)
    (profile,) = trt.LAST_BUILD["profiles"]
    assert profile["images"] == ((1, 3, 320, 320), (1, 3, 320, 320), (8, 3, 320, 320))
    assert profile["orig_target_sizes"] == ((1, 2), (1, 2), (8, 2))


def test_missing_profile_for_a_dynamic_input_is_an_error(fake_trt, graphs, tmp_path):
    fake_trt("11.4.0.106")
    with pytest.raises(ExportError, match="'orig_target_sizes' has a dynamic shape"):
        trt_export.build_engine(graphs["fp16"], tmp_path / "e.engine", profile={"images": PROFILE["images"]})


def test_timing_cache_round_trip_keyed_by_version_and_gpu(fake_trt, graphs, tmp_path):
    trt = fake_trt("10.13.0.35")
    engine = trt_export.build_engine(
        graphs["fp16"], tmp_path / "a.engine", profile=PROFILE, timing_cache_dir=tmp_path
    )
    cache = tmp_path / "timing-trt10.13.0.35-fake-t4-sm7.5.cache"
    assert engine.builder["timing_cache"] == cache.name and engine.builder["timing_cache_status"] == "new"
    assert trt.LAST_BUILD["cache_hits"] == 0 and cache.read_bytes().startswith(b"FAKE-TRT-CACHE")
    first = cache.read_bytes()
    again = trt_export.build_engine(
        graphs["fp16"], tmp_path / "b.engine", profile=PROFILE, timing_cache_dir=tmp_path
    )
    assert again.builder["timing_cache_status"] == "reused"
    assert trt.LAST_BUILD["cache_hits"] == len(json.loads(first[len(b"FAKE-TRT-CACHE") :])["entries"]) > 0


@pytest.mark.parametrize("blob", ["foreign", "garbage"])
def test_a_foreign_or_unreadable_timing_cache_warns_and_rebuilds(fake_trt, graphs, tmp_path, capsys, blob):
    """docs/export.md says to copy the artifact folder to the target: a foreign cache must not crash."""
    trt = fake_trt("10.14.1.48")
    cache = tmp_path / trt_plan.timing_cache_name("10.14.1.48", trt_plan.GpuInfo("Fake T4", "7.5"))
    if blob == "foreign":  # made on another GPU, copied under this machine's name
        trt.FAKE_GPU = {"name": "Jetson AGX Orin", "compute_capability": "8.7"}
        config = trt.Builder(trt.Logger()).create_builder_config()
        made = config.create_timing_cache(b"")
        made._entries["x@10.14.1.48"] = "tactic-9"
        cache.write_bytes(bytes(made.serialize()))
        trt.FAKE_GPU = {"name": "Fake T4", "compute_capability": "7.5"}
    else:
        cache.write_bytes(b"\x00not a timing cache")
    engine = trt_export.build_engine(
        graphs["fp16"], tmp_path / "e.engine", profile=PROFILE, timing_cache_dir=tmp_path
    )
    why = "was made by another TensorRT version or GPU" if blob == "foreign" else "cannot be read"
    assert why in capsys.readouterr().err and why in engine.builder["timing_cache_status"]
    assert trt.LAST_BUILD["cache_used"] and (tmp_path / "e.engine").is_file()
    rewritten = trt.Builder(trt.Logger()).create_builder_config().create_timing_cache(cache.read_bytes())
    assert rewritten is not None and rewritten._made_by["name"] == "Fake T4"  # replaced by this GPU's cache


def test_trt10_typed_graph_strongly_typed_fp32_graph_uses_fp16_flag(fake_trt, graphs, tmp_path):
    trt = fake_trt("10.3.0.30")
    trt_export.build_engine(graphs["fp16"], tmp_path / "a.engine", profile=PROFILE, typed_graph=True)
    assert trt.LAST_BUILD["strongly_typed"] and "FP16" not in trt.LAST_BUILD["config_flags"]
    engine = trt_export.build_engine(
        graphs["fp32"], tmp_path / "b.engine", profile=PROFILE, typed_graph=False
    )
    assert not trt.LAST_BUILD["strongly_typed"] and "FP16" in trt.LAST_BUILD["config_flags"]
    assert engine.builder["fp16_flag"] and engine.layer_precisions.get("fp16", 0) > 0


def test_an_fp32_only_engine_is_not_called_fp16(fake_trt, graphs, tmp_path):
    """The RF-DETR/Ultralytics failure: FP32 graph, strongly typed build, engine called FP16."""
    trt = fake_trt("11.4.0.106")
    with pytest.raises(ExportError, match="network has no FP16 tensors"):
        trt_export.build_engine(graphs["fp32"], tmp_path / "model.engine", profile=PROFILE, typed_graph=True)
    assert not (tmp_path / "model.engine").exists() and not trt.LAST_BUILD  # refused before building
    engine = trt_export.build_engine(
        graphs["fp32"], tmp_path / "model.engine", profile=PROFILE, fp16=False, typed_graph=False
    )
    assert engine.precision == "fp32" and "fp16" not in engine.layer_precisions
    assert engine.verification["status"] == "verified"


def test_trt11_refuses_fp16_from_an_untyped_graph():
    with pytest.raises(ExportError, match="no FP16 builder flag"):
        trt_plan.plan_build("11.4.0", fp16=True, have_typed_graph=False)


def test_version_plans_and_trtexec_lines():
    profile = trt_plan.artifact_profile((1, 1, 8), 640, 640)
    jp5 = trt_plan.plan_build("8.5.2", fp16=True, have_typed_graph=True)
    assert (jp5.graph, jp5.fp16_flag, jp5.explicit_batch_flag, jp5.strongly_typed) == (
        "fp32",
        True,
        True,
        False,
    )
    line5 = trt_plan.trtexec_command("model.onnx", "model.engine", jp5, profile)
    assert "--fp16" in line5 and "--stronglyTyped" not in line5
    assert "--minShapes=images:1x3x640x640,orig_target_sizes:1x2" in line5
    assert "--maxShapes=images:8x3x640x640,orig_target_sizes:8x2" in line5
    jp6 = trt_plan.plan_build("10.3.0", fp16=True, have_typed_graph=True)
    line6 = trt_plan.trtexec_command("model.fp16.onnx", "model.engine", jp6, profile)
    assert "--stronglyTyped" in line6 and "--fp16" not in line6 and "--noTF32" in line6
    jp72 = trt_plan.plan_build("11.4.1", fp16=True, have_typed_graph=True)
    line11 = trt_plan.trtexec_command("model.fp16.onnx", "model.engine", jp72, profile)
    assert "--fp16" not in line11 and "--stronglyTyped" not in line11
    with pytest.raises(ExportError, match="too old"):
        trt_plan.plan_build("8.2.1")


def test_without_tensorrt_the_error_says_what_is_missing_and_how_to_build(monkeypatch, graphs, tmp_path):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import fails as when it is not installed
    with pytest.raises(ExportError) as info:
        trt_export.build_engine(graphs["fp16"], tmp_path / "model.engine", profile=PROFILE)
    message = str(info.value)
    assert "TensorRT Python package cannot be imported" in message
    assert "export/jetson/build_engine.sh" in message and "trtexec --onnx=model.fp16.onnx" in message
    assert not (tmp_path / "model.engine").exists()


def test_no_gpu_is_a_clear_error(fake_trt, monkeypatch, graphs, tmp_path):
    fake_trt("11.4.0.106")
    monkeypatch.setattr(trt_export, "gpu_info", lambda: None)
    with pytest.raises(ExportError, match="no CUDA GPU is visible"):
        trt_export.build_engine(graphs["fp16"], tmp_path / "model.engine", profile=PROFILE)


def test_inspector_precisions_reads_every_layout_and_every_tensor():
    v85 = {
        "Layers": [
            {
                "Inputs": [{"Format/Datatype": "Row major linear FP32"}],
                "Outputs": [{"Format/Datatype": "Channel major FP16 format where channel % 2 == 0"}],
            }
        ],
        "Bindings": ["images"],
    }
    v10 = {
        "Layers": [
            {
                "Outputs": [
                    {"Format/Datatype": "Row major linear FP32 format"},
                    {"Format/Datatype": "Row major linear FP16 format"},
                ]
            }
        ]
    }
    v11 = {
        "Layers": [
            {
                "Inputs": [{"Format": "Row major linear", "Datatype": "Half"}],
                "Outputs": [
                    {"Format": "Row major linear", "Datatype": "Int64"},
                    {"Format": "Row major linear", "Datatype": "Half"},
                ],
            }
        ],
        "I/O Tensors": [{"Name": "boxes", "IOMode": "Output", "DataType": "Float"}],
    }
    v11_caps = {"Layers": [{"Outputs": [{"Format": "Row major linear", "DataType": "Half"}]}]}
    assert trt_verify.inspector_precisions(json.dumps(v85)) == ({"fp32": 1, "fp16": 1}, "")
    assert trt_verify.inspector_precisions(json.dumps(v10)) == ({"fp32": 1, "fp16": 1}, "")
    assert trt_verify.inspector_precisions(json.dumps(v11)) == ({"fp16": 2, "int": 1, "fp32": 1}, "")
    assert trt_verify.inspector_precisions(json.dumps(v11_caps)) == ({"fp16": 1}, "")
    counts, why = trt_verify.inspector_precisions(json.dumps({"Layers": ["conv1", "conv2"], "Bindings": []}))
    assert counts == {} and "layer names only" in why
    counts, why = trt_verify.inspector_precisions(json.dumps({"Layers": [{"Outputs": [{"Type": "?"}]}]}))
    assert counts == {} and "no per-tensor data type" in why


def test_fp32_layer_outcome_reads_fused_engine_layer_names():
    """How the layers pinned to FP32 ran, from engine layer names as 8.x writes them: plain, fused
    with " + " or PWN(...), inside a Myelin region, behind a reformat copy, or gone."""

    def layer(name, *types):
        return {"Name": name, "Outputs": [{"Format/Datatype": f"Row major linear {t}"} for t in types]}

    inspector = {
        "Layers": [
            layer("/n1/Sqrt", "FP32"),
            layer("/n1/Pow + /n1/ReduceMean", "FP32"),
            layer("PWN(/n2/Sub, /n2/Div)", "FP16"),
            layer("{ForeignNode[/n3/MatMul.../n3/Add]}", "FP32"),
            layer("Reformatting CopyNode for Input Tensor 0 to /n4/Sqrt", "FP16"),
            layer("/n5/Shape", "Int32"),
        ],
        "Bindings": ["images"],
    }
    asked = ["/n1/Sqrt", "/n1/Pow", "/n1/ReduceMean", "/n2/Div", "/n3/Add", "/n4/Sqrt", "/n5/Shape"]
    outcome = trt_verify.fp32_layer_outcome(json.dumps(inspector), asked)
    assert outcome == {
        "asked": 7,
        "fp32": 3,
        "not_fp32": 1,
        "not_fp32_layers": ["/n2/Div"],
        "fused": 1,
        "fused_layers": ["/n3/Add"],
        "not_found": 2,
        "not_found_layers": ["/n4/Sqrt", "/n5/Shape"],  # a reformat copy and an integer layer say nothing
    }
    line = trt_verify.describe_fp32_outcome(outcome)
    assert line.startswith("FP32 layers: 3 of 7 asked ran in FP32")
    names_only = trt_verify.fp32_layer_outcome(json.dumps({"Layers": ["/n1/Sqrt"]}), asked)
    assert names_only == {"asked": 7, "unknown": "the engine inspector gives no per-layer types"}


def test_precision_verdicts_refuse_only_on_positive_evidence():
    judge = trt_verify.judge_precision
    fused = judge(
        fp16=True,
        strongly_typed=True,
        network={"fp16": 40, "fp32": 9, "int": 3},
        inspector={"fp32": 3, "int": 1, "fp16": 12},
        inspector_gap="",
    )
    assert fused["status"] == "verified"
    silent = judge(
        fp16=True, strongly_typed=False, network={"fp32": 49}, inspector={}, inspector_gap="names only"
    )
    assert silent["status"] == "unverified" and "names only" in silent["reason"]
    fp32_engine = judge(
        fp16=True,
        strongly_typed=False,
        network={"fp32": 49},
        inspector={"fp32": 30, "int": 2},
        inspector_gap="",
    )
    assert fp32_engine["status"] == "refused" and "none in FP16" in fp32_engine["reason"]
    # strongly typed, the network's types are the engine's: an inspector without FP16 tensors (a
    # fused layer listing only its FP32 boundary) fails to corroborate, it is no evidence against
    for network in ({"fp16": 40, "fp32": 9}, {}):  # {}: a trtexec build, whose network we never see
        typed = judge(
            fp16=True, strongly_typed=True, network=network, inspector={"fp32": 3, "int": 1}, inspector_gap=""
        )
        assert typed["status"] == "unverified" and "none in FP16" in typed["reason"], network
    typed_fp32 = judge(fp16=True, strongly_typed=True, network={"fp32": 49}, inspector={}, inspector_gap="")
    assert typed_fp32["status"] == "refused"


def test_interface_accepts_int32_index_tensors_where_the_target_says_so():
    verdict = {"status": "verified"}
    int32_io = trt_plan.interface_dtypes("INT32")
    trt_verify.verify_engine(int32_io, verdict, expected_io=int32_io, source="m.onnx", version="8.5.2")
    with pytest.raises(ExportError, match="wrong dtypes.*orig_target_sizes"):
        trt_verify.verify_engine(
            int32_io,
            verdict,
            expected_io=trt_plan.interface_dtypes("INT64"),
            source="m.onnx",
            version="10.3.0",
        )
    assert (
        trt_plan.default_index_dtype("8.6.2") == "INT32" and trt_plan.default_index_dtype("10.3") == "INT64"
    )


@pytest.mark.parametrize(
    "version", ["8.5.2.2", "8.6.1.5", "10.3.0.26", "10.13.0.35", "10.14.1.48", "11.1.0.106"]
)
def test_fake_builds_pass_for_every_supported_version(fake_trt, graphs, tmp_path, version):
    trt = fake_trt(version)
    major = int(version.split(".")[0])
    if major < 10:  # weak FP16 on the FP32 graph; 8.5 needs LayerNorm decomposed and held in FP32
        graph = graphs["fp32_opset16"] if version.startswith("8.5") else graphs["fp32"]
        engine = trt_export.build_engine(
            graph,
            tmp_path / "e.engine",
            profile=PROFILE,
            typed_graph=False,
            fp32_layers=NORM_NODES,
            timing_cache_dir=tmp_path,
        )
        assert "FP16" in trt.LAST_BUILD["config_flags"]
    else:
        engine = trt_export.build_engine(
            graphs["fp16"], tmp_path / "e.engine", profile=PROFILE, timing_cache_dir=tmp_path
        )
        assert trt.LAST_BUILD["strongly_typed"]
    index = "INT32" if major < 9 else "INT64"
    assert engine.io_dtypes == trt_plan.interface_dtypes(index)
    target = targets.profile_for_tensorrt(version)  # what `--target` promises for this version
    assert engine.io_dtypes == trt_plan.io_dtype_names(target.io_dtypes)
    assert engine.verification["status"] == "verified" and engine.layer_precisions["fp16"] > 0
    assert engine.tensorrt_version == version


def test_fused_layers_whose_first_output_is_not_fp16_still_verify(fake_trt, graphs, tmp_path):
    """TensorRT fuses the graph; a fused layer lists its FP32/INT64 graph outputs first."""
    trt = fake_trt("10.14.1.48")
    engine = trt_export.build_engine(graphs["fp16"], tmp_path / "e.engine", profile=PROFILE)
    plan = json.loads((tmp_path / "e.engine").read_bytes())
    info = json.loads(trt.ICudaEngine(plan).create_engine_inspector().get_engine_information(1))
    first = {trt_verify.precision_kind(layer["Outputs"][0]["Format/Datatype"]) for layer in info["Layers"]}
    assert len(info["Layers"]) < len(onnx_export.load(graphs["fp16"]).graph.node)  # fused
    assert first - {"fp16"}, "the fake must list non-FP16 first outputs"
    assert engine.verification["status"] == "verified"


def test_trt85_parser_refuses_layernormalization_and_names_it(fake_trt, graphs, tmp_path):
    fake_trt("8.5.2.2")
    with pytest.raises(ExportError, match="cannot parse.*LayerNormalization"):
        trt_export.build_engine(graphs["fp32"], tmp_path / "e.engine", profile=PROFILE, typed_graph=False)


def test_weak_fp16_without_fp32_islands_trips_the_layernorm_overflow_check(fake_trt, graphs, tmp_path):
    fake_trt("8.5.2.2")
    with pytest.raises(ExportError, match="LayerNorm runs in FP16"):
        trt_export.build_engine(
            graphs["fp32_opset16"], tmp_path / "e.engine", profile=PROFILE, typed_graph=False
        )


def test_an_inspector_without_types_records_unverified(fake_trt, graphs, tmp_path, monkeypatch):
    trt = fake_trt("10.3.0.26")
    monkeypatch.setattr(
        trt.EngineInspector,
        "get_engine_information",
        lambda self, format: json.dumps({"Layers": ["a", "b"], "Bindings": []}),
    )
    with pytest.warns(UserWarning, match="precision unverified.*layer names only"):
        engine = trt_export.build_engine(graphs["fp16"], tmp_path / "e.engine", profile=PROFILE)
    assert engine.verification["status"] == "unverified" and (tmp_path / "e.engine").is_file()


def _artifact_of(tmp_path, sources: dict, *, opset: int, batch_opt: int, target: dict | None = None):
    """An artifact folder holding `sources` ({"fp32": path, "fp16": path}) as model.onnx and
    model.fp16.onnx, with the sidecar dfine-export would write for a 5-class 320 px model."""
    import shutil

    from dfine_deploy.artifact import ArtifactInfo, GraphInfo, write_artifact
    from dfine_deploy.files import sha256_file

    folder = tmp_path / "artifact"
    folder.mkdir()
    names = {"fp32": "model.onnx", "fp16": "model.fp16.onnx"}
    for key, source in sources.items():
        shutil.copyfile(source, folder / names[key])
    write_artifact(
        folder,
        ArtifactInfo(
            model="custom",
            num_classes=5,
            class_names=list("abcde"),
            input_height=320,
            input_width=320,
            batch_min=1,
            batch_opt=batch_opt,
            batch_max=4,
            num_top_queries=30,
            graphs={k: GraphInfo(names[k], sha256_file(folder / names[k]), k, opset) for k in sources},
            target=target or {},
        ),
    )
    return folder


def test_build_for_artifact_records_the_engine_in_the_sidecar(fake_trt, graphs, tmp_path, capsys):
    from dfine_deploy.artifact import read_artifact

    folder = _artifact_of(tmp_path, {"fp32": graphs["fp32"], "fp16": graphs["fp16"]}, opset=17, batch_opt=2)
    fake_trt("11.4.0.106")
    assert trt_export.main([str(folder)]) == 0
    info = read_artifact(folder)
    engine = info.engine_for("fp16")
    assert engine.source_graph == "model.fp16.onnx" and engine.precision == "fp16"
    assert engine.profile["orig_target_sizes"] == [[1, 2], [2, 2], [4, 2]]
    assert (folder / engine.builder["timing_cache"]).is_file() and (folder / "model.engine").is_file()
    assert '"tensorrt_version": "11.4.0.106"' in capsys.readouterr().out


def test_tensorrt_layernorm_overflow_warning_fails_the_build(fake_trt, tmp_path):
    """TensorRT's warning about FP16 Reduce/Pow after attention (decomposed LayerNorm) is fatal."""
    import onnx

    x = onnx.helper.make_tensor_value_info("images", onnx.TensorProto.FLOAT16, ["N", 4])
    y = onnx.helper.make_tensor_value_info("mean", onnx.TensorProto.FLOAT16, ["N", 1])
    node = onnx.helper.make_node(
        "ReduceMean", ["images"], ["mean"], name="/encoder/norm/ReduceMean", axes=[1]
    )
    path = tmp_path / "decomposed.onnx"
    onnx.save(
        onnx.helper.make_model(
            onnx.helper.make_graph([node], "g", [x], [y]), opset_imports=[onnx.helper.make_opsetid("", 17)]
        ),
        path,
    )
    fake_trt("10.13.0.35")
    with pytest.raises(ExportError, match="LayerNorm runs in FP16"):
        trt_export.build_engine(path, tmp_path / "e.engine", profile={"images": [[1, 4], [1, 4], [2, 4]]})
    assert not (tmp_path / "e.engine").exists()


def test_a_jetpack5_artifact_builds_on_tensorrt_8_5_with_its_fp32_layers_and_int32_io(
    fake_trt, graphs, tmp_path
):
    """What `dfine-export --target jetpack5` records drives the 8.5 build: graph, interface, constraints."""
    from dfine_deploy.artifact import read_artifact

    profile = targets.get_profile("jetpack5")
    layers = targets.constrained_layers(onnx_export.load(graphs["fp32_opset16"]), NORM_NODES)
    # the FP16 graph is present, but 8.x builds from model.onnx
    folder = _artifact_of(
        tmp_path,
        {"fp32": graphs["fp32_opset16"], "fp16": graphs["fp16"]},
        opset=16,
        batch_opt=1,
        target={"profile": profile.to_dict(), "fp32_layers": layers},
    )
    trt = fake_trt("8.5.2.2")
    engine = trt_export.build_for_artifact(folder)
    assert engine.source_graph == "model.onnx" and engine.builder["fp16_flag"]
    assert {"FP16", "OBEY_PRECISION_CONSTRAINTS"} <= trt.LAST_BUILD["config_flags"]
    assert engine.io_dtypes["orig_target_sizes"] == "INT32" and engine.io_dtypes["labels"] == "INT32"
    assert engine.verification["status"] == "verified"
    outcome = engine.verification["fp32_layers"]  # the pinned layers, by the fake's inspector
    kinds = ("fp32", "not_fp32", "fused", "not_found")
    assert outcome["asked"] == len(layers) == sum(outcome[k] for k in kinds), outcome
    assert outcome["fused"] > 0  # the fake fuses, as Myelin does: its inside is not typed
    assert read_artifact(folder).engine_for("fp16").tensorrt_version == "8.5.2.2"


def test_the_fake_refuses_what_a_version_does_not_bind(fake_trt):
    """Code written against the wrong version's names fails on the fake as on the real module."""
    trt11 = fake_trt("11.1.0.106")
    builder = trt11.Builder(trt11.Logger(trt11.Logger.WARNING))
    network = builder.create_network(1 << int(trt11.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    with pytest.raises(AttributeError):
        trt11.BuilderFlag.FP16  # noqa: B018 - removed in 11
    with pytest.raises(AttributeError, match="platform_has_fast_fp16"):
        builder.platform_has_fast_fp16  # noqa: B018
    config = builder.create_builder_config()
    cache = config.create_timing_cache(b"")
    with pytest.raises(TypeError, match="set_timing_cache"):
        config.set_timing_cache(cache, ignore=False)  # NVIDIA's keyword is ignore_mismatch
    assert config.set_timing_cache(cache, ignore_mismatch=False) is True
    assert network.num_layers == 0
    trt85 = fake_trt("8.5.2.2")
    assert "INT64" not in trt85.DataType.__members__
    assert not hasattr(trt85.NetworkDefinitionCreationFlag, "STRONGLY_TYPED")


@pytest.mark.parametrize(
    "argv", [["--batch", "0", "1", "8"], ["--batch", "4", "2", "8"], ["--workspace-mb", "0"]]
)
def test_engine_build_numbers_out_of_range_are_one_line(tmp_path, capsys, argv):
    from tests.runtime.test_runtime_detector import make_artifact

    folder = make_artifact(tmp_path / "art")
    assert trt_export.main([str(folder), *argv]) == 2
    err = capsys.readouterr().err
    assert f"{argv[0]} {' '.join(argv[1:])}:" in err and len(err.strip().splitlines()) == 1, err


def test_only_the_float_layers_of_fp32_nodes_are_pinned(fake_trt):
    """A further layer of an island node is pinned when float; an integer one, or the own layer of
    another ONNX node whose name only looks like a further layer (`/n/Add_3`), is left alone."""
    trt = fake_trt("8.5.2.2")
    network = trt.INetworkDefinition(0)

    def layer(name: str, dtype) -> object:
        return trt.ILayer(name, "Add", [], [trt.ITensor(f"{name}:0", (1,), dtype)])

    network._layers = [
        layer("/n/Add", trt.DataType.FLOAT),
        layer("/n/Add_3", trt.DataType.FLOAT),  # another node of the graph
        layer("/n/Add_7", trt.DataType.HALF),  # a further layer of /n/Add
        layer("/n/Add_8", trt.DataType.INT32),  # a further, integer layer of /n/Add
    ]
    assert trt_export._hold_in_fp32(network, {"/n/Add": 1}, ["/n/Add_3"]) == 2
    pinned = [lay.name for lay in network._layers if lay.precision_is_set]
    assert pinned == ["/n/Add", "/n/Add_7"]
    assert network._layers[2].get_output_type(0) == trt.DataType.FLOAT
