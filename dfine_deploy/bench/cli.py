"""`dfine-bench`: measure a detector on this machine beside the figures users quote.

    dfine-bench --model runs/export/dfine-n --device jetson
    dfine-bench --model dfine-s --backend torch onnxruntime --device t4 --batch 1 4 --json r.json
    dfine-bench --model runs/export/dfine-n yolo11n.onnx --adapter dfine yolo --device cpu --plot r.png
    dfine-bench --model dfine-n --train --train-images 118287 --device v100
    dfine-bench --model runs/export/dfine-n --streams --frame-size 1280 720 --fps 10   # cameras that fit
    dfine-bench --model runs/export/dfine-n --streams --motion    # ... with and without the motion gate
    dfine-bench --model runs/export/dfine-n --tiles 3x2 --data runs/dense   # small objects: tiles vs whole

`--device` names the PROFILE to compare against (jetson, jetson-orin, t4, a100, v100, cpu, auto);
the report says what hardware the figures were really measured on.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.bench.hardware import auto_profile, detect
from dfine_deploy.bench.report import build_report, check_outputs, render_table, write_json, write_plot
from dfine_deploy.bench.runner import BenchSettings, run_bench
from dfine_deploy.bench.streams import run_streams_bench
from dfine_deploy.bench.tables import HARDWARE_SELECTION, OFFICIAL_LATENCY, OFFICIAL_LATENCY_SETUP, PROFILES
from dfine_deploy.bench.tiles import run_tiles_bench
from dfine_deploy.bench.tracking import run_tracking_bench
from dfine_deploy.bench.training import run_train_bench
from dfine_deploy.cli import (
    ArgumentParser,
    add_input_size,
    check_option_owners,
    check_reads,
    configure_logging,
    friendly_errors,
    model_argument,
    option_dest,
)
from dfine_deploy.errors import BenchError
from dfine_deploy.files import user_path
from dfine_deploy.memory import check_memory
from dfine_deploy.model.reference import model_ref_forms
from dfine_deploy.numbers import POSITIVE
from dfine_deploy.runtime.adapters import ADAPTERS
from dfine_deploy.runtime.backends import BACKEND_HELP, BY_NAME, PRECISION_HELP, split_backend
from dfine_deploy.tiles import TileSpec


def get_args_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="dfine-bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", nargs="+", type=model_argument, help=f"{model_ref_forms()}, each")
    parser.add_argument(
        "--tables", action="store_true", help="print the hardware-selection and official latency tables"
    )
    parser.add_argument(
        "--adapter", nargs="+", default=["dfine"], help=f"one per --model, or one for all: {sorted(ADAPTERS)}"
    )
    parser.add_argument(
        "--backend",
        nargs="+",
        default=[BackendName.ONNXRUNTIME],
        help=BACKEND_HELP,
    )
    parser.add_argument(
        "--precision",
        nargs="+",
        default=[Precision.AUTO],
        choices=list(Precision),
        help=PRECISION_HELP + "; one row each",
    )
    parser.add_argument(
        "--device", default="auto", help=f"profile to compare against: {', '.join(PROFILES)}, auto"
    )
    parser.add_argument("--batch", nargs="+", type=int, default=[1], help="batch sizes to measure")
    add_input_size(parser, None, "network input size: S or H W pixels, multiples of 32")
    parser.add_argument(
        "--data", type=user_path, default=None, help="COCO-layout folder: mAP50-95 on the same graph"
    )
    parser.add_argument(
        "--data-limit",
        type=int,
        default=None,
        metavar="N",
        help="score only the first N images of --data (N >= 1), against their own annotations",
    )
    parser.add_argument(
        "--names",
        type=user_path,
        default=None,
        metavar="FILE",
        help="class names, one per line (or a JSON/YAML list): overrides the model's",
    )
    parser.add_argument("--runs", type=int, default=20, help="timed calls per row")
    parser.add_argument("--warmup", type=int, default=3, help="untimed calls before timing")
    parser.add_argument(
        "--rounds",
        type=int,
        default=None,
        help="the runs are split into rounds to show spread: 1..--runs (default 3, or --runs when fewer); "
        "--tiles: each image is timed this many times in each mode",
    )
    parser.add_argument("--frame-size", nargs=2, type=int, default=[1280, 720], metavar=("W", "H"))
    parser.add_argument("--threads", type=int, default=None, help="onnxruntime CPU threads")
    parser.add_argument(
        "--work-dir", type=user_path, default=".dfine_bench", help="where exports for a MODEL go"
    )
    parser.add_argument("--json", type=user_path, default=None, help="write every figure as JSON")
    parser.add_argument("--plot", type=user_path, default=None, help="write a PNG chart")
    parser.add_argument(
        "--train", action="store_true", help="measure training images/s and epochs/hour instead"
    )
    parser.add_argument(
        "--train-images", type=int, default=118287, help="dataset size for epochs/hour (COCO train2017)"
    )
    parser.add_argument(
        "--train-batch", type=int, default=4, help="batch size of the measured training steps"
    )
    parser.add_argument(
        "--streams",
        action="store_true",
        help="measure how many cameras of --frame-size at --fps this machine serves (dfine-serve's pipeline "
        "on generated H.264: decode, inference, tracking) instead",
    )
    parser.add_argument("--fps", type=int, default=10, help="--streams: frames per second of each camera")
    parser.add_argument(
        "--stream-seconds", type=float, default=10.0, help="--streams: measured seconds of each trial"
    )
    parser.add_argument(
        "--max-streams", type=int, default=32, help="--streams: try at most this many cameras"
    )
    parser.add_argument(
        "--max-batch",
        type=int,
        default=8,
        help="--streams, --tiles: images per inference call at most (dfine-serve's)",
    )
    parser.add_argument(
        "--motion",
        action="store_true",
        help="--streams: on a scene idle 80%% of the time, cameras served with and without the motion gate",
    )
    parser.add_argument(
        "--tiles",
        metavar="COLSxROWS",
        default=None,
        help="recall and cost of tiled detection against whole frames on --data, e.g. 3x2",
    )
    parser.add_argument(
        "--tile-overlap", type=float, default=TileSpec.overlap, help="--tiles: overlap of neighbouring crops"
    )
    parser.add_argument(
        "--tiles-no-full", action="store_true", help="--tiles: leave out the whole frame (crops only)"
    )
    parser.add_argument(
        "--tracking",
        metavar="VIDEO",
        type=user_path,
        default=None,
        help="score dfine-serve's tracker on VIDEO against --truth: HOTA, IDF1, MOTA, id switches, "
        "count error",
    )
    parser.add_argument(
        "--truth",
        metavar="GT",
        type=user_path,
        default=None,
        help="--tracking: the video's tracks in the MOT Challenge format (default: VIDEO's NAME.gt.txt)",
    )
    parser.add_argument(
        "--detect-fps",
        type=float,
        default=None,
        help="--tracking --motion: at most this many detections a second (dfine-serve's --detect-fps)",
    )
    return parser


def check_backend_installed(backend: str) -> None:
    """Refuse a backend that cannot load here before anything is exported or measured, with the
    install line of its row in the backend table."""
    name, _ = split_backend(backend)
    if name == BackendName.AUTO:
        return
    row = BY_NAME[name]
    problem = row.install_problem()
    if problem is not None:
        raise BenchError(f"--backend {backend}: {problem}; install it with: {row.install_hint}")


def tables_text() -> str:
    """The two tables users quote, from the package data."""
    hardware = [[r.scenario, r.hardware, r.model, r.expected] for r in HARDWARE_SELECTION]
    latency = [
        [
            r.model,
            f"{r.latency_ms} ms",
            f"{r.fps:g}",
            f"{r.coco_ap}",
            "—" if r.obj365_coco_ap is None else f"{r.obj365_coco_ap}",
        ]
        for r in OFFICIAL_LATENCY.values()
    ]
    return "\n".join(
        [
            "Hardware-selection table",
            render_table(["Scenario", "Hardware", "Model", "Expected"], hardware),
            "",
            f"Official latency table ({OFFICIAL_LATENCY_SETUP})",
            render_table(["Model", "Latency", "FPS", "COCO AP", "Objects365->COCO AP"], latency),
            "",
            "Profiles (--device): " + "; ".join(f"{p.key} = {p.label}" for p in PROFILES.values()),
        ]
    )


def imgsz_of(size: tuple[int, int] | None) -> tuple[int, int] | None:
    if size is not None and any(v <= 0 or v % 32 for v in size):
        raise BenchError(f"--imgsz {size[0]} {size[1]}: each side must be a positive multiple of 32")
    return size


# The options of one measurement, and the measurements each belongs to: given without any of them it
# would be ignored without a word (`--tile-overlap 0.3` ran the latency table as if never given).
MEASUREMENT_OPTIONS = {
    "--fps": ("--streams",),
    "--stream-seconds": ("--streams",),
    "--max-streams": ("--streams",),
    "--max-batch": ("--streams", "--tiles"),
    "--motion": ("--streams", "--tracking"),
    "--tile-overlap": ("--tiles",),
    "--tiles-no-full": ("--tiles",),
    "--truth": ("--tracking",),
    "--train-images": ("--train",),
    "--train-batch": ("--train",),
}


# What each measurement of its own reads (`--tables` prints and reads nothing else); any other option
# given beside it would be ignored without a word (`--batch 1 8 --streams`).
_SERVED = ("--model", "--device", "--json", "--backend", "--precision", "--threads", "--names")
MEASUREMENT_READS = {
    "--tables": (),
    "--train": (
        "--model",
        "--device",
        "--json",
        "--imgsz",
        "--runs",
        "--warmup",
        "--train-images",
        "--train-batch",
    ),
    "--streams": (
        *_SERVED,
        *(
            "--work-dir",
            "--frame-size",
            "--fps",
            "--stream-seconds",
            "--max-streams",
            "--max-batch",
            "--motion",
        ),
    ),
    "--tiles": (
        *_SERVED,
        "--data",
        "--data-limit",
        "--runs",
        "--rounds",
        "--max-batch",
        "--tile-overlap",
        "--tiles-no-full",
    ),
    "--tracking": (*_SERVED, "--work-dir", "--truth", "--motion", "--detect-fps"),
}


def _check_measurement_reads(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, args: argparse.Namespace
) -> None:
    for mode, reads in MEASUREMENT_READS.items():
        if getattr(args, option_dest(mode)):
            check_reads(parser, argv, mode, reads, BenchError)
            return


@friendly_errors
def main(argv: Sequence[str] | None = None) -> int:
    parser = get_args_parser()
    args = parser.parse_args(argv)
    configure_logging("WARNING")  # the tables are the output; the log adds its warnings
    if args.tables:
        _check_measurement_reads(parser, argv, args)
        print(tables_text())
        return 0
    if not args.model:
        raise BenchError(f"--model is required: {model_ref_forms()}")
    if args.device != "auto" and args.device not in PROFILES:
        raise BenchError(
            f"--device {args.device!r} is not a known profile; choose one of "
            f"{', '.join([*PROFILES, 'auto'])} (it names the hardware to compare against)"
        )
    if len(args.adapter) not in (1, len(args.model)):
        raise BenchError(f"--adapter: give one adapter, or one per --model ({len(args.model)})")
    for flag, values, minimum in (
        ("--batch", args.batch, 1),
        ("--runs", [args.runs], 1),
        ("--warmup", [args.warmup], 0),
        ("--frame-size", args.frame_size, 1),
        ("--train-images", [args.train_images], 1),
        ("--train-batch", [args.train_batch], 1),
        ("--fps", [args.fps], 1),
        ("--max-streams", [args.max_streams], 1),
        ("--max-batch", [args.max_batch], 1),
    ):
        if any(v < minimum for v in values):
            raise BenchError(f"{flag} {' '.join(map(str, values))}: each value must be at least {minimum}")
    POSITIVE.check(args.stream_seconds, "--stream-seconds", BenchError)
    check_option_owners(parser, argv, MEASUREMENT_OPTIONS, BenchError)
    if args.detect_fps is not None and not (args.tracking and args.motion):
        raise BenchError(
            f"--detect-fps {args.detect_fps:g} caps the motion gate of --tracking; add --tracking --motion"
        )
    if args.detect_fps is not None:
        POSITIVE.check(args.detect_fps, "--detect-fps", BenchError)
    if args.tiles and (args.streams or args.train):
        raise BenchError("--tiles is a measurement of its own; leave out --streams and --train")
    if args.tracking and (args.streams or args.train or args.tiles):
        raise BenchError("--tracking is a measurement of its own; leave out --streams, --train and --tiles")
    if args.train and args.streams:
        raise BenchError("--train is a measurement of its own; leave out --streams")
    _check_measurement_reads(parser, argv, args)
    width, height = args.frame_size
    check_memory(
        width * height * 3 * max(args.batch),
        f"--frame-size {width} {height} with --batch {max(args.batch)}",
        "give a camera's frame size, e.g. --frame-size 1280 720",
        BenchError,
    )
    # every count printed must be the count used: refuse what would be clipped or cut
    rounds = min(3, args.runs) if args.rounds is None else args.rounds
    if not 1 <= rounds <= args.runs:
        raise BenchError(
            f"--rounds {rounds} with --runs {args.runs}: give 1 to {args.runs} rounds "
            "(each round needs at least one timed call)"
        )
    if args.data_limit is not None and (args.data is None or args.data_limit < 1):
        raise BenchError(
            f"--data-limit {args.data_limit}: give N >= 1 with --data, or leave it out to score every image"
        )
    for backend in args.backend:
        check_backend_installed(backend)
    check_outputs(args.json, None if args.train else args.plot)
    hardware = detect()
    profile = auto_profile(hardware) if args.device == "auto" else PROFILES[args.device]
    if args.train:
        return run_train_bench(args, hardware, profile, imgsz_of(args.imgsz))
    if args.streams:
        return run_streams_bench(args, hardware, profile)
    if args.tiles:
        return run_tiles_bench(args, hardware, profile)
    if args.tracking:
        return run_tracking_bench(args, hardware, profile)
    adapters = args.adapter * len(args.model) if len(args.adapter) == 1 else args.adapter
    request = BenchSettings(
        models=list(args.model),
        adapters=list(adapters),
        backends=list(args.backend),
        profile=profile,
        batches=sorted(set(args.batch)),
        imgsz=imgsz_of(args.imgsz),
        runs=args.runs,
        warmup=args.warmup,
        rounds=rounds,
        frame_size=tuple(args.frame_size),
        data=args.data,
        data_limit=args.data_limit,
        work_dir=args.work_dir,
        threads=args.threads,
        names=args.names,
        precisions=list(dict.fromkeys(args.precision)),
    )
    result = run_bench(request, hardware)
    text, document = build_report(result)
    print(text)
    if args.json:
        write_json(args.json, document)
    if args.plot:
        write_plot(args.plot, result)
        print(f"plot: {args.plot}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
