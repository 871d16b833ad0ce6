"""Deterministic weights, inputs and set-matching comparisons for parity with the official D-FINE.

The rules follow the recording procedure of the parity JSON files in tests/data/ (copied from the
project's reference notes): weights come from an integer hash of each state_dict name, so every
platform fills the same bits without any checkpoint file. Outputs are compared as sets because many
scores differ by less than 1e-5, so a correct implementation may order near-ties differently.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import math
import subprocess
import sys
import types
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

DATA_DIR = Path(__file__).resolve().parents[2] / "tests" / "data"

# (w, h) of the two "original" images the deploy outputs are scaled to.
ORIG_SIZES = torch.tensor([[640, 480], [1280, 720]], dtype=torch.int64)

# Training targets of the two parity images: contiguous labels, normalised cxcywh boxes.
PARITY_TARGETS: list[dict[str, torch.Tensor]] = [
    {
        "labels": torch.tensor([1, 7, 7], dtype=torch.int64),
        "boxes": torch.tensor(
            [[0.30, 0.40, 0.20, 0.30], [0.70, 0.60, 0.25, 0.15], [0.50, 0.20, 0.10, 0.10]],
            dtype=torch.float32,
        ),
    },
    {
        "labels": torch.tensor([0, 42], dtype=torch.int64),
        "boxes": torch.tensor([[0.25, 0.75, 0.30, 0.20], [0.60, 0.35, 0.40, 0.50]], dtype=torch.float32),
    },
]

_UNFILLED_SUFFIXES = ("anchors", "valid_mask", "num_batches_tracked")
_UNFILLED_NAMES = frozenset(
    {"decoder.up", "decoder.reg_scale", "decoder.decoder.up", "decoder.decoder.reg_scale"}
)
_MASK32 = (1 << 32) - 1


def hash_uniform(name: str, n: int) -> torch.Tensor:
    """`n` float64 values in [-1, 1) from exact int64 arithmetic seeded by crc32(name)."""
    seed = zlib.crc32(name.encode())
    h = (torch.arange(n, dtype=torch.int64) + seed) & _MASK32
    h = (((h >> 16) ^ h) * 0x45D9F3B) & _MASK32
    h = (((h >> 16) ^ h) * 0x45D9F3B) & _MASK32
    h = (h >> 16) ^ h
    return h.to(torch.float64) / float(1 << 32) * 2.0 - 1.0


def _deterministic_value(name: str, shape: torch.Size) -> torch.Tensor:
    n = math.prod(shape)
    v = hash_uniform(name, n)
    leaf = name.rsplit(".", 1)[-1]
    if len(shape) >= 2:
        v = v * math.sqrt(6.0 / (n // shape[0]))
    elif leaf == "running_var":
        v = 1.0 + 0.25 * (1.0 + v)
    elif leaf in ("weight", "scale"):
        v = 1.0 + 0.1 * v
    else:
        v = 0.02 * v
    return v.reshape(shape).to(torch.float32)


@torch.no_grad()
def fill_deterministic(model: nn.Module) -> int:
    """Overwrite every floating state_dict entry by the parity rule; returns how many were filled."""
    filled = 0
    for name, tensor in model.state_dict(keep_vars=True).items():
        if not tensor.is_floating_point() or name in _UNFILLED_NAMES:
            continue
        if name.endswith(_UNFILLED_SUFFIXES):
            continue
        tensor.data.copy_(_deterministic_value(name, tensor.shape))
        filled += 1
    return filled


def deterministic_images() -> torch.Tensor:
    """[2, 3, 640, 640] float32 in [0, 1): 8x8-pixel cells with one hashed value each."""
    cells = (hash_uniform("images", 2 * 3 * 80 * 80).reshape(2, 3, 80, 80) + 1) / 2
    cells = cells.to(torch.float32)
    return cells.repeat_interleave(8, dim=2).repeat_interleave(8, dim=3)


# The image-inference records (an upstream's own inference script, its preprocessing included, on
# fixed images): how many of its best detections each image keeps, and the box-head scale of the
# weights they run.
TOP_DETECTIONS = 50
BOX_HEAD_SCALE = 0.1
# (height, width) of the fixed images: one at the network size (no resize), one that the size rule
# must stretch (shrunk in width, grown in height), so the comparison covers the resize too.
CONTRACT_IMAGE_SIZES = ((640, 640), (480, 800))
CONTRACT_CELL = 16  # pixels per hashed cell


def contract_images() -> list[np.ndarray]:
    """The fixed images of the inference records: uint8 RGB [H, W, 3], 16x16-pixel cells of hashed
    grey levels per channel (the parity hash, so any platform makes the same bytes)."""
    images = []
    for index, (height, width) in enumerate(CONTRACT_IMAGE_SIZES):
        rows, cols = -(-height // CONTRACT_CELL), -(-width // CONTRACT_CELL)
        cells = hash_uniform(f"contract-image-{index}", rows * cols * 3).reshape(rows, cols, 3)
        levels = ((cells + 1) * 127.5).round().clamp(0, 255).to(torch.uint8).numpy()
        grid = levels.repeat(CONTRACT_CELL, axis=0).repeat(CONTRACT_CELL, axis=1)
        images.append(np.ascontiguousarray(grid[:height, :width]))
    return images


@torch.no_grad()
def scale_box_heads(model: nn.Module, factor: float = BOX_HEAD_SCALE) -> None:
    """Scale every box head's weights of a parity-filled model. Under the plain fill the box heads
    saturate and every box collapses onto the image's corner; scaled, the top boxes spread over the
    image with several labels and decisive scores, so a change of the input's scale moves them."""
    for name, tensor in model.state_dict(keep_vars=True).items():
        if "bbox_head" in name and name.endswith(".weight"):
            tensor.data.mul_(factor)


def inference_record(pixels: np.ndarray, labels: Sequence, boxes: Sequence, scores: Sequence) -> dict:
    """One image's entry of an inference record: its size and sha256, and its `TOP_DETECTIONS` best
    detections (labels, boxes in image pixels, scores), best first."""
    order = sorted(range(len(scores)), key=lambda i: -float(scores[i]))[:TOP_DETECTIONS]
    return {
        "height": pixels.shape[0],
        "width": pixels.shape[1],
        "sha256": hashlib.sha256(pixels.tobytes()).hexdigest(),
        "labels": [int(labels[i]) for i in order],
        "boxes": [[round(float(v), 4) for v in boxes[i]] for i in order],
        "scores": [round(float(scores[i]), 6) for i in order],
    }


# Packages the upstreams import at module level for helpers a comparison never calls (a FLOP
# profiler; the validator's logger): attribute -> stand-in, so their code imports without them.
UNUSED_IMPORTS: dict[str, dict[str, object]] = {
    "calflops": {"calculate_flops": None},
    "loguru": {"logger": logging.getLogger("upstream")},
}


def stand_in_unused_imports() -> None:
    """Register an empty stand-in for each of `UNUSED_IMPORTS` that is not installed."""
    for name, attributes in UNUSED_IMPORTS.items():
        if importlib.util.find_spec(name) is None:
            sys.modules[name] = types.SimpleNamespace(**attributes)  # type: ignore[assignment]


def checkout_commit(checkout: Path) -> str | None:
    """The commit an upstream checkout is at (each record names the one it came from), or None
    after saying in one line that it is not a git checkout."""
    found = subprocess.run(["git", "-C", str(checkout), "rev-parse", "HEAD"], capture_output=True, text=True)
    if found.returncode != 0:
        print(f"{checkout}: not a git checkout; the record names the commit it came from", file=sys.stderr)
        return None
    return found.stdout.strip()


def load_parity(size: str) -> dict:
    """The recorded official outputs for one size ('n'..'x')."""
    path = DATA_DIR / f"parity_{size}.json"
    with path.open() as f:
        return json.load(f)


@dataclass
class Comparison:
    """Outcome of one set comparison: problems found and the worst differences seen."""

    what: str
    problems: list[str] = field(default_factory=list)
    max_diff: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems

    def note(self, key: str, value: float) -> None:
        self.max_diff[key] = max(self.max_diff.get(key, 0.0), float(value))

    def report(self) -> str:
        diffs = ", ".join(f"{k}={v:.3g}" for k, v in self.max_diff.items())
        head = f"{self.what}: {'PASS' if self.ok else 'FAIL'} (max diff: {diffs})"
        return "\n".join([head, *self.problems[:20]])


def _best_partner(row: torch.Tensor, candidates: torch.Tensor) -> tuple[int, float]:
    """Index and max-abs difference of the candidate row closest to `row` (Chebyshev)."""
    diff = (candidates - row).abs().amax(dim=1)
    best = int(diff.argmin())
    return best, float(diff[best])


def match_eval_slices(
    recorded: dict,
    pred_logits: torch.Tensor,
    pred_boxes: torch.Tensor,
    *,
    rows_searched: int = 16,
    atol: float = 1e-4,
    rtol_sums: float = 1e-4,
) -> Comparison:
    """Each recorded (8 logits + 4 box) query row must have a partner among our first 16 queries."""
    cmp = Comparison("eval")
    batch = pred_logits.shape[0]
    rec_logits = torch.tensor(recorded["pred_logits_slice"], dtype=torch.float64).reshape(batch, 8, 8)
    rec_boxes = torch.tensor(recorded["pred_boxes_slice"], dtype=torch.float64).reshape(batch, 8, 4)
    ours = torch.cat(
        [pred_logits[:, :rows_searched, :8], pred_boxes[:, :rows_searched, :]], dim=2
    ).double()  # [B, 16, 12]
    recorded_rows = torch.cat([rec_logits, rec_boxes], dim=2)  # [B, 8, 12]
    for b in range(batch):
        for q in range(recorded_rows.shape[1]):
            _, diff = _best_partner(recorded_rows[b, q], ours[b])
            cmp.note("slice", diff)
            if diff > atol:
                cmp.problems.append(f"image {b} recorded query {q}: nearest row differs by {diff:.3g}")
    sums = {
        "pred_logits_sum": pred_logits.double().sum(),
        "pred_logits_abs_sum": pred_logits.double().abs().sum(),
        "pred_boxes_sum": pred_boxes.double().sum(),
    }
    for key, value in sums.items():
        expected = recorded[key]
        rel = abs(float(value) - expected) / max(abs(expected), 1e-12)
        cmp.note(f"{key}_rel", rel)
        if rel > rtol_sums:
            cmp.problems.append(f"{key}: ours {float(value):.6f}, recorded {expected:.6f} (rel {rel:.3g})")
    return cmp


def match_deploy(
    recorded: dict,
    labels: torch.Tensor,
    boxes: torch.Tensor,
    scores: torch.Tensor,
    *,
    searched: int = 60,
    score_atol: float = 1e-4,
    box_atol: float = 0.02,
) -> Comparison:
    """Each recorded detection needs a partner in our first 60 with the same label, score and box."""
    cmp = Comparison("deploy")
    batch = labels.shape[0]
    rec_labels = torch.tensor(recorded["labels"], dtype=torch.int64).reshape(batch, -1)
    kept = rec_labels.shape[1]
    rec_boxes = torch.tensor(recorded["boxes"], dtype=torch.float64).reshape(batch, kept, 4)
    rec_scores = torch.tensor(recorded["scores"], dtype=torch.float64).reshape(batch, kept)
    for b in range(batch):
        our_labels = labels[b, :searched]
        our_rows = torch.cat(
            [scores[b, :searched, None].double(), boxes[b, :searched].double()], dim=1
        )  # [60, 5]: score, x1, y1, x2, y2
        for k in range(kept):
            same_label = our_labels == rec_labels[b, k]
            if not bool(same_label.any()):
                cmp.problems.append(f"image {b} detection {k}: label {int(rec_labels[b, k])} absent")
                continue
            candidates = our_rows[same_label]
            score_diff = (candidates[:, 0] - rec_scores[b, k]).abs()
            box_diff = (candidates[:, 1:] - rec_boxes[b, k]).abs().amax(dim=1)
            fits = (score_diff <= score_atol) & (box_diff <= box_atol)
            best = int(torch.argmin(score_diff / score_atol + box_diff / box_atol))
            cmp.note("score", score_diff[best])
            cmp.note("box_px", box_diff[best])
            if not bool(fits.any()):
                cmp.problems.append(
                    f"image {b} detection {k} (label {int(rec_labels[b, k])}, score "
                    f"{float(rec_scores[b, k]):.6f}): nearest differs by score "
                    f"{float(score_diff[best]):.3g}, box {float(box_diff[best]):.3g} px"
                )
    return cmp
