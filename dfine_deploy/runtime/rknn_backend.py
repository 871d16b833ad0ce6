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

What runs where: the NPU runs the network, `model.onnx` cut before its postprocessor (images ->
class logits, normalised boxes), and the board's CPU runs the postprocessor in numpy
(`boxes.postprocess_numpy`: sigmoid, top-K over queries x classes, boxes scaled to
`orig_target_sizes`). That is how Rockchip's model zoo ships detectors (its yolov8 example removes
the graph behind the last convolutions and decodes on the CPU): the NPU computes in FP16, where the
postprocessor's INT64 index arithmetic (TopK over 300 x classes, Div/Mul/Sub for label and query)
and the INT64 size input have no place. Before the toolkit reads the cut graph, each decoder layer's
sampler gets a value tensor of its own (`separate_parallel_gathers`: the toolkit would merge them).
docs/export.md (Rockchip NPUs) has the measurements.

The model is built for batch 1 (the NPU's compiled graphs have fixed shapes): a batch runs image by
image.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

import numpy as np

from dfine_deploy.artifact import read_artifact
from dfine_deploy.boxes import postprocess_numpy
from dfine_deploy.errors import BackendError
from dfine_deploy.runtime.backend import Backend

# what rknn-toolkit2 2.5.0 accepts as `target_platform` for RKNPU2 chips (its docs' support list)
PLATFORMS = ("rk3588", "rk3576", "rk3568", "rk3566", "rk3562")
TOOLKIT = "rknn-toolkit2==2.5.0"  # the release the export was verified with (docs/export.md)
INPUTS = ("images", "orig_target_sizes")  # what the backend takes, as every other backend
OUTPUTS = ("labels", "boxes", "scores")  # what it answers, after the postprocessor on the CPU
NPU_INPUT = "images"  # the only input of the graph the NPU runs
POSTPROCESSOR_SCOPE = "/postprocessor/"  # the exporter's scope of the postprocessor's nodes in model.onnx
# what a board needs: the NPU runtime's Python wheel (Rockchip ships it for aarch64 only)
ANALYSIS_FILE = "error_analysis.txt"  # what rknn-toolkit2's accuracy_analysis writes in its output_dir
BOARD_INSTALL = "pip install rknn-toolkit-lite2 (aarch64, on the board; librknnrt.so from Rockchip's rknpu2)"


def load_rknn(purpose: str) -> ModuleType:
    """The RKNN runtime here: rknn-toolkit-lite2 on a board, else rknn-toolkit2 (its simulator)."""
    for module in ("rknnlite.api", "rknn.api"):
        try:
            return importlib.import_module(module)
        except ImportError:
            continue
    raise BackendError(f"{purpose}: no RKNN runtime here; {BOARD_INSTALL}, or on a PC run from .venv-rknn")


def network_cut(onnx_path: Path) -> tuple[list[str], int]:
    """Where the NPU's graph ends in `onnx_path`: the tensors its postprocessor reads (class logits
    [1,Q,C], then boxes [1,Q,4] cxcywh in [0,1]), and the postprocessor's top-K (its `scores`
    output's width). onnx is imported here: both the export's venv and the toolkit's have it."""
    import onnx

    graph = onnx.load(str(onnx_path), load_external_data=False).graph
    made_before = {out for node in graph.node if POSTPROCESSOR_SCOPE not in node.name for out in node.output}
    post = [node for node in graph.node if POSTPROCESSOR_SCOPE in node.name]
    read = [name for node in post for name in node.input if name in made_before]
    logits = [node.input[0] for node in post if node.op_type == "Sigmoid" and node.input[0] in made_before]
    boxes = [name for name in dict.fromkeys(read) if name not in logits]
    scores = next((out for out in graph.output if out.name == "scores"), None)
    top_k = scores.type.tensor_type.shape.dim[1].dim_value if scores is not None else 0
    if len(logits) != 1 or len(boxes) != 1 or top_k < 1:
        raise BackendError(
            f"{onnx_path}: no postprocessor to cut off (expected one logits and one boxes tensor read by "
            f"'{POSTPROCESSOR_SCOPE}' nodes and a fixed-width 'scores' output); export it again with "
            "dfine-export --target rk3588"
        )
    return [logits[0], boxes[0]], top_k


def build_settings(platform: str, height: int, width: int, source_graph: Path) -> dict[str, Any]:
    """What rknn-toolkit2 is told, recorded in model.json: the simulator rebuilds from it, and a
    board reads the postprocessor's top-K from it."""
    outputs, top_k = network_cut(source_graph)
    return {
        "target_platform": platform,
        "inputs": [NPU_INPUT],
        "input_size_list": [[1, 3, height, width]],
        "outputs": outputs,  # model.onnx is cut here: the postprocessor runs on the CPU
        "top_k": top_k,
        "rewrites": list(REWRITES),  # applied to the cut graph before the toolkit reads it
        # the runtime feeds the graph input (model/contracts.py GRAPH_INPUT, floats from
        # preprocess.to_tensor) and the graph holds the family's own mean/std: nothing to fold here
        "mean_values": None,
        "std_values": None,
    }


def separate_parallel_gathers(model: Any) -> int:
    """Give every Gather that shares its data tensor with an earlier one a data tensor of its own
    (in place); returns how many were changed.

    The decoder layers' deformable samplers all gather from one value tensor, each at its own
    sampling indices. rknn-toolkit2 2.5.0's graph optimizer (`remove_parallel_gather`) merges
    Gathers that read the same data into one, whatever their indices, so decoder layers 1 and 2
    would sample at layer 0's locations. The k-th such Gather here reads the data with k leading
    unit axes (`Unsqueeze`) and gathers on axis + k: the same values in a shape of its own, which
    the optimizer does not merge; the Reshape after it (the only reader allowed) sees the same
    element order."""
    import onnx

    constant = {t.name for t in model.graph.initializer}
    constant |= {out for node in model.graph.node if node.op_type == "Constant" for out in node.output}
    shapes = {out for node in model.graph.node if node.op_type == "Shape" for out in node.output}
    # the Gather's output gains k unit axes: only where a Reshape is all that reads it
    not_reshaped = {name for node in model.graph.node if node.op_type != "Reshape" for name in node.input}
    seen: dict[tuple[str, int], int] = {}
    nodes, changed, outputs = [], 0, set()
    for node in model.graph.node:
        # activations gathered at computed indices; shape arithmetic is left to constant folding
        if (
            node.op_type == "Gather"
            and node.input[0] not in shapes | constant
            and node.input[1] not in constant
        ):
            axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
            key = (node.input[0], axis)
            k = seen.get(key, 0)
            seen[key] = k + 1
            if k and node.output[0] not in not_reshaped:
                axes = onnx.helper.make_tensor(
                    f"{node.name}/separate_axes", onnx.TensorProto.INT64, [k], list(range(k))
                )
                model.graph.initializer.append(axes)
                lifted = f"{node.input[0]}/separate_{k}"
                nodes.append(
                    onnx.helper.make_node(
                        "Unsqueeze", [node.input[0], axes.name], [lifted], name=f"{node.name}/separate"
                    )
                )
                node.input[0] = lifted
                kept_attributes = [a for a in node.attribute if a.name != "axis"]
                del node.attribute[:]
                node.attribute.extend(kept_attributes)
                node.attribute.append(onnx.helper.make_attribute("axis", axis + k if axis >= 0 else axis))
                changed += 1
                outputs.add(node.output[0])
        nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    kept = [info for info in model.graph.value_info if info.name not in outputs]  # their rank changed
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return changed


# what the cut graph goes through before rknn-toolkit2 reads it, by the name model.json records
REWRITES = {"separate_parallel_gathers": separate_parallel_gathers}


def toolkit_build(onnx_path: Path, settings: dict[str, Any], dataset: Path | None = None) -> Any:
    """rknn-toolkit2's `RKNN` with `onnx_path`, cut at `settings["outputs"]`, built (INT8 when
    `dataset` lists calibration inputs) and its simulator started; any step that fails is one
    BackendError with the toolkit's return code."""
    import onnx.utils
    from rknn.api import RKNN

    rknn = RKNN(verbose=False)
    with tempfile.TemporaryDirectory(prefix="dfine-rknn-cut-") as folder:
        network = Path(folder) / "network.onnx"  # the toolkit reads it until its build is done
        onnx.utils.extract_model(str(onnx_path), str(network), settings["inputs"], settings["outputs"])
        rewrites = [REWRITES[name] for name in settings.get("rewrites", [])]
        if rewrites:
            cut = onnx.load(str(network))
            for rewrite in rewrites:
                rewrite(cut)
            onnx.save(cut, str(network))
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
                    model=str(network), inputs=settings["inputs"], input_size_list=settings["input_size_list"]
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


def recorded_settings(path: Path) -> dict[str, Any]:
    """The build settings model.json beside `path` records for it (a board opening the file
    directly): the postprocessor's top-K is there, the file itself does not carry it."""
    try:
        artifact = read_artifact(path.parent)
    except (BackendError, OSError) as exc:
        raise BackendError(
            f"{path}: the postprocessor's top-K comes from model.json beside it, which cannot be read "
            f"({exc}); copy the whole artifact folder to the board"
        ) from None
    graph = artifact.graph_named(path.name)
    if graph is None or "top_k" not in (graph.recipe or {}).get("build", {}):
        raise BackendError(
            f"{path}: {path.parent / 'model.json'} records no RKNN build for {path.name}; export it again "
            "with dfine-export --target rk3588"
        )
    return dict(graph.recipe["build"])


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
        settings = settings if settings is not None else recorded_settings(path)
        if "top_k" not in settings:  # a model.json from before the postprocessor moved to the CPU
            raise BackendError(
                f"{path}: its model.json records an RKNN build that ends in the postprocessor; export it "
                "again with dfine-export --target rk3588 (the NPU now stops before it)"
            )
        self.top_k = int(settings["top_k"])
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
            if source_graph is None:
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
    def on_simulator(cls, rknn: Any, settings: dict[str, Any]) -> RknnBackend:
        """A backend over a toolkit session `toolkit_build` has just built (the export's gate)."""
        backend = cls.__new__(cls)
        backend._rknn, backend.top_k = rknn, int(settings["top_k"])
        backend.provider, backend.device = f"rknn-toolkit2 simulator ({settings['target_platform']})", "cpu"
        backend.max_batch, backend.max_batch_source = 1, "RKNN models are built for batch 1"
        return backend

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The network on the NPU image by image, then the postprocessor on the CPU (numpy)."""
        images, sizes = feeds["images"], feeds["orig_target_sizes"]
        logits, boxes = [], []
        for image in images:
            nhwc = np.ascontiguousarray(image[None].transpose(0, 2, 3, 1), dtype=np.float32)
            out = self._rknn.inference(inputs=[nhwc], data_format=["nhwc"])
            if out is None:
                raise BackendError("the RKNN runtime returned no outputs (its log above says why)")
            logits.append(out[0])
            boxes.append(out[1])
        detections = postprocess_numpy(
            np.concatenate(logits).astype(np.float32),
            np.concatenate(boxes).astype(np.float32),
            np.asarray(sizes, dtype=np.int64),
            self.top_k,
        )
        return dict(zip(OUTPUTS, detections))

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
    parser.add_argument(
        "--analysis",
        type=Path,
        help="folder for rknn-toolkit2's accuracy_analysis of the first feed (its error_analysis.txt)",
    )
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
    backend = RknnBackend.on_simulator(rknn, settings)
    with np.load(args.feeds) as feeds:
        out = backend.run({name: feeds[name] for name in INPUTS})
    np.savez(args.results, **out)
    if args.analysis is not None:
        analyse(rknn, args.feeds, args.analysis)
    rknn.release()
    return 0


def analyse(rknn: Any, feeds: Path, folder: Path) -> None:
    """rknn-toolkit2's `accuracy_analysis` of the build on the first image of `feeds`: each layer's
    output against FP32, as the whole path and as that layer alone, in `folder`'s
    ANALYSIS_FILE (with every layer's tensors beside it: hundreds of MB). It needs the session that
    built the graph, so it runs here; a failure is printed and leaves no file (the export says so)."""
    folder.mkdir(parents=True, exist_ok=True)
    first = folder / "image.npy"
    with np.load(feeds) as loaded:
        np.save(first, np.ascontiguousarray(loaded["images"][:1], dtype=np.float32))  # NCHW, as calibrated
    if rknn.accuracy_analysis(inputs=[str(first)], output_dir=str(folder)) != 0:
        print("rknn: accuracy_analysis failed (its log above says why)", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(_worker())
