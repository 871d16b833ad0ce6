"""Frigate's per-class filters (`objects.filters.<label>.min_score` and `threshold`), chosen on what
Frigate does with the graph's outputs and kept only where they beat Frigate's defaults on held-out images.

Thresholds chosen on our runtime's detections are the wrong ones for Frigate: its detector first runs
NMS across classes on misread boxes and keeps 20 rows, and its own filters drop every score of 0.5 or
less (`frigate_post`). So here the FP32 graph is run as Frigate feeds it on the annotated images of
`--data`, the images are split in two by position (even: selection, odd: held-out), and per class:

1. on the selection half, every `min_score` = `threshold` = t of `GRID` (0.50 to 0.99) goes through Frigate's
   post-processing (`frigate_post.frigate_objects`) and the t with the best objective (F1 of the objects
   Frigate reports, or with `--threshold-target P` the most recall at precision >= P) is chosen, the
   middle of the best run of equal values;
2. on the held-out half the chosen t and Frigate's defaults (min_score 0.5, threshold 0.7) go through
   the same post-processing; the class gets its t in `frigate.yml` only when its objective there beats
   the defaults'; otherwise it keeps Frigate's defaults, and the file says why with the figures.

A class's filters act on that class only inside Frigate (`frigate_post`), so the classes are chosen and
judged one by one.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dfine_deploy.boxes import average_precision
from dfine_deploy.export import frigate_post as fp
from dfine_deploy.thresholds import MATCH_IOU, MIN_INSTANCES, gather_evidence, objective, split_halves

log = logging.getLogger(__name__)

# min_score = threshold tried: 0.50 .. 0.99. Lower values act as 0.5 on a still image (reduce_detections
# drops scores of 0.5 or less unless a box touches an inner region edge), so none is written.
GRID = tuple(round(0.01 * i, 2) for i in range(50, 100))


@dataclass(frozen=True)
class FrigateImage:
    """One annotated still image as Frigate's detector saw it."""

    rows: np.ndarray  # frigate_post.detector_rows: [20, 6]
    size: tuple[int, int]  # width, height
    truth: tuple[np.ndarray, np.ndarray]  # labels [G], boxes [G, 4] xyxy px


@dataclass(frozen=True)
class Outcome:
    """What Frigate reports of one class on a set of images: objects found (right class, IoU >=
    MATCH_IOU, one detection each), objects reported, objects annotated."""

    found: int
    reported: int
    instances: int

    @property
    def precision(self) -> float:
        return self.found / self.reported if self.reported else 1.0

    @property
    def recall(self) -> float:
        return self.found / self.instances if self.instances else 0.0

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r else 0.0

    def objective(self, target_precision: float | None) -> float:
        return objective(self.precision, self.recall, self.f1, target_precision)

    def describe(self) -> str:
        return f"F1 {self.f1:.3f}, found {self.found} of {self.instances}, reported {self.reported}"


@dataclass
class ClassVerdict:
    """One class: the threshold chosen on the selection half (None: too little evidence there), its
    outcomes on the held-out half beside the defaults', and whether it is written."""

    name: str
    chosen: float | None
    selection: Outcome | None
    held_chosen: Outcome | None
    held_default: Outcome
    written: bool
    reason: str


@dataclass
class FrigateChoice:
    """The verdict on Frigate's filters for one artifact, with the held-out figures."""

    rule: str
    images: tuple[int, int]  # selection, held-out
    classes: list[ClassVerdict]
    ap50: dict[str, float] = field(default_factory=dict)  # held-out AP50 (0..1): "default", "written"
    found: dict[str, int] = field(default_factory=dict)  # held-out objects found, same keys
    instances: int = 0  # held-out annotated objects

    @property
    def filters(self) -> dict[str, fp.ClassFilter]:
        """The filters frigate.yml writes: the classes whose chosen threshold beat the defaults."""
        return {v.name: fp.ClassFilter(v.chosen, v.chosen) for v in self.classes if v.written and v.chosen}

    def comment_lines(self) -> list[str]:
        """frigate.yml's comment lines saying what was measured and why each class is as written."""
        d, (chosen_on, held) = fp.FRIGATE_DEFAULT, self.images
        lines = [
            "objects.filters: measured inside Frigate's own post-processing (docs/frigate.md). Per class,",
            f"min_score = threshold is chosen ({self.rule}) on {chosen_on} images of --data and written only",
            f"where it beats Frigate's defaults (min_score {d.min_score}, threshold {d.threshold}) on the "
            f"other {held}.",
            f"Held-out: AP50 {self.ap50['written']:.3f}, {self.found['written']} of {self.instances} objects "
            f"found as written; AP50 {self.ap50['default']:.3f}, {self.found['default']} found at the "
            "defaults.",
        ]
        if not self.instances:
            lines[-1] = "Held-out: no annotated object there to judge on."
        if not self.filters:
            lines.append("No class beat the defaults there: Frigate's defaults stay (no filters written).")
        for v in self.classes:
            if v.chosen is None or v.selection is None or v.held_chosen is None:
                lines.append(f"  {v.name}: defaults kept: {v.reason}.")
                continue
            verdict = "written" if v.written else "defaults kept"
            lines += [
                f"  {v.name}: {verdict}, {v.reason}: {v.chosen:.2f} chosen ({v.selection.describe()});",
                f"    held-out {v.held_chosen.describe()}; at the defaults {v.held_default.describe()}.",
            ]
        return lines


def detector_views(
    model: str | Path,
    images: Sequence[np.ndarray],
    truth: Sequence[tuple[np.ndarray, np.ndarray]],
    width: int,
    height: int,
) -> list[FrigateImage]:
    """Run the ONNX graph `model` on onnxruntime's CPU provider as Frigate's onnx detector feeds it
    (`frigate_post.region_tensor`, `region_sizes`) on each RGB image; keep its detector rows."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    views = []
    for image, annotated in zip(images, truth):
        size = (int(image.shape[1]), int(image.shape[0]))
        region = fp.still_image_region(size)
        feed = {
            "images": fp.region_tensor(image, region, width, height),
            "orig_target_sizes": fp.region_sizes(width, height),
        }
        labels, boxes, scores = session.run(None, feed)[:3]
        views.append(FrigateImage(fp.detector_rows(labels, boxes, scores, width, height), size, annotated))
    return views


def reported_detections(
    views: Sequence[FrigateImage], class_names: Sequence[str], filters: dict[str, fp.ClassFilter]
) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per image, the objects Frigate reports under `filters` as (labels, boxes xyxy px, scores)."""
    index = {name: label for label, name in enumerate(class_names)}
    out = []
    for view in views:
        objects = fp.frigate_objects(view.rows, class_names, view.size, filters)
        out.append(
            (
                np.array([index[o.label] for o in objects], np.int64),
                np.array([o.box for o in objects], np.float64).reshape(-1, 4),
                np.array([o.score for o in objects], np.float64),
            )
        )
    return out


def outcomes(
    views: Sequence[FrigateImage], class_names: Sequence[str], filters: dict[str, fp.ClassFilter]
) -> tuple[list[Outcome], float]:
    """Per class, what Frigate reports under `filters` on `views`; and the AP50 (0..1) of all it reports."""
    detections = reported_detections(views, class_names, filters)
    truth = [v.truth for v in views]
    evidence = gather_evidence(detections, truth, len(class_names))
    per_class = [Outcome(int(e.found.sum()), len(e.scores), e.instances) for e in evidence]
    ap50 = average_precision(
        [(np.asarray(lb, np.int64), np.asarray(bx, np.float64).reshape(-1, 4)) for lb, bx in truth],
        detections,
        (MATCH_IOU,),
    )
    return per_class, ap50 / 100.0


def _middle_of_best(values: Sequence[float]) -> int:
    """The index in the middle of the first run of the highest value."""
    best = max(values)
    first = values.index(best)
    last = first
    while last + 1 < len(values) and values[last + 1] == best:
        last += 1
    return (first + last) // 2


def choose_filters(
    views: Sequence[FrigateImage], class_names: Sequence[str], target_precision: float | None = None
) -> FrigateChoice:
    """Choose on the selection half, judge on the held-out half (module docstring)."""
    selection_at, held_at = split_halves(len(views))
    selection, held = [views[i] for i in selection_at], [views[i] for i in held_at]
    defaults = dict.fromkeys(class_names, fp.FRIGATE_DEFAULT)
    by_t = [outcomes(selection, class_names, {n: fp.ClassFilter(t, t) for n in class_names})[0] for t in GRID]
    held_default, ap_default = outcomes(held, class_names, defaults)
    candidates: dict[str, float] = {}
    verdicts = []
    for label, name in enumerate(class_names):
        at_grid = [row[label] for row in by_t]
        if at_grid[0].instances < MIN_INSTANCES or not any(o.found for o in at_grid):
            found = max(o.found for o in at_grid)
            reason = (
                f"{at_grid[0].instances} annotated, {found} found on the selection half "
                f"(needs {MIN_INSTANCES} and one found)"
            )
            verdicts.append(ClassVerdict(name, None, None, None, held_default[label], False, reason))
            continue
        best = _middle_of_best([o.objective(target_precision) for o in at_grid])
        candidates[name] = GRID[best]
        verdicts.append(ClassVerdict(name, GRID[best], at_grid[best], None, held_default[label], False, ""))
    held_chosen, _ = outcomes(
        held, class_names, {**defaults, **{n: fp.ClassFilter(t, t) for n, t in candidates.items()}}
    )
    for label, verdict in enumerate(verdicts):
        if verdict.chosen is None:
            continue
        verdict.held_chosen = held_chosen[label]
        mine, theirs = (
            held_chosen[label].objective(target_precision),
            held_default[label].objective(target_precision),
        )
        if held_default[label].instances < MIN_INSTANCES:
            verdict.reason = (
                f"{held_default[label].instances} annotated on the held-out half: too few to judge"
            )
        elif mine > theirs:
            verdict.written, verdict.reason = True, "beats the defaults on the held-out half"
        else:
            verdict.reason = "does not beat the defaults on the held-out half"
    choice = FrigateChoice(
        rule="f1" if target_precision is None else f"precision>={target_precision:g}",
        images=(len(selection), len(held)),
        classes=verdicts,
    )
    written, ap_written = outcomes(held, class_names, {**defaults, **choice.filters})
    choice.ap50 = {"default": ap_default, "written": ap_written}
    choice.found = {"default": sum(o.found for o in held_default), "written": sum(o.found for o in written)}
    choice.instances = sum(o.instances for o in held_default)
    return choice
