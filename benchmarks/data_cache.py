"""Data loading time of epoch 1 and epoch 2, with the decoded-image cache off, in RAM and in a folder.

With a cache, epoch 1 decodes JPEGs and fills the cache; epoch 2 reads decoded pixels. Each mode is
measured `--repeats` times from a cold cache (after one untimed warm-up pass that loads the
libraries and the page cache), and min / median / max are printed.

    .venv/bin/python benchmarks/data_cache.py                       # 200 synthetic images, 640 px
    .venv/bin/python benchmarks/data_cache.py --workers 2 --transforms train
    .venv/bin/python benchmarks/data_cache.py --data path/to/annotations.json --img-folder path/to/images
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from dfine_deploy.data.loader import build_dataloader, build_dataset
from dfine_deploy.data.synthetic import SyntheticSpec, generate
from dfine_deploy.settings import DataSettings, TransformOp, TransformsSettings


def transforms_for(kind: str, size: int) -> TransformsSettings:
    resize_and_float = (
        TransformOp("Resize", {"size": [size, size]}),
        TransformOp("ConvertPILImage", {"dtype": "float32", "scale": True}),
    )
    if kind == "none":
        return TransformsSettings(ops=())
    if kind == "eval":
        return TransformsSettings(ops=resize_and_float)
    return TransformsSettings(
        ops=(
            TransformOp("RandomPhotometricDistort", {"p": 0.5}),
            TransformOp("RandomZoomOut", {"fill": 0}),
            TransformOp("RandomIoUCrop", {"p": 0.8}),
            TransformOp("SanitizeBoundingBoxes", {"min_size": 1}),
            TransformOp("RandomHorizontalFlip"),
            resize_and_float[0],
            TransformOp("SanitizeBoundingBoxes", {"min_size": 1}),
            resize_and_float[1],
            TransformOp("ConvertBoxes", {"fmt": "cxcywh", "normalize": True}),
        )
    )


def epoch_times(settings: DataSettings) -> list[tuple[float, float]]:
    """[(wall s, this process's CPU s)] for epochs 1 and 2 (CPU excludes loader workers)."""
    dataset = build_dataset(settings)
    loader = build_dataloader(settings, dataset, seed=0)
    times = []
    for epoch in (0, 1):
        loader.set_epoch(epoch)
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in loader:
            pass
        times.append((time.perf_counter() - wall, time.process_time() - cpu))
    return times


def spread(values: list[float]) -> str:
    return f"{min(values):7.2f} {statistics.median(values):7.2f} {max(values):7.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--data", help="a COCO annotations json (default: generate synthetic images)")
    parser.add_argument("--img-folder", help="image folder of --data")
    parser.add_argument("--images", type=int, default=200, help="synthetic images to generate")
    parser.add_argument("--image-size", type=int, default=640, help="synthetic image side")
    parser.add_argument("--input-size", type=int, default=640, help="Resize target of the transforms")
    parser.add_argument("--transforms", choices=("none", "eval", "train"), default="eval")
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--cache-dir",
        default="/dev/shm",
        help="where the folder cache's own temporary folder is made, and removed at the end",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads in this process (1, as in a loader worker; more only adds contention)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    cache_root = tempfile.TemporaryDirectory(dir=args.cache_dir, prefix="dfine-cache-bench-")
    with tempfile.TemporaryDirectory() as tmp, cache_root as caches:
        if args.data:
            ann_file, img_folder = args.data, args.img_folder or str(Path(args.data).parent)
        else:
            generate(tmp, SyntheticSpec(images=args.images, seed=0, size=args.image_size, val_images=0))
            ann_file, img_folder = f"{tmp}/train/annotations.json", f"{tmp}/train"
        base = DataSettings(
            img_folder=img_folder,
            ann_file=ann_file,
            num_classes=1000,
            transforms=transforms_for(args.transforms, args.input_size),
            total_batch_size=args.batch,
            num_workers=args.workers,
        )
        count = len(build_dataset(base))
        print(
            f"{count} images from {ann_file}; transforms {args.transforms}, batch {args.batch}, "
            f"{args.workers} workers, {args.repeats} cold-cache repeats"
        )
        epoch_times(base)  # warm-up: imports, page cache
        print(
            f"{'cache':<8} {'epoch 1 wall s (min med max)':>29} {'epoch 2 wall s (min med max)':>29} "
            f"{'speed-up':>9} {'CPU s ep1/ep2 (med)':>20}"
        )
        for mode in ("off", "ram", "folder"):
            runs = []
            for repeat in range(args.repeats):
                cache = str(Path(caches) / f"cold-{repeat}") if mode == "folder" else mode  # a new one
                runs.append(epoch_times(DataSettings(**{**base.__dict__, "cache": cache})))
            first, second = [r[0][0] for r in runs], [r[1][0] for r in runs]
            cpu1, cpu2 = statistics.median(r[0][1] for r in runs), statistics.median(r[1][1] for r in runs)
            speed_up = statistics.median(first) / statistics.median(second)
            print(
                f"{mode:<8} {spread(first):>29} {spread(second):>29} "
                f"{speed_up:8.2f}x {cpu1:9.2f} / {cpu2:.2f}"
            )


if __name__ == "__main__":
    main()
