"""Rockchip NPUs (RK3588, RK3576, RK3568, RK3566, RK3562): `model.rknn`, compiled by rknn-toolkit2.

Two ways to run it, one class:
- on a board, rknn-toolkit-lite2 (`rknnlite`, aarch64 wheels) loads model.rknn and runs it on the NPU;
- on a PC, rknn-toolkit2's simulator. It cannot run a loaded .rknn file (rknn-toolkit2 2.5.0:
  "RKNN model that loaded by 'load_rknn' not support inference on the simulator"), only a graph it
  has just built, so the simulator builds the FP16 model again from the source ONNX beside it, with
  the settings model.json recorded (the build is deterministic; an INT8 build would need the
  calibration images again, so INT8 runs on a board only).

rknn-toolkit2 pins torch<=2.4.0, numpy<=1.26.4, onnx<=1.18.0 and protobuf<=4.25.4, which the export
side's own pins exclude, so it lives in a tool venv of its own (`make rknn-venv`: `.venv-rknn`,
docs/export.md). `python -m dfine_deploy.runtime.rknn_backend` is that venv's half of
`dfine-export --target rk3588`: it builds model.rknn and runs the gate's images in the simulator.

The model is built for batch 1 (the NPU's compiled graphs have fixed shapes): a batch runs image by
image.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import numpy as np

from dfine_deploy.errors import BackendError
from dfine_deploy.runtime.backend import Backend

# what rknn-toolkit2 2.5.0 accepts as `target_platform` for RKNPU2 chips (its docs' support list)
PLATFORMS = ("rk3588", "rk3576", "rk3568", "rk3566", "rk3562")
TOOLKIT = "rknn-toolkit2==2.5.0"  # the release the export was verified with (docs/export.md)
INPUTS = ("images", "orig_target_sizes")
OUTPUTS = ("labels", "boxes", "scores")
# what a board needs: the NPU runtime's Python wheel (Rockchip ships it for aarch64 only)
BOARD_INSTALL = "pip install rknn-toolkit-lite2 (aarch64, on the board; librknnrt.so from Rockchip's rknpu2)"


def load_rknn(purpose: str) -> ModuleType:
    """The RKNN runtime here: rknn-toolkit-lite2 on a board, else rknn-toolkit2 (its simulator)."""
    for module in ("rknnlite.api", "rknn.api"):
        try:
            return importlib.import_module(module)
        except ImportError:
            continue
    raise BackendError(f"{purpose}: no RKNN runtime here; {BOARD_INSTALL}, or on a PC run from .venv-rknn")


def build_settings(platform: str, height: int, width: int) -> dict[str, Any]:
    """What rknn-toolkit2 is told, recorded in model.json: the simulator rebuilds from it."""
    return {
        "target_platform": platform,
        "inputs": list(INPUTS),
        "input_size_list": [[1, 3, height, width], [1, 2]],
        # the runtime feeds the graph input (model/contracts.py GRAPH_INPUT, floats from
        # preprocess.to_tensor) and the graph holds the family's own mean/std: nothing to fold here
        "mean_values": None,
        "std_values": None,
    }


def toolkit_build(onnx_path: Path, settings: dict[str, Any], dataset: Path | None = None) -> Any:
    """rknn-toolkit2's `RKNN` with `onnx_path` built (INT8 when `dataset` lists calibration inputs) and
    its simulator started; any step that fails is one BackendError with the toolkit's return code."""
    from rknn.api import RKNN

    rknn = RKNN(verbose=False)
    steps = (
        (
            "config",
            lambda: rknn.config(
                target_platform=settings["target_platform"],
                mean_values=settings["mean_values"],
                std_values=settings["std_values"],
            ),
        ),
        (
            "load_onnx",
            lambda: rknn.load_onnx(
                model=str(onnx_path), inputs=settings["inputs"], input_size_list=settings["input_size_list"]
            ),
        ),
        (
            "build",
            lambda: rknn.build(
                do_quantization=dataset is not None, dataset=str(dataset) if dataset else None
            ),
        ),
        ("init_runtime", rknn.init_runtime),  # no target: the simulator
    )
    for name, step in steps:
        code = step()
        if code not in (0, None):
            rknn.release()
            raise BackendError(
                f"rknn-toolkit2 {name} of {onnx_path} returned {code} (its log above says why)"
            )
    return rknn


class RknnBackend(Backend):
    """model.rknn on the NPU (rknn-toolkit-lite2), or its FP16 source graph in rknn-toolkit2's simulator."""

    name = "rknn"
    input_names = INPUTS
    output_names = OUTPUTS

    def __init__(
        self,
        path: Path | str,
        *,
        settings: dict[str, Any] | None = None,
        source_graph: Path | None = None,
        core_mask: int | None = None,
    ):
        path = Path(path)
        if importlib.util.find_spec("rknnlite") is not None:
            from rknnlite.api import RKNNLite

            self._rknn = RKNNLite(verbose=False)
            if self._rknn.load_rknn(str(path)) != 0:
                raise BackendError(f"{path}: rknn-toolkit-lite2 cannot load it (not an .rknn model?)")
            mask = RKNNLite.NPU_CORE_AUTO if core_mask is None else core_mask
            if self._rknn.init_runtime(core_mask=mask) != 0:
                raise BackendError(f"{path}: the NPU runtime did not start (is librknnrt.so installed?)")
            self.provider, self.device = "rknpu", "npu"
        elif importlib.util.find_spec("rknn") is not None:
            if settings is None or source_graph is None:
                raise BackendError(
                    f"{path}: rknn-toolkit2's simulator cannot run a built .rknn file; open the artifact "
                    "folder (its model.json names the source graph), or run model.rknn on a board"
                )
            self._rknn = toolkit_build(source_graph, settings)
            self.provider, self.device = f"rknn-toolkit2 simulator ({settings['target_platform']})", "cpu"
        else:
            raise BackendError(f"{path}: no RKNN runtime here; {BOARD_INSTALL}")
        self.max_batch, self.max_batch_source = 1, "RKNN models are built for batch 1"

    @classmethod
    def on_simulator(cls, rknn: Any, platform: str) -> RknnBackend:
        """A backend over a toolkit session `toolkit_build` has just built (the export's gate)."""
        backend = cls.__new__(cls)
        backend._rknn = rknn
        backend.provider, backend.device = f"rknn-toolkit2 simulator ({platform})", "cpu"
        backend.max_batch, backend.max_batch_source = 1, "RKNN models are built for batch 1"
        return backend

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        images, sizes = feeds["images"], feeds["orig_target_sizes"]
        per_image: list[Sequence[np.ndarray]] = []
        for image, size in zip(images, sizes):
            nhwc = np.ascontiguousarray(image[None].transpose(0, 2, 3, 1), dtype=np.float32)
            out = self._rknn.inference(
                inputs=[nhwc, np.ascontiguousarray(size[None], dtype=np.int64)], data_format=["nhwc", "nchw"]
            )
            if out is None:
                raise BackendError("the RKNN runtime returned no outputs (its log above says why)")
            per_image.append(out)
        return {
            name: np.concatenate([out[i] for out in per_image]).astype(dtype)
            for i, (name, dtype) in enumerate(zip(OUTPUTS, (np.int64, np.float32, np.float32)))
        }

    def close(self) -> None:
        self._rknn.release()


def _worker(argv: Sequence[str] | None = None) -> int:
    """The tool venv's half of the export: build `--onnx`, write `--out`, run `--feeds` in the simulator."""
    parser = argparse.ArgumentParser(prog="python -m dfine_deploy.runtime.rknn_backend")
    parser.add_argument("--onnx", type=Path, required=True)
    parser.add_argument("--settings", required=True, help="build_settings(...) as JSON")
    parser.add_argument("--dataset", type=Path, help="calibration list (INT8); FP16 without it")
    parser.add_argument("--out", type=Path, required=True, help="the .rknn file to write")
    parser.add_argument(
        "--feeds", type=Path, required=True, help=".npz of images [N,3,H,W], orig_target_sizes"
    )
    parser.add_argument("--results", type=Path, required=True, help=".npz of labels, boxes, scores")
    args = parser.parse_args(argv)
    settings = json.loads(args.settings)
    try:
        rknn = toolkit_build(args.onnx, settings, args.dataset)
    except BackendError as exc:
        print(f"rknn: {exc}", file=sys.stderr)
        return 2
    if rknn.export_rknn(str(args.out)) != 0:
        print(f"rknn: export_rknn to {args.out} failed (its log above says why)", file=sys.stderr)
        return 2
    backend = RknnBackend.on_simulator(rknn, settings["target_platform"])
    with np.load(args.feeds) as feeds:
        out = backend.run({name: feeds[name] for name in INPUTS})
    np.savez(args.results, **out)
    rknn.release()
    return 0


if __name__ == "__main__":
    sys.exit(_worker())
