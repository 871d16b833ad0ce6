"""What recording costs per frame: CPU time of the H.264 writer dfine-serve records with, against
OpenCV's MPEG-4 part 2 (`mp4v`) writer it used before and x264's next slower preset.

    python benchmarks/recording_cost.py [--size 1280x720] [--frames 300] [--fps 20] [--repeats 3]

Each writer encodes the same frames (a grey scene with moving boxes and text, what an annotated
camera frame looks like to an encoder) into a temporary file; CPU time of the whole process (all of
the encoder's threads) per frame is printed as min/median/max over --repeats, with the file size.
The first repeat warms up and is not counted.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import cv2
import numpy as np

from dfine_deploy.serve import recording


def scene(i: int, width: int, height: int) -> np.ndarray:
    image = np.full((height, width, 3), 70, np.uint8)
    cv2.rectangle(image, (0, height * 2 // 3), (width, height), (40, 90, 40), -1)  # ground
    for k in range(6):  # objects walking across, with boxes and captions as the annotator draws
        x = (37 * k + 4 * i) % (width - 80)
        y = height // 3 + 40 * k % (height // 3)
        cv2.rectangle(image, (x, y), (x + 60, y + 120), (30 + 30 * k, 60, 200), -1)
        cv2.rectangle(image, (x - 2, y - 2), (x + 62, y + 122), (0, 255, 0), 2)
        cv2.putText(image, f"person {k} 0.9", (x, y - 6), cv2.FONT_HERSHEY_SIMPLEX, 0.5, (255, 255, 255), 1)
    noise = np.random.default_rng(i).integers(0, 6, image.shape, np.uint8)  # sensor noise
    return cv2.add(image, noise)


def mp4v(path: Path, frames: list[np.ndarray], fps: float) -> None:
    h, w = frames[0].shape[:2]
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, (w, h))
    for frame in frames:
        writer.write(frame)
    writer.release()


def h264(preset: str):
    def write(path: Path, frames: list[np.ndarray], fps: float) -> None:
        options = {**recording.ENCODER_OPTIONS, "preset": preset}
        writer = recording._H264Writer(path, frames[0].shape[1], frames[0].shape[0], fps, options)
        for frame in frames:
            writer.write(frame)
        writer.close()

    return write


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="1280x720")
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--fps", type=float, default=20.0)
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    width, height = (int(v) for v in args.size.split("x"))
    frames = [scene(i, width, height) for i in range(args.frames)]
    writers = {
        "mp4v (OpenCV, before)": mp4v,
        f"h264 {recording.ENCODER_OPTIONS['preset']} (recording.py)": h264(
            recording.ENCODER_OPTIONS["preset"]
        ),
        "h264 veryfast": h264("veryfast"),
    }
    print(f"{args.frames} frames of {width}x{height} at {args.fps:g} fps; CPU ms per frame (min/median/max)")
    with tempfile.TemporaryDirectory() as tmp:
        for name, write in writers.items():
            costs = []
            for repeat in range(args.repeats + 1):
                path = Path(tmp) / f"{repeat}.mp4"
                start = time.process_time()
                write(path, frames, args.fps)
                if repeat:
                    costs.append((time.process_time() - start) / args.frames * 1000)
            size = path.stat().st_size / (args.frames / args.fps) * 8 / 1e6
            print(
                f"  {name:32s} {min(costs):6.2f} {statistics.median(costs):6.2f} {max(costs):6.2f} ms"
                f"   {size:.2f} Mbit/s"
            )


if __name__ == "__main__":
    main()
