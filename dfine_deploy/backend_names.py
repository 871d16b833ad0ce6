"""The names of the inference backends and of the precisions, as constants every stage spells once.

They are `str` enums, so a member compares equal to its text ("tensorrt"), keys the sidecar's JSON
as that text and prints as that text on every Python version. What each backend opens and needs is
the table in `dfine_deploy/runtime/backends.py`; this module stays on the ground floor (no imports)
so `artifact.py` and the export side read the same names.
"""

from __future__ import annotations

from enum import Enum


class _Name(str, Enum):
    """A `str` whose `str()` and f-string form are its value on every Python (3.12 changed the
    default of mixed-in enums to 'Class.MEMBER')."""

    __str__ = str.__str__
    __format__ = str.__format__
    __repr__ = str.__repr__  # argparse lists choices by repr: "choose from 'auto', 'fp32', ..."


class BackendName(_Name):
    """What `--backend` and `Detector.open(backend=...)` name (onnxruntime may add ':provider')."""

    AUTO = "auto"
    TORCH = "torch"
    ONNXRUNTIME = "onnxruntime"
    OPENVINO = "openvino"
    TENSORRT = "tensorrt"
    RKNN = "rknn"
    REPLAY = "replay"


class Precision(_Name):
    """What `--precision` names: a graph of an artifact folder, or how OpenVINO runs one (bf16)."""

    AUTO = "auto"
    FP32 = "fp32"
    FP16 = "fp16"
    INT8 = "int8"
    BF16 = "bf16"


# the precisions an artifact's graphs are written in (`model.json` graphs[].precision); BF16 is a
# way OpenVINO runs the FP32 graph, not a graph of its own
GRAPH_PRECISIONS = (Precision.FP32, Precision.FP16, Precision.INT8)
