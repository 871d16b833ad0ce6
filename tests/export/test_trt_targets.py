"""TensorRT target profiles and the offline ONNX-parser check against the vendored operator tables."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from dfine_deploy.errors import ExportError
from dfine_deploy.export import targets
from dfine_deploy.runtime import tensorrt_plan

ROOT = Path(__file__).parents[2]


def _graph(nodes, inputs, outputs, initializers=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _vi(name, elem=TensorProto.FLOAT, shape=("N", 4)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def _layernorm_model(opset=17):
    scale = numpy_helper.from_array(np.ones(4, np.float32), "scale")
    node = helper.make_node(
        "LayerNormalization", ["x", "scale"], ["y"], name="/norm/LayerNormalization", axis=-1
    )
    return _graph([node], [_vi("x")], [_vi("y")], [scale], opset)


def test_every_table_names_its_source_and_ref():
    for path in sorted(targets.TABLES.glob("trt*.json")):
        table = json.loads(path.read_text())
        assert (
            table["source"] == "https://github.com/onnx/onnx-tensorrt"
            and table["path"] == "docs/operators.md"
        )
        assert len(table["ref"]) == 40 and table["ref_from"]
        assert {"Conv", "MatMul", "TopK", "Gather", "Softmax"} <= set(table["ops"])
    assert {p.operator_table for p in targets.PROFILES.values()} == {
        p.stem.removeprefix("trt") for p in targets.TABLES.glob("trt*.json")
    }


def test_the_pinned_parsers_and_the_oracle_tags_name_the_profiles_rows():
    from scripts import update_trt_operator_tables as regen

    assert set(regen.VERSIONS) == {p.operator_table for p in targets.PROFILES.values()}
    for version, pin in regen.VERSIONS.items():  # each recorded table came from its pin, or names it
        recorded = targets.operator_table(version)  # (10.3's stands in for a pin not read offline)
        assert pin.commit in f"{recorded['ref']} {recorded['ref_from']}" and pin.tag in recorded["ref_from"]
    from scripts.trt_oracle import TAGS

    assert {row.profile for row in TAGS.values()} == set(targets.PROFILES)
    for tag, row in TAGS.items():  # a tag runs a release of its profile's major version
        assert (
            tag == row.tag
            and row.version.split(".")[0] == targets.PROFILES[row.profile].tensorrt.split(".")[0]
        )


def test_layernormalization_importer_appears_in_86():
    assert "LayerNormalization" not in targets.supported_onnx_ops("8.5.2")
    for version in ("8.6", "10.3", "10.13.3", "10.14", "11.1"):
        assert "LayerNormalization" in targets.supported_onnx_ops(version)
    assert targets.operator_table("8.5")["opset_max"] == 17
    assert "less than 3840" in targets.supported_onnx_ops("10.14")["TopK"]


def test_versions_map_to_profiles():
    assert targets.get_profile("jetpack5").name == "trt8.5"
    assert targets.get_profile("jetpack6.0").tensorrt == "8.6"
    assert targets.get_profile("jetpack6").name == "trt10.3"
    assert targets.get_profile("jetpack7").name == "trt10.14"
    assert targets.profile_for_tensorrt("8.5.2.2").name == "trt8.5"
    assert targets.profile_for_tensorrt("10.13.3.9").name == "trt10.3"  # the older table is the stricter one
    assert targets.profile_for_tensorrt("11.0.1").name == "trt11"
    with pytest.raises(ExportError, match="not a supported target"):
        targets.profile_for_tensorrt("7.1.3")
    with pytest.raises(ExportError, match="choose one of .*jetpack5"):
        targets.get_profile("jetpack4")


def test_installed_tensorrt_must_fit_the_export_target():
    get = targets.get_profile
    targets.check_installed(get("jetpack5"), "8.5.2.2")
    targets.check_installed(get("jetpack5"), "8.6.2.3")  # 8.6 imports the 8.5 graph
    targets.check_installed(None, "10.3.0.30")
    targets.check_installed(get("jetpack7"), "11.1.0")
    with pytest.raises(
        ExportError, match=r"\(no --target\) cannot be built by TensorRT 8\.5\.2.*--target jetpack5"
    ):
        targets.check_installed(None, "8.5.2")
    with pytest.raises(ExportError, match=r"\(--target trt8\.6\) .* export with --target jetpack5"):
        targets.check_installed(get("trt8.6"), "8.5.2")
    with pytest.raises(ExportError, match=r"is for TensorRT 8\.x .* export with --target trt10\.3"):
        targets.check_installed(get("jetpack5"), "10.3.0")


def test_check_names_layernormalization_for_85_only():
    model = _layernorm_model()
    report = targets.check_parser_support(model, "8.5")
    assert not report.ok and report.unsupported_ops == {"LayerNormalization": 1}
    assert "LayerNormalization" in report.problems[0]
    assert targets.check_parser_support(model, "8.6").ok
    with pytest.raises(
        ExportError, match=r"cannot import it: no importer for LayerNormalization.*--target trt8\.6"
    ):
        targets.require_parser_support(model, targets.get_profile("trt8.5"), source="model.onnx")


def test_check_refuses_opset_past_the_table():
    assert (
        "opset 18 is outside 1..17" in targets.check_parser_support(_layernorm_model(18), "8.6").problems[0]
    )


def test_check_reads_restrictions():
    k_computed = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk")
    shape = helper.make_node("Shape", ["x"], ["k"], name="shape", start=1)
    model = _graph([shape, k_computed], [_vi("x")], [_vi("v"), _vi("i", TensorProto.INT64)])
    problems = targets.check_parser_support(model, "8.5").problems
    assert problems == ["TopK 'topk': input `K` is computed, but must be a constant"]
    assert targets.check_parser_support(model, "8.6").ok  # 8.6 lifted that limit

    big_k = numpy_helper.from_array(np.array([4000], np.int64), "k")
    unsorted = helper.make_node("TopK", ["x", "k"], ["v", "i"], name="topk", sorted=0)
    model = _graph([unsorted], [_vi("x")], [_vi("v"), _vi("i", TensorProto.INT64)], [big_k])
    assert targets.check_parser_support(model, "10.14").problems == [
        "TopK 'topk': `K` = 4000, must be less than 3840",
        "TopK 'topk': attribute `sorted` = 0, must be 1",
    ]

    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    resize = helper.make_node("Resize", ["x", "", "scales"], ["y"], name="up", mode="cubic")
    model = _graph([resize], [_vi("x", shape=("N", 1, 4, 4))], [_vi("y", shape=("N", 1, 8, 8))], [scales])
    assert targets.check_parser_support(model, "11.1").problems == [
        "Resize 'up': mode 'cubic' is not one of ['linear', 'nearest']"
    ]


def test_int64_interface_reported_for_8x_when_int32_is_expected():
    node = helper.make_node("Identity", ["s"], ["labels"], name="id")
    model = _graph([node], [_vi("s", TensorProto.INT64)], [_vi("labels", TensorProto.INT64)])
    report = targets.check_parser_support(model, "8.6", io_dtypes={"s": "int64", "labels": "int32"})
    assert report.problems == ["'labels' is INT64; TensorRT 8.6 has no INT64 tensors (INT32 in the engine)"]
    assert targets.check_parser_support(model, "10.3", io_dtypes={"labels": "int32"}).ok


def test_constrained_layers_and_trtexec_flags():
    split = numpy_helper.from_array(np.array([2, 2], np.int64), "split")
    nodes = [
        helper.make_node("Sqrt", ["x"], ["r"], name="/norm/Sqrt"),
        helper.make_node("Split", ["r", "split"], ["a", "b"], name="/norm/Split", axis=1),
        helper.make_node("Shape", ["a"], ["s"], name="/norm/Shape"),
    ]
    model = _graph(nodes, [_vi("x")], [_vi("b"), _vi("s", TensorProto.INT64, (2,))], [split])
    layers = targets.constrained_layers(model, ["/norm/Sqrt", "/norm/Split", "/norm/Shape"])
    assert layers == {"/norm/Sqrt": 1, "/norm/Split": 2}  # the integer Shape layer is left alone
    flags = targets.trtexec_precision_flags(targets.get_profile("jetpack5"), layers)
    assert flags == [
        "--fp16",
        "--precisionConstraints=obey",
        "--layerPrecisions=/norm/Sqrt:fp32,/norm/Split:fp32",
        "--layerOutputTypes=/norm/Sqrt:fp32,/norm/Split:fp32",  # one type: trtexec broadcasts it
    ]
    assert targets.trtexec_precision_flags(targets.get_profile("trt11"), layers) == []
    assert targets.is_constrained_layer("/norm/Sqrt_12", layers, ())
    assert not targets.is_constrained_layer("/norm/Sqrtx", layers, ())


def test_another_nodes_layer_is_not_taken_for_a_further_layer_of_an_island_node():
    """`/norm/Sqrt_3` is a node of its own (integer here): its layer keeps FP16/INT, never pinned."""
    nodes = [
        helper.make_node("Sqrt", ["x"], ["r"], name="/norm/Sqrt"),
        helper.make_node("Shape", ["r"], ["s"], name="/norm/Sqrt_3"),
    ]
    model = _graph(nodes, [_vi("x")], [_vi("s", TensorProto.INT64, (2,))])
    layers = targets.constrained_layers(model, ["/norm/Sqrt", "/norm/Sqrt_3"])
    assert layers == {"/norm/Sqrt": 1}
    others = targets.lookalike_nodes(model, layers)
    assert others == ["/norm/Sqrt_3"]
    assert not targets.is_constrained_layer("/norm/Sqrt_3", layers, others)
    assert targets.is_constrained_layer("/norm/Sqrt_4", layers, others)  # a further layer of /norm/Sqrt


def test_regeneration_script_parses_both_page_layouts():
    from scripts import update_trt_operator_tables as regen

    old = (
        "TensorRT 8.5 supports operators up to Opset 17.\n\n| Operator | Supported | Types | Restrictions |\n"
        "|---|---|---|---|\n| Conv | Y | FP32 |\n| TopK | Y | FP32 | `K` input must be an initializer\n"
        "| LayerNormalization | N |\n"
    )
    assert regen.parse(old) == {
        "opset_min": 1,
        "opset_max": 17,
        "ops": ["Conv", "TopK"],
        "restrictions": {"TopK": "`K` input must be an initializer"},
    }
    new = "TensorRT 11.1 supports operators in the inclusive range of opset 9 to opset 24.\n| Abs | Y |\n"
    assert regen.parse(new)["opset_min"] == 9
    with pytest.raises(ValueError, match="opset range"):
        regen.parse("| Abs | Y |")


# --- the real D-FINE-N graphs -----------------------------------------------------------------------


@dataclass(frozen=True)
class DfineGraphs:
    jp5: Path  # the jetpack5 artifact folder (conftest.py jetpack5_artifact), read-only
    default: Path  # the default graph (opset 17, INT64 I/O) of the same weights
    default_fp16: Any  # fp16.convert of it (Fp16Result): the typed graph and the nodes kept FP32
    own: dict[str, Path]  # each 8.x profile -> the artifact folder of its own graph, read-only
    imgsz: int


def _graph_settings(profile: tensorrt_plan.TargetProfile) -> tuple[int, dict[str, str]]:
    """What export_onnx is given for a target (export/graphs.py traced_graph): opset and interface."""
    return profile.opset, dict(profile.io_dtypes)


@pytest.fixture(scope="module")
def dfine_graphs(tmp_path_factory, jetpack5_artifact):
    """The jetpack5 artifact; from the same weights, the default graph written by export_onnx; and
    per 8.x profile the folder `dfine-export --target` writes: the jetpack5 one where the profile's
    graph settings are jetpack5's, else that graph traced with the profile's settings and the FP32
    layers the export records for it (fp16 islands -> constrained_layers -> trtexec flags)."""
    import shutil

    import torch

    from dfine_deploy.artifact import read_artifact, write_artifact
    from dfine_deploy.export import fp16 as fp16_export
    from dfine_deploy.export import onnx as onnx_export
    from dfine_deploy.hub.loader import load_model
    from dfine_deploy.model.dfine import DeployModel

    root = tmp_path_factory.mktemp("targets")
    imgsz = read_artifact(jetpack5_artifact).input_height
    torch.manual_seed(0)  # the same random weights as the CLI's model
    loaded = load_model("dfine-n", imgsz=(imgsz, imgsz), sampler="gather")
    module = DeployModel(loaded.model, loaded.postprocessor).eval()
    default = root / "default.onnx"
    onnx_export.export_onnx(module, default, height=imgsz, width=imgsz)
    default_fp16 = fp16_export.convert(onnx_export.load(default))
    jp5 = _graph_settings(targets.get_profile("jetpack5"))
    own = {}
    for name, profile in targets.PROFILES.items():
        if profile.precision != tensorrt_plan.LAYER_CONSTRAINTS:
            continue
        if _graph_settings(profile) == jp5:
            own[name] = jetpack5_artifact
            continue
        folder = own[name] = root / name
        shutil.copytree(jetpack5_artifact, folder)
        opset, io = _graph_settings(profile)
        graph = folder / "model.onnx"
        onnx_export.export_onnx(
            module, graph, height=imgsz, width=imgsz, opset=opset, io_dtypes=io, min_opset=opset
        )
        model = onnx_export.load(graph)
        layers = targets.constrained_layers(model, fp16_export.convert(model).kept)
        info = read_artifact(folder)
        info.target = {
            "profile": profile.to_dict(),
            "fp32_layers": layers,
            "fp32_lookalike_nodes": targets.lookalike_nodes(model, layers),
            "trtexec_layer_flags": targets.trtexec_layer_flags(layers),
        }
        write_artifact(folder, info)
    return DfineGraphs(jetpack5_artifact, default, default_fp16, own, imgsz)


@pytest.mark.slow
def test_jetpack5_graph_parses_on_85_and_matches_the_default_graph(dfine_graphs):
    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.export import onnx as onnx_export
    from dfine_deploy.export import parity

    folder, imgsz = dfine_graphs.jp5, dfine_graphs.imgsz
    model = onnx_export.load(folder / "model.onnx")
    counts = onnx_export.op_counts(model)
    assert counts.get("LayerNormalization", 0) == 0 and counts.get("GridSample", 0) == 0
    assert counts["ReduceMean"] > 12 and counts["Sqrt"] >= 12  # LayerNorm, decomposed
    assert onnx_export.opset_of(model) <= 16
    interface = onnx_export.verify_interface(model, source="model.onnx", dtypes=dict(tensorrt_plan.INT32_IO))
    assert interface["orig_target_sizes"][0] == "int32" and interface["labels"][0] == "int32"

    info = read_artifact(folder)
    profile = info.target["profile"]
    assert profile["name"] == "trt8.5" and profile["io_dtypes"]["labels"] == "int32"
    assert all(check["ok"] for check in info.target["parser_check"].values())
    layers = info.target["fp32_layers"]
    assert any("/norm1/Sqrt" in name for name in layers) and any("/cross_attn/" in name for name in layers)
    assert all(not name.startswith("/interface/") for name in layers)

    batches = parity.make_batches(parity.synthetic_scenes(3, seed=1), imgsz, imgsz, (1, 2))
    runner = onnx_export.ort_runner(onnx_export.ort_session(folder / "model.onnx"))
    labels, _, _ = runner(batches[0].images, batches[0].orig_sizes)
    assert labels.dtype == np.int32
    reference = onnx_export.ort_runner(onnx_export.ort_session(dfine_graphs.default))
    exact = parity.GateThresholds(score_p99_abs=1e-4, box_agreement=1.0, label_agreement=1.0, pseudo_ap=0.0)
    report = parity.run_gate(
        reference,
        runner,
        batches,
        exact,
        reference_name="model.onnx (opset 17)",
        candidate_name="jetpack5 model.onnx",
    )
    assert report.box_agreement == 1.0 and report.label_agreement == 1.0, report.summary()
    assert report.score_max_abs <= 1e-4, report.summary()


@pytest.mark.slow
def test_parser_check_on_real_graphs(dfine_graphs):
    from dfine_deploy.export import onnx as onnx_export

    default = onnx_export.load(dfine_graphs.default)
    with pytest.raises(
        ExportError,
        match=r"TensorRT 8\.5's ONNX parser cannot import it: no importer for "
        r"LayerNormalization \(\d+ nodes\).*--target trt8\.5",
    ):
        targets.require_parser_support(default, targets.get_profile("jetpack5"), source="model.onnx")

    own = {name: onnx_export.load(folder / "model.onnx") for name, folder in dfine_graphs.own.items()}
    typed = dfine_graphs.default_fp16.model  # the typed graph every 10.x/11 profile builds from
    for name, profile in targets.PROFILES.items():
        graph = own.get(name, typed)
        assert targets.require_parser_support(graph, profile, source=name).ok
    with pytest.raises(ExportError, match="'labels' is INT64; TensorRT 8.6 has no INT64 tensors"):
        targets.require_parser_support(default, targets.get_profile("jetpack6.0"), source="model.onnx")


def test_target_option_conflicts_are_one_line_errors(tmp_path, capsys):
    from dfine_deploy.export.cli import main as export_main

    assert export_main(["dfine-n", "--target", "jetpack5", "--opset", "17", "-o", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--opset 17 with --target jetpack5: the target fixes opset 16; drop --opset" in err
    assert export_main(["dfine-n", "--target", "trt11", "--sampler", "grid", "-o", str(tmp_path / "b")]) == 2
    assert "need the gather sampler" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export_main(["dfine-n", "--target", "jetpack4"])
    assert "invalid choice: 'jetpack4'" in capsys.readouterr().err


@pytest.mark.slow
def test_runtime_runs_the_int32_artifact_like_the_default_graph(dfine_graphs):
    """The runtime takes the interface dtypes from the graph: INT32 sizes in, INT32 labels out."""
    from dfine_deploy.export import parity
    from dfine_deploy.runtime import Detector

    int32 = Detector.open(dfine_graphs.jp5, backend="onnxruntime", device="cpu", precision="fp32")
    int64 = Detector.open(dfine_graphs.default, backend="onnxruntime", device="cpu")
    frames = [np.ascontiguousarray(img[:, :, ::-1]) for img in parity.synthetic_scenes(2, seed=3)]

    def rows(d):  # random weights tie many scores, so tied detections may come in another order
        table = np.column_stack([d.labels, np.round(d.boxes, 1), d.scores])
        return table[np.lexsort(table[:, ::-1].T)]

    for got, want in zip(int32.predict(frames), int64.predict(frames), strict=True):
        assert got.labels.dtype == np.int64 and len(got.labels) == len(want.labels) > 0
        np.testing.assert_allclose(rows(got), rows(want), atol=1e-4)


# --- every trtexec line we emit, against NVIDIA's own option parser (scripts/trt_oracle) -------
# CI compares the lines with the verdicts recorded from NVIDIA's parser (tests/data/trt_oracle_verdicts.json);
# with DFINE_TRT_SOURCES set (a clone of NVIDIA/TensorRT) it also runs the parser live. The record
# itself and the check's failures are tested in test_trt_oracle.py.


# the two ways build_engine.sh runs on a device: python3 imports dfine_deploy (installed, or from
# the checkout the script sits in), adding --timingCacheFile and --exportLayerInfo; or it cannot
# (no dfine-deploy, no numpy), leaving both out. The test pins each with its own python3 on PATH, so
# the lines do not depend on what the python3 running the suite can import.
SCRIPT_PYTHON = {
    "": 'exec {python} -I -S "$@"',  # no site-packages, PYTHONPATH ignored: dfine_deploy not importable
    " (python3 imports dfine_deploy)": 'exec {python} "$@"',
}
SCRIPT_GPU = "Orin:8.7"  # DFINE_TRT_GPU: the GPU the timing cache is keyed by, for a dry run here


def _script_line(folder: Path, version: str, python: str, *extra: str) -> tuple[str, ...]:
    import os
    import subprocess
    import sys
    import tempfile

    from scripts.trt_oracle.record import ARTIFACT

    with tempfile.TemporaryDirectory() as shims:
        shim = Path(shims) / "python3"
        shim.write_text("#!/bin/sh\n" + SCRIPT_PYTHON[python].format(python=sys.executable) + "\n")
        shim.chmod(0o755)
        done = subprocess.run(
            ["bash", str(ROOT / "export" / "jetson" / "build_engine.sh"), str(folder), "--dry-run", *extra],
            env=dict(
                os.environ,
                PATH=f"{shims}{os.pathsep}{os.environ['PATH']}",
                DFINE_TRT_VERSION=version,
                DFINE_TRT_GPU=SCRIPT_GPU,
                PYTHONPATH=str(ROOT),
            ),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    recorded = any(arg.startswith("--exportLayerInfo=") for arg in done.stdout.split())
    assert recorded == bool(python), f"{python or 'python3 without dfine_deploy'}: {done.stdout}"
    return tuple(arg.replace(str(folder), ARTIFACT) for arg in done.stdout.split()[1:])


def _with_int8_graph(folder: Path) -> None:
    """Give a copied artifact the Q/DQ graph TensorRT builds INT8 engines from (an --int8 export)."""
    import shutil

    from dfine_deploy.artifact import GraphInfo, read_artifact, write_artifact
    from dfine_deploy.files import sha256_file
    from dfine_deploy.runtime.tensorrt_plan import INT8_GRAPH

    file = "model.int8.trt.onnx"
    shutil.copyfile(folder / "model.onnx", folder / file)
    info = read_artifact(folder)
    info.graphs[INT8_GRAPH] = GraphInfo(file, sha256_file(folder / file), "int8", 17)
    info.backend_graphs.setdefault("tensorrt", {})["int8"] = INT8_GRAPH
    write_artifact(folder, info)


def _emitted_lines(dfine_graphs: DfineGraphs, artifact: Path):
    """Every trtexec line the product writes, per tag (scripts/trt_oracle/record.py Line)."""
    from dfine_deploy.artifact import read_artifact, write_artifact
    from dfine_deploy.runtime.tensorrt_plan import artifact_profile, plan_build, trtexec_command
    from scripts.trt_oracle import TAGS
    from scripts.trt_oracle.record import BASE, Line

    imgsz = dfine_graphs.imgsz
    _with_int8_graph(artifact)
    lines = []
    for tag, row in TAGS.items():
        name, version = row.profile, row.version
        profile = targets.PROFILES[name]
        own = dfine_graphs.own.get(name, dfine_graphs.jp5)  # 10.x/11.x: no layer flags to read
        layers = read_artifact(own).target["fp32_layers"]
        plan = plan_build(version)
        shapes = artifact_profile((1, 1, 2), imgsz, imgsz)
        command = trtexec_command(f"{plan.graph}.onnx", "model.engine", plan, shapes)
        lines.append(Line(tag, "tensorrt_plan.trtexec_command", tuple(command[1:])))
        precision = targets.trtexec_precision_flags(profile, layers)
        lines.append(Line(tag, f"targets.trtexec_precision_flags({name})", (*command[1:9], *precision)))
        lines.append(Line(tag, f"{name} build_only_flag", (*BASE, profile.build_only_flag)))
        if profile.precision == "layer-constraints":
            folder = own  # the 8.x target's own graph and FP32 layers
            forms: tuple[tuple[str, ...], ...] = ((), ("--tf32",), ("--fp32",))  # no INT8 on 8.x
        else:
            folder = artifact
            info = read_artifact(folder)
            info.target = {"profile": profile.to_dict()}
            write_artifact(folder, info)
            forms = ((), ("--tf32",), ("--fp32",), ("--int8",))
        for python in SCRIPT_PYTHON:
            for extra in forms:
                source = " ".join(("build_engine.sh", *extra)) + python
                lines.append(Line(tag, source, _script_line(folder, version, python, *extra)))
    return lines


def _record_live(lines) -> None:
    """scripts/record_trt_oracle.py: every line and probe through the live parser, into the record."""
    from scripts.trt_oracle import TAGS, binary, parse
    from scripts.trt_oracle.record import entry, probe_lines, write

    def verdicts(items):
        found = [(line, parse(line.tag, list(line.argv))) for line in items]
        return [entry(line, v.accepted, v.errors, v.warnings) for line, v in found]

    write(verdicts(lines), verdicts(probe_lines()), {tag: binary(tag)[1].to_dict() for tag in TAGS})


@pytest.mark.slow
def test_every_trtexec_line_we_emit_is_accepted_by_nvidias_parser_and_layer_rules(dfine_graphs, artifact):
    """Each line has an ACCEPTED verdict of trtexec's own option parser of its version (recorded, or
    live with DFINE_TRT_SOURCES), and on 8.x its layer flags pass trtexec's network rules on the real
    D-FINE-N graph as onnx-tensorrt imports it (always live)."""
    import os

    from dfine_deploy.artifact import read_artifact
    from dfine_deploy.export import onnx as onnx_export
    from scripts.trt_oracle import TAGS
    from scripts.trt_oracle.record import RECORD_ENV, load, problems, verdicts_by_line
    from scripts.trt_oracle.sources import sources_dir
    from tests.export.trt_layer_rules import layer_flag_problems

    lines = _emitted_lines(dfine_graphs, artifact)
    if os.environ.get(RECORD_ENV):
        _record_live(lines)
    record = load()
    assert not problems(lines, record), "\n".join(problems(lines, record))
    if sources_dir():
        from scripts.trt_oracle import parse

        known = verdicts_by_line(record)
        for line in lines:
            verdict = parse(line.tag, list(line.argv))
            recorded = known[(line.tag, line.sha256)]
            assert (verdict.accepted, verdict.errors) == (
                recorded["verdict"] == "ACCEPTED",
                recorded["errors"],
            )

    failures = []
    for name, folder in dfine_graphs.own.items():  # each 8.x line on its own target's graph
        graph, tensorrt = onnx_export.load(folder / "model.onnx"), targets.PROFILES[name].tensorrt
        failures += [
            f"{line.tag} {line.source}: {'; '.join(found)[:600]}"
            for line in lines
            if TAGS[line.tag].profile == name
            and (found := layer_flag_problems(graph, list(line.argv), tensorrt))
        ]
    assert not failures, "\n".join(failures)
    # the jetpack6.0 graph as it was before it followed jetpack5's (opset 17, native LayerNorm): 8.6
    # names no layer after a LayerNormalization node, so its 12 LayerNorm pins pin nothing
    native = onnx_export.load(dfine_graphs.default)
    layers = targets.constrained_layers(native, dfine_graphs.default_fp16.kept)
    norms = [n.name for n in native.graph.node if n.op_type == "LayerNormalization" and n.name in layers]
    found = layer_flag_problems(native, targets.trtexec_layer_flags(layers), "8.6")
    unpinned = [p for p in found if "names no layer" in p]
    assert len(norms) == 12 and len(unpinned) == 2 * len(norms), found  # both flags, each LayerNorm
    graph = onnx_export.load(dfine_graphs.jp5 / "model.onnx")
    info = read_artifact(dfine_graphs.jp5)  # integer nodes named like further layers of island nodes
    layers, others = info.target["fp32_layers"], info.target["fp32_lookalike_nodes"]
    assert any(name.endswith("/cross_attn/Add_9") for name in others)
    assert not any(targets.is_constrained_layer(name, layers, others) for name in others)
    assert any("--layerOutputTypes=" in " ".join(line.argv) for line in lines if line.tag == "8.5.2")
    # the pre-fix form (one type per ONNX output) aborts trtexec 8.5 on this graph
    old = "--layerOutputTypes=" + ",".join(f"{n}:{'+'.join(['fp32'] * k)}" for n, k in layers.items())
    assert any("Invalid --layerOutputTypes flag." in p for p in layer_flag_problems(graph, [old]))
