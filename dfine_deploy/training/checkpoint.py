"""The training checkpoint: schema, atomic writes, resume and weights-only loading.

    model                 weights (official key names; what `-t` and official loaders read)
    ema                   {module: EMA weights, updates: n, decay, warmups}
    optimizer             AdamW state
    lr_scheduler          the schedule's settings and where it stands (informative: the lr is a
                          pure function of step and epoch, see optim.LRSchedule)
    lr_warmup_scheduler   warm-up length and steps done (informative, likewise)
    scaler                GradScaler state (CUDA AMP) or None
    last_epoch            the last *finished* epoch (-1 before the first)
    step                  optimizer steps taken so far
    rng                   python / numpy / torch / cuda generator states (rank 0)
    best_ap, history, nonfinite_total   the run's progress (`Progress`)
    meta                  schema_version, size, model_spec, class_names, class_map, input_size,
                          config (resolved), versions, data (what loading fixed and skipped),
                          class_heads (-t: each class's source row, `heads.py`)

Every write goes to a temporary file in the same folder, is fsynced and renamed over the target,
so a crash (even SIGKILL mid-write) leaves either the old file or the new one, never a half file.
"""

from __future__ import annotations

import math
import os
import platform
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dfine_deploy.errors import CheckpointError, TrainingError
from dfine_deploy.files import atomic_write
from dfine_deploy.model.reference import models_in_folder
from dfine_deploy.model.weights import DENOISING_EMBED, read_torch_file

SCHEMA_VERSION = 1
LAST_NAME = "last.pth"
BEST_NAME = "best.pth"
REQUIRED_RESUME_KEYS = ("model", "optimizer", "lr_scheduler", "last_epoch", "step")


def versions() -> dict[str, str]:
    import torchvision

    from dfine_deploy import __version__ as ours

    # plain str: torch.__version__ is a TorchVersion, which weights-only loading refuses
    return {
        "dfine_deploy": str(ours),
        "torch": str(torch.__version__),
        "torchvision": str(torchvision.__version__),
        "python": platform.python_version(),
        "numpy": str(np.__version__),
    }


def build_meta(
    *,
    model_spec: Any,
    class_names: Sequence[str],
    class_map: Any = None,
    config: dict[str, Any] | None = None,
    data: dict[str, Any] | None = None,
    class_heads: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything a later stage needs to rebuild the model without the training config.
    `data`: per split, what loading fixed and skipped (`ValidationReport.counts_dict`); `class_heads`:
    with -t, where each class's head rows came from (`heads.HeadTransfer.meta`)."""
    spec = asdict(model_spec) if is_dataclass(model_spec) else dict(model_spec)
    if class_map is not None and hasattr(class_map, "to_dict"):
        class_map = class_map.to_dict()
    return {
        "schema_version": SCHEMA_VERSION,
        "size": spec.get("size"),
        "model_spec": spec,
        "class_names": list(class_names),
        "class_map": class_map,
        "input_size": list(spec.get("eval_spatial_size") or ()),
        "config": config or {},
        "data": data or {},
        "versions": versions(),
    } | ({"class_heads": class_heads} if class_heads else {})


def capture_rng() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any] | None) -> None:
    if not state:
        return
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def atomic_torch_save(obj: Any, path: str | os.PathLike) -> None:
    """torch.save that never leaves half a checkpoint behind (see `atomic_write`). A write that fails
    raises its OSError (ENOSPC, EFBIG, ...), not the zip writer's RuntimeError ('unexpected pos')
    that torch.save turns it into."""

    def save(fh: Any) -> None:
        recorder = _WriteErrors(fh)
        try:
            torch.save(obj, recorder)
        except RuntimeError:
            if recorder.error is not None:
                raise recorder.error from None
            raise

    atomic_write(path, save)


class _WriteErrors:
    """A file wrapper that remembers the OSError of a failed write (see `atomic_torch_save`)."""

    def __init__(self, fh: Any):
        self.fh = fh
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.fh.write(data)
        except OSError as exc:
            self.error = exc
            raise

    def flush(self) -> None:
        self.fh.flush()


def atomic_copy(source: str | os.PathLike, target: str | os.PathLike) -> None:
    """Publish an already-written checkpoint under another name, atomically and without a second
    serialisation: hard-link it to a temp name, then rename (a copy where links are refused).
    The link keeps its content when `source` is later replaced, since os.replace swaps inodes."""
    source, target = Path(source), Path(target)
    tmp = target.parent / f".{target.name}.{os.getpid()}.link.tmp"
    if tmp.exists():
        tmp.unlink()
    try:
        try:
            os.link(source, tmp)
        except OSError:
            import shutil

            shutil.copyfile(source, tmp)
        os.replace(tmp, target)
    except BaseException:  # a copy cut short (disk full) must not stay behind
        tmp.unlink(missing_ok=True)
        raise


def load_training_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """Read one of our own checkpoints for `-r` / auto-resume; clear errors for anything else."""
    path = Path(path)
    if path.is_dir():  # a run's folder: resuming takes its last.pth
        inside = models_in_folder(path, first="last.")
        raise CheckpointError(f"{path} is a folder, not a checkpoint file{inside}")
    if not path.is_file():
        raise CheckpointError(f"{path}: no such checkpoint; check the -r path or the output folder")
    try:
        state = read_torch_file(path)  # weights-only: resuming never runs code from a file
    except CheckpointError as exc:
        raise CheckpointError(
            f"{exc} To resume, use another checkpointNNNN.pth in the same folder."
        ) from None
    missing = [k for k in REQUIRED_RESUME_KEYS if k not in state] if isinstance(state, dict) else ["<dict>"]
    if missing:
        raise CheckpointError(
            f"{path}: not a full training checkpoint (missing {', '.join(missing)}); "
            "to start a new run from its weights use -t instead of -r"
        )
    return state


@dataclass
class Progress:
    """What the run has done so far; saved in every checkpoint and restored on resume."""

    start_epoch: int = 0  # the next epoch to train
    step: int = 0  # optimizer steps taken
    best_ap: float = -math.inf
    history: list[dict[str, Any]] = field(default_factory=list)  # one EpochRecord per finished epoch
    nonfinite_total: int = 0  # optimizer steps skipped for a non-finite loss or gradient


def training_state(
    *,
    model: torch.nn.Module,
    ema: Any,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    epoch: int,
    progress: Progress,
    schedule: Any,
    meta: dict[str, Any],
) -> dict[str, Any]:
    """The checkpoint dict after finishing `epoch` (layout in the module docstring)."""
    return {
        "model": model.state_dict(),
        "ema": ema.state_dict() if ema is not None else None,
        "optimizer": optimizer.state_dict(),
        "lr_scheduler": {**asdict(schedule), "last_epoch": epoch},
        "lr_warmup_scheduler": {"warmup_duration": schedule.warmup_steps, "step_count": progress.step},
        "scaler": scaler.state_dict() if scaler is not None else None,
        "last_epoch": epoch,
        "step": progress.step,
        "rng": capture_rng(),
        "best_ap": progress.best_ap,
        "history": progress.history,
        "nonfinite_total": progress.nonfinite_total,
        "meta": meta,
    }


def restore_training_state(
    state: dict[str, Any],
    *,
    model: torch.nn.Module,
    ema: Any,
    optimizer: torch.optim.Optimizer,
    scaler: Any,
    source: str | os.PathLike = "the checkpoint",
    auto: bool = False,
) -> Progress:
    """Load a `load_training_checkpoint` dict into the objects; returns the progress to continue from.
    `source` is the file, `auto` whether auto-resume found it in the output folder (not -r)."""
    check_same_run(state, model, source, auto)
    model.load_state_dict(state["model"])
    if ema is not None and state.get("ema"):
        ema.load_state_dict(state["ema"])
    try:
        optimizer.load_state_dict(state["optimizer"])
    except ValueError as exc:  # another number or size of parameter groups
        raise CheckpointError(
            f"{source}: its optimizer state does not fit this config's optimizer groups ({exc}); "
            "optimizer.params changed since the run started: resume with the run's own config, "
            f"or start a new run from its weights with -t {source}"
        ) from None
    if scaler is not None and state.get("scaler"):
        scaler.load_state_dict(state["scaler"])
    restore_rng(state.get("rng"))
    return Progress(
        start_epoch=int(state["last_epoch"]) + 1,
        step=int(state["step"]),
        best_ap=float(state.get("best_ap", -math.inf)),
        history=list(state.get("history", [])),
        nonfinite_total=int(state.get("nonfinite_total", 0)),
    )


def check_same_run(
    state: dict[str, Any], model: torch.nn.Module, source: str | os.PathLike, auto: bool
) -> None:
    """-r and auto-resume continue the run that wrote `source`; weights of another size, class count or
    input size are refused in one line (`load_state_dict` reported them in a 272-line traceback)."""
    from dfine_deploy.model.weights import describe_weights, first_difference

    own, theirs = model.state_dict(), state["model"]
    difference = first_difference(own, theirs)
    if difference is None:
        return
    what = f"{describe_weights(theirs)} vs {describe_weights(own)} in this config; {difference}"
    if auto:
        raise CheckpointError(
            f"this --output-dir ({Path(source).parent}) holds another run ({what}): give another "
            f"--output-dir for this config, and -t {source} there to fine-tune from that run's weights"
        )
    raise CheckpointError(
        f"{source} is from another run ({what}): -r continues the run that wrote it; "
        f"use -t {source} to fine-tune from its weights instead"
    )


def save_epoch_checkpoints(
    output_dir: Path, state: dict[str, Any], *, epoch: int, is_best: bool, checkpoint_freq: int
) -> None:
    """last.pth always; checkpointNNNN.pth every `checkpoint_freq` epochs; best.pth when `is_best`.
    A write that fails (disk full, folder made read-only) stops the run in one line; the file it was
    replacing is intact, since every write is atomic."""
    last = output_dir / LAST_NAME
    target = last
    try:
        atomic_torch_save(state, last)
        if checkpoint_freq and checkpoint_freq > 0 and (epoch + 1) % checkpoint_freq == 0:
            target = output_dir / f"checkpoint{epoch:04d}.pth"
            atomic_copy(last, target)
        if is_best:
            target = output_dir / BEST_NAME
            atomic_copy(last, target)
    except OSError as exc:
        if target == last:
            kept = f"{last} keeps the state saved before epoch {epoch}" if last.is_file() else "nothing saved"
        else:
            kept = f"{last} holds epoch {epoch}"
        raise TrainingError(
            f"could not write {target} after epoch {epoch} ({exc.strerror or exc}): {kept}; free space "
            "(or make the folder writable) and run the same command again to resume"
        ) from None


def find_auto_resume(output_dir: str | os.PathLike) -> Path | None:
    """`last.pth` of an earlier attempt in the same output folder, if any."""
    candidate = Path(output_dir) / LAST_NAME
    return candidate if candidate.is_file() else None


def load_finetune_weights(model: torch.nn.Module, path: str | os.PathLike):
    """Weights only (EMA if present), matched by name and shape: `--test-only -r`. Class heads of
    another class count are left fresh (`-t` carries them over by name: `training/heads.py`).
    Returns the load report and the file's class names (None when its meta names none)."""
    from dfine_deploy.model.weights import apply_state_dict, load_checkpoint

    checkpoint = load_checkpoint(path)
    names = checkpoint.meta.get("class_names")
    state = dict(checkpoint.state_dict)
    own = model.state_dict()
    if (
        DENOISING_EMBED in state
        and DENOISING_EMBED in own
        and state[DENOISING_EMBED].shape != own[DENOISING_EMBED].shape
    ):
        del state[DENOISING_EMBED]  # class-count dependent: keep the fresh embedding
    report = apply_state_dict(model, state, source=str(path))
    return report, [str(n) for n in names] if isinstance(names, list) and names else None
