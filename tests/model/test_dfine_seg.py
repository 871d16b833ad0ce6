"""D-FINE-seg checkpoints (github.com/ArgoHA/D-FINE-seg): an official D-FINE plus an instance-mask head
under `decoder.mask_decoder.` / `decoder.mask_head.`, saved by its trainer as a bare state_dict
(`torch.save(model.state_dict(), "model.pt")`). The detection part loads; the mask head is set aside."""

from __future__ import annotations

import pytest
import torch

from dfine_deploy.hub.loader import load_model
from dfine_deploy.model.families import build_model
from dfine_deploy.model.spec import SIZES
from dfine_deploy.model.weights import MASK_HEAD_PREFIXES, load_checkpoint
from tests.model.test_weights import official_state_dict

MASK_DIM = 256  # D-FINE-seg's default mask_dim; GroupNorm(32, mask_dim) throughout


def _mask_head(feat_channels: list[int], hidden_dim: int) -> dict[str, torch.Tensor]:
    """D-FINE-seg's MaskDecoder + mask MLP tensors, by its names and shapes."""
    gen = torch.Generator().manual_seed(1)
    shapes: dict[str, tuple[int, ...]] = {}
    for i, channels in enumerate(feat_channels):
        shapes[f"decoder.mask_decoder.lateral.{i}.weight"] = (MASK_DIM, channels, 1, 1)
        shapes[f"decoder.mask_decoder.bn.{i}.weight"] = (MASK_DIM,)
        shapes[f"decoder.mask_decoder.bn.{i}.bias"] = (MASK_DIM,)
    for conv, norm in (("fusion_conv", "fusion_norm"), ("up_conv", "bn1")):
        shapes[f"decoder.mask_decoder.{conv}.weight"] = (MASK_DIM, MASK_DIM, 3, 3)
        shapes[f"decoder.mask_decoder.{norm}.weight"] = (MASK_DIM,)
        shapes[f"decoder.mask_decoder.{norm}.bias"] = (MASK_DIM,)
    for i, (n_in, n_out) in enumerate(
        [(hidden_dim, hidden_dim), (hidden_dim, hidden_dim), (hidden_dim, MASK_DIM)]
    ):
        shapes[f"decoder.mask_head.layers.{i}.weight"] = (n_out, n_in)
        shapes[f"decoder.mask_head.layers.{i}.bias"] = (n_out,)
    return {k: torch.randn(s, generator=gen) for k, s in shapes.items()}


def test_d_fine_seg_checkpoint_loads_its_detection_part(tmp_path):
    torch.manual_seed(0)
    detection = build_model(SIZES["n"].with_classes(3)).state_dict()  # the official names and shapes
    assert set(detection) == set(official_state_dict("n", 3))
    seg = {**detection, **_mask_head([128, 128], 128)}
    seg_path, det_path = tmp_path / "model.pt", tmp_path / "det.pth"
    torch.save(seg, seg_path)
    torch.save(detection, det_path)

    with pytest.warns(UserWarning, match=r"D-FINE-seg checkpoint.*mask head \(18 tensors"):
        ckpt = load_checkpoint(seg_path)
    assert ckpt.source_key == "state_dict" and len(ckpt.set_aside) == 18
    assert all(k.startswith(MASK_HEAD_PREFIXES) for k in ckpt.set_aside)
    assert set(ckpt.state_dict) == set(detection)

    images = torch.rand(1, 3, 256, 256, generator=torch.Generator().manual_seed(2))
    outputs = []
    for path in (seg_path, det_path):
        loaded = load_model(path, imgsz=(256, 256))
        assert loaded.spec.size == "n" and loaded.spec.num_classes == 3
        with torch.no_grad():
            outputs.append(loaded.model(images))
    assert torch.equal(outputs[0]["pred_logits"], outputs[1]["pred_logits"])
    assert torch.equal(outputs[0]["pred_boxes"], outputs[1]["pred_boxes"])
