"""A stand-in for a small-input model, for tests of tiles: it sees each image shrunk to `side` x
`side` pixels, as D-FINE's preprocessing does, and finds the demo colours' blobs there
(`fake_detector.DemoColourDetector`'s rule), so an object too small at that scale is missed, the
way a model misses it. Boxes are mapped back to the image's pixels."""

from __future__ import annotations

import cv2
import numpy as np

from dfine_deploy.data.moving import CLASS_COLOURS
from tests.serve.fake_detector import FakeDetections

MIN_PIXELS = 3  # a blob smaller than this at the model's scale is not seen


class LowResColourDetector:
    backend_name = "fake"
    provider = "numpy"

    def __init__(self, side: int = 256, max_batch: int = 8):
        self.side = side
        self.max_batch = max_batch
        self.input_size = (side, side)
        self.images = 0  # images detected so far (the cost)

    def predict(self, frames, *, color: str = "BGR") -> list[FakeDetections]:
        assert color == "BGR" and len(frames) <= self.max_batch
        self.images += len(frames)
        return [self._detect(frame) for frame in frames]

    def _detect(self, frame: np.ndarray) -> FakeDetections:
        height, width = frame.shape[:2]
        small = cv2.resize(frame, (self.side, self.side), interpolation=cv2.INTER_AREA).astype(np.int16)
        sx, sy = width / self.side, height / self.side
        boxes, labels = [], []
        for label, colour in enumerate(CLASS_COLOURS.values()):
            mask = (np.abs(small - np.array(colour, np.int16)) < 60).all(axis=2).astype(np.uint8)
            # a ring's thin side or a triangle's tip fades at this scale: closing keeps one blob an object
            mask = cv2.morphologyEx(mask, cv2.MORPH_CLOSE, np.ones((5, 5), np.uint8))
            count, _, stats, _ = cv2.connectedComponentsWithStats(mask, connectivity=8)
            for x, y, w, h, area in stats[1:count]:
                if area >= MIN_PIXELS:
                    boxes.append([x * sx, y * sy, (x + w) * sx, (y + h) * sy])
                    labels.append(label)
        names = list(CLASS_COLOURS)
        return FakeDetections(
            np.array(boxes, np.float32).reshape(-1, 4),
            np.full(len(boxes), 0.9, np.float32),
            np.array(labels, np.int64),
            [names[label] for label in labels],
        )
