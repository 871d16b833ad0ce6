"""A recipe's `write` returns what it adds (`export.run.Written`) and `write_graphs` puts it into the
`ExportRun`: no write function writes the run's shared records itself, so what a recipe adds is its
return value, read in one place (`ExportRun.add`)."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from dfine_deploy.artifact import GATE_BACKEND, GraphInfo, parity_key
from dfine_deploy.export.recipes import BY_KEY, RECIPES
from dfine_deploy.export.run import ExportRun, Recorded, Written
from dfine_deploy.export.settings import ExportSettings

SHARED = {"graphs", "parity", "thresholds", "written", "target", "fp32_islands", "unavailable"}


def _run(tmp_path: Path) -> ExportRun:
    opts = ExportSettings(model="dfine-n", output=tmp_path / "out")
    return ExportRun(tmp_path, opts, module=None, loaded=None, batches=[], scorer=None, deploy_target=None)


def test_add_puts_a_recipes_records_into_the_run(tmp_path):
    run = _run(tmp_path)
    grid = GraphInfo("model.grid.onnx", "0" * 64, "fp32", 17)
    report = {"passed": True, "candidate": "model.grid.onnx"}
    written = Written("fp32-grid", (Recorded("fp32-grid", grid, {GATE_BACKEND: report}),)) + Written(
        "fp32-grid",
        (Recorded("bf16", None, {"openvino": {"run": False, "passed": False}}),),
        target={"int8_plan": {"graph": "x"}},
        fp32_islands={"/norm/Sqrt": "layernorm"},
        unavailable={"openvino": "not installed"},
    )
    run.add(BY_KEY["fp32-grid"], written)
    assert run.written == {"fp32-grid": "fp32-grid"} and run.graphs == {"fp32-grid": grid}
    assert run.parity == {
        parity_key("fp32-grid", GATE_BACKEND): report,
        "bf16:openvino": {"run": False, "passed": False},
    }
    assert run.target == {"int8_plan": {"graph": "x"}} and run.fp32_islands == {"/norm/Sqrt": "layernorm"}
    assert run.unavailable == {"openvino": "not installed"} and run.thresholds == {}
    # a recipe whose graph already is another's (model.onnx with --sampler grid) adds its key only
    run.add(BY_KEY["fp32"], Written("fp32-grid"))
    assert run.written["fp32"] == "fp32-grid" and list(run.graphs) == ["fp32-grid"]


def _writes_shared_records(function) -> list[str]:
    """The lines of `function` that write the run's shared records or call a record method on it."""
    tree = ast.parse(inspect.getsource(inspect.getmodule(function)))
    source = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function.__name__)
    found = []
    for node in ast.walk(source):
        target = None
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            target = next((t.value for t in targets if isinstance(t, ast.Subscript)), None)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("record", "add", "_record"):
                target = node.func
            elif node.func.attr in ("update", "setdefault", "pop"):
                target = node.func.value
        on_run = isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
        if on_run and target.value.id == "run" and target.attr in (*SHARED, "record", "add", "_record"):
            found.append(f"{function.__name__} line {node.lineno}: {ast.unparse(node)}")
    return found


def test_no_recipe_writes_the_runs_records_itself():
    functions = {recipe.write for recipe in RECIPES}
    assert len(functions) >= 6
    offenders = [line for function in functions for line in _writes_shared_records(function)]
    assert offenders == []


def test_the_check_sees_a_recipe_that_writes_the_run():
    def old_style(run, recipe):
        run.record(recipe.key, None, {})
        run.target["int8_plan"] = {}
        run.fp32_islands.update({})
        return recipe.key

    assert len(_writes_shared_records(old_style)) == 3
