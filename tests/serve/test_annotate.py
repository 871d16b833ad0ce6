"""The annotated frame (MJPEG view and recordings): counts per class beside each line and zone, and an
arrow to each line's "in" side."""

from __future__ import annotations

import numpy as np

from dfine_deploy.serve.annotate import LINE_COLOUR, ZONE_COLOUR, draw, line_rows, zone_rows
from dfine_deploy.serve.settings import CountingLine, CountingZone

LINE = CountingLine("gate", (160.0, 20.0), (160.0, 220.0))  # downwards: "in" is to the right
ZONE = CountingZone("dock", [(20.0, 150.0), (120.0, 150.0), (120.0, 230.0), (20.0, 230.0)])
COUNTS = {
    "lines": {"gate": {"in": {"red-square": 2}, "out": {"blue-square": 1}}},
    "zones": {"dock": {"blue-square": 1, "red-square": 3}},
}


def test_captions_give_counts_per_class_never_a_sum():
    assert line_rows("gate", COUNTS["lines"]["gate"]) == [
        "gate",
        "blue-square in 0 out 1",
        "red-square in 2 out 0",
    ]
    assert line_rows("gate", {"in": {}, "out": {}}) == ["gate: none crossed"]
    assert zone_rows("dock", COUNTS["zones"]["dock"]) == ["dock", "blue-square 1", "red-square 3"]
    assert zone_rows("dock", {}) == ["dock: empty"]


def _is(pixels: np.ndarray, colour: tuple[int, int, int]) -> np.ndarray:
    return np.all(np.abs(pixels.astype(int) - colour) < 40, axis=-1)


def test_the_frame_shows_each_caption_and_the_in_arrow():
    frame = np.full((240, 320, 3), 60, np.uint8)
    plain = draw(frame, [], [LINE], [ZONE])
    counted = draw(frame, [], [LINE], [ZONE], COUNTS)
    below_start = np.s_[22:60, 162:260]  # the line's caption: three rows beside its start
    assert _is(counted[below_start], LINE_COLOUR).mean() > 0.5
    assert _is(counted[below_start], LINE_COLOUR).sum() > _is(plain[below_start], LINE_COLOUR).sum() * 2
    inside_zone = np.s_[152:190, 22:110]  # the zone's caption: three rows in its top-left corner
    assert _is(counted[inside_zone], ZONE_COLOUR).mean() > 0.5
    right, left = np.s_[115:125, 165:175], np.s_[115:125, 145:155]  # either side of the line's middle
    assert _is(counted[right], LINE_COLOUR).any() and not _is(counted[left], LINE_COLOUR).any()
    assert np.array_equal(frame, np.full((240, 320, 3), 60, np.uint8))  # the source frame is left as it was
