"""Any input size that is a multiple of 32 runs, for every size; anchors follow the actual maps."""

from __future__ import annotations

import pytest
import torch

from benchmarks.official_parity import fill_deterministic
from dfine_deploy.errors import ModelError
from dfine_deploy.model import SIZES, DeployModel, PostProcessor, build_model, size_spec


@pytest.mark.parametrize("size", ["n", "s", "m", "l", "x"])
def test_eval_at_320_and_512_for_a_640_model(size):
    model = build_model(SIZES[size]).eval()  # anchors and pos-embeds cached for 640
    for side in (320, 512):
        images = torch.rand(1, 3, side, side, generator=torch.Generator().manual_seed(side))
        with torch.no_grad():
            out = model(images)
        assert out["pred_logits"].shape == (1, 300, 80)
        assert out["pred_boxes"].shape == (1, 300, 4)
        assert torch.isfinite(out["pred_logits"]).all() and torch.isfinite(out["pred_boxes"]).all()


def test_other_size_equals_a_model_built_for_it():
    """A 640 model run at 256x384 gives what a model built for 256x384 gives, with the same weights."""
    built_640 = build_model(SIZES["n"])
    built_here = build_model(SIZES["n"].with_input_size(256, 384))
    assert built_here.decoder.anchors.shape == (1, 16 * 24 + 8 * 12, 4)
    for model in (built_640, built_here):
        fill_deterministic(model)
        model.eval()
    images = torch.rand(2, 3, 256, 384, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        a, b = built_640(images), built_here(images)
    torch.testing.assert_close(a["pred_logits"], b["pred_logits"], atol=0, rtol=0)
    torch.testing.assert_close(a["pred_boxes"], b["pred_boxes"], atol=0, rtol=0)


def test_deploy_outputs_have_the_export_shapes():
    model = build_model(SIZES["n"].with_input_size(320, 320))
    deploy = DeployModel(model, PostProcessor(80)).eval()
    images = torch.rand(3, 3, 320, 320)
    sizes = torch.tensor([[640, 480], [320, 320], [1920, 1080]])
    with torch.no_grad():
        labels, boxes, scores = deploy(images, sizes)
    assert labels.shape == (3, 300) and labels.dtype == torch.int64
    assert boxes.shape == (3, 300, 4) and boxes.dtype == torch.float32
    assert scores.shape == (3, 300) and scores.dtype == torch.float32
    assert ((labels >= 0) & (labels < 80)).all()
    assert (scores[:, :-1] >= scores[:, 1:]).all()  # sorted per image


@pytest.mark.parametrize("hw", [(320, 330), (300, 320)])
def test_size_not_multiple_of_32_is_refused(hw):
    model = build_model(SIZES["n"]).eval()
    with pytest.raises(ModelError, match="not a multiple of 32"):
        model(torch.zeros(1, 3, *hw))


def test_spec_size_not_multiple_of_32_is_refused():
    with pytest.raises(ModelError, match="eval_spatial_size"):
        build_model(SIZES["n"].with_input_size(500, 640))


def test_an_input_too_small_for_the_query_count_names_the_fix():
    model = build_model(size_spec("n").with_input_size(160, 160)).eval()
    with (
        torch.no_grad(),
        pytest.raises(ModelError, match=r"125 feature tokens.*num_queries=300.*larger input size"),
    ):
        model(torch.zeros(1, 3, 160, 160))


def _suggested(message: str) -> tuple[int, int]:
    import re

    match = re.search(r"--imgsz (\d+) (\d+)", message)
    assert match, message
    return int(match.group(1)), int(match.group(2))


@pytest.mark.parametrize("hw", [(224, 224), (32, 32), (16, 16), (64, 320), (330, 320)])
def test_every_refused_size_suggests_a_size_that_runs(hw):
    """224 gives 245 tokens < 300 queries; 32 was once suggested by the refusal message itself."""
    spec = size_spec("n")
    with pytest.raises(ModelError) as caught:
        spec.check_input_size(*hw)
    fix = _suggested(str(caught.value))
    spec.check_input_size(*fix)  # the suggestion itself is accepted
    assert spec.feature_tokens(*fix) >= spec.decoder.num_queries


def test_fewer_queries_allow_a_smaller_input():
    from dataclasses import replace

    spec = size_spec("n")
    small = replace(spec, decoder=replace(spec.decoder, num_queries=100), num_top_queries=100)
    small.check_input_size(224, 224)
    with pytest.raises(ModelError, match="245 feature tokens"):
        spec.check_input_size(224, 224)


@pytest.mark.parametrize("ref", ["dfine-n", "configs/dfine/dfine_hgnetv2_n_coco.yml"])
def test_load_model_checks_the_query_count_before_building(ref):
    """Every path that builds a network (export, bench, serve, the torch Detector) goes through here."""
    from dfine_deploy.hub.loader import load_model, resolve_spec

    for call in (load_model, resolve_spec):
        with pytest.raises(ModelError, match=r"245 feature tokens.*--imgsz 256 256"):
            call(ref, imgsz=(224, 224))


def test_torch_detector_refuses_a_size_too_small_for_the_queries():
    from dfine_deploy.runtime import Detector

    with pytest.raises(ModelError, match="num_queries=300"):
        Detector.open("dfine-n", backend="torch", imgsz=(224, 224))
