"""The training loop in the torchvision `references/detection` shape: `run` builds everything in one
linear function, then calls `train_one_epoch` and `end_epoch` once per epoch.

    run(options)              join the job, load the config, build (a `Job`, then `build_loop`),
                              evaluate only (`evaluate_only`) or resume (`resume_state`); per epoch:
      train_one_epoch(...)    per optimizer step: `accumulate` micro-batches of forward (autocast) ->
                              criterion (fp32) -> backward, then clip -> step -> EMA
      end_epoch(...)          rank 0: COCO metrics of the EMA weights, the AP alarm, then
                              last/best/checkpointNNNN.pth, log.jsonl, TensorBoard, console

Determinism: the data order comes from DistributedSampler(seed, epoch), and every epoch starts from
RNG states derived from (seed, epoch, rank). A run restarted from `last.pth` therefore replays the
following epochs exactly as an uninterrupted run would (same threads, same device).

`train_one_epoch` and `evaluate` live in `steps.py`; what `run` builds before the loop, in `build.py`.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from dfine_deploy.errors import TrainingError
from dfine_deploy.ownership import check_writable_place, claim_folder
from dfine_deploy.training import distributed as dist_utils
from dfine_deploy.training.build import (
    Job,
    build_job,
    effective_settings,
    jsonable,
    planned_steps,
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
from dfine_deploy.training.diagnosis import alarm_due, alarm_record, diagnose
from dfine_deploy.training.ema import ModelEMA
from dfine_deploy.training.monitor import ResourceMonitor
from dfine_deploy.training.optim import LRSchedule, build_optimizer, linear_lr_scale
from dfine_deploy.training.runlock import RunLock, exit_on_sigterm
from dfine_deploy.training.runlog import EVAL_NAME, TRAINING_RUN, EpochRecord, RunLog
from dfine_deploy.training.settings import RunSettings
from dfine_deploy.training.smoke import SMOKE_NAME, default_smoke_skip, run_smoke, smoke_test
from dfine_deploy.training.steps import Loop, optimizer_steps, train_one_epoch


# ------------------------------------------------------------------------------------------- the run
@exit_on_sigterm()
def run(options: RunSettings) -> EpochRecord | dict[str, Any]:
    """Everything `train/main.py` and `dfine-train` do, for one process of the job: the last epoch's
    record (training) or the metrics (--test-only)."""
    from dfine_deploy.config import load_config

    check_options(options)
    info = dist_utils.init_distributed(options.device)
    lock = None
    try:
        cfg = load_config(options.config, options.updates)
        output_dir = claim_output_dir(options, cfg, info)
        log = RunLog(
            active=info.is_main,
            output_dir=output_dir,
            print_freq=cfg.train.print_freq,
            progress=options.progress,
        )
        lock = own_output_dir(output_dir, info, log)
        job = build_job(options, info, cfg, output_dir, log)  # the model, its batch plan, the data
        if options.test_only:
            return evaluate_only(job)

        cfg, data, train = job.cfg, job.data, job.cfg.train
        loop, lr_scale, sync_bn, group_reports = build_loop(job)
        progress, resume = resume_state(job, loop)
        if resume is not None and not options.resume and progress.start_epoch >= train.epochs:
            # a restart after the last checkpoint (torchrun --max-restarts, or the same command
            # typed again): the run is complete, which is no failure; nothing is trained. A kill
            # between the last checkpoint and its log line left log.jsonl an epoch short: it is
            # written again from the checkpoint, and said
            log.log(
                f"auto-resume: {resume} has finished all {train.epochs} epochs of its run; nothing is "
                "left to train (-u epochs=N trains on, another --output-dir starts a new run)"
            )
            if log.rewrite_history(progress.history):
                log.log(
                    f"auto-resume: log.jsonl did not hold the checkpoint's {len(progress.history)} epoch "
                    "records (stopped between saving it and logging); written again from it"
                )
            return progress.history[-1] if progress.history else {}
        total_steps = steps_to_take(job, loop, progress, resume)
        if resume is not None:
            log.rewrite_history(progress.history)
            log.log(f"resumed from {resume}: epoch {progress.start_epoch}, step {progress.step}")
        described = effective_settings(job, loop, lr_scale=lr_scale, sync_bn=sync_bn, total_steps=total_steps)
        config = jsonable(cfg.raw)
        log.start(described, [r.line() for r in group_reports], config)
        spec = cfg.model_spec
        log.log(
            f"  model: dfine-{spec.size or 'custom'}, {spec.num_classes} classes, "
            f"input {spec.eval_spatial_size}"
        )
        if options.smoke == "only" or (options.smoke == "auto" and resume is None):
            smoked = smoke_before_run(job, loop, total_steps)
            if options.smoke == "only":
                return smoked
        log.open_tensorboard(options.summary_dir or train.summary_dir or str(output_dir / "summary"))
        meta = build_meta(
            model_spec=spec,
            class_names=list(data.class_map.class_names),
            class_map=data.class_map,
            config=config,
            data=data.counts(),
            class_heads=job.class_heads,
        )
        try:
            for epoch in range(progress.start_epoch, train.epochs):
                start_epoch(job, loop, epoch)
                record = train_one_epoch(loop, data.train_loader, epoch, progress)
                if info.is_main:
                    end_epoch(job, loop, progress, epoch, record, meta)
                dist_utils.barrier(info)
        finally:
            log.close(progress.history)
        return progress.history[-1] if progress.history else {}
    finally:
        if lock is not None:
            lock.release()
        dist_utils.cleanup(info)


def check_options(options: RunSettings) -> None:
    """The options that exclude or need each other, and the command-line numbers that have a range
    (the config's are checked when it loads)."""
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
    if options.head_map and not options.tuning:
        raise TrainingError(
            f"--head-map {options.head_map}: it maps the classes of a -t checkpoint, and no -t was given; "
            "add -t CHECKPOINT or leave --head-map out"
        )
    if not 0 <= options.alarm_after <= 1:
        raise TrainingError(
            f"--ap-alarm-after {options.alarm_after}: give the share of the epochs, 0..1 (0 turns it off)"
        )
    for flag, value in (
        ("--accumulate", options.accumulate),
        ("--lr-reference-batch", options.lr_reference_batch),
        ("--max-nonfinite", options.max_nonfinite),
    ):
        if value is not None and value < 1:
            raise TrainingError(f"{flag} {value}: give a whole number >= 1")


def claim_output_dir(options: RunSettings, cfg: Any, info: dist_utils.DistInfo) -> Path:
    """The output folder, which rank 0 claims before anything is written there; a summary folder
    (opened after the smoke test) that takes no files is refused now."""
    output_dir = Path(options.output_dir or cfg.train.output_dir)
    if info.is_main:
        where = "--output-dir" if options.output_dir else f"output_dir of {options.config}"
        claim_folder(output_dir, TRAINING_RUN, option=where, replaces=False, error=TrainingError)
        summary_dir = options.summary_dir or cfg.train.summary_dir
        if summary_dir:
            flag = "--summary-dir" if options.summary_dir else f"summary_dir of {options.config}"
            check_writable_place(Path(summary_dir), f"{flag} {summary_dir}", TrainingError)
    return output_dir


def checkpoint_class_map(path: Any, report: Any, names: list[str] | None, data: Any, log: RunLog) -> Any:
    """`--test-only -r`: the val split's categories on the checkpoint's labels, by the checkpoint's class
    names (None: they are the train split's, by which the val split is read already). Class heads left
    at their fresh initialisation are refused: their AP would be reported as the checkpoint's."""
    if report.reinitialised:
        raise TrainingError(
            f"--test-only -r {path}: its class heads do not fit this config ({report.checkpoint_classes} "
            f"classes in the file, {report.model_classes} in the config), so they would be scored freshly "
            "initialised; evaluate it with the config it was trained with (num_classes and the dataset)"
        )
    if not names or data.val_loader is None or names == list(data.class_map.class_names):
        return None
    from dfine_deploy.data.classmap import meet_by_name

    dataset = data.val_loader.dataset
    fix = (
        "evaluate it on a dataset of its classes, or map the categories with --class-map FILE "
        "({category: class})"
    )
    class_map, lines = meet_by_name(
        dataset.annotations.categories, names, f"{path} on {dataset.annotations.source}", fix
    )
    for line in lines:
        log.log(line)
    return class_map


def own_output_dir(output_dir: Path, info: dist_utils.DistInfo, log: RunLog) -> RunLock | None:
    """Rank 0 takes the output folder's lock (the other ranks never write there, so they do not
    compete for it); every rank learns whether it did, so that a refusal stops them all at once."""
    lock, failure = None, None
    if info.is_main:
        lock = RunLock(output_dir)
        try:
            lock.acquire(note=log.log)
        except TrainingError as exc:
            lock, failure = None, str(exc)
    failure = dist_utils.broadcast_object(info, failure)
    if failure:
        raise TrainingError(failure)
    return lock


def evaluate_only(job: Job) -> dict[str, Any]:
    """--test-only: the checkpoint's weights (EMA when present, as official `--test-only -r`)
    evaluated on rank 0, the metrics and data counts written to eval.json."""
    options, log = job.options, job.log
    class_map = None
    if options.resume:
        report, names = load_finetune_weights(job.model, options.resume)
        log.log(f"evaluating: {report.summary()}")
        class_map = checkpoint_class_map(options.resume, report, names, job.data, log)
    metrics = {}
    if job.info.is_main:
        metrics = job.validate(job.model, class_map)
        job.output_dir.mkdir(parents=True, exist_ok=True)
        payload = {**metrics, "data": job.data.counts()}
        (job.output_dir / EVAL_NAME).write_text(json.dumps(payload, indent=2, default=float))
        log.log(
            f"evaluation: AP {metrics.get('AP', float('nan')):.4f}, "
            f"AP50 {metrics.get('AP50', float('nan')):.4f}"
        )
    dist_utils.barrier(job.info)
    return metrics


def build_loop(job: Job) -> tuple[Loop, float, bool, list[Any]]:
    """What every training step uses: EMA, the DDP wrap, the resource monitor, the optimizer (its lr
    scaled to the global batch), the schedule and the CUDA AMP scaler. Returns the loop, the lr
    scale, whether BatchNorm was synchronised and the optimizer groups' reports."""
    train, info, options = job.cfg.train, job.info, job.options
    ema = (
        ModelEMA(job.model, decay=train.ema.decay, warmups=train.ema.warmups, start=train.ema.start)
        if train.use_ema
        else None
    )
    model, sync_bn = dist_utils.wrap_model(
        job.model, info, sync_bn=train.sync_bn, find_unused_parameters=train.find_unused_parameters
    )
    monitor = ResourceMonitor(info.device)
    if info.distributed:
        model.register_comm_hook(None, monitor.ddp_comm_hook(info))
    lr_scale = linear_lr_scale(job.global_batch, options.lr_reference_batch)
    opt = train.optimizer
    optimizer, group_reports = build_optimizer(
        dist_utils.unwrap(model),
        lr=opt.lr,
        weight_decay=opt.weight_decay,
        betas=opt.betas,
        group_specs=opt.params,
        lr_scale=lr_scale,
    )
    steps_per_epoch = optimizer_steps(len(job.data.train_loader), job.accumulate)
    loop = Loop(
        model=model,
        criterion=job.criterion,
        optimizer=optimizer,
        base_lrs=[g["lr"] for g in optimizer.param_groups],
        schedule=LRSchedule.from_settings(train, steps_per_epoch),
        scaler=torch.amp.GradScaler("cuda") if (job.use_amp and info.device.type == "cuda") else None,
        ema=ema,
        info=info,
        use_amp=job.use_amp,
        amp_dtype=job.amp_dtype,
        clip_max_norm=train.clip_max_norm,
        accumulate=job.accumulate,
        micro_batch=job.micro_batch,
        freeze_bn=options.freeze_bn,
        max_nonfinite=options.max_nonfinite,
        monitor=monitor,
        log=job.log,
        last_checkpoint=job.output_dir / LAST_NAME,
    )
    return loop, lr_scale, sync_bn, group_reports


def resume_state(job: Job, loop: Loop) -> tuple[Progress, Path | None]:
    """The progress to continue from and the checkpoint it came from: -r, else the output folder's
    own last checkpoint (auto-resume, e.g. under torchrun --max-restarts), else a fresh start."""
    resume = job.options.resume or find_auto_resume(job.output_dir)
    if resume is None:
        return Progress(), None
    if not job.options.resume:
        job.log.log(f"auto-resume: found {resume}")
    progress = restore_training_state(
        load_training_checkpoint(resume),
        model=dist_utils.unwrap(loop.model),
        ema=loop.ema,
        optimizer=loop.optimizer,
        scaler=loop.scaler,
        source=resume,
        auto=not job.options.resume,
    )
    return progress, resume


def steps_to_take(job: Job, loop: Loop, progress: Progress, resume: Path | None) -> int:
    """The optimizer steps from the start epoch to the end (`planned_steps`: a run that would take
    none is refused before it starts)."""
    loader = job.data.train_loader
    return planned_steps(
        images=len(loader.dataset),
        batches=len(loader),
        micro_batch=loop.micro_batch,
        world_size=job.info.world_size,
        accumulate=loop.accumulate,
        drop_last=job.cfg.train_data.drop_last,
        epochs=job.cfg.train.epochs,
        start_epoch=progress.start_epoch,
        base_lrs=loop.base_lrs,
        resumed=resume,
    )


def start_epoch(job: Job, loop: Loop, epoch: int) -> None:
    """Every rank before `epoch`: the RNG states of (seed, epoch, rank), the data order and
    augmentation policy of the epoch, and at `stop_epoch` (0: no strong phase) the EMA's restart
    decay."""
    train = job.cfg.train
    dist_utils.seed_everything(_epoch_seed(job.seed, epoch), job.info.rank)
    job.data.train_loader.set_epoch(epoch)  # sampler order, augmentation policy, collator, worker seeds
    if train.stop_epoch and epoch == train.stop_epoch and loop.ema is not None:
        loop.ema.decay = train.ema_restart_decay
        job.log.log(f"epoch {epoch}: strong augmentation off; EMA decay now {loop.ema.decay} (applied)")


def end_epoch(
    job: Job,
    loop: Loop,
    progress: Progress,
    epoch: int,
    record: EpochRecord,
    meta: dict[str, Any],
) -> None:
    """Rank 0 after `epoch`: validation when due, the epoch's record (with the AP alarm when due),
    last/best/checkpointNNNN.pth when the weights are finite, and the logs."""
    train, data, log = job.cfg.train, job.data, job.log
    model = dist_utils.unwrap(loop.model)
    metrics = {}
    if data.val_loader is not None and validates(epoch, train.epochs, train.eval_freq):
        metrics = job.validate(loop.ema.module if loop.ema is not None else model)
    record = {
        "epoch": epoch,
        "step": progress.step,
        "time": round(time.time(), 3),
        **record,
        **{f"val_{k}": v for k, v in metrics.items() if not isinstance(v, (dict, list))},
        "data": data.counts(),
    }
    progress.history.append(record)
    if alarm_due(progress.history, train.epochs, job.options.alarm_after):
        findings = diagnose(
            data.train_loader.dataset,
            job.cfg.train_data.dataset_type,
            job.cfg.model_spec.num_classes,
            loop.optimizer,
            model,
            loop.base_lrs,
        )
        alarm = alarm_record(progress.history, train.epochs, findings, data.class_map)
        record["alarm"] = alarm
        log.alarm(alarm["text"])
    save_checkpoints(job, loop, progress, epoch, metrics, meta)
    log.epoch(record)


def save_checkpoints(
    job: Job, loop: Loop, progress: Progress, epoch: int, metrics: dict[str, Any], meta: dict[str, Any]
) -> None:
    """Rank 0 after `epoch`: last.pth, and best.pth or checkpointNNNN.pth when due, if the weights
    are finite; otherwise the line saying that last.pth keeps the last good state."""
    model = dist_utils.unwrap(loop.model)
    if all(torch.isfinite(p).all() for p in model.parameters()):
        ap = float(metrics.get("AP", 0.0))
        # ">=": best.pth exists after the first validated epoch at mAP 0; an epoch
        # that was not validated (eval_freq) cannot be the best
        is_best = ap >= progress.best_ap and (bool(metrics) or job.data.val_loader is None)
        progress.best_ap = max(progress.best_ap, ap)
        state = training_state(
            model=model,
            ema=loop.ema,
            optimizer=loop.optimizer,
            scaler=loop.scaler,
            epoch=epoch,
            progress=progress,
            schedule=loop.schedule,
            meta=meta,
        )
        save_epoch_checkpoints(
            job.output_dir, state, epoch=epoch, is_best=is_best, checkpoint_freq=job.cfg.train.checkpoint_freq
        )
    else:
        job.log.log(
            f"epoch {epoch}: the weights are not finite; no checkpoint written "
            f"({job.output_dir / LAST_NAME} keeps the last good state)"
        )


def smoke_before_run(job: Job, loop: Loop, total_steps: int) -> dict[str, Any]:
    """The smoke test (`smoke.py`) before the first epoch, or the line saying why it is skipped;
    rank 0 keeps its figures in smoke.json. Raises TrainingError on every rank when it fails."""
    cfg, options = job.cfg, job.options
    skipped = default_smoke_skip(total_steps) if options.smoke == "auto" else None
    if skipped:
        loop.log.log(skipped)
        return {}
    result = run_smoke(
        loop.info,
        loop.log,
        lambda: smoke_test(
            model=loop.model,
            criterion=job.criterion,
            optimizer=loop.optimizer,
            dataset=job.data.train_loader.dataset,
            dataset_type=cfg.train_data.dataset_type,
            num_classes=cfg.model_spec.num_classes,
            side=tuple(cfg.model_spec.eval_spatial_size),
            device=loop.info.device,
            clip_max_norm=cfg.train.clip_max_norm,
            freeze_bn=options.freeze_bn,
        ),
        job.data.class_map,
        job.output_dir / SMOKE_NAME,
    )
    return result.to_dict()


def validates(epoch: int, epochs: int, eval_freq: int) -> bool:
    """Whether epoch `epoch` (0-based) of `epochs` ends with a validation: every `eval_freq`-th
    epoch and always the last, whose weights are the run's result."""
    return epoch == epochs - 1 or (eval_freq > 0 and (epoch + 1) % eval_freq == 0)


def _epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch * 7919
