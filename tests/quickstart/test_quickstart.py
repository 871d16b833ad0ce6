"""The README's first command, shortened: every stage runs for real and every named file opens."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import cv2
import pytest

from dfine_deploy.errors import OwnershipError
from tests.support.folders import DOCUMENTS, TRAINING_RUN, fill, snapshot

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "quickstart.py"


def _quickstart_module():
    """scripts/quickstart.py is a checkout script, not a package module: load it from its path."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("quickstart_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fast_quickstart_runs_every_stage_and_leaves_files_that_open(quickstart_run):
    out = quickstart_run  # `scripts/quickstart.py --fast`, run once per session (tests/conftest.py)
    summary = json.loads((out / "summary.json").read_text())

    stages = {"data", "train", "evaluate", "export", "verify", "bench", "serve"}
    assert set(summary["stage_seconds"]) == stages
    assert 0.0 <= summary["validation"]["AP"] <= 1.0
    assert summary["validation"]["num_images"] == 32
    parity = summary["export"]["parity"]
    assert parity["fp32"]["passed"] and parity["fp16"]["passed"]
    # dfine-verify checked the graph onnxruntime serves on this CPU against the export's reference pack
    (verified,) = summary["verify"]
    assert verified["passed"] and verified["device"]["backend"] == "onnxruntime"
    assert summary["serve"]["results"] >= 2 and summary["serve"]["fps"] > 0
    # the demo video's known crossings beside what the (one-epoch, barely trained) model's tracks counted
    assert sum(summary["serve"]["input_video"]["expected_crossings"]["in"].values()) > 0
    assert set(summary["serve"]["tracking"]["counts"]) == {"middle"}
    # the served tracks scored as dfine-bench --tracking scores them, and each object's frames found
    scores = summary["serve"]["against_truth"]
    assert 0.0 <= scores["HOTA"] <= 1.0 and scores["frames_scored"] == summary["serve"]["results"]
    assert set(scores["count_error"]) == {"in", "out"}
    assert [o["class"] for o in scores["objects_found"]] == [
        o["class"] for o in summary["serve"]["input_video"]["objects"]
    ]
    assert summary["bench"]["table"], "the bench stage reported no measurement"
    assert any("not a Jetson" in line for line in summary["bench"]["measured_on"])

    files = summary["files"]
    for key, path in files.items():
        assert Path(path).is_file(), key
    for key in ("training_curves", "bench_chart", "val_predictions"):
        assert cv2.imread(files[key]) is not None, key
    video = cv2.VideoCapture(files["annotated_video"])
    frames = int(video.get(cv2.CAP_PROP_FRAME_COUNT))
    size = (int(video.get(cv2.CAP_PROP_FRAME_WIDTH)), int(video.get(cv2.CAP_PROP_FRAME_HEIGHT)))
    video.release()
    assert frames == summary["serve"]["results"]
    assert size == (summary["serve"]["input_video"]["width"], summary["serve"]["input_video"]["height"])
    served = [json.loads(line) for line in Path(files["served_detections"]).read_text().splitlines()]
    assert all({"stream", "frame_index", "detections"} <= set(r) for r in served)


def test_check_outputs_refuses_a_video_that_does_not_play(tmp_path):
    module = _quickstart_module()
    StageFailed, check_outputs = module.StageFailed, module.check_outputs

    broken = tmp_path / "broken.mp4"
    broken.write_bytes(b"not a video at all")
    with pytest.raises(StageFailed, match="does not play"):
        check_outputs({"files": {"annotated_video": str(broken)}})
    missing = tmp_path / "nothing.png"
    with pytest.raises(StageFailed, match="missing or empty"):
        check_outputs({"files": {"val_predictions": str(missing)}})


@pytest.mark.parametrize(
    "files",
    [DOCUMENTS, TRAINING_RUN, {"summary.json": '{"total": 1}', "logs/data.log": "theirs"}],
    ids=["documents", "a-training-run", "lookalike-summary"],
)
def test_an_out_folder_we_did_not_write_is_refused_before_any_stage(tmp_path, capsys, files):
    module = _quickstart_module()
    out = fill(tmp_path / "out", files)
    before = snapshot(out)
    assert module.main(["--out", str(out), "--fast"]) == 2
    printed = capsys.readouterr()
    assert f"--out {out}: is not a quickstart run folder written by scripts/quickstart.py" in printed.err
    assert "==>" not in printed.out and snapshot(out) == before  # no stage started


def test_a_quickstart_run_folder_is_its_own(tmp_path):
    module = _quickstart_module()
    earlier = fill(tmp_path / "earlier", {"summary.json": '{"stage_seconds": {}, "files": {}}'})
    assert module.claim_folder(earlier, module.QUICKSTART_RUN, option="--out", replaces=False)
    marked = fill(tmp_path / "marked", {"quickstart.json": '{"written_by": "scripts/quickstart.py"}'})
    assert module.claim_folder(marked, module.QUICKSTART_RUN, option="--out", replaces=False)


def test_a_second_quickstart_replaces_only_an_earlier_run_of_its_own(tmp_path, capsys):
    module = _quickstart_module()
    ours = {
        "quickstart.json": '{"written_by": "scripts/quickstart.py"}',
        "summary.json": '{"stage_seconds": {}, "files": {}}',
        "train/last.pth": "weights",
        "export/ov_cache/blob": "cache",
        "logs/train.log": "log",
    }
    earlier = fill(tmp_path / "earlier", ours)
    module.clear_earlier_run(earlier)
    assert earlier.is_dir() and not list(earlier.iterdir())
    assert f"replaced the earlier quickstart run in {earlier} (5 entries" in capsys.readouterr().out
    mixed = fill(tmp_path / "mixed", {**ours, "train/my_notes.txt": "mine"})
    before = snapshot(mixed)
    with pytest.raises(OwnershipError, match="did not write"):
        module.clear_earlier_run(mixed)
    assert snapshot(mixed) == before


@pytest.mark.slow
def test_the_quickstart_says_no_warning_the_user_cannot_act_on(quickstart_run):
    """Every stage's output (logs/*.log, what the run printed): the one line that names warnings is the
    count of other libraries' warnings it hid, with the option that shows them."""
    said = [
        line.strip()
        for log in sorted((quickstart_run / "logs").glob("*.log"))
        for line in log.read_text().splitlines()
        if "warn" in line.lower()
    ]
    assert all(line.startswith("note:") and "--verbose shows them" in line for line in said), said


def test_a_failed_bf16_gate_is_summed_up_as_kept_out_not_as_a_failure():
    """The BF16 gate may fail in a finished export (on a briefly trained model BF16 rounding can move
    enough boxes): the summary says what follows from it instead of FAILED."""
    from dfine_deploy.artifact import BF16_GATE_KEY

    quickstart = _quickstart_module()
    failed = {"run": True, "passed": False, "failures": ["pseudo-mAP 80.1 < 85.0"]}
    said = quickstart.gate_outcome(BF16_GATE_KEY, failed)
    assert "FAILED" not in said and "pseudo-mAP 80.1 < 85.0" in said and "FP32 is not affected" in said
    assert quickstart.gate_outcome("fp32", failed).startswith("FAILED")
    assert quickstart.gate_outcome(BF16_GATE_KEY, {"run": False, "reason": "no BF16 units"}) == (
        "not run (no BF16 units)"
    )
