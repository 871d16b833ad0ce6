"""The D-FINE decoder's building blocks: the decoder layer (self-attention, deformable cross-attention, gate,
FFN), the layer stack that refines boxes with FDR, and the LQE score head. `decoder.DFINETransformer`
assembles them with query selection.

Attribute names follow the official implementation, so official state_dicts load unchanged.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dfine_deploy.errors import ModelError
from dfine_deploy.model.box_ops import inverse_sigmoid
from dfine_deploy.model.deformable import MSDeformableAttention
from dfine_deploy.model.fdr import (
    distance2bbox,
    integral,
    weighting_constant,
    weighting_function,
)


def prior_prob_bias(prob: float) -> float:
    """Bias that makes sigmoid output `prob` at init."""
    return float(-math.log((1 - prob) / prob))


# The activations the decoder can use: D-FINE's is ReLU everywhere; DEIM's D-FINE models
# (github.com/ShihuaHuang95/DEIM, configs/base/deim.yml) use SiLU in the FFN, the LQE and the MLP heads.
ACTIVATIONS = {"relu": F.relu, "silu": F.silu}


def activation_function(name: str, what: str):
    """The function for `name`, or a one-line ModelError naming the choices."""
    if name not in ACTIVATIONS:
        raise ModelError(
            f"decoder {what} '{name}' is not supported: use one of {', '.join(ACTIVATIONS)} "
            "(D-FINE uses 'relu', DEIM's D-FINE models 'silu')"
        )
    return ACTIVATIONS[name]


class MLP(nn.Module):
    """`num_layers` linear layers with an activation (ReLU unless told) between them."""

    def __init__(self, input_dim: int, hidden_dim: int, output_dim: int, num_layers: int, act: str = "relu"):
        super().__init__()
        dims_in = [input_dim] + [hidden_dim] * (num_layers - 1)
        dims_out = [hidden_dim] * (num_layers - 1) + [output_dim]
        self.layers = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims_in, dims_out))
        self.act = activation_function(act, "mlp_act")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = layer(x) if i == last else self.act(layer(x))
        return x


class Gate(nn.Module):
    """Gated fusion of the self-attention and cross-attention streams (replaces residual + norm2)."""

    def __init__(self, dim: int):
        super().__init__()
        self.gate = nn.Linear(2 * dim, 2 * dim)
        nn.init.constant_(self.gate.bias, prior_prob_bias(0.5))
        nn.init.constant_(self.gate.weight, 0)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        gates = torch.sigmoid(self.gate(torch.cat([x1, x2], dim=-1)))
        gate1, gate2 = gates.chunk(2, dim=-1)
        return self.norm(gate1 * x1 + gate2 * x2)


class LQE(nn.Module):
    """Location Quality Estimator: adds a score from the sharpness of the edge distributions."""

    def __init__(self, k: int, hidden_dim: int, num_layers: int, reg_max: int, act: str = "relu"):
        super().__init__()
        self.k = k
        self.reg_max = reg_max
        self.reg_conf = MLP(4 * (k + 1), hidden_dim, 1, num_layers, act)
        nn.init.constant_(self.reg_conf.layers[-1].bias, 0)
        nn.init.constant_(self.reg_conf.layers[-1].weight, 0)

    def forward(self, scores: torch.Tensor, pred_corners: torch.Tensor) -> torch.Tensor:
        batch, queries, _ = pred_corners.shape
        prob = F.softmax(pred_corners.reshape(batch, queries, 4, self.reg_max + 1), dim=-1)
        top, _ = prob.topk(self.k, dim=-1)
        stat = torch.cat([top, top.mean(dim=-1, keepdim=True)], dim=-1)  # [B, Q, 4, k+1]
        return scores + self.reg_conf(stat.reshape(batch, queries, -1))


class TransformerDecoderLayer(nn.Module):
    """Self-attention, deformable cross-attention fused by a gate, then a clamped FFN."""

    def __init__(
        self,
        d_model: int,
        n_head: int,
        dim_feedforward: int,
        dropout: float,
        activation: str,
        n_levels: int,
        n_points: tuple[int, ...],
        sampler: str = "grid",
        ffn_norm: str = "norm3",
    ):
        super().__init__()
        self.activation = activation_function(activation, "activation")
        self.self_attn = nn.MultiheadAttention(d_model, n_head, dropout=dropout, batch_first=True)
        self.dropout1 = nn.Dropout(dropout)
        self.norm1 = nn.LayerNorm(d_model)
        self.cross_attn = MSDeformableAttention(d_model, n_head, n_levels, n_points, sampler=sampler)
        self.dropout2 = nn.Dropout(dropout)
        self.gateway = Gate(d_model)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.dropout3 = nn.Dropout(dropout)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.dropout4 = nn.Dropout(dropout)
        self.ffn_norm = ffn_norm  # the last LayerNorm's official name: norm3 (D-FINE), norm2 (ECDet)
        setattr(self, ffn_norm, nn.LayerNorm(d_model))
        nn.init.xavier_uniform_(self.linear1.weight)
        nn.init.xavier_uniform_(self.linear2.weight)

    def forward(
        self,
        target: torch.Tensor,
        reference_points: torch.Tensor,
        value: torch.Tensor,
        spatial_shapes: list[list[int]],
        attn_mask: torch.Tensor | None,
        query_pos: torch.Tensor,
    ) -> torch.Tensor:
        q = k = target + query_pos
        attn, _ = self.self_attn(q, k, value=target, attn_mask=attn_mask)  # official arithmetic
        target = self.norm1(target + self.dropout1(attn))
        cross = self.cross_attn(target + query_pos, reference_points, value, spatial_shapes)
        target = self.gateway(target, self.dropout2(cross))
        ffn = self.linear2(self.dropout3(self.activation(self.linear1(target))))
        target = target + self.dropout4(ffn)
        return getattr(self, self.ffn_norm)(target.clamp(min=-65504, max=65504))  # keeps FP16 finite


class TransformerDecoder(nn.Module):
    """The layer stack with FDR: every layer refines accumulated corner logits around `pre_boxes`."""

    def __init__(
        self,
        hidden_dim: int,
        layer_factory,
        num_layers: int,
        num_head: int,
        reg_max: int,
        reg_scale: nn.Parameter,
        up: nn.Parameter,
        eval_idx: int,
        activation: str = "relu",
        query_pos_per_layer: bool = True,
    ):
        super().__init__()
        self.query_pos_per_layer = query_pos_per_layer
        self.hidden_dim = hidden_dim
        self.num_layers = num_layers
        self.num_head = num_head
        self.eval_idx = eval_idx
        self.up = up  # shared Parameters: registered under both decoder. and decoder.decoder.
        self.reg_scale = reg_scale
        self.reg_max = reg_max
        self.layers = nn.ModuleList([layer_factory() for _ in range(eval_idx + 1)])
        self.lqe_layers = nn.ModuleList([LQE(4, 64, 2, reg_max, activation) for _ in range(num_layers)])

    def convert_to_deploy(self) -> None:
        """Keep layers up to eval_idx, drop unused LQEs, freeze the bin values as a constant."""
        self.register_buffer(
            "project", weighting_constant(self.reg_max, self.up, self.reg_scale), persistent=False
        )
        self.layers = self.layers[: self.eval_idx + 1]
        self.lqe_layers = nn.ModuleList([nn.Identity()] * self.eval_idx + [self.lqe_layers[self.eval_idx]])

    def value_from_memory(self, memory: torch.Tensor) -> torch.Tensor:
        """[B, L, C] -> [B*heads, C/heads, L]: the per-head value the samplers read."""
        batch, length, channels = memory.shape
        value = memory.reshape(batch, length, self.num_head, channels // self.num_head)
        return value.permute(0, 2, 3, 1).reshape(batch * self.num_head, channels // self.num_head, length)

    def forward(
        self,
        target: torch.Tensor,
        ref_points_unact: torch.Tensor,
        memory: torch.Tensor,
        spatial_shapes: list[list[int]],
        bbox_head: nn.ModuleList,
        score_head: nn.ModuleList,
        query_pos_head: nn.Module,
        pre_bbox_head: nn.Module,
        attn_mask: torch.Tensor | None = None,
    ) -> dict[str, Any]:
        value = self.value_from_memory(memory)
        project = getattr(self, "project", None)
        if project is None:
            project = weighting_function(self.reg_max, self.up, self.reg_scale)
        ref_points = torch.sigmoid(ref_points_unact)
        output = target
        output_detach: torch.Tensor | int = 0
        corners_prev: torch.Tensor | int = 0
        boxes, logits, corners_all, refs = [], [], [], []
        pre_boxes = pre_scores = ref_initial = None
        query_pos = query_pos_head(ref_points).clamp(min=-10, max=10)
        for i, layer in enumerate(self.layers):
            if i and self.query_pos_per_layer:
                query_pos = query_pos_head(ref_points).clamp(min=-10, max=10)
            output = layer(output, ref_points.unsqueeze(2), value, spatial_shapes, attn_mask, query_pos)
            if i == 0:
                # Layer-0 boxes anchor every later decoding ("ref_points_initial").
                pre_boxes = torch.sigmoid(pre_bbox_head(output) + inverse_sigmoid(ref_points))
                if self.training:
                    pre_scores = score_head[0](output)
                ref_initial = pre_boxes.detach()
            corners = bbox_head[i](output + output_detach) + corners_prev
            box = distance2bbox(ref_initial, integral(corners, project), self.reg_scale)
            if self.training or i == self.eval_idx:
                scores = self.lqe_layers[i](score_head[i](output), corners)
                logits.append(scores)
                boxes.append(box)
                corners_all.append(corners)
                refs.append(ref_initial)
                if not self.training:
                    break
            corners_prev = corners
            ref_points = box.detach()
            output_detach = output.detach()
        return {
            "boxes": torch.stack(boxes),
            "logits": torch.stack(logits),
            "corners": torch.stack(corners_all),
            "refs": torch.stack(refs),
            "pre_boxes": pre_boxes,
            "pre_logits": pre_scores,
        }
