"""`RunSettings`: what the `dfine-train` command line decides for one run (`training.cli`,
`train/main.py`); everything else comes from the config. `training.trainer` runs them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# The smoke test's size (training/smoke.py), here so that `dfine-train --help` names it without torch
SMOKE_STEPS = 30
SHARE_OF_RUN = 10  # by default, only runs of at least this many times SMOKE_STEPS optimizer steps


@dataclass
class RunSettings:
    """What the command line decides; everything else comes from the config."""

    config: str
    resume: str | None = None  # -r: full state
    tuning: str | None = None  # -t: weights only, class heads carried over by name (training/heads.py)
    head_map: str | None = None  # -t: a YAML/JSON {new class: source class or null} that overrides the names
    class_map: str | None = None  # a YAML/JSON {val category name: model class name} where the names differ
    use_amp: bool | None = None  # None: the config's use_amp
    seed: int | None = None
    updates: list[str] = field(default_factory=list)
    test_only: bool = False
    output_dir: str | None = None
    summary_dir: str | None = None
    auto_batch: bool = False
    accumulate: int | None = None  # micro-batches per optimizer step; None: the config's `accumulate`
    device: str | None = None
    freeze_bn: bool = False  # BatchNorm uses running statistics (tiny per-rank batches)
    lr_reference_batch: int | None = None  # linear LR scaling: lr was tuned for this global batch
    max_nonfinite: int = 5  # consecutive skipped steps before the run stops
    obj365_remap: bool = True  # -t: COCO <-> Objects365 names of the official obj365_ids table match
    progress: bool = True
    smoke: str = "auto"  # only (--smoke: the smoke test alone) | auto (before a long enough run) | off
    alarm_after: float = 0.25  # share of the epochs after which validation AP50 near 0 raises the alarm
    sizing: bool = True  # size the recipe's schedule to the train split (training/sizing.py)
