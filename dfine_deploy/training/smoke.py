"""The smoke test: before the long run, overfit a handful of training images and see the model learn.

A copy of the model (the run's own weights stay as they are) trains for `SMOKE_STEPS` AdamW steps on
one fixed batch of `SMOKE_IMAGES` training images, plainly resized (no augmentation), with the run's
parameter groups at their full learning rates. It passes when the loss falls and the predicted boxes
move onto the targets (the mean IoU of the queries the Hungarian matcher pairs with them rises), and
none of `diagnosis`'s certain causes is found. On a failure every finding is named, in order.

`--smoke` runs it alone and exits; by default it runs at the start of every run long enough for it
to be a small share (`SHARE_OF_RUN`); `--no-smoke` turns it off. Under torchrun rank 0 runs it while
the other ranks wait, and all of them stop or go on together.
"""

from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dfine_deploy.errors import TrainingError
from dfine_deploy.files import atomic_write_bytes
from dfine_deploy.training import distributed as dist_utils
from dfine_deploy.training.diagnosis import Finding, diagnose
from dfine_deploy.training.settings import SHARE_OF_RUN, SMOKE_STEPS

SMOKE_IMAGES = 4
SMOKE_WARMUP = 3  # steps of linear warm-up: the first step of a fresh head is the roughest
WINDOW = 3  # steps averaged at the start and at the end
LOSS_FALL = 0.85  # the end's loss at most this share of the start's
IOU_GAIN = 0.05  # the matched queries' mean IoU rises by at least this much
SMOKE_NAME = "smoke.json"


@dataclass
class SmokeResult:
    passed: bool
    images: int
    steps: int
    seconds: float
    cpu_seconds: float  # this process's CPU time (all threads): the work, whatever else shares the cores
    loss_start: float
    loss_end: float
    iou_start: float
    iou_end: float
    findings: list[Finding] = field(default_factory=list)

    @property
    def learned(self) -> bool:
        return (
            math.isfinite(self.loss_end)
            and self.loss_end <= LOSS_FALL * self.loss_start
            and self.iou_end >= self.iou_start + IOU_GAIN
        )

    def figures(self) -> str:
        return (
            f"{self.images} images x {self.steps} steps in {self.seconds:.0f} s "
            f"({self.cpu_seconds:.0f} s CPU): "
            f"loss {self.loss_start:.3f} -> {self.loss_end:.3f}, "
            f"matched-query IoU {self.iou_start:.3f} -> {self.iou_end:.3f}"
        )

    def report(self) -> str:
        """The lines the run prints: the verdict, then each finding in the order checked."""
        if self.passed:
            lines = [f"smoke test passed: {self.figures()}"]
            lines += [f"  note: {f.line}" for f in self.findings]
            return "\n".join(lines)
        if not self.steps:
            why = "found before training"
        elif self.learned:
            why = "the model learns, but the data or settings are wrong"
        else:
            why = f"the model did not learn (loss must fall to {LOSS_FALL:.0%} and IoU rise by {IOU_GAIN})"
        figures = f": {self.figures()}" if self.steps else ""
        lines = [f"smoke test failed ({why}){figures}", "likely causes, in the order checked:"]
        lines += [f"  - {f.line}" for f in self.findings] or [
            "  - none of the known causes (labels, box format, box sizes, learning rate, frozen parameters) "
            "was found: check the transforms (ConvertBoxes to normalised cxcywh) and the class map below"
        ]
        lines.append("(--no-smoke skips this test)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["findings"] = [asdict(f) for f in self.findings]
        return data


def smoke_batch(dataset: Any, side: tuple[int, int], count: int = SMOKE_IMAGES) -> tuple[torch.Tensor, list]:
    """The first `count` training images with a box, resized to `side` (h, w) with no augmentation,
    and their targets as the criterion takes them (normalised cxcywh)."""
    from dfine_deploy.data.transforms import Pipeline, build_op

    pipeline = Pipeline(
        [
            build_op({"type": "Resize", "size": list(side)}),
            build_op({"type": "ConvertPILImage", "dtype": "float32", "scale": True}),
            build_op({"type": "ConvertBoxes", "fmt": "cxcywh", "normalize": True}),
        ]
    )
    images, targets = [], []
    for index, record in enumerate(dataset.records):
        if len(images) == count:
            break
        if not (~record.iscrowd).any():
            continue
        image, target = pipeline(*dataset.load_item(index))
        images.append(image.as_subclass(torch.Tensor))
        targets.append({"labels": target["labels"], "boxes": target["boxes"]})
    if not images:
        raise TrainingError("smoke test: no training image has a box to learn; check the train split")
    return torch.stack(images), targets


def matched_iou(matcher: nn.Module, outputs: dict[str, Any], targets: list[dict[str, Any]]) -> float:
    """Mean IoU of the queries the Hungarian matcher pairs with the targets."""
    from torchvision.ops import box_iou

    from dfine_deploy.model.box_ops import box_cxcywh_to_xyxy

    scores = []
    main = {"pred_logits": outputs["pred_logits"].detach(), "pred_boxes": outputs["pred_boxes"].detach()}
    for (queries, wanted), boxes, target in zip(matcher(main, targets), main["pred_boxes"], targets):
        if len(queries):
            pred = box_cxcywh_to_xyxy(boxes[queries].float())
            true = box_cxcywh_to_xyxy(target["boxes"][wanted].to(pred))
            scores.append(box_iou(pred, true).diagonal())
    return float(torch.cat(scores).mean()) if scores else 0.0


def overfit(
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, list],
    *,
    device: torch.device,
    steps: int = SMOKE_STEPS,
    clip_max_norm: float = 0.0,
    freeze_bn: bool = False,
) -> tuple[list[float], list[float]]:
    """`steps` AdamW steps of a copy of `model` on one batch; (loss, matched IoU) before each step.
    `optimizer`'s groups give the learning rates; its parameters are not touched."""
    from dfine_deploy.training.steps import freeze_batchnorm

    trial = copy.deepcopy(dist_utils.unwrap(model)).to(device).train()
    if freeze_bn:
        freeze_batchnorm(trial)
    params = dict(dist_utils.unwrap(model).named_parameters())
    trial_params = dict(trial.named_parameters())
    by_id = {id(p): n for n, p in params.items()}
    groups = [
        {
            "params": [trial_params[by_id[id(p)]] for p in g["params"]],
            **{k: g[k] for k in ("lr", "betas", "weight_decay", "eps")},
        }
        for g in optimizer.param_groups
    ]
    base_lrs = [float(g["lr"]) for g in optimizer.param_groups]
    trial_opt = torch.optim.AdamW(groups)
    images = batch[0].to(device)
    targets = [{k: v.to(device) for k, v in t.items()} for t in batch[1]]
    losses, ious = [], []
    trainable = [p for p in trial.parameters() if p.requires_grad]
    criterion = copy.deepcopy(criterion)  # this process alone: no all-reduce of its box counts
    criterion.across_ranks = False
    for step in range(steps):
        for group, base in zip(trial_opt.param_groups, base_lrs):
            group["lr"] = base * min(1.0, (step + 1) / SMOKE_WARMUP)
        outputs = trial(images, targets=targets)
        loss = sum(criterion(outputs, targets).values())
        losses.append(float(loss.detach()))
        ious.append(matched_iou(criterion.matcher, outputs, targets))
        if not math.isfinite(losses[-1]):
            break
        trial_opt.zero_grad(set_to_none=True)
        loss.backward()
        if clip_max_norm and clip_max_norm > 0 and trainable:
            nn.utils.clip_grad_norm_(trainable, clip_max_norm, foreach=True)
        trial_opt.step()
    return losses, ious


def smoke_test(
    *,
    model: nn.Module,
    criterion: nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Any,
    dataset_type: str,
    num_classes: int,
    side: tuple[int, int],
    device: torch.device,
    clip_max_norm: float,
    freeze_bn: bool,
) -> SmokeResult:
    """Overfit, check, and judge (one process; `run_smoke` handles the job)."""
    started, cpu = time.perf_counter(), time.process_time()
    findings = diagnose(dataset, dataset_type, num_classes, optimizer, dist_utils.unwrap(model))
    certain = [f for f in findings if f.certain]
    if certain:  # no loss curve can make up for these: stop before training
        spent = (time.perf_counter() - started, time.process_time() - cpu)
        return SmokeResult(False, 0, 0, *spent, *(math.nan,) * 4, findings=certain)
    batch = smoke_batch(dataset, side)
    losses, ious = overfit(
        model, criterion, optimizer, batch, device=device, clip_max_norm=clip_max_norm, freeze_bn=freeze_bn
    )
    window = min(WINDOW, len(losses))
    result = SmokeResult(
        passed=False,
        images=len(batch[1]),
        steps=len(losses),
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - cpu,
        loss_start=sum(losses[:window]) / window,
        loss_end=sum(losses[-window:]) / window,
        iou_start=sum(ious[:window]) / window,
        iou_end=sum(ious[-window:]) / window,
        findings=findings,
    )
    result.passed = result.learned
    return result


def default_smoke_skip(planned_steps: int) -> str | None:
    """Why the default smoke test does not run for a run of `planned_steps` optimizer steps."""
    if planned_steps < SHARE_OF_RUN * SMOKE_STEPS:
        return (
            f"smoke test skipped: the run takes {planned_steps} optimizer steps, fewer than "
            f"{SHARE_OF_RUN * SMOKE_STEPS} (--smoke runs it alone)"
        )
    return None


def run_smoke(
    info: dist_utils.DistInfo, log: Any, test: Callable[[], SmokeResult], class_map: Any, record: Path
) -> SmokeResult:
    """`test()` on rank 0 (using every core of this host while the other ranks wait), its result on
    every rank; rank 0 prints it and writes it to `record` (JSON). A failure raises TrainingError
    on all ranks together, after rank 0 printed why and the class map."""
    result, failure = None, None
    if info.is_main:
        log.log(f"smoke test: overfitting {SMOKE_IMAGES} training images for {SMOKE_STEPS} steps ...")
        with dist_utils.rank0_takes_all_cores(info):
            try:
                result = test()
            except TrainingError as exc:
                failure = str(exc)
        if result is not None:
            log.log(result.report())
            if not result.passed:
                log.log(f"class map:\n{class_map.table()}")
            record.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(record, json.dumps(result.to_dict(), indent=2).encode())
    result, failure = dist_utils.broadcast_object(info, (result, failure))
    if failure:
        raise TrainingError(failure)
    if not result.passed:
        causes = "; ".join(f.line for f in result.findings) or "the model did not learn (see the lines above)"
        raise TrainingError(f"smoke test failed: {causes}")
    return result
