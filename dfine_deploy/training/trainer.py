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

`train_one_epoch` and `evaluate` live in `steps.py`.
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
    build_data,
    build_model,
    effective_settings,
    jsonable,
    load_train_annotations,
    micro_batch_size,
    planned_steps,
    size_to_data,
    trial_step,
    tune_from,
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
from dfine_deploy.training.monitor import ResourceMonitor, auto_batch_plan
from dfine_deploy.training.optim import LRSchedule, build_optimizer, linear_lr_scale
from dfine_deploy.training.runlock import RunLock, exit_on_sigterm
from dfine_deploy.training.runlog import EVAL_NAME, TRAINING_RUN, EpochRecord, RunLog
from dfine_deploy.training.settings import RunSettings
from dfine_deploy.training.smoke import SMOKE_NAME, default_smoke_skip, run_smoke, smoke_test
from dfine_deploy.training.steps import Loop, evaluate, optimizer_steps, train_one_epoch


# ------------------------------------------------------------------------------------------- the run
@exit_on_sigterm()
def run(options: RunSettings) -> EpochRecord | dict[str, Any]:
    """Everything `train/main.py` and `dfine-train` do, for one process of the job: the last epoch's
    record (training) or the metrics (--test-only)."""
    from dfine_deploy.config import load_config
    from dfine_deploy.model.dfine import to_device
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
    check_options(options)
    info = dist_utils.init_distributed(options.device)
    lock = None
    try:
        cfg = load_config(options.config, options.updates)
        train = cfg.train
        device = info.device
        output_dir = Path(options.output_dir or train.output_dir)
        if info.is_main:  # before anything is written there
            where = "--output-dir" if options.output_dir else f"output_dir of {options.config}"
            claim_folder(output_dir, TRAINING_RUN, option=where, replaces=False, error=TrainingError)
            summary_dir = options.summary_dir or train.summary_dir
            if summary_dir:  # opened after the smoke test: a place that takes no files is refused now
                flag = "--summary-dir" if options.summary_dir else f"summary_dir of {options.config}"
                check_writable_place(Path(summary_dir), f"{flag} {summary_dir}", TrainingError)
        log = RunLog(
            active=info.is_main, output_dir=output_dir, print_freq=train.print_freq, progress=options.progress
        )
        lock = own_output_dir(output_dir, info, log)
        use_amp = train.use_amp if options.use_amp is None else bool(options.use_amp)
        amp_dtype = torch.float16 if device.type == "cuda" else torch.bfloat16
        seed = options.seed if options.seed is not None else (train.seed if train.seed is not None else 0)

        dist_utils.seed_everything(seed, 0)  # one initialisation on every rank (EMA copies it)
        model = to_device(build_model(cfg), device)  # channels-last on the CPU
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
        annotations = load_train_annotations(cfg)
        sizing = "off (--no-sizing)"
        if options.sizing and not options.test_only:
            cfg, sizing = size_to_data(
                cfg, annotations, global_batch=global_batch, finetuning=bool(options.tuning), model=model
            )
            train = cfg.train
        data = build_data(cfg, micro_batch * info.world_size, seed, info, annotations)
        for line in data.lines:
            log.log(line)
        for split, report in data.reports.items():
            log.log(f"data {split}: {report.summary_line()}")
        class_heads = tune_from(model, options, data.class_map, log) if options.tuning else None

        def validate(module: torch.nn.Module, class_map: Any = None) -> dict[str, Any]:
            """COCO metrics on the validation split (rank 0; the other ranks wait in a barrier), the
            labels read by `class_map` when given (the checkpoint's names), else by the train split's."""
            with dist_utils.rank0_takes_all_cores(info):
                evaluator = data.evaluator(class_map)
                return evaluate(
                    module,
                    postprocessor,
                    data.val_loader,
                    evaluator,
                    device=device,
                    use_amp=use_amp,
                    amp_dtype=amp_dtype,
                )

        if options.test_only:
            class_map = None
            if options.resume:  # weights only (EMA when present), as official `--test-only -r`
                report, names = load_finetune_weights(model, options.resume)
                log.log(f"evaluating: {report.summary()}")
                class_map = checkpoint_class_map(options.resume, report, names, data, log)
            metrics = {}
            if info.is_main:
                metrics = validate(model, class_map)
                output_dir.mkdir(parents=True, exist_ok=True)
                payload = {**metrics, "data": data.counts()}
                (output_dir / EVAL_NAME).write_text(json.dumps(payload, indent=2, default=float))
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
        steps_per_epoch = optimizer_steps(len(data.train_loader), accumulate)
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
                source=resume,
                auto=not options.resume,
            )
        if resume is not None and not options.resume and progress.start_epoch >= train.epochs:
            # a restart after the last checkpoint (torchrun --max-restarts, or the same command
            # typed again): the run is complete, which is no failure; nothing is written
            log.log(
                f"auto-resume: {resume} has finished all {train.epochs} epochs of its run; nothing is "
                "left to train (-u epochs=N trains on, another --output-dir starts a new run)"
            )
            return progress.history[-1] if progress.history else {}
        total_steps = planned_steps(
            images=len(data.train_loader.dataset),
            batches=len(data.train_loader),
            micro_batch=micro_batch,
            world_size=info.world_size,
            accumulate=accumulate,
            drop_last=cfg.train_data.drop_last,
            epochs=train.epochs,
            start_epoch=progress.start_epoch,
            base_lrs=loop.base_lrs,
            resumed=resume,
        )
        if resume is not None:
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
            total_steps=total_steps,
            sizing=sizing,
        )
        config = jsonable(cfg.raw)
        log.start(described, [r.line() for r in group_reports], config)
        log.log(
            f"  model: dfine-{cfg.model_spec.size or 'custom'}, {cfg.model_spec.num_classes} classes, "
            f"input {cfg.model_spec.eval_spatial_size}"
        )
        if options.smoke == "only" or (options.smoke == "auto" and resume is None):
            smoked = smoke_before_run(cfg, options, loop, criterion, data, total_steps, output_dir)
            if options.smoke == "only":
                return smoked
        log.open_tensorboard(options.summary_dir or train.summary_dir or str(output_dir / "summary"))
        names = list(data.class_map.class_names)
        meta = build_meta(
            model_spec=cfg.model_spec,
            class_names=names,
            class_map=data.class_map,
            config=config,
            data=data.counts(),
            class_heads=class_heads,
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
                    if data.val_loader is not None and validates(epoch, train.epochs, train.eval_freq):
                        module = ema.module if ema is not None else dist_utils.unwrap(model)
                        metrics = validate(module)
                    record = {
                        "epoch": epoch,
                        "step": progress.step,
                        "time": round(time.time(), 3),
                        **record,
                        **{f"val_{k}": v for k, v in metrics.items() if not isinstance(v, (dict, list))},
                        "data": data.counts(),
                    }
                    progress.history.append(record)
                    if alarm_due(progress.history, train.epochs, options.alarm_after):
                        findings = diagnose(
                            data.train_loader.dataset,
                            cfg.train_data.dataset_type,
                            cfg.model_spec.num_classes,
                            optimizer,
                            dist_utils.unwrap(model),
                            loop.base_lrs,
                        )
                        alarm = alarm_record(progress.history, train.epochs, findings, data.class_map)
                        record["alarm"] = alarm
                        log.alarm(alarm["text"])
                    if all(torch.isfinite(p).all() for p in dist_utils.unwrap(model).parameters()):
                        ap = float(metrics.get("AP", 0.0))
                        # ">=": best.pth exists after the first validated epoch at mAP 0; an epoch
                        # that was not validated (eval_freq) cannot be the best
                        is_best = ap >= progress.best_ap and (bool(metrics) or data.val_loader is None)
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
        if lock is not None:
            lock.release()
        dist_utils.cleanup(info)


def check_options(options: RunSettings) -> None:
    """The command-line numbers that have a range (the config's are checked when it loads), and the
    options that mean something only beside another."""
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
    fix = "evaluate it on a dataset of its classes, or rename the categories"
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


def smoke_before_run(
    cfg: Any,
    options: RunSettings,
    loop: Loop,
    criterion: torch.nn.Module,
    data: Any,
    total_steps: int,
    output_dir: Path,
) -> dict[str, Any]:
    """The smoke test (`smoke.py`) before the first epoch, or the line saying why it is skipped;
    rank 0 keeps its figures in smoke.json. Raises TrainingError on every rank when it fails."""
    skipped = default_smoke_skip(total_steps) if options.smoke == "auto" else None
    if skipped:
        loop.log.log(skipped)
        return {}
    result = run_smoke(
        loop.info,
        loop.log,
        lambda: smoke_test(
            model=loop.model,
            criterion=criterion,
            optimizer=loop.optimizer,
            dataset=data.train_loader.dataset,
            dataset_type=cfg.train_data.dataset_type,
            num_classes=cfg.model_spec.num_classes,
            side=tuple(cfg.model_spec.eval_spatial_size),
            device=loop.info.device,
            clip_max_norm=cfg.train.clip_max_norm,
            freeze_bn=options.freeze_bn,
        ),
        data.class_map,
        output_dir / SMOKE_NAME,
    )
    return result.to_dict()


def validates(epoch: int, epochs: int, eval_freq: int) -> bool:
    """Whether epoch `epoch` (0-based) of `epochs` ends with a validation: every `eval_freq`-th
    epoch and always the last, whose weights are the run's result."""
    return epoch == epochs - 1 or (eval_freq > 0 and (epoch + 1) % eval_freq == 0)


def _epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch * 7919
