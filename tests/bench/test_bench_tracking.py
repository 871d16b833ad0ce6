"""dfine-bench --tracking VIDEO --truth GT: the served tracker on the trained model, scored by trackers'
evaluation; the figures printed and written are the library's own for the same files."""

from __future__ import annotations

import json

import pytest

from dfine_deploy.bench.cli import main
from dfine_deploy.bench.tracking import count_errors
from dfine_deploy.data.moving import DemoVideo


def test_tracking_figures_equal_trackers_own_evaluation_of_the_same_files(trained_export, tmp_path, capsys):
    from trackers.eval import evaluate_mot_sequence

    video = DemoVideo(frames=40)
    path = video.write(tmp_path / "demo.mp4", truth=True)
    truth = tmp_path / "demo.gt.txt"
    report = tmp_path / "tracking.json"
    argv = ["--model", str(trained_export), "--tracking", str(path), "--truth", str(truth)]
    assert main([*argv, "--work-dir", str(tmp_path / "work"), "--json", str(report)]) == 0
    written = json.loads(report.read_text())
    own = evaluate_mot_sequence(truth, written["tracks"], metrics=["CLEAR", "HOTA", "Identity"])
    assert (written["HOTA"], written["IDF1"], written["MOTA"], written["id switches"]) == (
        own.HOTA.HOTA,
        own.Identity.IDF1,
        own.CLEAR.MOTA,
        own.CLEAR.IDSW,
    )
    assert own.HOTA.HOTA > 0.3  # the trained model finds the objects: a tracker with nothing scores 0
    printed = capsys.readouterr().out
    assert f"HOTA         {own.HOTA.HOTA:.3f}" in printed and f"id switches  {own.CLEAR.IDSW}" in printed
    expected = video.expected_crossings(video.line)
    assert written["expected"] == expected
    assert written["count_error"] == count_errors(written["counted"], expected)


def test_the_quickstart_video_is_counted_exactly(trained_export, tmp_path):
    """The quickstart's demo video (120 frames, 5 objects, 6 crossings) through the trained model and
    the served tracker: every object found in most of its frames, every crossing counted once, no
    id switch. One rectangle's crossing used to go uncounted: the detector missed it for two frames
    on the line, and the line forgot which side it had come from."""
    video = DemoVideo(frames=120)
    path = video.write(tmp_path / "input.mp4", truth=True)
    report = tmp_path / "tracking.json"
    argv = ["--model", str(trained_export), "--tracking", str(path)]
    assert main([*argv, "--work-dir", str(tmp_path / "work"), "--json", str(report)]) == 0
    written = json.loads(report.read_text())
    assert all(o["frames_found"] >= 0.5 * o["frames_in_view"] for o in written["objects_found"])
    assert written["counted"] == video.expected_crossings(video.line), written["count_error"]
    assert written["id switches"] == 0 and written["ids_taken_over"] == {}


def test_count_error_is_counted_minus_true_for_every_class_either_names():
    counted = {"in": {"rectangle": 1, "ring": 1}, "out": {}}
    expected = {"in": {"rectangle": 2}, "out": {"ellipse": 1}}
    assert count_errors(counted, expected) == {
        "in": {"rectangle": -1, "ring": 1},
        "out": {"ellipse": -1},
    }


@pytest.mark.parametrize(
    "extra, says",
    [
        (["--tracking", "missing.mp4"], "--tracking"),
        (["--truth", "gt.txt"], "--truth belongs to --tracking"),
        (["--tracking", "v.mp4", "--streams"], "a measurement of its own"),
        (["--tracking", "v.mp4", "--detect-fps", "5"], "add --tracking --motion"),
    ],
)
def test_tracking_refuses_what_it_cannot_score_in_one_line(tmp_path, monkeypatch, capsys, extra, says):
    monkeypatch.chdir(tmp_path)
    assert main(["--model", "export", *extra]) != 0
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and says in said[0] and "Traceback" not in said[0]


def test_capped_detection_rate_counts_fast_movers_with_predicted_boxes(trained_export, tmp_path):
    """dfine-bench --tracking --motion --detect-fps 5 on objects moving a third of their width a
    frame at 10 fps (each detection finds them two thirds of their width further on): between
    detections the tracks are published at their predicted boxes, at least 90 % of the crossings are
    counted, none twice, and no track takes over another object."""
    from dfine_deploy.data.moving import fast_movers

    frames = 120
    video = DemoVideo(frames=frames, objects=fast_movers(frames))
    path = video.write(tmp_path / "fast.mp4", truth=True)
    report = tmp_path / "tracking.json"
    argv = ["--model", str(trained_export), "--tracking", str(path), "--motion", "--detect-fps", "5"]
    assert main([*argv, "--work-dir", str(tmp_path / "work"), "--json", str(report)]) == 0
    written = json.loads(report.read_text())
    expected = video.expected_crossings(video.line)
    true_total = sum(n for by_class in expected.values() for n in by_class.values())
    errors = [n for by_class in written["count_error"].values() for n in by_class.values()]
    assert true_total >= 15 and all(n <= 0 for n in errors), written["count_error"]
    assert true_total + sum(errors) >= 0.9 * true_total, written["count_error"]
    assert written["ids_taken_over"] == {}
    # the frames between detections carry boxes, each a prediction and not the earlier box repeated
    rows = [line.split(",") for line in (tmp_path / "work" / "fast.tracks.txt").read_text().splitlines()]
    boxes = {(int(r[0]), int(r[1])): tuple(float(v) for v in r[2:6]) for r in rows}
    between = [(f, t) for f, t in boxes if f % 2 == 0 and (f - 1, t) in boxes]  # frames 2, 4, ...: predicted
    assert len(between) >= 0.5 * frames
    assert sum(boxes[f, t] != boxes[f - 1, t] for f, t in between) >= 0.95 * len(between)


def test_objects_found_and_ids_taken_over_pair_boxes_with_the_truth_frame_by_frame(tmp_path):
    """An object without a box in any served frame is found in 0 of them; a track id that goes from
    one object to another is named with both."""
    from dfine_deploy.bench.tracking import frames_found, ids_taken_over

    video = DemoVideo(frames=20)
    video.write_truth(tmp_path / "demo.mp4")
    truth = tmp_path / "demo.gt.txt"
    served = {f + 1: [(i, box) for i, _, box in video.truth(f) if i != 1] for f in range(0, 20, 2)}
    found = frames_found(truth, served)
    assert found[2] == (0, video.frames_in_view(1) // 2)  # object 2 (index 1) never has a box
    assert found[1] == (10, 10) and all(n == of for n, of in found.values() if of and n)
    rows = []
    for f in range(20):  # track 7 follows object 1 for 10 frames, then object 3
        (box,) = [b for i, _, b in video.truth(f) if i == (0 if f < 10 else 2)]
        rows.append(f"{f + 1},7,{box[0]},{box[1]},{box[2] - box[0]},{box[3] - box[1]},1,-1,-1,-1")
    tracks = tmp_path / "tracks.txt"
    tracks.write_text("\n".join(rows) + "\n")
    assert ids_taken_over(truth, tracks) == {7: [1, 3]}
    tracks.write_text("\n".join(rows[:10]) + "\n")
    assert ids_taken_over(truth, tracks) == {}


def test_a_run_that_tracked_nothing_scores_zero_instead_of_failing(tmp_path):
    """trackers.eval refuses a tracks file without rows; a model that finds nothing is a result (every
    object missed), not a traceback."""
    from dfine_deploy.bench.tracking import NOTHING_TRACKED, score_tracks

    truth, tracks = tmp_path / "gt.txt", tmp_path / "tracks.txt"
    truth.write_text("1,1,10,10,20,20,1,1,1\n2,1,12,10,20,20,1,1,1\n")
    tracks.write_text("\n")
    assert score_tracks(truth, tracks) == NOTHING_TRACKED


@pytest.mark.parametrize(
    ("rows", "says"),
    [
        ("", "holds no rows"),
        ("1,1,10,10,20,20,1,1,1\nx,y\n", "gt.txt:2: 'x,y' is not a MOT Challenge row"),
        ("1,1,10,10,-5,20,1,1,1\n", "gt.txt:1: '1,1,10,10,-5,20,1,1,1' is not a MOT Challenge row"),
        ("7\n", "gt.txt:1: '7' is not a MOT Challenge row"),
    ],
    ids=["empty", "text", "negative-width", "one-column"],
)
def test_a_truth_that_is_no_mot_file_is_refused_before_tracking(tmp_path, monkeypatch, capsys, rows, says):
    """trackers.eval refused it after the whole video had been tracked, as a ValueError traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "v.mp4").write_bytes(b"")
    (tmp_path / "gt.txt").write_text(rows)
    opened = []
    monkeypatch.setattr("dfine_deploy.bench.streams.open_as_served", lambda *a: opened.append(a))
    assert main(["--model", "export", "--tracking", "v.mp4", "--truth", "gt.txt"]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and says in said[0], said
    assert opened == []  # refused before a model was opened
