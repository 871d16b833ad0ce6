"""EdgeCrafter's ECDet detector: ECViT (`model/ecvit.py`) -> a hybrid encoder -> D-FINE's decoder in
its "ecdet" variant (`model/decoder.py`), built from an `ECDetSpec`.

Written from the EdgeCrafter paper (arXiv 2603.18739) and the public repository's module layout
(github.com/Intellindust-AI-Lab/EdgeCrafter, ecdetseg/engine/edgecrafter/); attribute names are the
official ones, so official ECDet checkpoints load unchanged.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from dfine_deploy.errors import ModelError
from dfine_deploy.model.decoder import DFINETransformer
from dfine_deploy.model.deformable import check_sampler
from dfine_deploy.model.dfine import DFINE, _check_spec
from dfine_deploy.model.ecdet_spec import ECDetSpec
from dfine_deploy.model.ecvit import ViTAdapter
from dfine_deploy.model.encoder import (
    ConvNormLayerFuse,
    SCDown,
    TransformerEncoder,
    TransformerEncoderLayer,
    VGGBlock,
    sincos_position_embedding,
)
from dfine_deploy.model.spec import EncoderSpec


class CSPLayer2(nn.Module):
    """One 1x1 conv to two halves; one half through `num_blocks` RepVGG blocks, added to the other
    (RepC3 in the YOLO repositories)."""

    def __init__(self, in_channels: int, out_channels: int, num_blocks: int, act: str):
        super().__init__()
        self.conv1 = ConvNormLayerFuse(in_channels, out_channels * 2, 1, act=act)
        self.bottlenecks = nn.Sequential(
            *[VGGBlock(out_channels, out_channels, act=act) for _ in range(num_blocks)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kept, worked = self.conv1(x).chunk(2, dim=1)
        return kept + self.bottlenecks(worked)


class FusionBlock(nn.Module):
    """GELAN block with CSPLayer2 stages and no 3x3 conv after them (official `RepNCSPELAN4`, csp2)."""

    def __init__(self, c1: int, c2: int, c3: int, c4: int, num_blocks: int, act: str):
        super().__init__()
        self.half = c3 // 2
        self.cv1 = ConvNormLayerFuse(c1, c3, 1, act=act)
        self.cv2 = nn.Sequential(CSPLayer2(c3 // 2, c4, num_blocks, act))
        self.cv3 = nn.Sequential(CSPLayer2(c4, c4, num_blocks, act))
        self.cv4 = ConvNormLayerFuse(c3 + 2 * c4, c2, 1, act=act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        first, second = self.cv1(x).split((self.half, self.half), dim=1)
        mid = self.cv2(second)
        return self.cv4(torch.cat([first, second, mid, self.cv3(mid)], dim=1))


class ECHybridEncoder(nn.Module):
    """Self-attention within the stride-32 map, then top-down and bottom-up fusion by sums; the maps
    arrive at `hidden_dim` already (the adapter projects them), so there are no input projections."""

    def __init__(self, spec: EncoderSpec, eval_spatial_size: tuple[int, int] | None):
        super().__init__()
        if set(spec.in_channels) != {spec.hidden_dim}:
            raise ModelError(
                f"ECDet encoder in_channels {list(spec.in_channels)} must all equal "
                f"hidden_dim {spec.hidden_dim}"
            )
        hidden, act, levels = spec.hidden_dim, spec.enc_act, len(spec.in_channels)
        self.hidden_dim = hidden
        self.feat_strides = tuple(spec.feat_strides)
        self.use_encoder_idx = tuple(spec.use_encoder_idx)
        self.pe_temperature = spec.pe_temperature
        self.encoder = nn.ModuleList(
            TransformerEncoder(
                lambda: TransformerEncoderLayer(hidden, spec.nhead, spec.dim_feedforward, spec.dropout, act),
                spec.num_encoder_layers,
            )
            for _ in self.use_encoder_idx
        )
        c4, num_blocks = round(spec.expansion * hidden // 2), round(3 * spec.depth_mult)
        self.lateral_convs = nn.ModuleList(ConvNormLayerFuse(hidden, hidden, 1) for _ in range(levels - 1))
        self.fpn_blocks = nn.ModuleList(
            FusionBlock(hidden, hidden, hidden * 2, c4, num_blocks, act) for _ in range(levels - 1)
        )
        self.downsample_convs = nn.ModuleList(
            nn.Sequential(SCDown(hidden, hidden, 3, 2)) for _ in range(levels - 1)
        )
        self.pan_blocks = nn.ModuleList(
            FusionBlock(hidden, hidden, hidden * 2, c4, num_blocks, act) for _ in range(levels - 1)
        )
        self._pos_hw: dict[int, tuple[int, int]] = {}
        if eval_spatial_size:
            for idx in self.use_encoder_idx:
                hw = (
                    eval_spatial_size[0] // self.feat_strides[idx],
                    eval_spatial_size[1] // self.feat_strides[idx],
                )
                self.register_buffer(f"pos_embed{idx}", self._position(*hw), persistent=False)
                self._pos_hw[idx] = hw

    def _position(self, height: int, width: int) -> torch.Tensor:
        return sincos_position_embedding(height, width, self.hidden_dim, self.pe_temperature)

    def forward(self, feats: list[torch.Tensor]) -> list[torch.Tensor]:
        feats = list(feats)
        for encoder, idx in zip(self.encoder, self.use_encoder_idx):
            _, _, height, width = feats[idx].shape
            tokens = feats[idx].flatten(2).permute(0, 2, 1)
            if not self.training and self._pos_hw.get(idx) == (height, width):
                pos = getattr(self, f"pos_embed{idx}")
            else:
                pos = self._position(height, width).to(device=tokens.device, dtype=tokens.dtype)
            memory = encoder(tokens, pos)
            feats[idx] = memory.permute(0, 2, 1).reshape(-1, self.hidden_dim, height, width).contiguous()

        levels = len(feats)
        inner = [feats[-1]]
        for k, idx in enumerate(range(levels - 1, 0, -1)):
            top = self.lateral_convs[k](inner[0])
            inner[0] = top
            upsampled = F.interpolate(top, scale_factor=2.0, mode="nearest")
            inner.insert(0, self.fpn_blocks[k](upsampled + feats[idx - 1]))
        outs = [inner[0]]
        for k in range(levels - 1):
            outs.append(self.pan_blocks[k](self.downsample_convs[k](outs[-1]) + inner[k + 1]))
        return outs


class ECDet(DFINE):
    """`forward(images [B,3,H,W] RGB in [0,1], targets=None)` -> the official output dict; deploys,
    exports and serves as D-FINE does. Registration order backbone, encoder, decoder is the official one."""

    def __init__(
        self, backbone: ViTAdapter, encoder: ECHybridEncoder, decoder: DFINETransformer, spec: ECDetSpec
    ):
        nn.Module.__init__(self)
        self.backbone = backbone
        self.encoder = encoder
        self.decoder = decoder
        self.spec = spec


def build_ecdet(spec: ECDetSpec, *, sampler: str = "grid") -> ECDet:
    """A freshly initialised ECDet for `spec`; weights are loaded separately."""
    _check_spec(spec)
    check_sampler(sampler)
    backbone = ViTAdapter(spec.backbone)
    if list(spec.encoder.in_channels) != backbone.out_channels:
        raise ModelError(
            f"ECDet encoder in_channels {list(spec.encoder.in_channels)} do not match the ViT adapter's "
            f"{backbone.out_channels} (ViTAdapter proj_dim or embed_dim)"
        )
    encoder = ECHybridEncoder(spec.encoder, spec.eval_spatial_size)
    decoder = DFINETransformer(
        **dataclasses.asdict(spec.decoder),
        num_classes=spec.num_classes,
        eval_spatial_size=spec.eval_spatial_size,
        sampler=sampler,
    )
    return ECDet(backbone, encoder, decoder, spec)
