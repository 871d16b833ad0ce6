"""The TensorRT modules type-check against NVIDIA's published `tensorrt-stubs` (10.13): zero errors.

mypy reads the stubs for every `import tensorrt as trt` in these modules, so a misspelt enum member,
a method TensorRT 10.13 lacks or a wrong argument type fails here. A control file with a member
that does not exist proves the stubs were really read (without them `tensorrt` would be `Any` and
everything would pass). `make setup` installs the stubs (`pip install --no-deps tensorrt-stubs`).
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
MODULES = [
    "dfine_deploy/export/tensorrt.py",
    "dfine_deploy/runtime/tensorrt_plan.py",
    "dfine_deploy/export/tensorrt_verify.py",
    "dfine_deploy/runtime/tensorrt_backend.py",
    "dfine_deploy/runtime/cuda_memory.py",
]
STUBS_HINT = (
    "install them with `make setup`, or: "
    "pip install mypy && pip install --no-deps tensorrt-stubs==10.13.0.35.1"
)


def _modules_importing_tensorrt() -> list[str]:
    """Every package module with an `import tensorrt` (at run time or under TYPE_CHECKING)."""
    found = []
    for path in sorted((ROOT / "dfine_deploy").rglob("*.py")):
        tree = ast.parse(path.read_text())
        if any(
            isinstance(node, ast.Import) and any(alias.name == "tensorrt" for alias in node.names)
            for node in ast.walk(tree)
        ):
            found.append(str(path.relative_to(ROOT)))
    return found


def test_every_module_importing_tensorrt_is_type_checked():
    found = _modules_importing_tensorrt()
    assert "dfine_deploy/export/tensorrt.py" in found, "the scan no longer finds the build: it checks nothing"
    assert set(found) <= set(MODULES), f"add to MODULES: {sorted(set(found) - set(MODULES))}"


def _stub_folders() -> list[Path]:
    """The installed `tensorrt` and `tensorrt_bindings` stub folders (they carry no py.typed marker,
    so mypy would skip them in site-packages: they are handed over on MYPYPATH instead)."""
    folders = []
    for name in ("tensorrt", "tensorrt_bindings"):
        spec = importlib.util.find_spec(name)
        for location in (spec.submodule_search_locations or []) if spec else []:
            if (Path(location) / "__init__.pyi").is_file():
                folders.append(Path(location))
    return folders


def repair_stub_syntax(text: str) -> tuple[str, int]:
    """NVIDIA's generated 10.13 stubs are not valid Python in two ways; fix them in the copy.

    A parameter named `in` (a keyword: renamed `in_`) and parameters without defaults after ones
    with defaults (given `= ...`). Returns the text and the number of `def` lines changed.
    """
    fixed, changed = [], 0
    for line in text.splitlines(keepends=True):
        head = line.lstrip()
        if head.startswith("def ") and "(" in line:
            new = re.sub(r"([(,]\s*)in(\s*:)", r"\1in_\2", line)
            start, end = new.index("(") + 1, new.rindex(")")
            params, seen_default = [], False
            for part in new[start:end].split(", "):
                if "=" in part:
                    seen_default = True
                elif seen_default and ":" in part and not part.lstrip().startswith("*"):
                    part += " = ..."
                params.append(part)
            new = new[:start] + ", ".join(params) + new[end:]
            changed += new != line
            line = new
        fixed.append(line)
    return "".join(fixed), changed


def test_tensorrt_modules_type_check_against_nvidia_stubs(tmp_path):
    assert importlib.util.find_spec("mypy") is not None, f"mypy is missing: {STUBS_HINT}"
    folders = _stub_folders()
    assert [f.name for f in folders] == ["tensorrt", "tensorrt_bindings"], (
        f"tensorrt-stubs missing: {STUBS_HINT}"
    )
    stubs = tmp_path / "stubs"
    repaired = 0
    for folder in folders:
        shutil.copytree(folder, stubs / folder.name, ignore=shutil.ignore_patterns("*.py", "__pycache__"))
        for stub in (stubs / folder.name).glob("*.pyi"):
            text, changed = repair_stub_syntax(stub.read_text())
            stub.write_text(text)
            repaired += changed
    assert repaired < 50, f"{repaired} stub lines repaired: not the 10.13 stubs this test was written for"
    control = tmp_path / "stub_control.py"
    control.write_text("import tensorrt as trt\n\nflag = trt.BuilderFlag.NO_SUCH_FLAG\n")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(ROOT / "pyproject.toml"), *MODULES, str(control)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "MYPYPATH": str(stubs)},
    )
    lines = [line for line in proc.stdout.splitlines() if ": error:" in line]
    ours = [line for line in lines if line.startswith(tuple(MODULES))]  # the stubs' own errors are NVIDIA's
    assert not ours, "type errors against tensorrt-stubs 10.13:\n" + "\n".join(ours)
    assert any("NO_SUCH_FLAG" in line for line in lines), f"the stubs were not read: {proc.stdout[-2000:]}"
