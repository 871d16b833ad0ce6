"""What browsers may do: the Host allow-list (DNS rebinding), the Origin check (cross-site WebSockets
and requests), and the Content-Security-Policy and framing headers on every response."""

from __future__ import annotations

import asyncio
import re
import socket

import httpx
import pytest
import websockets
from conftest import write_video

from dfine_deploy.errors import ServeError
from dfine_deploy.serve.settings import ServeSettings, StreamSpec

FOREIGN_ORIGINS = ["http://evil.example", "null", "http://127.0.0.1:1", "https://127.0.0.1.evil.example"]


@pytest.fixture
def cam_server(serve, tmp_path):
    """A server without an API key, streaming a looped file as 'cam'."""
    video = write_video(tmp_path / "v.mp4", 20)
    return serve(streams=[StreamSpec(url=str(video), name="cam", loop=True)])


async def _ws_first(url: str, **kwargs) -> dict:
    async with websockets.connect(url, open_timeout=10, **kwargs) as ws:
        return await asyncio.wait_for(ws.recv(), 10)


def _ws_status(url: str, **kwargs) -> int:
    """101 when the handshake is accepted (and a result arrives), else the HTTP status of the refusal."""
    try:
        asyncio.run(_ws_first(url, **kwargs))
    except websockets.InvalidStatus as exc:
        return exc.response.status_code
    return 101


def _raw_handshake(port: int, host: str) -> tuple[int, str]:
    """The status and the reply of a WebSocket handshake sent with exactly this Host header (one,
    unlike a client library that adds its own)."""
    request = (
        "GET /v1/streams/cam/ws HTTP/1.1\r\n"
        f"Host: {host}\r\n"
        "Upgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request.encode())
        reply = b""
        while b"\r\n\r\n" not in reply:
            reply += conn.recv(4096)
        status = int(reply.split()[1])
        while status != 101 and (chunk := conn.recv(4096)):  # a refusal: its body, up to the close
            reply += chunk
    return status, reply.decode("latin-1")


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
def test_a_websocket_from_a_foreign_origin_is_refused(cam_server, origin):
    url = cam_server.base_url.replace("http", "ws") + "/v1/streams/cam/ws"
    assert _ws_status(url, origin=origin) == 403
    assert _ws_status(url, origin=cam_server.base_url) == 101  # the dashboard's own origin
    assert _ws_status(url) == 101  # no Origin: not a browser


def test_allowed_origins_are_accepted_and_only_those(serve, tmp_path):
    video = write_video(tmp_path / "v.mp4", 20)
    server = serve(
        streams=[StreamSpec(url=str(video), name="cam", loop=True)],
        allowed_origins=["https://ops.example.com"],
    )
    url = server.base_url.replace("http", "ws") + "/v1/streams/cam/ws"
    assert _ws_status(url, origin="https://ops.example.com") == 101
    assert _ws_status(url, origin="http://ops.example.com") == 403  # another scheme is another origin
    events = server.client.get("/v1/streams", headers={"Origin": "https://ops.example.com"})
    assert events.status_code == 200


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
def test_cross_site_requests_are_refused(cam_server, origin):
    http = cam_server.client
    headers = {"Origin": origin}
    body = {"url": "rtsp://127.0.0.1:1/x", "name": "planted"}
    assert http.post("/v1/streams", json=body, headers=headers).status_code == 403  # a cross-site form/fetch
    assert http.delete("/v1/streams/cam", headers=headers).status_code == 403
    assert http.get("/v1/streams/cam/latest", headers=headers).status_code == 403
    assert [s["name"] for s in http.get("/v1/streams").json()] == ["cam"]  # nothing changed


@pytest.mark.parametrize(
    "host", ["evil.example", "evil.example:80", "127.0.0.1.nip.io", "localhost.evil.example"]
)
def test_a_host_that_is_not_this_server_is_refused(cam_server, host):
    """A DNS-rebinding page reaches 127.0.0.1 under its own name: that name is in the Host header."""
    http = cam_server.client
    for path in ("/", "/v1/streams", "/metrics", "/docs", "/v1/streams/cam/latest"):
        reply = http.get(path, headers={"Host": host})
        assert reply.status_code == 400 and "--allowed-host" in reply.text, path
    port = int(cam_server.port)
    status, reply = _raw_handshake(port, host)  # the same status and line as a request (docs/serve.md)
    assert status == 400 and "start it with --allowed-host NAME" in reply, reply
    assert "x-frame-options: deny" in reply.lower()  # the denial carries the security headers too
    assert _raw_handshake(port, f"127.0.0.1:{port}")[0] == 101  # the same handshake with this server's name


def test_this_servers_own_names_are_accepted(serve):
    http = serve(allowed_hosts=["cams.example.com"]).client
    port = http.base_url.port
    for host in ("127.0.0.1", f"127.0.0.1:{port}", f"localhost:{port}", "LocalHost.", "[::1]:8000",
                 "192.168.1.20:8000", socket.gethostname(), f"cams.example.com:{port}"):  # fmt: skip
        assert http.get("/healthz", headers={"Host": host}).status_code == 200, host
    assert serve(allowed_hosts=["*"]).client.get("/healthz", headers={"Host": "x.example"}).status_code == 200


@pytest.mark.parametrize(
    "path, status", [("/", 200), ("/docs", 200), ("/v1/streams", 200), ("/healthz", 200), ("/nothing", 404)]
)
def test_every_response_forbids_framing_and_foreign_code(cam_server, path, status):
    reply = cam_server.client.get(path)
    assert reply.status_code == status
    csp = reply.headers["content-security-policy"]
    assert "frame-ancestors 'none'" in csp and "default-src 'self'" in csp and "script-src 'self'" in csp
    assert "unsafe-inline" not in csp and "unsafe-eval" not in csp
    assert reply.headers["x-frame-options"] == "DENY" and reply.headers["x-content-type-options"] == "nosniff"
    assert reply.headers["referrer-policy"] == "no-referrer"  # URLs may carry ?api_key=
    refused = cam_server.client.get(path, headers={"Host": "evil.example"})
    assert refused.headers["x-frame-options"] == "DENY"


def test_the_docs_page_and_its_assets_are_served_here(cam_server):
    """Everything /docs loads is a path on this server that answers 200 (checked in a browser with the
    network cut off in test_dashboard.py)."""
    http = cam_server.client
    page = http.get("/docs").text
    refs = re.findall(r"(?:src|href)=\"([^\"]+)\"", page)
    assert refs and all(ref.startswith("/") and not ref.startswith("//") for ref in refs), refs
    for ref in refs:
        reply = http.get(ref)
        assert reply.status_code == 200 and len(reply.content) > 100, ref
    assert "SwaggerUIBundle" in http.get("/docs/assets/swagger-ui-bundle.js").text
    assert http.get("/redoc").status_code == 404  # FastAPI's CDN pages are off
    assert http.get("/docs/assets/../../settings.py").status_code == 404


@pytest.mark.parametrize(
    "field, value",
    [
        ("allowed_hosts", ["http://cams.example.com"]),
        ("allowed_hosts", ["cams.example.com:8000"]),
        ("allowed_hosts", [""]),
        ("allowed_origins", ["ops.example.com"]),
        ("allowed_origins", ["https://ops.example.com/path"]),
        ("allowed_origins", ["ftp://ops.example.com"]),
    ],
)
def test_allow_lists_are_checked_with_one_clear_line(field, value):
    with pytest.raises(ServeError, match=r"--allowed-(host|origin) .*: give "):
        ServeSettings(**{field: value})


def test_no_key_server_still_refuses_a_foreign_page_reading_the_detections_over_events(cam_server):
    with httpx.stream(
        "GET", f"{cam_server.base_url}/v1/streams/cam/events", headers={"Origin": "http://evil.example"}
    ) as reply:
        assert reply.status_code == 403
