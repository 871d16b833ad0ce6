"""Real servers on loopback for the serve tests: uvicorn, an MJPEG HTTP camera, GStreamer's RTSP server.

Every wait is bounded; every server is stopped by its fixture.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
import uvicorn

sys.path.insert(0, str(Path(__file__).parent))

from fake_detector import RedSquareDetector

from dfine_deploy.serve.app import create_app
from dfine_deploy.serve.cli import GRACE_S
from dfine_deploy.serve.server import Server
from dfine_deploy.serve.settings import ServeSettings

RTSP_HELPER = Path(__file__).parents[1] / "support" / "rtsp_server.py"
SYSTEM_PYTHON = "/usr/bin/python3"
CHROMIUM = "/usr/bin/chromium"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


HANG_GUARD_SCALE = 3
"""Each `wait_for` timeout is what an idle machine needs with room to spare; it is a guard against a
hang, not a speed test, so it is stretched this many times for CI, where two pytest workers share
two cores with whatever else the machine runs. A failing wait then takes longer to report, nothing more."""


def wait_for(predicate: Callable[[], object], timeout: float, what: str, interval: float = 0.05):
    """Poll until `predicate()` is truthy; fail the test with `what` after `timeout` seconds
    (times HANG_GUARD_SCALE)."""
    timeout *= HANG_GUARD_SCALE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def square_frame(i: int, size: tuple[int, int] = (160, 120)) -> tuple[np.ndarray, tuple[int, int, int, int]]:
    """A grey frame with a red square that moves one pixel per frame; returns (BGR image, box xyxy)."""
    w, h = size
    image = np.full((h, w, 3), 60, np.uint8)
    x, y = 10 + i % (w - 50), 20
    cv2.rectangle(image, (x, y), (x + 29, y + 29), (0, 0, 255), -1)
    return image, (x, y, x + 30, y + 30)


def default_hangup() -> None:
    """For a child: SIGHUP does what it does in a terminal, even when pytest runs under nohup (a
    child inherits an ignored SIGHUP, and the server then rightly keeps ignoring it)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


def write_video(path: Path, frames: int, fps: float = 20.0, fourcc: str = "mp4v") -> Path:
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*fourcc), fps, (160, 120))
    assert writer.isOpened(), f"OpenCV cannot write {fourcc} to {path}"
    for i in range(frames):
        writer.write(square_frame(i)[0])
    writer.release()
    return path


class LiveServer:
    """uvicorn (the package's Server) serving `app` in a thread on a free loopback port."""

    def __init__(self, app):
        self.app = app
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            lifespan="on",
            timeout_graceful_shutdown=GRACE_S,
        )
        self.server = Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        # one client per server: a fresh httpx client per call costs ~0.15 s (it builds an SSL context)
        self.client = httpx.Client(base_url=self.base_url, timeout=20)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        wait_for(lambda: self.server.started, 20, "uvicorn to start")
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.server.should_exit = True
        self.thread.join(20)
        assert not self.thread.is_alive(), "uvicorn did not shut down within 20 s"

    @property
    def pipeline(self):
        return self.app.state.pipeline


@pytest.fixture
def serve(tmp_path):
    """Start a server: serve(detector=None, **settings) -> LiveServer (stopped at teardown)."""
    servers: list[LiveServer] = []

    def start(detector=None, **fields) -> LiveServer:
        """Without `detector` and without `model=` the fake detector serves.

        With `model=` the lifespan loads it.
        """
        settings = ServeSettings(**fields)
        if detector is None and not settings.model:
            detector = RedSquareDetector()
        server = LiveServer(create_app(settings, detector=detector))
        servers.append(server.__enter__())
        return server

    yield start
    for server in reversed(servers):
        server.__exit__(None, None, None)


class MjpegCamera:
    """An HTTP camera on loopback: GET /video streams multipart/x-mixed-replace JPEG frames at `fps`.

    `frames_per_connection` makes a frozen camera: each connection gets that many frames, then stays
    open without data (what a hung encoder does).
    """

    def __init__(self, fps: float = 20.0, frames_per_connection: int | None = None):
        self.fps = fps
        self.frames_per_connection = frames_per_connection
        self.frames_sent = 0
        self.connections = 0
        camera = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:
                if self.path != "/video":
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "multipart/x-mixed-replace; boundary=frame")
                self.end_headers()
                camera.connections += 1
                i = 0
                try:
                    while not camera.stopping.is_set():
                        limit = camera.frames_per_connection
                        frozen = limit is not None and i >= limit
                        if camera.paused.is_set() or frozen:  # a stalled camera: connection open, no data
                            if frozen and i == limit:
                                self.wfile.write(b"--frame\r\n")  # the last frame's end: it decodes
                                self.wfile.flush()
                                i += 1
                            time.sleep(0.05)
                            continue
                        jpeg = cv2.imencode(".jpg", square_frame(i)[0])[1].tobytes()
                        self.wfile.write(
                            b"--frame\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n\r\n" % len(jpeg)
                        )
                        self.wfile.write(jpeg + b"\r\n")
                        camera.frames_sent += 1
                        i += 1
                        time.sleep(1.0 / camera.fps)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.stopping = threading.Event()
        self.paused = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/video"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stopping.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def mjpeg_camera():
    camera = MjpegCamera()
    yield camera
    camera.close()


@pytest.fixture
def http_files(tmp_path):
    """A plain static file server on loopback over tmp_path/www: (folder, base URL)."""
    import functools
    from http.server import SimpleHTTPRequestHandler

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    folder = tmp_path / "www"
    folder.mkdir()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(folder)))
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield folder, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


class RtspServer:
    """GStreamer's RTSP server as a subprocess of the system Python; start()/stop() can repeat."""

    def __init__(self, video: Path, port: int):
        self.video = video
        self.port = port
        self.url = f"rtsp://127.0.0.1:{port}/stream"
        self.proc: subprocess.Popen | None = None

    def start(self, stall_after: int | None = None) -> None:
        """Serve the video; with `stall_after`, each client gets that many frames and then none."""
        stall = [] if stall_after is None else ["--stall-after", str(stall_after)]
        self.proc = subprocess.Popen(
            [SYSTEM_PYTHON, str(RTSP_HELPER), "--port", str(self.port), "--video", str(self.video), *stall],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        ready, _, _ = select.select([self.proc.stdout], [], [], 30)
        line = self.proc.stdout.readline() if ready else "(nothing within 30 s)"
        if not line.startswith("READY"):
            self.proc.kill()
            self.proc.wait(5)
            raise RuntimeError(f"RTSP server did not start: {line!r} {self.proc.stderr.read()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        self.proc = None


def _rtsp_available() -> str | None:
    if not Path(SYSTEM_PYTHON).exists():
        return f"{SYSTEM_PYTHON} is missing"
    probe = subprocess.run(
        [
            SYSTEM_PYTHON,
            "-c",
            "import gi; gi.require_version('GstRtspServer', '1.0'); from gi.repository import GstRtspServer",
        ],
        capture_output=True,
        timeout=30,
    )
    return (
        None
        if probe.returncode == 0
        else "GStreamer's RTSP server is not installed (run scripts/install-system-deps.sh)"
    )


def require_system_part(missing: str | None) -> None:
    """Skip a test whose system part is missing, saying why; in CI (CI=true) fail it loudly instead,
    since CI installs every part (scripts/install-system-deps.sh) and a skip there would hide a gap."""
    if not missing:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{missing}; CI must have it: run scripts/install-system-deps.sh as root")
    pytest.skip(missing)


@pytest.fixture
def rtsp_server(tmp_path):
    require_system_part(_rtsp_available())
    video = write_video(
        tmp_path / "rtsp.avi", frames=600, fps=10, fourcc="MJPG"
    )  # a minute: never ends in a test
    server = RtspServer(video, free_port())
    server.start()
    yield server
    server.stop()


@pytest.fixture
def browser():
    """Debian's Chromium, headless, driven by Playwright (the dashboard tests)."""
    missing = None if Path(CHROMIUM).exists() else f"{CHROMIUM} is missing (Debian package chromium)"
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        missing = missing or "playwright is not installed (pip install -e '.[dev]')"
    require_system_part(missing)
    with sync_playwright() as playwright:
        # Playwright's own browser download cannot work here: drive the system's Chromium instead.
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


def metric_value(client: httpx.Client, name: str, headers: dict | None = None, **labels: str) -> float:
    """One sample from /metrics, matched on its labels in any order (0.0 when the series does not exist)."""
    text = client.get("/metrics", headers=headers or {}).text
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        metric, _, label_text = series.partition("{")
        found = dict(pair.split("=", 1) for pair in label_text.rstrip("}").split(",") if pair)
        if metric == name and {k: v.strip('"') for k, v in found.items()} == labels:
            return float(value)
    return 0.0
