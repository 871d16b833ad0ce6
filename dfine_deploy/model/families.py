"""The detector families one spec can name: D-FINE (HGNetv2 + hybrid encoder) and EdgeCrafter's
ECDet (ECViT + its encoder), which share the decoder. Kept apart from both so that neither module
imports the other's builder."""

from __future__ import annotations

from dfine_deploy.model.dfine import DFINE, build_dfine
from dfine_deploy.model.ecdet import build_ecdet
from dfine_deploy.model.ecdet_spec import ECDetSpec
from dfine_deploy.model.spec import ModelSpec


def build_model(spec: ModelSpec, *, sampler: str = "grid") -> DFINE:
    """A freshly initialised model of the spec's family (official init); weights are loaded separately."""
    if isinstance(spec, ECDetSpec):
        return build_ecdet(spec, sampler=sampler)
    return build_dfine(spec, sampler=sampler)
