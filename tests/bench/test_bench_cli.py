"""dfine-bench end to end on real onnxruntime, plus its tables, hardware words and noise verdicts."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np
import pytest

from dfine_deploy.bench.cli import main
from dfine_deploy.bench.hardware import Hardware, auto_profile, measured_on, measured_on_line
from dfine_deploy.bench.measure import NOISY_CV, noise_reasons, summarize, time_calls
from dfine_deploy.bench.tables import HARDWARE_SELECTION, OFFICIAL_LATENCY, PROFILES, expected_for
from tests.runtime.test_runtime_detector import make_artifact
from tests.runtime.tiny_graphs import yolo_like


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("bench") / "art", batch_max=2)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main([*argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def bench_yolo_on_data(capsys, model, data, *extra: str) -> tuple[int, str, str]:
    """One timed CPU run of a YOLO-layout graph, then its mAP on the COCO folder `data`."""
    return run_cli(
        capsys,
        *("--model", str(model), "--adapter", "yolo", "--device", "cpu"),
        *("--runs", "1", "--warmup", "0", "--data", str(data)),
        *extra,
    )


def table_cells(text: str) -> list[list[str]]:
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in row.strip("|").split(" | ")] for row in rows[1:]]  # without header


def test_jetson_profile_report_json_and_plot(capsys, tmp_path, artifact):
    report, plot = tmp_path / "r.json", tmp_path / "r.png"
    code, out, _ = run_cli(
        capsys,
        "--model",
        str(artifact),
        "--backend",
        "onnxruntime",
        "--device",
        "jetson",
        "--batch",
        "1",
        "2",
        "--runs",
        "4",
        "--warmup",
        "1",
        "--frame-size",
        "160",
        "120",
        "--json",
        str(report),
        "--plot",
        str(plot),
    )
    assert code == 0
    assert "reference: edge inference | Jetson AGX Xavier | dfine-n | 472 FPS" in out
    assert re.search(r"measured on: x86-64 CPU \(.+\), not a Jetson", out)
    assert "Jetson power mode / clocks: not readable" in out
    header = next(line for line in out.splitlines() if line.startswith("| "))
    for column in (
        "Format",
        "Status",
        "Size (MB)",
        "mAP50-95",
        "Inference time (ms/im)",
        "FPS",
        "Batch",
        "Ratio",
    ):
        assert f" {column} " in header
    printed = table_cells(out)
    assert len(printed) == 4  # 2 batches x (engine, image->det)
    assert {row[2] for row in printed} == {"engine", "image->det"}
    document = json.loads(report.read_text())
    assert document["table"] == printed  # every printed cell
    for line in out.splitlines():
        if not line.startswith(("|", "json:", "plot:")) and line.strip():
            assert line in document["reference"] + document["measured_on"] + document["notes"], line
    for row, cells in zip(document["rows"], printed):
        assert row["timing"]["runs"] == 4 and row["timing"]["warmup"] == 1
        # the cell is p50 to 2 decimals, the JSON p50 to 4: a value such as 0.05504 reads 0.06 and 0.0550
        assert abs(float(cells[10]) - row["timing"]["p50"]) <= 0.005 + 1e-4, (cells[10], row["timing"])
        assert row["provider"] == "CPUExecutionProvider"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_foreign_yolo_model_in_the_same_table(capsys, tmp_path, artifact):
    table = np.zeros((4 + 3, 5), np.float32)
    table[:4, 0], table[5, 0] = [16, 16, 8, 8], 0.9
    yolo = yolo_like(tmp_path / "yolo_tiny.onnx", table, 32)
    code, out, _ = run_cli(
        capsys,
        "--model",
        str(artifact),
        str(yolo),
        "--adapter",
        "dfine",
        "yolo",
        "--device",
        "cpu",
        "--runs",
        "2",
        "--warmup",
        "0",
        "--frame-size",
        "64",
        "48",
    )
    assert code == 0, out
    formats = {row[1] for row in table_cells(out)}
    assert formats == {"ONNX", "ONNX (yolo)"}


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--device", "xavier"], "--device 'xavier' is not a known profile"),
        (["--backend", "tensorrt"], "tensorrt is not installed"),
        (["--batch", "4"], "takes at most 2 images per call"),
        (["--imgsz", "100"], "multiple of 32"),
    ],
)
def test_bad_requests_exit_2_with_a_clear_message(capsys, artifact, argv, message):
    code, _, err = run_cli(capsys, "--model", str(artifact), "--runs", "1", *argv)
    assert code == 2
    assert message in err and "Traceback" not in err


def test_missing_artifact_exits_2(capsys, tmp_path):
    code, _, err = run_cli(capsys, "--model", str(tmp_path / "nope"), "--runs", "1")
    assert code == 2 and "no such file or folder" in err


def test_timing_rounds_and_noise_verdict():
    timed = time_calls(lambda: time.sleep(0.001), batch=2, warmup=1, runs=7, rounds=3)
    assert timed.runs == 7 and len(timed.round_medians_ms) == 3 and timed.warmup == 1
    assert 1.0 <= timed.min <= timed.p50 <= timed.p90 <= timed.p99 <= timed.max
    assert timed.fps == pytest.approx(2000 / timed.p50)
    steady = summarize([[10.0, 10.2, 9.9], [10.1, 10.0, 10.3]], batch=1, warmup=0)
    assert steady.p50 == pytest.approx(10.05) and steady.round_medians_ms == [10.0, 10.1]
    assert noise_reasons(steady, load_average=0.5, cpu_count=2) == []
    assert "load average 3.00" in noise_reasons(steady, load_average=3.0, cpu_count=2)[0]
    jumpy = summarize([[1.0, 12.0, 1.0], [12.0, 1.0, 12.0]], batch=1, warmup=0)
    reasons = noise_reasons(jumpy, load_average=0.0, cpu_count=2)
    assert jumpy.cv > NOISY_CV and "variation" in reasons[0]
    assert "round medians differ by x12.00" in reasons[1] and "slowest call x12.00 the fastest" in reasons[2]
    one_outlier = summarize([[10.0, 10.1, 10.0, 25.0, 10.2, 10.1, 10.0, 10.1, 10.0, 10.1]], batch=1, warmup=0)
    assert [r.split(" ")[0] for r in noise_reasons(one_outlier, 0.0, 2)] == ["call-to-call", "slowest"]


def test_tables_are_self_consistent_and_profiles_pick_their_rows():
    for row in OFFICIAL_LATENCY.values():  # FPS and latency were transcribed separately
        assert row.fps == pytest.approx(1000 / row.latency_ms, rel=0.01)
    assert expected_for(PROFILES["t4"], "dfine-s").fps == 287
    assert expected_for(PROFILES["jetson"], "dfine-n").fps == 472
    assert expected_for(PROFILES["jetson"], "dfine-s").fps is None
    assert expected_for(PROFILES["jetson-orin"], "dfine-n").fps is None
    assert {r.hardware for r in HARDWARE_SELECTION} == {"Jetson AGX Xavier", "2 x T4", "4 x V100", "8 x A100"}


def _hw(jetson=None, gpus=()):
    return Hardware("x86-64", "Test CPU 3000", "avx2", 2, jetson, list(gpus), "none")


def test_measured_on_words():
    cpu = _hw()
    assert (
        measured_on_line(PROFILES["jetson"], cpu, "cpu")
        == "measured on: x86-64 CPU (Test CPU 3000, ISA class avx2), not a Jetson"
    )
    limits = "2 of 64 CPUs (cgroup CPU quota 2)"
    quota = Hardware("x86-64", "Xeon", "amx", 64, None, [], "none", cpu_limits=limits)
    assert measured_on(quota, "cpu") == "x86-64 CPU (Xeon, ISA class amx, 2 of 64 CPUs (cgroup CPU quota 2))"
    assert (
        measured_on_line(PROFILES["t4"], _hw(gpus=["NVIDIA H200"]), "cuda:0")
        == "measured on: NVIDIA H200 GPU, not an NVIDIA T4"
    )
    assert "matches" in measured_on_line(PROFILES["t4"], _hw(gpus=["Tesla T4"]), "cuda:0")
    assert "not an NVIDIA T4" in measured_on_line(PROFILES["t4"], _hw(gpus=["Tesla T4"]), "cpu")
    xavier = _hw(jetson="NVIDIA Jetson AGX Xavier Developer Kit")
    assert "matches" in measured_on_line(PROFILES["jetson"], xavier, "cuda:0")
    assert auto_profile(xavier).key == "jetson"
    assert auto_profile(_hw(jetson="NVIDIA Jetson AGX Orin")).key == "jetson-orin"
    assert auto_profile(cpu).key == "cpu" and auto_profile(_hw(gpus=["NVIDIA A100-SXM4-80GB"])).key == "a100"


def _constant_box_dataset(folder: Path, box_xywh: list[float], names=("a", "b", "c")) -> Path:
    """Three 64x64 images, each with one object of category 1 at `box_xywh`; categories 0, 1, 2 are
    named `names`."""
    import cv2

    folder.mkdir(parents=True)
    images, annotations = [], []
    for i in range(3):
        cv2.imwrite(str(folder / f"{i}.png"), np.full((64, 64, 3), 40 * i, np.uint8))
        images.append({"id": i + 1, "file_name": f"{i}.png", "width": 64, "height": 64})
        annotations.append(
            {
                "id": i + 1,
                "image_id": i + 1,
                "category_id": 1,
                "bbox": box_xywh,
                "area": box_xywh[2] * box_xywh[3],
                "iscrowd": 0,
            }
        )
    categories = [{"id": k, "name": n} for k, n in enumerate(names)]
    (folder / "annotations.json").write_text(
        json.dumps({"images": images, "annotations": annotations, "categories": categories})
    )
    return folder


def test_data_gives_map_of_the_graph_being_timed(capsys, tmp_path):
    pytest.importorskip("faster_coco_eval")
    table = np.zeros((4 + 3, 2), np.float32)
    table[:4, 0], table[4 + 1, 0] = [32, 32, 20, 20], 0.9  # class "b" at xyxy 22,22,42,42 on 64x64
    yolo = yolo_like(tmp_path / "const.onnx", table, 64)
    hit = _constant_box_dataset(tmp_path / "hit", [22, 22, 20, 20])
    miss = _constant_box_dataset(tmp_path / "miss", [0, 0, 10, 10])
    report = tmp_path / "r.json"
    for data, expected in ((hit, 1.0), (miss, 0.0)):
        code, out, err = bench_yolo_on_data(capsys, yolo, data, "--json", str(report))
        assert code == 0, err
        assert json.loads(report.read_text())["rows"][0]["map50_95"] == pytest.approx(expected, abs=1e-6)
        assert table_cells(out)[0][5] == f"{expected:.4f}"
    code, _, err = run_cli(
        capsys, "--model", str(yolo), "--adapter", "yolo", "--data", str(tmp_path / "none")
    )
    assert code == 2 and f"dataset {tmp_path / 'none'} not found" in err


def test_data_is_validated_as_training_validates_it(capsys, tmp_path):
    """A truncated image, an unknown category or a negative box must not end in an mAP and exit 0."""
    pytest.importorskip("faster_coco_eval")
    table = np.zeros((4 + 3, 2), np.float32)
    table[:4, 0], table[4 + 1, 0] = [32, 32, 20, 20], 0.9
    yolo = yolo_like(tmp_path / "const.onnx", table, 64)

    def damaged(name, change):
        folder = _constant_box_dataset(tmp_path / name, [22, 22, 20, 20])
        coco = json.loads((folder / "annotations.json").read_text())
        change(folder, coco)
        (folder / "annotations.json").write_text(json.dumps(coco))
        return folder

    def truncate(folder, coco):
        import cv2

        cv2.imwrite(str(folder / "1.jpg"), np.full((64, 64, 3), 90, np.uint8))
        (folder / "1.jpg").write_bytes((folder / "1.jpg").read_bytes()[:300])
        coco["images"][1]["file_name"] = "1.jpg"

    cases = {
        "truncated": (truncate, "corrupt_image"),
        "category": (lambda f, c: c["annotations"][0].update(category_id=7), "unknown_category"),
        "negative": (lambda f, c: c["annotations"][2].update(bbox=[22, 22, -20, 20]), "negative_box"),
    }
    for name, (change, problem) in cases.items():
        code, out, err = bench_yolo_on_data(capsys, yolo, damaged(name, change))
        assert code == 2, (name, out)
        assert problem in err and "Traceback" not in err
        assert not table_cells(out)  # no table, no mAP


def test_tables_flag_prints_both_tables(capsys):
    code, out, _ = run_cli(capsys, "--tables")
    assert code == 0
    assert "| edge inference           | Jetson AGX Xavier | dfine-n | 472 FPS         |" in out
    assert "| dfine-x | 12.89 ms | 78  | 55.8    | 59.3" in out
    code, _, err = run_cli(capsys, "--runs", "1")
    assert code == 2 and "--model is required" in err


def test_onnxruntime_and_openvino_rows_with_map(capsys, tmp_path, artifact):
    pytest.importorskip("faster_coco_eval")
    data = _constant_box_dataset(tmp_path / "data", [22, 22, 20, 20], names=("thing0", "thing1", "thing2"))
    code, out, err = run_cli(
        capsys,
        "--model",
        str(artifact),
        "--backend",
        "onnxruntime",
        "openvino",
        "--device",
        "cpu",
        "--runs",
        "1",
        "--warmup",
        "0",
        "--rounds",
        "1",
        "--data",
        str(data),
    )
    assert code == 0, err
    rows = table_cells(out)
    assert [(r[1], r[2]) for r in rows] == [
        ("ONNX", "engine"),
        ("ONNX", "image->det"),
        ("OpenVINO", "engine"),
        ("OpenVINO", "image->det"),
    ]
    maps = {r[5] for r in rows}
    assert len(maps) == 1 and float(maps.pop()) >= 0.0  # the same graph scores the same on both runtimes
    code, _, err = run_cli(capsys, "--model", str(artifact), "--backend", "openvino", "--precision", "int8")
    assert code == 2 and "no int8 graph for openvino" in err and "--int8" in err
    code, _, err = run_cli(capsys, "--model", str(artifact), "--backend", "openvino", "--precision", "bf16")
    assert code == 2 and "precision bf16 refused: model.json records no bf16 gate" in err


def test_openvino_bf16_row_where_the_cpu_has_bf16_units(capsys, tmp_path):
    from dfine_deploy.runtime.openvino_backend import cpu_capabilities
    from tests.runtime.test_runtime_openvino import PASSED, with_bf16_gate

    folder = with_bf16_gate(make_artifact(tmp_path / "art", batch_max=2), PASSED)
    argv = ["--model", str(folder), "--backend", "openvino", "--precision", "fp32", "bf16", "--device", "cpu"]
    code, out, err = run_cli(capsys, *argv, "--runs", "1", "--warmup", "0", "--rounds", "1")
    if "BF16" not in cpu_capabilities():
        assert code == 2 and "no BF16 units" in err and "use precision fp32 (or int8)" in err
        return
    assert code == 0, err
    assert [(r[1], r[2]) for r in table_cells(out)] == [
        ("OpenVINO", "engine"),
        ("OpenVINO", "image->det"),
        ("OpenVINO BF16", "engine"),
        ("OpenVINO BF16", "image->det"),
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--frame-size", "0", "0"],
        ["--frame-size", "-5", "720"],
        ["--batch", "1", "0"],
        ["--runs", "0"],
        ["--warmup", "-1"],
        ["--train-batch", "0"],
        ["--train-images", "-3"],
    ],
)
def test_numbers_out_of_range_are_one_line_before_any_work(capsys, artifact, argv):
    code, _, err = run_cli(capsys, "--model", str(artifact), "--device", "cpu", *argv)
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{argv[0]} {' '.join(argv[1:])}: each value must be at least" in err


# a value other than the default for each option of one measurement
MEASUREMENT_VALUES = {
    "--fps": ["5"],
    "--stream-seconds": ["3"],
    "--max-streams": ["2"],
    "--max-batch": ["2"],
    "--motion": [],
    "--tile-overlap": ["0.3"],
    "--tiles-no-full": [],
    "--truth": ["gt.txt"],
    "--train-images": ["100"],
    "--train-batch": ["2"],
}


def test_every_option_of_a_measurement_has_a_case():
    from dfine_deploy.bench.cli import MEASUREMENT_OPTIONS

    assert set(MEASUREMENT_VALUES) == set(MEASUREMENT_OPTIONS)


def test_an_option_at_its_default_value_without_its_measurement_is_refused(capsys, artifact):
    """`--fps 10` (the default) without --streams passed: the check compared the value with the default."""
    code, _, err = run_cli(capsys, "--model", str(artifact), "--device", "cpu", "--fps", "10")
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert "--fps belongs to --streams, and is ignored without it" in err, err


@pytest.mark.parametrize("flag", list(MEASUREMENT_VALUES))
def test_an_option_without_its_measurement_is_refused_not_ignored(capsys, artifact, flag):
    """`--tile-overlap 0.3` without --tiles ran the latency table as if it had not been given."""
    code, _, err = run_cli(
        capsys, "--model", str(artifact), "--device", "cpu", flag, *MEASUREMENT_VALUES[flag]
    )
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"{flag} belongs to --" in err and f"or leave {flag} out" in err, err


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--tables", "--model", "m.onnx"], "--tables does not read --model"),
        (["--model", "m.onnx", "--streams", "--batch", "1", "8"], "--streams does not read --batch"),
        (["--model", "m.onnx", "--streams", "--runs", "20"], "--streams does not read --runs"),  # the default
        (["--model", "m.onnx", "--tiles", "2x2", "--plot", "p.png"], "--tiles does not read --plot"),
        (
            ["--model", "m.onnx", "--tracking", "v.mp4", "--adapter", "yolo"],
            "--tracking does not read --adapter",
        ),
        (["--model", "dfine-n", "--train", "--backend", "openvino"], "--train does not read --backend"),
        (["--model", "dfine-n", "--train", "--streams"], "--train is a measurement of its own"),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, list) else None,
)
def test_an_option_the_measurement_does_not_read_is_refused_not_ignored(argv, words, capsys):
    """`--streams --batch 1 8` measured the cameras as if --batch had not been given (the streams
    are batched by --max-batch); each measurement names what it does not read."""
    code, _, err = run_cli(capsys, *argv)
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert words in err, err


def test_every_measurement_reads_options_the_parser_has():
    from dfine_deploy.bench.cli import MEASUREMENT_READS, get_args_parser
    from dfine_deploy.cli import option_flags

    flags = option_flags(get_args_parser())
    assert all(flag in flags for reads in MEASUREMENT_READS.values() for flag in reads)
    assert set(MEASUREMENT_READS) <= set(flags)
