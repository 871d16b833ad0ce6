"""Every golden file in tests/data/ has its source named in tests/data/README.md, pinned to a commit."""

from __future__ import annotations

import re
from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"


def _expand(pattern: str) -> set[str]:
    """'parity_{n,s}.json' -> {'parity_n.json', 'parity_s.json'}."""
    match = re.search(r"\{([^}]*)\}", pattern)
    if not match:
        return {pattern}
    return {
        p for option in match.group(1).split(",") for p in _expand(pattern.replace(match.group(0), option, 1))
    }


def test_every_golden_file_has_its_source_and_recipe_in_the_readme():
    readme = (DATA / "README.md").read_text()
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", readme, re.M)
    documented = {name: source for pattern, source in rows for name in _expand(pattern)}
    files = {str(p.relative_to(DATA)) for p in DATA.rglob("*") if p.is_file() and p.name != "README.md"}
    assert files, "no golden files found"
    assert files == set(documented), files ^ set(documented)
    # a commit, a file that records the commits it came from, or pinned releases of a package index
    pinned = r"\bcommits? [0-9a-f]{7,40}\b|commits and blob ids inside|pycocotools|PyPI releases [0-9]"
    for name, source in documented.items():
        assert re.search(pinned, source), (
            name,
            source,
        )
    for pattern, _ in rows:  # each file family has a "how it was made" paragraph
        assert f"**`{pattern}`.**" in readme, pattern
