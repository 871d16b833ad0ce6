"""Frames in, network input out, with no per-pixel Python.

Colour convention (the one rule to remember): frames from OpenCV (`cv2.imread`, `cv2.VideoCapture`)
are **BGR**; every exported graph wants **RGB** scaled to [0, 1] (`model/contracts.py`'s
`GRAPH_INPUT`; a family's own mean/std, ECDet's, is applied inside the graph).
`predict(frames, color="BGR")` is the default for that reason; pass `color="RGB"` for frames from
PIL, imageio or torchvision. The channel swap happens once, inside the same vectorised pass that
scales and transposes.

D-FINE resizes the whole frame to the network size (no letterbox, aspect ratio not kept) and maps
boxes back with `orig_target_sizes` (w, h) inside the graph. `letterbox` is for adapters of models
that were trained with padding (YOLO).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import cv2
import numpy as np

from dfine_deploy.errors import BackendError
from dfine_deploy.images import resize_as_trained
from dfine_deploy.model.contracts import GRAPH_INPUT

COLORS = ("BGR", "RGB")


def check_color(color: str) -> str:
    value = color.upper()
    if value not in COLORS:
        raise BackendError(f"color={color!r} is not a channel order; expected 'BGR' (OpenCV frames) or 'RGB'")
    return value


def _shape_fix(shape: tuple[int, ...]) -> str:
    """How to make an HxWx3 colour image of a frame of `shape`."""
    if len(shape) == 2 or (len(shape) == 3 and shape[2] == 1):
        return "convert grayscale with cv2.cvtColor(frame, cv2.COLOR_GRAY2BGR)"
    if len(shape) == 3 and shape[2] == 4:
        return "drop the alpha channel with cv2.cvtColor(frame, cv2.COLOR_BGRA2BGR)"
    if len(shape) == 3 and shape[0] == 3:
        return "it is channels-first: give frame.transpose(1, 2, 0)"
    return "give one HxWx3 image per frame"


def check_frames(frames: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Accept a list of HxWx3 uint8 frames (or a single frame) and say clearly what is wrong."""
    one = frames is None or isinstance(frames, (str, os.PathLike))
    if one or (isinstance(frames, np.ndarray) and frames.ndim in (2, 3)):
        frames = [frames]  # one frame: a wrong one is named by its own shape
    checked = []
    for i, frame in enumerate(frames):
        if frame is None:
            raise BackendError(
                f"frame {i}: got None, not an image (cv2.imread returns None for a file it cannot read: "
                "check the path)"
            )
        if isinstance(frame, (str, os.PathLike)):
            raise BackendError(
                f"frame {i}: got the path {os.fspath(frame)!r}, not an image; read it first with "
                "dfine_deploy.images.read_image(path) (EXIF orientation applied) or cv2.imread(path)"
            )
        if not isinstance(frame, np.ndarray):
            raise BackendError(f"frame {i}: expected a numpy array, got {type(frame).__name__}")
        if frame.ndim != 3 or frame.shape[2] != 3:
            raise BackendError(
                f"frame {i}: expected an HxWx3 colour image, got shape {frame.shape}; "
                + _shape_fix(frame.shape)
            )
        if frame.dtype != np.uint8:
            raise BackendError(
                f"frame {i}: expected uint8 pixels (0..255), got {frame.dtype}; "
                "convert with (frame * 255).clip(0, 255).astype(np.uint8) if it is in [0, 1]"
            )
        if frame.shape[0] == 0 or frame.shape[1] == 0:
            raise BackendError(f"frame {i}: empty image of shape {frame.shape}")
        checked.append(frame)
    return checked


def to_tensor(batch_hwc: np.ndarray, color: str) -> np.ndarray:
    """[N, H, W, 3] uint8 in `color` order -> [N, 3, H, W] float32 as the graphs take it
    (`GRAPH_INPUT`: RGB in [0, 1]), one pass."""
    channels_first = batch_hwc.transpose(0, 3, 1, 2)  # [N, 3, H, W] view
    if color != GRAPH_INPUT.colour:
        channels_first = channels_first[:, ::-1]  # BGR <-> RGB, still a view
    out = np.empty(channels_first.shape, dtype=np.float32)
    np.multiply(channels_first, np.float32(GRAPH_INPUT.scale), out=out, casting="unsafe")
    return out


def resize_batch(
    frames: Sequence[np.ndarray], size_hw: tuple[int, int], color: str = "BGR", *, raw_pixels: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """Resize every frame to the network size (the D-FINE way).

    Returns images float32 [N, 3, H, W] RGB in [0, 1] and orig_target_sizes int64 [N, 2] as (w, h).
    With `raw_pixels` the images stay as resized, uint8 [N, H, W, 3] BGR, for a backend that converts
    them inside its graph (`Backend.raw_pixels`).
    """
    color = check_color(color)
    frames = check_frames(frames)
    height, width = size_hw
    batch = np.empty((len(frames), height, width, 3), dtype=np.uint8)  # [N, H, W, 3]
    sizes = np.empty((len(frames), 2), dtype=np.int64)  # [N, 2] (w, h)
    for i, frame in enumerate(frames):
        sizes[i] = (frame.shape[1], frame.shape[0])
        batch[i] = frame if frame.shape[:2] == (height, width) else resize_as_trained(frame, (width, height))
        if raw_pixels and color == "RGB":
            cv2.cvtColor(batch[i], cv2.COLOR_RGB2BGR, dst=batch[i])  # the graph takes BGR
    return (batch if raw_pixels else to_tensor(batch, color)), sizes


def letterbox_batch(
    frames: Sequence[np.ndarray], size_hw: tuple[int, int], color: str = "BGR", pad_value: int = 114
) -> tuple[np.ndarray, np.ndarray]:
    """Resize keeping the aspect ratio and pad to the network size (the YOLO way).

    Returns images float32 [N, 3, H, W] RGB in [0, 1] and the transform per frame, float32 [N, 3]
    as (gain, pad_x, pad_y): original pixel = (network pixel - pad) / gain.
    """
    color = check_color(color)
    frames = check_frames(frames)
    height, width = size_hw
    batch = np.full((len(frames), height, width, 3), pad_value, dtype=np.uint8)  # [N, H, W, 3]
    transforms = np.empty((len(frames), 3), dtype=np.float32)
    for i, frame in enumerate(frames):
        frame_h, frame_w = frame.shape[:2]
        gain = min(height / frame_h, width / frame_w)
        new_w, new_h = max(1, round(frame_w * gain)), max(1, round(frame_h * gain))
        pad_x, pad_y = (width - new_w) // 2, (height - new_h) // 2
        target = batch[i, pad_y : pad_y + new_h, pad_x : pad_x + new_w]
        target[...] = cv2.resize(frame, (new_w, new_h), interpolation=cv2.INTER_LINEAR)
        transforms[i] = (gain, pad_x, pad_y)
    return to_tensor(batch, color), transforms
