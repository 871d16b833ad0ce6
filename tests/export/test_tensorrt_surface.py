"""Every TensorRT attribute the project touches exists in NVIDIA's bindings of every version it claims.

The surfaces (tests/fakes/tensorrt/surface/*.json) are extracted by scripts/trt_surface.py from
NVIDIA/TensorRT's pybind11 sources; each file names its ref and commit. The project's code is
read with `ast`: `trt.X`, `trt.X.Y`, and methods/properties/keywords used on the objects a build
and a run hold (builder, network, config, ...), named by the variables that hold them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
SURFACE_DIR = ROOT / "tests" / "fakes" / "tensorrt" / "surface"
SURFACES = {p.stem: json.loads(p.read_text()) for p in sorted(SURFACE_DIR.glob("*.json"))}
# Variable (or attribute) name -> the TensorRT class it holds, in the project's TensorRT code.
HOLDERS = {
    "builder": "Builder",
    "network": "INetworkDefinition",
    "config": "IBuilderConfig",
    "parser": "OnnxParser",
    "engine": "ICudaEngine",
    "context": "IExecutionContext",
    "inspector": "EngineInspector",
    "opt_profile": "IOptimizationProfile",
    "tensor": "ITensor",
    "layer": "ILayer",
    "runtime": "Runtime",
    "cache": "ITimingCache",
    "fresh": "ITimingCache",
    "written": "ITimingCache",
}
CONSTRUCTORS = {"Builder", "Runtime", "OnnxParser", "Logger"}
# Reached only on some versions (see runtime.tensorrt_plan.plan_build): name -> predicate on the major.
GATED = {
    "BuilderFlag.FP16": lambda major: major < 11,  # weak FP16 builds: plan_build never on 11.x
    "BuilderFlag.OBEY_PRECISION_CONSTRAINTS": lambda major: major < 11,  # FP32 islands of weak builds
    "ILayer.precision": lambda major: major < 11,
    "ILayer.set_output_type": lambda major: major < 11,
    "NetworkDefinitionCreationFlag.EXPLICIT_BATCH": lambda major: major < 11,  # 8.x plans only
    "NetworkDefinitionCreationFlag.STRONGLY_TYPED": lambda major: major >= 10,  # hasattr-guarded
}


def _files() -> list[Path]:
    found = []
    for path in [*(ROOT / "dfine_deploy").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]:
        text = path.read_text()
        if "import tensorrt" in text or "load_tensorrt(" in text:
            found.append(path)
    return found


def _holder(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return HOLDERS.get(node.id.lstrip("_"))
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
        return HOLDERS.get(node.attr.lstrip("_"))
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
        func = node.func
        if isinstance(func.value, ast.Name) and func.value.id == "trt" and func.attr in CONSTRUCTORS:
            return func.attr
    return None


def _tensorrt_scopes(tree: ast.Module) -> list[ast.AST]:
    """Functions that name the `trt` module (or its stub types), and every method of such classes."""

    def names_trt(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id in ("trt", "trt_types") for n in ast.walk(node))

    scopes: list[ast.AST] = []
    for node in tree.body:
        if isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and names_trt(node):
            scopes.append(node)
    return scopes


def touched() -> dict[str, set[str]]:
    """'X' / 'X.Y' (module and enum/class attributes) and 'Class.member' / 'Class.member(kw=)'."""
    uses: dict[str, set[str]] = {}
    for path in _files():
        tree = ast.parse(path.read_text())
        where = str(path.relative_to(ROOT))
        nodes = [n for scope in _tensorrt_scopes(tree) for n in ast.walk(scope)]
        for node in nodes:
            if isinstance(node, ast.Attribute):
                if isinstance(node.value, ast.Name) and node.value.id == "trt":
                    uses.setdefault(node.attr, set()).add(where)
                elif (
                    isinstance(node.value, ast.Attribute)
                    and isinstance(node.value.value, ast.Name)
                    and node.value.value.id == "trt"
                ):
                    uses.setdefault(f"{node.value.attr}.{node.attr}", set()).add(where)
                holder = _holder(node.value)
                if holder:
                    uses.setdefault(f"{holder}.{node.attr}", set()).add(where)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.keywords:
                holder = _holder(node.func.value)
                if holder:
                    for kw in node.keywords:
                        uses.setdefault(f"{holder}.{node.func.attr}({kw.arg}=)", set()).add(where)
    return uses


def exists(surface: dict, name: str) -> bool:
    if "(" in name:  # a keyword argument
        member_path, keyword = name[:-2].split("(")
        cls, member = member_path.split(".")
        entry = _member(surface, cls, member)
        return entry is not None and any(
            keyword in [n for n, _ in sig] for sig in entry.get("signatures", [])
        )
    head, _, tail = name.partition(".")
    if not tail:
        return head in surface["module"]
    if head in surface["enums"]:
        return tail in surface["enums"][head]
    if f"{head}.{tail}" in surface["enums"]:  # a nested enum, e.g. ILogger.Severity
        return True
    return _member(surface, head, tail) is not None


def _member(surface: dict, cls: str, member: str) -> dict | None:
    while cls in surface["classes"]:
        entry = surface["classes"][cls]["members"].get(member)
        if entry is not None:
            return entry
        bases = surface["classes"][cls]["bases"]
        cls = bases[0] if bases else ""
    return None


def test_the_surfaces_cover_every_claimed_version_and_name_their_source():
    assert sorted(SURFACES) == ["10.13", "10.14", "10.3", "11", "8.5", "8.6"]
    for label, surface in SURFACES.items():
        source = surface["source"]
        assert source["repository"] == "https://github.com/NVIDIA/TensorRT" and len(source["commit"]) == 40
        assert (
            "python/src/infer/pyCore.cpp" in source["paths"]
            and "python/src/parsers/pyOnnx.cpp" in source["paths"]
        )
        assert surface["version"].startswith(label), (label, surface["version"])
    # facts the build depends on, read from NVIDIA's sources rather than remembered
    assert (
        "INT64" not in SURFACES["8.5"]["enums"]["DataType"]
        and SURFACES["10.3"]["enums"]["DataType"]["INT64"] == 8
    )
    assert (
        "FP16" not in SURFACES["11"]["enums"]["BuilderFlag"]
        and "FP16" in SURFACES["10.14"]["enums"]["BuilderFlag"]
    )
    assert "EXPLICIT_BATCH" not in SURFACES["11"]["enums"]["NetworkDefinitionCreationFlag"]
    assert "STRONGLY_TYPED" not in SURFACES["8.6"]["enums"]["NetworkDefinitionCreationFlag"]


def test_the_scan_sees_the_build_and_the_runtime():
    scanned = {str(path.relative_to(ROOT)) for path in _files()}
    for module in ("export/tensorrt.py", "export/tensorrt_verify.py", "runtime/tensorrt_backend.py"):
        assert f"dfine_deploy/{module}" in scanned, f"the scan no longer reads dfine_deploy/{module}"
    uses = touched()
    for name in (
        "Builder",
        "BuilderFlag.TF32",
        "IBuilderConfig.set_timing_cache(ignore_mismatch=)",
        "ICudaEngine.get_tensor_profile_shape",
        "IExecutionContext.execute_async_v3",
        "INetworkDefinition.get_layer",
        "EngineInspector.get_engine_information",
    ):
        assert name in uses, f"the scan no longer finds {name}: the test would check nothing"


@pytest.mark.parametrize("label", sorted(SURFACES))
def test_every_touched_tensorrt_attribute_exists_in_the_version(label):
    surface = SURFACES[label]
    major = int(label.split(".")[0])
    missing = {}
    for name, where in sorted(touched().items()):
        base = name.split("(")[0]
        if base in GATED and not GATED[base](major):
            continue
        if not exists(surface, name):
            missing[name] = sorted(where)
    assert not missing, f"TensorRT {surface['version']} ({surface['source']['ref']}) has none of {missing}"


def test_version_gates_are_true_to_the_sources():
    """A gated attribute must really be absent where the gate says the code never reaches it."""
    for name, reached in GATED.items():
        for label, surface in SURFACES.items():
            major = int(label.split(".")[0])
            assert exists(surface, name) == reached(major), (name, label)


def test_the_fake_defines_only_what_nvidia_binds():
    spec = importlib.util.spec_from_file_location("fake_tensorrt", SURFACE_DIR.parent / "__init__.py")
    fake = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fake)
    for trt_name, cls in fake._CLASSES.items():
        for member in vars(cls):
            nested_enum = any(f"{trt_name}.{member}" in s["enums"] for s in SURFACES.values())
            if member.startswith("_") or nested_enum:
                continue
            if not any(_member(s, trt_name, member) is not None for s in SURFACES.values()):
                raise AssertionError(f"fake tensorrt.{trt_name}.{member} is in no NVIDIA binding")
