"""The floors of docs/ARCHITECTURE.md: no two packages of dfine_deploy, and no two of its modules,
import each other in a circle, so every module stands above all that it imports.

Every import statement counts, wherever it stands (module level, inside a function, under
`TYPE_CHECKING`): a circle of type-only imports is still two modules that cannot be read apart.
Imports made by `importlib` are not seen (the lazy names of `model/__init__.py`).
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "dfine_deploy"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, name: str, modules: set[str]) -> set[str]:
    """The modules of dfine_deploy that `path` imports; `from pkg import sub` names the submodule."""
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                sub = f"{source}.{alias.name}"
                found.add(sub if sub in modules else source)
    return {m for m in found if m in modules and m != name}


def _graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, name, modules) for name, path in paths.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def _room(module: str) -> str:
    """A top-level module or subpackage of dfine_deploy (the package's own __init__ is its own room)."""
    parts = module.split(".")
    return ".".join(parts[:2])


def test_the_graph_sees_the_imports():
    graph = _graph()
    assert "dfine_deploy.runtime.classes" in graph["dfine_deploy.runtime.detector"]
    assert "dfine_deploy.export.settings" in graph["dfine_deploy.export.pipeline"]
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_modules_import_each_other_in_a_circle():
    circles = _circles(_graph())
    assert circles == [], f"modules that import each other in a circle: {circles}"


def test_no_packages_import_each_other_in_a_circle():
    rooms: dict[str, set[str]] = defaultdict(set)
    for module, imported in _graph().items():
        rooms[_room(module)].update(_room(m) for m in imported if _room(m) != _room(module))
    for room in list(rooms.values()):
        for other in room:
            rooms.setdefault(other, set())
    circles = _circles(dict(rooms))
    assert circles == [], (
        f"packages of dfine_deploy that import each other in a circle: {circles}; move what the lower "
        "one needs down (docs/ARCHITECTURE.md, The floors)"
    )
