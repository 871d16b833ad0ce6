"""Class names: the one check every source of names passes, names for a model that carries none,
and the names file a user gives to override them. Torch-free and artifact-free: the config, data,
model loader, artifact and runtime layers all read names through this module.

Names enter from a `--names` file, a sidecar (model.json), a checkpoint's meta, a config, a graph's
metadata and a dataset's categories; each goes through `check_class_names`, so everything after it
(a label indexing the list, DeepStream's labels.txt with one name per line, counts per class name,
mapping a dataset's categories by name) can rely on one name per class.

An official checkpoint has no class names, only a class count. 80 classes are taken to be COCO's
and 366 Objects365's (in the label order of the official models); every place that shows names says
so with `note` (sidecar, bench, serve). `--names FILE` on any CLI that reads a model overrides both.
"""

from __future__ import annotations

import functools
import json
import unicodedata
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from dfine_deploy.errors import ConfigError, DfineError
from dfine_deploy.text_files import load_yaml_or_json, read_text

# The name tables ship as data files beside this module; each file names its source in its `source` key.
_TABLES = Path(__file__).with_name("class_name_tables")


@functools.lru_cache(maxsize=None)  # functools.cache is 3.9; the runtime runs on 3.8
def _table(name: str) -> tuple[str, ...]:
    """The `names` list of class_name_tables/<name>.json, read on first use."""
    return tuple(json.loads((_TABLES / f"{name}.json").read_text(encoding="utf-8"))["names"])


def coco_names() -> tuple[str, ...]:
    """The 80 COCO detection classes in label order: the values of `mscoco_category2name` in the
    official D-FINE source (src/data/dataset/coco_dataset.py, github.com/Peterande/D-FINE at 4a1f73a)."""
    return _table("coco")


def objects365_names() -> tuple[str, ...]:
    """Objects365 (v2) classes in the label order of the official D-FINE *_obj365 models: the (index,
    name) table in src/solver/_solver.py of github.com/Peterande/D-FINE at 4a1f73a (its `obj365_ids`
    maps COCO labels into this order, e.g. person 0, bicycle 46, car 5). The models have 366 outputs:
    label = Objects365 category id (`remap_mscoco_category: False`), so name i is output i + 1 and
    output 0 is unused (the official solver reads COCO label i from row `obj365_ids[i] + 1`)."""
    return _table("objects365")


OBJECTS365_CLASSES = 366  # the official *_obj365 models' class count


class ClassNames(NamedTuple):
    names: list[str]
    note: str  # "" when the names came with the model or from the user


def name_key(name: str) -> str:
    """A class name as names are compared everywhere: Unicode NFC, so that a name typed or stored
    decomposed (NFD: macOS file names, some editors) is the same name as its composed twin."""
    return unicodedata.normalize("NFC", name)


NAMES_RULE = "distinct, non-empty, single-line names without spaces around them, one per class in label order"


def _name_problem(index: int, name: Any) -> str | None:
    if not isinstance(name, str):
        return f"name {index} is {type(name).__name__} {name!r:.40}, not text"
    if not name.strip():
        return f"name {index} is empty"
    if name.splitlines() != [name] or any(unicodedata.category(c) == "Cc" for c in name):
        return f"name {index} {name!r:.40} has a line break or control character"
    if name != name.strip():
        return f"name {index} {name!r:.40} has spaces around it"
    return None


def check_class_names(
    names: Any,
    num_classes: int | None,
    source: str,
    fix: str,
    error: type[DfineError] = ConfigError,
) -> list[str]:
    """`names` as a list (each in `name_key` form) when it holds exactly `num_classes` (None: any
    number) distinct, non-empty, single-line names without spaces around them; else `error` in one
    line naming `source`, the first problems found and `fix`. Every place class names enter calls
    this: a label indexes the list, labels.txt and names files hold one name per line, and counts
    and dataset categories are matched by name, so each of those needs exactly one printable name
    per class."""
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
        problems = [f"is {type(names).__name__}, not a list of names"]
    else:
        problems = [p for i, n in enumerate(names) if (p := _name_problem(i, n))]
        if num_classes is not None and len(names) != num_classes:
            problems.insert(0, f"has {len(names)} names but the model has {num_classes} classes")
        first: dict[str, int] = {}
        for i, n in enumerate(names):
            if isinstance(n, str) and name_key(n) in first:
                problems.append(f"{n!r:.40} is given twice (names {first[name_key(n)]} and {i})")
            elif isinstance(n, str):
                first[name_key(n)] = i
    if not problems:
        return [name_key(n) for n in names]
    more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
    count = f"{num_classes} " if num_classes is not None else ""
    raise error(f"{source}: {'; '.join(problems[:3])}{more}; class names must be {count}{NAMES_RULE}: {fix}")


def default_class_names(num_classes: int) -> ClassNames:
    """Names assumed from the class count alone: COCO for 80, Objects365 for 366, else `class_<i>`."""
    if num_classes == len(coco_names()):
        return ClassNames(list(coco_names()), "names assumed from the class count: 80 = COCO")
    if num_classes == OBJECTS365_CLASSES:
        names = ["class_0", *objects365_names()]  # output 0 has no category (ids start at 1)
        return ClassNames(names, "names assumed from the class count: 366 = Objects365")
    return ClassNames([f"class_{i}" for i in range(num_classes)], "the model names no classes: class_<index>")


def model_class_names(
    carried: Sequence[str] | None,
    num_classes: int | None,
    source: str,
    *,
    names_file: str | Path | None = None,
    note: str = "",
    error: type[DfineError] = ConfigError,
) -> ClassNames:
    """The names a model runs with, whatever it was opened from: a names file first (checked against
    the class count), else the names the model carries (`carried`, from `source`; checked), else names
    assumed from its class count. `num_classes` None: the count is unknown (a bare engine, or a graph
    without a D-FINE class head); the names file then sets it."""
    if names_file is not None:
        return ClassNames(read_names_file(names_file, num_classes), "")
    if carried is not None:
        fix = "give the right names with --names FILE (one per line), or fix where they came from"
        return ClassNames(check_class_names(carried, num_classes, source, fix, error), note)
    if num_classes is not None:
        return default_class_names(num_classes)
    return ClassNames(
        list(coco_names()),
        "the model names no classes and its class count is unknown: COCO's 80 names assumed",
    )


def read_names_file(path: str | Path, num_classes: int | None = None) -> list[str]:
    """Class names from a file: one per line (.txt), a JSON list, or YAML (a list, or a `names:` list
    or {index: name} mapping as in a YOLO data.yaml). Its length must equal the model's class count."""
    path = Path(path)
    if path.suffix.lower() in (".json", ".yaml", ".yml"):
        data = load_yaml_or_json(path, "--names", ConfigError)
        if isinstance(data, dict) and "names" in data:
            data = data["names"]
        if isinstance(data, dict):
            keys = sorted(data, key=lambda k: int(k)) if all(str(k).isdigit() for k in data) else None
            if keys is None or [int(k) for k in keys] != list(range(len(keys))):
                raise ConfigError(f"--names {path}: a mapping must have the keys 0..N-1")
            data = [data[k] for k in keys]
        if not isinstance(data, list):
            raise ConfigError(
                f"--names {path}: expected a list of names (or `names:`), found {type(data).__name__}"
            )
        names = [str(n) if isinstance(n, (int, float)) else n for n in data]  # a YAML 7 is the name "7"
    else:  # one name per "\n" line, as labels.txt readers split it; blank lines are spacing
        text = read_text(path, "--names", ConfigError)
        names = [line.strip() for line in text.split("\n") if line.strip()]
    if not names:
        raise ConfigError(f"--names {path}: holds no names; give one name per class, in label order")
    return check_class_names(names, num_classes, f"--names {path}", "correct the file")
