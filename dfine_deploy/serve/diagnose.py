"""Why a source gave no frame, in words a user can act on.

OpenCV says only that a capture did not open. When it does not, the reader asks the source itself,
once per failed attempt and within a few seconds: an HTTP camera's status and content type, an RTSP
server's answer to DESCRIBE, whether the host answers at all, whether the camera device exists,
which codec a file holds. Every text names the source with its password hidden (`redact`).
"""

from __future__ import annotations

import base64
import http.client
import socket
import ssl
import time
from pathlib import Path
from urllib.parse import unquote, urlsplit

import cv2

from dfine_deploy.serve.settings import redact

DIAGNOSE_TIMEOUT_S = 5.0  # at most this long per question, so a stopping stream is never held up
STALL_LISTEN_S = 2  # frames_before_stall listens this many times its wait for a stall, at most
STALL_ANSWER_S = 0.5  # ... after an answer (status and headers) within this many seconds
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/xhtml")


def file_failure(path: str, cap: cv2.VideoCapture) -> str:
    """One line on a video file that yields no frame: what is wrong and the fix."""
    if not cap.isOpened():
        what = (
            "FFmpeg finds no video in it (not a video, audio only, empty, or cut short before its "
            "index was written)"
        )
    elif cap.get(cv2.CAP_PROP_FRAME_COUNT) == 0:
        what = "it holds no frames"
    else:
        code = int(cap.get(cv2.CAP_PROP_FOURCC)).to_bytes(4, "little").decode("latin-1").strip("\0 ")
        codec = code if code.isprintable() and code else "unknown"
        what = f"OpenCV's FFmpeg cannot decode its video (codec {codec})"
    return (
        f"video file {path} cannot be decoded: {what}; check that it plays, or re-encode it "
        "(e.g. ffmpeg -i IN -c:v libx264 OUT.mp4)"
    )


def device_failure(index: int) -> str:
    """One line on a camera index that gives no frame."""
    device = Path(f"/dev/video{index}")
    if not device.exists():
        present = sorted(p.name for p in Path("/dev").glob("video*"))
        return (
            f"camera {index}: {device} does not exist "
            f"(cameras here: {', '.join(present) if present else 'none'})"
        )
    return f"camera {index} gives no frame; check that no other program holds {device} and that it captures"


def network_failure(url: str, timeout: float) -> str:
    """Why `url` (rtsp, rtsps, http, https) did not open, as far as one request can tell."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    secure = scheme in ("rtsps", "https")
    try:
        port = parts.port or {"rtsp": 554, "rtsps": 322, "http": 80, "https": 443}[scheme]
        host = parts.hostname or ""
    except ValueError:  # a password with a character urlsplit misreads: nothing to ask
        return "FFmpeg could not open it"
    timeout = min(timeout, DIAGNOSE_TIMEOUT_S)
    where = f"{host}:{port}"
    try:
        if scheme.startswith("http"):
            return _http_answer(parts, host, port, secure, timeout)
        with socket.create_connection((host, port), timeout) as sock:
            if secure:
                return f"{where} accepts connections, but FFmpeg could not open the stream"
            return _rtsp_answer(sock, url, parts.password is not None)
    except socket.gaierror as exc:
        return f"host {host!r} is not known ({exc.strerror}); check the name"
    except (TimeoutError, socket.timeout):
        return f"{where} does not answer within {timeout:g} s (host down, wrong address or a firewall)"
    except ssl.SSLError as exc:
        return f"TLS with {where} failed ({exc.reason or exc})"
    except OSError as exc:
        return f"cannot connect to {where} ({exc.strerror or exc})"


def stalled_stream(wait_s: float, frames: int) -> str:
    """The one text of a source that keeps its connection open and sends no frame for `wait_s`
    (the stream's read_timeout_s, or less)."""
    after = f"after {frames} frame(s)" if frames else "after opening"
    return f"stalled: the connection stayed open but no frame came for {wait_s:g} s {after} (read_timeout_s)"


def frames_before_stall(url: str, wait_s: float) -> int | None:
    """The JPEG frames an HTTP camera sent before it went quiet for `wait_s` with its connection
    open (a hung encoder; FFmpeg's open, which waits for more frames to learn the stream, runs out of
    time on it); None when it did not go quiet that way (it closed, kept sending, or refused)."""
    parts = urlsplit(url)
    secure = parts.scheme.lower() == "https"
    try:
        port = parts.port or (443 if secure else 80)
        connection = _get(parts, parts.hostname or "", port, secure, STALL_ANSWER_S)
    except (ValueError, OSError):
        return None
    try:
        sock = connection.sock  # the response reads from it; the connection lets go of a streamed one
        # a camera that answered FFmpeg answers at once; one that never answers costs only this
        response = connection.getresponse()
        if response.status != 200 or sock is None:
            return None
        sock.settimeout(wait_s)
        frames, tail, started = 0, b"", time.monotonic()
        while time.monotonic() - started < STALL_LISTEN_S * wait_s:  # a camera that keeps sending
            try:
                chunk = response.read1(65536)
            except (TimeoutError, socket.timeout):
                return frames
            if not chunk:
                return None  # closed: not a stall
            frames += (tail + chunk).count(b"\xff\xd8\xff")  # a JPEG's start
            tail = chunk[-2:]
        return None
    except OSError:
        return None
    finally:
        connection.close()


def _get(parts, host: str, port: int, secure: bool, timeout: float) -> http.client.HTTPConnection:
    """A GET of `parts` sent (with the URL's user and password); the answer is the caller's to read."""
    connection_type = http.client.HTTPSConnection if secure else http.client.HTTPConnection
    connection = connection_type(host, port, timeout=timeout)
    headers = {"User-Agent": "dfine-serve", "Accept": "*/*"}
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    path = parts.path or "/"
    try:
        connection.request("GET", f"{path}?{parts.query}" if parts.query else path, headers=headers)
    except BaseException:
        connection.close()
        raise
    return connection


def _http_answer(parts, host: str, port: int, secure: bool, timeout: float) -> str:
    connection = _get(parts, host, port, secure, timeout)
    path = parts.path or "/"
    try:
        response = connection.getresponse()  # the status and headers only: the body is never read
        status, reason = response.status, response.reason
        content_type = response.getheader("Content-Type", "") or ""
    finally:
        connection.close()
    if status in (401, 403):
        given = (
            "the user and password in the URL are refused"
            if parts.username
            else "it needs a user and password"
        )
        return f"HTTP {status} {reason}: {given} ({parts.scheme}://USER:PASSWORD@{parts.netloc.rpartition('@')[2]}/...)"
    if status == 404:
        return f"HTTP 404 {reason}: no video at path {redact(path)!r}; check the camera's video URL"
    if status >= 400:
        return f"HTTP {status} {reason}"
    if content_type.lower().startswith(_TEXT_TYPES):
        return (
            f"the server answers with {content_type.split(';')[0]}, not video: is this the camera's web page "
            "instead of its video URL?"
        )
    return (
        f"the server answers HTTP {status} ({content_type or 'no content type'}), "
        "but FFmpeg reads no video from it"
    )


def _rtsp_answer(sock: socket.socket, url: str, has_password: bool) -> str:
    """Ask DESCRIBE without credentials: a 404 or 401 answer names the fault."""
    parts = urlsplit(url)
    plain = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
    sock.sendall(f"DESCRIBE {plain} RTSP/1.0\r\nCSeq: 1\r\nAccept: application/sdp\r\n\r\n".encode())
    status_line = sock.recv(1024).split(b"\r\n", 1)[0].decode("latin-1")
    version, _, rest = status_line.partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("RTSP/"):
        return (
            f"{parts.hostname}:{parts.port or 554} accepts connections but does not answer as an RTSP server"
        )
    if code == "404":
        return f"RTSP 404 {reason}: no stream at path {redact(parts.path)!r}; check the camera's stream URL"
    if code == "401":
        given = "check the user and password in the URL" if has_password else "it needs a user and password"
        return f"RTSP 401 {reason}: {given} (rtsp://USER:PASSWORD@host/...)"
    return f"the RTSP server answers {code} {reason}, but FFmpeg could not open the stream"
