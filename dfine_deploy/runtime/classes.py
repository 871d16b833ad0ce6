"""Class names read from what the runtime opens: a sidecar's, a graph's own metadata, or the count
of a graph's class head. The rules every name passes live in `dfine_deploy.class_names`.
"""

from __future__ import annotations

import ast
from pathlib import Path

from dfine_deploy.artifact import SIDECAR_NAME, ArtifactInfo
from dfine_deploy.class_names import ClassNames, model_class_names
from dfine_deploy.errors import BackendError

# An exported D-FINE graph keeps its parameter names; this bias has one entry per class.
SCORE_HEAD_BIAS = "decoder.enc_score_head.bias"


def graph_class_count(path: str | Path) -> int | None:
    """The class count of an ONNX graph, read from the D-FINE class head's bias; None for a graph
    without one, or when the `onnx` package (an export dependency) is not installed."""
    try:
        import onnx
    except ImportError:
        return None
    graph = onnx.load(str(path), load_external_data=False).graph
    for tensor in graph.initializer:
        if tensor.name.endswith(SCORE_HEAD_BIAS) and len(tensor.dims) == 1:
            return int(tensor.dims[0])
    return None


def graph_class_names(
    graph: Path, artifact: ArtifactInfo | None, metadata: dict[str, str], names_file: str | Path | None
) -> ClassNames:
    """The names a graph or engine runs with, the same on every backend: the sidecar's, else the
    graph's own metadata (Ultralytics keeps them there), else names assumed from its class head's
    size. A names file overrides them and must fit the class count the model is known to have."""
    if artifact is not None:
        return model_class_names(
            artifact.class_names,
            artifact.num_classes,
            f"{graph.parent / SIDECAR_NAME} class_names",
            names_file=names_file,
            note=artifact.class_names_note,
            error=BackendError,
        )
    carried = None if names_file is not None else names_from_metadata(metadata, str(graph))
    count = graph_class_count(graph) if graph.suffix == ".onnx" else None
    if count is None and carried is not None:
        count = len(carried)  # the graph's own names say how many classes it has
    return model_class_names(
        carried, count, f"{graph}: metadata 'names'", names_file=names_file, error=BackendError
    )


def names_from_metadata(metadata: dict[str, str], source: str) -> list | None:
    """Class names stored in the graph under 'names': a JSON/Python list, or a {index: name} dict
    with the keys 0..N-1; None when there are none. Anything else is refused, not guessed."""
    raw = metadata.get("names")
    if not raw:
        return None
    try:
        value = ast.literal_eval(raw)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        value = None
    if isinstance(value, dict):
        by_index = {int(k): v for k, v in value.items() if str(k).isdigit()}
        value = (
            [by_index[i] for i in range(len(value))] if sorted(by_index) == list(range(len(value))) else None
        )
    if not isinstance(value, (list, tuple)):
        raise BackendError(
            f"{source}: its metadata 'names' ({raw[:60]!r}) is not a list of names or a dict with "
            "the keys 0..N-1; give the names with --names FILE (one per line, in label order)"
        )
    return list(value)
