"""Three real `dfine-serve --shard i/3` workers on loopback share one stream list: every stream is
served by exactly one of them, and the bus receives every stream's detections and events."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections import Counter

import cv2
import numpy as np
import pytest
import yaml
from brokers import MqttInbox, mosquitto  # noqa: F401  (fixture)
from conftest import wait_for
from tiny_model import red_score_model

FRAMES = 10
WORKERS = 3


def _red_video(path) -> None:
    """Red frames: the tiny model scores them ~0.9, so its one full-frame box is tracked from frame 2."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    for _ in range(FRAMES):
        writer.write(np.full((48, 64, 3), (20, 20, 230), np.uint8))
    writer.release()


def _names() -> list[str]:
    """Stream names with at least two per worker, chosen by the hash the docs give (independent of code)."""
    names, per_worker = [], Counter()
    for i in range(100):
        name = f"cam-{i}"
        worker = int.from_bytes(hashlib.sha1(name.encode()).digest()[:8], "big") % WORKERS
        if per_worker[worker] < 2:
            names.append(name)
            per_worker[worker] += 1
        if len(names) == 2 * WORKERS:
            return names
    raise AssertionError("unreachable for these names")


@pytest.mark.slow
def test_three_workers_serve_every_stream_exactly_once_and_all_reach_the_bus(tmp_path, mosquitto):  # noqa: F811
    model = red_score_model(tmp_path / "red.onnx")
    names = _names()
    zone = {"name": "all", "polygon": [[0, 0], [1000, 0], [1000, 1000], [0, 1000]]}
    entries = []
    for name in names:
        _red_video(tmp_path / f"{name}.mp4")
        entries.append({"url": str(tmp_path / f"{name}.mp4"), "name": name, "realtime": False,
                        "every_frame": True, "track": True, "zones": [zone]})  # fmt: skip
    streams = tmp_path / "streams.yaml"
    streams.write_text(yaml.safe_dump({"streams": entries}))
    inbox = MqttInbox(mosquitto, ["dfine/events", "dfine/+/detections"])
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "dfine_deploy.serve.cli",
                str(model),
                "--backend",
                "onnxruntime",
                "--threads",
                "1",
                "--port",
                "0",
                "--streams",
                str(streams),
                "--shard",
                f"{i}/{WORKERS}",
                "--mqtt",
                mosquitto.url,
                "--bus-detections",
                "--output-json",
                str(tmp_path / f"worker-{i}.jsonl"),
                "--duration",
                "60",
                "--log-level",
                "info",
            ],  # fmt: skip
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(WORKERS)
    ]
    logs = [w.communicate(timeout=90)[0] for w in workers]
    inbox_count = len(names) * (FRAMES + 1)  # every frame's detections and one zone entry per stream
    try:
        wait_for(lambda: len(inbox.messages) >= inbox_count, 10, "every stream's messages on the bus")
    finally:
        inbox.close()
    for i, (worker, log) in enumerate(zip(workers, logs, strict=True)):
        assert worker.returncode == 0, f"worker {i}: {log[-2000:]}"

    served = {}
    for i in range(WORKERS):
        results = [json.loads(line) for line in (tmp_path / f"worker-{i}.jsonl").read_text().splitlines()]
        for stream, frames in Counter(r["stream"] for r in results).items():
            assert stream not in served, f"{stream} served by workers {served[stream]} and {i}"
            assert frames == FRAMES
            served[stream] = i
        assert f"shard {i}/{WORKERS}: serving 2 of {len(names)} stream(s)" in logs[i]
    assert sorted(served) == sorted(names)  # every stream once
    assert Counter(served.values()) == dict.fromkeys(range(WORKERS), 2)

    detections = Counter(
        (p["stream"], p["frame_index"]) for t, p in inbox.messages if t.endswith("/detections")
    )
    assert detections == Counter({(name, f): 1 for name in names for f in range(FRAMES)})
    events = [p for t, p in inbox.messages if t == "dfine/events"]
    assert sorted(e["stream"] for e in events) == sorted(names)
    assert all(e["kind"] == "zone_enter" and e["zone"] == "all" for e in events)


@pytest.mark.parametrize("value", ["-1/2"])  # the other forms: in-process, below
def test_a_bad_shard_is_refused_in_one_line_before_anything_starts(tmp_path, value):
    run = subprocess.run(
        [sys.executable, "-m", "dfine_deploy.serve.cli", str(tmp_path / "none.onnx"), f"--shard={value}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and len(run.stderr.strip().splitlines()) == 1, run.stderr
    assert "--shard" in run.stderr and "0 <= INDEX < COUNT" in run.stderr


def test_sharding_needs_every_stream_named(tmp_path):
    from dfine_deploy.errors import ServeError
    from dfine_deploy.serve.settings import StreamSpec
    from dfine_deploy.serve.shard import shard_streams

    specs = [StreamSpec(url="rtsp://cam/a", name="a"), StreamSpec(url="rtsp://cam/b")]
    with pytest.raises(ServeError, match="stream 1 of the list has no name"):
        shard_streams(specs, (0, 2))
    assert shard_streams(specs, (0, 1)) == specs  # one worker: everything, names or not


@pytest.mark.parametrize("value", ["x", "3/3", "-1/2", "1/0", "1-3", "1/3/5", ""])
def test_bad_shard_forms_are_refused_in_one_line(value):
    from dfine_deploy.errors import ServeError
    from dfine_deploy.serve.shard import parse_shard

    with pytest.raises(ServeError, match=r"^--shard .*: give INDEX/COUNT with 0 <= INDEX < COUNT") as info:
        parse_shard(value)
    assert "\n" not in str(info.value)
