"""The message bus against real brokers (mosquitto, redis-server, started here): every event arrives
exactly once across a broker restart within the buffer, beyond the buffer the oldest are dropped and
counted, and a served video's events and detections reach both buses."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import time
from collections import Counter
from pathlib import Path

import pytest
from brokers import MqttInbox, _require, mosquitto, redis_server  # noqa: F401  (fixtures)
from conftest import metric_value, wait_for
from test_events import _event, _spec
from test_tracking import FRAMES, _write_paths_video

from dfine_deploy.serve.bus import MqttPublisher, RedisPublisher
from dfine_deploy.serve.metrics import ServeMetrics


def _events(n: int, start: float) -> list[dict]:
    return [_event("cam", start + i / 1000) for i in range(n)]


def _mqtt(broker, metrics, capacity=1000) -> MqttPublisher:
    return MqttPublisher(broker.url, "dfine", capacity, metrics, detections=False, client_id="test-publisher")


def _redis_ids(broker, key: str = "dfine:events") -> list[str]:
    import redis

    client = redis.Redis.from_url(broker.url)
    try:
        return [fields[b"id"].decode() for _, fields in client.xrange(key)]
    finally:
        client.close()


def _value(metrics: ServeMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def _across_a_restart(broker, publisher, received) -> list[str]:
    """Events before, during and after a broker restart; returns every id offered, in order."""
    before, during, after = _events(40, 1.7e9), _events(40, 1.7e9 + 1), _events(40, 1.7e9 + 2)
    for event in before:
        publisher.offer_event(event)
    wait_for(lambda: len(received()) >= 40, 10, "the events sent before the restart")
    # the normal case: the restart comes between messages, not while one is on its way (a message the
    # broker took but could not acknowledge before it went is sent again: a duplicate, by design)
    wait_for(lambda: len(publisher.outbox) == 0, 5, "the broker's acknowledgements")
    time.sleep(0.5)  # and the subscriber's acknowledgements reach the broker (else it redelivers them)
    broker.stop()
    wait_for(lambda: not publisher.connected.is_set(), 10, "the publisher to see the broker go")
    for event in during:
        publisher.offer_event(event)
    assert len(publisher.outbox) == 40  # held, waiting for the broker
    broker.start()
    for event in after:
        publisher.offer_event(event)
    wait_for(lambda: len(received()) >= 120, 15, "every event after the restart")
    return [e["id"] for e in before + during + after]


def test_mqtt_events_arrive_exactly_once_across_a_broker_restart(mosquitto):  # noqa: F811
    inbox = MqttInbox(mosquitto, ["dfine/events"])
    metrics = ServeMetrics()
    publisher = _mqtt(mosquitto, metrics)
    publisher.start()
    try:
        sent = _across_a_restart(mosquitto, publisher, lambda: inbox.messages)
        wait_for(lambda: len(publisher.outbox) == 0, 5, "every acknowledgement")
    finally:
        publisher.close()
        inbox.close()
    got = [payload["id"] for topic, payload in inbox.messages]
    assert {topic for topic, _ in inbox.messages} == {"dfine/events"}
    duplicates = sum(n - 1 for n in Counter(got).values())
    redelivered = sum(inbox.redelivered)  # the broker's own resends to the subscriber (DUP flag)
    assert set(got) == set(sent), "lost events"
    assert duplicates == 0, f"{duplicates} duplicates, {redelivered} of them redelivered by the broker"
    assert got == sent  # in order, too
    assert _value(metrics, "dfine_serve_bus_dropped_total", bus="mqtt") == 0
    assert _value(metrics, "dfine_serve_bus_reconnects_total", bus="mqtt") >= 1
    assert _value(metrics, "dfine_serve_bus_published_total", bus="mqtt", channel="events") == 120


def test_redis_events_arrive_exactly_once_across_a_server_restart(redis_server):  # noqa: F811
    metrics = ServeMetrics()
    publisher = RedisPublisher(redis_server.url, "dfine", 1000, 1000, metrics, detections=False)
    publisher.start()
    try:
        sent = _across_a_restart(redis_server, publisher, lambda: _redis_ids(redis_server))
    finally:
        publisher.close()
    got = _redis_ids(redis_server)
    assert got == sent and len(set(got)) == len(got)
    assert _value(metrics, "dfine_serve_bus_dropped_total", bus="redis") == 0
    assert _value(metrics, "dfine_serve_bus_reconnects_total", bus="redis") >= 1


def test_beyond_the_buffer_the_oldest_are_dropped_counted_and_logged(mosquitto, caplog):  # noqa: F811
    inbox = MqttInbox(mosquitto, ["dfine/events"])
    mosquitto.stop()  # the publisher starts while the broker is away
    metrics = ServeMetrics()
    publisher = _mqtt(mosquitto, metrics, capacity=100)
    publisher.start()
    events = _events(130, 1.7e9)
    with caplog.at_level(logging.WARNING, logger="dfine_deploy.serve"):
        for event in events:
            publisher.offer_event(event)
    assert _value(metrics, "dfine_serve_bus_dropped_total", bus="mqtt") == 30
    assert "buffer full (100 messages, --bus-buffer), the oldest dropped" in caplog.text
    mosquitto.start()
    try:
        wait_for(lambda: len(inbox.messages) >= 100, 15, "the buffered events")
        wait_for(lambda: len(publisher.outbox) == 0, 5, "every acknowledgement")
    finally:
        publisher.close()
        inbox.close()
    assert [p["id"] for _, p in inbox.messages] == [e["id"] for e in events[30:]]  # the newest 100


def test_a_served_videos_events_and_detections_reach_both_buses(serve, tmp_path, mosquitto, redis_server):  # noqa: F811
    inbox = MqttInbox(mosquitto, ["dfine/events", "dfine/+/detections"])
    video = tmp_path / "paths.mp4"
    _write_paths_video(video)
    server = serve(
        events_dir=tmp_path / "events",
        mqtt_url=mosquitto.url,
        redis_url=redis_server.url,
        bus_detections=True,
        streams=[_spec(video)],
    )
    wait_for(server.pipeline.all_finished, 30, "the video to end")
    stored = server.client.get("/v1/events", params={"limit": 1000}).json()
    assert len(stored) == 10  # 4 crossings, 4 entries, 2 exits (test_events)
    wait_for(lambda: len(inbox.messages) >= len(stored) + FRAMES, 10, "every message over MQTT")
    events = [p for topic, p in inbox.messages if topic == "dfine/events"]
    assert sorted(e["id"] for e in events) == sorted(e["id"] for e in stored)
    assert {json.dumps(e, sort_keys=True) for e in events} == {json.dumps(e, sort_keys=True) for e in stored}
    frames = [p["frame_index"] for topic, p in inbox.messages if topic == "dfine/yard/detections"]
    assert frames == list(range(FRAMES))
    wait_for(lambda: len(_redis_ids(redis_server)) == len(stored), 10, "every event in Redis")
    assert sorted(_redis_ids(redis_server)) == sorted(e["id"] for e in stored)
    import redis

    client = redis.Redis.from_url(redis_server.url)
    entries = client.xrange("dfine:detections:yard")
    client.close()
    assert [json.loads(f[b"json"])["frame_index"] for _, f in entries] == list(range(FRAMES))
    for bus in ("mqtt", "redis"):
        assert metric_value(server.client, "dfine_serve_bus_connected", bus=bus) == 1
        assert metric_value(server.client, "dfine_serve_bus_dropped_total", bus=bus) == 0
    inbox.close()


@pytest.mark.parametrize(
    "field, value, error",
    [
        ("mqtt_url", "tcp://broker:1883", "--mqtt 'tcp://broker:1883': give mqtt://"),
        ("mqtt_url", "mqtt://:1883", "--mqtt"),
        ("redis_url", "redis://u:secret@h:99999", "--redis 'redis://u:\\*\\*\\*@h"),
        ("mqtt_prefix", "a/b", "--mqtt-prefix 'a/b'"),
        ("bus_buffer", 10, "bus_buffer"),
    ],
)
def test_bad_bus_settings_are_refused_in_one_line(field, value, error):
    from dfine_deploy.errors import ServeError
    from dfine_deploy.serve.settings import ServeSettings

    with pytest.raises(ServeError, match=error) as info:
        ServeSettings(**{field: value})
    assert "\n" not in str(info.value) and "secret" not in str(info.value)


def test_an_absent_broker_holds_no_frame_back_and_what_it_missed_is_counted(serve, tmp_path, caplog):
    from conftest import free_port

    video = tmp_path / "paths.mp4"
    _write_paths_video(video)
    server = serve(mqtt_url=f"mqtt://127.0.0.1:{free_port()}", bus_detections=True, streams=[_spec(video)])
    wait_for(server.pipeline.all_finished, 30, "the video to end with no broker there")
    http = server.client
    assert metric_value(http, "dfine_serve_frames_processed_total", stream="yard") == FRAMES
    assert metric_value(http, "dfine_serve_bus_connected", bus="mqtt") == 0
    assert (
        metric_value(http, "dfine_serve_bus_buffered", bus="mqtt") == FRAMES + 10
    )  # results and events, held
    metrics = server.app.state.metrics
    with caplog.at_level(logging.WARNING, logger="dfine_deploy.serve"):
        server.__exit__(None, None, None)  # shutdown: what was never delivered is counted and logged
    assert _value(metrics, "dfine_serve_bus_dropped_total", bus="mqtt") == FRAMES + 10
    assert f"bus mqtt: {FRAMES + 10} message(s) not delivered at shutdown" in caplog.text


DOCS = Path(__file__).parents[2] / "docs" / "serving-fleet.md"


def _documented_event() -> dict:
    """The event object docs/serving-fleet.md shows every channel's consumer (its first JSON block)."""
    return json.loads(DOCS.read_text().split("```json\n", 1)[1].split("```", 1)[0])


def _mosquitto_sub(broker, *options: str, timeout_s: int) -> subprocess.CompletedProcess:
    """Eclipse's own command-line consumer, as a separate process: `%q %r %t %p` prints each message's
    QoS as delivered, its retained flag, topic and payload on one line."""
    command = [shutil.which("mosquitto_sub") or "mosquitto_sub", "-h", "127.0.0.1", "-p", str(broker.port),
               "-t", "dfine/events", "-W", str(timeout_s), "-F", "%q %r %t %p", *options]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout_s + 10)


def _publish_all(publisher, events: list[dict]) -> None:
    """Start `publisher`, offer it `events`, wait until the broker has taken every one, close it."""
    publisher.start()
    try:
        for event in events:
            publisher.offer_event(event)
        wait_for(lambda: len(publisher.outbox) == 0, 5, "every event to reach the broker")
    finally:
        publisher.close()


def test_mosquitto_sub_reads_what_the_docs_promise_across_a_broker_restart(mosquitto):  # noqa: F811
    """The docs' recipe for a consumer that must not miss events (persistent session: fixed client id,
    clean session off, QoS 1, broker persistence on): it subscribes and goes away, the events are
    published, the broker restarts, and on its return the consumer gets each event once, at QoS 1, not
    retained, with the documented fields; a new subscriber gets nothing (no retained message)."""
    _require("mosquitto_sub")
    session = ("-c", "-i", "dfine-consumer", "-q", "1")
    subscribed = _mosquitto_sub(mosquitto, *session, "-E", timeout_s=10)
    assert subscribed.returncode == 0, subscribed.stderr
    events = _events(5, 1.7e9)
    metrics = ServeMetrics()
    publisher = _mqtt(mosquitto, metrics)
    _publish_all(publisher, events)
    mosquitto.stop()
    mosquitto.start()
    back = _mosquitto_sub(mosquitto, *session, "-C", str(len(events)), timeout_s=10)
    assert back.returncode == 0, (
        f"the consumer got {back.stdout.count(chr(10))} of {len(events)}: {back.stderr}"
    )
    rows = [line.split(" ", 3) for line in back.stdout.splitlines()]
    assert [(qos, retained, topic) for qos, retained, topic, _ in rows] == [("1", "0", "dfine/events")] * 5
    payloads = [json.loads(payload) for *_, payload in rows]
    assert payloads == events  # each once, in order, as published
    assert all(set(p) == set(_documented_event()) for p in payloads), "fields differ from the docs' event"
    late = _mosquitto_sub(mosquitto, "-q", "1", "-C", "1", timeout_s=2)
    assert late.stdout == "" and late.returncode == 27  # -W ran out: nothing retained for a newcomer


def test_redis_cli_reads_what_the_docs_promise(redis_server):  # noqa: F811
    """redis-cli, as a separate process, reads PREFIX:events: fields `id`, `stream`, `json` (the event,
    with the documented fields), one entry per event, in order."""
    _require("redis-cli")
    events = _events(5, 1.7e9)
    publisher = RedisPublisher(redis_server.url, "dfine", 1000, 1000, ServeMetrics(), detections=False)
    _publish_all(publisher, events)
    command = [shutil.which("redis-cli") or "redis-cli", "-h", "127.0.0.1", "-p", str(redis_server.port),
               "--json", "XRANGE", "dfine:events", "-", "+"]  # fmt: skip
    read = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True)
    entries = [dict(zip(flat[::2], flat[1::2])) for _, flat in json.loads(read.stdout)]
    assert [set(fields) for fields in entries] == [{"id", "stream", "json"}] * 5
    assert [json.loads(f["json"]) for f in entries] == events
    assert [(f["id"], f["stream"]) for f in entries] == [(e["id"], e["stream"]) for e in events]
    assert set(json.loads(entries[0]["json"])) == set(_documented_event())
