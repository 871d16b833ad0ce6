"""The demo video's ground truth (dfine_deploy/data/moving.py): tracks in the MOT Challenge format that
trackers' evaluation reads, the true crossings beside them, and the fast-mover scene moving each object a
third of its width per frame."""

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
    frame, object_id, x, y, w, h, conf, cls, visibility = map(int, rows[0])
    ((index, _, box),) = [t for t in video.truth(frame - 1) if t[0] == object_id - 1]
    assert (x, y, x + w, y + h) == box and (conf, cls, visibility) == (1, 1, 1)
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
