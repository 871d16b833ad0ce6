"""The one place where dataset category ids meet the model's contiguous labels.

Half of the official repository's custom-data issues are class-id confusion, so the mapping is an
explicit object that is printed at start, saved in checkpoints and used to map predictions back:

- ``remap=True`` (``remap_mscoco_category``): categories sorted by id get labels 0..K-1.
- ``remap=False``: the raw category id *is* the label, so ``num_classes`` must exceed the largest id
  (a label >= num_classes makes the matcher index out of range deep inside training).
- ``ClassMap.for_model``: a trained model scored on a dataset (dfine-bench --data, the export gate):
  each category gets the label of the model's class of the same name, whatever the dataset's ids
  or their order, since the model's names say what each label means and a count of categories
  does not (ids 1..5 read as 0..4 scored a 0.53 model at 0.035).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from dfine_deploy.class_names import check_class_names, name_key
from dfine_deploy.errors import DatasetError


@dataclass(frozen=True)
class ClassMap:
    """Dataset category id <-> contiguous label <-> name.

    ``category_ids`` and ``names`` are parallel, sorted by category id.
    """

    category_ids: tuple[int, ...]
    names: tuple[str, ...]
    remap: bool
    num_classes: int
    # the label of each category, given (ClassMap.for_model: by the model's class names); empty: `remap`
    given_labels: tuple[int, ...] = ()
    _label_of: dict[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.category_ids) != len(self.names):
            raise DatasetError(
                f"class map: {len(self.category_ids)} category ids but {len(self.names)} names; "
                "each category needs exactly one name"
            )
        if len(set(self.category_ids)) != len(self.category_ids):
            raise DatasetError(f"class map: duplicate category ids in {list(self.category_ids)}")
        if list(self.category_ids) != sorted(self.category_ids):
            raise DatasetError("class map: category ids must be sorted (use ClassMap.from_categories)")
        if any(c < 0 for c in self.category_ids):
            raise DatasetError(f"class map: negative category id in {list(self.category_ids)}")
        fix = "rename them in the annotation file (or in the config's class_names)"
        check_class_names(self.names, None, "dataset categories (by id)", fix, DatasetError)
        if self.given_labels:
            labels = self.given_labels
            if len(labels) != len(self.category_ids) or len(set(labels)) != len(labels) or min(labels) < 0:
                raise DatasetError(
                    f"class map: given labels {list(labels)} must be distinct, >= 0 and one per category"
                )
            needed = max(labels) + 1
            rule = "the labels follow the model's class names"
        elif self.remap:
            labels = range(len(self.category_ids))
            needed = len(self.category_ids)
            rule = f"remap_mscoco_category is True, so the {needed} categories become labels 0..{needed - 1}"
        else:
            labels = self.category_ids
            needed = (max(self.category_ids) + 1) if self.category_ids else 0
            rule = (
                "remap_mscoco_category is False, so the raw category id is the label and "
                f"num_classes must exceed the largest category id ({needed - 1})"
            )
        if self.num_classes < needed:
            raise DatasetError(
                f"num_classes is {self.num_classes} but must be at least {needed}: {rule}. "
                f"Set num_classes: {needed} in the dataset config"
                + ("" if self.remap else ", or set remap_mscoco_category: True to use contiguous labels")
            )
        object.__setattr__(self, "_label_of", dict(zip(self.category_ids, labels)))

    @classmethod
    def from_categories(
        cls, categories: Iterable[Mapping[str, Any]], *, remap: bool, num_classes: int | None = None
    ) -> ClassMap:
        """Build from COCO ``categories`` entries ({id, name}); num_classes defaults to the minimum."""
        pairs = sorted((int(c["id"]), str(c.get("name", c["id"]))) for c in categories)
        ids = tuple(p[0] for p in pairs)
        names = tuple(p[1] for p in pairs)
        if num_classes is None:
            num_classes = len(ids) if remap else (max(ids) + 1 if ids else 0)
        return cls(ids, names, remap, int(num_classes))

    # ---------------------------------------------------------------- lookups
    def label_of(self, category_id: int) -> int:
        try:
            return self._label_of[int(category_id)]
        except KeyError:
            raise DatasetError(
                f"category id {category_id} is not among the dataset's categories {list(self.category_ids)}"
            ) from None

    def labels_of(self, category_ids: np.ndarray) -> np.ndarray:
        """Vectorised ``label_of`` for an int array."""
        return np.array([self.label_of(c) for c in np.asarray(category_ids).tolist()], dtype=np.int64)

    def category_ids_of(self, labels: np.ndarray) -> np.ndarray:
        """Map model labels back to category ids; a label with no category maps to -1."""
        labels = np.asarray(labels, dtype=np.int64)
        table = np.full(max(self.num_classes, 1), -1, dtype=np.int64)  # label -> category id
        table[list(self.labels)] = self.category_ids
        valid = (labels >= 0) & (labels < self.num_classes)
        return np.where(valid, table[np.clip(labels, 0, len(table) - 1)], -1)

    @property
    def labels(self) -> tuple[int, ...]:
        return tuple(self._label_of[c] for c in self.category_ids)

    @property
    def class_names(self) -> list[str]:
        """One name per model output index (length num_classes); unused indices get 'class_<i>'."""
        out = [f"class_{i}" for i in range(self.num_classes)]
        for label, name in zip(self.labels, self.names):
            out[label] = name
        return out

    # ---------------------------------------------------------------- output
    def table(self) -> str:
        """Printable mapping table: category id, label, name."""
        header = f"{'category_id':>11}  {'label':>5}  name"
        rows = [f"{c:>11}  {lab:>5}  {n}" for c, lab, n in zip(self.category_ids, self.labels, self.names)]
        mode = (
            "the model's class of the same name"
            if self.given_labels
            else "contiguous (remap_mscoco_category)"
            if self.remap
            else "raw category id"
        )
        footer = f"{len(self.category_ids)} categories, labels = {mode}, num_classes = {self.num_classes}"
        return "\n".join([header, *rows, footer])

    def to_dict(self) -> dict[str, Any]:
        data = {
            "category_ids": list(self.category_ids),
            "names": list(self.names),
            "remap": self.remap,
            "num_classes": self.num_classes,
        }
        return data | ({"given_labels": list(self.given_labels)} if self.given_labels else {})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ClassMap:
        try:
            return cls(
                tuple(int(c) for c in data["category_ids"]),
                tuple(str(n) for n in data["names"]),
                bool(data["remap"]),
                int(data["num_classes"]),
                tuple(int(label) for label in data.get("given_labels", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise DatasetError(
                f"class map dict is malformed ({exc!r}); "
                "expected keys category_ids, names, remap, num_classes"
            ) from None

    @classmethod
    def for_model(
        cls,
        categories: Iterable[Mapping[str, Any]],
        model_names: Sequence[str],
        *,
        names_note: str = "",
        fix: str = "give the model's names in label order with --names FILE, or rename the categories",
    ) -> ClassMatch:
        """Map a dataset's categories onto a model's labels by name, with one line saying how.

        Every category must be one of the model's class names (compared as `name_key` compares them:
        exactly, once both are in Unicode NFC); predicted labels
        the dataset has no category for are left out of its score. A model that names its classes
        and a dataset with other names are refused: the score would be of the wrong classes. Only
        when the model's names were assumed from its class count (`names_note`, e.g. an official
        checkpoint) do the categories fall back to the count rule (sorted by id when there are as
        many categories as classes, else the raw id), and the line says so."""
        by_id = cls.from_categories(categories, remap=True)
        label_of = {name_key(name): label for label, name in enumerate(model_names)}
        missing = [name for name in by_id.names if name_key(name) not in label_of]
        count = len(model_names)
        if not missing:
            labels = tuple(label_of[name_key(name)] for name in by_id.names)
            matched = cls(by_id.category_ids, by_id.names, False, count, labels)
            line = f"classes: {len(labels)} categories matched by name to the model's {count} classes"
            return ClassMatch(matched, line, by_name=True)
        listed = ", ".join(repr(n) for n in missing[:5]) + (", ..." if len(missing) > 5 else "")
        theirs = ", ".join(repr(n) for n in model_names[:5]) + (", ..." if count > 5 else "")
        if not names_note:
            raise DatasetError(
                f"{len(missing)} of the {len(by_id.names)} categories ({listed}) are not among the model's "
                f"{count} class names ({theirs}; compared exactly, in Unicode NFC), so no label could be "
                "scored as them; " + fix
            )
        remap = len(by_id.names) == count
        ids = by_id.category_ids
        fallback = cls.from_categories(
            categories, remap=remap, num_classes=count if remap else max(count, max(ids) + 1)
        )
        rule = "sorted by id to labels 0..K-1" if remap else "category id = label"
        line = (
            f"classes: {len(missing)} of {len(ids)} categories ({listed}) are not among the model's "
            f"class names ({names_note}), so categories are matched by count ({rule}); give the "
            "model's real names with --names FILE to match them by name"
        )
        return ClassMatch(fallback, line, by_name=False)


class ClassMatch(NamedTuple):
    """`ClassMap.for_model`'s answer: the map, the line to print, and whether names decided it."""

    class_map: ClassMap
    line: str
    by_name: bool


def meet_by_name(
    categories: Sequence[Mapping[str, Any]], names: Sequence[str], what: str, fix: str
) -> tuple[ClassMap, list[str]]:
    """The categories of `what` on the labels of `names` (a model's or the train split's classes), by
    name: other names are refused in one line (with `fix`); when their ids list them in another
    order than the labels, the lines say so and hold the table of what meets what."""
    try:
        match = ClassMap.for_model(categories, names, fix=fix)
    except DatasetError as exc:
        raise DatasetError(f"{what}: {exc}") from None
    labels = list(match.class_map.labels)
    if labels == sorted(labels):
        return match.class_map, []
    head = f"classes: {what} lists its categories in another order than the model's labels; remapped by name:"
    return match.class_map, [head, match.class_map.table()]


def read_renames(path: str | os.PathLike, option: str = "--class-map") -> dict[str, str]:
    """A YAML or JSON file {dataset category name: model class name}: what `rename_categories` applies."""
    from dfine_deploy.text_files import load_yaml_or_json

    data = load_yaml_or_json(path, option, DatasetError)
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise DatasetError(
            f"{option} {path}: expected a mapping of names, {{dataset category name: model class name}}, "
            f"found {data!r:.80}"
        )
    first: dict[str, str] = {}  # by name_key: the key as the file first wrote it
    for key in data:
        if name_key(key) in first:
            raise DatasetError(
                f"{option} {path}: {key!r} and {first[name_key(key)]!r} are one name (the same letters, "
                "one written decomposed in Unicode); give each category once"
            )
        first[name_key(key)] = key
    return data


def rename_categories(
    categories: list[dict[str, Any]], renames: Mapping[str, str], source: str, option: str
) -> list[str]:
    """Give the categories named in `renames` their new names, in place (the model's names they meet
    by name, as `name_key` compares names); a name of `renames` that is no category is refused.
    Returns the line that says so."""
    names = [c["name"] for c in categories]
    keys = {name_key(n) for n in names}
    unknown = [n for n in renames if name_key(n) not in keys]
    if unknown:
        raise DatasetError(
            f"{option}: {unknown[0]!r} is no category of {source} (its categories: "
            f"{', '.join(repr(n) for n in names[:8])}); correct the file"
        )
    by_key = {name_key(old): new for old, new in renames.items()}
    for category in categories:
        category["name"] = by_key.get(name_key(category["name"]), category["name"])
    shown = ", ".join(f"{old!r} as {new!r}" for old, new in renames.items())
    return [f"classes: {source}: {option} reads {shown}"]
