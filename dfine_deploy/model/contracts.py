"""How each model family wants its pixels, transcribed from its upstream's own inference code.

Every exported graph takes the same input (`GRAPH_INPUT`: RGB, pixels divided by 255, NCHW); a
family whose network wants more (ECDet: ImageNet mean/std) gets that step inside the graph, from
`InputContract.in_graph`, by `model/dfine.py`'s `DeployModel`. So the Detector, dfine-serve,
OpenVINO, TensorRT, DeepStream, Triton, Frigate and RKNN all feed `GRAPH_INPUT` and read it from here;
model.json declares both (`ArtifactInfo.input`). Torch-free, like `spec.py`: the runtime reads it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from dfine_deploy.errors import ModelError

NO_MEAN = (0.0, 0.0, 0.0)
NO_STD = (1.0, 1.0, 1.0)
# The size rule of every family here: the whole frame resized to the network size, aspect ratio not
# kept, bilinear with antialiasing (torchvision's Resize; `images.resize_as_trained`), boxes mapped
# back through `orig_target_sizes`.
STRETCH = "stretch"


@dataclass(frozen=True)
class PixelContract:
    """Pixels as a network takes them: `colour` order, then 0..255 values times `scale`, minus
    `mean`, divided by `std` (per channel, in `colour` order)."""

    colour: str
    scale: float
    mean: tuple[float, float, float] = NO_MEAN
    std: tuple[float, float, float] = NO_STD

    @property
    def normalises(self) -> bool:
        return self.mean != NO_MEAN or self.std != NO_STD

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


# What every exported graph takes, whatever the family: RGB in [0, 1].
GRAPH_INPUT = PixelContract(colour="RGB", scale=1.0 / 255.0)


@dataclass(frozen=True)
class InputContract:
    """One family's input contract and where its upstream states it (file at commit)."""

    family: str
    network: PixelContract  # what the network itself was trained and evaluated on
    resize: str
    sources: tuple[str, ...]

    @property
    def in_graph(self) -> PixelContract:
        """The step the exported graph adds after `GRAPH_INPUT`: the network's mean and std."""
        return PixelContract(
            colour=self.network.colour, scale=1.0, mean=self.network.mean, std=self.network.std
        )

    def to_dict(self) -> dict:
        """model.json's `input`: what the graph takes (`graph`), what the network takes (`network`,
        its mean/std applied inside the graph), the size rule and the upstream sources."""
        return {
            "family": self.family,
            "graph": GRAPH_INPUT.to_dict(),
            "network": self.network.to_dict(),
            "resize": self.resize,
            "sources": list(self.sources),
        }


# The only table of input contracts, keyed by `ModelSpec.family`. DEIM's D-FINE models are family
# "dfine" (the same network), so DEIM's code is a source of that row.
INPUT_CONTRACTS: dict[str, InputContract] = {
    "dfine": InputContract(
        family="dfine",
        network=PixelContract(colour="RGB", scale=1.0 / 255.0),
        resize=STRETCH,
        sources=(
            "github.com/Peterande/D-FINE@4a1f73a tools/inference/torch_inf.py: PIL convert('RGB'), "
            "T.Resize((640, 640)), T.ToTensor(); configs/dfine/include/dataloader.yml val: Resize "
            "[640, 640], ConvertPILImage scale: True, no Normalize",
            "github.com/ShihuaHuang95/DEIM@a9aa4ad tools/inference/torch_inf.py and "
            "configs/base/dataloader.yml: the same steps",
            "transformers 5.25.0 models/rt_detr/image_processing_rt_detr.py RTDetrImageProcessor (the "
            "processor D-FINE's hub folders name): resize 640x640 bilinear, do_rescale 1/255, "
            "do_normalize False",
        ),
    ),
    "ecdet": InputContract(
        family="ecdet",
        network=PixelContract(
            colour="RGB", scale=1.0 / 255.0, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)
        ),
        resize=STRETCH,
        sources=(
            "github.com/Intellindust-AI-Lab/EdgeCrafter@706d037 ecdetseg/tools/inference/torch_inf.py "
            "ECInferencer: PIL RGB, T.Resize(eval_spatial_size), T.ToTensor(), T.Normalize(mean="
            "[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225]); ecdetseg/configs/ecdet/ecdet.yml "
            "train and val: Resize [640, 640], ConvertPILImage scale: True, Normalize (the same)",
        ),
    ),
}


def input_contract(family: str) -> InputContract:
    """The family's contract; a family without one is refused, never given D-FINE's by default."""
    try:
        contract = INPUT_CONTRACTS[family]
    except KeyError:
        raise ModelError(
            f"model family {family!r} has no input contract (colour order, scale, mean/std, size rule); "
            f"known: {', '.join(sorted(INPUT_CONTRACTS))}. Add its row, from its upstream's inference "
            "code, to INPUT_CONTRACTS in dfine_deploy/model/contracts.py"
        ) from None
    network = contract.network
    if (network.colour, network.scale) != (GRAPH_INPUT.colour, GRAPH_INPUT.scale):
        raise ModelError(
            f"model family {family!r} wants {network.colour} pixels times {network.scale}; exported "
            f"graphs take {GRAPH_INPUT.colour} times {GRAPH_INPUT.scale} and add only a mean/std step"
        )
    return contract
