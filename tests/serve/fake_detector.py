"""A fast detector with the runtime Detector's interface, for server tests that are not about the model.

It really looks at each frame: every blob of strongly red pixels is a 'red-square' (label 0), every
blob of strongly blue pixels a 'blue-square' (label 1), boxed tightly; the tests draw squares at known
places, so a test can check that the right frame's result reached the right stream and follow objects
along known paths. `delay_s` makes each predict call cost time, as a real model would.

`top_k_pairs` answers as D-FINE's top-K over (query, class) pairs does: every box comes back a second
time, identical, under the other class with a lower score, and the list is sorted by score.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import cv2
import numpy as np

NAMES = ("red-square", "blue-square")
MIN_BLOB_PIXELS = 30
DEMO_MIN_BLOB_PIXELS = 300  # the demo video's smallest object (a ring) covers about 1500


@dataclass
class FakeDetections:
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    names: list[str]


class RedSquareDetector:
    backend_name = "fake"
    provider = "numpy"

    def __init__(self, max_batch: int = 8, delay_s: float = 0.0, top_k_pairs: bool = False):
        self.max_batch = max_batch
        self.delay_s = delay_s
        self.top_k_pairs = top_k_pairs
        self.batch_sizes: list[int] = []
        self._lock = threading.Lock()

    def predict(self, frames, *, color: str = "BGR") -> list[FakeDetections]:
        assert color == "BGR"
        if len(frames) > self.max_batch:
            raise ValueError(f"batch of {len(frames)} exceeds max_batch {self.max_batch}")
        with self._lock:
            self.batch_sizes.append(len(frames))
        if self.delay_s:
            time.sleep(self.delay_s)
        found = [self._detect(frame) for frame in frames]
        return [_as_top_k_pairs(d) for d in found] if self.top_k_pairs else found

    @staticmethod
    def _detect(frame: np.ndarray) -> FakeDetections:
        b, g, r = (frame[..., i].astype(np.int16) for i in range(3))
        boxes, labels = [], []
        for label, mask in enumerate(((r > 180) & (g < 90) & (b < 90), (b > 180) & (g < 90) & (r < 90))):
            count, _, stats, _ = cv2.connectedComponentsWithStats(mask.astype(np.uint8), connectivity=8)
            for x, y, w, h, area in stats[1:count]:  # row 0 is the background
                if area >= MIN_BLOB_PIXELS:  # codec speckles are not objects
                    boxes.append([x, y, x + w, y + h])
                    labels.append(label)
        order = np.lexsort((np.array([bx[0] for bx in boxes]), np.array(labels))) if boxes else []
        return FakeDetections(
            np.array([boxes[i] for i in order], np.float32).reshape(-1, 4),  # [N, 4] xyxy
            np.ones(len(boxes), np.float32),
            np.array([labels[i] for i in order], np.int64),
            [NAMES[labels[i]] for i in order],
        )


def _as_top_k_pairs(det: FakeDetections) -> FakeDetections:
    """Each box twice: its own class at 0.9, the other class at 0.4 (the same box), by score."""
    boxes = np.concatenate([det.boxes, det.boxes])  # [2N, 4]
    scores = np.concatenate([np.full(len(det.boxes), 0.9), np.full(len(det.boxes), 0.4)]).astype(np.float32)
    labels = np.concatenate([det.labels, 1 - det.labels])
    order = np.argsort(-scores, kind="stable")
    return FakeDetections(boxes[order], scores[order], labels[order], [NAMES[labels[i]] for i in order])


class DemoColourDetector:
    """Finds the objects of `dfine_deploy.data.moving.DemoVideo` by their class colours, boxed tightly
    (labels index `synthetic.CLASS_NAMES`): the demo video's tracking and counting tested without a
    trained model."""

    backend_name = "fake"
    provider = "numpy"
    max_batch = 8

    def predict(self, frames, *, color: str = "BGR") -> list[FakeDetections]:
        assert color == "BGR"
        return [self._detect(frame) for frame in frames]

    @staticmethod
    def _detect(frame: np.ndarray) -> FakeDetections:
        # the codec's 2x2 colour blocks split an edge row off a shape: closing joins it back
        return colour_blobs(frame, closing=3, min_pixels=DEMO_MIN_BLOB_PIXELS)


def colour_blobs(frame: np.ndarray, *, closing: int, min_pixels: int, scale=(1.0, 1.0)) -> FakeDetections:
    """The demo colours' blobs of `frame` (BGR), each closed with a `closing`-pixel square and kept
    from `min_pixels` up, boxed tightly and multiplied by `scale` (x, y), score 0.9."""
    from dfine_deploy.data.moving import CLASS_COLOURS

    pixels = frame.astype(np.int16)
    boxes, labels = [], []
    for label, colour in enumerate(CLASS_COLOURS.values()):
        mask = (np.abs(pixels - np.array(colour, np.int16)) < 60).all(axis=2).astype(np.uint8)
        mask = cv2.morphologyEx(mask, cv2.MORPH_CLOSE, np.ones((closing, closing), np.uint8))
        count, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
        for x, y, w, h, area in stats[1:count]:
            if area >= min_pixels:
                boxes.append([x * scale[0], y * scale[1], (x + w) * scale[0], (y + h) * scale[1]])
                labels.append(label)
    names = list(CLASS_COLOURS)
    return FakeDetections(
        np.array(boxes, np.float32).reshape(-1, 4),
        np.full(len(boxes), 0.9, np.float32),
        np.array(labels, np.int64),
        [names[label] for label in labels],
    )
