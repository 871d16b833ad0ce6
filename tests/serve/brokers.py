"""Real message brokers for the bus tests, started from the system packages on loopback: mosquitto
(MQTT, with persistence so a subscriber's session and its queued messages survive a restart) and
redis-server (append-only file, so a restart keeps the streams). start()/stop() can repeat."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import free_port, require_system_part


def _wait_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"{what} exited with {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}"
            )
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on port {port} within {timeout} s")


class Broker:
    name = ""

    def __init__(self, folder: Path):
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        _wait_port(self.port, self.proc, self.name)

    def stop(self) -> None:
        """A clean stop (SIGTERM): what a broker restart by its service manager does."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(10)
        self.proc = None


class Mosquitto(Broker):
    name = "mosquitto"

    def command(self) -> list[str]:
        conf = self.folder / "mosquitto.conf"
        lines = [f"listener {self.port} 127.0.0.1", "allow_anonymous true", "persistence true",
                 f"persistence_location {self.folder}/", f"log_dest file {self.folder}/log"]  # fmt: skip
        if os.geteuid() == 0:  # as root mosquitto switches to its own user, which cannot write here
            lines.append(f"user {pwd.getpwuid(0).pw_name}")
        conf.write_text("\n".join(lines) + "\n")
        return [shutil.which("mosquitto") or "mosquitto", "-c", str(conf)]

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"


class RedisServer(Broker):
    name = "redis-server"

    def command(self) -> list[str]:
        program = shutil.which("redis-server") or "redis-server"
        return [program, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder),
                "--appendonly", "yes", "--save", "", "--daemonize", "no"]  # fmt: skip

    def start(self) -> None:
        """Started once it answers PING: it opens its port while still loading its append-only file."""
        import redis

        super().start()
        client = redis.Redis(port=self.port, socket_timeout=2)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.BusyLoadingError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.02)
        finally:
            client.close()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def _require(program: str) -> None:
    missing = (
        None if shutil.which(program) else f"{program} is not installed (scripts/install-system-deps.sh)"
    )
    require_system_part(missing)


@pytest.fixture
def mosquitto(tmp_path):
    _require("mosquitto")
    broker = Mosquitto(tmp_path / "mosquitto")
    broker.start()
    yield broker
    broker.stop()


@pytest.fixture
def redis_server(tmp_path):
    _require("redis-server")
    broker = RedisServer(tmp_path / "redis")
    broker.start()
    yield broker
    broker.stop()


class MqttInbox:
    """A subscriber with a persistent session (clean_session false, QoS 1): what a consumer that must not
    miss events across a broker restart uses. Collects (topic, payload JSON) in arrival order."""

    def __init__(self, broker: Mosquitto, topics: list[str], client_id: str = "test-inbox"):
        import json
        import threading

        import paho.mqtt.client as mqtt

        self.messages: list[tuple[str, dict]] = []
        self.subscribed = threading.Event()
        client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=False)
        client.reconnect_delay_set(0.05, 0.2)

        def on_connect(c, userdata, flags, reason, props) -> None:
            c.subscribe([(topic, 1) for topic in topics])

        client.on_connect = on_connect
        client.on_subscribe = lambda *args: self.subscribed.set()
        self.redelivered: list[bool] = []  # per message: the broker's DUP flag

        def on_message(c, userdata, message) -> None:
            self.messages.append((message.topic, json.loads(message.payload)))
            self.redelivered.append(bool(message.dup))

        client.on_message = on_message
        client.connect("127.0.0.1", broker.port, keepalive=5)
        client.loop_start()
        self.client = client
        if not self.subscribed.wait(10):
            raise RuntimeError("the MQTT test subscriber did not subscribe within 10 s")

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()
