"""The served tracker's settings, measured: each value of the lost-track time and of the score that
starts a track, on generated videos with their ground truth, scored as `dfine-bench --tracking` scores.

    python benchmarks/tracker_settings.py --model runs/quickstart/export
    python benchmarks/tracker_settings.py --model EXPORT --lost 0.5 1 2 --confident 0.3 0.5 0.7 --json t.json

The videos are those `dfine-data video` writes (dfine_deploy/data/moving.py): the quickstart's demo, the
same with a pillar hiding what passes behind it (ids kept through an occlusion), with every object
standing still on the counting line for 2 s, and the fast movers detected every frame and at 5 a
second (`--detect-fps 5`). Each video is detected once; the tracker (dfine_deploy/serve/tracking.py)
then runs with each pair of settings on the same detections. Printed per video and pair: HOTA, IDF1,
id switches (trackers.eval) and the crossings counted of the true ones; `--frames` shortens every video.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def videos(folder: Path, frames: int) -> list[tuple[str, Path, float | None]]:
    """(name, video, detections a second or None for every frame) of each scene measured."""
    from dfine_deploy.data.moving import DemoVideo, fast_movers, stopping

    demo = DemoVideo(frames=frames)
    scenes = {
        "demo": demo,
        "occluded": DemoVideo(frames=frames, occluder=0.3),
        "stops on the line": DemoVideo(frames=frames, objects=stopping(demo.objects, 2.0, demo.fps)),
        "fast movers": DemoVideo(frames=frames, objects=fast_movers(frames)),
    }
    written = {
        name: video.write(folder / f"{name.replace(' ', '_')}.mp4", truth=True)
        for name, video in scenes.items()
    }
    rows = [(name, path, None) for name, path in written.items()]
    return [*rows, ("fast movers, 5 detections/s", written["fast movers"], 5.0)]


def detect(model: str, video: Path, detect_fps: float | None) -> list:
    """`detected_frames` of the video, each detected frame with one label per object (as served)."""
    from dfine_deploy.bench.tracking import detected_frames
    from dfine_deploy.serve.app import load_detector
    from dfine_deploy.serve.results import one_label_per_object
    from dfine_deploy.serve.settings import ServeSettings

    detector = load_detector(ServeSettings(model=model, backend="onnxruntime", device="cpu"))
    gate = {"motion": True, "fps": detect_fps} if detect_fps else None
    try:
        return [
            (seconds, size, det if det is None else one_label_per_object(det))
            for seconds, size, det in detected_frames(detector, video, gate)
        ]
    finally:
        detector.close()


def track(video: Path, found: list, detect_fps: float | None, lost: float, confident: float) -> dict:
    """The tracker with these settings on `found`, scored against the video's truth."""
    import dfine_deploy.serve.tracking as tracking
    from dfine_deploy.bench.tracking import count_errors, mot_row, score_tracks, truth_facts
    from dfine_deploy.data.moving import truth_paths
    from dfine_deploy.serve.regions import DetectSpec
    from dfine_deploy.serve.settings import StreamSpec

    truth = truth_paths(video)[0]
    facts = truth_facts(truth)
    saved = tracking.LOST_TRACK_SECONDS, tracking.CONFIDENT_SCORE
    tracking.LOST_TRACK_SECONDS, tracking.CONFIDENT_SCORE = lost, confident
    try:
        gate = DetectSpec(True, detect_fps) if detect_fps else None
        tracker = tracking.StreamTracker(
            StreamSpec(url=str(video), track=True, lines=[facts["line"]], detect=gate)
        )
        rows = []
        for number, (seconds, size, det) in enumerate(found, 1):
            det, ids = tracker.predict(seconds, size) if det is None else (det, tracker.update(det, seconds))
            for track_id, score, box in zip(ids, det.scores, det.boxes):
                if track_id >= 0:
                    rows.append(mot_row(number, int(track_id), box, float(score)))
    finally:
        tracking.LOST_TRACK_SECONDS, tracking.CONFIDENT_SCORE = saved
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as out:
        out.write("\n".join(rows) + "\n")
    figures = score_tracks(truth, out.name)
    Path(out.name).unlink()
    counted = {d: dict(c) for d, c in tracker.crossings[facts["line"]["name"]].items()}
    errors = count_errors(counted, facts["expected_crossings"])
    true_total = sum(n for by_class in facts["expected_crossings"].values() for n in by_class.values())
    wrong = sum(abs(n) for by_class in errors.values() for n in by_class.values())
    return {**figures, "crossings": true_total, "count_errors": wrong}


def main(argv: list[str] | None = None) -> int:
    from dfine_deploy.serve import tracking

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", required=True, help="an artifact folder (dfine-export's)")
    parser.add_argument("--lost", type=float, nargs="+", default=[0.5, tracking.LOST_TRACK_SECONDS, 2.0, 3.0])
    parser.add_argument("--confident", type=float, nargs="+", default=[0.3, tracking.CONFIDENT_SCORE, 0.7])
    parser.add_argument("--frames", type=int, default=120, help="frames of every video (default 120)")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as folder:
        for name, video, detect_fps in videos(Path(folder), args.frames):
            found = detect(args.model, video, detect_fps)
            for lost, confident in itertools.product(args.lost, args.confident):
                figures = track(video, found, detect_fps, lost, confident)
                results.append({"video": name, "lost_track_s": lost, "confident_score": confident, **figures})
                print(
                    f"{name:28} lost {lost:>4g} s  confident {confident:.2f}  HOTA {figures['HOTA']:.3f}  "
                    f"IDF1 {figures['IDF1']:.3f}  id switches {figures['id switches']:>2}  "
                    f"count errors {figures['count_errors']} of {figures['crossings']} crossings",
                    flush=True,
                )
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
