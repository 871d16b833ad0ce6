"""Typed settings of EdgeCrafter's ECDet detectors: a compact ViT backbone, a hybrid encoder and
D-FINE's FDR decoder (the "ecdet" row of `model/decoder.py`'s `DECODER_VARIANTS`).

Values follow the official configs (github.com/Intellindust-AI-Lab/EdgeCrafter,
ecdetseg/configs/ecdet/ecdet_{s,m,l,x}.yml, mirrored in configs/ecdet/); torch-free like `spec.py`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import ClassVar

from dfine_deploy.model.spec import DecoderSpec, EncoderSpec, ModelSpec

ECDET_SIZE_NAMES = ("s", "m", "l", "x")


@dataclass(frozen=True)
class ViTSpec:
    """ECViT, the `ViTAdapter:` section: a 12-block ViT on 16 x 16 patches (a conv pyramid stem, one
    register token, 2-D RoPE), whose blocks `interaction_indexes` are averaged and resampled to
    strides 8, 16 and 32.

    Attributes:
        name (`str`): the official backbone name (ecvitt, ecvittplus, ecvits, ecvitsplus).
        embed_dim (`int`): token width.
        num_heads (`int`): attention heads (head width a multiple of 4, for the 2-D RoPE).
        ffn_ratio (`float`): hidden width of each block's MLP, as a multiple of `embed_dim`.
        proj_dim (`int | None`): with a value, a 1x1 conv + BN projects every level to it; without,
            only the stride-32 level is projected, keeping `embed_dim`.
        interaction_indexes (`tuple[int, ...]`): the blocks whose outputs are averaged.
        depth (`int`): transformer blocks.
    """

    name: str = "ecvitt"
    embed_dim: int = 192
    num_heads: int = 3
    ffn_ratio: float = 4.0
    proj_dim: int | None = None
    interaction_indexes: tuple[int, ...] = (10, 11)
    depth: int = 12

    @property
    def out_channels(self) -> int:
        return self.proj_dim or self.embed_dim


# The ECDet hybrid encoder has no input projections and fuses maps by a sum through RepC3-style
# CSP blocks (official `csp_type: csp2`, `fuse_op: sum`); SiLU everywhere (`act: silu`).
_ECDET_ENCODER = EncoderSpec(enc_act="silu")
_ECDET_DECODER = DecoderSpec(
    num_layers=4, activation="silu", mlp_act="silu", dim_feedforward=2048, variant="ecdet"
)


@dataclass(frozen=True)
class ECDetSpec(ModelSpec):
    """Everything needed to build one ECDet network: `ModelSpec` with an ECViT backbone, so the
    input-size and memory rules and the class-count and size changes are D-FINE's."""

    family: ClassVar[str] = "ecdet"
    backbone: ViTSpec = field(default_factory=ViTSpec)  # type: ignore[assignment]
    encoder: EncoderSpec = _ECDET_ENCODER
    decoder: DecoderSpec = _ECDET_DECODER

    @property
    def backbone_label(self) -> str:
        return f"ECViT {self.backbone.name}"


def _size(
    size: str, vit: ViTSpec, hidden: int, encoder_ffn: int, expansion: float, depth_mult: float, ffn: int
):
    channels = (vit.out_channels,) * 3
    return ECDetSpec(
        size=size,
        backbone=vit,
        encoder=replace(
            _ECDET_ENCODER,
            in_channels=channels,
            hidden_dim=hidden,
            dim_feedforward=encoder_ffn,
            expansion=expansion,
            depth_mult=depth_mult,
        ),
        decoder=replace(_ECDET_DECODER, feat_channels=(hidden,) * 3, hidden_dim=hidden, dim_feedforward=ffn),
    )


# The only table of ECDet sizes. Columns: backbone, encoder hidden_dim, encoder dim_feedforward,
# expansion, depth_mult, decoder dim_feedforward.
ECDET_SIZES: dict[str, ECDetSpec] = {
    "s": _size("s", ViTSpec("ecvitt", 192, 3), 192, 512, 0.34, 0.67, 512),
    "m": _size("m", ViTSpec("ecvittplus", 256, 4), 256, 512, 0.75, 0.67, 1024),
    "l": _size("l", ViTSpec("ecvits", 384, 6, proj_dim=256), 256, 1024, 0.75, 1.0, 1024),
    "x": _size("x", ViTSpec("ecvitsplus", 384, 6, ffn_ratio=6.0, proj_dim=256), 256, 2048, 1.5, 1.0, 2048),
}
