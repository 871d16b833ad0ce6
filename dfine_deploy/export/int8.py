"""INT8 post-training quantization: a QDQ ONNX graph calibrated on the user's images.

Two quantizers write standard QuantizeLinear/DequantizeLinear pairs. NNCF, OpenVINO's compression
library, places quantizers by graph pattern (Conv+BN+activation, MatMul+bias as one unit, no
quantizer between ops the CPU runtimes fuse) and applies bias correction, which keeps small models
like D-FINE-N close to FP32. onnxruntime's `quantize_static` quantizes only the inputs of Conv,
MatMul and Gemm, without bias correction. Which goes first depends on the CPU's ISA class
(`cpu_attempts`): on CPUs without AMX, OpenVINO has run NNCF's graph far from its FP32 run while
onnxruntime's graph held on both runtimes.

What stays FP32 is D-FINE's list of precision-critical islands, the one in `export/fp16.py` (box
decoding and the FDR integral, the sampling-coordinate chain of the deformable attention, query
selection, the postprocessor, and the normalisation and softmax operator types): their errors
accumulate layer after layer or move boxes by whole pixels. INT8 adds the first convolutions, which
see raw pixels (`INT8_RECIPES`). INT8 therefore covers the rest of the backbone, the encoder and the
decoder's projections and feed-forward layers, where nearly all the time goes.

Weights are quantized to 7 bits instead of 8 (NNCF's overflow fix, `OverflowFix.ENABLE`) when the
graph is made for CPUs without VNNI (`dfine_deploy/cpu.py`): there the u8 x s8 kernels add product
pairs in 16 bits, which full-range weights overflow. On an AVX2-only EPYC, random-weight D-FINE-N's
NNCF graph with 8-bit weights moved OpenVINO's scores by up to 0.076 against its own FP32 run, with
7-bit weights by 0.020 (onnxruntime's kernels: 0.003 and 0.007); 7 bits did not save the trained
model on OpenVINO, hence the quantizer order above (`NNCF_FIRST_CLASSES`). With VNNI (or AMX) the
products accumulate in 32 bits and NNCF's default (7 bits only for the first convolutions) keeps
the most precision. The sidecar records which was used and on which ISA class the gate ran
(`runtime.Detector` serves a graph gated on another class only once dfine-verify passed it there).

For TensorRT (`for_tensorrt=True`) the graph is the target's gather-sampler graph and the quantizer
is onnxruntime's with signed INT8 activations and weights, both symmetric (zero point 0): TensorRT's
explicit quantization handles only symmetric signed INT8
(https://docs.nvidia.com/deeplearning/tensorrt/latest/inference-library/work-quantized-types.html),
while the CPU recipe above quantizes non-negative activations to UINT8 with a zero point.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from dfine_deploy import cpu
from dfine_deploy.errors import ExportError, MissingDependency
from dfine_deploy.export.fp16 import FP32_SCOPES, Fp16Recipe, island_nodes

if TYPE_CHECKING:
    from onnx import ModelProto

log = logging.getLogger(__name__)

QUANTIZERS = ("nncf", "onnxruntime")
# What INT8 keeps FP32 besides the FP16 islands, fastest first; `dfine-export --int8` takes the first
# recipe whose graph passes the INT8 gate. Measured on D-FINE-N (OpenVINO, 640 px, 2 cores, docs/export.md):
# - "stem1-fp32": only the stem's first convolution (3 input channels, raw pixels) FP32: 0.56x the
#   FP32 graph's time; on two quickstart models 0.65 and 0.73 AP below FP32.
# - "stem-fp32": the whole stem FP32: 0.64x (its 320x320 FP32 convolutions, pad and concat cost a
#   quarter of the INT8 time); 0.19 and 0.74 AP below FP32. NNCF's accuracy-control search had ranked
#   the three stem convolutions the most sensitive of 140 quantized ops.
INT8_RECIPES = {
    "stem1-fp32": {**FP32_SCOPES, "input_conv": r"/backbone/stem/stem1/"},
    "stem-fp32": {**FP32_SCOPES, "input_stem": r"/backbone/stem/"},
}


# The CPU classes (`dfine_deploy/cpu.py`) where NNCF's graph was measured to hold on OpenVINO, so it
# goes first there (`cpu_attempts`); everywhere else onnxruntime's quantizer does.
NNCF_FIRST_CLASSES = frozenset({"amx"})


def cpu_attempts(isa: str) -> list[tuple[str, str]]:
    """The (recipe, quantizer) pairs `dfine-export --int8` tries for the CPU graph, in order; the first
    whose graph passes the INT8 gate on every CPU backend is kept.

    Why the order follows the ISA class. OpenVINO has run NNCF's ONNX Q/DQ graph far from its FP32
    run on every class measured but AMX (D-FINE-N, 256 px, 80 validation images, docs/export.md):
    - `avx2` EPYC, the trained quickstart model, FP32 AP 41.52: NNCF's graph 20.58 on OpenVINO and
      41.41 on onnxruntime; onnxruntime's quantizer's graph (Conv/MatMul/Gemm inputs only, UINT8
      activations with zero points) 41.50 and 41.52.
    - `avx512-vnni` EPYC (VNNI, so not the 16-bit saturation), two trained models: NNCF's graphs
      26.43 and 31.03 from 56.15, 18.62 and 19.15 from 33.68 on OpenVINO while passing on
      onnxruntime; onnxruntime's quantizer's graph 55.89 and 33.13 on OpenVINO.
    - `amx` Xeon, the quickstart model: NNCF's graph held on both (37.71 -> 37.43 onnxruntime, 37.12
      OpenVINO), and its bias correction keeps more accuracy, so there it goes first.
    A class not measured gets the order that held everywhere measured: onnxruntime's quantizer first."""
    nncf_first = [(recipe, "nncf") for recipe in INT8_RECIPES]
    ort = [("stem-fp32", "onnxruntime")]
    if available_quantizer() != "nncf":
        return ort
    return nncf_first + ort if isa in NNCF_FIRST_CLASSES else ort + nncf_first


# onnxruntime quantize_static options for TensorRT: zero points 0, and biases left FP32 (TensorRT's
# DequantizeLinear takes INT8 inputs, not the INT32 biases onnxruntime makes by default)
_TENSORRT_OPTIONS = {"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False}


@dataclass
class Int8Result:
    model: Any  # onnx.ModelProto with QuantizeLinear/DequantizeLinear nodes
    quantizer: str  # "nncf <version>" or "onnxruntime <version>"
    recipe: str  # a key of INT8_RECIPES
    fp32_nodes: dict[str, int]  # reason -> node count (the islands)
    quantized_ops: dict[str, int]  # op type -> count of ops that got INT8 inputs
    calibration_images: int
    weight_bits: int  # 7 with the overflow fix (every INT8 weight), else 8
    isa: str  # the ISA class of the CPU that quantized and gated it (dfine_deploy/cpu.py)

    def summary(self) -> dict[str, Any]:
        return {
            "quantizer": self.quantizer,
            "recipe": self.recipe,
            "weight_bits": self.weight_bits,
            "isa": self.isa,
            "fp32_islands": self.fp32_nodes,
            "quantized_ops": self.quantized_ops,
            "calibration_images": self.calibration_images,
        }


def available_quantizer() -> str:
    """'nncf' when installed, else 'onnxruntime' (always there: the runtime depends on it)."""
    try:
        import nncf  # noqa: F401
    except ImportError:
        log.info("NNCF is not installed (pip install -e '.[cpu]'): quantizing with onnxruntime")
        return "onnxruntime"
    return "nncf"


def quantize(
    model: ModelProto,
    calibration: Sequence[dict[str, np.ndarray]],
    *,
    quantizer: str | None = None,
    for_tensorrt: bool = False,
    recipe: str = "stem-fp32",
    weight_bits: int | None = None,
) -> Int8Result:
    """Quantize an FP32 D-FINE graph to INT8 QDQ, keeping the FP32 islands of `recipe`
    (`INT8_RECIPES`), calibrated on `calibration`.

    `for_tensorrt`: signed symmetric INT8 everywhere (onnxruntime's quantizer), what TensorRT imports.
    `weight_bits`: 7 (the overflow fix, safe on every CPU) or 8; default 7 where INT8 kernels can
    saturate (x86 without VNNI, `cpu.int8_saturates`), else 8.
    TensorRT graphs keep 8 (GPU INT8 units accumulate in 32 bits).
    """
    if not calibration:
        raise ExportError("--int8 needs calibration images: pass --data DIR with images of your domain")
    if for_tensorrt:
        if quantizer not in (None, "onnxruntime"):
            raise ExportError(
                f"INT8 quantizer {quantizer!r} for TensorRT: only 'onnxruntime' is set up for the "
                "symmetric signed INT8 TensorRT imports"
            )
        quantizer = "onnxruntime"
    quantizer = quantizer or available_quantizer()
    if quantizer not in QUANTIZERS:
        raise ExportError(f"INT8 quantizer {quantizer!r} is unknown; expected one of {list(QUANTIZERS)}")
    if recipe not in INT8_RECIPES:
        raise ExportError(f"INT8 recipe {recipe!r} is unknown; expected one of {list(INT8_RECIPES)}")
    isa = cpu.isa_class()
    if weight_bits is None:
        weight_bits = 7 if not for_tensorrt and cpu.int8_saturates(isa) else 8
    if weight_bits not in (7, 8):
        raise ExportError(f"INT8 weight_bits {weight_bits!r}: expected 7 (the overflow fix) or 8")
    keep = island_nodes(model, Fp16Recipe(scopes=dict(INT8_RECIPES[recipe])))
    if quantizer == "nncf":
        quantized, version = _quantize_nncf(model, calibration, sorted(keep), weight_bits)
    else:
        quantized, version = _quantize_onnxruntime(
            model, calibration, sorted(keep), symmetric=for_tensorrt, weight_bits=weight_bits
        )
    counts: dict[str, int] = {}
    for reason in keep.values():
        counts[reason] = counts.get(reason, 0) + 1
    ops = _quantized_ops(quantized)
    return Int8Result(quantized, version, recipe, counts, ops, len(calibration), weight_bits, isa)


def _quantize_nncf(
    model: ModelProto, calibration: Sequence[dict[str, np.ndarray]], keep: list[str], weight_bits: int
):
    # NNCF imports torch's extension builder, whose logger warns on machines without CUDA
    logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
    try:
        import nncf
    except ImportError as exc:
        raise MissingDependency("nncf", "cpu", "INT8 quantization with NNCF") from exc
    from nncf.quantization.advanced_parameters import AdvancedQuantizationParameters, OverflowFix

    logging.getLogger("nncf").setLevel(logging.WARNING)  # one INFO line per skipped node otherwise
    overflow_fix = OverflowFix.ENABLE if weight_bits == 7 else OverflowFix.FIRST_LAYER
    quantized = nncf.quantize(
        model,
        nncf.Dataset(list(calibration)),
        subset_size=len(calibration),
        ignored_scope=nncf.IgnoredScope(names=keep, validate=False),
        advanced_parameters=AdvancedQuantizationParameters(overflow_fix=overflow_fix),
    )
    return quantized, f"nncf {nncf.__version__}"


def _quantize_onnxruntime(
    model: ModelProto,
    calibration: Sequence[dict[str, np.ndarray]],
    keep: list[str],
    *,
    symmetric: bool,
    weight_bits: int,
):
    import onnx
    import onnxruntime
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.feeds = iter(calibration)

        def get_next(self):
            return next(self.feeds, None)

    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        src, dst = Path(tmp) / "fp32.onnx", Path(tmp) / "int8.onnx"
        onnx.save_model(model, str(src))
        quantize_static(
            str(src),
            str(dst),
            Reader(),
            quant_format=QuantFormat.QDQ,
            per_channel=True,
            activation_type=QuantType.QInt8 if symmetric else QuantType.QUInt8,
            weight_type=QuantType.QInt8,
            nodes_to_exclude=keep,
            op_types_to_quantize=["Conv", "MatMul", "Gemm"],
            # onnxruntime's own overflow fix: 7-bit weights (its "reduce_range")
            reduce_range=weight_bits == 7,
            extra_options=_TENSORRT_OPTIONS if symmetric else {},
        )
        return onnx.load(str(dst)), f"onnxruntime {onnxruntime.__version__}"


def _quantized_ops(model: ModelProto) -> dict[str, int]:
    """Op types fed by a DequantizeLinear output: the ops that compute on INT8 data."""
    dequantized = {out for n in model.graph.node if n.op_type == "DequantizeLinear" for out in n.output}
    counts: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type not in ("QuantizeLinear", "DequantizeLinear") and dequantized & set(node.input):
            counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return dict(sorted(counts.items()))
