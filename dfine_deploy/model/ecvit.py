"""ECViT, EdgeCrafter's compact ViT backbone, and the adapter that turns its tokens into three maps.

Written from the EdgeCrafter paper (arXiv 2603.18739) and the public repository's module layout
(github.com/Intellindust-AI-Lab/EdgeCrafter, ecdetseg/engine/edgecrafter/ecvit.py); attribute
names are the official ones, so official state_dicts load unchanged.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dfine_deploy.errors import ModelError
from dfine_deploy.model.ecdet_spec import ViTSpec
from dfine_deploy.model.encoder import ConvNormLayerFuse

PATCH_SIZE = 16
ROPE_BASE = 100.0
LAYER_NORM_EPS = 1e-6


class ConvPyramidPatchEmbed(nn.Module):
    """Three stride-2 conv+BN+ReLU layers widening to embed_dim/2, then a stride-2 3x3 conv: 16x16 patches."""

    def __init__(self, embed_dim: int):
        super().__init__()
        widths = [embed_dim // 8, embed_dim // 4, embed_dim // 2]
        self.convs = nn.ModuleList(
            ConvNormLayerFuse(c_in, c_out, 3, 2, act="relu") for c_in, c_out in zip([3, *widths[:-1]], widths)
        )
        self.proj = nn.Conv2d(widths[-1], embed_dim, kernel_size=3, stride=2, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = conv(x)
        return self.proj(x)


class RopePositionEmbedding(nn.Module):
    """2-D rotary embedding: patch centres in [-1, 1] per axis (each side normalised separately),
    rotated by angles 2*pi*coord/period, one period per quarter of the head width."""

    def __init__(self, embed_dim: int, num_heads: int):
        super().__init__()
        head_dim = embed_dim // num_heads
        if head_dim % 4:
            raise ModelError(
                f"ViT head width {head_dim} (embed_dim / num_heads) must be a multiple of 4 for RoPE"
            )
        quarter = head_dim // 4
        periods = ROPE_BASE ** (2 * torch.arange(quarter, dtype=torch.float32) / (head_dim // 2))
        self.register_buffer("periods", periods)

    def forward(self, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """sin and cos [1, 1, H*W, head_dim] for the patch tokens, row-major."""
        device, dtype = self.periods.device, self.periods.dtype
        rows = torch.arange(0.5, height, device=device, dtype=dtype) / height
        cols = torch.arange(0.5, width, device=device, dtype=dtype) / width
        coords = torch.stack(torch.meshgrid(rows, cols, indexing="ij"), dim=-1).flatten(0, 1) * 2.0 - 1.0
        angles = 2 * math.pi * coords[:, :, None] / self.periods[None, None, :]  # [HW, 2, quarter]
        angles = angles.flatten(1, 2).repeat(1, 2)  # [HW, head_dim]
        return angles.sin()[None, None], angles.cos()[None, None]


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-second, first], dim=-1) * sin


class Attention(nn.Module):
    """Multi-head self-attention; RoPE turns the queries and keys of the patch tokens (not the register)."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, dim * 3)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        batch, tokens, dim = x.shape
        qkv = self.qkv(x).reshape(batch, tokens, 3, self.num_heads, dim // self.num_heads)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))  # [B, heads, N, head_dim]
        sin, cos = rope
        q = torch.cat([q[:, :, :1], _rotate(q[:, :, 1:], sin, cos)], dim=2)
        k = torch.cat([k[:, :, :1], _rotate(k[:, :, 1:], sin, cos)], dim=2)
        out = F.scaled_dot_product_attention(q, k, v)
        return self.proj(out.transpose(1, 2).reshape(batch, tokens, dim))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    """Pre-norm transformer block."""

    def __init__(self, dim: int, num_heads: int, ffn_ratio: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim, eps=LAYER_NORM_EPS)
        self.mlp = Mlp(dim, int(dim * ffn_ratio))

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rope)
        return x + self.mlp(self.norm2(x))


class VisionTransformer(nn.Module):
    """Patch tokens plus one learned register token through `depth` blocks; returns the patch tokens
    of the blocks in `return_layers`."""

    def __init__(self, spec: ViTSpec):
        super().__init__()
        self.return_layers = tuple(spec.interaction_indexes)
        self.patch_embed = ConvPyramidPatchEmbed(spec.embed_dim)
        self.register_token = nn.Parameter(torch.zeros(1, 1, spec.embed_dim))
        self.blocks = nn.ModuleList(
            Block(spec.embed_dim, spec.num_heads, spec.ffn_ratio) for _ in range(spec.depth)
        )
        self.rope_embed = RopePositionEmbedding(spec.embed_dim, spec.num_heads)
        nn.init.trunc_normal_(self.register_token, std=0.02)
        for module in self.blocks.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        patches = self.patch_embed(images)
        height, width = patches.shape[-2:]
        tokens = patches.flatten(2).transpose(1, 2)
        x = torch.cat([self.register_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        rope = self.rope_embed(int(height), int(width))
        outs = []
        for i, block in enumerate(self.blocks):
            x = block(x, rope)
            if i in self.return_layers:
                outs.append(x[:, 1:])
        return outs


class ViTAdapter(nn.Module):
    """ECViT -> three maps at strides 8, 16, 32: the chosen blocks' tokens averaged into one stride-16
    map, resized bilinearly by 2, 1 and 1/2, then projected (every level with `proj_dim`, else only
    the stride-32 one)."""

    def __init__(self, spec: ViTSpec):
        super().__init__()
        self.backbone = VisionTransformer(spec)
        widths = [spec.proj_dim] * 3 if spec.proj_dim is not None else [spec.embed_dim]
        self.projector = nn.ModuleList(ConvNormLayerFuse(spec.embed_dim, w, 1) for w in widths)
        self.out_channels = [spec.out_channels] * 3
        self.out_strides = [8, 16, 32]

    def forward(self, images: torch.Tensor) -> list[torch.Tensor]:
        batch, _, height, width = images.shape
        rows, cols = height // PATCH_SIZE, width // PATCH_SIZE
        fused = torch.stack(self.backbone(images)).mean(dim=0)
        fused = fused.transpose(1, 2).reshape(batch, -1, rows, cols)
        maps = [
            F.interpolate(
                fused, size=[int(rows * scale), int(cols * scale)], mode="bilinear", align_corners=False
            )
            for scale in (2.0, 1.0, 0.5)
        ]
        if len(self.projector) == 1:
            maps[-1] = self.projector[0](maps[-1])
        else:
            maps = [proj(m) for proj, m in zip(self.projector, maps)]
        return maps
