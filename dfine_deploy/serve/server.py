"""uvicorn's server, with three changes: live clients are told first when a shutdown starts, SIGHUP
stops it as SIGTERM does, and a stop has a deadline.

uvicorn, asked to stop (SIGTERM, SIGINT, `should_exit`), waits `timeout_graceful_shutdown` seconds
for open responses and then cancels them, logging a long ERROR traceback for each; only after that
does the app's lifespan, which ends the streams, run. An SSE or MJPEG response never ends by itself,
so every viewer connected at shutdown used to cost the grace period and a traceback. This server
first hands every WebSocket, SSE and MJPEG client its end ("the server is shutting down"), lets
them finish (at most `END_WAIT_S`), and only then runs uvicorn's own shutdown. Run `create_app`
under it (as `dfine-serve` does) rather than under a plain `uvicorn.Server`.

SIGHUP (the terminal or SSH session the server was started from closed) shuts it down the same
way, segments finished and files closed, and the process then exits with status 0: the hang-up is
no failure of the server. Under `nohup`, which ignores SIGHUP, it stays ignored, and the start-up
log says so (a child of a process that ignores SIGHUP inherits that: `nohup make test` included).

With `stop_deadline_s` (dfine-serve's `--stop-timeout`), every stop (a signal, `--duration`) must
be over within that many seconds, the process's exit included: past it, the server logs one ERROR
line naming each thread still running and where it is, and exits with `DEADLINE_EXIT`, so a stop
can never hang an orchestrator or a terminal. A caller that goes on in the same process (`main` of
dfine_deploy.serve.cli called in-process) ends the watch with `stop_over` once the server has
returned. The signal handlers only set flags: a handler runs between two bytecodes of the main
thread, which may hold the very lock that logging or starting a thread would take; the watchdog
thread, started with the server, does the talking.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import uvicorn

END_WAIT_S = 1.0  # how long clients get to receive their end before uvicorn's shutdown proceeds
DEADLINE_EXIT = 124  # a stop past its deadline (what `timeout` returns for a command it ended)
BACKSTOP_S = 5.0  # after the deadline, the C-level watchdog ends a process whose Python cannot run
POLL_S = 0.1
log = logging.getLogger("dfine_deploy.serve")
PACKAGE = str(Path(__file__).resolve().parents[1])


def _arm_backstop(seconds: float) -> None:
    """The backstop for a process whose Python threads cannot run any more (a native call holding the
    GIL): after `seconds`, a dump of every thread's stack, then exit status 1. faulthandler writes to a
    file descriptor; where sys.stderr has none (replaced by a Python object, as an embedding host or a
    test runner does) the process's own stderr takes the dump, and where that is gone too the log says
    the backstop is off, rather than the stop's watcher dying with it."""
    for stream in (sys.stderr, sys.__stderr__):
        try:
            faulthandler.dump_traceback_later(seconds, exit=True, file=stream)
            return
        except (AttributeError, OSError, RuntimeError, ValueError):  # no usable file descriptor
            continue
    log.warning("no stderr file descriptor: the %g s backstop of the stop deadline is off", seconds)


class Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, stop_deadline_s: float | None = None):
        super().__init__(config)
        self.stop_deadline_s = stop_deadline_s
        self._stop_signal: int | None = None  # the first signal that asked for a stop
        self._stop_over = threading.Event()  # `stop_over`: the deadline's watch ends

    def stop_over(self) -> None:
        """The stop is over for a caller that goes on in this process (`dfine_deploy.serve.cli.main`
        called in-process): the deadline's watch ends, so that it cannot end the caller later. The
        `dfine-serve` command does not call it: its process's exit is part of the stop."""
        self._stop_over.set()
        faulthandler.cancel_dump_traceback_later()

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's SIGINT and SIGTERM handling, plus SIGHUP as a clean shutdown (module docstring),
        and the stop deadline's watchdog."""
        hangup = getattr(signal, "SIGHUP", None)  # not on Windows
        with super().capture_signals():
            if self.stop_deadline_s is not None:
                threading.Thread(target=self._watch_the_stop, name="dfine-stop-deadline", daemon=True).start()
            if hangup is None or threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = signal.signal(hangup, self._hang_up)
            if previous is signal.SIG_IGN:  # nohup: keep ignoring it
                signal.signal(hangup, signal.SIG_IGN)
                log.info("SIGHUP is ignored (nohup): closing the terminal will not stop the server")
            try:
                yield
            finally:
                signal.signal(hangup, previous)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """SIGINT and SIGTERM (uvicorn's handler); no lock may be taken here (module docstring)."""
        if self._stop_signal is None:
            self._stop_signal = sig
        super().handle_exit(sig, frame)

    def _hang_up(self, sig: int, frame: FrameType | None) -> None:
        if self._stop_signal is None:
            self._stop_signal = sig
        self.should_exit = True

    def _watch_the_stop(self) -> None:
        """Wait for a stop to begin, say what began it, and end the process if the stop outlives its
        deadline (this thread is a daemon: a process that exits in time takes it along)."""
        assert self.stop_deadline_s is not None
        while not self.should_exit:
            if self._stop_over.wait(POLL_S):  # the server returned without a stop (it did not start)
                return
        deadline = time.monotonic() + self.stop_deadline_s
        _arm_backstop(self.stop_deadline_s + BACKSTOP_S)
        if self._stop_over.is_set():  # `stop_over` came before the backstop was armed
            faulthandler.cancel_dump_traceback_later()
            return
        if self._stop_signal is not None:  # a stop of our own (--duration) has said why
            log.info("%s: shutting down, finishing recordings and files", _stop_cause(self._stop_signal))
        while time.monotonic() < deadline:
            if self._stop_over.wait(POLL_S):
                return
        log.error(
            "the shutdown did not end within --stop-timeout %g s; still running: %s; exiting with status %d",
            self.stop_deadline_s,
            "; ".join(still_running()),
            DEADLINE_EXIT,
        )
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        os._exit(DEADLINE_EXIT)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        pipeline = getattr(getattr(self.config.app, "state", None), "pipeline", None)
        if pipeline is not None:
            pipeline.end_clients()
            deadline = time.monotonic() + END_WAIT_S
            while pipeline.clients() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await super().shutdown(sockets)


def _stop_cause(sig: int) -> str:
    name = signal.Signals(sig).name
    return f"{name} (the terminal closed?)" if name == "SIGHUP" else name


def still_running() -> list[str]:
    """Every thread but the caller, by name, with where it is: the innermost line of this package
    on its stack (else its innermost line), e.g. 'dfine-output (recording.py:201 write)'."""
    frames = sys._current_frames()
    found = []
    for thread in threading.enumerate():
        if thread is threading.current_thread():
            continue
        frame = frames.get(thread.ident or -1)
        found.append(f"{thread.name} ({_where(frame)})" if frame is not None else thread.name)
    return found


def _where(frame: FrameType) -> str:
    innermost, ours = frame, None
    while frame is not None and ours is None:
        if frame.f_code.co_filename.startswith(PACKAGE):
            ours = frame
        frame = frame.f_back
    chosen = ours or innermost
    return f"{Path(chosen.f_code.co_filename).name}:{chosen.f_lineno} {chosen.f_code.co_name}"
