"""Memory of a server that stores events for a long time: resident memory (RSS) while events flow.

    python benchmarks/events_soak.py [--minutes 10] [--streams 4] [--sample-s 10] [--model DIR]

dfine-serve's own pipeline, in this process, serves --streams looped copies of the quickstart's demo
video (dfine_deploy/data/moving.py) as fast as they decode, with tracking and its counting line, and
stores every crossing with its snapshot in a temporary `--events` folder (the server's default
retention). The detector finds the demo's objects by their colours, so no model and no GPU are
needed and nearly all the time goes to serving; `--model` serves an export instead (as dfine-serve
opens it), so the model's own memory is in the figure too. Every --sample-s seconds it prints the RSS and the
events stored so far. Acceptance (docs/serving-fleet.md): at the end, RSS within 2 MB of its value
at minute 3 (the warm-up: caches and allocator pools fill in the first minutes).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from dfine_deploy.data.moving import CLASS_COLOURS, DemoVideo
from dfine_deploy.serve.pipeline import StreamPipeline
from dfine_deploy.serve.settings import ServeSettings, StreamSpec

COLOUR_TOLERANCE = 45  # per channel, around the class colour (compression shifts it a little)
MIN_PIXELS = 300


@dataclass
class _Detections:
    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    names: list[str]  # one per box


class ColourDetector:
    """Every blob of one of the demo's class colours is an object of that class."""

    backend_name = "colour"
    provider = "numpy"
    max_batch = 8
    names = list(CLASS_COLOURS)

    def predict(self, frames, *, color: str = "BGR") -> list[_Detections]:
        return [self._detect(frame) for frame in frames]

    def _detect(self, frame: np.ndarray) -> _Detections:
        boxes, labels = [], []
        for label, colour in enumerate(CLASS_COLOURS.values()):
            low = np.clip(np.array(colour) - COLOUR_TOLERANCE, 0, 255).astype(np.uint8)
            high = np.clip(np.array(colour) + COLOUR_TOLERANCE, 0, 255).astype(np.uint8)
            count, _, stats, _ = cv2.connectedComponentsWithStats(cv2.inRange(frame, low, high))
            for x, y, w, h, area in stats[1:count]:
                if area >= MIN_PIXELS:
                    boxes.append((x, y, x + w, y + h))
                    labels.append(label)
        return _Detections(
            np.array(boxes, np.float32).reshape(-1, 4),
            np.full(len(boxes), 0.9, np.float32),
            np.array(labels, np.int64),
            [self.names[label] for label in labels],
        )


def rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def soak(
    seconds: float,
    streams: int,
    sample_s: float,
    folder: Path,
    video: DemoVideo | None = None,
    report=print,
    model: str | None = None,
) -> list[tuple]:
    """Serve `video` (the quickstart's by default) for `seconds`, with the colour detector or the
    export `model`; returns [(elapsed s, RSS MB, events stored, Python heap blocks)] every
    `sample_s`. The blocks (`sys.getallocatedblocks`) count Python objects alone: a store that keeps
    something per event grows them whatever the allocator and the machine's load do to the RSS."""
    video = video or DemoVideo()
    path = video.write(folder / "demo.mp4")
    settings = ServeSettings(events_dir=folder / "events", max_streams=streams, model=model or "")
    if model:
        from dfine_deploy.serve.app import load_detector

        detector = load_detector(settings)
    else:
        detector = ColourDetector()
    pipeline = StreamPipeline(detector, settings)
    pipeline.start()
    samples = []
    try:
        for i in range(streams):
            spec = StreamSpec(
                url=str(path), name=f"demo-{i}", loop=True, realtime=False, every_frame=True, track=True,
                lines=[video.line],
            )  # fmt: skip
            pipeline.add_stream(spec, trusted=True)
        start = time.monotonic()
        while True:
            elapsed = time.monotonic() - start
            stored = len(pipeline.events.store)
            blocks = sys.getallocatedblocks()
            rss = rss_mb()
            samples.append((elapsed, rss, stored, blocks))
            report(f"{elapsed:7.0f} s  RSS {rss:7.1f} MB  events stored {stored}  heap blocks {blocks}")
            if elapsed >= seconds:
                return samples
            time.sleep(min(sample_s, seconds - elapsed + 0.01))
    finally:
        pipeline.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--streams", type=int, default=4)
    p.add_argument("--sample-s", type=float, default=10.0)
    p.add_argument("--model", help="an export folder to serve instead of the colour detector")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        samples = soak(args.minutes * 60, args.streams, args.sample_s, Path(tmp), model=args.model)
    at_3 = min(samples, key=lambda s: abs(s[0] - 180))
    end = samples[-1]
    after = [s for s in samples if s[0] >= at_3[0]]
    slope = np.polyfit([s[0] / 60 for s in after], [s[1] for s in after], 1)[0] if len(after) > 1 else 0.0
    print(
        f"RSS at {at_3[0]:.0f} s {at_3[1]:.1f} MB, at the end ({end[0]:.0f} s) {end[1]:.1f} MB: "
        f"{end[1] - at_3[1]:+.1f} MB with {end[2] - at_3[2]} more events (goal: within 2 MB); "
        f"slope after minute 3 {slope:+.2f} MB/min; Python heap blocks {end[3] - at_3[3]:+d}"
    )


if __name__ == "__main__":
    main()
