"""API keys: who may call what, and keeping keys out of the logs.

The key travels in the X-API-Key header. Browsers cannot set headers on a WebSocket, an EventSource
(server-sent events) or an <img> (MJPEG), so those routes (a stream's ws, events and mjpeg, and
/v1/events/live), and only those, also accept it as `?api_key=`; everywhere else the query form is
refused, because URLs end up in logs, histories and proxies. The health probes, the dashboard page
and the API docs need no key (they are static; every call they make does).
"""

from __future__ import annotations

import hmac
import logging
import re

from fastapi import HTTPException, Security, WebSocketException, status
from fastapi.security import APIKeyHeader
from starlette.requests import HTTPConnection
from typing_extensions import Annotated  # typing.Annotated is 3.9; serve runs on 3.8

API_KEY_HEADER = "X-API-Key"
QUERY_KEY = "api_key"
_header = APIKeyHeader(
    name=API_KEY_HEADER, auto_error=False, description="the server's --api-key (not needed when it has none)"
)


def key_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison, so response timing reveals nothing about the key."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _refuse(conn: HTTPConnection, reason: str) -> None:
    if conn.scope["type"] == "websocket":
        raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION, reason=reason)
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED, detail=reason, headers={"WWW-Authenticate": API_KEY_HEADER}
    )


async def require_api_key(conn: HTTPConnection, key: Annotated[str | None, Security(_header)]) -> None:
    """FastAPI dependency of the header-only routes; a no-op when the server has no key configured."""
    expected = conn.app.state.settings.api_key
    if not expected or key_matches(key, expected):
        return
    if key is None and QUERY_KEY in conn.query_params:
        _refuse(
            conn,
            f"the {QUERY_KEY} query parameter is accepted only by the WebSocket, events and mjpeg routes; "
            f"send the key in the {API_KEY_HEADER} header",
        )
    _refuse(conn, f"{'missing' if key is None else 'wrong'} API key: send it in the {API_KEY_HEADER} header")


async def require_api_key_or_query(conn: HTTPConnection) -> None:
    """FastAPI dependency of the routes browsers open without headers: WebSocket, SSE and MJPEG."""
    expected = conn.app.state.settings.api_key
    if not expected:
        return
    given = conn.headers.get(API_KEY_HEADER) or conn.query_params.get(QUERY_KEY)
    if not key_matches(given, expected):
        reason = "missing API key" if given is None else "wrong API key"
        _refuse(conn, f"{reason}: send it in the {API_KEY_HEADER} header or as ?{QUERY_KEY}=")


class RedactKeys(logging.Filter):
    """Rewrites log records so that no API key shows: `api_key=...` in any URL, and the key itself.

    Installed on every handler of the server's process (uvicorn's access log included) by
    `install_redaction`; it changes the record's arguments in place, before any handler formats them.
    """

    _QUERY = re.compile(rf"({QUERY_KEY}=)[^&\s\"']*", re.IGNORECASE)

    def __init__(self, key: str | None):
        super().__init__()
        self.key = key

    def redact(self, text: str) -> str:
        text = self._QUERY.sub(r"\1***", text)
        return text.replace(self.key, "***") if self.key else text

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = self.redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(self.redact(a) if isinstance(a, str) else a for a in record.args)
        elif isinstance(record.args, dict):
            record.args = {k: self.redact(v) if isinstance(v, str) else v for k, v in record.args.items()}
        return True


def install_redaction(
    key: str | None, loggers: tuple[str, ...] = ("", "uvicorn", "uvicorn.access", "uvicorn.error")
) -> None:
    """Put a RedactKeys filter on every handler of these loggers (call after logging is configured)."""
    redactor = RedactKeys(key)
    for name in loggers:
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, RedactKeys) for f in handler.filters):
                handler.addFilter(redactor)
