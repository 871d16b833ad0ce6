"""Score thresholds per class: chosen on annotated images (by `dfine-export --data`), recorded per graph
and backend in model.json (`ArtifactInfo.thresholds`), and resolved against the user's own.

Why per class and per backend: classes differ in how confident a trained model is about them, and FP16
and INT8 move scores (an INT8 graph can move one score by 0.3), so a threshold tuned on one graph is off
on another. A detection counts as found when it has the label of an unmatched annotation at IoU >=
`MATCH_IOU`, taken in descending score order (the one-to-one rule of COCO and VOC).

    evidence = gather_evidence(detections, truth, num_classes)    # per image: (labels, boxes, scores)
    chosen = choose_thresholds(evidence)                           # {label: Choice}, F1-optimal
    chosen = choose_thresholds(evidence, target_precision=0.9)     # or the most recall at P >= 0.9

Chosen thresholds are kept in model.json under the artifact's class names and served by label
(`by_label`), so a model served with other names (`--names FILE`) keeps them.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from dfine_deploy.boxes import match_greedy
from dfine_deploy.class_names import name_key
from dfine_deploy.errors import BackendError

log = logging.getLogger(__name__)

DEFAULT_SCORE_THRESHOLD = 0.25  # one score for every class: dfine-serve's --score-threshold default
MATCH_IOU = 0.5
# A class with fewer annotated objects than this on the data keeps the default: a threshold chosen on
# two or three objects is noise.
MIN_INSTANCES = 5

# where an effective threshold comes from (`resolve_thresholds`)
YOURS, CHOSEN, DEFAULT = "yours", "chosen", "default"


@dataclass
class ClassEvidence:
    """Every detection of one class on the data: its score and whether it found an object."""

    scores: np.ndarray  # float64 [N], descending
    found: np.ndarray  # bool [N]
    instances: int  # annotated objects of the class

    def counts_above(self, threshold: float) -> tuple[int, int]:
        """(true positives, detections) kept by `score > threshold`."""
        kept = self.scores > threshold
        return int(self.found[kept].sum()), int(kept.sum())


@dataclass
class Choice:
    """One class's chosen threshold and what it reached on the data it was chosen on."""

    threshold: float
    precision: float
    recall: float
    f1: float
    instances: int
    # with a target precision the data never reached: the threshold of the highest precision it did
    # reach, and the record says so (a class short of the target is never served the most permissive)
    short_of_target: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(self).items()}


def gather_evidence(
    detections: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    truth: Sequence[tuple[np.ndarray, np.ndarray]],
    num_classes: int,
) -> list[ClassEvidence]:
    """Per class: every detection's score and whether it matched an annotation (same label, IoU >=
    MATCH_IOU, one detection per object, best scores first). `detections[i]` = (labels [K], boxes [K, 4]
    xyxy, scores [K]) and `truth[i]` = (labels [G], boxes [G, 4] xyxy) of the same image, in pixels."""
    scores: list[list[float]] = [[] for _ in range(num_classes)]
    found: list[list[bool]] = [[] for _ in range(num_classes)]
    instances = np.zeros(num_classes, dtype=np.int64)
    for (labels, boxes, det_scores), (true_labels, true_boxes) in zip(detections, truth):
        labels, det_scores = np.asarray(labels).reshape(-1), np.asarray(det_scores).reshape(-1)
        true_labels = np.asarray(true_labels, dtype=np.int64).reshape(-1)
        order = np.argsort(-det_scores, kind="stable")
        partner, _ = match_greedy(
            np.asarray(boxes, dtype=np.float64).reshape(-1, 4)[order],
            np.asarray(true_boxes, dtype=np.float64).reshape(-1, 4),
            MATCH_IOU,
            ref_labels=labels[order],
            cand_labels=true_labels,
        )
        for label, score, hit in zip(labels[order].tolist(), det_scores[order].tolist(), partner.tolist()):
            if 0 <= label < num_classes:
                scores[label].append(score)
                found[label].append(hit >= 0)
        for label in true_labels.tolist():
            if 0 <= label < num_classes:
                instances[label] += 1
    out = []
    for c in range(num_classes):
        s, f = np.asarray(scores[c], dtype=np.float64), np.asarray(found[c], dtype=bool)
        order = np.argsort(-s, kind="stable")
        out.append(ClassEvidence(s[order], f[order], int(instances[c])))
    return out


def precision_recall(evidence: ClassEvidence, threshold: float) -> tuple[float, float, float]:
    """(precision, recall, F1) of the detections kept by `score > threshold`; precision is 1 when none
    is kept."""
    hits, kept = evidence.counts_above(threshold)
    precision = hits / kept if kept else 1.0
    recall = hits / evidence.instances if evidence.instances else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def choose_threshold(evidence: ClassEvidence, target_precision: float | None = None) -> Choice | None:
    """The F1-optimal threshold of one class (or, with `target_precision`, the one keeping the most
    objects found at that precision or more; when no cut reaches it, the cut of the highest precision
    reached, most recall among equals, marked `short_of_target`); None when the data cannot tell
    (fewer than MIN_INSTANCES objects, or no object found). The threshold sits halfway between the
    last score kept and the next one, so that scores a little off the data's fall on the same side."""
    if evidence.instances < MIN_INSTANCES or not evidence.found.any():
        return None
    hits = np.cumsum(evidence.found)
    kept = np.arange(1, len(evidence.scores) + 1)
    precision, recall = hits / kept, hits / evidence.instances
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-12)
    # a cut only between two different scores: keeping one of two tied detections is not a threshold
    cuts = np.append(evidence.scores[1:] < evidence.scores[:-1], True)
    if target_precision is None:
        score = np.where(cuts, f1, -1.0)
    else:
        score = np.where(cuts & (precision >= target_precision), recall, -1.0)
    short = target_precision is not None and score.max() <= 0
    if short:  # the highest precision reached, then the most recall: never the most permissive cut
        highest = np.where(cuts & (hits > 0), precision, -1.0)
        score = np.where(highest == highest.max(), recall, -1.0)
    best = int(np.argmax(score))
    if score[best] <= 0:
        return None
    below = evidence.scores[best + 1] if best + 1 < len(evidence.scores) else 0.0
    threshold = float((evidence.scores[best] + below) / 2)
    return Choice(
        threshold,
        float(precision[best]),
        float(recall[best]),
        float(f1[best]),
        evidence.instances,
        short_of_target=bool(short),
    )


def choose_thresholds(
    evidence: Sequence[ClassEvidence], target_precision: float | None = None
) -> dict[int, Choice]:
    """`choose_threshold` for every class the data can tell about, by label."""
    chosen = {label: choose_threshold(e, target_precision) for label, e in enumerate(evidence)}
    return {label: choice for label, choice in chosen.items() if choice is not None}


def macro_f1(evidence: Sequence[ClassEvidence], thresholds: Sequence[float]) -> float:
    """Mean F1 over the classes with annotated objects, each at its own threshold."""
    f1 = [precision_recall(e, t)[2] for e, t in zip(evidence, thresholds) if e.instances]
    return float(np.mean(f1)) if f1 else 0.0


def objective(precision: float, recall: float, f1: float, target_precision: float | None) -> float:
    """What a threshold is judged by: F1, or with a target precision the recall where it is reached
    (below it: precision - 1, negative and higher the nearer the target)."""
    if target_precision is None:
        return f1
    return recall if precision >= target_precision else precision - 1.0


def split_halves(count: int) -> tuple[list[int], list[int]]:
    """(selection, held-out) positions of `count` images: even and odd positions, so that both halves
    span the data's order."""
    return list(range(0, count, 2)), list(range(1, count, 2))


def held_out_verdicts(
    selection: Sequence[ClassEvidence],
    held: Sequence[ClassEvidence],
    class_names: Sequence[str],
    target_precision: float | None,
    default: float = DEFAULT_SCORE_THRESHOLD,
) -> dict[str, dict[str, Any]]:
    """Per class: the threshold chosen on the `selection` half of the data, judged on the `held` half
    against `default` by `objective`; `kept` only where it does better there. For a consumer that
    applies one threshold per class and nothing else to the graph's detections (DeepStream's parser
    with cluster-mode=4): it writes a class's threshold only where it generalises."""
    verdicts = {}
    for label, name in enumerate(class_names):
        choice = choose_threshold(selection[label], target_precision)
        if choice is None:
            reason = f"{selection[label].instances} annotated on the selection half: nothing to choose on"
            verdicts[name] = {"threshold": None, "kept": False, "reason": reason}
            continue
        mine = precision_recall(held[label], choice.threshold)
        theirs = precision_recall(held[label], default)
        if held[label].instances < MIN_INSTANCES:
            kept, reason = False, f"{held[label].instances} annotated on the held-out half: too few to judge"
        elif objective(*mine, target_precision) > objective(*theirs, target_precision):
            kept, reason = True, "beats the default on the held-out half"
        else:
            kept, reason = False, "does not beat the default on the held-out half"
        verdicts[name] = {
            "threshold": round(choice.threshold, 4),
            "f1": round(mine[2], 4),
            "default_f1": round(theirs[2], 4),
            "kept": kept,
            "reason": reason,
        }
    return verdicts


def threshold_record(
    evidence: Sequence[ClassEvidence],
    class_names: Sequence[str],
    *,
    target_precision: float | None,
    images: int,
    halves: tuple[Sequence[ClassEvidence], Sequence[ClassEvidence]] | None = None,
) -> dict[str, Any]:
    """model.json's `thresholds` entry of one graph on one backend: how they were chosen, and per class
    that the data could tell about, the threshold with its precision, recall and F1 there. With
    `halves` (the evidence of the selection and the held-out half), also `held_out_verdicts`."""
    chosen = choose_thresholds(evidence, target_precision)
    if target_precision is not None:
        for label, e in enumerate(evidence):
            choice = chosen.get(label)
            if choice is None and e.instances:
                log.warning(
                    "class %s: %d annotated object(s), %d found: too few to choose a threshold for "
                    "precision >= %g; it is served at %g unless you give one (--class-threshold)",
                    class_names[label],
                    e.instances,
                    int(e.found.sum()),
                    target_precision,
                    DEFAULT_SCORE_THRESHOLD,
                )
            elif choice is not None and choice.short_of_target:
                log.warning(
                    "class %s: precision %g is not reached on the data; its highest, %.3f (recall %.3f), "
                    "is kept at threshold %.3f (model.json marks it short_of_target)",
                    class_names[label],
                    target_precision,
                    choice.precision,
                    choice.recall,
                    choice.threshold,
                )
    record = {
        "rule": "f1" if target_precision is None else f"precision>={target_precision:g}",
        "images": images,
        "iou": MATCH_IOU,
        "classes": {class_names[label]: choice.to_dict() for label, choice in sorted(chosen.items())},
    }
    if halves is not None:
        record["held_out"] = {
            "default": DEFAULT_SCORE_THRESHOLD,
            "classes": held_out_verdicts(*halves, class_names, target_precision),
        }
    return record


def check_record(record: Any, class_names: Sequence[str], where: str, source: str) -> None:
    """Refuse a `thresholds` entry whose classes are not the model's or whose thresholds are not in
    [0, 1] (one line naming the entry)."""
    classes = record.get("classes") if isinstance(record, dict) else None
    if not isinstance(classes, dict):
        raise BackendError(f"{source}: {where} must hold a 'classes' object; re-export the model")
    known = {name_key(n) for n in class_names}
    for name, entry in classes.items():
        value = entry.get("threshold") if isinstance(entry, dict) else None
        if name_key(name) not in known or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise BackendError(
                f"{source}: {where}.classes.{name}: not a class of the model with a numeric threshold; "
                "re-export the model"
            )
        if not 0.0 <= value <= 1.0:
            raise BackendError(f"{source}: {where}.classes.{name}.threshold {value!r} is not in [0, 1]")


def chosen_of(record: Mapping[str, Any] | None) -> dict[str, float]:
    """{class name: threshold} of a `thresholds` entry (None: no entry)."""
    return {name: float(e["threshold"]) for name, e in ((record or {}).get("classes") or {}).items()}


def by_label(chosen: Mapping[str, float], class_names: Sequence[str]) -> dict[int, float]:
    """{label: threshold} of {class name: threshold} keyed by `class_names` (those the thresholds were
    chosen and recorded under): what is served whatever names the model is shown with."""
    labels = {name_key(name): label for label, name in enumerate(class_names)}
    return {labels[name_key(name)]: value for name, value in chosen.items() if name_key(name) in labels}


@dataclass
class ClassThresholds:
    """The score each class must pass, and where each came from (YOURS, CHOSEN or DEFAULT)."""

    values: np.ndarray  # float32 [C]
    sources: list[str]
    chosen: dict[int, float]  # the export's by label, shown beside yours even where yours win

    def in_force(self, class_names: Sequence[str]) -> dict[str, dict[str, Any]]:
        """{class name: {"threshold", "source"}}: each class's threshold as it is compared (float32,
        written with the fewest digits that give it back: no rounding) and where it came from."""
        return {
            name: {"threshold": float(np.format_float_positional(np.float32(v), unique=True)), "source": src}
            for name, v, src in zip(class_names, self.values.tolist(), self.sources)
        }

    def table(self, class_names: Sequence[str]) -> list[dict[str, Any]]:
        """One row per class: its threshold, where it came from, and the chosen one."""
        return [
            {"class": name, "threshold": round(float(v), 4), "source": src, "chosen": self.chosen.get(label)}
            for label, (name, v, src) in enumerate(zip(class_names, self.values.tolist(), self.sources))
        ]


def resolve_thresholds(
    class_names: Sequence[str],
    chosen: Mapping[int, float],
    yours: Mapping[str, float] | None = None,
    default: float | None = None,
) -> ClassThresholds:
    """Each class's threshold: yours (`yours` by class name as served, then `default` when you gave one)
    win over the chosen one (`chosen` by label, see `by_label`), which wins over DEFAULT_SCORE_THRESHOLD.
    A name in `yours` the model does not have is refused in one line."""
    yours = {name_key(name): value for name, value in (yours or {}).items()}
    unknown = sorted(set(yours) - {name_key(n) for n in class_names})
    if unknown:
        raise BackendError(
            f"class threshold for {unknown[0]!r}: the model has no such class; its classes are "
            + ", ".join(list(class_names)[:12])
            + (" ..." if len(class_names) > 12 else "")
        )
    values, sources = [], []
    for label, name in enumerate(class_names):
        if name_key(name) in yours:
            values.append(yours[name_key(name)])
            sources.append(YOURS)
        elif default is not None:
            values.append(default)
            sources.append(YOURS)
        elif label in chosen:
            values.append(chosen[label])
            sources.append(CHOSEN)
        else:
            values.append(DEFAULT_SCORE_THRESHOLD)
            sources.append(DEFAULT)
    return ClassThresholds(np.asarray(values, dtype=np.float32), sources, dict(chosen))
