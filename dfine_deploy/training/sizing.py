"""Defaults sized to the dataset: the official recipes' schedule, stretched for small training sets.

The recipes in configs/dfine/ were tuned on COCO (118k images), Objects365 (1.7M) and CrowdHuman
(15k). On a few hundred images their schedule gives a handful of optimizer steps per epoch, a warm-up
longer than the run and an EMA that lags thousands of steps behind the model. The rule
(docs/fine-tuning.md, "Defaults sized to your data"):

    r = min(1, images / 10,000, median boxes per class / 1,000)     the data's size against the recipes'
    s = max(1/4, sqrt(r))                                           1 for large data: nothing changes
    epochs, strong-augmentation stop, lr milestones / flat epochs   / s      (up to 4x)
    lr warm-up (steps)                                              at most 5 % of the run's steps
    backbone lr factor (with -t only)                               x s      (pretrained features move less)
    EMA warm-up (updates)                                           at least 1/5 of the run's steps

Only values that come from the recipes (a file under configs/dfine/, or the built-in default) are
sized; a value set by -u or by a config file of your own is used as written. `--no-sizing` turns it
off. The sized values go into the config itself (their origin reads "sized to the data"), so
checkpoints, resolved_config.json and --print-config show what the run used.
"""

from __future__ import annotations

import copy
import math
import re
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dfine_deploy.config.core import Config
from dfine_deploy.config.tree import OVERRIDE_ORIGIN, dotted

RECIPES = Path(__file__).resolve().parents[2] / "configs" / "dfine"  # the official recipes
LARGE_IMAGES = 10_000
LARGE_BOXES_PER_CLASS = 1_000
MIN_FACTOR = 0.25
WARMUP_SHARE = 0.05
EMA_WARMUP_SHARE = 0.2
SIZED_ORIGIN = "sized to the data"

EPOCHS = ("epochs",)
STOP_KEYS = (
    ("train_dataloader", "dataset", "transforms", "policy", "epoch"),
    ("train_dataloader", "collate_fn", "stop_epoch"),
)
WARMUP = ("lr_warmup_scheduler", "warmup_duration")
EMA_WARMUP = ("ema", "warmups")
MILESTONES = ("lr_scheduler", "milestones")
FLAT_EPOCHS = ("lr_scheduler", "flat_epochs")
GROUPS = ("optimizer", "params")


@dataclass(frozen=True)
class DataScale:
    """The train split's size as the rule reads it."""

    images: int
    median_boxes_per_class: float

    @classmethod
    def of(cls, records: list[Any], category_ids: list[int]) -> DataScale:
        """From validated records: images kept, non-crowd boxes per category (0 for an empty one)."""
        counts = Counter()
        for rec in records:
            counts.update(rec.category_ids[~rec.iscrowd].tolist())
        per_class = [counts.get(c, 0) for c in category_ids] or [0]
        return cls(len(records), float(statistics.median(per_class)))

    @property
    def ratio(self) -> float:
        return min(1.0, self.images / LARGE_IMAGES, self.median_boxes_per_class / LARGE_BOXES_PER_CLASS)

    @property
    def factor(self) -> float:
        return max(MIN_FACTOR, math.sqrt(self.ratio))

    def describe(self) -> str:
        return f"{self.images} images, median {self.median_boxes_per_class:g} boxes per class"


@dataclass(frozen=True)
class Sized:
    """One setting: what the recipe says, what the run uses, and why."""

    name: str  # as printed
    recipe: Any
    value: Any
    origin: str  # where the value the run uses comes from

    def line(self) -> str:
        if self.origin == SIZED_ORIGIN and self.value != self.recipe:
            return f"{self.name} {_show(self.value)} (sized; recipe {_show(self.recipe)})"
        return f"{self.name} {_show(self.value)} ({self.origin})"


def is_recipe_value(cfg: Config, path: tuple[str, ...]) -> bool:
    """True when nobody but the recipes set `path`: no origin (a built-in default), or a file under
    configs/dfine/; False for -u and for any other file."""
    origin = cfg.provenance.get(dotted(path))
    if origin is None:
        return True
    if origin.startswith(OVERRIDE_ORIGIN):
        return False
    try:
        return Path(origin).resolve().is_relative_to(RECIPES)
    except (OSError, ValueError):
        return False


def _origin(cfg: Config, path: tuple[str, ...]) -> str:
    origin = cfg.provenance.get(dotted(path))
    return f"set {origin}" if origin and origin.startswith(OVERRIDE_ORIGIN) else f"set in {origin}"


def backbone_groups(patterns: list[str], parameter_names: list[str]) -> list[int]:
    """Indices of the `optimizer.params` groups that hold backbone parameters only (first match wins)."""
    from dfine_deploy.training.optim import fix_lookahead_precedence

    compiled = [re.compile(fix_lookahead_precedence(p)) for p in patterns]
    holds: dict[int, set[bool]] = {}
    for name in parameter_names:
        index = next((i for i, rx in enumerate(compiled) if rx.search(name)), None)
        if index is not None:
            holds.setdefault(index, set()).add(name.startswith("backbone."))
    return sorted(i for i, kinds in holds.items() if kinds == {True})


def size_config(
    cfg: Config,
    scale: DataScale,
    *,
    global_batch: int,
    finetuning: bool,
    parameter_names: list[str],
) -> tuple[Config, list[Sized]]:
    """The config with the rule applied to the recipe's values, and one `Sized` per setting."""
    raw = copy.deepcopy(cfg.raw)
    provenance = dict(cfg.provenance)
    train = cfg.train
    s = scale.factor if scale.ratio < 1 else 1.0
    drop_last = cfg.train_data.drop_last
    steps_per_epoch = max(1, scale.images // global_batch if drop_last else -(-scale.images // global_batch))
    out: list[Sized] = []

    def put(path: tuple[str, ...], value: Any) -> None:
        node = raw
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
        provenance[dotted(path)] = f"{SIZED_ORIGIN} ({scale.describe()})"

    def setting(name: str, paths: list[tuple[str, ...]], recipe: Any, value: Any) -> Any:
        """Size one setting unless someone but the recipes set one of its keys; returns the value."""
        mine = [p for p in paths if not is_recipe_value(cfg, p)]
        if mine:
            out.append(Sized(name, recipe, recipe, _origin(cfg, mine[0])))
            return recipe
        if value != recipe:
            for path in paths:
                put(path, value)
        out.append(Sized(name, recipe, value, SIZED_ORIGIN))
        return value

    epochs_key = ("epoches",) if "epoches" in raw and "epochs" not in raw else EPOCHS
    epochs = setting("epochs", [epochs_key], train.epochs, round(train.epochs / s))
    stretch = epochs / train.epochs
    stop = train.stop_epoch
    if stop and stop < train.epochs:  # a stop at or after the end (Objects365's 500) means "never"
        present = [p for p in STOP_KEYS if _has(raw, p)]
        setting("strong augmentation stops at epoch", present, stop, round(stop * stretch))
    sched = train.lr_scheduler
    if sched.type == "FlatCosineLR":
        setting("lr flat epochs", [FLAT_EPOCHS], sched.flat_epochs, round(sched.flat_epochs * stretch))
    else:
        milestones = list(sched.milestones)
        setting("lr milestones", [MILESTONES], milestones, [round(m * stretch) for m in milestones])
    total = epochs * steps_per_epoch
    warmup = train.lr_warmup_scheduler.warmup_duration
    short = min(warmup, math.ceil(WARMUP_SHARE * total)) if s < 1 else warmup
    setting("warm-up steps", [WARMUP], warmup, short)
    if train.use_ema:
        ema = train.ema.warmups
        longer = max(ema, math.ceil(EMA_WARMUP_SHARE * total)) if s < 1 else ema
        setting("EMA warm-up updates", [EMA_WARMUP], ema, longer)
    groups = list(train.optimizer.params)
    backbone = [i for i in backbone_groups([g.pattern for g in groups], parameter_names) if groups[i].lr]
    if backbone and finetuning:
        base = train.optimizer.lr
        recipe = round(groups[backbone[0]].lr / base, 6)
        if not is_recipe_value(cfg, GROUPS):
            out.append(Sized("backbone lr factor", recipe, recipe, _origin(cfg, GROUPS)))
        else:
            for i in backbone:
                raw["optimizer"]["params"][i]["lr"] = groups[i].lr * s
            if s < 1:
                provenance[dotted(GROUPS)] = f"{SIZED_ORIGIN} ({scale.describe()})"
            out.append(Sized("backbone lr factor", recipe, round(recipe * s, 6), SIZED_ORIGIN))
    return Config(raw, source=cfg.source, provenance=provenance), out


def _has(raw: dict, path: tuple[str, ...]) -> bool:
    node: Any = raw
    for part in path:
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def start_line(scale: DataScale, settings: list[Sized]) -> str:
    """What the run prints beside its effective settings, after "sizing: "."""
    if scale.ratio >= 1:
        head = f"{scale.describe()}, large enough for the recipe as written"
    else:
        head = f"{scale.describe()}, scale {scale.factor:.2f}"
    return f"{head}: " + ", ".join(s.line() for s in settings)


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)
