"""The epoch loop: one `Trainer` per process, the same code for one process and for torchrun.

    run(options)          join the job, load the config, build everything, fit or evaluate
    Trainer.fit()         epochs: train_one_epoch -> schedule -> checkpoints -> evaluate (rank 0)
    Trainer.train_one_epoch()   forward (autocast) -> criterion (fp32) -> backward -> clip -> step -> EMA

Determinism: the data order comes from DistributedSampler(seed, epoch), and every epoch starts
from RNG states derived from (seed, epoch, rank). A run restarted from `last.pth` therefore
replays the following epochs exactly as an uninterrupted run would (same threads, same device).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dfine_deploy.artifact import atomic_write_bytes
from dfine_deploy.errors import TrainingError
from dfine_deploy.training import distributed as dist_utils
from dfine_deploy.training.checkpoint import (
    BEST_NAME,
    LAST_NAME,
    atomic_copy,
    atomic_torch_save,
    build_meta,
    capture_rng,
    find_auto_resume,
    load_finetune_weights,
    load_training_checkpoint,
    restore_rng,
)
from dfine_deploy.training.ema import ModelEMA
from dfine_deploy.training.monitor import ResourceMonitor, auto_batch_size
from dfine_deploy.training.optim import Schedule, build_optimizer, linear_lr_scale


@dataclass
class RunOptions:
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
    device: str | None = None
    freeze_bn: bool = False  # BatchNorm uses running statistics (tiny per-rank batches)
    lr_reference_batch: int | None = None  # linear LR scaling: lr was tuned for this global batch
    max_nonfinite: int = 5  # consecutive skipped steps before the run stops
    obj365_remap: bool = True  # -t: remap class heads through OBJ365_IDS (or config obj365_ids)
    progress: bool = True


def _to_device(targets: list[dict[str, Any]], device: torch.device) -> list[dict[str, Any]]:
    return [{k: (v.to(device, non_blocking=True) if torch.is_tensor(v) else v) for k, v in t.items()}
            for t in targets]


def _to_float32(value: Any) -> Any:
    """Criterion inputs in fp32 whatever autocast produced (the loss runs outside autocast)."""
    if torch.is_tensor(value):
        return value.float() if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _to_float32(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_to_float32(v) for v in value)
    return value


def _epoch_seed(seed: int, epoch: int) -> int:
    return seed * 1_000_003 + epoch * 7919


def freeze_batchnorm(model: nn.Module) -> int:
    """Put every BatchNorm in eval mode (running statistics, no updates); returns how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.eval()
            count += 1
    return count


class Trainer:
    def __init__(self, cfg: Any, options: RunOptions, info: dist_utils.DistInfo):
        self.cfg = cfg
        self.options = options
        self.info = info
        self.device = info.device
        train = cfg.train
        self.settings = train
        self.use_amp = train.use_amp if options.use_amp is None else bool(options.use_amp)
        self.amp_dtype = torch.float16 if self.device.type == "cuda" else torch.bfloat16
        self.seed = options.seed if options.seed is not None else (train.seed if train.seed is not None else 0)
        self.output_dir = Path(options.output_dir or train.output_dir)
        self.epochs = int(train.epochs)

        dist_utils.seed_everything(self.seed, 0)  # one initialisation on every rank (EMA copies it)
        self.model = self._build_model()
        self.criterion = self._build_criterion()
        self.postprocessor = self._build_postprocessor()
        self.train_loader, self.val_loader, self.class_map, self.evaluator_factory = self._build_data()

        self.ema = None
        if train.use_ema:
            self.ema = ModelEMA(self.model, decay=train.ema.decay, warmups=train.ema.warmups, start=train.ema.start)
        self.model, self.sync_bn = dist_utils.wrap_model(
            self.model, info, sync_bn=train.sync_bn, find_unused_parameters=train.find_unused_parameters
        )
        self.monitor = ResourceMonitor(self.device)
        if info.distributed:
            self.model.register_comm_hook(None, self.monitor.ddp_comm_hook())

        global_batch = self.per_rank_batch * info.world_size
        lr_scale = linear_lr_scale(global_batch, options.lr_reference_batch)
        opt = train.optimizer
        self.optimizer, self.group_reports = build_optimizer(
            dist_utils.unwrap(self.model), lr=opt.lr, weight_decay=opt.weight_decay, betas=opt.betas,
            group_specs=opt.params, lr_scale=lr_scale,
        )
        self.lr_scale = lr_scale
        sched = train.lr_scheduler
        self.schedule = Schedule(
            self.optimizer,
            kind="flatcosine" if sched.type == "FlatCosineLR" else "multistep",
            warmup_iters=train.lr_warmup_scheduler.warmup_duration,
            milestones=sched.milestones, gamma=sched.gamma,
            iters_per_epoch=len(self.train_loader), flat_epochs=sched.flat_epochs,
            decay_end_epochs=self.epochs, min_ratio=sched.min_lr_ratio,
        )
        self.scaler = torch.amp.GradScaler("cuda") if (self.use_amp and self.device.type == "cuda") else None

        self.start_epoch = 0
        self.step = 0
        self.best_ap = -math.inf
        self.history: list[dict[str, Any]] = []
        self.nonfinite_total = 0
        self.nonfinite_streak = 0  # consecutive skipped steps, across epoch boundaries
        self._resume_if_any()

    # ----------------------------------------------------------------------------- building
    def _build_model(self) -> nn.Module:
        from dfine_deploy.model.dfine import build_model

        spec = self.cfg.model_spec
        model = build_model(spec)
        if self.options.tuning:
            class_ids = None
            if self.options.obj365_remap:
                from dfine_deploy.training.checkpoint import OBJ365_IDS

                class_ids = self.cfg.raw.get("obj365_ids") or OBJ365_IDS
            report, remapped = load_finetune_weights(model, self.options.tuning, class_ids)
            self.log(f"fine-tuning: {report.summary()}")
            if remapped:
                self.log(f"  class heads remapped through obj365_ids: {len(remapped)} tensors")
        return model.to(self.device)

    def _build_criterion(self) -> nn.Module:
        from dfine_deploy.training.criterion import build_criterion

        return build_criterion(self.cfg.model_spec, settings=self.settings.criterion).to(self.device)

    def _build_postprocessor(self) -> nn.Module:
        from dfine_deploy.model.postprocess import PostProcessor

        spec = self.cfg.model_spec
        return PostProcessor(spec.num_classes, num_top_queries=spec.num_top_queries).to(self.device)

    def _build_data(self):
        """DATA's builders: a seeded DetectionLoader per split (its set_epoch reaches the sampler,
        dataset, collator and worker seeds); validation only on rank 0."""
        from dfine_deploy.data.loader import build_dataloader, build_dataset, per_rank_batch_size

        info = self.info
        train_settings = self.cfg.train_data
        if self.options.auto_batch:
            train_settings = replace(train_settings, total_batch_size=self._auto_batch(train_settings.total_batch_size))
        self.per_rank_batch = per_rank_batch_size(train_settings.total_batch_size, info.world_size)
        train_set = build_dataset(train_settings)
        train_loader = build_dataloader(train_settings, train_set, seed=self.seed, rank=info.rank,
                                        world_size=info.world_size)
        val_loader = None
        if info.is_main and self.cfg.val_data is not None:
            val_set = build_dataset(self.cfg.val_data, class_map=train_set.class_map)
            val_loader = build_dataloader(self.cfg.val_data, val_set, seed=self.seed, rank=0, world_size=1)
        class_map = train_set.class_map

        def evaluator():
            from dfine_deploy.evaluation import CocoEvaluator

            return CocoEvaluator(val_loader.dataset.coco_gt(), val_loader.dataset.class_map)

        return train_loader, val_loader, class_map, evaluator

    def _auto_batch(self, configured_total: int) -> int:
        """Largest per-GPU batch that fits; the global batch becomes that times the world size."""
        if self.device.type != "cuda":
            _, message = auto_batch_size(lambda b: None, self.device)
            self.log(message)
            return configured_total
        side = self.cfg.model_spec.eval_spatial_size

        def try_step(batch: int) -> None:
            images = torch.rand(batch, 3, *side, device=self.device)
            targets = [{"labels": torch.zeros(4, dtype=torch.int64, device=self.device),
                        "boxes": torch.full((4, 4), 0.25, device=self.device)} for _ in range(batch)]
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.use_amp):
                outputs = self.model(images, targets=targets)
            loss = sum(self.criterion(_to_float32(outputs), targets).values())
            loss.backward()
            self.model.zero_grad(set_to_none=True)

        before = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
        found, message = auto_batch_size(try_step, self.device)
        self.model.load_state_dict(before)  # the trial steps must not move BatchNorm statistics
        found = dist_utils.broadcast_object(self.info, found)
        self.log(message)
        return configured_total if found is None else found * self.info.world_size

    # ------------------------------------------------------------------------------ logging
    def log(self, message: str) -> None:
        if self.info.is_main:
            print(message, flush=True)

    def describe(self) -> dict[str, Any]:
        """The effective settings, printed at start and saved as resolved_config.json."""
        info = self.info
        return {
            "config": str(self.cfg.source),
            "output_dir": str(self.output_dir),
            "device": str(self.device),
            "backend": info.backend or "none (single process)",
            "world_size": info.world_size,
            "threads_per_rank": info.threads,
            "per_rank_batch": self.per_rank_batch,
            "global_batch": self.per_rank_batch * info.world_size,
            "epochs": self.epochs,
            "use_amp": self.use_amp,
            "amp_dtype": str(self.amp_dtype).replace("torch.", "") if self.use_amp else None,
            "use_amp_source": "--use-amp flag" if self.options.use_amp is not None else "config use_amp",
            "use_ema": self.ema is not None,
            "sync_bn": self.sync_bn,
            "freeze_bn": self.options.freeze_bn,
            "find_unused_parameters": self.settings.find_unused_parameters,
            "clip_max_norm": self.settings.clip_max_norm,
            "seed": self.seed,
            "lr_scale": self.lr_scale,
            "lr_scheduler": self.settings.lr_scheduler.type,
            "warmup_iters": self.settings.lr_warmup_scheduler.warmup_duration,
            "stop_epoch": self.settings.stop_epoch,
            "checkpoint_freq": self.settings.checkpoint_freq,
            "model": asdict(self.cfg.model_spec),
        }

    def print_start(self) -> None:
        described = self.describe()
        self.log("effective settings:")
        for key, value in described.items():
            if key != "model":
                self.log(f"  {key}: {value}")
        self.log(f"  model: dfine-{self.cfg.model_spec.size or 'custom'}, {self.cfg.model_spec.num_classes} classes, "
                 f"input {self.cfg.model_spec.eval_spatial_size}")
        self.log("optimizer groups (first matching pattern wins; look-ahead alternations read as "
                 "'any of', fixing the official precedence slip):")
        for report in self.group_reports:
            self.log(report.line())
        if self.info.is_main:
            self.output_dir.mkdir(parents=True, exist_ok=True)
            for stale in self.output_dir.glob(".*.pth.*tmp"):  # left by a process killed mid-write
                stale.unlink()
            payload = {"effective": described, "config": _jsonable(self.cfg.raw)}
            (self.output_dir / "resolved_config.json").write_text(json.dumps(payload, indent=2, default=str))

    # ------------------------------------------------------------------------------- resume
    def _resume_if_any(self) -> None:
        path = self.options.resume
        if self.options.test_only:
            if path:  # weights only (EMA when present), as official `--test-only -r`
                report, _ = load_finetune_weights(dist_utils.unwrap(self.model), path, None)
                self.ema = None  # evaluate exactly the loaded weights
                self.log(f"evaluating: {report.summary()}")
            return
        if path is None:
            auto = find_auto_resume(self.output_dir)
            path = str(auto) if auto is not None else None
            if path:
                self.log(f"auto-resume: found {path}")
        if path is None:
            return
        state = load_training_checkpoint(path)
        model = dist_utils.unwrap(self.model)
        model.load_state_dict(state["model"])
        if self.ema is not None and state.get("ema"):
            self.ema.load_state_dict(state["ema"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.schedule.load_state_dict(state["lr_scheduler"], state.get("lr_warmup_scheduler"))
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])
        self.start_epoch = int(state["last_epoch"]) + 1
        self.step = int(state["step"])
        self.best_ap = float(state.get("best_ap", -math.inf))
        self.history = list(state.get("history", []))
        self.nonfinite_total = int(state.get("nonfinite_total", 0))
        restore_rng(state.get("rng"))
        if self.info.is_main:  # log.jsonl says exactly what the resumed state has seen
            self.output_dir.mkdir(parents=True, exist_ok=True)
            lines = "".join(json.dumps(r, default=float) + "\n" for r in self.history)
            atomic_write_bytes(self.output_dir / "log.jsonl", lines.encode())
        self.log(f"resumed from {path}: epoch {self.start_epoch}, step {self.step}")

    def _state(self, epoch: int) -> dict[str, Any]:
        main_state, warm_state = self.schedule.state_dict()
        spec = self.cfg.model_spec
        names = list(self.class_map.class_names) if self.class_map is not None else [str(i) for i in range(spec.num_classes)]
        return {
            "model": dist_utils.unwrap(self.model).state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "optimizer": self.optimizer.state_dict(),
            "lr_scheduler": main_state,
            "lr_warmup_scheduler": warm_state,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "last_epoch": epoch,
            "step": self.step,
            "rng": capture_rng(),
            "best_ap": self.best_ap,
            "history": self.history,
            "nonfinite_total": self.nonfinite_total,
            "meta": build_meta(model_spec=spec, class_names=names, class_map=self.class_map,
                               config=_jsonable(self.cfg.raw)),
        }

    # --------------------------------------------------------------------------------- loop
    def fit(self) -> dict[str, Any]:
        self.print_start()
        writer = self._tensorboard()
        try:
            for epoch in range(self.start_epoch, self.epochs):
                self._enter_epoch(epoch)
                stats = self.train_one_epoch(epoch)
                self.schedule.step_epoch()
                metrics = self.evaluate() if self.info.is_main else {}
                record = {"epoch": epoch, "step": self.step, "time": round(time.time(), 3), **stats, **{f"val_{k}": v for k, v in metrics.items()
                                                                       if not isinstance(v, (dict, list))}}
                if self.info.is_main:
                    self.history.append(record)
                    self._save(epoch, metrics)
                    self._log_epoch(record, writer)
                dist_utils.barrier(self.info)
        finally:
            if writer is not None:
                writer.close()
        if self.info.is_main:
            self._plot_curves()
        return self.history[-1] if self.history else {}

    def _enter_epoch(self, epoch: int) -> None:
        dist_utils.seed_everything(_epoch_seed(self.seed, epoch), self.info.rank)
        self.train_loader.set_epoch(epoch)  # sampler order, augmentation policy, collator, worker seeds
        stop = self.settings.stop_epoch
        if stop and epoch == stop and self.ema is not None:  # stop 0: there never was a strong phase
            self.ema.decay = self.settings.ema_restart_decay
            self.log(f"epoch {epoch}: strong augmentation off; EMA decay now {self.ema.decay} (applied)")

    def train_one_epoch(self, epoch: int) -> dict[str, Any]:
        model, criterion = self.model, self.criterion
        model.train()
        criterion.train()
        if self.options.freeze_bn:
            freeze_batchnorm(model)
        clip = self.settings.clip_max_norm
        steps_per_epoch = len(self.train_loader)
        self.monitor.start_epoch()
        sums: dict[str, float] = {}
        step_losses: list[float] = []
        skipped = 0
        bar = self._progress(steps_per_epoch, epoch)
        started = time.perf_counter()
        for i, (images, targets) in enumerate(self.train_loader):
            self.monitor.data_ready()
            images = images.to(self.device, non_blocking=True)
            targets = _to_device(targets, self.device)
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.use_amp):
                outputs = model(images, targets=targets)
            with torch.autocast(self.device.type, enabled=False):
                losses = criterion(_to_float32(outputs), targets, epoch=epoch, step=i,
                                   global_step=self.step, epoch_step=steps_per_epoch)
            loss = sum(losses.values())
            if self._all_finite(loss):
                stepped = self._backward_and_step(loss, clip)
            else:
                self.optimizer.zero_grad(set_to_none=True)
                stepped = False
            if not stepped:
                skipped += 1
                self.nonfinite_streak += 1
                self.nonfinite_total += 1
                self.log(f"epoch {epoch} step {i}: non-finite loss or gradient (loss {loss.item():.4g}); "
                         f"step skipped ({self.nonfinite_streak} in a row)")
                if self.nonfinite_streak >= self.options.max_nonfinite:
                    raise TrainingError(
                        f"{self.nonfinite_streak} non-finite losses in a row at epoch {epoch}, step {self.step}: training "
                        f"stopped. The last good checkpoint is {self.output_dir / LAST_NAME}. Lower the learning "
                        "rate, keep clip_max_norm > 0, or check the data for degenerate boxes, then resume with -r"
                    )
                continue
            self.nonfinite_streak = 0
            self.schedule.step_iteration()
            if self.ema is not None:
                self.ema.update(model)
            self.step += 1
            reduced = dist_utils.all_reduce_mean(self.info, {k: v.item() for k, v in losses.items()} | {"loss": loss.item()})
            step_losses.append(reduced["loss"])
            for key, value in reduced.items():
                sums[key] = sums.get(key, 0.0) + value
            if bar is not None:
                elapsed = time.perf_counter() - started
                done = i + 1
                bar.set_postfix(loss=f"{reduced['loss']:.3f}", lr=f"{self.schedule.current_lr():.2e}",
                                img_s=f"{done * self.per_rank_batch * self.info.world_size / elapsed:.1f}")
                bar.update(1)
            self.monitor.step_done(self.info.distributed)
        if bar is not None:
            bar.close()
        resources = self.monitor.end_epoch()
        seconds = time.perf_counter() - started
        done_steps = max(1, len(step_losses))
        stats = {k: v / done_steps for k, v in sums.items()}
        stats.update({
            "train_loss": stats.pop("loss", float("nan")),
            "lr": self.schedule.current_lr(),
            "step_losses": step_losses,
            "skipped_steps": skipped,
            "epoch_seconds": round(seconds, 2),
            "images_per_second": round(len(step_losses) * self.per_rank_batch * self.info.world_size / seconds, 2),
            "resources": resources.summary(),
        })
        for note in resources.warnings():
            self.log(f"warning: {note}")
        if resources.gpu_util_note and self.device.type == "cuda":
            self.log(f"note: {resources.gpu_util_note}")
        return stats

    def _backward_and_step(self, loss: torch.Tensor, clip: float) -> bool:
        """Backward, clip, step; False (nothing applied) when the gradient is not finite.

        The gradient norm is the same on every rank after DDP's all-reduce, so all ranks agree.
        Under CUDA AMP, GradScaler skips overflowing steps itself (normal while it calibrates).
        """
        params = [p for p in self.model.parameters() if p.requires_grad]
        max_norm = clip if clip and clip > 0 else float("inf")
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(params, max_norm)
            self.scaler.step(self.optimizer)
            self.scaler.update()
            return True
        loss.backward()
        norm = nn.utils.clip_grad_norm_(params, max_norm)
        if not torch.isfinite(norm):
            self.optimizer.zero_grad(set_to_none=True)
            return False
        self.optimizer.step()
        return True

    def _all_finite(self, loss: torch.Tensor) -> bool:
        """Every rank must agree, or DDP would wait for a backward that one rank skipped."""
        flag = torch.isfinite(loss.detach()).to(torch.float32).reshape(1)
        if self.info.distributed:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MIN)
        return bool(flag.item() > 0)

    # ---------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict[str, Any]:
        """COCO metrics of the EMA model (the plain model without EMA) on the validation set."""
        if self.val_loader is None:
            return {}
        module = self.ema.module if self.ema is not None else dist_utils.unwrap(self.model)
        was_training = module.training
        module.eval()
        evaluator = self.evaluator_factory()
        for images, targets in self.val_loader:
            images = images.to(self.device)
            with torch.autocast(self.device.type, dtype=self.amp_dtype, enabled=self.use_amp):
                outputs = module(images)
            sizes = torch.stack([t["orig_size"] for t in targets]).to(self.device)
            results = self.postprocessor(_to_float32(outputs), sizes)
            evaluator.update([int(t["image_id"]) for t in targets], results)
        module.train(was_training)
        return evaluator.summarize()

    # ---------------------------------------------------------------------------- artefacts
    def _save(self, epoch: int, metrics: dict[str, Any]) -> None:
        model = dist_utils.unwrap(self.model)
        if not all(torch.isfinite(p).all() for p in model.parameters()):
            self.log(f"epoch {epoch}: the weights are not finite; no checkpoint written "
                     f"({self.output_dir / LAST_NAME} keeps the last good state)")
            return
        ap = float(metrics.get("AP", 0.0)) if metrics else 0.0
        is_best = ap >= self.best_ap  # ">=": best.pth exists after the first epoch even at mAP 0
        if is_best:
            self.best_ap = ap
        last = self.output_dir / LAST_NAME
        atomic_torch_save(self._state(epoch), last)
        freq = self.settings.checkpoint_freq
        if freq and freq > 0 and (epoch + 1) % freq == 0:
            atomic_copy(last, self.output_dir / f"checkpoint{epoch:04d}.pth")
        if is_best:
            atomic_copy(last, self.output_dir / BEST_NAME)

    def _log_epoch(self, record: dict[str, Any], writer) -> None:
        line = {k: v for k, v in record.items()}
        with open(self.output_dir / "log.jsonl", "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, default=float) + "\n")
        res = record.get("resources", {})
        self.log(
            f"epoch {record['epoch']}: loss {record['train_loss']:.4f}, lr {record['lr']:.2e}, "
            f"{record['images_per_second']} img/s, AP {record.get('val_AP', float('nan')):.4f}, "
            f"AP50 {record.get('val_AP50', float('nan')):.4f}; data {res.get('data_time_share', 0):.0%} of step time, "
            f"peak memory {res.get('peak_memory_mb')} MB ({res.get('memory_kind')})"
            + (f", all-reduce {res['allreduce_ms_per_step']} ms/step" if "allreduce_ms_per_step" in res else "")
            + (f", GPU {res['gpu_util_percent']} %" if res.get("gpu_util_percent") is not None else "")
        )
        if writer is not None:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key not in ("epoch", "step"):
                    writer.add_scalar(key, value, record["epoch"])
            for key, value in res.items():
                if isinstance(value, (int, float)):
                    writer.add_scalar(f"resources/{key}", value, record["epoch"])
            writer.flush()

    def _tensorboard(self):
        if not self.info.is_main:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            self.log("note: tensorboard is not installed; scalars go to log.jsonl only")
            return None
        return SummaryWriter(self.options.summary_dir or self.settings.summary_dir or str(self.output_dir / "summary"))

    def _progress(self, total: int, epoch: int):
        if not (self.info.is_main and self.options.progress):
            return None
        from tqdm import tqdm

        return tqdm(total=total, desc=f"epoch {epoch}/{self.epochs - 1}", unit="step", file=sys.stdout,
                    dynamic_ncols=True, mininterval=1.0)

    def _plot_curves(self) -> None:
        if not self.history:
            return
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        epochs = [r["epoch"] for r in self.history]
        fig, (ax_loss, ax_ap) = plt.subplots(1, 2, figsize=(10, 4))
        ax_loss.plot(epochs, [r["train_loss"] for r in self.history], marker="o")
        ax_loss.set(title="training loss", xlabel="epoch", ylabel="loss")
        for key in ("val_AP", "val_AP50"):
            if any(key in r for r in self.history):
                ax_ap.plot(epochs, [r.get(key, float("nan")) for r in self.history], marker="o", label=key[4:])
        ax_ap.set(title="validation mAP (EMA model)", xlabel="epoch", ylabel="mAP")
        ax_ap.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(self.output_dir / "curves.png", dpi=100)
        plt.close(fig)


def _jsonable(value: Any) -> Any:
    """The resolved config as plain JSON types (tuples -> lists, unknown objects -> str)."""
    return json.loads(json.dumps(value, default=str))


def run(options: RunOptions) -> dict[str, Any]:
    """Everything `train/main.py` and `dfine-train` do, for one process of the job."""
    from dfine_deploy.config import load_config

    if options.resume and options.tuning:
        raise TrainingError("-r (resume) and -t (fine-tune) exclude each other: -r continues a run, "
                            "-t starts a new one from weights; give only one")
    info = dist_utils.init_distributed(options.device)
    try:
        cfg = load_config(options.config, options.updates)
        trainer = Trainer(cfg, options, info)
        if options.test_only:
            trainer.print_start()
            metrics = trainer.evaluate() if info.is_main else {}
            if info.is_main:
                (trainer.output_dir / "eval.json").write_text(json.dumps(metrics, indent=2, default=float))
                trainer.log(f"evaluation: AP {metrics.get('AP', float('nan')):.4f}, AP50 {metrics.get('AP50', float('nan')):.4f}")
            dist_utils.barrier(info)
            return metrics
        return trainer.fit()
    finally:
        dist_utils.cleanup(info)
