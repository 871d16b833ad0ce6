"""The D-FINE training loss: VFL, L1 + GIoU, FGL and DDF over every decoder output (DEIM's MAL in place
of VFL where a config names `mal`, as configs/deim/ do).

What is applied where (the official recipe, `src/zoo/dfine/dfine_criterion.py`):

    output            vfl / mal (classes)      boxes (L1, GIoU)       local (FGL, DDF)
    final layer       own matching             GO union               GO union (FGL only)
    aux layer i       own matching             GO union               GO union (FGL + DDF)
    pre (layer-0)     own matching             GO union               - (no corners)
    encoder top-k     own matching             GO union               - (no corners)
    dn layer i, pre   denoising pairs          denoising pairs        denoising pairs

"GO union" pools the matchings of all non-denoising outputs and keeps, for every query, the ground
truth it was matched to most often. Classes are normalised by the number of ground-truth boxes, the
box and local terms by the size of the GO union, and denoising terms by boxes x groups; both counts
are averaged over ranks when torch.distributed runs. The returned dict holds the weighted terms under
the official names (`loss_vfl`, `loss_bbox_aux_0`, `loss_ddf_dn_2`, `loss_giou_enc_0`, ...), so that
`sum(losses.values())` is the training objective.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn
from torchvision.ops import box_area

from dfine_deploy.errors import ConfigError, DatasetError
from dfine_deploy.model.box_ops import box_cxcywh_to_xyxy
from dfine_deploy.model.fdr import weighting_function
from dfine_deploy.model.spec import ModelSpec
from dfine_deploy.settings import KNOWN_LOSS_WEIGHTS, KNOWN_LOSSES, CriterionSettings
from dfine_deploy.training.matcher import HungarianMatcher, MatchIndices

DISTILL_TEMPERATURE = 5.0  # softens teacher and student corner distributions in DDF
DDF_REFERENCE_BATCH = 8  # DDF's pos/neg balance is computed as if each rank held 8 images
_EDGES = 4  # left, top, right, bottom


# ---------------------------------------------------------------------------------------------------
# Fine-grained localisation targets


class FGLTargets(NamedTuple):
    """Each edge's target distance as a mix of two adjacent bins of the weighting function W.

    All [M*4], entry 4*k + e being edge e (left, top, right, bottom) of matched box k: bin
    `left_bin` gets `weight_left`, bin `left_bin + 1` gets `weight_right`; the mix's expectation
    under W is the target distance (clipped to W's range).
    """

    left_bin: Tensor  # int64, in [0, reg_max - 1]
    weight_left: Tensor
    weight_right: Tensor


def translate_gt(distances: Tensor, project: Tensor) -> FGLTargets:
    """Split continuous edge distances [N] onto the bins of W (`project`, [reg_max+1], ascending).

    A distance below W[0] goes wholly to bin 0, one at or above W[reg_max] wholly to bin reg_max;
    in between it is interpolated linearly between its two neighbouring bins.
    """
    reg_max = project.numel() - 1
    distances = distances.reshape(-1)
    position = (project[None, :] <= distances[:, None]).sum(-1) - 1  # [N], -1 .. reg_max
    left_bin = position.clamp(0, reg_max - 1)
    to_left = (distances - project[left_bin]).abs()
    to_right = (project[left_bin + 1] - distances).abs()
    inside = (position >= 0) & (position < reg_max)
    weight_right = torch.where(
        inside, to_left / (to_left + to_right), (position >= reg_max).to(distances.dtype)
    )
    weight_left = torch.where(inside, 1.0 - weight_right, (position < 0).to(distances.dtype))
    return FGLTargets(left_bin, weight_left, weight_right)


def bbox2distance(
    ref_points: Tensor, target_xyxy: Tensor, project: Tensor, reg_scale: Tensor | float
) -> FGLTargets:
    """FGL targets for boxes `target_xyxy` [M,4] decoded relative to `ref_points` [M,4] (cxcywh).

    Inverts the model's `distance2bbox`: an edge at distance d (in units of ref_size / reg_scale,
    beyond the half box) lies at `centre -/+ (reg_scale/2 + d) * size / reg_scale`.
    """
    reg_scale = abs(reg_scale)
    centre_xy, size_wh = ref_points[:, :2], ref_points[:, 2:]  # [M, 2] each
    unit = size_wh / reg_scale + 1e-16  # [M, 2] one step of d in normalised image units
    near = (centre_xy - target_xyxy[:, :2]) / unit - 0.5 * reg_scale  # left, top
    far = (target_xyxy[:, 2:] - centre_xy) / unit - 0.5 * reg_scale  # right, bottom
    distances = torch.cat([near, far], dim=-1)  # [M, 4] l, t, r, b
    return translate_gt(distances, project.to(distances.dtype))


# ---------------------------------------------------------------------------------------------------
# Matched pairs


def _paired_iou_giou(boxes1: Tensor, boxes2: Tensor) -> tuple[Tensor, Tensor]:
    """IoU and GIoU of aligned xyxy box pairs [M,4] x [M,4] -> [M], [M].

    The same arithmetic as torchvision's pairwise `box_iou` / `generalized_box_iou`, without
    building the M x M matrix of which only the diagonal is needed.
    """
    area1, area2 = box_area(boxes1), box_area(boxes2)
    inter = (torch.min(boxes1[:, 2:], boxes2[:, 2:]) - torch.max(boxes1[:, :2], boxes2[:, :2])).clamp(min=0)
    inter_area = inter[:, 0] * inter[:, 1]
    union = area1 + area2 - inter_area
    iou = inter_area / union
    hull = (torch.max(boxes1[:, 2:], boxes2[:, 2:]) - torch.min(boxes1[:, :2], boxes2[:, :2])).clamp(min=0)
    hull_area = hull[:, 0] * hull[:, 1]
    return iou, iou - (hull_area - union) / hull_area


@dataclass(frozen=True)
class MatchedPairs:
    """One matching flattened over the batch: pair k is query `query[k]` of image `image[k]`."""

    image: Tensor  # [M] int64
    query: Tensor  # [M] int64
    labels: Tensor  # [M] int64 ground-truth classes
    boxes: Tensor  # [M, 4] ground-truth boxes, normalised cxcywh

    @classmethod
    def gather(
        cls, indices: MatchIndices, targets: Sequence[Mapping[str, Tensor]], device: torch.device
    ) -> MatchedPairs:
        image = torch.cat([torch.full_like(query, b) for b, (query, _) in enumerate(indices)])
        query = torch.cat([query for query, _ in indices])
        labels = torch.cat([t["labels"][gt.to(t["labels"].device)] for t, (_, gt) in zip(targets, indices)])
        boxes = torch.cat([t["boxes"][gt.to(t["boxes"].device)] for t, (_, gt) in zip(targets, indices)])
        return cls(image.to(device), query.to(device), labels.to(device), boxes.to(device, torch.float32))

    def __len__(self) -> int:
        return self.query.numel()


def union_matching(matchings: Sequence[MatchIndices]) -> MatchIndices:
    """The GO union: for each query, the ground truth it was matched to most often across `matchings`.

    Ties are resolved as in the official code: distinct (query, gt) pairs in ascending order, put in
    descending count order by torch's CPU argsort (stable up to 16 pairs, so the lower ground-truth
    index wins there; beyond that, whatever order that sort leaves), first pair per query kept.
    Per image, pairs come out sorted by query.
    """
    union: MatchIndices = []
    for image in range(len(matchings[0])):
        query = torch.cat([m[image][0] for m in matchings]).cpu()
        gt = torch.cat([m[image][1] for m in matchings]).cpu()
        if query.numel() == 0:
            union.append((query, gt))
            continue
        gt_span = int(gt.max()) + 1
        pairs, counts = torch.unique(query * gt_span + gt, return_counts=True)  # ascending (query, gt)
        pairs = pairs[torch.argsort(counts, descending=True)]
        by_query = torch.argsort(pairs // gt_span, stable=True)  # keeps the count order within a query
        grouped = pairs[by_query] // gt_span
        first = torch.ones_like(grouped, dtype=torch.bool)
        first[1:] = grouped[1:] != grouped[:-1]
        chosen = pairs[by_query[first]]
        union.append((chosen // gt_span, chosen % gt_span))
    return union


def get_cdn_matched_indices(
    dn_meta: Mapping[str, Any], targets: Sequence[Mapping[str, Tensor]]
) -> MatchIndices:
    """Denoising pairs: each image's positive dn queries, group after group, against its targets.

    `dn_meta['dn_positive_idx'][b]` lists image b's positive queries group-major, each group
    holding one noised copy of every target in order, so the targets are 0..n-1 tiled per group.
    """
    positive, num_group = dn_meta["dn_positive_idx"], int(dn_meta["dn_num_group"])
    indices: MatchIndices = []
    for b, target in enumerate(targets):
        num_gt = len(target["labels"])
        gt = torch.arange(num_gt, dtype=torch.int64).tile(num_group)
        queries = positive[b].to("cpu", torch.int64) if num_gt > 0 else gt.new_zeros(0)
        if queries.numel() != gt.numel():
            raise ValueError(
                f"dn_meta of image {b}: {queries.numel()} positive denoising queries for {num_gt} targets "
                f"x {num_group} groups; the model's denoising group does not belong to these targets"
            )
        indices.append((queries, gt))
    return indices


# ---------------------------------------------------------------------------------------------------
# The criterion


@dataclass(frozen=True)
class _Head:
    """One output to be scored: which pairs each loss uses and by what count it divides."""

    suffix: str
    output: Mapping[str, Any]
    class_pairs: MatchedPairs
    class_norm: float
    box_pairs: MatchedPairs
    box_norm: float
    fgl_targets: FGLTargets | None


class DFINECriterion(nn.Module):
    """D-FINE loss; see the module docstring for which output gets which matching."""

    def __init__(self, settings: CriterionSettings | None = None, *, num_classes: int) -> None:
        """Built, with its matcher, from `settings` (`Config.train.criterion`; default: official), which
        holds every knob and its default; `build_criterion` also checks them against the model."""
        super().__init__()
        self.settings = CriterionSettings() if settings is None else settings
        _reject_unknown("DFINECriterion.weight_dict", self.settings.weight_dict, KNOWN_LOSS_WEIGHTS)
        _reject_unknown("DFINECriterion.losses", dict.fromkeys(self.settings.losses), KNOWN_LOSSES)
        self.matcher = HungarianMatcher(self.settings.matcher)
        self.weight_dict = {name: float(w) for name, w in self.settings.weight_dict.items()}
        self.num_classes = num_classes
        # average the box counts that normalise the losses over the job's ranks (one rank alone, as in
        # the smoke test while the others wait, must not: the all-reduce would wait for them forever)
        self.across_ranks = True

    # -- the individual terms (unweighted) ---------------------------------------------------------

    def _class_targets(
        self, output: Mapping[str, Tensor], pairs: MatchedPairs
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The logits [B, Q, C], the matched (query, class) entries as a 0/1 mask, and there the IoU of
        the query's box with its ground truth (no gradient), for the IoU-aware class losses."""
        logits = output["pred_logits"].float()
        matched_boxes = output["pred_boxes"][pairs.image, pairs.query].float()
        iou, _ = _paired_iou_giou(box_cxcywh_to_xyxy(matched_boxes), box_cxcywh_to_xyxy(pairs.boxes))
        one_hot = torch.zeros_like(logits)
        one_hot[pairs.image, pairs.query, pairs.labels] = 1.0
        target_iou = torch.zeros_like(logits)
        target_iou[pairs.image, pairs.query, pairs.labels] = iou.detach()
        return logits, one_hot, target_iou

    def _negatives_weight(self, logits: Tensor, one_hot: Tensor, alpha: float) -> Tensor:
        return alpha * logits.detach().sigmoid().pow(self.settings.gamma) * (1 - one_hot)

    def loss_vfl(self, output: Mapping[str, Tensor], pairs: MatchedPairs, norm: float) -> Tensor:
        """Varifocal loss: BCE towards IoU-valued class targets, negatives down-weighted by p^gamma."""
        logits, one_hot, target = self._class_targets(output, pairs)
        weight = self._negatives_weight(logits, one_hot, self.settings.alpha) + target
        loss = F.binary_cross_entropy_with_logits(logits, target, weight=weight, reduction="none")
        return loss.mean(1).sum() * logits.shape[1] / norm

    def loss_mal(self, output: Mapping[str, Tensor], pairs: MatchedPairs, norm: float) -> Tensor:
        """DEIM's matchability-aware loss (arxiv.org/abs/2412.04234): positives towards IoU^gamma at full
        weight, where VFL weighs each by its IoU and so barely teaches the low-IoU matches of early
        training; negatives as in VFL (times `mal_alpha`, 1 unless set)."""
        logits, one_hot, target = self._class_targets(output, pairs)
        alpha = 1.0 if self.settings.mal_alpha is None else self.settings.mal_alpha
        weight = self._negatives_weight(logits, one_hot, alpha) + one_hot
        target = target.pow(self.settings.gamma)
        loss = F.binary_cross_entropy_with_logits(logits, target, weight=weight, reduction="none")
        return loss.mean(1).sum() * logits.shape[1] / norm

    def loss_boxes(
        self, matched_boxes: Tensor, pairs: MatchedPairs, giou: Tensor, norm: float
    ) -> dict[str, Tensor]:
        """L1 on cxcywh and 1 - GIoU of matched boxes, summed and divided by `norm`."""
        return {
            "loss_bbox": F.l1_loss(matched_boxes, pairs.boxes, reduction="sum") / norm,
            "loss_giou": (1 - giou).sum() / norm,
        }

    def loss_fgl(
        self, output: Mapping[str, Tensor], pairs: MatchedPairs, iou: Tensor, targets: FGLTargets, norm: float
    ) -> Tensor:
        """Fine-grained localisation: cross-entropy of each edge's corner logits against its
        two-bin target, weighted by the box's IoU."""
        corners = output["pred_corners"][pairs.image, pairs.query].float()  # [M, 4*(R+1)]
        log_prob = F.log_softmax(corners.reshape(-1, self.settings.reg_max + 1), dim=-1)  # [M*4, R+1]
        left = targets.left_bin[:, None]
        nll_left = -log_prob.gather(1, left).squeeze(1)
        nll_right = -log_prob.gather(1, left + 1).squeeze(1)
        per_edge = nll_left * targets.weight_left + nll_right * targets.weight_right
        return (per_edge * iou.detach().repeat_interleave(_EDGES)).sum() / norm

    def loss_ddf(
        self, output: Mapping[str, Tensor], pairs: MatchedPairs, iou: Tensor, balance: tuple[float, float]
    ) -> Tensor:
        """Decoupled distillation focal loss: KL from the last layer's corner distributions,
        weighted by IoU (matched queries) or teacher confidence (others), the two groups averaged
        separately and mixed by `balance` = (num_pos, num_neg)."""
        student = output["pred_corners"].float().reshape(-1, self.settings.reg_max + 1)  # [B*Q*4, R+1]
        teacher = output["teacher_corners"].float().reshape(-1, self.settings.reg_max + 1)
        if student is teacher or torch.equal(student, teacher):
            return student.sum() * 0  # the last layer teaches itself nothing
        temperature = DISTILL_TEMPERATURE
        kl = (
            F.kl_div(
                F.log_softmax(student / temperature, dim=-1),
                F.softmax(teacher.detach() / temperature, dim=-1),
                reduction="none",
            ).sum(-1)
            * temperature**2
        )  # [B*Q*4]
        weight = output["teacher_logits"].detach().float().sigmoid().amax(-1)  # [B, Q]
        weight[pairs.image, pairs.query] = iou.detach()
        matched = torch.zeros_like(weight, dtype=torch.bool)
        matched[pairs.image, pairs.query] = True
        per_edge = kl * weight.repeat_interleave(_EDGES, dim=-1).reshape(-1)
        matched = matched.repeat_interleave(_EDGES, dim=-1).reshape(-1)
        mean_pos = (per_edge * matched).sum() / matched.sum().clamp(min=1)
        mean_neg = (per_edge * ~matched).sum() / (~matched).sum().clamp(min=1)
        num_pos, num_neg = balance
        return (mean_pos * num_pos + mean_neg * num_neg) / (num_pos + num_neg)

    # -- one output --------------------------------------------------------------------------------

    def _head_losses(self, head: _Head, ddf_balance: tuple[float, float]) -> dict[str, Tensor]:
        output, losses = head.output, {}
        if "vfl" in self.settings.losses:
            losses["loss_vfl"] = self.loss_vfl(output, head.class_pairs, head.class_norm)
        if "mal" in self.settings.losses:
            losses["loss_mal"] = self.loss_mal(output, head.class_pairs, head.class_norm)
        pairs = head.box_pairs
        needs_local = "local" in self.settings.losses and "pred_corners" in output
        if "boxes" in self.settings.losses or needs_local:
            matched_boxes = output["pred_boxes"][pairs.image, pairs.query].float()  # [M, 4] cxcywh
            iou, giou = _paired_iou_giou(box_cxcywh_to_xyxy(matched_boxes), box_cxcywh_to_xyxy(pairs.boxes))
        if "boxes" in self.settings.losses:
            losses.update(self.loss_boxes(matched_boxes, pairs, giou, head.box_norm))
        if needs_local:
            losses["loss_fgl"] = self.loss_fgl(output, pairs, iou, head.fgl_targets, head.box_norm)
            if "teacher_corners" in output:
                losses["loss_ddf"] = self.loss_ddf(output, pairs, iou, ddf_balance)
        return {
            name + head.suffix: value * self.weight_dict[name]
            for name, value in losses.items()
            if name in self.weight_dict
        }

    def _fgl_targets(
        self, outputs: Mapping[str, Any], head_output: Mapping[str, Tensor], pairs: MatchedPairs
    ) -> FGLTargets | None:
        """FGL targets of one output family; every layer decodes from the same layer-0 reference
        boxes, so one computation serves all of them."""
        if "local" not in self.settings.losses or "pred_corners" not in head_output:
            return None
        with torch.no_grad():
            ref_points = head_output["ref_points"][pairs.image, pairs.query].float()  # [M, 4] cxcywh
            project = weighting_function(self.settings.reg_max, outputs["up"], outputs["reg_scale"])
            return bbox2distance(ref_points, box_cxcywh_to_xyxy(pairs.boxes), project, outputs["reg_scale"])

    # -- all outputs -------------------------------------------------------------------------------

    def _check_labels(self, targets: Sequence[Mapping[str, Tensor]]) -> None:
        """Labels outside [0, num_classes) would fail deep in an indexing kernel; say what is wrong."""
        labels = torch.cat([t["labels"] for t in targets])
        if labels.numel() == 0 or bool(((labels >= 0) & (labels < self.num_classes)).all()):
            return  # one check (one device sync) for the whole batch
        for image, target in enumerate(targets):
            wrong = sorted({int(v) for v in target["labels"] if not 0 <= int(v) < self.num_classes})
            if wrong:
                raise DatasetError(
                    f"training target {image}: labels must be contiguous class indices in "
                    f"[0, {self.num_classes}), got {wrong}; check num_classes in the config, and "
                    "remap_mscoco_category for COCO category ids"
                )

    def forward(
        self, outputs: Mapping[str, Any], targets: Sequence[Mapping[str, Tensor]], **step_info: Any
    ) -> dict[str, Tensor]:
        """Weighted loss terms of a training-mode D-FINE output dict.

        `targets`: one dict per image with `labels` int64 [n] and `boxes` [n, 4] normalised cxcywh.
        `step_info` (epoch, step, global_step, epoch_step) is accepted as the official trainer
        passes it; the D-FINE loss does not depend on it. The terms are computed in float32, with
        autocast off, whatever precision the model ran in.
        """
        with torch.autocast(outputs["pred_logits"].device.type, enabled=False):
            return self._weighted_losses(outputs, targets)

    def _weighted_losses(
        self, outputs: Mapping[str, Any], targets: Sequence[Mapping[str, Tensor]]
    ) -> dict[str, Tensor]:
        self._check_labels(targets)
        device = outputs["pred_logits"].device
        aux_outputs = list(outputs.get("aux_outputs", []))
        pre_output = outputs.get("pre_outputs")
        enc_outputs = list(outputs.get("enc_aux_outputs", []))

        own = self.matcher(outputs, targets)
        aux_own = [self.matcher(o, targets) for o in aux_outputs]
        pre_own = self.matcher(pre_output, targets) if pre_output is not None else None
        enc_own = [self.matcher(o, targets) for o in enc_outputs]
        go = union_matching([own, *aux_own, *([pre_own] if pre_own else []), *enc_own])

        def pairs(indices: MatchIndices) -> MatchedPairs:
            return MatchedPairs.gather(indices, targets, device)

        go_pairs = pairs(go)
        num_boxes, num_boxes_go = _mean_over_ranks(
            [sum(len(t["labels"]) for t in targets), len(go_pairs)], device, self.across_ranks
        )
        batch, num_queries = outputs["pred_logits"].shape[:2]
        ddf_balance = _ddf_balance(len(go_pairs), batch * num_queries, batch)
        fgl_go = self._fgl_targets(outputs, outputs, go_pairs)

        heads = [_Head("", outputs, pairs(own), num_boxes, go_pairs, num_boxes_go, fgl_go)]
        heads += [
            _Head(f"_aux_{i}", o, pairs(m), num_boxes, go_pairs, num_boxes_go, fgl_go)
            for i, (o, m) in enumerate(zip(aux_outputs, aux_own))
        ]
        if pre_output is not None:
            heads.append(_Head("_pre", pre_output, pairs(pre_own), num_boxes, go_pairs, num_boxes_go, None))
        heads += [
            _Head(f"_enc_{i}", o, pairs(m), num_boxes, go_pairs, num_boxes_go, None)
            for i, (o, m) in enumerate(zip(enc_outputs, enc_own))
        ]
        if "dn_outputs" in outputs:
            dn_pairs = pairs(get_cdn_matched_indices(outputs["dn_meta"], targets))
            dn_norm = num_boxes * int(outputs["dn_meta"]["dn_num_group"]) or 1.0
            dn_outputs = list(outputs["dn_outputs"])
            fgl_dn = self._fgl_targets(outputs, dn_outputs[0], dn_pairs) if dn_outputs else None
            heads += [
                _Head(f"_dn_{i}", o, dn_pairs, dn_norm, dn_pairs, dn_norm, fgl_dn)
                for i, o in enumerate(dn_outputs)
            ]
            if "dn_pre_outputs" in outputs:
                heads.append(
                    _Head("_dn_pre", outputs["dn_pre_outputs"], dn_pairs, dn_norm, dn_pairs, dn_norm, None)
                )

        losses: dict[str, Tensor] = {}
        for head in heads:
            losses.update(self._head_losses(head, ddf_balance))
        return {name: torch.nan_to_num(value, nan=0.0) for name, value in losses.items()}


def _mean_over_ranks(counts: list[int], device: torch.device, across_ranks: bool = True) -> list[float]:
    """Counts averaged over the ranks of the default process group (if any and `across_ranks`), each
    at least 1."""
    values = torch.tensor(counts, dtype=torch.float32, device=device)
    if across_ranks and dist.is_available() and dist.is_initialized():
        dist.all_reduce(values)
        values /= dist.get_world_size()
    return values.clamp(min=1).tolist()


def _ddf_balance(num_matched: int, num_queries: int, batch: int) -> tuple[float, float]:
    """(num_pos, num_neg) of DDF: square roots of the matched and unmatched edge counts, rescaled to
    a batch of DDF_REFERENCE_BATCH images so the balance does not depend on the per-rank batch."""
    scale = DDF_REFERENCE_BATCH / batch
    return (num_matched * _EDGES * scale) ** 0.5, ((num_queries - num_matched) * _EDGES * scale) ** 0.5


def _reject_unknown(field: str, given: Mapping[str, Any], valid: Sequence[str]) -> None:
    for name in given:
        if name not in valid:
            near = difflib.get_close_matches(name, list(valid), n=1)
            hint = f"did you mean '{near[0]}'? " if near else ""
            raise ConfigError(f"{field}: unknown entry '{name}'; {hint}valid entries are {list(valid)}")


# ---------------------------------------------------------------------------------------------------
# Building from a config


def build_criterion(spec: ModelSpec, settings: CriterionSettings | None = None) -> DFINECriterion:
    """The criterion for `spec` from typed `settings` (`Config.train.criterion`; default: official)."""
    if settings is None:
        settings = CriterionSettings()
    if settings.reg_max != spec.decoder.reg_max:
        raise ConfigError(
            f"DFINECriterion.reg_max is {settings.reg_max} but DFINETransformer.reg_max is "
            f"{spec.decoder.reg_max}; the loss must use the decoder's number of bins: make them equal"
        )
    return DFINECriterion(settings, num_classes=spec.num_classes)
