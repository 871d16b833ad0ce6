"""What the runtime side uses that Python 3.8 lacks, in one place.

The runtime (runtime/, bench/, serve/, artifact.py and what they import) runs on Python 3.8, the
Python of JetPack 5 (docs/install.md); the torch side needs 3.10. tests/install/test_python38.py
checks the minimum version of those modules with vermin and runs them on a 3.8 interpreter.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Iterable, Iterator
from typing import Any


def zip_strict(*iterables: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """`zip(..., strict=True)` (3.10) on every Python: ValueError when the lengths differ."""
    if sys.version_info >= (3, 10):
        return zip(*iterables, strict=True)  # novermin (only reached on 3.10+)
    return _zip_checked(*iterables)


def _zip_checked(*iterables: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    sentinel = object()
    iterators = [iter(it) for it in iterables]
    while True:
        items = [next(it, sentinel) for it in iterators]
        done = [item is sentinel for item in items]
        if all(done):
            return
        if any(done):
            raise ValueError("zip_strict: the iterables have different lengths")
        yield tuple(items)


def remove_prefix(text: str, prefix: str) -> str:
    """`str.removeprefix` (3.9)."""
    return text[len(prefix) :] if prefix and text.startswith(prefix) else text


def type_hints(cls: type) -> dict[str, Any]:
    """`typing.get_type_hints(cls)` for a class written with `X | None` and `list[int]` annotations.

    Python 3.8 cannot evaluate those; there the `eval_type_backport` package (a dependency of the
    `serve` extra on Python < 3.10, the one pydantic itself uses for this) evaluates them.
    """
    if sys.version_info >= (3, 10):
        return typing.get_type_hints(cls)
    from eval_type_backport import eval_type_backport

    namespace = vars(sys.modules[cls.__module__])
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        for name, annotation in getattr(klass, "__annotations__", {}).items():
            ref = typing.ForwardRef(annotation) if isinstance(annotation, str) else annotation
            hints[name] = eval_type_backport(ref, namespace, None)
    return hints
