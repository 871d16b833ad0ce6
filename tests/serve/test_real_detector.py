"""The server on the real runtime: `Detector.open` on an ONNX graph with D-FINE's interface, run by
onnxruntime, both embedded (create_app) and through the `dfine-serve` command line."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time

import cv2
import httpx
import numpy as np
import pytest
import websockets
from conftest import free_port, wait_for
from tiny_model import red_score_model

from dfine_deploy.serve.settings import StreamSpec

runtime = pytest.importorskip("dfine_deploy.runtime")


def _alternating_video(path, frames: int = 16):
    """Even frames pure red, odd frames pure blue: the model finds a red frame, never a blue one."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    for i in range(frames):
        image = np.zeros((48, 64, 3), np.uint8)
        image[..., 2 if i % 2 == 0 else 0] = 255  # BGR: channel 2 is red
        writer.write(image)
    writer.release()
    return path


def _check(result: dict) -> None:
    if result["frame_index"] % 2 == 0:
        (det,) = result["detections"]
        assert det["box"] == [0, 0, 64, 48] and det["score"] > 0.9
    else:
        assert result["detections"] == []


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return red_score_model(tmp_path_factory.mktemp("model") / "red.onnx")


def test_embedded_server_on_onnxruntime(serve, tmp_path, model_path):
    detector = runtime.Detector.open(model_path, backend="onnxruntime", device="cpu", score_threshold=0.25)
    video = _alternating_video(tmp_path / "v.mp4")
    server = serve(detector=detector, streams=[StreamSpec(url=str(video), name="v", loop=True)])
    http = server.client
    assert http.get("/readyz").json()["backend"] == "onnxruntime"
    wait_for(lambda: server.pipeline.get("v").frames_processed >= 6, 20, "six processed frames")
    _check(http.get("/v1/streams/v/latest").json())

    red = np.zeros((30, 40, 3), np.uint8)
    red[..., 2] = 255
    reply = http.post(
        "/v1/detect", content=cv2.imencode(".png", red)[1].tobytes(), headers={"Content-Type": "image/png"}
    ).json()
    assert reply["detections"][0]["box"] == [0, 0, 40, 30]


def test_cli_serves_a_file_writes_video_and_json_then_exits(tmp_path, model_path):
    video = _alternating_video(tmp_path / "clip.mp4", frames=16)
    out = tmp_path / "out"
    command = [
        sys.executable, "-m", "dfine_deploy.serve.cli", str(model_path), "--backend", "onnxruntime",
        "--source", str(video), "--every-frame", "--fast", "--port", "0", "--duration", "60",
        "--record", str(out), "--output-json", str(out / "detections.jsonl"), "--log-level", "warning",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in (out / "detections.jsonl").read_text().splitlines()]
    assert [r["frame_index"] for r in results] == list(range(16))  # ended with the file, long before 60 s
    for result in results:
        _check(result)
    (segment,) = (out / "clip").glob("clip-*.mp4")  # named after the source file
    assert int(cv2.VideoCapture(str(segment)).get(cv2.CAP_PROP_FRAME_COUNT)) == 16


def test_cli_reports_bad_input_in_one_line(tmp_path, model_path, capsys):
    from dfine_deploy.serve.cli import main

    assert main([str(model_path), "--source", str(tmp_path / "missing.mp4")]) == 2
    assert "missing.mp4 does not exist" in capsys.readouterr().err
    (tmp_path / "same").mkdir()
    video = _alternating_video(tmp_path / "same" / "same.mp4", frames=2)
    record = ["--duration", "5", "--port", "0", "--record"]
    assert (
        main([str(model_path), "--backend", "onnxruntime", "--source", str(video), *record, str(tmp_path)])
        == 2
    )
    assert "reads " + str(video) + ", inside its own recording folder" in capsys.readouterr().err
    assert main([str(model_path), "--source", str(video), *record, str(video)]) == 2  # a file, not a folder
    assert f"{video} is a file, not a folder" in capsys.readouterr().err
    for flag, value in (("--record-segment", "0.5"), ("--record-max-age", "0"), ("--record-max-size", "nan")):
        assert (
            main([str(model_path), "--source", str(video), *record, str(tmp_path / "out"), flag, value]) == 2
        )
        assert "must be" in capsys.readouterr().err
    bad_list = tmp_path / "streams.yaml"
    bad_list.write_text("streams:\n  - {url: rtsp://127.0.0.1/x, every_frames: true}\n")
    assert main([str(model_path), "--streams", str(bad_list)]) == 2
    assert "did you mean 'every_frame'" in capsys.readouterr().err
    # --precision reaches the runtime: a single graph has no INT8 sibling to choose
    assert main([str(model_path), "--precision", "int8", "--source", str(video), "--port", "0"]) == 2
    assert "precision='int8' chooses a graph of an artifact folder" in capsys.readouterr().err


def test_the_lifespan_loads_the_model_while_health_answers(serve, model_path, tmp_path):
    server = serve(model=str(model_path), backend="onnxruntime", device="cpu")
    http = server.client
    assert http.get("/healthz").json()["status"] == "ok"
    wait_for(lambda: http.get("/readyz").status_code == 200, 30, "the model to load")
    assert http.get("/readyz").json()["backend"] == "onnxruntime"

    broken = serve(model=str(tmp_path / "nowhere.onnx"), backend="onnxruntime")
    wait_for(lambda: broken.client.get("/readyz").json()["status"] == "failed", 30, "the load to fail")
    assert "nowhere.onnx" in broken.client.get("/readyz").json()["detail"]
    assert broken.client.get("/healthz").status_code == 200
    assert broken.client.get("/v1/streams").status_code == 503


def test_an_undecodable_file_is_refused_in_one_line_in_every_mode(tmp_path, model_path, capsys):
    from dfine_deploy.serve.cli import main

    bad = tmp_path / "broken.mp4"
    bad.write_bytes(b"\x00\x00\x00\x18ftypmp42" + bytes(range(256)) * 40)  # an MP4 signature, then garbage
    out = tmp_path / "out" / "detections.jsonl"
    common = [str(model_path), "--backend", "onnxruntime", "--source", str(bad), "--port", "0"]
    for mode in (["--duration", "30", "--output-json", str(out)], []):  # process-then-exit, and server
        started = time.monotonic()
        assert main(common + mode) == 2
        assert time.monotonic() - started < 20
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "broken.mp4 cannot be decoded" in err[0] and "Traceback" not in err[0]
    assert not out.exists()  # no empty detections file that could pass for "nothing detected"


def test_api_keys_never_reach_the_logs_and_the_query_form_only_works_for_browsers(tmp_path, model_path):
    key = "k3y-that-must-not-leak"
    port = free_port()
    video = _alternating_video(tmp_path / "cam.mp4", frames=16)
    command = [
        sys.executable, "-m", "dfine_deploy.serve.cli", str(model_path), "--backend", "onnxruntime",
        "--source", str(video), "--loop", "--port", str(port), "--api-key", key, "--log-level", "info",
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as http:
            wait_for(lambda: _answers(http), 60, "the server to answer")
            assert http.get(f"/v1/streams?api_key={key}").status_code == 401  # header-only route
            assert http.get("/v1/streams", headers={"X-API-Key": key}).status_code == 200
            with http.stream(
                "GET", f"/v1/streams/cam/events?api_key={key}"
            ) as events:  # a browser's EventSource
                assert events.status_code == 200
                next(line for line in events.iter_lines() if line.startswith("data: "))

        async def websocket_with_query_key() -> dict:  # a browser's WebSocket
            async with websockets.connect(f"ws://127.0.0.1:{port}/v1/streams/cam/ws?api_key={key}") as ws:
                return json.loads(await asyncio.wait_for(ws.recv(), 10))

        assert asyncio.run(websocket_with_query_key())["stream"] == "cam"
    finally:
        server.send_signal(signal.SIGINT)
        out, err = server.communicate(timeout=30)
    log = out + err  # uvicorn writes its access log to stdout
    assert "GET /v1/streams?api_key=*** HTTP/1.1" in log and "/v1/streams/cam/events?api_key=***" in log
    assert "/v1/streams/cam/ws?api_key=***" in log
    assert key not in log


def _answers(http: httpx.Client, port: int | None = None) -> bool:
    try:
        path = f"http://127.0.0.1:{port}/readyz" if port else "/readyz"
        return http.get(path).status_code == 200
    except httpx.TransportError:
        return False


def test_a_network_source_that_never_delivers_ends_a_timed_run_with_one_line(model_path, capsys, monkeypatch):
    from dfine_deploy.serve.cli import main
    from dfine_deploy.serve.server import Server

    ended: list[Server] = []  # in-process, main ends the stop deadline's watch (test_shutdown.py)
    end_watch = Server.stop_over
    monkeypatch.setattr(Server, "stop_over", lambda self: (ended.append(self), end_watch(self)))
    url = f"rtsp://user:secret@127.0.0.1:{free_port()}/none"  # nothing listens there
    started = time.monotonic()
    code = main(
        [str(model_path), "--backend", "onnxruntime", "--source", url, "--duration", "3", "--port", "0"]
    )
    assert code == 2 and time.monotonic() - started < 20
    assert len(ended) == 1
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert "'stream-1'" in line and "no frame in 3 s (could not open rtsp://user:***@127.0.0.1" in line


@pytest.mark.parametrize("log_level", ["warning", "debug"])
def test_refused_cameras_leave_only_our_lines_on_stderr(model_path, log_level):
    """OpenCV and its FFmpeg print their own lines for every refused connection, straight to stderr
    (`[tcp @ 0x...] Connection ... refused`, `[ WARN:0@1.4] ... capture by name`), beside ours that
    already say it: they show only at --log-level debug."""
    port = free_port()  # nothing listens there
    command = [
        sys.executable, "-m", "dfine_deploy.serve.cli", str(model_path), "--backend", "onnxruntime",
        "--port", "0", "--source", f"rtsp://127.0.0.1:{port}/cam", "--source",
        f"http://127.0.0.1:{port}/video.mjpg", "--duration", "3", "--log-level", log_level,
    ]  # fmt: skip
    environment = {
        k: v for k, v in os.environ.items() if not k.startswith(("OPENCV_FFMPEG_LOG", "OPENCV_LOG"))
    }
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, env=environment)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.splitlines()
    theirs = [line for line in lines if line.startswith("[")]
    if log_level == "debug":
        assert any("Connection refused" in line or "VIDEOIO" in line for line in theirs), lines
        return
    ours = [line for line in lines if " WARNING dfine_deploy.serve: stream stream-" in line]
    assert {"stream-1", "stream-2"} <= {line.split("stream ")[1].split()[0] for line in ours}, lines
    assert all("Connection refused" in line for line in ours)
    assert not theirs and len(lines) == len(ours) + 1 and lines[-1].startswith("error: 2 stream(s)"), lines


def test_sigterm_with_viewers_connected_ends_them_cleanly_without_tracebacks(tmp_path, model_path):
    """A WebSocket, an SSE and an MJPEG viewer are watching when SIGTERM comes: each gets its end
    (close 1001, `event: end`, the end of the multipart body) at once, the log has no ERROR and no
    traceback, and the process is gone well within the grace period it used to run out."""
    from dfine_deploy.serve.cli import GRACE_S

    port = free_port()
    video = _alternating_video(tmp_path / "cam.mp4", frames=16)
    command = [
        sys.executable, "-m", "dfine_deploy.serve.cli", str(model_path), "--backend", "onnxruntime",
        "--source", str(video), "--loop", "--port", str(port), "--log-level", "info",
    ]  # fmt: skip
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    base = f"127.0.0.1:{port}/v1/streams/cam"
    received = {kind: threading.Event() for kind in ("events", "mjpeg", "ws")}
    ended: dict[str, object] = {}

    def watch(kind: str) -> None:
        body = b""
        with httpx.stream("GET", f"http://{base}/{kind}", timeout=30) as response:
            for chunk in response.iter_bytes():
                body += chunk
                received[kind].set()
        ended[kind] = body

    async def websocket_until_closed() -> None:
        async with websockets.connect(f"ws://{base}/ws") as ws:
            try:
                while True:
                    await asyncio.wait_for(ws.recv(), 30)
                    received["ws"].set()
            except websockets.ConnectionClosedOK:
                ended["ws"] = (ws.close_code, ws.close_reason)

    try:
        with httpx.Client(timeout=10) as http:
            wait_for(lambda: _answers(http, port), 60, "the server to answer")
        threads = [threading.Thread(target=watch, args=(kind,)) for kind in ("events", "mjpeg")]
        threads.append(threading.Thread(target=lambda: asyncio.run(websocket_until_closed())))
        for thread in threads:
            thread.start()
        wait_for(lambda: all(e.is_set() for e in received.values()), 20, "every viewer to receive results")
        started = time.monotonic()
        server.send_signal(signal.SIGTERM)
        out, err = server.communicate(timeout=30)
        took = time.monotonic() - started
        for thread in threads:
            thread.join(10)
    finally:
        if server.poll() is None:
            server.kill()
    log = out + err
    assert "ERROR" not in log and "Traceback" not in log, log
    assert took < GRACE_S, f"shutdown took {took:.1f} s"
    assert ended["ws"] == (1001, "the server is shutting down")
    assert ended["events"].rstrip().endswith(b'event: end\ndata: {"reason": "the server is shutting down"}')
    assert ended["mjpeg"].startswith(b"--frame\r\nContent-Type: image/jpeg")  # frames, then a normal end


def test_served_onnxruntime_threads_sleep_between_frames_and_bench_keeps_spinning(model_path):
    from dfine_deploy.serve.app import load_detector
    from dfine_deploy.serve.settings import ServeSettings

    served = load_detector(ServeSettings(model=str(model_path), backend="onnxruntime", device="cpu"))
    options = served.backend.session.get_session_options()
    for key in ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning"):
        assert options.get_session_config_entry(key) == "0"
    assert served.info["spin_wait"] is False
    plain = runtime.Detector.open(model_path, backend="onnxruntime", device="cpu")  # what dfine-bench opens
    with pytest.raises(Exception, match="allow_spinning"):  # onnxruntime's default: spinning on
        plain.backend.session.get_session_options().get_session_config_entry(
            "session.intra_op.allow_spinning"
        )


def test_openvino_compiles_before_the_first_frame_and_never_while_six_streams_batch(
    serve, tmp_path, model_path
):
    """The server compiles the batch sizes it can meet (1, 2, 4, 8) when it loads the model: every
    batch from 1 to 8 frames then runs on one of those, and six streams served to their end compile
    nothing more. Which sizes the streams make depends on thread timing, so each size is also run
    directly; in one CI run the six streams made batches of only 3 and 6."""
    from dfine_deploy.serve.app import load_detector
    from dfine_deploy.serve.settings import ServeSettings

    detector = load_detector(ServeSettings(model=str(model_path), backend="openvino", max_batch=8))
    backend = detector.backend
    assert sorted(backend._compiled) == [1, 2, 4, 8] and backend.compiles == 4
    red = np.zeros((48, 64, 3), np.uint8)
    red[..., 2] = 255
    for size in range(1, 9):
        found = detector.predict([red] * size)
        assert [len(d) for d in found] == [1] * size, f"batch of {size}"
    assert backend.compiles == 4, "compiled again for a batch of 1 to 8 frames"

    sizes: list[int] = []
    predict = detector.predict

    def recording_predict(frames, **kwargs):
        sizes.append(len(frames))
        return predict(frames, **kwargs)

    detector.predict = recording_predict
    video = _alternating_video(tmp_path / "v.mp4", frames=40)
    streams = [StreamSpec(url=str(video), name=f"cam{i}", realtime=False, every_frame=True) for i in range(6)]
    server = serve(detector=detector, streams=streams, max_batch=8)
    wait_for(server.pipeline.all_finished, 60, "six streams to reach their end")
    assert sum(h.frames_processed for h in server.pipeline.list()) == 6 * 40
    assert sizes and max(sizes) <= 8, f"batch sizes met: {sorted(set(sizes))}"
    assert backend.compiles == 4, f"compiled again while serving batches of {sorted(set(sizes))}"
    _check(server.client.get("/v1/streams/cam3/latest").json())


def test_cli_tiles_and_motion_for_a_source(tmp_path, model_path):
    """`--tiles`, `--tile-overlap`, `--tiles-no-full`, `--motion` and `--detect-fps` give a --source
    stream the very settings of the stream list's `tiles:` and `detect:`; typed as a user types them,
    the stream is served through its tiles and the motion gate (each red frame's crops merged into
    one box of the whole frame)."""
    from dfine_deploy.serve.cli import _settings, get_args_parser
    from dfine_deploy.serve.settings import stream_from_dict

    video = _alternating_video(tmp_path / "clip.mp4", frames=16)
    flags = ["--tiles", "3x2", "--tile-overlap", "0.1", "--tiles-no-full", "--motion", "--detect-fps", "5"]
    (spec,) = _settings(
        get_args_parser().parse_args([str(model_path), "--source", str(video), *flags])
    ).streams
    entry = {
        "tiles": {"grid": [3, 2], "overlap": 0.1, "full_frame": False},
        "detect": {"motion": True, "fps": 5},
    }
    listed = stream_from_dict({"url": str(video), **entry}, "list")
    assert (spec.tiles, spec.detect) == (listed.tiles, listed.detect)

    out = tmp_path / "out" / "detections.jsonl"
    command = [
        sys.executable, "-m", "dfine_deploy.serve.cli", str(model_path), "--backend", "onnxruntime",
        "--source", str(video), "--every-frame", "--fast", "--port", "0", "--duration", "60",
        "--tiles", "2x1", "--tile-overlap", "0.25", "--motion", "--output-json", str(out),
        "--log-level", "warning",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["frame_index"] for r in results] == list(range(16))
    for result in results:
        _check(result)  # red frames: the two crops' boxes joined into the frame's one box


# a value other than the default for each option that belongs to another (serve/cli.py OPTION_OWNERS)
OWNED_VALUES = {
    "--record-segment": ["5"],
    "--record-max-age": ["2"],
    "--record-max-size": ["1"],
    "--events-max-age": ["2"],
    "--events-max-size": ["3"],
    "--mqtt-prefix": ["site"],
    "--redis-prefix": ["site"],
    "--redis-maxlen": ["500"],
    "--bus-detections": [],
    "--bus-buffer": ["500"],
    "--shard": ["1/2"],
}


def test_an_option_without_the_option_it_belongs_to_is_refused_not_ignored(model_path, capsys):
    """--record-segment without --record, --mqtt-prefix without --mqtt, --shard without --streams, ...
    were ignored without a word."""
    from dfine_deploy.serve.cli import OPTION_OWNERS, main

    assert set(OWNED_VALUES) == set(OPTION_OWNERS)
    for flag, value in OWNED_VALUES.items():
        assert main([str(model_path), flag, *value, "--duration", "5"]) == 2, flag  # a server ends
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"{flag} belongs to {' or '.join(OPTION_OWNERS[flag])}, and is ignored without it" in line, (
            line
        )


def test_an_owned_option_written_at_its_default_value_is_refused_too(model_path, capsys):
    """`--shard 0/1` without --streams passed: the check compared the value with the default."""
    from dfine_deploy.cli import option_dest
    from dfine_deploy.serve.cli import OPTION_OWNERS, get_args_parser, main

    defaults = {flag: get_args_parser().get_default(option_dest(flag)) for flag in OPTION_OWNERS}
    written = {flag: str(value) for flag, value in defaults.items() if value not in (None, False)}
    assert "--shard" in written and "--record-segment" in written
    for flag, value in written.items():
        assert main([str(model_path), flag, value, "--duration", "5"]) == 2, flag
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"{flag} belongs to {' or '.join(OPTION_OWNERS[flag])}" in line, line
    assert main([str(model_path), "--shar=0/1", "--duration", "5"]) == 2  # argparse's abbreviation
    assert "--shard belongs to --streams" in capsys.readouterr().err


def test_every_source_flag_without_a_source_is_refused_not_ignored(model_path, capsys):
    """--loop, --fast, --every-frame and --track without a --source were ignored without a word."""
    from dfine_deploy.serve.cli import SOURCE_FLAGS, main

    for flag, field in SOURCE_FLAGS.items():
        value = ["3x2"] if flag == "--tiles" else []
        assert main([str(model_path), flag, *value]) == 2, flag
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert f"{flag} applies to --source streams" in line and f"({field}, docs/serve.md)" in line, line


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--tiles", "3by2"], "--tiles: '3by2': give COLUMNSxROWS, e.g. 3x2"),
        (["--tiles", "3x2", "--tile-overlap", "0.7"], "--tile-overlap: overlap 0.7: give a fraction"),
        (["--tiles", "1x1"], "--tiles: grid [1, 1]: give [columns, rows], each 1-16, at least 2 crops"),
        (["--tile-overlap", "0.1"], "--tile-overlap shapes the tiles of --tiles; add --tiles COLSxROWS"),
        (["--motion", "--detect-fps", "-2"], "--detect-fps: fps -2.0: give detections per second >= 0"),
        (["--detect-fps", "5"], "--detect-fps 5 caps the motion gate's detections; add --motion"),
    ],
)
def test_cli_tiles_and_motion_flags_refused_in_one_line(tmp_path, model_path, capsys, argv, expected):
    from dfine_deploy.serve.cli import main

    video = _alternating_video(tmp_path / "clip.mp4", frames=2)
    assert main([str(model_path), "--source", str(video), "--port", "0", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and expected in err[0], err
