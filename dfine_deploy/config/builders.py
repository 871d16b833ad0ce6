"""The D-FINE builders: a checked config → ModelSpec, DataSettings, TrainSettings."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dfine_deploy.config.layout import TRANSFORM_TYPES
from dfine_deploy.config.reader import Reader, unknown_choice
from dfine_deploy.config.tree import KeyPath, dotted
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

if TYPE_CHECKING:
    from dfine_deploy.config.core import Config

# Output channels of HGNetv2 stages 0..3 (official arch_configs); strides are 4, 8, 16, 32.
BACKBONE_STAGE_CHANNELS = {
    "B0": (64, 256, 512, 1024),
    "B2": (96, 384, 768, 1536),
    "B4": (128, 512, 1024, 2048),
    "B5": (128, 512, 1024, 2048),
}
BACKBONE_STAGE_STRIDES = (4, 8, 16, 32)


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
    def fail(key: KeyPath, message: str):
        raise ConfigError(f"'{dotted(key)}' ({cfg.origin(key)}): {message}")

    if backbone.name not in BACKBONE_STAGE_CHANNELS:
        choices = list(BACKBONE_STAGE_CHANNELS)
        raise unknown_choice(cfg, ("HGNetv2", "name"), "backbone", backbone.name, choices)
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


def _transform_op(r: Reader, path: KeyPath, entry: Any) -> TransformOp:
    if not isinstance(entry, Mapping) or not isinstance(entry.get("type"), str):
        raise r.fail(path, "a mapping with a 'type' (e.g. {type: Resize, size: [640, 640]})", entry)
    name = entry["type"]
    if name not in TRANSFORM_TYPES:
        raise unknown_choice(r.cfg, path + ("type",), "transform", name, TRANSFORM_TYPES)
    return TransformOp(type=name, kwargs={k: v for k, v in entry.items() if k != "type"})


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


def build_data_settings(cfg: Config, which: str) -> DataSettings:
    """`which` is 'train_dataloader' or 'val_dataloader'."""
    r = Reader(cfg)
    ds = (which, "dataset")
    tf = ds + ("transforms",)
    dataset_type = r.value(ds + ("type",), "str", "CocoDetection")
    if dataset_type not in DATASET_TYPES:
        raise unknown_choice(cfg, ds + ("type",), "dataset type", dataset_type, DATASET_TYPES)
    ops_raw = r.node(*tf, "ops") or []
    if not isinstance(ops_raw, list):
        raise r.fail(tf + ("ops",), "a list of transforms", ops_raw)
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
        raise r.fail((which, "cache"), "'off', 'ram' or a folder path", cache)
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
            raise r.fail((which, key), f"an integer >= {minimum}", getattr(settings, key))
    return settings


def build_train_settings(cfg: Config) -> TrainSettings:
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
        groups.append(ParamGroupSettings(
            pattern=r.value(at + ("params",), "str"),
            lr=r.value(at + ("lr",), "float"),
            weight_decay=r.value(at + ("weight_decay",), "float"),
        ))
    betas = r.value(("optimizer", "betas"), "floats", (0.9, 0.999))
    if len(betas) != 2:
        raise r.fail(("optimizer", "betas"), "two numbers [beta1, beta2]", list(betas))

    sched_type = r.value(("lr_scheduler", "type"), "str", "MultiStepLR")
    if sched_type not in LR_SCHEDULER_TYPES:
        raise unknown_choice(cfg, ("lr_scheduler", "type"), "scheduler", sched_type, LR_SCHEDULER_TYPES)

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


def _weights(r: Reader, path: KeyPath, default: dict[str, float]) -> dict[str, float]:
    node = r.node(*path)
    if node is None:
        return dict(default)
    return {str(k): r.value(path + (str(k),), "float") for k in node}


