"""Tiles and the motion gate (dfine_deploy/tiles.py, dfine_deploy/serve/regions.py): what the detector
sees of a frame, and that what is published and counted from it stays right."""

from __future__ import annotations

import re
from pathlib import Path

import cv2
import numpy as np
import pytest

from dfine_deploy.data.shapes import CLASS_NAMES
from dfine_deploy.errors import ServeError
from dfine_deploy.runtime.detections import Detections
from dfine_deploy.runtime.tile_merge import merge
from dfine_deploy.serve.settings import StreamSpec, stream_from_dict
from dfine_deploy.tiles import TileSpec, tile_windows
from tests.serve.conftest import wait_for
from tests.serve.fake_detector import DemoColourDetector, RedSquareDetector
from tests.serve.low_res_detector import LowResColourDetector


def _det(boxes, labels=None) -> Detections:
    b = np.array(boxes, np.float32).reshape(-1, 4)
    labels = np.zeros(len(b), np.int64) if labels is None else np.array(labels, np.int64)
    return Detections(b, np.full(len(b), 0.9, np.float32), labels, [f"c{i}" for i in labels])


# -- merging at the seams ---------------------------------------------------------------------------
WINDOWS = tile_windows(320, 240, TileSpec((2, 1), overlap=0.2, full_frame=False))  # x seams at 142, 178


def test_windows_cover_the_frame_with_overlap():
    assert WINDOWS == [(0, 0, 178, 240), (142, 0, 320, 240)]
    windows = tile_windows(1920, 1080, TileSpec())
    assert len(windows) == 7 and windows[-1] == (0, 0, 1920, 1080)
    covered = np.zeros((1080, 1920), bool)
    for x1, y1, x2, y2 in windows[:-1]:
        covered[y1:y2, x1:x2] = True
    assert covered.all()


def test_an_object_on_a_seam_is_counted_once():
    left, right = WINDOWS
    # whole in the right crop, a cut piece in the left one: the piece goes
    merged = merge([(left, _det([[150, 10, 178, 40]])), (right, _det([[8, 10, 28, 40]]))], 320, 240)
    assert merged.boxes.tolist() == [[150, 10, 170, 40]]
    # wider than the overlap: cut in both crops, the two pieces are joined
    merged = merge([(left, _det([[130, 60, 178, 90]])), (right, _det([[0, 60, 58, 90]]))], 320, 240)
    assert merged.boxes.tolist() == [[130, 60, 200, 90]]
    # a piece whose box runs past its crop's edge (measured on the quickstart model: 5 px) is still
    # a piece: it goes under the whole box the other crop found, instead of being a second object
    merged = merge([(left, _det([[120, 100, 172, 140]])), (right, _det([[-5, 108, 33, 143]]))], 320, 240)
    assert merged.boxes.tolist() == [[120, 100, 172, 140]]
    # two neighbours of one class, and one object under two classes (D-FINE's top-K pairs), all kept
    merged = merge(
        [(left, _det([[10, 10, 30, 30], [34, 10, 54, 30], [10, 10, 30, 30]], [0, 0, 1]))], 320, 240
    )
    assert len(merged) == 3


def test_tile_settings_are_checked_in_one_line():
    good = stream_from_dict({"url": "a.mp4", "tiles": {"grid": [4, 3], "overlap": 0.1}}, "list")
    assert good.tiles == TileSpec((4, 3), 0.1, True)
    both = stream_from_dict({"url": "a.mp4", "tiles": {"grid": [3, 2]}, "detect": {"motion": True}}, "list")
    assert both.tiles == TileSpec((3, 2)) and both.detect.motion
    for entry, expected in (
        ({"tiles": {"grid": [3]}}, r"tiles: grid \[3\]: give \[columns, rows\]"),
        ({"tiles": {"grid": [3, 2], "overlap": 0.9}}, r"tiles: overlap 0.9: give a fraction"),
        ({"tiles": {"gird": [3, 2]}}, r"tiles: unknown key 'gird'"),
        ({"detect": {"motion": "yes"}}, r"detect: motion 'yes': give true or false"),
        ({"detect": {"motion": True, "fps": -1}}, r"detect: fps -1: give detections per second"),
    ):
        with pytest.raises(ServeError, match=expected):
            stream_from_dict({"url": "a.mp4", **entry}, "list")


# -- tiles on the dense synthetic set -----------------------------------------------------------------
def test_dense_set_tiles_find_small_objects_once_each(tmp_path, monkeypatch):
    """The docs' `dfine-data synth --dense` line, then whole frames against 3x2 tiles with a detector
    that sees 256 x 256 pixels (low_res_detector.py): tiles must find at least 15 points more of the
    objects, none on a seam twice, at (crops + 1) detector images per frame."""
    from dfine_deploy.bench.tiles import compare, load_frames
    from dfine_deploy.data.cli import main as data_main

    monkeypatch.chdir(tmp_path)
    assert data_main(["synth", "--dense", "--out", "runs/dense", "--images", "1", "--val-images", "2"]) == 0
    detector = LowResColourDetector()
    frames = load_frames(Path("runs/dense"), list(CLASS_NAMES), None)
    assert len(frames) == 2 and all(img.shape == (1080, 1920, 3) for img, _, _ in frames)
    assert all(150 <= len(t) <= 400 for _, t, _ in frames)
    sizes = np.concatenate([np.sqrt((t[:, 2] - t[:, 0]) * (t[:, 3] - t[:, 1])) for _, t, _ in frames])
    assert sizes.min() >= 6 and sizes.max() <= 24 * 1.5  # 8-24 px before rotation and aspect
    spec = TileSpec()
    whole, tiled = compare(detector, frames, spec, max_batch=8)
    assert tiled.recall >= whole.recall + 0.15, (whole.to_dict(), tiled.to_dict())
    assert tiled.seam_objects >= 20 and tiled.seam_found_twice == 0
    assert detector.images == len(frames) * (1 + spec.images)  # one whole frame + (crops + 1) a frame


def test_bench_tiles_on_the_quickstart_model(quickstart_run, tmp_path, monkeypatch, capsys):
    """The docs' `dfine-bench --tiles` line on the quickstart model: both modes on the same graph,
    7 detector images a tiled frame, the cost ratio printed beside its limit (its value is a timing
    on a shared machine, not asserted here: docs/bench.md gives measured figures; the images counted
    are asserted exactly in the test above). The quickstart model finds none of these 8-24 px
    objects (docs/bench.md says why)."""
    import json

    from dfine_deploy.bench.cli import main as bench_main
    from dfine_deploy.data.cli import main as data_main

    monkeypatch.chdir(tmp_path)
    assert data_main(["synth", "--dense", "--out", "runs/dense", "--images", "1", "--val-images", "2"]) == 0
    model = str(quickstart_run / "export")
    argv = [
        "--model",
        model,
        "--tiles",
        "3x2",
        "--data",
        "runs/dense",
        "--data-limit",
        "2",
        "--json",
        "t.json",
    ]
    assert bench_main(argv) == 0
    out = capsys.readouterr().out
    assert "| tiles       | 7 " in out and "(limit 7x: crops + 1)" in out, out
    report = json.loads(Path("t.json").read_text())
    assert report["whole"]["frames"] == report["tiled"]["frames"] == 2
    assert report["whole"]["timed"] == report["tiled"]["timed"] == 2 * 3  # 3 rounds of each image
    assert list(report) == ["tiles", "whole", "tiled", "backend", "lines", "hardware", "profile"]
    assert report["lines"][0].startswith("measured on")
    assert re.fullmatch(r"json: \S*t\.json", out.splitlines()[-1]), out
    assert re.search(r"cost \d+\.\d\dx one whole frame", out), out
    assert bench_main(["--model", model, "--tiles", "3x2"]) == 2  # no --data: one line, no traceback
    assert "--tiles needs --data" in capsys.readouterr().err


# -- the pipeline -----------------------------------------------------------------------------------
class _Collect:
    def __init__(self):
        self.results = []

    def write(self, result):
        self.results.append(result)

    def close(self):
        pass


def _serve(detector, video: Path, **stream) -> list[dict]:
    from dfine_deploy.serve.pipeline import StreamPipeline
    from dfine_deploy.serve.settings import ServeSettings

    pipeline = StreamPipeline(detector, ServeSettings())
    sink = _Collect()
    pipeline.add_sink(sink)
    pipeline.start()
    try:
        spec = StreamSpec(url=str(video), name="cam", realtime=False, every_frame=True, **stream)
        pipeline.add_stream(spec, trusted=True)
        wait_for(pipeline.all_finished, 30, "the video served to its end")
        info = pipeline.get("cam").info()
    finally:
        pipeline.close()
    return sink.results, info


def test_tiled_stream_publishes_one_box_per_object(tmp_path):
    """A red square wider than the overlap straddles the seam of a 2x1 grid: cut in both crops,
    whole in the whole frame; every published result holds it once, with its whole box."""
    path = tmp_path / "seam.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (320, 240))
    for i in range(8):
        image = np.full((240, 320, 3), 60, np.uint8)
        cv2.rectangle(image, (130, 40 + 4 * i), (199, 79 + 4 * i), (0, 0, 255), -1)
        writer.write(image)
    writer.release()
    for full in (True, False):
        detector = RedSquareDetector()
        results, info = _serve(detector, path, tiles={"grid": [2, 1], "overlap": 0.2, "full_frame": full})
        assert len(results) == 8 and info["tiles"]["full_frame"] is full
        for result in results:
            (only,) = result["detections"]
            x1, y1, x2, y2 = only["box"]
            assert abs(x1 - 130) <= 2 and abs(x2 - 200) <= 2, only
        assert sum(detector.batch_sizes) == 8 * (3 if full else 2)


def _idle_video(tmp_path: Path):
    from dfine_deploy.data.moving import DemoVideo, idle_objects

    video = DemoVideo(width=480, height=360, fps=10, frames=100, objects=idle_objects(100))
    return video, video.write(tmp_path / "idle.mp4")


class _Counting(DemoColourDetector):
    def __init__(self):
        self.images = 0

    def predict(self, frames, *, color: str = "BGR"):
        self.images += len(frames)
        return super().predict(frames, color=color)


def test_motion_gate_counts_the_crossings_with_a_fraction_of_the_inference(tmp_path):
    """Objects in view 20 % of the time: the gated stream counts what the always-on stream counts
    (the scene's true crossings) while its detector sees at most 35 % of the images."""
    video, path = _idle_video(tmp_path)
    counts, images = {}, {}
    for mode, detect in (("always", None), ("gated", {"motion": True})):
        detector = _Counting()
        results, info = _serve(detector, path, track=True, lines=[video.line], detect=detect)
        assert len(results) == 100
        counts[mode], images[mode] = results[-1]["counts"]["lines"]["middle"], detector.images
        if detect:
            assert info["frames_without_inference"] >= 60
    expected = video.expected_crossings(video.line)
    assert counts["always"] == expected and sum(expected["in"].values()) + sum(expected["out"].values()) == 3
    assert counts["gated"] == counts["always"]
    assert images["gated"] <= 0.35 * images["always"], images


def test_motion_gate_runs_no_inference_on_a_still_scene(tmp_path):
    """Nothing moves: the first frame is detected (what stands still is known) and no other."""
    from dfine_deploy.data.moving import DemoVideo, MovingObject, Route

    still = (MovingObject("ring", Route((0.5, 0.5), (0.5, 0.5)), 0.2, 0, 39),)
    path = DemoVideo(width=320, height=240, fps=10, frames=40, objects=still).write(tmp_path / "still.mp4")
    detector = _Counting()
    results, info = _serve(detector, path, track=True, detect={"motion": True})
    assert detector.images == 1 and info["frames_without_inference"] == 39
    ids = {d["track_id"] for r in results[2:] for d in r["detections"]}
    assert len(ids) == 1 and None not in ids  # the ring keeps one track through the frames not detected


def test_served_stream_at_a_capped_detection_rate_publishes_predicted_tracks_between_detections(tmp_path):
    """A stream with `detect: {motion: true, fps: 5}` on fast movers at 10 fps: every other frame is
    published as `detected: false` with each object at its track's predicted box (not the box of the
    frame before), the objects keep their ids and every crossing is counted once."""
    from dfine_deploy.data.moving import DemoVideo, fast_movers

    video = DemoVideo(frames=60, objects=fast_movers(60))
    path = video.write(tmp_path / "fast.mp4")
    detector = _Counting()
    results, info = _serve(detector, path, track=True, lines=[video.line], detect={"motion": True, "fps": 5})
    assert len(results) == 60 and detector.images <= 32
    predicted = [r for r in results if not r["detected"]]
    assert len(predicted) >= 28 and info["frames_without_inference"] >= len(predicted)  # + still frames
    previous = {r["frame_index"]: r for r in results}
    moved = 0
    for result in predicted[1:]:  # (tracks get their ids at their second detection)
        assert result["detections"] and all(d["track_id"] is not None for d in result["detections"])
        before = {d["track_id"]: d["box"] for d in previous[result["frame_index"] - 1]["detections"]}
        moved += sum(d["box"] != before.get(d["track_id"]) for d in result["detections"])
    assert moved >= 0.9 * sum(len(r["detections"]) for r in predicted[1:])
    assert len({d["track_id"] for r in results[1:] for d in r["detections"]}) == 3
    assert results[-1]["counts"]["lines"]["middle"] == video.expected_crossings(video.line)


def test_motion_regions_fps_cap_and_reset():
    """The regions fit the model's aspect around what moved and keep what did not; `fps` spaces the
    detections in time; a reset (a reconnect) detects the next frame whole."""
    from dfine_deploy.serve.regions import DetectSpec, StreamRegions

    regions = StreamRegions(None, DetectSpec(motion=True, fps=5), input_size=(256, 256))

    def frame(x: int) -> np.ndarray:
        image = np.full((720, 1280, 3), 90, np.uint8)
        cv2.rectangle(image, (x, 300), (x + 60, 360), (230, 230, 230), -1)
        return image

    parked = _det([[1000, 600, 1040, 640]])
    first = regions.plan(frame(100), 0.0)
    assert first.windows == [(0, 0, 1280, 720)]
    regions.detected(
        first,
        merge([((0, 0, 1280, 720), _det([[100, 300, 160, 360], [1000, 600, 1040, 640]]))], 1280, 720),
        0.0,
    )
    moved = regions.plan(frame(130), 0.25)
    ((x1, y1, x2, y2),) = moved.windows
    assert x2 - x1 == y2 - y1 >= 256 and x1 <= 100 and x2 >= 190 and y1 <= 300 and y2 >= 360
    assert moved.kept.boxes.tolist() == parked.boxes.tolist()  # the parked object is kept, not detected
    regions.detected(moved, moved.combine([_det([[0, 50, 60, 110]])]), 0.25)
    too_soon = regions.plan(frame(160), 0.3)  # 5 detections a second at most: 0.2 s apart
    # not detected, and the earlier boxes are not repeated as if seen: the tracks predict this frame
    assert too_soon.windows == [] and too_soon.predicted and len(too_soon.combine([])) == 0
    regions.detected(too_soon, too_soon.combine([]), 0.3)
    due = regions.plan(frame(190), 0.5)
    ((x1, _, x2, _),) = due.windows  # what moved since the last detection, in the skipped frame too
    assert x1 <= 130 and x2 >= 250 and not due.predicted
    assert due.kept.boxes.tolist() == parked.boxes.tolist()  # the parked object was kept throughout
    regions.reset()
    assert regions.plan(frame(190), 0.6).windows == [(0, 0, 1280, 720)]


# -- tiles and the motion gate on one stream --------------------------------------------------------
def _small_objects_video(tmp_path: Path):
    """1080p: a 12 x 9 pixel ring parked in the top-left tile for the whole video, and a rectangle
    of that size crossing the middle line slowly (6 pixels a frame, so its track follows it)."""
    from dfine_deploy.data.moving import DemoVideo, MovingObject, Route

    objects = (
        MovingObject("ring", Route((0.15, 0.2), (0.15, 0.2)), 0.008, 0, 39),
        MovingObject("rectangle", Route((0.44, 0.75), (0.56, 0.75)), 0.008, 0, 39),
    )
    video = DemoVideo(width=1920, height=1080, fps=10, frames=40, objects=objects)
    return video, video.write(tmp_path / "small.mp4")


def test_tiles_and_motion_gate_find_small_moving_objects_where_they_move(tmp_path):
    """A 1080p camera with both tiles and the motion gate: the small moving object is found in every
    frame and its crossing counted, as with tiles on every frame, while the tiles where nothing
    moves run no inference; the parked object keeps its one track; no object is published twice."""
    video, path = _small_objects_video(tmp_path)
    tiles = {"grid": [3, 2], "overlap": 0.2, "full_frame": True}
    runs = {}
    for mode, detect in (("tiles", None), ("both", {"motion": True})):
        detector = LowResColourDetector()
        results, info = _serve(detector, path, track=True, lines=[video.line], tiles=tiles, detect=detect)
        assert len(results) == 40
        runs[mode] = results, info, detector.images
    whole = LowResColourDetector()
    seen_whole = sum(len(whole.predict([video.render(i)])[0].boxes) for i in range(40))
    assert seen_whole < 0.5 * 2 * 40  # the whole frame misses most of the two objects
    results, info, images = runs["both"]
    expected = video.expected_crossings(video.line)
    assert sum(expected["in"].values()) == 1
    assert results[-1]["counts"]["lines"]["middle"] == runs["tiles"][0][-1]["counts"]["lines"]["middle"]
    assert results[-1]["counts"]["lines"]["middle"] == expected
    for result in results:
        names = sorted(d["name"] for d in result["detections"])
        assert names == ["rectangle", "ring"], (result["frame_id"], result["detections"])
    parked = {d["track_id"] for r in results[1:] for d in r["detections"] if d["name"] == "ring"}
    assert len(parked) == 1 and None not in parked
    # the first frame as 7 images (6 tiles + the whole frame), then one window a frame around the mover
    assert images == 7 + 39 and runs["tiles"][2] == 7 * 40, (images, runs["tiles"][2])
    assert info["tiles"]["grid"] == [3, 2] and info["detect"]["motion"] is True


def test_a_large_moving_region_is_seen_through_the_tiles_it_touches():
    """A moving region larger than a tile: the grid's tiles that it touches (plus the whole frame)
    are detected, the other tiles are not; an object on the seam of two of those tiles is one box;
    a small moving region is one window of a tile's size in the model's aspect."""
    from dfine_deploy.data.moving import CLASS_COLOURS
    from dfine_deploy.serve.regions import DetectSpec, StreamRegions

    spec = TileSpec((3, 2), 0.2, True)
    grid = tile_windows(1920, 1080, TileSpec((3, 2), 0.2, False))
    regions = StreamRegions(spec, DetectSpec(motion=True), input_size=(256, 256))
    colour = CLASS_COLOURS["rectangle"]

    def frame(x: int, width: int, height: int) -> np.ndarray:
        image = np.full((1080, 1920, 3), 90, np.uint8)
        cv2.rectangle(image, (x, 100), (x + width - 1, 100 + height - 1), colour, -1)
        cv2.circle(image, (1700, 900), 6, CLASS_COLOURS["ellipse"], -1)  # parked, small, far away
        return image

    first = regions.plan(frame(410, 590, 150), 0.0)
    assert first.windows == tile_windows(1920, 1080, spec)
    detector = LowResColourDetector()
    regions.detected(first, first.combine(detector.predict(first.images(frame(410, 590, 150)))), 0.0)
    moved = regions.plan(frame(430, 590, 150), 0.1)  # across the seams at x 591 and 738
    assert set(moved.windows) == {grid[0], grid[1], (0, 0, 1920, 1080)}  # the top row's left two tiles
    found = moved.combine(detector.predict(moved.images(frame(430, 590, 150))))
    assert sorted(found.names) == ["ellipse", "rectangle"]  # the parked one kept, though the frame ran
    found = found.keep(np.array(found.names) == "rectangle")
    x1, y1, x2, y2 = found.boxes[0].tolist()
    assert abs(x1 - 430) <= 8 and abs(x2 - 1020) <= 8 and abs(y1 - 100) <= 8 and abs(y2 - 250) <= 8

    regions = StreamRegions(spec, DetectSpec(motion=True), input_size=(256, 256))
    regions.detected(regions.plan(frame(1500, 20, 20), 0.0), Detections(*EMPTY_PARTS), 0.0)
    ((x1, y1, x2, y2),) = regions.plan(frame(1510, 20, 20), 0.1).windows
    assert x2 - x1 == y2 - y1 == grid[0][2] - grid[0][0] and x1 <= 1500 and x2 >= 1530


EMPTY_PARTS = (np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), [])
