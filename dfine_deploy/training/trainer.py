"""The training loop in the torchvision `references/detection` shape: `run` builds everything in one
linear function, then calls `train_one_epoch` and `evaluate` once per epoch.

    run(options)              join the job, load the config, build, resume, then per epoch:
      train_one_epoch(...)    per optimizer step: `accumulate` micro-batches of forward (autocast) ->
                              criterion (fp32) -> backward, then clip -> step -> EMA
      evaluate(...)           COCO metrics of the EMA weights (rank 0)
      checkpoint + RunLog     last/best/checkpointNNNN.pth, log.jsonl, TensorBoard, console

Determinism: the data order comes from DistributedSampler(seed, epoch), and every epoch starts from
RNG states derived from (seed, epoch, rank). A run restarted from `last.pth` therefore replays the
following epochs exactly as an uninterrupted run would (same threads, same device).

Host syncs (marked `# host sync`): one stacked loss reduction per micro-batch (it also tells every
rank whether the loss is finite) and the gradient-norm check per optimizer step.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dfine_deploy.errors import TrainingError
from dfine_deploy.training import distributed as dist_utils
from dfine_deploy.training.build import (
    build_data,
    build_model,
    effective_settings,
    jsonable,
    micro_batch_size,
    to_float32,
    trial_step,
)
from dfine_deploy.training.checkpoint import (
    LAST_NAME,
    Progress,
    build_meta,
    find_auto_resume,
    load_finetune_weights,
    load_training_checkpoint,
    restore_training_state,
    save_epoch_checkpoints,
    training_state,
)
from dfine_deploy.training.ema import ModelEMA
from dfine_deploy.training.monitor import ResourceMonitor, auto_batch_plan
from dfine_deploy.training.optim import LRSchedule, build_optimizer, linear_lr_scale, set_lr
from dfine_deploy.training.runlog import EpochRecord, RunLog


@dataclass
class RunSettings:
    """What the command line decides; everything else comes from the config."""

    config: str
    resume: str | None = None  # -r: full state
    tuning: str | None = None  # -t: weights only, class heads remapped
    use_amp: bool | None = None  # None: the config's use_amp
    seed: int | None = None
    updates: list[str] = field(default_factory=list)
    test_only: bool = False
    output_dir: str | None = None
    summary_dir: str | None = None
    auto_batch: bool = False
    accumulate: int | None = None  # micro-batches per optimizer step; None: the config's `accumulate`
    device: str | None = None
    freeze_bn: bool = False  # BatchNorm uses running statistics (tiny per-rank batches)
    lr_reference_batch: int | None = None  # linear LR scaling: lr was tuned for this global batch
    max_nonfinite: int = 5  # consecutive skipped steps before the run stops
    obj365_remap: bool = True  # -t: remap class heads through OBJ365_IDS (or config obj365_ids)
    progress: bool = True


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


# ------------------------------------------------------------------------------------------ the loop
def train_one_epoch(loop: Loop, loader: Iterable, epoch: int, progress: Progress) -> EpochRecord:
    """One pass over `loader`; advances `progress.step` and `progress.nonfinite_total`."""
    model, info = loop.model, loop.info
    model.train()
    loop.criterion.train()
    if loop.freeze_bn:
        freeze_batchnorm(model)
    steps = -(-len(loader) // loop.accumulate)  # optimizer steps this epoch (the last may be shorter)
    loop.monitor.start_epoch()
    loop.log.start_epoch(epoch, loop.schedule.epochs, steps)
    sums: dict[str, float] = {}
    step_losses: list[float] = []
    images = 0
    lr = 0.0
    started = time.perf_counter()
    for index, group in enumerate(accumulation_groups(loader, loop.accumulate)):
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
    and skips overflowing steps itself (normal while it calibrates)."""
    params = [p for p in loop.model.parameters() if p.requires_grad]
    max_norm = loop.clip_max_norm if loop.clip_max_norm and loop.clip_max_norm > 0 else float("inf")
    if loop.scaler is not None:
        loop.scaler.unscale_(loop.optimizer)
        nn.utils.clip_grad_norm_(params, max_norm)
        loop.scaler.step(loop.optimizer)  # host sync inside (GradScaler's inf check)
        loop.scaler.update()
        return True
    norm = nn.utils.clip_grad_norm_(params, max_norm)
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
        with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
            outputs = module(images.to(device))
        sizes = torch.stack([t["orig_size"] for t in targets]).to(device)
        results = postprocessor(to_float32(outputs), sizes)
        evaluator.update([int(t["image_id"]) for t in targets], results)
    module.train(was_training)
    return evaluator.summarize()


# ------------------------------------------------------------------------------------------- the run
def run(options: RunSettings) -> EpochRecord | dict[str, Any]:
    """Everything `train/main.py` and `dfine-train` do, for one process of the job: the last epoch's
    record (training) or the metrics (--test-only)."""
    from dfine_deploy.config import load_config
    from dfine_deploy.model.postprocess import PostProcessor
    from dfine_deploy.training.criterion import build_criterion

    if options.resume and options.tuning:
        raise TrainingError(
            "-r (resume) and -t (fine-tune) exclude each other: -r continues a run, "
            "-t starts a new one from weights; give only one"
        )
    if options.test_only and not (options.resume or options.tuning):
        raise TrainingError(
            "--test-only evaluates the weights of a checkpoint, and none was given: "
            "add -r CHECKPOINT (e.g. --test-only -r runs/n/best.pth)"
        )
    info = dist_utils.init_distributed(options.device)
    try:
        cfg = load_config(options.config, options.updates)
        train = cfg.train
        device = info.device
        output_dir = Path(options.output_dir or train.output_dir)
        log = RunLog(
            active=info.is_main, output_dir=output_dir, print_freq=train.print_freq, progress=options.progress
        )
        use_amp = train.use_amp if options.use_amp is None else bool(options.use_amp)
        amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        seed = options.seed if options.seed is not None else (train.seed if train.seed is not None else 0)

        dist_utils.seed_everything(seed, 0)  # one initialisation on every rank (EMA copies it)
        model = build_model(cfg, options, log).to(device)
        criterion = build_criterion(cfg.model_spec, settings=train.criterion).to(device)
        postprocessor = PostProcessor(
            cfg.model_spec.num_classes, num_top_queries=cfg.model_spec.num_top_queries
        ).to(device)
        accumulate = options.accumulate if options.accumulate is not None else train.accumulate
        global_batch = cfg.train_data.total_batch_size
        if options.auto_batch:
            accumulate, global_batch = auto_batch_plan(
                lambda b: trial_step(
                    model, criterion, cfg.model_spec.eval_spatial_size, b, device, use_amp, amp_dtype
                ),
                model,
                info,
                global_batch,
                accumulate,
                log,
            )
        micro_batch = micro_batch_size(global_batch, info.world_size, accumulate)
        data = build_data(cfg, micro_batch * info.world_size, seed, info)
        for split, report in data.reports.items():
            log.log(f"data {split}: {report.summary_line()}")
        if options.test_only:
            if options.resume:  # weights only (EMA when present), as official `--test-only -r`
                report, _ = load_finetune_weights(model, options.resume, None)
                log.log(f"evaluating: {report.summary()}")
            metrics = {}
            if info.is_main:
                metrics = evaluate(
                    model,
                    postprocessor,
                    data.val_loader,
                    data.evaluator(),
                    device=device,
                    use_amp=use_amp,
                    amp_dtype=amp_dtype,
                )
                output_dir.mkdir(parents=True, exist_ok=True)
                payload = {**metrics, "data": data.counts()}
                (output_dir / "eval.json").write_text(json.dumps(payload, indent=2, default=float))
                log.log(
                    f"evaluation: AP {metrics.get('AP', float('nan')):.4f}, "
                    f"AP50 {metrics.get('AP50', float('nan')):.4f}"
                )
            dist_utils.barrier(info)
            return metrics

        ema = (
            ModelEMA(model, decay=train.ema.decay, warmups=train.ema.warmups, start=train.ema.start)
            if train.use_ema
            else None
        )
        model, sync_bn = dist_utils.wrap_model(
            model, info, sync_bn=train.sync_bn, find_unused_parameters=train.find_unused_parameters
        )
        monitor = ResourceMonitor(device)
        if info.distributed:
            model.register_comm_hook(None, monitor.ddp_comm_hook())
        lr_scale = linear_lr_scale(global_batch, options.lr_reference_batch)
        opt = train.optimizer
        optimizer, group_reports = build_optimizer(
            dist_utils.unwrap(model),
            lr=opt.lr,
            weight_decay=opt.weight_decay,
            betas=opt.betas,
            group_specs=opt.params,
            lr_scale=lr_scale,
        )
        steps_per_epoch = -(-len(data.train_loader) // accumulate)
        schedule = LRSchedule.from_settings(train, steps_per_epoch)
        scaler = torch.amp.GradScaler("cuda") if (use_amp and device.type == "cuda") else None
        loop = Loop(
            model=model,
            criterion=criterion,
            optimizer=optimizer,
            base_lrs=[g["lr"] for g in optimizer.param_groups],
            schedule=schedule,
            scaler=scaler,
            ema=ema,
            info=info,
            use_amp=use_amp,
            amp_dtype=amp_dtype,
            clip_max_norm=train.clip_max_norm,
            accumulate=accumulate,
            micro_batch=micro_batch,
            freeze_bn=options.freeze_bn,
            max_nonfinite=options.max_nonfinite,
            monitor=monitor,
            log=log,
            last_checkpoint=output_dir / LAST_NAME,
        )

        progress = Progress()
        resume = options.resume or find_auto_resume(output_dir)
        if resume is not None:
            if not options.resume:
                log.log(f"auto-resume: found {resume}")
            progress = restore_training_state(
                load_training_checkpoint(resume),
                model=dist_utils.unwrap(model),
                ema=ema,
                optimizer=optimizer,
                scaler=scaler,
            )
            log.rewrite_history(progress.history)
            log.log(f"resumed from {resume}: epoch {progress.start_epoch}, step {progress.step}")

        described = effective_settings(
            cfg,
            options,
            loop,
            output_dir=output_dir,
            global_batch=global_batch,
            seed=seed,
            lr_scale=lr_scale,
            sync_bn=sync_bn,
        )
        config = jsonable(cfg.raw)
        log.start(described, [r.line() for r in group_reports], config)
        log.log(
            f"  model: dfine-{cfg.model_spec.size or 'custom'}, {cfg.model_spec.num_classes} classes, "
            f"input {cfg.model_spec.eval_spatial_size}"
        )
        log.open_tensorboard(options.summary_dir or train.summary_dir or str(output_dir / "summary"))
        names = list(data.class_map.class_names)
        meta = build_meta(
            model_spec=cfg.model_spec,
            class_names=names,
            class_map=data.class_map,
            config=config,
            data=data.counts(),
        )
        try:
            for epoch in range(progress.start_epoch, train.epochs):
                dist_utils.seed_everything(_epoch_seed(seed, epoch), info.rank)
                data.train_loader.set_epoch(
                    epoch
                )  # sampler order, augmentation policy, collator, worker seeds
                if train.stop_epoch and epoch == train.stop_epoch and ema is not None:  # 0: no strong phase
                    ema.decay = train.ema_restart_decay
                    log.log(f"epoch {epoch}: strong augmentation off; EMA decay now {ema.decay} (applied)")
                record = train_one_epoch(loop, data.train_loader, epoch, progress)
                if info.is_main:
                    metrics = {}
                    if data.val_loader is not None:
                        module = ema.module if ema is not None else dist_utils.unwrap(model)
                        metrics = evaluate(
                            module,
                            postprocessor,
                            data.val_loader,
                            data.evaluator(),
                            device=device,
                            use_amp=use_amp,
                            amp_dtype=amp_dtype,
                        )
                    record = {
                        "epoch": epoch,
                        "step": progress.step,
                        "time": round(time.time(), 3),
                        **record,
                        **{f"val_{k}": v for k, v in metrics.items() if not isinstance(v, (dict, list))},
                        "data": data.counts(),
                    }
                    progress.history.append(record)
                    if all(torch.isfinite(p).all() for p in dist_utils.unwrap(model).parameters()):
                        ap = float(metrics.get("AP", 0.0))
                        is_best = (
                            ap >= progress.best_ap
                        )  # ">=": best.pth exists after the first epoch at mAP 0
                        progress.best_ap = max(progress.best_ap, ap)
                        state = training_state(
                            model=dist_utils.unwrap(model),
                            ema=ema,
                            optimizer=optimizer,
                            scaler=scaler,
                            epoch=epoch,
                            progress=progress,
                            schedule=schedule,
                            meta=meta,
                        )
                        save_epoch_checkpoints(
                            output_dir,
                            state,
                            epoch=epoch,
                            is_best=is_best,
                            checkpoint_freq=train.checkpoint_freq,
                        )
                    else:
                        log.log(
                            f"epoch {epoch}: the weights are not finite; no checkpoint written "
                            f"({output_dir / LAST_NAME} keeps the last good state)"
                        )
                    log.epoch(record)
                dist_utils.barrier(info)
        finally:
            log.close(progress.history)
        return progress.history[-1] if progress.history else {}
    finally:
        dist_utils.cleanup(info)


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


def _epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch * 7919
