"""`--target` is routed by its row (`export/deploy_targets.py`), never by testing a name's membership
in a target family's list: no product module outside the target modules asks `x in PLATFORMS`,
`x not in PROFILES`, `x in TARGET_NAMES` and the like, or compares a settings' `target` with spelled
names. A new target then touches its own modules and the rows only (docs/ARCHITECTURE.md, "Adding a
target").
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("dfine_deploy", "scripts", "benchmarks", "train", "export", "serve")
# the table and each target family's own modules: they may look their names up
TARGET_MODULES = {
    "dfine_deploy.export.deploy_targets",
    "dfine_deploy.export.targets",
    "dfine_deploy.export.tensorrt",
    "dfine_deploy.export.tensorrt_record",
    "dfine_deploy.export.tensorrt_verify",
    "dfine_deploy.export.rknn",
    "dfine_deploy.runtime.tensorrt_plan",
    "dfine_deploy.runtime.rknn_backend",
}
LISTS = {"PLATFORMS", "PROFILES", "ALIASES", "TARGET_NAMES", "TARGETS", "target_names"}


def _target_bindings(tree: ast.AST) -> tuple[set[str], set[str]]:
    """(names bound to a target module, names bound to a list of one) by the imports of `tree`."""
    modules, lists = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in TARGET_MODULES:
                    modules.add(alias.asname or alias.name)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                bound = alias.asname or alias.name
                if f"{node.module}.{alias.name}" in TARGET_MODULES:
                    modules.add(bound)
                elif node.module in TARGET_MODULES and alias.name in LISTS:
                    lists.add(bound)
    return modules, lists


def _is_target_list(expr: ast.AST, modules: set[str], lists: set[str]) -> bool:
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Name):
        return expr.id in lists
    if isinstance(expr, ast.Attribute) and expr.attr in LISTS:
        return isinstance(expr.value, ast.Name) and expr.value.id in modules
    return False


def _spelled(expr: ast.AST) -> bool:
    """A string, or a tuple/list/set of strings, written in the code."""
    if isinstance(expr, ast.Constant):
        return isinstance(expr.value, str)
    return isinstance(expr, (ast.Tuple, ast.List, ast.Set)) and all(_spelled(e) for e in expr.elts)


def membership_tests(source: str) -> list[str]:
    """The lines of `source` that route on a target family's list or on spelled target names."""
    tree = ast.parse(source)
    modules, lists = _target_bindings(tree)
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Compare):
            continue
        for op, right in zip(node.ops, node.comparators):
            by_list = isinstance(op, (ast.In, ast.NotIn)) and _is_target_list(right, modules, lists)
            by_name = (
                isinstance(node.left, ast.Attribute)
                and node.left.attr == "target"
                and isinstance(op, (ast.In, ast.NotIn, ast.Eq, ast.NotEq))
                and _spelled(right)
            )
            if by_list or by_name:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def test_no_product_module_outside_the_targets_routes_on_a_target_list():
    files = sorted(p for folder in PRODUCT for p in (ROOT / folder).rglob("*.py"))
    assert len(files) > 100, f"found only {len(files)} product files under {PRODUCT}"
    offenders = [
        f"{path.relative_to(ROOT)} {line}"
        for path in files
        if _module_name(path) not in TARGET_MODULES
        for line in membership_tests(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], (
        "route --target by its row (export/deploy_targets.py: backend, refusals, record), not by a "
        "family's list:\n" + "\n".join(offenders)
    )


def test_the_check_finds_the_routing_the_table_replaced():
    """What export/pipeline.py, export/rknn.py and export/cli.py did before the table."""
    old = """
from dfine_deploy.export import rknn as rknn_export
from dfine_deploy.runtime.rknn_backend import PLATFORMS
from dfine_deploy.export.targets import TARGET_NAMES
import dfine_deploy.runtime.tensorrt_plan as plan

def check(opts):
    if opts.target in rknn_export.PLATFORMS:
        pass
    if opts.target and opts.target not in PLATFORMS:
        pass
    return opts.target in TARGET_NAMES or opts.target in plan.PROFILES or opts.target == "rk3588"
"""
    assert len(membership_tests(old)) == 5
    fine = """
from dfine_deploy.bench.tables import PROFILES
from dfine_deploy.export.deploy_targets import get_target, runs_on

def check(args, opts):
    target = get_target(opts.target) if opts.target else None
    return args.device in PROFILES and opts.target is None and runs_on(target, "rknn")
"""
    assert membership_tests(fine) == []
