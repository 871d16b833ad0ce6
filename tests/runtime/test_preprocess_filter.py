"""The runtime shrinks a frame as training and `--test-only` do: on 4000x3000 photos `--test-only`
scored AP 0.58 and `dfine-bench` 0.54 on the same images, because the runtime's resize (cv2
INTER_LINEAR, 4 source pixels per output pixel at any scale) aliased what the trainer's Resize
(torchvision, antialiased) smoothed. The runtime's resize (`resize_as_trained`, all OpenCV) stays
within half a grey level on average of torchvision's on photo-like frames at the sizes cameras and
phones give; INTER_LINEAR alone is several levels off there. The export gate's batches are the
runtime's."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch
from torchvision import tv_tensors

from dfine_deploy.data.transforms import eval_transforms
from dfine_deploy.export.parity import make_batches
from dfine_deploy.images import resize_as_trained
from dfine_deploy.runtime.preprocess import resize_batch

MEAN_LEVELS = 0.5  # mean |runtime - torchvision| over all samples, in grey levels of 255
RARE_LEVELS = 8  # the 99.9th percentile: a few edge pixels of a thousand may differ more
MAX_LEVELS = 16


def _scene(height: int, width: int) -> np.ndarray:
    """Photo-like content: smooth shading, sensor noise, sharp-edged objects and one-pixel lines."""
    rng = np.random.default_rng(1)
    shading = rng.integers(0, 256, (height // 64 + 2, width // 64 + 2, 3), dtype=np.uint8)
    image = cv2.resize(shading, (width, height), interpolation=cv2.INTER_CUBIC).astype(np.int16)
    image += rng.normal(0, 12, image.shape).astype(np.int16)
    for _ in range(40):
        colour = [int(v) for v in rng.integers(0, 256, 3)]
        x, y = int(rng.integers(0, width)), int(rng.integers(0, height))
        corner = (x + int(rng.integers(5, width // 8)), y + int(rng.integers(5, height // 8)))
        cv2.rectangle(image, (x, y), corner, colour, -1)
        ends = [(int(rng.integers(0, width)), int(rng.integers(0, height))) for _ in range(2)]
        cv2.line(image, ends[0], ends[1], colour, 1)
    return np.clip(image, 0, 255).astype(np.uint8)


def _stripes(height: int, width: int) -> np.ndarray:
    """The worst case: blocks of noise with a one-pixel stripe every other column (a Nyquist pattern)."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (height // 4 + 1, width // 4 + 1, 3), dtype=np.uint8)
    image = np.ascontiguousarray(np.repeat(np.repeat(blocks, 4, 0), 4, 1)[:height, :width])
    image[:, ::2, 1] = 255
    return image


def _trained_on(image: np.ndarray) -> np.ndarray:
    """What training feeds the model at 640x640: float [3, H, W] RGB in grey levels."""
    tensor = tv_tensors.Image(torch.from_numpy(image).permute(2, 0, 1))
    return eval_transforms([640, 640])(tensor, {}, 0)[0].numpy() * 255.0


def _off_by(resized_hwc: np.ndarray, image: np.ndarray) -> tuple[float, float, float]:
    """(mean, 99.9th percentile, max) of |resized - torchvision's| in grey levels."""
    difference = np.abs(resized_hwc.transpose(2, 0, 1).astype(np.float64) - _trained_on(image))
    return float(difference.mean()), float(np.percentile(difference, 99.9)), float(difference.max())


def _within_tolerance(off: tuple[float, float, float]) -> bool:
    mean, rare, most = off
    return mean <= MEAN_LEVELS and rare <= RARE_LEVELS + 1e-3 and most <= MAX_LEVELS + 1e-3


@pytest.mark.parametrize(
    ("height", "width"),
    [(1080, 1920), (720, 1280), (1079, 1917), (3000, 4000), (300, 4000)],  # video, odd sizes, photos
)
def test_the_runtime_gives_the_model_the_pixels_test_only_gives_it(height, width):
    scene = _scene(height, width)
    runtime, sizes = resize_batch([scene], (640, 640), color="RGB")
    off = _off_by(np.round(runtime[0].transpose(1, 2, 0) * 255.0), scene)
    assert _within_tolerance(off), off
    assert sizes.tolist() == [[width, height]]
    (batch,) = make_batches([scene], 640, 640, [1])
    np.testing.assert_array_equal(batch.images, runtime)


def test_growing_a_small_image_is_torchvisions_bilinear_to_rounding():
    scene = _scene(200, 160)
    mean, _, most = _off_by(resize_as_trained(scene, (640, 640)), scene)
    assert mean < 0.25 and most <= 1.0 + 1e-3, (mean, most)


def test_a_nyquist_pattern_stays_within_a_few_levels():
    """One fixed kernel cannot follow the phase of every output pixel; this bounds what that costs."""
    stripes = _stripes(1080, 1920)
    mean, _, most = _off_by(resize_as_trained(stripes, (640, 640)), stripes)
    assert mean < 1.5 and most <= 24, (mean, most)


def test_plain_linear_interpolation_fails_the_tolerance_on_a_big_downscale():
    """The reason the filter exists: without it a 4000x3000 photo is aliased past the tolerance."""
    scene = _scene(3000, 4000)
    off = _off_by(cv2.resize(scene, (640, 640), interpolation=cv2.INTER_LINEAR), scene)
    assert not _within_tolerance(off), off
