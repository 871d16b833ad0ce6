"""`dfine-bench --tiles 3x2`: what tiles buy on small objects, and what they cost, for one model.

Every image of --data (best: `dfine-data synth --dense`, 1080p scenes of 8-24 px objects) is detected
twice with the same graph, opened as dfine-serve opens it (its score threshold): whole, and as the
crops of dfine_deploy/tiles.py (plus the whole frame unless --tiles-no-full), merged. The report gives,
for each: recall (a ground-truth box is found when a detection of its class has IoU >= MATCH_IOU),
objects on a seam found more than once (two or more detections of its class lying mostly inside its
box: the merge must leave one), and milliseconds per frame, crops included, beside the limit
(crops + 1) x one whole frame.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy.bench.hardware import Hardware
from dfine_deploy.bench.report import render_table
from dfine_deploy.bench.tables import Profile
from dfine_deploy.errors import BenchError
from dfine_deploy.images import read_image
from dfine_deploy.runtime.tile_merge import merge
from dfine_deploy.tiles import TileSpec, crops, seams, small_in_whole, tile_windows

MATCH_IOU = 0.5
INSIDE = 0.5  # a detection with this share of its box inside an object's box is a detection of it


@dataclass
class ModeScore:
    """One way of detecting (whole frames or tiles) over the images scored."""

    mode: str
    images_per_frame: int
    objects: int = 0
    found: int = 0
    seam_objects: int = 0
    seam_found_twice: int = 0
    frames: int = 0
    times: list[float] = field(default_factory=list)  # seconds of each timed frame

    @property
    def ms_per_frame(self) -> float:
        """The median: a shared machine's other jobs stretch single calls."""
        return 1000 * float(np.median(self.times)) if self.times else 0.0

    @property
    def recall(self) -> float:
        return self.found / self.objects if self.objects else 0.0

    def to_dict(self) -> dict[str, Any]:
        data = {k: v for k, v in asdict(self).items() if k != "times"}
        return {**data, "timed": len(self.times), "recall": round(self.recall, 4),
                "ms_per_frame": round(self.ms_per_frame, 2)}  # fmt: skip


def _iou(box: np.ndarray, others: np.ndarray) -> np.ndarray:
    ix = np.clip(np.minimum(box[2], others[:, 2]) - np.maximum(box[0], others[:, 0]), 0, None)
    iy = np.clip(np.minimum(box[3], others[:, 3]) - np.maximum(box[1], others[:, 1]), 0, None)
    inter = ix * iy
    union = (box[2] - box[0]) * (box[3] - box[1]) + (others[:, 2] - others[:, 0]) * (
        others[:, 3] - others[:, 1]
    )
    return inter / np.maximum(union - inter, 1e-6)


def score_frame(
    score: ModeScore, truth: np.ndarray, truth_labels: np.ndarray, on_seam: np.ndarray, det: Any
) -> None:
    """Add one frame: `truth` [N, 4] xyxy, `truth_labels` [N], `on_seam` [N] bool, `det` the
    frame's detections (best label per box)."""
    boxes = np.asarray(det.boxes, np.float32).reshape(-1, 4)
    labels = np.asarray(det.labels, np.int64).reshape(-1)
    order = np.argsort(-np.asarray(det.scores, np.float32).reshape(-1), kind="stable")
    taken = np.zeros(len(truth), bool)
    for i in order.tolist():  # greedy, best score first, as COCO matches
        same = np.flatnonzero((truth_labels == labels[i]) & ~taken)
        if len(same):
            iou = _iou(boxes[i], truth[same])
            best = int(np.argmax(iou))
            if iou[best] >= MATCH_IOU:
                taken[same[best]] = True
    score.objects += len(truth)
    score.found += int(taken.sum())
    score.seam_objects += int(on_seam.sum())
    for t in np.flatnonzero(on_seam).tolist():
        mine = boxes[labels == truth_labels[t]]
        if len(mine):
            gx1, gy1, gx2, gy2 = truth[t]
            ix = np.clip(np.minimum(gx2, mine[:, 2]) - np.maximum(gx1, mine[:, 0]), 0, None)
            iy = np.clip(np.minimum(gy2, mine[:, 3]) - np.maximum(gy1, mine[:, 1]), 0, None)
            area = np.maximum((mine[:, 2] - mine[:, 0]) * (mine[:, 3] - mine[:, 1]), 1e-6)
            score.seam_found_twice += int(((ix * iy / area) >= INSIDE).sum() >= 2)


def on_seams(truth: np.ndarray, width: int, height: int, spec: TileSpec) -> np.ndarray:
    """[N] bool: boxes a crop edge runs through."""
    xs, ys = seams(width, height, spec)
    cut = np.zeros(len(truth), bool)
    for x in xs:
        cut |= (truth[:, 0] < x) & (truth[:, 2] > x)
    for y in ys:
        cut |= (truth[:, 1] < y) & (truth[:, 3] > y)
    return cut


def tiled_predict(detector: Any, image: np.ndarray, spec: TileSpec, max_batch: int) -> Any:
    """The merged detections of `image`'s crops, detected in batches of at most `max_batch`."""
    height, width = image.shape[:2]
    windows = tile_windows(width, height, spec)
    pieces = crops(image, windows)
    results: list[Any] = []
    for start in range(0, len(pieces), max_batch):
        results += detector.predict(pieces[start : start + max_batch], color="BGR")
    return merge(list(zip(windows, results)), width, height, small_in_whole(width, height, spec))


def compare(
    detector: Any,
    frames: list[tuple[np.ndarray, np.ndarray, np.ndarray]],
    spec: TileSpec,
    max_batch: int,
    rounds: int = 1,
) -> tuple[ModeScore, ModeScore]:
    """Whole frames and tiles on `frames` [(BGR image, truth [N, 4] xyxy, truth labels [N])], each
    frame timed `rounds` times in each mode, the two modes in turn."""
    from dfine_deploy.serve.results import one_label_per_object

    whole, tiled = ModeScore("whole frame", 1), ModeScore("tiles", spec.images)
    modes = (
        (whole, lambda im: detector.predict([im], color="BGR")[0]),
        (tiled, lambda im: tiled_predict(detector, im, spec, max_batch)),
    )
    for image, truth, labels in frames:
        height, width = image.shape[:2]
        seam = on_seams(truth, width, height, spec)
        for round_ in range(rounds):
            for mode, run in modes:
                t0 = time.perf_counter()
                det = run(image)
                mode.times.append(time.perf_counter() - t0)
                if round_ == 0:
                    mode.frames += 1
                    score_frame(mode, truth, labels, seam, one_label_per_object(det))
    return whole, tiled


def load_frames(
    data: Path, class_names: list[str], limit: int | None
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The val split of a COCO folder (or its annotations.json) as (BGR image, xyxy boxes, labels);
    categories meet the model's labels by name."""
    from dfine_deploy.data.formats import open_dataset

    annotations = open_dataset(data).load("val")
    gt = annotations.coco_dict()
    by_name = {name: i for i, name in enumerate(class_names)}
    to_label = {c["id"]: by_name.get(c["name"], -1) for c in gt["categories"]}
    if all(v < 0 for v in to_label.values()):
        raise BenchError(
            f"--tiles --data {data}: none of its categories {sorted(c['name'] for c in gt['categories'])} "
            f"is a class of the model ({class_names}); give a dataset of the model's classes"
        )
    frames = []
    for record in gt["images"][:limit]:
        image = read_image(annotations.img_folder / record["file_name"], color="BGR")
        anns = [a for a in gt["annotations"] if a["image_id"] == record["id"]]
        boxes = np.array([[x, y, x + w, y + h] for x, y, w, h in (a["bbox"] for a in anns)], np.float32)
        frames.append(
            (image, boxes.reshape(-1, 4), np.array([to_label[a["category_id"]] for a in anns], np.int64))
        )
    return frames


def report_lines(whole: ModeScore, tiled: ModeScore, spec: TileSpec) -> list[str]:
    header = ["Mode", "Images/frame", "Recall", "Objects", "Seam objects", "Found twice", "ms/frame"]
    rows = [
        [m.mode, str(m.images_per_frame), f"{m.recall:.3f}", str(m.objects), str(m.seam_objects),
         str(m.seam_found_twice), f"{m.ms_per_frame:.1f}"]
        for m in (whole, tiled)
    ]  # fmt: skip
    limit = spec.grid[0] * spec.grid[1] + 1
    ratio = tiled.ms_per_frame / max(whole.ms_per_frame, 1e-9)
    return [
        render_table(header, rows),
        "",
        f"tiles {spec.grid[0]}x{spec.grid[1]}, overlap {spec.overlap:g}"
        f"{', with the whole frame' if spec.full_frame else ''}: "
        f"recall {100 * (tiled.recall - whole.recall):+.1f} points; "
        f"cost {ratio:.2f}x one whole frame (limit {limit}x: crops + 1)",
    ]


def run_tiles_bench(args: argparse.Namespace, hardware: Hardware, profile: Profile) -> int:
    """`dfine-bench --tiles GRID --data DENSE`: one --model on one --backend, opened as dfine-serve
    opens it."""
    if args.data is None:
        raise BenchError(
            "--tiles needs --data: a COCO folder of small objects, e.g. from "
            "`dfine-data synth --dense --out runs/dense --images 1 --val-images 2`"
        )
    try:
        spec = TileSpec.from_text(args.tiles, args.tile_overlap, not args.tiles_no_full)
    except ValueError as exc:
        raise BenchError(f"--tiles {args.tiles} --tile-overlap {args.tile_overlap}: {exc}") from None
    from dfine_deploy.bench.streams import open_as_served, served_report

    detector = open_as_served(args, profile, "--tiles")
    try:
        frames = load_frames(args.data, detector.class_names, args.data_limit)
        # warm-up, untimed: the first call at each batch size allocates (onnxruntime) or compiles (OpenVINO)
        detector.predict([frames[0][0]], color="BGR")
        tiled_predict(detector, frames[0][0], spec, args.max_batch)
        whole, tiled = compare(detector, frames, spec, args.max_batch, args.rounds or min(3, args.runs))
    finally:
        detector.close()
    thresholds = ", ".join(
        f"{row['class']} {row['threshold']:g}" for row in detector.thresholds.table(detector.class_names)
    )
    lines = [
        f"{len(frames)} image(s) of {args.data}, each timed {len(whole.times) // max(1, len(frames))} times "
        f"in each mode (median); score thresholds {thresholds} (dfine-serve's)",
        "",
        *report_lines(whole, tiled, spec),
    ]
    document = {"tiles": spec.to_dict(), "whole": whole.to_dict(), "tiled": tiled.to_dict()}
    return served_report(args, hardware, profile, detector, lines, document)
