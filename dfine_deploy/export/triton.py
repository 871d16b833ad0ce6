"""A Triton Inference Server model repository for an artifact folder.

    REPO/
      dfine_onnx/config.pbtxt   platform onnxruntime_onnx   1/model.onnx
      dfine_trt/config.pbtxt    platform tensorrt_plan      1/model.plan   (only when an engine exists)

`max_batch_size` > 0 means Triton owns the batch dimension: `dims` leave it out, and the graph
(dynamic N) or the engine (profile max >= max_batch_size) must accept it. The dynamic batcher
merges single-image requests from many clients into those batches.

The repository may hold other models: only the model folders named above are written, and an
existing one is replaced (with --force) only when it is ours, i.e. its config.pbtxt opens with
`MARKER_LINE` and it holds nothing else we did not write.

Triton passes the graph's top-K through unfiltered; the score threshold per class that dfine-export chose
on --data for the graph (or the engine's source graph) is written as the model's `parameters`
(`score_threshold:NAME`), which clients read from the model's configuration (GET v2/models/NAME/config).
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from dfine_deploy.artifact import GATE_BACKEND, ArtifactInfo, read_artifact, verify_file
from dfine_deploy.backend_names import Precision
from dfine_deploy.errors import ExportError
from dfine_deploy.ownership import Claim, claim_folder, replacing, share_folder

log = logging.getLogger(__name__)

MARKER_LINE = "# written by dfine-export --triton, which replaces only model folders that open with this line"
CONFIG_NAME = "config.pbtxt"
# a model's `parameters` key for one class's score threshold chosen at export: "score_threshold:NAME"
THRESHOLD_PARAMETER = "score_threshold:"


def _config_is_ours(config: Path) -> bool:
    with open(config, encoding="utf-8", errors="replace") as fh:
        return fh.readline().rstrip("\n") == MARKER_LINE


MODEL_FOLDER = Claim(
    command="dfine-export --triton",
    kind="a Triton model folder",
    markers=(CONFIG_NAME,),
    patterns=("1", "1/model.onnx", "1/model.plan"),
    recognise=_config_is_ours,
)

_TRITON_TYPES = {
    "images": "TYPE_FP32",
    "orig_target_sizes": "TYPE_INT64",
    "labels": "TYPE_INT64",
    "boxes": "TYPE_FP32",
    "scores": "TYPE_FP32",
}
_TRITON_DTYPES = {"float32": "TYPE_FP32", "int32": "TYPE_INT32", "int64": "TYPE_INT64"}


@dataclass(frozen=True)
class TritonSettings:
    prefix: str = "dfine"
    instances: int = 1
    kind: str = "KIND_GPU"  # KIND_CPU for a CPU-only server (ONNX model only)
    max_queue_delay_us: int = 2000


def config_text(info: ArtifactInfo, *, name: str, platform: str, options: TritonSettings) -> str:
    """config.pbtxt for one model of the repository, in protobuf text format."""
    k = info.num_top_queries
    dims = {
        "images": [3, info.input_height, info.input_width],
        "orig_target_sizes": [2],
        "labels": [k],
        "boxes": [k, 4],
        "scores": [k],
    }

    # a --target export may fix other integer dtypes (INT32 for TensorRT 8.x)
    target_dtypes = info.target.get("profile", {}).get("io_dtypes", {})
    types = {**_TRITON_TYPES, **{n: _TRITON_DTYPES[d] for n, d in target_dtypes.items()}}

    def tensor(name_: str) -> str:
        shape = ", ".join(str(d) for d in dims[name_])
        return f'  {{ name: "{name_}" data_type: {types[name_]} dims: [ {shape} ] }}'

    preferred = sorted({b for b in (info.batch_opt, info.batch_max) if b > 1}) or [info.batch_max]
    kind = "KIND_GPU" if platform == "tensorrt_plan" else options.kind
    engine = info.engine_for() if platform == "tensorrt_plan" else None  # FP16's, else the one built
    runs = engine.file if engine is not None else info.graphs[Precision.FP32].file
    # Triton returns the top-K as the graph gives it: its clients read each class's threshold here
    chosen = info.chosen_thresholds(runs, GATE_BACKEND)
    parameters = [
        f'parameters {{ key: "{THRESHOLD_PARAMETER}{_pbtxt_escape(name)}" '
        f'value: {{ string_value: "{chosen[name]:.4f}" }} }}'
        for name in info.class_names
        if name in chosen
    ]
    return "\n".join(
        [
            MARKER_LINE,
            f'name: "{name}"',
            f'platform: "{platform}"',
            f"max_batch_size: {info.batch_max}",
            "input [",
            ",\n".join(tensor(n) for n in ("images", "orig_target_sizes")),
            "]",
            "output [",
            ",\n".join(tensor(n) for n in ("labels", "boxes", "scores")),
            "]",
            "dynamic_batching {",
            f"  preferred_batch_size: [ {', '.join(str(b) for b in preferred)} ]",
            f"  max_queue_delay_microseconds: {options.max_queue_delay_us}",
            "}",
            f"instance_group [ {{ count: {options.instances} kind: {kind} }} ]",
            *parameters,
            "",
        ]
    )


def _pbtxt_escape(text: str) -> str:
    """`text` inside a protobuf text-format string: backslashes and double quotes escaped."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


def _schema_module_path() -> Path | None:
    """tritonclient's generated model_config_pb2.py (Triton's model_config.proto), if installed."""
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        return None
    pb2_path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    return pb2_path if pb2_path.is_file() else None


def schema_available() -> bool:
    """Whether `validate_config_text` can check against Triton's schema (tritonclient installed)."""
    return _schema_module_path() is not None


def validate_config_text(text: str):
    """Parse with Triton's own ModelConfig schema (tritonclient's model_config_pb2), strictly.

    Returns the parsed message, or None when tritonclient is not installed (`schema_available`;
    `write_repository` says so). Unknown fields, bad enum values and malformed text raise ExportError.
    """
    pb2_path = _schema_module_path()
    if pb2_path is None:
        return None
    # Loaded by path: tritonclient.grpc's __init__ insists on grpcio, which the schema does not need.
    module_spec = importlib.util.spec_from_file_location("_triton_model_config_pb2", pb2_path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    from google.protobuf import text_format

    message = module.ModelConfig()
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        raise ExportError(f"config.pbtxt does not match Triton's ModelConfig schema: {exc}") from exc
    return message


def _model_names(options: TritonSettings, engine: bool) -> list[str]:
    return [f"{options.prefix}_onnx"] + ([f"{options.prefix}_trt"] if engine else [])


def check_repository(
    repository: str | Path, options: TritonSettings = TritonSettings(), *, engine: bool, force: bool
) -> None:
    """Refuse, before any work, a model folder of the repository that we may not replace."""
    for name in _model_names(options, engine):
        claim_folder(Path(repository) / name, MODEL_FOLDER, option="--triton", force=force, error=ExportError)


def write_repository(
    artifact: str | Path,
    repository: str | Path,
    options: TritonSettings = TritonSettings(),
    *,
    force: bool = False,
) -> list[Path]:
    """Write (or with force, replace) the repository's model folders; returns their paths."""
    artifact, repository = Path(artifact), Path(repository)
    info = read_artifact(artifact)
    sources = [("onnxruntime_onnx", artifact / info.graphs[Precision.FP32].file, "model.onnx")]
    engine = info.engine_for()  # the FP16 engine, else the one precision built (ENGINE_FILES' order)
    if engine is not None:
        sources.append(("tensorrt_plan", artifact / engine.file, "model.plan"))
    models = [(name, *source) for name, source in zip(_model_names(options, True), sources)]
    for _, _, source, _ in models:
        verify_file(artifact, info, source.name)
    check_repository(repository, options, engine=engine is not None, force=force)
    written = []
    if not schema_available():
        log.warning(
            "%s not checked against Triton's ModelConfig schema: tritonclient is not installed "
            "(pip install tritonclient, or the dev extra)",
            CONFIG_NAME,
        )
    for name, platform, source, target in models:
        final = repository / name
        with replacing(final, MODEL_FOLDER, option="--triton", force=force, error=ExportError) as staging:
            (staging / "1").mkdir()
            text = config_text(info, name=name, platform=platform, options=options)
            validate_config_text(text)
            (staging / CONFIG_NAME).write_text(text)
            shutil.copyfile(source, staging / "1" / target)
            share_folder(staging)  # Triton's container reads it as another user, whatever our umask
        written.append(final)
    stale = repository / f"{options.prefix}_trt"
    if engine is None and MODEL_FOLDER.is_ours(stale):
        log.info("left %s, an earlier export's engine: this artifact has none to replace it", stale)
    return written
