"""The message bus: events (and, when asked, every frame's detections) to MQTT and to Redis Streams.

    output thread ─put─► Outbox (bounded; full: the oldest goes, counted) ─► publisher thread ─► broker

Each publisher runs in its own thread with its own bounded outbox, so a slow or absent broker never
delays a frame. A message leaves the outbox only once the broker acknowledged it (MQTT: the PUBACK of
QoS 1; Redis: the XADD reply); on a lost connection the unacknowledged ones go back to the front, in
order, and the publisher reconnects with a growing, capped delay. Delivery is therefore at least once:
a broker that stored a message but died before acknowledging it gets it again, so consumers drop an
event id they have already seen (docs/serving-fleet.md gives the topics, keys and the schema).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import paho.mqtt.client as mqtt
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from dfine_deploy.serve.settings import MQTT_SCHEMES, REDIS_SCHEMES, broker_address
from dfine_deploy.serve.sources import redact

log = logging.getLogger("dfine_deploy.serve")

MQTT_INFLIGHT = 20  # QoS 1 messages sent and not yet acknowledged, at most (paho's own default)
REDIS_BATCH = 100  # XADDs per round trip
REDIS_IDLE_PING_S = 1.0  # an idle connection is checked this often
RECONNECT_INITIAL_S, RECONNECT_MAX_S = 0.1, 5.0
DROP_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True)
class Message:
    channel: str  # "events" or "detections"
    stream: str
    payload: dict[str, Any]  # never changed once published; turned into JSON in the publisher thread
    event_id: str | None = None

    @property
    def body(self) -> bytes:
        return json.dumps(self.payload).encode()


class Outbox:
    """A bounded FIFO between the output thread and one publisher thread, holding every message not yet
    acknowledged; when full, the oldest waiting message is dropped and `on_drop` told."""

    def __init__(self, capacity: int, on_drop: Callable[[], None]):
        self.capacity = capacity
        self._on_drop = on_drop
        self._pending: deque[Message] = deque()
        self._inflight: dict[int, Message] = {}  # token -> message, in the order they were taken
        self._tokens = itertools.count()
        self._lock = threading.Lock()
        self.ready = threading.Event()
        self.dropped = 0

    def put(self, message: Message) -> None:
        with self._lock:
            if len(self._pending) + len(self._inflight) >= self.capacity and self._pending:
                self._pending.popleft()
                self.dropped += 1
                self._on_drop()
            self._pending.append(message)
        self.ready.set()

    def take(self, limit: int) -> list[tuple[int, Message]]:
        """Up to `limit` waiting messages, now in flight until `done` or `requeue`."""
        with self._lock:
            taken = []
            while self._pending and len(taken) < limit:
                token = next(self._tokens)
                self._inflight[token] = message = self._pending.popleft()
                taken.append((token, message))
            if not self._pending:
                self.ready.clear()
            return taken

    def done(self, token: int) -> None:
        with self._lock:
            self._inflight.pop(token, None)

    def requeue(self) -> int:
        """Put every unacknowledged message back at the front, in its order (the connection was lost)."""
        with self._lock:
            back = list(self._inflight.values())
            self._inflight.clear()
            self._pending.extendleft(reversed(back))
            if self._pending:
                self.ready.set()
            return len(back)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending) + len(self._inflight)


class Disconnected(Exception):
    """The broker connection is gone; the publisher reconnects."""


class Publisher:
    """A publisher thread: connects, sends the outbox, reconnects; subclasses speak one protocol."""

    bus = ""  # the `bus` label of the metrics and logs

    def __init__(self, url: str, capacity: int, metrics: Any, detections: bool):
        self.url = url
        self.detections = detections  # publish every frame's result too
        self.metrics = metrics
        self.outbox = Outbox(capacity, self._dropped)
        self.connected = threading.Event()
        self._stop = threading.Event()
        self._last_drop_log = 0.0
        self._thread = threading.Thread(target=self._run, name=f"dfine-bus-{self.bus}", daemon=True)
        metrics.bus_buffered.labels(self.bus).set_function(lambda: float(len(self.outbox)))
        metrics.start_bus(self.bus, ("events", "detections") if detections else ("events",))

    # -- the output thread's side -----------------------------------------------------------------
    def offer_event(self, event: dict[str, Any]) -> None:
        self.outbox.put(Message("events", event["stream"], event, event["id"]))

    def write(self, result: dict[str, Any]) -> None:
        """The `ResultSink` side (dfine_deploy/serve/outputs.py): every frame's result, when asked."""
        if self.detections:
            self.outbox.put(Message("detections", result["stream"], result))

    def _dropped(self) -> None:
        self.metrics.bus_dropped.labels(self.bus).inc()
        now = time.monotonic()
        if now - self._last_drop_log >= DROP_LOG_INTERVAL_S or self.outbox.dropped == 1:
            self._last_drop_log = now
            log.warning(
                "bus %s: buffer full (%d messages, --bus-buffer), the oldest dropped; %d dropped so far",
                self.bus,
                self.outbox.capacity,
                self.outbox.dropped,
            )

    # -- life cycle -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def close(self, drain_s: float = 5.0) -> None:
        """Send what is buffered for up to `drain_s` seconds, then stop; what is left is counted lost."""
        deadline = time.monotonic() + drain_s
        while len(self.outbox) and self.connected.is_set() and time.monotonic() < deadline:
            time.sleep(0.02)
        self._stop.set()
        self.outbox.ready.set()
        self._thread.join(drain_s + 5)
        left = len(self.outbox)
        if left:
            self.metrics.bus_dropped.labels(self.bus).inc(left)
            log.warning(
                "bus %s: %d message(s) not delivered at shutdown (counted as dropped)", self.bus, left
            )

    def _run(self) -> None:
        delay = RECONNECT_INITIAL_S
        failures = 0
        while not self._stop.is_set():
            try:
                self._connect()
            except (OSError, Disconnected, redis.RedisError) as exc:
                failures += 1
                if failures == 1:
                    log.warning("bus %s: cannot reach %s (%s); retrying", self.bus, redact(self.url), exc)
                self._stop.wait(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)
                continue
            if failures:
                self.metrics.bus_reconnects.labels(self.bus).inc()
                log.info(
                    "bus %s: connected to %s after %d failed attempt(s)", self.bus, redact(self.url), failures
                )
            delay, failures = RECONNECT_INITIAL_S, 0
            self.connected.set()
            self.metrics.bus_connected.labels(self.bus).set(1)
            try:
                self._pump()
            except (OSError, Disconnected, redis.RedisError) as exc:
                failures = 1
                log.warning(
                    "bus %s: connection to %s lost (%s); reconnecting", self.bus, redact(self.url), exc
                )
            finally:
                self.connected.clear()
                self.metrics.bus_connected.labels(self.bus).set(0)
                self.outbox.requeue()
                self._disconnect()

    def _sent(self, token: int, message: Message) -> None:
        self.outbox.done(token)
        self.metrics.bus_published.labels(self.bus, message.channel).inc()

    def _connect(self) -> None:
        raise NotImplementedError

    def _pump(self) -> None:
        raise NotImplementedError

    def _disconnect(self) -> None:
        raise NotImplementedError


class MqttPublisher(Publisher):
    """MQTT 3.1.1, QoS 1, not retained. Topics (PREFIX defaults to dfine):
    PREFIX/events                  every event, from every stream
    PREFIX/<stream>/detections     every frame's result (with --bus-detections)
    """

    bus = "mqtt"

    def __init__(self, url: str, prefix: str, capacity: int, metrics: Any, detections: bool, client_id: str):
        self.host, self.port, self.username, self.password = broker_address(url, MQTT_SCHEMES, "--mqtt")
        self.prefix = prefix
        self.client_id = client_id
        self._client: mqtt.Client | None = None
        self._lost = threading.Event()
        self._acked: dict[int, tuple[int, Message]] = {}  # mid -> (outbox token, message)
        super().__init__(url, capacity, metrics, detections)

    def topic(self, message: Message) -> str:
        if message.channel == "events":
            return f"{self.prefix}/events"
        return f"{self.prefix}/{message.stream}/{message.channel}"

    def _connect(self) -> None:
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=self.client_id, clean_session=True)
        if self.username:
            client.username_pw_set(self.username, self.password)
        connack: list[Any] = []
        client.on_connect = lambda c, userdata, flags, reason, props: connack.append(reason)
        client.on_disconnect = lambda c, userdata, flags, reason, props: self._lost.set()
        client.on_publish = self._on_publish
        self._lost.clear()
        self._acked.clear()
        self._client = client
        client.connect(self.host, self.port, keepalive=15)
        deadline = time.monotonic() + 5
        while not connack and time.monotonic() < deadline and not self._lost.is_set():
            client.loop(0.05)
        if not connack or connack[0].is_failure:
            raise Disconnected(f"no CONNACK ({connack[0] if connack else 'timed out'})")

    def _on_publish(self, client, userdata, mid, reason, props) -> None:
        entry = self._acked.pop(mid, None)
        if entry is not None:
            self._sent(*entry)

    def _pump(self) -> None:
        client = self._client
        assert client is not None
        while not self._stop.is_set():
            room = MQTT_INFLIGHT - len(self._acked)
            for token, message in self.outbox.take(room) if room > 0 else []:
                info = client.publish(self.topic(message), message.body, qos=1)
                if info.rc != mqtt.MQTT_ERR_SUCCESS:
                    raise Disconnected(mqtt.error_string(info.rc))
                self._acked[info.mid] = (token, message)
            rc = client.loop(0.02 if self._acked or self.outbox.ready.is_set() else 0.1)
            if rc != mqtt.MQTT_ERR_SUCCESS or self._lost.is_set():
                raise Disconnected(mqtt.error_string(rc) if rc else "the broker closed the connection")

    def _disconnect(self) -> None:
        if self._client is not None:
            with contextlib.suppress(OSError):  # the connection is gone already
                self._client.disconnect()
            self._client = None


class RedisPublisher(Publisher):
    """Redis Streams: XADD to PREFIX:events (every event) and PREFIX:detections:<stream> (every frame's
    result, with --bus-detections), each trimmed to about `maxlen` entries (MAXLEN ~)."""

    bus = "redis"

    def __init__(self, url: str, prefix: str, maxlen: int, capacity: int, metrics: Any, detections: bool):
        broker_address(url, REDIS_SCHEMES, "--redis")
        self.prefix = prefix
        self.maxlen = maxlen
        self._client: redis.Redis | None = None
        super().__init__(url, capacity, metrics, detections)

    def key(self, message: Message) -> str:
        if message.channel == "events":
            return f"{self.prefix}:events"
        return f"{self.prefix}:{message.channel}:{message.stream}"

    def _connect(self) -> None:
        # no retries inside redis-py: a retried pipeline could add entries twice; the outbox retries
        self._client = redis.Redis.from_url(
            self.url, socket_timeout=5, socket_connect_timeout=2, retry=Retry(NoBackoff(), 0)
        )
        self._client.ping()

    def _pump(self) -> None:
        client = self._client
        assert client is not None
        last_reply = time.monotonic()
        while not self._stop.is_set():
            batch = self.outbox.take(REDIS_BATCH)
            if not batch:
                if time.monotonic() - last_reply >= REDIS_IDLE_PING_S:  # so `connected` tells the truth
                    client.ping()
                    last_reply = time.monotonic()
                self.outbox.ready.wait(0.1)
                continue
            pipe = client.pipeline(transaction=False)
            for _, message in batch:
                fields = {"stream": message.stream, "json": message.body}
                if message.event_id:
                    fields["id"] = message.event_id
                pipe.xadd(self.key(message), fields, maxlen=self.maxlen, approximate=True)
            pipe.execute()
            last_reply = time.monotonic()
            for token, message in batch:
                self._sent(token, message)

    def _disconnect(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
