"""Sources as users bring them: phone videos, other codecs and pixel formats, broken files, and cameras
that answer 404, 401 or a web page, through the reader and the server, on real files and servers."""

from __future__ import annotations

import logging
import re
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import MjpegCamera, free_port, metric_value, square_frame, wait_for, write_video
from user_videos import audio_only, encode, rotated

from dfine_deploy.errors import ServeError
from dfine_deploy.serve.settings import StreamSpec, redact
from dfine_deploy.serve.sources import StreamReader, StreamState, classify_source, probe_source


def _reader(url: str, **spec) -> StreamReader:
    spec.setdefault("backoff_initial_s", 0.05)
    spec.setdefault("backoff_max_s", 0.3)
    kind, target = classify_source(url, trusted=True, allow_devices=True)
    return StreamReader("s", StreamSpec(url=url, name="s", **spec), kind, target)


def _take(reader: StreamReader, count: int) -> list:
    """Start `reader`, collect its first `count` frames as they come, stop it."""
    seen: list = []
    reader.start()
    try:
        wait_for(
            lambda: (f := reader.take()) and seen.append(f) or len(seen) >= count,
            20,
            f"{count} frames",
            0.002,
        )
    finally:
        reader.stop()
    return seen


def _all_frames(url: str, **spec) -> list:
    """Every frame of a file, read as fast as possible (the reader waits for us)."""
    reader = _reader(url, every_frame=True, **spec)
    frames: list = []

    def ended() -> bool:
        stopped = reader.state in (StreamState.STOPPED, StreamState.FAILED)
        frame = reader.take()
        if frame is not None:
            frames.append(frame)
        return stopped and frame is None

    reader.start()
    try:
        wait_for(ended, 20, f"{url} to end", interval=0.002)
    finally:
        reader.stop()
    return frames


def _red_box(image: np.ndarray) -> tuple[int, int, int, int]:
    ys, xs = np.nonzero((image[..., 2] > 200) & (image[..., 1] < 80))
    return int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1


@pytest.mark.parametrize(
    "name, codec, pix_fmt, size, options",
    [
        ("hevc.mp4", "libx265", "yuv420p", (160, 120), {"x265-params": "log-level=error"}),
        ("vp9.webm", "libvpx-vp9", "yuv420p", (160, 120), {}),
        ("mjpeg.avi", "mjpeg", "yuvj420p", (160, 120), {}),
        ("ten-bit.mp4", "libx264", "yuv420p10le", (160, 120), {}),
        ("full-chroma.mp4", "libx264", "yuv444p", (160, 120), {}),
        ("odd-size.mp4", "libx264", "yuv444p", (641, 479), {}),
        ("grey.mkv", "ffv1", "gray", (160, 120), {}),
    ],
)
def test_every_codec_and_pixel_format_reaches_the_detector_as_8_bit_bgr(
    tmp_path, name, codec, pix_fmt, size, options
):
    video = encode(tmp_path / name, codec, frames=6, size=size, pix_fmt=pix_fmt, options=options)
    frames = _all_frames(str(video), realtime=False)
    assert [f.index for f in frames] == list(range(6))
    for frame in frames:
        assert frame.image.shape == (size[1], size[0], 3) and frame.image.dtype == np.uint8
    if pix_fmt != "gray":  # the square is where it was drawn (grey keeps only its brightness)
        assert _red_box(frames[3].image) == pytest.approx(square_frame(3, size)[1], abs=2)


def test_a_phone_video_is_served_as_its_viewer_shows_it_boxes_and_recording_included(serve, tmp_path):
    """A phone records landscape pixels and a 'turn 90 degrees' matrix; players show it upright.
    The detector, the boxes and the recording all see it upright, as the user does."""
    plain = encode(tmp_path / "plain.mp4", "libx264", frames=8)
    phone = rotated(plain, tmp_path / "phone.mp4", 90)
    frames = _all_frames(str(phone), realtime=False)
    x1, y1, x2, y2 = square_frame(0)[1]  # in the recorded 160x120 pixels
    upright = (120 - y2, x1, 120 - y1, x2)  # the same square turned 90 degrees clockwise, in 120x160
    assert frames[0].image.shape == (160, 120, 3)
    assert _red_box(frames[0].image) == pytest.approx(upright, abs=2)

    out = tmp_path / "out"
    server = serve(
        streams=[StreamSpec(url=str(phone), name="phone", every_frame=True, realtime=False)], record_dir=out
    )
    wait_for(server.pipeline.all_finished, 20, "the phone video to end")
    latest = server.client.get("/v1/streams/phone/latest").json()
    assert (latest["width"], latest["height"]) == (120, 160)
    x1, y1, x2, y2 = square_frame(7)[1]
    assert latest["detections"][0]["box"] == pytest.approx([120 - y2, x1, 120 - y1, x2], abs=2)
    server.__exit__(None, None, None)
    (segment,) = sorted((out / "phone").glob("phone-*.mp4"))
    recorded = cv2.VideoCapture(str(segment))
    ok, image = recorded.read()
    assert ok and image.shape == (160, 120, 3)  # upright, as served


def test_a_variable_frame_rate_file_keeps_its_own_times_for_pacing_and_the_tracker(tmp_path):
    """Phones and screen recorders write variable frame rates: index / fps puts frame 3 at 0.15 s
    where the file says 0.24 s. The reader follows the file's timestamps, also across loops."""
    times_ms = [0, 20, 40, 240, 260, 280]
    video = encode(tmp_path / "vfr.mkv", "libx264", times_ms=times_ms)
    frames = _all_frames(str(video), realtime=False)
    assert [f.position_s for f in frames] == pytest.approx([t / 1000 for t in times_ms])

    reader = _reader(str(video), every_frame=True, realtime=True, loop=True)
    seen = _take(reader, 9)
    positions = [f.position_s for f in seen[:9]]
    assert positions[:6] == pytest.approx([t / 1000 for t in times_ms])
    assert positions[6:] == pytest.approx([0.3, 0.32, 0.34])  # the second loop goes on one frame gap later
    decoded = [f.captured_at - seen[0].captured_at for f in seen[:9]]
    assert decoded[3] - decoded[2] >= 0.15  # paced by the file's 200 ms gap, not 1/fps = 50 ms


def _joined_at_two_sizes(tmp_path) -> Path:
    """Two H.264 MPEG-TS files, 160x120 then 320x240, joined end to end (`cat a.ts b.ts`, what a
    camera's recordings or an HLS discontinuity give): the resolution changes at frame 20 and the
    timestamps start again there."""
    first = encode(tmp_path / "a.ts", "libx264", frames=20, size=(160, 120))
    second = encode(tmp_path / "b.ts", "libx264", frames=20, size=(320, 240))
    joined = tmp_path / "joined.ts"
    joined.write_bytes(first.read_bytes() + second.read_bytes())
    return joined


def test_a_video_whose_resolution_changes_plays_on_to_its_end_at_its_own_pace(tmp_path):
    """At the change the file's timestamps went back to 0: the reader held its clock at the last
    time, so the second half passed unpaced, dropped as stale (20 of 40 frames, the stream 'ended'
    at the change). It goes on one frame later, as after a loop, and plays to the end."""
    video = _joined_at_two_sizes(tmp_path)
    frames = _all_frames(str(video), realtime=False)
    assert [f.index for f in frames] == list(range(40))
    positions = [f.position_s for f in frames]
    assert positions == sorted(positions) and positions[20] - positions[19] == pytest.approx(0.05)
    assert positions[-1] == pytest.approx(39 * 0.05)
    # the square drawn in each half is there (OpenCV may scale the second half to the first size)
    assert _red_box(frames[19].image) == pytest.approx(square_frame(19)[1], abs=2)
    after = frames[25].image
    scale = after.shape[1] / 320
    assert _red_box(after) == pytest.approx([v * scale for v in square_frame(5, (320, 240))[1]], abs=2)

    reader = _reader(str(video), realtime=True)  # latest-frame mode, paced by the file's times
    seen: list = []
    reader.start()
    try:
        wait_for(lambda: (f := reader.take()) and seen.append(f) or not reader.alive, 20, "the end", 0.002)
    finally:
        reader.stop()
    assert reader.finished and reader.last_error is None
    assert len(seen) >= 36 and reader.frames_dropped <= 4, (len(seen), reader.frames_dropped)
    assert seen[-1].captured_at - seen[0].captured_at >= 1.7  # 2 s of video, paced throughout


def test_frames_that_come_at_a_new_size_are_read_on_and_the_change_is_said(tmp_path, monkeypatch, caplog):
    """OpenCV builds that rebuild their scaler pass the frames after a resolution change at their own
    size (this one scales them to the first size): the reader goes on with them and says so once."""
    from dfine_deploy.serve import sources

    video = _joined_at_two_sizes(tmp_path)
    opened = sources._open_capture

    class AtOwnSize:
        """The real capture, passing the frames from 20 on at the 320x240 they were encoded at."""

        def __init__(self, *args):
            self.cap, self.index = opened(*args), -1

        def grab(self):
            self.index += 1
            return self.cap.grab()

        def retrieve(self):
            ok, image = self.cap.retrieve()
            if ok and self.index >= 20 and image.shape[:2] != (240, 320):
                image = cv2.resize(image, (320, 240))
            return ok, image

        def __getattr__(self, name):
            return getattr(self.cap, name)

    monkeypatch.setattr(sources, "_open_capture", AtOwnSize)
    with caplog.at_level(logging.WARNING, logger=sources.log.name):
        frames = _all_frames(str(video), realtime=False)
    assert [f.image.shape[:2] for f in frames] == [(120, 160)] * 20 + [(240, 320)] * 20
    assert _red_box(frames[25].image) == pytest.approx(square_frame(5, (320, 240))[1], abs=2)
    lines = [r.getMessage() for r in caplog.records if "changed size" in r.getMessage()]
    assert lines == [
        f"stream s ({video}): the frames changed size from 160x120 to 320x240 at frame 20; read on at "
        "the new size"
    ]


def test_a_clip_over_http_plays_at_its_own_pace_instead_of_dropping_its_frames(http_files):
    """Before, a 2.2 s clip passed in 0.06 s and 27 of its 30 frames were dropped as stale."""
    folder, base_url = http_files
    times_ms = [0, 20, 40, 240, 260, 280, 480, 500]
    encode(folder / "clip.mkv", "libx264", times_ms=times_ms)
    reader = _reader(f"{base_url}/clip.mkv", backoff_initial_s=5)  # latest-frame mode, as cameras
    seen = _take(reader, 8)
    assert [f.index for f in seen] == list(range(8)) and reader.frames_dropped == 0
    assert [f.position_s for f in seen] == pytest.approx([t / 1000 for t in times_ms])
    assert seen[-1].captured_at - seen[0].captured_at >= 0.4  # paced: the clip lasts 0.5 s


def _truncated(tmp_path):
    whole = encode(tmp_path / "whole.mp4", "libx264", frames=20).read_bytes()
    path = tmp_path / "cut.mp4"
    path.write_bytes(whole[: len(whole) // 2])  # the index (moov), written last, is gone
    return path


@pytest.mark.parametrize(
    "make, reason",
    [
        (lambda tmp: write_video(tmp / "empty.avi", 0, fourcc="MJPG"), "it holds no frames"),
        (lambda tmp: audio_only(tmp / "memo.mp4"), "FFmpeg finds no video in it"),
        (_truncated, "FFmpeg finds no video in it"),
        (
            lambda tmp: (tmp / "notes.mp4").write_text("not a video\n" * 50) and tmp / "notes.mp4",
            "FFmpeg finds no video in it",
        ),
    ],
)
def test_a_file_without_frames_is_refused_at_start_and_fails_the_stream_saying_why(tmp_path, make, reason):
    path = make(tmp_path)
    kind, target = classify_source(str(path), trusted=True, allow_devices=False)
    with pytest.raises(ServeError, match=rf"^video file {path} cannot be decoded: {reason}.*re-encode it"):
        probe_source(kind, target, StreamSpec(url=str(path), name="s"))
    assert _all_frames(str(path)) == []


def test_a_codec_opencv_cannot_decode_is_named(tmp_path):
    """AV1 (SVT-AV1 here): OpenCV's wheels carry FFmpeg without an AV1 decoder. Should a future wheel
    decode it, the frames must then all arrive."""
    video = encode(tmp_path / "clip.mkv", "libsvtav1", frames=4, size=(160, 128))
    frames = _all_frames(str(video), realtime=False)
    if frames:
        assert [f.index for f in frames] == [0, 1, 2, 3]
        return
    with pytest.raises(ServeError, match=r"cannot decode its video \(codec AV01\)"):
        probe_source(
            *classify_source(str(video), trusted=True, allow_devices=False), StreamSpec(url=str(video))
        )


class _Camera(BaseHTTPRequestHandler):
    """Answers as misconfigured cameras do: /404, /401 (Basic auth wanted), /page (a login page)."""

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        path = self.path.split("?")[0]
        if path == "/401":
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="camera"')
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif path == "/snapshot.jpg":  # one JPEG per request, as a camera's still-image URL answers
            jpeg = cv2.imencode(".jpg", square_frame(0)[0])[1].tobytes()
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(jpeg)))
            self.end_headers()
            self.wfile.write(jpeg)
        elif path == "/page":
            body = b"<html><form>login</form></html>" * 20
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        else:
            self.send_error(404)


@pytest.fixture
def bad_camera():
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Camera)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.mark.parametrize(
    "path, reason",
    [
        ("/video", r"HTTP 404 Not Found: no video at path '/video'"),
        ("/401", r"HTTP 401 Unauthorized: it needs a user and password"),
        ("/page", r"the server answers with text/html, not video: is this the camera's web page"),
    ],
)
def test_a_camera_url_that_is_wrong_says_why_and_keeps_retrying(bad_camera, path, reason):
    reader = _reader(f"http://{bad_camera}{path}", open_timeout_s=2)
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 2, 15, "two reconnects")
        assert reader.state in (StreamState.RETRYING, StreamState.CONNECTING) and reader.frames_in == 0
        assert re.search(rf"^could not open http://{bad_camera}{path}: {reason}", reader.last_error or "")
    finally:
        reader.stop()


def test_a_snapshot_url_is_never_live_and_says_what_it_looks_like(bad_camera):
    reader = _reader(f"http://{bad_camera}/snapshot.jpg")
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 3, 15, "three reconnects")
        assert reader.state is not StreamState.LIVE and reader.frames_in >= 3  # one frame per connection
        assert "the source ended after one frame (a snapshot URL? give its video URL)" in reader.last_error
    finally:
        reader.stop()


@pytest.mark.parametrize("frames", [2, 3])
def test_a_camera_that_stalls_with_its_connection_open_is_called_stalled(frames):
    """Not a snapshot URL: that one closes the connection after its frame; this one keeps it open and
    sends nothing (a hung encoder), so the read runs into read_timeout_s. (With one frame FFmpeg's
    open, which probes more than one MJPEG frame, is what times out.)"""
    camera = MjpegCamera(frames_per_connection=frames)
    reader = _reader(camera.url, read_timeout_s=1)
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 1, 15, "a reconnect")
        assert reader.last_error.startswith(
            f"stalled: the connection stayed open but no frame came for 1 s after {frames} frame(s)"
        ), reader.last_error
        assert "snapshot" not in reader.last_error
    finally:
        reader.stop()
        camera.close()


def test_missing_camera_and_closed_port_say_why():
    reader = _reader("63")
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 1, 15, "a reconnect")
        assert "camera 63: /dev/video63 does not exist" in reader.last_error
    finally:
        reader.stop()
    with pytest.raises(ServeError, match="camera 63: /dev/video63 does not exist"):
        probe_source(*classify_source(63, trusted=True, allow_devices=True), StreamSpec(url="63"))
    port = free_port()
    reader = _reader(f"rtsp://127.0.0.1:{port}/cam", open_timeout_s=1)
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 1, 15, "a reconnect")
        assert f"cannot connect to 127.0.0.1:{port} (Connection refused)" in reader.last_error
    finally:
        reader.stop()


@pytest.mark.parametrize("scheme", ["http", "rtsp"])
def test_a_server_that_accepts_and_never_answers_is_named_without_waiting_twice(scheme):
    """The open times out; asking the server again would only time out again, so the reason is given
    at once and the retry is not held up."""
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)  # the kernel completes each connection; nothing ever reads or answers
    url = f"{scheme}://127.0.0.1:{silent.getsockname()[1]}/video"
    reader = _reader(url, open_timeout_s=2)
    started = time.monotonic()
    reader.start()
    try:
        wait_for(lambda: reader.state is StreamState.RETRYING, 10, "the first retry")
        assert time.monotonic() - started < 2 * 2  # one open timeout, not a second one asking
        assert "nothing answered within open_timeout_s 2 s" in reader.last_error
    finally:
        reader.stop()
        silent.close()


def test_an_rtsp_path_the_server_does_not_have_is_named(rtsp_server):
    url = rtsp_server.url.replace("/stream", "/wrong")
    reader = _reader(url.replace("rtsp://", "rtsp://admin:pw@"), open_timeout_s=3)
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 1, 20, "a reconnect")
        assert "RTSP 404 Not Found: no stream at path '/wrong'" in reader.last_error
        assert "pw" not in reader.last_error.replace("/wrong", "")
    finally:
        reader.stop()


@pytest.fixture
def rtsp_login():
    """An RTSP server that wants a login: every request gets 401 with a Digest challenge."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    stopping = threading.Event()

    def answer() -> None:
        while not stopping.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            with conn:
                conn.settimeout(2)
                try:
                    request = conn.recv(4096).decode("latin-1")
                    cseq = next(
                        (ln.split(":")[1].strip() for ln in request.split("\r\n") if ln.startswith("CSeq")),
                        "1",
                    )
                    conn.sendall(
                        f'RTSP/1.0 401 Unauthorized\r\nCSeq: {cseq}\r\nWWW-Authenticate: Digest realm="cam", '
                        'nonce="0"\r\n\r\n'.encode()
                    )
                except OSError:
                    pass

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    yield f"127.0.0.1:{listener.getsockname()[1]}"
    stopping.set()
    thread.join(5)
    listener.close()


@pytest.mark.parametrize(
    "credentials, reason",
    [("", "it needs a user and password"), ("admin:wrong@", "check the user and password in the URL")],
)
def test_an_rtsp_camera_that_wants_a_login_says_so(rtsp_login, credentials, reason):
    reader = _reader(f"rtsp://{credentials}{rtsp_login}/stream", open_timeout_s=3)
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 1, 20, "a reconnect")
        assert f"RTSP 401 Unauthorized: {reason}" in reader.last_error and "wrong" not in reader.last_error
    finally:
        reader.stop()


def test_an_http_server_named_as_rtsp_is_told_apart(bad_camera):
    reader = _reader(f"rtsp://{bad_camera}/stream", open_timeout_s=3)
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 1, 20, "a reconnect")
        assert "accepts connections but does not answer as an RTSP server" in reader.last_error
    finally:
        reader.stop()


def test_frame_index_goes_on_across_reconnects():
    """Detections messages are identified by (stream, frame_index): a reconnect must not start over at 0."""
    camera = MjpegCamera(fps=40, frames_per_connection=6)
    reader = _reader(camera.url, every_frame=True, read_timeout_s=0.5, live_frames=1)
    indices: list[int] = []

    def collect() -> bool:
        while (frame := reader.take()) is not None:
            indices.append(frame.index)
        return reader.reconnects >= 2 and len(indices) >= 13

    reader.start()
    try:
        wait_for(collect, 20, "frames from three connections")
    finally:
        reader.stop()
        camera.close()
    assert indices == sorted(set(indices)) and indices[0] == 0


@pytest.mark.parametrize(
    "url, shown",
    [
        ("http://cam/cgi?user=admin&pwd=hunter2&res=hd", "http://cam/cgi?user=admin&pwd=***&res=hd"),
        ("rtsp://cam/live?token=hunter2", "rtsp://cam/live?token=***"),
        ("https://cdn/v.mp4?X-Amz-Signature=hunter2#t=3", "https://cdn/v.mp4?X-Amz-Signature=***#t=3"),
        ("rtsp://admin:hun/ter2@cam:554/s", "rtsp://admin:***@cam:554/s"),
        ("rtsp://admin:hun@ter#2@cam/s?channel=1", "rtsp://admin:***@cam/s?channel=1"),
        ("rtsp://cam/s?channel=1&email=a@b", "rtsp://cam/s?channel=1&email=a@b"),
    ],
)
def test_redact_hides_query_secrets_and_passwords_with_odd_characters(url, shown):
    assert redact(url) == shown


def test_credentials_never_reach_the_api_metrics_or_logs_and_a_dead_host_holds_up_no_one(
    serve, mjpeg_camera, bad_camera, caplog
):
    caplog.set_level(logging.INFO, "dfine_deploy.serve")
    server = serve()
    http = server.client
    secret = "hunter2"
    urls = {
        "query": f"http://{bad_camera}/401?user=admin&pwd={secret}",
        "userinfo": f"http://admin:{secret}@{bad_camera}/401",
        "dead": "http://10.255.255.1:8080/video",  # nothing answers there: a dead host (or no route)
        "good": mjpeg_camera.url,
    }
    for name, url in urls.items():
        assert http.post("/v1/streams", json={"name": name, "url": url}).status_code == 201
    wait_for(lambda: http.get("/v1/streams/good").json()["state"] == "live", 20, "the good camera live")
    wait_for(lambda: http.get("/v1/streams/query").json()["reconnects"] >= 1, 20, "a reconnect")
    bad = http.post("/v1/streams", json={"url": f"rtsp://u:{secret}@cam/x", "live_frames": 0})
    assert bad.status_code == 400 and "u:***@cam" in bad.text
    slash = http.post("/v1/streams", json={"url": f"rtsp://admin:{secret}/x@127.0.0.1/cam"})
    assert slash.status_code == 400 and "written %2F" in slash.text
    listing = http.get("/v1/streams").text
    exposed = {
        "listing": listing,
        "metrics": http.get("/metrics").text,
        "logs": "\n".join(r.getMessage() for r in caplog.records),
        "refusals": bad.text + slash.text,
    }
    for where, text in exposed.items():
        assert secret not in text, f"the password shows in the {where}"
    assert "pwd=***" in listing and "admin:***@" in listing
    assert metric_value(http, "dfine_serve_stream_up", stream="good") == 1.0
    assert metric_value(http, "dfine_serve_stream_up", stream="query") == 0.0
    assert metric_value(http, "dfine_serve_reconnects_total", stream="query") >= 1  # counted
    query = http.get("/v1/streams/query").json()
    assert query["state"] in ("retrying", "connecting") and "HTTP 401 Unauthorized" in query["last_error"]
