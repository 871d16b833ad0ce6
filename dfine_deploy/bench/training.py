"""`dfine-bench --train`: training images/s and epochs/hour, beside the 4 x V100 row.

One training step is what the trainer does per batch: the training forward (denoising on), the full
D-FINE criterion, backward, gradient clipping at 0.1 and an AdamW step from the trainer's own
parameter groups, under FP16 autocast with a GradScaler on CUDA (FP32 on the CPU). Random images
with a few random boxes each: speed does not depend on the pixels.

The reference row says D-FINE-M trains at 5 epochs/hour on 4 x V100; for COCO train2017
(118,287 images) that is about 164 images/s for the four cards, 41 per card.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from dfine_deploy.backend_names import Precision
from dfine_deploy.bench.hardware import Hardware, measured_on_line
from dfine_deploy.bench.measure import noise_reasons, time_calls
from dfine_deploy.bench.report import render_table, write_json
from dfine_deploy.bench.tables import HARDWARE_SELECTION, Profile
from dfine_deploy.errors import BenchError, require
from dfine_deploy.model.reference import classify_model_ref, model_ref_forms

REFERENCE = next(r for r in HARDWARE_SELECTION if r.unit == "epochs/hour")
REFERENCE_GPUS = 4
COCO_TRAIN_IMAGES = 118287


def spec_of(ref: str, imgsz: tuple[int, int] | None):
    """A ModelSpec from a size name or an official-layout .yml."""
    if classify_model_ref(ref).kind == "config":
        from dfine_deploy.config import load_config

        spec = load_config(ref).model_spec
    else:
        from dfine_deploy.model.spec import size_spec

        spec = size_spec(ref)
    return spec.with_input_size(*imgsz) if imgsz else spec


AMP_DTYPES = (Precision.FP16, Precision.BF16)


def make_train_step(spec, batch: int, device: str, seed: int = 0, amp: str = Precision.FP16):
    """A callable doing one full training step, and a synchronise function for timing.

    `amp`: the autocast type on CUDA, "fp16" (with a GradScaler) or "bf16" (no scaler: bf16 has
    fp32's exponent range); on the CPU "bf16" autocasts too and "fp16" runs in fp32."""
    torch = require("torch", "train", "dfine-bench --train")
    from dfine_deploy.model.families import build_model
    from dfine_deploy.training.criterion import build_criterion
    from dfine_deploy.training.optim import build_optimizer

    torch.manual_seed(seed)
    dev = torch.device(device)
    model = build_model(spec).to(dev).train()
    criterion = build_criterion(spec).to(dev)
    optimizer, _ = build_optimizer(model, lr=2e-4, weight_decay=1e-4)
    cuda = dev.type == "cuda"
    if amp not in AMP_DTYPES:
        raise ValueError(f"amp={amp!r}: choose one of {', '.join(AMP_DTYPES)}")
    dtype = torch.float16 if amp == Precision.FP16 else torch.bfloat16
    autocast = cuda or amp == Precision.BF16
    scaler = torch.amp.GradScaler("cuda", enabled=cuda and amp == Precision.FP16)
    height, width = spec.eval_spatial_size
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(batch, 3, height, width, generator=gen).to(dev)
    targets = []
    for _ in range(batch):
        centre = torch.rand(5, 2, generator=gen) * 0.6 + 0.2
        wh = torch.rand(5, 2, generator=gen) * 0.2 + 0.05
        targets.append(
            {
                "labels": torch.randint(0, spec.num_classes, (5,), generator=gen).to(dev),
                "boxes": torch.cat([centre, wh], 1).to(dev),  # [5, 4] normalised cxcywh
            }
        )
    state = {"step": 0, "loss": float("nan")}

    def step() -> None:
        with torch.autocast(dev.type, dtype=dtype, enabled=autocast):
            outputs = model(images, targets=targets)
            losses = criterion(
                outputs, targets, epoch=0, step=state["step"], global_step=state["step"], epoch_step=1
            )
        loss = sum(losses.values())
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
        scaler.step(optimizer)
        scaler.update()
        state["step"] += 1
        state["loss"] = float(loss.detach())

    def synchronize() -> None:
        if cuda:
            torch.cuda.synchronize(dev)

    return step, synchronize, state


def measure_training(
    ref: str, imgsz, batch: int, runs: int, warmup: int, device: str, amp: str = Precision.FP16
) -> dict[str, Any]:
    torch = require("torch", "train", "dfine-bench --train")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    spec = spec_of(ref, imgsz)
    step, synchronize, state = make_train_step(spec, batch, device, amp=amp)
    timing = time_calls(
        step, batch=batch, warmup=warmup, runs=runs, rounds=min(3, runs), synchronize=synchronize
    )
    peak_gpu = round(torch.cuda.max_memory_allocated() / 2**20, 1) if device.startswith("cuda") else None
    return {
        "device": device,
        "amp": amp,
        "timing": timing,
        "loss": state["loss"],
        "gpu_peak_mb": peak_gpu,
        "imgsz": list(spec.eval_spatial_size),
    }


def run_train_bench(
    args: argparse.Namespace, hardware: Hardware, profile: Profile, imgsz: tuple[int, int] | None
) -> int:
    """`dfine-bench --train`: `imgsz` is the checked `--imgsz` (None: the model's own size)."""
    ref = args.model[0]
    if classify_model_ref(ref).kind not in ("size", "config"):
        raise BenchError(f"--train --model {ref}: give {model_ref_forms(('size', 'config'))}")
    device = "cpu" if profile.kind == "cpu" else "auto"
    result = measure_training(ref, imgsz, args.train_batch, args.runs, args.warmup, device)
    timing = result["timing"]
    images_per_s = timing.fps
    epochs_per_hour = images_per_s * 3600 / args.train_images
    ref_per_gpu = REFERENCE.value * COCO_TRAIN_IMAGES / 3600 / REFERENCE_GPUS
    noise = noise_reasons(timing, hardware.load_average[0], hardware.cpu_count)
    low, high = timing.fps_range
    cells = [
        ref,
        f"{result['imgsz'][0]}x{result['imgsz'][1]}",
        str(args.train_batch),
        result["device"],
        f"{low:.2f}-{high:.2f}" if noise else f"{images_per_s:.2f}",
        f"{timing.min:.0f}/{timing.median:.0f}/{timing.max:.0f}",
        f"{epochs_per_hour:.3f}",
        str(args.train_images),
        f"{ref_per_gpu:.1f}",
        f"{images_per_s / ref_per_gpu:.3f}",
        "noisy machine" if noise else "ok",
    ]
    header = [
        "Model",
        "Size",
        "Batch",
        "Device",
        "Images/s",
        "Step min/med/max (ms)",
        "Epochs/hour",
        "Dataset images",
        "Ref images/s per V100",
        "Ratio",
        "Status",
    ]
    lines = [
        f"reference: {REFERENCE.scenario} | {REFERENCE.hardware} | {REFERENCE.model} | {REFERENCE.expected} "
        f"(= {ref_per_gpu:.1f} images/s per card for COCO train2017, {COCO_TRAIN_IMAGES} images)",
        measured_on_line(profile, hardware, result["device"]),
    ]
    notes = [f"noisy machine: {'; '.join(noise)}"] if noise else []
    notes.append(
        f"one step = training forward + D-FINE loss + backward + clip 0.1 + AdamW"
        f"{', FP16 autocast' if result['device'].startswith('cuda') else ', FP32'}; {args.warmup} warm-up + "
        f"{timing.runs} timed steps; final loss {result['loss']:.3f}; GPU peak "
        f"{result['gpu_peak_mb'] if result['gpu_peak_mb'] is not None else 'n/a'} MB; epochs/hour is for one "
        f"process on this device"
    )
    print("\n".join([*lines, "", render_table(header, [cells]), "", *notes]))
    if args.json:
        document = {
            "reference": lines,
            "columns": header,
            "table": [cells],
            "notes": notes,
            "timing": timing.to_dict(),
            "images_per_s": images_per_s,
            "epochs_per_hour": epochs_per_hour,
            "hardware": hardware.to_dict(),
            "profile": profile.key,
        }
        write_json(Path(args.json), document)
    return 0
