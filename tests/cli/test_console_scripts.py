"""What every console script shares: piping into `head` ends quietly, never with a traceback."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from dfine_deploy.cli import SIGPIPE_EXIT

ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/dfine/dfine_hgnetv2_n_coco.yml"


def _console_scripts() -> dict[str, str]:
    """[project.scripts] of pyproject.toml: name -> 'module:function'."""
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    section = text.split("[project.scripts]", 1)[1].split("\n[", 1)[0]
    scripts = dict(re.findall(r'^([\w-]+)\s*=\s*"([\w.]+:\w+)"', section, flags=re.M))
    assert scripts, "pyproject.toml lists no console scripts"
    return scripts


SCRIPTS = _console_scripts()
# Each script with --help, plus the commands that print the most without building a model.
CASES = [(name, ["--help"]) for name in SCRIPTS] + [
    ("dfine-info", ["-c", CONFIG, "--print-config"]),
    ("dfine-bench", ["--tables"]),
]


def _command(name: str, args: list[str]) -> list[str]:
    """The console script as its installed wrapper runs it, on this checkout's code."""
    module, function = SCRIPTS[name].split(":")
    launcher = f"import sys; from {module} import {function}; sys.exit({function}())"
    return [sys.executable, "-c", launcher, *args]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def test_every_console_script_is_covered():
    assert {name for name, _ in CASES} == set(SCRIPTS)
    assert {"dfine-info", "dfine-export", "dfine-bench", "dfine-serve"} <= set(SCRIPTS)


@pytest.mark.parametrize(("name", "args"), CASES, ids=[f"{n} {' '.join(a)}" for n, a in CASES])
def test_a_reader_that_left_ends_the_command_quietly(name, args):
    """The strict form of `| head -1`: the reader is gone before the first write."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            _command(name, args),
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=_env(),
            timeout=300,
        )
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    # argparse drops a --help it cannot write (exit 0); output printed by the command gets 141
    assert done.returncode == (0 if args == ["--help"] else SIGPIPE_EXIT), done.stderr


def test_print_config_piped_into_head_prints_its_first_line_only():
    shell = " ".join(shlex.quote(part) for part in _command("dfine-info", ["-c", CONFIG, "--print-config"]))
    done = subprocess.run(
        ["bash", "-c", f"{shell} | head -1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_env(),
        timeout=300,
    )
    assert done.returncode == 0 and done.stderr == "", done.stderr
    assert done.stdout == f"# merged config of {ROOT / CONFIG}\n"  # -c is held absolute


@pytest.mark.parametrize(
    ("name", "args", "stdout", "words"),
    [
        ("dfine-info", ["-c", CONFIG, "--print-config"], "/dev/full", "No space left on device; free space"),
        (
            "dfine-data",
            ["synth", "--out", "/sys/dfine-deploy-test", "--images", "2"],
            None,
            "/sys/dfine-deploy-test",
        ),
    ],
    ids=["disk full", "read-only place"],
)
def test_a_machine_that_refuses_a_write_is_one_line(name, args, stdout, words):
    """A full disk or a place nobody may write (`/sys`, even for root) is the machine's answer, not a
    bug: one line with the path and what to do, status 2, no traceback."""
    with open(stdout or os.devnull, "w") as sink:
        done = subprocess.run(
            _command(name, args),
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=_env(),
            timeout=300,
        )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr, done.stderr
