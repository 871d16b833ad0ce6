"""DFINECriterion: each term against a direct formula, FGL targets, DDF, denoising and GO indices."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dfine_deploy.config import Config, load_config
from dfine_deploy.errors import ConfigError
from dfine_deploy.model.fdr import distance2bbox, weighting_function
from dfine_deploy.model.spec import SIZES
from dfine_deploy.settings import LOSS_WEIGHTS, CriterionSettings
from dfine_deploy.training.criterion import (
    DFINECriterion,
    bbox2distance,
    build_criterion,
    get_cdn_matched_indices,
    translate_gt,
    union_matching,
)

REG_MAX = 32


def _project(reg_scale: float = 4.0) -> torch.Tensor:
    return weighting_function(REG_MAX, torch.tensor([0.5]), torch.tensor([reg_scale]))


def make_targets(
    generator: torch.Generator, counts: list[int], classes: int
) -> list[dict[str, torch.Tensor]]:
    targets = []
    for n in counts:
        centres = torch.rand(n, 2, generator=generator) * 0.6 + 0.2
        sizes = torch.rand(n, 2, generator=generator) * 0.3 + 0.05
        targets.append(
            {
                "labels": torch.randint(0, classes, (n,), generator=generator),
                "boxes": torch.cat([centres, sizes], -1),
            }
        )
    return targets


def make_outputs(
    generator: torch.Generator,
    counts: list[int],
    *,
    queries: int = 30,
    classes: int = 6,
    layers: int = 3,
    dn_groups: int = 2,
) -> dict:
    """A training-mode output dict with the official structure and random values."""
    batch = len(counts)

    def boxes(n: int) -> torch.Tensor:
        return torch.cat(
            [
                torch.rand(batch, n, 2, generator=generator) * 0.8 + 0.1,
                torch.rand(batch, n, 2, generator=generator) * 0.3 + 0.05,
            ],
            -1,
        )

    def layer_stack(n: int) -> list[dict[str, torch.Tensor]]:
        ref = boxes(n)
        return [
            {
                "pred_logits": torch.randn(batch, n, classes, generator=generator).requires_grad_(),
                "pred_boxes": boxes(n).requires_grad_(),
                "pred_corners": (
                    torch.randn(batch, n, 4 * (REG_MAX + 1), generator=generator) * 2
                ).requires_grad_(),
                "ref_points": ref,
            }
            for _ in range(layers)
        ]

    def with_teacher(stack: list[dict]) -> list[dict]:
        last = stack[-1]
        return [
            {**layer, "teacher_corners": last["pred_corners"], "teacher_logits": last["pred_logits"]}
            for layer in stack
        ]

    def plain(n: int) -> dict[str, torch.Tensor]:
        return {
            "pred_logits": torch.randn(batch, n, classes, generator=generator).requires_grad_(),
            "pred_boxes": boxes(n).requires_grad_(),
        }

    stack = layer_stack(queries)
    outputs = {
        **stack[-1],
        "up": torch.tensor([0.5]),
        "reg_scale": torch.tensor([4]),
        "aux_outputs": with_teacher(stack)[:-1],
        "pre_outputs": plain(queries),
        "enc_aux_outputs": [plain(queries)],
        "enc_meta": {"class_agnostic": False},
    }
    max_gt = max(counts)
    if dn_groups and max_gt:
        num_dn = 2 * max_gt * dn_groups
        positive = [torch.cat([g * 2 * max_gt + torch.arange(n) for g in range(dn_groups)]) for n in counts]
        outputs["dn_outputs"] = with_teacher(layer_stack(num_dn))
        outputs["dn_pre_outputs"] = plain(num_dn)
        outputs["dn_meta"] = {
            "dn_positive_idx": positive,
            "dn_num_group": dn_groups,
            "dn_num_split": [num_dn, queries],
        }
    return outputs


REPO = Path(__file__).resolve().parents[2]


def make_criterion(classes: int = 6, **kwargs) -> DFINECriterion:
    return DFINECriterion(CriterionSettings(**kwargs), num_classes=classes)


# --- FGL targets ---------------------------------------------------------------------------------


def test_translate_gt_weights_sum_to_one_and_interpolate() -> None:
    project = _project()
    distances = torch.linspace(-6.0, 6.0, 301)  # beyond both ends of W = [-4, 4]
    left, weight_left, weight_right = translate_gt(distances, project)
    torch.testing.assert_close(weight_left + weight_right, torch.ones_like(distances))
    assert bool((weight_left >= 0).all() and (weight_right >= 0).all())
    assert int(left.min()) >= 0 and int(left.max()) <= REG_MAX - 1
    expectation = project[left] * weight_left + project[left + 1] * weight_right
    torch.testing.assert_close(
        expectation, distances.clamp(float(project[0]), float(project[-1])), atol=1e-5, rtol=0
    )


def test_translate_gt_puts_bin_values_wholly_on_their_bin() -> None:
    project = _project(8.0)
    left, weight_left, weight_right = translate_gt(project.clone(), project)
    assert left.tolist() == list(range(REG_MAX)) + [REG_MAX - 1]
    assert weight_left.tolist() == [1.0] * REG_MAX + [0.0]  # the last value sits on bin reg_max
    assert weight_right.tolist() == [0.0] * REG_MAX + [1.0]


def test_bbox2distance_inverts_distance2bbox() -> None:
    generator = torch.Generator().manual_seed(0)
    ref = torch.cat(
        [
            torch.rand(20, 2, generator=generator) * 0.5 + 0.25,
            torch.rand(20, 2, generator=generator) * 0.2 + 0.1,
        ],
        -1,
    )
    distances = torch.rand(20, 4, generator=generator) * 5 - 2.5  # inside W's range [-4, 4]
    reg_scale = torch.tensor([4])
    target = distance2bbox(ref, distances, reg_scale)  # cxcywh
    cx, cy, w, h = target.unbind(-1)
    target_xyxy = torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)
    project = _project()
    left, weight_left, weight_right = bbox2distance(ref, target_xyxy, project, reg_scale)
    recovered = (project[left] * weight_left + project[left + 1] * weight_right).reshape(20, 4)
    torch.testing.assert_close(recovered, distances, atol=1e-4, rtol=0)
    # a target equal to its reference box needs no move: every edge on W's zero bin (up to rounding)
    left, weight_left, weight_right = bbox2distance(
        ref, torch.cat([ref[:, :2] - ref[:, 2:] / 2, ref[:, :2] + ref[:, 2:] / 2], -1), project, reg_scale
    )
    on_zero = torch.where(left == REG_MAX // 2, weight_left, weight_right)  # the weight on bin 16
    assert set(left.tolist()) <= {REG_MAX // 2 - 1, REG_MAX // 2} and torch.allclose(
        on_zero, torch.ones(80), atol=1e-4
    )


# --- VFL, boxes, FGL against direct formulas ---------------------------------------------------------


def _scalar_iou(a: list[float], b: list[float]) -> tuple[float, float]:
    ax1, ay1, ax2, ay2 = a[0] - a[2] / 2, a[1] - a[3] / 2, a[0] + a[2] / 2, a[1] + a[3] / 2
    bx1, by1, bx2, by2 = b[0] - b[2] / 2, b[1] - b[3] / 2, b[0] + b[2] / 2, b[1] + b[3] / 2
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = a[2] * a[3] + b[2] * b[3] - inter
    hull = (max(ax2, bx2) - min(ax1, bx1)) * (max(ay2, by2) - min(ay1, by1))
    return inter / union, inter / union - (hull - union) / hull


def _tiny_single_output() -> tuple[dict, list[dict]]:
    logits = torch.tensor([[[0.3, -1.2], [2.0, 0.5], [-0.7, 1.1]]])  # [1, 3 queries, 2 classes]
    boxes = torch.tensor([[[0.50, 0.50, 0.20, 0.20], [0.32, 0.41, 0.18, 0.26], [0.70, 0.62, 0.20, 0.10]]])
    targets = [
        {
            "labels": torch.tensor([0, 1]),
            "boxes": torch.tensor([[0.30, 0.40, 0.20, 0.30], [0.70, 0.60, 0.25, 0.15]]),
        }
    ]
    return {"pred_logits": logits, "pred_boxes": boxes}, targets


def test_vfl_and_box_losses_match_direct_formulas() -> None:
    outputs, targets = _tiny_single_output()
    criterion = make_criterion(classes=2, losses=("vfl", "boxes"))
    losses = criterion(outputs, targets)
    # matching is obvious here: query 1 <-> target 0, query 2 <-> target 1
    matched = {1: 0, 2: 1}
    logits, boxes = outputs["pred_logits"][0].tolist(), outputs["pred_boxes"][0].tolist()
    gt_boxes, gt_labels = targets[0]["boxes"].tolist(), targets[0]["labels"].tolist()
    vfl = l1 = giou_loss = 0.0
    for q in range(3):
        for c in range(2):
            p = 1 / (1 + math.exp(-logits[q][c]))
            is_target = q in matched and gt_labels[matched[q]] == c
            score = _scalar_iou(boxes[q], gt_boxes[matched[q]])[0] if is_target else 0.0
            weight = score if is_target else 0.75 * p**2
            vfl += -weight * (score * math.log(p) + (1 - score) * math.log(1 - p))
    for q, g in matched.items():
        l1 += sum(abs(x - y) for x, y in zip(boxes[q], gt_boxes[g]))
        giou_loss += 1 - _scalar_iou(boxes[q], gt_boxes[g])[1]
    num_boxes = 2
    assert float(losses["loss_vfl"]) == pytest.approx(vfl / num_boxes, rel=1e-5)
    assert float(losses["loss_bbox"]) == pytest.approx(5 * l1 / num_boxes, rel=1e-5)
    assert float(losses["loss_giou"]) == pytest.approx(2 * giou_loss / num_boxes, rel=1e-5)


def test_mal_matches_the_formula_of_deims_paper() -> None:
    """MAL(p, q, y) = -q^g log p - (1 - q^g) log(1 - p) where y = 1, and -a p^g log(1 - p) where y = 0
    (DEIM, arxiv.org/abs/2412.04234, eq. 4; a = `mal_alpha`, 1 when unset), q the matched box's IoU."""
    outputs, targets = _tiny_single_output()
    matched = {1: 0, 2: 1}
    logits, boxes = outputs["pred_logits"][0].tolist(), outputs["pred_boxes"][0].tolist()
    gt_boxes, gt_labels = targets[0]["boxes"].tolist(), targets[0]["labels"].tolist()
    for gamma, mal_alpha in ((1.5, None), (2.0, 0.4)):
        weights = {"loss_mal": 1.0}
        settings = CriterionSettings(weight_dict=weights, losses=("mal",), gamma=gamma, mal_alpha=mal_alpha)
        losses = DFINECriterion(settings, num_classes=2)(outputs, targets)
        expected = 0.0
        for q in range(3):
            for c in range(2):
                p = 1 / (1 + math.exp(-logits[q][c]))
                if q in matched and gt_labels[matched[q]] == c:
                    quality = _scalar_iou(boxes[q], gt_boxes[matched[q]])[0] ** gamma
                    expected += -quality * math.log(p) - (1 - quality) * math.log(1 - p)
                else:
                    expected += -(1.0 if mal_alpha is None else mal_alpha) * p**gamma * math.log(1 - p)
        assert set(losses) == {"loss_mal"}
        assert float(losses["loss_mal"]) == pytest.approx(expected / 2, rel=1e-5)  # over 2 boxes


def test_fgl_matches_direct_formula() -> None:
    outputs, targets = _tiny_single_output()
    generator = torch.Generator().manual_seed(5)
    outputs["pred_corners"] = torch.randn(1, 3, 4 * (REG_MAX + 1), generator=generator)
    outputs["ref_points"] = torch.tensor(
        [[[0.5, 0.5, 0.3, 0.3], [0.31, 0.42, 0.2, 0.2], [0.68, 0.6, 0.2, 0.2]]]
    )
    outputs["up"], outputs["reg_scale"] = torch.tensor([0.5]), torch.tensor([4])
    losses = make_criterion(classes=2, losses=("local",))(outputs, targets)
    project = _project().tolist()
    expected = 0.0
    for q, g in {1: 0, 2: 1}.items():
        cx, cy, w, h = outputs["ref_points"][0, q].tolist()
        tx, ty, tw, th = targets[0]["boxes"][g].tolist()
        edges = [
            (cx - (tx - tw / 2)) / (w / 4) - 2,
            (cy - (ty - th / 2)) / (h / 4) - 2,
            (tx + tw / 2 - cx) / (w / 4) - 2,
            (ty + th / 2 - cy) / (h / 4) - 2,
        ]
        iou = _scalar_iou(outputs["pred_boxes"][0, q].tolist(), [tx, ty, tw, th])[0]
        for e, d in enumerate(edges):
            logits = outputs["pred_corners"][0, q, e * 33 : (e + 1) * 33]
            log_prob = torch.log_softmax(logits.double(), 0).tolist()
            k = max(i for i in range(33) if project[i] <= d) if d >= project[0] else 0
            k = min(k, REG_MAX - 1)
            right = min(max((d - project[k]) / (project[k + 1] - project[k]), 0.0), 1.0)
            expected += -(log_prob[k] * (1 - right) + log_prob[k + 1] * right) * iou
    assert float(losses["loss_fgl"]) == pytest.approx(0.15 * expected / 2, rel=1e-4)


# --- the whole criterion -----------------------------------------------------------------------------


@pytest.mark.parametrize("config", [None, "configs/deim/deim_hgnetv2_n_coco.yml"], ids=["vfl", "deim-mal"])
def test_key_set_and_backward_for_a_three_layer_model_with_denoising(config: str | None) -> None:
    generator = torch.Generator().manual_seed(1)
    counts = [3, 1]
    outputs = make_outputs(generator, counts)
    settings = load_config(str(REPO / config)).train.criterion if config else CriterionSettings()
    losses = DFINECriterion(settings, num_classes=6)(
        outputs, make_targets(generator, counts, 6), epoch=0, step=0, global_step=0, epoch_step=1
    )
    cls = "mal" if config else "vfl"
    expected = {f"loss_{n}" for n in (cls, "bbox", "giou", "fgl")}
    for suffix in ("_aux_0", "_aux_1", "_dn_0", "_dn_1", "_dn_2"):
        expected |= {f"loss_{n}{suffix}" for n in (cls, "bbox", "giou", "fgl", "ddf")}
    for suffix in ("_pre", "_enc_0", "_dn_pre"):
        expected |= {f"loss_{n}{suffix}" for n in (cls, "bbox", "giou")}
    assert set(losses) == expected and len(losses) == 38  # the official count for 3-layer models
    assert float(losses["loss_ddf_dn_2"]) == 0.0  # the last layer is its own teacher
    assert all(torch.isfinite(v) and float(v) >= 0 for v in losses.values())
    sum(losses.values()).backward()
    assert outputs["pred_corners"].grad is not None and torch.isfinite(outputs["pred_corners"].grad).all()
    assert outputs["aux_outputs"][0]["pred_corners"].grad.abs().sum() > 0


def test_ddf_is_zero_exactly_when_student_equals_teacher() -> None:
    generator = torch.Generator().manual_seed(2)
    counts = [2, 2]
    outputs = make_outputs(generator, counts, dn_groups=0)
    targets = make_targets(generator, counts, 6)
    criterion = make_criterion()
    assert float(criterion(outputs, targets)["loss_ddf_aux_0"]) > 0
    outputs["aux_outputs"][0]["pred_corners"] = (
        outputs["pred_corners"].detach().clone()
    )  # equal values, another tensor
    assert float(criterion(outputs, targets)["loss_ddf_aux_0"]) == 0.0


def test_losses_do_not_depend_on_repeating_the_batch() -> None:
    """Every term is normalised per box (DDF per 8 images), so a batch holding the same image twice
    gives the losses of that image alone."""
    generator = torch.Generator().manual_seed(3)
    single = make_outputs(generator, [3], dn_groups=2)
    targets = make_targets(generator, [3], 6)

    def doubled(value):
        if isinstance(value, torch.Tensor) and value.dim() >= 2:
            return torch.cat([value.detach(), value.detach()])
        if isinstance(value, dict):
            return {k: doubled(v) for k, v in value.items()}
        if isinstance(value, list):
            return [doubled(v) for v in value]
        return value

    twice = doubled(single)
    twice["dn_meta"]["dn_positive_idx"] = single["dn_meta"]["dn_positive_idx"] * 2
    criterion = make_criterion()
    one, two = criterion(single, targets), criterion(twice, targets * 2)
    for name in one:
        assert float(two[name]) == pytest.approx(float(one[name]), rel=1e-5, abs=1e-7), name


def test_weights_scale_terms_and_missing_weights_drop_them() -> None:
    generator = torch.Generator().manual_seed(4)
    outputs, targets = make_outputs(generator, [2, 1], dn_groups=0), make_targets(generator, [2, 1], 6)
    base = make_criterion()(outputs, targets)
    weights = {**LOSS_WEIGHTS, "loss_bbox": 10.0}
    del weights["loss_ddf"]
    changed = DFINECriterion(CriterionSettings(weight_dict=weights), num_classes=6)(outputs, targets)
    assert float(changed["loss_bbox_aux_1"]) == pytest.approx(2 * float(base["loss_bbox_aux_1"]))
    assert not any(name.startswith("loss_ddf") for name in changed)


def test_half_precision_outputs_are_scored_in_float32() -> None:
    """Under autocast the model may hand over bf16 tensors; the loss must equal that of the same
    values in float32 (no bf16 arithmetic inside the criterion)."""
    generator = torch.Generator().manual_seed(6)
    outputs, targets = make_outputs(generator, [3, 2], dn_groups=2), make_targets(generator, [3, 2], 6)

    def cast(value, dtype):
        if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() >= 2:
            return value.detach().to(dtype)
        if isinstance(value, dict):
            return {k: cast(v, dtype) for k, v in value.items()}
        if isinstance(value, list):
            return [cast(v, dtype) for v in value]
        return value

    low = cast(outputs, torch.bfloat16)
    criterion = make_criterion()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        from_bf16 = criterion(low, targets)
    reference = criterion(cast(low, torch.float32), targets)
    for name, value in reference.items():
        assert from_bf16[name].dtype == torch.float32, name
        assert float(from_bf16[name]) == pytest.approx(float(value), rel=1e-6, abs=1e-7), name


def test_labels_outside_the_classes_are_refused_clearly() -> None:
    from dfine_deploy.errors import DatasetError

    outputs, targets = _tiny_single_output()
    targets[0]["labels"] = torch.tensor([0, 2])
    with pytest.raises(DatasetError, match=r"\[0, 2\), got \[2\]"):
        make_criterion(classes=2)(outputs, targets)


# --- indices -----------------------------------------------------------------------------------------


def test_cdn_indices_pair_each_group_with_all_targets() -> None:
    generator = torch.Generator().manual_seed(0)
    targets = make_targets(generator, [2, 0, 1], 5)
    # max 2 targets, 3 groups: group g's positives of image b start at g * 2 * 2
    meta = {
        "dn_positive_idx": [
            torch.tensor([0, 1, 4, 5, 8, 9]),
            torch.zeros(0, dtype=torch.int64),
            torch.tensor([0, 4, 8]),
        ],
        "dn_num_group": 3,
    }
    indices = get_cdn_matched_indices(meta, targets)
    assert [(q.tolist(), g.tolist()) for q, g in indices] == [
        ([0, 1, 4, 5, 8, 9], [0, 1, 0, 1, 0, 1]),
        ([], []),
        ([0, 4, 8], [0, 0, 0]),
    ]


def test_union_matching_keeps_the_most_frequent_target_per_query() -> None:
    t = torch.tensor
    matchings = [
        [(t([3, 5]), t([0, 1])), (t([0]), t([0]))],
        [(t([3, 7]), t([1, 0])), (t([0]), t([0]))],
        [(t([3, 5]), t([0, 1])), (t([2]), t([0]))],
        [(t([5, 7]), t([0, 1])), (t([2]), t([1]))],
    ]
    union = union_matching(matchings)
    # image 0: query 3 -> 0 (2 of 3), 5 -> 1 (2 of 3), 7 -> tie 0/1 -> lower index 0
    # image 1: query 0 -> 0, query 2 -> tie 0/1 -> 0
    assert [(q.tolist(), g.tolist()) for q, g in union] == [([3, 5, 7], [0, 1, 0]), ([0, 2], [0, 0])]


# --- building from a config --------------------------------------------------------------------------


def test_build_criterion_reads_the_official_sections() -> None:
    raw = {
        "DFINECriterion": {
            "weight_dict": {"loss_vfl": 2, "loss_bbox": 5, "loss_giou": 2, "loss_fgl": 0.3, "loss_ddf": 1.5},
            "losses": ["vfl", "boxes", "local"],
            "alpha": 0.5,
            "gamma": 1.5,
            "reg_max": 32,
            "matcher": {
                "type": "HungarianMatcher",
                "weight_dict": {"cost_class": 3, "cost_bbox": 5, "cost_giou": 2},
                "alpha": 0.3,
                "gamma": 2.0,
            },
        }
    }
    criterion = build_criterion(SIZES["n"], Config.from_dict(raw).train.criterion)
    assert criterion.weight_dict["loss_fgl"] == 0.3
    assert criterion.settings.alpha == 0.5 and criterion.settings.gamma == 1.5
    assert criterion.matcher.cost_class == 3 and criterion.matcher.settings.alpha == 0.3
    assert criterion.num_classes == 80 and criterion.settings.reg_max == 32
    default = build_criterion(SIZES["x"])
    assert default.weight_dict == LOSS_WEIGHTS and default.matcher.cost_bbox == 5


def test_build_criterion_refuses_inconsistent_settings() -> None:
    with pytest.raises(ConfigError, match="reg_max"):
        build_criterion(SIZES["s"], CriterionSettings(reg_max=16))
    # loss and weight names are refused when the config loads, with the nearest valid name
    with pytest.raises(ConfigError, match="did you mean 'vfl'"):
        Config.from_dict({"DFINECriterion": {"losses": ["vlf", "boxes"]}})
    with pytest.raises(ConfigError, match="loss_giou"):
        Config.from_dict({"DFINECriterion": {"weight_dict": {"loss_gio": 2}}})


# --- the real model, and several ranks ---------------------------------------------------------------


def test_real_model_with_denoising_gives_every_term_and_gradients() -> None:
    from benchmarks.official_parity import PARITY_TARGETS, fill_deterministic
    from dfine_deploy.model.families import build_model

    spec = SIZES["n"].with_input_size(256, 256)
    model = build_model(spec)
    fill_deterministic(model)
    model.train()
    targets = [dict(t) for t in PARITY_TARGETS]
    torch.manual_seed(0)
    outputs = model(torch.rand(2, 3, 256, 256), targets)
    losses = build_criterion(spec)(outputs, targets)
    assert len(losses) == 38 and {"loss_fgl_dn_0", "loss_ddf_dn_1", "loss_vfl_dn_pre"} <= set(losses)
    assert all(torch.isfinite(v) for v in losses.values())
    assert float(losses["loss_ddf_dn_0"]) > 0 and float(losses["loss_ddf_dn_2"]) == 0.0
    sum(losses.values()).backward()
    dn_embedding = model.decoder.denoising_class_embed.weight.grad
    assert dn_embedding is not None and dn_embedding.abs().sum() > 0
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def _rank_worker(rank: int, world: int, port: int, folder: str) -> None:
    import torch.distributed as dist

    counts = [[3, 1], [1, 1]][rank]
    generator = torch.Generator().manual_seed(rank)
    outputs, targets = make_outputs(generator, counts), make_targets(generator, counts, 6)
    criterion = make_criterion()
    local = {k: float(v) for k, v in criterion(outputs, targets).items()}
    matchings = [criterion.matcher(outputs, targets)] + [
        criterion.matcher(o, targets)
        for o in [*outputs["aux_outputs"], outputs["pre_outputs"], *outputs["enc_aux_outputs"]]
    ]
    go_count = sum(len(q) for q, _ in union_matching(matchings))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        shared = {k: float(v) for k, v in criterion(outputs, targets).items()}
    finally:
        dist.destroy_process_group()
    torch.save(
        {"local": local, "shared": shared, "boxes": sum(counts), "go": go_count}, f"{folder}/rank{rank}.pt"
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_counts_are_averaged_over_ranks(tmp_path) -> None:
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_rank_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    mean_boxes = sum(r["boxes"] for r in ranks) / 2
    mean_go = sum(r["go"] for r in ranks) / 2
    for r in ranks:
        for name, local in r["local"].items():
            if name.startswith("loss_ddf"):
                factor = 1.0  # DDF averages per edge, with no box count
            elif "_dn_" in name or name.startswith("loss_vfl"):
                factor = r["boxes"] / mean_boxes  # dn terms: boxes x groups, the groups cancel
            else:
                factor = r["go"] / mean_go
            assert r["shared"][name] == pytest.approx(local * factor, rel=1e-5), name
