"""HungarianMatcher: its cost against a per-pair formula, its assignment against brute force."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from dfine_deploy.errors import ConfigError
from dfine_deploy.settings import MatcherSettings
from dfine_deploy.training.matcher import HungarianMatcher


def _xyxy(box: list[float]) -> list[float]:
    cx, cy, w, h = box
    w, h = max(w, 0.0), max(h, 0.0)
    return [cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2]


def _giou(a: list[float], b: list[float]) -> float:
    """GIoU of two cxcywh boxes, written out scalar by scalar."""
    ax1, ay1, ax2, ay2 = _xyxy(a)
    bx1, by1, bx2, by2 = _xyxy(b)
    inter = max(0.0, min(ax2, bx2) - max(ax1, bx1)) * max(0.0, min(ay2, by2) - max(ay1, by1))
    union = (ax2 - ax1) * (ay2 - ay1) + (bx2 - bx1) * (by2 - by1) - inter
    hull = (max(ax2, bx2) - min(ax1, bx1)) * (max(ay2, by2) - min(ay1, by1))
    return inter / union - (hull - union) / hull


def _pair_cost(
    logits: list[float],
    box: list[float],
    label: int,
    gt: list[float],
    w=(2.0, 5.0, 2.0),
    alpha=0.25,
    gamma=2.0,
) -> float:
    p = 1 / (1 + math.exp(-logits[label]))
    focal = alpha * (1 - p) ** gamma * -math.log(p + 1e-8) - (1 - alpha) * p**gamma * -math.log(1 - p + 1e-8)
    l1 = sum(abs(x - y) for x, y in zip(box, gt))
    return w[0] * focal + w[1] * l1 - w[2] * _giou(box, gt)


def _random_case(generator: torch.Generator, batch: int, queries: int, classes: int, counts: list[int]):
    logits = torch.randn(batch, queries, classes, generator=generator) * 2
    centres = torch.rand(batch, queries, 2, generator=generator) * 0.6 + 0.2
    sizes = torch.rand(batch, queries, 2, generator=generator) * 0.3 + 0.05
    outputs = {"pred_logits": logits, "pred_boxes": torch.cat([centres, sizes], -1)}
    targets = []
    for n in counts:
        boxes = torch.cat(
            [
                torch.rand(n, 2, generator=generator) * 0.6 + 0.2,
                torch.rand(n, 2, generator=generator) * 0.3 + 0.05,
            ],
            -1,
        )
        targets.append({"labels": torch.randint(0, classes, (n,), generator=generator), "boxes": boxes})
    return outputs, targets


def _cost_table(outputs, targets, image: int) -> list[list[float]]:
    logits, boxes = outputs["pred_logits"][image].tolist(), outputs["pred_boxes"][image].tolist()
    labels, gts = targets[image]["labels"].tolist(), targets[image]["boxes"].tolist()
    return [
        [_pair_cost(logits[q], boxes[q], labels[g], gts[g]) for g in range(len(gts))]
        for q in range(len(boxes))
    ]


def _brute_force_minimum(cost: list[list[float]]) -> float:
    num_gt = len(cost[0])
    return min(
        sum(cost[q][g] for g, q in enumerate(chosen))
        for chosen in itertools.permutations(range(len(cost)), num_gt)
    )


@pytest.mark.parametrize("seed", range(6))
def test_assignment_is_optimal_against_brute_force(seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    counts = [
        int(torch.randint(1, 4, (1,), generator=generator)),
        int(torch.randint(0, 4, (1,), generator=generator)),
    ]
    outputs, targets = _random_case(generator, 2, 6, 5, counts)
    indices = HungarianMatcher()(outputs, targets)
    for image, (queries, gts) in enumerate(indices):
        assert len(queries) == len(gts) == counts[image]
        if counts[image] == 0:
            continue
        cost = _cost_table(outputs, targets, image)
        assert sorted(gts.tolist()) == list(range(counts[image]))  # every target used once
        assert len(set(queries.tolist())) == len(queries)  # every query at most once
        chosen = sum(cost[q][g] for q, g in zip(queries.tolist(), gts.tolist()))
        assert chosen == pytest.approx(_brute_force_minimum(cost), abs=1e-4)


def test_cost_matrix_matches_the_per_pair_formula() -> None:
    outputs, targets = _random_case(torch.Generator().manual_seed(7), 2, 5, 4, [2, 3])
    cost = HungarianMatcher().cost_matrix(outputs, targets)  # [2, 5, 5]
    for image, offset in ((0, 0), (1, 2)):
        expected = torch.tensor(_cost_table(outputs, targets, image))
        block = cost[image, :, offset : offset + len(targets[image]["labels"])]
        torch.testing.assert_close(block, expected, atol=1e-5, rtol=1e-5)


def test_custom_weights_change_the_assignment() -> None:
    # query 0 sits on the target but scores the wrong class; query 1 scores the class but is far away
    outputs = {
        "pred_logits": torch.tensor([[[4.0, -4.0], [-4.0, 6.0]]]),
        "pred_boxes": torch.tensor([[[0.5, 0.5, 0.2, 0.2], [0.2, 0.2, 0.2, 0.2]]]),
    }
    targets = [{"labels": torch.tensor([1]), "boxes": torch.tensor([[0.5, 0.5, 0.2, 0.2]])}]
    by_box = HungarianMatcher(
        MatcherSettings(weight_dict={"cost_class": 0.0, "cost_bbox": 5.0, "cost_giou": 2.0})
    )(outputs, targets)
    by_class = HungarianMatcher(
        MatcherSettings(weight_dict={"cost_class": 2.0, "cost_bbox": 0.0, "cost_giou": 0.0})
    )(outputs, targets)
    assert by_box[0][0].tolist() == [0]
    assert by_class[0][0].tolist() == [1]


def test_nan_costs_still_give_a_full_assignment() -> None:
    outputs, targets = _random_case(torch.Generator().manual_seed(3), 1, 4, 3, [2])
    outputs["pred_logits"][0, 1] = float("nan")
    queries, gts = HungarianMatcher()(outputs, targets)[0]
    assert sorted(gts.tolist()) == [0, 1] and len(set(queries.tolist())) == 2


def test_no_targets_anywhere_gives_empty_matches() -> None:
    outputs, _ = _random_case(torch.Generator().manual_seed(0), 2, 4, 3, [])
    empty = {"labels": torch.zeros(0, dtype=torch.int64), "boxes": torch.zeros(0, 4)}
    indices = HungarianMatcher()(outputs, [empty, empty])
    assert [(len(q), len(g)) for q, g in indices] == [(0, 0), (0, 0)]


def test_bad_weight_names_are_refused() -> None:
    with pytest.raises(ConfigError, match="cost_bbox"):
        HungarianMatcher(MatcherSettings(weight_dict={"cost_class": 2, "cost_box": 5, "cost_giou": 2}))
    with pytest.raises(ConfigError, match="non-zero"):
        HungarianMatcher(MatcherSettings(weight_dict={"cost_class": 0, "cost_bbox": 0, "cost_giou": 0}))
