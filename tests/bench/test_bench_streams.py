"""`dfine-bench --streams`: the server's pipeline on generated H.264 cameras, decoded, detected and tracked
for real, says how many streams this machine sustains, beside the hardware table's figure."""

from __future__ import annotations

import json

import pytest

from dfine_deploy.artifact import read_artifact, write_artifact
from dfine_deploy.bench import streams
from dfine_deploy.bench.cli import main
from tests.runtime.test_runtime_detector import make_artifact


@pytest.fixture(scope="module")
def dfine_n_artifact(tmp_path_factory):
    """A tiny graph with D-FINE's interface whose sidecar says dfine-n, so the table has its figure."""
    folder = make_artifact(tmp_path_factory.mktemp("streams") / "art", batch_max=4)
    info = read_artifact(folder)
    info.model = "dfine-n"
    write_artifact(folder, info)
    return folder


def test_streams_prints_the_count_this_machine_sustains_beside_the_tables(dfine_n_artifact, tmp_path, capsys):
    report = tmp_path / "streams.json"
    code = main(
        [
            *("--model", str(dfine_n_artifact), "--streams", "--device", "jetson"),
            *("--frame-size", "160", "120", "--fps", "10", "--stream-seconds", "1.5", "--max-streams", "2"),
            *("--work-dir", str(tmp_path / "work"), "--json", str(report)),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    document = json.loads(report.read_text())
    count = document["streams_sustained"]
    assert count >= 1, out  # one 160x120 camera of a tiny graph fits anywhere
    assert f"this machine sustains {count}" in out and "160x120 at 10 fps" in out
    assert "472 FPS for dfine-n = 47 streams at 10 fps" in out  # the Jetson row of the hardware table
    trials = document["trials"]
    assert [t["streams"] for t in trials][:1] == [1] and all(t["served_frames"] > 0 for t in trials)
    for trial in trials:  # the answer is the largest sustained count among the trials run
        assert trial["sustained"] == (trial["served_ratio"] >= streams.SUSTAINED)
        assert f"| {trial['served_ratio']:.3f} " in out  # the figure the verdict read is the one printed
    assert f"({streams.SUSTAINED_RULE};" in out
    assert count == max(t["streams"] for t in trials if t["sustained"])
    assert list(document)[-len(COMMON) :] == COMMON and document["camera"]["codec"] == "h264"
    assert document["lines"][0].startswith("measured on") and out.endswith(f"json: {report}\n")
    camera = tmp_path / "work" / "camera-160x120-10fps.mp4"
    assert camera.is_file()  # the generated H.264 camera, decoded by the server's own reader


COMMON = ["backend", "lines", "hardware", "profile"]  # what every report of a served model holds


def test_the_motion_report_holds_each_modes_count_beside_what_every_report_holds(
    dfine_n_artifact, tmp_path, capsys
):
    report = tmp_path / "motion.json"
    code = main(
        [
            *("--model", str(dfine_n_artifact), "--streams", "--motion", "--device", "jetson"),
            *("--frame-size", "160", "120", "--fps", "10", "--stream-seconds", "1", "--max-streams", "1"),
            *("--work-dir", str(tmp_path / "work"), "--json", str(report)),
        ]
    )
    out = capsys.readouterr().out
    assert code == 0
    document = json.loads(report.read_text())
    assert list(document) == ["modes", "camera", "model", *COMMON]
    assert list(document["modes"]) == ["every frame", "motion gate"]
    assert document["camera"] == {"width": 160, "height": 120, "fps": 10, "codec": "h264", "idle_share": 0.8}
    assert document["model"] == "dfine-n" and document["profile"] == "jetson"
    assert "\n".join(document["lines"]) in out and document["lines"][0].startswith("measured on")
    assert out.endswith(f"json: {report}\n")


@pytest.mark.parametrize("served", [370, 371, 372, 376, 392])
def test_the_verdict_reads_the_served_raw_the_table_shows(served):
    """8 cameras produced 400 frames: the figure printed (one frame per camera in flight counted as
    served) and the verdict agree at the one threshold; 376 used to print 0.940 and pass as sustained."""
    trial = streams.Trial(8, 10.0, 400.0, served, 1.0)
    shown = float(trial.ratio_text)
    assert trial.served_ratio == shown == trial.to_dict()["served_ratio"] == round((served + 8) / 400, 3)
    assert trial.sustained == (shown >= streams.SUSTAINED) == (served >= 372)


def _trial_up_to(capacity: int, seen: list[int]):
    def trial(k: int) -> streams.Trial:
        seen.append(k)
        served = 100 if k <= capacity else 80
        return streams.Trial(k, 1.0, 100.0, served, 0.5)

    return trial


@pytest.mark.parametrize(("capacity", "tried"), [(5, [1, 2, 4, 8, 6, 5]), (0, [1]), (16, [1, 2, 4, 8, 16])])
def test_the_search_doubles_then_bisects_to_the_largest_sustained_count(capacity, tried):
    seen: list[int] = []
    found, trials = streams.find_capacity(_trial_up_to(capacity, seen), max_streams=16)
    assert found == capacity and seen == tried and len(trials) == len(tried)


def test_streams_refuses_two_models_in_one_line(dfine_n_artifact, capsys):
    code = main(["--model", str(dfine_n_artifact), str(dfine_n_artifact), "--streams"])
    assert code == 2 and "one --model" in capsys.readouterr().err


@pytest.mark.parametrize("size", [("641", "479"), ("100", "80")])
def test_streams_refuses_a_camera_size_h264_cannot_hold_before_loading_the_model(tmp_path, capsys, size):
    missing = tmp_path / "not-loaded.onnx"  # never opened: the size is refused first
    code = main(["--model", str(missing), "--streams", "--frame-size", *size, "--work-dir", str(tmp_path)])
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and f"--streams --frame-size {' '.join(size)}: demo video" in line
    assert "use an even size of at least 160x120" in line
