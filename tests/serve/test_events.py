"""Events: objects on known paths cross a line and enter and leave a zone; each happening is one event
with a snapshot of the object, a clip reference into the recording, listed and filtered over REST,
pushed over SSE as it happens, and kept within the retention limits (only our files deleted)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest
from conftest import metric_value, wait_for
from test_tracking import FRAMES, LINE, ZONE, _write_paths_video

from dfine_deploy.serve.events import EventStore, make_event
from dfine_deploy.serve.settings import EventPolicy, StreamSpec

# the paths of test_tracking: a and b (red) and c (blue) each cross the middle line; c crosses twice
EXPECTED_CROSSINGS = {("in", "red-square"): 1, ("out", "red-square"): 1, ("in", "blue-square"): 1,
                      ("out", "blue-square"): 1}  # fmt: skip


def _spec(video) -> StreamSpec:
    return StreamSpec(
        url=str(video), name="yard", every_frame=True, realtime=False, track=True, lines=[LINE], zones=[ZONE]
    )


def _sse_events(base_url: str, found: list, stop: threading.Event) -> None:
    with (
        httpx.Client(base_url=base_url, timeout=30) as client,
        client.stream("GET", "/v1/events/live") as reply,
    ):
        for line in reply.iter_lines():
            if line.startswith("data: "):
                found.append(json.loads(line[6:]))
            if stop.is_set():
                return


def test_crossings_and_zone_changes_become_events_with_snapshots_and_clips(serve, tmp_path):
    video = tmp_path / "paths.mp4"
    _write_paths_video(video)
    server = serve(events_dir=tmp_path / "events", record_dir=tmp_path / "rec", max_streams=2)
    live: list[dict] = []
    stop = threading.Event()
    reader = threading.Thread(target=_sse_events, args=(server.base_url, live, stop), daemon=True)
    reader.start()
    wait_for(lambda: server.pipeline.events.clients == 1, 10, "the SSE client")
    server.pipeline.add_stream(_spec(video), trusted=True)
    wait_for(server.pipeline.all_finished, 30, "the video to end")
    http = server.client

    events = http.get("/v1/events", params={"limit": 1000}).json()
    crossings = [e for e in events if e["kind"] == "line_cross"]
    assert {(e["direction"], e["class"]): 1 for e in crossings} == EXPECTED_CROSSINGS
    assert len(crossings) == 4 and all(e["line"] == "middle" and e["zone"] is None for e in crossings)
    enters = [e for e in events if e["kind"] == "zone_enter"]
    leaves = [e for e in events if e["kind"] == "zone_leave"]
    # a starts left and leaves; b enters; c starts left, leaves, comes back: enters 3 (first frames
    # with an id count as entries), leaves 2; b and c end inside (the counts say 2 objects there)
    assert sorted(e["class"] for e in enters) == ["blue-square", "blue-square", "red-square", "red-square"]
    assert sorted(e["class"] for e in leaves) == ["blue-square", "red-square"]
    assert all(e["track_id"] is not None for e in enters + leaves)
    times = [e["time"] for e in events]
    assert times == sorted(times, reverse=True) and len({e["id"] for e in events}) == len(events)

    wait_for(lambda: len(live) == len(events), 10, "every event over SSE")
    stop.set()
    assert sorted(e["id"] for e in live) == sorted(e["id"] for e in events)

    one = crossings[0]
    snap = http.get(one["snapshot"])
    assert snap.status_code == 200 and snap.headers["content-type"] == "image/jpeg"
    picture = cv2.imdecode(np.frombuffer(snap.content, np.uint8), cv2.IMREAD_COLOR)
    x1, y1, x2, y2 = one["box"]
    assert picture.shape[0] >= y2 - y1 and picture.shape[1] >= x2 - x1  # the box and its margin
    colour = picture[picture.shape[0] // 2, picture.shape[1] // 2]  # the object itself, in its colour
    assert (colour[2] > 150) if one["class"] == "red-square" else (colour[0] > 150)
    assert one["clip"]["segment"].startswith("yard/yard-") and one["clip"]["segment"].endswith(".mp4")
    assert metric_value(http, "dfine_serve_events_total", stream="yard", kind="line_cross") == 4
    assert not (tmp_path / "rec" / one["clip"]["segment"]).exists()  # still being written
    assert http.delete("/v1/streams/yard").status_code == 204  # which finishes the segment
    assert (tmp_path / "rec" / one["clip"]["segment"]).is_file()
    assert 0 <= one["clip"]["offset_s"] <= FRAMES / 20
    assert one["frame_size"] == [320, 240]

    assert http.get("/v1/events", params={"kind": "zone_leave"}).json() == leaves
    assert len(http.get("/v1/events", params={"class": "blue-square", "where": "middle"}).json()) == 2
    assert http.get("/v1/events", params={"stream": "other"}).json() == []
    assert http.get("/v1/events", params={"kind": "crossing"}).status_code == 400
    assert http.get(f"/v1/events/{one['id']}").json() == one
    assert http.get("/v1/events/1700000000.000000-zzzzzz").status_code == 404


def test_a_server_without_an_events_folder_says_how_to_get_one(serve):
    reply = serve().client.get("/v1/events")
    assert reply.status_code == 404 and "--events DIR" in reply.json()["detail"]


def _event(stream: str, at: float) -> dict:
    from dfine_deploy.serve.events import Occurrence

    occurrence = Occurrence("line_cross", "middle", "in", "thing", 3, (1.0, 2.0, 3.0, 4.0), 0.9)
    return make_event(stream, 0, at, (320, 240), occurrence, None)


def test_retention_deletes_the_oldest_events_and_only_our_files(tmp_path, caplog):
    root = tmp_path / "events"
    deleted: list[tuple[str, int]] = []
    store = EventStore(root, EventPolicy(max_age_s=3600), lambda reason, n: deleted.append((reason, n)))
    now = time.time()
    old = [_event("cam", now - 7200 + i) for i in range(3)]
    new = [_event("cam", now - 10 + i) for i in range(2)]
    for event in old + new:
        store.add(event, b"\xff\xd8jpeg")
    foreign = root / "cam" / "notes.json"
    foreign.write_text("{}")  # not named like an event: never touched
    assert store.enforce_retention() == 0  # add applied the limit already
    assert deleted == [("age", 1), ("age", 1), ("age", 1)]
    assert [e["id"] for e in store.query()] == [e["id"] for e in reversed(new)]
    assert sorted(p.name for p in (root / "cam").iterdir()) == sorted(
        [f"{e['id']}.{ext}" for e in new for ext in ("json", "jpg")] + ["notes.json"]
    )

    sized = EventStore(root, EventPolicy(max_bytes=1))  # a restart reads the folder, then applies limits
    assert sized.query() == [] and foreign.exists()
    assert sorted(p.name for p in (root / "cam").iterdir()) == ["notes.json"]


def test_an_events_path_that_is_a_file_is_refused_in_one_line(tmp_path):
    from dfine_deploy.errors import ServeError

    (tmp_path / "taken").write_text("not a folder")
    with pytest.raises(
        ServeError, match=r"^--events .*taken is a file, not a folder; choose another folder$"
    ):
        EventStore(tmp_path / "taken" / "events", EventPolicy())


def test_a_track_that_ends_inside_a_zone_leaves_it():
    """Lost for longer than LOST_TRACK_SECONDS, or cut by a reconnect: the object leaves, where it was
    last seen; a short gap (a missed detection) is no exit."""
    from test_tracking import _Dets, _square

    from dfine_deploy.serve.tracking import LOST_TRACK_SECONDS, StreamTracker

    zone = {"name": "z", "polygon": [[0, 0], [300, 0], [300, 100], [0, 100]]}
    tracker = StreamTracker(StreamSpec(url="rtsp://cam/x", track=True, zones=[zone]))
    empty = _Dets(np.zeros((0, 4), np.float32), np.zeros(0), np.zeros(0, np.int64), [])
    kinds = []
    t = 0.0
    for frame in [_square(100), _square(102), empty, _square(104)] + [empty] * 20:  # a short gap, then gone
        tracker.update(frame, t)
        kinds += [(o.kind, o.track_id, o.box[0]) for o in tracker.occurrences]
        t += 0.1
    (enter, leave) = kinds
    assert enter[0] == "zone_enter" and leave[0] == "zone_leave" and enter[1] == leave[1]
    assert leave[2] == 104.0  # the box where it was last seen
    assert t > LOST_TRACK_SECONDS

    for i in range(3):
        tracker.update(_square(110 + i), t)
        t += 0.1
    assert [o.kind for o in tracker.occurrences] == [] and tracker.counts()["zones"]["z"] == {"thing": 1}
    tracker.request_reset()  # a reconnect: the old tracks end, their objects leave
    tracker.update(empty, t)
    assert [o.kind for o in tracker.occurrences] == ["zone_leave"]


def test_only_the_live_route_takes_the_key_in_the_url(serve, tmp_path):
    server = serve(api_key="k3y", events_dir=tmp_path / "events")
    http = server.client
    assert http.get("/v1/events").status_code == 401
    assert http.get("/v1/events", params={"api_key": "k3y"}).status_code == 401  # header only
    assert http.get("/v1/events", headers={"X-API-Key": "k3y"}).json() == []
    with http.stream("GET", "/v1/events/live", params={"api_key": "wrong"}) as reply:
        assert reply.status_code == 401
    with http.stream("GET", "/v1/events/live", params={"api_key": "k3y"}) as reply:
        assert reply.status_code == 200 and reply.headers["content-type"].startswith("text/event-stream")


def test_memory_stays_flat_while_events_are_stored(tmp_path):
    """The short form of benchmarks/events_soak.py (10 minutes there): a smaller, faster demo video
    makes about 25 events a second; after a warm-up, a thousand more events must not grow the
    process. It runs in a process of its own, as dfine-serve does: this worker's RSS also holds what
    earlier tests left in its heap, which moved the figure by up to a megabyte.

    Two measures. Python's heap blocks are the exact one: they stay within a few hundred blocks
    over thousands of events, and a store that kept a copy of each event's dict grew 14 blocks an
    event (3.6 MB of RSS over 3800 events). The RSS is the backstop for memory outside Python's
    heap; under a busy machine's load it moved by up to 2.4 MB with no leak, so its bound is 3 MB."""
    root = Path(__file__).parents[2]
    code = (
        "import json, sys; from pathlib import Path; sys.path.insert(0, 'benchmarks');"
        "from events_soak import soak; from dfine_deploy.data.moving import DemoVideo;"
        "video = DemoVideo(width=240, height=180, frames=16);"
        f"samples = soak(45, streams=4, sample_s=5, folder=Path({str(tmp_path)!r}), video=video,"
        " report=lambda line: None);"
        "print(json.dumps(samples))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=240, check=False
    )
    assert run.returncode == 0, run.stderr[-3000:]
    samples = json.loads(run.stdout.splitlines()[-1])
    warm = next(s for s in samples if s[0] >= 15)
    end = samples[-1]
    events = end[2] - warm[2]
    assert events >= 300, samples  # events flowed
    assert end[3] - warm[3] < 2000 + 0.5 * events, samples  # Python heap blocks
    assert end[1] - warm[1] < 3.0, samples  # MB


def test_the_index_on_disk_follows_the_files_across_restarts(tmp_path):
    """The files are the record: a restart drops the rows of events whose files are gone and reads
    back the files the index lacks, e.g. after the index was deleted."""
    from dfine_deploy.serve.events import INDEX_NAME

    root = tmp_path / "events"
    store = EventStore(root, EventPolicy())
    events = [_event("cam", 1_700_000_000 + i) for i in range(3)]
    for event in events:
        store.add(event, b"\xff\xd8jpeg")
    store.close()
    (root / "cam" / f"{events[0]['id']}.json").unlink()
    assert [e["id"] for e in EventStore(root, EventPolicy()).query()] == [events[2]["id"], events[1]["id"]]
    (root / INDEX_NAME).unlink()
    rebuilt = EventStore(root, EventPolicy())
    assert rebuilt.query() == [events[2], events[1]] and len(rebuilt) == 2
    assert rebuilt.get(events[1]["id"])["snapshot"] == f"/v1/events/{events[1]['id']}/snapshot"
