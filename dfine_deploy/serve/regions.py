"""Which parts of a stream's frame the detector sees: tiles (small objects), the motion gate
(detection only where something moves), or both.

    tiles:  {grid: [3, 2], overlap: 0.2, full_frame: true}   every frame: the crops of dfine_deploy/tiles.py
    detect: {motion: true, fps: 5}                            frames with motion: the moving regions

The motion gate compares each frame with the one before, on a small copy (MOTION_WIDTH pixels wide,
blurred; with tiles, MOTION_WIDTH per tile column), so it costs about a millisecond or less. Pixels
whose colour changed by more than MOTION_LEVEL form regions; each is padded (an object's edge moves
before its middle does), regions that touch are joined, and each is widened to the model's aspect and at
least the model's input size (so its objects are not enlarged past what the model saw in training). Only
those regions are detected; a detection of the previous result outside every region is kept as it was,
so a parked object keeps its track while nothing moves near it. A frame without motion runs no inference
at all: its result repeats the previous detections (the tracks stay alive; a still object crosses no
line). The first frame, and the first after a reconnect, is detected whole, so what stands still from
the start is known. `fps` caps the detections per second while there is motion (0: every frame with
motion). A frame with motion that the cap leaves undetected has no detections of its own
(`FramePlan.predicted`): a tracked stream publishes its tracks at the boxes their motion model
predicts (serve/tracking.py, `StreamTracker.predict`), an untracked one no box; the previous
detections are not repeated, since what moves is no longer where it was.

Both on one stream: motion decides where, tiles decide at what scale. A moving region is seen no
coarser than one tile: a region that fits in a tile is one window of a tile's size (widened to the
model's aspect) around it; a larger one is detected through the stream's tiles that it touches (plus
the whole frame with `full_frame`, where objects larger than a tile are whole). Tiles with no motion
run no inference. The first frame is detected as every tile. The windows' detections are merged
class by class at their edges (runtime/tile_merge.py), as the tiles of a whole frame are.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import cv2
import numpy as np

from dfine_deploy.runtime.detections import Detections
from dfine_deploy.runtime.tile_merge import merge
from dfine_deploy.tiles import TileSpec, Window, crops, small_in_whole, tile_windows

MOTION_WIDTH = 160  # the small copy's width in pixels
MOTION_LEVEL = 25  # levels (0-255) a pixel's B, G or R must change by, after blurring, to count as motion
MOTION_MIN_AREA = 0.0005  # regions smaller than this share of the frame are noise (codec, leaves)
PAD = 0.25  # each region grows by this share of its size on every side (at least 8 frame pixels)
FULL_FRAME_SHARE = 0.5  # when the regions cover more of the frame than this, the frame is detected whole
MAX_REGIONS = 3  # ... and when there are more regions than this
# `fps`: a detection is due this much before its interval is over (0.6 - 0.4 < 0.2 in floating point)
DUE_TOLERANCE_S = 0.001


@dataclass(frozen=True)
class DetectSpec:
    """The stream list's `detect: {motion: true, fps: 5}`."""

    motion: bool = False
    fps: float = 0.0  # detections per second at most while there is motion; 0: every frame with motion

    @classmethod
    def from_mapping(cls, data: Any) -> DetectSpec:
        """ValueError names the key and the fix."""
        if not isinstance(data, dict):
            raise ValueError(f"expected a mapping {{motion: true, fps: 5}}, got {data!r}")
        unknown = sorted(set(data) - {"motion", "fps"})
        if unknown:
            raise ValueError(f"unknown key '{unknown[0]}' (valid keys: fps, motion)")
        motion, fps = data.get("motion", False), data.get("fps", 0.0)
        if not isinstance(motion, bool):
            raise ValueError(f"motion {motion!r}: give true or false")
        if isinstance(fps, bool) or not isinstance(fps, (int, float)) or not 0 <= fps < float("inf"):
            raise ValueError(f"fps {fps!r}: give detections per second >= 0 (0: every frame with motion)")
        return cls(motion, float(fps))

    def to_dict(self) -> dict[str, Any]:
        return {"motion": self.motion, "fps": self.fps}


class MotionDetector:
    """Frame differencing on a small blurred copy `width` pixels wide; `regions(frame)` are boxes in
    frame pixels, from `min_area` of the frame up."""

    def __init__(self, width: int = MOTION_WIDTH, min_area: float = MOTION_MIN_AREA) -> None:
        self.width, self.min_area = width, min_area
        self._previous: np.ndarray | None = None

    def reset(self) -> None:
        self._previous = None

    def regions(self, image: np.ndarray) -> list[Window] | None:
        """The moving regions of `image` (BGR) against the previous frame; None for a first frame."""
        height, width = image.shape[:2]
        scale = self.width / width
        # linear, not area, shrinking: 6x cheaper, and the blur does the averaging that matters here
        small = cv2.resize(image, (self.width, max(1, round(height * scale))), interpolation=cv2.INTER_LINEAR)
        small = cv2.GaussianBlur(small, (5, 5), 0)
        previous, self._previous = self._previous, small
        if previous is None or previous.shape != small.shape:
            return None
        # the largest change of the three colour channels (a red object on a grey background of the same
        # brightness changes little in grey levels), with OpenCV's max: 30x faster than numpy's here
        blue, green, red = cv2.split(cv2.absdiff(small, previous))
        _, moved = cv2.threshold(cv2.max(cv2.max(blue, green), red), MOTION_LEVEL, 1, cv2.THRESH_BINARY)
        moved = cv2.dilate(moved, np.ones((3, 3), np.uint8))
        count, _, stats, _ = cv2.connectedComponentsWithStats(moved, connectivity=8)
        min_area = self.min_area * small.shape[0] * small.shape[1]
        return [
            (int(x / scale), int(y / scale), int(np.ceil((x + w) / scale)), int(np.ceil((y + h) / scale)))
            for x, y, w, h, area in stats[1:count]  # row 0 is the still background
            if area >= min_area
        ]


def _grow(box: Window, width: int, height: int) -> Window:
    x1, y1, x2, y2 = box
    px, py = max(8, PAD * (x2 - x1)), max(8, PAD * (y2 - y1))
    return (max(0, int(x1 - px)), max(0, int(y1 - py)), min(width, int(x2 + px)), min(height, int(y2 + py)))


def _touch(a: Window, b: Window) -> bool:
    return a[0] <= b[2] and b[0] <= a[2] and a[1] <= b[3] and b[1] <= a[3]


def _overlap(a: Window, b: Window) -> bool:
    """Whether `a` and `b` share pixels (touching edges share none)."""
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _inside(a: Window, b: Window) -> bool:
    return b[0] <= a[0] and b[1] <= a[1] and a[2] <= b[2] and a[3] <= b[3]


def _join(boxes: list[Window]) -> list[Window]:
    """Boxes that touch, joined into their union until none touch."""
    boxes = list(boxes)
    joined = True
    while joined:
        joined = False
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                if _touch(boxes[i], boxes[j]):
                    a, b = boxes[i], boxes.pop(j)
                    boxes[i] = (min(a[0], b[0]), min(a[1], b[1]), max(a[2], b[2]), max(a[3], b[3]))
                    joined = True
                    break
            if joined:
                break
    return boxes


def _to_aspect(box: Window, aspect: float, minimum: tuple[int, int], width: int, height: int) -> Window:
    """`box` widened (about its centre, kept inside the frame) to width/height = `aspect` and at
    least `minimum` (w, h)."""
    x1, y1, x2, y2 = box
    w, h = max(x2 - x1, minimum[0]), max(y2 - y1, minimum[1])
    w, h = max(w, h * aspect), max(h, w / aspect)
    w, h = min(width, round(w)), min(height, round(h))
    cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
    left = int(min(max(0, round(cx - w / 2)), width - w))
    top = int(min(max(0, round(cy - h / 2)), height - h))
    return (left, top, left + w, top + h)


def _outside(det: Detections, regions: list[Window]) -> Detections:
    """The detections whose box meets none of `regions`."""
    keep = [i for i, box in enumerate(det.boxes.tolist()) if not any(_touch(tuple(box), r) for r in regions)]
    return Detections(det.boxes[keep], det.scores[keep], det.labels[keep], [det.names[i] for i in keep])


EMPTY = Detections.empty()


@dataclass
class FramePlan:
    """What to detect in one frame: `windows` (frame pixels; none: no inference) and the earlier
    detections kept outside them."""

    windows: list[Window]
    kept: Detections = field(default_factory=lambda: EMPTY)
    width: int = 0
    height: int = 0
    motion: bool = False  # chosen by the motion gate (the kept detections count)
    # something moved but `fps` left the frame undetected: no detections; the tracks predict
    predicted: bool = False
    small: tuple[float, float] = (0.0, 0.0)  # tiles: whole-frame boxes smaller than this are the crops'

    def images(self, image: np.ndarray) -> list[np.ndarray]:
        """The detector inputs: the whole frame as it is, or contiguous crops."""
        if self.windows == [(0, 0, self.width, self.height)]:
            return [image]
        return crops(image, self.windows)

    def combine(self, results: list[Any]) -> Any:
        """The frame's detections in frame pixels from the windows' results (in window pixels)."""
        if self.predicted:
            return EMPTY
        if not self.windows:
            return self.kept
        if self.windows == [(0, 0, self.width, self.height)]:
            return results[0]
        found = merge(list(zip(self.windows, results)), self.width, self.height, self.small)
        # the kept boxes meet no crop (`_outside`); only the whole frame, when it is a window, can find
        # them again (the large ones: `small`), and then its box replaces the kept one
        kept = _outside(self.kept, [tuple(box) for box in found.boxes.tolist()])
        if not len(kept):
            return found
        scores = np.concatenate([found.scores, kept.scores])
        order = np.argsort(-scores, kind="stable")
        names = found.names + kept.names
        return Detections(
            np.concatenate([found.boxes, kept.boxes])[order],
            scores[order],
            np.concatenate([found.labels, kept.labels])[order],
            [names[i] for i in order],
        )


class StreamRegions:
    """One stream's choice of what the detector sees in each frame (tiles, the motion gate, both,
    or neither: the whole frame). Only the pipeline's inference thread calls `plan` and `detected`;
    `reset` (a reconnect) may come from a reader thread and only sets a flag."""

    def __init__(
        self, tiles: TileSpec | None, detect: DetectSpec | None, input_size: tuple[int, int] | None = None
    ):
        self.tiles = tiles
        self.gate: MotionDetector | None = None
        if detect is not None and detect.motion:
            # with tiles, motion is looked for at the tiles' scale too: a copy as wide per tile column,
            # noise measured against one tile (what moves is as small as what tiles are for)
            cols, rows = tiles.grid if tiles is not None else (1, 1)
            self.gate = MotionDetector(MOTION_WIDTH * cols, MOTION_MIN_AREA / (cols * rows))
        self.detect_every_s = 1.0 / detect.fps if detect is not None and detect.fps else 0.0
        self.input_size = input_size or (640, 640)  # (height, width) of the model's input
        self._last: Detections = EMPTY
        self._last_detected_at: float | None = None
        # what moved in the frames the rate cap left undetected: the next detection sees it too, so
        # an object that left its last detected box is not kept there as if parked
        self._moved_unseen: list[Window] = []
        self._reset = False
        self.frames_skipped = 0  # frames answered without inference

    def reset(self) -> None:
        self._reset = True

    def plan(self, image: np.ndarray, timestamp: float) -> FramePlan:
        height, width = image.shape[:2]
        if self._reset:
            self._reset, self._last, self._last_detected_at = False, EMPTY, None
            self._moved_unseen = []
            if self.gate is not None:
                self.gate.reset()
        if self.gate is None:
            return self._everything(width, height)
        moving = self.gate.regions(image)
        if moving is None:  # first frame: everything, once
            return self._everything(width, height)
        due = (
            self._last_detected_at is None
            or timestamp - self._last_detected_at >= self.detect_every_s - DUE_TOLERANCE_S
        )
        if not moving and not self._moved_unseen:  # what was seen is still there
            return FramePlan([], self._last, width, height, motion=True)
        if not due:
            self._moved_unseen += moving
            return FramePlan([], EMPTY, width, height, motion=True, predicted=True)
        moving, self._moved_unseen = moving + self._moved_unseen, []
        in_h, in_w = self.input_size
        grown = _join([_grow(box, width, height) for box in moving])
        if self.tiles is not None:
            return self._tiled(grown, width, height)
        # at least the model's input, and at least half the frame: the model sees a region's objects at
        # most twice as large as in the whole frame (a model trained at one scale misreads them larger)
        least = (max(in_w, width // 2), max(in_h, height // 2))
        shaped = _join([_to_aspect(b, in_w / in_h, least, width, height) for b in grown])
        area = sum((x2 - x1) * (y2 - y1) for x1, y1, x2, y2 in shaped)
        if len(shaped) > MAX_REGIONS or area > FULL_FRAME_SHARE * width * height:
            return self._everything(width, height, motion=True)
        return FramePlan(shaped, _outside(self._last, shaped), width, height, motion=True)

    def _everything(self, width: int, height: int, motion: bool = False) -> FramePlan:
        """The whole frame: as it is, or as every tile."""
        if self.tiles is None:
            return FramePlan([(0, 0, width, height)], width=width, height=height, motion=motion)
        small = small_in_whole(width, height, self.tiles)
        windows = tile_windows(width, height, self.tiles)
        return FramePlan(windows, width=width, height=height, motion=motion, small=small)

    def _tiled(self, grown: list[Window], width: int, height: int) -> FramePlan:
        """Tiles and the motion gate: the windows that see the moving regions `grown` at the tiles'
        scale (the module docstring gives the rule)."""
        assert self.tiles is not None
        in_h, in_w = self.input_size
        grid = tile_windows(width, height, TileSpec(self.tiles.grid, self.tiles.overlap, full_frame=False))
        tile = (grid[0][2] - grid[0][0], grid[0][3] - grid[0][1])
        x1, y1, x2, y2 = _to_aspect((0, 0, *tile), in_w / in_h, tile, width, height)
        most = (x2 - x1, y2 - y1)  # one window at the tiles' scale, in the model's aspect

        def fits(box: Window) -> bool:
            return box[2] - box[0] <= most[0] and box[3] - box[1] <= most[1]

        shaped = _join([_to_aspect(b, in_w / in_h, tile, width, height) for b in grown if fits(b)])
        windows = [w for w in shaped if fits(w)]
        # a region too large for one window, or whose window was joined with others into a larger one
        large = [b for b in grown if not any(_inside(b, w) for w in windows)]
        if large:
            windows += [t for t in grid if any(_overlap(t, b) for b in large)]
            if self.tiles.full_frame:
                windows.append((0, 0, width, height))
        if len(windows) >= self.tiles.images:
            return self._everything(width, height, motion=True)
        whole = (0, 0, width, height)
        small = small_in_whole(width, height, self.tiles) if whole in windows else (0.0, 0.0)
        kept = _outside(self._last, [w for w in windows if w != whole])  # small ones: the crops' alone
        return FramePlan(windows, kept, width, height, motion=True, small=small)

    def detected(self, plan: FramePlan, result: Any, timestamp: float) -> None:
        """Remember a detected frame's result (the next frames keep its detections outside their
        regions); count the frames answered without inference."""
        if not plan.windows:
            self.frames_skipped += 1
            return
        self._last_detected_at = timestamp
        if self.gate is not None:
            labels = np.asarray(result.labels, np.int64).reshape(-1)
            self._last = Detections(
                np.asarray(result.boxes, np.float32).reshape(-1, 4),
                np.asarray(result.scores, np.float32).reshape(-1),
                labels,
                list(result.names),
            )
