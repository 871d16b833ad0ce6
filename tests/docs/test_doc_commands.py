"""The docs are tests: every shell command in README.md and docs/*.md runs here as written.

Each line of a fenced bash/sh/console/shell block is run by bash from a folder that looks like the
repository root (its files linked in), with the docs' relative paths. The docs' placeholders exist
there, each standing for a file of the quickstart's run (`PLACEHOLDERS`: `my_set` is its data,
`best.pth` its checkpoint, ...), so no command's text is changed. The commands run in the docs' order,
as a reader runs them: the README's export line writes the `artifacts/n` that later lines read.

How a line is run is said in the docs themselves, by a tag at the end of its comment (`TAGS`); a
line without one must exit 0. A tag the table does not know fails the suite, and so does a new line
that fails: adding a command to the docs adds its run here. docs/development.md describes the tags.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

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


@dataclass
class Command:
    page: str  # README.md, docs/export.md
    line: int
    text: str  # the command as written, its comment cut off
    tag: str | None
    value: str | None
    companions: list[Command]  # lines run while this one runs
    also: list[str]  # the same line on other pages: one run covers them

    @property
    def where(self) -> str:
        return " = ".join([f"{self.page}:{self.line}", *self.also])


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


COMMANDS = doc_commands()


# -------------------------------------------------------------------------------- the sandbox


@pytest.fixture(scope="module")
def sandbox(tmp_path_factory, quickstart_run: Path) -> Path:
    """A folder that looks like the repository root: its files linked in, the placeholders made."""
    root = tmp_path_factory.mktemp("docs") / "repo"
    root.mkdir()
    for entry in ROOT.iterdir():
        if not entry.name.startswith(".") and entry.name not in ("runs", "artifacts"):
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


def _check_exit_0(cmd: Command, proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"{cmd.where}: `{cmd.text}` exited {proc.returncode}" + _shown(proc)


def _ours(command: str) -> bool:
    """A console script of this package, or a script of this repository (python X, bash X, X)."""
    words = shlex.split(command)
    program = words[1] if words[0] in ("python", "bash") and len(words) > 1 else words[0]
    return program.startswith("dfine-") or (ROOT / program).is_file()


def _check_refusal(cmd: Command, proc: subprocess.CompletedProcess) -> None:
    """Ours refuse with a non-zero exit and the reason on stderr (a console script: one `error:`
    line, a hint may follow); another program (gdb) need only say what it lacks. No traceback."""
    said = f"{cmd.where}: `{cmd.text}` [needs: {cmd.value}]"
    assert "Traceback" not in proc.stdout + proc.stderr, f"{said} printed a traceback" + _shown(proc)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert lines, f"{said} refused without saying why" + _shown(proc)
    if _ours(cmd.text):
        assert 0 < proc.returncode < 128, f"{said} exited {proc.returncode}, no refusal" + _shown(proc)
    if cmd.text.startswith("dfine-"):
        errors = [line for line in lines if line.startswith("error:")]
        assert len(errors) == 1, f"{said}: not one `error:` line" + _shown(proc)


def _port(command: str) -> int:
    words = shlex.split(command)
    return int(words[words.index("--port") + 1]) if "--port" in words else 8000


def _run_until_stopped(cmd: Command, cwd: Path) -> None:
    """Start the server as written, wait for /healthz, run the companion lines, stop it with SIGINT.
    Its output goes to files: a full pipe would stop a server that logs every request."""
    port = _port(cmd.text)
    with socket.socket() as probe:  # the docs' port: another server there would answer for ours
        busy = probe.connect_ex(("127.0.0.1", port)) == 0
    assert not busy, f"{cmd.where}: port {port} is taken here, so `{cmd.text}` cannot be checked"
    out_path, err_path = cwd / ".server.out", cwd / ".server.err"
    with open(out_path, "w") as out, open(err_path, "w") as err:
        argv = ["bash", "-c", "exec " + cmd.text]
        proc = subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=out, stderr=err)
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        deadline = time.monotonic() + READY_S
        ready = False
        while not ready and proc.poll() is None and time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(url, timeout=2) as answer:
                    ready = answer.status == 200
            except OSError:
                time.sleep(0.5)
        if ready:
            for companion in cmd.companions:
                _check_exit_0(companion, _run(companion.text, cwd, timeout=60))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    shown = _shown(None, out_path.read_text(), err_path.read_text())
    assert ready, f"{cmd.where}: `{cmd.text}` never answered {url}" + shown
    assert proc.returncode in (0, 130), f"{cmd.where}: Ctrl-C ended it with {proc.returncode}" + shown
    assert "Traceback" not in shown, f"{cmd.where}: a traceback at Ctrl-C" + shown


def _check_tested_by(cmd: Command) -> None:
    target = ROOT / (cmd.value or "")
    assert cmd.value and target.is_file(), f"{cmd.where}: [tested by: {cmd.value}] names no file"
    words = shlex.split(cmd.text)
    program = Path(words[1] if words[0] in ("make", "python", "bash") else words[0]).stem
    assert program in target.read_text(encoding="utf-8"), (
        f"{cmd.where}: {cmd.value} does not name `{program}`, so it cannot be what runs `{cmd.text}`"
    )


@pytest.mark.slow
@pytest.mark.timeout(1200)  # the first run that needs the sandbox waits for the shared quickstart run
@pytest.mark.parametrize("cmd", COMMANDS, ids=[f"{c.page}:{c.line}" for c in COMMANDS])
def test_doc_command(cmd: Command, request) -> None:
    if cmd.tag is not None and cmd.tag not in TAGS:
        pytest.fail(f"{cmd.where}: unknown tag [{cmd.tag}]; the tags are {sorted(TAGS)}")
    if cmd.tag == "tested by":
        _check_tested_by(cmd)
        return
    if cmd.tag == "the suite itself":
        assert re.match(r"(make test|python -X faulthandler -m pytest)\b", cmd.text), cmd.where
        return
    cwd = request.getfixturevalue("sandbox")
    if cmd.tag == "runs until stopped":
        _run_until_stopped(cmd, cwd)
        return
    assert not cmd.companions, f"{cmd.where}: lines run 'while the line above runs' follow no server"
    text = f"{cmd.text} {cmd.value}" if cmd.tag == "the suite adds" else cmd.text
    proc = _run(text, cwd)
    if cmd.tag == "needs":
        _check_refusal(cmd, proc)
    else:
        _check_exit_0(cmd, proc)


def test_every_page_with_commands_is_read():
    """The extraction finds the commands (a changed fence or page layout would silently find none)."""
    pages = {c.page for c in COMMANDS}
    assert {"README.md", "docs/export.md", "docs/serve.md", "docs/train.md"} <= pages, pages
    assert len(COMMANDS) >= 50
