"""COCO box metrics through faster-coco-eval, with per-class AP, JSON output and optional plots.

Predictions arrive per image with contiguous labels (what the model outputs); the `ClassMap` maps
them back to dataset category ids, as the official postprocessor does for COCO evaluation. All
detections are kept (no score threshold); COCO's maxDets=100 keeps the 100 best per image.

    evaluator = CocoEvaluator(dataset.coco_gt(), dataset.class_map)
    for images, targets in loader:
        results = postprocessor(model(images), orig_sizes)      # list of {boxes, scores, labels}
        evaluator.update([int(t["image_id"]) for t in targets], results)
    evaluator.synchronize()                                      # under torchrun: all ranks
    metrics = evaluator.summarize()                              # {"AP": ..., "per_class": [...]}
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dfine_deploy.boxes import match_greedy, xywh_to_xyxy
from dfine_deploy.data.classmap import ClassMap
from dfine_deploy.errors import DatasetError, require
from dfine_deploy.files import no_file

# The 12 numbers of COCOeval.summarize(), in order.
STAT_NAMES = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")


def _as_numpy(value: Any) -> np.ndarray:
    if hasattr(value, "detach"):  # torch tensor, without importing torch here
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def _load_gt(coco_gt: Any):
    """A path, a COCO dict or an already built faster_coco_eval.COCO."""
    fce = require("faster_coco_eval", "train", "COCO evaluation")
    if isinstance(coco_gt, fce.COCO):
        return coco_gt
    if isinstance(coco_gt, (str, os.PathLike)):
        if not Path(coco_gt).is_file():
            raise DatasetError(f"ground-truth annotation file {coco_gt}: {no_file(coco_gt)}")
        return fce.COCO(str(coco_gt))
    if isinstance(coco_gt, Mapping):
        return fce.COCO(copy.deepcopy(dict(coco_gt)))
    raise DatasetError(
        f"ground truth must be a COCO json path, dict or COCO object, got {type(coco_gt).__name__}"
    )


class CocoEvaluator:
    """Collects detections per image and computes COCO bbox metrics."""

    def __init__(self, coco_gt: Any, class_map: ClassMap | None = None):
        self.coco_gt = _load_gt(coco_gt)
        self.class_map = class_map
        # image_id -> [n, 7] rows (image_id, x, y, w, h, score, category_id). Keyed by image so that
        # the copies DistributedSampler pads the last batch with are counted once, as official.
        self._by_image: dict[int, np.ndarray] = {}
        self._coco_eval = None

    def update(self, image_ids: Sequence[int], results: Sequence[Mapping[str, Any]]) -> None:
        """Add one batch: `results[i]` has boxes [K, 4] xyxy px, scores [K], labels [K] (contiguous)."""
        if len(image_ids) != len(results):
            raise DatasetError(f"update got {len(image_ids)} image ids but {len(results)} results")
        for image_id, result in zip(image_ids, results):
            image_id = int(image_id)
            if image_id in self._by_image:
                continue  # a padded repeat of an image already seen
            boxes = _as_numpy(result["boxes"]).astype(np.float64).reshape(-1, 4)  # [K, 4] xyxy
            scores = _as_numpy(result["scores"]).astype(np.float64).reshape(-1)
            labels = _as_numpy(result["labels"]).astype(np.int64).reshape(-1)
            categories = self.class_map.category_ids_of(labels) if self.class_map else labels
            keep = categories >= 0  # labels with no dataset category cannot be scored
            rows = np.empty((int(keep.sum()), 7), dtype=np.float64)
            rows[:, 0] = image_id
            rows[:, 1:3] = boxes[keep, :2]
            rows[:, 3:5] = boxes[keep, 2:] - boxes[keep, :2]  # xyxy -> xywh
            rows[:, 5] = scores[keep]
            rows[:, 6] = categories[keep]
            self._by_image[image_id] = rows
        self._coco_eval = None

    @property
    def detections(self) -> np.ndarray:
        """All detections so far, [N, 7] (image_id, x, y, w, h, score, category_id)."""
        rows = list(self._by_image.values())
        return np.concatenate(rows) if rows else np.zeros((0, 7))

    def synchronize(self) -> None:
        """Under torch.distributed, gather every rank's detections onto every rank."""
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, self._by_image)
            merged: dict[int, np.ndarray] = {}
            for part in gathered:
                for image_id, rows in part.items():
                    merged.setdefault(image_id, rows)
            self._by_image = merged
            self._coco_eval = None

    # ------------------------------------------------------------------------ metrics
    def evaluate(self):
        """Run COCOeval (evaluate, accumulate, summarize) once; returns the COCOeval object."""
        if self._coco_eval is None:
            fce = require("faster_coco_eval", "train", "COCO evaluation")
            dets = self.detections
            unknown = sorted(set(dets[:, 0].astype(np.int64).tolist()) - set(self.coco_gt.getImgIds()))
            if unknown:
                raise DatasetError(
                    f"detections refer to image ids {unknown[:10]} that the ground truth lacks; "
                    "pass the targets' image_id of the same dataset"
                )
            coco_dt = self.coco_gt.loadRes(dets)
            coco_eval = fce.COCOeval_faster(self.coco_gt, coco_dt, "bbox", print_function=lambda *a: None)
            coco_eval.evaluate()
            coco_eval.accumulate()
            coco_eval.summarize()
            self._coco_eval = coco_eval
        return self._coco_eval

    def summarize(self, per_class: bool = True) -> dict[str, Any]:
        """Metrics dict: the 12 COCO numbers by name, `stats` (the list), and `per_class` rows."""
        coco_eval = self.evaluate()
        stats = [float(v) for v in coco_eval.stats[: len(STAT_NAMES)]]
        out: dict[str, Any] = dict(zip(STAT_NAMES, stats))
        out["stats"] = stats
        out["num_detections"] = len(self.detections)
        out["num_images"] = len(self.coco_gt.getImgIds())
        if per_class:
            out["per_class"] = self.per_class()
        return out

    def per_class(self) -> list[dict[str, Any]]:
        """AP, AP50, AP75 and AR100 per category (None where the category has no ground truth)."""
        coco_eval = self.evaluate()
        precision = coco_eval.eval["precision"]  # [T iou, R recall, K cat, A area, M maxDets]
        recall = coco_eval.eval["recall"]  # [T, K, A, M]
        ious = np.asarray(coco_eval.params.iouThrs)
        t50, t75 = int(np.argmin(np.abs(ious - 0.5))), int(np.argmin(np.abs(ious - 0.75)))

        def mean_valid(values: np.ndarray) -> float | None:
            valid = values[values > -1]
            return float(valid.mean()) if valid.size else None

        rows = []
        for k, category_id in enumerate(coco_eval.params.catIds):
            category_id = int(category_id)
            p = precision[:, :, k, 0, -1]  # [T, R], area all, maxDets 100
            rows.append(
                {
                    "category_id": category_id,
                    "label": self._label_of(category_id),
                    "name": self.coco_gt.cats[category_id].get("name", str(category_id)),
                    "num_gt": len(self.coco_gt.getAnnIds(catIds=[category_id], iscrowd=False)),
                    "AP": mean_valid(p),
                    "AP50": mean_valid(p[t50]),
                    "AP75": mean_valid(p[t75]),
                    "AR100": mean_valid(recall[:, k, 0, -1]),
                }
            )
        return rows

    def _label_of(self, category_id: int) -> int | None:
        if self.class_map is None:
            return category_id
        return self.class_map.label_of(category_id) if category_id in self.class_map.category_ids else None

    # ------------------------------------------------------------------------ reports
    def format_table(self, metrics: Mapping[str, Any] | None = None) -> str:
        """The summary line and the per-class AP table, for printing."""
        metrics = metrics or self.summarize()
        head = "  ".join(
            f"{n} {metrics[n]:.4f}" for n in ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR100")
        )
        lines = [
            head,
            f"{'category_id':>11}  {'label':>5}  {'name':<20} {'gt':>6} {'AP':>7} {'AP50':>7} {'AP75':>7}",
        ]

        def fmt(v: float | None) -> str:
            return f"{v:7.4f}" if v is not None else "     --"

        for row in metrics.get("per_class", []):
            label = "" if row["label"] is None else row["label"]
            lines.append(
                f"{row['category_id']:>11}  {label:>5}  {row['name']:<20.20} {row['num_gt']:>6} "
                f"{fmt(row['AP'])} {fmt(row['AP50'])} {fmt(row['AP75'])}"
            )
        return "\n".join(lines)

    def write_json(self, path: str | os.PathLike, metrics: Mapping[str, Any] | None = None) -> Path:
        from dfine_deploy.files import atomic_write_bytes

        metrics = metrics or self.summarize()
        atomic_write_bytes(path, json.dumps(metrics, indent=2).encode())
        return Path(path)

    def confusion_matrix(
        self, iou_threshold: float = 0.5, score_threshold: float = 0.5
    ) -> tuple[np.ndarray, list[str]]:
        """[(K+1), (K+1)] counts, rows = ground truth, columns = prediction, last = background.

        Detections above `score_threshold` are matched greedily by score to the unmatched
        non-crowd ground truth box of highest IoU (any class) above `iou_threshold`.
        """
        cat_ids = [int(c) for c in self.coco_gt.getCatIds()]
        index = {c: i for i, c in enumerate(cat_ids)}
        background = len(cat_ids)
        matrix = np.zeros((background + 1, background + 1), dtype=np.int64)
        dets = self.detections
        dets = dets[dets[:, 5] >= score_threshold]
        for image_id in self.coco_gt.getImgIds():
            anns = [
                a
                for a in self.coco_gt.loadAnns(self.coco_gt.getAnnIds(imgIds=[image_id]))
                if not a.get("iscrowd")
            ]
            gt_boxes = np.array([a["bbox"] for a in anns], dtype=np.float64).reshape(-1, 4)
            gt_cls = [index[a["category_id"]] for a in anns]
            mine = dets[dets[:, 0] == image_id]
            mine = mine[np.argsort(-mine[:, 5], kind="stable")]
            # class-agnostic, one-to-one, in score order: a wrong class is a confusion, not a miss
            partner, _ = match_greedy(xywh_to_xyxy(mine[:, 1:5]), xywh_to_xyxy(gt_boxes), iou_threshold)
            taken = np.zeros(len(anns), dtype=bool)
            taken[partner[partner >= 0]] = True
            for det, g in zip(mine, partner, strict=True):
                pred = index.get(int(det[6]), background)
                matrix[gt_cls[g] if g >= 0 else background, pred] += 1
            for g in np.where(~taken)[0]:
                matrix[gt_cls[g], background] += 1
        names = [self.coco_gt.cats[c].get("name", str(c)) for c in cat_ids] + ["background"]
        return matrix, names

    def plot_confusion_matrix(self, path: str | os.PathLike, **kwargs: Any) -> Path:
        matrix, names = self.confusion_matrix(**kwargs)
        fig = _figure((1.0 + 0.5 * len(names), 1.0 + 0.5 * len(names)))
        ax = fig.subplots()
        ax.imshow(matrix, cmap="Blues")
        ax.set_xticks(range(len(names)), names, rotation=60, ha="right")
        ax.set_yticks(range(len(names)), names)
        ax.set_xlabel("predicted")
        ax.set_ylabel("ground truth")
        for (i, j), v in np.ndenumerate(matrix):
            if v:
                ax.text(j, i, str(v), ha="center", va="center", fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        return Path(path)

    def plot_pr_curves(self, path: str | os.PathLike, iou_threshold: float = 0.5) -> Path:
        """Precision-recall curve per class at one IoU threshold (COCO's 101 recall points)."""
        coco_eval = self.evaluate()
        t = int(np.argmin(np.abs(np.asarray(coco_eval.params.iouThrs) - iou_threshold)))
        recall_points = np.asarray(coco_eval.params.recThrs)
        fig = _figure((6, 5))
        ax = fig.subplots()
        for k, category_id in enumerate(coco_eval.params.catIds):
            p = coco_eval.eval["precision"][t, :, k, 0, -1]
            if (p > -1).any():
                name = self.coco_gt.cats[int(category_id)].get("name", str(category_id))
                ax.plot(
                    recall_points,
                    np.clip(p, 0, 1),
                    label=f"{name} (AP{int(iou_threshold * 100)} {p[p > -1].mean():.3f})",
                )
        ax.set_xlabel("recall")
        ax.set_ylabel("precision")
        ax.set_xlim(0, 1)
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, loc="lower left")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        return Path(path)


def _figure(size: tuple[float, float]):
    """A matplotlib Figure drawn with Agg, without pyplot (no global backend change, no GUI)."""
    require("matplotlib", "train", "Evaluation plots")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig
