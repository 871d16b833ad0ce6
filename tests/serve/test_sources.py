"""Sources: the URL allow-list, and reader threads on real files and an unreachable RTSP address."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import MjpegCamera, free_port, square_frame, wait_for, write_video

from dfine_deploy.errors import ServeError
from dfine_deploy.serve.settings import StreamSpec, load_streams_file
from dfine_deploy.serve.sources import (
    ForbiddenSource,
    SourceKind,
    StreamReader,
    StreamState,
    classify_source,
    redact,
)


@pytest.mark.parametrize(
    "url, kind",
    [
        ("rtsp://127.0.0.1:8554/cam", SourceKind.RTSP),
        ("rtsps://user:pw@camera.local/live", SourceKind.RTSP),
        ("http://127.0.0.1:8080/video.mjpg", SourceKind.HTTP),
        ("https://example.org/clip.mp4", SourceKind.HTTP),
    ],
)
def test_network_urls_are_allowed_for_clients(url, kind):
    assert classify_source(url, trusted=False, allow_devices=False) == (kind, url)


@pytest.mark.parametrize(
    "url, error",
    [
        ("file:///etc/passwd", ForbiddenSource),
        ("/etc/passwd", ForbiddenSource),
        ("/dev/video0", ForbiddenSource),
        (0, ForbiddenSource),
        ("ftp://127.0.0.1/video.mp4", ServeError),
        ("gopher://x", ServeError),
        ("rtsp://", ServeError),
        ("rtsp:///no-host", ServeError),
        ("http://127.0.0.1:99999/x", ServeError),
        ("http://127.0.0.1/a b", ServeError),
        ("", ServeError),
    ],
)
def test_clients_cannot_name_files_cameras_or_other_schemes(url, error):
    with pytest.raises(error):
        classify_source(url, trusted=False, allow_devices=False)


def test_trusted_input_may_name_files_and_cameras(tmp_path):
    video = write_video(tmp_path / "a.mp4", 3)
    assert classify_source(str(video), trusted=True, allow_devices=False) == (SourceKind.FILE, str(video))
    assert classify_source(f"file://{video}", trusted=True, allow_devices=False) == (
        SourceKind.FILE,
        str(video),
    )
    assert classify_source("/dev/video2", trusted=False, allow_devices=True) == (SourceKind.DEVICE, 2)
    with pytest.raises(ServeError, match="does not exist"):
        classify_source(str(tmp_path / "missing.mp4"), trusted=True, allow_devices=False)


def test_a_folder_given_as_a_video_names_the_videos_inside(tmp_path):
    """A folder of recordings was refused as "video file DIR does not exist", of a folder that exists."""
    for name in ("b.mkv", "a.mp4", "cover.jpg"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(ServeError) as refused:
        classify_source(str(tmp_path), trusted=True, allow_devices=False)
    assert str(refused.value) == (
        f"{tmp_path} is a folder, not a video file; it holds a.mp4, b.mkv: give each video as a --source "
        "of its own (or list them in a --streams file)"
    )


@pytest.mark.parametrize("name", ["photo.jpg", "scan.PNG", "still.webp", "page.tiff"])
def test_a_still_image_is_not_a_stream(tmp_path, name):
    """FFmpeg would decode a photo unturned; images go to /v1/detect, through the one reader."""
    path = tmp_path / name
    path.write_bytes(b"not read: the suffix decides")
    with pytest.raises(ServeError, match=r"is a still image, not a video; send it to POST /v1/detect"):
        classify_source(str(path), trusted=True, allow_devices=False)


def test_redact_hides_passwords_only():
    assert redact("rtsp://admin:secret@10.0.0.5:554/s") == "rtsp://admin:***@10.0.0.5:554/s"
    assert redact("http://10.0.0.5/v") == "http://10.0.0.5/v"


def test_stream_list_rejects_unknown_keys_with_a_suggestion(tmp_path):
    good = tmp_path / "ok.yaml"
    good.write_text("streams:\n  - {name: a, url: rtsp://127.0.0.1/x, max_fps: 5}\n")
    assert load_streams_file(good)[0].max_fps == 5
    bad = tmp_path / "bad.yaml"
    bad.write_text("streams:\n  - {url: rtsp://127.0.0.1/x, vid_strid: 2}\n")
    with pytest.raises(ServeError, match="did you mean 'vid_stride'"):
        load_streams_file(bad)


def _reader(url, **spec) -> StreamReader:
    spec.setdefault("backoff_initial_s", 0.05)
    kind, target = classify_source(url, trusted=True, allow_devices=False)
    return StreamReader("s", StreamSpec(url=url, name="s", **spec), kind, target)


def _drain(reader: StreamReader, timeout: float = 20) -> list:
    frames = []

    def collect():
        stopped = reader.state is StreamState.STOPPED  # read before taking: nothing arrives after STOPPED
        frame = reader.take()
        if frame is not None:
            frames.append(frame)
        return stopped and frame is None

    wait_for(collect, timeout, "the file to end", interval=0.001)
    return frames


def test_every_frame_mode_delivers_each_frame_once_in_order(tmp_path):
    video = write_video(tmp_path / "v.mp4", 25)
    reader = _reader(str(video), every_frame=True, realtime=False)
    reader.start()
    frames = _drain(reader)
    assert [f.index for f in frames] == list(range(25))
    assert reader.finished and reader.frames_dropped == 0 and not reader.alive
    # the decoded pixels are the frame the index names: the red square moved to its place
    x1 = square_frame(7)[1][0]
    assert frames[7].image[35, x1 + 2, 2] > 180 and frames[7].image[35, x1 - 3, 2] < 120


def test_vid_stride_keeps_one_frame_in_n(tmp_path):
    video = write_video(tmp_path / "v.mp4", 20)
    reader = _reader(str(video), every_frame=True, realtime=False, vid_stride=3)
    reader.start()
    assert [f.index for f in _drain(reader)] == list(range(0, 20, 3))


def test_latest_frame_mode_drops_stale_frames_and_loops(tmp_path):
    video = write_video(tmp_path / "v.mp4", 10, fps=400)  # paced like a 400 fps camera
    reader = _reader(str(video), loop=True)
    reader.start()
    try:
        wait_for(lambda: reader.frames_in >= 40, 20, "four passes over a looped 10-frame file")
        frame = reader.take()
        assert frame is not None and reader.take() is None  # one slot: only the newest waits
        assert reader.frames_dropped >= reader.frames_in - 3  # nobody took the others
        assert not reader.finished
    finally:
        reader.stop()
    assert not reader.alive and reader.state is StreamState.STOPPED


def test_native_rate_pacing(tmp_path):
    video = write_video(tmp_path / "v.mp4", 12, fps=20)
    reader = _reader(str(video), every_frame=True, realtime=True)
    t0 = time.monotonic()
    reader.start()
    _drain(reader)
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.45  # 12 frames at 20 fps take 0.55 s; as fast as possible would take ~0.05 s


def test_files_read_as_fast_as_possible_wait_for_the_consumer(tmp_path):
    video = write_video(tmp_path / "v.mp4", 30)
    reader = _reader(str(video), realtime=False)
    reader.start()
    try:
        wait_for(lambda: reader.frames_in >= StreamReader.EVERY_FRAME_QUEUE, 10, "the queue to fill")
        time.sleep(0.2)
        assert reader.frames_in == StreamReader.EVERY_FRAME_QUEUE + 1  # the queue plus one in hand, no more
        assert reader.frames_dropped == 0 and reader.take().index == 0
    finally:
        reader.stop()


def test_the_health_rule_keeps_only_the_arrivals_it_reads(tmp_path):
    """The source clock stands still while the reader waits for the consumer, so live_window_s of it
    can span many frames of a fast file: only the newest live_frames are kept (memory stays flat in a
    long run), and the rule still sees a live stream."""
    reader = _reader(str(write_video(tmp_path / "v.mp4", 2)), live_frames=5, live_window_s=5)
    for _ in range(10_000):  # far more than live_frames within one window
        reader._note_arrival()
    assert len(reader._arrivals) == 5 and reader.recent_frames() == 5 and reader._healthy


def test_unreachable_source_retries_with_backoff_until_stopped(caplog):
    caplog.set_level(logging.WARNING, "dfine_deploy.serve")
    reader = _reader(f"rtsp://u:pw@127.0.0.1:{free_port()}/nothing", open_timeout_s=1, backoff_max_s=0.2)
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 3, 15, "three reconnect attempts")
        assert reader.state in (StreamState.RETRYING, StreamState.CONNECTING)
        assert "could not open" in (reader.last_error or "")
        assert reader.frames_in == 0
    finally:
        reader.stop()
    assert not reader.alive
    retries = [r.getMessage() for r in caplog.records if "reconnecting in" in r.getMessage()]
    assert len(retries) >= 3 and all("stream s (rtsp://u:***@127.0.0.1" in line for line in retries)


def test_an_undecodable_file_fails_once_with_one_log_line(tmp_path, caplog):
    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 40)
    reader = _reader(str(bad))
    reader.start()
    wait_for(lambda: not reader.alive, 15, "the reader to give up")
    assert reader.state is StreamState.FAILED and reader.reconnects == 0
    assert "broken.mp4 cannot be decoded" in reader.last_error
    (line,) = [r for r in caplog.records if r.levelno >= logging.WARNING and r.name == "dfine_deploy.serve"]
    assert line.levelno == logging.ERROR and "stream s failed: video file" in line.getMessage()


def test_backoff_is_capped_and_jittered():
    reader = _reader("rtsp://127.0.0.1:1/x", backoff_initial_s=0.5, backoff_max_s=4.0)
    delays = [reader._backoff(attempt) for attempt in range(12) for _ in range(20)]
    assert max(delays) <= 4.0 and min(delays) >= 0.25
    assert len({round(d, 6) for d in delays}) > 100  # jitter: retries of many cameras do not align


@pytest.mark.parametrize(
    ("url", "fields", "said"),
    [
        ("rtsp://cam.local/x", "loop: true", "loop: for video files only"),
        ("https://cam.local/x.mjpg", "realtime: false", "realtime: false: for video files only"),
        ("/dev/video0", "loop: true, realtime: false", "loop and realtime: false: for video files only"),
        (3, "loop: true", "loop: for video files only"),
    ],
)
def test_file_only_fields_on_a_live_source_are_refused_not_ignored(tmp_path, url, fields, said):
    """`loop: true` on a camera or a network stream did nothing, without a word."""
    listed = tmp_path / "streams.yaml"
    listed.write_text(f"streams:\n  - {{url: {url}, name: cam, {fields}}}\n")
    with pytest.raises(ServeError, match=f"stream 'cam': {re.escape(said)}"):
        load_streams_file(listed)


def test_the_example_stream_list_is_valid():
    example = Path(__file__).parents[2] / "serve" / "streams.example.yaml"
    specs = load_streams_file(example)
    assert [s.name for s in specs] == ["entrance", "gate", "parking", "loading-dock", "replay", "usb-cam"]
    for spec in specs:
        if not str(spec.url).startswith("/data/"):  # the example file path does not exist here
            classify_source(spec.url, trusted=True, allow_devices=False)


def test_max_fps_skips_frames_of_a_live_source(mjpeg_camera):
    reader = _reader(mjpeg_camera.url, max_fps=4)
    reader.start()
    try:
        wait_for(lambda: reader.state is StreamState.LIVE, 10, "the camera to be live")
        sent0, kept0, t0 = mjpeg_camera.frames_sent, reader.frames_in, time.monotonic()
        time.sleep(1.5)
        sent, kept, elapsed = (
            mjpeg_camera.frames_sent - sent0,
            reader.frames_in - kept0,
            time.monotonic() - t0,
        )
    finally:
        reader.stop()
    assert sent >= 15  # the camera sends 20 fps
    assert 1 <= kept <= 4 * elapsed + 2  # at most 4 per second were decoded and handed on


def _states_over(reader: StreamReader, seconds: float) -> list[StreamState]:
    """The reader's state sampled every 20 ms for `seconds`."""
    states = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        states.append(reader.state)
        time.sleep(0.02)
    return states


FROZEN = {"open_timeout_s": 2, "read_timeout_s": 0.5, "backoff_initial_s": 0.05, "backoff_max_s": 0.4}


@pytest.mark.parametrize("frames_per_connection", [2, 3, 4])
def test_a_camera_that_freezes_after_a_few_frames_is_never_live_and_keeps_backing_off(frames_per_connection):
    """Each reconnect gets a few frames (fewer than live_frames = 5), then nothing: the stream must
    never read live, and the backoff must keep growing instead of starting over at every frame. (Two
    is the fewest: FFmpeg's probe cannot open an MJPEG stream that sends one frame and stops.)"""
    camera = MjpegCamera(frames_per_connection=frames_per_connection)
    reader = _reader(camera.url, **FROZEN)
    reader.start()
    try:
        states = _states_over(reader, 4.0)
        wait_for(lambda: reader.reconnects >= 2, 10, "two reconnects")
        assert reader.frames_in >= 2  # it did receive frames, one burst per connection
        assert StreamState.LIVE not in states, states
        assert reader.failures >= reader.reconnects  # never reset: no connection was live
        assert "fewer than 5 frames in 5 s" in (reader.last_error or "")
    finally:
        reader.stop()
        camera.close()


def test_an_mjpeg_camera_that_freezes_after_one_frame_is_called_stalled_and_reconnected():
    """A real HTTP camera sends one JPEG of its multipart/x-mixed-replace stream, then holds the
    connection open with nothing more (a hung encoder). FFmpeg's open, which waits for more frames
    to learn the stream, runs out of open_timeout_s on it; the reason must say "stalled" after one
    frame, as for RTSP, not that nothing answered or that the source ended, and the reader keeps
    reconnecting."""
    camera = MjpegCamera(frames_per_connection=1)
    reader = _reader(
        camera.url, open_timeout_s=2, read_timeout_s=1, backoff_initial_s=0.05, backoff_max_s=0.3
    )
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 2, 30, "two reconnects")
        expected = "stalled: the connection stayed open but no frame came for 1 s after 1 frame(s)"
        assert (reader.last_error or "").startswith(expected), reader.last_error
        assert reader.state is not StreamState.LIVE and camera.connections >= 2
        assert camera.frames_sent >= 2  # each connection sent its one frame
    finally:
        reader.stop()
        camera.close()


@pytest.mark.parametrize("frames_per_connection, reset_s, resets", [(50, 1.0, True), (12, 3.0, False)])
def test_the_backoff_starts_over_only_after_a_sustained_live_run(frames_per_connection, reset_s, resets):
    """50 frames at 20 fps keep a connection live for ~2.3 s, past backoff_reset_s = 1: every failure
    is then the first again. 12 frames are live for ~0.35 s, far from 3 s: failures pile up."""
    camera = MjpegCamera(frames_per_connection=frames_per_connection)
    reader = _reader(camera.url, backoff_reset_s=reset_s, **FROZEN)
    reader.start()
    try:
        states = []
        wait_for(lambda: states.append(reader.state) or reader.reconnects >= 3, 40, "three reconnects")
        assert StreamState.LIVE in states  # each connection was live for a while
        assert (reader.failures <= 1) is resets, reader.failures
    finally:
        reader.stop()
        camera.close()


def test_a_camera_that_slows_to_a_trickle_reads_stalled_then_live_again():
    camera = MjpegCamera(fps=20)
    reader = _reader(camera.url, live_frames=5, live_window_s=1.0)
    reader.start()
    try:
        wait_for(lambda: reader.state is StreamState.LIVE, 10, "the camera to be live")
        camera.fps = 1.5  # still connected, well under 5 frames a second
        wait_for(lambda: reader.state is StreamState.STALLED, 10, "the stream to read stalled")
        reason = re.compile(r"stalled: [1-4] frame\(s\) in the last 1 s, live needs 5")
        wait_for(lambda: reason.search(reader.last_error or ""), 10, "the reason")
        assert reader.reconnects == 0  # the connection never failed: stalled is not retrying
        camera.fps = 20
        wait_for(lambda: reader.state is StreamState.LIVE, 10, "the camera to be live again")
        assert reader.last_error is None
    finally:
        reader.stop()
        camera.close()


def test_a_busy_consumer_does_not_make_a_source_stall(tmp_path):
    """every_frame makes the reader wait for the detector; that wait is not the source's fault."""
    video = write_video(tmp_path / "v.mp4", 60)
    reader = _reader(str(video), every_frame=True, realtime=False, live_window_s=2.0)
    reader.start()
    try:
        wait_for(lambda: reader.frames_in > StreamReader.EVERY_FRAME_QUEUE, 10, "a full queue")
        assert set(_states_over(reader, 3.0)) == {StreamState.LIVE}  # nobody took a frame for 3 s
    finally:
        reader.stop()


@pytest.mark.parametrize(
    "entry, error",
    [
        ({"live_frames": 0}, "live_frames must be"),
        ({"live_frames": 2.5}, "live_frames must be a whole number from 1 to 3600000"),
        ({"live_window_s": 1e-300}, r"live_window_s must be a finite number in \[0.01, 3600\]"),
        ({"read_timeout_s": 1e308}, r"read_timeout_s must be a finite number in \[0.01, 3600\]"),
        ({"vid_stride": True}, "vid_stride must be a whole number from 1 to 10000; found True"),
        ({"live_window_s": 0}, "live_window_s must be"),
        ({"live_window_s": float("nan")}, "live_window_s must be"),
        ({"backoff_reset_s": -1}, "backoff_reset_s must be"),
        ({"read_timeout_s": float("inf")}, "read_timeout_s must be"),
    ],
)
def test_health_settings_are_checked_with_one_clear_line(entry, error):
    with pytest.raises(ServeError, match=error):
        StreamSpec(url="rtsp://127.0.0.1/x", name="s", **entry)


def test_public_surface_and_no_torch_on_the_serving_path():
    import dfine_deploy.serve as serve

    assert sorted(serve.__all__) == sorted(
        [
            "CountingLine",
            "CountingZone",
            "DetectorLike",
            "ServeSettings",
            "SourceKind",
            "StreamPipeline",
            "StreamSpec",
            "StreamState",
            "create_app",
            "load_streams_file",
        ]
    )
    assert all(getattr(serve, name) is not None for name in serve.__all__)
    code = (
        "import sys, dfine_deploy.serve.app, dfine_deploy.serve.cli, dfine_deploy.serve.tracking;"
        "sys.exit('torch' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0, (
        "the server imported torch"
    )
