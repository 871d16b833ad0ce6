"""trtexec's own option parser (scripts/trt_oracle): what was recorded from it, and the checks.

The product's lines themselves are checked against the record in test_trt_targets.py (they need
the real D-FINE-N export made there). CI has no NVIDIA sources; with DFINE_TRT_SOURCES set (a clone
of NVIDIA/TensorRT) these tests also run the parser live.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from dfine_deploy.export import targets
from scripts.trt_oracle.sources import sources_dir


def _graph(nodes, inputs, outputs, initializers=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _vi(name, elem=TensorProto.FLOAT, shape=("N", 4)):
    return helper.make_tensor_value_info(name, elem, list(shape))


def test_record_names_what_each_tags_oracle_was_built_from():
    from scripts.trt_oracle import HERE, TAGS
    from scripts.trt_oracle.record import COMMAND, load
    from scripts.trt_oracle.sources import PARSER, REPOSITORY

    record = load()
    assert record["repository"] == REPOSITORY and record["recorded"]["command"] == COMMAND
    assert set(record["tags"]) == set(TAGS)
    for tag, built in record["tags"].items():
        assert len(built["commit"]) == 40, tag
        assert set(PARSER) <= set(built["blobs"]) and all(len(b) == 40 for b in built["blobs"].values())
    assert {entry["tag"] for entry in record["lines"]} == set(TAGS)
    assert not [p for p in HERE.rglob("*") if p.name.startswith(("sampleOptions", "sample_helpers"))]
    if sources_dir():  # the record was made from the sources named now
        from scripts.trt_oracle import binary

        for tag in TAGS:
            assert binary(tag)[1].to_dict() == record["tags"][tag], f"{tag}: re-record with {COMMAND}"


def test_recorded_probes_show_the_parser_can_fail():
    """What one version's trtexec has, another's refuses, in NVIDIA's words (live when sources are set)."""
    from scripts.trt_oracle.record import PROBES, load, probe_lines, verdicts_by_line

    known = verdicts_by_line(load())
    for line, (_, _, expected) in zip(probe_lines(), PROBES, strict=True):
        entry = known[(line.tag, line.sha256)]
        assert entry["errors"] == expected and (entry["verdict"] == "ACCEPTED") == (not expected), entry
        if sources_dir():
            from scripts.trt_oracle import parse

            verdict = parse(line.tag, list(line.argv))
            assert (verdict.accepted, verdict.errors) == (not expected, expected), line.text


def test_a_changed_or_rejected_line_fails_the_check():
    """A line with no recorded verdict (it changed) fails with the re-record command; so does a
    line whose recorded verdict is REJECTED, with NVIDIA's message."""
    from scripts.trt_oracle.record import BASE, COMMAND, Line, load, probe_lines, problems

    record = load()
    recorded = next(
        e for e in record["lines"] if (e["tag"], e["from"]) == ("v10.3.0", "tensorrt_plan.trtexec_command")
    )
    argv = tuple(recorded["line"].split()[1:])
    assert problems([Line("v10.3.0", "today", argv)], record) == []
    changed = Line("8.5.2", "old", (*BASE, "--layerOutputTypes=/decoder/cross_attn/Split:fp32+fp32"))
    assert problems([changed], record) == [
        "8.5.2 old: this line has no recorded verdict of NVIDIA's parser (it changed); "
        f"re-record with {COMMAND}"
    ]
    rejected = probe_lines()[0]
    assert problems([rejected], record) == [
        f"8.5.2 {rejected.source}: NVIDIA's parser REJECTED it: Unknown option: --stronglyTyped "
    ]


def test_86_names_no_layer_after_a_layernormalization_node():
    """8.6's LayerNormalization importer registers no layer (trt_layer_rules.py UNNAMED): a pin by
    the node's name pins nothing there, while the decomposed form's nodes name their layers."""
    from tests.export.trt_layer_rules import layer_flag_problems

    scale = numpy_helper.from_array(np.ones(4, np.float32), "scale")
    nodes = [
        helper.make_node("LayerNormalization", ["x", "scale"], ["n"], name="/norm/LayerNormalization"),
        helper.make_node("Sqrt", ["n"], ["y"], name="/norm/Sqrt"),
    ]
    model = _graph(nodes, [_vi("x")], [_vi("y")], [scale])
    flags = ["--layerPrecisions=/norm/LayerNormalization:fp32,/norm/Sqrt:fp32"]
    assert layer_flag_problems(model, flags, "8.6") == [
        "--layerPrecisions: '/norm/LayerNormalization' names no layer of the network: it pins nothing"
    ]


def test_layer_rules_follow_the_importer():
    """Split imports as one single-output layer per output, Constant as none (trt_layer_rules.py)."""
    from tests.export.trt_layer_rules import first_layers, layer_flag_problems

    split = numpy_helper.from_array(np.array([2, 2], np.int64), "split")
    nodes = [
        helper.make_node(
            "Constant", [], ["c"], name="/c", value=numpy_helper.from_array(np.ones(4, np.float32))
        ),
        helper.make_node("Add", ["x", "c"], ["r"], name="/a/Add"),
        helper.make_node("Split", ["r", "split"], ["a", "b"], name="/a/Split", axis=1),
        helper.make_node("Shape", ["a"], ["s"], name="/a/Add_9"),
    ]
    model = _graph(nodes, [_vi("x")], [_vi("b"), _vi("s", TensorProto.INT64, (2,))], [split])
    assert first_layers(model) == {
        "/a/Add": (1, [TensorProto.FLOAT]),
        "/a/Split": (1, [TensorProto.FLOAT]),
        "/a/Add_9": (1, [TensorProto.INT64]),
    }
    assert layer_flag_problems(model, ["--layerOutputTypes=/a/Split:fp32+fp32,/c:fp32,/a/Add_9:fp32"]) == [
        "Layer /a/Split has 1 outputs but 2 output types are given in --layerOutputTypes flag. "
        "Invalid --layerOutputTypes flag.",
        "--layerOutputTypes: '/c' names no layer of the network: it pins nothing",
        "--layerOutputTypes: '/a/Add_9' is an integer layer; FP32 cannot be forced on it",
    ]
    layers = targets.constrained_layers(model, ["/a/Add", "/a/Split", "/a/Add_9"])
    assert (
        layer_flag_problems(model, targets.trtexec_precision_flags(targets.get_profile("jetpack5"), layers))
        == []
    )
