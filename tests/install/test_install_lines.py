"""The documented install lines, installed and used as a user would: no `dev` extra in the venv.

Every `pip install` line naming this project in README.md, docs/*.md and serve/Dockerfile is read
from the file (a changed line changes the test) and sorted by its extras:

- lines that can install here (a CPU machine) are installed, each set of extras once, into a fresh
  venv of the test's own Python (3.11, the Dockerfile's too). In it: every console script's `--help`;
  `dfine-serve` on a looping video, read by a WebSocket, an SSE and an MJPEG client (run by this
  test's interpreter, so the venv gets no client library it does not declare); `dfine-bench` on a
  tiny artifact folder (the runtime tests' `make_artifact`);
- lines that need an NVIDIA GPU, TensorRT or a Jetson must match a case of scripts/check_installs.py
  (same extras), which resolves them for their platform;
- lines with `train` need torch from its own index first: the Makefile's own install line (which
  `make test` builds) must hold their extras.

Installs run through uv with the documented arguments (scripts/venv_install.py hands it pip's
settings); options that touch only pip's cache, byte-code or verbosity are dropped (PIP_ONLY). The
uv cache (~/.cache/uv, or $UV_CACHE_DIR) keeps the wheels between runs; the venv is built anew each
run, so it holds this tree. Cost of the `.[cpu,serve,tracking]` venv, 2-core AMD EPYC: see
docs/install.md ("The install lines are tests"). Needs PyPI unless the cache holds every wheel.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
import tomllib
import websockets.sync.client

from tests.runtime.test_runtime_detector import make_artifact
from tests.support.processes import interrupt

ROOT = Path(__file__).resolve().parents[2]
DOCS = ("README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")), "serve/Dockerfile")
# `pip install [options] [-e] '<project>[extras]'`, the project being the clone (`.`) or its wheel file
INSTALL = re.compile(
    r"pip install (?P<options>(?:(?!-e )-\S+ )*)(?P<editable>-e )?[\"']?"
    r"(?P<project>\.|dfine[-_]deploy[^\[\s\"']*)\[(?P<extras>[\w,-]+)\][\"']?"
)
HARDWARE = {"gpu-cu12", "gpu-cu13", "trt-cu12", "trt-cu13", "jetpack5", "jetpack6", "jetpack7"}
PIP_ONLY = {"--no-cache-dir", "--no-compile", "-q", "--quiet"}  # change nothing that is installed
SERVE_WAIT_S = 60


def _load_script(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


check_installs = _load_script("check_installs")
venv_install = _load_script("venv_install")


@dataclass(frozen=True)
class InstallLine:
    where: str  # file:line
    text: str
    options: tuple[str, ...]
    editable: bool
    project: str
    extras: frozenset[str]

    @property
    def args(self) -> list[str]:
        """`pip install` arguments as written, less the pip-only options."""
        target = f"{self.project}[{','.join(sorted(self.extras))}]"
        kept = [o for o in self.options if o not in PIP_ONLY]
        return [*kept, *(["-e"] if self.editable else []), target]


def documented_install_lines() -> list[InstallLine]:
    lines = []
    for doc in DOCS:
        for number, text in enumerate((ROOT / doc).read_text().splitlines(), 1):
            for match in INSTALL.finditer(text):
                lines.append(
                    InstallLine(
                        f"{doc}:{number}",
                        match.group(0),
                        tuple(match.group("options").split()),
                        bool(match.group("editable")),
                        match.group("project"),
                        frozenset(match.group("extras").split(",")),
                    )
                )
    return lines


LINES = documented_install_lines()
INSTALLABLE = [line for line in LINES if not line.extras & HARDWARE and "train" not in line.extras]


def test_the_documented_lines_are_found_and_each_is_checked_somewhere():
    found = {line.where.split(":")[0] for line in LINES}
    assert {"README.md", "docs/install.md", "serve/Dockerfile"} <= found, found
    assert frozenset({"cpu", "serve", "tracking"}) in {line.extras for line in INSTALLABLE}
    cases = {frozenset(case.extras) for case in check_installs.CASES}
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    makefile = re.search(r"-e \"\.\[(?P<extras>[\w,-]+)\]\"", (ROOT / "Makefile").read_text())
    unchecked = []
    for line in LINES:
        said = f"{line.where}: `{line.text}`"
        if line.extras - declared:
            unchecked.append(f"{said}: pyproject.toml has no extra {sorted(line.extras - declared)}")
        elif line.project != "." and not line.project.endswith(".whl"):
            unchecked.append(f"{said}: dfine-deploy is not on PyPI; write '.[...]' (from the clone)")
        elif line.extras & HARDWARE and line.extras not in cases:
            unchecked.append(f"{said}: no scripts/check_installs.py case has these extras")
        elif "train" in line.extras and not line.extras <= set(makefile.group("extras").split(",")):
            unchecked.append(f"{said}: extras beyond the Makefile's install line")
    assert not unchecked, "\n".join(unchecked)


EXTRA_SETS = sorted({line.extras for line in INSTALLABLE}, key=sorted)
SERVE_SETS = [extras for extras in EXTRA_SETS if "serve" in extras]  # dfine-serve needs that extra


def _ids(extras: frozenset[str]) -> str:
    return ",".join(sorted(extras))


@pytest.fixture(scope="module", params=EXTRA_SETS, ids=_ids)
def venv(request, tmp_path_factory) -> Path:
    """A fresh venv filled by the documented line of these extras (the non-editable one if any:
    it also proves the wheel carries the package's data files)."""
    same = [each for each in INSTALLABLE if each.extras == request.param]
    line = min(same, key=lambda each: (each.project != ".", each.editable))
    # setuptools builds the wheel in ./build and copies over what is there: a module deleted from the
    # tree would live on in it, so start as a fresh clone does
    shutil.rmtree(ROOT / "build", ignore_errors=True)
    folder = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(folder)], check=True, timeout=120)
    python = str(folder / "bin" / "python")
    planned = venv_install.uv_command(["install", *line.args], venv_install.pip_settings(), python=python)
    assert not isinstance(planned, str), f"uv is needed to fill the venv: {planned}"
    command, env = planned
    started = time.perf_counter()
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, f"{line.where}: `{line.text}` failed:\n{done.stderr[-3000:]}"
    print(f"\n{line.where}: venv filled in {time.perf_counter() - started:.1f} s by {shlex.join(command)}")
    return folder


def _scripts() -> list[str]:
    return sorted(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


def _env() -> dict[str, str]:
    """The user's environment: nothing points at this tree or the test's venv."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


@pytest.mark.slow
def test_console_scripts_answer_help(venv, tmp_path):
    running = {  # started together, then each waited for
        name: subprocess.Popen(
            [str(venv / "bin" / name), "--help"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=_env(),
        )
        for name in _scripts()
    }
    failed = []
    for name, process in running.items():
        out, err = process.communicate(timeout=120)
        if process.returncode != 0 or "usage:" not in out:
            failed.append(f"{name} --help: exit {process.returncode}: {(err or out)[-800:]}")
    assert not failed, "\n".join(failed)


@pytest.fixture(scope="module")
def artifact(tmp_path_factory) -> Path:
    return make_artifact(tmp_path_factory.mktemp("install-lines") / "artifact", batch_max=2)


def _video(path: Path) -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    for i in range(20):
        writer.write(np.full((48, 64, 3), 12 * i, np.uint8))
    writer.release()
    return path


@pytest.fixture
def served(venv, artifact, tmp_path):
    """`dfine-serve ARTIFACT --source clip.mp4 --loop` from the venv: (base URL, stream name)."""
    log = tmp_path / "serve.log"
    port = free_port()
    with log.open("w") as out:
        server = subprocess.Popen(
            [str(venv / "bin" / "dfine-serve"), str(artifact), "--source", str(_video(tmp_path / "clip.mp4")),
             "--loop", "--port", str(port), "--log-level", "warning"],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path, env=_env(),
        )  # fmt: skip
    base, streams = f"127.0.0.1:{port}", []
    try:
        deadline = time.monotonic() + SERVE_WAIT_S
        with httpx.Client(base_url=f"http://{base}", timeout=10) as http:
            while not streams and time.monotonic() < deadline and server.poll() is None:
                with contextlib.suppress(httpx.TransportError):  # not listening yet
                    streams = [s for s in http.get("/v1/streams").json() if s["frames_processed"] > 0]
                time.sleep(0.2)
        assert streams, f"dfine-serve published nothing (exit {server.poll()}):\n{log.read_text()[-3000:]}"
        yield base, streams[0]["name"], log
    finally:
        interrupt(server, timeout=20)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _is_result(item: dict) -> bool:
    return isinstance(item.get("frame_index"), int) and isinstance(item.get("detections"), list)


@pytest.mark.slow
@pytest.mark.parametrize("venv", SERVE_SETS, indirect=True, ids=_ids)
def test_a_served_stream_reaches_websocket_sse_and_mjpeg_clients(served):
    base, name, log = served
    with websockets.sync.client.connect(f"ws://{base}/v1/streams/{name}/ws", open_timeout=10) as ws:
        message = json.loads(ws.recv(timeout=20))
    assert _is_result(message), message

    with httpx.stream("GET", f"http://{base}/v1/streams/{name}/events", timeout=20) as response:
        assert response.status_code == 200, response.read()
        data = next(line for line in response.iter_lines() if line.startswith("data: "))
    assert _is_result(json.loads(data[len("data: ") :])), data

    jpeg = b""
    with httpx.stream("GET", f"http://{base}/v1/streams/{name}/mjpeg", timeout=20) as response:
        assert response.status_code == 200 and "multipart/x-mixed-replace" in response.headers["content-type"]
        buffered = b""
        for chunk in response.iter_bytes():
            buffered += chunk
            start = buffered.find(b"\xff\xd8")
            end = buffered.find(b"\xff\xd9", start + 2)
            if start >= 0 and end > 0:
                jpeg = buffered[start : end + 2]
                break
    image = cv2.imdecode(np.frombuffer(jpeg, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None and image.shape == (48, 64, 3), log.read_text()[-2000:]


@pytest.mark.slow
def test_bench_runs_on_a_tiny_artifact(venv, artifact, tmp_path):
    report = tmp_path / "bench.json"
    done = subprocess.run(
        [str(venv / "bin" / "dfine-bench"), "--model", str(artifact), "--device", "cpu",
         "--backend", "onnxruntime", "--runs", "3", "--warmup", "1", "--json", str(report)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=_env(),
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    rows = json.loads(report.read_text())["rows"]
    assert rows and all(r["provider"] == "CPUExecutionProvider" for r in rows), rows
