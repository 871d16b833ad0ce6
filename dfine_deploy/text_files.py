"""The one reader of the text files a user hands a command: configs, a YOLO data.yaml, COCO
annotations, `--names`, `--head-map`, a stream list.

Whatever is wrong with such a file (missing, a folder, not UTF-8, not YAML or JSON) comes back as one
line naming the file, the place in it and the fix, in the caller's error class, so that every command
refuses the same way (docs/bad-input.md). YAML is read with `safe_load_unique`: a key given twice is
refused in every such file, not only in some.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import yaml

from dfine_deploy.errors import DfineError
from dfine_deploy.yaml_unique import safe_load_unique

JSON_SUFFIXES = (".json",)


def read_text(path: str | os.PathLike, what: str, error: type[DfineError], missing_fix: str = "") -> str:
    """The file's UTF-8 text; `what` names the file in the message ('config file', '--names').

    `missing_fix` is what to do when the file is not there (default: check the path)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} not found: {path}; {missing_fix or 'check the path'}") from None
    except IsADirectoryError:
        raise error(f"{what} {path} is a folder; give the file itself") from None
    except OSError as exc:
        raise error(f"{what} {path}: cannot read it ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8-sig")  # a byte-order mark, as Windows tools write, is no content
    except UnicodeDecodeError as exc:
        raise error(
            f"{what} {path}: cannot read it: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); save it as UTF-8, or check that this is the text file meant"
        ) from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """A YAML parser error as one line: 'line 2, column 1: found character ...' (PyYAML's own text
    spans several lines and quotes the input back)."""
    problem = getattr(exc, "problem", None)
    mark = getattr(exc, "problem_mark", None)
    if problem and mark is not None:
        text = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
        if "'\\t'" in problem:
            text += " (YAML indents with spaces, never tabs)"
        return text
    return " ".join(str(exc).split())


def parse_yaml(text: str, where: str, error: type[DfineError]) -> Any:
    """YAML text (a key given twice refused); `where` names its source in the message."""
    try:
        return safe_load_unique(text)
    except yaml.YAMLError as exc:
        raise error(f"{where} is not valid YAML: {yaml_problem(exc)}") from None


def load_yaml(path: str | os.PathLike, what: str, error: type[DfineError], missing_fix: str = "") -> Any:
    """A YAML file's data; every failure is one line in `error`."""
    text = read_text(path, what, error, missing_fix)
    return parse_yaml(text, f"{what} {Path(path)}", error)


def load_json(path: str | os.PathLike, what: str, error: type[DfineError], missing_fix: str = "") -> Any:
    """A JSON file's data; every failure is one line in `error`."""
    text = read_text(path, what, error, missing_fix)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{what} {Path(path)} is not valid JSON: line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise error(f"{what} {Path(path)} is not valid JSON: nested too deeply to read") from None


def load_yaml_or_json(path: str | os.PathLike, what: str, error: type[DfineError]) -> Any:
    """JSON for a .json file, YAML otherwise (YAML reads most JSON too, but JSON's messages are its own)."""
    if Path(path).suffix.lower() in JSON_SUFFIXES:
        return load_json(path, what, error)
    return load_yaml(path, what, error)
