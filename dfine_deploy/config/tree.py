"""Generic YAML loading: `__include__`, `-u a.b=c` overrides and where each key came from.

The rules are the official D-FINE loader's (`src/core/yaml_utils.py` in
https://github.com/Peterande/D-FINE): `__include__` paths are relative to the file that names them,
includes merge in list order and the including file last, dicts merge deep while lists and scalars
are replaced, and overrides come last with YAML-typed values. Unlike the official loader there is no
shared mutable default and no `yaml.load`. Nothing here knows the D-FINE layout (see `layout.py`).
"""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from dfine_deploy.errors import ConfigError
from dfine_deploy.text_files import load_yaml, yaml_problem

OVERRIDE_ORIGIN = "-u"  # provenance of values given on the command line
KeyPath = tuple[str, ...]


def dotted(path: KeyPath) -> str:
    return ".".join(path)


def _read_yaml(path: Path) -> dict:
    data = load_yaml(path, "config file", ConfigError)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path} must hold a YAML mapping (key: value lines) at the top, found a {type(data).__name__}"
        )
    return data


def _merge(
    dst: dict, src: Mapping, origin_of: Callable[[str], str], provenance: dict[str, str], prefix: KeyPath = ()
) -> None:
    """Deep-merge `src` into `dst` (dicts merge, everything else replaces), recording origins.

    `origin_of(dotted_key)` names where a key of `src` was set; `provenance` is `dst`'s record.
    """
    for key, value in src.items():
        key = str(key)
        path = prefix + (key,)
        name = dotted(path)
        if isinstance(value, Mapping) and isinstance(dst.get(key), dict):
            provenance.setdefault(name, origin_of(name))
            _merge(dst[key], value, origin_of, provenance, path)
            continue
        if key in dst:  # a replaced subtree forgets where its old children came from
            for old in [k for k in provenance if k.startswith(name + ".")]:
                del provenance[old]
        dst[key] = {} if isinstance(value, Mapping) else copy.deepcopy(value)
        provenance[name] = origin_of(name)
        if isinstance(value, Mapping):
            _merge(dst[key], value, origin_of, provenance, path)


def _read_with_includes(path: Path, chain: tuple[Path, ...]) -> tuple[dict, dict[str, str]]:
    """Merged content of `path` and its includes (includes in order, the file itself last), with
    the file each key came from."""
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in chain + (resolved,))
        raise ConfigError(f"__include__ cycle: {cycle}")
    data = _read_yaml(path)
    includes = data.pop("__include__", None) or []
    if isinstance(includes, str):
        includes = [includes]
    if not isinstance(includes, list) or not all(isinstance(i, str) for i in includes):
        raise ConfigError(f"{path}: __include__ must be a list of file paths, found {includes!r}")
    merged: dict = {}
    provenance: dict[str, str] = {}
    for include in includes:
        target = Path(os.path.expanduser(include))
        if not target.is_absolute():
            target = path.parent / target
        target = Path(os.path.normpath(target))
        if not target.is_file():
            raise ConfigError(
                f"{path}: __include__ names '{include}', but {target} does not exist "
                "(include paths are relative to the file that names them)"
            )
        tree, origins = _read_with_includes(target, chain + (resolved,))
        _merge(merged, tree, lambda key, o=origins, t=str(target): o.get(key, t), provenance)
    _merge(merged, data, lambda _key: str(path), provenance)
    return merged, provenance


def parse_override(text: str) -> tuple[KeyPath, Any]:
    """`a.b.c=value` → (('a', 'b', 'c'), YAML-typed value); `x=[1, 2]` gives a list."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if not sep or not key or any(not part for part in key.split(".")):
        raise ConfigError(
            f"override '{text}' is not of the form key.sub=value (e.g. -u epochs=12 "
            "or -u train_dataloader.total_batch_size=16)"
        )
    try:
        parsed = yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ConfigError(f"override '{text}': the value is not valid YAML: {yaml_problem(exc)}") from None
    return tuple(key.split(".")), parsed


def add_overrides_option(parser: argparse.ArgumentParser, help: str) -> None:
    """-u/--update KEY=VALUE ...: the official tools' config overrides (train.py's -u), each checked
    by `parse_override` when the command line is parsed."""
    parser.add_argument(
        "-u", "--update", nargs="+", default=[], type=_override_argument, metavar="KEY=VALUE", help=help
    )


def _override_argument(text: str) -> str:
    try:
        parse_override(text)
    except ConfigError as exc:
        # -u takes every word after it: `dfine-info -u epochs=12 dfine-n` reads the model as an override
        raise argparse.ArgumentTypeError(
            f"{exc}; -u reads every word after it, so a model or file written after its values is taken "
            "as one of them: write it before -u"
        ) from None
    return text


def _apply_override(raw: dict, path: KeyPath, value: Any, provenance: dict[str, str], text: str) -> None:
    node = raw
    for depth, part in enumerate(path[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = dotted(path[: depth + 1])
            raise ConfigError(
                f"override '{text}': '{where}' holds a {type(child).__name__}, not a mapping, "
                "so it has no sub-keys"
            )
        provenance.setdefault(dotted(path[: depth + 1]), f"{OVERRIDE_ORIGIN} {text}")
        node = child
    _merge(node, {path[-1]: value}, lambda _key: f"{OVERRIDE_ORIGIN} {text}", provenance, path[:-1])


def load_tree(path: Path, overrides: Sequence[str] = ()) -> tuple[dict, dict[str, str]]:
    """The merged content of `path`, its includes and `overrides`, with the origin of each dotted key."""
    raw, provenance = _read_with_includes(path, ())
    for text in overrides:
        key_path, value = parse_override(text)
        _apply_override(raw, key_path, value, provenance, text)
    return raw, provenance


def all_paths(node: Mapping, prefix: KeyPath = ()) -> Iterator[str]:
    """Every dotted key of a nested mapping, parents before children."""
    for key, value in node.items():
        path = prefix + (str(key),)
        yield dotted(path)
        if isinstance(value, Mapping):
            yield from all_paths(value, path)


class ConfigTree:
    """A merged YAML tree (`raw`) and the file, or `-u`, that set each key: all that the readers and
    checks of a config need (`reader`, `layout`, `builders`); `core.Config` adds the typed settings."""

    def __init__(self, raw: dict, *, source: str, provenance: Mapping[str, str] | None = None):
        self.raw = raw
        self.source = source
        self.provenance = (
            dict(provenance) if provenance is not None else dict.fromkeys(all_paths(raw), source)
        )

    def origin(self, path: Sequence[str]) -> str:
        """'from <file>' / 'from -u a.b=c' for a dotted key (or its nearest set ancestor)."""
        path = tuple(path)
        while path:
            origin = self.provenance.get(dotted(path))
            if origin:
                return f"from {origin}"
            path = path[:-1]
        return f"from {self.source}"
