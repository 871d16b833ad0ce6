"""Tracking and counting: objects on known paths in a generated video keep their ids, a line crossed a
known number of times is counted exactly, and the counts reach the API, the results and /metrics."""

from __future__ import annotations

import json
import sys
from collections import Counter
from dataclasses import dataclass

import cv2
import numpy as np
import pytest
from conftest import metric_value, wait_for

from dfine_deploy.errors import ServeError
from dfine_deploy.serve.settings import MAX_FRAME_SIDE, StreamSpec, load_streams_file, stream_from_dict
from dfine_deploy.serve.tracking import StreamTracker

SIZE = (320, 240)  # w, h
FRAMES = 60
SIDE = 20
RED, BLUE = (0, 0, 255), (255, 0, 0)  # BGR


def _paths(i: int) -> dict[str, tuple[tuple[int, int], tuple[int, int, int]]]:
    """Top-left corner and colour of each object in frame i.

    a: red, left to right along the top (crosses the line x=160 once, to the right)
    b: red, right to left through the middle (crosses once, to the left)
    c: blue, to the right and back along the bottom (crosses twice: right, then left)
    """
    t = i / (FRAMES - 1)
    bounce = 1 - abs(2 * t - 1)  # 0 -> 1 -> 0
    return {
        "a": ((int(10 + 280 * t), 30), RED),
        "b": ((int(290 - 280 * t), 110), RED),
        "c": ((int(30 + 220 * bounce), 190), BLUE),
    }


def _write_paths_video(path) -> None:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 20, SIZE)
    for i in range(FRAMES):
        image = np.full((SIZE[1], SIZE[0], 3), 60, np.uint8)
        for (x, y), colour in _paths(i).values():
            cv2.rectangle(image, (x, y), (x + SIDE - 1, y + SIDE - 1), colour, -1)
        writer.write(image)
    writer.release()


# A vertical line through the middle, drawn downwards: walking down the screen the left-hand side is the
# screen's right, so moving right across it counts "in" and moving left counts "out" (see CountingLine).
LINE = {"name": "middle", "start": [160, 0], "end": [160, 240]}
ZONE = {"name": "left", "polygon": [[0, 0], [150, 0], [150, 239], [0, 239]]}


def test_objects_on_known_paths_keep_their_ids_and_crossings_are_counted_exactly(serve, tmp_path):
    video = tmp_path / "paths.mp4"
    _write_paths_video(video)
    spec = StreamSpec(
        url=str(video), name="yard", every_frame=True, realtime=False, track=True, lines=[LINE], zones=[ZONE]
    )
    server = serve(streams=[spec], output_json=tmp_path / "results.jsonl")
    http = server.client
    wait_for(server.pipeline.all_finished, 30, "the video to be tracked to its end")
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["frame_index"] for r in results] == list(range(FRAMES))

    ids: dict[str, list[int | None]] = {name: [] for name in "abc"}
    for result in results:
        assert len(result["detections"]) == 3
        for name, ((x, y), _) in _paths(result["frame_index"]).items():  # each object's detection by position
            (det,) = [
                d for d in result["detections"] if abs(d["box"][0] - x) <= 3 and abs(d["box"][1] - y) <= 3
            ]
            ids[name].append(det["track_id"])
    for name, seen in ids.items():
        main_id, frames = Counter(i for i in seen if i is not None).most_common(1)[0]
        assert frames >= 0.9 * FRAMES, (
            f"object {name} kept track {main_id} in only {frames} of {FRAMES} frames"
        )
    assert len({Counter(seen).most_common(1)[0][0] for seen in ids.values()}) == 3  # three distinct objects

    expected = {"in": {"blue-square": 1, "red-square": 1}, "out": {"blue-square": 1, "red-square": 1}}
    assert results[-1]["counts"]["lines"] == {"middle": expected}
    assert results[-1]["counts"]["zones"] == {"left": {"blue-square": 1, "red-square": 1}}  # b and c end left
    (info,) = http.get("/v1/streams").json()
    assert info["track"] and info["counts"]["lines"] == {"middle": expected}
    for direction, by_class in expected.items():
        for cls, n in by_class.items():
            labels = {"stream": "yard", "line": "middle", "direction": direction, "class": cls}
            assert metric_value(http, "dfine_serve_line_crossings_total", **labels) == n
    assert (
        metric_value(
            http, "dfine_serve_zone_occupancy", stream="yard", zone="left", **{"class": "red-square"}
        )
        == 1
    )
    assert metric_value(http, "dfine_serve_tracker_seconds_count") == FRAMES

    http.delete("/v1/streams/yard")  # its series go with it
    assert "yard" not in http.get("/metrics").text


@dataclass
class _Dets:
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    names: list[str]


def _square(x: float) -> _Dets:
    return _Dets(np.array([[x, 10, x + 20, 30]], np.float32), np.ones(1), np.zeros(1, np.int64), ["thing"])


def test_a_redefinition_keeps_the_tracks_and_the_counts_of_what_it_left_as_it_was():
    """PATCH with one line moved: the unchanged line and zone keep their counts and the objects their
    ids; only the moved line starts from zero (before, every count of the stream restarted)."""
    moved_from = {"name": "second", "start": [200, 0], "end": [200, 240]}
    spec = StreamSpec(url="rtsp://cam/x", track=True, lines=[LINE, moved_from], zones=[ZONE])
    old = StreamTracker(spec)
    ids = [old.update(_square(130 + 5 * i), i / 10)[0] for i in range(20)]  # x 130 -> 225: crosses both
    assert old.counts()["lines"]["middle"]["in"] == {"thing": 1} == old.counts()["lines"]["second"]["in"]
    changed = StreamSpec(
        url="rtsp://cam/x",
        track=True,
        lines=[LINE, {**moved_from, "start": [250, 0], "end": [250, 240]}],
        zones=[ZONE],
    )
    spec.lines, spec.zones = changed.lines, changed.zones  # as PATCH does: the stream's spec, in place
    new = StreamTracker(spec, first_id=old.next_id)
    assert new.keep_from(old) == ({"middle"}, {"left"})
    assert new.counts()["lines"] == {
        "middle": {"in": {"thing": 1}, "out": {}},
        "second": {"in": {}, "out": {}},
    }
    later = [new.update(_square(230 + 5 * i), 2 + i / 10)[0] for i in range(10)]  # crosses x=250 only
    assert set(later) == {ids[-1]}  # the same object, the same id
    assert new.counts()["lines"]["second"]["in"] == {"thing": 1}
    assert new.counts()["lines"]["middle"]["in"] == {"thing": 1}  # still its one crossing
    untracked = StreamTracker(StreamSpec(url="rtsp://cam/x", zones=[ZONE]))
    assert untracked.keep_from(new) == (set(), set())  # tracking off: nothing to continue


def test_a_redefinition_keeps_the_metric_series_of_what_it_left_as_it_was():
    from collections import Counter as Counts

    from dfine_deploy.serve.metrics import ServeMetrics

    metrics = ServeMetrics()
    for line in ("middle", "second"):
        metrics.line_crossings.labels("cam", line, "in", "thing").inc(2)
    metrics.set_zone_occupancy("cam", {"left": Counts(thing=1), "right": Counts(thing=3)})
    metrics.forget_counting("cam", keep_lines={"middle"}, keep_zones={"left"})
    text = metrics.render().decode()
    assert 'line="middle"' in text and 'line="second"' not in text
    assert 'zone="left"' in text and 'zone="right"' not in text


def test_a_reconnect_starts_tracking_afresh_with_ids_never_reused():
    tracker = StreamTracker(StreamSpec(url="rtsp://cam/x", track=True, lines=[LINE]))
    before = [tracker.update(_square(100 + 5 * i), i / 10)[0] for i in range(10)]
    assert before[0] == -1 and len(set(before[1:])) == 1  # an id from the object's second frame on
    tracker.request_reset()
    after = [tracker.update(_square(120 + 5 * i), 100 + i / 10)[0] for i in range(14)]  # crosses x=160
    assert tracker.resets == 1
    assert after[0] == -1 and len(set(after[1:])) == 1 and after[1] > before[1]
    assert tracker.counts()["lines"]["middle"]["in"] == {"thing": 1}


def test_an_untracked_stream_publishes_null_track_ids(serve, tmp_path):
    video = tmp_path / "paths.mp4"
    _write_paths_video(video)
    server = serve(streams=[StreamSpec(url=str(video), name="v", every_frame=True, realtime=False)])
    wait_for(lambda: server.pipeline.get("v").frames_processed >= 5, 20, "five results")
    latest = server.client.get("/v1/streams/v/latest").json()
    assert latest["detections"] and all(d["track_id"] is None for d in latest["detections"])
    assert latest["counts"] is None and server.client.get("/v1/streams/v").json()["counts"] is None


@pytest.mark.parametrize(
    "entry, error",
    [
        ({"lines": [LINE]}, "counting lines follow tracks; set track: true"),
        ({"track": True, "lines": [{**LINE, "strat": [0, 0]}]}, "lines\\[0\\]: unknown key 'strat'"),
        ({"track": True, "lines": [{**LINE, "end": LINE["start"]}]}, "same point"),
        ({"zones": [{"name": "z", "polygon": [[0, 0], [1, 1]]}]}, "at least 3 points"),
        ({"zones": [{"name": "bad name", "polygon": [[0, 0], [9, 0], [9, 9]]}]}, "zones\\[0\\].name"),
        ({"track": True, "lines": [LINE], "zones": [{**ZONE, "name": "middle"}]}, "must be unique"),
        # finite numbers only: NaN and infinity would be stored and answered as null
        ({"zones": [{"name": "z", "polygon": [[0, 0], [9, 0], [float("nan"), 9]]}]}, "each a finite number"),
        ({"zones": [{"name": "z", "polygon": [[0, 0], [float("inf"), 0], [9, 9]]}]}, "each a finite number"),
        # frame pixels: from 0 to a bound (a zone is a mask as large as its farthest point)
        ({"zones": [{"name": "z", "polygon": [[0, 0], [9, 0], [9, -1]]}]}, r"in \[0, 8192\], got \[9, -1\]"),
        ({"zones": [{"name": "z", "polygon": [[0, 0], [9, 0], [9, 10**6]]}]}, r"got \[9, 1000000\]"),
        ({"track": True, "lines": [{**LINE, "end": [True, 5]}]}, r"lines\[0\].end: .*got \[True, 5\]"),
        ({"track": True, "lines": [{**LINE, "end": [float("nan"), 5]}]}, "lines\\[0\\].end: .*finite"),
        # a zone is a simple polygon with an area
        ({"zones": [{"name": "z", "polygon": [[0, 0], [9, 9], [9, 0], [0, 9]]}]}, "edges 0 and 2 cross"),
        ({"zones": [{"name": "z", "polygon": [[0, 0], [5, 5], [9, 9]]}]}, "encloses no area"),
        ({"zones": [{"name": "z", "polygon": [[3, 3], [3, 3], [3, 3]]}]}, "encloses no area"),
    ],
)
def test_counting_settings_are_checked_with_one_clear_line(entry, error):
    with pytest.raises(ServeError, match=error):
        stream_from_dict({"url": "rtsp://cam/x", **entry}, "streams[0]")


def test_counting_in_the_stream_list(tmp_path):
    path = tmp_path / "streams.yaml"
    path.write_text(
        "streams:\n"
        "  - {url: rtsp://cam/x, name: gate, track: true,\n"
        "     lines: [{name: door, start: [0, 50], end: [100, 50]}],\n"
        "     zones: [{name: dock, polygon: [[0, 0], [10, 0], [10, 10]]}]}\n"
    )
    (spec,) = load_streams_file(path)
    assert spec.track and spec.lines[0].end == (100.0, 50.0) and len(spec.zones[0].polygon) == 3


def test_frames_without_detections_do_not_break_tracking():
    tracker = StreamTracker(StreamSpec(url="rtsp://cam/x", track=True, zones=[ZONE]))
    empty = _Dets(np.zeros((0, 4), np.float32), np.zeros(0), np.zeros(0, np.int64), [])
    assert len(tracker.update(empty, 0.0)) == 0  # no track yet, nothing seen
    ids = [tracker.update(_square(100 + 5 * i), 0.1 + i / 10)[0] for i in range(3)]
    assert len(tracker.update(empty, 0.5)) == 0  # tracks alive, nothing seen in this frame
    assert tracker.update(_square(120), 0.6)[0] == ids[-1]  # the same object again, the same id
    assert tracker.counts()["zones"] == {"left": {"thing": 1}}


def test_tracking_and_counting_of_a_running_stream_change_over_rest(serve, mjpeg_camera):
    http = serve().client
    url = mjpeg_camera.url.replace("http://", "http://op:s3cret@")  # the camera ignores them
    assert http.post("/v1/streams", json={"url": url, "name": "cam", "wait_live_s": 10}).status_code == 201
    latest = lambda: http.get("/v1/streams/cam/latest").json()  # noqa: E731
    wait_for(lambda: latest()["detections"], 10, "a detection")
    assert latest()["detections"][0]["track_id"] is None

    line = {"name": "gate", "start": [60, 0], "end": [60, 120]}
    changed = http.patch("/v1/streams/cam", json={"track": True, "lines": [line]})
    assert (
        changed.status_code == 200
        and changed.json()["track"]
        and changed.json()["lines"][0]["name"] == "gate"
    )
    wait_for(lambda: latest()["detections"][0]["track_id"] is not None, 10, "a track id")
    assert set(latest()["counts"]["lines"]) == {"gate"}

    assert http.patch("/v1/streams/cam", json={"lines": [{**line, "strat": [0, 0]}]}).status_code == 422
    refused = http.patch("/v1/streams/cam", json={"lines": [{**line, "end": line["start"]}]})
    assert refused.status_code == 400
    assert refused.json()["detail"].startswith("stream 'cam': lines[0]: start and end are the same point")
    assert "s3cret" not in refused.text  # named by the stream, never by its URL
    assert http.patch("/v1/streams/cam", json={"track": False}).status_code == 400  # the line needs tracking
    assert http.patch("/v1/streams/cam", json={"trak": True}).status_code == 422
    assert http.patch("/v1/streams/none", json={"track": True}).status_code == 404
    off = http.patch("/v1/streams/cam", json={"track": False, "lines": []})
    assert off.status_code == 200 and off.json()["counts"] is None
    wait_for(
        lambda: latest()["detections"] and latest()["detections"][0]["track_id"] is None, 10, "no track ids"
    )


def _write_scene_video(path, squares: list[tuple[int, int, tuple[int, int, int]]], frames: int = 6) -> None:
    """A still scene: squares (x, y, colour) on grey, the same in every frame."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 20, SIZE)
    image = np.full((SIZE[1], SIZE[0], 3), 60, np.uint8)
    for x, y, colour in squares:
        cv2.rectangle(image, (x, y), (x + SIDE - 1, y + SIDE - 1), colour, -1)
    for _ in range(frames):
        writer.write(image)
    writer.release()


SCENES = {  # squares, and the objects inside ZONE (x < 150) per class
    "one red": ([(20, 20, RED)], {"red-square": 1}),
    "two red, one blue": (
        [(20, 20, RED), (60, 100, RED), (100, 180, BLUE)],
        {"red-square": 2, "blue-square": 1},
    ),
    "three blue inside, a red outside": (
        [(10, 10, BLUE), (50, 60, BLUE), (90, 150, BLUE), (250, 100, RED)],
        {"blue-square": 3},
    ),
}


@pytest.mark.parametrize("scene", list(SCENES))
@pytest.mark.parametrize("track", [False, True])
def test_zone_occupancy_counts_objects_not_label_pairs(serve, tmp_path, scene, track):
    """The detector answers like D-FINE's top-K: every box twice, under both classes. The zone, the
    tracks, the published detections and /metrics must all see each object once."""
    from fake_detector import RedSquareDetector

    squares, inside = SCENES[scene]
    video = tmp_path / "scene.mp4"
    _write_scene_video(video, squares)
    spec = StreamSpec(url=str(video), name="v", every_frame=True, realtime=False, track=track, zones=[ZONE])
    server = serve(detector=RedSquareDetector(top_k_pairs=True), streams=[spec])
    wait_for(server.pipeline.all_finished, 20, "the file to end")
    latest = server.client.get("/v1/streams/v/latest").json()
    assert latest["counts"]["zones"] == {"left": inside}
    for name in ("red-square", "blue-square"):
        value = metric_value(
            server.client, "dfine_serve_zone_occupancy", stream="v", zone="left", **{"class": name}
        )
        assert value == inside.get(name, 0), name
    assert len(latest["detections"]) == len(squares) and latest["raw_detections"] is None
    folded = metric_value(server.client, "dfine_serve_labels_folded_total", stream="v")
    assert folded == len(squares) * server.pipeline.get("v").frames_processed  # each box's second label
    assert len({tuple(d["box"]) for d in latest["detections"]}) == len(squares)
    if track:  # one track per object, not one per (object, label)
        ids = [d["track_id"] for d in latest["detections"]]
        assert None not in ids and len(set(ids)) == len(squares)


def test_raw_detections_keep_the_models_pairs_for_clients_that_ask(serve, tmp_path):
    from fake_detector import RedSquareDetector

    squares = SCENES["two red, one blue"][0]
    video = tmp_path / "scene.mp4"
    _write_scene_video(video, squares)
    spec = StreamSpec(url=str(video), name="v", every_frame=True, realtime=False, track=True, zones=[ZONE])
    server = serve(detector=RedSquareDetector(top_k_pairs=True), streams=[spec], raw_detections=True)
    wait_for(server.pipeline.all_finished, 20, "the file to end")
    latest = server.client.get("/v1/streams/v/latest").json()
    objects, raw = latest["detections"], latest["raw_detections"]
    assert (
        len(objects) == 3
        and len(raw) == 6
        and latest["counts"]["zones"]["left"] == {"red-square": 2, "blue-square": 1}
    )
    assert sorted(d["score"] for d in raw) == [0.4] * 3 + [0.9] * 3  # both labels of every box, as they came
    ids = {tuple(d["box"]): d["track_id"] for d in objects}
    assert all(d["track_id"] == ids[tuple(d["box"])] for d in raw)  # each pair carries its object's id

    image = np.full((SIZE[1], SIZE[0], 3), 60, np.uint8)
    cv2.rectangle(image, (20, 20), (39, 39), RED, -1)
    body = cv2.imencode(".png", image)[1].tobytes()
    reply = server.client.post("/v1/detect", content=body, headers={"Content-Type": "image/png"}).json()
    assert [d["name"] for d in reply["detections"]] == ["red-square"]
    assert sorted(d["name"] for d in reply["raw_detections"]) == ["blue-square", "red-square"]


def test_uploads_get_one_label_per_object_by_default(serve):
    from fake_detector import RedSquareDetector

    server = serve(detector=RedSquareDetector(top_k_pairs=True))
    image = np.full((SIZE[1], SIZE[0], 3), 60, np.uint8)
    for x in (20, 80):
        cv2.rectangle(image, (x, 20), (x + SIDE - 1, 39), BLUE, -1)
    body = cv2.imencode(".png", image)[1].tobytes()
    reply = server.client.post("/v1/detect", content=body, headers={"Content-Type": "image/png"}).json()
    assert [(d["name"], d["score"]) for d in reply["detections"]] == [("blue-square", 0.9)] * 2
    assert reply["raw_detections"] is None


@pytest.mark.parametrize(
    "start, end",
    [((160, 0), (160, 240)), ((160, 240), (160, 0)), ((0, 120), (320, 120)), ((20, 20), (300, 220))],
    ids=["down", "up", "right", "diagonal"],
)
def test_in_is_the_side_in_direction_points_to(start, end):
    """What the docs and the dashboard's arrow say: crossing towards `in_direction` counts "in"."""
    line = {"name": "gate", "start": list(start), "end": list(end)}
    spec = StreamSpec(url="rtsp://cam/x", track=True, lines=[line])
    nx, ny = spec.lines[0].in_direction()
    assert abs(nx * (end[0] - start[0]) + ny * (end[1] - start[1])) < 1e-9  # across the line
    middle = ((start[0] + end[0]) / 2, (start[1] + end[1]) / 2)
    for direction, sign in (("in", 1), ("out", -1)):
        tracker = StreamTracker(spec)
        for step in range(-10, 11):  # from 50 px on one side to 50 px on the other, 5 px a frame
            cx, cy = middle[0] + sign * nx * 5 * step, middle[1] + sign * ny * 5 * step
            box = np.array([[cx - 10, cy - 10, cx + 10, cy + 10]], np.float32)
            tracker.update(_Dets(box, np.ones(1), np.zeros(1, np.int64), ["thing"]), step / 10)
        crossed = tracker.counts()["lines"]["gate"]
        assert crossed == {direction: {"thing": 1}, ("out" if direction == "in" else "in"): {}}, crossed


def test_a_patch_past_the_frame_bound_or_refused_midway_leaves_the_stream_as_it_was(
    serve, mjpeg_camera, monkeypatch
):
    server = serve()
    http = server.client
    zone = {"name": "dock", "polygon": [[0, 0], [50, 0], [50, 50]]}
    body = {"url": mjpeg_camera.url, "name": "cam", "zones": [zone]}
    assert http.post("/v1/streams", json=body).status_code == 201
    far = {"name": "far", "polygon": [[0, 0], [10**6, 0], [10**6, 10**6]]}
    refused = http.patch("/v1/streams/cam", json={"zones": [far]})
    assert refused.status_code == 400, refused.text
    assert refused.json()["detail"] == (
        f"stream 'cam': zones[0].polygon[1]: expected a point [x, y] in frame pixels, each a finite "
        f"number in [0, {MAX_FRAME_SIDE}], got [1000000.0, 0.0]"
    )
    assert http.get("/healthz").status_code == 200
    assert http.get("/v1/streams/cam").json()["zones"] == [zone]
    # booleans are no numbers, and numbers no booleans: refused as the wrong type
    for wrong in ({"track": 1}, {"zones": [{**zone, "polygon": [[True, 0], [50, 0], [50, 50]]}]}):
        assert http.patch("/v1/streams/cam", json=wrong).status_code == 422, wrong
    # the tracker cannot be built (the tracking extra missing): nothing of the change is kept
    monkeypatch.setitem(sys.modules, "dfine_deploy.serve.tracking", None)
    line = {"name": "gate", "start": [10, 0], "end": [10, 40]}
    missing = http.patch("/v1/streams/cam", json={"track": True, "lines": [line]})
    assert missing.status_code >= 400 and "tracking" in missing.text
    after = http.get("/v1/streams/cam").json()
    assert (after["track"], after["lines"], after["zones"]) == (False, [], [zone])
