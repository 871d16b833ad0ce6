"""The D-FINE config layout: every key the official files use, and what we do with it.

Every key is checked against this layout. An unknown key is an error that names the key, the file
it came from and the nearest valid key. Keys the official files carry but we do not act on
(`pretrained`, `local_model_dir`, `use_wandb`, ...) are accepted and listed as ignored; keys with
one implementation here (`model: DFINE`, `act: silu`, ...) must keep that value.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dfine_deploy.config.tree import KeyPath, dotted
from dfine_deploy.errors import ConfigError
from dfine_deploy.model.spec import BackboneSpec, DecoderSpec, EncoderSpec

if TYPE_CHECKING:
    from dfine_deploy.config.core import Config

# torchvision-v2 ops the official registry knows (src/data/transforms/__init__.py).
TRANSFORM_TYPES = (
    "RandomPhotometricDistort",
    "RandomZoomOut",
    "RandomIoUCrop",
    "SanitizeBoundingBoxes",
    "RandomHorizontalFlip",
    "Resize",
    "ConvertPILImage",
    "ConvertBoxes",
    "RandomCrop",
    "Normalize",
    "PadToSize",
    "EmptyTransform",
    "Mosaic",
)


class _Any:
    """A leaf whose value is typed later, when the settings are built."""


@dataclasses.dataclass(frozen=True)
class _Fixed:
    """A key official files carry whose value we cannot change (one implementation only)."""

    value: Any


@dataclasses.dataclass(frozen=True)
class _Ignored:
    """A key official files carry that has no effect here; `why` is shown in the printed config."""

    why: str


@dataclasses.dataclass(frozen=True)
class _ListOf:
    """A list whose entries are mappings with the given layout."""

    item: dict


ANY = _Any()
OPEN = "open mapping"  # a mapping with free keys (loss weights)

_TRANSFORMS = {
    "type": _Fixed("Compose"),
    "ops": ANY,  # entries checked in _transform_op
    "policy": {"name": ANY, "epoch": ANY, "ops": ANY},
}
_DATASET = {
    "type": ANY,
    "img_folder": ANY,
    "ann_file": ANY,
    "root": ANY,  # read as img_folder (VOCDetection's name for it)
    "label_file": ANY,  # VOCDetection's; the type itself is refused with the fix when settings build
    "class_names": ANY,  # ours
    "return_masks": _Fixed(False),
    "transforms": _TRANSFORMS,
}
_LOADER = {
    "type": _Fixed("DataLoader"),
    "dataset": _DATASET,
    "shuffle": ANY,
    "num_workers": ANY,
    "drop_last": ANY,
    "total_batch_size": ANY,
    "pin_memory": ANY,
    "prefetch_factor": ANY,
    "persistent_workers": ANY,
    "cache": ANY,  # ours
    "validation": ANY,  # ours: {problem: error | fix | skip | keep}, see dfine_deploy/data/validation.py
    "collate_fn": {
        "type": _Fixed("BatchImageCollateFunction"),
        "base_size": ANY,
        "base_size_repeat": ANY,
        "stop_epoch": ANY,
        "ema_restart_decay": ANY,
    },
}
_NOT_LOGGED = _Ignored("experiment trackers are not wired in; tensorboard goes to summary_dir")

LAYOUT: dict[str, Any] = {
    # what to build (one implementation each)
    "task": _Fixed("detection"),
    "model": _Fixed("DFINE"),
    "criterion": _Fixed("DFINECriterion"),
    "postprocessor": _Fixed("DFINEPostProcessor"),
    "evaluator": {"type": _Fixed("CocoEvaluator"), "iou_types": _Fixed(["bbox"])},
    "DFINE": {
        "backbone": _Fixed("HGNetv2"),
        "encoder": _Fixed("HybridEncoder"),
        "decoder": _Fixed("DFINETransformer"),
    },
    # keys shared by several components (official __share__)
    "num_classes": ANY,
    "eval_spatial_size": ANY,
    "remap_mscoco_category": ANY,
    "use_focal_loss": _Fixed(True),
    "num_top_queries": ANY,
    # the network
    "HGNetv2": {
        **{f.name: ANY for f in dataclasses.fields(BackboneSpec) if f.name != "pretrained"},
        "pretrained": _Ignored("ImageNet weights are never downloaded; start from a checkpoint"),
        "local_model_dir": _Ignored("ImageNet weights are never downloaded"),
    },
    "HybridEncoder": {
        **{f.name: ANY for f in dataclasses.fields(EncoderSpec)},
        "act": _Fixed("silu"),
    },
    "DFINETransformer": {
        **{f.name: ANY for f in dataclasses.fields(DecoderSpec)},
        "learn_query_content": _Fixed(False),
        "eps": _Fixed(0.01),
        "aux_loss": _Fixed(True),
    },
    "DFINEPostProcessor": {"num_top_queries": ANY, "use_focal_loss": _Fixed(True)},
    "DFINECriterion": {
        "weight_dict": OPEN,
        "losses": ANY,
        "alpha": ANY,
        "gamma": ANY,
        "reg_max": ANY,
        "boxes_weight_format": _Fixed(None),
        "share_matched_indices": _Fixed(False),
        "matcher": {
            "type": _Fixed("HungarianMatcher"),
            "weight_dict": OPEN,
            "alpha": ANY,
            "gamma": ANY,
            "use_focal_loss": _Fixed(True),
        },
    },
    # training run
    "epochs": ANY,
    "epoches": ANY,  # RT-DETR's spelling
    "clip_max_norm": ANY,
    "use_amp": ANY,
    "use_ema": ANY,
    "sync_bn": ANY,
    "find_unused_parameters": ANY,
    "checkpoint_freq": ANY,
    "print_freq": ANY,
    "accumulate": ANY,  # ours: gradient accumulation
    "output_dir": ANY,
    "summary_dir": ANY,
    "seed": ANY,
    "scaler": {"type": _Fixed("GradScaler"), "enabled": _Fixed(True)},
    "ema": {"type": _Fixed("ModelEMA"), "decay": ANY, "warmups": ANY, "start": ANY},
    "optimizer": {
        "type": _Fixed("AdamW"),
        "lr": ANY,
        "betas": ANY,
        "weight_decay": ANY,
        "params": _ListOf({"params": ANY, "lr": ANY, "weight_decay": ANY}),
    },
    "lr_scheduler": {
        "type": ANY,
        "milestones": ANY,
        "gamma": ANY,
        "flat_epochs": ANY,
        "min_lr_ratio": ANY,
    },
    "lr_warmup_scheduler": {"type": _Fixed("LinearWarmup"), "warmup_duration": ANY},
    "train_dataloader": _LOADER,
    "val_dataloader": _LOADER,
    # official run-time switches with no effect here
    "use_wandb": _NOT_LOGGED,
    "project_name": _NOT_LOGGED,
    "exp_name": _NOT_LOGGED,
    "print_method": _Ignored("logging always uses the standard library"),
    "print_rank": _Ignored("only rank 0 prints"),
}


def check_layout(node: Mapping, layout: Mapping, path: KeyPath, cfg: Config, ignored: list[str]) -> None:
    """Check `node` against `layout` (recursively), appending the dotted keys it ignores to `ignored`."""
    for key, value in node.items():
        key = str(key)
        here = path + (key,)
        if key not in layout:
            near = difflib.get_close_matches(key, list(layout), n=1, cutoff=0.6)
            hint = (
                f"; did you mean '{dotted(path + (near[0],))}'?"
                if near
                else (f"; valid keys here: {', '.join(sorted(layout))}")
            )
            raise ConfigError(f"unknown key '{dotted(here)}' ({cfg.origin(here)}){hint}")
        rule = layout[key]
        if isinstance(rule, _Ignored):
            ignored.append(dotted(here))
        elif isinstance(rule, _Fixed):
            if not _same(value, rule.value):
                raise ConfigError(
                    f"'{dotted(here)}' ({cfg.origin(here)}) must be {rule.value!r}: it is the "
                    f"only choice dfine-deploy implements; found {value!r}. Remove the key or set "
                    f"it to {rule.value!r}."
                )
        elif isinstance(rule, dict):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"'{dotted(here)}' ({cfg.origin(here)}) must be a mapping of "
                    f"{', '.join(sorted(rule))}; found {value!r}"
                )
            check_layout(value, rule, here, cfg, ignored)
        elif isinstance(rule, _ListOf):
            if value is None:
                continue
            if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
                raise ConfigError(
                    f"'{dotted(here)}' ({cfg.origin(here)}) must be a list of mappings; found {value!r}"
                )
            for index, item in enumerate(value):
                check_layout(item, rule.item, here + (str(index),), cfg, ignored)
        elif rule == OPEN and value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"'{dotted(here)}' ({cfg.origin(here)}) must be a mapping; found {value!r}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b
