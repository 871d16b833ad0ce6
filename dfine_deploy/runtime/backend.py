"""The one small interface every inference backend implements (named arrays in, named arrays out)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Callable

import numpy as np


class Backend(ABC):
    """A loaded graph that maps named input arrays to named output arrays.

    Everything model-specific (resizing, box decoding) lives in an `Adapter`, so the same backend
    runs D-FINE and foreign detectors, and benchmarks can time `run` alone ("engine only").
    """

    name: str = ""  # "onnxruntime" | "torch" | "tensorrt"
    provider: str = ""  # what really executes: an ORT provider, "cuda:0 fp16 autocast", ...
    device: str = "cpu"  # "cpu" or "cuda:N"
    input_names: tuple[str, ...] = ()
    output_names: tuple[str, ...] = ()
    input_size: tuple[int, int] | None = None  # (H, W) when the graph fixes it
    max_batch: int = 1
    max_batch_source: str = ""  # where the limit comes from, for error messages
    # the image input takes resized uint8 [N, H, W, 3] BGR frames and converts them inside the graph
    raw_pixels: bool = False
    # the precision the file was built as, where something records it (an engine's model.json entry);
    # "" when nothing does (a graph runs as typed). dfine-verify checks it against `engine_inspector`
    declared_precision: str = ""
    # whether the engine was built from a strongly typed network (its types are the graph's), where its
    # record says so (model.json's engine `builder`, a replay's recording); None when nothing records
    # it. dfine-verify reads the inspector's FP32 tensors by it (export/tensorrt_verify.judge_precision)
    strongly_typed: bool | None = None

    @abstractmethod
    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run one batch; outputs are host numpy arrays that the caller may keep."""

    def prepare_batches(self, max_batch: int) -> None:
        """Get every batch size up to `max_batch` ready before the first frame, so that a server never
        stops to build a plan. A no-op by default: onnxruntime, TensorRT and torch run any size of
        their range as it comes; OpenVINO overrides it (it compiles per size)."""
        return None

    def close(self) -> None:
        """Release sessions, engines and buffers that garbage collection would not free in time.

        A deliberate no-op by default: onnxruntime sessions and torch modules are freed with the
        backend; TensorRT and OpenVINO override it.
        """
        return None

    def engine_only(self, feeds: dict[str, np.ndarray]) -> Callable[[], None] | None:
        """A callable that runs the engine once more on `feeds`, already on its device, and waits for
        it: the engine's own time, without the host copies and conversions `run` adds (dfine-verify
        times INT8 against FP16 by it, where host work would hide a small model's gain). None where
        the backend cannot run its engine apart from them (a graph runtime's session)."""
        return None

    def engine_inspector(self) -> str | None:
        """The engine inspector's JSON, which types every layer's tensors (what precision each layer
        really runs in); None where the backend cannot say (a graph runs as typed)."""
        return None

    def metadata(self) -> dict[str, str]:
        """The graph's own key/value metadata (Ultralytics keeps class names there); none by default."""
        return {}

    def describe(self) -> dict[str, Any]:
        return {
            "backend": self.name,
            "provider": self.provider,
            "device": self.device,
            "inputs": list(self.input_names),
            "outputs": list(self.output_names),
            "max_batch": self.max_batch,
        }
