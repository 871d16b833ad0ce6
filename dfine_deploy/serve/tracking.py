"""Tracking and counting for one stream: ByteTrack from Roboflow's `trackers`, zones from `supervision`.

Why these libraries (docs/serve.md says more): `trackers` is maintained, Apache-2.0, needs no torch (numpy,
scipy, OpenCV) and tracks 50 objects in well under 2 ms per frame (benchmarks/serve_overhead.py);
BoxMOT requires torch, and supervision moved its ByteTrack to `trackers`. supervision, which `trackers`
depends on anyway, provides the zone counters. Lines are counted here (`LineCounter`): supervision's
`LineZone` forgets which side a track was on after two frames without it, so an object the detector
missed for two frames while on the line crossed it uncounted, though its track kept its id.

Track ids are per stream, start at 0 and never repeat within a stream: after a reconnect the tracker
starts afresh (an object seen before the gap gets a new id) and the ids continue after the last one.

Frames the motion gate does not detect while something moves (its rate cap, `detect: {fps: N}`,
dfine_deploy/serve/regions.py) go to `predict`, not `update`: every track's motion model advances to the
frame's time and the tracks followed at the last detection are published at their predicted boxes. The
last detections are never repeated as if seen again: the motion model would read an object that stood
still and then jumped, and lose it at the next detection.

Each update also lists what happened to single objects (`Occurrence`: a line crossed, a zone entered or
left), which become events (dfine_deploy/serve/events.py). Zone entries and exits need track ids: an
object enters when a track is first inside, and leaves when it is seen outside, or when its track ends
inside (not seen for `lost_track_seconds`, or the tracker restarted after a reconnect).
"""

from __future__ import annotations

import copy
import threading
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import supervision as sv
from trackers import ByteTrackTracker
from trackers.utils.iou import BIoU, IoU

from dfine_deploy.boxes import box_iou
from dfine_deploy.runtime.detections import Detections
from dfine_deploy.serve.events import LINE_CROSS, ZONE_ENTER, ZONE_LEAVE, Occurrence
from dfine_deploy.serve.settings import CountingLine, StreamSpec

if TYPE_CHECKING:
    from dfine_deploy.serve.regions import DetectSpec
    from dfine_deploy.serve.results import DetectionsLike

# ByteTrack's settings for served streams. Detections already passed the server's score threshold,
# so one confident detection starts a track at once (the library hands out its id from the object's
# second frame on); less confident ones only extend existing tracks (ByteTrack's second stage).
CONFIDENT_SCORE = 0.5
LOST_TRACK_SECONDS = 1.0  # a track survives this long without a detection (occlusion, missed frames)
# the library's unit of time (its settings and motion model count 30 fps frames); given the frames'
# timestamps it converts seconds to these frames, whatever the stream's rate
NOMINAL_RATE = 30.0
LOST_TRACK_DETECTIONS = 3  # ... and at least this many detections of a capped rate (`detect: {fps}`)


# Where the rate cap spaces detections apart, an object can be far from where its motion model put
# it (it turned, braked, or its speed was not yet known): boxes are matched with their sides pushed
# out by this share of their size per second between detections (buffered IoU, Yang et al. 2022,
# `trackers`' BIoU), at most BUFFER_MOST. Measured on `fast_movers` (docs/serve.md): at 5 detections a
# second 0.5 to 2.0 keep every id (plain IoU: a new id at every turn); at 2.5 a second 1.0 counts 17
# of 20 crossings, 2.0 all of them. Every-frame detection keeps plain IoU (nothing measured changes).
BUFFER_PER_SECOND = 5.0
BUFFER_MOST = 2.0


def detect_interval_s(detect: DetectSpec | None) -> float:
    """Seconds between detections the motion gate's rate cap keeps at least (0: no cap)."""
    return 1.0 / detect.fps if detect is not None and detect.motion and detect.fps else 0.0


def lost_track_seconds(detect: DetectSpec | None) -> float:
    """How long a track survives without a detection: LOST_TRACK_SECONDS, or LOST_TRACK_DETECTIONS
    detection intervals where the motion gate's rate cap spaces them further apart."""
    return max(LOST_TRACK_SECONDS, LOST_TRACK_DETECTIONS * detect_interval_s(detect))


def match_buffer(detect: DetectSpec | None) -> float:
    """The share of a box's size its sides are pushed out by for matching (see BUFFER_PER_SECOND)."""
    return min(BUFFER_MOST, BUFFER_PER_SECOND * detect_interval_s(detect))


# (line, "in" or "out", class name, how many) for each crossing in a frame
CrossingHandler = Callable[[str, str, str, int], None]


@dataclass
class _Inside:
    """A tracked object inside a zone: what it was when last seen."""

    class_name: str
    box: tuple[float, float, float, float]
    score: float
    seen_at: float


# a box's corners as (x, y) column pairs of its xyxy row: top-left, top-right, bottom-left, bottom-right
_CORNERS = np.array([[0, 1], [2, 1], [0, 3], [2, 3]])


class LineCounter:
    """Crossings of one counting line by tracks (`CountingLine` gives the rule and the directions).

    A track's side is the side its whole box was on when last wholly on one side; a box on the line,
    or beyond the perpendiculars through the line's ends, leaves it unchanged (a corner exactly on the
    line is on the `out` side, as in supervision's `LineZone`). A crossing counts when
    a track is seen wholly on the other side, however many frames it straddled the line or went
    undetected in between: the side lasts as long as the track's id (`forget` drops ended tracks).
    The ends are inclusive, so a line drawn from edge to edge of the picture also counts boxes the
    frame's edge cuts off."""

    def __init__(self, line: CountingLine):
        start, end = np.asarray(line.start, np.float64), np.asarray(line.end, np.float64)
        self._start = start
        self._length = float(np.hypot(*(end - start)))
        self._along = (end - start) / self._length
        self._towards_in = np.asarray(line.in_direction(), np.float64)
        self._sides: dict[int, int] = {}  # track id -> +1 wholly on the `in` side, -1 on the `out` side

    def sides(self, boxes: np.ndarray) -> np.ndarray:
        """[N] int: +1 a box wholly on the `in` side, -1 wholly on the `out` side, 0 on the line or
        beyond its ends (boxes: [N, 4] xyxy pixels)."""
        corners = np.asarray(boxes, np.float64).reshape(-1, 4)[:, _CORNERS] - self._start  # [N, 4, 2]
        across, along = corners @ self._towards_in, corners @ self._along  # [N, 4] each
        within = ((along >= 0) & (along <= self._length)).all(axis=1)
        side = np.where((across > 0).all(axis=1), 1, np.where((across <= 0).all(axis=1), -1, 0))
        return np.where(within, side, 0)

    def trigger(self, boxes: np.ndarray, track_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """([N] bool crossed in, [N] bool crossed out) for one frame's boxes and their track ids
        (-1: untracked, never counted)."""
        crossed_in, crossed_out = np.zeros(len(boxes), bool), np.zeros(len(boxes), bool)
        for i, side in enumerate(self.sides(boxes)):
            track_id = int(track_ids[i])
            if side == 0 or track_id < 0:
                continue
            before = self._sides.get(track_id)
            self._sides[track_id] = int(side)
            if before is not None and before != side:
                (crossed_in if side > 0 else crossed_out)[i] = True
        return crossed_in, crossed_out

    def forget(self, track_ids: Iterable[int]) -> None:
        """Drop the sides of tracks that ended (their ids never come back)."""
        for track_id in track_ids:
            self._sides.pop(track_id, None)


class StreamTracker:
    """Follows the objects of one stream and counts line crossings and zone occupancy.

    Only the output thread of the pipeline updates it. The API reads `counts()` from other threads, so
    the counters change and are read under a lock; `request_reset` (the reader, on reconnect) only sets
    a flag.
    """

    def __init__(self, spec: StreamSpec, on_crossing: CrossingHandler | None = None, first_id: int = 0):
        self.spec = spec
        self.tracking = spec.track
        self.lost_track_s = lost_track_seconds(spec.detect)
        self.match_buffer = match_buffer(spec.detect)
        # the lines and zones as this tracker counts them: a PATCH changes `spec` (the stream's) in place
        self._counted_lines = {line.name: line for line in spec.lines}
        self._counted_zones = {zone.name: zone for zone in spec.zones}
        self._on_crossing = on_crossing or (lambda line, direction, name, count: None)
        self._tracker: ByteTrackTracker | None = None
        self._lines: dict[str, LineCounter] = {}
        self._zones = {
            zone.name: sv.PolygonZone(np.round(np.asarray(zone.polygon)).astype(np.int64))
            for zone in spec.zones
        }
        self._first_id = first_id  # ids of the current tracker are offset by this (ids never repeat)
        self.next_id = first_id  # one past the highest id handed out so far
        self._reset_pending = False
        self._lock = threading.Lock()
        self.resets = 0
        self.crossings: dict[str, dict[str, Counter[str]]] = {
            line.name: {"in": Counter(), "out": Counter()} for line in spec.lines
        }
        self.occupancy: dict[str, Counter[str]] = {zone.name: Counter() for zone in spec.zones}
        self._inside: dict[str, dict[int, _Inside]] = {zone.name: {} for zone in spec.zones}
        self.occurrences: list[Occurrence] = []  # of the latest update
        self._votes: dict[int, Counter[str]] = {}  # track id -> summed score per class (`_vote`)
        self._seen_at: dict[int, float] = {}  # track id -> when it was last seen
        # library track id -> (label, name, score) of its box in the latest detected frame
        self._followed: dict[int, tuple[int, str, float]] = {}
        self._start()

    def _start(self) -> None:
        if self.tracking:
            self._tracker = ByteTrackTracker(
                # in 30 fps frames; given timestamps, the library keeps a track lost_track_buffer / 30 s
                lost_track_buffer=round(self.lost_track_s * NOMINAL_RATE),
                frame_rate=NOMINAL_RATE,
                track_activation_threshold=CONFIDENT_SCORE,
                high_conf_det_threshold=CONFIDENT_SCORE,
                minimum_consecutive_frames=1,
                iou=BIoU(self.match_buffer) if self.match_buffer else IoU(),
            )
        self._lines = {line.name: LineCounter(line) for line in self.spec.lines}
        self._first_id = self.next_id
        self._followed = {}
        self._detected_at: float | None = None  # the latest update's timestamp

    def keep_from(self, old: StreamTracker) -> tuple[set[str], set[str]]:
        """Continue what a redefinition left as it was: the tracks (when tracking stays on), and each
        line and zone whose name and points did not change, with its counts and who is inside. Returns
        the names of the lines and zones kept; the others start from zero. Call before the new tracker
        gets its first frame."""
        if not (self.tracking and old.tracking):
            return set(), set()
        self._tracker, self._first_id, self.next_id = old._tracker, old._first_id, old.next_id
        self._followed, self._detected_at = old._followed, old._detected_at
        self._votes, self._seen_at = old._votes, old._seen_at  # the tracks go on, with their classes
        self._reset_pending = old._reset_pending  # a reconnect the old one had not applied yet
        lines = {name for name, line in self._counted_lines.items() if old._counted_lines.get(name) == line}
        zones = {name for name, zone in self._counted_zones.items() if old._counted_zones.get(name) == zone}
        with old._lock:
            for name in lines:
                self._lines[name], self.crossings[name] = old._lines[name], old.crossings[name]
            for name in zones:
                self._zones[name], self.occupancy[name] = old._zones[name], old.occupancy[name]
                self._inside[name] = old._inside[name]
        return lines, zones

    def request_reset(self) -> None:
        """Forget every track before the next frame (the stream reconnected: objects may have moved)."""
        self._reset_pending = True

    def _apply_reset(self) -> None:
        """A reconnect asked for a fresh tracker: start one; the objects inside zones leave."""
        if not self._reset_pending:
            return
        self._reset_pending = False
        self.resets += 1
        self._start()
        for zone_name, inside in self._inside.items():  # the old tracks ended: their objects leave
            for track_id, seen in sorted(inside.items()):
                self.occurrences.append(
                    Occurrence(ZONE_LEAVE, zone_name, None, seen.class_name, track_id, seen.box, seen.score)
                )
            inside.clear()

    def predict(self, timestamp: float, size: tuple[int, int] | None = None) -> tuple[Detections, np.ndarray]:
        """A frame with motion that was not detected (the motion gate's rate cap): each track's motion
        model advances to `timestamp`; returns the tracks followed at the latest detection at their
        predicted boxes (label, name and score of that detection; descending score) and their ids.
        Nothing is counted and the zones keep their state: counts come from detected frames. Without
        tracking there is no motion model, and no box. `size` (width, height): boxes are cut to the
        frame, and a track predicted wholly outside it is left out."""
        self.occurrences = []
        self._apply_reset()
        if self._tracker is None:
            return Detections.empty(), np.zeros(0, np.int64)
        # each followed track's filter, copied, advanced by the time since the latest detection: the
        # tracker itself is left alone, so the next detection is matched after one step over the whole
        # gap (the same motion model) and a track started at the latest detection is not dropped as a
        # track missed for several frames before it was confirmed
        step = (
            max(0.0, timestamp - self._detected_at) * NOMINAL_RATE if self._detected_at is not None else 0.0
        )
        found = []
        for track in self._tracker.tracks:
            if track.tracker_id in self._followed:
                motion = copy.deepcopy(track.state_estimator)
                motion.predict(step, NOMINAL_RATE)
                found.append(
                    (
                        motion.state_to_bbox(),
                        *self._followed[track.tracker_id],
                        track.tracker_id + self._first_id,
                    )
                )
        found.sort(key=lambda row: -row[3])
        if not found:
            return Detections.empty(), np.zeros(0, np.int64)
        boxes, labels, names, scores, ids = zip(*found)
        predicted = Detections(
            np.asarray(boxes, np.float32).reshape(-1, 4),
            np.asarray(scores, np.float32),
            np.asarray(labels, np.int64),
            list(names),
        )
        track_ids = np.asarray(ids, np.int64)
        if size is not None:
            predicted.boxes[:, 0::2] = predicted.boxes[:, 0::2].clip(0, size[0])
            predicted.boxes[:, 1::2] = predicted.boxes[:, 1::2].clip(0, size[1])
            inside = (predicted.boxes[:, 2] > predicted.boxes[:, 0]) & (
                predicted.boxes[:, 3] > predicted.boxes[:, 1]
            )
            predicted, track_ids = predicted.keep(inside), track_ids[inside]
        return predicted, track_ids

    def update(self, det: DetectionsLike, timestamp: float) -> np.ndarray:
        """Track ids for the frame's detections, in their order ([N] int64, -1: not tracked).

        `timestamp` is the frame's time in seconds (media time where known), so that frames skipped
        in latest-frame mode count as the gap they are in the motion model.
        """
        self.occurrences = []
        self._apply_reset()
        boxes = np.asarray(det.boxes, dtype=np.float32).reshape(-1, 4)  # [N, 4] xyxy px
        count = len(boxes)
        labels = np.asarray(det.labels, dtype=np.int64).reshape(-1)
        detections = sv.Detections(
            xyxy=boxes,
            confidence=np.asarray(det.scores, dtype=np.float32).reshape(-1),
            class_id=labels,
            data={"index": np.arange(count)},
        )
        track_ids = np.full(count, -1, dtype=np.int64)
        scores_in = detections.confidence
        if self._tracker is not None:
            # one box per object: a second box of another class on the same object would start a
            # second track that takes the object's id in turns (its class goes to the vote instead)
            kept = _one_box_per_object(boxes, detections.confidence)
            tracked = self._tracker.update(detections[kept], timestamp=timestamp)  # reordered
            if len(tracked):  # (an empty result carries no data columns)
                ids = np.asarray(tracked.tracker_id, dtype=np.int64)
                order = np.asarray(tracked.data["index"], dtype=np.int64)
                track_ids[order] = np.where(ids >= 0, ids + self._first_id, -1)
                if ids.max() >= 0:
                    self.next_id = max(self.next_id, int(ids.max()) + self._first_id + 1)
            self._detected_at = timestamp
            self._followed = {
                int(track_id) - self._first_id: (int(labels[i]), str(det.names[i]), float(scores_in[i]))
                for i, track_id in enumerate(track_ids)
                if track_id >= 0
            }
        detections.tracker_id = track_ids
        classes = self._vote(track_ids, list(det.names), detections.confidence, boxes, timestamp)
        scores = detections.confidence
        for line_name, line in self._lines.items():
            crossed_in, crossed_out = line.trigger(boxes, track_ids)
            for direction, crossed in (("in", crossed_in), ("out", crossed_out)):
                rows = np.flatnonzero(crossed)
                for name, n in Counter(classes[i] for i in rows).items():
                    with self._lock:
                        self.crossings[line_name][direction][name] += n
                    self._on_crossing(line_name, direction, name, n)
                for i in rows:  # untracked boxes (-1) cross nothing: a line follows tracks
                    self.occurrences.append(
                        Occurrence(
                            LINE_CROSS,
                            line_name,
                            direction,
                            classes[i],
                            int(track_ids[i]),
                            _box(boxes[i]),
                            float(scores[i]),
                        )
                    )
        for zone_name, zone in self._zones.items():
            inside = np.asarray(zone.trigger(detections), dtype=bool) if count else np.zeros(0, bool)
            self.occupancy[zone_name] = Counter(classes[i] for i in np.flatnonzero(inside))
            self._zone_changes(zone_name, inside, boxes, classes, track_ids, scores, timestamp)
        self._forget_ended(timestamp)
        return track_ids

    def _vote(
        self, track_ids: np.ndarray, names: list[str], scores: np.ndarray, boxes: np.ndarray, now: float
    ) -> list[str]:
        """Each detection's class for counts and events: its track's, the class with the highest
        summed score over the track's life so far (a track whose class flips between two look-alikes
        counts as one class); an untracked box keeps its own."""
        classes = list(names)
        for i in np.flatnonzero(track_ids >= 0):
            track_id = int(track_ids[i])
            votes = self._votes.setdefault(track_id, Counter())
            votes[names[i]] += float(scores[i])
            self._seen_at[track_id] = now
            classes[i] = max(sorted(votes), key=votes.__getitem__)
        return classes

    def _forget_ended(self, now: float) -> None:
        """Drop the votes and line sides of tracks not seen for twice the lost-track time: the tracker
        has ended them, and ids never come back."""
        ended = [t for t, seen in self._seen_at.items() if now - seen > 2 * self.lost_track_s]
        for track_id in ended:
            del self._votes[track_id], self._seen_at[track_id]
        for line in self._lines.values():
            line.forget(ended)

    def _zone_changes(
        self,
        zone_name: str,
        inside: np.ndarray,
        boxes: np.ndarray,
        classes: list[str],
        track_ids: np.ndarray,
        scores: np.ndarray,
        timestamp: float,
    ) -> None:
        """Entries and exits of tracked objects for one zone (see the module docstring)."""
        known = self._inside[zone_name]
        seen_now = {int(t) for t in track_ids if t >= 0}
        inside_now = set()
        for i in np.flatnonzero(inside & (track_ids >= 0)):
            track_id, box = int(track_ids[i]), _box(boxes[i])
            inside_now.add(track_id)
            state = _Inside(classes[i], box, float(scores[i]), timestamp)
            if track_id not in known:
                self.occurrences.append(
                    Occurrence(ZONE_ENTER, zone_name, None, state.class_name, track_id, box, state.score)
                )
            known[track_id] = state
        for track_id in sorted(known):
            seen = known[track_id]
            outside = track_id in seen_now and track_id not in inside_now
            lost = track_id not in seen_now and timestamp - seen.seen_at > self.lost_track_s
            if outside or lost:
                if outside:  # where it was seen outside
                    i = int(np.flatnonzero(track_ids == track_id)[0])
                    seen = _Inside(seen.class_name, _box(boxes[i]), float(scores[i]), timestamp)
                del known[track_id]
                self.occurrences.append(
                    Occurrence(ZONE_LEAVE, zone_name, None, seen.class_name, track_id, seen.box, seen.score)
                )

    def counts(self) -> dict[str, dict]:
        """Crossings per line, direction and class (totals since the stream started); zone occupancy now."""
        with self._lock:
            return {
                "lines": {
                    name: {direction: dict(sorted(c.items())) for direction, c in by_direction.items()}
                    for name, by_direction in self.crossings.items()
                },
                "zones": {name: dict(sorted(c.items())) for name, c in self.occupancy.items()},
            }


DUPLICATE_IOU = 0.7  # two boxes overlapping this much are one object (classes of one object's query)


def _one_box_per_object(boxes: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """[N] bool: the best-scoring box of each group of boxes that overlap by DUPLICATE_IOU or more,
    whatever their classes."""
    overlaps = box_iou(boxes, boxes) >= DUPLICATE_IOU  # [N, N]
    keep = np.zeros(len(boxes), bool)
    for i in np.argsort(-scores, kind="stable"):
        keep[i] = not np.any(overlaps[i] & keep)
    return keep


def _box(row: np.ndarray) -> tuple[float, float, float, float]:
    x1, y1, x2, y2 = (round(float(v), 2) for v in row)
    return x1, y1, x2, y2
