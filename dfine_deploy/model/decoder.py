"""The D-FINE decoder (DFINETransformer): anchors, top-K query selection and denoising queries, fed to
the layer stack in `decoder_layers` (deformable decoder layers with FDR and LQE).

Attribute names follow the official implementation, so official state_dicts load unchanged.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from typing import TypedDict

import torch
from torch import nn

from dfine_deploy.errors import ModelError
from dfine_deploy.model.decoder_layers import (
    MLP,
    TransformerDecoder,
    TransformerDecoderLayer,
    prior_prob_bias,
)
from dfine_deploy.model.deformable import MSDeformableAttention, check_sampler
from dfine_deploy.model.denoising import contrastive_denoising_group
from dfine_deploy.model.spec import DecoderSpec


class Prediction(TypedDict):
    """One set of predictions: class logits [B, Q, C] and boxes [B, Q, 4] (cx, cy, w, h in [0, 1])."""

    pred_logits: torch.Tensor
    pred_boxes: torch.Tensor


class LayerOutput(Prediction):
    """A decoder layer's output in training. `pred_corners` [B, Q, 4 * (reg_max + 1)] are the edge
    distributions, `ref_points` [B, Q, 4] the boxes they refine; the teacher entries are the last
    layer's corners and logits, which self-distillation (DDF) pulls this layer towards."""

    pred_corners: torch.Tensor
    ref_points: torch.Tensor
    teacher_corners: torch.Tensor
    teacher_logits: torch.Tensor


class DenoisingMeta(TypedDict):
    """Where the denoising queries sit: `dn_num_split` = [denoising, matching] query counts."""

    dn_positive_idx: list[torch.Tensor]
    dn_num_group: int
    dn_num_split: list[int]


class _TrainingOutputBase(TypedDict):
    pred_logits: torch.Tensor
    pred_boxes: torch.Tensor
    pred_corners: torch.Tensor
    ref_points: torch.Tensor
    up: torch.Tensor  # the weighting function's fixed parameters (model/fdr.py)
    reg_scale: torch.Tensor
    aux_outputs: list[LayerOutput]  # every layer but the last
    enc_aux_outputs: list[Prediction]  # the encoder's top-k proposals
    pre_outputs: Prediction  # the boxes before the first layer refines them
    enc_meta: dict[str, bool]


class TrainingOutput(_TrainingOutputBase, total=False):
    """What the model returns in training, under the official key names the criterion reads; the
    `dn_` entries are there when denoising queries ran (`num_denoising > 0`)."""

    dn_outputs: list[LayerOutput]
    dn_pre_outputs: Prediction
    dn_meta: DenoisingMeta


def generate_anchors(
    spatial_shapes: list[list[int]],
    grid_size: float = 0.05,
    eps: float = 0.01,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unactivated anchor boxes [1, sum(HW), 4] (inf where invalid) and the valid mask [1, sum(HW), 1]."""
    anchors = []
    for level, (h, w) in enumerate(spatial_shapes):
        grid_y, grid_x = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        centers = (torch.stack([grid_x, grid_y], dim=-1).unsqueeze(0) + 0.5) / torch.tensor(
            [w, h], dtype=dtype
        )
        sizes = torch.ones_like(centers) * grid_size * (2.0**level)
        anchors.append(torch.cat([centers, sizes], dim=-1).reshape(-1, h * w, 4))
    boxes = torch.cat(anchors, dim=1).to(device)
    valid = ((boxes > eps) * (boxes < 1 - eps)).all(-1, keepdim=True)
    logits = torch.log(boxes / (1 - boxes))
    return torch.where(valid, logits, torch.inf), valid


@dataclasses.dataclass(frozen=True)
class DecoderVariant:
    """Where a family's decoder departs from D-FINE's (all else, FDR and LQE included, is shared).

    Attributes:
        heads: the heads, in the official registration order (the state_dict's); with `enc_output`,
            a Linear + LayerNorm on the encoder tokens before query selection.
        query_pos_width, query_pos_layers: `query_pos_head` is MLP(4, width x hidden_dim, hidden_dim,
            layers).
        query_pos_per_layer: the query position embedding is made again from each layer's boxes
            (D-FINE) or once from the selected anchors (ECDet).
        ffn_norm: the official name of each layer's last LayerNorm.
    """

    heads: tuple[str, ...]
    query_pos_width: int
    query_pos_layers: int
    query_pos_per_layer: bool
    ffn_norm: str


# The decoder families, by `DecoderSpec.variant`: D-FINE (and DEIM's D-FINE), and EdgeCrafter's ECDet
# (github.com/Intellindust-AI-Lab/EdgeCrafter, ecdetseg/engine/edgecrafter/decoder.py: ECTransformer).
_DFINE_HEADS = ("query_pos_head", "enc_output", "enc_score_head", "enc_bbox_head", "dec_score_head")
_ECDET_HEADS = ("enc_score_head", "enc_bbox_head", "query_pos_head", "pre_bbox_head", "dec_score_head")
DECODER_VARIANTS: dict[str, DecoderVariant] = {
    "dfine": DecoderVariant((*_DFINE_HEADS, "pre_bbox_head", "dec_bbox_head"), 2, 2, True, "norm3"),
    "ecdet": DecoderVariant((*_ECDET_HEADS, "dec_bbox_head"), 1, 3, False, "norm2"),
}


class DFINETransformer(nn.Module):
    """Decoder head of D-FINE: picks the top-K encoder tokens as queries and refines them."""

    @classmethod
    def from_spec(
        cls, spec: DecoderSpec, *, num_classes: int, eval_spatial_size: tuple[int, int], sampler: str = "grid"
    ) -> DFINETransformer:
        """The decoder a spec describes; the keyword signature below stays the official one."""
        return cls(
            **dataclasses.asdict(spec),
            num_classes=num_classes,
            eval_spatial_size=eval_spatial_size,
            sampler=sampler,
        )

    def __init__(
        self,
        num_classes: int = 80,
        hidden_dim: int = 256,
        num_queries: int = 300,
        feat_channels: tuple[int, ...] = (256, 256, 256),
        feat_strides: tuple[int, ...] = (8, 16, 32),
        num_levels: int = 3,
        num_points: tuple[int, ...] = (3, 6, 3),
        nhead: int = 8,
        num_layers: int = 6,
        dim_feedforward: int = 1024,
        dropout: float = 0.0,
        activation: str = "relu",
        mlp_act: str = "relu",
        num_denoising: int = 100,
        label_noise_ratio: float = 0.5,
        box_noise_scale: float = 1.0,
        eval_spatial_size: tuple[int, int] | None = (640, 640),
        eval_idx: int = -1,
        eps: float = 1e-2,
        reg_max: int = 32,
        reg_scale: float = 4.0,
        layer_scale: float = 1.0,
        query_select_method: str = "default",
        cross_attn_method: str = "default",
        sampler: str = "grid",
        variant: str = "dfine",
    ):
        super().__init__()
        if variant not in DECODER_VARIANTS:
            raise ModelError(f"decoder variant '{variant}': expected one of {', '.join(DECODER_VARIANTS)}")
        family = DECODER_VARIANTS[variant]
        if len(feat_channels) > num_levels or len(feat_strides) != len(feat_channels):
            raise ModelError(
                f"decoder feat_channels {list(feat_channels)} / feat_strides {list(feat_strides)} / "
                f"num_levels {num_levels} do not fit: one stride per channel entry, at most num_levels"
            )
        if query_select_method != "default" or cross_attn_method != "default":
            raise ModelError(
                f"decoder query_select_method '{query_select_method}' / cross_attn_method "
                f"'{cross_attn_method}': only 'default' (the shipped D-FINE configs) is supported"
            )
        if layer_scale != 1 and eval_idx not in (-1, num_layers - 1):
            raise ModelError("decoder layer_scale != 1 with a non-final eval_idx is not supported")
        strides = list(feat_strides)
        while len(strides) < num_levels:
            strides.append(strides[-1] * 2)
        self.num_classes = num_classes
        self.hidden_dim = hidden_dim
        self.num_queries = num_queries
        self.feat_strides = strides
        self.num_levels = num_levels
        self.num_layers = num_layers
        self.eps = eps
        self.reg_max = reg_max
        self.eval_spatial_size = tuple(eval_spatial_size) if eval_spatial_size else None
        self.eval_idx = eval_idx if eval_idx >= 0 else num_layers + eval_idx

        self.input_proj = self._build_input_proj(feat_channels)
        self.up = nn.Parameter(torch.tensor([0.5]), requires_grad=False)
        # Official YAML writes reg_scale as an integer, which makes this an int64 tensor.
        scale_value = int(reg_scale) if float(reg_scale).is_integer() else float(reg_scale)
        self.reg_scale = nn.Parameter(torch.tensor([scale_value]), requires_grad=False)
        self.decoder = TransformerDecoder(
            hidden_dim,
            lambda: TransformerDecoderLayer(
                hidden_dim,
                nhead,
                dim_feedforward,
                dropout,
                activation,
                num_levels,
                tuple(num_points),
                sampler,
                family.ffn_norm,
            ),
            num_layers,
            nhead,
            reg_max,
            self.reg_scale,
            self.up,
            self.eval_idx,
            activation,
            family.query_pos_per_layer,
        )
        self.num_denoising = num_denoising
        self.label_noise_ratio = label_noise_ratio
        self.box_noise_scale = box_noise_scale
        if num_denoising > 0:
            self.denoising_class_embed = nn.Embedding(num_classes + 1, hidden_dim, padding_idx=num_classes)
            nn.init.normal_(self.denoising_class_embed.weight[:-1])
        heads = {
            "query_pos_head": lambda: MLP(
                4, family.query_pos_width * hidden_dim, hidden_dim, family.query_pos_layers, mlp_act
            ),
            "enc_output": lambda: nn.Sequential(
                OrderedDict([("proj", nn.Linear(hidden_dim, hidden_dim)), ("norm", nn.LayerNorm(hidden_dim))])
            ),
            "enc_score_head": lambda: nn.Linear(hidden_dim, num_classes),
            "enc_bbox_head": lambda: MLP(hidden_dim, hidden_dim, 4, 3, mlp_act),
            "dec_score_head": lambda: nn.ModuleList(
                [nn.Linear(hidden_dim, num_classes) for _ in range(num_layers)]
            ),
            "pre_bbox_head": lambda: MLP(hidden_dim, hidden_dim, 4, 3, mlp_act),
            "dec_bbox_head": lambda: nn.ModuleList(
                [MLP(hidden_dim, hidden_dim, 4 * (reg_max + 1), 3, mlp_act) for _ in range(num_layers)]
            ),
        }
        self.enc_output = None
        for name in family.heads:  # the official registration order, which is the state_dict's
            setattr(self, name, heads[name]())
        self._anchor_shapes: list[list[int]] | None = None
        if self.eval_spatial_size:
            self._anchor_shapes = self._eval_spatial_shapes()
            anchors, valid_mask = generate_anchors(self._anchor_shapes, eps=eps)
            self.register_buffer("anchors", anchors)
            self.register_buffer("valid_mask", valid_mask)
        self._reset_parameters(feat_channels)

    def _build_input_proj(self, feat_channels: tuple[int, ...]) -> nn.ModuleList:
        layers = nn.ModuleList()
        for channels in feat_channels:
            if channels == self.hidden_dim:
                layers.append(nn.Identity())
            else:
                layers.append(
                    nn.Sequential(
                        OrderedDict(
                            [
                                ("conv", nn.Conv2d(channels, self.hidden_dim, 1, bias=False)),
                                ("norm", nn.BatchNorm2d(self.hidden_dim)),
                            ]
                        )
                    )
                )
        channels = feat_channels[-1]
        for _ in range(self.num_levels - len(feat_channels)):  # extra coarser levels
            layers.append(
                nn.Sequential(
                    OrderedDict(
                        [
                            ("conv", nn.Conv2d(channels, self.hidden_dim, 3, 2, padding=1, bias=False)),
                            ("norm", nn.BatchNorm2d(self.hidden_dim)),
                        ]
                    )
                )
            )
            channels = self.hidden_dim
        return layers

    def _reset_parameters(self, feat_channels: tuple[int, ...]) -> None:
        bias = prior_prob_bias(0.01)
        nn.init.constant_(self.enc_score_head.bias, bias)
        for head in [self.enc_bbox_head, self.pre_bbox_head, *self.dec_bbox_head]:
            nn.init.constant_(head.layers[-1].weight, 0)
            nn.init.constant_(head.layers[-1].bias, 0)
        for head in self.dec_score_head:
            nn.init.constant_(head.bias, bias)
        if self.enc_output is not None:
            nn.init.xavier_uniform_(self.enc_output.proj.weight)
        for layer in self.query_pos_head.layers:
            nn.init.xavier_uniform_(layer.weight)
        for layer, channels in zip(self.input_proj, feat_channels):
            if channels != self.hidden_dim:
                nn.init.xavier_uniform_(layer.conv.weight)

    def _eval_spatial_shapes(self) -> list[list[int]]:
        height, width = self.eval_spatial_size
        return [[int(height / s), int(width / s)] for s in self.feat_strides]

    def convert_to_deploy(self) -> None:
        """Drop the score heads of layers before eval_idx (their outputs are never used at inference)."""
        self.dec_score_head = nn.ModuleList(
            [nn.Identity()] * self.eval_idx + [self.dec_score_head[self.eval_idx]]
        )
        self.dec_bbox_head = nn.ModuleList(
            [head if i <= self.eval_idx else nn.Identity() for i, head in enumerate(self.dec_bbox_head)]
        )

    def _flatten_features(self, feats: list[torch.Tensor]) -> tuple[torch.Tensor, list[list[int]]]:
        proj = [layer(feat) for layer, feat in zip(self.input_proj, feats)]
        for layer in self.input_proj[len(proj) :]:
            proj.append(layer(feats[-1] if len(proj) == len(feats) else proj[-1]))
        shapes = [[p.shape[2], p.shape[3]] for p in proj]
        memory = torch.cat([p.flatten(2).permute(0, 2, 1) for p in proj], dim=1)  # [B, sum(HW), C]
        return memory, shapes

    def _anchors_for(
        self, shapes: list[list[int]], memory: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Cached anchors in eval at the configured size; otherwise made for the actual maps."""
        if not self.training and self._anchor_shapes is not None and shapes == self._anchor_shapes:
            return self.anchors, self.valid_mask
        return generate_anchors(shapes, eps=self.eps, device=memory.device)

    def _select_queries(self, memory: torch.Tensor, shapes: list[list[int]]):
        if not torch.jit.is_tracing() and memory.shape[1] < self.num_queries:
            raise ModelError(
                f"the input gives {memory.shape[1]} feature tokens (maps {shapes}) but the decoder selects "
                f"num_queries={self.num_queries}: use a larger input size, or lower "
                "DFINETransformer.num_queries (and DFINEPostProcessor.num_top_queries)"
            )
        anchors, valid_mask = self._anchors_for(shapes, memory)
        memory = valid_mask.to(memory.dtype) * memory  # invalid tokens are zeroed, not excluded
        output_memory = memory if self.enc_output is None else self.enc_output(memory)
        enc_logits = self.enc_score_head(output_memory)  # [B, L, C]
        _, topk = torch.topk(enc_logits.max(-1).values, self.num_queries, dim=-1)  # [B, K]
        topk_memory = output_memory.gather(1, topk.unsqueeze(-1).expand(-1, -1, output_memory.shape[-1]))
        topk_anchors = anchors.expand(memory.shape[0], -1, -1).gather(1, topk.unsqueeze(-1).expand(-1, -1, 4))
        bbox_unact = self.enc_bbox_head(topk_memory) + topk_anchors
        enc_outputs = None
        if self.training:
            topk_logits = enc_logits.gather(1, topk.unsqueeze(-1).expand(-1, -1, enc_logits.shape[-1]))
            enc_outputs = [{"pred_logits": topk_logits, "pred_boxes": torch.sigmoid(bbox_unact)}]
        return topk_memory.detach(), bbox_unact.detach(), enc_outputs

    def forward(
        self, feats: list[torch.Tensor], targets: list[dict[str, torch.Tensor]] | None = None
    ) -> Prediction | TrainingOutput:
        """Inference: the eval layer's `Prediction`; training: the full `TrainingOutput`."""
        memory, shapes = self._flatten_features(feats)
        dn_content = dn_boxes = attn_mask = dn_meta = None
        if self.training and self.num_denoising > 0:
            if targets is None:
                raise ModelError("training with denoising needs targets: call model(images, targets)")
            dn_content, dn_boxes, attn_mask, dn_meta = contrastive_denoising_group(
                targets,
                self.num_classes,
                self.num_queries,
                self.denoising_class_embed,
                self.num_denoising,
                self.label_noise_ratio,
                self.box_noise_scale,
            )
        content, ref_unact, enc_outputs = self._select_queries(memory, shapes)
        if dn_content is not None:
            content = torch.cat([dn_content, content], dim=1)
            ref_unact = torch.cat([dn_boxes, ref_unact], dim=1)

        dec = self.decoder(
            content,
            ref_unact,
            memory,
            shapes,
            self.dec_bbox_head,
            self.dec_score_head,
            self.query_pos_head,
            self.pre_bbox_head,
            attn_mask=attn_mask,
        )
        boxes, logits, corners, refs = dec["boxes"], dec["logits"], dec["corners"], dec["refs"]
        if not self.training:
            return {"pred_logits": logits[-1], "pred_boxes": boxes[-1]}

        pre_logits, pre_boxes = dec["pre_logits"], dec["pre_boxes"]
        if dn_meta is not None:
            split = dn_meta["dn_num_split"]
            dn_pre_logits, pre_logits = pre_logits.split(split, dim=1)
            dn_pre_boxes, pre_boxes = pre_boxes.split(split, dim=1)
            dn_logits, logits = logits.split(split, dim=2)
            dn_boxes_all, boxes = boxes.split(split, dim=2)
            dn_corners, corners = corners.split(split, dim=2)
            dn_refs, refs = refs.split(split, dim=2)
        out: TrainingOutput = {
            "pred_logits": logits[-1],
            "pred_boxes": boxes[-1],
            "pred_corners": corners[-1],
            "ref_points": refs[-1],
            "up": self.up,
            "reg_scale": self.reg_scale,
            "aux_outputs": _layer_outputs(
                logits[:-1], boxes[:-1], corners[:-1], refs[:-1], corners[-1], logits[-1]
            ),
            "enc_aux_outputs": enc_outputs,
            "pre_outputs": {"pred_logits": pre_logits, "pred_boxes": pre_boxes},
            "enc_meta": {"class_agnostic": False},
        }
        if dn_meta is not None:
            out["dn_outputs"] = _layer_outputs(
                dn_logits, dn_boxes_all, dn_corners, dn_refs, dn_corners[-1], dn_logits[-1]
            )
            out["dn_pre_outputs"] = {"pred_logits": dn_pre_logits, "pred_boxes": dn_pre_boxes}
            out["dn_meta"] = dn_meta
        return out

    def set_sampler(self, sampler: str) -> None:
        check_sampler(sampler)
        for module in self.modules():
            if isinstance(module, MSDeformableAttention):
                module.sampler = sampler


def _layer_outputs(logits, boxes, corners, refs, teacher_corners, teacher_logits) -> list[LayerOutput]:
    """Per-layer output dicts; each carries the last layer's corners/logits as its distillation teacher."""
    return [
        {
            "pred_logits": logit,
            "pred_boxes": box,
            "pred_corners": corner,
            "ref_points": ref,
            "teacher_corners": teacher_corners,
            "teacher_logits": teacher_logits,
        }
        for logit, box, corner, ref in zip(logits, boxes, corners, refs)
    ]
