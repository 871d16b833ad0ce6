"""PyTorch -> ONNX: one graph, official tensor names, dynamic batch, simplified, checked.

The legacy TorchScript exporter (`dynamo=False`) is used on purpose: it writes one self-contained
file at the opset we ask for, while the dynamo exporter of torch >= 2.9 moves to opset 18 and may
split weights into an external `.data` file that most deployment tools do not expect.
"""

from __future__ import annotations

import io
import warnings
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dfine_deploy.artifact import INPUT_NAMES, OUTPUT_NAMES
from dfine_deploy.cores import usable_cores
from dfine_deploy.errors import ExportError, ModelError
from dfine_deploy.files import no_file

if TYPE_CHECKING:
    from onnx import ModelProto, ValueInfoProto
    from onnxruntime import InferenceSession

MIN_OPSET = 17
DEFAULT_OPSET = 17  # the first opset with a native LayerNormalization (TensorRT >= 8.6 imports it)
RAW_OUTPUT_NAMES = ("pred_logits", "pred_boxes")  # --no-postprocess graphs

# ONNX element types of the graph interface (TensorProto enum values).
_FLOAT, _INT32, _INT64, _FLOAT16 = 1, 6, 7, 10
_INTERFACE_DTYPES = {
    "images": _FLOAT,
    "orig_target_sizes": _INT64,
    "labels": _INT64,
    "boxes": _FLOAT,
    "scores": _FLOAT,
    "pred_logits": _FLOAT,
    "pred_boxes": _FLOAT,
}
_DTYPE_NAMES = {_FLOAT: "float32", _INT32: "int32", _INT64: "int64", _FLOAT16: "float16"}
_DTYPE_CODES = {name: code for code, name in _DTYPE_NAMES.items()}


def max_opset() -> int:
    """The highest opset the installed torch's TorchScript exporter writes (the one we export with,
    `dynamo=False`): 20 in torch 2.x; torch says it in a private constant, read where it is."""
    from torch.onnx import _constants

    return int(getattr(_constants, "ONNX_TORCHSCRIPT_EXPORTER_MAX_OPSET", 20))


def check_opset(opset: int, minimum: int = MIN_OPSET) -> None:
    """`minimum` is 16 only for a target whose decomposed LayerNorm is held in FP32 (TensorRT 8.x)."""
    highest = max_opset()
    if opset > highest:  # torch's own refusal came minutes later, as a RuntimeError traceback
        raise ExportError(
            f"--opset {opset}: the installed torch exports ONNX up to opset {highest}; "
            f"use --opset {DEFAULT_OPSET} (the default) to {highest}"
        )
    if opset < minimum:
        raise ExportError(
            f"--opset {opset}: D-FINE needs opset >= {MIN_OPSET}. Below 17 LayerNorm is decomposed into "
            "ReduceMean/Pow/Sqrt, which overflows in FP16 and gives engines with zero or garbage "
            "detections (D-FINE#44/#98, DeepStream-Yolo PR #647); opset 17 keeps a native "
            "LayerNormalization. Use --opset 17 (or 18/19), or --target trt8.5 / trt8.6 for TensorRT "
            "8.x, whose graph keeps the decomposed LayerNorm in FP32."
        )


def check_input_size(height: int, width: int) -> None:
    if height <= 0 or width <= 0 or height % 32 or width % 32:
        fix_h, fix_w = max(32, round(height / 32) * 32), max(32, round(width / 32) * 32)
        raise ModelError(
            f"--imgsz {height} {width}: D-FINE's strides need both sides to be positive multiples "
            f"of 32; use --imgsz {fix_h} {fix_w}"
        )


def export_onnx(
    module: Any,
    path: str | Path,
    *,
    height: int,
    width: int,
    opset: int = DEFAULT_OPSET,
    postprocess: bool = True,
    trace_batch: int = 2,
    io_dtypes: dict[str, str] | None = None,
    min_opset: int = MIN_OPSET,
) -> None:
    """Trace `module` (DeployModel, or the bare network when `postprocess` is False) into `path`.

    Traced at batch `trace_batch` (> 1, so no size-1 batch gets folded into a constant) with both
    inputs' batch dimension named dynamic. Then simplified with onnxslim and checked. `io_dtypes`
    retypes integer inputs/outputs at the graph boundary (INT32 for TensorRT 8.x targets).
    """
    import torch

    check_opset(opset, min_opset)
    check_input_size(height, width)
    images = torch.rand(trace_batch, 3, height, width)
    sizes = torch.tensor([[width, height]] * trace_batch, dtype=torch.int64)
    if postprocess:
        args, input_names, output_names = (images, sizes), list(INPUT_NAMES), list(OUTPUT_NAMES)
    else:
        args, input_names, output_names = (images,), ["images"], list(RAW_OUTPUT_NAMES)
    dynamic_axes = {name: {0: "N"} for name in input_names + output_names}
    buffer = io.BytesIO()
    module.eval()
    with torch.no_grad(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export.*")
        torch.onnx.export(
            module,
            args,
            buffer,
            input_names=input_names,
            output_names=output_names,
            dynamic_axes=dynamic_axes,
            opset_version=opset,
            do_constant_folding=True,
            dynamo=False,
        )
    model = simplify(load_bytes(buffer.getvalue()))
    write_checked(model, path, postprocess=postprocess, io_dtypes=io_dtypes)


def write_checked(
    model: ModelProto, path: str | Path, *, postprocess: bool = True, io_dtypes: dict[str, str] | None = None
) -> list[str]:
    """What follows the trace: retype the interface to `io_dtypes` if given, check the graph and its
    interface, save it to `path`. Returns the retyped names (none without `io_dtypes`)."""
    retyped = retype_interface(model, io_dtypes) if io_dtypes else []
    check_model(model, source=str(path))
    verify_interface(model, source=str(path), postprocess=postprocess, dtypes=io_dtypes)
    save(model, path)
    return retyped


def retype_interface(model: ModelProto, io_dtypes: dict[str, str]) -> list[str]:
    """Give integer graph inputs/outputs the dtypes in `io_dtypes`, with one Cast at the boundary.

    The graph inside keeps its own types: an input gets a Cast to what its consumers expect, an
    output a Cast from what its producer makes. Returns the names that were retyped.
    """
    import onnx

    changed = []
    for value in model.graph.input:
        want = _DTYPE_CODES.get(io_dtypes.get(value.name, ""))
        have = value.type.tensor_type.elem_type
        if want is None or want == have:
            continue
        inner = f"{value.name}__{_DTYPE_NAMES[have]}"
        for node in model.graph.node:
            node.input[:] = [inner if name == value.name else name for name in node.input]
        name = f"/interface/{value.name}/Cast"
        model.graph.node.insert(0, onnx.helper.make_node("Cast", [value.name], [inner], name=name, to=have))
        value.type.tensor_type.elem_type = want
        changed.append(value.name)
    for value in model.graph.output:
        want = _DTYPE_CODES.get(io_dtypes.get(value.name, ""))
        have = value.type.tensor_type.elem_type
        if want is None or want == have:
            continue
        inner = f"{value.name}__{_DTYPE_NAMES[have]}"
        for node in model.graph.node:
            node.output[:] = [inner if name == value.name else name for name in node.output]
            node.input[:] = [inner if name == value.name else name for name in node.input]
        name = f"/interface/{value.name}/Cast"
        model.graph.node.append(onnx.helper.make_node("Cast", [inner], [value.name], name=name, to=want))
        value.type.tensor_type.elem_type = want
        changed.append(value.name)
    stale = [v for v in model.graph.value_info if v.name in changed]  # the old type, now the inner name's
    for v in stale:
        model.graph.value_info.remove(v)
    return changed


def load_bytes(data: bytes):
    import onnx

    return onnx.load_from_string(data)


def simplify(model: ModelProto):
    """Fold constants and remove redundant nodes (onnxslim); keeps the dynamic batch dims."""
    import onnxslim

    return onnxslim.slim(model)


def check_model(model: ModelProto, *, source: str) -> None:
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # onnx raises several unrelated types
        raise ExportError(f"{source}: onnx.checker rejects the exported graph: {exc}") from exc


def save(model: ModelProto, path: str | Path) -> None:
    """One self-contained file (weights inline): every D-FINE size is far below protobuf's 2 GB."""
    import onnx

    onnx.save_model(model, str(path), save_as_external_data=False)


def load(path: str | Path):
    import onnx

    path = Path(path)
    if not path.is_file():
        raise ExportError(f"{path}: {no_file(path)} (an ONNX graph was expected)")
    try:
        return onnx.load(str(path))
    except Exception as exc:
        raise ExportError(f"{path}: not a readable ONNX model ({exc})") from exc


def _value_infos(values: Iterable[ValueInfoProto]) -> dict[str, tuple[int, list]]:
    out = {}
    for v in values:
        t = v.type.tensor_type
        dims = [d.dim_param or d.dim_value for d in t.shape.dim]
        out[v.name] = (t.elem_type, dims)
    return out


def verify_interface(
    model: ModelProto, *, source: str, postprocess: bool = True, dtypes: dict[str, str] | None = None
) -> dict[str, Any]:
    """Raise ExportError unless the graph has exactly our inputs/outputs, dtypes and a dynamic batch.

    `dtypes` overrides the expected dtype of some names (a target profile's INT32 interface).
    Returns {name: (dtype name, dims)} of the interface.
    """
    expected = {**_INTERFACE_DTYPES, **{n: _DTYPE_CODES[d] for n, d in (dtypes or {}).items()}}
    inputs = _value_infos(
        i for i in model.graph.input if i.name not in {x.name for x in model.graph.initializer}
    )
    outputs = _value_infos(model.graph.output)
    want_in = list(INPUT_NAMES) if postprocess else ["images"]
    want_out = list(OUTPUT_NAMES) if postprocess else list(RAW_OUTPUT_NAMES)
    problems = []
    for kind, want, have in (("input", want_in, inputs), ("output", want_out, outputs)):
        missing = [n for n in want if n not in have]
        extra = [n for n in have if n not in want]
        if missing:
            problems.append(f"missing {kind}s {missing}")
        if extra:
            problems.append(f"unexpected {kind}s {extra}")
        for name in want:
            if name in have:
                dtype, dims = have[name]
                if dtype != expected[name]:
                    problems.append(
                        f"{kind} '{name}' is {_DTYPE_NAMES.get(dtype, dtype)}, expected "
                        f"{_DTYPE_NAMES[expected[name]]}"
                    )
                if dims and not isinstance(dims[0], str):
                    problems.append(f"{kind} '{name}' has a fixed batch dimension {dims[0]}")
    if problems:
        raise ExportError(
            f"{source}: not a D-FINE detection graph: " + "; ".join(problems) + ". Expected inputs "
            f"{want_in} and outputs {want_out} (the official names); export it with dfine-export."
        )
    return {n: (_DTYPE_NAMES.get(d, str(d)), dims) for n, (d, dims) in {**inputs, **outputs}.items()}


def op_counts(model: ModelProto) -> Counter:
    return Counter(node.op_type for node in model.graph.node)


def opset_of(model: ModelProto) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def ort_session(path: str | Path, threads: int | None = None):
    """A CPU onnxruntime session; graph optimisations on, as deployed. `threads`: default the cores
    this process may use (`dfine_deploy.cores.usable_cores`)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads or usable_cores()
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:
        raise ExportError(f"{path}: onnxruntime cannot load the graph ({exc})") from exc


def ort_runner(session: InferenceSession, *, postprocess: bool = True, num_top_queries: int = 300):
    """Wrap a session as a parity Runner returning (labels, boxes, scores)."""
    from dfine_deploy.boxes import postprocess_numpy

    sizes_dtype = next(
        (
            np.int32
            for i in session.get_inputs()
            if i.name == "orig_target_sizes" and i.type == "tensor(int32)"
        ),
        np.int64,
    )

    def run(images: np.ndarray, orig_sizes: np.ndarray):
        if postprocess:
            feeds = {"images": images, "orig_target_sizes": orig_sizes.astype(sizes_dtype, copy=False)}
            labels, boxes, scores = session.run(list(OUTPUT_NAMES), feeds)
            return labels, boxes, scores
        logits, boxes = session.run(list(RAW_OUTPUT_NAMES), {"images": images})
        return postprocess_numpy(logits, boxes, orig_sizes, num_top_queries)

    return run
