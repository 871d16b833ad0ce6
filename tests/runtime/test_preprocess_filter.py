"""The runtime shrinks a frame as training and `--test-only` do: on 4000x3000 photos `--test-only`
scored AP 0.58 and `dfine-bench` 0.54 on the same images, because the runtime's resize (cv2
INTER_LINEAR, 4 source pixels per output pixel at any scale) aliased what the trainer's Resize
(torchvision, antialiased) smoothed. Now both give the model the same pixels, to rounding; the export
gate's batches are the runtime's."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchvision import tv_tensors

from dfine_deploy.data.transforms import eval_transforms
from dfine_deploy.export.parity import make_batches
from dfine_deploy.runtime.preprocess import resize_batch


def _photo(height: int, width: int) -> np.ndarray:
    """Fine detail, as a sharp photo has: blocks of noise with one-pixel stripes across them."""
    rng = np.random.default_rng(0)
    blocks = rng.integers(0, 256, (height // 4 + 1, width // 4 + 1, 3), dtype=np.uint8)
    image = np.ascontiguousarray(np.repeat(np.repeat(blocks, 4, 0), 4, 1)[:height, :width])
    image[:, ::2, 1] = 255
    return image


@pytest.mark.parametrize(
    ("height", "width"),
    [(3000, 4000), (1200, 1600), (300, 4000), (200, 160)],  # 4:3 photos, a panorama, an upscale
)
def test_the_runtime_gives_the_model_the_pixels_test_only_gives_it(height, width):
    photo = _photo(height, width)
    image, _ = eval_transforms([640, 640])(tv_tensors.Image(torch.from_numpy(photo).permute(2, 0, 1)), {}, 0)
    trained_on = image.numpy() * 255.0  # [3, H, W] RGB
    runtime, sizes = resize_batch([photo], (640, 640), color="RGB")
    difference = np.abs(runtime[0] * 255.0 - trained_on)
    assert difference.mean() < 0.05 and difference.max() <= 1.0 + 1e-3, (difference.mean(), difference.max())
    assert sizes.tolist() == [[width, height]]
    (batch,) = make_batches([photo], 640, 640, [1])
    np.testing.assert_array_equal(batch.images, runtime)
