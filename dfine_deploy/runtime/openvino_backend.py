"""OpenVINO backend: Intel's CPU runtime, compiled from the artifact's ONNX graph.

OpenVINO reads the ONNX file directly (no separate IR is needed) and compiles it for the CPU. The
compiled blob is kept in a cache folder beside the graph (`ov_cache/`, or `cache_dir`), so the
second open of the same graph skips compilation. A graph with a dynamic batch is compiled with static
shapes for a fixed set of batch sizes, the powers of two below its largest batch and that batch
(`batch_sizes`); a batch of another size runs as chunks of those sizes (`split_batch`), so any mix of
batch sizes (a server whose live stream count changes) compiles each size once and never again.
A graph with a fixed batch runs smaller batches padded to it, the padded rows' results dropped.
Precision is pinned to FP32
(`INFERENCE_PRECISION_HINT=f32`): on CPUs with BF16 or AMX units OpenVINO would otherwise run FP32
graphs in BF16, which moves boxes and is not what the FP32 parity gate checked. An INT8 (QDQ) graph
keeps its INT8 convolutions and matrix multiplies under the same hint.

`precision="bf16"` asks for BF16 explicitly (the CPU's counterpart of FP16 on GPUs): the FP32 graph
runs with the bf16 hint, which OpenVINO honours only on CPUs that list "BF16" in their
OPTIMIZATION_CAPABILITIES (AVX512_BF16 or AMX units); elsewhere it would silently stay FP32, so
asking for it there is refused. Whether a model's detections survive BF16 is the export's
"bf16:openvino" gate (`dfine_deploy.artifact.BF16_GATE_KEY`), checked by `Detector`.

With `raw_pixels_input` (the D-FINE adapter's "images"), that input takes the resized uint8 BGR
frames as they are: OpenVINO's PrePostProcessor compiles the conversion to float RGB in [0, 1] into
the graph, where it runs fused with the first convolution instead of as a numpy pass per frame.
"""

from __future__ import annotations

import importlib
import logging
import os
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from dfine_deploy import cpu
from dfine_deploy.backend_names import BackendName, Precision
from dfine_deploy.compat import zip_strict
from dfine_deploy.errors import BackendError, MissingDependency
from dfine_deploy.files import no_file
from dfine_deploy.model.contracts import GRAPH_INPUT
from dfine_deploy.runtime.backend import Backend
from dfine_deploy.runtime.backends import BY_NAME

log = logging.getLogger(__name__)

CACHE_FOLDER = "ov_cache"
# our precision -> OpenVINO's INFERENCE_PRECISION_HINT
PRECISION_HINTS = {Precision.FP32: "f32", Precision.BF16: "bf16"}


def openvino_reason(exc: Exception) -> str:
    """OpenVINO's message in one line, without its 'Exception from src/...cpp:N:' location lines."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return " ".join(line for line in lines if not line.startswith("Exception from")) or " ".join(lines)


def import_openvino() -> ModuleType:
    row = BY_NAME[BackendName.OPENVINO]
    try:
        return importlib.import_module(row.requires)
    except ImportError as exc:
        raise MissingDependency(row.requires, row.extra, "the OpenVINO backend") from exc


@lru_cache(maxsize=1)
def shared_core() -> Any:
    """The process's one OpenVINO Core, kept until the interpreter exits.

    One, not one per graph: the CPU plugin of each Core swaps the compiling thread's alternate signal
    stack for its own and puts back the one it found when that Core is released. Cores released in
    any order but the reverse of their creation leave the thread on a freed stack, and the next signal
    with a handler (Python's SIGCHLD or SIGINT ones use that stack) kills the process with SIGSEGV
    before any handler, faulthandler included, can run (docs/development.md has the reproduction)."""
    return import_openvino().Core()


def cpu_capabilities() -> tuple[str, ...]:
    """OpenVINO's OPTIMIZATION_CAPABILITIES of this CPU, e.g. ("BF16", "FP32", "INT8", ...)."""
    core = shared_core()
    return tuple(str(c) for c in core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))


def bf16_unsupported_reason() -> str | None:
    """Why this CPU cannot run BF16 in OpenVINO, or None when it can."""
    capabilities = cpu_capabilities()
    if "BF16" in capabilities:
        return None
    return (
        f"this CPU has no BF16 units (OpenVINO's CPU OPTIMIZATION_CAPABILITIES are {list(capabilities)}, "
        "without BF16; BF16 needs AVX512_BF16 or AMX)"
    )


def batch_sizes(max_batch: int) -> tuple[int, ...]:
    """The batch sizes a dynamic-batch graph is compiled for: 1, 2, 4, ... below `max_batch`, and
    `max_batch` itself (8 -> 1, 2, 4, 8; 6 -> 1, 2, 4, 6): log2 of the largest batch compiled graphs,
    each holding its own buffers, instead of one per batch size met."""
    sizes = [1 << k for k in range(max_batch.bit_length()) if (1 << k) < max_batch]
    return (*sizes, max_batch)


def split_batch(count: int, sizes: tuple[int, ...]) -> list[int]:
    """`count` images as chunks of compiled `sizes`, largest first (7 of 1, 2, 4, 8 -> 4, 2, 1).

    Chunks, not padding to the next size: on a CPU an image costs about the same in a batch of 4 as
    alone, so the padded rows of 5 -> 8 would spend 60 % more CPU on images nobody sees."""
    chunks = []
    while count:
        chunk = max(size for size in sizes if size <= count)
        chunks.append(chunk)
        count -= chunk
    return chunks


class OpenVinoBackend(Backend):
    name = "openvino"

    def __init__(
        self,
        path: str | os.PathLike,
        *,
        device: str = "auto",
        threads: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        use_cache: bool = True,
        default_max_batch: int = 32,
        max_batch_source: str = "",
        precision: str = Precision.FP32,
        raw_pixels_input: str | None = None,
    ):
        ov = import_openvino()
        path = Path(path)
        if not path.is_file():
            raise BackendError(f"{path}: {no_file(path)} (a graph was expected)")
        if device not in ("auto", "cpu"):
            raise BackendError(f"device={device!r}: the OpenVINO backend runs on the CPU; use device='cpu'")
        if precision not in PRECISION_HINTS:
            raise BackendError(f"precision={precision!r}: the OpenVINO backend runs {list(PRECISION_HINTS)}")
        if precision == Precision.BF16 and (reason := bf16_unsupported_reason()):
            raise BackendError(f"precision bf16 on OpenVINO: {reason}; use precision fp32 (or int8)")
        core = shared_core()
        cache = Path(cache_dir) if cache_dir is not None else path.parent / CACHE_FOLDER
        config = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": PRECISION_HINTS[precision]}
        try:
            if use_cache:
                cache.mkdir(parents=True, exist_ok=True)
                config["CACHE_DIR"] = str(cache)
        except OSError as exc:  # a read-only artifact still runs, it just compiles every time
            log.info("OpenVINO: cache folder %s not writable (%s); compiling without a cache", cache, exc)
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        try:
            self._model = core.read_model(str(path))
        except Exception as exc:  # OpenVINO raises its own untyped errors
            raise BackendError(f"{path}: OpenVINO cannot read this graph: {exc}") from exc
        self._core, self._config = core, config
        self._compiled: dict[int, tuple[Any, Any]] = {}  # batch -> (compiled, request)
        self.compiles = 0  # compile_model calls so far: each compiled size once (`batch_sizes`)
        self.path = path
        self.precision = precision
        self.cache_dir = config.get("CACHE_DIR")
        self.provider = f"OpenVINO {ov.__version__} CPU"
        self.device = "cpu"
        names = [i.get_any_name() for i in self._model.inputs]
        self._raw_pixels_input = raw_pixels_input if raw_pixels_input in names else None
        self.raw_pixels = self._raw_pixels_input is not None
        shape = self._model.inputs[0].get_partial_shape()  # the graph's own NCHW image shape
        if shape.rank.is_static and len(shape) == 4 and shape[2].is_static and shape[3].is_static:
            self.input_size = (shape[2].get_length(), shape[3].get_length())
        self._fixed_batch = shape.rank.is_static and len(shape) > 0 and shape[0].is_static
        if self._fixed_batch:
            self.max_batch = shape[0].get_length()
            self.max_batch_source = f"{path.name} has a fixed batch dimension of {self.max_batch}"
        else:
            self.max_batch = default_max_batch
            self.max_batch_source = max_batch_source or "the default chunk size of the runtime"
        self.batch_sizes = (self.max_batch,) if self._fixed_batch else batch_sizes(self.max_batch)
        compiled, _ = self._for_batch(self.max_batch if self._fixed_batch else 1)  # fails here, not later
        self.input_names = tuple(i.get_any_name() for i in compiled.inputs)
        self.output_names = tuple(o.get_any_name() for o in compiled.outputs)
        self._dtypes = {i.get_any_name(): np.dtype(i.get_element_type().to_dtype()) for i in compiled.inputs}

    def _for_batch(self, batch: int) -> tuple[Any, Any]:
        """The graph compiled for `batch` images (one of `batch_sizes`), and its request. A graph
        with a dynamic batch is compiled per size with every shape static: OpenVINO's CPU plugin then
        plans its kernels and memory ahead; D-FINE-N INT8 at 640 ran in 0.77x the time of the dynamic
        graph. Every size compiled stays compiled: there are only log2(max_batch) of them."""
        if batch in self._compiled:
            return self._compiled[batch]
        ov = import_openvino()
        model = self._model.clone()
        if not self._fixed_batch:
            model.reshape(
                {
                    i.get_any_name(): ov.PartialShape([batch, *list(i.get_partial_shape())[1:]])
                    for i in model.inputs
                }
            )
        if self._raw_pixels_input:
            model = _with_pixel_preprocessing(model, self._raw_pixels_input)
        try:
            compiled = self._core.compile_model(model, "CPU", self._config)
        except Exception as exc:  # OpenVINO raises its own untyped errors
            raise BackendError(
                f"{self.path}: {self.provider} cannot compile this graph here (CPU {cpu.describe()}): "
                f"{openvino_reason(exc)}; run it on backend onnxruntime"
            ) from exc
        self.compiles += 1
        self._compiled[batch] = (compiled, compiled.create_infer_request())
        return self._compiled[batch]

    def prepare_batches(self, max_batch: int) -> None:
        """Compile now every size a batch of up to `max_batch` images runs as, so that serving never
        stops to compile (a D-FINE compile takes longer than many frames' inference)."""
        for size in self.batch_sizes:
            if size <= max_batch or self._fixed_batch:
                self._for_batch(size)

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        typed = {
            name: np.ascontiguousarray(feeds[name], dtype=self._dtypes[name]) for name in self.input_names
        }
        count = len(typed[self.input_names[0]])
        if self._fixed_batch:
            return self._run_padded(typed, count)
        parts, start = [], 0
        for chunk in split_batch(count, self.batch_sizes):
            parts.append(self._infer({k: v[start : start + chunk] for k, v in typed.items()}, chunk))
            start += chunk
        if len(parts) == 1:
            return parts[0]
        return {name: np.concatenate([part[name] for part in parts]) for name in self.output_names}

    def _run_padded(self, typed: dict[str, np.ndarray], count: int) -> dict[str, np.ndarray]:
        """A fixed-batch graph: fewer images are padded with copies of the last one, whose results
        are then dropped."""
        if count > self.max_batch:
            raise BackendError(f"{self.path}: a batch of {count} images; {self.max_batch_source}")
        pad = self.max_batch - count
        if pad:
            typed = {k: np.concatenate([v, np.repeat(v[-1:], pad, axis=0)]) for k, v in typed.items()}
        outputs = self._infer(typed, self.max_batch)
        return {name: value[:count] for name, value in outputs.items()}

    def _infer(self, typed: dict[str, np.ndarray], batch: int) -> dict[str, np.ndarray]:
        compiled, request = self._for_batch(batch)
        results = request.infer({k: np.ascontiguousarray(v) for k, v in typed.items()})
        # The request owns its output buffers and reuses them: copy so callers may keep the arrays.
        pairs = zip_strict(self.output_names, compiled.outputs)
        return {name: np.array(results[out]) for name, out in pairs}

    def metadata(self) -> dict[str, str]:
        """Custom metadata stored in the ONNX graph (OpenVINO keeps it under the "framework" rt_info),
        the same map onnxruntime's session gives."""
        info = self._model.get_rt_info()
        framework = info["framework"] if "framework" in info else {}  # noqa: SIM401 (RTMap has no get)
        return {str(key): value.astype(str) for key, value in framework.items()}

    def close(self) -> None:
        self._compiled.clear()

    def describe(self) -> dict:
        info = super().describe()
        info["file"] = str(self.path)
        info["cache_dir"] = self.cache_dir
        info["precision"] = self.precision
        info["raw_pixels"] = self.raw_pixels
        info["compiled_batches"] = sorted(self._compiled)
        info["compiles"] = self.compiles
        return info


def _with_pixel_preprocessing(model, name: str):
    """`model` whose input `name` takes resized uint8 [N, H, W, 3] BGR frames: the conversion to
    float32 [N, 3, H, W] as graphs take it (`GRAPH_INPUT`, RGB in [0, 1]; what `preprocess.to_tensor`
    does in numpy) becomes the first ops of the compiled graph, fused with the first convolution's
    own layout change."""
    ov = import_openvino()
    from openvino.preprocess import ColorFormat, PrePostProcessor

    ppp = PrePostProcessor(model)
    image = ppp.input(name)
    image.tensor().set_element_type(ov.Type.u8).set_layout(ov.Layout("NHWC")).set_color_format(
        ColorFormat.BGR
    )
    image.model().set_layout(ov.Layout("NCHW"))
    to_graph_input = image.preprocess().convert_element_type(ov.Type.f32)
    to_graph_input.convert_color(getattr(ColorFormat, GRAPH_INPUT.colour)).scale(1.0 / GRAPH_INPUT.scale)
    return ppp.build()
