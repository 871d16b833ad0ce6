"""The D-FINE builders: a checked config → ModelSpec, DataSettings, TrainSettings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dfine_deploy.config.layout import TRANSFORM_TYPES
from dfine_deploy.config.reader import Reader, unknown_choice
from dfine_deploy.config.tree import ConfigTree, KeyPath, dotted
from dfine_deploy.errors import ConfigError, DfineError
from dfine_deploy.files import user_path
from dfine_deploy.model.spec import (
    HGNETV2_VARIANTS,
    SIZES,
    BackboneSpec,
    DecoderSpec,
    EncoderSpec,
    ModelSpec,
)
from dfine_deploy.numbers import AT_LEAST_1, FINITE, FRACTION
from dfine_deploy.settings import (
    DATASET_TYPES,
    KNOWN_LOSS_WEIGHTS,
    KNOWN_LOSSES,
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

# Official constructor defaults where they differ from our dataclass defaults (used only when a
# file leaves the key out: the shipped files set them all).
_OFFICIAL_BACKBONE = BackboneSpec(freeze_at=0, freeze_norm=True)
_OFFICIAL_DECODER = DecoderSpec(feat_channels=(512, 1024, 2048), num_points=(4,))

_FIELD_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


def _spec_section(r: Reader, section: str, base: Any) -> Any:
    """Fill a spec dataclass from `section:`; a field's type decides how the YAML value is read."""
    updates = {}
    for f in dataclasses.fields(base):
        current = getattr(base, f.name)
        if f.name in ("pretrained", "variant") or not r.has(section, f.name):
            continue
        if isinstance(current, tuple):
            kind = "floats" if current and isinstance(current[0], float) else "ints"
        else:
            kind = _FIELD_KINDS[type(current)]
        if f.name == "num_points" and isinstance(r.node(section, f.name), int):
            kind = "int"  # official: one int means the same count on every level
        updates[f.name] = r.value((section, f.name), kind)
    return dataclasses.replace(base, **updates)


def build_model_spec(cfg: ConfigTree) -> ModelSpec:
    r = Reader(cfg)
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
        backbone=backbone,
        encoder=encoder,
        decoder=decoder,
        num_classes=num_classes,
        eval_spatial_size=(size[0], size[1]),
        num_top_queries=top_k,
    )
    return dataclasses.replace(spec, size=official_size_of(spec))


# Decoder knobs that change neither the weights nor what they mean: query and denoising counts.
_QUERY_KNOBS = ("num_queries", "num_denoising", "label_noise_ratio", "box_noise_scale")


def official_size_of(spec: ModelSpec) -> str | None:
    """'n'..'x' when the weights are an official size's (classes, input size, freezing and the query
    and denoising counts aside: a checkpoint of the size loads into the model either way)."""

    def arch(s: ModelSpec) -> tuple:
        b = s.backbone
        decoder = dataclasses.replace(s.decoder, **{k: getattr(DecoderSpec(), k) for k in _QUERY_KNOBS})
        return (b.name, b.return_idx, b.use_lab), s.encoder, decoder

    for name, official in SIZES.items():
        if arch(official) == arch(spec):
            return name
    return None


def _check_architecture(cfg, backbone: BackboneSpec, encoder: EncoderSpec, decoder: DecoderSpec):
    def fail(key: KeyPath, message: str):
        raise ConfigError(f"'{dotted(key)}' ({cfg.origin(key)}): {message}")

    if backbone.name not in HGNETV2_VARIANTS:
        choices = list(HGNETV2_VARIANTS)
        raise unknown_choice(cfg, ("HGNetv2", "name"), "backbone", backbone.name, choices)
    if not all(0 <= i <= 3 for i in backbone.return_idx):
        fail(("HGNetv2", "return_idx"), f"stage indices are 0..3; found {list(backbone.return_idx)}")
    feature_info = HGNETV2_VARIANTS[backbone.name].feature_info(backbone.return_idx)
    channels = tuple(c for c, _ in feature_info)
    strides = tuple(s for _, s in feature_info)
    if encoder.in_channels != channels:
        fail(
            ("HybridEncoder", "in_channels"),
            f"{backbone.name} stages {list(backbone.return_idx)} give {list(channels)} channels; "
            f"found {list(encoder.in_channels)}",
        )
    if encoder.feat_strides != strides:
        fail(
            ("HybridEncoder", "feat_strides"),
            f"{backbone.name} stages {list(backbone.return_idx)} have strides {list(strides)}; "
            f"found {list(encoder.feat_strides)}",
        )
    if not all(0 <= i < len(channels) for i in encoder.use_encoder_idx):
        fail(
            ("HybridEncoder", "use_encoder_idx"),
            f"indices must be below {len(channels)} (one per feature level)",
        )
    for section, spec in (("HybridEncoder", encoder), ("DFINETransformer", decoder)):
        if spec.hidden_dim % spec.nhead:
            fail((section, "hidden_dim"), f"{spec.hidden_dim} is not divisible by nhead={spec.nhead}")
    if len(decoder.feat_channels) != len(channels):
        fail(
            ("DFINETransformer", "feat_channels"),
            f"needs one entry per encoder output ({len(channels)}); found {list(decoder.feat_channels)}",
        )
    if decoder.feat_strides != strides:
        fail(
            ("DFINETransformer", "feat_strides"),
            f"must equal the encoder's strides {list(strides)}; found {list(decoder.feat_strides)}",
        )
    if decoder.num_levels < len(channels):
        fail(
            ("DFINETransformer", "num_levels"),
            f"must be at least the number of feature levels ({len(channels)})",
        )
    if len(decoder.num_points) != decoder.num_levels:
        fail(
            ("DFINETransformer", "num_points"),
            f"needs one entry per level ({decoder.num_levels}); found {list(decoder.num_points)}",
        )
    if not -decoder.num_layers <= decoder.eval_idx < decoder.num_layers:
        fail(("DFINETransformer", "eval_idx"), f"must index one of {decoder.num_layers} layers")


def _transform_op(r: Reader, path: KeyPath, entry: Any) -> TransformOp:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("type"), str):
        raise r.fail(path, "a mapping with a 'type' (e.g. {type: Resize, size: [640, 640]})", entry)
    name = entry["type"]
    if name not in TRANSFORM_TYPES:
        raise unknown_choice(r.cfg, path + ("type",), "transform", name, TRANSFORM_TYPES)
    kwargs = {k: v for k, v in entry.items() if k != "type"}
    for key, value in kwargs.items():  # no op takes NaN or infinity; `size` and `p` mean one thing in all
        rule = _OP_ARGUMENT_RANGES.get(key, FINITE)
        if any(not rule.holds(v) for v in _numbers_in(value)):
            raise r.fail(path + (key,), f"{rule.describe()} (each of them)", value)
    return TransformOp(type=name, kwargs=kwargs)


# Transform arguments with the same meaning in every op: an output size in pixels, a probability.
# (Resize [0, 0] was accepted and failed in a loader worker.)
_OP_ARGUMENT_RANGES = {"size": AT_LEAST_1, "p": FRACTION}


def _numbers_in(value: Any) -> list[float]:
    """The numbers in a transform argument (a number, or lists of them: sizes, ranges, fill values)."""
    if isinstance(value, (list, tuple)):
        return [n for item in value for n in _numbers_in(item)]
    return [value] if isinstance(value, (int, float)) and not isinstance(value, bool) else []


def _validation_policy(r: Reader, key: KeyPath) -> tuple[tuple[str, str], ...]:
    """`validation: {problem: action}` -> sorted pairs, checked now so a typo names its file."""
    from dfine_deploy.data.validation import ValidationPolicy

    node = r.node(*key) or {}
    if not isinstance(node, Mapping):
        raise r.fail(key, "a mapping {problem: error | fix | skip | keep}", node)
    try:
        ValidationPolicy.from_mapping(node)
    except DfineError as exc:
        raise ConfigError(f"'{dotted(key)}' ({r.cfg.origin(key)}): {exc}") from None
    return tuple(sorted((str(k), str(v)) for k, v in node.items()))


_COLLATE_KEYS = ("base_size", "base_size_repeat", "stop_epoch", "ema_restart_decay")


def build_data_settings(cfg: ConfigTree, which: str) -> DataSettings:
    """`which` is 'train_dataloader' or 'val_dataloader'."""
    r = Reader(cfg)
    ds = (which, "dataset")
    tf = ds + ("transforms",)
    dataset_type = r.value(ds + ("type",), "str", DataSettings.dataset_type)
    if dataset_type not in DATASET_TYPES:
        raise unknown_choice(cfg, ds + ("type",), "dataset type", dataset_type, DATASET_TYPES)
    ops_raw = r.node(*tf, "ops") or []
    if not isinstance(ops_raw, list):
        raise r.fail(tf + ("ops",), "a list of transforms", ops_raw)
    ops = tuple(_transform_op(r, tf + ("ops", str(i)), e) for i, e in enumerate(ops_raw))
    policy_keys = {f: tf + ("policy", f) for f in ("name", "epoch", "ops")}
    policy = TransformPolicy(**r.fields(TransformPolicy, policy_keys))
    coll = (which, "collate_fn")
    cache = r.node(which, "cache")
    cache = "off" if cache in (None, False) else cache
    if not isinstance(cache, str) or not cache:
        raise r.fail((which, "cache"), "'off', 'ram' or a folder path", cache)
    cache = cache if cache in ("off", "ram") else _path_field(cache)
    validation = _validation_policy(r, (which, "validation"))
    loader_keys = (
        "total_batch_size",
        "num_workers",
        "shuffle",
        "drop_last",
        "pin_memory",
        "prefetch_factor",
        "persistent_workers",
    )
    loader = r.fields(DataSettings, {key: (which, key) for key in loader_keys})
    if which == "train_dataloader":  # the train loader shuffles and drops its last partial batch
        loader = {"shuffle": True, "drop_last": True, **loader}
    settings = DataSettings(
        dataset_type=dataset_type,
        img_folder=_img_folder_field(
            r.value(ds + ("img_folder",), "str") or r.value(ds + ("root",), "str"), dataset_type
        ),
        split="train" if which == "train_dataloader" else "val",
        transforms=TransformsSettings(ops=ops, policy=policy),
        collate=CollateSettings(**r.fields(CollateSettings, {f: coll + (f,) for f in _COLLATE_KEYS})),
        cache=cache,
        validation=validation,
        **r.fields(
            DataSettings,
            {
                "ann_file": ds + ("ann_file",),
                "class_names": ds + ("class_names",),
                "num_classes": ("num_classes",),
                "remap_mscoco_category": ("remap_mscoco_category",),
            },
        ),
        **loader,
    )
    return dataclasses.replace(settings, ann_file=_path_field(settings.ann_file))


def _path_field(value: str | None) -> str | None:
    """A config field naming a file or folder (img_folder, ann_file, a cache folder, output_dir): read
    as official D-FINE reads it, relative to the folder the command runs in, and held as
    `files.user_path` makes it (`~` expanded, absolute)."""
    return None if value is None else str(user_path(value))


def _img_folder_field(value: str | None, dataset_type: str) -> str | None:
    """img_folder by what it is. A YOLODetection img_folder names a split of its data.yaml (train,
    val, valid, ...) or an images folder: a split name, or a relative folder that is not there from
    this working folder (one below the data.yaml's root, as Ultralytics reads it), is held as
    written for the layout to resolve (data/yolo.py `split_images_dirs`); a folder that is there is
    held absolute, as every other dataset's img_folder (a path only) is."""
    from dfine_deploy.data.formats import is_split_name

    if value is None or dataset_type != "YOLODetection" or Path(value).expanduser().is_absolute():
        return _path_field(value)
    if is_split_name(value) or not user_path(value).exists():
        return value
    return _path_field(value)


def build_train_settings(cfg: ConfigTree) -> TrainSettings:
    r = Reader(cfg)
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
            raise r.fail(at, "a mapping with a 'params' regex", group)
        groups.append(
            ParamGroupSettings(
                pattern=r.value(at + ("params",), "str"),
                lr=r.value(at + ("lr",), "float"),
                weight_decay=r.value(at + ("weight_decay",), "float"),
            )
        )
    optimizer = r.fields(OptimizerSettings, {f: ("optimizer", f) for f in ("lr", "betas", "weight_decay")})
    if len(optimizer.get("betas", (0, 0))) != 2:
        raise r.fail(("optimizer", "betas"), "two numbers [beta1, beta2]", list(optimizer["betas"]))

    sched_type = r.value(("lr_scheduler", "type"), "str", LrSchedulerSettings.type)
    if sched_type not in LR_SCHEDULER_TYPES:
        raise unknown_choice(cfg, ("lr_scheduler", "type"), "scheduler", sched_type, LR_SCHEDULER_TYPES)
    scheduler_keys = ("milestones", "gamma", "flat_epochs", "min_lr_ratio")

    policy_epoch = r.value(("train_dataloader", "dataset", "transforms", "policy", "epoch"), "int")
    collate_stop = r.value(("train_dataloader", "collate_fn", "stop_epoch"), "int")
    top_level = (
        "clip_max_norm",
        "use_amp",
        "use_ema",
        "sync_bn",
        "find_unused_parameters",
        "checkpoint_freq",
        "print_freq",
        "eval_freq",
        "accumulate",
        "output_dir",
        "summary_dir",
        "seed",
    )
    train = TrainSettings(
        stop_epoch=policy_epoch if policy_epoch is not None else collate_stop,
        optimizer=OptimizerSettings(params=tuple(groups), **optimizer),
        lr_scheduler=LrSchedulerSettings(
            type=sched_type,
            **r.fields(LrSchedulerSettings, {f: ("lr_scheduler", f) for f in scheduler_keys}),
        ),
        lr_warmup_scheduler=WarmupSettings(
            **r.fields(WarmupSettings, {"warmup_duration": ("lr_warmup_scheduler", "warmup_duration")})
        ),
        ema=EmaSettings(**r.fields(EmaSettings, {f: ("ema", f) for f in ("decay", "warmups", "start")})),
        criterion=_criterion_settings(r),
        **r.fields(
            TrainSettings,
            {
                "epochs": epochs_key,
                "ema_restart_decay": ("train_dataloader", "collate_fn", "ema_restart_decay"),
                **{key: (key,) for key in top_level},
            },
        ),
    )
    paths = {"output_dir": _path_field(train.output_dir), "summary_dir": _path_field(train.summary_dir)}
    return dataclasses.replace(train, **paths)


def _criterion_settings(r: Reader) -> CriterionSettings:
    """`DFINECriterion:` and its `matcher:`; loss and weight names are checked here, at load time."""
    crit = ("DFINECriterion",)
    matcher = crit + ("matcher",)
    knobs = ("losses", "alpha", "gamma", "mal_alpha", "reg_max")
    settings = r.fields(CriterionSettings, {f: crit + (f,) for f in knobs})
    for index, name in enumerate(settings.get("losses", ())):
        if name not in KNOWN_LOSSES:
            raise unknown_choice(r.cfg, crit + ("losses", str(index)), "loss", name, KNOWN_LOSSES)
    weights = _weights(r, crit + ("weight_dict",))
    for name in weights or {}:
        if name not in KNOWN_LOSS_WEIGHTS:
            raise unknown_choice(r.cfg, crit + ("weight_dict", name), "loss weight", name, KNOWN_LOSS_WEIGHTS)
    matcher_weights = _weights(r, matcher + ("weight_dict",))
    return CriterionSettings(
        **settings,
        **({"weight_dict": weights} if weights is not None else {}),
        matcher=MatcherSettings(
            **r.fields(MatcherSettings, {f: matcher + (f,) for f in ("alpha", "gamma")}),
            **({"weight_dict": matcher_weights} if matcher_weights is not None else {}),
        ),
    )


def _weights(r: Reader, path: KeyPath) -> dict[str, float] | None:
    """A `{name: weight}` mapping, None when the config leaves it out."""
    node = r.node(*path)
    if node is None:
        return None
    return {str(k): r.value(path + (str(k),), "float") for k in node}
