"""Comments, docstrings and docs state facts, not the numbers of a tracker that is not in the repository,
which no reader can follow. A public reference names its repository
(`NVIDIA/TensorRT#4813`, `D-FINE#18`, `DeepStream-Yolo PR #647`) or is a link
(https://github.com/owner/repo/issues/N).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("dfine_deploy", "scripts", "benchmarks", "tests", "docs", "configs", "export", "serve", "train")
FOLDERS += ("ci",)
TOP_FILES = ("README.md", "Makefile", "pyproject.toml")
SUFFIXES = {".py", ".md", ".yml", ".yaml", ".sh", ".toml", ".txt", ".cfg", ".cpp", ".h", ".sbatch", ""}
SKIPPED = ("tests/data/",)  # recorded facts (JSON, verdicts), not prose
# "issue 5", "Issue 13 #6", "issues #4"; and a bare "#12" that follows no repository name
NUMBERED = re.compile(r"\bissues?\s*#?\s*\d+(?:\s*#\d+)?|(?<![\w/.&-])(?<!PR )#\d+\b", re.IGNORECASE)


def tracker_numbers(text: str) -> list[str]:
    """The tracker references without a repository in `text`, as written."""
    return [match.group(0) for match in NUMBERED.finditer(text)]


def _files() -> list[Path]:
    found = [ROOT / name for name in TOP_FILES]
    for folder in FOLDERS:
        found += [p for p in (ROOT / folder).rglob("*") if p.is_file() and p.suffix in SUFFIXES]
    here = Path(__file__).resolve()  # its examples are the rule's own
    return sorted(p for p in found if p != here and not str(p.relative_to(ROOT)).startswith(SKIPPED))


def test_no_file_points_at_a_tracker_outside_the_repository():
    files = _files()
    assert len(files) > 300, f"found only {len(files)} files to read"
    offenders = []
    for path in files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError:
            continue  # not text
        for number, line in enumerate(lines, 1):
            offenders += [f"{path.relative_to(ROOT)}:{number}: {ref!r}" for ref in tracker_numbers(line)]
    assert offenders == [], "state the fact instead, or name the public repository:\n" + "\n".join(offenders)


def test_what_counts_as_a_tracker_number():
    assert tracker_numbers("(issue 13 #3)") == ["issue 13 #3"]
    assert tracker_numbers("Issue 20 #6: names") == ["Issue 20 #6"]
    assert tracker_numbers("Goal (issue 5): faster; issues #4") == ["issue 5", "issues #4"]
    assert tracker_numbers("see (#12) and #7") == ["#12", "#7"]
    public = (
        "NVIDIA/TensorRT#4813, D-FINE#44/#98, DeepStream-Yolo PR #647, onnxruntime#26996, "
        "https://github.com/Peterande/D-FINE/issues/266, rtsp://a:b#2@cam, &#39;, an issue of speed"
    )
    assert tracker_numbers(public) == []
