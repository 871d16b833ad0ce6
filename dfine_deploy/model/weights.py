"""Weight files: read them safely, tell which model they are for, and load them with clear errors.

Accepted layouts (those the official D-FINE code and DEIM's write and read): a training checkpoint
(`ckpt['ema']['module']` is preferred, as every official loader does; its other entries, such as
'date', 'optimizer' or 'criterion', are not read), a converted/released file (`ckpt['model']`), or a
bare state_dict; keys may carry DDP's 'module.' prefix. Keys keep the official names, so official `.pth` files
and ours are read the same way.

Files are read with `torch.load(weights_only=True)`: tensors and plain containers only, nothing
that can run code. A file that needs more is refused unless the caller opts in (`allow_pickle`).
"""

from __future__ import annotations

import math
import os
import pickle
import re
import warnings
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dfine_deploy.errors import CheckpointError
from dfine_deploy.model.reference import models_in_folder
from dfine_deploy.model.spec import HGNETV2_VARIANTS, SIZES, ModelSpec

__all__ = [
    "CLASS_HEAD_PATTERN",
    "DENOISING_EMBED",
    "DERIVED_KEYS",
    "SCORE_HEAD_PATTERN",
    "Checkpoint",
    "MASK_HEAD_PREFIXES",
    "LoadReport",
    "apply_state_dict",
    "guess_size",
    "infer_spec",
    "load_checkpoint",
    "spec_from_meta",
]

# The one list of class-count keys. Score heads: first dimension = class count (Objects365 → COCO
# fine-tuning remaps their rows). Denoising embed: classes + 1 padding row (re-initialised instead).
SCORE_HEAD_PATTERN = re.compile(r"^decoder\.(enc_score_head\.|dec_score_head\.\d+\.)")
DENOISING_EMBED = "decoder.denoising_class_embed.weight"
CLASS_HEAD_PATTERN = re.compile(rf"{SCORE_HEAD_PATTERN.pattern}|^{re.escape(DENOISING_EMBED)}$")
# Buffers computed from the input size, not learned: the model keeps its own when sizes differ.
DERIVED_KEYS = ("decoder.anchors", "decoder.valid_mask")
BATCHNORM_COUNTER = ".num_batches_tracked"  # BatchNorm2d has it, FrozenBatchNorm2d not
# The distribution head's fixed scalars (official: up 0.5, reg_scale 4): the bin values and the box
# edges divide by them, so a zero or non-finite one breaks every box the model draws.
FDR_SCALARS = ("decoder.up", "decoder.reg_scale")
# D-FINE-seg (github.com/ArgoHA/D-FINE-seg, src/d_fine/arch/dfine_decoder.py) adds an instance-mask
# head under these names to an otherwise official D-FINE; its detection part loads here, the mask
# head is set aside (masks are not exported yet).
MASK_HEAD_PREFIXES = ("decoder.mask_decoder.", "decoder.mask_head.")


@dataclass
class Checkpoint:
    """Weights read from a file, plus our `meta` when the file has one."""

    path: str
    state_dict: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)
    source_key: str = "state_dict"  # "ema.module" | "model" | "state_dict"
    set_aside: list[str] = field(default_factory=list)  # D-FINE-seg mask-head keys, not loaded


@dataclass
class LoadReport:
    """What `apply_state_dict` did, for logs and for the tests."""

    source: str
    loaded: list[str]
    reinitialised: list[str]  # class-head keys left at fresh init: other class count, or absent
    kept_derived: list[str]  # anchors/valid_mask made for the model's own input size
    checkpoint_classes: int | None
    model_classes: int | None
    kept_counters: list[str] = field(default_factory=list)  # BatchNorm counters the file lacks

    def summary(self) -> str:
        text = f"loaded {len(self.loaded)} tensors from {self.source}"
        if self.reinitialised:
            text += (
                f"; class heads re-initialised ({self.checkpoint_classes} -> "
                f"{self.model_classes} classes): {', '.join(self.reinitialised)}"
            )
        if self.kept_derived:
            text += f"; {', '.join(self.kept_derived)} regenerated for the model's input size"
        if self.kept_counters:
            text += (
                f"; {len(self.kept_counters)} BatchNorm num_batches_tracked counters are not in the file "
                "(trained with frozen BatchNorm) and start at 0"
            )
        return text


# ------------------------------------------------------------------------------------- reading


def _numpy_globals() -> list:
    """What numpy RNG states in our training checkpoints need; array rebuilding runs no code."""
    import numpy as np

    try:
        reconstruct = np._core.multiarray._reconstruct  # numpy >= 2
    except AttributeError:  # pragma: no cover - numpy 1.x
        reconstruct = np.core.multiarray._reconstruct
    return [reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


# The tools that take --allow-pickle: a refusal advises the option only where it exists.
PICKLE_OPTION = "--allow-pickle (dfine-export, dfine-info; in Python: allow_pickle=True)"
_SAFE_GLOBAL_PREFIXES = (
    "torch.",
    "collections.OrderedDict",
    "builtins.set",
    "builtins.frozenset",
    "_codecs.encode",
)


def _refused_global(exc: BaseException) -> str | None:
    """The Python name a weights-only load refused ('posix.system'), or None for other failures.

    A refused name inside `torch` means a damaged file (torch's own rebuild functions are allowed:
    a cut-off stream leaves a truncated name such as 'torch._utils._rebuild')."""
    found = re.search(r"GLOBAL ([\w.]+)", str(exc))
    if "Weights only load failed" not in str(exc) or not found:
        return None
    name = found.group(1)
    return None if name.startswith("torch.") else name


def pickled_globals(path: Path, limit: int = 3) -> list[str]:
    """The Python names (module.attr) a pickle would import, read from its opcodes without running it.

    Works on a plain pickle and on torch.save's zip (its data.pkl); torch's own names and plain
    containers are left out. Empty when the stream cannot be parsed (a damaged file)."""
    import pickletools

    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                member = next((n for n in archive.namelist() if n.endswith("data.pkl")), None)
                data = archive.read(member) if member else b""
        else:
            data = path.read_bytes()
    except (OSError, zipfile.BadZipFile):
        return []
    names: list[str] = []
    strings: list[str] = []  # the last strings pushed: STACK_GLOBAL takes module and name from them
    memo: dict[int, Any] = {}
    try:
        for op, arg, _pos in pickletools.genops(data):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE", "BINUNICODE8"):
                strings.append(arg)
            elif op.name in ("BINGET", "LONG_BINGET", "GET") and isinstance(memo.get(int(arg)), str):
                strings.append(memo[int(arg)])
            elif op.name == "MEMOIZE" and strings:
                memo[len(memo)] = strings[-1]
            elif op.name in ("BINPUT", "LONG_BINPUT", "PUT") and strings:
                memo[int(arg)] = strings[-1]
            name = None
            if op.name == "GLOBAL":
                name = str(arg).replace(" ", ".")
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                name = f"{strings[-2]}.{strings[-1]}"
            if name and not name.startswith(_SAFE_GLOBAL_PREFIXES) and name not in names:
                names.append(name)
                if len(names) >= limit:
                    break
    except (ValueError, EOFError, pickle.UnpicklingError, KeyError, IndexError):
        pass  # a damaged tail: keep what was read before it
    return names


def _refusal(path: Path, names: list[str]) -> CheckpointError:
    return CheckpointError(
        f"{path}: refused: besides tensors the file holds Python objects that loading would have to "
        f"execute (it refers to {', '.join(repr(n) for n in names)}). Load it only if you trust where it "
        f"came from, with {PICKLE_OPTION}; or re-save just its tensors with torch.save."
    )


def read_torch_file(path: Path, allow_pickle: bool = False) -> Any:
    """torch.load restricted to tensors, plain containers and numpy arrays unless `allow_pickle`;
    a refused or damaged file becomes a CheckpointError that names it (and the object it holds)."""
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        name = _refused_global(exc)
        # a plain pickle (not torch.save's zip) fails on an opcode before any name; read the names
        names = [name] if name else pickled_globals(path) if "Weights only load failed" in str(exc) else []
        if not names:
            raise _corrupt(path, exc) from None
        if not allow_pickle:
            raise _refusal(path, names) from None
    except (
        RuntimeError,
        EOFError,
        zipfile.BadZipFile,
        ValueError,
        OSError,
        KeyError,
        IndexError,
        TypeError,
        AttributeError,
    ) as exc:
        raise _corrupt(path, exc) from None
    try:  # explicitly allowed by the caller: full unpickling
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # anything here means the file is broken
        raise _corrupt(path, exc) from None


def _other_cause(path: Path, exc: BaseException) -> str:
    """Why a file torch cannot read is no damaged checkpoint, where it shows ('' where it does not):
    an ONNX graph given a .pth name, or a checkpoint a newer PyTorch wrote."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return ""
    # ModelProto starts with ir_version (field 1, varint: 0x08) and names its producer near the start
    if head[:1] == b"\x08" and (b"onnx" in head.lower() or b"pytorch" in head):
        return (
            "an ONNX graph, not a PyTorch checkpoint (renamed?): give the .pth checkpoint here; the ONNX "
            "file itself goes where a graph is taken (dfine-bench, dfine-serve, Detector.open)"
        )
    newer = re.search(
        r"file with version (\d+), but the maximum supported version for reading is (\d+)", str(exc)
    )
    if newer:
        return (
            f"written by a newer PyTorch (file format version {newer.group(1)}; torch {torch.__version__} "
            f"reads up to {newer.group(2)}): upgrade torch, or save the weights again with this version"
        )
    unknown = re.search(r"GLOBAL (torch\.[\w.]+)", str(exc))
    if unknown and zipfile.is_zipfile(path) and not _resolves(unknown.group(1)):  # whole, not cut off
        return (
            f"written by a newer PyTorch (it refers to {unknown.group(1)}, which torch {torch.__version__} "
            "lacks): upgrade torch, or save the weights again with this version"
        )
    return ""


def _resolves(dotted: str) -> bool:
    """Whether a name such as 'torch._utils._rebuild_tensor_v2' exists in this torch."""
    import importlib

    module, _, attr = dotted.rpartition(".")
    try:
        return hasattr(importlib.import_module(module), attr)
    except ImportError:
        return False


def _corrupt(path: Path, exc: BaseException) -> CheckpointError:
    cause = _other_cause(path, exc)
    if cause:
        return CheckpointError(f"{path}: {cause}")
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if "weights_only" in detail:  # torch's text advises turning the safety off: never repeat it
        detail = "not a tensor-only checkpoint"
    return CheckpointError(
        f"{path}: truncated or not a PyTorch checkpoint ({type(exc).__name__}: {detail[:200]}). "
        "Download or copy the file again."
    )


def _is_state_dict(obj: Any) -> bool:
    return (
        isinstance(obj, Mapping)
        and bool(obj)
        and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items())
    )


def load_checkpoint(path: str | os.PathLike, *, allow_pickle: bool = False) -> Checkpoint:
    """Read a `.pth` file: EMA weights if present, else `model`, else a bare state_dict."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint not found: {path}")
    if not path.is_file():
        raise CheckpointError(f"{path} is a folder, not a checkpoint file (.pth){models_in_folder(path)}")
    obj = read_torch_file(path, allow_pickle)
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"{path}: expected a dict (a checkpoint or a state_dict), found {type(obj).__name__}"
        )
    ema = obj.get("ema")
    if isinstance(ema, Mapping) and _is_state_dict(ema.get("module")):
        weights, source_key = ema["module"], "ema.module"
    elif _is_state_dict(obj.get("model")):
        weights, source_key = obj["model"], "model"
    elif _is_state_dict(obj):
        weights, source_key = obj, "state_dict"
    else:
        keys = ", ".join(map(str, list(obj)[:12]))
        raise CheckpointError(
            f"{path}: no weights found. Expected 'ema': {{'module': ...}}, 'model', or a bare "
            f"state_dict of tensors; the file's top-level keys are: {keys}"
        )
    meta = obj.get("meta") if source_key != "state_dict" else None
    state_dict = _strip_prefix(dict(weights), "module.")
    set_aside = [k for k in state_dict if k.startswith(MASK_HEAD_PREFIXES)]
    if set_aside:
        warnings.warn(
            f"{path}: a D-FINE-seg checkpoint; its detection part is loaded and its mask head "
            f"({len(set_aside)} tensors under {' and '.join(MASK_HEAD_PREFIXES)}) is set aside: "
            "boxes and classes only",
            UserWarning,
            stacklevel=2,
        )
        state_dict = {k: v for k, v in state_dict.items() if k not in set_aside}
    return Checkpoint(
        path=str(path),
        state_dict=state_dict,
        meta=dict(meta) if isinstance(meta, Mapping) else {},
        source_key=source_key,
        set_aside=set_aside,
    )


def _strip_prefix(state_dict: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """DataParallel/DDP-wrapped saves prefix every key with 'module.'."""
    if state_dict and all(k.startswith(prefix) for k in state_dict):
        return {k[len(prefix) :]: v for k, v in state_dict.items()}
    return state_dict


# ------------------------------------------------------------------------------------ inferring


def _signature(stem: int, hidden: int, layers: int, levels: int) -> str:
    return f"stem {stem} channels, hidden dim {hidden}, {layers} decoder layers, {levels} levels"


def _size_signatures() -> dict[str, tuple[int, int, int, int]]:
    # stem_channels[1] is what `backbone.stem.stem1.conv.weight` outputs.
    return {
        name: (
            HGNETV2_VARIANTS[s.backbone.name].stem_channels[1],
            s.encoder.hidden_dim,
            s.decoder.num_layers,
            len(s.encoder.in_channels),
        )
        for name, s in SIZES.items()
    }


def _decoder_layers(state_dict: Mapping[str, torch.Tensor]) -> set[int]:
    return {int(m.group(1)) for k in state_dict if (m := re.match(r"decoder\.decoder\.layers\.(\d+)\.", k))}


def _signature_of(state_dict: Mapping[str, torch.Tensor]) -> tuple[int, int, int, int] | None:
    stem = state_dict.get("backbone.stem.stem1.conv.weight")
    proj = state_dict.get("encoder.input_proj.0.conv.weight")
    if stem is None or proj is None or stem.dim() != 4 or proj.dim() != 4:
        return None
    layers = _decoder_layers(state_dict)
    levels = {int(m.group(1)) for k in state_dict if (m := re.match(r"encoder\.input_proj\.(\d+)\.", k))}
    return stem.shape[0], proj.shape[0], len(layers), len(levels)


def guess_size(state_dict: Mapping[str, torch.Tensor]) -> str | None:
    """'n'..'x' when the tensors have an official size's signature, else None."""
    signature = _signature_of(state_dict)
    for name, expected in _size_signatures().items():
        if signature == expected:
            return name
    return None


# Shapes that tell the ECDet sizes apart: ViT width and MLP width, adapter output, encoder/decoder width
# and feed-forward widths, decoder layers.
_ECDET_SIGNATURE_KEYS = (
    ("backbone.backbone.register_token", -1),
    ("backbone.backbone.blocks.0.mlp.fc1.weight", 0),
    ("backbone.projector.0.conv.weight", 0),
    ("decoder.enc_score_head.weight", 1),
    ("encoder.encoder.0.layers.0.linear1.weight", 0),
    ("decoder.decoder.layers.0.linear1.weight", 0),
)


def _ecdet_signature_of(state_dict: Mapping[str, torch.Tensor]) -> tuple[int, ...] | None:
    if any(key not in state_dict for key, _ in _ECDET_SIGNATURE_KEYS):
        return None
    layers = _decoder_layers(state_dict)
    return (*(int(state_dict[key].shape[dim]) for key, dim in _ECDET_SIGNATURE_KEYS), len(layers))


def _ecdet_spec(state_dict: Mapping[str, torch.Tensor], source: str) -> ModelSpec:
    """The ECDet size whose shapes the file has (EdgeCrafter's own files, e.g. ecdet_s.pth)."""
    from dfine_deploy.model.ecdet_spec import ECDET_SIZES

    found = _ecdet_signature_of(state_dict)
    for spec in ECDET_SIZES.values():
        vit, enc, dec = spec.backbone, spec.encoder, spec.decoder
        expected = (
            vit.embed_dim,
            int(vit.embed_dim * vit.ffn_ratio),
            vit.out_channels,
            dec.hidden_dim,
            enc.dim_feedforward,
            dec.dim_feedforward,
            dec.num_layers,
        )
        if found == expected:
            return spec
    raise CheckpointError(
        f"{source}: an EdgeCrafter ViT backbone, but its shapes {found} match no ECDet size "
        f"({', '.join('ecdet-' + n for n in ECDET_SIZES)}); only the official sizes are built"
    )


def infer_spec(state_dict: Mapping[str, torch.Tensor], *, source: str = "state_dict") -> ModelSpec:
    """The ModelSpec of an official-size state_dict (D-FINE, or EdgeCrafter's ECDet): size, class
    count and trained input size."""
    size = guess_size(state_dict)
    if size is None and "backbone.backbone.register_token" in state_dict:
        spec = _ecdet_spec(state_dict, source)
    elif size is None:
        found = _signature_of(state_dict)
        known = "; ".join(f"dfine-{n}: {_signature(*sig)}" for n, sig in _size_signatures().items())
        raise CheckpointError(
            f"{source}: the weights do not match any official D-FINE size "
            f"(found: {_signature(*found) if found else 'no D-FINE backbone/encoder keys'}; "
            f"expected one of {known}). Give a config file (-c) that describes this model."
        )
    else:
        spec = SIZES[size]
    head = state_dict.get("decoder.enc_score_head.weight")
    if head is not None:
        spec = spec.with_classes(int(head.shape[0]))
    side = _square_side(state_dict.get("decoder.anchors"), spec)
    if side is not None:
        spec = spec.with_input_size(side, side)
    return spec


def _square_side(anchors: torch.Tensor | None, spec: ModelSpec) -> int | None:
    """Side of the square input that gives this many anchors, when there is one."""
    if anchors is None or anchors.dim() != 3:
        return None
    per_pixel = sum(1.0 / (s * s) for s in spec.decoder.feat_strides)  # anchors / (H * W)
    side = round(math.sqrt(anchors.shape[1] / per_pixel))
    counts = sum(math.ceil(side / s) ** 2 for s in spec.decoder.feat_strides)
    return side if side % 32 == 0 and counts == anchors.shape[1] else None


# -------------------------------------------------------------------------------------- loading


def _model_classes(model_state: Mapping[str, torch.Tensor]) -> int | None:
    head = model_state.get("decoder.enc_score_head.weight")
    return int(head.shape[0]) if head is not None else None


def describe_weights(state_dict: Mapping[str, torch.Tensor]) -> str:
    """'dfine-n, 4 classes' (or 'a custom architecture, ...'): what a state dict is, for messages."""
    size = guess_size(state_dict)
    classes = _model_classes(state_dict)
    return f"{f'dfine-{size}' if size else 'a custom architecture'}, {classes if classes else '?'} classes"


def first_difference(own: Mapping[str, torch.Tensor], other: Mapping[str, torch.Tensor]) -> str | None:
    """The first key whose presence or shape differs between two state dicts, in words; None when
    they have the same keys and shapes (so `load_state_dict` takes one into the other)."""
    for key, target in own.items():
        if key not in other:
            return f"'{key}' is not in the file"
        if tuple(other[key].shape) != tuple(target.shape):
            return f"'{key}' has shape {list(other[key].shape)} in the file, {list(target.shape)} here"
    extra = [key for key in other if key not in own]
    return f"the file has {len(extra)} weights this model does not: {_listing(extra)}" if extra else None


def _listing(keys: list[str], limit: int = 8) -> str:
    shown = ", ".join(keys[:limit])
    return shown + (f" ... ({len(keys)} in all)" if len(keys) > limit else "")


def apply_state_dict(model: nn.Module, state_dict: Mapping[str, torch.Tensor], *, source: str) -> LoadReport:
    """Load official-named weights into `model`: strict on names and shapes, except class heads
    (a different class count re-initialises them) and input-size-derived anchors."""
    own = model.state_dict()
    model_size = guess_size(own)
    file_size = guess_size(state_dict)

    def looks_like() -> str:
        if file_size is None:
            return "it does not look like any official D-FINE size"
        return f"the file looks like dfine-{file_size}" + (
            f", the model is dfine-{model_size}" if model_size else ""
        )

    reinitialised, kept_derived, to_load = [], [], {}
    for key, target in own.items():
        if key not in state_dict:
            continue
        value = state_dict[key]
        if tuple(value.shape) == tuple(target.shape):
            to_load[key] = value
        elif key in DERIVED_KEYS:
            kept_derived.append(key)
        elif CLASS_HEAD_PATTERN.match(key) and value.shape[1:] == target.shape[1:]:
            reinitialised.append(key)
        else:
            raise CheckpointError(
                f"{source}: weights do not fit this model. First mismatching key '{key}': "
                f"shape {list(value.shape)} in the file, {list(target.shape)} in the model; "
                f"{looks_like()}. Use the matching size or config."
            )
    missing = [k for k in own if k not in state_dict and k not in DERIVED_KEYS]
    # A file trained with frozen BatchNorm (FrozenBatchNorm2d has no counter) into BatchNorm that
    # trains, e.g. DEIM's Objects365 D-FINE-X fine-tuned with DEIM's COCO config: the counters only
    # count steps, so they start at 0 and are reported.
    kept_counters = [k for k in missing if k.endswith(BATCHNORM_COUNTER)]
    missing = [k for k in missing if not k.endswith(BATCHNORM_COUNTER)]
    # A file without (some) class heads, e.g. one whose heads were dropped for a new class set,
    # still loads: those heads keep their fresh initialisation and are reported.
    reinitialised += [k for k in missing if CLASS_HEAD_PATTERN.match(k)]
    missing = [k for k in missing if not CLASS_HEAD_PATTERN.match(k)]
    if missing:
        raise CheckpointError(
            f"{source}: {len(missing)} weights of the model are missing from the file: "
            f"{_listing(missing)}; {looks_like()}. The file is incomplete or for another model."
        )
    unexpected = [k for k in state_dict if k not in own]
    if unexpected and all(k.startswith("backbone.") and k.endswith(BATCHNORM_COUNTER) for k in unexpected):
        raise CheckpointError(
            f"{source}: the file's backbone BatchNorm was trained ({len(unexpected)} num_batches_tracked "
            f"counters), this model's is frozen; {looks_like()}. DEIM's D-FINE checkpoints are such files, "
            "and they also need SiLU in the decoder: load them with configs/deim/deim_hgnetv2_<size>_coco.yml"
            " (for your own D-FINE run, set HGNetv2.freeze_norm: False)"
        )
    if unexpected:
        raise CheckpointError(
            f"{source}: the file has {len(unexpected)} weights this model does not: "
            f"{_listing(unexpected)}; {looks_like()}. "
            "(A deploy()-converted model cannot take training weights: load before deploy().)"
        )
    for key in FDR_SCALARS:
        value = to_load.get(key)
        if value is not None and not bool(torch.isfinite(value.double()).all() and (value != 0).all()):
            raise CheckpointError(
                f"{source}: {key} is {value.flatten().tolist()}; D-FINE needs a finite, non-zero value "
                "(the official weights hold up 0.5 and reg_scale 4). The file was edited or damaged: "
                "use the original checkpoint"
            )
    # copy_ casts, so the official int64 reg_scale loads into a float parameter and vice versa.
    result = model.load_state_dict(to_load, strict=False)
    assert not result.unexpected_keys, result.unexpected_keys  # filtered above
    head = state_dict.get("decoder.enc_score_head.weight")
    return LoadReport(
        source=source,
        loaded=sorted(to_load),
        reinitialised=reinitialised,
        kept_derived=kept_derived,
        checkpoint_classes=int(head.shape[0]) if head is not None else None,
        model_classes=_model_classes(own),
        kept_counters=kept_counters,
    )


def spec_from_meta(meta: Mapping[str, Any], *, source: str) -> ModelSpec | None:
    """Rebuild the ModelSpec our checkpoints store in meta['model_spec'] (asdict form)."""
    from dfine_deploy.model.spec import BackboneSpec, DecoderSpec, EncoderSpec

    stored = meta.get("model_spec")
    if not isinstance(stored, Mapping):
        return None

    def part(cls, data: Any):
        if not isinstance(data, Mapping):
            raise CheckpointError(f"{source}: meta['model_spec'] is malformed ({cls.__name__})")
        fields = cls.__dataclass_fields__
        unknown = [k for k in data if k not in fields]
        if unknown:
            raise CheckpointError(
                f"{source}: meta['model_spec'] has fields this version does not know: "
                f"{', '.join(unknown)}; upgrade dfine-deploy"
            )
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    top = {k: v for k, v in stored.items() if k not in ("backbone", "encoder", "decoder")}
    spec = part(
        ModelSpec,
        {
            **top,
            "backbone": part(BackboneSpec, stored.get("backbone")),
            "encoder": part(EncoderSpec, stored.get("encoder")),
            "decoder": part(DecoderSpec, stored.get("decoder")),
        },
    )
    return replace(spec, eval_spatial_size=tuple(spec.eval_spatial_size))
