"""uvicorn's server, with one change: live clients are told first when a shutdown starts.

uvicorn, asked to stop (SIGTERM, SIGINT, `should_exit`), waits `timeout_graceful_shutdown` seconds
for open responses and then cancels them, logging a long ERROR traceback for each; only after that
does the app's lifespan, which ends the streams, run. An SSE or MJPEG response never ends by itself,
so every viewer connected at shutdown used to cost the grace period and a traceback. This server
first hands every WebSocket, SSE and MJPEG client its end ("the server is shutting down"), lets
them finish (at most `END_WAIT_S`), and only then runs uvicorn's own shutdown. Run `create_app`
under it (as `dfine-serve` does) rather than under a plain `uvicorn.Server`.

SIGHUP (the terminal or SSH session the server was started from closed) shuts it down the same
way, segments finished and files closed, and the process then exits with status 0: the hang-up is
no failure of the server. Under `nohup`, which ignores SIGHUP, it stays ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
import threading
import time
from collections.abc import Iterator

import uvicorn

END_WAIT_S = 1.0  # how long clients get to receive their end before uvicorn's shutdown proceeds
log = logging.getLogger("dfine_deploy.serve")


class Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """uvicorn's SIGINT and SIGTERM handling, plus SIGHUP as a clean shutdown (module docstring)."""
        hangup = getattr(signal, "SIGHUP", None)  # not on Windows
        with super().capture_signals():
            if hangup is None or threading.current_thread() is not threading.main_thread():
                yield
                return
            previous = signal.signal(hangup, self._hang_up)
            if previous is signal.SIG_IGN:  # nohup: keep ignoring it
                signal.signal(hangup, signal.SIG_IGN)
            try:
                yield
            finally:
                signal.signal(hangup, previous)

    def _hang_up(self, sig: int, frame: object) -> None:
        log.info("SIGHUP (the terminal closed?): shutting down, finishing recordings and files")
        self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        pipeline = getattr(getattr(self.config.app, "state", None), "pipeline", None)
        if pipeline is not None:
            pipeline.end_clients()
            deadline = time.monotonic() + END_WAIT_S
            while pipeline.clients() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await super().shutdown(sockets)
