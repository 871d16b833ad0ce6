"""HybridEncoder: input projections, AIFI self-attention on the coarsest map, then CCFF (FPN + PAN).

Names follow the official implementation; every fusable conv/BN pair can be folded for deployment.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict

import torch
import torch.nn.functional as F
from torch import nn

from dfine_deploy.errors import ModelError
from dfine_deploy.model.fusion import folded_conv, fuse_conv_bn, make_inplace
from dfine_deploy.model.spec import EncoderSpec

_ACTIVATIONS = {"silu": nn.SiLU, "relu": nn.ReLU, "gelu": nn.GELU}


def make_activation(name: str | None) -> nn.Module:
    if name is None:
        return nn.Identity()
    if name.lower() not in _ACTIVATIONS:
        raise ModelError(f"unknown activation '{name}': expected one of {sorted(_ACTIVATIONS)}")
    return _ACTIVATIONS[name.lower()]()


class ConvNormLayer(nn.Module):
    """conv -> BN -> act (used inside RepVGG blocks, which fuse the pair themselves)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        groups: int = 1,
        padding: int | None = None,
        act: str | None = None,
    ):
        super().__init__()
        padding = (kernel_size - 1) // 2 if padding is None else padding
        self.conv = nn.Conv2d(
            in_channels, out_channels, kernel_size, stride, padding=padding, groups=groups, bias=False
        )
        self.norm = nn.BatchNorm2d(out_channels)
        self.act = make_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(self.norm(self.conv(x)))


class ConvNormLayerFuse(ConvNormLayer):
    """conv -> BN -> act; `convert_to_deploy` folds conv+BN into `conv_bn_fused`."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "conv_bn_fused"):
            return self.act(self.conv_bn_fused(x))
        return super().forward(x)

    @torch.no_grad()
    def convert_to_deploy(self) -> None:
        if hasattr(self, "conv_bn_fused"):
            return
        self.conv_bn_fused = folded_conv(self.conv, self.norm)
        make_inplace(self.act)
        del self.conv
        del self.norm


class VGGBlock(nn.Module):
    """RepVGG block: act(BN(3x3 conv) + BN(1x1 conv)); deploys as one 3x3 conv with bias."""

    def __init__(self, in_channels: int, out_channels: int, act: str = "relu"):
        super().__init__()
        self.conv1 = ConvNormLayer(in_channels, out_channels, 3, padding=1)
        self.conv2 = ConvNormLayer(in_channels, out_channels, 1, padding=0)
        self.act = make_activation(act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "conv"):
            return self.act(self.conv(x))
        return self.act(self.conv1(x) + self.conv2(x))

    @torch.no_grad()
    def convert_to_deploy(self) -> None:
        if hasattr(self, "conv"):
            return
        k3, b3 = fuse_conv_bn(self.conv1.conv, self.conv1.norm)
        k1, b1 = fuse_conv_bn(self.conv2.conv, self.conv2.norm)
        ref = self.conv1.conv
        fused = nn.Conv2d(ref.in_channels, ref.out_channels, 3, 1, padding=1, bias=True)
        fused.weight.copy_(k3 + F.pad(k1, [1, 1, 1, 1]))  # 1x1 kernel centred in a 3x3 one
        fused.bias.copy_(b3 + b1)
        self.conv = fused.to(ref.weight.device)
        make_inplace(self.act)
        del self.conv1
        del self.conv2


class CSPLayer(nn.Module):
    """Two 1x1 branches, one through `num_blocks` RepVGG blocks, summed."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int, act: str = "silu"):
        super().__init__()
        hidden = out_channels  # expansion 1.0: conv3 would be an identity, so it is omitted
        self.conv1 = ConvNormLayerFuse(in_channels, hidden, 1, act=act)
        self.conv2 = ConvNormLayerFuse(in_channels, hidden, 1, act=act)
        self.bottlenecks = nn.Sequential(*[VGGBlock(hidden, hidden, act=act) for _ in range(num_blocks)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.bottlenecks(self.conv1(x)) + self.conv2(x)


class RepNCSPELAN4(nn.Module):
    """GELAN block: split, two CSP+conv stages in series, concatenate all four parts, project."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int, num_blocks: int, act: str = "silu"):
        super().__init__()
        self.half = c3 // 2
        self.cv1 = ConvNormLayerFuse(c1, c3, 1, act=act)
        self.cv2 = nn.Sequential(
            CSPLayer(c3 // 2, c4, num_blocks, act), ConvNormLayerFuse(c4, c4, 3, act=act)
        )
        self.cv3 = nn.Sequential(CSPLayer(c4, c4, num_blocks, act), ConvNormLayerFuse(c4, c4, 3, act=act))
        self.cv4 = ConvNormLayerFuse(c3 + 2 * c4, c2, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.cv1(x).split((self.half, self.half), dim=1)
        mid = self.cv2(second)
        last = self.cv3(mid)
        return self.cv4(torch.cat([first, second, mid, last], dim=1))


class SCDown(nn.Module):
    """Spatial-channel decoupled downsampling: 1x1 conv, then depthwise k x k stride-s conv."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        self.cv1 = ConvNormLayerFuse(in_channels, out_channels, 1)
        self.cv2 = ConvNormLayerFuse(out_channels, out_channels, kernel_size, stride, groups=out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cv2(self.cv1(x))


class TransformerEncoderLayer(nn.Module):
    """Post-norm transformer layer; the position embedding is added to queries and keys only."""

    def __init__(self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, activation: str):
        super().__init__()
        self.self_attn = nn.MultiheadAttention(d_model, nhead, dropout=dropout, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.activation = make_activation(activation)

    def forward(self, src: torch.Tensor, pos_embed: torch.Tensor) -> torch.Tensor:
        q = k = src + pos_embed
        # need_weights=True keeps the official (non-fused) attention arithmetic for parity.
        attn, _ = self.self_attn(q, k, value=src)
        src = self.norm1(src + self.dropout1(attn))
        ffn = self.linear2(self.dropout(self.activation(self.linear1(src))))
        return self.norm2(src + self.dropout2(ffn))


class TransformerEncoder(nn.Module):
    def __init__(self, layer_factory, num_layers: int):
        super().__init__()
        self.layers = nn.ModuleList([layer_factory() for _ in range(num_layers)])

    def forward(self, src: torch.Tensor, pos_embed: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            src = layer(src, pos_embed)
        return src


def sincos_position_embedding(height: int, width: int, dim: int, temperature: float) -> torch.Tensor:
    """[1, H*W, dim] fixed 2-D sin-cos embedding, reproducing the official layout exactly.

    The official code builds an 'ij' meshgrid over (w, h), so token k (row-major over H x W) gets
    the pair (k // H, k % H): rows and columns only on square maps. Kept for checkpoint parity.
    """
    if dim % 4:
        raise ModelError(f"encoder hidden_dim {dim} must be divisible by 4 for the 2-D position embedding")
    quarter = dim // 4
    omega = 1.0 / (temperature ** (torch.arange(quarter, dtype=torch.float32) / quarter))
    token = torch.arange(height * width)
    first = (token // height).to(torch.float32)[:, None] * omega[None]  # [H*W, dim/4]
    second = (token % height).to(torch.float32)[:, None] * omega[None]
    return torch.cat([first.sin(), first.cos(), second.sin(), second.cos()], dim=1)[None]


class HybridEncoder(nn.Module):
    """Projects the backbone maps to `hidden_dim`, runs AIFI, and fuses them top-down then bottom-up."""

    @classmethod
    def from_spec(cls, spec: EncoderSpec, eval_spatial_size: tuple[int, int] | None = None) -> HybridEncoder:
        """The encoder a spec describes; the keyword signature below stays the official one."""
        return cls(**dataclasses.asdict(spec), eval_spatial_size=eval_spatial_size)

    def __init__(
        self,
        in_channels: tuple[int, ...] = (512, 1024, 2048),
        feat_strides: tuple[int, ...] = (8, 16, 32),
        hidden_dim: int = 256,
        nhead: int = 8,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        enc_act: str = "gelu",
        use_encoder_idx: tuple[int, ...] = (2,),
        num_encoder_layers: int = 1,
        pe_temperature: float = 10000,
        expansion: float = 1.0,
        depth_mult: float = 1.0,
        eval_spatial_size: tuple[int, int] | None = None,
    ):
        super().__init__()
        if len(in_channels) != len(feat_strides):
            raise ModelError(
                f"encoder in_channels {list(in_channels)} and feat_strides {list(feat_strides)} "
                "differ in length"
            )
        self.in_channels = tuple(in_channels)
        self.feat_strides = tuple(feat_strides)
        self.hidden_dim = hidden_dim
        self.use_encoder_idx = tuple(use_encoder_idx)
        self.num_encoder_layers = num_encoder_layers
        self.pe_temperature = pe_temperature
        self.eval_spatial_size = tuple(eval_spatial_size) if eval_spatial_size else None
        levels = len(in_channels)

        self.input_proj = nn.ModuleList(
            [
                nn.Sequential(
                    OrderedDict(
                        [
                            ("conv", nn.Conv2d(c, hidden_dim, 1, bias=False)),
                            ("norm", nn.BatchNorm2d(hidden_dim)),
                        ]
                    )
                )
                for c in in_channels
            ]
        )
        self.encoder = nn.ModuleList(
            [
                TransformerEncoder(
                    lambda: TransformerEncoderLayer(hidden_dim, nhead, dim_feedforward, dropout, enc_act),
                    num_encoder_layers,
                )
                for _ in self.use_encoder_idx
            ]
        )

        c4 = round(expansion * hidden_dim // 2)
        num_blocks = round(3 * depth_mult)

        def elan() -> RepNCSPELAN4:
            return RepNCSPELAN4(hidden_dim * 2, hidden_dim, hidden_dim * 2, c4, num_blocks)

        self.lateral_convs = nn.ModuleList(
            [ConvNormLayerFuse(hidden_dim, hidden_dim, 1) for _ in range(levels - 1)]
        )
        self.fpn_blocks = nn.ModuleList([elan() for _ in range(levels - 1)])
        self.downsample_convs = nn.ModuleList(
            [nn.Sequential(SCDown(hidden_dim, hidden_dim, 3, 2)) for _ in range(levels - 1)]
        )
        self.pan_blocks = nn.ModuleList([elan() for _ in range(levels - 1)])

        # Position embeddings for the configured eval size: non-persistent, like the official plain attribute.
        self._pos_cache_hw: dict[int, tuple[int, int]] = {}
        if self.eval_spatial_size:
            for idx in self.use_encoder_idx:
                stride = self.feat_strides[idx]
                hw = (self.eval_spatial_size[0] // stride, self.eval_spatial_size[1] // stride)
                self.register_buffer(f"pos_embed{idx}", self._position_embedding(*hw), persistent=False)
                self._pos_cache_hw[idx] = hw

    def _position_embedding(self, height: int, width: int) -> torch.Tensor:
        return sincos_position_embedding(height, width, self.hidden_dim, self.pe_temperature)

    def _pos_embed_for(self, idx: int, height: int, width: int, like: torch.Tensor) -> torch.Tensor:
        if not self.training and self._pos_cache_hw.get(idx) == (height, width):
            return getattr(self, f"pos_embed{idx}")
        return self._position_embedding(height, width).to(device=like.device, dtype=like.dtype)

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        if len(feats) != len(self.in_channels):
            raise ModelError(f"encoder expects {len(self.in_channels)} feature maps, got {len(feats)}")
        proj = [layer(feat) for layer, feat in zip(self.input_proj, feats)]

        for encoder, idx in zip(self.encoder, self.use_encoder_idx):
            _, _, height, width = proj[idx].shape
            tokens = proj[idx].flatten(2).permute(0, 2, 1)  # [B, H*W, C]
            pos = self._pos_embed_for(idx, height, width, tokens)
            memory = encoder(tokens, pos)
            proj[idx] = memory.permute(0, 2, 1).reshape(-1, self.hidden_dim, height, width).contiguous()

        # Top-down: the lateral conv output replaces the coarser map before it is upsampled.
        levels = len(self.in_channels)
        inner = [proj[-1]]
        for k, idx in enumerate(range(levels - 1, 0, -1)):
            top = self.lateral_convs[k](inner[0])
            inner[0] = top
            upsampled = F.interpolate(top, scale_factor=2.0, mode="nearest")
            inner.insert(0, self.fpn_blocks[k](torch.cat([upsampled, proj[idx - 1]], dim=1)))

        # Bottom-up.
        outs = [inner[0]]
        for k in range(levels - 1):
            down = self.downsample_convs[k](outs[-1])
            outs.append(self.pan_blocks[k](torch.cat([down, inner[k + 1]], dim=1)))
        return outs
