"""The extraction of the docs' commands and their split into test files (tests/docs/doc_commands.py)."""

from __future__ import annotations

from tests.docs.doc_commands import COMMANDS, DEFAULT_GROUP, GROUPS, ROOT, group_of


def test_every_page_with_commands_is_read():
    """The extraction finds the commands (a changed fence or page layout would silently find none)."""
    pages = {c.page for c in COMMANDS}
    assert {"README.md", "docs/export.md", "docs/serve.md", "docs/train.md"} <= pages, pages
    assert len(COMMANDS) >= 50


def test_every_group_has_its_test_file():
    groups = {*GROUPS.values(), DEFAULT_GROUP}
    missing = [g for g in groups if not (ROOT / "tests" / "docs" / f"test_docs_{g}.py").is_file()]
    assert not missing, f"GROUPS names groups without a tests/docs/test_docs_GROUP.py: {missing}"
    assert {group_of(c) for c in COMMANDS} <= groups


def test_a_line_runs_after_the_lines_that_write_what_it_reads():
    """The README's export lines make artifacts/n and artifacts/n-cpu, which docs/bench.md reads."""
    by_place = {f"{c.page}:{c.line}": c for c in COMMANDS}
    reader = next(c for c in COMMANDS if c.page == "docs/bench.md" and "artifacts/n-cpu" in c.text)
    writers = {f"{c.page}:{c.line}" for c in reader.after}
    makes = {w for w in writers if "-o artifacts/n-cpu" in by_place[w].text}
    assert makes, [c.where for c in reader.after]
    assert not any(
        "my_set" in by_place[w].text and "artifacts/n-cpu" not in by_place[w].text for w in writers
    )
