"""Deploy-time folding of a BatchNorm (eval statistics) into the convolution before it."""

from __future__ import annotations

import torch
from torch import nn


def fuse_conv_bn(conv: nn.Conv2d, bn: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel and bias of the single conv equal to `bn(conv(x))` (bias-free conv, BN in eval mode).

    `bn` is a BatchNorm2d or a FrozenBatchNorm2d: both carry weight, bias, running statistics, eps.
    """
    std = (bn.running_var + bn.eps).sqrt()
    kernel = conv.weight * (bn.weight / std).reshape(-1, 1, 1, 1)
    bias = bn.bias - bn.running_mean * bn.weight / std  # this operation order matches official deploys
    return kernel, bias


@torch.no_grad()
def folded_conv(conv: nn.Conv2d, bn: nn.Module) -> nn.Conv2d:
    """A new conv with bias computing `bn(conv(x))`, on the conv's device."""
    fused = nn.Conv2d(
        conv.in_channels,
        conv.out_channels,
        conv.kernel_size,
        conv.stride,
        padding=conv.padding,
        groups=conv.groups,
        bias=True,
    )
    kernel, bias = fuse_conv_bn(conv, bn)
    fused.weight.copy_(kernel)
    fused.bias.copy_(bias)
    return fused.to(conv.weight.device)


def make_inplace(activation: nn.Module) -> None:
    """Let ReLU/SiLU overwrite their input (deploy only: the input is a fresh conv output there)."""
    if isinstance(activation, (nn.ReLU, nn.SiLU)):
        activation.inplace = True
