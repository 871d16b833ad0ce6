"""Typed settings for everything an official-layout YAML file configures, apart from the network.

The network itself is `dfine_deploy.model.spec.ModelSpec`. `dfine_deploy.config.load_config` fills
these frozen dataclasses from the merged YAML with plain functions, so a reader can grep for where a
value comes from. Field names follow the official YAML keys; where a field's meaning differs from
the official code, its comment says so.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from dfine_deploy.model.spec import ModelSpec

__all__ = [
    "DATASET_TYPES",
    "KNOWN_LOSSES",
    "KNOWN_LOSS_WEIGHTS",
    "LOSS_NAMES",
    "LOSS_WEIGHTS",
    "MATCH_COST_WEIGHTS",
    "LR_SCHEDULER_TYPES",
    "CollateSettings",
    "CriterionSettings",
    "DataSettings",
    "EmaSettings",
    "LrSchedulerSettings",
    "MatcherSettings",
    "ModelSpec",
    "OptimizerSettings",
    "ParamGroupSettings",
    "TrainSettings",
    "TransformOp",
    "TransformPolicy",
    "TransformsSettings",
    "WarmupSettings",
]

# `CocoDetection`: a COCO json + image folder (the official type). `YOLODetection`: a YOLO folder
# (images/ + labels/ + data.yaml), converted to the same in-memory form. `SyntheticDetection`: our
# generated COCO folder (written by `dfine-data synth`), read exactly like CocoDetection.
# `VOCDetection`: a Pascal VOC folder (`root`). The type names the official class; what is read is
# whatever layout `data/formats.py` recognises at ann_file (or img_folder), and the run says which.
DATASET_TYPES = ("CocoDetection", "YOLODetection", "SyntheticDetection", "VOCDetection")

# `MultiStepLR` as official (stepped once per epoch after warm-up). `FlatCosineLR` is ours: the lr
# stays at its base value for `flat_epochs`, then follows a half cosine down to
# `min_lr_ratio * base` at the last epoch (stepped per iteration). Short CPU runs need it.
LR_SCHEDULER_TYPES = ("MultiStepLR", "FlatCosineLR")


# ------------------------------------------------------------------------------------------ data


@dataclass(frozen=True)
class TransformOp:
    """One entry of `transforms.ops`: a torchvision-v2 style op name and its keyword arguments."""

    type: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TransformPolicy:
    """`transforms.policy`: `stop_epoch` switches the listed ops off from `epoch` on."""

    name: str | None = None  # "stop_epoch" or None (no policy)
    epoch: int | None = None  # first epoch without the listed ops
    ops: tuple[str, ...] = ()


@dataclass(frozen=True)
class TransformsSettings:
    ops: tuple[TransformOp, ...] = ()
    policy: TransformPolicy = field(default_factory=TransformPolicy)


@dataclass(frozen=True)
class CollateSettings:
    """`collate_fn` (BatchImageCollateFunction): multi-scale batches until `stop_epoch`."""

    base_size: int = 640
    base_size_repeat: int | None = None  # None: no multi-scale
    stop_epoch: int | None = None  # first epoch with single-scale batches
    ema_restart_decay: float = 0.9999  # EMA decay from stop_epoch on (official: printed, never applied)


@dataclass(frozen=True)
class DataSettings:
    """One of `train_dataloader` / `val_dataloader`, with its dataset and shared top-level keys."""

    dataset_type: str = "CocoDetection"  # one of DATASET_TYPES
    img_folder: str | None = None  # the image root (`root` is read as a synonym)
    ann_file: str | None = None  # COCO json; YOLO: the data.yaml; or any file data/formats.py reads
    split: str | None = None  # train or val: the split of a several-split export this loader reads
    class_names: tuple[str, ...] | None = None  # optional; COCO json names win when absent
    num_classes: int = 80  # top-level `num_classes`
    remap_mscoco_category: bool = False  # top-level; True maps the 80 COCO ids to 0..79
    return_masks: bool = False  # official key; masks are never produced (must stay False)
    transforms: TransformsSettings = field(default_factory=TransformsSettings)
    total_batch_size: int = 32  # over all ranks; must divide by the world size
    num_workers: int = 4
    shuffle: bool = False
    drop_last: bool = False
    pin_memory: bool = False
    prefetch_factor: int | None = None  # torch default when None (and required None at 0 workers)
    persistent_workers: bool = False
    collate: CollateSettings = field(default_factory=CollateSettings)
    cache: str = "off"  # "off" | "ram" | a folder path (e.g. /dev/shm/dfine-cache)
    # (problem, action) pairs; problems not named keep their default action
    validation: tuple[tuple[str, str], ...] = ()


# ---------------------------------------------------------------------------------- optimisation


@dataclass(frozen=True)
class ParamGroupSettings:
    """`optimizer.params[i]`: parameters whose name matches `pattern` (re.findall, as official)."""

    pattern: str
    lr: float | None = None  # None: the optimizer's base lr
    weight_decay: float | None = None  # None: the optimizer's base weight decay


@dataclass(frozen=True)
class OptimizerSettings:
    type: str = "AdamW"
    lr: float = 2.5e-4
    betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = 1.25e-4
    params: tuple[ParamGroupSettings, ...] = ()  # unmatched parameters form a last default group


@dataclass(frozen=True)
class LrSchedulerSettings:
    type: str = "MultiStepLR"  # one of LR_SCHEDULER_TYPES
    milestones: tuple[int, ...] = (500,)  # MultiStepLR, in epochs
    gamma: float = 0.1  # MultiStepLR
    flat_epochs: int = 0  # FlatCosineLR: epochs at the base lr before the cosine starts
    min_lr_ratio: float = 0.05  # FlatCosineLR: final lr as a fraction of each group's base lr


@dataclass(frozen=True)
class WarmupSettings:
    """`lr_warmup_scheduler` (LinearWarmup): lr factor min(1, (step+1)/duration) per iteration."""

    warmup_duration: int = 500  # iterations; 0 = no warm-up


@dataclass(frozen=True)
class EmaSettings:
    """`ema` (ModelEMA): d = decay * (1 - exp(-updates / warmups)); warmups 0 = constant decay."""

    decay: float = 0.9999
    warmups: int = 1000
    start: int = 0


# The matching cost terms and their weights (official dfine_hgnetv2.yml).
MATCH_COST_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"cost_class": 2.0, "cost_bbox": 5.0, "cost_giou": 2.0}
)


@dataclass(frozen=True)
class MatcherSettings:
    """`DFINECriterion.matcher`: what `HungarianMatcher` is built from (every knob's default is here)."""

    weight_dict: dict[str, float] = field(default_factory=lambda: dict(MATCH_COST_WEIGHTS))
    alpha: float = 0.25
    gamma: float = 2.0


# The D-FINE loss groups and the weight of each term they produce (official dfine_hgnetv2.yml).
LOSS_NAMES = ("vfl", "boxes", "local")
LOSS_WEIGHTS: Mapping[str, float] = MappingProxyType(
    {"loss_vfl": 1.0, "loss_bbox": 5.0, "loss_giou": 2.0, "loss_fgl": 0.15, "loss_ddf": 1.5}
)
# DEIM's classification loss, `mal` weighted by `loss_mal`, in place of `vfl` (DEIM's configs/base/deim.yml,
# github.com/ShihuaHuang95/DEIM): what a config may name beside D-FINE's own.
KNOWN_LOSSES = (*LOSS_NAMES, "mal")
KNOWN_LOSS_WEIGHTS = (*LOSS_WEIGHTS, "loss_mal")


@dataclass(frozen=True)
class CriterionSettings:
    """`DFINECriterion`: loss weights and which losses run (names checked when the config loads); the
    criterion is built from it, so a new knob is a field here and the line that reads it."""

    weight_dict: dict[str, float] = field(default_factory=lambda: dict(LOSS_WEIGHTS))
    losses: tuple[str, ...] = LOSS_NAMES
    alpha: float = 0.75
    gamma: float = 2.0
    mal_alpha: float | None = None  # MAL's weight of the negatives' term (DEIM's default: none, 1)
    reg_max: int = 32
    matcher: MatcherSettings = field(default_factory=MatcherSettings)


@dataclass(frozen=True)
class TrainSettings:
    """Top-level training keys (runtime.yml, optimizer.yml and the size files)."""

    epochs: int = 72  # official key `epochs`; RT-DETR's misspelt `epoches` is accepted too
    stop_epoch: int | None = None  # strong augmentation / multi-scale end (policy.epoch)
    clip_max_norm: float = 0.1  # <= 0 disables clipping
    # Official quirk: train.py turns AMP off unless --use-amp is given, whatever the YAML says. We
    # honour the YAML; `dfine-train --use-amp/--no-amp` overrides it.
    use_amp: bool = False
    use_ema: bool = False
    sync_bn: bool = True
    find_unused_parameters: bool = False
    checkpoint_freq: int = 12
    print_freq: int = 100  # a loss line every N optimizer steps when there is no progress bar
    eval_freq: int = 1  # validate every N epochs and after the last one (ours; 0: after the last only)
    accumulate: int = 1  # micro-batches per optimizer step (ours; `--accumulate N` overrides)
    output_dir: str = "./logs"
    summary_dir: str | None = None  # tensorboard; None = <output_dir>/summary
    seed: int | None = None
    ema_restart_decay: float = CollateSettings.ema_restart_decay  # train collate_fn's value
    optimizer: OptimizerSettings = field(default_factory=OptimizerSettings)
    lr_scheduler: LrSchedulerSettings = field(default_factory=LrSchedulerSettings)
    lr_warmup_scheduler: WarmupSettings = field(default_factory=WarmupSettings)
    ema: EmaSettings = field(default_factory=EmaSettings)
    criterion: CriterionSettings = field(default_factory=CriterionSettings)
