"""Every labelled counter has its series at 0 as soon as its labels are known, so Prometheus's
`increase()` sees the first event (a series born at 1 shows no increase); scraped before anything
happened, on a server with every kind of counter in use."""

from __future__ import annotations

from conftest import free_port, metric_value, wait_for

from dfine_deploy.serve.metrics import OPEN_LABELS, ServeMetrics
from dfine_deploy.serve.settings import StreamSpec


def _series(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            found.setdefault(name, []).append(line)
    return found


def test_every_labelled_counter_reads_0_before_its_first_event(serve, mjpeg_camera, tmp_path):
    mjpeg_camera.paused.set()  # connected, no frame yet: nothing has happened
    closed = free_port()  # no broker there: the buses keep retrying, nothing is published or dropped
    server = serve(
        events_dir=tmp_path / "events",
        record_dir=tmp_path / "rec",
        mqtt_url=f"mqtt://127.0.0.1:{closed}",
        redis_url=f"redis://127.0.0.1:{closed}",
        bus_detections=True,
    )
    line = {"name": "door", "start": [80, 0], "end": [80, 120]}
    zone = {"name": "dock", "polygon": [[0, 0], [80, 0], [80, 120], [0, 120]]}
    server.pipeline.add_stream(
        StreamSpec(url=mjpeg_camera.url, name="gate", track=True, lines=[line], zones=[zone]), trusted=True
    )
    gone = f"http://127.0.0.1:{free_port()}/video"  # fails at once and retries
    server.pipeline.add_stream(StreamSpec(url=gone, name="away", backoff_initial_s=0.1), trusted=True)
    http = server.client
    series = _series(http.get("/metrics").text)

    expected = {
        ("dfine_serve_reconnects_total", ("stream", "gate")),
        ("dfine_serve_subscriber_dropped_total", ("stream", "gate")),
        ("dfine_serve_subscriber_dropped_total", ("stream", "(events)")),
        ("dfine_serve_frames_dropped_total", ("stream", "gate"), ("reason", "stale")),
        ("dfine_serve_events_total", ("stream", "gate"), ("kind", "line_cross")),
        ("dfine_serve_events_total", ("stream", "gate"), ("kind", "zone_enter")),
        ("dfine_serve_events_total", ("stream", "gate"), ("kind", "zone_leave")),
        ("dfine_serve_events_deleted_total", ("reason", "age")),
        ("dfine_serve_events_deleted_total", ("reason", "size")),
        ("dfine_serve_recording_deleted_segments_total", ("reason", "size")),
        ("dfine_serve_recording_segments_total", ("stream", "gate")),
        ("dfine_serve_bus_dropped_total", ("bus", "mqtt")),
        ("dfine_serve_bus_dropped_total", ("bus", "redis")),
        ("dfine_serve_bus_reconnects_total", ("bus", "redis")),
        ("dfine_serve_bus_published_total", ("bus", "mqtt"), ("channel", "events")),
        ("dfine_serve_bus_published_total", ("bus", "redis"), ("channel", "detections")),
        ("dfine_serve_detect_requests_total", ("status", "200")),
        ("dfine_serve_detect_requests_total", ("status", "503")),
    }
    for name, *labels in expected:
        assert metric_value(http, name, **dict(labels)) == 0.0  # 0.0 is also "absent": check presence
        assert any(all(f'{k}="{v}"' in s for k, v in labels) for s in series.get(name, [])), (name, labels)

    # the class, not these examples: every labelled counter of the server has a series by now
    labelled = [  # a fresh registry has samples only for the counters without labels
        f.name for f in ServeMetrics().registry.collect() if f.type == "counter" and not f.samples
    ]
    missing = [name for name in labelled if name + "_total" not in series and name not in OPEN_LABELS]
    assert missing == [], f"labelled counters without a series before their first event: {missing}"

    wait_for(lambda: metric_value(http, "dfine_serve_reconnects_total", stream="away") >= 1, 10, "a retry")
    # the series went 0 -> 1: increase() over the two scrapes sees it
