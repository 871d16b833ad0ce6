"""Images/s and peak RSS of one D-FINE-N training step (forward, full loss, backward, AdamW step).

    python benchmarks/train_step.py                      # 640 and 320, batch 4, 2 threads
    python benchmarks/train_step.py --sizes 320 --steps 5 --threads 2
    python benchmarks/train_step.py --sizes 256 --batch 1 --steps 1 --warmup 0   # seconds: the suite's form

Each size runs in its own subprocess so that its peak RSS is its own. Random images with a few
boxes each; denoising on (the official training forward); float32 unless --amp (bf16 on CPU).
Reference: the official trainer on a 2-core CPU does about 2.2-2.6 images/s at batch 4 and 640 px,
4-5.5 at 320 px, with about 2.8 GB peak RSS at 640.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def our_parts(size: int) -> tuple:
    """D-FINE-N at `size` px placed on the CPU as the trainer places it, its criterion and its AdamW
    with the trainer's parameter groups: (spec, model, criterion, optimizer)."""
    import torch

    from dfine_deploy.model.dfine import to_device
    from dfine_deploy.model.families import build_model
    from dfine_deploy.model.spec import size_spec
    from dfine_deploy.training.criterion import build_criterion
    from dfine_deploy.training.optim import build_optimizer

    spec = size_spec("n").with_input_size(size, size)
    model = to_device(build_model(spec).train(), torch.device("cpu"))
    optimizer, _ = build_optimizer(model, lr=2e-4, weight_decay=1e-4)
    return spec, model, build_criterion(spec), optimizer


def random_batch(batch: int, size: int, num_classes: int) -> tuple:
    """`batch` random images [B, 3, size, size] and 5 random boxes each ([5, 4] normalised cxcywh),
    the same on every call: (images, targets)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    images = torch.rand(batch, 3, size, size, generator=gen)
    targets = []
    for _ in range(batch):
        centre = torch.rand(5, 2, generator=gen) * 0.6 + 0.2
        wh = torch.rand(5, 2, generator=gen) * 0.2 + 0.05
        labels = torch.randint(0, num_classes, (5,), generator=gen)
        targets.append({"labels": labels, "boxes": torch.cat([centre, wh], 1)})
    return images, targets


def step_once(model, criterion, optimizer, images, targets, step: int, amp: bool = False) -> None:
    """One optimizer step as the official det_engine.train_one_epoch takes it: forward (bf16 autocast
    with `amp`), the criterion's losses summed, backward, gradients clipped at 0.1, the step."""
    import torch

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        outputs = model(images, targets=targets)
    losses = criterion(outputs, targets, epoch=0, step=step, global_step=step, epoch_step=1)
    loss = sum(losses.values())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.1)
    optimizer.step()


def measure(size: int, batch: int, steps: int, warmup: int, threads: int, amp: bool) -> dict:
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    spec, model, criterion, optimizer = our_parts(size)
    images, targets = random_batch(batch, size, spec.num_classes)
    times = []
    for i in range(warmup + steps):
        start = time.perf_counter()
        step_once(model, criterion, optimizer, images, targets, i, amp)
        if i >= warmup:
            times.append(time.perf_counter() - start)
    per_s = [batch / t for t in times]
    return {
        "size": size,
        "batch": batch,
        "threads": threads,
        "amp": amp,
        "steps": steps,
        "img_s_min": min(per_s),
        "img_s_median": statistics.median(per_s),
        "img_s_max": max(per_s),
        "step_s_median": statistics.median(times),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[640, 320])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--amp", action="store_true", help="bf16 autocast (CPU)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--one", type=int, help=argparse.SUPPRESS)  # child mode: measure one size
    args = p.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.batch, args.steps, args.warmup, args.threads, args.amp)))
        return
    rows = []
    for size in args.sizes:
        cmd = [
            sys.executable,
            __file__,
            "--one",
            str(size),
            "--batch",
            str(args.batch),
            "--steps",
            str(args.steps),
            "--warmup",
            str(args.warmup),
            "--threads",
            str(args.threads),
        ] + (["--amp"] if args.amp else [])
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            raise SystemExit(f"train_step: size {size} failed:\n{done.stderr[-3000:]}")
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    print(
        f"D-FINE-N training step, batch {args.batch}, {args.threads} threads, {args.steps} timed steps "
        f"after {args.warmup} warm-up{' (bf16)' if args.amp else ''}"
    )
    print(f"{'size':>5} {'img/s min':>10} {'median':>8} {'max':>8} {'s/step':>8} {'peak RSS MB':>12}")
    for r in rows:
        print(
            f"{r['size']:>5} {r['img_s_min']:>10.2f} {r['img_s_median']:>8.2f} {r['img_s_max']:>8.2f} "
            f"{r['step_s_median']:>8.2f} {r['peak_rss_mb']:>12.0f}"
        )
    print("official trainer on a 2-core CPU: 2.2-2.6 img/s at 640, 4-5.5 at 320, ~2.8 GB peak RSS at 640")


if __name__ == "__main__":
    main()
