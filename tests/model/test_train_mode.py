"""Train-mode outputs follow the official structure the criterion and trainer rely on."""

from __future__ import annotations

import pytest
import torch

from dfine_deploy.model import SIZES, build_model
from dfine_deploy.model.denoising import denoising_attention_mask
from dfine_deploy.model.hgnetv2 import FrozenBatchNorm2d, HGNetv2

TARGETS = [
    {
        "labels": torch.tensor([1, 7, 7]),
        "boxes": torch.tensor([[0.3, 0.4, 0.2, 0.3], [0.7, 0.6, 0.25, 0.15], [0.5, 0.2, 0.1, 0.1]]),
    },
    {"labels": torch.tensor([0]), "boxes": torch.tensor([[0.25, 0.75, 0.3, 0.2]])},
]


def test_train_outputs_with_denoising_and_backward():
    model = build_model(SIZES["n"].with_input_size(256, 256)).train()
    images = torch.rand(2, 3, 256, 256)
    out = model(images, TARGETS)
    layers, queries, bins = 3, 300, 4 * 33
    assert out["pred_logits"].shape == (2, queries, 80)
    assert out["pred_boxes"].shape == out["ref_points"].shape == (2, queries, 4)
    assert out["pred_corners"].shape == (2, queries, bins)
    assert out["up"] is model.decoder.up and out["reg_scale"] is model.decoder.reg_scale
    assert len(out["aux_outputs"]) == layers - 1
    for aux in out["aux_outputs"]:
        assert set(aux) == {
            "pred_logits",
            "pred_boxes",
            "pred_corners",
            "ref_points",
            "teacher_corners",
            "teacher_logits",
        }
        assert torch.equal(aux["teacher_corners"], out["pred_corners"])
        assert torch.equal(aux["teacher_logits"], out["pred_logits"])
    assert len(out["enc_aux_outputs"]) == 1 and out["enc_aux_outputs"][0]["pred_logits"].shape == (
        2,
        queries,
        80,
    )
    assert out["pre_outputs"]["pred_boxes"].shape == (2, queries, 4)
    assert out["enc_meta"] == {"class_agnostic": False}

    meta = out["dn_meta"]
    num_group = 100 // 3  # max 3 targets per image
    num_dn = 2 * 3 * num_group
    assert meta["dn_num_group"] == num_group and meta["dn_num_split"] == [num_dn, queries]
    assert [len(idx) for idx in meta["dn_positive_idx"]] == [3 * num_group, 1 * num_group]
    assert len(out["dn_outputs"]) == layers
    assert out["dn_outputs"][0]["pred_logits"].shape == (2, num_dn, 80)
    assert out["dn_pre_outputs"]["pred_boxes"].shape == (2, num_dn, 4)

    loss = (
        out["pred_boxes"].sum()
        + out["pred_logits"].sigmoid().mean()
        + out["dn_outputs"][0]["pred_corners"].mean()
    )
    loss.backward()
    assert model.decoder.dec_bbox_head[0].layers[0].weight.grad is not None
    assert model.decoder.up.grad is None and not model.decoder.up.requires_grad


def test_denoising_mask_blocks_other_groups_and_hides_dn_from_queries():
    mask = denoising_attention_mask(num_denoising=6, group_size=2, num_queries=3, device=torch.device("cpu"))
    assert mask.shape == (9, 9)
    assert mask[6:, :6].all() and not mask[6:, 6:].any()  # queries see no dn, but each other
    assert not mask[:6, 6:].any()  # dn queries see the matching queries
    for group in range(3):
        rows = slice(2 * group, 2 * group + 2)
        assert not mask[rows, rows].any()
        assert mask[rows, :6].sum() == 2 * 4  # blocked from the other two groups


@pytest.mark.parametrize("freeze_stem_only, frozen_stages", [(True, 0), (False, 2)])
def test_freeze_options(freeze_stem_only, frozen_stages):
    backbone = HGNetv2(
        "B0",
        use_lab=True,
        return_idx=(1, 2, 3),
        freeze_at=1,
        freeze_stem_only=freeze_stem_only,
        freeze_norm=True,
    )
    assert not any(p.requires_grad for p in backbone.stem.parameters())
    for i, stage in enumerate(backbone.stages):
        assert all(p.requires_grad != (i < frozen_stages) for p in stage.parameters())
    norms = [m for m in backbone.modules() if isinstance(m, (torch.nn.BatchNorm2d, FrozenBatchNorm2d))]
    assert norms and all(isinstance(m, FrozenBatchNorm2d) for m in norms)
    assert not any(k.endswith("num_batches_tracked") for k in backbone.state_dict())
    assert backbone.feature_info == [(256, 8), (512, 16), (1024, 32)]


def test_frozen_batchnorm_equals_eval_batchnorm_and_loads_plain_bn_weights():
    bn = torch.nn.BatchNorm2d(5).eval()
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2)
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-1, 1)
    frozen = FrozenBatchNorm2d(5)
    frozen.load_state_dict(bn.state_dict())  # carries num_batches_tracked, which is dropped
    x = torch.randn(2, 5, 4, 4)
    torch.testing.assert_close(frozen(x), bn(x), atol=1e-6, rtol=1e-6)


def test_channels_last_training_differs_from_nchw_only_by_rounding():
    """`to_device` puts CPU models channels-last (faster convolutions and backward). The train-mode
    outputs after query selection are chaotic (a 1e-6 change of the input moves some boxes by the
    whole image), so what is compared is the part without discrete choices, the backbone and the
    encoder. Features: within a small multiple of the NCHW model's own change under a 1e-6 input
    change (measured 4x). Backbone gradient norm: within 1e-3 relative, float32 reduction order over
    the batch and the pixels (measured 3.5e-4)."""
    from benchmarks.official_parity import fill_deterministic
    from dfine_deploy.model.dfine import to_device

    def build():
        return build_model(SIZES["n"].with_input_size(320, 320)).train()

    nchw = build()
    fill_deterministic(nchw)
    twin, nhwc = build(), to_device(build(), torch.device("cpu"))
    twin.load_state_dict(nchw.state_dict())
    nhwc.load_state_dict(nchw.state_dict())
    kernels = [p for p in nhwc.parameters() if p.dim() == 4]
    assert kernels and all(k.is_contiguous(memory_format=torch.channels_last) for k in kernels)
    images = torch.rand(2, 3, 320, 320, generator=torch.Generator().manual_seed(0))

    def features_and_grad_norm(model, x):
        feats = model.encoder(model.backbone(x))
        sum(f.square().mean() for f in feats).backward()
        grad = torch.stack([p.grad.norm() for p in model.backbone.parameters() if p.grad is not None]).norm()
        return torch.cat([f.flatten() for f in feats]).detach(), grad

    ref, ref_grad = features_and_grad_norm(nchw, images)
    near, _ = features_and_grad_norm(twin, images * (1 + 1e-6))
    out, out_grad = features_and_grad_norm(nhwc, images)
    noise = float((near - ref).abs().max())
    assert 0 < float((out - ref).abs().max()) <= 20 * noise
    assert abs(float(out_grad / ref_grad) - 1) <= 1e-3
