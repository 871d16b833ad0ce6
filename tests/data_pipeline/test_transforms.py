from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torchvision import tv_tensors

from dfine_deploy.config import load_config
from dfine_deploy.data.transforms import (
    BatchCollator,
    ConvertBoxes,
    build_transforms,
    eval_transforms,
    generate_scales,
)
from dfine_deploy.errors import ConfigError

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
STRONG = ["RandomPhotometricDistort", "RandomZoomOut", "RandomIoUCrop"]


def sample(h: int = 60, w: int = 80):
    image = tv_tensors.Image(torch.randint(0, 256, (3, h, w), dtype=torch.uint8))
    boxes = torch.tensor([[10.0, 5.0, 50.0, 45.0], [60.0, 30.0, 80.0, 60.0], [1.0, 1.0, 1.5, 30.0]])
    target = {
        "boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(h, w)),
        "labels": torch.tensor([0, 1, 2]),
        "image_id": torch.tensor(7),
    }
    return image, target


def official_ops(size: int) -> list[dict]:
    return [
        {"type": "RandomPhotometricDistort", "p": 0.5},
        {"type": "RandomZoomOut", "fill": 0},
        {"type": "RandomIoUCrop", "p": 0.8},
        {"type": "SanitizeBoundingBoxes", "min_size": 1},
        {"type": "RandomHorizontalFlip"},
        {"type": "Resize", "size": [size, size]},
        {"type": "SanitizeBoundingBoxes", "min_size": 1},
        {"type": "ConvertPILImage", "dtype": "float32", "scale": True},
        {"type": "ConvertBoxes", "fmt": "cxcywh", "normalize": True},
    ]


def test_official_config_ops_build_in_order_with_the_policy():
    cfg = load_config(CONFIGS / "dfine" / "dfine_hgnetv2_n_coco.yml")
    settings = cfg.train_data.transforms
    pipe = build_transforms(settings.ops, settings.policy)
    assert [name for name, _ in pipe.ops] == [op["type"] for op in official_ops(640)]
    assert pipe.stop_epoch == settings.policy.epoch and pipe.stop_epoch is not None
    assert pipe.active(pipe.stop_epoch - 1)[:3] == STRONG
    assert pipe.active(pipe.stop_epoch) == [op["type"] for op in official_ops(640)][3:]


def test_train_pipeline_output_contract():
    pipe = build_transforms(official_ops(64))
    torch.manual_seed(0)
    for _ in range(8):
        image, target = pipe(*sample(), epoch=0)
        assert image.dtype == torch.float32 and image.shape == (3, 64, 64)
        assert image.min() >= 0.0 and image.max() <= 1.0
        boxes = target["boxes"]
        assert type(boxes) is torch.Tensor and boxes.dtype == torch.float32  # plain tensor for the criterion
        assert boxes.shape[0] == target["labels"].shape[0]  # sanitize kept labels aligned
        assert ((boxes >= 0) & (boxes <= 1)).all()
        assert int(target["image_id"]) == 7


def test_stop_epoch_skips_the_strong_ops():
    policy = {"name": "stop_epoch", "epoch": 3, "ops": STRONG}
    pipe = build_transforms(official_ops(64), policy)
    weak = build_transforms(official_ops(64)[3:])
    image, target = sample()
    torch.manual_seed(1)
    late = pipe(image, target, epoch=3)
    torch.manual_seed(1)
    expected = weak(image, target)
    assert torch.equal(late[0], expected[0]) and torch.equal(late[1]["boxes"], expected[1]["boxes"])
    # before the stop epoch the strong ops run: zoom-out with p=1 changes the boxes
    zoom = build_transforms(
        [{"type": "RandomZoomOut", "fill": 0, "p": 1.0}],
        {"name": "stop_epoch", "epoch": 3, "ops": ["RandomZoomOut"]},
    )
    assert zoom(image, target, epoch=2)[0].shape != image.shape
    assert zoom(image, target, epoch=3)[0].shape == image.shape


def test_convert_boxes_to_normalised_cxcywh():
    image, target = sample(h=60, w=80)
    _, out = ConvertBoxes(fmt="cxcywh", normalize=True)(image, target)
    torch.testing.assert_close(out["boxes"][0], torch.tensor([30 / 80, 25 / 60, 40 / 80, 40 / 60]))


def test_eval_pipeline_is_a_plain_resize():
    image, target = sample(h=60, w=80)
    out_image, out_target = eval_transforms(32)(image, target)
    assert out_image.shape == (3, 32, 32) and out_image.dtype == torch.float32
    torch.testing.assert_close(
        out_target["boxes"][0].as_subclass(torch.Tensor), torch.tensor([4.0, 32 / 60 * 5, 20.0, 32 / 60 * 45])
    )


def test_generate_scales_matches_the_official_list():
    # official BatchImageCollateFunction (src/data/dataloader.py in Peterande/D-FINE):
    # [480, 512, 544, 576, 608] + [640] * r + [800, 768, 736, 704, 672]
    assert generate_scales(640, 3) == [480, 512, 544, 576, 608, 640, 640, 640, 800, 768, 736, 704, 672]
    scales = generate_scales(320, 2)
    assert all(s % 32 == 0 for s in scales) and min(scales) == 224 and max(scales) == 384
    assert scales.count(320) == 3  # twice as base, once as the top range's last step


def test_collator_multi_scale_until_stop_epoch():
    collate = BatchCollator(scales=[32, 48], stop_epoch=2)
    items = [build_transforms(official_ops(64)[3:])(*sample()) for _ in range(3)]
    torch.manual_seed(0)
    sizes = {collate(items)[0].shape[-1] for _ in range(20)}
    assert sizes == {32, 48}
    images, targets = collate(items)
    assert images.shape[:2] == (3, 3) and len(targets) == 3
    collate.set_epoch(2)
    assert collate(items)[0].shape == (3, 3, 64, 64)
    assert BatchCollator(None)(items)[0].shape == (3, 3, 64, 64)


def test_unknown_op_and_policy_errors():
    with pytest.raises(ConfigError, match="did you mean RandomHorizontalFlip"):
        build_transforms([{"type": "RandomHorizontalFlipp"}])
    with pytest.raises(ConfigError, match="bad arguments"):
        build_transforms([{"type": "Resize", "sizes": [3, 3]}])
    with pytest.raises(ConfigError, match="stop_sample"):
        build_transforms(official_ops(64), {"name": "stop_sample", "epoch": 3})
    with pytest.raises(ConfigError, match="different sizes"):
        BatchCollator()([sample(60, 80), sample(60, 70)])
