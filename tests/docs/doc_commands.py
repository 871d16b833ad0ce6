"""The docs are tests: every shell command in README.md and docs/*.md runs as written.

Each line of a fenced bash/sh/console/shell block is run by bash from a folder that looks like the
repository root (its files linked in), with the docs' relative paths. The docs' placeholders exist
there, each standing for a file of the quickstart's run (`PLACEHOLDERS`: `my_set` is its data,
`best.pth` its checkpoint, ...), so no command's text is changed.

How a line is run is said in the docs themselves, by a tag at the end of its comment (`TAGS`); a
line without one must exit 0. A tag the table does not know fails the suite, and so does a new line
that fails: adding a command to the docs adds its run. docs/development.md describes the tags.

The pages are split into groups (`GROUPS`), one test file each (tests/docs/test_docs_*.py), so that
pytest-xdist (`--dist loadfile`) runs them on different workers. They share one folder for the
session (`shared_sandbox`, made by whichever worker asks first). A line that uses a path an earlier
line writes (`Command.after`: the README's export line makes the `artifacts/n` that docs/bench.md
reads) runs after it, wherever that earlier line's test is: each line runs once per session
(`outcome`), by its own test or, first, by a later line that needs it; the result is kept, and the
line's own test reports it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from filelock import FileLock

from tests.support.processes import interrupt

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_BLOCK = re.compile(r"^```(bash|sh|console|shell)[ \t]*\n(.*?)^```", re.M | re.S)
TAG = re.compile(r"\[([a-z][a-z ]*?)(?::\s*([^\]]+))?\]\s*$")

# The docs' placeholders: each names what stands at that path, relative to the quickstart's run
# folder (the `quickstart_run` fixture); `None` for a file of its own, written by `_sandbox`.
PLACEHOLDERS: dict[str, str | None] = {
    "runs/quickstart": ".",
    "my_set": "data",
    "data/my_set": "data/val",
    "runs/synthetic": "data",  # the synthetic config's own place for the data (configs/dataset/)
    "best.pth": "train/best.pth",
    "runs/s/best.pth": "train/best.pth",
    "artifacts/dfine-n": "export",
    "ARTIFACT": "export",  # copied: the TensorRT lines write into it
    "video.mp4": "serve/input.mp4",
    "phone-clip.mp4": "serve/input.mp4",
    "CFG": None,  # a config of the quickstart's recipe and data, one epoch (`_CFG`)
}
ENV = {
    "KEY": "docs-test-key",  # `--api-key "$KEY"`
    # Official weights by name (docs/models.md) come from a closed port into a fresh cache in the
    # sandbox: the suite never downloads them, online or not, so those lines are tagged [needs: ...].
    "DFINE_WEIGHTS_URL": "http://127.0.0.1:9/",
    "DFINE_HOME": "dfine-home",
}
_CFG = """\
__include__: [configs/quickstart/dfine_n_synthetic.yml]
epochs: 1
output_dir: runs/cfg
"""

# What each tag means for the run. A line without a tag must exit 0.
TAGS = {
    "needs": "run; this machine lacks what it names, so it must refuse: the reason on stderr and no "
    "traceback; ours also exit non-zero, and a console script says it in one `error:` line",
    "runs until stopped": "start it, wait until GET /healthz answers, stop it with Ctrl-C (it must end "
    "cleanly)",
    "while the line above runs": "run it while the line above (a server) runs; it must exit 0",
    "the suite adds": "run it with these flags added (a bound on a long run); it must exit 0",
    "tested by": "not run here: the named test runs it (the file must exist and name the command)",
    "the suite itself": "not run here: this line runs the test suite",
}
TIMEOUT_S = 420
READY_S = 120

# Which test file runs a page's commands: tests/docs/test_docs_GROUP.py. Groups are for pytest-xdist,
# which gives each file to one worker: the README's exports, the pages on making a model and the
# pages on running one take a few minutes each. A page not named here runs with "build".
GROUPS = {
    "README.md": "readme",
    "docs/bench.md": "run",
    "docs/serve.md": "run",
    "docs/serving.md": "run",
    "docs/sources.md": "run",
}
DEFAULT_GROUP = "build"
UNLINKED = ("runs", "artifacts")  # what the docs' lines write: the sandbox starts without them


@dataclass
class Command:
    page: str  # README.md, docs/export.md
    line: int
    text: str  # the command as written, its comment cut off
    tag: str | None
    value: str | None
    companions: list[Command]  # lines run while this one runs
    also: list[str]  # the same line on other pages: one run covers them
    after: list[Command] = field(default_factory=list)  # earlier lines that write what it uses

    @property
    def where(self) -> str:
        return " = ".join([f"{self.page}:{self.line}", *self.also])

    @property
    def key(self) -> str:
        """A file name for this line's kept result."""
        return hashlib.sha1(f"{self.where}\n{self.text}".encode()).hexdigest()[:16]


def _split_comment(line: str) -> tuple[str, str]:
    """(command, comment): the comment starts at a `#` that begins a word outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i].rstrip(), line[i + 1 :].strip()
    return line.rstrip(), ""


def doc_commands() -> list[Command]:
    commands: list[Command] = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for block in SHELL_BLOCK.finditer(text):
            first = text[: block.start(2)].count("\n") + 1
            pending = ""
            for offset, raw in enumerate(block.group(2).splitlines()):
                line = pending + raw.removeprefix("$ ")
                if line.rstrip().endswith("\\"):
                    pending = line.rstrip()[:-1] + " "
                    continue
                pending = ""
                command, comment = _split_comment(line)
                if not command:
                    continue
                tag = TAG.search(comment)
                name, value = (tag.group(1), tag.group(2)) if tag else (None, None)
                where = str(page.relative_to(ROOT))
                found = Command(where, first + offset, command, name, value and value.strip(), [], [])
                same = [c for c in commands if (c.text, c.tag, c.value) == (command, name, found.value)]
                if name == "while the line above runs" and commands:
                    commands[-1].companions.append(found)
                elif same and not same[0].companions:
                    same[0].also.append(f"{where}:{found.line}")
                else:
                    commands.append(found)
    return commands


def _is_fixed(word: str) -> bool:
    """A path no line changes: a placeholder standing for the quickstart's files (or under one), or a
    file of the repository (configs/..., serve/...)."""
    fixed = [name for name, target in PLACEHOLDERS.items() if target is not None]
    top = word.split("/")[0]
    under = any(word == name or word.startswith(name + "/") for name in fixed)
    return under or (top not in UNLINKED and (ROOT / top).exists())


def _paths(command: Command) -> set[str]:
    """The paths a line names that lines can write: artifacts/n, bench.json, out/, CFG (its output_dir)."""
    try:
        words = shlex.split(command.text)
    except ValueError:
        return set()
    named = {
        word.rstrip("/")
        for word in words
        if not word.startswith("-")
        and not any(ch.isspace() for ch in word)
        and "://" not in word
        and ("/" in word or "." in word or word in PLACEHOLDERS)
        and not word.replace(".", "").isdigit()
    }
    return {word for word in named if not _is_fixed(word)}


def _shares(a: set[str], b: set[str]) -> bool:
    return any(x == y or x.startswith(y + "/") or y.startswith(x + "/") for x in a for y in b)


def _order(commands: list[Command]) -> None:
    """Each line runs after the earlier lines that name a path it names: one of them may write it."""
    for i, command in enumerate(commands):
        mine = _paths(command) | {p for c in command.companions for p in _paths(c)}
        command.after = [earlier for earlier in commands[:i] if _shares(mine, _paths(earlier))]


COMMANDS = doc_commands()
_order(COMMANDS)


def group_of(command: Command) -> str:
    return GROUPS.get(command.page, DEFAULT_GROUP)


# -------------------------------------------------------------------------------- the sandbox


def shared_sandbox(quickstart_run: Path, base: Path) -> Path:
    """A folder that looks like the repository root: its files linked in, the placeholders made.
    One per session: `base` is the session's folder (above the xdist workers' own), and the first
    worker to ask makes it, under a file lock."""
    root = base / "docs-sandbox" / "repo"
    root.parent.mkdir(exist_ok=True)
    with FileLock(str(root.parent / "make.lock")):
        if (root.parent / "made").is_file():
            return root
        shutil.rmtree(root, ignore_errors=True)  # a half-made one
        root.mkdir()
        for entry in ROOT.iterdir():
            # `make test` builds .venv-rknn before the suite: `make rknn-venv` finds it done, as in the
            # checkout (without it here, the line builds it in the sandbox)
            linked = not entry.name.startswith(".") or entry.name == ".venv-rknn"
            if linked and entry.name not in UNLINKED:
                (root / entry.name).symlink_to(entry)
        for name, target in PLACEHOLDERS.items():
            place = root / name
            place.parent.mkdir(parents=True, exist_ok=True)
            if target is None:
                continue
            source = (quickstart_run / target).resolve()
            if name == "ARTIFACT":
                shutil.copytree(source, place)
            else:
                place.symlink_to(source)
        (root / "CFG").write_text(_CFG, encoding="utf-8")
        (root.parent / "results").mkdir()
        (root.parent / "made").touch()
    return root


def _env() -> dict[str, str]:
    bin_dir = str(Path(sys.executable).parent)  # console scripts and `python` of this interpreter
    path = os.pathsep.join([bin_dir, os.environ.get("PATH", "")])
    return {**os.environ, **ENV, "PATH": path, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}


def _run(command: str, cwd: Path, timeout: float = TIMEOUT_S) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", command],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _shown(proc: subprocess.CompletedProcess | None, out: str = "", err: str = "") -> str:
    out, err = (proc.stdout, proc.stderr) if proc is not None else (out, err)
    return f"\n--- stdout (end)\n{out[-3000:]}\n--- stderr (end)\n{err[-3000:]}"


def _exit_0(cmd: Command, proc: subprocess.CompletedProcess) -> str | None:
    return (
        None if proc.returncode == 0 else f"{cmd.where}: `{cmd.text}` exited {proc.returncode}" + _shown(proc)
    )


def _ours(command: str) -> bool:
    """A console script of this package, or a script of this repository (python X, bash X, X)."""
    words = shlex.split(command)
    program = words[1] if words[0] in ("python", "bash") and len(words) > 1 else words[0]
    return program.startswith("dfine-") or (ROOT / program).is_file()


def _refusal(cmd: Command, proc: subprocess.CompletedProcess) -> str | None:
    """Ours refuse with a non-zero exit and the reason on stderr (a console script: one `error:`
    line, a hint may follow); another program (gdb) need only say what it lacks. No traceback."""
    said = f"{cmd.where}: `{cmd.text}` [needs: {cmd.value}]"
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    if "Traceback" in proc.stdout + proc.stderr:
        return f"{said} printed a traceback" + _shown(proc)
    if not lines:
        return f"{said} refused without saying why" + _shown(proc)
    if _ours(cmd.text) and not 0 < proc.returncode < 128:
        return f"{said} exited {proc.returncode}, no refusal" + _shown(proc)
    if cmd.text.startswith("dfine-") and len([line for line in lines if line.startswith("error:")]) != 1:
        return f"{said}: not one `error:` line" + _shown(proc)
    return None


def _port(command: str) -> int:
    words = shlex.split(command)
    return int(words[words.index("--port") + 1]) if "--port" in words else 8000


def _run_until_stopped(cmd: Command, cwd: Path) -> str | None:
    """Start the server as written, wait for /healthz, run the companion lines, stop it with SIGINT.
    Its output goes to files: a full pipe would stop a server that logs every request. One server
    on a port at a time, across the xdist workers."""
    port = _port(cmd.text)
    with FileLock(str(cwd.parent / f"port-{port}.lock")):
        with socket.socket() as probe:  # the docs' port: another server there would answer for ours
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return f"{cmd.where}: port {port} is taken here, so `{cmd.text}` cannot be checked"
        out_path, err_path = cwd.parent / f"{cmd.key}.out", cwd.parent / f"{cmd.key}.err"
        with open(out_path, "w") as out, open(err_path, "w") as err:
            argv = ["bash", "-c", "exec " + cmd.text]
            proc = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=out, stderr=err)
        url = f"http://127.0.0.1:{port}/healthz"
        failure = None
        try:
            deadline = time.monotonic() + READY_S
            ready = False
            while not ready and proc.poll() is None and time.monotonic() < deadline:
                try:
                    with urllib.request.urlopen(url, timeout=2) as answer:
                        ready = answer.status == 200
                except OSError:
                    time.sleep(0.5)
            for companion in cmd.companions if ready else []:
                failure = failure or _exit_0(companion, _run(companion.text, cwd, timeout=60))
        finally:
            status = interrupt(proc, timeout=60)
    shown = _shown(None, out_path.read_text(), err_path.read_text())
    if not ready:
        return f"{cmd.where}: `{cmd.text}` never answered {url}" + shown
    if status not in (0, 130):
        return f"{cmd.where}: Ctrl-C ended it with {status}" + shown
    if "Traceback" in shown:
        return f"{cmd.where}: a traceback at Ctrl-C" + shown
    return failure


def _tested_by(cmd: Command) -> str | None:
    target = ROOT / (cmd.value or "")
    if not (cmd.value and target.is_file()):
        return f"{cmd.where}: [tested by: {cmd.value}] names no file"
    words = shlex.split(cmd.text)
    program = Path(words[1] if words[0] in ("make", "python", "bash") else words[0]).stem
    if program not in target.read_text(encoding="utf-8"):
        return f"{cmd.where}: {cmd.value} does not name `{program}`, so it cannot be what runs `{cmd.text}`"
    return None


def _check(cmd: Command, cwd: Path) -> str | None:
    """Run the line as its tag says; None when it did, else what went wrong."""
    if cmd.tag is not None and cmd.tag not in TAGS:
        return f"{cmd.where}: unknown tag [{cmd.tag}]; the tags are {sorted(TAGS)}"
    if cmd.tag == "tested by":
        return _tested_by(cmd)
    if cmd.tag == "the suite itself":
        suite = re.match(r"(make test|python -X faulthandler -m pytest)\b", cmd.text)
        return None if suite else f"{cmd.where}: `{cmd.text}` is not the suite's command"
    if cmd.tag == "runs until stopped":
        return _run_until_stopped(cmd, cwd)
    if cmd.companions:
        return f"{cmd.where}: lines run 'while the line above runs' follow no server"
    text = f"{cmd.text} {cmd.value}" if cmd.tag == "the suite adds" else cmd.text
    proc = _run(text, cwd)
    return _refusal(cmd, proc) if cmd.tag == "needs" else _exit_0(cmd, proc)


def outcome(cmd: Command, sandbox: Path) -> str | None:
    """The line's result, run once per session: by the first test that needs it (its own, or that of
    a later line using what it writes), after the earlier lines it needs; kept in the sandbox."""
    kept = sandbox.parent / "results" / f"{cmd.key}.json"
    with FileLock(str(kept.with_suffix(".lock"))):
        if not kept.is_file():
            for earlier in cmd.after:
                outcome(earlier, sandbox)
            kept.write_text(json.dumps({"failure": _check(cmd, sandbox)}), encoding="utf-8")
        return json.loads(kept.read_text(encoding="utf-8"))["failure"]


def line_tests(group: str):
    """The test of one group's file (tests/docs/test_docs_GROUP.py): one a line, in the docs' order."""
    commands = [command for command in COMMANDS if group_of(command) == group]

    @pytest.mark.slow
    @pytest.mark.timeout(1200)  # the first line to run waits for the shared quickstart run
    @pytest.mark.parametrize("cmd", commands, ids=[f"{c.page}:{c.line}" for c in commands])
    def test_doc_command(cmd: Command, request: pytest.FixtureRequest) -> None:
        if cmd.tag in ("tested by", "the suite itself") or (cmd.tag is not None and cmd.tag not in TAGS):
            failure = _check(cmd, ROOT)  # nothing runs
        else:
            quickstart = request.getfixturevalue("quickstart_run")
            failure = outcome(cmd, shared_sandbox(quickstart, request.getfixturevalue("session_folder")))
        assert failure is None, failure

    return test_doc_command
