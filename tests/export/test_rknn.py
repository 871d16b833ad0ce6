"""`dfine-export --target rk3588`: model.rknn built by rknn-toolkit2 and gated against PyTorch in its
simulator (the real toolkit, in its own venv: `make rknn-venv`, which `make test` builds), the runtime
row that opens it, and what the target refuses.

The export runs on the suite's trained model (tests/fixtures/dfine_n_synthetic.safetensors, the
`trained_model` fixture), so the gate can fail: the FP16 gate, not the rank-free one, against its
validation set's annotations. It passes without --force (docs/export.md: Rockchip NPUs, the graph
rewrite that made it pass). One export serves every test here (GATE_IMAGES validation images; the
simulator is slow, docs/export.md has its time). model.int8.rknn is built in one test of its own:
its gate fails, and the refusal names where rknn-toolkit2's accuracy_analysis finds the loss.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import onnx
import onnx.utils
import onnxruntime as ort
import pytest

from dfine_deploy.artifact import read_artifact
from dfine_deploy.boxes import box_iou, postprocess_numpy
from dfine_deploy.errors import BackendError, ExportError, ParityError
from dfine_deploy.export import parity
from dfine_deploy.export import rknn as rknn_export
from dfine_deploy.export.cli import main as export_main
from dfine_deploy.export.pipeline import export_artifact
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.images import IMAGE_SUFFIXES, read_image
from dfine_deploy.runtime import rknn_backend
from tests.support.trained_model import TrainedModel, guard_artifact

SIZE = 256  # the smallest square D-FINE-N takes
GATE_IMAGES = 8  # validation images the gate runs in the simulator (the CLI's --gate-images)
REPO = Path(__file__).parents[2]


def _tool_python() -> Path:
    """The tool venv's interpreter; CI must have it (`make test` builds it), elsewhere its absence skips."""
    path = REPO / rknn_export.TOOL_VENV / "bin" / "python"
    if not path.is_file():
        missing = f"{path} is missing (make rknn-venv)"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{missing}; CI must have it")
        pytest.skip(missing)
    return path


@pytest.fixture(scope="module")
def rknn_artifact(tmp_path_factory, trained_model: TrainedModel) -> Path:
    """The trained D-FINE-N at 256 px for rk3588, FP16, through the CLI, gated on its validation set."""
    python = _tool_python()
    out = tmp_path_factory.mktemp("rknn") / "art"
    size = str(trained_model.imgsz)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(rknn_export.PYTHON_VARIABLE, str(python))
        code = export_main(
            [str(trained_model.checkpoint), "--target", "rk3588", "--imgsz", size, size]
            + ["--batch", "1", "1", "1", "--no-fp16", "--data", str(trained_model.val)]
            + ["--gate-images", str(GATE_IMAGES), "-o", str(out)]
        )
    assert code == 0  # without --force: the FP16 gate passed
    guard_artifact(out, trained_model.val)
    return out


@pytest.mark.slow
def test_model_rknn_is_built_and_gated_in_the_simulator_on_a_model_that_detects(rknn_artifact):
    info = read_artifact(rknn_artifact)
    graph = info.graphs["rknn-fp16"]
    assert graph.file == "model.rknn" and (rknn_artifact / "model.rknn").stat().st_size > 1_000_000
    assert graph.recipe["build"]["target_platform"] == "rk3588"
    assert graph.recipe["build"]["inputs"] == ["images"] and graph.recipe["build"]["top_k"] == 100
    report = info.parity["rknn-fp16:rknn"]
    assert report["reference"] == "pytorch" and "simulator" in report["candidate"]
    assert not report["rank_free"] and report["images"] == GATE_IMAGES and report["decisive"] > 0
    assert report["passed"] and report["box_agreement"] >= parity.FP16_GATE.box_agreement
    assert graph.recipe["build"]["rewrites"] == ["separate_parallel_gathers"]
    assert report["dataset_ap"]["reference"] > 30.0  # the trained model: the AP check is not vacuous
    # a board opens model.rknn by itself: the postprocessor's top-K comes from model.json beside it
    assert rknn_backend.recorded_settings(rknn_artifact / "model.rknn") == graph.recipe["build"]


@pytest.mark.slow
def test_the_runtime_row_runs_the_fp16_file_in_the_simulator_like_onnxruntime(rknn_artifact, trained_model):
    """Detector.open(folder, backend="rknn") in the tool venv (the simulator rebuilds model.rknn's
    source graph, the postprocessor runs in numpy) finds what onnxruntime finds in model.onnx on a
    validation image."""
    python = _tool_python()
    first = sorted(p for p in trained_model.val.iterdir() if p.suffix in IMAGE_SUFFIXES)[0]
    frame = read_image(first, color="BGR")  # Detector.predict's order
    np.save(rknn_artifact.parent / "frame.npy", frame)
    script = (
        "import json, sys, numpy as np\n"
        "from dfine_deploy.runtime import Detector\n"
        "frame = np.load(sys.argv[2])\n"
        "out = {}\n"
        "for backend in ('rknn', 'onnxruntime'):\n"
        "    d = Detector.open(sys.argv[1], backend=backend, score_threshold=0.0)\n"
        "    r = d.predict([frame])[0]\n"
        "    out[backend] = [d.backend.provider, r.boxes.tolist(), r.labels.tolist()]\n"
        "print('RESULT', json.dumps(out))\n"
    )
    done = subprocess.run(
        [str(python), "-c", script, str(rknn_artifact), str(rknn_artifact.parent / "frame.npy")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    # rknn-toolkit2 writes its own lines to stdout too, some after ours
    out = json.loads(next(line[7:] for line in done.stdout.splitlines() if line.startswith("RESULT ")))
    assert out["rknn"][0] == "rknn-toolkit2 simulator (rk3588)"
    (_, ort_boxes, ort_labels), (_, rk_boxes, rk_labels) = out["onnxruntime"], out["rknn"]
    assert len(rk_boxes) == len(ort_boxes) == 100  # the postprocessor's top-K, applied on the CPU
    # each of onnxruntime's first 20 is looked for among all of the simulator's, same label at IoU
    # 0.9: the FP16 gate's box bar
    iou = box_iou(np.array(ort_boxes[:20]), np.array(rk_boxes))
    same = np.array(ort_labels[:20])[:, None] == np.array(rk_labels)[None, :]
    assert ((iou >= 0.9) & same).any(axis=1).mean() >= parity.FP16_GATE.box_agreement


@pytest.mark.slow
def test_a_failed_int8_gate_names_the_layers_that_lose_the_accuracy(tmp_path, trained_model, monkeypatch):
    """model.int8.rknn (rknn-toolkit2's own quantizer, calibrated on the validation set) loses most
    of the trained model's boxes (docs/export.md: AP 20 vs 65): the refusal is one line that also
    says where, from the toolkit's accuracy_analysis of the first gate image."""
    monkeypatch.setenv(rknn_export.PYTHON_VARIABLE, str(_tool_python()))
    size = trained_model.imgsz
    opts = ExportSettings(
        model=str(trained_model.checkpoint),
        output=tmp_path / "art",
        target="rk3588",
        imgsz=(size, size),
        batch=(1, 1, 1),
        fp16=False,
        int8=True,
        data=trained_model.val,
        gate_images=GATE_IMAGES,
    )
    with pytest.raises(ParityError) as refused:
        export_artifact(opts)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("model.int8.rknn in the rknn-toolkit2 simulator (rk3588)")
    first = re.search(rf"first falls under {rknn_export.PATH_COSINE_BOUND} at (\w+) (\S+) \((0\.\d+)\)", line)
    assert first is not None, line
    assert first[2].startswith("/model/") and float(first[3]) < rknn_export.PATH_COSINE_BOUND
    worst = re.search(r"lowest single-layer cosines (.*?)\. Nothing was written", line)
    assert worst is not None, line
    named = re.findall(r"(\w+) (/model/\S+) (\d\.\d{4})", worst[1])
    assert len(named) == rknn_export.WORST_LAYERS and all(float(c) < 1.0 for _, _, c in named)
    assert not (tmp_path / "art").exists()


ANALYSIS_EXCERPT = """\
# our own sample of the table's layout: a comment block, a two-row header, a rule, then per layer
# [op] tensor, whole-path cos | euc, single-layer cos | euc
layer_name                  simulator_error
                            entire              single
                            cos      euc        cos      euc
-----------------------------------------------------------------
[Input] images              1.00000 | 0.00000   1.00000 | 0.00000
[Conv] /net/a/Conv_out
[Relu] /net/a/Relu_out      0.99500 | 3.20000   0.99500 | 3.20000
[Conv] /net/b/Conv_out      0.97900 | 9.10000   0.99100 | 4.00000
[Add] /net/c/Add_out        0.96000 | 12.5000   0.99900 | 1.00000
[Sigmoid] /net/d/Sig_out    0.95000 | 0.80000   0.98000 | 0.40000
"""


def test_the_accuracy_analysis_table_names_where_the_path_breaks_and_the_worst_layers():
    layers = rknn_export.read_accuracy_analysis(ANALYSIS_EXCERPT)
    assert [layer.tensor for layer in layers] == [
        "images",
        "/net/a/Relu_out",
        "/net/b/Conv_out",
        "/net/c/Add_out",
        "/net/d/Sig_out",
    ]  # the fused Conv row, with no figures, is left out
    assert layers[2] == rknn_export.LayerError("Conv", "/net/b/Conv_out", 0.979, 0.991)
    phrase = rknn_export.where_accuracy_is_lost(layers)
    assert "first falls under 0.98 at Conv /net/b/Conv_out (0.9790)" in phrase
    assert phrase.endswith(
        "lowest single-layer cosines Sigmoid /net/d/Sig_out 0.9800, Conv /net/b/Conv_out 0.9910, "
        "Relu /net/a/Relu_out 0.9950"
    )
    intact = rknn_export.where_accuracy_is_lost(layers[:2])
    assert "stays at or above 0.98" in intact and "\n" not in intact


def test_the_cpu_half_is_the_graphs_own_postprocessor(trained_export, trained_model):
    """What a board runs on its CPU (numpy, on the NPU graph's two outputs) gives model.onnx's own
    detections, at a frame size other than the input's (the INT64 size scaling moved there too)."""
    source = trained_export / "model.onnx"
    cut, top_k = rknn_backend.network_cut(source)
    model = onnx.load(str(source))
    value = onnx.helper.make_tensor_value_info
    model.graph.output.extend(value(name, onnx.TensorProto.FLOAT, None) for name in cut)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    image = read_image(sorted(p for p in trained_model.val.iterdir() if p.suffix in IMAGE_SUFFIXES)[0])
    feeds = {"images": (image.transpose(2, 0, 1)[None] / 255.0).astype(np.float32)}
    feeds["orig_target_sizes"] = np.array([[1920, 1080]], dtype=np.int64)
    labels, boxes, scores, logits, raw_boxes = session.run(["labels", "boxes", "scores", *cut], feeds)
    assert scores[0, 0] > 0.5  # a trained model: a real detection, not the prior
    ours = postprocess_numpy(logits, raw_boxes, feeds["orig_target_sizes"], top_k)
    np.testing.assert_array_equal(ours[0], labels)
    np.testing.assert_allclose(ours[1], boxes, atol=1e-3)
    np.testing.assert_allclose(ours[2], scores, atol=1e-6)


def test_each_decoder_layer_samples_from_a_value_tensor_of_its_own(trained_export, trained_model, tmp_path):
    """rknn-toolkit2 2.5.0 merges Gathers that read one tensor, whatever their indices
    (`remove_parallel_gather`): decoder layers 1 and 2 sampled at layer 0's locations, which cost the
    simulated FP16 file 15 AP points. The build records the rewrite that gives each later layer's
    Gather a data tensor of its own, and the rewritten network computes exactly what model.onnx does."""
    source = trained_export / "model.onnx"
    settings = rknn_backend.build_settings("rk3588", trained_model.imgsz, trained_model.imgsz, source)
    assert settings["rewrites"] == ["separate_parallel_gathers"]
    cut = tmp_path / "network.onnx"  # the cut the toolkit reads, as toolkit_build makes it
    onnx.utils.extract_model(str(source), str(cut), settings["inputs"], settings["outputs"])
    model = onnx.load(str(cut))
    original = onnx.ModelProto()
    original.CopyFrom(model)

    def sampled(graph):  # the data tensor each decoder layer's value Gather reads
        return [n.input[0] for n in graph.node if n.op_type == "Gather" and "/cross_attn/Gather_5" in n.name]

    layers = len(sampled(original.graph))
    assert layers >= 3 and len(set(sampled(original.graph))) == 1  # what the toolkit merged
    assert rknn_backend.separate_parallel_gathers(model) == layers - 1
    assert len(set(sampled(model.graph))) == layers
    image = read_image(sorted(p for p in trained_model.val.iterdir() if p.suffix in IMAGE_SUFFIXES)[0])
    feeds = {"images": (image.transpose(2, 0, 1)[None] / 255.0).astype(np.float32)}
    options = ort.SessionOptions()
    options.log_severity_level = 3
    before, after = (
        ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
            None, feeds
        )
        for m in (original, model)
    )
    for old, new in zip(before, after):
        np.testing.assert_array_equal(old, new)


def test_a_graph_without_a_postprocessor_is_refused_in_one_line(tmp_path):
    value = onnx.helper.make_tensor_value_info
    node = onnx.helper.make_node("Identity", ["images"], ["logits"], name="/model/Identity")
    graph = onnx.helper.make_graph(
        [node],
        "bare",
        [value("images", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
        [value("logits", onnx.TensorProto.FLOAT, [1, 3, 8, 8])],
    )
    onnx.save(onnx.helper.make_model(graph), tmp_path / "bare.onnx")
    with pytest.raises(BackendError, match=r"^\S+bare\.onnx: no postprocessor to cut off .*--target rk3588$"):
        rknn_backend.network_cut(tmp_path / "bare.onnx")


def test_a_board_without_model_json_is_told_to_copy_the_folder(tmp_path):
    (tmp_path / "model.rknn").write_bytes(b"rknn")
    with pytest.raises(BackendError, match=r"top-K comes from model\.json beside it.*copy the whole"):
        rknn_backend.recorded_settings(tmp_path / "model.rknn")


def test_a_missing_tool_venv_is_one_line_that_says_how_to_make_it(tmp_path, monkeypatch):
    monkeypatch.setenv(rknn_export.PYTHON_VARIABLE, str(tmp_path / "nope" / "python"))
    opts = ExportSettings(model="dfine-n", output=tmp_path / "out", target="rk3588")
    with pytest.raises(ExportError, match=r"rknn-toolkit2 runs in its own venv .*make rknn-venv"):
        export_artifact(opts)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("change", "option"), [({"postprocess": False}, "--no-postprocess"), ({"trt": True}, "--trt")]
)
def test_options_an_rknn_export_cannot_take_are_refused_first(tmp_path, change, option):
    opts = ExportSettings(model="dfine-n", output=tmp_path / "out", target="rk3566", **change)
    with pytest.raises(ExportError, match=rf"^{re.escape(option)} with --target rk3566: .*drop"):
        export_artifact(opts)


def test_the_makefile_installs_the_toolkit_release_the_code_names():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert f'"{rknn_backend.TOOLKIT}"' in makefile


def test_a_candidate_whose_score_noise_leaves_nothing_decisive_is_still_held_to_its_boxes():
    """The simulator's RKNN rows printed `nan` agreement: one detection whose score moved by 0.45
    made the score noise so large that no reference detection counted as decisive, the agreement
    was taken over nothing and not gated. Here every other box has moved off its object."""
    k = parity.INT8_GATE.top_k
    labels = np.zeros((1, k), dtype=np.int64)
    scores = np.linspace(0.9, 0.5, k, dtype=np.float32)[None]
    corners = np.arange(k, dtype=np.float32)[:, None] * 30.0
    boxes = np.concatenate([corners, corners, corners + 20.0, corners + 20.0], axis=1)[None]
    moved_boxes, moved_scores = boxes + 1000.0, scores.copy()
    moved_boxes[0, 0], moved_scores[0, 0] = boxes[0, 0], 0.45
    report = parity.compare_outputs(
        [(labels, boxes, scores)], [(labels, moved_boxes, moved_scores)], parity.INT8_GATE
    )
    assert report.decisive == k and report.box_agreement == pytest.approx(1 / k)
    assert not report.passed and any("reference boxes" in failure for failure in report.failures)


def test_a_build_recorded_before_the_cut_is_refused_in_one_line(tmp_path):
    old = {"target_platform": "rk3588", "inputs": ["images", "orig_target_sizes"], "mean_values": None}
    with pytest.raises(BackendError, match=r"ends in the postprocessor; export it again"):
        rknn_backend.RknnBackend(tmp_path / "model.rknn", settings=old, source_graph=tmp_path / "model.onnx")
