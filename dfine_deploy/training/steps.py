"""What `trainer.run` calls per epoch: `train_one_epoch` (its optimizer steps with gradient
accumulation, loss reduction across ranks, clipping and the non-finite skip) and `evaluate`.

Host syncs (marked `# host sync`): one stacked loss reduction per micro-batch (it also tells every
rank whether the loss is finite) and the gradient-norm check per optimizer step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dfine_deploy.errors import TrainingError
from dfine_deploy.training import distributed as dist_utils
from dfine_deploy.training.checkpoint import Progress
from dfine_deploy.training.ema import ModelEMA
from dfine_deploy.training.monitor import ResourceMonitor
from dfine_deploy.training.optim import LRSchedule, set_lr
from dfine_deploy.training.runlock import exit_if_terminated
from dfine_deploy.training.runlog import EpochRecord, RunLog


@dataclass
class Loop:
    """What every training step uses; built once by `run`, passed explicitly."""

    model: nn.Module  # DDP-wrapped under torchrun
    criterion: nn.Module
    optimizer: torch.optim.Optimizer
    base_lrs: list[float]  # each group's lr before the schedule's factor
    schedule: LRSchedule
    scaler: torch.amp.GradScaler | None  # CUDA AMP only
    ema: ModelEMA | None
    info: dist_utils.DistInfo
    use_amp: bool
    amp_dtype: torch.dtype
    clip_max_norm: float
    accumulate: int  # micro-batches per optimizer step
    micro_batch: int  # images per rank per micro-batch
    freeze_bn: bool
    max_nonfinite: int
    monitor: ResourceMonitor
    log: RunLog
    last_checkpoint: Path  # named when non-finite losses stop the run
    nonfinite_streak: int = 0  # consecutive skipped optimizer steps, across epoch boundaries


def train_one_epoch(loop: Loop, loader: Iterable, epoch: int, progress: Progress) -> EpochRecord:
    """One pass over `loader`; advances `progress.step` and `progress.nonfinite_total`."""
    model, info = loop.model, loop.info
    model.train()
    loop.criterion.train()
    if loop.freeze_bn:
        freeze_batchnorm(model)
    steps = optimizer_steps(len(loader), loop.accumulate)
    loop.monitor.start_epoch()
    loop.log.start_epoch(epoch, loop.schedule.epochs, steps)
    sums: dict[str, float] = {}
    step_losses: list[float] = []
    images = 0
    lr = 0.0
    started = time.perf_counter()
    for index, group in enumerate(accumulation_groups(loader, loop.accumulate)):
        exit_if_terminated()
        loop.monitor.data_ready()  # the group's micro-batches are loaded by now
        lr = set_lr(loop.optimizer, loop.base_lrs, loop.schedule.lr_factor(progress.step, epoch))
        values = accumulate_gradients(loop, group, epoch)
        if values is not None and optimizer_step(loop):
            loop.nonfinite_streak = 0
            progress.step += 1
            if loop.ema is not None:
                loop.ema.update(model)
            step_losses.append(values["loss"])
            for key, value in values.items():
                sums[key] = sums.get(key, 0.0) + value
            images += len(group) * loop.micro_batch * info.world_size
            loop.log.step(epoch, index, steps, values["loss"], lr, images / (time.perf_counter() - started))
        else:
            skip_step(loop, progress, epoch, index, values)
        loop.monitor.step_done(info.distributed)
    loop.log.end_epoch()
    resources = loop.monitor.end_epoch()
    seconds = time.perf_counter() - started
    done = max(1, len(step_losses))
    averaged = {key: value / done for key, value in sums.items()}
    train_loss = averaged.pop("loss", float("nan"))
    record: EpochRecord = {
        **averaged,
        "train_loss": train_loss,
        "lr": lr,  # type: ignore[typeddict-item]
        "step_losses": step_losses,
        "skipped_steps": steps - len(step_losses),
        "epoch_seconds": round(seconds, 2),
        "images_per_second": round(images / seconds, 2),
        "resources": resources.summary(),
    }
    for note in resources.warnings():
        loop.log.log(f"warning: {note}")
    if resources.gpu_util_note and loop.info.device.type == "cuda":
        loop.log.log(f"note: {resources.gpu_util_note}")
    return record


def optimizer_steps(batches: int, accumulate: int) -> int:
    """Optimizer steps of an epoch of `batches` micro-batches: one per `accumulate` of them, the last
    group may be shorter (see `accumulation_groups`). 0 when the loader yields no batch."""
    return -(-batches // accumulate)


def accumulation_groups(loader: Iterable, accumulate: int) -> Iterator[list[Any]]:
    """The loader's batches in lists of `accumulate` (the last list holds what is left)."""
    group: list[Any] = []
    for batch in loader:
        group.append(batch)
        if len(group) == accumulate:
            yield group
            group = []
    if group:
        yield group


def accumulate_gradients(loop: Loop, group: list[Any], epoch: int) -> dict[str, float] | None:
    """Forward + backward of each micro-batch, each loss divided by the group size (so the gradient
    is the group's mean, as one batch of all its images would give); DDP all-reduces only on the
    last micro-batch (`no_sync` before). Returns the loss terms averaged over micro-batches and
    ranks, or None when a loss was not finite (the gradients are then dropped on every rank)."""
    model, info = loop.model, loop.info
    loop.optimizer.zero_grad(set_to_none=True)
    totals: dict[str, float] = {}
    for k, (images, targets) in enumerate(group):
        last = k == len(group) - 1
        sync = contextlib.nullcontext() if (last or not info.distributed) else model.no_sync()
        with sync:
            images = images.to(info.device, non_blocking=True)
            targets = _to_device(targets, info.device)
            with torch.autocast(info.device.type, dtype=loop.amp_dtype, enabled=loop.use_amp):
                outputs = model(images, targets=targets)
            losses = loop.criterion(to_float32(outputs), targets)
            loss = sum(losses.values())
            values = reduce_losses(losses, loss, info)
            if values is None:
                loop.optimizer.zero_grad(set_to_none=True)
                return None
            scaled = loss / len(group)
            (loop.scaler.scale(scaled) if loop.scaler is not None else scaled).backward()
        for key, value in values.items():
            totals[key] = totals.get(key, 0.0) + value / len(group)
    return totals


def reduce_losses(
    losses: dict[str, torch.Tensor], loss: torch.Tensor, info: dist_utils.DistInfo
) -> dict[str, float] | None:
    """All loss terms and the total, averaged over ranks in ONE stacked all-reduce and read back in
    one transfer (torchvision's `reduce_dict`); None when any rank's loss is not finite, so that
    every rank skips the step together (DDP would otherwise wait for a backward one rank skipped)."""
    names = [*losses, "loss"]
    finite = torch.isfinite(loss.detach()).to(torch.float32)
    stacked = torch.stack([*(v.detach().float() for v in losses.values()), loss.detach().float(), finite])
    if info.distributed:
        torch.distributed.all_reduce(stacked)
        stacked /= info.world_size
    values = stacked.tolist()  # host sync: the one per micro-batch
    if values[-1] < 1.0:
        return None
    return dict(zip(names, values[:-1], strict=True))


def optimizer_step(loop: Loop) -> bool:
    """Clip and step; False (nothing applied) when the gradient is not finite. The norm is the same on
    every rank after DDP's all-reduce, so all ranks agree. Under CUDA AMP, GradScaler unscales first
    and skips overflowing steps itself (normal while it calibrates). The norm uses torch's multi-tensor
    kernels on every device (on the CPU torch would loop over the 430 tensors of D-FINE-N)."""
    params = [p for p in loop.model.parameters() if p.requires_grad]
    max_norm = loop.clip_max_norm if loop.clip_max_norm and loop.clip_max_norm > 0 else float("inf")
    if loop.scaler is not None:
        loop.scaler.unscale_(loop.optimizer)
        nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
        loop.scaler.step(loop.optimizer)  # host sync inside (GradScaler's inf check)
        loop.scaler.update()
        return True
    norm = nn.utils.clip_grad_norm_(params, max_norm, foreach=True)
    if not bool(torch.isfinite(norm)):  # host sync: one per optimizer step
        loop.optimizer.zero_grad(set_to_none=True)
        return False
    loop.optimizer.step()
    return True


def skip_step(
    loop: Loop, progress: Progress, epoch: int, index: int, values: dict[str, float] | None
) -> None:
    """Count a skipped optimizer step; stop the run after `max_nonfinite` in a row."""
    loop.nonfinite_streak += 1
    progress.nonfinite_total += 1
    what = "loss" if values is None else "gradient"
    loop.log.log(
        f"epoch {epoch} step {index}: non-finite {what}; step skipped ({loop.nonfinite_streak} in a row)"
    )
    if loop.nonfinite_streak >= loop.max_nonfinite:
        raise TrainingError(
            f"{loop.nonfinite_streak} non-finite losses in a row at epoch {epoch}, step {progress.step}: "
            f"training stopped. The last good checkpoint is {loop.last_checkpoint}. "
            "Lower the learning rate, keep clip_max_norm > 0, or check the data for degenerate boxes, "
            "then resume with -r"
        )


@torch.no_grad()
def evaluate(
    module: nn.Module,
    postprocessor: nn.Module,
    loader: Iterable,
    evaluator: Any,
    *,
    device: torch.device,
    use_amp: bool,
    amp_dtype: torch.dtype,
) -> dict[str, Any]:
    """COCO metrics of `module` (the EMA model when there is one) over `loader`."""
    was_training = module.training
    module.eval()
    for images, targets in loader:
        exit_if_terminated()
        with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
            outputs = module(images.to(device))
        sizes = torch.stack([t["orig_size"] for t in targets]).to(device)
        results = postprocessor(to_float32(outputs), sizes)
        evaluator.update([int(t["image_id"]) for t in targets], results)
    module.train(was_training)
    return evaluator.summarize()


def to_float32(value: Any) -> Any:
    """Criterion inputs in fp32 whatever autocast produced (the loss runs outside autocast)."""
    if torch.is_tensor(value):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: to_float32(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_float32(v) for v in value)
    return value


def freeze_batchnorm(model: nn.Module) -> int:
    """Put every BatchNorm in eval mode (running statistics, no updates); returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()
            count += 1
    return count


def _to_device(targets: list[dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    return [
        {k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in t.items()}
        for t in targets
    ]
