"""Typed settings of the D-FINE network: one frozen dataclass per component, one entry per size.

Values follow the official COCO configs (configs/dfine/dfine_hgnetv2_{n,s,m,l,x}_coco.yml);
`dfine_deploy.config` fills the same dataclasses from any official-layout YAML file.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from dfine_deploy.compat import remove_prefix

SIZE_NAMES = ("n", "s", "m", "l", "x")
# How deformable attention samples its values: "grid" with F.grid_sample, as the official code;
# "gather" with the same bilinear arithmetic written as gathers, so an exported graph holds no
# GridSample node (TensorRT mis-compiles it in D-FINE, NVIDIA/TensorRT#4813). Exports use gather.
SAMPLERS = ("grid", "gather")
EXPORT_SAMPLER = "gather"


# ---------------------------------------------------------------------------- the HGNetv2 variants


@dataclass(frozen=True)
class StageSpec:
    """One HGNetv2 stage: `num_blocks` HG blocks of `layer_num` convs each (official `arch_configs`)."""

    in_channels: int
    mid_channels: int
    out_channels: int
    num_blocks: int
    downsample: bool  # a stride-2 depthwise conv before the blocks
    light_block: bool  # depthwise-separable convs inside the blocks
    kernel_size: int
    layer_num: int


@dataclass(frozen=True)
class HGNetv2Variant:
    """One row of the HGNetv2 table: the stem's [in, mid, out] channels and the four stages."""

    stem_channels: tuple[int, int, int]
    stages: tuple[StageSpec, StageSpec, StageSpec, StageSpec]

    def feature_info(self, return_idx: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
        """(channels, stride) of each stage output listed in `return_idx`."""
        return tuple((self.stages[i].out_channels, HGNETV2_STAGE_STRIDES[i]) for i in return_idx)


# Output stride of stages 0..3: the stem halves twice, stages 1..3 downsample once each.
HGNETV2_STAGE_STRIDES = (4, 8, 16, 32)
# The only table of HGNetv2 widths and depths (values of the official `arch_configs`); the model,
# the config checks and the checkpoint size inference all read it. Stage fields: in, mid, out
# channels, blocks, downsample, light block, kernel size, layers per block.
HGNETV2_VARIANTS: dict[str, HGNetv2Variant] = {
    "B0": HGNetv2Variant(
        (3, 16, 16),
        (
            StageSpec(16, 16, 64, 1, False, False, 3, 3),
            StageSpec(64, 32, 256, 1, True, False, 3, 3),
            StageSpec(256, 64, 512, 2, True, True, 5, 3),
            StageSpec(512, 128, 1024, 1, True, True, 5, 3),
        ),
    ),
    "B2": HGNetv2Variant(
        (3, 24, 32),
        (
            StageSpec(32, 32, 96, 1, False, False, 3, 4),
            StageSpec(96, 64, 384, 1, True, False, 3, 4),
            StageSpec(384, 128, 768, 3, True, True, 5, 4),
            StageSpec(768, 256, 1536, 1, True, True, 5, 4),
        ),
    ),
    "B4": HGNetv2Variant(
        (3, 32, 48),
        (
            StageSpec(48, 48, 128, 1, False, False, 3, 6),
            StageSpec(128, 96, 512, 1, True, False, 3, 6),
            StageSpec(512, 192, 1024, 3, True, True, 5, 6),
            StageSpec(1024, 384, 2048, 1, True, True, 5, 6),
        ),
    ),
    "B5": HGNetv2Variant(
        (3, 32, 64),
        (
            StageSpec(64, 64, 128, 1, False, False, 3, 6),
            StageSpec(128, 128, 512, 2, True, False, 3, 6),
            StageSpec(512, 256, 1024, 5, True, True, 5, 6),
            StageSpec(1024, 512, 2048, 2, True, True, 5, 6),
        ),
    ),
}


@dataclass(frozen=True)
class BackboneSpec:
    """HGNetv2, the `HGNetv2:` section of an official config.

    Attributes:
        name (`str`, default `"B4"`): the variant, a key of `HGNETV2_VARIANTS` (B0 for the n and s
            sizes, B2 for m, B4 for l, B5 for x).
        return_idx (`tuple[int, ...]`, default `(1, 2, 3)`): the stages (0..3, strides 4, 8, 16, 32)
            whose outputs go to the encoder.
        use_lab (`bool`, default `False`): a learnable affine block (scale and bias) after each
            activation, as PP-HGNetV2 has for its small variants.
        freeze_at (`int`, default `-1`): -1 trains everything; 0 or more freezes the stem, and stages
            0..freeze_at too unless `freeze_stem_only`.
        freeze_stem_only (`bool`, default `True`): with `freeze_at >= 0`, freeze the stem only.
        freeze_norm (`bool`, default `False`): BatchNorm2d becomes FrozenBatchNorm2d (fixed statistics
            and affine terms, as buffers).
        pretrained (`bool`, default `False`): the official switch to download ImageNet weights;
            accepted and never acted on here (weights come from checkpoints).
    """

    name: str = "B4"
    return_idx: tuple[int, ...] = (1, 2, 3)
    use_lab: bool = False
    freeze_at: int = -1
    freeze_stem_only: bool = True
    freeze_norm: bool = False
    pretrained: bool = False


@dataclass(frozen=True)
class EncoderSpec:
    """HybridEncoder, the `HybridEncoder:` section: attention within the coarsest map, then a
    top-down and bottom-up fusion of all maps.

    Attributes:
        in_channels (`tuple[int, ...]`, default `(512, 1024, 2048)`): channels of the backbone maps
            it receives; must be what `BackboneSpec.return_idx` gives.
        feat_strides (`tuple[int, ...]`, default `(8, 16, 32)`): their strides.
        hidden_dim (`int`, default `256`): the width every map is projected to; the decoder reads
            maps of this width.
        use_encoder_idx (`tuple[int, ...]`, default `(2,)`): the maps (indices into `in_channels`)
            that go through transformer layers (the paper's attention-based intra-scale interaction).
        num_encoder_layers (`int`, default `1`): transformer layers for each of those maps.
        nhead (`int`, default `8`): attention heads of those layers.
        dim_feedforward (`int`, default `1024`): hidden width of their feed-forward part.
        dropout (`float`, default `0.0`): their dropout.
        enc_act (`str`, default `"gelu"`): their feed-forward activation.
        pe_temperature (`int`, default `10000`): temperature of the 2-D sine positional embedding.
        expansion (`float`, default `1.0`): width multiplier of the fusion blocks.
        depth_mult (`float`, default `1.0`): depth multiplier of the fusion blocks.
    """

    in_channels: tuple[int, ...] = (512, 1024, 2048)
    feat_strides: tuple[int, ...] = (8, 16, 32)
    hidden_dim: int = 256
    use_encoder_idx: tuple[int, ...] = (2,)
    num_encoder_layers: int = 1
    nhead: int = 8
    dim_feedforward: int = 1024
    dropout: float = 0.0
    enc_act: str = "gelu"
    pe_temperature: int = 10000
    expansion: float = 1.0
    depth_mult: float = 1.0


@dataclass(frozen=True)
class DecoderSpec:
    """DFINETransformer, the `DFINETransformer:` section: queries chosen among the encoder's tokens,
    refined layer by layer as a distribution over each box edge (Fine-grained Distribution
    Refinement), with self-distillation from the last layer to the earlier ones in training.

    Attributes:
        feat_channels (`tuple[int, ...]`, default `(256, 256, 256)`): channels of each encoder output
            it reads; each equals `EncoderSpec.hidden_dim`.
        feat_strides (`tuple[int, ...]`, default `(8, 16, 32)`): their strides.
        hidden_dim (`int`, default `256`): the width of a query.
        num_levels (`int`, default `3`): feature levels the deformable attention samples; at least
            one per entry of `feat_channels`.
        num_layers (`int`, default `6`): decoder layers, each refining the boxes of the one before.
        num_points (`tuple[int, ...]`, default `(3, 6, 3)`): sampling points per level and head; an
            official file may give one int for every level.
        nhead (`int`, default `8`): attention heads.
        dim_feedforward (`int`, default `1024`): hidden width of the feed-forward part.
        dropout (`float`, default `0.0`): dropout of the decoder layers.
        activation (`str`, default `"relu"`): activation of the layers' feed-forward part and of the
            LQE: "relu" (D-FINE) or "silu" (DEIM's D-FINE models).
        mlp_act (`str`, default `"relu"`): activation inside the MLP heads (query position, box heads):
            "relu" (D-FINE) or "silu" (DEIM's D-FINE models).
        num_queries (`int`, default `300`): queries chosen from the encoder's tokens (top-k by class
            score); the input must give at least this many tokens.
        num_denoising (`int`, default `100`): noised ground-truth queries added in training
            (contrastive denoising); 0 turns them off.
        label_noise_ratio (`float`, default `0.5`): share of denoising labels replaced at random.
        box_noise_scale (`float`, default `1.0`): size of the noise on denoising boxes.
        reg_max (`int`, default `32`): bins of each edge's distribution (the paper's N).
        reg_scale (`float`, default `4.0`): scale of the weighting function that maps bins to edge
            offsets (`model/fdr.py`): larger reaches further with coarser steps (8 for the x size).
        layer_scale (`float`, default `1.0`): the official width multiplier of the layers after
            `eval_idx`; other values are built only when no layer follows it.
        eval_idx (`int`, default `-1`): the layer whose boxes are the output at inference; layers
            after it are trained and cut by `deploy()`.
        cross_attn_method (`str`, default `"default"`): the official option; only "default" is built.
        query_select_method (`str`, default `"default"`): the official option; only "default" is built.
        variant (`str`, default `"dfine"`): the decoder family, a key of `model/decoder.py`'s
            `DECODER_VARIANTS`: "dfine" (D-FINE, DEIM's D-FINE) or "ecdet" (EdgeCrafter's ECTransformer).
    """

    feat_channels: tuple[int, ...] = (256, 256, 256)
    feat_strides: tuple[int, ...] = (8, 16, 32)
    hidden_dim: int = 256
    num_levels: int = 3
    num_layers: int = 6
    num_points: tuple[int, ...] = (3, 6, 3)
    nhead: int = 8
    dim_feedforward: int = 1024
    dropout: float = 0.0
    activation: str = "relu"
    mlp_act: str = "relu"
    num_queries: int = 300
    num_denoising: int = 100
    label_noise_ratio: float = 0.5
    box_noise_scale: float = 1.0
    reg_max: int = 32
    reg_scale: float = 4.0
    layer_scale: float = 1.0
    eval_idx: int = -1
    cross_attn_method: str = "default"
    query_select_method: str = "default"
    variant: str = "dfine"


_FEATURE_BYTES_PER_PIXEL = 64  # see ModelSpec.activation_bytes


# The largest input side accepted: 16 times the official 640, far past what fits in a GPU's memory for
# the larger models, and small enough that sizes derived from it stay ordinary integers.
MAX_INPUT_SIDE = 10240


@dataclass(frozen=True)
class ModelSpec:
    """Everything needed to build one D-FINE network; stored in checkpoints as `meta['model_spec']`.

    Attributes:
        backbone, encoder, decoder: the three parts, above.
        num_classes (`int`, default `80`): classes the heads score (the top-level `num_classes`).
        eval_spatial_size (`tuple[int, int]`, default `(640, 640)`): input (H, W), multiples of 32;
            anchors and positional embeddings are made for it.
        num_top_queries (`int`, default `300`): detections the postprocessor keeps per image.
        size (`str | None`): "n" .. "x" when the architecture is an official size, else None.
    """

    family: ClassVar[str] = "dfine"  # the name prefix of the family's sizes: dfine-n, ecdet-s
    backbone: BackboneSpec = field(default_factory=BackboneSpec)
    encoder: EncoderSpec = field(default_factory=EncoderSpec)
    decoder: DecoderSpec = field(default_factory=DecoderSpec)
    num_classes: int = 80
    eval_spatial_size: tuple[int, int] = (640, 640)  # (H, W), multiples of 32
    num_top_queries: int = 300
    size: str | None = None  # "n".."x" when it is one of the official sizes

    @property
    def backbone_label(self) -> str:
        return f"HGNetv2-{self.backbone.name}"

    def with_classes(self, num_classes: int) -> ModelSpec:
        return replace(self, num_classes=num_classes)

    def with_input_size(self, height: int, width: int) -> ModelSpec:
        return replace(self, eval_spatial_size=(height, width))

    def feature_tokens(self, height: int, width: int) -> int:
        """How many encoder tokens an input of (height, width) gives: query selection picks from these."""
        return sum((height // s) * (width // s) for s in self.decoder.feat_strides)

    def activation_bytes(self, height: int, width: int, batch: int = 1) -> int:
        """A lower bound of the memory one inference pass of `batch` images of (height, width) holds at
        its peak (for `dfine_deploy.memory.check_memory`): the encoder's self-attention weights, one
        float32 [heads, L, L] matrix over the L tokens of the map it attends within, quadratic in the
        pixels (137 GB at 8192 x 8192), and the feature maps at 64 bytes per input pixel (measured on
        dfine-n, the leanest size: about 80 in onnxruntime and 100 in torch)."""
        strides = [self.encoder.feat_strides[i] for i in self.encoder.use_encoder_idx]
        tokens = max(((height // s) * (width // s) for s in strides), default=0)
        attention = self.encoder.nhead * tokens**2 * 4
        return batch * (_FEATURE_BYTES_PER_PIXEL * height * width + attention)

    def check_input_size(self, height: int, width: int) -> None:
        """Refuse a size the network cannot run, suggesting the nearest size that it can.

        Three rules: both sides are positive multiples of 32 (the coarsest stride) of at most
        `MAX_INPUT_SIDE`, and the feature maps hold at least `num_queries` tokens (top-k query
        selection, D-FINE#175).
        """
        from dfine_deploy.errors import ModelError

        if max(height, width) > MAX_INPUT_SIDE:
            raise ModelError(
                f"input size {height} x {width} (H x W): each side must be at most {MAX_INPUT_SIDE} pixels; "
                f"use a smaller --imgsz such as 640 640 (larger images are resized to it)"
            )
        queries = self.decoder.num_queries
        if (
            height > 0
            and width > 0
            and not height % 32
            and not width % 32
            and self.feature_tokens(height, width) >= queries
        ):
            return
        fix_h, fix_w = (max(32, round(side / 32) * 32) for side in (height, width))
        while self.feature_tokens(fix_h, fix_w) < queries:
            fix_h, fix_w = fix_h + 32, fix_w + 32
        if height % 32 or width % 32 or height <= 0 or width <= 0:
            why = "both sides must be positive multiples of 32 (D-FINE's coarsest stride)"
        else:
            why = (
                f"it gives {self.feature_tokens(height, width)} feature tokens but the decoder selects "
                f"num_queries={queries} (or lower DFINETransformer.num_queries and "
                "DFINEPostProcessor.num_top_queries in the config)"
            )
        raise ModelError(f"input size {height} x {width} (H x W): {why}; use --imgsz {fix_h} {fix_w}")


SIZES: dict[str, ModelSpec] = {
    "n": ModelSpec(
        size="n",
        backbone=BackboneSpec(name="B0", return_idx=(2, 3), use_lab=True),
        encoder=EncoderSpec(
            in_channels=(512, 1024),
            feat_strides=(16, 32),
            hidden_dim=128,
            use_encoder_idx=(1,),
            dim_feedforward=512,
            expansion=0.34,
            depth_mult=0.5,
        ),
        decoder=DecoderSpec(
            feat_channels=(128, 128),
            feat_strides=(16, 32),
            hidden_dim=128,
            num_levels=2,
            num_layers=3,
            dim_feedforward=512,
            num_points=(6, 6),
            reg_scale=4,
        ),
    ),
    "s": ModelSpec(
        size="s",
        backbone=BackboneSpec(name="B0", return_idx=(1, 2, 3), use_lab=True),
        encoder=EncoderSpec(in_channels=(256, 512, 1024), expansion=0.5, depth_mult=0.34),
        decoder=DecoderSpec(num_layers=3),
    ),
    "m": ModelSpec(
        size="m",
        backbone=BackboneSpec(name="B2", return_idx=(1, 2, 3), use_lab=True),
        encoder=EncoderSpec(in_channels=(384, 768, 1536), expansion=1.0, depth_mult=0.67),
        decoder=DecoderSpec(num_layers=4),
    ),
    "l": ModelSpec(
        size="l",
        backbone=BackboneSpec(name="B4", freeze_at=0, freeze_stem_only=True, freeze_norm=True),
        encoder=EncoderSpec(in_channels=(512, 1024, 2048)),
        decoder=DecoderSpec(num_layers=6),
    ),
    "x": ModelSpec(
        size="x",
        backbone=BackboneSpec(name="B5", freeze_at=0, freeze_stem_only=True, freeze_norm=True),
        encoder=EncoderSpec(in_channels=(512, 1024, 2048), hidden_dim=384, dim_feedforward=2048),
        decoder=DecoderSpec(feat_channels=(384, 384, 384), num_layers=6, reg_scale=8),
    ),
}


def size_key(name: str) -> str | None:
    """'n' for 'dfine-n', 'dfine_n', 'DFINE-N' or 'n'; None when `name` is no size name."""
    key = remove_prefix(name.strip().lower().replace("_", "-"), "dfine-")
    return key if key in SIZE_NAMES else None


def size_spec(name: str) -> ModelSpec:
    """Spec of an official size; accepts the forms `size_key` does."""
    from dfine_deploy.errors import ModelError

    key = size_key(name)
    if key is None:
        raise ModelError(
            f"unknown model size '{name}': expected one of " + ", ".join(f"dfine-{s}" for s in SIZE_NAMES)
        )
    return SIZES[key]
