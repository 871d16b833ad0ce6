"""The served tracker against ground truth: one track per object when the model also sees it as another
class, one class per track for counts (a vote over its life), and a crossing counted for as long as
the object keeps its track."""

from __future__ import annotations

import numpy as np
import pytest

from dfine_deploy.runtime.detections import Detections
from dfine_deploy.serve.settings import StreamSpec
from dfine_deploy.serve.tracking import StreamTracker

LINE = {"name": "middle", "start": [160, 0], "end": [160, 240]}


def _object_seen_twice(x: float, flip: bool) -> Detections:
    """One 40 px object at x, reported as a rectangle (0.9) and, 2 px off, a triangle (0.6); with
    `flip` the triangle scores higher."""
    boxes = np.array([[x, 10, x + 40, 50], [x + 2, 11, x + 41, 50]], np.float32)
    scores = np.array([0.6, 0.9] if flip else [0.9, 0.6], np.float32)
    return Detections.build(boxes, scores, np.array([0, 1]), ["rectangle", "triangle"])


def test_an_object_seen_as_two_classes_is_one_track_counted_once_as_its_voted_class():
    tracker = StreamTracker(StreamSpec(url="rtsp://cam/x", track=True, lines=[LINE]))
    ids = set()
    for i in range(30):  # crosses x=160 once, to the right; every fifth frame the triangle wins
        found = tracker.update(_object_seen_twice(80 + 5 * i, flip=i % 5 == 0), i / 10)
        ids |= {int(t) for t in found if t >= 0}
        assert (found >= 0).sum() <= 1  # never two tracks on the one object
    assert len(ids) == 1
    assert tracker.counts()["lines"]["middle"] == {"in": {"rectangle": 1}, "out": {}}


def _box_at(x: float) -> Detections:
    return Detections.build(np.array([[x, 100, x + 60, 140]]), np.array([0.9]), np.array([0]), ["rectangle"])


def test_frames_not_detected_publish_the_predicted_box_and_the_object_keeps_its_track():
    """The motion gate at 5 detections a second on a 10 fps stream: a 60 px object moving 20 px a
    frame is detected every other frame, 40 px further on each time. Between detections the track's
    box is where its motion model puts it (ahead of the last detection, never that box repeated);
    the object keeps one track and its crossing is counted once."""
    from dfine_deploy.serve.regions import DetectSpec

    spec = StreamSpec(url="rtsp://cam/x", track=True, lines=[LINE], detect=DetectSpec(True, 5.0))
    tracker = StreamTracker(spec)
    assert tracker.lost_track_s == 1.0  # 1 s is 5 detections at 5 a second
    ids, ahead = set(), []
    for i in range(16):  # x from 20 to 320: crosses x=160 to the right
        x = 20.0 + 20 * i
        if i % 2 == 0:
            found = tracker.update(_box_at(x), i / 10)
            ids |= {int(t) for t in found if t >= 0}
        else:
            predicted, found = tracker.predict(i / 10)
            assert len(predicted) == len(found) <= 1 and tracker.occurrences == []
            if len(found):
                ids.add(int(found[0]))
                ahead.append(float(predicted.boxes[0, 0]) - (x - 20))  # past the last detected box
    assert len(ids) == 1
    assert len(ahead) >= 6 and all(gain > 5 for gain in ahead[2:]), ahead  # moving once its speed is known
    assert tracker.counts()["lines"]["middle"] == {"in": {"rectangle": 1}, "out": {}}


def test_a_capped_detection_rate_keeps_tracks_for_several_detections():
    from dfine_deploy.serve.regions import DetectSpec

    for fps, seconds in ((5.0, 1.0), (1.0, 3.0), (0.0, 1.0)):
        spec = StreamSpec(url="rtsp://cam/x", track=True, detect=DetectSpec(True, fps))
        assert StreamTracker(spec).lost_track_s == seconds


def test_predicted_boxes_are_cut_to_the_frame_and_left_out_once_wholly_outside():
    from dfine_deploy.serve.regions import DetectSpec

    spec = StreamSpec(url="rtsp://cam/x", track=True, detect=DetectSpec(True, 5.0))
    tracker = StreamTracker(spec)
    for i in range(4):  # leaving at the right edge of a 300 px frame, 20 px a frame
        tracker.update(_box_at(180.0 + 20 * i), i / 10)
    near, _ = tracker.predict(0.4, (300, 240))
    assert len(near) == 1 and near.boxes[0, 2] == 300 and near.boxes[0, 0] < 300
    gone, ids = tracker.predict(3.0, (300, 240))  # 2.7 s on: far past the edge
    assert len(gone) == len(ids) == 0


def test_an_object_missed_while_on_the_line_still_counts_its_crossing():
    """A 60 px object crossing x=160 at 10 px a frame is not detected in the 4 frames it straddles the
    line (0.4 s, well within its track's 1 s): it keeps its track and its crossing counts once. The
    line used to forget its side after two frames without it (supervision's LineZone) and counted
    nothing."""
    tracker = StreamTracker(StreamSpec(url="rtsp://cam/x", track=True, lines=[LINE]))
    ids = set()
    for i in range(20):  # x from 40 to 230: wholly left up to x=100, wholly right from x=170
        x = 40.0 + 10 * i
        seen = not 130 <= x <= 160
        found = tracker.update(_box_at(x) if seen else Detections.empty(), i / 10)
        ids |= {int(t) for t in found if t >= 0}
    assert len(ids) == 1
    assert tracker.counts()["lines"]["middle"] == {"in": {"rectangle": 1}, "out": {}}


@pytest.mark.parametrize("edge", ["top", "bottom"])
def test_a_line_from_edge_to_edge_counts_boxes_the_frame_edge_cuts(edge):
    """A line drawn from the top of a 240 px high picture to its bottom: an object partly above (or
    below) the picture has a box cut at y=0 (or 240), on the line's end; it is counted (the line's
    ends are inclusive), and one wholly beyond an end of a shorter line is not."""
    y1, y2 = (0.0, 30.0) if edge == "top" else (210.0, 240.0)
    short = {"name": "short", "start": [160, 60], "end": [160, 180]}
    tracker = StreamTracker(StreamSpec(url="rtsp://cam/x", track=True, lines=[LINE, short]))
    for i in range(20):
        x = 60.0 + 10 * i
        box = np.array([[x, y1, x + 60, y2]], np.float32)
        tracker.update(Detections.build(box, np.array([0.9]), np.array([0]), ["rectangle"]), i / 10)
    counts = tracker.counts()["lines"]
    assert counts["middle"] == {"in": {"rectangle": 1}, "out": {}}
    assert counts["short"] == {"in": {}, "out": {}}
