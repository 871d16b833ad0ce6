"""The rule that sizes the recipe's schedule to the dataset (training/sizing.py).

Official configs on COCO-sized data must come back exactly as written; on 800 images the recipe's
values are stretched by the documented factors; whatever -u or one's own file sets is kept.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dfine_deploy.config import load_config
from dfine_deploy.training.sizing import SIZED_ORIGIN, DataScale, size_config, start_line

REPO = Path(__file__).resolve().parents[2]
OFFICIAL = sorted((REPO / "configs" / "dfine").glob("**/*.yml"))
OFFICIAL = [p for p in OFFICIAL if "include" not in p.parts]
# names that land in each kind of optimizer group of the official patterns
PARAMETERS = [
    "backbone.stem.stem1.conv.weight",
    "backbone.stages.0.blocks.0.layers.0.conv.weight",
    "backbone.stages.0.blocks.0.layers.0.bn.weight",
    "encoder.input_proj.0.conv.weight",
    "encoder.input_proj.0.norm.weight",
    "decoder.dec_score_head.0.weight",
    "decoder.dec_score_head.0.bias",
]
COCO = DataScale(images=118_287, median_boxes_per_class=6_000)  # COCO train2017 (median class: ~6k boxes)


def sized(path: Path, scale: DataScale, *updates: str, finetuning: bool = True):
    cfg = load_config(path, list(updates))
    new, settings = size_config(
        cfg, scale, global_batch=32, finetuning=finetuning, parameter_names=PARAMETERS
    )
    return cfg, new, settings


@pytest.mark.parametrize("path", OFFICIAL, ids=lambda p: str(p.relative_to(REPO / "configs" / "dfine")))
def test_official_configs_are_unchanged_on_coco_sized_data(path):
    cfg, new, settings = sized(path, COCO)
    assert new.raw == cfg.raw
    assert new.train == cfg.train and new.train_data == cfg.train_data
    assert all(s.value == s.recipe for s in settings), [s.line() for s in settings]


def test_800_images_stretch_the_l_recipe():
    path = REPO / "configs" / "dfine" / "custom" / "dfine_hgnetv2_l_custom.yml"
    scale = DataScale(images=800, median_boxes_per_class=150)
    factor = math.sqrt(800 / 10_000)  # images are the smaller share; 150 / 1000 is larger
    assert scale.factor == pytest.approx(factor)
    cfg, new, settings = sized(path, scale)
    epochs = round(80 / factor)
    assert new.train.epochs == epochs == 283
    stop = round(72 * epochs / 80)
    assert new.train.stop_epoch == stop
    assert new.raw["train_dataloader"]["collate_fn"]["stop_epoch"] == stop
    assert new.train_data.transforms.policy.epoch == stop
    total = epochs * (800 // 32)
    assert new.train.lr_warmup_scheduler.warmup_duration == math.ceil(0.05 * total) < 500
    assert new.train.ema.warmups == math.ceil(0.2 * total) > 1000
    backbone = new.train.optimizer.params[0]
    assert backbone.lr == pytest.approx(0.0000125 * factor)
    assert new.train.optimizer.params[1].lr is None and new.train.optimizer.lr == cfg.train.optimizer.lr
    assert new.train.lr_scheduler.milestones == (round(500 * epochs / 80),)  # still never reached
    assert new.provenance["epochs"].startswith(SIZED_ORIGIN)
    line = start_line(scale, settings)
    assert line.startswith(
        "800 images, median 150 boxes per class, scale 0.28: epochs 283 (sized; recipe 80)"
    )
    assert "backbone lr factor 0.014142 (sized; recipe 0.05)" in line


def test_backbone_lr_is_sized_only_when_fine_tuning():
    path = REPO / "configs" / "dfine" / "custom" / "dfine_hgnetv2_l_custom.yml"
    _, new, settings = sized(path, DataScale(800, 150), finetuning=False)
    assert new.train.optimizer.params[0].lr == 0.0000125
    assert not any(s.name == "backbone lr factor" for s in settings)


def test_values_you_set_are_kept(tmp_path):
    path = REPO / "configs" / "dfine" / "custom" / "dfine_hgnetv2_l_custom.yml"
    mine = tmp_path / "mine.yml"
    mine.write_text(f"__include__: ['{path}']\nlr_warmup_scheduler: {{warmup_duration: 321}}\n")
    cfg, new, settings = sized(mine, DataScale(800, 150), "epochs=50")
    assert new.train.epochs == 50 and new.train.lr_warmup_scheduler.warmup_duration == 321
    line = start_line(DataScale(800, 150), settings)
    assert "epochs 50 (set -u epochs=50)" in line
    assert f"warm-up steps 321 (set in {mine})" in line
    # the recipe's, so sized: 1/5 of 50 x 25 steps is below the recipe's 1000, which stays
    assert new.train.ema.warmups == 1000 and "EMA warm-up updates 1000 (sized to the data)" in line
    assert new.train.stop_epoch == 72  # your epochs stretch nothing


def test_boxes_per_class_count_too():
    import numpy as np

    from dfine_deploy.data.validation import ImageRecord

    def image(ids: list[int], crowd: list[bool]) -> ImageRecord:
        n = len(ids)
        return ImageRecord(
            1, "a.jpg", 10, 10, np.zeros((n, 4), np.float32), np.array(ids), np.array(crowd), np.ones(n)
        )

    scale = DataScale.of(
        [image([0, 0, 1], [False, False, True]), image([0, 2], [False, False])], [0, 1, 2, 3]
    )
    assert scale.images == 2 and scale.median_boxes_per_class == 0.5  # per class 3, 0 (crowd), 1, 0
    few = DataScale(images=50_000, median_boxes_per_class=90)
    assert few.ratio == pytest.approx(0.09) and few.factor == pytest.approx(0.3)
    assert DataScale(images=50_000, median_boxes_per_class=10).factor == 0.25  # the floor: at most 4x
