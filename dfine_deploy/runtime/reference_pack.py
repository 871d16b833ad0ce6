"""The reference pack: the artifact's own truth, which `dfine-verify` checks an engine against.

`dfine-export` writes it (`reference.npz`, listed under `reference_pack` in model.json): the first
`PACK_IMAGES` images of its parity gate, already at the graph's input size (uint8 RGB, exactly the
pixels the gate fed: the gate resizes uint8 images and divides by 255), and the PyTorch model's
detections of each (top-K labels, boxes in the pack image's own pixels, scores). On the device an
engine runs the same pixels and is held to the export gate's thresholds (`export/parity.py`).

Nothing here needs torch: the export hands in the detections its gates computed with PyTorch.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Tuple

import numpy as np

from dfine_deploy.errors import BackendError
from dfine_deploy.files import atomic_write_bytes, cached_sha256

PACK_NAME = "reference.npz"
# 16 gate images: enough boxes for the matching statistics, and at the quickstart's 256 px about 3 MB
# before compression (the pack must stay a few MB on a 640 px export too: 16 x 1.2 MB, compressed)
PACK_IMAGES = 16

Outputs = Tuple[np.ndarray, np.ndarray, np.ndarray]  # labels [B,K], boxes [B,K,4], scores [B,K]


@dataclass(frozen=True)
class ReferencePack:
    images: np.ndarray  # [N, H, W, 3] uint8 RGB at the graph's input size
    labels: np.ndarray  # [N, K] int64
    boxes: np.ndarray  # [N, K, 4] float32, xyxy in the pack image's pixels
    scores: np.ndarray  # [N, K] float32
    batch_max: int  # the artifact's largest batch: an engine must run it
    rank_free: bool  # random weights: the gate's rank-free judgement (export/parity.py run_gate)

    def feeds(self, indices: list[int]) -> tuple[np.ndarray, np.ndarray]:
        return gate_feeds(self.images[indices])

    def reference(self, indices: list[int]) -> Outputs:
        return self.labels[indices], self.boxes[indices], self.scores[indices]


def gate_feeds(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gate's inputs for pack images [B,H,W,3]: float [B,3,H,W] in [0,1], sizes [B,2] (w, h):
    the boxes come back in the pack image's own pixels."""
    height, width = pixels.shape[1:3]
    images = pixels.transpose(0, 3, 1, 2).astype(np.float32) / 255.0
    return images, np.tile(np.array([[width, height]], dtype=np.int64), (len(pixels), 1))


def write_pack(
    folder: Path,
    gate: Iterable[tuple[np.ndarray, np.ndarray, Outputs]],
    batch_max: int,
    rank_free: bool,
) -> dict[str, Any]:
    """Write the pack of the gate's first PACK_IMAGES images; `gate` holds its batches: (images
    float [B,3,H,W], their original sizes [B,2] (w, h), PyTorch's detections of them in those
    sizes' pixels). Boxes are scaled into the pack image's own pixels (the postprocessor scales
    normalised boxes by the size it is given, and nothing else depends on it). Returns the
    model.json record."""
    kept: list[tuple[np.ndarray, np.ndarray, Outputs]] = []
    count = 0
    for images, sizes, outputs in gate:
        take = min(len(images), PACK_IMAGES - count)
        kept.append((images[:take], sizes[:take], tuple(o[:take] for o in outputs)))
        count += take
        if count >= PACK_IMAGES:
            break
    images = np.concatenate([k[0] for k in kept])
    pixels = np.rint(images * 255.0).clip(0, 255).astype(np.uint8).transpose(0, 2, 3, 1)
    height, width = pixels.shape[1:3]
    scale = np.concatenate([np.array([width, height], np.float32) / k[1].astype(np.float32) for k in kept])
    labels, boxes, scores = (np.concatenate([k[2][i] for k in kept]) for i in range(3))
    boxes = boxes * np.tile(scale, 2)[:, None, :]
    buffer = io.BytesIO()
    meta = {"batch_max": batch_max, "rank_free": rank_free}
    np.savez_compressed(
        buffer,
        images=pixels,
        labels=labels.astype(np.int64),
        boxes=boxes.astype(np.float32),
        scores=scores.astype(np.float32),
        meta=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
    )
    path = Path(folder) / PACK_NAME
    atomic_write_bytes(path, buffer.getvalue())
    return {"file": PACK_NAME, "sha256": cached_sha256(path), "images": int(len(pixels))}


def read_pack(folder: Path, record: dict[str, Any], source: str) -> ReferencePack:
    """The pack model.json lists, its bytes checked against the recorded sha256."""
    if not record:
        raise BackendError(
            f"{source}: model.json lists no reference pack (exported before dfine-verify existed); "
            "re-export the model with dfine-export, which writes reference.npz"
        )
    path = Path(folder) / str(record.get("file", PACK_NAME))
    if not path.is_file():
        raise BackendError(
            f"{path}: model.json lists this reference pack and it is missing; copy the whole folder"
        )
    if cached_sha256(path) != record.get("sha256"):
        raise BackendError(
            f"{path}: its sha256 is not the one model.json records: the pack was replaced or damaged; "
            "re-export the model with dfine-export"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode())
            return ReferencePack(
                data["images"],
                data["labels"],
                data["boxes"],
                data["scores"],
                batch_max=int(meta["batch_max"]),
                rank_free=bool(meta["rank_free"]),
            )
    except (OSError, ValueError, KeyError) as exc:
        raise BackendError(f"{path}: unreadable reference pack ({exc}); re-export the model") from exc
