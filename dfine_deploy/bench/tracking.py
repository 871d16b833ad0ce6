"""dfine-bench --tracking VIDEO --truth GT: the served tracker scored against ground-truth tracks.

Every frame of VIDEO goes through the detector and dfine-serve's tracker (serve/tracking.py) as a
served stream's would; the tracks are written in the MOT Challenge format and scored by Roboflow
`trackers`' evaluation (trackers.eval, which matches TrackEval's figures: HOTA, IDF1, MOTA, id
switches), not by code of ours. Where NAME.truth.json lies beside the truth (what
`DemoVideo.write(..., truth=True)` writes, dfine_deploy/data/moving.py), the counting line it names is
served too and its counts are compared with the true crossings, per direction and class.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Dict, List, Tuple  # the alias is evaluated at import: Python 3.8

import numpy as np

from dfine_deploy.bench.hardware import Hardware
from dfine_deploy.bench.tables import Profile
from dfine_deploy.compat import zip_strict
from dfine_deploy.errors import BenchError, require
from dfine_deploy.files import no_file

# the figures printed, each as (name, metric family of trackers.eval, its field there)
FIGURES = (
    ("HOTA", "HOTA", "HOTA"),
    ("IDF1", "Identity", "IDF1"),
    ("MOTA", "CLEAR", "MOTA"),
    ("id switches", "CLEAR", "IDSW"),
)


# The figures of a run that tracked nothing: every true object missed, no false track, no switch.
# trackers.eval refuses a tracks file without rows ("No valid data found"), and by the metrics'
# definitions each association score is 0 and MOTA = 1 - misses / objects = 0.
NOTHING_TRACKED = {"HOTA": 0.0, "IDF1": 0.0, "MOTA": 0.0, "id switches": 0}


def score_tracks(truth: str | Path, tracks: str | Path) -> dict[str, float]:
    """`tracks` (a MOT Challenge file) against `truth`, by trackers.eval: each figure of `FIGURES`."""
    if not Path(tracks).read_text().strip():
        return dict(NOTHING_TRACKED)
    evaluation = require("trackers.eval", "tracking", "scoring tracks (dfine-bench --tracking)")
    result = evaluation.evaluate_mot_sequence(
        truth, tracks, metrics=sorted({family for _, family, _ in FIGURES})
    )
    return {name: getattr(getattr(result, family), field) for name, family, field in FIGURES}


Boxes = Dict[int, List[Tuple[int, Tuple[float, float, float, float]]]]  # frame -> [(id, xyxy box)]


def mot_row(frame: int, track_id: int, box, score: float) -> str:
    """One tracked box as a MOT Challenge results row: `frame` from 1, our `track_id` (from 0) + 1,
    the xyxy `box` as left, top, width, height, its score, and -1 for the 3D fields."""
    x1, y1, x2, y2 = (float(v) for v in box)
    return f"{frame},{track_id + 1},{x1:.2f},{y1:.2f},{x2 - x1:.2f},{y2 - y1:.2f},{score:.4f},-1,-1,-1"


def _mot_boxes(path: Path) -> Boxes:
    """frame -> [(id, xyxy box)] of a MOT Challenge file; a row that is not one is refused with its
    line number (trackers.eval's own refusal came after the whole video was tracked, as a traceback)."""
    frames: Boxes = {}
    for number, row in enumerate(Path(path).read_text().splitlines(), 1):
        if not row.strip():
            continue
        values = row.split(",")
        try:
            frame, track_id = int(values[0]), int(values[1])
            left, top, width, height = (float(v) for v in values[2:6])
            if frame < 1 or min(width, height) < 0:
                raise ValueError
        except (ValueError, IndexError):  # IndexError: fewer than two columns
            raise BenchError(
                f"{path}:{number}: {row.strip()[:60]!r} is not a MOT Challenge row: frame (from 1), id, "
                "left, top, width, height (>= 0), then score and the rest"
            ) from None
        frames.setdefault(frame, []).append((track_id, (left, top, left + width, top + height)))
    return frames


def check_truth(truth: Path) -> None:
    """Read the truth before minutes of tracking: MOT Challenge rows, at least one."""
    if not _mot_boxes(truth):
        raise BenchError(f"--truth {truth}: holds no rows; give the video's MOT Challenge gt.txt")


def _pairs(objects: Boxes, found: Boxes, min_iou: float) -> Iterator[tuple[int, int]]:
    """(object id, found id) of each frame's one-to-one pairing of `objects` and `found` by the largest
    IoU, from `min_iou` up (the pairing CLEAR MOT scores)."""
    from scipy.optimize import linear_sum_assignment

    from dfine_deploy.boxes import box_iou

    for frame, truth in objects.items():
        boxes = found.get(frame, [])
        if not boxes:
            continue
        iou = box_iou(
            np.array([b for _, b in truth], np.float64), np.array([b for _, b in boxes], np.float64)
        )
        for row, col in zip(*linear_sum_assignment(-iou)):
            if iou[row, col] >= min_iou:
                yield truth[row][0], boxes[col][0]


def ids_taken_over(truth: str | Path, tracks: str | Path, min_iou: float = 0.5) -> dict[int, list[int]]:
    """Each track id of `tracks` that followed more than one object of `truth` (both MOT Challenge
    files) -> the truth ids it followed, paired frame by frame (`_pairs`). A track that goes from one
    object to another is the error a count cannot survive: both objects' crossings are split
    between ids. trackers.eval's figures count id switches per object, not this."""
    followed: dict[int, set[int]] = {}
    for obj, track in _pairs(_mot_boxes(Path(truth)), _mot_boxes(Path(tracks)), min_iou):
        followed.setdefault(track, set()).add(obj)
    return {track: sorted(ids) for track, ids in sorted(followed.items()) if len(ids) > 1}


def frames_found(truth: str | Path, found: Boxes, min_iou: float = 0.5) -> dict[int, tuple[int, int]]:
    """Each object of `truth` (a MOT Challenge file) -> (frames a box of `found` was paired with it,
    frames it is in view among those `found` has: the frames served): 0 found is an object the
    detector never sees."""
    objects = {frame: boxes for frame, boxes in _mot_boxes(Path(truth)).items() if frame in found}
    in_view = Counter(obj for boxes in objects.values() for obj, _ in boxes)
    paired = Counter(obj for obj, _ in _pairs(objects, found, min_iou))
    return {obj: (paired[obj], in_view[obj]) for obj in sorted(in_view)}


def objects_found(truth: Path, found: Boxes, classes: dict[str, str] | None = None) -> list[dict]:
    """`frames_found` as records: each object of `truth` with its class (from NAME.truth.json's
    `classes`, where there is one), the frames a box was paired with it and the frames it is in view."""
    return [
        {
            "object": obj,
            "class": (classes or {}).get(str(obj), "?"),
            "frames_found": n,
            "frames_in_view": of,
        }
        for obj, (n, of) in frames_found(truth, found).items()
    ]


def found_lines(objects: list[dict]) -> list[str]:
    """What is printed of `objects_found`: each object's frames with a box, and those never seen."""
    seen = ", ".join(f"{o['class']} {o['frames_found']}/{o['frames_in_view']}" for o in objects)
    never = [f"{o['class']} (object {o['object']})" for o in objects if not o["frames_found"]]
    return [
        f"frames with a box on each object: {seen}",
        "objects the detector never sees: " + (", ".join(never) if never else "none"),
    ]


def count_errors(
    counted: dict[str, dict[str, int]], expected: dict[str, dict[str, int]]
) -> dict[str, dict[str, int]]:
    """Counted minus true crossings, per direction and class (0 where they agree), for every class
    either names."""
    return {
        direction: {
            name: counted.get(direction, {}).get(name, 0) - expected.get(direction, {}).get(name, 0)
            for name in sorted({*counted.get(direction, {}), *expected.get(direction, {})})
        }
        for direction in ("in", "out")
    }


def _frames(video: Path) -> Iterator[tuple[np.ndarray, float]]:
    """(BGR frame, its time in seconds) of every frame of `video`."""
    import cv2

    capture = cv2.VideoCapture(str(video))
    if not capture.isOpened():
        raise BenchError(f"--tracking {video}: OpenCV cannot open it; give a video file (e.g. .mp4)")
    fps = capture.get(cv2.CAP_PROP_FPS) or 0.0
    if fps <= 0:
        raise BenchError(f"--tracking {video}: the file names no frame rate; re-encode it with one")
    index = 0
    try:
        while True:
            ok, frame = capture.read()
            if not ok:
                return
            yield frame, index / fps
            index += 1
    finally:
        capture.release()


def detected_frames(
    detector, video: Path, detect: dict | None = None
) -> Iterator[tuple[float, tuple[int, int], Any]]:
    """(seconds, (width, height), the frame's detections, or None where the motion gate's rate cap
    left it undetected) of every frame of `video`, as the served pipeline plans and combines them.
    `detect`: a stream's `detect:` (the motion gate and its rate, dfine_deploy/serve/regions.py)."""
    from dfine_deploy.serve.regions import DetectSpec, StreamRegions

    gate = DetectSpec.from_mapping(detect) if detect else None
    regions = StreamRegions(None, gate, detector.input_size) if gate else None
    for frame, seconds in _frames(video):
        size = (frame.shape[1], frame.shape[0])
        plan = regions.plan(frame, seconds) if regions is not None else None
        if plan is None:
            (det,) = detector.predict([frame], color="BGR")
        else:
            images = plan.images(frame)
            det = plan.combine(detector.predict(images, color="BGR") if images else [])
            regions.detected(plan, det, seconds)
        yield seconds, size, None if plan is not None and plan.predicted else det


def track_video(
    detector, video: Path, tracks: Path, line: dict | None, detect: dict | None = None
) -> tuple[dict[str, dict[str, int]], Boxes]:
    """Serve `video` through `detector` and dfine-serve's tracker, write its tracks to `tracks` (MOT
    Challenge rows, frame and id from 1) and return `line`'s counts ({} without a line) and every
    frame's served boxes, tracked or not (frame from 1 -> [(index, xyxy box)]). `detect`: as
    `detected_frames` takes it."""
    from dfine_deploy.serve.regions import DetectSpec
    from dfine_deploy.serve.results import one_label_per_object
    from dfine_deploy.serve.settings import StreamSpec
    from dfine_deploy.serve.tracking import StreamTracker

    gate = DetectSpec.from_mapping(detect) if detect else None
    tracker = StreamTracker(StreamSpec(url=str(video), track=True, lines=[line] if line else [], detect=gate))
    rows = []
    served: Boxes = {}
    frames = 0
    for seconds, size, det in detected_frames(detector, video, detect):
        frames += 1
        if det is None:  # not detected: the tracks' predicted boxes
            det, ids = tracker.predict(seconds, size)
        else:
            det = one_label_per_object(det)  # what the served pipeline tracks (serve/results.py)
            ids = tracker.update(det, seconds)
        served[frames] = [(i, tuple(float(v) for v in box)) for i, box in enumerate(det.boxes)]
        for track_id, score, box in zip_strict(ids, det.scores, det.boxes):
            if track_id >= 0:
                rows.append(mot_row(frames, int(track_id), box, float(score)))
    if not frames:
        raise BenchError(f"--tracking {video}: no frame could be decoded")
    tracks.write_text("\n".join(rows) + "\n")
    if line is None:
        return {}, served
    return {d: dict(sorted(c.items())) for d, c in tracker.crossings[line["name"]].items()}, served


def truth_facts(truth: Path) -> dict | None:
    """NAME.truth.json beside NAME.gt.txt (the line and its true crossings), or None where there is none."""
    name = truth.name.removesuffix(".gt.txt") if truth.name.endswith(".gt.txt") else truth.stem
    facts = truth.parent / f"{name}.truth.json"
    if not facts.is_file():
        return None
    try:
        return json.loads(facts.read_text())
    except json.JSONDecodeError as exc:
        raise BenchError(f"{facts}: not JSON ({exc}); write it again with DemoVideo.write_truth") from None


def run_tracking_bench(args: argparse.Namespace, hardware: Hardware, profile: Profile) -> int:
    """`dfine-bench --tracking VIDEO --truth GT --model M`."""
    from dfine_deploy.bench.streams import open_as_served, served_report
    from dfine_deploy.data.moving import truth_paths

    video = Path(args.tracking)
    truth = Path(args.truth) if args.truth else truth_paths(video)[0]
    for option, path in (("--tracking", video), ("--truth", truth)):
        if not path.is_file():
            raise BenchError(
                f"{option} {path}: {no_file(path)}; give a video and its MOT Challenge gt.txt "
                "(dfine-data video writes both)"
            )
    check_truth(truth)
    facts = truth_facts(truth)
    line = facts["line"] if facts else None
    Path(args.work_dir).mkdir(parents=True, exist_ok=True)
    tracks = Path(args.work_dir) / f"{video.stem}.tracks.txt"
    detector = open_as_served(args, profile, "--tracking")
    try:
        detect = {"motion": True, "fps": args.detect_fps or 0.0} if args.motion else None
        counted, served = track_video(detector, video, tracks, line, detect)
    finally:
        detector.close()
    figures = score_tracks(truth, tracks)
    taken_over = ids_taken_over(truth, tracks)
    gate = f", motion gate at most {args.detect_fps or 'every frame'} detections/s" if args.motion else ""
    lines = [
        f"{video} against {truth} (trackers.eval){gate}; tracks written to {tracks}",
        *(
            f"  {name:<12} {value:.3f}" if isinstance(value, float) else f"  {name:<12} {value}"
            for name, value in figures.items()
        ),
    ]
    lines.append(
        f"  ids taken over: {len(taken_over)} tracks followed another object too"
        + (f" (MOT track id: object ids {taken_over})" if taken_over else "")
    )
    found = objects_found(truth, served, facts["classes"] if facts else None)
    lines += [f"  {line}" for line in found_lines(found)]
    document: dict = {"video": str(video), "truth": str(truth), "tracks": str(tracks), **figures}
    document["ids_taken_over"] = {str(track): objects for track, objects in taken_over.items()}
    document["objects_found"] = found
    if facts is None:
        lines.append(
            f"  count error: no {truth.parent}/*.truth.json beside the truth names a line; not measured"
        )
    else:
        errors = count_errors(counted, facts["expected_crossings"])
        lines.append(f"  line {line['name']!r}: counted {counted}, true {facts['expected_crossings']}")
        lines.append(f"  count error (counted - true) {errors}")
        document.update(counted=counted, expected=facts["expected_crossings"], count_error=errors)
    return served_report(args, hardware, profile, detector, lines, document)
