"""The gather-based bilinear sampler gives grid_sample's numbers and exports without GridSample."""

from __future__ import annotations

import onnx
import onnxruntime as ort
import pytest
import torch

from benchmarks.official_parity import fill_deterministic
from dfine_deploy.errors import ModelError
from dfine_deploy.model import SIZES, build_model
from dfine_deploy.model.deformable import (
    MSDeformableAttention,
    sample_gather,
    sample_grid,
)

SHAPES = [[7, 5], [4, 9], [2, 3]]  # non-square levels of different sizes
POINTS = [3, 6, 2]


def _random_inputs(batch_heads: int, queries: int, channels: int = 4, spread: float = 0.4):
    generator = torch.Generator().manual_seed(0)
    length = sum(h * w for h, w in SHAPES)
    value = torch.randn(batch_heads, channels, length, generator=generator)
    # Locations reach `spread` beyond [0, 1] on every side, so many points fall outside the maps.
    locations = (
        torch.rand(batch_heads, queries, sum(POINTS), 2, generator=generator) * (1 + 2 * spread) - spread
    )
    weights = torch.rand(batch_heads, queries, sum(POINTS), generator=generator)
    return value, locations, weights


@pytest.mark.parametrize("batch_heads", [1, 6])
def test_gather_equals_grid_sample_inside_and_outside(batch_heads):
    value, locations, weights = _random_inputs(batch_heads, queries=50)
    outside = ((locations < 0) | (locations > 1)).any(-1)
    assert outside.any() and (~outside).any()
    expected = sample_grid(value, SHAPES, locations, weights, POINTS)
    got = sample_gather(value, SHAPES, locations, weights, POINTS)
    assert got.shape == expected.shape == (batch_heads, 4, 50)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("shift", [5.0, -5.0, 1e6, -1e6])
def test_points_far_outside_sample_zero(shift):
    value, locations, weights = _random_inputs(2, queries=10)
    locations = locations + shift  # every bilinear neighbour is off the map
    assert sample_gather(value, SHAPES, locations, weights, POINTS).abs().max() == 0
    assert sample_grid(value, SHAPES, locations, weights, POINTS).abs().max() == 0


def _edge_locations(size: int) -> torch.Tensor:
    """Normalised locations whose pixel coordinate (loc * size - 0.5) is on or around the map's edges."""
    pixels = torch.tensor([-1.5, -1.0, -0.5, 0.0, size - 1.0, size - 0.5, size, size + 0.5])
    return (pixels + 0.5) / size


def test_points_on_the_map_edges_equal_grid_sample():
    """Where the gather sampler clamps onto its zero border: every pair of edge coordinates (x, y)."""
    value, _, weights = _random_inputs(3, queries=64)
    per_level = []
    for (h, w), n in zip(SHAPES, POINTS):
        x, y = torch.meshgrid(_edge_locations(w), _edge_locations(h), indexing="ij")
        per_level.append(torch.stack([x, y], dim=-1).reshape(64, 1, 2).expand(64, n, 2))
    locations = torch.cat(per_level, dim=1).expand(3, 64, sum(POINTS), 2)
    expected = sample_grid(value, SHAPES, locations, weights, POINTS)
    got = sample_gather(value, SHAPES, locations, weights, POINTS)
    assert expected.abs().max() > 0
    torch.testing.assert_close(got, expected, atol=1e-6, rtol=0)


def test_whole_model_agrees_between_samplers():
    model = build_model(SIZES["n"].with_input_size(256, 320))
    fill_deterministic(model)
    model.eval()
    images = torch.rand(2, 3, 256, 320, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        grid_out = model(images)
        gather_out = model.set_sampler("gather")(images)
    for key in ("pred_logits", "pred_boxes"):
        torch.testing.assert_close(gather_out[key], grid_out[key], atol=1e-5, rtol=0)


@pytest.mark.filterwarnings("ignore::torch.jit.TracerWarning", "ignore::DeprecationWarning")
def test_gather_sampler_exports_without_gridsample(tmp_path):
    attention = MSDeformableAttention(
        embed_dim=32, num_heads=4, num_levels=3, num_points=POINTS, sampler="gather"
    ).eval()
    fill_deterministic(attention)
    length = sum(h * w for h, w in SHAPES)

    class Wrapper(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = attention

        def forward(self, query, reference, value):
            return self.attention(query, reference, value, SHAPES)

    generator = torch.Generator().manual_seed(2)
    query = torch.randn(2, 11, 32, generator=generator)
    reference = torch.rand(2, 11, 1, 4, generator=generator)
    value = torch.randn(2 * 4, 8, length, generator=generator)
    path = tmp_path / "attention.onnx"
    torch.onnx.export(
        Wrapper(),
        (query, reference, value),
        str(path),
        opset_version=17,
        dynamo=False,
        input_names=["query", "reference", "value"],
        output_names=["out"],
    )
    graph = onnx.load(str(path)).graph
    ops = {node.op_type for node in graph.node}
    assert "GridSample" not in ops
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (got,) = session.run(
        None, {"query": query.numpy(), "reference": reference.numpy(), "value": value.numpy()}
    )
    attention.sampler = "grid"
    with torch.no_grad():
        expected = attention(query, reference, value, SHAPES)
    torch.testing.assert_close(torch.from_numpy(got), expected, atol=1e-5, rtol=0)


def test_unknown_sampler_is_refused():
    with pytest.raises(ModelError, match="unknown sampler 'nearest'"):
        build_model(SIZES["n"], sampler="nearest")
