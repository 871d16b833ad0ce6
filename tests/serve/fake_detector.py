"""A fast detector with the runtime Detector's interface, for server tests that are not about the model.

It really looks at each frame: the box is the bounding box of the strongly red pixels (the tests draw
red squares at known places), so a test can check that the right frame's result reached the right
stream. `delay_s` makes each predict call cost time, as a real model would.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import numpy as np


@dataclass
class FakeDetections:
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    names: list[str]


class RedSquareDetector:
    backend_name = "fake"
    provider = "numpy"

    def __init__(self, max_batch: int = 8, delay_s: float = 0.0):
        self.max_batch = max_batch
        self.delay_s = delay_s
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
        return [self._detect(frame) for frame in frames]

    @staticmethod
    def _detect(frame: np.ndarray) -> FakeDetections:
        b, g, r = (frame[..., i].astype(np.int16) for i in range(3))
        ys, xs = np.nonzero((r > 180) & (g < 90) & (b < 90))
        if len(xs) == 0:
            return FakeDetections(np.zeros((0, 4), np.float32), np.zeros(0, np.float32), np.zeros(0, np.int64), [])
        box = np.array([[xs.min(), ys.min(), xs.max() + 1, ys.max() + 1]], np.float32)  # [1, 4] xyxy
        return FakeDetections(box, np.ones(1, np.float32), np.zeros(1, np.int64), ["red-square"])
