"""The replay backend: an "engine" that serves recorded output tensors for recorded input images.

A `.replay` file stands in for an engine built on a device this machine cannot reach: the outputs a
TensorRT engine gave for the reference pack's images (`runtime/reference_pack.py`), what it was built
as (its declared precision), its engine inspector JSON, its optimisation profile's largest batch and
its per-image latency. Served like an engine, it goes through the same paths as one: dfine-verify
judges it, and dfine-serve and `Detector.open` refuse it without a passing verify.json
(`BackendInfo.needs_verify`). The suite records faulty engines this way (shifted boxes, collapsed
scores, FP32 layers in an "FP16" engine, a slow INT8 engine, a too small profile).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from dfine_deploy.artifact import INPUT_NAMES, OUTPUT_NAMES
from dfine_deploy.errors import BackendError
from dfine_deploy.files import atomic_write_bytes
from dfine_deploy.runtime.backend import Backend

REPLAY_SUFFIX = ".replay"


def image_digest(image: np.ndarray) -> str:
    """The key of one input image [3,H,W] in [0,1]: its 8-bit pixels (what the pack holds)."""
    return hashlib.sha256(np.rint(image * 255.0).astype(np.uint8).tobytes()).hexdigest()[:20]


def write_replay(
    path: Path,
    images: np.ndarray,
    outputs: tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    precision: str,
    max_batch: int,
    latency_ms: float,
    inspector: str | None = None,
    strongly_typed: bool | None = None,
    host_ms: float = 0.0,
) -> Path:
    """Record an engine: its outputs (labels, boxes, scores per image) for `images` (float
    [N,3,H,W] in [0,1], boxes in the images' own pixels) and what it says about itself
    (`strongly_typed`: how its network was typed, None when its build did not record it).
    `latency_ms` per image is the engine's own time, `host_ms` per batch what copying in and out adds."""
    meta = {
        "precision": precision,
        "strongly_typed": strongly_typed,
        "max_batch": int(max_batch),
        "latency_ms": float(latency_ms),
        "host_ms": float(host_ms),
        "inspector": inspector,
        "input_size": [int(images.shape[2]), int(images.shape[3])],
        "keys": [image_digest(image) for image in images],
    }
    labels, boxes, scores = outputs
    buffer = io.BytesIO()
    np.savez(
        buffer,
        labels=np.asarray(labels, np.int64),
        boxes=np.asarray(boxes, np.float32),
        scores=np.asarray(scores, np.float32),
        meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
    )
    atomic_write_bytes(path, buffer.getvalue())
    return Path(path)


class ReplayBackend(Backend):
    name = "replay"

    def __init__(self, path: str | os.PathLike, *, default_max_batch: int = 1, max_batch_source: str = ""):
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                self._labels, self._boxes, self._scores = data["labels"], data["boxes"], data["scores"]
                meta: dict[str, Any] = json.loads(bytes(data["meta"]).decode())
        except (OSError, ValueError, KeyError) as exc:
            raise BackendError(
                f"{path}: not a replay recording ({exc}); record one with write_replay"
            ) from exc
        self._index = {key: i for i, key in enumerate(meta["keys"])}
        self._latency = float(meta["latency_ms"]) / 1000.0
        self._host = float(meta.get("host_ms", 0.0)) / 1000.0
        self._inspector = meta.get("inspector")
        self.declared_precision = str(meta["precision"])
        typed = meta.get("strongly_typed")
        self.strongly_typed = typed if isinstance(typed, bool) else None
        self.input_names, self.output_names = INPUT_NAMES, OUTPUT_NAMES
        self.input_size = (int(meta["input_size"][0]), int(meta["input_size"][1]))
        self.max_batch = int(meta["max_batch"])
        self.max_batch_source = f"{path.name}'s recorded optimisation profile (batch max {self.max_batch})"
        self.provider = f"replay of {path.name}"
        self.path = path

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows = self._rows(feeds)
        time.sleep(self._host + self._latency * len(rows))
        # recorded at the input size; scaled to the sizes asked for, as the graph's postprocessor does
        sizes = feeds[INPUT_NAMES[1]]
        height, width = self.input_size
        scale = (sizes.astype(np.float32) / np.array([width, height], np.float32))[:, None, :]
        boxes = self._boxes[rows] * np.concatenate([scale, scale], axis=-1)
        return dict(zip(OUTPUT_NAMES, (self._labels[rows], boxes.astype(np.float32), self._scores[rows])))

    def engine_only(self, feeds: dict[str, np.ndarray]) -> Callable[[], None]:
        """The recorded engine time alone (no host copies)."""
        count = len(self._rows(feeds))
        return lambda: time.sleep(self._latency * count)

    def _rows(self, feeds: dict[str, np.ndarray]) -> list[int]:
        images = feeds[INPUT_NAMES[0]]
        if len(images) > self.max_batch:
            raise BackendError(f"{self.path}: batch {len(images)} is beyond {self.max_batch_source}")
        rows = []
        for image in images:
            row = self._index.get(image_digest(image))
            if row is None:
                raise BackendError(
                    f"{self.path}: this input image was not recorded; replay runs its pack only"
                )
            rows.append(row)
        return rows

    def engine_inspector(self) -> str | None:
        return self._inspector
