"""The README's first command: every stage of the toolchain on generated data, on a CPU, in minutes.

    synthetic COCO data ─► torchrun training (2 processes) ─► evaluation ─► dfine-export (ONNX,
    typed FP16 ONNX, parity gate) ─► dfine-verify (the graph against its reference pack, on this CPU)
    ─► dfine-bench (onnxruntime vs the hardware table) ─► dfine-serve
    on a generated video ─► summary.json

Each stage runs the same documented command a user would type (printed before it runs, its output
kept in logs/), so any stage can be repeated by hand with other data or another model. Every file
the summary names is checked to exist and open before the run is called a success.

--out must be new, empty or an earlier quickstart run (its quickstart.json, written first): the run
writes its fixed names there and each stage's command checks its own subfolder in turn.

It drives a source checkout (train/main.py, configs/), so it lives beside them, not in the package:

    python scripts/quickstart.py [--out runs/quickstart] [--fast]      # what `make quickstart` runs
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import yaml

from dfine_deploy.artifact import BF16_GATE_KEY
from dfine_deploy.data.moving import DemoVideo
from dfine_deploy.errors import DfineError, ImageError
from dfine_deploy.files import atomic_write_bytes
from dfine_deploy.images import read_image
from dfine_deploy.ownership import Claim, claim_folder

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout: scripts/ is one level down
QUICKSTART_CONFIG = Path("configs/quickstart/dfine_n_synthetic.yml")
WRITTEN_BY = "scripts/quickstart.py"
RUN_MARKER = "quickstart.json"  # written first: the plan, and that the folder is a quickstart run


def _is_run(path: Path) -> bool:
    data = json.loads(path.read_text(encoding="utf-8"))
    if path.name == RUN_MARKER:
        return isinstance(data, dict) and data.get("written_by") == WRITTEN_BY
    return isinstance(data, dict) and {"stage_seconds", "files"} <= data.keys()  # an earlier summary.json


# Everything a run writes under --out (fnmatch patterns, "*" crossing folders): a second run removes an
# earlier one only when it holds nothing else.
RUN_FILES = (
    RUN_MARKER,
    "summary.json",
    "val_predictions.png",
    "logs",
    "logs/*.log",
    "data",
    "data/train",
    "data/val",
    "data/*/annotations.json",
    "data/*/*.jpg",
    "train",
    "train/*.pth",
    "train/curves.png",
    "train/eval.json",
    "train/log.jsonl",
    "train/resolved_config.json",
    "train/.dfine-run.lock",
    "train/summary",
    "train/summary/events.out.tfevents.*",
    ".export.*",  # a killed export's staging folder
    "export",
    "export/*.onnx",
    "export/model.json",
    "export/labels.txt",
    "export/*_dfine.txt",
    "export/ov_cache",
    "export/ov_cache/*",
    "bench",
    "bench/bench.json",
    "bench/bench.png",
    "bench/work",
    "bench/work/*",
    "serve",
    "serve/input.mp4",
    "serve/input.gt.txt",
    "serve/input.truth.json",
    "serve/tracks.txt",
    "serve/truth-served.gt.txt",
    "serve/streams.yml",
    "serve/detections.jsonl",
    "serve/recordings",
    "serve/recordings/input",  # the stream is named after its video
    "serve/recordings/input/input-*.mp4",
)
QUICKSTART_RUN = Claim(
    WRITTEN_BY, "a quickstart run folder", (RUN_MARKER, "summary.json"), patterns=RUN_FILES, recognise=_is_run
)


def clear_earlier_run(out: Path) -> None:
    """A second `make quickstart` starts afresh: an earlier run of ours in `out`, holding nothing we did
    not write (`claim_folder` refuses it otherwise), is removed first and the count said."""
    if not claim_folder(out, QUICKSTART_RUN, option="--out"):
        return
    entries = sorted(out.iterdir())
    for entry in entries:
        shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    print(f"replaced the earlier quickstart run in {out} ({len(entries)} entries it had written)", flush=True)


@dataclass(frozen=True)
class Plan:
    """How big each stage is: the full quickstart, or the shortened one the test suite runs."""

    train_images: int
    val_images: int
    epochs: int | None  # None: the config's own `epochs`
    imgsz: int
    bench_runs: int
    serve_seconds: float
    video_frames: int

    @classmethod
    def full(cls) -> Plan:
        return cls(
            train_images=600,
            val_images=80,
            epochs=None,
            imgsz=256,
            bench_runs=30,
            serve_seconds=14.0,
            video_frames=120,
        )

    @classmethod
    def fast(cls) -> Plan:
        return cls(
            train_images=16,
            val_images=32,  # the fewest `dfine-export --int8` calibrates on (the docs' INT8 line runs on it)
            epochs=1,
            imgsz=256,
            bench_runs=5,
            serve_seconds=8.0,
            video_frames=40,
        )


class StageFailed(DfineError):
    pass


def _tool(name: str) -> str:
    """The console script installed beside this interpreter (the one in .venv/bin)."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


def _flags(**options: object) -> list[str]:
    """`--name value` pairs of a documented command, in order (underscores become dashes; a tuple
    gives one flag several values, True a bare flag)."""
    argv: list[str] = []
    for name, value in options.items():
        argv.append("--" + name.replace("_", "-"))
        if value is not True:
            argv += [str(v) for v in value] if isinstance(value, tuple) else [str(value)]
    return argv


def _run(stage: str, cmd: Sequence[str], logs: Path, env: dict[str, str] | None = None) -> float:
    """Run one documented command, keep its output in logs/<stage>.log, return its wall time."""
    shown = " ".join(shlex.quote(Path(c).name if i == 0 else c) for i, c in enumerate(cmd))
    print(f"\n==> [{stage}] {shown}", flush=True)
    log_path = logs / f"{stage}.log"
    start = time.perf_counter()
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            list(cmd),
            cwd=REPO_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(env or {})},
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            log.write(line)
            if not line.startswith(("\r",)) and len(line) < 400:
                print(f"    {line}", end="", flush=True)
        code = proc.wait()
    seconds = time.perf_counter() - start
    if code != 0:
        raise StageFailed(f"stage '{stage}' failed with exit status {code}; its output is in {log_path}")
    print(f"    ({stage}: {seconds:.0f} s)", flush=True)
    return seconds


def _last_jsonl(path: Path) -> dict[str, Any]:
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    if not lines:
        raise StageFailed(f"{path} is empty: the trainer logged no epoch")
    return json.loads(lines[-1])


def make_video(serve_dir: Path, frames: int) -> tuple[dict[str, Any], Path]:
    """The demo video (shapes on known paths, MPEG-4 part 2) and a stream list that tracks its objects
    and counts them on the video's middle line; returns what the summary says of it, and the list."""
    video = DemoVideo(frames=frames)
    path = video.write(serve_dir / "input.mp4", truth=True)  # and input.gt.txt, input.truth.json
    streams = serve_dir / "streams.yml"
    stream = {"name": "input", "url": str(path), "track": True, "lines": [video.line]}
    streams.write_text(yaml.safe_dump({"streams": [stream]}, sort_keys=False), encoding="utf-8")
    return {"path": str(path), **video.describe()}, streams


def tracking_summary(served: list[dict[str, Any]]) -> dict[str, Any]:
    """How long the served tracks lasted (frames each track id was seen) and the line's final counts."""
    lengths: dict[int, int] = {}
    for result in served:
        for det in result["detections"]:
            if det.get("track_id") is not None:
                lengths[det["track_id"]] = lengths.get(det["track_id"], 0) + 1
    return {
        "tracks": len(lengths),
        "median_track_frames": float(np.median(list(lengths.values()))) if lengths else 0.0,
        "counts": served[-1].get("counts", {}).get("lines", {}),
    }


def tracking_scores(served: list[dict[str, Any]], video_path: Path, tracks: Path) -> dict[str, Any]:
    """The served tracks (written to `tracks`, MOT Challenge rows) against the video's true ones by the
    evaluation `dfine-bench --tracking` uses (trackers.eval): HOTA, IDF1, MOTA, id switches; the line's
    count error per direction and class; and each object's frames with a served box on it (the
    objects the detector never sees have none)."""
    from dfine_deploy.bench.tracking import count_errors, mot_row, objects_found, score_tracks, truth_facts
    from dfine_deploy.data.moving import truth_paths

    truth = truth_paths(video_path)[0]
    facts = truth_facts(truth)
    assert facts is not None  # make_video wrote it
    rows, boxes = [], {}
    for result in served:
        frame = result["frame_index"] + 1  # MOT frames count from 1
        boxes[frame] = [(i, tuple(det["box"])) for i, det in enumerate(result["detections"])]
        for det in result["detections"]:
            if det["track_id"] is not None:
                rows.append(mot_row(frame, det["track_id"], det["box"], det["score"]))
    tracks.write_text("\n".join(rows) + "\n")
    # scored on the frames served: a live stream skips frames while the detector is busy, and a frame
    # never served would count as every object missed
    served_truth = tracks.with_name("truth-served.gt.txt")
    kept = [row for row in truth.read_text().splitlines() if row and int(row.split(",")[0]) in boxes]
    served_truth.write_text("\n".join(kept) + "\n")
    figures = score_tracks(served_truth, tracks)
    counted = served[-1].get("counts", {}).get("lines", {}).get(facts["line"]["name"], {})
    return {
        **figures,
        "frames_scored": len(boxes),
        "tracks": len({row.split(",")[1] for row in rows}),
        "count_error": count_errors(counted, facts["expected_crossings"]),
        "objects_found": objects_found(truth, boxes, facts["classes"]),
    }


def annotated_grid(artifact: Path, val_dir: Path, out_path: Path, count: int = 16) -> dict[str, Any]:
    """Detect on the first validation images with the exported graph and tile them, annotated at the
    score thresholds dfine-serve uses by default (what a user sees first), one label per box."""
    from dfine_deploy.runtime import Detector
    from dfine_deploy.serve.annotate import draw
    from dfine_deploy.serve.settings import ServeSettings

    score_threshold = ServeSettings().score_threshold

    annotations = json.loads((val_dir / "annotations.json").read_text())
    files = [val_dir / img["file_name"] for img in annotations["images"][:count]]
    frames = [read_image(f, color="BGR") for f in files]  # drawn and written by OpenCV
    with Detector.open(str(artifact), backend="onnxruntime", score_threshold=score_threshold) as det:
        results = [dets.one_label_per_box() for dets in det.predict(frames)]
        thresholds = det.thresholds.table(det.class_names)
    tiles = []
    for frame, dets in zip(frames, results):
        boxes = [
            {"box": box, "label": int(label), "name": name, "score": float(score)}
            for box, label, name, score in zip(
                dets.boxes.tolist(), dets.labels.tolist(), dets.names, dets.scores.tolist()
            )
        ]
        tiles.append(cv2.resize(draw(frame, boxes), (256, 256)))
    cols = 4
    while len(tiles) % cols:
        tiles.append(np.zeros_like(tiles[0]))
    rows = [np.hstack(tiles[i : i + cols]) for i in range(0, len(tiles), cols)]
    if not cv2.imwrite(str(out_path), np.vstack(rows)):
        raise StageFailed(f"could not write {out_path}")
    return {
        "path": str(out_path),
        "images": len(frames),
        "thresholds": thresholds,
        "detections_above_threshold": int(sum(len(r) for r in results)),
    }


def check_outputs(summary: dict[str, Any]) -> None:
    """Every file the summary names must exist and open: images decode, the video has its frames."""
    for key, path in summary["files"].items():
        p = Path(path)
        if not p.is_file() or p.stat().st_size == 0:
            raise StageFailed(f"summary names {key} = {p}, which is missing or empty")
        if p.suffix.lower() in {".png", ".jpg", ".jpeg"}:
            try:
                read_image(p)
            except ImageError as exc:
                raise StageFailed(f"{key} = {p} is not a readable image ({exc.reason})") from None
        if p.suffix.lower() in {".mp4", ".avi"}:
            cap = cv2.VideoCapture(str(p))
            frames = int(cap.get(cv2.CAP_PROP_FRAME_COUNT))
            ok, frame = cap.read()
            cap.release()
            if not ok or frames <= 0 or frame is None:
                raise StageFailed(f"{key} = {p} does not play (frames={frames})")
        if p.suffix.lower() == ".json":
            json.loads(p.read_text())


def run(out: Path, plan: Plan) -> dict[str, Any]:
    out = out if out.is_absolute() else REPO_ROOT / out
    clear_earlier_run(out)
    marker = {"written_by": WRITTEN_BY, "plan": asdict(plan)}
    atomic_write_bytes(out / RUN_MARKER, json.dumps(marker, indent=2).encode())
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    data_dir = out / "data"
    train_dir = out / "train"
    export_dir = out / "export"
    bench_dir = out / "bench"
    serve_dir = out / "serve"
    for d in (bench_dir, serve_dir):
        d.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    load_at_start = round(os.getloadavg()[0], 2)

    synth = _flags(
        out=data_dir, images=plan.train_images, val_images=plan.val_images, seed=0, size=plan.imgsz
    )
    timings["data"] = _run("data", [_tool("dfine-data"), "synth", *synth], logs)

    data_overrides = [
        f"train_dataloader.dataset.img_folder={data_dir / 'train'}",
        f"train_dataloader.dataset.ann_file={data_dir / 'train' / 'annotations.json'}",
        f"val_dataloader.dataset.img_folder={data_dir / 'val'}",
        f"val_dataloader.dataset.ann_file={data_dir / 'val' / 'annotations.json'}",
    ]
    if plan.epochs is not None:
        data_overrides.append(f"epochs={plan.epochs}")
    torchrun = [_tool("torchrun"), "--standalone", "--nproc_per_node=2", "train/main.py"]
    # --no-smoke: the generated scenes are known to train (tests/training/test_smoke.py runs the smoke
    # test on them); skipping it keeps the demo inside its 15 minutes on a 2-core CPU
    train = _flags(seed=0, output_dir=train_dir, no_smoke=True)
    config = ["-c", str(QUICKSTART_CONFIG)]
    timings["train"] = _run("train", [*torchrun, *config, *train, "-u", *data_overrides], logs)
    last_epoch = _last_jsonl(train_dir / "log.jsonl")

    checkpoint = train_dir / "best.pth"
    test_only = ["--test-only", "-r", str(checkpoint), *_flags(output_dir=train_dir)]
    evaluate = [sys.executable, "train/main.py", *config, *test_only, "-u", *data_overrides]
    timings["evaluate"] = _run("evaluate", evaluate, logs)
    metrics = json.loads((train_dir / "eval.json").read_text())

    export = _flags(imgsz=(plan.imgsz, plan.imgsz), data=data_dir / "val")
    timings["export"] = _run(
        "export", [_tool("dfine-export"), str(checkpoint), "-o", str(export_dir), *export], logs
    )
    sidecar = json.loads((export_dir / "model.json").read_text())
    # the graph onnxruntime serves here, checked on this CPU against the export's reference pack
    timings["verify"] = _run("verify", [_tool("dfine-verify"), str(export_dir)], logs)
    verified = json.loads((export_dir / "verify.json").read_text())["results"]

    bench_json, bench_png = bench_dir / "bench.json", bench_dir / "bench.png"
    bench_flags = _flags(
        model=export_dir,
        backend="onnxruntime",
        device="jetson",
        imgsz=plan.imgsz,
        runs=plan.bench_runs,
        json=bench_json,
        plot=bench_png,
        work_dir=bench_dir / "work",
    )
    timings["bench"] = _run("bench", [_tool("dfine-bench"), *bench_flags], logs)
    bench = json.loads(bench_json.read_text())

    video, streams_file = make_video(serve_dir, plan.video_frames)
    detections_jsonl = serve_dir / "detections.jsonl"
    detections_jsonl.unlink(missing_ok=True)
    serve = _flags(
        port=0,
        streams=streams_file,
        duration=plan.serve_seconds,
        record=serve_dir / "recordings",
        output_json=detections_jsonl,
    )
    timings["serve"] = _run("serve", [_tool("dfine-serve"), str(export_dir), *serve], logs)
    served = [json.loads(line) for line in detections_jsonl.read_text().splitlines() if line.strip()]
    if len(served) < 2:
        raise StageFailed(
            f"dfine-serve wrote {len(served)} results to {detections_jsonl}; expected a stream of them"
        )
    served_span = served[-1]["timestamp"] - served[0]["timestamp"]
    # finished segments, STREAM/STREAM-<UTC start>.mp4: names sort in time, and earlier runs' stay
    recordings = sorted(p for p in (serve_dir / "recordings").glob("*/*.mp4") if not p.name.startswith("."))
    if not recordings:
        raise StageFailed(f"dfine-serve wrote no recording under {serve_dir / 'recordings'}")

    grid = annotated_grid(export_dir, data_dir / "val", out / "val_predictions.png")

    summary = {
        "total_seconds": round(time.perf_counter() - started, 1),
        "stage_seconds": {k: round(v, 1) for k, v in timings.items()},
        # the times depend on what else ran: the 1-minute load average before and after, and the cores
        "machine": {
            "cpus": os.cpu_count(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": round(os.getloadavg()[0], 2),
        },
        "training": {"epochs": last_epoch.get("epoch", -1) + 1, "last_epoch_log": last_epoch},
        "validation": metrics,
        "export": {"parity": sidecar.get("parity"), "graphs": sorted(sidecar.get("graphs", {}))},
        "verify": [
            {k: r[k] for k in ("file", "precision", "passed", "latency_ms", "device")}
            for r in verified.values()
        ],
        "bench": bench,
        "serve": {
            "results": len(served),
            "fps": round((len(served) - 1) / max(served_span, 1e-9), 2),
            "input_video": video,
            "tracking": tracking_summary(served),
            "against_truth": tracking_scores(served, Path(video["path"]), serve_dir / "tracks.txt"),
            "recording": str(recordings[-1]),
        },
        "val_predictions": grid,
        "files": {
            "checkpoint": str(checkpoint),
            "training_curves": str(train_dir / "curves.png"),
            "onnx": str(export_dir / "model.onnx"),
            "onnx_fp16": str(export_dir / "model.fp16.onnx"),
            "sidecar": str(export_dir / "model.json"),
            "reference_pack": str(export_dir / "reference.npz"),
            "verify_json": str(export_dir / "verify.json"),
            "bench_json": str(bench_json),
            "bench_chart": str(bench_png),
            "served_detections": str(detections_jsonl),
            "annotated_video": str(recordings[-1]),
            "val_predictions": grid["path"],
        },
    }
    check_outputs(summary)
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    return summary


def gate_outcome(graph: str, result: dict[str, Any]) -> str:
    """What the summary says of one parity gate. Only the BF16 gate may fail in a finished export
    (every other failure stops it): its graph is then kept out, not broken, since the runtime refuses
    precision bf16 for the model and nothing the user runs uses it (on the quickstart's briefly
    trained model BF16 rounding can move enough boxes)."""
    if result.get("run") is False:  # a gate this CPU cannot run (BF16 without BF16 units)
        return f"not run ({result.get('reason')})"
    if result.get("passed"):
        return "passed"
    failures = "; ".join(result.get("failures", [])) or "see model.json"
    if graph == BF16_GATE_KEY:
        return f"not kept ({failures}): precision bf16 is refused for this model, FP32 is not affected"
    return f"FAILED ({failures})"


def print_summary(summary: dict[str, Any], out: Path) -> None:
    from dfine_deploy.bench.tracking import found_lines

    metrics = summary["validation"]
    print("\n================ quickstart summary ================")
    ap, ap50 = metrics.get("AP", float("nan")), metrics.get("AP50", float("nan"))
    print(f"validation mAP50-95 {ap:.3f}   mAP50 {ap50:.3f}")
    parity = summary["export"]["parity"] or {}
    for graph, result in parity.items():
        if isinstance(result, dict):
            print(f"export parity [{graph}]: {gate_outcome(graph, result)}")
    bench = summary["bench"]
    for line in bench["measured_on"] + bench["reference"][:2]:
        print(f"bench {line}")
    wanted = ("Format", "Scope", "Status", "Inference time (ms/im)", "FPS", "Expected FPS", "Ratio")
    index = [bench["columns"].index(c) for c in wanted]
    for row in bench["table"]:
        print("  " + "  ".join(f"{c}: {row[i]}" for c, i in zip(wanted, index)))
    serve = summary["serve"]
    print(f"served {serve['results']} frames at {serve['fps']} FPS; annotated video {serve['recording']}")
    tracking = serve["tracking"]
    print(
        f"tracking: {tracking['tracks']} tracks, median {tracking['median_track_frames']:g} frames "
        f"(each object is in view {[o['frames_in_view'] for o in serve['input_video']['objects']]} frames); "
        f"line counts {tracking['counts'].get('middle', {})}, "
        f"the video's objects cross it {serve['input_video']['expected_crossings']}"
    )
    scores = serve["against_truth"]
    print(
        f"tracking against the video's truth on the {scores['frames_scored']} frames served "
        f"(trackers.eval, as dfine-bench --tracking): HOTA {scores['HOTA']:.3f}  "
        f"IDF1 {scores['IDF1']:.3f}  MOTA {scores['MOTA']:.3f}  id switches {scores['id switches']}"
        + ("" if scores["tracks"] else " (no object was tracked)")
    )
    print(f"count error (counted - true) per direction and class: {scores['count_error']}")
    for line in found_lines(scores["objects_found"]):
        print(line)
    for stage, seconds in summary["stage_seconds"].items():
        print(f"  {stage:<9} {seconds:7.1f} s")
    print(
        f"total {summary['total_seconds']:.0f} s — everything is in {out}, summary in {out / 'summary.json'}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="scripts/quickstart.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--out", type=Path, default=Path("runs/quickstart"), help="where every output goes")
    parser.add_argument(
        "--fast", action="store_true", help="a shortened run (the test suite's): tiny data, one epoch"
    )
    args = parser.parse_args(argv)
    plan = Plan.fast() if args.fast else Plan.full()
    try:
        summary = run(args.out, plan)
    except DfineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_summary(summary, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
