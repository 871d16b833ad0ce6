"""`dfine-data`: make the synthetic dataset, validate a dataset, convert YOLO to COCO.

dfine-data synth --out runs/synthetic --images 400 --seed 0 [--size 320] [--val-images 80]
dfine-data synth --out runs/dense --images 4 --val-images 8 --dense [--dense-size 8 24]  (dfine-bench --tiles)
dfine-data video --out runs/videos/demo.mp4 [--scene demo|fast|idle] [--fps 10] [--stop 2] [--occluder 0.3]
                 (and its true tracks and crossings beside it, for dfine-bench --tracking)
dfine-data validate data/train/annotations.json [--img-folder data/train] [--json]
dfine-data validate data/yolo/data.yaml --split val
dfine-data validate roboflow-export/        (any layout of dfine_deploy/data/formats.py, folder or file)
dfine-data convert-yolo data/yolo --out data/coco
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Sequence
from pathlib import Path

from dfine_deploy.cli import (
    ArgumentParser,
    configure_logging,
    friendly_errors,
    int_at_least,
    non_negative_float,
)
from dfine_deploy.data.classmap import ClassMap
from dfine_deploy.data.moving import CODECS, SCENES
from dfine_deploy.data.synthetic import SyntheticSpec
from dfine_deploy.data.validation import CHECK_LEVELS, PROBLEMS, ValidationPolicy
from dfine_deploy.errors import DatasetError
from dfine_deploy.files import user_path

DEFAULT_SPLIT = "val"


def get_args_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="dfine-data", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)

    synth = sub.add_parser("synth", help="write the synthetic shapes dataset as a COCO folder")
    synth.add_argument(
        "--out",
        required=True,
        type=user_path,
        help="output folder: train/ and val/, each written whole (over our own only)",
    )
    synth.add_argument("--images", type=int, required=True, help="number of training images")
    synth.add_argument("--seed", type=int_at_least(0), default=0)
    synth.add_argument(
        "--size",
        type=int,
        help=f"square image side in pixels (default {SyntheticSpec.size}; not with --dense)",
    )
    synth.add_argument("--val-images", type=int, default=None, help="validation images (default: images / 5)")
    synth.add_argument(
        "--dense",
        action="store_true",
        help="1920x1080 scenes of 150-400 objects of 8-24 px, some across tile seams (measures tiles)",
    )
    synth.add_argument(
        "--dense-size",
        type=float,
        nargs=2,
        metavar=("MIN", "MAX"),
        default=None,
        help="with --dense: the object size range in pixels (default 8 24)",
    )

    video = sub.add_parser(
        "video",
        help="write a video of moving shapes with its ground truth: MOT Challenge tracks and line crossings",
    )
    video.add_argument(
        "--out",
        required=True,
        type=user_path,
        help="the video (.mp4); NAME.gt.txt and NAME.truth.json are written beside it",
    )
    video.add_argument(
        "--scene",
        choices=tuple(SCENES),
        default="demo",
        help="; ".join(f"{name}: {about}" for name, (_, about) in SCENES.items()).replace("%", "%%")
        + " (default demo)",  # argparse formats help with %
    )
    video.add_argument("--seconds", type=non_negative_float, default=12.0, help="length (default 12)")
    video.add_argument("--fps", type=int_at_least(1), default=10, help="frame rate (default 10)")
    video.add_argument(
        "--size",
        type=int,
        nargs=2,
        metavar=("W", "H"),
        default=(480, 360),
        help="frame size (default 480 360)",
    )
    video.add_argument(
        "--stop",
        type=non_negative_float,
        default=0.0,
        metavar="SECONDS",
        help="every object stands still this long halfway along its way (straight ones: on the line)",
    )
    video.add_argument(
        "--scale", type=non_negative_float, default=1.0, help="object size factor: 0.3 makes small objects"
    )
    video.add_argument(
        "--occluder",
        type=float,
        default=None,
        metavar="X",
        help="a pillar centred at this share of the width (0..1) hides what passes behind it",
    )
    video.add_argument(
        "--one-colour",
        action="store_true",
        help="every object in one colour: classes told apart by shape alone",
    )
    video.add_argument("--codec", choices=CODECS, default=CODECS[0], help="h264 needs the serve extra")
    video.add_argument("--seed", type=int_at_least(0), default=0, help="the background and the noise")

    defaults = ValidationPolicy()
    policy_help = "; ".join(
        f"{name}: {'|'.join(allowed)} (default {getattr(defaults, name)})"
        for name, (allowed, _) in PROBLEMS.items()
    )
    for name, helptext in (
        ("validate", "check a COCO json or YOLO data.yaml and print the report and class table"),
        ("convert-yolo", "convert a YOLO dataset (data.yaml + images/ + labels/) to COCO folders"),
    ):
        p = sub.add_parser(name, help=helptext)
        if name == "validate":
            p.add_argument(
                "source",
                type=user_path,
                help="a dataset folder or annotation file: COCO json, Roboflow / CVAT / Label Studio export, "
                "YOLO data.yaml, Pascal VOC folder",
            )
            p.add_argument(
                "--img-folder",
                type=user_path,
                help="a plain COCO json's image folder (default: the json's folder)",
            )
            p.add_argument(
                "--split", help=f"the split to check, of a dataset with several (default {DEFAULT_SPLIT})"
            )
            p.add_argument(
                "--remap", action="store_true", help="show labels as with remap_mscoco_category: True"
            )
            p.add_argument("--json", action="store_true", help="print the report as JSON")
        else:
            p.add_argument("source", type=user_path, help="YOLO data.yaml or the folder holding it")
            p.add_argument(
                "--out",
                required=True,
                type=user_path,
                help="output folder: OUT/<split>/annotations.json + images, each split written whole "
                "(replacing only an earlier conversion of ours)",
            )
        p.add_argument("--policy", action="append", default=[], metavar="PROBLEM=ACTION", help=policy_help)
        p.add_argument(
            "--check-images",
            choices=CHECK_LEVELS,
            default="header",
            help="header: size and end marker (default); decode: full decode of every image",
        )
    return parser


def _policy(args: argparse.Namespace) -> ValidationPolicy:
    values = {"check_images": args.check_images}
    for item in args.policy:
        if "=" not in item:
            raise DatasetError(f"--policy {item!r}: expected PROBLEM=ACTION, e.g. --policy empty_image=skip")
        key, value = item.split("=", 1)
        values[key.strip()] = value.strip()
    return ValidationPolicy.from_mapping(values)


def _validate(args: argparse.Namespace) -> int:
    from dfine_deploy.data.formats import open_dataset

    dataset = open_dataset(args.source, img_folder=args.img_folder, img_folder_option="--img-folder")
    ann_set = dataset.load(args.split, policy=_policy(args), chosen=True)
    class_map = ClassMap.from_categories(ann_set.categories, remap=args.remap)
    if args.json:
        print(
            json.dumps(
                {
                    "layout": dataset.format.name,
                    "notes": ann_set.notes,
                    "report": ann_set.report.to_dict(),
                    "class_map": class_map.to_dict(),
                },
                indent=2,
            )
        )
    else:
        print("\n".join(ann_set.lines()))
        print(ann_set.report.format())
        print()
        print(class_map.table())
    return 0


def _synth(args: argparse.Namespace) -> int:
    from dfine_deploy.data.synthetic import generate

    if args.dense_size is not None and not args.dense:
        raise DatasetError(
            "dfine-data synth --dense-size: it sizes the objects of --dense scenes; add --dense"
        )
    if args.size is not None and args.dense:
        raise DatasetError(
            f"dfine-data synth --size {args.size}: --dense scenes are 1920x1080 whatever --size says; "
            "leave --size out"
        )
    extra = {} if args.dense_size is None else {"dense_size": tuple(args.dense_size)}
    if args.size is not None:
        extra["size"] = args.size
    spec = SyntheticSpec(
        images=args.images,
        seed=args.seed,
        val_images=args.val_images,
        dense=args.dense,
        **extra,
    )
    start = time.perf_counter()
    written = generate(args.out, spec)
    elapsed = time.perf_counter() - start
    for split, path in written.items():
        data = json.loads(path.read_text())
        print(f"{split}: {len(data['images'])} images, {len(data['annotations'])} boxes -> {path}")
    low, high = spec.dense_size
    scene = f"1920x1080 dense scenes, objects of {low:g}-{high:g} px" if spec.dense else f"{spec.size} px"
    print(f"done in {elapsed:.1f} s (seed {spec.seed}, {scene})")
    return 0


def _written_by_video(facts: Path) -> bool:
    """Whether `facts` is a NAME.truth.json of ours (`DemoVideo.write_truth`'s keys)."""
    try:
        data = json.loads(facts.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (
        isinstance(data, dict) and {"fps", "frames", "line", "expected_crossings", "classes"} <= data.keys()
    )


VIDEO_MIN_FRAMES = 10
OBJECT_MIN_PX = 4  # smaller shapes are no longer told apart (a triangle of 3 px is a dot)


def _video(args: argparse.Namespace) -> int:
    from dfine_deploy.data.moving import DemoVideo, longest_stop, scaled, stopping, truth_paths

    out = Path(args.out)
    if out.suffix.lower() != ".mp4":
        raise DatasetError(f"dfine-data video --out {out}: name an .mp4 file, e.g. --out videos/demo.mp4")
    if args.occluder is not None and not 0.0 <= args.occluder <= 1.0:
        raise DatasetError(f"dfine-data video --occluder {args.occluder}: give a share of the width, 0 to 1")
    tracks, facts = truth_paths(out)
    if not _written_by_video(facts):  # replace only a video of ours, known by its truth beside it
        for path in (out, tracks, facts):
            if path.exists():
                raise DatasetError(
                    f"dfine-data video --out {out}: {path} exists and is not a file this command wrote "
                    f"(no truth file of ours beside it); name a new video"
                )
    width, height = args.size
    frames = round(args.seconds * args.fps)
    if frames < VIDEO_MIN_FRAMES:  # was raised to 10 frames without a word
        raise DatasetError(
            f"dfine-data video --seconds {args.seconds:g}: {frames} frames at --fps {args.fps}; a video has "
            f"at least {VIDEO_MIN_FRAMES}: give --seconds {VIDEO_MIN_FRAMES / args.fps:g} or more"
        )
    make, _ = SCENES[args.scene]
    objects = scaled(make(frames, width, height), args.scale)
    sizes = [obj.extent * height for obj in objects]
    if min(sizes) < OBJECT_MIN_PX or max(sizes) > height:
        raise DatasetError(
            f"dfine-data video --scale {args.scale:g}: its objects would be {min(sizes):.1f} to "
            f"{max(sizes):.0f} px in a {height} px high frame; give a --scale that keeps them "
            f"{OBJECT_MIN_PX} px or more and within the frame"
        )
    if args.stop:
        most = longest_stop(objects, args.fps)
        if args.stop > most:  # was cut to what fits without a word
            raise DatasetError(
                f"dfine-data video --stop {args.stop:g}: the shortest time an object is in view holds a "
                f"stop of at most {most:.1f} s at --seconds {args.seconds:g}; give a shorter --stop or a "
                "longer video"
            )
        objects = stopping(objects, args.stop, args.fps)
    video = DemoVideo(
        width=width,
        height=height,
        fps=args.fps,
        frames=frames,
        seed=args.seed,
        objects=objects,
        occluder=args.occluder,
        one_colour=args.one_colour,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    video.write(out, codec=args.codec, truth=True)
    described = video.describe()
    print(f"{out}: {frames} frames at {args.fps} fps, {width}x{height}, scene {args.scene}")
    print(f"{tracks}: the objects' true tracks (MOT Challenge); {facts}: the line and its crossings")
    print(f"the middle line's true crossings: {described['expected_crossings']}")
    print(f"score a model on it: dfine-bench --model MODEL --tracking {out}")
    return 0


def _convert(args: argparse.Namespace) -> int:
    from dfine_deploy.data.formats import recognise
    from dfine_deploy.data.yolo import convert_yolo

    dataset = recognise(Path(args.source))
    if dataset is not None and dataset.format.name != "yolo":
        raise DatasetError(
            f"{args.source}: a {dataset.format.title}, which every command reads as it is (dfine-data "
            "validate, a config's ann_file, --data): no conversion needed; convert-yolo converts a YOLO "
            "dataset with a data.yaml"
        )
    converted = convert_yolo(args.source, args.out, policy=_policy(args))
    for split, ann_set in converted.items():
        print(
            f"{split}: {ann_set.report.images_kept} images, {ann_set.report.annotations_kept} boxes "
            f"-> {Path(args.out) / split / 'annotations.json'}"
        )
        counts = dict(ann_set.report.counts)
        if counts:
            print(f"  {counts}")
    first = next(iter(converted.values()))
    print()
    print(ClassMap.from_categories(first.categories, remap=False).table())
    return 0


@friendly_errors
def main(argv: Sequence[str] | None = None) -> int:
    args = get_args_parser().parse_args(argv)
    configure_logging()
    commands = {"synth": _synth, "video": _video, "validate": _validate, "convert-yolo": _convert}
    return commands[args.command](args)


if __name__ == "__main__":
    raise SystemExit(main())
