"""A stand-in for a small-input model, for tests of tiles: it sees each image shrunk to `side` x
`side` pixels, as D-FINE's preprocessing does, and finds the demo colours' blobs there
(`fake_detector.DemoColourDetector`'s rule), so an object too small at that scale is missed, the
way a model misses it. Boxes are mapped back to the image's pixels."""

from __future__ import annotations

import cv2
import numpy as np

from tests.serve.fake_detector import FakeDetections, colour_blobs

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
        small = cv2.resize(frame, (self.side, self.side), interpolation=cv2.INTER_AREA)
        # a ring's thin side or a triangle's tip fades at this scale: closing keeps one blob an object
        scale = (width / self.side, height / self.side)
        return colour_blobs(small, closing=5, min_pixels=MIN_PIXELS, scale=scale)
