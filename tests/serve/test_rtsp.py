"""A real RTSP camera (GStreamer's RTSP server in a subprocess) that dies and comes back, or stalls."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
import websockets
from conftest import metric_value, wait_for

from dfine_deploy.serve.settings import StreamSpec
from dfine_deploy.serve.sources import StreamReader, classify_source


def _state(http: httpx.Client, name: str) -> str:
    return http.get(f"/v1/streams/{name}").json()["state"]


def test_rtsp_stream_survives_its_server_restarting(serve, rtsp_server):
    server = serve()
    http = server.client
    base = server.base_url
    reply = http.post(
        "/v1/streams",
        json={"url": rtsp_server.url, "name": "gate", "read_timeout_s": 2, "wait_live_s": 20},
        timeout=30,
    )
    assert reply.status_code == 201, reply.text
    assert reply.json()["kind"] == "rtsp" and reply.json()["state"] == "live"

    async def results(count: int) -> list[dict]:
        async with websockets.connect(
            f"{base.replace('http', 'ws')}/v1/streams/gate/ws", open_timeout=10
        ) as ws:
            return [json.loads(await asyncio.wait_for(ws.recv(), 10)) for _ in range(count)]

    first = asyncio.run(results(3))
    for result in first:
        (det,) = result["detections"]  # the red square survived JPEG -> RTP -> FFmpeg
        assert det["name"] == "red-square" and result["width"] == 160

    rtsp_server.stop()
    wait_for(
        lambda: _state(http, "gate") in ("retrying", "connecting"), 15, "the stream to notice its server died"
    )
    assert metric_value(http, "dfine_serve_stream_up", stream="gate") == 0
    rtsp_server.start()
    wait_for(lambda: _state(http, "gate") == "live", 40, "the stream to come back live")
    assert metric_value(http, "dfine_serve_reconnects_total", stream="gate") >= 1
    assert metric_value(http, "dfine_serve_stream_up", stream="gate") == 1
    after = asyncio.run(results(2))
    assert after[-1]["timestamp"] > first[-1]["timestamp"]


def test_a_missing_system_part_fails_in_ci_and_skips_with_its_reason_elsewhere(monkeypatch):
    from conftest import require_system_part

    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="no RTSP server.*install-system-deps"):
        require_system_part("no RTSP server")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception, match="no RTSP server"):
        require_system_part("no RTSP server")
    require_system_part(None)  # present: nothing happens


@pytest.mark.parametrize("frames", [1, 3])
def test_an_rtsp_camera_that_stalls_with_its_session_open_is_called_stalled_and_reconnected(
    rtsp_server, frames
):
    """GStreamer's RTSP server gives each client `frames` frames and then nothing, its session open (a
    hung encoder): the read runs into read_timeout_s, the reason says "stalled" (not "ended", not "a
    snapshot URL"), and the reader reconnects and gets the frames again. With one frame FFmpeg's
    open, which probes for more, waits out open_timeout_s first (hence 2 s here, not 10)."""
    rtsp_server.stop()
    rtsp_server.start(stall_after=frames)
    url = rtsp_server.url
    spec = StreamSpec(
        url=url, name="cam", read_timeout_s=2, open_timeout_s=2, backoff_initial_s=0.05, backoff_max_s=0.3
    )
    reader = StreamReader("cam", spec, *classify_source(url, trusted=True, allow_devices=True))
    reader.start()
    try:
        wait_for(lambda: reader.reconnects >= 2, 30, "two reconnects")
        expected = f"stalled: the connection stayed open but no frame came for 2 s after {frames} frame(s)"
        assert (reader.last_error or "").startswith(expected), reader.last_error
        assert reader.frames_read >= 2 * frames  # each connection got its frames
    finally:
        reader.stop()
