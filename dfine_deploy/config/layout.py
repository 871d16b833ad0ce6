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
from typing import Any

from dfine_deploy.config.tree import ConfigTree, KeyPath, dotted
from dfine_deploy.errors import ConfigError
from dfine_deploy.model.spec import BackboneSpec, DecoderSpec, EncoderSpec
from dfine_deploy.numbers import AT_LEAST_1, BELOW_1, FINITE, FRACTION, NON_NEGATIVE, POSITIVE, Range

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


@dataclasses.dataclass(frozen=True)
class _WeightsOf:
    """A mapping with free keys (loss and matcher weights) whose values obey `value`."""

    value: Range


ANY = _Any()
WEIGHTS = _WeightsOf(NON_NEGATIVE)

# Network knobs with a range (the rest are names, flags, or checked against each other in
# config/builders.py `_check_architecture`).
_ENCODER_RANGES = {
    "hidden_dim": AT_LEAST_1,
    "num_encoder_layers": NON_NEGATIVE,
    "nhead": AT_LEAST_1,
    "dim_feedforward": AT_LEAST_1,
    "dropout": BELOW_1,
    "pe_temperature": POSITIVE,
    "expansion": POSITIVE,
    "depth_mult": POSITIVE,
}
_DECODER_RANGES = {
    "hidden_dim": AT_LEAST_1,
    "num_levels": AT_LEAST_1,
    "num_layers": AT_LEAST_1,
    "num_points": AT_LEAST_1,
    "nhead": AT_LEAST_1,
    "dim_feedforward": AT_LEAST_1,
    "dropout": BELOW_1,
    "num_queries": AT_LEAST_1,
    "num_denoising": NON_NEGATIVE,
    "label_noise_ratio": FRACTION,
    "box_noise_scale": NON_NEGATIVE,
    "reg_max": AT_LEAST_1,
    "reg_scale": POSITIVE,
    "layer_scale": POSITIVE,
    "eval_idx": FINITE,
}

_TRANSFORMS = {
    "type": _Fixed("Compose"),
    "ops": ANY,  # entries checked in _transform_op
    "policy": {"name": ANY, "epoch": NON_NEGATIVE, "ops": ANY},
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
    "num_workers": NON_NEGATIVE,
    "drop_last": ANY,
    "total_batch_size": AT_LEAST_1,
    "pin_memory": ANY,
    "prefetch_factor": AT_LEAST_1,
    "persistent_workers": ANY,
    "cache": ANY,  # ours
    "validation": ANY,  # ours: {problem: error | fix | skip | keep}, see dfine_deploy/data/validation.py
    "collate_fn": {
        "type": _Fixed("BatchImageCollateFunction"),
        "base_size": AT_LEAST_1,
        "base_size_repeat": AT_LEAST_1,
        "stop_epoch": NON_NEGATIVE,
        "ema_restart_decay": FRACTION,
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
    "num_classes": AT_LEAST_1,
    "eval_spatial_size": AT_LEAST_1,  # multiples of 32: checked with the network
    "remap_mscoco_category": ANY,
    "use_focal_loss": _Fixed(True),
    "num_top_queries": AT_LEAST_1,
    # the network
    "HGNetv2": {
        **{f.name: ANY for f in dataclasses.fields(BackboneSpec) if f.name != "pretrained"},
        "pretrained": _Ignored("ImageNet weights are never downloaded; start from a checkpoint"),
        "local_model_dir": _Ignored("ImageNet weights are never downloaded"),
    },
    "HybridEncoder": {
        **{f.name: _ENCODER_RANGES.get(f.name, ANY) for f in dataclasses.fields(EncoderSpec)},
        "act": _Fixed("silu"),
    },
    "DFINETransformer": {
        # `variant` is ours (ECDet's decoder is built from ECDet files), not an official key
        **{
            f.name: _DECODER_RANGES.get(f.name, ANY)
            for f in dataclasses.fields(DecoderSpec)
            if f.name != "variant"
        },
        "learn_query_content": _Fixed(False),
        "eps": _Fixed(0.01),
        "aux_loss": _Fixed(True),
    },
    "DFINEPostProcessor": {"num_top_queries": AT_LEAST_1, "use_focal_loss": _Fixed(True)},
    "DFINECriterion": {
        "weight_dict": WEIGHTS,
        "losses": ANY,
        "alpha": FRACTION,
        "gamma": NON_NEGATIVE,
        "reg_max": AT_LEAST_1,
        "boxes_weight_format": _Fixed(None),
        "share_matched_indices": _Fixed(False),
        "matcher": {
            "type": _Fixed("HungarianMatcher"),
            "weight_dict": WEIGHTS,
            "alpha": FRACTION,
            "gamma": NON_NEGATIVE,
            "use_focal_loss": _Fixed(True),
        },
    },
    # training run
    "epochs": AT_LEAST_1,
    "epoches": AT_LEAST_1,  # RT-DETR's spelling
    "clip_max_norm": FINITE,  # <= 0 disables clipping
    "use_amp": ANY,
    "use_ema": ANY,
    "sync_bn": ANY,
    "find_unused_parameters": ANY,
    "checkpoint_freq": NON_NEGATIVE,
    "print_freq": NON_NEGATIVE,
    "eval_freq": NON_NEGATIVE,
    "accumulate": AT_LEAST_1,  # ours: gradient accumulation
    "output_dir": ANY,
    "summary_dir": ANY,
    "seed": FINITE,
    "scaler": {"type": _Fixed("GradScaler"), "enabled": _Fixed(True)},
    "ema": {"type": _Fixed("ModelEMA"), "decay": FRACTION, "warmups": NON_NEGATIVE, "start": NON_NEGATIVE},
    "optimizer": {
        "type": _Fixed("AdamW"),
        "lr": POSITIVE,
        "betas": BELOW_1,
        "weight_decay": NON_NEGATIVE,
        # a group's lr may be 0 (a frozen group); the run refuses when every group's is
        "params": _ListOf({"params": ANY, "lr": NON_NEGATIVE, "weight_decay": NON_NEGATIVE}),
    },
    "lr_scheduler": {
        "type": ANY,
        "milestones": NON_NEGATIVE,
        "gamma": POSITIVE,
        "flat_epochs": NON_NEGATIVE,
        "min_lr_ratio": FRACTION,
    },
    "lr_warmup_scheduler": {"type": _Fixed("LinearWarmup"), "warmup_duration": NON_NEGATIVE},
    "train_dataloader": _LOADER,
    "val_dataloader": _LOADER,
    # official run-time switches with no effect here
    "use_wandb": _NOT_LOGGED,
    "project_name": _NOT_LOGGED,
    "exp_name": _NOT_LOGGED,
    "print_method": _Ignored("logging always uses the standard library"),
    "print_rank": _Ignored("only rank 0 prints"),
}


def check_layout(node: Mapping, layout: Mapping, path: KeyPath, cfg: ConfigTree, ignored: list[str]) -> None:
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
        elif isinstance(rule, _WeightsOf) and value is not None:
            if not isinstance(value, Mapping):
                raise ConfigError(f"'{dotted(here)}' ({cfg.origin(here)}) must be a mapping; found {value!r}")
            for name, weight in value.items():
                _check_range(weight, rule.value, here + (str(name),), cfg)
        elif isinstance(rule, Range):
            _check_range(value, rule, here, cfg)


def _check_range(value: Any, rule: Range, path: KeyPath, cfg: ConfigTree) -> None:
    """A number, or each number of a list, outside `rule` is refused when the file loads (`epochs: -1`
    trained nothing, `lr: .nan` trained on NaN); other types are left to the reader, which names the
    type it expects."""
    numbers = value if isinstance(value, list) else [value]
    for number in numbers:
        if isinstance(number, (int, float)) and not isinstance(number, bool) and not rule.holds(number):
            each = "each entry of " if isinstance(value, list) else ""
            raise ConfigError(
                f"{each}'{dotted(path)}' ({cfg.origin(path)}) must be {rule.describe()}; found {value!r}"
            )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b
