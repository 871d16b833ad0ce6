"""The annotated frame (MJPEG view and recordings): counts per class beside each line and zone, and an
arrow to each line's "in" side."""

from __future__ import annotations

import numpy as np

from dfine_deploy.serve.annotate import LEGEND_ALPHA, LINE_COLOUR, ZONE_COLOUR, draw, line_rows, zone_rows
from dfine_deploy.serve.settings import CountingLine, CountingZone

LINE = CountingLine("gate", (160.0, 20.0), (160.0, 220.0))  # downwards: "in" is to the right
ZONE = CountingZone("dock", [(20.0, 150.0), (120.0, 150.0), (120.0, 230.0), (20.0, 230.0)])
COUNTS = {
    "lines": {"gate": {"in": {"red-square": 2}, "out": {"blue-square": 1}}},
    "zones": {"dock": {"blue-square": 1, "red-square": 3}},
}


def test_legend_rows_give_counts_per_class_never_a_sum():
    assert line_rows("gate", COUNTS["lines"]["gate"]) == "gate in/out: blue-square 0/1, red-square 2/0"
    assert line_rows("gate", {"in": {}, "out": {}}) == "gate: none crossed"
    assert zone_rows("dock", COUNTS["zones"]["dock"]) == "dock: blue-square 1, red-square 3"
    assert zone_rows("dock", {}) == "dock: empty"


def _is(pixels: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    return np.all(np.abs(pixels.astype(int) - colour) < 40, axis=-1)


BOX = {"box": [4, 12, 150, 110], "label": 0, "name": "red-square", "score": 0.91, "track_id": 7}


def test_the_counts_are_one_legend_in_a_corner_free_of_boxes_and_each_line_shows_its_arrow():
    frame = np.full((240, 320, 3), 60, np.uint8)
    plain = draw(frame, [BOX], [LINE], [ZONE])
    counted = draw(frame, [BOX], [LINE], [ZONE], COUNTS)
    ground = np.all(counted == int(60 * (1 - LEGEND_ALPHA)), axis=-1)  # the legend's darkened picture
    ys, xs = np.nonzero(ground)
    # the legend: one compact block in a corner of the frame, off the box and its caption
    assert {ys.min(), ys.max()} & {0, 239} and {xs.min(), xs.max()} & {0, 319}
    assert (ys.max() - ys.min()) * (xs.max() - xs.min()) < 0.25 * 240 * 320
    changed = np.zeros_like(ground)
    changed[ys.min() : ys.max() + 1, xs.min() : xs.max() + 1] = True
    assert not changed[:112, :152].any()
    assert np.array_equal(counted[:112, :152], plain[:112, :152])
    assert _is(counted[changed], LINE_COLOUR).any() and _is(counted[changed], ZONE_COLOUR).any()
    tag = np.s_[22:32, 162:185]  # each line and zone is tagged with its name where it is drawn
    assert _is(plain[tag], LINE_COLOUR).mean() > 0.3
    right, left = np.s_[115:125, 165:175], np.s_[115:125, 145:155]  # either side of the line's middle
    assert _is(counted[right], LINE_COLOUR).any() and not _is(counted[left], LINE_COLOUR).any()
    assert np.array_equal(frame, np.full((240, 320, 3), 60, np.uint8))  # the source frame is left as it was


def test_boxes_are_drawn_over_the_legend_when_every_corner_holds_one():
    frame = np.full((240, 320, 3), 60, np.uint8)
    corners = [[0, 0, 200, 120], [120, 0, 320, 120], [0, 120, 200, 240], [120, 120, 320, 240]]
    boxes = [dict(BOX, box=box, track_id=None) for box in corners]
    counted = draw(frame, boxes, [LINE], [ZONE], COUNTS)
    plain = draw(frame, boxes, [LINE], [ZONE])
    assert np.any(counted != plain)  # the legend is there
    painted = np.any(draw(frame, boxes) != frame, axis=-1)  # the boxes' outlines and captions
    assert np.array_equal(counted[painted], plain[painted])
