"""Official-layout D-FINE YAML files → one merged dict → typed settings.

Reading follows the official rules (reference §4.1): `__include__` paths are relative to the file
that names them, includes merge in list order and the including file last, dicts merge deep while
lists and scalars are replaced, and `-u a.b=c` overrides come last with YAML-typed values. Unlike
the official loader there is no shared mutable default, no registry and no `yaml.load`.

Every key is checked against the layout the official files use. An unknown key is an error that
names the key, the file it came from (provenance is tracked through includes and overrides) and
the nearest valid key. Keys the official files carry but we do not act on (`pretrained`,
`local_model_dir`, `use_wandb`, ...) are accepted and listed as ignored.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import functools
import math
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dfine_deploy.errors import ConfigError, DfineError
from dfine_deploy.model.spec import (
    SIZES,
    BackboneSpec,
    DecoderSpec,
    EncoderSpec,
    ModelSpec,
)
from dfine_deploy.settings import (
    DATASET_TYPES,
    LR_SCHEDULER_TYPES,
    CollateSettings,
    CriterionSettings,
    DataSettings,
    EmaSettings,
    LrSchedulerSettings,
    MatcherSettings,
    OptimizerSettings,
    ParamGroupSettings,
    TrainSettings,
    TransformOp,
    TransformPolicy,
    TransformsSettings,
    WarmupSettings,
)

__all__ = ["OVERRIDE_ORIGIN", "Config", "format_config", "load_config", "parse_override"]

OVERRIDE_ORIGIN = "-u"  # provenance of values given on the command line
Path_ = tuple[str, ...]

# Output channels of HGNetv2 stages 0..3 (official arch_configs); strides are 4, 8, 16, 32.
BACKBONE_STAGE_CHANNELS = {
    "B0": (64, 256, 512, 1024),
    "B2": (96, 384, 768, 1536),
    "B4": (128, 512, 1024, 2048),
    "B5": (128, 512, 1024, 2048),
}
BACKBONE_STAGE_STRIDES = (4, 8, 16, 32)

# torchvision-v2 ops the official registry knows (src/data/transforms/__init__.py).
TRANSFORM_TYPES = (
    "RandomPhotometricDistort", "RandomZoomOut", "RandomIoUCrop", "SanitizeBoundingBoxes",
    "RandomHorizontalFlip", "Resize", "ConvertPILImage", "ConvertBoxes", "RandomCrop",
    "Normalize", "PadToSize", "EmptyTransform", "Mosaic",
)


# ------------------------------------------------------------------------------------ the layout


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
    "root": ANY,  # VOCDetection's image root
    "label_file": ANY,  # VOCDetection
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
        "type": ANY, "milestones": ANY, "gamma": ANY, "flat_epochs": ANY, "min_lr_ratio": ANY,
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


# --------------------------------------------------------------------------------------- loading


def _dotted(path: Path_) -> str:
    return ".".join(path)


def _read_yaml(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a YAML mapping (key: value lines) at the top, "
            f"found a {type(data).__name__}"
        )
    return data


def _merge(dst: dict, src: Mapping, origin_of, provenance: dict[str, str], prefix: Path_ = ()):
    """Deep-merge `src` into `dst` (dicts merge, everything else replaces), recording origins.

    `origin_of(dotted_key)` names where a key of `src` was set; `provenance` is `dst`'s record.
    """
    for key, value in src.items():
        key = str(key)
        path = prefix + (key,)
        dotted = _dotted(path)
        if isinstance(value, Mapping) and isinstance(dst.get(key), dict):
            provenance.setdefault(dotted, origin_of(dotted))
            _merge(dst[key], value, origin_of, provenance, path)
            continue
        if key in dst:  # a replaced subtree forgets where its old children came from
            for old in [k for k in provenance if k.startswith(dotted + ".")]:
                del provenance[old]
        dst[key] = {} if isinstance(value, Mapping) else copy.deepcopy(value)
        provenance[dotted] = origin_of(dotted)
        if isinstance(value, Mapping):
            _merge(dst[key], value, origin_of, provenance, path)


def _load_tree(path: Path, chain: tuple[Path, ...]) -> tuple[dict, dict[str, str]]:
    """Merged content of `path` and its includes (includes in order, the file itself last), with
    the file each key came from."""
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in chain + (resolved,))
        raise ConfigError(f"__include__ cycle: {cycle}")
    data = _read_yaml(path)
    includes = data.pop("__include__", None) or []
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"{path}: __include__ must be a list of file paths, found {includes!r}")
    merged: dict = {}
    provenance: dict[str, str] = {}
    for include in includes:
        target = Path(os.path.expanduser(include))
        if not target.is_absolute():
            target = path.parent / target
        target = Path(os.path.normpath(target))
        if not target.is_file():
            raise ConfigError(
                f"{path}: __include__ names '{include}', but {target} does not exist "
                "(include paths are relative to the file that names them)"
            )
        tree, origins = _load_tree(target, chain + (resolved,))
        _merge(merged, tree, lambda key, o=origins, t=str(target): o.get(key, t), provenance)
    _merge(merged, data, lambda _key: str(path), provenance)
    return merged, provenance


def parse_override(text: str) -> tuple[Path_, Any]:
    """`a.b.c=value` → (('a', 'b', 'c'), YAML-typed value); `x=[1, 2]` gives a list."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"override '{text}' is not of the form key.sub=value (e.g. -u epochs=12 "
            "or -u train_dataloader.total_batch_size=16)"
        )
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override '{text}': the value is not valid YAML: {exc}") from None
    return tuple(key.split(".")), parsed


def _apply_override(raw: dict, path: Path_, value: Any, provenance: dict[str, str], text: str):
    node = raw
    for depth, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = _dotted(path[: depth + 1])
            raise ConfigError(
                f"override '{text}': '{where}' holds a {type(child).__name__}, not a mapping, "
                "so it has no sub-keys"
            )
        provenance.setdefault(_dotted(path[: depth + 1]), f"{OVERRIDE_ORIGIN} {text}")
        node = child
    _merge(node, {path[-1]: value}, lambda _key: f"{OVERRIDE_ORIGIN} {text}", provenance, path[:-1])


def load_config(path: str | os.PathLike, overrides: Sequence[str] = ()) -> Config:
    """Load an official-layout YAML file with its includes and `-u` overrides, then check it."""
    path = Path(path)
    raw, provenance = _load_tree(path, ())
    for text in overrides:
        key_path, value = parse_override(text)
        _apply_override(raw, key_path, value, provenance, text)
    return Config(raw, source=str(path), provenance=provenance)


# ------------------------------------------------------------------------------------ validation



def _unknown_choice(cfg: "Config", key: Path_, what: str, value: str, choices: Sequence[str]) -> ConfigError:
    """The error for a name that is not one of `choices`: where it came from, and the nearest valid name."""
    near = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    return ConfigError(
        f"'{_dotted(key)}' ({cfg.origin(key)}): unknown {what} '{value}'; "
        f"expected one of {', '.join(choices)}{hint}"
    )

def _check_layout(node: Mapping, layout: Mapping, path: Path_, cfg: Config, ignored: list[str]):
    for key, value in node.items():
        key = str(key)
        here = path + (key,)
        if key not in layout:
            near = difflib.get_close_matches(key, list(layout), n=1, cutoff=0.6)
            hint = f"; did you mean '{_dotted(path + (near[0],))}'?" if near else (
                f"; valid keys here: {', '.join(sorted(layout))}"
            )
            raise ConfigError(f"unknown key '{_dotted(here)}' ({cfg.origin(here)}){hint}")
        rule = layout[key]
        if isinstance(rule, _Ignored):
            ignored.append(_dotted(here))
        elif isinstance(rule, _Fixed):
            if not _same(value, rule.value):
                raise ConfigError(
                    f"'{_dotted(here)}' ({cfg.origin(here)}) must be {rule.value!r}: it is the "
                    f"only choice dfine-deploy implements; found {value!r}. Remove the key or set "
                    f"it to {rule.value!r}."
                )
        elif isinstance(rule, dict):
            if value is None:
                continue
            if not isinstance(value, Mapping):
                raise ConfigError(
                    f"'{_dotted(here)}' ({cfg.origin(here)}) must be a mapping of "
                    f"{', '.join(sorted(rule))}; found {value!r}"
                )
            _check_layout(value, rule, here, cfg, ignored)
        elif isinstance(rule, _ListOf):
            if value is None:
                continue
            if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
                raise ConfigError(
                    f"'{_dotted(here)}' ({cfg.origin(here)}) must be a list of mappings; "
                    f"found {value!r}"
                )
            for index, item in enumerate(value):
                _check_layout(item, rule.item, here + (str(index),), cfg, ignored)
        elif rule == OPEN and value is not None and not isinstance(value, Mapping):
            raise ConfigError(
                f"'{_dotted(here)}' ({cfg.origin(here)}) must be a mapping; found {value!r}"
            )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b or a == b and type(a) is type(b)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


# --------------------------------------------------------------------------------- typed reading


class _Reader:
    """Typed access to the merged dict; every error names the key and where it was set."""

    def __init__(self, cfg: Config):
        self.cfg = cfg

    def node(self, *path: str) -> Any:
        node: Any = self.cfg.raw
        for part in path:
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, Mapping) and part in node:
                node = node[part]
            else:
                return None
        return node

    def has(self, *path: str) -> bool:
        return self.node(*path) is not None

    def _fail(self, path: Path_, expected: str, value: Any) -> ConfigError:
        return ConfigError(
            f"'{_dotted(path)}' ({self.cfg.origin(path)}) must be {expected}; found {value!r}"
        )

    def value(self, path: Path_, kind: str, default: Any = None):
        """Read a leaf as `kind`: bool, int, float, str, ints, floats, strs, or any (null: default)."""
        value = self.node(*path)
        if value is None:
            return default
        convert = _CONVERTERS[kind]
        try:
            return convert(value)
        except (TypeError, ValueError):
            raise self._fail(path, _EXPECTED[kind], value) from None


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise TypeError


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        raise TypeError
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise TypeError


def _to_float(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError
    return float(v)


def _to_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise TypeError


def _seq(convert):
    def inner(v: Any) -> tuple:
        if not isinstance(v, (list, tuple)):
            raise TypeError
        return tuple(convert(x) for x in v)

    return inner


_CONVERTERS = {
    "bool": _to_bool, "int": _to_int, "float": _to_float, "str": _to_str,
    "ints": _seq(_to_int), "floats": _seq(_to_float), "strs": _seq(_to_str), "any": lambda v: v,
}
_EXPECTED = {
    "bool": "true or false", "int": "an integer", "float": "a number", "str": "a string",
    "ints": "a list of integers", "floats": "a list of numbers", "strs": "a list of strings",
    "any": "a value",
}


# ------------------------------------------------------------------------------- typed settings


# Official constructor defaults where they differ from our dataclass defaults (used only when a
# file leaves the key out: the shipped files set them all).
_OFFICIAL_BACKBONE = BackboneSpec(freeze_at=0, freeze_norm=True)
_OFFICIAL_DECODER = DecoderSpec(feat_channels=(512, 1024, 2048), num_points=(4,))

_FIELD_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


def _spec_section(r: _Reader, section: str, base: Any) -> Any:
    """Fill a spec dataclass from `section:`; a field's type decides how the YAML value is read."""
    updates = {}
    for f in dataclasses.fields(base):
        current = getattr(base, f.name)
        if f.name == "pretrained" or not r.has(section, f.name):
            continue
        if isinstance(current, tuple):
            kind = "floats" if current and isinstance(current[0], float) else "ints"
        else:
            kind = _FIELD_KINDS[type(current)]
        if f.name == "num_points" and isinstance(r.node(section, f.name), int):
            kind = "int"  # official: one int means the same count on every level
        updates[f.name] = r.value((section, f.name), kind)
    return dataclasses.replace(base, **updates)


def build_model_spec(cfg: Config) -> ModelSpec:
    r = _Reader(cfg)
    if not r.has("HGNetv2", "name"):
        raise ConfigError(
            f"{cfg.source} does not describe a network: 'HGNetv2.name' is not set. Use a full "
            "model config such as configs/dfine/dfine_hgnetv2_n_coco.yml, or include "
            "configs/dfine/include/dfine_hgnetv2.yml and set HGNetv2.name."
        )
    backbone = _spec_section(r, "HGNetv2", _OFFICIAL_BACKBONE)
    encoder = _spec_section(r, "HybridEncoder", EncoderSpec())
    decoder = _spec_section(r, "DFINETransformer", _OFFICIAL_DECODER)
    if isinstance(decoder.num_points, int):
        decoder = dataclasses.replace(decoder, num_points=(decoder.num_points,) * decoder.num_levels)
    elif len(decoder.num_points) == 1 and decoder.num_levels > 1:
        decoder = dataclasses.replace(decoder, num_points=decoder.num_points * decoder.num_levels)

    num_classes = r.value(("num_classes",), "int", 80)
    if r.has("DFINETransformer", "num_classes"):  # the shared key may also sit in the section
        num_classes = r.value(("DFINETransformer", "num_classes"), "int")
    size = r.value(("eval_spatial_size",), "ints", (640, 640))
    top_k = r.value(("num_top_queries",), "int", 300)
    if r.has("DFINEPostProcessor", "num_top_queries"):
        top_k = r.value(("DFINEPostProcessor", "num_top_queries"), "int")

    _check_architecture(cfg, backbone, encoder, decoder)
    if num_classes < 1:
        raise ConfigError(f"'num_classes' ({cfg.origin(('num_classes',))}) must be >= 1")
    if len(size) != 2 or any(s <= 0 or s % 32 for s in size):
        raise ConfigError(
            f"'eval_spatial_size' ({cfg.origin(('eval_spatial_size',))}) must be [height, width], "
            f"both positive multiples of 32; found {list(size)}"
        )
    spec = ModelSpec(
        backbone=backbone, encoder=encoder, decoder=decoder, num_classes=num_classes,
        eval_spatial_size=(size[0], size[1]), num_top_queries=top_k,
    )
    return dataclasses.replace(spec, size=official_size_of(spec))


def official_size_of(spec: ModelSpec) -> str | None:
    """'n'..'x' when the architecture is an official size (classes, input size, freezing aside)."""
    def arch(s: ModelSpec):
        b = s.backbone
        return (b.name, b.return_idx, b.use_lab), s.encoder, s.decoder

    for name, official in SIZES.items():
        if arch(official) == arch(spec):
            return name
    return None


def _check_architecture(cfg, backbone: BackboneSpec, encoder: EncoderSpec, decoder: DecoderSpec):
    def fail(key: Path_, message: str):
        raise ConfigError(f"'{_dotted(key)}' ({cfg.origin(key)}): {message}")

    if backbone.name not in BACKBONE_STAGE_CHANNELS:
        raise _unknown_choice(cfg, ("HGNetv2", "name"), "backbone", backbone.name, list(BACKBONE_STAGE_CHANNELS))
    if not all(0 <= i <= 3 for i in backbone.return_idx):
        fail(("HGNetv2", "return_idx"), f"stage indices are 0..3; found {list(backbone.return_idx)}")
    channels = tuple(BACKBONE_STAGE_CHANNELS[backbone.name][i] for i in backbone.return_idx)
    strides = tuple(BACKBONE_STAGE_STRIDES[i] for i in backbone.return_idx)
    if encoder.in_channels != channels:
        fail(("HybridEncoder", "in_channels"),
             f"{backbone.name} stages {list(backbone.return_idx)} give {list(channels)} channels; "
             f"found {list(encoder.in_channels)}")
    if encoder.feat_strides != strides:
        fail(("HybridEncoder", "feat_strides"),
             f"{backbone.name} stages {list(backbone.return_idx)} have strides {list(strides)}; "
             f"found {list(encoder.feat_strides)}")
    if not all(0 <= i < len(channels) for i in encoder.use_encoder_idx):
        fail(("HybridEncoder", "use_encoder_idx"),
             f"indices must be below {len(channels)} (one per feature level)")
    for section, spec in (("HybridEncoder", encoder), ("DFINETransformer", decoder)):
        if spec.hidden_dim % spec.nhead:
            fail((section, "hidden_dim"), f"{spec.hidden_dim} is not divisible by nhead={spec.nhead}")
    if len(decoder.feat_channels) != len(channels):
        fail(("DFINETransformer", "feat_channels"),
             f"needs one entry per encoder output ({len(channels)}); found {list(decoder.feat_channels)}")
    if decoder.feat_strides != strides:
        fail(("DFINETransformer", "feat_strides"),
             f"must equal the encoder's strides {list(strides)}; found {list(decoder.feat_strides)}")
    if decoder.num_levels < len(channels):
        fail(("DFINETransformer", "num_levels"),
             f"must be at least the number of feature levels ({len(channels)})")
    if len(decoder.num_points) != decoder.num_levels:
        fail(("DFINETransformer", "num_points"),
             f"needs one entry per level ({decoder.num_levels}); found {list(decoder.num_points)}")
    if not -decoder.num_layers <= decoder.eval_idx < decoder.num_layers:
        fail(("DFINETransformer", "eval_idx"), f"must index one of {decoder.num_layers} layers")


def _transform_op(r: _Reader, path: Path_, entry: Any) -> TransformOp:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("type"), str):
        raise r._fail(path, "a mapping with a 'type' (e.g. {type: Resize, size: [640, 640]})", entry)
    name = entry["type"]
    if name not in TRANSFORM_TYPES:
        raise _unknown_choice(r.cfg, path + ("type",), "transform", name, TRANSFORM_TYPES)
    return TransformOp(type=name, kwargs={k: v for k, v in entry.items() if k != "type"})


def _validation_policy(r: _Reader, key: Path_) -> tuple[tuple[str, str], ...]:
    """`validation: {problem: action}` -> sorted pairs, checked now so a typo names its file."""
    from dfine_deploy.data.validation import ValidationPolicy

    node = r.node(*key) or {}
    if not isinstance(node, Mapping):
        raise r._fail(key, "a mapping {problem: error | fix | skip | keep}", node)
    try:
        ValidationPolicy.from_mapping(node)
    except DfineError as exc:
        raise ConfigError(f"'{_dotted(key)}' ({r.cfg.origin(key)}): {exc}") from None
    return tuple(sorted((str(k), str(v)) for k, v in node.items()))


def build_data_settings(cfg: Config, which: str) -> DataSettings:
    """`which` is 'train_dataloader' or 'val_dataloader'."""
    r = _Reader(cfg)
    ds = (which, "dataset")
    tf = ds + ("transforms",)
    dataset_type = r.value(ds + ("type",), "str", "CocoDetection")
    if dataset_type not in DATASET_TYPES:
        raise _unknown_choice(cfg, ds + ("type",), "dataset type", dataset_type, DATASET_TYPES)
    ops_raw = r.node(*tf, "ops") or []
    if not isinstance(ops_raw, list):
        raise r._fail(tf + ("ops",), "a list of transforms", ops_raw)
    ops = tuple(_transform_op(r, tf + ("ops", str(i)), e) for i, e in enumerate(ops_raw))
    policy = TransformPolicy(
        name=r.value(tf + ("policy", "name"), "str"),
        epoch=r.value(tf + ("policy", "epoch"), "int"),
        ops=r.value(tf + ("policy", "ops"), "strs", ()),
    )
    coll = (which, "collate_fn")
    cache = r.node(which, "cache")
    cache = "off" if cache in (None, False) else cache
    if not isinstance(cache, str) or not cache:
        raise r._fail((which, "cache"), "'off', 'ram' or a folder path", cache)
    validation = _validation_policy(r, (which, "validation"))
    names = r.value(ds + ("class_names",), "strs")
    default_shuffle = which == "train_dataloader"
    settings = DataSettings(
        dataset_type=dataset_type,
        img_folder=r.value(ds + ("img_folder",), "str") or r.value(ds + ("root",), "str"),
        ann_file=r.value(ds + ("ann_file",), "str"),
        label_file=r.value(ds + ("label_file",), "str"),
        class_names=names,
        num_classes=r.value(("num_classes",), "int", 80),
        remap_mscoco_category=r.value(("remap_mscoco_category",), "bool", False),
        transforms=TransformsSettings(ops=ops, policy=policy),
        total_batch_size=r.value((which, "total_batch_size"), "int", 32),
        num_workers=r.value((which, "num_workers"), "int", 4),
        shuffle=r.value((which, "shuffle"), "bool", default_shuffle),
        drop_last=r.value((which, "drop_last"), "bool", default_shuffle),
        pin_memory=r.value((which, "pin_memory"), "bool", False),
        prefetch_factor=r.value((which, "prefetch_factor"), "int"),
        persistent_workers=r.value((which, "persistent_workers"), "bool", False),
        collate=CollateSettings(
            base_size=r.value(coll + ("base_size",), "int", 640),
            base_size_repeat=r.value(coll + ("base_size_repeat",), "int"),
            stop_epoch=r.value(coll + ("stop_epoch",), "int"),
            ema_restart_decay=r.value(coll + ("ema_restart_decay",), "float", 0.9999),
        ),
        cache=cache,
        validation=validation,
    )
    for key in ("total_batch_size", "num_workers"):
        minimum = 1 if key == "total_batch_size" else 0
        if getattr(settings, key) < minimum:
            raise r._fail((which, key), f"an integer >= {minimum}", getattr(settings, key))
    return settings


def build_train_settings(cfg: Config) -> TrainSettings:
    r = _Reader(cfg)
    if r.has("epochs") and r.has("epoches") and r.node("epochs") != r.node("epoches"):
        raise ConfigError(
            f"both 'epochs' ({cfg.origin(('epochs',))}) and 'epoches' ({cfg.origin(('epoches',))}) "
            "are set, to different values; keep only 'epochs'"
        )
    epochs_key = ("epochs",) if r.has("epochs") else ("epoches",)

    groups = []
    for i, group in enumerate(r.node("optimizer", "params") or []):
        at = ("optimizer", "params", str(i))
        if "params" not in group:
            raise r._fail(at, "a mapping with a 'params' regex", group)
        groups.append(ParamGroupSettings(
            pattern=r.value(at + ("params",), "str"),
            lr=r.value(at + ("lr",), "float"),
            weight_decay=r.value(at + ("weight_decay",), "float"),
        ))
    betas = r.value(("optimizer", "betas"), "floats", (0.9, 0.999))
    if len(betas) != 2:
        raise r._fail(("optimizer", "betas"), "two numbers [beta1, beta2]", list(betas))

    sched_type = r.value(("lr_scheduler", "type"), "str", "MultiStepLR")
    if sched_type not in LR_SCHEDULER_TYPES:
        raise _unknown_choice(cfg, ("lr_scheduler", "type"), "scheduler", sched_type, LR_SCHEDULER_TYPES)

    crit = ("DFINECriterion",)
    matcher = crit + ("matcher",)
    default_crit, default_matcher = CriterionSettings(), MatcherSettings()
    policy_epoch = r.value(("train_dataloader", "dataset", "transforms", "policy", "epoch"), "int")
    collate_stop = r.value(("train_dataloader", "collate_fn", "stop_epoch"), "int")
    return TrainSettings(
        epochs=r.value(epochs_key, "int", 72),
        stop_epoch=policy_epoch if policy_epoch is not None else collate_stop,
        clip_max_norm=r.value(("clip_max_norm",), "float", 0.1),
        use_amp=r.value(("use_amp",), "bool", False),
        use_ema=r.value(("use_ema",), "bool", False),
        sync_bn=r.value(("sync_bn",), "bool", True),
        find_unused_parameters=r.value(("find_unused_parameters",), "bool", False),
        checkpoint_freq=r.value(("checkpoint_freq",), "int", 12),
        print_freq=r.value(("print_freq",), "int", 100),
        output_dir=r.value(("output_dir",), "str", "./logs"),
        summary_dir=r.value(("summary_dir",), "str"),
        seed=r.value(("seed",), "int"),
        ema_restart_decay=r.value(
            ("train_dataloader", "collate_fn", "ema_restart_decay"), "float", 0.9999),
        optimizer=OptimizerSettings(
            lr=r.value(("optimizer", "lr"), "float", 2.5e-4),
            betas=(betas[0], betas[1]),
            weight_decay=r.value(("optimizer", "weight_decay"), "float", 1.25e-4),
            params=tuple(groups),
        ),
        lr_scheduler=LrSchedulerSettings(
            type=sched_type,
            milestones=r.value(("lr_scheduler", "milestones"), "ints", (500,)),
            gamma=r.value(("lr_scheduler", "gamma"), "float", 0.1),
            flat_epochs=r.value(("lr_scheduler", "flat_epochs"), "int", 0),
            min_lr_ratio=r.value(("lr_scheduler", "min_lr_ratio"), "float", 0.05),
        ),
        lr_warmup_scheduler=WarmupSettings(
            warmup_duration=r.value(("lr_warmup_scheduler", "warmup_duration"), "int", 500),
        ),
        ema=EmaSettings(
            decay=r.value(("ema", "decay"), "float", 0.9999),
            warmups=r.value(("ema", "warmups"), "int", 1000),
            start=r.value(("ema", "start"), "int", 0),
        ),
        criterion=CriterionSettings(
            weight_dict=_weights(r, crit + ("weight_dict",), default_crit.weight_dict),
            losses=r.value(crit + ("losses",), "strs", default_crit.losses),
            alpha=r.value(crit + ("alpha",), "float", default_crit.alpha),
            gamma=r.value(crit + ("gamma",), "float", default_crit.gamma),
            reg_max=r.value(crit + ("reg_max",), "int", default_crit.reg_max),
            matcher=MatcherSettings(
                weight_dict=_weights(r, matcher + ("weight_dict",), default_matcher.weight_dict),
                alpha=r.value(matcher + ("alpha",), "float", default_matcher.alpha),
                gamma=r.value(matcher + ("gamma",), "float", default_matcher.gamma),
            ),
        ),
    )


def _weights(r: _Reader, path: Path_, default: dict[str, float]) -> dict[str, float]:
    node = r.node(*path)
    if node is None:
        return dict(default)
    return {str(k): r.value(path + (str(k),), "float") for k in node}


# ---------------------------------------------------------------------------------------- Config


class Config:
    """A merged, checked config: `raw` dict, where each key came from, and typed settings."""

    def __init__(self, raw: dict, *, source: str, provenance: Mapping[str, str] | None = None):
        self.raw = raw
        self.source = source
        self.provenance = dict(provenance) if provenance is not None else {
            key: source for key in _all_paths(raw)
        }
        ignored: list[str] = []
        _check_layout(raw, LAYOUT, (), self, ignored)
        self.ignored: tuple[str, ...] = tuple(ignored)
        # Build the typed settings now so that a wrong value fails at load time, not mid-training.
        for name in ("train", "train_data", "val_data"):
            getattr(self, name)
        if self.describes_model:
            _ = self.model_spec

    def origin(self, path: Sequence[str]) -> str:
        """'from <file>' / 'from -u a.b=c' for a dotted key (or its nearest set ancestor)."""
        path = tuple(path)
        while path:
            origin = self.provenance.get(_dotted(path))
            if origin:
                return f"from {origin}"
            path = path[:-1]
        return f"from {self.source}"

    @property
    def describes_model(self) -> bool:
        return isinstance(self.raw.get("HGNetv2"), Mapping) and "name" in self.raw["HGNetv2"]

    @functools.cached_property
    def model_spec(self) -> ModelSpec:
        return build_model_spec(self)

    @functools.cached_property
    def train(self) -> TrainSettings:
        return build_train_settings(self)

    @functools.cached_property
    def train_data(self) -> DataSettings:
        return build_data_settings(self, "train_dataloader")

    @functools.cached_property
    def val_data(self) -> DataSettings:
        return build_data_settings(self, "val_dataloader")

    def to_dict(self) -> dict:
        """The merged config as plain YAML-safe data (what checkpoints store as meta['config'])."""
        return copy.deepcopy(self.raw)

    @classmethod
    def from_dict(cls, data: Mapping, *, source: str = "<checkpoint>") -> Config:
        """Rebuild from `to_dict()` output (e.g. a checkpoint's meta['config']), checking it again."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: a stored config must be a mapping, found {type(data).__name__}")
        return cls(copy.deepcopy(dict(data)), source=source)

    def __repr__(self) -> str:
        return f"Config(source={self.source!r})"


def _all_paths(node: Mapping, prefix: Path_ = ()) -> Iterator[str]:
    for key, value in node.items():
        path = prefix + (str(key),)
        yield _dotted(path)
        if isinstance(value, Mapping):
            yield from _all_paths(value, path)


def format_config(cfg: Config, *, provenance: bool = True) -> str:
    """The merged config as YAML, each leaf annotated with the file (or -u) that set it."""
    lines = [f"# merged config of {cfg.source}"]

    def emit(node: Mapping, path: Path_, indent: int):
        for key, value in node.items():
            here = path + (str(key),)
            note = f"  # {cfg.provenance.get(_dotted(here), '')}" if provenance else ""
            if _dotted(here) in cfg.ignored:
                note += "  (ignored)"
            pad = "  " * indent
            if isinstance(value, Mapping) and value:
                lines.append(f"{pad}{key}:")
                emit(value, here, indent + 1)
            elif isinstance(value, list) and value and all(isinstance(v, Mapping) for v in value):
                lines.append(f"{pad}{key}:{note}")
                for item in value:
                    flow = yaml.safe_dump(item, default_flow_style=True, sort_keys=False, width=10**6).strip()
                    lines.append(f"{pad}  - {flow}")
            else:
                flow = yaml.safe_dump(value, default_flow_style=True, sort_keys=False, width=10**6).strip()
                flow = flow.removesuffix("\n...").removesuffix("...").strip()
                lines.append(f"{pad}{key}: {flow}{note}")

    emit(cfg.raw, (), 0)
    if cfg.ignored:
        lines.append("# accepted but ignored: " + ", ".join(cfg.ignored))
    return "\n".join(lines)
