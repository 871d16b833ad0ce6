"""Tiny runs for the trainer tests: a generated shapes dataset and a D-FINE-N config at 128 px.

The config includes the shipped quickstart config and shrinks it: 128 x 128 input unless asked, a
handful of images, num_workers 0, no strong augmentation (deterministic steps), no denoising unless asked.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import socket
import subprocess
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
import torch

REPO = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
MAIN = REPO / "train" / "main.py"
QUICKSTART = REPO / "configs" / "quickstart" / "dfine_n_synthetic.yml"


def make_dataset(root: Path, images: int = 8, val_images: int = 2) -> Path:
    from dfine_deploy.data.synthetic import SyntheticSpec, generate

    generate(root, SyntheticSpec(images=images, val_images=val_images, size=128, seed=0))
    return root


# Flat shapes of one colour each (BGR), so that a class is told by shape and colour at once: what a
# trained class head knows, and a fresh one does not.
SHAPES = {
    "square": ("rectangle", (40, 60, 240)),  # red
    "disc": ("ellipse", (240, 220, 40)),  # cyan
    "triangle": ("triangle", (60, 200, 60)),  # green
    "ring": ("ring", (40, 220, 240)),  # yellow
}


def _draw(
    image: np.ndarray, shape: str, colour: tuple[int, int, int], x: float, y: float, w: float, h: float
):
    """Fill `shape` into the box (x, y, w, h) of `image` in place."""
    x0, y0, x1, y1 = int(x), int(y), int(x + w) - 1, int(y + h) - 1
    centre, axes = (int(x + w / 2), int(y + h / 2)), (int(w / 2), int(h / 2))
    if shape == "rectangle":
        cv2.rectangle(image, (x0, y0), (x1, y1), colour, -1)
    elif shape == "ellipse":
        cv2.ellipse(image, centre, axes, 0, 0, 360, colour, -1)
    elif shape == "triangle":
        corners = np.array([[(x0 + x1) // 2, y0], [x1, y1], [x0, y1]], np.int32)
        cv2.fillPoly(image, [corners], colour)
    else:  # ring
        cv2.ellipse(image, centre, axes, 0, 0, 360, colour, max(2, int(min(w, h) / 5)))


def _apart(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    """Whether boxes (x, y, w, h) do not overlap."""
    return a[0] + a[2] <= b[0] or b[0] + b[2] <= a[0] or a[1] + a[3] <= b[1] or b[1] + b[3] <= a[1]


def shape_scenes(
    folder: Path,
    classes: Sequence[str],
    images: int,
    size: int,
    *,
    objects: int = 1,
    extent: tuple[float, float] = (0.35, 0.6),
    seed: int = 0,
) -> Path:
    """A COCO split in `folder` (label k = category id k = `classes[k]`, shapes and colours from
    `SHAPES`): `images` scenes on a plain grey background with mild noise, each with `objects` objects
    of different classes (image i starts at class i mod len(classes)), sides `extent` of the image side,
    boxes apart. Returns the folder."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    entries, boxes = [], []
    for i in range(images):
        image = np.full((size, size, 3), 110.0) + rng.normal(0.0, 6.0, (size, size, 3))
        for _attempt in range(100):  # the whole layout again until its boxes are apart
            layout = []
            for _ in range(objects):
                w, h = np.round(rng.uniform(*extent, 2) * size)
                x, y = np.round(rng.uniform(0.05 * size, np.array([size - w, size - h]) - 0.05 * size))
                layout.append((x, y, w, h))
            if all(_apart(a, b) for n, a in enumerate(layout) for b in layout[:n]):
                break
        else:
            raise AssertionError(f"shape_scenes: {objects} objects of {extent} do not fit in {size} px")
        for k, (x, y, w, h) in enumerate(layout):
            label = (i + k) % len(classes)
            _draw(image, *SHAPES[classes[label]], x, y, w, h)
            record = {"category_id": label, "bbox": [float(x), float(y), float(w), float(h)], "area": w * h}
            boxes.append({"id": len(boxes) + 1, "image_id": i + 1, **record})
        name = f"{i + 1:06d}.jpg"
        cv2.imwrite(str(folder / name), np.clip(image, 0, 255).astype(np.uint8))
        entries.append({"id": i + 1, "file_name": name, "width": size, "height": size})
    categories = [{"id": k, "name": name} for k, name in enumerate(classes)]
    coco = {"images": entries, "annotations": boxes, "categories": categories}
    (folder / "annotations.json").write_text(json.dumps(coco))
    return folder


def write_config(
    folder: Path,
    data: Path,
    *,
    epochs: int = 1,
    batch: int = 4,
    denoising: int = 0,
    flip: bool = False,
    stop_epoch: int = 0,
    checkpoint_freq: int = 1,
    eval_freq: int = 1,
    size: int = 128,
    queries: int = 64,
    class_names: list[str] | None = None,
    lrs: tuple[float, float] | None = None,
    detections: int | None = None,
) -> Path:
    """A YAML that includes the quickstart config and sizes it for tests. `stop_epoch` > 0: photometric
    distortion and multi-scale batches (96, 128 or 160 px) until that epoch, EMA restart decay 0.5 from it.
    `size`: the square input side; `queries`: decoder queries and kept detections (at most the feature
    tokens, 80 at 128 px); `class_names`: the dataset's classes when not the quickstart's four shapes;
    `lrs`: (learning rate, backbone learning rate) instead of the quickstart's 1e-3 for all;
    `detections`: the kept detections per image when not `queries` (at most queries x classes)."""
    ops = [{"type": "RandomHorizontalFlip"}] if flip else []
    if stop_epoch:
        ops.insert(0, {"type": "RandomPhotometricDistort", "p": 1.0})
    scales = "base_size_repeat: 1" if stop_epoch else "base_size_repeat: ~"
    ops += [
        {"type": "Resize", "size": [size, size]},
        {"type": "ConvertPILImage", "dtype": "float32", "scale": True},
        {"type": "ConvertBoxes", "fmt": "cxcywh", "normalize": True},
    ]
    val_ops = [
        {"type": "Resize", "size": [size, size]},
        {"type": "ConvertPILImage", "dtype": "float32", "scale": True},
    ]
    names = f"\n    class_names: {json.dumps(class_names)}" if class_names else ""
    settings = f"num_classes: {len(class_names)}\n" if class_names else ""
    if lrs:  # YAML reads 1e-05 as a string: the numbers are written with a decimal point
        settings += (
            f"optimizer: {{lr: {lrs[0]:.6f}, params: [{{params: '^(?=.*backbone)', lr: {lrs[1]:.6f}}}, "
            "{params: '^(?=.*(?:encoder|decoder))(?=.*(?:norm|bn|bias)).*$', weight_decay: 0.0}]}\n"
        )
    text = f"""
__include__: ['{QUICKSTART}']
output_dir: {folder / "out"}
eval_spatial_size: [{size}, {size}]
epochs: {epochs}
checkpoint_freq: {checkpoint_freq}
eval_freq: {eval_freq}
{settings}lr_warmup_scheduler: {{warmup_duration: 2}}
lr_scheduler: {{type: FlatCosineLR, flat_epochs: 1, min_lr_ratio: 0.05}}
ema: {{decay: 0.99, warmups: 5}}
DFINETransformer: {{num_denoising: {denoising}, num_queries: {queries}}}
DFINEPostProcessor: {{num_top_queries: {detections or queries}}}
train_dataloader:
  total_batch_size: {batch}
  num_workers: 0
  shuffle: True
  drop_last: True
  dataset:
    img_folder: {data / "train"}
    ann_file: {data / "train" / "annotations.json"}{names}
    transforms: {{ops: {json.dumps(ops)}, policy: {{name: stop_epoch, epoch: {stop_epoch},
                  ops: ['RandomPhotometricDistort']}}}}
  collate_fn: {{base_size: {size}, {scales}, stop_epoch: {stop_epoch}, ema_restart_decay: 0.5}}
val_dataloader:
  total_batch_size: 2
  num_workers: 0
  dataset:
    img_folder: {data / "val"}
    ann_file: {data / "val" / "annotations.json"}{names}
    transforms: {{ops: {json.dumps(val_ops)}}}
"""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.yml"
    path.write_text(text)
    return path


def options(*argv: str):
    """The RunSettings `train/main.py` makes of these flags."""
    from dfine_deploy.training.cli import get_args_parser, options_from_args

    return options_from_args(get_args_parser().parse_args(list(argv)))


def finished_run(root: Path) -> tuple[Path, Path, str]:
    """(config, output folder, printed text) of `--use-amp --seed 3` over 2 epochs of 1 step each, in
    `root`: the finished run test modules read (and must not change) through a `trained` fixture."""
    from dfine_deploy.training.trainer import run

    data = make_dataset(root / "data", images=2, val_images=1)
    cfg = write_config(root, data, epochs=2, batch=2)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        run(options("-c", str(cfg), "--use-amp", "--no-progress", "--seed", "3"))
    return cfg, root / "out", printed.getvalue()


@contextlib.contextmanager
def one_torch_thread():
    """Torch on one thread: the same arithmetic whatever the machine's core count, and no oversubscribed
    cores on a shared CPU. Measured on a 2-core machine busy with other work: test_learning.py's easy-set
    run took 43 s on one thread and over 300 s on two; its six-step test 7 s and 20-52 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(threads: int = 1) -> dict[str, str]:
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(threads), PYTHONUNBUFFERED="1")
    return env


PORT_IN_USE = ("eaddrinuse", "address already in use")  # the known transient: free_port() raced


def port_was_taken(output: str) -> bool:
    return any(marker in output.lower() for marker in PORT_IN_USE)


def retry_if_port_taken(launch, *, retries: int = 1):
    """`launch()` -> CompletedProcess-like (returncode, stdout, stderr); launched again only when it failed
    because the rendezvous port was taken between `free_port()` and torchrun binding it. Any other
    failure is returned as it is, and each retry is reported as a warning."""
    for attempt in range(retries + 1):
        proc = launch()
        output = f"{proc.stdout or ''}{proc.stderr or ''}"
        if proc.returncode == 0 or attempt == retries or not port_was_taken(output):
            return proc
        warnings.warn(
            f"torchrun: rendezvous port already in use; launching again (attempt {attempt + 2})", stacklevel=2
        )
    return proc


def torchrun(
    args: list[str],
    *,
    nproc: int,
    timeout: float,
    extra: list[str] = (),
    retries: int = 1,
    fresh: Path | None = None,
) -> subprocess.CompletedProcess:
    """`torchrun ... train/main.py args`, launched again only if the port was taken (see
    `retry_if_port_taken`); `fresh` (the run's output folder) is emptied before a retry so it does
    not auto-resume."""
    attempts = []

    def launch():
        if attempts and fresh is not None:
            shutil.rmtree(fresh, ignore_errors=True)
        attempts.append(1)
        cmd = [PYTHON, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *extra]
        if "--nnodes=2" not in extra:
            cmd += ["--master_addr=127.0.0.1", f"--master_port={free_port()}"]
        return subprocess.run(
            [*cmd, str(MAIN), *args],
            cwd=REPO,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    return retry_if_port_taken(launch, retries=retries)


def read_log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def load_weights(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


def cpu_loop(model, criterion, optimizer, **overrides):
    """A single-process CPU `Loop` for driving `train_one_epoch` / `accumulate_gradients` directly:
    float32, no EMA, no scaler, logging off; `overrides` set any other field."""
    from dfine_deploy.training.distributed import DistInfo
    from dfine_deploy.training.monitor import ResourceMonitor
    from dfine_deploy.training.runlog import RunLog
    from dfine_deploy.training.steps import Loop

    info = DistInfo()
    fields = {
        "model": model,
        "criterion": criterion,
        "optimizer": optimizer,
        "base_lrs": [group["lr"] for group in optimizer.param_groups],
        "schedule": None,
        "scaler": None,
        "ema": None,
        "info": info,
        "use_amp": False,
        "amp_dtype": torch.bfloat16,
        "clip_max_norm": 0.0,
        "accumulate": 1,
        "micro_batch": 2,
        "freeze_bn": False,
        "max_nonfinite": 5,
        "monitor": ResourceMonitor(info.device),
        "log": RunLog(active=False, output_dir=None, print_freq=0, progress=False),
        "last_checkpoint": None,
    }
    return Loop(**{**fields, **overrides})
