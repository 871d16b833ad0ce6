"""PyTorch eager backend: a checkpoint, config or size name, run as the exported graph would be.

The model is built through `dfine_deploy.hub.loader.load_model` and wrapped in `DeployModel`
(model + postprocessor in deploy form), so it takes and returns exactly the ONNX tensors. On a
CUDA device it runs under FP16 autocast; on the CPU in FP32. This module is only imported when
the torch backend is chosen.
"""

from __future__ import annotations

import os

import numpy as np

from dfine_deploy.backend_names import BackendName
from dfine_deploy.errors import BackendError, require
from dfine_deploy.runtime.backend import Backend
from dfine_deploy.runtime.backends import BY_NAME

INPUTS = ("images", "orig_target_sizes")
OUTPUTS = ("labels", "boxes", "scores")


class TorchBackend(Backend):
    name = "torch"
    input_names = INPUTS
    output_names = OUTPUTS

    def __init__(
        self,
        ref: str,
        *,
        device: str = "auto",
        imgsz: tuple[int, int] | None = None,
        sampler: str = "grid",
        max_batch: int = 32,
        names: str | os.PathLike | None = None,
        threads: int | None = None,
    ):
        """`names`: a class-names file overriding the checkpoint's (`load_model`). `threads`: torch's
        intra-op threads, set for the whole process (torch has one pool); None leaves torch's own."""
        row = BY_NAME[BackendName.TORCH]
        torch = require(row.requires, row.extra, "The torch backend")
        from dfine_deploy.hub.loader import load_model
        from dfine_deploy.model.dfine import DeployModel

        self._torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        if device.startswith("cuda") and not torch.cuda.is_available():
            raise BackendError(
                f"device={device!r} but torch sees no CUDA GPU (torch {torch.__version__}); use device='cpu'"
            )
        self._device = torch.device(device)
        if threads:
            torch.set_num_threads(threads)
        loaded = load_model(ref, imgsz=imgsz, sampler=sampler, names=names)
        self.loaded = loaded
        self.module = DeployModel(loaded.model, loaded.postprocessor).eval().for_eager(self._device)
        self.input_size = tuple(loaded.spec.eval_spatial_size)
        self.device = str(self._device)
        self.autocast = self._device.type == "cuda"
        self.provider = f"{self.device} {'fp16 autocast' if self.autocast else 'fp32'}"
        self.declared_precision = "fp16" if self.autocast else "fp32"
        self.max_batch = max_batch
        self.max_batch_source = "the torch backend's chunk size"

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        torch = self._torch
        images = torch.from_numpy(np.ascontiguousarray(feeds["images"], dtype=np.float32))
        sizes = torch.from_numpy(np.ascontiguousarray(feeds["orig_target_sizes"], dtype=np.int64))
        images = images.to(self._device, non_blocking=True)
        sizes = sizes.to(self._device, non_blocking=True)
        autocast = torch.autocast(self._device.type, dtype=torch.float16, enabled=self.autocast)
        with torch.inference_mode(), autocast:
            labels, boxes, scores = self.module(images, sizes)
        return {
            "labels": labels.to(torch.int64).cpu().numpy(),
            "boxes": boxes.float().cpu().numpy(),
            "scores": scores.float().cpu().numpy(),
        }

    def synchronize(self) -> None:
        if self._device.type == "cuda":
            self._torch.cuda.synchronize(self._device)
