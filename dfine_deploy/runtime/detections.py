"""What every backend returns for one frame."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class Detections:
    """Detections of one frame, in pixels of that frame as it was given to `predict`.

    boxes  float32 [N, 4] xyxy pixels of the original frame
    scores float32 [N]
    labels int64   [N] contiguous class index 0..C-1
    names  list[str] of length N, the class name of each detection
    """

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    names: list[str]

    def __len__(self) -> int:
        return int(self.scores.shape[0])

    @property
    def class_names(self) -> list[str]:
        """Alias of `names` (one class name per detection)."""
        return self.names

    @classmethod
    def empty(cls) -> Detections:
        """No detection."""
        return cls(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), [])

    @classmethod
    def build(
        cls, boxes: np.ndarray, scores: np.ndarray, labels: np.ndarray, class_names: list[str]
    ) -> Detections:
        """Cast to the contract dtypes and attach a name to each label."""
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        names = [class_names[i] if 0 <= i < len(class_names) else f"class_{i}" for i in labels.tolist()]
        return cls(
            boxes=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
            scores=np.asarray(scores, dtype=np.float32).reshape(-1),
            labels=labels,
            names=names,
        )

    def one_label_per_box(self) -> Detections:
        """Only the best-scoring label of each box. D-FINE takes its top-K over (query, class) pairs,
        so one query can come back under two classes with the very same box; for a picture or a
        count of objects, one object should carry one label. Order: descending score."""
        order = np.argsort(-self.scores, kind="stable")
        _, first = np.unique(self.boxes[order], axis=0, return_index=True)
        keep = order[np.sort(first)]
        return Detections(
            self.boxes[keep], self.scores[keep], self.labels[keep], [self.names[i] for i in keep]
        )

    def keep(self, mask: np.ndarray) -> Detections:
        """The detections where `mask` [N] is true, in their order."""
        index = np.flatnonzero(mask)
        return Detections(
            self.boxes[index], self.scores[index], self.labels[index], [self.names[i] for i in index]
        )

    def to_dict(self) -> dict[str, Any]:
        """Plain lists, ready for JSON."""
        return {
            "boxes": self.boxes.round(2).tolist(),
            "scores": self.scores.round(4).tolist(),
            "labels": self.labels.tolist(),
            "names": list(self.names),
        }
