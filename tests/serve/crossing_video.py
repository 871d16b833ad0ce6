"""A small generated video whose objects cross the middle of the frame on known paths, for counting tests.

320×240 at 20 fps, 40 frames (2 s), meant to be served with `loop: true`: a red square moves right along
the top band and a blue one left along the bottom band, each crossing x=160 once per loop. The fake
detector (fake_detector.py) sees them as 'red-square' and 'blue-square'.
"""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np

SIZE = (320, 240)  # w, h
FPS = 20
FRAMES = 40
SIDE = 24
TOP_Y, BOTTOM_Y = 40, 170  # the squares' top edges
RED, BLUE = (0, 0, 255), (255, 0, 0)  # BGR


def positions(i: int) -> dict[str, tuple[int, int]]:
    """Top-left corner of each square in frame i (of one loop)."""
    travel = SIZE[0] - SIDE - 20
    step = travel / (FRAMES - 1)
    return {"red": (10 + round(step * i), TOP_Y), "blue": (10 + travel - round(step * i), BOTTOM_Y)}


def write_crossing_video(path: Path) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), FPS, SIZE)
    assert writer.isOpened(), f"OpenCV cannot write mp4v to {path}"
    for i in range(FRAMES):
        image = np.full((SIZE[1], SIZE[0], 3), 60, np.uint8)
        for colour, (x, y) in zip((RED, BLUE), positions(i).values(), strict=True):
            cv2.rectangle(image, (x, y), (x + SIDE - 1, y + SIDE - 1), colour, -1)
        writer.write(image)
    writer.release()
    return path
