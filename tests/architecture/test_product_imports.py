"""What ships or runs for users never imports the test suite: tests/ may import the product, scripts and
benchmarks, never the other way round. Code both need lives on the product side (the parity fill in
benchmarks/official_parity/, trtexec's option parser oracle in scripts/trt_oracle/).

Every import statement counts, wherever it stands (module level, inside a function).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("dfine_deploy", "scripts", "benchmarks", "train", "export", "serve")


def imports_of_tests(source: str) -> list[str]:
    """The modules under `tests` that `source` imports, relative imports aside."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            names = [node.module or ""]
        else:
            continue
        found += [name for name in names if name == "tests" or name.startswith("tests.")]
    return found


def test_no_product_file_imports_the_tests():
    files = sorted(p for folder in PRODUCT for p in (ROOT / folder).rglob("*.py"))
    assert len(files) > 100, f"found only {len(files)} product files under {PRODUCT}"
    offenders = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        if "tests" in text:  # parse only what can import it
            offenders += [f"{path.relative_to(ROOT)}: imports {name}" for name in imports_of_tests(text)]
    assert offenders == [], "move what both need out of tests/:\n" + "\n".join(offenders)


def test_every_form_of_import_is_seen():
    source = (
        "import tests\nimport os, tests.support.images as im\nfrom tests.export import conftest\n"
        "def f():\n    from tests import fakes\nfrom . import tests\nimport testsuite\n"
    )
    assert imports_of_tests(source) == ["tests", "tests.support.images", "tests.export", "tests"]
