"""API-key check for every route but the health probes (header X-API-Key, or ?api_key= for browsers).

Browsers cannot set headers on <img> (MJPEG), EventSource (SSE) or WebSocket, so the key may also come
as a query parameter; prefer the header elsewhere, since URLs end up in logs.
"""

from __future__ import annotations

import hmac

from fastapi import HTTPException, WebSocketException, status
from starlette.requests import HTTPConnection

API_KEY_HEADER = "X-API-Key"


def key_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison, so response timing reveals nothing about the key."""
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


async def require_api_key(conn: HTTPConnection) -> None:
    """FastAPI dependency; a no-op when the server has no key configured."""
    expected = conn.app.state.settings.api_key
    if not expected:
        return
    given = conn.headers.get(API_KEY_HEADER) or conn.query_params.get("api_key")
    if key_matches(given, expected):
        return
    reason = "missing API key" if given is None else "wrong API key"
    if conn.scope["type"] == "websocket":
        raise WebSocketException(code=status.WS_1008_POLICY_VIOLATION, reason=reason)
    raise HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        detail=f"{reason}: send it in the {API_KEY_HEADER} header",
        headers={"WWW-Authenticate": API_KEY_HEADER},
    )
