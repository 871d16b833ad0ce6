"""Checks on uploaded images before they cost memory: type, header dimensions, then decode.

The pixel count is read from the file header (JPEG SOF, PNG IHDR, BMP, WebP) *before* decoding, so a
small file that would inflate to gigabytes (a decompression bomb) is refused for the price of a few
bytes of parsing. The decode is the one every stage uses (dfine_deploy.images: EXIF orientation
applied), so a photo is detected as it was trained and as it is shown.
"""

from __future__ import annotations

import struct

import numpy as np

from dfine_deploy.errors import ImageError
from dfine_deploy.images import read_image

ACCEPTED_TYPES = ("image/jpeg", "image/png", "image/bmp", "image/webp")
# JPEG start-of-frame markers carry the size; C4 (DHT), C8 (JPG) and CC (DAC) share the range but do not.
_SOF_MARKERS = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}


class ImageRejected(ValueError):
    """The upload is not an image we can use; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    i = 2
    while i + 4 <= len(data):
        if data[i] != 0xFF:
            return None
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:  # markers without a length
            i += 2
            continue
        (length,) = struct.unpack(">H", data[i + 2 : i + 4])
        if marker in _SOF_MARKERS and i + 9 <= len(data):
            height, width = struct.unpack(">HH", data[i + 5 : i + 9])
            return width, height
        i += 2 + length
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8X" and len(data) >= 30:
        return 1 + int.from_bytes(data[24:27], "little"), 1 + int.from_bytes(data[27:30], "little")
    if chunk == b"VP8 " and len(data) >= 30:
        w, h = struct.unpack("<HH", data[26:30])
        return w & 0x3FFF, h & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    return None


def header_size(data: bytes) -> tuple[str, tuple[int, int] | None]:
    """(format, (width, height) from the header or None); format is '' for unknown bytes."""
    if data[:3] == b"\xff\xd8\xff":
        return "jpeg", _jpeg_size(data)
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return "png", (
            struct.unpack(">II", data[16:24]) if len(data) >= 24 and data[12:16] == b"IHDR" else None
        )
    if data[:2] == b"BM" and len(data) >= 26:
        w, h = struct.unpack("<ii", data[18:26])
        return "bmp", (abs(w), abs(h))
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "webp", _webp_size(data)
    return "", None


def decode_upload(data: bytes, content_type: str | None, max_pixels: int) -> np.ndarray:
    """A BGR image from uploaded bytes, or ImageRejected with 415 (type), 413 (too many pixels) or 400."""
    media = (content_type or "").split(";")[0].strip().lower()
    if media not in ACCEPTED_TYPES and media != "application/octet-stream":
        raise ImageRejected(
            415,
            f"content type {media or '(none)'!r} is not accepted; send one of {', '.join(ACCEPTED_TYPES)}",
        )
    if not data:
        raise ImageRejected(400, "the upload is empty; send the image bytes")
    fmt, size = header_size(data)
    if not fmt:
        raise ImageRejected(
            400, "the upload is not a JPEG, PNG, BMP or WebP image (unrecognised first bytes)"
        )
    if size is None:
        raise ImageRejected(400, f"the {fmt.upper()} header is corrupt: no image dimensions found")
    width, height = size
    if width <= 0 or height <= 0:
        raise ImageRejected(400, f"the {fmt.upper()} header claims an empty image ({width}x{height})")
    if width * height > max_pixels:
        raise ImageRejected(
            413,
            f"the image is {width}x{height} = {width * height} pixels; "
            f"this server accepts at most {max_pixels}",
        )
    try:
        return read_image(data, color="BGR")
    except ImageError as exc:
        raise ImageRejected(
            400, f"the {fmt.upper()} image could not be decoded ({exc.reason}); send an undamaged image"
        ) from None
