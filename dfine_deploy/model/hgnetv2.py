"""HGNetv2 backbone (B0/B2/B4/B5) with learnable affine blocks and the official freezing options.

Module and attribute names follow the official implementation so its state_dicts load unchanged.
Read bottom-up: conv blocks -> HG block -> stage -> backbone. The table of variants (widths,
depths, strides) is `HGNETV2_VARIANTS` in the torch-free `spec.py`, which config checks read too.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from dfine_deploy.errors import ModelError
from dfine_deploy.model.fusion import fuse_conv_bn, make_inplace
from dfine_deploy.model.spec import HGNETV2_VARIANTS, BackboneSpec, StageSpec


class FrozenBatchNorm2d(nn.Module):
    """BatchNorm2d with fixed statistics and affine terms, all buffers (no num_batches_tracked)."""

    def __init__(self, num_features: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # Checkpoints made with a plain BatchNorm carry a counter this module has no use for.
        state_dict.pop(prefix + "num_batches_tracked", None)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        shift = self.bias - self.running_mean * scale
        return x * scale.reshape(1, -1, 1, 1) + shift.reshape(1, -1, 1, 1)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"


class LearnableAffineBlock(nn.Module):
    """`scale * x + bias` with two learnable scalars (the "LAB" of HGNetv2)."""

    def __init__(self, scale: float = 1.0, bias: float = 0.0):
        super().__init__()
        self.scale = nn.Parameter(torch.tensor([scale]))
        self.bias = nn.Parameter(torch.tensor([bias]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x + self.bias


class ConvBNAct(nn.Module):
    """Bias-free conv -> BN -> ReLU -> LAB; act and LAB are skipped when `use_act` is False.

    `convert_to_deploy` folds the BN into the conv (the official deploy leaves it unfused). The
    folded kernel and bias are non-persistent buffers, so the state_dict keeps the official keys.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        stride: int = 1,
        groups: int = 1,
        use_act: bool = True,
        use_lab: bool = False,
    ):
        super().__init__()
        self.conv = nn.Conv2d(
            in_channels,
            out_channels,
            kernel_size,
            stride,
            padding=(kernel_size - 1) // 2,
            groups=groups,
            bias=False,
        )
        self.bn = nn.BatchNorm2d(out_channels)
        self.act = nn.ReLU() if use_act else nn.Identity()
        self.lab = LearnableAffineBlock() if use_act and use_lab else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if hasattr(self, "folded_weight"):
            conv = self.conv
            x = F.conv2d(x, self.folded_weight, self.folded_bias, conv.stride, conv.padding, 1, conv.groups)
        else:
            x = self.bn(self.conv(x))
        return self.lab(self.act(x))

    @torch.no_grad()
    def convert_to_deploy(self) -> None:
        if hasattr(self, "folded_weight"):
            return
        kernel, bias = fuse_conv_bn(self.conv, self.bn)
        self.register_buffer("folded_weight", kernel.detach().clone(), persistent=False)
        self.register_buffer("folded_bias", bias.detach().clone(), persistent=False)
        make_inplace(self.act)


class LightConvBNAct(nn.Module):
    """1x1 projection (no activation) followed by a depthwise k x k conv with activation."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, use_lab: bool = False):
        super().__init__()
        self.conv1 = ConvBNAct(in_channels, out_channels, 1, use_act=False, use_lab=use_lab)
        self.conv2 = ConvBNAct(out_channels, out_channels, kernel_size, groups=out_channels, use_lab=use_lab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(self.conv1(x))


class StemBlock(nn.Module):
    """Stride-4 stem: a conv, then a max-pool branch and a two-conv branch, concatenated."""

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, use_lab: bool = False):
        super().__init__()
        self.stem1 = ConvBNAct(in_channels, mid_channels, 3, stride=2, use_lab=use_lab)
        self.stem2a = ConvBNAct(mid_channels, mid_channels // 2, 2, use_lab=use_lab)
        self.stem2b = ConvBNAct(mid_channels // 2, mid_channels, 2, use_lab=use_lab)
        self.stem3 = ConvBNAct(mid_channels * 2, mid_channels, 3, stride=2, use_lab=use_lab)
        self.stem4 = ConvBNAct(mid_channels, out_channels, 1, use_lab=use_lab)
        self.pool = nn.MaxPool2d(kernel_size=2, stride=1, ceil_mode=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.pad(self.stem1(x), (0, 1, 0, 1))  # 2x2 kernels keep the size with right/bottom padding
        branch = F.pad(self.stem2a(x), (0, 1, 0, 1))
        branch = self.stem2b(branch)
        pooled = self.pool(x)
        return self.stem4(self.stem3(torch.cat([pooled, branch], dim=1)))


class HGBlock(nn.Module):
    """A chain of convs whose input and outputs are concatenated, then squeezed by two 1x1 convs."""

    def __init__(
        self,
        in_channels: int,
        mid_channels: int,
        out_channels: int,
        layer_num: int,
        kernel_size: int,
        residual: bool,
        light_block: bool,
        use_lab: bool,
    ):
        super().__init__()
        self.residual = residual
        self.layers = nn.ModuleList()
        for i in range(layer_num):
            layer_in = in_channels if i == 0 else mid_channels
            if light_block:
                self.layers.append(LightConvBNAct(layer_in, mid_channels, kernel_size, use_lab))
            else:
                self.layers.append(ConvBNAct(layer_in, mid_channels, kernel_size, use_lab=use_lab))
        total = in_channels + layer_num * mid_channels
        # Official HGNetv2 builds its stages positionally, which leaves the "se" aggregation on.
        self.aggregation = nn.Sequential(
            ConvBNAct(total, out_channels // 2, 1, use_lab=use_lab),
            ConvBNAct(out_channels // 2, out_channels, 1, use_lab=use_lab),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = [x]
        y = x
        for layer in self.layers:
            y = layer(y)
            outputs.append(y)
        y = self.aggregation(torch.cat(outputs, dim=1))
        return y + x if self.residual else y


class HGStage(nn.Module):
    """Optional depthwise stride-2 downsample, then `num_blocks` HG blocks (all but the first residual)."""

    def __init__(self, cfg: StageSpec, use_lab: bool):
        super().__init__()
        if cfg.downsample:
            self.downsample = ConvBNAct(
                cfg.in_channels,
                cfg.in_channels,
                3,
                stride=2,
                groups=cfg.in_channels,
                use_act=False,
                use_lab=use_lab,
            )
        else:
            self.downsample = nn.Identity()
        self.blocks = nn.Sequential(
            *[
                HGBlock(
                    cfg.in_channels if i == 0 else cfg.out_channels,
                    cfg.mid_channels,
                    cfg.out_channels,
                    cfg.layer_num,
                    cfg.kernel_size,
                    residual=i > 0,
                    light_block=cfg.light_block,
                    use_lab=use_lab,
                )
                for i in range(cfg.num_blocks)
            ]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks(self.downsample(x))


def _freeze_norm(module: nn.Module) -> nn.Module:
    """Replace every BatchNorm2d below `module` by a fresh FrozenBatchNorm2d (in place)."""
    if isinstance(module, nn.BatchNorm2d):
        return FrozenBatchNorm2d(module.num_features, module.eps)
    for name, child in module.named_children():
        replacement = _freeze_norm(child)
        if replacement is not child:
            setattr(module, name, replacement)
    return module


class HGNetv2(nn.Module):
    """The backbone: stem + four stages; returns the stage outputs listed in `return_idx`."""

    @classmethod
    def from_spec(cls, spec: BackboneSpec) -> HGNetv2:
        """The backbone a spec describes (`pretrained` aside: weights come from checkpoints)."""
        fields = {k: v for k, v in dataclasses.asdict(spec).items() if k != "pretrained"}
        return cls(**fields)

    def __init__(
        self,
        name: str = "B4",
        use_lab: bool = False,
        return_idx: tuple[int, ...] = (1, 2, 3),
        freeze_at: int = -1,
        freeze_stem_only: bool = True,
        freeze_norm: bool = False,
    ):
        super().__init__()
        if name not in HGNETV2_VARIANTS:
            raise ModelError(f"unknown HGNetv2 variant '{name}': expected one of {sorted(HGNETV2_VARIANTS)}")
        if not return_idx or any(i not in range(4) for i in return_idx):
            raise ModelError(f"HGNetv2 return_idx {list(return_idx)}: expected indices in 0..3")
        variant = HGNETV2_VARIANTS[name]
        self.return_idx = tuple(return_idx)
        self.stem = StemBlock(*variant.stem_channels, use_lab=use_lab)
        self.stages = nn.ModuleList([HGStage(cfg, use_lab) for cfg in variant.stages])
        # (channels, stride) of each returned map, for the encoder to check against its spec.
        self.feature_info = list(variant.feature_info(self.return_idx))

        if freeze_at >= 0:
            self.stem.requires_grad_(False)
            if not freeze_stem_only:
                for stage in self.stages[: freeze_at + 1]:
                    stage.requires_grad_(False)
        if freeze_norm:
            _freeze_norm(self)

    @property
    def out_channels(self) -> list[int]:
        return [c for c, _ in self.feature_info]

    @property
    def out_strides(self) -> list[int]:
        return [s for _, s in self.feature_info]

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        outs = []
        for idx, stage in enumerate(self.stages):
            x = stage(x)
            if idx in self.return_idx:
                outs.append(x)
        return outs
