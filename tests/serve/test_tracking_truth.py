"""The served tracker against ground truth: one track per object when the model also sees it as another
class, and one class per track for counts (a vote over its life)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dfine_deploy.serve.settings import StreamSpec
from dfine_deploy.serve.tracking import StreamTracker

LINE = {"name": "middle", "start": [160, 0], "end": [160, 240]}


@dataclass
class _Dets:
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    names: list[str]


def _object_seen_twice(x: float, flip: bool) -> _Dets:
    """One 40 px object at x, reported as a rectangle (0.9) and, 2 px off, a triangle (0.6); with
    `flip` the triangle scores higher."""
    boxes = np.array([[x, 10, x + 40, 50], [x + 2, 11, x + 41, 50]], np.float32)
    scores = np.array([0.6, 0.9] if flip else [0.9, 0.6], np.float32)
    return _Dets(boxes, scores, np.array([0, 1], np.int64), ["rectangle", "triangle"])


def test_an_object_seen_as_two_classes_is_one_track_counted_once_as_its_voted_class():
    tracker = StreamTracker(StreamSpec(url="rtsp://cam/x", track=True, lines=[LINE]))
    ids = set()
    for i in range(30):  # crosses x=160 once, to the right; every fifth frame the triangle wins
        found = tracker.update(_object_seen_twice(80 + 5 * i, flip=i % 5 == 0), i / 10)
        ids |= {int(t) for t in found if t >= 0}
        assert (found >= 0).sum() <= 1  # never two tracks on the one object
    assert len(ids) == 1
    assert tracker.counts()["lines"]["middle"] == {"in": {"rectangle": 1}, "out": {}}
