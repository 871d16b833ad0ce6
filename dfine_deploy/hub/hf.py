"""Hugging Face transformers D-FINE folders, both ways: read one as our model, write ours as one.

A transformers folder is `config.json` (`model_type: d_fine`, a `DFineConfig`) beside
`model.safetensors`, and `preprocessor_config.json` for transformers' image processor. Its tensors
are the official ones under other names (transformers' `modeling_d_fine.py`); `NAME_RULES` below is
the one table of the renames, read in both directions, and the two attention input projections are
split (ours: one `in_proj_weight`, theirs: q, k, v). Reading needs only `safetensors`; transformers
itself is not imported.
"""

from __future__ import annotations

import copy
import json
import logging
import re
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dfine_deploy.errors import CheckpointError
from dfine_deploy.model.contracts import input_contract
from dfine_deploy.model.spec import (
    HGNETV2_VARIANTS,
    SIZES,
    BackboneSpec,
    DecoderSpec,
    EncoderSpec,
    ModelSpec,
)
from dfine_deploy.ownership import Claim, replacing, share_folder

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

__all__ = ["read_hf_folder", "write_hf_folder"]

WEIGHTS_FILE = "model.safetensors"
PROCESSOR_FILE = "preprocessor_config.json"
# The image processor class transformers' D-FINE folders name (its RT-DETR one), and PIL's code
# for bilinear resampling, the contracts' size rule
PROCESSOR_TYPE = "RTDetrImageProcessor"
PIL_BILINEAR = 2

# (ours, transformers'): regular expressions whose groups carry over, applied first match wins.
# `{i}` stands for an index; the rest is written literally.
NAME_RULES: list[tuple[str, str]] = [
    # backbone (HGNetv2): stem, stages; conv -> convolution, bn -> normalization
    ("backbone.stem.{w}.conv.weight", "model.backbone.model.embedder.{w}.convolution.weight"),
    ("backbone.stem.{w}.bn.{p}", "model.backbone.model.embedder.{w}.normalization.{p}"),
    ("backbone.stem.{w}.lab.{p}", "model.backbone.model.embedder.{w}.lab.{p}"),
    (
        "backbone.stages.{i}.{path}.conv.weight",
        "model.backbone.model.encoder.stages.{i}.{path}.convolution.weight",
    ),
    ("backbone.stages.{i}.{path}.bn.{p}", "model.backbone.model.encoder.stages.{i}.{path}.normalization.{p}"),
    ("backbone.stages.{i}.{path}.lab.{p}", "model.backbone.model.encoder.stages.{i}.{path}.lab.{p}"),
    # encoder: input projections, the transformer layer (AIFI), the CSP fusion blocks
    ("encoder.input_proj.{i}.conv.weight", "model.encoder_input_proj.{i}.0.weight"),
    ("encoder.input_proj.{i}.norm.{p}", "model.encoder_input_proj.{i}.1.{p}"),
    (
        "encoder.encoder.{i}.layers.{j}.self_attn.out_proj.{p}",
        "model.encoder.aifi.{i}.layers.{j}.self_attn.o_proj.{p}",
    ),
    ("encoder.encoder.{i}.layers.{j}.linear1.{p}", "model.encoder.aifi.{i}.layers.{j}.mlp.layers.0.{p}"),
    ("encoder.encoder.{i}.layers.{j}.linear2.{p}", "model.encoder.aifi.{i}.layers.{j}.mlp.layers.1.{p}"),
    (
        "encoder.encoder.{i}.layers.{j}.norm1.{p}",
        "model.encoder.aifi.{i}.layers.{j}.self_attn_layer_norm.{p}",
    ),
    ("encoder.encoder.{i}.layers.{j}.norm2.{p}", "model.encoder.aifi.{i}.layers.{j}.final_layer_norm.{p}"),
    ("encoder.lateral_convs.{path}", "model.encoder.lateral_convs.{path}"),
    ("encoder.downsample_convs.{i}.0.cv{k}.{path}", "model.encoder.downsample_convs.{i}.conv{k}.{path}"),
    ("encoder.{b}_blocks.{i}.cv1.{path}", "model.encoder.{b}_blocks.{i}.conv1.{path}"),
    ("encoder.{b}_blocks.{i}.cv2.0.{path}", "model.encoder.{b}_blocks.{i}.csp_rep1.{path}"),
    ("encoder.{b}_blocks.{i}.cv2.1.{path}", "model.encoder.{b}_blocks.{i}.conv2.{path}"),
    ("encoder.{b}_blocks.{i}.cv3.0.{path}", "model.encoder.{b}_blocks.{i}.csp_rep2.{path}"),
    ("encoder.{b}_blocks.{i}.cv3.1.{path}", "model.encoder.{b}_blocks.{i}.conv3.{path}"),
    ("encoder.{b}_blocks.{i}.cv4.{path}", "model.encoder.{b}_blocks.{i}.conv4.{path}"),
    # decoder layers
    ("decoder.decoder.layers.{i}.self_attn.out_proj.{p}", "model.decoder.layers.{i}.self_attn.o_proj.{p}"),
    ("decoder.decoder.layers.{i}.cross_attn.{path}", "model.decoder.layers.{i}.encoder_attn.{path}"),
    ("decoder.decoder.layers.{i}.norm1.{p}", "model.decoder.layers.{i}.self_attn_layer_norm.{p}"),
    ("decoder.decoder.layers.{i}.norm3.{p}", "model.decoder.layers.{i}.final_layer_norm.{p}"),
    ("decoder.decoder.layers.{i}.linear1.{p}", "model.decoder.layers.{i}.mlp.layers.0.{p}"),
    ("decoder.decoder.layers.{i}.linear2.{p}", "model.decoder.layers.{i}.mlp.layers.1.{p}"),
    ("decoder.decoder.layers.{i}.gateway.{path}", "model.decoder.layers.{i}.gateway.{path}"),
    ("decoder.decoder.lqe_layers.{path}", "model.decoder.lqe_layers.{path}"),
    ("decoder.decoder.up", "model.decoder.up"),
    ("decoder.decoder.reg_scale", "model.decoder.reg_scale"),
    # decoder heads and the query selection
    ("decoder.dec_score_head.{path}", "model.decoder.class_embed.{path}"),
    ("decoder.dec_bbox_head.{path}", "model.decoder.bbox_embed.{path}"),
    ("decoder.pre_bbox_head.{path}", "model.decoder.pre_bbox_head.{path}"),
    ("decoder.query_pos_head.{path}", "model.decoder.query_pos_head.{path}"),
    ("decoder.input_proj.{i}.conv.weight", "model.decoder_input_proj.{i}.0.weight"),
    ("decoder.input_proj.{i}.norm.{p}", "model.decoder_input_proj.{i}.1.{p}"),
    ("decoder.denoising_class_embed.weight", "model.denoising_class_embed.weight"),
    ("decoder.enc_output.proj.{p}", "model.enc_output.0.{p}"),
    ("decoder.enc_output.norm.{p}", "model.enc_output.1.{p}"),
    ("decoder.enc_score_head.{p}", "model.enc_score_head.{p}"),
    ("decoder.enc_bbox_head.{path}", "model.enc_bbox_head.{path}"),
]
# Ours only: a second name of a shared parameter, and buffers made for the input size.
OURS_ALIASES = {"decoder.up": "decoder.decoder.up", "decoder.reg_scale": "decoder.decoder.reg_scale"}
OURS_DERIVED = ("decoder.anchors", "decoder.valid_mask")
# Theirs only: the decoder's heads appear twice (tied), under the model and the detection head.
HF_TIED_HEADS = re.compile(r"^model\.decoder\.((?:class|bbox)_embed\..*)$")
# One decoder layer's head, under either of its two names: (class|bbox, layer, the rest of the name).
HF_LAYER_HEAD = re.compile(r"^(?:model\.decoder\.)?(class|bbox)_embed\.(\d+)\.(.+)$")
IN_PROJ = re.compile(
    r"^(encoder\.encoder\.\d+\.layers\.\d+|decoder\.decoder\.layers\.\d+)\.self_attn\.in_proj_(weight|bias)$"
)
# Folders saved by transformers 4.x (those on the Hugging Face Hub) name four things differently;
# transformers 5 renames them on loading (its conversion_mapping.py, "d_fine"). We read both and
# write the 4.x names, which both versions load.
LEGACY_NAMES = [  # (a transformers 5 name, its 4.x form; a 4.x name, its transformers 5 form)
    (r"\.o_proj\.", ".out_proj.", r"\.out_proj\.", ".o_proj."),
    (
        r"layers\.(\d+)\.mlp\.layers\.0\.",
        r"layers.\1.fc1.",
        r"layers\.(\d+)\.fc1\.",
        r"layers.\1.mlp.layers.0.",
    ),
    (
        r"layers\.(\d+)\.mlp\.layers\.1\.",
        r"layers.\1.fc2.",
        r"layers\.(\d+)\.fc2\.",
        r"layers.\1.mlp.layers.1.",
    ),
    (
        r"^model\.encoder\.aifi\.(\d+)\.layers\.",
        r"model.encoder.encoder.\1.layers.",
        r"^model\.encoder\.encoder\.(\d+)\.layers\.",
        r"model.encoder.aifi.\1.layers.",
    ),
]
_TO_LEGACY = [(re.compile(new), old) for new, old, _, _ in LEGACY_NAMES]
_FROM_LEGACY = [(re.compile(old), new) for _, _, old, new in LEGACY_NAMES]
_FLOAT_IN_HF = ("model.decoder.up", "model.decoder.reg_scale")  # the official file may hold integers
QKV = re.compile(r"^(.*)\.self_attn\.([qkv])_proj\.(weight|bias)$")


def _rule_patterns(side: int) -> list[tuple[re.Pattern, str]]:
    rules = []
    for pair in NAME_RULES:
        source, target = pair[side], pair[1 - side]
        regex = re.sub(
            r"\\\{(\w+)\\\}",
            lambda m: rf"(?P<{m.group(1)}>[\w.]+?)" if m.group(1) == "path" else rf"(?P<{m.group(1)}>\w+?)",
            re.escape(source),
        )
        rules.append((re.compile(f"^{regex}$"), target))
    return rules


_TO_HF = _rule_patterns(0)
_FROM_HF = _rule_patterns(1)


def _rename(name: str, rules: list[tuple[re.Pattern, str]]) -> str | None:
    for regex, target in rules:
        match = regex.match(name)
        if match:
            return target.format(**match.groupdict())
    return None


def to_hf_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Our (official) names to transformers', with q, k, v split out of `in_proj`."""
    out: dict[str, torch.Tensor] = {}
    for name, value in state_dict.items():
        if name in OURS_ALIASES or name in OURS_DERIVED:
            continue
        if name.startswith("backbone.") and name.endswith(".num_batches_tracked"):
            continue  # transformers' backbone BatchNorm is frozen (freeze_backbone_batch_norms)
        found = IN_PROJ.match(name)
        if found:
            prefix = _rename(f"{found.group(1)}.self_attn.out_proj.{found.group(2)}", _TO_HF)
            assert prefix is not None
            base = prefix.rsplit(".o_proj.", 1)[0]
            for letter, part in zip("qkv", value.chunk(3, dim=0)):
                out[f"{base}.{letter}_proj.{found.group(2)}"] = part.clone()
            continue
        renamed = _rename(name, _TO_HF)
        if renamed is None:
            raise CheckpointError(
                f"no transformers name for '{name}': this model is not a D-FINE of the official layout"
            )
        out[renamed] = value.float() if renamed in _FLOAT_IN_HF else value
        tied = HF_TIED_HEADS.match(renamed)
        if tied:
            out[tied.group(1)] = value
    return out


def _renamed(name: str, table: list[tuple[re.Pattern, str]]) -> str:
    for pattern, replacement in table:
        name = pattern.sub(replacement, name)
    return name


def from_hf_state_dict(state_dict: dict[str, torch.Tensor], source: str) -> dict[str, torch.Tensor]:
    """transformers' names to ours, q, k, v joined into `in_proj`; BatchNorm step counters dropped."""
    import torch

    out: dict[str, torch.Tensor] = {}
    parts: dict[tuple[str, str], dict[str, torch.Tensor]] = {}
    # save_pretrained keeps one name of a tied tensor: the detection head's or the decoder's
    state_dict = {
        ("model.decoder." + k if HF_TIED_HEADS.match("model.decoder." + k) else _renamed(k, _FROM_LEGACY)): v
        for k, v in state_dict.items()
    }
    for name, value in state_dict.items():
        if name.endswith(".num_batches_tracked"):
            continue
        found = QKV.match(name)
        if found:
            parts.setdefault((found.group(1), found.group(3)), {})[found.group(2)] = value
            continue
        renamed = _rename(name, _FROM_HF)
        if renamed is None:
            raise CheckpointError(f"{source}: '{name}' is no tensor of a transformers D-FINE model")
        out[renamed] = value
    for (prefix, kind), qkv in parts.items():
        if sorted(qkv) != ["k", "q", "v"]:
            raise CheckpointError(f"{source}: {prefix}.self_attn has only {''.join(sorted(qkv))} projections")
        ours = _rename(f"{prefix}.self_attn.o_proj.{kind}", _FROM_HF)
        if ours is None:
            raise CheckpointError(f"{source}: '{prefix}.self_attn' is no attention of a transformers D-FINE")
        out[ours.replace(".out_proj.", ".in_proj_")] = torch.cat([qkv["q"], qkv["k"], qkv["v"]], dim=0)
    for alias, name in OURS_ALIASES.items():
        if name in out:
            out[alias] = out[name]
    return out


# ---------------------------------------------------------------------------------- configs

# The JSON type of every config.json field we write, as transformers' config classes want it: DFineConfig
# ("d_fine") and its backbone's HGNetV2Config ("hgnet_v2"). transformers 5's later releases check them
# strictly (a `@strict` dataclass refuses `"reg_scale": 4` where it declares float); 4.57 and 5.0 check
# none. tests/data/hf_config_types.json holds what each version declares, recorded from the classes
# themselves by scripts/record_hf_config_types.py; tests/model/test_hub.py holds us to it.
HF_CONFIG_TYPES: dict[str, dict[str, str]] = {
    "d_fine": {
        "architectures": "list[str]",
        "model_type": "str",
        "backbone_config": "dict",
        "encoder_in_channels": "list[int]",
        "feat_strides": "list[int]",
        "encoder_hidden_dim": "int",
        "encode_proj_layers": "list[int]",
        "encoder_layers": "int",
        "encoder_attention_heads": "int",
        "encoder_ffn_dim": "int",
        "encoder_activation_function": "str",
        "positional_encoding_temperature": "int",
        "hidden_expansion": "float",
        "depth_mult": "float",
        "d_model": "int",
        "decoder_in_channels": "list[int]",
        "num_feature_levels": "int",
        "decoder_layers": "int",
        "decoder_n_points": "list[int]",
        "decoder_attention_heads": "int",
        "decoder_ffn_dim": "int",
        "decoder_activation_function": "str",
        "num_queries": "int",
        "num_denoising": "int",
        "label_noise_ratio": "float",
        "box_noise_scale": "float",
        "max_num_bins": "int",
        "reg_scale": "float",
        "layer_scale": "float",
        "eval_idx": "int",
        "freeze_backbone_batch_norms": "bool",
        "tie_word_embeddings": "bool",
        "decoder_offset_scale": "float",
        "top_prob_values": "int",
        "lqe_hidden_dim": "int",
        "lqe_layers": "int",
        "up": "float",
        "decoder_method": "str",
        "activation_function": "str",
        "normalize_before": "bool",
        "with_box_refine": "bool",
        "learn_initial_query": "bool",
        "id2label": "dict",
        "label2id": "dict",
    },
    "hgnet_v2": {
        "model_type": "str",
        "stem_channels": "list[int]",
        "stage_in_channels": "list[int]",
        "stage_mid_channels": "list[int]",
        "stage_out_channels": "list[int]",
        "stage_num_blocks": "list[int]",
        "stage_downsample": "list[bool]",
        "stage_light_block": "list[bool]",
        "stage_kernel_size": "list[int]",
        "stage_numb_of_layers": "list[int]",
        "hidden_sizes": "list[int]",
        "depths": "list[int]",
        "use_learnable_affine_block": "bool",
        "out_indices": "list[int]",
        "out_features": "list[str]",
    },
}


def _as_type(kind: str, value: Any, where: str) -> Any:
    """`value` as the JSON type `kind` names; a value that would change on the way is refused."""
    if kind.startswith("list["):
        return [_as_type(kind[5:-1], item, where) for item in value]
    converted = {"int": int, "float": float, "bool": bool, "str": str, "dict": dict}[kind](value)
    if converted != value or (kind in ("int", "float") and isinstance(value, bool)):
        raise CheckpointError(f"{where} = {value!r} is no {kind}, which transformers' config wants")
    return converted


def _typed_config(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    """`config` with every field of the JSON type HF_CONFIG_TYPES gives it (`"reg_scale": 4.0`, not 4)."""
    types = HF_CONFIG_TYPES[model_type]
    return {key: _as_type(types[key], value, f"{model_type} {key}") for key, value in config.items()}


# transformers' DFineConfig values our model does not have as settings: the official constants.
_FIXED = {
    "decoder_offset_scale": 0.5,
    "top_prob_values": 4,
    "lqe_hidden_dim": 64,
    "lqe_layers": 2,
    "up": 0.5,
    "decoder_method": "default",
    "activation_function": "silu",
    "normalize_before": False,
    "with_box_refine": True,
    "learn_initial_query": False,
}


def _variant_name(backbone: dict[str, Any], source: str) -> str:
    """Our HGNetv2 variant whose widths and depths the transformers backbone config lists."""
    for name, variant in HGNETV2_VARIANTS.items():
        stages = variant.stages
        if list(backbone.get("stem_channels", [])) == list(variant.stem_channels) and all(
            list(backbone.get(key, [])) == [getattr(s, field) for s in stages]
            for key, field in _STAGE_FIELDS.items()
        ):
            return name
    raise CheckpointError(
        f"{source}: backbone_config describes no HGNetv2 variant of the official D-FINE sizes "
        f"({', '.join(HGNETV2_VARIANTS)}); stem_channels {backbone.get('stem_channels')}"
    )


_STAGE_FIELDS = {
    "stage_in_channels": "in_channels",
    "stage_mid_channels": "mid_channels",
    "stage_out_channels": "out_channels",
    "stage_num_blocks": "num_blocks",
    "stage_downsample": "downsample",
    "stage_light_block": "light_block",
    "stage_kernel_size": "kernel_size",
    "stage_numb_of_layers": "layer_num",
}


def spec_from_hf_config(config: dict[str, Any], source: str) -> tuple[ModelSpec, list[str]]:
    """Our ModelSpec and the class names of a transformers DFineConfig (as config.json holds it)."""
    if config.get("model_type") != "d_fine":
        raise CheckpointError(
            f"{source}: model_type is {config.get('model_type')!r}; only transformers' 'd_fine' models "
            "are read"
        )
    for key, value in _FIXED.items():
        if key in config and config[key] != value:
            raise CheckpointError(f"{source}: {key} = {config[key]!r}; D-FINE as built here has {value!r}")
    backbone = config.get("backbone_config") or {}
    labels = config.get("id2label") or {}
    names = [str(labels[k]) for k in sorted(labels, key=int)]
    if not names:
        raise CheckpointError(f"{source}: config.json has no id2label: the class count is unknown")
    out_indices = backbone.get("out_indices") or [2, 3, 4]
    points = config.get("decoder_n_points", 4)
    levels = int(config.get("num_feature_levels", 3))
    eval_size = config.get("anchor_image_size") or config.get("eval_size") or [640, 640]
    spec = ModelSpec(
        backbone=BackboneSpec(
            name=_variant_name(backbone, source),
            return_idx=tuple(int(i) - 1 for i in out_indices),
            use_lab=bool(backbone.get("use_learnable_affine_block", False)),
        ),
        encoder=EncoderSpec(
            in_channels=tuple(config["encoder_in_channels"]),
            feat_strides=tuple(config["feat_strides"]),
            hidden_dim=int(config["encoder_hidden_dim"]),
            use_encoder_idx=tuple(config.get("encode_proj_layers", [2])),
            num_encoder_layers=int(config.get("encoder_layers", 1)),
            nhead=int(config.get("encoder_attention_heads", 8)),
            dim_feedforward=int(config.get("encoder_ffn_dim", 1024)),
            enc_act=str(config.get("encoder_activation_function", "gelu")),
            pe_temperature=int(config.get("positional_encoding_temperature", 10000)),
            expansion=float(config.get("hidden_expansion", 1.0)),
            depth_mult=float(config.get("depth_mult", 1.0)),
        ),
        decoder=DecoderSpec(
            feat_channels=tuple(config["decoder_in_channels"]),
            feat_strides=tuple(config["feat_strides"]),
            hidden_dim=int(config["d_model"]),
            num_levels=levels,
            num_layers=int(config["decoder_layers"]),
            num_points=tuple(points) if isinstance(points, list) else (int(points),) * levels,
            nhead=int(config.get("decoder_attention_heads", 8)),
            dim_feedforward=int(config.get("decoder_ffn_dim", 1024)),
            activation=str(config.get("decoder_activation_function", "relu")),
            num_queries=int(config.get("num_queries", 300)),
            num_denoising=int(config.get("num_denoising", 100)),
            label_noise_ratio=float(config.get("label_noise_ratio", 0.5)),
            box_noise_scale=float(config.get("box_noise_scale", 1.0)),
            reg_max=int(config.get("max_num_bins", 32)),
            reg_scale=float(config.get("reg_scale", 4.0)),
            layer_scale=float(config.get("layer_scale", 1.0)),
            eval_idx=int(config.get("eval_idx", -1)),
        ),
        num_classes=len(names),
        eval_spatial_size=(int(eval_size[0]), int(eval_size[-1])),
        num_top_queries=int(config.get("num_queries", 300)),
    )
    return _official_size(spec), names


def _official_size(spec: ModelSpec) -> ModelSpec:
    """The spec marked with its official size when its architecture is one (BatchNorm freezing aside)."""
    for name, official in SIZES.items():
        candidate = replace(
            official,
            backbone=replace(
                official.backbone, freeze_at=-1, freeze_norm=False, freeze_stem_only=True, pretrained=False
            ),
            num_classes=spec.num_classes,
            eval_spatial_size=spec.eval_spatial_size,
            num_top_queries=spec.num_top_queries,
        )
        if replace(candidate, size=None) == replace(spec, size=None):
            return replace(spec, size=name, backbone=official.backbone)
    return spec


def hf_config(spec: ModelSpec, class_names: list[str]) -> dict[str, Any]:
    """The config.json of a transformers DFineForObjectDetection with this architecture."""
    variant = HGNETV2_VARIANTS[spec.backbone.name]
    e, d = spec.encoder, spec.decoder
    stages = {key: [getattr(s, field) for s in variant.stages] for key, field in _STAGE_FIELDS.items()}
    backbone = {
        "model_type": "hgnet_v2",
        "stem_channels": list(variant.stem_channels),
        **stages,
        "hidden_sizes": stages["stage_out_channels"],
        "depths": stages["stage_num_blocks"],
        "use_learnable_affine_block": spec.backbone.use_lab,
        "out_indices": [i + 1 for i in spec.backbone.return_idx],
        "out_features": [f"stage{i + 1}" for i in spec.backbone.return_idx],
    }
    config = {
        "architectures": ["DFineForObjectDetection"],
        "model_type": "d_fine",
        "backbone_config": _typed_config(backbone, "hgnet_v2"),
        "encoder_in_channels": list(e.in_channels),
        "feat_strides": list(e.feat_strides),
        "encoder_hidden_dim": e.hidden_dim,
        "encode_proj_layers": list(e.use_encoder_idx),
        "encoder_layers": e.num_encoder_layers,
        "encoder_attention_heads": e.nhead,
        "encoder_ffn_dim": e.dim_feedforward,
        "encoder_activation_function": e.enc_act,
        "positional_encoding_temperature": e.pe_temperature,
        "hidden_expansion": e.expansion,
        "depth_mult": e.depth_mult,
        "d_model": d.hidden_dim,
        "decoder_in_channels": list(d.feat_channels),
        "num_feature_levels": d.num_levels,
        "decoder_layers": d.num_layers,
        "decoder_n_points": list(d.num_points),
        "decoder_attention_heads": d.nhead,
        "decoder_ffn_dim": d.dim_feedforward,
        "decoder_activation_function": d.activation,
        "num_queries": d.num_queries,
        "num_denoising": d.num_denoising,
        "label_noise_ratio": d.label_noise_ratio,
        "box_noise_scale": d.box_noise_scale,
        "max_num_bins": d.reg_max,
        "reg_scale": d.reg_scale,
        "layer_scale": d.layer_scale,
        "eval_idx": d.eval_idx,
        "freeze_backbone_batch_norms": True,
        # each decoder layer has heads of its own, not tied to the first layer's as transformers 5.0.0
        # ties them by default (see expand_shared_heads); 5.0.0 warns for every head tensor without it
        "tie_word_embeddings": False,
        **_FIXED,
        "id2label": {str(i): name for i, name in enumerate(class_names)},
        "label2id": {name: i for i, name in enumerate(class_names)},
    }
    return _typed_config(config, "d_fine")


# ---------------------------------------------------------------------------------- folders


def expand_shared_heads(state: dict[str, torch.Tensor], decoder_layers: int, source: str) -> int:
    """Give every decoder layer its class and box head when the file holds only the first layer's.

    transformers 5.0.0 ties the heads of every decoder layer to the first's (`_tied_weights_keys` in
    its modeling_d_fine.py, `bbox_embed.(?![0])\\d+` -> `bbox_embed.0`), so its model uses one head
    for all layers and its save_pretrained writes that one only. Copying it to each layer is that
    same model in our layout. Returns how many tensors were added (0 for a folder of its own heads)."""
    heads: dict[tuple[str, int], dict[str, torch.Tensor]] = {}
    for name, value in state.items():
        found = HF_LAYER_HEAD.match(name)
        if found:
            heads.setdefault((found.group(1), int(found.group(2))), {})[found.group(3)] = value
    layers_held = {layer for _, layer in heads}
    if decoder_layers < 2 or layers_held != {0}:
        return 0
    added = 0
    for kind in ("class", "bbox"):
        first = heads.get((kind, 0), {})
        if not first:
            raise CheckpointError(
                f"{source}: the folder holds no {kind}_embed.0 to share across decoder layers"
            )
        for layer in range(1, decoder_layers):
            for rest, value in first.items():
                state[f"model.decoder.{kind}_embed.{layer}.{rest}"] = value
                added += 1
    log.info(
        "%s: one class and box head shared by all %d decoder layers (as transformers 5.0.0 saves it); "
        "copied to each layer (%d tensors)",
        source,
        decoder_layers,
        added,
    )
    return added


def read_hf_folder(folder: Path) -> tuple[ModelSpec, dict[str, torch.Tensor], list[str]]:
    """(spec, state_dict in our names, class names) of a transformers D-FINE folder."""
    config_path = folder / "config.json"
    config = _json_object(config_path)
    spec, names = spec_from_hf_config(config, str(config_path))
    check_processor_config(folder, spec)
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise CheckpointError(
            f"{folder}: no .safetensors file beside config.json (a pytorch_model.bin folder: re-save it "
            "with transformers' save_pretrained, which writes safetensors)"
        )
    try:
        from safetensors.torch import load_file
    except ImportError:
        from dfine_deploy.errors import MissingDependency

        raise MissingDependency(
            f"{folder} is a transformers folder; reading it needs safetensors: pip install -e '.[train]'"
        ) from None
    state: dict[str, torch.Tensor] = {}
    for path in files:
        try:
            state.update(load_file(str(path)))
        except Exception as exc:  # safetensors raises its own error type for a damaged header
            raise CheckpointError(f"{path}: truncated or not a safetensors file ({exc})") from None
    expand_shared_heads(state, spec.decoder.num_layers, str(folder))
    ours = from_hf_state_dict(state, str(folder))
    head = ours.get("decoder.enc_score_head.weight")  # [classes, hidden]: the tensors' class count
    if head is not None and head.shape[0] != spec.num_classes:
        raise CheckpointError(
            f"{config_path}: id2label names {spec.num_classes} classes, the weights' class heads have "
            f"{head.shape[0]}; list one name per class of the weights in id2label (and label2id)"
        )
    return spec, ours, names


def _json_object(path: Path) -> dict[str, Any]:
    """A folder's JSON file that must hold one object; CheckpointError naming it otherwise."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(found, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return found


def hf_processor_config(spec: ModelSpec) -> dict[str, Any]:
    """preprocessor_config.json: transformers' image processor set to the family's input contract
    (model/contracts.py), so `AutoImageProcessor.from_pretrained` feeds the network what it was
    trained on: the frame stretched to the network size, bilinear, times the scale, the mean/std."""
    network = input_contract(spec.family).network
    height, width = spec.eval_spatial_size
    return {
        "image_processor_type": PROCESSOR_TYPE,
        "do_resize": True,
        "size": {"height": height, "width": width},
        "resample": PIL_BILINEAR,
        "do_rescale": True,
        "rescale_factor": network.scale,
        "do_normalize": network.normalises,
        "image_mean": list(network.mean),
        "image_std": list(network.std),
        "do_pad": False,
    }


def check_processor_config(folder: Path, spec: ModelSpec) -> None:
    """A folder's image processor must feed the pixels of the family's contract: weights trained
    on other pixels (say, with ImageNet mean/std) would be served the contract's, wrongly and in
    silence, so such a folder is refused. No processor file: the contract applies."""
    path = folder / PROCESSOR_FILE
    if not path.is_file():
        return
    found = _json_object(path)
    expected = hf_processor_config(spec)
    differ = [
        f"{key} {found[key]!r} (the contract's: {expected[key]!r})"
        for key in ("do_rescale", "rescale_factor", "do_normalize")
        if key in found and found[key] != expected[key]
    ]
    if found.get("do_normalize"):
        differ += [
            f"{key} {found.get(key)!r} (the contract's: {expected[key]!r})"
            for key in ("image_mean", "image_std")
            if found.get(key) != expected[key]
        ]
    if differ:
        raise CheckpointError(
            f"{path}: its image processor feeds other pixels than {spec.family}'s input contract "
            f"(dfine_deploy/model/contracts.py): {'; '.join(differ)}. dfine-deploy would serve these "
            "weights the contract's pixels; fine-tune with the contract's preprocessing, or delete the "
            "file if training did not use it"
        )


def write_hf_folder(
    folder: Path, spec: ModelSpec, state_dict: dict[str, torch.Tensor], class_names: list[str]
) -> None:
    """config.json, model.safetensors and preprocessor_config.json, which transformers'
    from_pretrained and AutoImageProcessor load."""
    from safetensors.torch import save_file

    config = hf_config(spec, class_names)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {
        _renamed(k, _TO_LEGACY): v.detach().contiguous().clone()
        for k, v in to_hf_state_dict(state_dict).items()
    }
    save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    processor = json.dumps(hf_processor_config(spec), indent=2) + "\n"
    (folder / PROCESSOR_FILE).write_text(processor, encoding="utf-8")


# The largest difference between ours and transformers' forward that a written folder may show.
EXPORT_TOLERANCE = 1e-4


def _is_d_fine_config(config: Path) -> bool:
    """A config.json of a transformers D-FINE: what `--hf` writes, and may replace with --force."""
    return json.loads(config.read_text(encoding="utf-8")).get("model_type") == "d_fine"


# What `dfine-export --hf` writes in its folder (dfine_deploy/ownership.py: it replaces only its own).
HF_FOLDER = Claim(
    command="dfine-export --hf",
    kind="a transformers D-FINE folder",
    markers=("config.json",),
    patterns=(WEIGHTS_FILE, PROCESSOR_FILE),
    recognise=_is_d_fine_config,
)


def export_hf(loaded: Any, folder: Path, *, force: bool = False) -> str:
    """Write `loaded` (a hub.loader.LoadedModel) as a transformers folder; when transformers is
    installed, load it back with from_pretrained and compare its forward with ours on random images.
    The folder is filled in a staging folder beside it and moved into place only once checked, so a
    refusal leaves nothing behind. Returns one line saying what was checked."""
    with replacing(folder, HF_FOLDER, option="--hf", force=force, error=CheckpointError) as staging:
        write_hf_folder(staging, loaded.spec, loaded.model.state_dict(), list(loaded.class_names))
        checked = _check_with_transformers(loaded, staging, folder)
        share_folder(staging)
    return f"wrote {folder}/ (config.json, {WEIGHTS_FILE}, {PROCESSOR_FILE}); {checked}"


def _check_with_transformers(loaded: Any, written: Path, folder: Path) -> str:
    """Load `written` with transformers' DFineForObjectDetection (when installed) and compare its
    forward with ours; CheckpointError naming `folder` when it refuses or disagrees."""
    import torch

    try:
        import transformers
        from transformers import DFineForObjectDetection
    except ImportError:
        return "not checked: transformers is not installed here"
    version = transformers.__version__
    try:
        theirs = DFineForObjectDetection.from_pretrained(str(written)).double().eval()
    except Exception as exc:  # transformers' own errors (a strict config's, a loading report's) vary
        reason = " ".join(str(exc).split())[:300] or type(exc).__name__  # strict's error spans lines
        raise CheckpointError(
            f"--hf {folder}: transformers {version} refuses the folder written ({reason}); nothing was "
            "written"
        ) from None
    # float64: in float32, random images give near-tied query scores that the two implementations'
    # last-bit differences order differently (then whole rows swap places)
    height, width = loaded.spec.eval_spatial_size
    images = torch.rand(1, 3, height, width, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    with torch.no_grad():
        ours = copy.deepcopy(loaded.model).double().eval()(images)
        out = theirs(pixel_values=images)
    logits = (ours["pred_logits"] - out.logits).abs().max().item()
    boxes = (ours["pred_boxes"] - out.pred_boxes).abs().max().item()
    if max(logits, boxes) > EXPORT_TOLERANCE:
        raise CheckpointError(
            f"--hf {folder}: transformers {version}'s DFineForObjectDetection disagrees with this model "
            f"(logits |d| {logits:.1e}, boxes |d| {boxes:.1e}, allowed {EXPORT_TOLERANCE:.0e}); nothing "
            "was written"
        )
    return (
        f"transformers {version}'s from_pretrained loads it and its forward agrees (logits |d| "
        f"{logits:.1e}, boxes |d| {boxes:.1e})"
    )
