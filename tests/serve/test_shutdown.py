"""Every stop of a real `dfine-serve` is bounded: SIGTERM, SIGHUP and Ctrl-C each have a deadline
(--stop-timeout) after which the server names what it still waited for and exits non-zero."""

from __future__ import annotations

import io
import logging
import signal
import subprocess
import sys
import threading
import time

import pytest
import uvicorn
from conftest import default_hangup, wait_for, write_video
from tiny_model import red_score_model

from dfine_deploy.serve import server as server_module
from dfine_deploy.serve.server import DEADLINE_EXIT

# dfine-serve whose recordings go to a disk that hangs: the first frame written never returns
HANGING_DISK = """
import sys, threading
from dfine_deploy.serve import recording
recording._H264Writer.write = lambda self, image: threading.Event().wait()
from dfine_deploy.serve.cli import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return red_score_model(tmp_path_factory.mktemp("model") / "red.onnx")


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_a_stop_that_hangs_ends_at_its_deadline_naming_what_it_waited_for(tmp_path, model_path, stop):
    video = write_video(tmp_path / "cam.mp4", 20, fps=20)
    out = tmp_path / "out"
    command = [
        sys.executable, "-c", HANGING_DISK, str(model_path), "--backend", "onnxruntime", "--port", "0",
        "--log-level", "warning", "--source", str(video), "--loop", "--record", str(out),
        "--stop-timeout", "3",
    ]  # fmt: skip
    server = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, preexec_fn=default_hangup
    )
    try:
        # the stream's folder is made as its first segment opens, just before the write that hangs
        wait_for(lambda: (out / "cam").is_dir() or server.poll() is not None, 90, "the first segment")
        assert server.poll() is None, server.stderr.read()
        time.sleep(1.0)  # the output thread is inside the write now
        started = time.monotonic()
        server.send_signal(stop)
        _, stderr = server.communicate(timeout=30)
        took = time.monotonic() - started
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == DEADLINE_EXIT, stderr
    assert 3 <= took < 3 + 10, took
    (line,) = [line for line in stderr.splitlines() if "did not end within" in line]
    assert "--stop-timeout 3 s" in line and "dfine-output (recording.py:" in line, line
    assert "Traceback" not in stderr


@pytest.mark.parametrize("over", [False, True], ids=["the-stop-hangs", "main-returned"])
def test_the_stop_deadline_ends_the_process_only_while_the_stop_lasts(monkeypatch, over):
    """In-process, `main` ends the deadline's watch on return (`Server.stop_over`): the watch would
    otherwise end the caller (a host embedding dfine-serve, a test) at a deadline long after its stop."""
    exits: list[int] = []
    monkeypatch.setattr(server_module.os, "_exit", exits.append)
    monkeypatch.setattr(server_module.faulthandler, "dump_traceback_later", lambda *a, **k: None)
    server = server_module.Server(uvicorn.Config(app=None), stop_deadline_s=0.5)
    watcher = threading.Thread(target=server._watch_the_stop, daemon=True)
    watcher.start()
    server.should_exit = True  # a stop begins
    if over:
        server.stop_over()
    watcher.join(timeout=5)
    assert not watcher.is_alive()
    assert exits == ([] if over else [DEADLINE_EXIT])


@pytest.mark.parametrize("stderr_left", [True, False], ids=["process-stderr", "none"])
def test_the_stop_backstop_arms_where_sys_stderr_has_no_file_descriptor(monkeypatch, caplog, stderr_left):
    """An embedding host or a test runner replaces sys.stderr with a Python object without a file
    descriptor; faulthandler refused it and the stop's watcher died before its deadline. The process's
    own stderr takes the dump now, and where that is gone too the log says the backstop is off."""
    armed: list[object] = []

    def dump_traceback_later(seconds, exit=False, file=None):
        file.fileno()  # what faulthandler asks of its file: io.UnsupportedOperation without one
        armed.append(file)

    monkeypatch.setattr(server_module.faulthandler, "dump_traceback_later", dump_traceback_later)
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    monkeypatch.setattr(sys, "__stderr__", sys.__stderr__ if stderr_left else None)
    with caplog.at_level(logging.WARNING, logger="dfine_deploy.serve"):
        server_module._arm_backstop(3600)
    if stderr_left:
        assert armed == [sys.__stderr__] and "backstop" not in caplog.text
    else:
        assert armed == [] and "the 3600 s backstop of the stop deadline is off" in caplog.text


def test_a_server_that_returned_without_a_stop_ends_the_deadlines_watch():
    """A server that never stopped (it could not bind its port) never sets `should_exit`: `stop_over`
    ends the watch all the same, instead of a thread polling for the rest of the caller's process."""
    server = server_module.Server(uvicorn.Config(app=None), stop_deadline_s=0.5)
    watcher = threading.Thread(target=server._watch_the_stop, daemon=True)
    watcher.start()
    server.stop_over()
    watcher.join(timeout=5)
    assert not watcher.is_alive()
