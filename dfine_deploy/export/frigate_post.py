"""What Frigate makes of a D-FINE graph's outputs on one still image, step by step, as its code does.

Facts read from Frigate's source at commit e3fa701 (github.com/blakeblackshear/frigate, `dev`, July
2026), redone here in our own code; nothing of Frigate is imported:

1. Detector (`post_process_dfine`, frigate/util/model.py, called by the onnx and openvino detectors
   with `model_type: dfine`): outputs read by position as labels, boxes, scores; detections with a score
   above 0.4 kept; boxes divided by (height, width, height, width) of the model input; OpenCV's
   `cv2.dnn.NMSBoxes` at score 0.4 and IoU 0.4 run over all of them **across classes**, on the corner
   boxes (x1, y1, x2, y2), which OpenCV reads as (x, y, width, height); at most 20 rows, best score first,
   as (class, score, y1, x1, y2, x2).
2. `detect` (frigate/object_detection/base.py, threshold 0.4 by default): rows read in order until the
   first score under 0.4; a class index outside the label map is skipped.
3. `detect` (frigate/video/detect.py): each box scaled by the square region's side, offset by its
   corner, clamped to the frame, cut to whole pixels; a box starting at the frame's last column or row is
   dropped. `is_object_filtered` (frigate/util/object.py) then drops a class not in `objects.track`, and
   per class `objects.filters.<label>`: area outside [min_area, max_area], **score < min_score**, width
   / height outside [min_ratio, max_ratio] (masks are not modelled here).
4. `reduce_detections` (frigate/util/object.py): per class, `cv2.dnn.NMSBoxes` on (x, y, width, height)
   with **score threshold 0.5** and IoU 0.4 (0.6 for `car`), a box within 5 px of a region edge that is
   not a frame edge scored 0.6 for it; then per class, a box more than 90 % (80 % `car`, 50 % `face`)
   inside a larger one of its class is dropped, unless it is under 5 % of that one's area.
5. The tracker (frigate/track/tracked_object.py): an object is a false positive until the median of its
   last 10 scores reaches `objects.filters.<label>.threshold` (`computed_score < threshold`). On a still
   image every frame gives the same score, so the median is that score: **score >= threshold**.

Defaults (FilterConfig, frigate/config/camera/objects.py): min_score 0.5, threshold 0.7 for every class.

So on a still image a detection scored 0.5 or less never reaches the tracker (step 4), whatever
min_score says, and a class's filters act on that class only (steps 3 to 5 are per class; step 1's
cross-class NMS runs before any filter).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import cv2
import numpy as np

DETECTOR_SCORE = 0.4  # post_process_dfine: kept above; NMSBoxes' score threshold too; detect()'s default
DETECTOR_NMS_IOU = 0.4
DETECTOR_ROWS = 20
REDUCE_SCORE = 0.5  # reduce_detections' NMSBoxes score threshold
REDUCE_NMS_IOU = {"car": 0.6}
REDUCE_NMS_IOU_DEFAULT = 0.4
CLIPPED_MARGIN = 5  # px from a region edge that is not a frame edge
CLIPPED_SCORE = 0.6
CONSOLIDATION = {"car": 0.8, "face": 0.5}
CONSOLIDATION_DEFAULT = 0.9
CONSOLIDATION_MIN_AREA_RATIO = 0.05
DEFAULT_MIN_SCORE = 0.5
DEFAULT_THRESHOLD = 0.7


@dataclass(frozen=True)
class ClassFilter:
    """`objects.filters.<label>`: the two score fields (areas and ratios at Frigate's defaults)."""

    min_score: float = DEFAULT_MIN_SCORE
    threshold: float = DEFAULT_THRESHOLD


FRIGATE_DEFAULT = ClassFilter()


@dataclass(frozen=True)
class FrameDetection:
    """One detection in frame pixels, as Frigate's detect() hands it on."""

    label: str
    score: float
    box: tuple[int, int, int, int]  # x1, y1, x2, y2, whole pixels
    region: tuple[int, int, int, int]

    @property
    def area(self) -> int:
        return (self.box[2] - self.box[0]) * (self.box[3] - self.box[1])

    @property
    def ratio(self) -> float:
        return (self.box[2] - self.box[0]) / max(1, self.box[3] - self.box[1])


def detector_rows(
    labels: np.ndarray, boxes: np.ndarray, scores: np.ndarray, width: int, height: int
) -> np.ndarray:
    """Step 1: the detector's [20, 6] rows (class, score, y1, x1, y2, x2) of one image's outputs
    (labels [K] or [1, K], boxes [K, 4] xyxy in model-input pixels, scores), zero rows after the last."""
    labels, scores = np.asarray(labels).reshape(-1), np.asarray(scores).reshape(-1)
    keep = scores > DETECTOR_SCORE
    kept = np.divide(np.asarray(boxes).reshape(-1, 4)[keep], [height, width, height, width], dtype=np.float32)
    kept_scores, kept_labels = scores[keep], labels[keep]
    # OpenCV reads each row as (x, y, width, height): the corners are passed as they are, as Frigate does
    order = np.asarray(
        cv2.dnn.NMSBoxes(kept.tolist(), kept_scores.tolist(), DETECTOR_SCORE, DETECTOR_NMS_IOU),
        dtype=np.int64,
    ).reshape(-1)[:DETECTOR_ROWS]
    rows = np.zeros((DETECTOR_ROWS, 6), np.float32)
    if len(order):
        rows[: len(order), 0] = kept_labels[order]
        rows[: len(order), 1] = kept_scores[order]
        rows[: len(order), 2:] = kept[order][:, [1, 0, 3, 2]]
    return rows


def frame_detections(
    rows: np.ndarray,
    class_names: Sequence[str],
    region: tuple[int, int, int, int],
    frame_size: tuple[int, int],
    filters: Mapping[str, ClassFilter],
) -> list[FrameDetection]:
    """Steps 2 and 3: the rows of one square `region` (x1, y1, x2, y2) of a frame (width, height) in
    frame pixels, those `filters` (by class name; a missing class at Frigate's defaults) let through.
    Every class is tracked (the snippet's `objects.track` lists them all)."""
    width, height = frame_size
    side = region[2] - region[0]
    out = []
    for label, score, y1, x1, y2, x2 in np.asarray(rows, np.float32):  # float32 sums, as Frigate's
        if score < DETECTOR_SCORE:
            break
        if not 0 <= int(label) < len(class_names):
            continue
        box = (
            int(max(0, x1 * side + region[0])),
            int(max(0, y1 * side + region[1])),
            int(min(width - 1, x2 * side + region[0])),
            int(min(height - 1, y2 * side + region[1])),
        )
        if box[0] >= width - 1 or box[1] >= height - 1:
            continue
        det = FrameDetection(class_names[int(label)], float(score), box, region)
        if det.score >= filters.get(det.label, FRIGATE_DEFAULT).min_score:  # areas, ratios: no limits
            out.append(det)
    return out


def _clipped(det: FrameDetection, frame_size: tuple[int, int]) -> bool:
    (x1, y1, x2, y2), (r1, s1, r2, s2), (width, height) = det.box, det.region, frame_size
    m = CLIPPED_MARGIN
    return (
        (r1 > m and x1 - r1 <= m)
        or (s1 > m and y1 - s1 <= m)
        or (width - r2 > m and r2 - x2 <= m)
        or (height - s2 > m and s2 - y2 <= m)
    )


def _pixels(box: Sequence[int]) -> int:
    """A box's area as Frigate's consolidation counts it: both edges' pixels included."""
    return (box[2] - box[0] + 1) * (box[3] - box[1] + 1)


def _nested(small: Sequence[int], large: Sequence[int], share: float) -> bool:
    """Frigate's consolidation test: `small` (at least 5 % of `large`'s pixels) lies more than `share`
    inside `large` (boxes touching at an edge share that edge's pixels)."""
    if _pixels(small) / _pixels(large) < CONSOLIDATION_MIN_AREA_RATIO:
        return False
    if small[2] < large[0] or small[0] > large[2] or small[1] > large[3] or small[3] < large[1]:
        return False
    inner = (
        max(small[0], large[0]),
        max(small[1], large[1]),
        min(small[2], large[2]),
        min(small[3], large[3]),
    )
    return _pixels(inner) / _pixels(small) > share


def reduce_detections(
    detections: Sequence[FrameDetection], frame_size: tuple[int, int]
) -> list[FrameDetection]:
    """Step 4: per class, OpenCV's NMS at score 0.5, then the consolidation of nested boxes."""
    groups: dict[str, list[FrameDetection]] = {}
    for det in detections:
        groups.setdefault(det.label, []).append(det)
    kept: list[FrameDetection] = []
    for label, group in groups.items():
        rects = [[d.box[0], d.box[1], d.box[2] - d.box[0], d.box[3] - d.box[1]] for d in group]
        confidences = [CLIPPED_SCORE if _clipped(d, frame_size) else d.score for d in group]
        iou = REDUCE_NMS_IOU.get(label, REDUCE_NMS_IOU_DEFAULT)
        chosen = np.asarray(cv2.dnn.NMSBoxes(rects, confidences, REDUCE_SCORE, iou), dtype=np.int64).reshape(
            -1
        )
        survivors = sorted((group[i] for i in chosen), key=lambda d: d.area)  # smallest first (w x h), stable
        share = CONSOLIDATION.get(label, CONSOLIDATION_DEFAULT)
        for i, det in enumerate(survivors):
            if not any(_nested(det.box, other.box, share) for other in survivors[i + 1 :]):
                kept.append(det)
    return kept


def reported(
    detections: Sequence[FrameDetection], filters: Mapping[str, ClassFilter]
) -> list[FrameDetection]:
    """Step 5 on a still image: the tracked objects that are true positives (score >= threshold)."""
    return [d for d in detections if d.score >= filters.get(d.label, FRIGATE_DEFAULT).threshold]


def still_image_region(image_size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The region a still image is detected in here (our choice, not Frigate's region logic): Frigate's
    regions are square, so the square of the image's longer side at its top-left corner, the part past
    the image black."""
    side = max(image_size)
    return (0, 0, side, side)


def region_tensor(
    image_rgb: np.ndarray, region: tuple[int, int, int, int], width: int, height: int
) -> np.ndarray:
    """What Frigate feeds with input_tensor nchw, input_pixel_format rgb, input_dtype float: the region
    (black past the image) resized to the model's width x height, [1, 3, H, W] float32 divided by 255."""
    side = region[2] - region[0]
    canvas = np.zeros((side, side, 3), np.uint8)
    crop = image_rgb[region[1] : region[3], region[0] : region[2]]
    canvas[: crop.shape[0], : crop.shape[1]] = crop
    resized = cv2.resize(canvas, (width, height))
    return (resized.transpose(2, 0, 1)[None] / 255.0).astype(np.float32)


def region_sizes(width: int, height: int) -> np.ndarray:
    """`orig_target_sizes` as Frigate sends it: int64 [[height, width]] of the model input."""
    return np.array([[height, width]], np.int64)


def frigate_objects(
    rows: np.ndarray,
    class_names: Sequence[str],
    image_size: tuple[int, int],
    filters: Mapping[str, ClassFilter],
) -> list[FrameDetection]:
    """Steps 2 to 5 on a still image (width, height) detected as `still_image_region`: the objects
    Frigate reports, from the detector's rows (`detector_rows`)."""
    region = still_image_region(image_size)
    found = frame_detections(rows, class_names, region, image_size, filters)
    return reported(reduce_detections(found, image_size), filters)
