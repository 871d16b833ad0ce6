"""Class heads carried over by name when `-t` starts a run on another class set.

Every class of the new dataset whose name matches a class of the source checkpoint starts from the
source's rows in every class-dependent tensor (`model/weights.py` `CLASS_HEAD_PATTERN`: the encoder
and every decoder layer's score head, weight and bias, and the denoising class embedding, whose last
row is its padding row); the other classes keep the model's fresh initialisation.

A new class takes the first source class that matches, in this order:
1. the same name;
2. the same name ignoring case, spaces, underscores and hyphens ("Potted Plant" = "potted_plant");
3. a synonym (`synonym_groups`): PASCAL VOC's names of COCO classes, and the COCO <-> Objects365
   pairs of the official `obj365_ids` table (off with `--no-obj365-remap`).
An explicit file (`--head-map`) maps new names to source names, or to null (start fresh), before all
of that.

The source's names: our checkpoints carry them (`meta['class_names']`); an official file carries none,
so 80 classes are read as COCO's and 366 as Objects365's (`class_names.default_class_names`). A
file with another class count names no classes: its rows are taken by position when the counts agree
(what official loaders do), else every class starts fresh.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from dfine_deploy.class_names import OBJECTS365_CLASSES, coco_names, default_class_names, objects365_names
from dfine_deploy.errors import CheckpointError, ConfigError
from dfine_deploy.model.weights import CLASS_HEAD_PATTERN, DENOISING_EMBED, LoadReport
from dfine_deploy.text_files import load_yaml_or_json

# COCO contiguous label (0..79) -> Objects365 label - 1: the official `obj365_ids` (src/solver/_solver.py,
# github.com/Peterande/D-FINE at 4a1f73a). An Objects365 head has 366 outputs (label = category id
# 1..365, output 0 unused), so COCO label i is row OBJ365_IDS[i] + 1.
OBJ365_IDS = (
    0, 46, 5, 58, 114, 55, 116, 65, 21, 40, 176, 127, 249, 24, 56, 139, 92, 78, 99, 96,
    144, 295, 178, 180, 38, 39, 13, 43, 120, 219, 148, 173, 165, 154, 137, 113, 145, 146, 204, 8,
    35, 10, 88, 84, 93, 26, 112, 82, 265, 104, 141, 152, 234, 143, 150, 97, 2, 50, 25, 75,
    98, 153, 37, 73, 115, 132, 106, 61, 163, 134, 277, 81, 133, 18, 94, 30, 169, 70, 328, 226,
)  # fmt: skip

# PASCAL VOC's names of the classes COCO names otherwise: the VOC 2012 class list (VOCdevkit,
# host.robots.ox.ac.uk/pascal/VOC/voc2012) beside COCO's (class_name_tables/coco.json).
VOC_TO_COCO = {
    "aeroplane": "airplane",
    "diningtable": "dining table",
    "motorbike": "motorcycle",
    "pottedplant": "potted plant",
    "sofa": "couch",
    "tvmonitor": "tv",
}
SCORE_HEAD = "decoder.enc_score_head.weight"  # its rows say how many classes a file has


def normalise(name: str) -> str:
    """The name compared in step 2: case-folded, without spaces, underscores and hyphens."""
    return re.sub(r"[\s_\-]+", "", name.casefold())


def synonym_groups(obj365_table: bool = True) -> dict[str, int]:
    """Normalised name -> synonym group: VOC's renames, and with `obj365_table` the COCO name and the
    Objects365 name of every `OBJ365_IDS` pair (e.g. 'tv' ~ 'Monitor/TV' ~ 'tvmonitor')."""
    pairs = list(VOC_TO_COCO.items())
    if obj365_table:
        pairs += [(coco, objects365_names()[row]) for coco, row in zip(coco_names(), OBJ365_IDS)]
    group: dict[str, int] = {}
    for a, b in pairs:
        a, b = normalise(a), normalise(b)
        if a == b:
            continue
        ga, gb = group.get(a), group.get(b)
        if ga is None and gb is None:
            group[a] = group[b] = len(group)
        elif gb is None:
            group[b] = ga
        elif ga is None:
            group[a] = gb
        elif ga != gb:  # join two groups
            group.update({k: ga for k, v in group.items() if v == gb})
    return group


@dataclass(frozen=True)
class SourceClasses:
    """The class of each row of a checkpoint's class heads, and where the names come from."""

    names: tuple[str, ...]
    origin: str
    named: bool  # False: the file names no classes (class_<i> placeholders)


@dataclass(frozen=True)
class HeadMatch:
    """One class of the new model: the source row it starts from (None: fresh) and why."""

    label: int
    name: str
    source_row: int | None
    source_name: str | None
    how: str  # exact | case/space | synonym | head-map | position | new


def source_classes(meta: Mapping[str, Any], state_dict: Mapping[str, torch.Tensor]) -> SourceClasses | None:
    """The classes of a checkpoint's head rows; None for a file without class heads."""
    head = state_dict.get(SCORE_HEAD)
    if head is None:
        return None
    rows = int(head.shape[0])
    carried = meta.get("class_names")
    if isinstance(carried, Sequence) and not isinstance(carried, str) and len(carried) == rows:
        return SourceClasses(tuple(str(n) for n in carried), "the checkpoint's class names", True)
    assumed = default_class_names(rows)
    named = rows in (len(coco_names()), OBJECTS365_CLASSES)
    return SourceClasses(tuple(assumed.names), assumed.note, named)


def match_heads(
    target: Sequence[tuple[int, str]],
    source: SourceClasses,
    *,
    head_map: Mapping[str, str | None] | None = None,
    obj365_table: bool = True,
) -> list[HeadMatch]:
    """Each (label, name) of the new model with its source row (see the module docstring)."""
    head_map = head_map or {}
    if not source.named and not head_map:
        same = len(target) == len(source.names) and [lab for lab, _ in target] == list(range(len(target)))
        return [
            HeadMatch(lab, name, lab, source.names[lab], "position")
            if same
            else HeadMatch(lab, name, None, None, "new")
            for lab, name in target
        ]
    exact = {}
    loose: dict[str, int] = {}
    for row, name in enumerate(source.names):
        exact.setdefault(name, row)
        loose.setdefault(normalise(name), row)
    groups = synonym_groups(obj365_table)
    by_group: dict[int, int] = {}
    for key, row in sorted(loose.items(), key=lambda item: item[1]):
        if key in groups:
            by_group.setdefault(groups[key], row)
    matches = []
    for label, name in target:
        row, how = None, "new"
        if name in head_map:
            chosen = head_map[name]
            row, how = (exact[chosen], "head-map") if chosen is not None else (None, "new")
        elif name in exact:
            row, how = exact[name], "exact"
        elif normalise(name) in loose:
            row, how = loose[normalise(name)], "case/space"
        elif groups.get(normalise(name)) in by_group:
            row, how = by_group[groups[normalise(name)]], "synonym"
        matches.append(HeadMatch(label, name, row, source.names[row] if row is not None else None, how))
    return matches


def _nearest(value: str, choices: Sequence[str]) -> str:
    near = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    if near:
        return f"; did you mean '{near[0]}'?"
    shown = ", ".join(repr(c) for c in list(choices)[:8])
    return f"; they are {shown}{', ...' if len(choices) > 8 else ''}"


def read_head_map(
    path: str | os.PathLike, target_names: Sequence[str], source: SourceClasses
) -> dict[str, str | None]:
    """`--head-map FILE`: a YAML or JSON mapping {new class: source class or null}, checked by name."""
    path = Path(path)
    where = f"--head-map {path}"
    data = load_yaml_or_json(path, "--head-map", ConfigError)
    if not isinstance(data, Mapping) or not data:
        raise ConfigError(
            f"{where}: expected a mapping 'new class: source class' (or null to start it fresh), "
            f"found {type(data).__name__}"
        )
    mapping: dict[str, str | None] = {}
    for key, value in data.items():
        key = str(key)
        if key not in target_names:
            raise ConfigError(f"{where}: '{key}' is not a class of the dataset{_nearest(key, target_names)}")
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{where}: '{key}': give a source class name or null, not {value!r}")
        if value is not None and value not in source.names:
            raise ConfigError(
                f"{where}: '{key}: {value}': '{value}' is not a class of the source checkpoint "
                f"({source.origin}){_nearest(value, source.names)}"
            )
        mapping[key] = value
    return mapping


def transfer_rows(
    source_state: Mapping[str, torch.Tensor],
    model_state: Mapping[str, torch.Tensor],
    matches: Sequence[HeadMatch],
) -> dict[str, torch.Tensor]:
    """The class-head tensors the model loads: its fresh rows, with each matched class's rows copied
    from the source (the denoising embedding's padding row from the source's padding row)."""
    pairs = [(m.label, m.source_row) for m in matches if m.source_row is not None]
    source_rows = int(source_state[SCORE_HEAD].shape[0])
    out = {}
    for key, fresh in model_state.items():
        if not CLASS_HEAD_PATTERN.match(key) or key not in source_state:
            continue
        value = source_state[key]
        padding = key == DENOISING_EMBED
        if value.shape[0] != source_rows + padding or value.shape[1:] != fresh.shape[1:]:
            raise CheckpointError(
                f"class head '{key}' has shape {list(value.shape)} in the file, but {source_rows} classes "
                f"({list(fresh.shape[1:])} per row here) were expected: the file's class heads disagree"
            )
        tensor = fresh.detach().clone()
        rows = pairs + ([(fresh.shape[0] - 1, source_rows)] if padding else [])
        if rows:
            dst, src = zip(*rows)
            tensor[list(dst)] = value[list(src)].to(tensor.dtype)
        out[key] = tensor
    return out


def heads_table(matches: Sequence[HeadMatch], source: SourceClasses, path: str) -> str:
    """The printed mapping: one line per class, new class <- source class (row), or 'new'."""
    width = max([len(m.name) for m in matches] + [9])
    lines = [f"class heads from {path} ({len(source.names)} classes: {source.origin}):"]
    lines.append(f"  {'label':>5}  {'new class':<{width}}  <- source class (row)")
    for m in matches:
        origin = f"<- {m.source_name} ({m.source_row})  [{m.how}]" if m.source_row is not None else "new"
        lines.append(f"  {m.label:>5}  {m.name:<{width}}  {origin}")
    carried = sum(m.source_row is not None for m in matches)
    lines.append(
        f"  {carried} of {len(matches)} classes start from the source's rows, {len(matches) - carried} new"
    )
    return "\n".join(lines)


@dataclass
class HeadTransfer:
    """What `load_tuning_weights` did: the load report, the source classes and the mapping."""

    report: LoadReport
    source: SourceClasses | None
    matches: list[HeadMatch]

    def meta(self) -> dict[str, Any]:
        """The record a checkpoint keeps in meta['class_heads']."""
        return {
            "source": self.report.source,
            "source_classes": len(self.source.names) if self.source else None,
            "source_names": self.source.origin if self.source else None,
            "rows": [asdict(m) for m in self.matches],
        }


def load_tuning_weights(
    model: nn.Module,
    path: str | os.PathLike,
    target: Sequence[tuple[int, str]],
    *,
    head_map: str | os.PathLike | None = None,
    obj365_table: bool = True,
) -> HeadTransfer:
    """`-t`: the checkpoint's weights (EMA when present), class heads carried over by name for the
    (label, name) classes of `target`; the model's other labels keep their fresh rows."""
    from dfine_deploy.hub.download import weights_path
    from dfine_deploy.model.weights import apply_state_dict, load_checkpoint

    ckpt = load_checkpoint(weights_path(str(path)))
    state = dict(ckpt.state_dict)
    source = source_classes(ckpt.meta, state)
    matches: list[HeadMatch] = []
    if source is not None:
        names = [name for _, name in target]
        chosen = read_head_map(head_map, names, source) if head_map is not None else None
        matches = match_heads(target, source, head_map=chosen, obj365_table=obj365_table)
        state.update(transfer_rows(state, model.state_dict(), matches))
    elif head_map is not None:
        raise ConfigError(f"--head-map {head_map}: {path} has no class heads to map from")
    report = apply_state_dict(model, state, source=str(path))
    return HeadTransfer(report, source, matches)
