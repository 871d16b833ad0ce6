"""A Triton Inference Server model repository for an artifact folder.

    REPO/
      dfine_onnx/config.pbtxt   platform onnxruntime_onnx   1/model.onnx
      dfine_trt/config.pbtxt    platform tensorrt_plan      1/model.plan   (only when an engine exists)

`max_batch_size` > 0 means Triton owns the batch dimension: `dims` leave it out, and the graph
(dynamic N) or the engine (profile max >= max_batch_size) must accept it. The dynamic batcher
merges single-image requests from many clients into those batches.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from dfine_deploy.artifact import ArtifactInfo, read_artifact, verify_file
from dfine_deploy.errors import ExportError

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
    return "\n".join(
        [
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
            "",
        ]
    )


def validate_config_text(text: str):
    """Parse with Triton's own ModelConfig schema (tritonclient's model_config_pb2), strictly.

    Returns the parsed message, or None when tritonclient is not installed. Unknown fields, bad
    enum values and malformed text raise ExportError.
    """
    spec = importlib.util.find_spec("tritonclient")
    if spec is None or not spec.submodule_search_locations:
        return None
    pb2_path = Path(next(iter(spec.submodule_search_locations))) / "grpc" / "model_config_pb2.py"
    if not pb2_path.is_file():
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
    models = [
        (f"{options.prefix}_onnx", "onnxruntime_onnx", artifact / info.graphs["fp32"].file, "model.onnx")
    ]
    if info.engine is not None:
        models.append((f"{options.prefix}_trt", "tensorrt_plan", artifact / info.engine.file, "model.plan"))
    for _, _, source, _ in models:
        verify_file(artifact, info, source.name)
    try:
        repository.mkdir(parents=True, exist_ok=True)
        staging_root = tempfile.mkdtemp(dir=repository, prefix=".dfine-")
    except OSError as exc:
        raise ExportError(
            f"--triton {repository}: cannot write there ({exc}); choose a writable folder"
        ) from exc
    written = []
    try:
        for name, platform, source, target in models:
            final = repository / name
            if final.exists() and not force:
                raise ExportError(f"{final} exists; pass --force to replace it")
            staging = Path(staging_root) / name
            (staging / "1").mkdir(parents=True)
            text = config_text(info, name=name, platform=platform, options=options)
            validate_config_text(text)
            (staging / "config.pbtxt").write_text(text)
            shutil.copyfile(source, staging / "1" / target)
            if final.exists():
                shutil.rmtree(final)
            os.replace(staging, final)
            written.append(final)
    finally:
        shutil.rmtree(staging_root, ignore_errors=True)
    return written
