"""The one way an image file becomes pixels, for every stage.

Training, `dfine-data validate`, evaluation (`--test-only`), `dfine-bench --data`, the export gate and
INT8 calibration, serve uploads and the quickstart's pictures all call `read_image`, so a file gives
the same pixels everywhere. The policy (docs/images.md) is to show what image viewers
and labelling tools show:

- EXIF orientation (tags 2..8, from EXIF, TIFF tags or XMP) is applied: the pixels and the size are
  those of the image as shown, turned or mirrored back upright.
- 16-bit samples keep their high byte (v >> 8, so 65535 -> 255), as libpng and OpenCV reduce them;
  a 16-bit PNG is neither clipped to white nor stretched.
- Bilevel, grayscale, palette, CMYK and YCbCr images become RGB by Pillow's conversion; embedded ICC
  profiles are not applied (OpenCV ignores them too).
- Alpha is dropped: the colour stored under a transparent pixel is used, as OpenCV's IMREAD_COLOR,
  torchvision's RGB mode and Pillow's convert("RGB") do, so a model trained here sees what a
  deployment reading frames with OpenCV feeds it.
- Floating-point images are refused: there is no agreed 8-bit view of them.
- Only the formats of `IMAGE_SUFFIXES` are read (`READ_FORMATS`), whatever a file is named: a GIF,
  PSD or EPS is refused with one line everywhere, as a folder search never finds one.
- A file of several frames or pages (animated WebP or PNG, multi-page TIFF, a phone's MPO) gives
  its first; `ImageInfo.frames` says how many it holds, which validation counts.

Pillow decodes every format, because it reads the orientation of every format that carries one
(OpenCV never applies it with IMREAD_UNCHANGED, and OpenCV 5.0 could not read a turned TIFF) and
because it reads a header without decoding the pixels, which `probe_image` gives validation.
"""

from __future__ import annotations

import functools
import io
import math
import os
from dataclasses import dataclass
from typing import Union

import cv2
import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from dfine_deploy.errors import ImageError

# Bump when the policy changes the pixels a file gives: caches of decoded images key on it.
POLICY_VERSION = 1
COLOR_ORDERS = ("RGB", "BGR")
# What counts as an image file wherever a folder is searched (YOLO sets, --data folders, streams).
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".webp", ".tif", ".tiff")
# Pillow's names of the formats of those suffixes; MPO is a JPEG with more pictures after the first,
# as phones save portrait and burst shots.
READ_FORMATS = ("JPEG", "MPO", "PNG", "BMP", "WEBP", "TIFF")
ORIENTATION_TAG = 0x0112
# what a viewer does to the stored pixels for each EXIF orientation value
ORIENTATIONS = {
    1: "shown as stored",
    2: "mirrored left-right",
    3: "turned 180 degrees",
    4: "mirrored top-bottom",
    5: "mirrored about the main diagonal",
    6: "turned 90 degrees clockwise",
    7: "mirrored about the other diagonal",
    8: "turned 90 degrees counter-clockwise",
}
# Pillow's modes whose samples are wider than 8 bits (it holds 16-bit grayscale in these).
_WIDE_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")
_REFUSED_MODES = {"F": "32-bit floating-point samples have no agreed 8-bit view; save it as 8 or 16-bit"}
_ALPHA_MODES = ("RGBA", "RGBa", "LA", "La", "PA")
# the colour mode under an alpha channel or a padding byte
_BASE_MODE = {"RGBA": "RGB", "RGBa": "RGB", "RGBX": "RGB", "LA": "L", "La": "L", "PA": "P"}
_DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError)
Source = Union[str, os.PathLike, bytes]  # typing.Union: evaluated at import, and `|` needs 3.10


@dataclass(frozen=True)
class ImageInfo:
    """What a file's header says, and so what `read_image` will make of it."""

    format: str  # Pillow's format name: JPEG, PNG, TIFF, ...
    mode: str  # Pillow's mode as stored: RGB, L, P, CMYK, I;16, RGBA, LA, ...
    stored_size: tuple[int, int]  # (w, h) of the pixels as stored
    orientation: int  # EXIF orientation 1..8; 1 when the file has none (or an invalid one)
    bits: int  # bits per sample as stored (16 for 16-bit PNG/TIFF, else 8; 1 for bilevel)
    alpha: bool  # an alpha channel or a transparent colour, which the reader drops
    frames: int = 1  # frames or pages in the file; the reader gives the first

    @property
    def size(self) -> tuple[int, int]:
        """(w, h) as shown: what `read_image` returns; orientations 5..8 swap the sides."""
        w, h = self.stored_size
        return (h, w) if self.orientation >= 5 else (w, h)

    @property
    def converted_mode(self) -> bool:
        """The stored colours are not RGB (grayscale, palette, CMYK, ...): the reader converts them."""
        return _BASE_MODE.get(self.mode, self.mode) != "RGB"


def probe_image(source: Source) -> ImageInfo:
    """The header of an image file: sizes, orientation, mode; an ImageError if it is no image we read.

    The pixels are not decoded, except a PNG's: Pillow decodes it to find EXIF stored after them."""
    with _open(source) as img:
        try:
            bits = _bits(img)  # before the orientation: finding a PNG's EXIF may decode it
            return ImageInfo(
                format=img.format or "",
                mode=img.mode,
                stored_size=_stored_size(img),
                orientation=_orientation(img),
                bits=bits,
                alpha=img.mode in _ALPHA_MODES or "transparency" in img.info,
                frames=img.n_frames if getattr(img, "is_animated", False) else 1,
            )
        except _DECODE_ERRORS as exc:
            raise _corrupt(source, exc) from None


def read_image(source: Source, *, color: str = "RGB") -> np.ndarray:
    """The pixels of an image file (a path, or the bytes of one) as viewers show them.

    Returns a writable, contiguous uint8 [H, W, 3] array in RGB (the model's order), or in BGR
    (OpenCV's order, for drawing and for `Detector.predict`'s default) with `color="BGR"`.
    Raises ImageError, naming the file, for missing, unreadable or damaged data.
    """
    if color not in COLOR_ORDERS:
        raise ValueError(f"color={color!r}; expected one of {COLOR_ORDERS}")
    with _open(source) as img:
        try:
            if _orientation(img) != 1:
                ImageOps.exif_transpose(img, in_place=True)
            rgb = _to_rgb(img)
        except _DECODE_ERRORS as exc:
            raise _corrupt(source, exc) from None
    return rgb if color == "RGB" else np.ascontiguousarray(rgb[:, :, ::-1])


def orient_boxes(boxes: np.ndarray, orientation: int, stored_size: tuple[int, int]) -> np.ndarray:
    """xyxy boxes [n, 4] drawn on the stored pixels, moved to the image as shown (after `orientation`).

    For annotations made where the EXIF orientation was ignored; `stored_size` is (w, h) as stored.
    """
    w, h = stored_size
    x1, y1, x2, y2 = (boxes[:, i] for i in range(4))
    corners = {  # where the stored corners (x1, y1) and (x2, y2) land, per ORIENTATIONS
        1: (x1, y1, x2, y2),
        2: (w - x1, y1, w - x2, y2),
        3: (w - x1, h - y1, w - x2, h - y2),
        4: (x1, h - y1, x2, h - y2),
        5: (y1, x1, y2, x2),
        6: (h - y1, x1, h - y2, x2),
        7: (h - y1, w - x1, h - y2, w - x2),
        8: (y1, w - x1, y2, w - x2),
    }[orientation]
    ax, ay, bx, by = corners
    return np.stack([np.minimum(ax, bx), np.minimum(ay, by), np.maximum(ax, bx), np.maximum(ay, by)], 1)


def _name(source: Source) -> str:
    """The file as the error names it: on one line, though its name holds a newline."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return "(uploaded bytes)"
    return str(source).replace("\n", "\\n")


def _corrupt(source: Source, exc: BaseException) -> ImageError:
    reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return ImageError(_name(source), reason, corrupt=True)


def _open(source: Source) -> Image.Image:
    """Pillow's lazy image (only the header read), its mode checked against the policy."""
    try:
        img = Image.open(io.BytesIO(source) if isinstance(source, (bytes, bytearray, memoryview)) else source)
    except FileNotFoundError:
        raise ImageError(_name(source), "no such file", corrupt=False) from None
    except UnidentifiedImageError:  # Pillow's text repeats the file's name, or a BytesIO's address
        reason = "Pillow cannot identify it as an image (cut short, damaged, or not an image)"
        raise ImageError(_name(source), reason, corrupt=False) from None
    except Image.DecompressionBombError as exc:
        reason = (
            f"{str(exc).split(', could be')[0]} (Pillow's guard against decompression bombs); downscale it"
        )
        raise ImageError(_name(source), reason, corrupt=False) from None
    except _DECODE_ERRORS as exc:
        raise _corrupt(source, exc) from None
    if img.format not in READ_FORMATS:
        img.close()
        raise ImageError(
            _name(source),
            f"{img.format} is not a format the tools read ({', '.join(IMAGE_SUFFIXES)}); convert it to PNG",
            corrupt=False,
        )
    if img.mode in _REFUSED_MODES:
        img.close()
        raise ImageError(_name(source), f"mode {img.mode}: {_REFUSED_MODES[img.mode]}", corrupt=False)
    return img


def _orientation(img: Image.Image) -> int:
    """The EXIF orientation that Pillow's exif_transpose applies (an out-of-range value counts as 1)."""
    value = img.getexif().get(ORIENTATION_TAG, 1)
    return value if isinstance(value, int) and 1 <= value <= 8 else 1


def _stored_size(img: Image.Image) -> tuple[int, int]:
    """(w, h) as stored. Recent Pillow reports a TIFF's size already turned by its orientation (and
    turns its pixels on load), so a TIFF's comes from its own width and length tags."""
    if img.format == "TIFF":
        return int(img.tag_v2[256]), int(img.tag_v2[257])  # ImageWidth, ImageLength
    return img.size


def _bits(img: Image.Image) -> int:
    """Bits per sample as stored: Pillow opens 16-bit RGB PNG and TIFF as 8-bit RGB, so the raw
    mode of the undecoded data says what the mode does not."""
    if img.mode in _WIDE_MODES:
        return 16
    if img.mode == "1":
        return 1
    for tile in img.tile:
        args = tile[3]
        rawmode = args if isinstance(args, str) else args[0] if isinstance(args, tuple) and args else ""
        if isinstance(rawmode, str) and ";16" in rawmode:
            return 16
    return 8


def _to_rgb(img: Image.Image) -> np.ndarray:
    """8-bit RGB pixels by the module's policy (16-bit: high byte; alpha dropped; modes converted)."""
    if img.mode in _WIDE_MODES:
        wide = np.asarray(img)  # [H, W] uint16 (any byte order) or int32
        gray = (np.clip(wide, 0, 65535).astype(np.uint16) >> 8).astype(np.uint8)
        return np.repeat(gray[:, :, None], 3, axis=2)  # [H, W, 3]
    if img.mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")  # Pillow's own route for a transparent palette entry
    return np.array(img if img.mode == "RGB" else img.convert("RGB"))  # a copy: callers may write


def resize_as_trained(frame: np.ndarray, size_wh: tuple[int, int]) -> np.ndarray:
    """`frame` (uint8 [H, W, C]) resized to `size_wh` as training and `--test-only` resize it
    (torchvision's Resize: bilinear with antialiasing, a triangle filter that widens with the scale
    where it shrinks), to within a grey level on photos (tests/runtime/test_preprocess_filter.py).

    cv2's INTER_LINEAR alone reads 4 pixels per output pixel whatever the scale: a 4000x3000 photo
    shrunk to 640 px keeps about one pixel in six, aliased, and the model, trained on smoothed images,
    scored it lower (AP 0.54 against 0.58 on the same photos). PIL's BILINEAR gives torchvision's
    pixels to rounding but took 15 ms for a 1080p frame on a 2-core EPYC, ten times INTER_LINEAR.
    So each shrunk axis is first smoothed by a short kernel (`_prefilter`) at source size, then
    INTER_LINEAR samples it: a few ms, all in OpenCV. Growing needs no smoothing: INTER_LINEAR is
    then the same filter as torchvision's."""
    height, width = frame.shape[:2]
    kernel_x, kernel_y = _prefilter(width, size_wh[0]), _prefilter(height, size_wh[1])
    if kernel_x is not None or kernel_y is not None:
        identity = np.ones(1, np.float32)
        frame = cv2.sepFilter2D(
            frame,
            -1,
            identity if kernel_x is None else kernel_x,
            identity if kernel_y is None else kernel_y,
            borderType=cv2.BORDER_REFLECT,
        )
    return cv2.resize(frame, size_wh, interpolation=cv2.INTER_LINEAR)


@functools.lru_cache(maxsize=64)
def _prefilter(source: int, target: int) -> np.ndarray | None:
    """The symmetric kernel that, followed by linear interpolation, comes closest (least squares)
    to the antialiased weights torchvision and PIL give each output pixel when `source` pixels
    shrink to `target`; None when the axis does not shrink.

    Those weights are a triangle of half-width s = source / target centred on each output pixel,
    and their taps shift with the output pixel's phase on the source grid when s is not a whole
    number, which one fixed kernel cannot follow exactly: the fit spreads that residual over the
    phases. Cached, as video frames repeat sizes."""
    scale = source / target
    if scale <= 1.0:
        return None
    radius = math.ceil(scale)
    span = np.arange(-radius - 1, radius + 3)  # source offsets from the left interpolation tap
    rows, wanted = [], []
    for i in range(target):
        centre = (i + 0.5) * scale  # in source pixels, whose centres are at j + 0.5
        left = math.floor(centre - 0.5)
        if left - 2 * radius - 2 < 0 or left + 2 * radius + 3 >= source:
            continue  # near a border, where the triangle is cut: the interior decides the fit
        taps = np.maximum(0.0, 1.0 - np.abs((left + span + 0.5 - centre) / scale))
        wanted.append(taps / taps.sum())
        frac = centre - 0.5 - left
        columns = []
        for k in range(radius + 1):  # kernel tap k (and -k), then the two interpolation taps
            column = np.zeros(len(span))
            for offset in {k, -k}:
                column[offset + radius + 1] += 1.0 - frac
                column[offset + radius + 2] += frac
            columns.append(column)
        rows.append(np.stack(columns, 1))
        if len(rows) == 256:  # more rows repeat phases already seen
            break
    if not rows:  # too few source pixels for an interior: a plain triangle of the scale
        half = np.maximum(0.0, 1.0 - np.arange(radius) / scale)
    else:
        # the kernel's sum is held at 1 (a flat image stays flat) by one heavily weighted row
        total = np.array([1.0] + [2.0] * radius)
        system = np.vstack([np.concatenate(rows), 1e3 * total])
        goal = np.concatenate([*wanted, [1e3]])
        half = np.linalg.lstsq(system, goal, rcond=None)[0]
    kernel = np.concatenate([half[:0:-1], half])
    if len(kernel) > 1 and abs(kernel[0]) < 1e-6:  # whole scales fit zero end taps: drop them
        kernel = kernel[1:-1]
    return (kernel / kernel.sum()).astype(np.float32)
