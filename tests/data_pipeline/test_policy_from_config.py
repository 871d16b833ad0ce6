"""The validation policy set in a YAML config reaches the dataset the trainer builds."""

from __future__ import annotations

import pytest

from dfine_deploy.config import load_config
from dfine_deploy.data.loader import build_dataset
from dfine_deploy.errors import ConfigError, DatasetError


def _config(tmp_path, coco, validation: str):
    path = tmp_path / "data.yml"
    path.write_text(f"""
num_classes: 4
remap_mscoco_category: False
train_dataloader:
  dataset: {{type: CocoDetection, img_folder: {coco.root}, ann_file: {coco.ann_file}}}
  {validation}
""")
    return path


def test_config_policy_decides_what_happens_to_an_empty_image(tmp_path, small_coco):
    small_coco.data["annotations"] = [a for a in small_coco.data["annotations"] if a["image_id"] != 3]
    small_coco.write()

    kept = build_dataset(load_config(_config(tmp_path, small_coco, "")).train_data)
    assert len(kept) == 3  # default: an image without annotations is kept as background

    skipped = build_dataset(
        load_config(_config(tmp_path, small_coco, "validation: {empty_image: skip}")).train_data
    )
    assert len(skipped) == 2
    assert "empty_image" in str(skipped.annotations.report)

    with pytest.raises(DatasetError, match="img3.jpg|empty"):
        build_dataset(
            load_config(_config(tmp_path, small_coco, "validation: {empty_image: error}")).train_data
        )


def test_a_misspelt_problem_or_action_names_the_config_file(tmp_path, small_coco):
    with pytest.raises(ConfigError, match=r"train_dataloader.validation.*data.yml.*empty_imgae"):
        _ = load_config(_config(tmp_path, small_coco, "validation: {empty_imgae: skip}")).train_data
    with pytest.raises(ConfigError, match=r"data.yml.*empty_image='drop'.*keep, skip, error"):
        _ = load_config(_config(tmp_path, small_coco, "validation: {empty_image: drop}")).train_data
