"""Every number a config sets has a range, checked when the file loads: `epochs: -1` trained nothing
and exited 0, `lr: .nan` trained on NaN. Walks the layout, so a key added with a range is tested."""

from __future__ import annotations

from pathlib import Path

import pytest

from dfine_deploy.config import load_config
from dfine_deploy.config.layout import LAYOUT, _WeightsOf
from dfine_deploy.errors import ConfigError
from dfine_deploy.numbers import Range

QUICKSTART = Path(__file__).resolve().parents[2] / "configs" / "quickstart" / "dfine_n_synthetic.yml"


def _ranged_keys(layout: dict, prefix: str = "") -> list[tuple[str, Range]]:
    keys = []
    for key, rule in layout.items():
        dotted = f"{prefix}{key}"
        if isinstance(rule, dict):
            keys += _ranged_keys(rule, f"{dotted}.")
        elif isinstance(rule, Range):
            keys.append((dotted, rule))
        elif isinstance(rule, _WeightsOf):  # one weight of each free mapping stands for all
            keys.append((f"{dotted}.{'cost_class' if 'matcher' in dotted else 'loss_vfl'}", rule.value))
    return keys


RANGED = _ranged_keys(LAYOUT)


def test_the_walk_finds_the_keys_that_ruin_a_run():
    names = {key for key, _ in RANGED}
    assert {"epochs", "optimizer.lr", "train_dataloader.total_batch_size", "ema.decay"} <= names
    assert "DFINECriterion.weight_dict.loss_vfl" in names and len(names) > 40


@pytest.mark.parametrize(("key", "rule"), RANGED, ids=[key for key, _ in RANGED])
def test_non_finite_and_out_of_range_values_name_the_key(key, rule):
    bad = [".nan", ".inf", "-.inf"]
    if rule.low is not None:
        bad.append(str(rule.low - 1))
    if rule.high is not None:
        bad.append(str(rule.high + 1))
    for value in bad:
        with pytest.raises(ConfigError, match=rf"'{key}' \(from -u {key}={value}\) must be a finite number"):
            load_config(QUICKSTART, [f"{key}={value}"])


def test_each_end_of_a_range_is_where_the_rule_says():
    assert load_config(QUICKSTART, ["ema.decay=1.0", "lr_scheduler.min_lr_ratio=0"]).train.ema.decay == 1.0
    with pytest.raises(ConfigError, match=r"'optimizer.betas' .* in \[0, 1\); found \[0.9, 1.0\]"):
        load_config(QUICKSTART, ["optimizer.betas=[0.9, 1.0]"])
    with pytest.raises(ConfigError, match=r"'lr_scheduler.milestones' .* >= 0; found \[5, -1\]"):
        load_config(QUICKSTART, ["lr_scheduler.milestones=[5, -1]"])
    with pytest.raises(ConfigError, match=r"'optimizer.params.0.lr' .* >= 0; found -0.1"):
        load_config(QUICKSTART, ["optimizer.params=[{params: '.*', lr: -0.1}]"])


@pytest.mark.parametrize(
    ("op", "words"),
    [
        ("{type: Resize, size: [.nan, 128]}", "size' (from -u"),
        ("{type: Resize, size: [0, 0]}", "must be a finite number >= 1 (each of them); found [0, 0]"),
        ("{type: RandomPhotometricDistort, p: .inf}", ".p' (from -u"),
        ("{type: RandomIoUCrop, p: -1}", "in [0, 1] (each of them); found -1"),
        ("{type: RandomZoomOut, side_range: [1.0, .inf]}", "side_range"),
    ],
)
def test_transform_arguments_are_finite_and_sizes_positive(op, words):
    with pytest.raises(ConfigError) as caught:
        load_config(QUICKSTART, [f"train_dataloader.dataset.transforms.ops=[{op}]"])
    assert "'train_dataloader.dataset.transforms.ops.0." in str(caught.value) and words in str(caught.value)
