"""The deploy target table: one row per `dfine-export --target` name, read by the option's choices and
help (`export/cli.py`), the checks of the options (`export/pipeline.py`), the recipes' `applies`
(`export/recipes.py`) and the sidecar's `target` record.

A row says which backend runs what it exports on the device, what it fixes in the graphs (opset,
sampler, I/O dtypes), which options it refuses and why, the tool it needs before minutes of work,
how `model.json` records it, and the sentence `--help` gives it. The TensorRT rows are the release
lines of `runtime/tensorrt_plan.py` `PROFILES` and their JetPack aliases; the Rockchip rows are the
chips rknn-toolkit2 builds for (`runtime/rknn_backend.py` `PLATFORMS`). docs/ARCHITECTURE.md,
"Adding a target", is the recipe for a new row.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dfine_deploy.backend_names import BackendName
from dfine_deploy.errors import ExportError
from dfine_deploy.export.settings import ExportSettings
from dfine_deploy.runtime import rknn_backend
from dfine_deploy.runtime.tensorrt_plan import PROFILES, TargetProfile, plan_build


@dataclass(frozen=True)
class Refusal:
    """An option a target cannot take: the line `OPTION with --target NAME: why; fix`."""

    given: Callable[[ExportSettings], str | None]  # the option as the user gave it; None: not given
    why: str
    fix: str = ""  # "" when `why` names the fix itself

    def problem(self, settings: ExportSettings, target: str) -> str | None:
        spelled = self.given(settings)
        if spelled is None:
            return None
        return f"{spelled} with --target {target}: {self.why}" + (f"; {self.fix}" if self.fix else "")


@dataclass(frozen=True)
class DeployTarget:
    """One `--target` name: everything outside its own modules needs to know about it."""

    name: str  # what --target takes
    backend: BackendName  # what runs its artifact on the device: the recipes that apply follow it
    help: str  # its --help sentence; rows that share one are listed together before it
    describe: str  # the line the export logs and prints for it
    opset: int | None = None  # the opset it fixes (None: --opset's, else the default)
    sampler: str | None = None  # the deformable sampler it fixes (None: --sampler's)
    sampler_why: str = ""  # why it fixes the sampler (the refusal says it)
    io_dtypes: Mapping[str, str] | None = None  # the graphs' interface dtypes it fixes (numpy names)
    profile: TargetProfile | None = None  # a TensorRT row's release line (parser table, build plan)
    refuses: tuple[Refusal, ...] = ()  # options it cannot take, beyond a fixed opset and sampler
    # "module:function" (imported when called, as the export's own modules import this table):
    # () -> raises ExportError, one line saying how to install it, when the tool its export runs is
    # not here; None: it needs none
    tool_check: str | None = None
    # "module:function": (ExportRun) -> model.json's `target` record of the run (it may refuse the
    # written graphs); None: the record is empty
    record: str | None = None

    def refusals(self) -> tuple[Refusal, ...]:
        """What it refuses: a different --opset or --sampler where it fixes one, then `refuses`."""
        fixed: list[Refusal] = []
        if self.opset is not None:
            fixed.append(
                Refusal(
                    lambda s, fixed=self.opset: None if s.opset in (None, fixed) else f"--opset {s.opset}",
                    f"the target fixes opset {self.opset}",
                    "drop --opset",
                )
            )
        if self.sampler is not None:
            fixed.append(
                Refusal(
                    lambda s, fixed=self.sampler: None if s.sampler == fixed else f"--sampler {s.sampler}",
                    self.sampler_why or f"the target needs the {self.sampler} sampler",
                    "drop --sampler",
                )
            )
        return (*fixed, *self.refuses)

    def check(self, settings: ExportSettings) -> None:
        """Refuse, in one line, the first option this target cannot take; then check its tool."""
        for refusal in self.refusals():
            problem = refusal.problem(settings, self.name)
            if problem is not None:
                raise ExportError(problem)
        if self.tool_check is not None:
            _function(self.tool_check)()

    def target_record(self, run: Any) -> dict[str, Any]:
        """model.json's `target` record of an export (`run`: its ExportRun, whose module reads this
        table) for this row."""
        return _function(self.record)(run) if self.record is not None else {}


def _function(spelled: str) -> Callable[..., Any]:
    module, _, name = spelled.partition(":")
    return getattr(importlib.import_module(module), name)


def _int8_refusals(profile: TargetProfile) -> tuple[Refusal, ...]:
    """--int8 where the line builds no INT8 engine (8.x: explicit quantization needs strong typing)."""
    try:
        plan_build(profile.tensorrt, int8=True)
    except ExportError as exc:
        return (Refusal(lambda s: "--int8" if s.int8 else None, str(exc)),)
    return ()


_TENSORRT_HELP = (
    "the TensorRT the engine is for (a JetPack name or a TensorRT line): fixes opset, LayerNorm form, "
    "I/O dtypes and the engine's precision plan, and checks every graph against that version's ONNX "
    "parser (docs/export.md: TensorRT)"
)
_RKNN_HELP = (
    "a Rockchip NPU: writes model.rknn (FP16; with --int8 model.int8.rknn), gated in rknn-toolkit2's "
    "simulator (its own venv: make rknn-venv; docs/export.md: Rockchip NPUs)"
)


def _tensorrt(name: str, profile: TargetProfile) -> DeployTarget:
    return DeployTarget(
        name=name,
        backend=BackendName.TENSORRT,
        help=_TENSORRT_HELP,
        describe=profile.describe(),
        opset=profile.opset,
        sampler=profile.sampler,
        sampler_why="TensorRT targets need the gather sampler (NVIDIA/TensorRT#4813)",
        io_dtypes=profile.io_dtypes,
        profile=profile,
        refuses=_int8_refusals(profile),
        record="dfine_deploy.export.sidecar:target_record",
    )


def _rknn(chip: str) -> DeployTarget:
    return DeployTarget(
        name=chip,
        backend=BackendName.RKNN,
        help=_RKNN_HELP,
        describe=f"--target {chip}: Rockchip NPU, model.rknn built by {rknn_backend.TOOLKIT} and gated in "
        "its simulator; the postprocessor runs on the board's CPU",
        refuses=(
            Refusal(
                lambda s: None if s.postprocess else "--no-postprocess",
                "the board's CPU runs the graph's own postprocessor and the gate reads its labels, boxes "
                "and scores",
                "drop --no-postprocess",
            ),
            Refusal(
                lambda s: "--trt" if s.trt else None,
                "a TensorRT engine runs on NVIDIA GPUs, not on a Rockchip NPU",
                "drop --trt",
            ),
            Refusal(
                lambda s: None if s.triton is None else "--triton",
                "Triton has no RKNN backend",
                "drop --triton",
            ),
        ),
        tool_check="dfine_deploy.export.rknn:tool_python",
    )


# the order is the order of the choices: the JetPack names, the TensorRT lines, the Rockchip chips
TARGETS: tuple[DeployTarget, ...] = (
    *(_tensorrt(alias, p) for p in PROFILES.values() for alias in p.aliases),
    *(_tensorrt(p.name, p) for p in PROFILES.values()),
    *(_rknn(chip) for chip in rknn_backend.PLATFORMS),
)


def target_names() -> tuple[str, ...]:
    """What `--target` takes, in table order."""
    return tuple(row.name for row in TARGETS)


def targets_help() -> str:
    """`--target`'s help: each help sentence after the names of the rows that share it."""
    grouped: dict[str, list[str]] = {}
    for row in TARGETS:
        grouped.setdefault(row.help, []).append(row.name)
    return ". ".join(f"{', '.join(names)}: {sentence}" for sentence, names in grouped.items())


def get_target(name: str) -> DeployTarget:
    """The row of a `--target` name; one line naming the choices for any other."""
    for row in TARGETS:
        if row.name == name:
            return row
    raise ExportError(f"--target {name}: unknown target; choose one of {', '.join(target_names())}")


def runs_on(target: DeployTarget | None, backend: BackendName) -> bool:
    """Does `backend` run what `target` exports (False without --target)? The recipes' `applies`."""
    return target is not None and target.backend == backend
