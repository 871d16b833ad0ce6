"""The server end to end on loopback: uvicorn, real sources, WebSocket/SSE/MJPEG clients, bad inputs."""

from __future__ import annotations

import asyncio
import json
import struct
import threading
import time
import zlib

import cv2
import httpx
import numpy as np
import pytest
import websockets
from conftest import GRACE_S, MjpegCamera, metric_value, square_frame, wait_for, write_video
from fake_detector import RedSquareDetector

from dfine_deploy.serve.settings import StreamSpec

KEY = "s3cret-key"
AUTH = {"X-API-Key": KEY}


def _png(image: np.ndarray) -> bytes:
    return cv2.imencode(".png", image)[1].tobytes()


def _assert_square(result: dict) -> None:
    """The detection is the red square of the frame the result names (mp4v blurs edges by a pixel)."""
    (det,) = result["detections"]
    expected = square_frame(result["frame_index"])[1]
    assert np.allclose(det["box"], expected, atol=2), (det["box"], expected)
    assert det["name"] == "red-square" and result["width"] == 160 and result["height"] == 120


async def _ws_results(url: str, count: int, headers: dict | None = None) -> list[dict]:
    async with websockets.connect(url, additional_headers=headers or {}, open_timeout=10) as ws:
        return [json.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in range(count)]


def _sse_results(http: httpx.Client, path: str, count: int, headers: dict | None = None) -> list[dict]:
    results = []
    with http.stream("GET", path, headers=headers or {}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                results.append(json.loads(line[6:]))
                if len(results) == count:
                    break
    return results


def test_file_stream_results_over_websocket_sse_latest_and_mjpeg(serve, tmp_path):
    video = write_video(tmp_path / "v.mp4", 40)
    server = serve(streams=[StreamSpec(url=str(video), name="cam", loop=True)], api_key=KEY)
    http = server.client
    ws_base = server.base_url.replace("http", "ws")

    ws = asyncio.run(_ws_results(f"{ws_base}/v1/streams/cam/ws", 5, AUTH))
    for result in ws:
        assert result["stream"] == "cam"
        _assert_square(result)
    assert len({r["frame_index"] for r in ws}) == 5

    for result in _sse_results(http, "/v1/streams/cam/events", 5, AUTH):
        _assert_square(result)

    latest = http.get("/v1/streams/cam/latest", headers=AUTH).json()
    _assert_square(latest)

    with http.stream("GET", "/v1/streams/cam/mjpeg", headers=AUTH) as response:
        assert response.headers["content-type"] == "multipart/x-mixed-replace; boundary=frame"
        buffer = b""
        for chunk in response.iter_bytes():
            buffer += chunk
            if buffer.count(b"--frame") >= 2:
                break
    part = buffer.split(b"--frame")[1]
    header, _, body = part.partition(b"\r\n\r\n")
    length = int(header.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    frame = cv2.imdecode(np.frombuffer(body[:length], np.uint8), cv2.IMREAD_COLOR)
    assert frame.shape == (120, 160, 3)

    (info,) = http.get("/v1/streams", headers=AUTH).json()
    assert info["state"] == "live" and info["kind"] == "file" and info["frames_processed"] >= 10
    assert metric_value(http, "dfine_serve_frames_processed_total", AUTH, stream="cam") >= 10


def test_http_mjpeg_camera_added_at_run_time_then_removed(serve, mjpeg_camera):
    server = serve()
    http = server.client
    base = server.base_url
    created = http.post("/v1/streams", json={"url": mjpeg_camera.url, "name": "door", "wait_live_s": 10})
    assert created.status_code == 201, created.text
    assert created.json()["state"] == "live" and created.json()["kind"] == "http"
    for result in _sse_results(http, "/v1/streams/door/events", 3):
        _assert_square(result)
    fps = lambda: http.get("/v1/streams/door").json()["fps"]  # noqa: E731
    wait_for(lambda: 5 <= fps() <= 25, 10, "the published rate to settle near the camera's 20 fps")
    assert http.get("/v1/streams/door").json()["latency_ms"] > 0

    async def removed_while_listening() -> int:
        async with websockets.connect(
            f"{base.replace('http', 'ws')}/v1/streams/door/ws", open_timeout=10
        ) as ws:
            await asyncio.wait_for(ws.recv(), 10)
            reply = await asyncio.to_thread(http.delete, "/v1/streams/door")
            assert reply.status_code == 204
            with pytest.raises(websockets.ConnectionClosedOK):
                while True:
                    await asyncio.wait_for(ws.recv(), 10)
            return ws.close_code

    assert asyncio.run(removed_while_listening()) == 1000
    assert http.get("/v1/streams").json() == []
    assert not any(t.name == "reader-door" for t in threading.enumerate())


def test_frames_of_several_streams_share_batches(serve, tmp_path):
    video = write_video(tmp_path / "v.mp4", 20, fps=200)  # four 200 fps cameras
    detector = RedSquareDetector(max_batch=4, delay_s=0.03)
    specs = [StreamSpec(url=str(video), name=f"s{i}", loop=True) for i in range(4)]
    server = serve(detector=detector, streams=specs)
    http = server.client
    wait_for(lambda: len(detector.batch_sizes) >= 20, 20, "twenty batches")
    assert max(detector.batch_sizes) == 4  # never above the detector's limit, and streams do get merged
    dropped = metric_value(http, "dfine_serve_frames_dropped_total", stream="s0", reason="stale")
    assert dropped > 0  # 200 fps outruns a 30 ms detector: stale frames are counted


def test_every_frame_file_is_detected_completely_and_recorded(serve, tmp_path):
    video = write_video(tmp_path / "v.mp4", 30)
    out = tmp_path / "out"
    server = serve(
        streams=[StreamSpec(url=str(video), name="clip", every_frame=True, realtime=False)],
        record_dir=out,
        output_json=out / "detections.jsonl",
    )
    wait_for(lambda: server.pipeline.all_finished(), 20, "the file to end")
    wait_for(lambda: server.pipeline.get("clip").frames_processed == 30, 10, "30 processed frames")
    server.__exit__(None, None, None)  # graceful shutdown finishes the recording
    lines = [json.loads(line) for line in (out / "detections.jsonl").read_text().splitlines()]
    assert [r["frame_index"] for r in lines] == list(range(30))
    for result in lines:
        _assert_square(result)
    (segment,) = (out / "clip").glob("clip-*.mp4")  # 1.5 s of video: one segment
    assert int(cv2.VideoCapture(str(segment)).get(cv2.CAP_PROP_FRAME_COUNT)) == 30
    assert not list(out.rglob(".*partial*"))


class SlowSink:
    """A result sink that breaks the rule on purpose: each write takes 50 ms."""

    def __init__(self) -> None:
        self.seen: list[int] = []
        self.closed = 0

    def write(self, result: dict) -> None:
        time.sleep(0.05)
        self.seen.append(result["frame_index"])

    def close(self) -> None:
        self.closed += 1


def test_a_finished_file_has_reached_every_sink_and_the_sinks_close_once(serve, tmp_path):
    """`all_finished` (what the process-a-file-then-exit mode waits for) holds only once every result
    was handed to every sink: a slow sink makes a premature "finished" visible."""
    video = write_video(tmp_path / "v.mp4", 12)
    server = serve()
    sink = SlowSink()
    server.pipeline.add_sink(sink)
    server.pipeline.add_stream(StreamSpec(url=str(video), every_frame=True, realtime=False), trusted=True)
    wait_for(server.pipeline.all_finished, 20, "the file to end")
    assert sink.seen == list(range(12)), f"finished when the sink had frames {sink.seen}"
    assert sink.closed == 0
    server.pipeline.close()
    assert sink.closed == 1


def _png_bomb(width: int, height: int) -> bytes:
    """A valid PNG header claiming width x height grey pixels, with a tiny compressed body."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = zlib.compress(b"\x00" * (width + 1) * 64, 9)  # only 64 rows: decoding would fail late, never mind
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0))
        + chunk(b"IDAT", rows)
        + chunk(b"IEND", b"")
    )


def test_bad_inputs_get_clear_statuses_and_the_server_stays_healthy(serve, tmp_path):
    server = serve(api_key=KEY, max_streams=2, max_upload_mb=0.05, max_image_pixels=200_000)
    http = server.client
    base = server.base_url
    red = np.zeros((40, 50, 3), np.uint8)
    red[..., 2] = 255
    good = _png(red)

    def detect(data: bytes, content_type: str = "image/png", headers: dict = AUTH) -> httpx.Response:
        return http.post(
            "/v1/detect", content=data, headers={**headers, "Content-Type": content_type}, timeout=20
        )

    ok = detect(good).json()
    assert ok["width"] == 50 and ok["detections"][0]["box"] == [0, 0, 50, 40]
    multipart = http.post("/v1/detect", files={"file": ("r.png", good, "image/png")}, headers=AUTH)
    assert multipart.status_code == 200 and multipart.json() == ok

    jpeg = cv2.imencode(".jpg", red)[1].tobytes()
    corrupt = jpeg[:200] + bytes(range(256)) * 4  # a real JPEG header, then garbage
    assert detect(corrupt, "image/jpeg").status_code == 400
    assert detect(b"GIF89a....", "image/png").status_code == 400
    cut = detect(good[:40])  # a PNG cut short after its header: the reason once named a BytesIO's address
    assert cut.status_code == 400 and "Pillow cannot identify it" in cut.json()["detail"], cut.text
    assert detect(_png_bomb(60_000, 60_000)).status_code == 413  # 3.6 GP: refused from the header alone
    assert detect(_png(np.zeros((500, 500, 3), np.uint8))).status_code == 413  # 250 kP > 200 kP limit
    assert detect(good, "text/plain").status_code == 415
    assert detect(b"\x00" * 100_000, "image/png").status_code == 413  # body over 0.05 MB (Content-Length)

    def chunked():
        for _ in range(20):
            yield b"\x00" * 10_000

    assert (
        http.post("/v1/detect", content=chunked(), headers={**AUTH, "Content-Type": "image/png"}).status_code
        == 413
    )

    # keys: missing or wrong -> 401 everywhere but the health probes and the static pages; the right key
    # as ?api_key= is refused too except on the three routes browsers open without headers
    for path in ("/v1/streams", "/metrics", "/v1/streams/x/latest"):
        assert http.get(f"{path}").status_code == 401
        assert http.get(f"{path}", headers={"X-API-Key": "wrong"}).status_code == 401
        in_query = http.get(f"{path}?api_key={KEY}")
        assert in_query.status_code == 401 and "X-API-Key header" in in_query.json()["detail"]
    assert detect(good, headers={"X-API-Key": KEY + "x"}).status_code == 401
    assert (
        http.post(
            f"/v1/detect?api_key={KEY}", content=good, headers={"Content-Type": "image/png"}
        ).status_code
        == 401
    )
    assert http.get("/healthz").status_code == 200 and http.get("/readyz").status_code == 200
    assert http.get("/docs").status_code == 200 and http.get("/").status_code == 200
    assert "/v1/detect" in http.get("/openapi.json").json()["paths"]

    async def ws_without_key():
        with pytest.raises(websockets.InvalidStatus) as info:
            async with websockets.connect(f"{base.replace('http', 'ws')}/v1/streams/x/ws", open_timeout=10):
                pass
        return info.value.response.status_code

    assert asyncio.run(ws_without_key()) == 403

    def add(url: str, **extra) -> httpx.Response:
        return http.post("/v1/streams", json={"url": url, **extra}, headers=AUTH, timeout=20)

    huge = http.post(
        "/v1/streams",
        content=b'{"url": "' + b"a" * 100_000 + b'"}',
        headers={**AUTH, "Content-Type": "application/json"},
    )
    assert huge.status_code == 413
    assert add("file:///etc/passwd").status_code == 403
    assert add(str(tmp_path)).status_code == 403
    assert add("/dev/video0").status_code == 403
    assert add("ftp://127.0.0.1/v").status_code == 400
    assert add("rtsp://").status_code == 400
    stride = add("http://127.0.0.1:1/none", vid_stride=0)
    assert (
        stride.status_code == 400
        and "vid_stride must be a whole number from 1 to 10000" in stride.json()["detail"]
    )
    # one schema for the API and the stream list: unknown keys are refused, and so are trusted-only ones
    unknown = add("http://127.0.0.1:1/none", vid_strid=2)
    assert unknown.status_code == 422 and unknown.json()["detail"][0]["loc"][-1] == "vid_strid"
    assert add("http://127.0.0.1:1/none", loop=True).status_code == 422
    no_track = add("http://127.0.0.1:1/none", lines=[{"name": "l", "start": [0, 0], "end": [9, 9]}])
    assert no_track.status_code == 400 and "set track: true" in no_track.json()["detail"]
    unreachable = add("rtsp://127.0.0.1:1/none", wait_live_s=1.5)
    assert unreachable.status_code == 504 and "not added" in unreachable.json()["detail"]
    assert add("rtsp://127.0.0.1:1/a", name="a").status_code == 201  # accepted: cameras come and go
    assert add("rtsp://127.0.0.1:1/a", name="a").status_code == 409
    assert add("rtsp://127.0.0.1:1/b", name="b").status_code == 201
    too_many = add("rtsp://127.0.0.1:1/c", name="c")
    assert too_many.status_code == 429 and "limit 2" in too_many.json()["detail"]
    wait_for(
        lambda: http.get("/v1/streams/a", headers=AUTH).json()["state"] == "retrying", 10, "stream a to retry"
    )

    # still healthy and still detecting
    assert http.get("/readyz").json()["status"] == "ready"
    assert detect(good).json() == ok
    assert metric_value(http, "dfine_serve_detect_requests_total", AUTH, status="413") == 4


def test_full_upload_queue_answers_503_not_unbounded_memory(serve):
    server = serve(detector=RedSquareDetector(max_batch=1, delay_s=0.3), max_pending_uploads=1)
    http = server.client
    body = _png(np.zeros((20, 20, 3), np.uint8))

    async def burst() -> list[int]:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            replies = await asyncio.gather(
                *(
                    client.post("/v1/detect", content=body, headers={"Content-Type": "image/png"})
                    for _ in range(8)
                )
            )
        return sorted(r.status_code for r in replies)

    statuses = asyncio.run(burst())
    assert 200 in statuses and 503 in statuses and set(statuses) <= {200, 503}
    assert http.get("/healthz").status_code == 200


def test_shutdown_releases_every_stream_even_with_clients_listening(serve, tmp_path, mjpeg_camera):
    video = write_video(tmp_path / "v.mp4", 10)
    server = serve(
        streams=[StreamSpec(url=str(video), name="f", loop=True), StreamSpec(url=mjpeg_camera.url, name="m")]
    )
    wait_for(
        lambda: all(h.reader.state.value == "live" for h in server.pipeline.list()), 15, "both streams live"
    )
    readers = [h.reader for h in server.pipeline.list()]
    received: list[str] = []

    def listen() -> None:  # an SSE client that would wait forever
        try:
            with httpx.stream("GET", f"{server.base_url}/v1/streams/f/events", timeout=60) as response:
                received.extend(response.iter_lines())
        except httpx.HTTPError:
            pass

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    wait_for(lambda: len(received) > 0 or server.pipeline.get("f").json_subscribers, 10, "the SSE client")
    started = time.monotonic()
    server.__exit__(None, None, None)
    assert time.monotonic() - started < GRACE_S + 10
    listener.join(10)
    assert all(not r.alive and r.state.value == "stopped" for r in readers)
    assert not any(t.name.startswith(("reader-", "dfine-")) for t in threading.enumerate())


def test_openapi_documents_every_router(serve):
    server = serve()
    http = server.client
    schema = http.get("/openapi.json").json()
    for path in ("/healthz", "/readyz", "/v1/streams", "/v1/streams/{name}",
                 "/v1/streams/{name}/latest", "/v1/streams/{name}/events", "/v1/streams/{name}/mjpeg",
                 "/v1/detect", "/metrics"):  # fmt: skip
        assert path in schema["paths"], path
    assert {"StreamRequest", "StreamInfo", "DetectResponse", "StreamResult"} <= set(
        schema["components"]["schemas"]
    )


def test_a_stalled_camera_is_detected_by_read_timeout_and_recovers(serve, mjpeg_camera):
    server = serve()
    http = server.client
    reply = http.post(
        "/v1/streams",
        json={
            "url": mjpeg_camera.url,
            "name": "stall",
            "read_timeout_s": 1,
            "wait_live_s": 10,
            "track": True,
        },
    )
    assert reply.status_code == 201
    wait_for(
        lambda: http.get("/v1/streams/stall/latest").json()["detections"][0]["track_id"] is not None,
        10,
        "a track",
    )
    id_before = http.get("/v1/streams/stall/latest").json()["detections"][0]["track_id"]
    state = lambda: http.get("/v1/streams/stall").json()  # noqa: E731
    mjpeg_camera.paused.set()
    wait_for(lambda: state()["state"] == "retrying", 10, "the stall to be noticed")
    assert state()["last_error"].startswith("stalled: the connection stayed open but no frame came for 1 s")
    mjpeg_camera.paused.clear()
    wait_for(lambda: state()["state"] == "live", 20, "the camera to be live again")
    tracker = server.pipeline.get("stall").tracker
    wait_for(lambda: tracker.resets == 1, 10, "tracking to start afresh after the reconnect")
    new_id = lambda: http.get("/v1/streams/stall/latest").json()["detections"][0]["track_id"]  # noqa: E731
    wait_for(lambda: (new_id() or -1) > id_before, 10, "a new track id, never a reused one")
    assert state()["reconnects"] >= 1
    processed = state()["frames_processed"]
    wait_for(lambda: state()["frames_processed"] > processed, 10, "new results after the stall")


@pytest.mark.parametrize("frames_per_connection", [2, 4])
def test_a_camera_that_freezes_after_each_reconnect_reads_down_all_the_time(
    serve, mjpeg_camera, frames_per_connection
):
    """The alert of docs/serve.md (dfine_serve_stream_up == 0) fires for a camera that sends a frame or two
    after each reconnect and then freezes; a healthy camera beside it reads up."""
    frozen = MjpegCamera(frames_per_connection=frames_per_connection)
    try:
        timing = {"open_timeout_s": 2, "read_timeout_s": 0.5, "backoff_initial_s": 0.05, "backoff_max_s": 0.4}
        server = serve(
            streams=[
                StreamSpec(url=frozen.url, name="frozen", **timing),
                StreamSpec(url=mjpeg_camera.url, name="fine", **timing),
            ]
        )
        http = server.client
        up, states = [], []
        deadline = time.monotonic() + 4
        while time.monotonic() < deadline:
            up.append(metric_value(http, "dfine_serve_stream_up", stream="frozen"))
            states.append(http.get("/v1/streams/frozen").json()["state"])
            time.sleep(0.1)
        assert metric_value(http, "dfine_serve_reconnects_total", stream="frozen") >= 2
        assert frozen.connections >= 2 and server.pipeline.get("frozen").reader.frames_in >= 2
        assert set(up) == {0.0} and "live" not in states, (up, states)
        # the healthy camera's reads have a 0.5 s timeout too, which a loaded CI machine can miss once
        wait_for(lambda: metric_value(http, "dfine_serve_stream_up", stream="fine") == 1.0, 5, "fine up")
        late = http.post("/v1/streams", json={"url": frozen.url, "name": "late", "wait_live_s": 2})
        assert late.status_code == 504 and "was not live within 2.0 s" in late.json()["detail"]
    finally:
        frozen.close()


def test_progressive_http_video_every_frame(serve, http_files):
    folder, base_url = http_files
    write_video(folder / "clip.mp4", 24)
    server = serve()
    http = server.client
    reply = http.post(
        "/v1/streams",
        json={"url": f"{base_url}/clip.mp4", "name": "web", "every_frame": True, "wait_live_s": 10},
    )
    assert reply.status_code == 201 and reply.json()["kind"] == "http"
    # the subscription may start mid-file; the source is then reopened at its end and plays again,
    # its frame_index going on (24, 25, ...) so that stream and frame_index still name one frame
    results = _sse_results(http, "/v1/streams/web/events", 48)
    indices = [r["frame_index"] for r in results]
    assert indices == list(range(indices[0], indices[0] + 48))  # in order, none dropped
    assert any(index % 24 == 0 and index > 0 for index in indices)  # a replay, counted on
    for result in results:
        _assert_square({**result, "frame_index": result["frame_index"] % 24})  # the file's frame


def test_a_client_that_never_reads_loses_old_results_without_slowing_the_pipeline(tmp_path):
    from dfine_deploy.serve.pipeline import StreamPipeline
    from dfine_deploy.serve.settings import ServeSettings

    video = write_video(tmp_path / "v.mp4", 10)
    pipeline = StreamPipeline(RedSquareDetector(), ServeSettings(subscriber_queue=4))
    loop = asyncio.new_event_loop()
    loop_thread = threading.Thread(target=loop.run_forever, daemon=True)
    loop_thread.start()
    pipeline.start()
    try:
        pipeline.add_stream(StreamSpec(url=str(video), name="v", loop=True, realtime=False), trusted=True)
        stuck = pipeline.subscribe("v", loop)  # never read
        wait_for(lambda: pipeline.get("v").frames_processed >= 50, 20, "50 results")
        assert stuck.pending == 4
        assert (
            pipeline.metrics.registry.get_sample_value(
                "dfine_serve_subscriber_dropped_total", {"stream": "v"}
            )
            >= 40
        )
    finally:
        pipeline.close()
        loop.call_soon_threadsafe(loop.stop)
        loop_thread.join(5)
        loop.close()


def test_routes_take_the_pipeline_as_a_dependency_that_tests_can_override(tmp_path):
    from fastapi.testclient import TestClient

    from dfine_deploy.serve.app import create_app
    from dfine_deploy.serve.dependencies import get_pipeline
    from dfine_deploy.serve.pipeline import StreamPipeline
    from dfine_deploy.serve.settings import ServeSettings

    settings = ServeSettings()
    app = create_app(settings, detector=RedSquareDetector())
    client = TestClient(app, base_url="http://127.0.0.1")  # not entered: no lifespan, no pipeline of its own
    assert client.get("/v1/streams").status_code == 503
    pipeline = StreamPipeline(RedSquareDetector(), settings)
    pipeline.start()
    try:
        pipeline.add_stream(StreamSpec(url=str(write_video(tmp_path / "v.mp4", 5)), name="own"), trusted=True)
        app.dependency_overrides[get_pipeline] = lambda: pipeline
        assert [s["name"] for s in client.get("/v1/streams").json()] == ["own"]
    finally:
        pipeline.close()


def test_the_api_refuses_nan_infinity_and_zones_that_are_no_simple_polygon(tmp_path):
    """JSON's NaN and Infinity literals (Python's json reads them) in any number field answer 422 with
    the field named, and a zone whose edges cross 400 with the edges named (invalid counting settings,
    as documented); nothing reaches the pipeline."""
    from fastapi.testclient import TestClient

    from dfine_deploy.serve.app import create_app
    from dfine_deploy.serve.dependencies import get_pipeline
    from dfine_deploy.serve.settings import ServeSettings

    app = create_app(ServeSettings(), detector=RedSquareDetector())
    app.dependency_overrides[get_pipeline] = lambda: None  # a request that passes would fail on it
    client = TestClient(app, base_url="http://127.0.0.1")
    crossing = [[0, 0], [9, 0], [0, 9], [9, 9]]  # a bow tie
    cases = [
        ('{"url": "rtsp://cam/x", "zones": [{"name": "z", "polygon": [[0, 0], [9, 0], [NaN, 9]]}]}', 422),
        (
            '{"url": "rtsp://cam/x", "zones": [{"name": "z", "polygon": [[0, 0], [Infinity, 0], [9, 9]]}]}',
            422,
        ),
        ('{"url": "rtsp://cam/x", "wait_live_s": NaN}', 422),
        (json.dumps({"url": "rtsp://cam/x", "zones": [{"name": "z", "polygon": crossing}]}), 400),
    ]
    for (body, expected), named in zip(
        cases, ('"zones",0,"polygon",2,0', '"zones",0,"polygon",1,0', '"wait_live_s"', "cross")
    ):
        answer = client.post("/v1/streams", content=body, headers={"content-type": "application/json"})
        assert answer.status_code == expected, (body, answer.text)
        assert named in answer.text and ("finite" in answer.text or expected == 400), answer.text
    assert client.get("/v1/events?since=NaN").status_code == 422
