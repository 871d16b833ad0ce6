"""Typed reading of a merged config: every error names the key and where it was set."""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dfine_deploy.config.tree import ConfigTree, KeyPath, dotted
from dfine_deploy.errors import ConfigError


def unknown_choice(
    cfg: ConfigTree, key: KeyPath, what: str, value: str, choices: Sequence[str]
) -> ConfigError:
    """The error for a name that is not one of `choices`: where it came from, and the nearest valid name."""
    near = difflib.get_close_matches(value, list(choices), n=1, cutoff=0.6)
    hint = f" (did you mean '{near[0]}'?)" if near else ""
    return ConfigError(
        f"'{dotted(key)}' ({cfg.origin(key)}): unknown {what} '{value}'; "
        f"expected one of {', '.join(choices)}{hint}"
    )


class Reader:
    """Typed access to the merged dict; every error names the key and where it was set."""

    def __init__(self, cfg: ConfigTree):
        self.cfg = cfg

    def node(self, *path: str) -> Any:
        node: Any = self.cfg.raw
        for part in path:
            if isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            elif isinstance(node, Mapping) and part in node:
                node = node[part]
            else:
                return None
        return node

    def has(self, *path: str) -> bool:
        return self.node(*path) is not None

    def fail(self, path: KeyPath, expected: str, value: Any) -> ConfigError:
        return ConfigError(f"'{dotted(path)}' ({self.cfg.origin(path)}) must be {expected}; found {value!r}")

    def fields(self, cls: type, keys: Mapping[str, KeyPath]) -> dict[str, Any]:
        """The fields of dataclass `cls` named in `keys` (field -> key path) that the config sets, each
        read as its annotated type. Fields left out keep the dataclass default: defaults live there only."""
        types = {f.name: str(f.type) for f in dataclasses.fields(cls)}
        return {
            name: self.value(path, _KIND_OF_TYPE[types[name].removesuffix(" | None")])
            for name, path in keys.items()
            if self.has(*path)
        }

    def value(self, path: KeyPath, kind: str, default: Any = None) -> Any:
        """Read a leaf as `kind`: bool, int, float, str, ints, floats, strs, or any (null: default)."""
        value = self.node(*path)
        if value is None:
            return default
        convert = _CONVERTERS[kind]
        try:
            return convert(value)
        except (TypeError, ValueError):
            raise self.fail(path, _EXPECTED[kind], value) from None


def _to_bool(v: Any) -> bool:
    if isinstance(v, bool):
        return v
    raise TypeError


def _to_int(v: Any) -> int:
    if isinstance(v, bool):
        raise TypeError
    if isinstance(v, int):
        return v
    if isinstance(v, float) and v.is_integer():
        return int(v)
    raise TypeError


def _to_float(v: Any) -> float:
    """A finite number: YAML's `.nan` and `.inf` are numbers too, and none of our keys means them."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise TypeError
    return float(v)


def _to_str(v: Any) -> str:
    if isinstance(v, str):
        return v
    raise TypeError


def _seq(convert: Callable[[Any], Any]) -> Callable[[Any], tuple]:
    def inner(v: Any) -> tuple:
        if not isinstance(v, (list, tuple)):
            raise TypeError
        return tuple(convert(x) for x in v)

    return inner


_CONVERTERS = {
    "bool": _to_bool,
    "int": _to_int,
    "float": _to_float,
    "str": _to_str,
    "ints": _seq(_to_int),
    "floats": _seq(_to_float),
    "strs": _seq(_to_str),
    "any": lambda v: v,
}
_EXPECTED = {
    "bool": "true or false",
    "int": "an integer",
    "float": "a finite number",
    "str": "a string",
    "ints": "a list of integers",
    "floats": "a list of finite numbers",
    "strs": "a list of strings",
    "any": "a value",
}
# A dataclass field's annotation (as written, `X | None` stripped) -> how its YAML value is read.
_KIND_OF_TYPE = {
    "bool": "bool",
    "int": "int",
    "float": "float",
    "str": "str",
    "tuple[int, ...]": "ints",
    "tuple[float, ...]": "floats",
    "tuple[float, float]": "floats",
    "tuple[str, ...]": "strs",
    "tuple[int, int]": "ints",
}
