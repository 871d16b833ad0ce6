"""The artifact folder: the contract between `dfine-export` and every runtime.

Its graphs (model.onnx and the others: the rows of export/recipes.py, tabled in
docs/ARCHITECTURE.md), optional TensorRT engines (one file per precision: model.engine FP16,
model.int8.engine INT8, model.fp32.engine FP32), and model.json, this sidecar:
everything a runtime may rely on. The runtime trusts nothing the sidecar does not say. Reading it
needs no torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from dfine_deploy.backend_names import GRAPH_PRECISIONS, BackendName, Precision
from dfine_deploy.class_names import check_class_names
from dfine_deploy.errors import BackendError
from dfine_deploy.files import atomic_write_bytes, cached_sha256
from dfine_deploy.model.contracts import GRAPH_INPUT, INPUT_CONTRACTS
from dfine_deploy.model.reference import SIDECAR_NAME, models_in_folder
from dfine_deploy.model.spec import EXPORT_SAMPLER, SAMPLERS
from dfine_deploy.thresholds import check_record, chosen_of

FORMAT_VERSION = 1
SIDECAR_ENCODING = "utf-8-sig"  # a byte-order mark (an editor on Windows saved it) is no content
INPUT_NAMES = ("images", "orig_target_sizes")
OUTPUT_NAMES = ("labels", "boxes", "scores")
# One engine file per precision it was built as, each with its own model.json record (`engines`), so
# an INT8 build never replaces the FP16 engine it is timed against. Order: what a folder opens at
# when no precision is asked (`ArtifactInfo.engine_for`). export/jetson/build_engine.sh names its
# engines by the same table (tests/export/test_tensorrt_int8.py holds them equal).
ENGINE_FILES = {
    Precision.FP16: "model.engine",
    Precision.INT8: "model.int8.engine",
    Precision.FP32: "model.fp32.engine",
}
# The backend dfine-export runs its own gates on: onnxruntime's CPU provider.
GATE_BACKEND = f"{BackendName.ONNXRUNTIME}:cpu"


def parity_key(key: str, backend: str = GATE_BACKEND) -> str:
    """The `parity` entry of a gate: the graph key (or precision) alone for a gate run on
    GATE_BACKEND, "KEY:BACKEND" for one run on another backend ("int8:openvino")."""
    return str(key) if backend == GATE_BACKEND else f"{key}:{backend}"


# The parity entry of the OpenVINO BF16 run (the CPU FP32 graph under OpenVINO's bf16 precision hint);
# precision "bf16" opens only when it passed. Not run: {"run": False, "passed": False, "reason": ...}.
BF16_GATE_KEY = parity_key(Precision.BF16, BackendName.OPENVINO)


@dataclass
class GraphInfo:
    file: str  # relative to the artifact folder
    sha256: str
    precision: str  # one of GRAPH_PRECISIONS
    opset: int | None = None
    recipe: dict[str, Any] = field(default_factory=dict)  # fp16/int8: FP32 islands kept, calibration
    sampler: str = "gather"  # deformable sampling in this graph: "gather" or "grid" (GridSample)


@dataclass
class EngineInfo:
    file: str
    sha256: str
    source_graph: str  # which graph file it was built from
    tensorrt_version: str
    gpu_name: str
    compute_capability: str
    profile: dict[str, list[list[int]]]  # input name -> [min, opt, max] shapes
    io_dtypes: dict[str, str]
    layer_precisions: dict[str, int]  # precision -> count of layer inputs/outputs in the inspector JSON
    build_seconds: float
    precision: str = Precision.FP16  # what the engine was built as; `verification` says how sure that is
    builder: dict[str, Any] = field(default_factory=dict)  # strongly_typed, fp16_flag, tf32, workspace, cache
    # status verified | unverified (with the reason), the network's and the inspector's tensor counts
    verification: dict[str, Any] = field(default_factory=dict)


@dataclass
class ArtifactInfo:
    model: str  # "dfine-n" .. "dfine-x", or "custom"
    num_classes: int
    class_names: list[str]
    input_height: int
    input_width: int
    batch_min: int = 1
    batch_opt: int = 1
    batch_max: int = 8
    color: str = "RGB"  # channel order the graph expects; pixels scaled to [0, 1]
    # the family's input contract (model/contracts.py, `InputContract.to_dict`): `graph`, what the graph
    # takes (GRAPH_INPUT, what every runtime feeds); `network`, what the network takes, its mean/std
    # inside the graph; the size rule and the upstream sources. {}: written before it was recorded
    input: dict[str, Any] = field(default_factory=dict)
    sampler: str = EXPORT_SAMPLER  # one of model.spec.SAMPLERS
    postprocess: bool = True  # graph ends in (labels, boxes, scores)
    num_top_queries: int = 300
    graphs: dict[str, GraphInfo] = field(default_factory=dict)  # key: a recipe key (export/recipes.py)
    # Which graph each backend runs, per precision: {"openvino": {"fp32": "fp32-grid"}, ...}. Targets
    # are "onnxruntime:cpu", "onnxruntime:cuda", "onnxruntime:tensorrt", "openvino", "tensorrt"; a
    # target or precision not listed runs the graph keyed by the precision itself. "bf16" (openvino
    # only) names the FP32 graph OpenVINO runs in BF16, listed when its gate passed.
    backend_graphs: dict[str, dict[str, str]] = field(default_factory=dict)
    # TensorRT engines by the precision they were built as, each in its own file (ENGINE_FILES), so
    # that building one precision never replaces another's engine or record
    engines: dict[str, EngineInfo] = field(default_factory=dict)
    checkpoint: dict[str, Any] = field(default_factory=dict)  # path, sha256
    parity: dict[str, Any] = field(default_factory=dict)  # per graph (and BF16_GATE_KEY): the gate's results
    # score thresholds per class chosen on --data's annotations, keyed as `parity` (a graph on the backend
    # its gate ran on): {"rule", "images", "iou", "classes": {name: {"threshold", "precision", ...}}}
    thresholds: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    # --target (export/targets.py): the profile, the parser check per graph, and for TensorRT 8.x
    # the FP32 layers held by precision constraints ({node name: float output count})
    target: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    class_names_note: str = ""  # set when the names were assumed from the class count (no names given)
    # file, sha256, images: the gate's images and PyTorch's detections of them, which dfine-verify
    # checks an engine against on its device (runtime/reference_pack.py); {} before it was written
    reference_pack: dict[str, Any] = field(default_factory=dict)

    def graph_for(self, target: str, precision: str, source: str = "model.json") -> GraphInfo:
        """The graph `target` (e.g. "openvino", "onnxruntime:cpu") runs at `precision`. A target that
        `backend_graphs` lists runs only the precisions listed for it: INT8 is left out for a backend
        whose INT8 gate failed at export while another backend's passed."""
        listed = self.backend_graphs.get(target)
        gate = self.parity.get(parity_key(precision, target), {})
        if listed is not None and precision not in listed and gate.get("passed") is False:
            why = "; ".join(gate.get("failures", [])[:1]) or "its gate failed"
            raise BackendError(
                f"{source}: no {precision} graph for {target}: its {precision} gate failed at export on a "
                f"CPU of class {gate.get('isa', 'unrecorded')} ({why}); use precision fp32"
                + (f", or backend {other}" if (other := self._passed_elsewhere(precision, target)) else "")
            )
        key = (listed or {}).get(precision, precision)
        if key not in self.graphs:
            raise BackendError(
                f"{source}: no {precision} graph for {target} in this artifact (it has "
                f"{sorted(self.graphs)}); re-export (dfine-export --int8 --data DIR for INT8), "
                "or ask for another precision"
            )
        return self.graphs[key]

    def engine_for(self, precision: str = Precision.AUTO) -> EngineInfo | None:
        """The engine recorded for `precision`; "auto": the first recorded in ENGINE_FILES' order
        (FP16, then INT8, then FP32)."""
        if precision == Precision.AUTO:
            return next((self.engines[p] for p in ENGINE_FILES if p in self.engines), None)
        return self.engines.get(precision)

    def engine_named(self, file: str) -> EngineInfo | None:
        """The engine record of the file `file` (a name in the artifact folder), if any."""
        return next((e for e in self.engines.values() if e.file == file), None)

    def graph_named(self, file: str) -> GraphInfo | None:
        """The graph record of the file `file` (a name in the artifact folder), if any."""
        return next((g for g in self.graphs.values() if g.file == file), None)

    def chosen_thresholds(self, file: str, target: str, precision: str = "") -> dict[str, float]:
        """{class name: threshold} chosen at export for the graph in `file` (or the graph an engine of
        that name was built from) run by `target` ("openvino", "onnxruntime:cuda", ...): those of that
        backend's own gate (OpenVINO's BF16 run: its own), else those of the GATE_BACKEND run of the same
        graph; {} when none."""
        return chosen_of(self.threshold_record(file, target, precision))

    def threshold_record(self, file: str, target: str, precision: str = "") -> dict[str, Any] | None:
        """The whole `thresholds` entry `chosen_thresholds` reads (None: none), with its rule and,
        where the export judged them on a held-out half, `held_out`."""
        engine = self.engine_named(file)
        if engine is not None:
            file = engine.source_graph
        key = next((k for k, g in self.graphs.items() if g.file == file), None)
        if key is None:
            return None
        applied = [BF16_GATE_KEY] if precision == Precision.BF16 and target == BackendName.OPENVINO else []
        for entry in (*applied, parity_key(key, target), key):
            if entry in self.thresholds:
                return self.thresholds[entry]
        return None

    def _passed_elsewhere(self, precision: str, target: str) -> str | None:
        """Another target that runs `precision` (its gate passed), if any."""
        others = (t for t, graphs in self.backend_graphs.items() if t != target and precision in graphs)
        return next(others, None)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=False)

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "model.json") -> ArtifactInfo:
        """Every field checked (present, of its type, in its range) before anything relies on it: a
        sidecar that lost a `sha256` or names a file outside its folder is refused in one line."""
        if not isinstance(data, dict):
            raise BackendError(
                f"{source}: the sidecar must be a JSON object, found {type(data).__name__}; "
                "re-export the model"
            )
        if data.get("format_version") != FORMAT_VERSION:
            raise BackendError(
                f"{source}: sidecar format_version {data.get('format_version')!r} is not "
                f"{FORMAT_VERSION}; re-export the model with this version of dfine-export"
            )
        data = _checked_fields(cls, _engines_of_one_record(data), source, "")
        graphs = data.get("graphs", {})
        data["graphs"] = {
            key: GraphInfo(**_checked_fields(GraphInfo, entry, source, f"graphs.{key}."))
            for key, entry in graphs.items()
        }
        data["engines"] = {
            key: EngineInfo(**_checked_fields(EngineInfo, entry, source, f"engines.{key}."))
            for key, entry in data.get("engines", {}).items()
        }
        info = cls(**data)
        _check_values(info, source)
        fix = "re-export the model with dfine-export (--names FILE gives the names)"
        check_class_names(info.class_names, info.num_classes, f"{source}: class_names", fix, BackendError)
        return info


def _engines_of_one_record(data: dict[str, Any]) -> dict[str, Any]:
    """A sidecar written when an artifact held one engine (`engine`, its precision inside) read as
    `engines` keyed by that precision; the next write records it so."""
    if "engine" not in data:
        return data
    data = dict(data)
    engine = data.pop("engine")
    if engine is not None and "engines" not in data:
        precision = engine.get("precision", Precision.FP16) if isinstance(engine, dict) else Precision.FP16
        data["engines"] = {str(precision): engine}
    return data


# The JSON type each annotation's outer name stands for; a nested dataclass is an object.
_JSON_TYPES: dict[str, type | tuple[type, ...]] = {
    "str": str,
    "int": int,
    "float": (int, float),
    "bool": bool,
    "list": list,
    "dict": dict,
}


def _checked_fields(cls: type, data: Any, source: str, where: str) -> dict[str, Any]:
    """`data` as keyword arguments of dataclass `cls`: an object with every field that has no default,
    each of its annotated JSON type, and no field `cls` does not know."""

    def refuse(problem: str) -> BackendError:
        return BackendError(
            f"{source}: {problem}; the sidecar is damaged or was edited by hand: re-export the model "
            "with dfine-export"
        )

    if not isinstance(data, dict):
        raise refuse(f"{where.rstrip('.') or 'the sidecar'} must be an object, found {data!r}")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise refuse(f"unknown field {where}{unknown[0]}")
    for name, spec in known.items():
        if name not in data:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise refuse(f"{where}{name} is missing")
            continue
        alternatives = [part.strip() for part in str(spec.type).split("|")]
        value = data[name]
        if value is None and "None" in alternatives:
            continue
        outer = alternatives[0].split("[", 1)[0]
        expected = _JSON_TYPES.get(outer, dict)
        if not isinstance(value, expected) or (isinstance(value, bool) and outer in ("int", "float")):
            raise refuse(
                f"{where}{name} must be {'an object' if expected is dict else outer}, found {value!r}"
            )
    return dict(data)


def _check_values(info: ArtifactInfo, source: str) -> None:
    """The ranges and names the runtime relies on (types are checked by `_checked_fields`)."""

    def refuse(problem: str) -> BackendError:
        return BackendError(f"{source}: {problem}; re-export the model with dfine-export")

    if info.input_height <= 0 or info.input_width <= 0 or info.input_height % 32 or info.input_width % 32:
        raise refuse(
            f"input size {info.input_height} x {info.input_width}: both must be positive multiples of 32"
        )
    if not 1 <= info.batch_min <= info.batch_opt <= info.batch_max:
        raise refuse(
            f"batch range {info.batch_min} {info.batch_opt} {info.batch_max}: need 1 <= min <= opt <= max"
        )
    if info.num_classes < 1 or info.num_top_queries < 1:
        raise refuse(
            f"num_classes {info.num_classes} and num_top_queries {info.num_top_queries} must be >= 1"
        )
    if info.color != "RGB":
        raise refuse(
            f"color {info.color!r}: the graphs dfine-export writes take RGB, and the runtime feeds RGB"
        )
    if info.sampler not in SAMPLERS:
        raise refuse(f"sampler {info.sampler!r}: expected one of {', '.join(SAMPLERS)}")
    _check_input(info, refuse)
    for target, choice in info.backend_graphs.items():
        if not isinstance(choice, dict) or not all(isinstance(v, str) for v in choice.values()):
            raise refuse(f"backend_graphs.{target} must map precisions to graph keys, found {choice!r}")
    if Precision.FP32 not in info.graphs:
        raise refuse(f"no fp32 graph among {sorted(info.graphs)} (every artifact has model.onnx)")
    files: list[tuple[str, str, str]] = [(f"graphs.{k}", g.file, g.sha256) for k, g in info.graphs.items()]
    for precision, engine in info.engines.items():
        if precision not in ENGINE_FILES or engine.precision != precision:
            raise refuse(
                f"engines.{precision}: an engine recorded under {precision!r} must be built as one of "
                f"{', '.join(ENGINE_FILES)} and say so (its precision is {engine.precision!r})"
            )
        files.append((f"engines.{precision}", engine.file, engine.sha256))
    for where, file, digest in files:
        if not file or file != Path(file).name or file in (".", ".."):
            raise refuse(f"{where}.file {file!r} must be a file name inside the artifact folder")
        if len(digest) != 64 or any(c not in "0123456789abcdef" for c in digest):
            raise refuse(f"{where}.sha256 {digest!r} is not a sha256 (64 hex digits)")
    for key, record in info.thresholds.items():
        check_record(record, info.class_names, f"thresholds.{key}", source)
    for key, graph in info.graphs.items():
        if graph.precision not in GRAPH_PRECISIONS or graph.sampler not in SAMPLERS:
            raise refuse(f"graphs.{key}: precision {graph.precision!r} / sampler {graph.sampler!r} unknown")


def _check_input(info: ArtifactInfo, refuse) -> None:
    """The graph must take what the runtimes feed (GRAPH_INPUT). A sidecar without `input` predates
    the contract: its graph has no normalisation step, which is right only for a family without one."""
    if info.input:
        graph = info.input.get("graph")
        if graph != GRAPH_INPUT.to_dict():
            raise refuse(f"input.graph {graph!r}: the runtimes feed {GRAPH_INPUT.to_dict()}")
        return
    family = info.model.split("-", 1)[0]
    contract = INPUT_CONTRACTS.get(family)
    if contract is not None and contract.network.normalises:
        raise refuse(
            f"model {info.model}: its graph was exported without {family}'s input normalisation "
            f"(mean {list(contract.network.mean)}, std {list(contract.network.std)}; model.json has no "
            "`input`), so it would detect on wrongly scaled pixels"
        )


def read_artifact(folder: str | os.PathLike) -> ArtifactInfo:
    path = Path(folder) / SIDECAR_NAME
    if not path.is_file():
        raise BackendError(
            f"{folder}: no {SIDECAR_NAME} found; an artifact folder is made by `dfine-export`"
            + (models_in_folder(folder) if Path(folder).is_dir() else "")
        )
    try:
        data = json.loads(path.read_text(encoding=SIDECAR_ENCODING))
    except (OSError, ValueError) as exc:  # ValueError: not JSON, or not UTF-8
        raise BackendError(f"{path}: unreadable sidecar ({exc}); re-export the model") from exc
    return ArtifactInfo.from_dict(data, source=str(path))


def is_sidecar(path: str | os.PathLike) -> bool:
    """Whether `path` reads as a sidecar of ours, of any format version: what shows that a folder is an
    artifact dfine-export wrote (dfine_deploy/ownership.py). Raises ValueError/OSError when unreadable."""
    data = json.loads(Path(path).read_text(encoding=SIDECAR_ENCODING))
    return isinstance(data, dict) and "format_version" in data and isinstance(data.get("graphs"), dict)


def sidecar_files(path: str | os.PathLike) -> list[str]:
    """The graph and engine files a sidecar records (relative to its folder)."""
    data = json.loads(Path(path).read_text(encoding=SIDECAR_ENCODING))
    engines = data.get("engines") if isinstance(data.get("engines"), dict) else {}
    entries = [
        *data.get("graphs", {}).values(),
        *engines.values(),
        data.get("engine") or {},  # one engine record: written before each precision had its own
        data.get("reference_pack") or {},
    ]
    return [e["file"] for e in entries if isinstance(e, dict) and isinstance(e.get("file"), str)]


def write_artifact(folder: str | os.PathLike, info: ArtifactInfo) -> Path:
    path = Path(folder) / SIDECAR_NAME
    atomic_write_bytes(path, info.to_json().encode())
    return path


def verify_file(folder: str | os.PathLike, info: ArtifactInfo, file: str) -> None:
    """Refuse a graph or engine whose bytes are not the ones the sidecar recorded (swapped, damaged)."""
    recorded = {g.file: g.sha256 for g in info.graphs.values()}
    recorded.update({e.file: e.sha256 for e in info.engines.values()})
    if file not in recorded:
        return  # not one of the artifact's files: the sidecar vouches for nothing about it
    path = Path(folder) / file
    if not path.is_file():
        raise BackendError(
            f"{path}: {SIDECAR_NAME} names this file, and it is not in the folder: the artifact is "
            "incomplete (copy the whole folder, or re-export it with dfine-export)"
        )
    actual = cached_sha256(path)
    if actual != recorded[file]:
        fix = (
            "Rebuild it with export/jetson/build_engine.sh or python -m dfine_deploy.export.tensorrt "
            f"where python3 imports dfine-deploy: both record the engine in {SIDECAR_NAME}"
            if info.engine_named(file) is not None
            else "Re-export the folder with dfine-export (a graph from elsewhere can be opened by its "
            f".onnx path in a folder without {SIDECAR_NAME})"
        )
        raise BackendError(
            f"{path}: its sha256 ({actual[:12]}…) is not the one {SIDECAR_NAME} records "
            f"({recorded[file][:12]}…): the file was replaced or damaged after it was recorded. {fix}"
        )
