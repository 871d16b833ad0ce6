"""The parity gate: does an exported graph detect what its reference detects?

A candidate (ONNX Runtime on the FP32 graph, the typed FP16 graph, an engine) and a reference
(PyTorch, or the FP32 graph for the FP16 one) run on the same real-looking images at several batch
sizes. The gate then compares, per image:

  * raw tensors: max / mean absolute differences of scores and boxes (reported; scores gated);
  * boxes: every top-k reference detection must have a candidate detection of the same label with
    IoU >= `match_iou` (0.9): "box agreement";
  * labels: the same, with a loose IoU (0.5), so a label flip is told apart from a box drift;
  * pseudo-mAP: COCO-style AP (IoU 0.50:0.95) of the candidate, scored against the reference's top-k
    detections taken as ground truth (100 = the same detections); and real mAP against a dataset's
    annotations when one is given.

Why scores alone are not enough: TensorRT's mis-compiled deformable attention keeps the top-300
scores almost identical (score cosine above 0.99) while the boxes move by tens of pixels and COCO AP
drops by 10-18 points (NVIDIA/TensorRT#4813). Only a box comparison catches that, so the gate always
matches boxes. Nothing here needs torch: references are plain callables returning numpy arrays.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Tuple

import numpy as np

from dfine_deploy import cpu
from dfine_deploy.boxes import average_precision, box_iou, match_greedy
from dfine_deploy.errors import DatasetError, ParityError
from dfine_deploy.images import IMAGE_SUFFIXES, read_image

# (images float32 [B,3,H,W], orig_target_sizes int64 [B,2]) -> (labels [B,K], boxes [B,K,4], scores [B,K])
# (typing's spellings: dfine-verify imports this module on the runtime side, Python 3.8)
Runner = Callable[[np.ndarray, np.ndarray], Tuple[np.ndarray, np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class GateThresholds:
    """What a candidate must reach to pass; one preset per kind of comparison."""

    # bound on the 99th percentile of |score_ref - score_cand| over the sorted top-K scores of every
    # image: a systematic score change fails, one sensitive detection (a trained model near its
    # decision boundary can move one score by 0.3 in INT8 with every box and the mAP kept) does not
    score_p99_abs: float
    box_agreement: float  # fraction of reference top-k detections matched at match_iou, same label
    label_agreement: float  # the same at IoU >= 0.5
    pseudo_ap: float  # minimum pseudo-mAP (0..100)
    top_k: int = 20  # reference detections per image that are compared
    match_iou: float = 0.9
    max_ap_drop: float = 0.5  # allowed mAP drop (points) against annotations, when a dataset is given
    # bound on the box precision (found detections, low-scoring ones too, at IoU >= match_iou);
    # None: the same as box_agreement
    box_precision: float | None = None


# ORT against PyTorch: the same arithmetic up to operator order, so almost exact.
FP32_GATE = GateThresholds(score_p99_abs=2e-3, box_agreement=0.98, label_agreement=0.98, pseudo_ap=95.0)
# The typed FP16 graph against the FP32 graph: half-precision rounding in the backbone and encoder.
FP16_GATE = GateThresholds(
    score_p99_abs=5e-2, box_agreement=0.90, label_agreement=0.95, pseudo_ap=85.0, max_ap_drop=0.5
)
# The INT8 QDQ graph against its FP32 graph: 8-bit activations move scores and boxes more than FP16;
# what must hold is that the same objects are found in the same places and mAP stays within 1 point.
# The low-scoring detections of the top-20 move most, so box precision over all found ones has its
# own bound: on the suite's trained model (avx512-vnni EPYC, OpenVINO) onnxruntime's INT8 graph kept
# AP 56.15 -> 55.89 and 99.6 % of the decisive boxes at IoU 0.9, with a box precision of 89.9 % on 80
# images and 80.6 % on the reference pack's 16; NNCF's graphs that lost 25-30 AP there had 11-20 %.
INT8_GATE = GateThresholds(
    score_p99_abs=0.15,
    box_agreement=0.85,
    label_agreement=0.90,
    pseudo_ap=75.0,
    max_ap_drop=1.0,
    box_precision=0.75,
)

# OpenVINO running the FP32 CPU graph under its bf16 hint, against PyTorch. BF16 keeps 8 mantissa bits
# to FP16's 11 and OpenVINO keeps no FP32 islands, so scores move more than in the FP16 gate: on the
# trained quickstart model (D-FINE-N, 256 px, its 80 val images) scores moved up to 0.046 with every
# box found at IoU 0.9 and AP 23.77 vs 24.13; the score bound is twice that. Boxes, labels and mAP
# are held to the FP16 gate's bounds: BF16 must find the same objects in the same places.
BF16_GATE = GateThresholds(
    score_p99_abs=0.1, box_agreement=0.90, label_agreement=0.95, pseudo_ap=85.0, max_ap_drop=0.5
)

# The gate of each precision a graph or engine runs in against PyTorch's detections (dfine-verify on
# the device holds an engine of that precision to the same bounds as its graph at export).
PRECISION_GATES = {"fp32": FP32_GATE, "fp16": FP16_GATE, "int8": INT8_GATE, "bf16": BF16_GATE}


RANK_STABILITY = 20.0  # pseudo-mAP is gated when the reference's top-k spread > this x score noise
# A reference whose top-k scores all lie within this of each image's best ranks nothing: a model still
# at its class prior (one trained for an epoch scores every query 0.0121 +- 1e-8) is compared as random
# weights are (`run_gate`'s rank_free), since rounding alone decides which queries make its top-k.
RANKLESS_SPREAD = 1e-3


@dataclass
class ParityBatch:
    images: np.ndarray  # [B, 3, H, W] float32 RGB in [0, 1]
    orig_sizes: np.ndarray  # [B, 2] int64 (w, h)
    image_ids: list[int] = field(default_factory=list)


@dataclass
class ParityReport:
    """What the gate measured; `asdict` of it goes into the sidecar."""

    reference: str
    candidate: str
    passed: bool
    failures: list[str]
    batch_sizes: list[int]
    images: int
    score_max_abs: float
    score_p99_abs: float  # what the gate bounds (GateThresholds.score_p99_abs)
    score_mean_abs: float
    score_noise: float  # largest score change of one detection between the two (tight matches)
    box_max_abs: float  # position-wise, over the top-k; informative only (ties may reorder)
    box_mean_abs: float
    matched_box_max_abs: float  # between matched detections (pixels)
    decisive: int  # reference detections that must be found (see compare_outputs)
    box_agreement: float  # decisive ones found with the same label at IoU >= match_iou
    label_agreement: float  # decisive ones found with the same label at IoU >= 0.5
    box_precision: float  # found ones (same label, IoU >= 0.5) whose IoU >= match_iou
    pseudo_ap: float
    reference_score_spread: float  # mean (top-1 - top-k) reference score per image
    pseudo_ap_gated: bool  # False when the reference's ranking is too close to ties to be stable
    rank_free: bool  # random weights: only box precision and score noise are gated (see run_gate)
    thresholds: dict[str, float]
    dataset_ap: dict[str, float] = field(default_factory=dict)  # reference/candidate AP vs annotations
    isa: str = field(default_factory=cpu.isa_class)  # the CPU class it ran on (INT8/BF16 depend on it)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        return (
            f"{self.candidate} vs {self.reference}: score |d| p99 {self.score_p99_abs:.2e} "
            f"(max {self.score_max_abs:.2e}), "
            f"box agreement {self.box_agreement:.3f} / label agreement {self.label_agreement:.3f} "
            f"over {self.decisive} decisive detections, box precision {self.box_precision:.3f}, "
            f"pseudo-mAP {self.pseudo_ap:.1f}"
            + ("" if self.pseudo_ap_gated else " (not gated: near-tied scores)")
            + (
                f", AP {self.dataset_ap['candidate']:.2f} vs {self.dataset_ap['reference']:.2f}"
                if self.dataset_ap
                else ""
            )
            + (" [the reference ranks nothing: rank-free gate]" if self.rank_free else "")
            + (" -> PASS" if self.passed else " -> FAIL: " + "; ".join(self.failures))
        )


# ----------------------------------------------------------------------------------------------
# Inputs


def synthetic_scenes(count: int, seed: int = 0) -> list[np.ndarray]:
    """Deterministic RGB uint8 images that look like scenes: gradients, textures, shapes.

    Random noise would push a detector into a regime no real input reaches; these have edges,
    flat regions and objects of many sizes, and several aspect ratios so box scaling is exercised.
    """
    import cv2

    rng = np.random.default_rng(seed)
    sizes = [(640, 480), (480, 640), (800, 450), (512, 512), (1280, 720), (300, 400)]
    images = []
    for i in range(count):
        w, h = sizes[i % len(sizes)]
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
        base = rng.uniform(40, 200, size=3)
        slope = rng.uniform(-0.15, 0.15, size=(3, 2))
        img = np.stack([base[c] + slope[c, 0] * xx + slope[c, 1] * yy for c in range(3)], -1)
        img += rng.normal(0, 6, size=img.shape)
        img = np.clip(img, 0, 255).astype(np.uint8)
        for _ in range(int(rng.integers(3, 9))):
            color = tuple(int(v) for v in rng.integers(0, 256, size=3))
            cx, cy = int(rng.integers(0, w)), int(rng.integers(0, h))
            bw, bh = int(rng.integers(w // 16, w // 2)), int(rng.integers(h // 16, h // 2))
            if rng.random() < 0.5:
                cv2.rectangle(img, (cx - bw // 2, cy - bh // 2), (cx + bw // 2, cy + bh // 2), color, -1)
            else:
                cv2.ellipse(img, (cx, cy), (bw // 2, bh // 2), float(rng.uniform(0, 180)), 0, 360, color, -1)
            if rng.random() < 0.4:  # stripes: texture the network has to resolve
                for x in range(cx - bw // 2, cx + bw // 2, 6):
                    cv2.line(img, (x, cy - bh // 2), (x, cy + bh // 2), (255 - color[0], 128, color[2]), 1)
        images.append(img)
    return images


def load_folder_images(folder: str | Path, count: int) -> list[np.ndarray]:
    """Up to `count` RGB images from a folder (searched recursively, sorted, so runs repeat), read as
    every stage reads them (dfine_deploy.images)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DatasetError(f"--data {folder}: not a folder; give a folder of validation images")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)[:count]
    if not files:
        raise DatasetError(
            f"--data {folder}: no images ({', '.join(IMAGE_SUFFIXES)}) found; "
            "give the folder of validation images (e.g. val2017)"
        )
    return [read_image(path) for path in files]


def make_batches(
    images: Sequence[np.ndarray], height: int, width: int, batch_sizes: Sequence[int] = (1, 2, 4)
) -> list[ParityBatch]:
    """Resize (plain resize, as D-FINE is trained, by the runtime's own `resize_batch`) and group the
    RGB images into batches of the given sizes."""
    from dfine_deploy.runtime.preprocess import resize_batch

    batches, start = [], 0
    for bs in batch_sizes:
        chunk = images[start : start + bs]
        if len(chunk) < bs:
            break
        batch, sizes = resize_batch(chunk, (height, width), color="RGB")  # [B, 3, H, W], [B, 2] (w, h)
        batches.append(ParityBatch(batch, sizes, list(range(start, start + bs))))
        start += bs
    return batches


# ----------------------------------------------------------------------------------------------
# The gate


def _top_k(labels: np.ndarray, boxes: np.ndarray, scores: np.ndarray, k: int):
    order = np.argsort(-scores, kind="stable")[:k]
    return labels[order], boxes[order], scores[order]


def compare_outputs(
    reference: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    candidate: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]],
    thresholds: GateThresholds,
    *,
    reference_name: str = "reference",
    candidate_name: str = "candidate",
    batch_sizes: Sequence[int] = (),
    rank_free: bool = False,
) -> ParityReport:
    """Compare per-batch outputs (labels [B,K], boxes [B,K,4], scores [B,K]) of two runners.

    The outputs are top-K lists, so a reference detection whose score is within the measured
    score noise of the candidate's K-th score may legitimately fall out of the candidate's list.
    Only *decisive* reference detections (score above the candidate's cut-off by twice the noise)
    must be found; every detection that is found must still have the same box (box precision).
    """
    images = []
    for (rl, rb, rs), (cl, cb, cs) in zip(reference, candidate):
        if rl.shape != cl.shape or rb.shape != cb.shape or rs.shape != cs.shape:
            raise ParityError(
                f"{candidate_name}: output shapes differ from {reference_name}: labels {cl.shape} vs "
                f"{rl.shape}, boxes {cb.shape} vs {rb.shape}, scores {cs.shape} vs {rs.shape}"
            )
        images += [(rl[i], rb[i], rs[i], cl[i], cb[i], cs[i]) for i in range(rl.shape[0])]
    k = min(thresholds.top_k, images[0][2].shape[0]) if images else 0

    # Pass 1: the per-detection score noise. A reference detection's twin is, among the candidates of
    # the same label at IoU >= match_iou, the one of nearest score: a trained model often puts
    # near-duplicate boxes of lower score on one object, and pairing with one of those (by IoU
    # alone) would read their score gap as noise and leave no detection decisive.
    per_image, noise = [], 0.0
    for rl, rb, rs, cl, cb, cs in images:
        r_lab, r_box, r_sc = _top_k(rl, rb, rs, k)
        loose, loose_iou = match_greedy(r_box, cb, 0.5, ref_labels=r_lab, cand_labels=cl)
        tight, _ = match_greedy(r_box, cb, thresholds.match_iou, ref_labels=r_lab, cand_labels=cl)
        if len(r_box) and len(cb):
            twins = (box_iou(r_box, cb) >= thresholds.match_iou) & (r_lab[:, None] == cl[None, :])
            gaps = np.where(twins, np.abs(r_sc[:, None] - cs[None, :]), np.inf).min(1)  # [k]
            if np.isfinite(gaps).any():
                noise = max(noise, float(gaps[np.isfinite(gaps)].max()))
        per_image.append((r_lab, r_box, r_sc, loose, loose_iou, tight))

    # Pass 2: agreement over decisive detections; box precision over every found detection.
    # When the candidate's score noise is so large that no reference detection is decisive, every
    # compared one must be found: an agreement over nothing (NaN) would let any boxes through.
    cut_offs = [r_sc > float(cs.min()) + 2.0 * noise for (*_, cs), (_, _, r_sc, *_) in zip(images, per_image)]
    if not any(decisive.any() for decisive in cut_offs):
        cut_offs = [np.ones_like(decisive) for decisive in cut_offs]
    score_diffs, box_diffs, matched_diffs, spreads, gt, dets = [], [], [], [], [], []
    n_decisive = n_box = n_label = n_found = n_precise = 0
    for (_, _, rs, cl, cb, cs), (r_lab, r_box, r_sc, loose, loose_iou, tight), decisive in zip(
        images, per_image, cut_offs
    ):
        # Sorted scores are comparable position by position even when near-ties reorder queries.
        score_diffs.append(np.abs(np.sort(rs)[::-1] - np.sort(cs)[::-1]))
        spreads.append(float(r_sc[0] - r_sc[-1]))
        c_lab, c_box, c_sc = _top_k(cl, cb, cs, k)
        box_diffs.append(np.abs(r_box - c_box).ravel())
        n_decisive += int(decisive.sum())
        n_box += sum(bool(d) and m >= 0 for d, m in zip(decisive, tight))
        n_label += sum(bool(d) and m >= 0 for d, m in zip(decisive, loose))
        for row, m in enumerate(loose):
            if m >= 0:
                n_found += 1
                n_precise += int(loose_iou[row] >= thresholds.match_iou)
                matched_diffs.append(float(np.abs(r_box[row] - cb[m]).max()))
        gt.append((r_lab, r_box))
        # The candidate's own top-k: identical outputs then score 100 (lower-ranked extras of
        # one image would otherwise count as false positives against another image's GT).
        dets.append((c_lab, c_box, c_sc))
    score_all = np.concatenate(score_diffs) if score_diffs else np.zeros(1)
    box_all = np.concatenate(box_diffs) if box_diffs else np.zeros(1)
    spread = float(np.mean(spreads)) if spreads else 0.0
    report = ParityReport(
        reference=reference_name,
        candidate=candidate_name,
        passed=True,
        failures=[],
        batch_sizes=list(batch_sizes),
        images=len(gt),
        score_max_abs=float(score_all.max()),
        score_p99_abs=float(np.percentile(score_all, 99)),
        score_mean_abs=float(score_all.mean()),
        score_noise=noise,
        box_max_abs=float(box_all.max()),
        box_mean_abs=float(box_all.mean()),
        matched_box_max_abs=max(matched_diffs) if matched_diffs else math.nan,
        decisive=n_decisive,
        box_agreement=n_box / n_decisive if n_decisive else math.nan,
        label_agreement=n_label / n_decisive if n_decisive else math.nan,
        box_precision=n_precise / n_found if n_found else 0.0,
        pseudo_ap=average_precision(gt, dets),
        reference_score_spread=spread,
        # A ranking metric only means something when the reference ranks decisively: with random
        # weights all scores sit near the prior (~0.01) and rounding alone reorders the top-k.
        pseudo_ap_gated=not rank_free and spread > RANK_STABILITY * float(score_all.max()),
        rank_free=rank_free,
        thresholds=asdict(thresholds),
    )
    _judge(report, thresholds)
    return report


def _judge(report: ParityReport, t: GateThresholds) -> None:
    failures = []
    if not report.score_p99_abs <= t.score_p99_abs:  # written so NaN fails
        failures.append(
            f"scores differ by {report.score_p99_abs:.3g} at the 99th percentile "
            f"(allowed {t.score_p99_abs:g})"
        )
    must_find = report.decisive and not report.rank_free
    if must_find and not report.box_agreement >= t.box_agreement:
        failures.append(
            f"only {report.box_agreement:.1%} of the top-{t.top_k} reference boxes have a same-label "
            f"candidate box with IoU >= {t.match_iou} (needed {t.box_agreement:.0%})"
        )
    precision_bound = t.box_agreement if t.box_precision is None else t.box_precision
    if not report.box_precision >= precision_bound:
        failures.append(
            f"only {report.box_precision:.1%} of the detections found in both have boxes with IoU >= "
            f"{t.match_iou} (needed {precision_bound:.0%})"
        )
    if must_find and not report.label_agreement >= t.label_agreement:
        failures.append(
            f"labels agree for {report.label_agreement:.1%} of the top-{t.top_k} detections "
            f"(needed {t.label_agreement:.0%})"
        )
    if report.pseudo_ap_gated and not report.pseudo_ap >= t.pseudo_ap:
        failures.append(
            f"pseudo-mAP against the reference is {report.pseudo_ap:.1f} (needed {t.pseudo_ap:g})"
        )
    if report.dataset_ap:
        drop = report.dataset_ap["reference"] - report.dataset_ap["candidate"]
        if drop > t.max_ap_drop:
            failures.append(f"mAP on the dataset drops by {drop:.2f} points (allowed {t.max_ap_drop:g})")
    report.failures = failures
    report.passed = not failures


def ranks_nothing(outputs: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], top_k: int) -> bool:
    """Whether every image's top-k scores lie within RANKLESS_SPREAD of its best (see there)."""
    for _, _, scores in outputs:
        for row in scores:
            best = np.sort(row)[::-1][:top_k]
            if len(best) and float(best[0] - best[-1]) >= RANKLESS_SPREAD:
                return False
    return True


def run_gate(
    reference: Runner,
    candidate: Runner,
    batches: Sequence[ParityBatch],
    thresholds: GateThresholds,
    *,
    reference_name: str,
    candidate_name: str,
    dataset_scorer: Callable[[Sequence[ParityBatch], list], float] | None = None,
    rank_free: bool = False,
) -> ParityReport:
    """Run both runners on every batch and compare; never raises on a failed gate (see `enforce`).

    `rank_free` is for random weights: every score sits near the class prior, so which (query,
    class) pairs make the top-K, and even which queries the encoder selects, is decided by
    rounding noise, and detections legitimately appear and vanish. Boxes of the detections found
    in both must still agree (box precision), and score noise is still bounded.
    """
    ref_out = [reference(b.images, b.orig_sizes) for b in batches]
    rank_free = rank_free or ranks_nothing(ref_out, thresholds.top_k)
    cand_out = [candidate(b.images, b.orig_sizes) for b in batches]
    report = compare_outputs(
        ref_out,
        cand_out,
        thresholds,
        reference_name=reference_name,
        candidate_name=candidate_name,
        batch_sizes=[len(b.images) for b in batches],
        rank_free=rank_free,
    )
    if dataset_scorer is not None:
        report.dataset_ap = {
            "reference": float(dataset_scorer(batches, ref_out)),
            "candidate": float(dataset_scorer(batches, cand_out)),
        }
        _judge(report, thresholds)
    return report


def enforce(report: ParityReport, *, force: bool) -> None:
    """Refuse a failed gate unless forced; the message says what differed and how to override."""
    if report.passed or force:
        return
    raise ParityError(
        f"{report.candidate} disagrees with {report.reference}: "
        + "; ".join(report.failures)
        + ". Nothing was written. Re-run with --force to keep the artifact anyway "
        "(the failure is recorded in model.json)."
    )
