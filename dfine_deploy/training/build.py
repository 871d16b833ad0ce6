"""What `run` builds before the loop: the model (then the -t weights, class heads by name), the data of
each split with its load report, the micro-batch size, the trial step `--auto-batch` measures, and the
`Job` that the steps after the set-up read."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dfine_deploy.errors import ConfigError, DatasetError, TrainingError
from dfine_deploy.training import distributed as dist_utils
from dfine_deploy.training.monitor import auto_batch_plan
from dfine_deploy.training.runlog import RunLog
from dfine_deploy.training.settings import RunSettings
from dfine_deploy.training.steps import Loop, evaluate, optimizer_steps, to_float32


def build_model(cfg: Any) -> nn.Module:
    """The config's model, freshly initialised (`tune_from` loads -t weights once the classes are known)."""
    from dfine_deploy.model.families import build_model as build_network

    return build_network(cfg.model_spec)


def tune_from(model: nn.Module, options: RunSettings, class_map: Any, log: RunLog) -> dict[str, Any]:
    """-t: the checkpoint's weights, class heads carried over by name to the dataset's classes; prints
    the mapping table and returns its record for the checkpoint's meta."""
    from dfine_deploy.training.heads import heads_table, load_tuning_weights

    classes = list(zip(class_map.labels, class_map.names))
    transfer = load_tuning_weights(
        model, options.tuning, classes, head_map=options.head_map, obj365_table=options.obj365_remap
    )
    log.log(f"fine-tuning: {transfer.report.summary()}")
    if transfer.source is not None:
        log.log(heads_table(transfer.matches, transfer.source, str(options.tuning)))
    return transfer.meta()


@dataclass
class TrainData:
    train_loader: Any  # DetectionLoader of micro-batches
    val_loader: Any  # None on ranks > 0 and without val_dataloader
    class_map: Any
    reports: dict[str, Any]  # split -> ValidationReport (what loading fixed and skipped)
    evaluator: Callable[..., Any]  # the val split's CocoEvaluator; a class map given scores by it
    lines: list[str]  # each split's layout and what reading noted (AnnotationSet.lines)

    def counts(self) -> dict[str, Any]:
        return {split: report.tally() for split, report in self.reports.items()}


def check_transforms(cfg: Any) -> None:
    """Refuse a loader whose transforms list nothing: no image would be resized or made a tensor. A
    dataset file included after the dataloader file does it (its `ops: ~` replaces the ops), and
    otherwise ends in a type error deep inside the first step."""
    for which in ("train_dataloader", "val_dataloader"):
        node = cfg.raw.get(which)
        if not isinstance(node, dict):
            continue
        settings = cfg.train_data if which == "train_dataloader" else cfg.val_data
        if not settings.transforms.ops:
            key = (which, "dataset", "transforms", "ops")
            raise ConfigError(
                f"{which}.dataset.transforms.ops is empty ({cfg.origin(key)}), so no image would be "
                "resized or made a tensor: in __include__ list the dataset file before the dataloader "
                "file that sets the ops (configs/dfine/include/dataloader.yml), as configs/dfine/custom/ do"
            )


def load_train_annotations(cfg: Any) -> Any:
    """The train split's validated annotations (what sizing reads before the datasets are built)."""
    from dfine_deploy.data.loader import load_annotations
    from dfine_deploy.data.validation import ValidationPolicy

    settings = cfg.train_data
    return load_annotations(settings, policy=ValidationPolicy.from_mapping(dict(settings.validation)))


def build_data(
    cfg: Any,
    micro_total: int,
    seed: int,
    info: dist_utils.DistInfo,
    train_annotations: Any = None,
    class_map_file: str | None = None,
) -> TrainData:
    """A seeded DetectionLoader per split (its set_epoch reaches the sampler, dataset, collator and
    worker seeds); validation only on rank 0. `micro_total`: images per micro-batch over all ranks;
    `train_annotations`: the train split's, when loaded already (`load_train_annotations`);
    `class_map_file`: --class-map, the val split's category names as the model's classes."""
    from dfine_deploy.data.classmap import read_renames
    from dfine_deploy.data.loader import build_dataloader, build_dataset, classes_missing_from_train
    from dfine_deploy.evaluation import CocoEvaluator

    train_settings = replace(cfg.train_data, total_batch_size=micro_total)
    train_set = build_dataset(train_settings, annotations=train_annotations)
    _refuse_empty("train_dataloader", train_set)
    train_loader = build_dataloader(
        train_settings, train_set, seed=seed, rank=info.rank, world_size=info.world_size
    )
    reports = {"train": train_set.annotations.report}
    lines = train_set.annotations.lines()
    val_loader = None
    if info.is_main and cfg.val_data is not None:
        renames = (class_map_file, read_renames(class_map_file)) if class_map_file else None
        val_set = build_dataset(cfg.val_data, class_map=train_set.class_map, renames=renames)
        _refuse_empty("val_dataloader", val_set)
        val_loader = build_dataloader(cfg.val_data, val_set, seed=seed, rank=0, world_size=1)
        reports["val"] = val_set.annotations.report
        lines += val_set.annotations.lines()
        lines += classes_missing_from_train(train_set.annotations, val_set.annotations)

    def evaluator(class_map: Any = None) -> CocoEvaluator:
        return CocoEvaluator(val_loader.dataset.coco_gt(), class_map or val_loader.dataset.class_map)

    return TrainData(train_loader, val_loader, train_set.class_map, reports, evaluator, lines)


@dataclass(frozen=True)
class Job:
    """One process's run as the set-up left it, what evaluation, resume and every epoch's end read."""

    options: RunSettings
    cfg: Any  # config.Config, its schedule sized to the train split unless --no-sizing
    info: dist_utils.DistInfo
    output_dir: Path
    log: RunLog
    use_amp: bool
    amp_dtype: torch.dtype  # float16 on CUDA, bfloat16 on the CPU
    seed: int
    model: nn.Module  # the network, seeded alike on every rank (`build_loop` wraps it for DDP)
    criterion: nn.Module
    postprocessor: nn.Module
    global_batch: int  # images per optimizer step over all ranks (after --auto-batch)
    accumulate: int  # micro-batches per optimizer step
    micro_batch: int  # images per rank per micro-batch
    sizing: str  # what `size_to_data` did
    data: TrainData
    class_heads: dict[str, Any] | None  # -t: where each class's head rows came from

    def validate(self, module: nn.Module, class_map: Any = None) -> dict[str, Any]:
        """COCO metrics of `module` on the validation split (rank 0; the other ranks wait in a barrier),
        the labels read by `class_map` when given (the checkpoint's names), else by the train split's.

        Rank 0 keeps its own share of the cores (`DistInfo.threads`) rather than taking the waiting
        ranks' too: OpenMP threads spin while they wait for each other, so a team of 2 on 2 cores
        slows down 2-4x as soon as any other process wants a core, while on an idle machine the
        second thread saves well under a second of a quickstart validation (docs/performance.md)."""
        evaluator = self.data.evaluator(class_map)
        return evaluate(
            module,
            self.postprocessor,
            self.data.val_loader,
            evaluator,
            device=self.info.device,
            use_amp=self.use_amp,
            amp_dtype=self.amp_dtype,
        )


def build_job(
    options: RunSettings, info: dist_utils.DistInfo, cfg: Any, output_dir: Path, log: RunLog
) -> Job:
    """The model (seeded alike on every rank), criterion and postprocessor, the batch plan (measured
    with --auto-batch), the schedule sized to the train split, the data of each split and the -t
    weights: everything the run builds before it chooses between evaluating and training."""
    from dfine_deploy.model.dfine import to_device
    from dfine_deploy.model.postprocess import PostProcessor
    from dfine_deploy.training.criterion import build_criterion

    use_amp = cfg.train.use_amp if options.use_amp is None else bool(options.use_amp)
    amp_dtype = torch.float16 if info.device.type == "cuda" else torch.bfloat16
    seed = options.seed if options.seed is not None else (cfg.train.seed if cfg.train.seed is not None else 0)
    # read before the model is built: a dataset that is missing or broken is named in a second, not
    # after the model's construction (tens of seconds for the larger sizes on a CPU)
    check_transforms(cfg)
    annotations = load_train_annotations(cfg)
    dist_utils.seed_everything(seed, 0)  # one initialisation on every rank (EMA copies it)
    spec = cfg.model_spec
    model = to_device(build_model(cfg), info.device)  # channels-last on the CPU
    criterion = build_criterion(spec, settings=cfg.train.criterion).to(info.device)
    postprocessor = PostProcessor(spec.num_classes, num_top_queries=spec.num_top_queries).to(info.device)
    accumulate = options.accumulate if options.accumulate is not None else cfg.train.accumulate
    global_batch = cfg.train_data.total_batch_size
    if options.auto_batch:
        accumulate, global_batch = auto_batch_plan(
            lambda b: trial_step(
                model, criterion, spec.eval_spatial_size, b, info.device, use_amp, amp_dtype
            ),
            model,
            info,
            global_batch,
            accumulate,
            log,
        )
    micro_batch = micro_batch_size(global_batch, info.world_size, accumulate)
    sizing = "off (--no-sizing)"
    if options.sizing and not options.test_only:
        cfg, sizing = size_to_data(
            cfg, annotations, global_batch=global_batch, finetuning=bool(options.tuning), model=model
        )
    data = build_data(cfg, micro_batch * info.world_size, seed, info, annotations, options.class_map)
    for line in data.lines:
        log.log(line)
    for split, report in data.reports.items():
        log.log(f"data {split}: {report.summary_line()}")
    class_heads = tune_from(model, options, data.class_map, log) if options.tuning else None
    return Job(
        options=options,
        cfg=cfg,
        info=info,
        output_dir=output_dir,
        log=log,
        use_amp=use_amp,
        amp_dtype=amp_dtype,
        seed=seed,
        model=model,
        criterion=criterion,
        postprocessor=postprocessor,
        global_batch=global_batch,
        accumulate=accumulate,
        micro_batch=micro_batch,
        sizing=sizing,
        data=data,
        class_heads=class_heads,
    )


def _refuse_empty(split: str, dataset: Any) -> None:
    """A split without images trains or evaluates nothing (the sampler failed with a traceback)."""
    if not len(dataset):
        raise DatasetError(
            f"{split}: no images to load ({dataset.annotations.report.summary_line()}); check "
            f"{split}.dataset (img_folder, ann_file) and the validation policy"
        )


def size_to_data(
    cfg: Any, annotations: Any, *, global_batch: int, finetuning: bool, model: nn.Module
) -> tuple[Any, str]:
    """The config with the recipe's schedule sized to the train split (`sizing.py`), and its line."""
    from dfine_deploy.training.sizing import DataScale, size_config, start_line

    scale = DataScale.of(annotations.records, [c["id"] for c in annotations.categories])
    sized, settings = size_config(
        cfg,
        scale,
        global_batch=global_batch,
        finetuning=finetuning,
        parameter_names=[name for name, _ in model.named_parameters()],
    )
    return sized, start_line(scale, settings)


def micro_batch_size(global_batch: int, world_size: int, accumulate: int) -> int:
    """Images per rank per micro-batch: global_batch / (world_size x accumulate), which must divide."""
    if accumulate < 1:
        raise ConfigError(f"accumulate {accumulate}: give a whole number of micro-batches per step, >= 1")
    if global_batch % (world_size * accumulate):
        raise ConfigError(
            f"total_batch_size {global_batch} does not divide into {world_size} process(es) x {accumulate} "
            f"micro-batch(es); use a multiple of {world_size * accumulate}, or another --accumulate"
        )
    return global_batch // (world_size * accumulate)


def planned_steps(
    *,
    images: int,
    batches: int,
    micro_batch: int,
    world_size: int,
    accumulate: int,
    drop_last: bool,
    epochs: int,
    start_epoch: int,
    base_lrs: Sequence[float],
    resumed: Path | None,
) -> int:
    """The optimizer steps the run will take, or TrainingError when it would take none (a run that
    cannot train fails before it starts, instead of writing an untrained best.pth with exit 0).

    `images`: the train split's images after loading; `batches`: its loader's micro-batches per
    epoch on one rank; `resumed`: the checkpoint the run continues, if any."""
    per_epoch = optimizer_steps(batches, accumulate)
    if per_epoch == 0:
        per_process = images // world_size  # build_data refused an empty split
        if not per_process:
            fix = f"use at most {images} process(es), or add images"
        else:  # the largest total_batch_size that still gives every process one micro-batch
            unit = world_size * accumulate
            multiple = f" (a multiple of {unit})" if unit > 1 else ""
            fix = f"use total_batch_size {per_process * unit} or less{multiple}, or add images"
        raise TrainingError(
            f"train_dataloader: {images} image(s) give no batch of {micro_batch} per process over "
            f"{world_size} process(es){' (drop_last drops the partial batch)' if drop_last else ''}, so "
            f"no optimizer step would be taken: {fix}"
            + (", or set train_dataloader.drop_last: False" if drop_last else "")
        )
    if start_epoch >= epochs:
        raise TrainingError(
            f"{resumed} has finished all {epochs} epochs of its run: nothing is left to train. "
            f"Raise epochs (-u epochs=N) to train on, evaluate it with --test-only -r {resumed}, "
            "or give another --output-dir for a new run"
        )
    if not any(lr > 0 for lr in base_lrs):
        raise TrainingError(
            "every optimizer group has lr 0 (optimizer.lr and optimizer.params[*].lr, after "
            "--lr-reference-batch scaling): no step would change a weight; give optimizer.lr > 0"
        )
    return per_epoch * (epochs - start_epoch)


def trial_step(
    model: nn.Module,
    criterion: nn.Module,
    side: Any,
    batch: int,
    device: torch.device,
    use_amp: bool,
    amp_dtype: torch.dtype,
) -> None:
    """One forward + backward of `batch` random images (what --auto-batch measures)."""
    images = torch.rand(batch, 3, *side, device=device)
    targets = [
        {
            "labels": torch.zeros(4, dtype=torch.int64, device=device),
            "boxes": torch.full((4, 4), 0.25, device=device),
        }
        for _ in range(batch)
    ]
    with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
        outputs = model(images, targets=targets)
    sum(criterion(to_float32(outputs), targets).values()).backward()
    model.zero_grad(set_to_none=True)


def jsonable(value: Any) -> Any:
    """The resolved config as plain JSON types (tuples -> lists, unknown objects -> str)."""
    return json.loads(json.dumps(value, default=str))


def effective_settings(
    job: Job, loop: Loop, *, lr_scale: float, sync_bn: bool, total_steps: int
) -> dict[str, Any]:
    """The settings the run really uses, printed at start and saved in resolved_config.json."""
    cfg, options, info = job.cfg, job.options, loop.info
    train = cfg.train
    return {
        "config": str(cfg.source),
        "output_dir": str(job.output_dir),
        "device": str(info.device),
        "backend": info.backend or "none (single process)",
        "world_size": info.world_size,
        "threads_per_rank": info.threads,
        "per_rank_batch": loop.micro_batch * loop.accumulate,
        "micro_batch": loop.micro_batch,
        "accumulate": loop.accumulate,
        "global_batch": job.global_batch,
        "epochs": train.epochs,
        "use_amp": loop.use_amp,
        "amp_dtype": str(loop.amp_dtype).replace("torch.", "") if loop.use_amp else None,
        "use_amp_source": "--use-amp flag" if options.use_amp is not None else "config use_amp",
        "use_ema": loop.ema is not None,
        "sync_bn": sync_bn,
        "freeze_bn": options.freeze_bn,
        "find_unused_parameters": train.find_unused_parameters,
        "clip_max_norm": train.clip_max_norm,
        "seed": job.seed,
        "lr_scale": lr_scale,
        "lr_scheduler": train.lr_scheduler.type,
        "warmup_iters": train.lr_warmup_scheduler.warmup_duration,
        "steps_per_epoch": loop.schedule.steps_per_epoch,
        "optimizer_steps": total_steps,  # what this run will take (from its start epoch)
        "stop_epoch": train.stop_epoch,
        "checkpoint_freq": train.checkpoint_freq,
        "print_freq": train.print_freq,
        "eval_freq": train.eval_freq,
        "sizing": job.sizing,
        "model": asdict(cfg.model_spec),
    }
