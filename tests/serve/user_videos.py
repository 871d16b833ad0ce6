"""Videos as users bring them, written at test time with PyAV (the `serve` extra's encoder).

Each holds the moving red square of `conftest.square_frame`, so a test can check where it lands.
"""

from __future__ import annotations

import os
import struct
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from conftest import square_frame

MS = Fraction(1, 1000)


def encode(
    path: Path,
    codec: str,
    frames: int = 6,
    size: tuple[int, int] = (160, 120),
    pix_fmt: str = "yuv420p",
    times_ms: list[int] | None = None,
    options: dict[str, str] | None = None,
) -> Path:
    """Write `frames` frames of the square; `times_ms` gives each frame's time (variable frame rate).

    SVT-AV1 (libsvtav1) run as root makes the calling thread SCHED_FIFO at priority 99, and every
    process and thread started from it after inherits that: one CI run hung when a torchrun rank
    of the same pytest worker never got the CPU. The policy is put back once the file is written."""
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        _write(path, codec, frames, size, pix_fmt, times_ms, options)
    finally:
        os.sched_setscheduler(0, policy, param)
    return path


def _write(path, codec, frames, size, pix_fmt, times_ms, options) -> None:
    with av.open(str(path), "w") as container:
        stream = container.add_stream(codec, rate=20, options=options or {})
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], pix_fmt
        if times_ms is not None:
            stream.time_base = stream.codec_context.time_base = MS
        for i in range(len(times_ms) if times_ms is not None else frames):
            frame = av.VideoFrame.from_ndarray(square_frame(i, size)[0], format="bgr24").reformat(
                format=pix_fmt
            )
            if times_ms is not None:
                frame.pts, frame.time_base = times_ms[i], MS
            container.mux(stream.encode(frame))
        container.mux(stream.encode())


def rotated(source: Path, path: Path, degrees: int) -> Path:
    """`source` (an MP4) with its track's display matrix set as a phone sets it: the pixels stay as
    recorded and players turn them `degrees` clockwise (90, 180 or 270)."""
    data = bytearray(source.read_bytes())
    box = data.find(b"tkhd")
    assert box > 0 and data[box + 4] == 0, f"{source}: no version-0 track header"
    one, minus = 0x10000, 0x100000000 - 0x10000
    a, b, c, d = {90: (0, one, minus, 0), 180: (minus, 0, 0, minus), 270: (0, minus, one, 0)}[degrees]
    # the 3x3 matrix follows the box type at 44 bytes: a b u / c d v / x y w (16.16, w 2.30)
    struct.pack_into(">9I", data, box + 44, a, b, 0, c, d, 0, 0, 0, 0x40000000)
    path.write_bytes(bytes(data))
    return path


def audio_only(path: Path) -> Path:
    """An AAC file without any video stream (a voice memo named .mp4)."""
    with av.open(str(path), "w") as container:
        stream = container.add_stream("aac", rate=16000)
        for i in range(8):
            frame = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            frame.sample_rate, frame.pts = 16000, i * 1024
            container.mux(stream.encode(frame))
        container.mux(stream.encode())
    return path
