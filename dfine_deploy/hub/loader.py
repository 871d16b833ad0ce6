"""Build the PyTorch model a name, a config file, a checkpoint or a transformers folder names
(`model/reference.py`).

A size name has random weights (a warning says so); a config too, unless `weights=` (a checkpoint,
like `-r`) is given. Our checkpoints carry their spec and class names in `meta`; official files are
recognised from their tensor shapes; an official weights name is fetched into the cache first
(`hub/download.py`); a transformers folder is converted on reading (`hub/hf.py`).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dfine_deploy.class_names import model_class_names
from dfine_deploy.errors import ModelError
from dfine_deploy.model.reference import (
    CHECKPOINT_SUFFIXES,
    CONFIG_SUFFIXES,
    HF_CONFIG,
    SIDECAR_NAME,
    TORCH_KINDS,
    classify_model_ref,
    model_ref_forms,
    models_in_folder,
    names_nothing,
)
from dfine_deploy.model.spec import ModelSpec, size_spec

if TYPE_CHECKING:  # the torch side, imported when a model is built (this module imports without torch)
    from dfine_deploy.model.dfine import DFINE
    from dfine_deploy.model.postprocess import PostProcessor
    from dfine_deploy.model.weights import LoadReport

__all__ = ["LoadedModel", "load_model", "resolve_spec"]

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    """A model ready for inference (eval mode, not yet deploy()-converted)."""

    model: DFINE
    postprocessor: PostProcessor
    spec: ModelSpec
    class_names: list[str]
    meta: dict[str, Any] = field(default_factory=dict)
    class_names_note: str = ""  # how the names were assumed when the model carries none
    ref: str = ""
    report: LoadReport | None = None  # when weights were loaded
    random_weights: bool = False
    weights_file: Path | None = None  # the file the weights came from (a cached download too)

    @property
    def name(self) -> str:
        """'dfine-n' or 'ecdet-s' for official sizes, else the file name."""
        return f"{self.spec.family}-{self.spec.size}" if self.spec.size else Path(self.ref).stem


PICKLED_KINDS = ("checkpoint", "weights")  # the references read with torch.load (--allow-pickle's)


def _kind(ref: str) -> str:
    """'size', 'config' or 'checkpoint': the model references that build a PyTorch model."""
    classified = classify_model_ref(ref)
    if classified.runs_on_torch:
        return classified.kind
    if classified.kind == "artifact" and not (Path(ref) / SIDECAR_NAME).is_file():
        inside = models_in_folder(ref)  # a training run's folder: its checkpoints
        raise ModelError(
            f"{ref}: a folder without {SIDECAR_NAME} or {HF_CONFIG}, so neither an artifact folder nor a "
            f"transformers folder{inside or f'; this command takes {model_ref_forms(TORCH_KINDS)}'}"
        )
    if classified.kind in ("artifact", "onnx", "engine"):
        raise ModelError(
            f"'{ref}' is {model_ref_forms((classified.kind,))}, which holds no PyTorch weights; this "
            f"command takes {model_ref_forms(TORCH_KINDS)}"
        )
    if classified.exists:
        raise ModelError(
            f"'{ref}' exists but is neither a config ({', '.join(CONFIG_SUFFIXES)}) nor a "
            f"checkpoint ({', '.join(CHECKPOINT_SUFFIXES)}); rename it or give another model"
        )
    from dfine_deploy.model.zoo import OFFICIAL_WEIGHTS

    near = [name for name in OFFICIAL_WEIGHTS if name.startswith(ref.strip().lower().replace("_", "-"))]
    hint = f" (official weights starting so: {', '.join(near)})" if near and ref.strip() else ""
    raise ModelError(names_nothing(ref, TORCH_KINDS) + hint)


def _class_names(
    source: str, meta: dict[str, Any], spec: ModelSpec, fallback: Any, names_file, heads_kept: bool
):
    """The names file's names, else the checkpoint's (when its class heads are the ones loaded), else a
    config's `class_names` when it lists one per class, else names assumed from the class count."""
    from dfine_deploy.errors import CheckpointError, ConfigError

    carried = meta.get("class_names") if heads_kept else None
    if carried is not None:
        where, error = f"{source}: meta class_names", CheckpointError
    elif fallback is not None and len(fallback) == spec.num_classes:
        carried, where, error = list(fallback), f"{source}: class_names", ConfigError
    else:
        where, error = source, ConfigError
    return model_class_names(carried, spec.num_classes, where, names_file=names_file, error=error)


def resolve_spec(
    ref: str,
    *,
    imgsz: tuple[int, int] | None = None,
    num_classes: int | None = None,
    allow_pickle: bool = False,
) -> ModelSpec:
    """The spec `load_model` would build, without building it (cheap for configs and sizes)."""
    kind = _kind(ref)
    if kind == "size":
        spec = size_spec(ref)
    elif kind == "config":
        from dfine_deploy.config import load_config

        spec = load_config(ref).model_spec
    else:
        spec, _, _, _ = _checkpoint_spec(ref, kind, allow_pickle)
    return _adjust(spec, imgsz, num_classes)


def _adjust(spec: ModelSpec, imgsz: tuple[int, int] | None, num_classes: int | None) -> ModelSpec:
    if imgsz is not None:
        height, width = (int(imgsz[0]), int(imgsz[1]))
        spec = spec.with_input_size(height, width)
    if num_classes is not None:
        if int(num_classes) < 1:
            raise ModelError(f"num_classes must be >= 1, got {num_classes}")
        spec = spec.with_classes(int(num_classes))
    spec.check_input_size(*spec.eval_spatial_size)
    return spec


def _checkpoint_spec(ref: str, kind: str, allow_pickle: bool):
    """(spec, state_dict, meta, file) of a checkpoint, an official weights name or a transformers folder."""
    from dfine_deploy.model.weights import infer_spec, load_checkpoint, spec_from_meta

    if kind == "hf":
        from dfine_deploy.hub.hf import read_hf_folder

        spec, state_dict, names = read_hf_folder(Path(ref))
        return spec, state_dict, {"class_names": names}, Path(ref)
    path = ref
    if kind == "weights":
        from dfine_deploy.hub.download import fetch_weights

        path = str(fetch_weights(ref))
    ckpt = load_checkpoint(path, allow_pickle=allow_pickle)
    spec = spec_from_meta(ckpt.meta, source=path) or infer_spec(ckpt.state_dict, source=path)
    return spec, ckpt.state_dict, ckpt.meta, Path(path)


def load_model(
    ref: str | os.PathLike,
    *,
    imgsz: tuple[int, int] | None = None,
    num_classes: int | None = None,
    sampler: str = "grid",
    weights: str | os.PathLike | None = None,
    allow_pickle: bool = False,
    overrides: Sequence[str] = (),
    names: str | os.PathLike | None = None,
) -> LoadedModel:
    """Build the model `ref` names, load its weights, and return it in eval mode.

    `imgsz` (H, W) rebuilds anchors for another input size (multiples of 32); `num_classes`
    re-initialises the class heads; `weights` loads a .pth into a config- or size-built model;
    `overrides` (`-u key=value`) apply to a config; `names` is a class-names file overriding the
    checkpoint's (class_names.read_names_file), one per class.
    """
    from dfine_deploy.model.families import build_model
    from dfine_deploy.model.postprocess import PostProcessor
    from dfine_deploy.model.weights import apply_state_dict, load_checkpoint

    ref = str(ref)
    kind = _kind(ref)
    if overrides and kind != "config":
        raise ModelError(
            f"-u {' '.join(overrides)}: overrides change a config file, and '{ref}' is a {kind}; "
            "give the .yml the model comes from"
        )
    if allow_pickle and weights is None and kind not in PICKLED_KINDS:
        raise ModelError(
            f"--allow-pickle: '{ref}' is {model_ref_forms((kind,))}, and no .pth file is read, so there is "
            "nothing to unpickle; leave --allow-pickle out (it would be ignored)"
        )
    meta: dict[str, Any] = {}
    state_dict = None
    names_fallback = None
    weights_file = None
    if kind == "size":
        spec = size_spec(ref)
    elif kind == "config":
        from dfine_deploy.config import load_config

        cfg = load_config(ref, overrides)
        spec = cfg.model_spec
        names_fallback = cfg.train_data.class_names
    else:
        spec, state_dict, meta, weights_file = _checkpoint_spec(ref, kind, allow_pickle)
    loaded_classes = spec.num_classes
    if weights is not None:
        if state_dict is not None:
            raise ModelError(f"'{ref}' is already a checkpoint; drop weights={weights!s}")
        ckpt = load_checkpoint(weights, allow_pickle=allow_pickle)
        state_dict, meta, weights_file = ckpt.state_dict, ckpt.meta, Path(weights)
    spec = _adjust(spec, imgsz, num_classes)

    model = build_model(spec, sampler=sampler)
    report = None
    source = str(weights) if weights is not None else ref
    if state_dict is not None:
        report = apply_state_dict(model, state_dict, source=source)
        log.info("%s", report.summary())
        if report.reinitialised:
            warnings.warn(
                f"{source}: class heads re-initialised for {spec.num_classes} classes "
                f"(the file has {report.checkpoint_classes}); class scores are meaningless until "
                "the model is fine-tuned",
                UserWarning,
                stacklevel=2,
            )
    else:
        warnings.warn(
            f"{ref}: no weights given, the model has random weights and its outputs are "
            "meaningless (use a .pth checkpoint for real detections)",
            UserWarning,
            stacklevel=2,
        )
    model.eval()
    heads_kept = spec.num_classes == loaded_classes and not (report and report.reinitialised)
    chosen = _class_names(source, meta, spec, names_fallback, names, heads_kept)
    return LoadedModel(
        model=model,
        postprocessor=PostProcessor(spec.num_classes, num_top_queries=spec.num_top_queries),
        spec=spec,
        class_names=chosen.names,
        class_names_note=chosen.note,
        meta=meta,
        ref=ref,
        report=report,
        random_weights=state_dict is None,
        weights_file=weights_file,
    )
