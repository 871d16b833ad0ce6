"""uvicorn's server, with one change: live clients are told first when a shutdown starts.

uvicorn, asked to stop (SIGTERM, SIGINT, `should_exit`), waits `timeout_graceful_shutdown` seconds
for open responses and then cancels them, logging a long ERROR traceback for each; only after that
does the app's lifespan, which ends the streams, run. An SSE or MJPEG response never ends by itself,
so every viewer connected at shutdown used to cost the grace period and a traceback. This server
first hands every WebSocket, SSE and MJPEG client its end ("the server is shutting down"), lets
them finish (at most `END_WAIT_S`), and only then runs uvicorn's own shutdown. Run `create_app`
under it (as `dfine-serve` does) rather than under a plain `uvicorn.Server`.
"""

from __future__ import annotations

import asyncio
import socket
import time

import uvicorn

END_WAIT_S = 1.0  # how long clients get to receive their end before uvicorn's shutdown proceeds


class Server(uvicorn.Server):
    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        pipeline = getattr(getattr(self.config.app, "state", None), "pipeline", None)
        if pipeline is not None:
            pipeline.end_clients()
            deadline = time.monotonic() + END_WAIT_S
            while pipeline.clients() and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
        await super().shutdown(sockets)
