"""The D-FINE detector: HGNetv2 backbone -> HybridEncoder -> DFINETransformer, built from a ModelSpec."""

from __future__ import annotations

import torch
from torch import nn

from dfine_deploy.errors import ModelError
from dfine_deploy.model.contracts import PixelContract, input_contract
from dfine_deploy.model.decoder import DFINETransformer, Prediction, TrainingOutput
from dfine_deploy.model.deformable import check_sampler
from dfine_deploy.model.encoder import HybridEncoder
from dfine_deploy.model.hgnetv2 import HGNetv2
from dfine_deploy.model.postprocess import PostProcessor
from dfine_deploy.model.spec import ModelSpec

INPUT_MULTIPLE = 32


class DFINE(nn.Module):
    """`forward(images [B,3,H,W] RGB in [0,1], targets=None)` -> the official output dict."""

    def __init__(
        self,
        backbone: HGNetv2,
        encoder: HybridEncoder,
        decoder: DFINETransformer,
        spec: ModelSpec | None = None,
    ):
        super().__init__()
        # Registration order fixes the state_dict order: backbone, decoder, encoder (as official).
        self.backbone = backbone
        self.decoder = decoder
        self.encoder = encoder
        self.spec = spec

    def forward(
        self, images: torch.Tensor, targets: list[dict[str, torch.Tensor]] | None = None
    ) -> Prediction | TrainingOutput:
        height, width = images.shape[-2:]
        if height % INPUT_MULTIPLE or width % INPUT_MULTIPLE:
            raise ModelError(
                f"input size {int(height)}x{int(width)} (HxW) is not a multiple of {INPUT_MULTIPLE}: "
                f"resize or pad the images, e.g. to {_round_up(height)}x{_round_up(width)}"
            )
        return self.decoder(self.encoder(self.backbone(images)), targets)

    def deploy(self) -> DFINE:
        """Inference form, in place: eval mode, fused RepVGG/conv-BN, unused heads cut."""
        self.eval()
        for module in list(self.modules()):
            if module is not self and hasattr(module, "convert_to_deploy"):
                module.convert_to_deploy()
        return self

    def set_sampler(self, sampler: str) -> DFINE:
        """Switch every deformable attention between 'grid' (grid_sample) and 'gather'."""
        self.decoder.set_sampler(sampler)
        return self


def _round_up(size: int) -> int:
    return -(-int(size) // INPUT_MULTIPLE) * INPUT_MULTIPLE


def _check_spec(spec: ModelSpec) -> None:
    height, width = spec.eval_spatial_size
    if height % INPUT_MULTIPLE or width % INPUT_MULTIPLE or height <= 0 or width <= 0:
        raise ModelError(
            f"eval_spatial_size {list(spec.eval_spatial_size)} (H, W): each side must be a positive "
            f"multiple of {INPUT_MULTIPLE}, e.g. [{_round_up(height)}, {_round_up(width)}]"
        )


def build_dfine(spec: ModelSpec, *, sampler: str = "grid") -> DFINE:
    """A freshly initialised D-FINE (official init) for `spec`; weights are loaded separately.
    `dfine_deploy.model.families.build_model` picks this or ECDet's builder by the spec."""
    _check_spec(spec)
    check_sampler(sampler)
    b, e, d = spec.backbone, spec.encoder, spec.decoder
    backbone = HGNetv2.from_spec(b)
    if list(e.in_channels) != backbone.out_channels or list(e.feat_strides) != backbone.out_strides:
        raise ModelError(
            f"encoder in_channels {list(e.in_channels)} / feat_strides {list(e.feat_strides)} do not match "
            f"HGNetv2 {b.name} return_idx {list(b.return_idx)}, which gives channels "
            f"{backbone.out_channels} at strides {backbone.out_strides}"
        )
    encoder = HybridEncoder.from_spec(e, eval_spatial_size=spec.eval_spatial_size)
    if list(d.feat_channels[: len(e.in_channels)]) != [e.hidden_dim] * min(
        len(d.feat_channels), len(e.in_channels)
    ):
        raise ModelError(
            f"decoder feat_channels {list(d.feat_channels)} must equal the encoder hidden_dim {e.hidden_dim} "
            "for every encoder output"
        )
    decoder = DFINETransformer.from_spec(
        d, num_classes=spec.num_classes, eval_spatial_size=spec.eval_spatial_size, sampler=sampler
    )
    return DFINE(backbone, encoder, decoder, spec)


class PixelNormalise(nn.Module):
    """The family's step after the graph input (`contracts.GRAPH_INPUT`, RGB in [0, 1]): minus its
    mean, divided by its std, as its upstream normalises; no node at all for a family without one."""

    def __init__(self, step: PixelContract):
        super().__init__()
        self.active = step.normalises
        self.register_buffer("mean", torch.tensor(step.mean).reshape(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(step.std).reshape(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.mean) / self.std if self.active else images


def graph_input_step(model: DFINE) -> PixelNormalise:
    """The in-graph step of `model`'s family (`model/contracts.py`); a family without a contract,
    or a model that names none, is refused."""
    spec = getattr(model, "spec", None)
    if spec is None:
        raise ModelError("the model names no family (no spec), so its input contract is unknown")
    return PixelNormalise(input_contract(spec.family).in_graph)


class DeployModel(nn.Module):
    """images [N,3,H,W] RGB in [0,1] + orig_target_sizes [N,2] (w,h) -> (labels, boxes xyxy px, scores):
    the export graph, with the family's own normalisation inside (`graph_input_step`).

    Converts `model` and `postprocessor` to their deploy forms in place (fused, heads cut).
    """

    def __init__(self, model: DFINE, postprocessor: PostProcessor):
        super().__init__()
        self.normalise = graph_input_step(model)
        self.model = model.deploy()
        self.postprocessor = postprocessor.deploy()

    def forward(self, images: torch.Tensor, orig_target_sizes: torch.Tensor):
        return self.postprocessor(self.model(self.normalise(images)), orig_target_sizes)

    def for_eager(self, device: torch.device) -> DeployModel:
        """On `device` for eager inference (`to_device`). D-FINE-N at 640 ran in 0.68-0.81x the NCHW
        time, every detection of the trained quickstart model the same (IoU >= 0.99, boxes within
        1e-4 px). Exports keep NCHW weights (not called there)."""
        return to_device(self, device)


def to_device(module: nn.Module, device: torch.device) -> nn.Module:
    """`module` on `device`; on the CPU with channels-last (NHWC) convolution weights, oneDNN's fastest
    layout: convolutions, and in training their backward, then run and hand on NHWC activations.
    The values are unchanged, so checkpoints load either way."""
    module.to(device)
    if device.type == "cpu":
        module.to(memory_format=torch.channels_last)
    return module
