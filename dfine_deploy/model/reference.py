"""What names a model: the one classifier every CLI and `Detector.open` use (torch-free).

    dfine-n … dfine-x        an official size (also dfine_n, n): random weights, with a warning
    dfine-s-coco …           official weights by name (model/zoo.py): downloaded once into a cache
    path/to/config.yml       the architecture an official-layout config describes (.yml, .yaml)
    path/to/model.pth        a checkpoint: ours or an official one (.pth, .pt, .ckpt)
    path/to/artifact/        a folder written by dfine-export (model.json beside its graphs)
    path/to/hf-model/        a Hugging Face transformers D-FINE folder (config.json + safetensors)
    path/to/model.onnx       an ONNX graph, with or without a sidecar
    path/to/model.engine     a TensorRT engine (.engine, .plan, .trt)

Size and weights names, configs, checkpoints and transformers folders build a PyTorch model; the
other three run without torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dfine_deploy.model.spec import SIZE_NAMES, size_key
from dfine_deploy.model.zoo import weights_key

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "CONFIG_SUFFIXES",
    "ENGINE_SUFFIXES",
    "ONNX_SUFFIXES",
    "TORCH_KINDS",
    "ModelRef",
    "classify_model_ref",
    "models_in_folder",
    "model_ref_forms",
    "names_nothing",
    "size_key",
]

CONFIG_SUFFIXES = (".yml", ".yaml")
CHECKPOINT_SUFFIXES = (".pth", ".pt", ".ckpt")
ONNX_SUFFIXES = (".onnx",)
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")
RKNN_SUFFIXES = (".rknn",)
REPLAY_SUFFIXES = (".replay",)  # an engine's recorded outputs (dfine_deploy/runtime/replay_backend.py)
# the kinds that build a PyTorch model
TORCH_KINDS = ("size", "weights", "config", "checkpoint", "hf")
NAME_KINDS = ("size", "weights")  # names, not paths: nothing to find on disk
HF_CONFIG = "config.json"  # a transformers model folder's config; dfine-export's folders have model.json
SIDECAR_NAME = "model.json"  # what makes a folder an artifact folder (dfine_deploy/artifact.py)

_SUFFIX_KINDS = {
    **dict.fromkeys(CONFIG_SUFFIXES, "config"),
    **dict.fromkeys(CHECKPOINT_SUFFIXES, "checkpoint"),
    **dict.fromkeys(ONNX_SUFFIXES, "onnx"),
    **dict.fromkeys(ENGINE_SUFFIXES, "engine"),
    **dict.fromkeys(RKNN_SUFFIXES, "rknn"),
    **dict.fromkeys(REPLAY_SUFFIXES, "replay"),
}
_FORMS = {
    "size": "a size name (" + ", ".join(f"dfine-{s}" for s in SIZE_NAMES) + ")",
    "weights": "official weights by name (dfine-s-coco, dfine-s-obj365, ...; dfine-info --list-weights)",
    "config": f"a config file ({', '.join(CONFIG_SUFFIXES)})",
    "checkpoint": f"a checkpoint ({', '.join(CHECKPOINT_SUFFIXES)})",
    "hf": "a Hugging Face transformers D-FINE folder (config.json + model.safetensors)",
    "artifact": "an artifact folder (from dfine-export)",
    "onnx": "an ONNX graph (.onnx)",
    "engine": f"a TensorRT engine ({', '.join(ENGINE_SUFFIXES)})",
    "rknn": "a Rockchip NPU model (.rknn)",
    "replay": "an engine's recorded outputs (.replay)",
}


@dataclass(frozen=True)
class ModelRef:
    """A classified model reference. `kind`: size, weights, config, checkpoint, hf, artifact, onnx,
    engine, rknn, or unknown (then `exists` tells a file of another type from a name that matches
    nothing)."""

    text: str
    kind: str
    size: str | None = None  # 'n'..'x' when kind == "size"
    exists: bool = False

    @property
    def runs_on_torch(self) -> bool:
        return self.kind in TORCH_KINDS

    @property
    def is_name(self) -> bool:
        """A size or weights name: it names no file."""
        return self.kind in NAME_KINDS


def classify_model_ref(ref: str | os.PathLike) -> ModelRef:
    """Classify `ref` by its form: a known suffix first, then an existing folder, then a size name.

    Never raises and never reads a file: whoever opens it reports a missing or unreadable one.
    """
    text = str(ref)
    path = Path(text)
    kind = _SUFFIX_KINDS.get(path.suffix.lower())
    if kind is not None:
        return ModelRef(text, kind, exists=path.is_file())
    if path.is_dir():
        hf = (path / HF_CONFIG).is_file() and not (path / SIDECAR_NAME).is_file()
        return ModelRef(text, "hf" if hf else "artifact", exists=True)
    size = size_key(text)
    if size is not None:
        return ModelRef(text, "size", size=size)
    if weights_key(text) is not None:
        return ModelRef(text, "weights")
    return ModelRef(text, "unknown", exists=path.exists())


def model_ref_forms(kinds: tuple[str, ...] = tuple(_FORMS)) -> str:
    """'a size name (dfine-n, …), a config file (.yml, .yaml) or …' for error messages."""
    forms = [_FORMS[k] for k in kinds]
    return forms[0] if len(forms) == 1 else ", ".join(forms[:-1]) + " or " + forms[-1]


def models_in_folder(folder: str | os.PathLike, first: str = "best.") -> str:
    """For the error that refuses a folder where a model file is taken: '; it holds best.pth,
    last.pth: give one of those files (e.g. DIR/best.pth)', naming the model files it holds (a
    training run's folder holds checkpoints; the one whose name starts with `first` is named first:
    last.pth to resume), or '' where it holds none."""
    path = Path(folder)
    try:
        names = [p.name for p in path.iterdir() if p.suffix.lower() in _SUFFIX_KINDS and p.is_file()]
    except OSError:
        return ""
    if not names:
        return ""
    names.sort(key=lambda name: (not name.startswith(first), name))
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    example = path / names[0]
    return f"; it holds {shown}: give one of those files (e.g. {example})"


def names_nothing(ref: str, kinds: tuple[str, ...] = tuple(_FORMS)) -> str:
    """The one refusal of a model reference that names nothing, for every command: a path that is not
    there ('x/best.pth: no such file or folder; ...') or a name that is none ('dfine-q: no model has
    this name; ...'): a path because it holds a folder separator or a suffix."""
    path_like = "/" in ref or os.sep in ref or Path(ref).suffix != ""
    what = "no such file or folder" if path_like else "no model has this name"
    return f"{ref}: {what}; expected {model_ref_forms(kinds)}"
