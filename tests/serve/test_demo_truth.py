"""The demo video's ground truth (dfine_deploy/data/moving.py): tracks in the MOT Challenge format that
trackers' evaluation reads, the true crossings beside them, the fast-mover scene moving each object a
third of its width per frame, and `dfine-data video` with a camera's knobs (rate, stops, an occluder,
small objects, one colour)."""

from __future__ import annotations

import json

import pytest

from dfine_deploy.bench.tracking import score_tracks
from dfine_deploy.data.moving import DemoVideo, Route, fast_movers, truth_paths


def test_written_truth_lists_every_object_in_every_frame_in_mot_form(tmp_path):
    video = DemoVideo(frames=20)
    path = video.write(tmp_path / "demo.mp4", truth=True)
    tracks, facts = truth_paths(path)
    rows = [line.split(",") for line in tracks.read_text().splitlines()]
    assert len(rows) == sum(len(video.truth(i)) for i in range(video.frames))
    frame, object_id, x, y, w, h, conf, cls = map(int, rows[0][:8])
    ((index, _, box),) = [t for t in video.truth(frame - 1) if t[0] == object_id - 1]
    assert (x, y, x + w, y + h) == box and (conf, cls, float(rows[0][8])) == (1, 1, 1.0)
    written = json.loads(facts.read_text())
    assert written["expected_crossings"] == video.expected_crossings(video.line)
    assert written["classes"] == {str(i + 1): o.class_name for i, o in enumerate(video.objects)}


def test_truth_scored_against_itself_is_perfect_and_a_swapped_id_is_one_switch(tmp_path):
    video = DemoVideo(frames=20)
    tracks, _ = video.write_truth(tmp_path / "demo.mp4")
    assert score_tracks(tracks, tracks) == {"HOTA": 1.0, "IDF1": 1.0, "MOTA": 1.0, "id switches": 0}
    # object 1 takes a new id from frame 11 on: one id switch, fewer frames with the right id
    swapped = tmp_path / "swapped.txt"
    swapped.write_text(
        "\n".join(
            row.replace(",1,", ",99,", 1) if row.split(",")[1] == "1" and int(row.split(",")[0]) > 10 else row
            for row in tracks.read_text().splitlines()
        )
    )
    figures = score_tracks(tracks, swapped)
    assert figures["id switches"] == 1 and figures["IDF1"] < 1 and figures["MOTA"] < 1


@pytest.mark.parametrize("frames", [40, 100])
def test_fast_movers_move_a_third_of_their_width_per_frame_and_cross_the_line(frames):
    video = DemoVideo(frames=frames, objects=fast_movers(frames))
    for index, _ in enumerate(video.objects):
        (_, _, (a1, _, a2, _)), (_, _, (b1, _, _, _)) = (
            next(t for t in video.truth(i) if t[0] == index) for i in (3, 4)
        )
        assert abs(abs(b1 - a1) / (a2 - a1) - 1 / 3) < 0.05
    crossings = video.expected_crossings(video.line)
    passes = sum(o.route.passes for o in video.objects)
    assert sum(sum(c.values()) for c in crossings.values()) == passes


def test_a_route_with_passes_goes_back_and_forth():
    route = Route((0.0, 0.5), (1.0, 0.5), passes=3)
    assert [round(route.at(t)[0], 3) for t in (0, 1 / 6, 1 / 3, 1 / 2, 2 / 3, 1)] == [0, 0.5, 1, 0.5, 0, 1]


def _rows(path) -> list[list[str]]:
    return [line.split(",") for line in path.read_text().splitlines()]


def test_dfine_data_video_writes_a_video_and_its_truth_as_the_docs_run_it(tmp_path, monkeypatch, capsys):
    """`dfine-data video --out videos/demo.mp4 --fps 15 --seconds 4`, from the user's folder: the video
    plays at its rate with seconds x fps frames, and its truth lies beside it."""
    import cv2

    from dfine_deploy.data.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["video", "--out", "videos/demo.mp4", "--fps", "15", "--seconds", "4"]) == 0
    capture = cv2.VideoCapture(str(tmp_path / "videos" / "demo.mp4"))
    assert capture.get(cv2.CAP_PROP_FPS) == 15 and capture.get(cv2.CAP_PROP_FRAME_COUNT) == 60
    capture.release()
    facts = json.loads((tmp_path / "videos" / "demo.truth.json").read_text())
    assert facts["fps"] == 15 and facts["frames"] == 60
    assert max(int(r[0]) for r in _rows(tmp_path / "videos" / "demo.gt.txt")) == 60
    said = capsys.readouterr().out
    assert f"dfine-bench --model MODEL --tracking {tmp_path / 'videos' / 'demo.mp4'}" in said
    assert main(["video", "--out", "videos/demo.mp4", "--seconds", "2"]) == 0  # its own: replaced


def test_objects_told_to_stop_stand_still_on_their_way():
    from dfine_deploy.data.moving import stopping

    plain = DemoVideo()
    stopped = DemoVideo(objects=stopping(plain.objects, 2.0, plain.fps))
    still = [
        sum(stopped.truth(i)[0][2] == stopped.truth(i + 1)[0][2] for i in range(stopped.frames - 1)),
        sum(plain.truth(i)[0][2] == plain.truth(i + 1)[0][2] for i in range(plain.frames - 1)),
    ]
    assert still[0] >= 19 and still[1] <= 2  # 2 s at 10 fps: 20 frames in one place
    assert stopped.expected_crossings(stopped.line) == plain.expected_crossings(plain.line)


def test_an_occluder_hides_what_passes_behind_it_and_the_truth_says_so(tmp_path):
    """Behind the pillar an object shows less: its truth box is what shows, and where less than a
    quarter of it shows the row is marked 0 (not scored), as the MOT Challenge marks such objects."""
    from dfine_deploy.data.moving import MIN_VISIBLE, OCCLUDER_COLOUR

    video = DemoVideo(occluder=0.3)
    frame = video.render(0)
    column = round(0.3 * video.width)
    assert (frame[:, column].astype(int) - OCCLUDER_COLOUR).__abs__().max() <= 6  # the pillar, sensor noise
    rows = _rows(video.write(tmp_path / "hidden.mp4", truth=True).with_name("hidden.gt.txt"))
    shares = [float(r[8]) for r in rows]
    assert min(shares) < MIN_VISIBLE and any(0 < s < 1 for s in shares)
    assert all((r[6] == "1") == (float(r[8]) >= MIN_VISIBLE) for r in rows)
    assert len(rows) == len(
        _rows(DemoVideo().write(tmp_path / "open.mp4", truth=True).with_name("open.gt.txt"))
    )


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--out", "clip.avi"], "name an .mp4 file"),
        (["--out", "mine.mp4"], "mine.mp4 exists and is not a file this command wrote"),
        (["--out", "theirs.mp4"], "theirs.gt.txt exists and is not a file this command wrote"),
        (["--out", "v.mp4", "--occluder", "1.5"], "give a share of the width, 0 to 1"),
    ],
    ids=["not-mp4", "foreign-video", "foreign-truth", "occluder-outside"],
)
def test_dfine_data_video_refuses_in_one_line(tmp_path, monkeypatch, capsys, argv, says):
    from dfine_deploy.data.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.mp4").write_bytes(b"someone's video")
    (tmp_path / "theirs.gt.txt").write_text("1,1,0,0,5,5,1,1,1\n")  # their truth, no video of ours
    assert main(["video", *argv]) != 0
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and says in said[0], said
    assert (tmp_path / "mine.mp4").read_bytes() == b"someone's video"
    assert (tmp_path / "theirs.gt.txt").read_text() == "1,1,0,0,5,5,1,1,1\n"


def test_small_objects_are_smaller_and_one_colour_paints_every_class_alike():
    from dfine_deploy.data.moving import ONE_COLOUR, scaled

    plain = DemoVideo()
    small = DemoVideo(objects=scaled(plain.objects, 0.4))
    widths = [(b[2] - b[0], s[2] - s[0]) for (_, _, b), (_, _, s) in zip(plain.truth(0), small.truth(0))]
    assert all(0.3 * w <= ws <= 0.5 * w for w, ws in widths)
    image = DemoVideo(one_colour=True).render(0)
    for _, _, (x1, y1, x2, y2) in plain.truth(0):
        patch = image[y1:y2, x1:x2].reshape(-1, 3).astype(int)
        assert (abs(patch - ONE_COLOUR).sum(axis=1) < 30).mean() > 0.2  # each object is painted in it
