"""The README stays a short entry page: at most 250 lines, and every page under docs/ is reachable
from it; every relative link in the README and the pages points at a file that exists."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PAGES = sorted((ROOT / "docs").glob("*.md"))
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def _relative_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text(encoding="utf-8")) if not re.match(r"[a-z]+:", t)]


def test_the_readme_is_short_and_links_every_page():
    text = README.read_text(encoding="utf-8")
    lines = text.count("\n")
    assert lines <= 250, f"README.md has {lines} lines; move details into a page under docs/"
    linked = {(ROOT / target).resolve() for target in _relative_links(README)}
    unlinked = [p.name for p in PAGES if p.resolve() not in linked]
    assert not unlinked, f"pages under docs/ that README.md does not link: {unlinked}"


def test_every_relative_link_resolves():
    broken = [
        f"{page.relative_to(ROOT)} -> {target}"
        for page in [README, *PAGES]
        for target in _relative_links(page)
        if not (page.parent / target).exists()
    ]
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_architecture_page_names_every_file_an_artifact_folder_can_hold():
    """Every pattern of the artifact's claim matches a name the page writes in backticks, with
    `<placeholders>` standing for the pattern's wildcards (`model.<precision>.engine`)."""
    from dfine_deploy.export.pipeline import ARTIFACT

    text = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    written = {re.sub(r"<[^>]*>", "x", token).rstrip("/") for token in re.findall(r"`([^`\n]+)`", text)}
    missing = [
        pattern
        for pattern in sorted({p.split("/")[0] for p in ARTIFACT.patterns})
        if not any(fnmatch.fnmatchcase(name, pattern) for name in written)
    ]
    assert not missing, f"docs/ARCHITECTURE.md's artifact table does not name: {missing}"


def _recipe_line(row, by_key) -> str:
    """The line of docs/ARCHITECTURE.md's graph table for one row of export/recipes.py."""
    from dfine_deploy.export.run import PYTORCH

    def graph(key):
        return "PyTorch" if key in (None, PYTORCH) else f"`{by_key[key].file}`"

    cells = [
        f"`{row.key}`",
        f"`{row.file}`",
        str(row.precision),
        row.sampler or "the export's (`--sampler`)",
        graph(row.source),
        f"{graph(row.reference)}, on {', '.join(row.gated_on)}",
        ", ".join(row.backends) or "by default",
        row.when,
    ]
    return "| " + " | ".join(cells) + " |"


def test_the_architecture_pages_graph_table_is_the_recipe_table():
    from dfine_deploy.export.recipes import BY_KEY, RECIPES

    lines = (ROOT / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").splitlines()
    header = lines.index(
        "| key | file | precision | sampler | made from | gated against, on | routed to | written |"
    )
    table = []
    for line in lines[header + 2 :]:
        if not line.startswith("|"):
            break
        table.append(line)
    expected = [_recipe_line(row, BY_KEY) for row in RECIPES]
    expected_text = "\n".join(expected)
    assert table == expected, f"docs/ARCHITECTURE.md's graph table must be, row for row:\n{expected_text}"


# what a quoted line of docs/bad-input.md may hold that the code fills in: '...', a placeholder in
# capitals, a variable's name before '=', a quoted or bracketed value, a number
_FILLED_IN = re.compile(
    r"\.\.\.|\b(?:NAME|PATH|DIR|URL|N|L|C)\b|\b[A-Z_]+=|'[^']*'|\[[^\]]*\]"
    r"|(?<![\w.])\d+(?:\.\d+)?(?:e[+-]\d+)?(?!\w)"
)


# a word of a quoted line that is a value the code fills in: a path or file name, a placeholder X, a
# byte in hex, a Python constant
_FILLED_WORD = re.compile(r"/|\.[a-z]{2,5}[:,]?$|^(?:X|0x[0-9a-f]+|True|False|None)$")


def _code_text() -> str:
    """The package's source as one text, string literals written over several lines joined."""
    text = "\n".join(p.read_text(encoding="utf-8") for p in sorted((ROOT / "dfine_deploy").rglob("*.py")))
    return re.sub(r"\"\s*\n\s*f?\"", "", text)


def _unprinted(part: str, code: str) -> bool:
    """Whether `part` of a quoted line is not the code's: of its pairs of neighbouring words (values
    filled in left out), those the code does not write side by side, where an f-string field of
    the code gave words, may be no more than one in three."""
    words = ["\x00" if _FILLED_WORD.search(w) else w for w in part.split()]
    pairs = [f"{a} {b}" for a, b in zip(words, words[1:]) if "\x00" not in (a, b)]
    return 3 * sum(pair not in code for pair in pairs) > len(pairs)


def test_every_line_docs_bad_input_quotes_is_in_the_code():
    """docs/bad-input.md says what each refusal prints: each quoted line's words are the code's own
    (the values it fills in aside), so a message changed in the code cannot leave the page behind."""
    code = _code_text()
    page = (ROOT / "docs" / "bad-input.md").read_text(encoding="utf-8")
    rows = [line.strip("|").split(" | ") for line in page.splitlines() if line.startswith("| ")]
    missing = []
    for cells in rows[2:]:  # after the header and its rule
        for quote in re.findall(r"`([^`]+)`", cells[1] if len(cells) > 1 else ""):
            for part in _FILLED_IN.split(quote):
                part = part.strip(" ,;:.()")
                if len(part) >= 10 and _unprinted(part, code):
                    missing.append(f"{cells[0][:40]}: {part!r}")
    assert not missing, f"docs/bad-input.md quotes words the code does not print: {missing}"
