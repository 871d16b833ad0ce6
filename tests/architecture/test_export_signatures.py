"""The export's functions stay easy to call and to read: none takes more than 5 positional
parameters (the rest are keyword-only, after `*`), and every parameter is annotated. The same
rules as ruff's ANN001-ANN003 and PLR0917 (max-positional-args = 5) applied to dfine_deploy/export."""

from __future__ import annotations

import ast
from pathlib import Path

EXPORT = Path(__file__).resolve().parents[2] / "dfine_deploy" / "export"
MAX_POSITIONAL = 5


def _functions():
    for path in sorted(EXPORT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{path.relative_to(EXPORT.parents[1])}:{node.lineno} {node.name}", node.args


def _positional(args: ast.arguments) -> list[ast.arg]:
    """The positional parameters, less a method's `self` or `cls`."""
    params = [*args.posonlyargs, *args.args]
    return params[1:] if params and params[0].arg in ("self", "cls") else params


def test_the_rules_see_what_they_count():
    (node,) = ast.parse("def f(self, a, b: int, *args, c, **kw): ...").body
    assert [p.arg for p in _positional(node.args)] == ["a", "b"]


def test_no_export_function_takes_more_than_five_positional_parameters():
    counts = {where: len(_positional(args)) for where, args in _functions()}
    wide = [f"{where} ({count})" for where, count in counts.items() if count > MAX_POSITIONAL]
    assert not wide, f"more than {MAX_POSITIONAL} positional parameters (make the rest keyword-only): {wide}"


def test_every_export_parameter_is_annotated():
    bare = [
        f"{where}: {param.arg}"
        for where, args in _functions()
        for param in [*_positional(args), *args.kwonlyargs, args.vararg, args.kwarg]
        if param is not None and param.annotation is None
    ]
    assert not bare, f"parameters without a type annotation: {bare}"
