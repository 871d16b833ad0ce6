"""What a browser may do with this server: which Host and Origin it accepts, and the headers that keep
its pages from being framed or made to run foreign code.

Browsers apply no same-origin rule to WebSockets, and a page on any site can make a browser on the
server's own machine send requests to 127.0.0.1; without an API key that let any web page read the
detections (a WebSocket from a foreign Origin), and a DNS-rebinding page (its own name pointed at
127.0.0.1) could use the whole API. So, for every request and WebSocket handshake:

- **Host** must name this server: an IP address (a rebinding page cannot make a browser send one for
  its own site), `localhost`, this machine's host name, the `--host` name, or a name given with
  `--allowed-host` (`*` accepts any). Anything else gets 400.
- **Origin**, when the client sends one, must be this server's own (its host:port equals Host) or one
  given with `--allowed-origin` (`*` accepts any). Anything else, `null` included, gets 403.

A WebSocket handshake is refused with the same status and line as a request (ASGI's WebSocket
denial response); a server without that extension can only close it, which its client sees as 403.

Every HTTP response carries a Content-Security-Policy that allows only this server's own scripts,
styles, images and connections (no inline script, nothing from elsewhere) and no framing, with
`X-Frame-Options: DENY`, `X-Content-Type-Options: nosniff` and `Referrer-Policy: no-referrer` (a
URL may carry `?api_key=`).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.responses import PlainTextResponse

CSP = "; ".join(
    (
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data: blob:",  # Swagger UI's icons are data: URLs
        "connect-src 'self'",
        "object-src 'none'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    )
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]


def _host_name(authority: str) -> str:
    """'Example.COM.:8000' -> 'example.com', '[::1]:8000' -> '::1'."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1 : authority.find("]")] if "]" in authority else authority
    return authority.rsplit(":", 1)[0].rstrip(".") if authority.count(":") == 1 else authority.rstrip(".")


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def allowed_host_names(bind_host: str, extra: Iterable[str]) -> frozenset[str]:
    """The host names Host may carry besides IP addresses ('*' in the set: any)."""
    names = {"localhost", socket.gethostname().lower(), _host_name(bind_host)}
    names |= {name.strip().lower().rstrip(".") for name in extra}
    return frozenset(n for n in names if n)


class BrowserGuard:
    """ASGI middleware enforcing the Host and Origin rules above and adding the headers."""

    def __init__(self, app, host_names: frozenset[str], origins: Iterable[str] = ()):
        self.app = app
        self.host_names = host_names
        self.origins = frozenset(o.strip().lower().rstrip("/") for o in origins)

    def _host_ok(self, host: str | None) -> bool:
        if host is None:  # HTTP/1.0 without Host: no browser sends that
            return True
        name = _host_name(host)
        return "*" in self.host_names or _is_ip(name) or name in self.host_names

    def _origin_ok(self, origin: str | None, host: str | None) -> bool:
        if origin is None:  # not a browser's cross-site request (browsers send Origin on those)
            return True
        origin = origin.strip().lower().rstrip("/")
        if "*" in self.origins or origin in self.origins:
            return True
        netloc = urlsplit(origin).netloc
        return bool(netloc) and host is not None and netloc == host.strip().lower()

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        host, origin = headers.get("host"), headers.get("origin")
        refusal = None
        if not self._host_ok(host):
            refusal = (400, f"Host {host!r} is not a name of this server; start it with --allowed-host NAME")
        elif not self._origin_ok(origin, host):
            refusal = (
                403,
                f"requests from {origin!r} are not allowed; start the server with --allowed-origin",
            )

        if refusal is None:
            return await self.app(scope, receive, _with_headers(send) if scope["type"] == "http" else send)
        if scope["type"] == "websocket" and DENIAL not in scope.get("extensions", {}):
            # before accept: the client sees 403 (a response, as below, is sent as the denial)
            return await send({"type": "websocket.close", "code": 1008, "reason": refusal[1][:120]})
        await PlainTextResponse(refusal[1], status_code=refusal[0])(scope, receive, _with_headers(send))


DENIAL = "websocket.http.response"  # the ASGI extension that answers a WebSocket handshake with HTTP


def _with_headers(send):
    """`send` adding the security headers to the response's start (a WebSocket denial's too)."""

    async def sending(message):
        if message["type"] in ("http.response.start", "websocket.http.response.start"):
            names = {k.lower() for k, _ in message.get("headers", [])}
            message["headers"] = [*message.get("headers", []), *(h for h in HEADERS if h[0] not in names)]
        await send(message)

    return sending
