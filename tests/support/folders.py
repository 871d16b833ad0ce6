"""Folders a test hands to a command that must not touch them: their exact contents, and a few shapes.

`snapshot` records every file's bytes and every folder (empty ones too), so "untouched" means the
same names and the same bytes afterwards. The shapes are what the ownership rule must refuse: a
training run, a user's documents, and lookalikes that carry one of our file names.
"""

from __future__ import annotations

from pathlib import Path

DEAD_PID = 4194305  # above the largest pid Linux hands out (2**22): no process has it


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Relative path -> bytes (a file) or None (a folder), for everything under `folder`."""
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    }


def fill(folder: Path, files: dict[str, str | bytes]) -> Path:
    """Make `folder` and write `files` (relative path -> text or bytes) in it; returns `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for rel, content in files.items():
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return folder


TRAINING_RUN = {
    "best.pth": b"weights of the best epoch",
    "last.pth": b"weights of the last epoch",
    "log.jsonl": '{"epoch": 0}\n',
    "resolved_config.json": '{"effective": {}, "config": {}}',
}
DOCUMENTS = {
    "thesis.docx": b"chapter one",
    "photos/holiday.jpg": b"\xff\xd8 a photo",
    "notes.txt": "call the bank",
}
