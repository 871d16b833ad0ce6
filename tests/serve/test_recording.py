"""Recordings: complete segments one by one, never an overwrite, retention by age and size, and a real
`dfine-serve` killed with SIGKILL in the middle of a segment."""

from __future__ import annotations

import hashlib
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest
from conftest import default_hangup, metric_value, square_frame, wait_for, write_video
from tiny_model import red_score_model

from dfine_deploy.serve.recording import PARTIAL_NAME, SEGMENT_NAME, RecordingPolicy, Recordings
from dfine_deploy.serve.settings import StreamSpec


def _frames(path: Path) -> int:
    """Frames actually decoded from a file (not the count its header claims)."""
    capture = cv2.VideoCapture(str(path))
    assert capture.isOpened(), f"{path} does not open"
    count = 0
    while capture.read()[0]:
        count += 1
    capture.release()
    return count


def _segments(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.mp4") if SEGMENT_NAME.match(p.name))


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in _segments(folder)}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return red_score_model(tmp_path_factory.mktemp("model") / "red.onnx")


def _cli(model_path: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "dfine_deploy.serve.cli", str(model_path), "--backend", "onnxruntime",
            "--port", "0", "--log-level", "warning", *args]  # fmt: skip


@pytest.mark.parametrize(
    "frames, fps, expected", [(35, 10, [10, 10, 10, 5]), (20, 20, [20]), (41, 20, [20, 20, 1])]
)
def test_segments_are_complete_files_of_segment_s_seconds(tmp_path, frames, fps, expected):
    recordings = Recordings(tmp_path, RecordingPolicy(segment_s=1.0))
    recorder = recordings.recorder("cam")
    for i in range(frames):
        recorder.write(square_frame(i)[0], fps)
        if i == 0:
            assert recorder.current is not None and PARTIAL_NAME.match(recorder.current.name)
    recorder.close()
    segments = _segments(tmp_path / "cam")
    assert [_frames(p) for p in segments] == expected  # in name order, which is time order
    assert all(p.name.startswith("cam-") for p in segments) and recorder.segments == len(expected)
    assert sorted(os.listdir(tmp_path / "cam")) == [p.name for p in segments]  # no partial left
    recorder.write(square_frame(0)[0], fps)  # after close: ignored, nothing reopened
    assert len(os.listdir(tmp_path / "cam")) == len(expected)


def test_kill_9_while_recording_leaves_every_finished_segment_playable(tmp_path, model_path):
    """SIGKILL lands while a segment is being written: the finished ones are complete, playable files
    (the old single file, renamed only on a clean stop, left nothing readable)."""
    video = write_video(tmp_path / "cam.mp4", 40, fps=20)
    out = tmp_path / "out"
    args = [
        "--source",
        str(video),
        "--loop",
        "--fast",
        "--every-frame",
        "--record",
        str(out),
        "--record-segment",
        "2",
    ]
    server = subprocess.Popen(
        _cli(model_path, *args), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        wait_for(lambda: len(_segments(out / "cam")) >= 3 or server.poll() is not None, 90, "three segments")
        assert server.poll() is None, server.stderr.read()
    finally:
        server.send_signal(signal.SIGKILL)
        server.wait(10)
    assert server.returncode == -signal.SIGKILL
    segments = _segments(out / "cam")
    counts = [_frames(p) for p in segments]
    assert len(segments) >= 3 and min(counts) >= 1, counts
    assert max(counts) == 40, counts  # 2 s of a 20 fps file (a busy host may finish one early by the clock)
    for path, count in zip(segments, counts, strict=True):
        assert int(cv2.VideoCapture(str(path)).get(cv2.CAP_PROP_FRAME_COUNT)) == count, path  # index complete
    partial = [p for p in (out / "cam").iterdir() if p not in segments]
    assert len(partial) <= 1 and all(PARTIAL_NAME.match(p.name) for p in partial)  # only the one in progress


@pytest.mark.parametrize("entry", ["source", "streams"])
def test_restarting_with_record_never_replaces_an_earlier_recording(tmp_path, model_path, entry, caplog):
    video = write_video(tmp_path / "cam.mp4", 12, fps=20)
    out = tmp_path / "out"
    streams = tmp_path / "streams.yaml"
    streams.write_text(f"streams:\n  - {{name: cam, url: {video}, realtime: false, every_frame: true}}\n")
    source = (
        ["--source", str(video), "--fast", "--every-frame"]
        if entry == "source"
        else ["--streams", str(streams)]
    )
    run = _cli(model_path, *source, "--duration", "60", "--record", str(out))
    before: dict[str, str] = {}
    for attempt in range(3):
        done = subprocess.run(run, capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr
        now = _digests(out / "cam")
        assert len(now) == attempt + 1 and all(now[name] == digest for name, digest in before.items())
        before = now
    assert all(_frames(out / "cam" / name) == 12 for name in before)


def test_re_adding_a_stream_over_the_api_never_replaces_its_recording(serve, tmp_path, mjpeg_camera):
    out = tmp_path / "out"
    server = serve(record_dir=out)
    http = server.client
    kept: dict[str, str] = {}
    for attempt in range(2):
        reply = http.post("/v1/streams", json={"url": mjpeg_camera.url, "name": "door", "wait_live_s": 10})
        assert reply.status_code == 201 and reply.json()["recording"] == str(out / "door")
        wait_for(lambda: server.pipeline.get("door").frames_processed >= 5, 10, "five results")
        assert http.delete("/v1/streams/door").status_code == 204  # finishes the segment
        now = _digests(out / "door")
        assert len(now) == attempt + 1 and all(now[name] == digest for name, digest in kept.items())
        kept = now
    assert all(_frames(out / "door" / name) >= 5 for name in kept)


def _fake_segment(folder: Path, name: str, size: int, age_s: float) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_bytes(b"\0" * size)
    then = time.time() - age_s
    os.utime(path, (then, then))
    return path


def _recorded_tree(root: Path) -> dict[str, Path]:
    """Two streams' segments of several ages (hours), and files retention must never touch."""
    hour = 3600
    return {
        "cam old": _fake_segment(root / "cam", "cam-20260101T000000.000Z.mp4", 1000, 50 * hour),
        "cam mid": _fake_segment(root / "cam", "cam-20260102T000000.000Z.mp4", 1000, 20 * hour),
        "cam new": _fake_segment(root / "cam", "cam-20260103T000000.000Z-2.mp4", 1000, 1 * hour),
        "door old": _fake_segment(root / "door", "door-20260101T120000.000Z.mp4", 1000, 40 * hour),
        "door new": _fake_segment(root / "door", "door-20260103T120000.000Z.mp4", 1000, 2 * hour),
        # not ours, or not a finished segment: never deleted
        "crash leftover": _fake_segment(
            root / "cam", ".cam-20251231T000000.000Z.partial.mp4", 1000, 90 * hour
        ),
        "user video": _fake_segment(root / "cam", "holiday.mp4", 1000, 90 * hour),
        "other stream's name": _fake_segment(root / "cam", "door-20251230T000000.000Z.mp4", 1000, 90 * hour),
        "at the root": _fake_segment(root, "cam-20251230T000000.000Z.mp4", 1000, 90 * hour),
        "notes": _fake_segment(root / "door", "notes.txt", 1000, 90 * hour),
    }


@pytest.mark.parametrize(
    "policy, deleted, reasons",
    [
        (RecordingPolicy(), [], {}),
        (RecordingPolicy(max_age_s=24 * 3600), ["cam old", "door old"], {"age": 2}),
        (RecordingPolicy(max_age_s=100 * 3600), [], {}),
        (RecordingPolicy(max_bytes=3000), ["cam old", "door old"], {"size": 2}),
        (RecordingPolicy(max_bytes=1500), ["cam old", "door old", "cam mid", "door new"], {"size": 4}),
        (
            RecordingPolicy(max_age_s=45 * 3600, max_bytes=2500),
            ["cam old", "door old", "cam mid"],
            {"age": 1, "size": 2},
        ),
    ],
)
def test_retention_deletes_only_our_oldest_finished_segments(tmp_path, caplog, policy, deleted, reasons):
    tree = _recorded_tree(tmp_path)
    counted: dict[str, int] = {}
    recordings = Recordings(tmp_path, policy, on_deleted=lambda reason, n: counted.update({reason: n}))
    with caplog.at_level(logging.INFO, "dfine_deploy.serve"):
        gone = recordings.enforce_retention()
    assert sorted(gone) == sorted(tree[k] for k in deleted)
    assert {k for k, p in tree.items() if not p.exists()} == set(deleted)
    assert counted == reasons
    lines = [r.getMessage() for r in caplog.records if "retention deleted" in r.getMessage()]
    assert len(lines) == (1 if deleted else 0) and (
        not deleted or f"deleted {len(deleted)} segment(s)" in lines[0]
    )


def test_a_server_with_a_size_limit_keeps_its_folder_under_it(serve, tmp_path):
    video = write_video(tmp_path / "v.mp4", 40, fps=20)
    out = tmp_path / "out"
    limit_gb = 0.0002  # 200 kB: a handful of 1 s segments of 160x120
    spec = StreamSpec(url=str(video), name="v", loop=True, realtime=False, every_frame=True)
    server = serve(streams=[spec], record_dir=out, record_segment_s=1, record_max_gb=limit_gb)
    wait_for(
        lambda: (
            metric_value(server.client, "dfine_serve_recording_deleted_segments_total", reason="size") >= 3
        ),
        60,
        "retention to delete three segments",
    )
    made = metric_value(server.client, "dfine_serve_recording_segments_total", stream="v")
    server.__exit__(None, None, None)
    sizes = [p.stat().st_size for p in _segments(out / "v")]
    assert sizes and sum(sizes) <= limit_gb * 1e9 and made >= 4


def test_a_crash_leftover_is_reported_and_kept(tmp_path, caplog):
    leftover = _fake_segment(tmp_path / "cam", ".cam-20260101T000000.000Z.partial.mp4", 100, 10)
    with caplog.at_level(logging.WARNING, "dfine_deploy.serve"):
        Recordings(tmp_path, RecordingPolicy(segment_s=1, max_age_s=1)).recorder("cam")
    (line,) = [r.getMessage() for r in caplog.records]
    assert "1 unfinished segment(s)" in line and leftover.name in line and "killed" in line
    assert leftover.exists()


def test_recordings_are_annotated_frames_of_the_stream(serve, tmp_path):
    video = write_video(tmp_path / "v.mp4", 10, fps=20)
    out = tmp_path / "out"
    server = serve(
        streams=[StreamSpec(url=str(video), name="v", every_frame=True, realtime=False)], record_dir=out
    )
    wait_for(server.pipeline.all_finished, 20, "the file to end")
    server.__exit__(None, None, None)
    (segment,) = _segments(out / "v")
    capture = cv2.VideoCapture(str(segment))
    ok, frame = capture.read()
    assert ok and frame.shape == (120, 160, 3)
    source, (x1, y1, _, _) = square_frame(0)
    caption = np.s_[y1 - 8 : y1, x1 : x1 + 20]  # the filled caption box above the square
    assert np.abs(frame[caption].astype(int) - source[caption]).mean() > 30  # drawn: not the plain frame


def test_a_folder_that_cannot_be_written_stops_the_recording_in_one_line(tmp_path, caplog):
    (tmp_path / "cam").write_text("a file where the stream's folder should be")
    recorder = Recordings(tmp_path, RecordingPolicy(segment_s=1)).recorder("cam")
    with caplog.at_level(logging.WARNING, "dfine_deploy.serve"):
        for i in range(5):
            recorder.write(square_frame(i)[0], 10)  # no exception reaches the output thread
        assert recorder.close() is None
    (line,) = [r.getMessage() for r in caplog.records]
    assert line.startswith("stream cam: recording stopped") and "cam" in line


def _decoded(path: Path) -> tuple[str, int]:
    """The video codec of a file and the frames FFmpeg decodes from it (libav, what ffprobe runs)."""
    import av

    with av.open(str(path)) as container:
        (stream,) = container.streams.video
        return stream.codec_context.name, sum(1 for _ in container.decode(stream))


def test_the_segment_being_written_plays_up_to_its_last_second(tmp_path):
    """Fragmented MP4: what is on disk while a segment is written (and what a crash leaves) decodes,
    up to the last keyframe (one a second)."""
    recorder = Recordings(tmp_path, RecordingPolicy(segment_s=60)).recorder("cam")
    for i in range(25):  # 2.5 s at 10 fps: keyframes at 0, 1 and 2 s
        recorder.write(square_frame(i)[0], 10)
    in_progress = tmp_path / "copy.mp4"
    in_progress.write_bytes(recorder.current.read_bytes())  # the file as a kill -9 would leave it
    codec, frames = _decoded(in_progress)
    assert codec == "h264" and 20 <= frames <= 25, frames
    finished = recorder.close()
    assert _decoded(finished) == ("h264", 25)


def test_a_finished_segment_plays_in_chromium(tmp_path, browser, http_files):
    """What a user does with a recording: open it in a browser. The <video> gets a picture and plays."""
    folder, base_url = http_files
    recorder = Recordings(folder, RecordingPolicy(segment_s=60)).recorder("cam")
    for i in range(60):  # 3 s at 20 fps
        recorder.write(square_frame(i)[0], 20)
    segment = recorder.close()
    (folder / "play.html").write_text(f'<video id="v" muted playsinline src="cam/{segment.name}"></video>')
    page = browser.new_page()
    page.goto(f"{base_url}/play.html")
    video = page.locator("#v")
    playing = video.evaluate("v => v.play().then(() => 'playing', e => String(e))")
    assert playing == "playing", playing
    page.wait_for_function("document.getElementById('v').currentTime > 1", timeout=15_000)
    size = video.evaluate("v => [v.videoWidth, v.videoHeight, v.error && v.error.message]")
    assert size == [160, 120, None]


def test_sighup_finishes_the_segment_in_progress_and_exits_cleanly(tmp_path, model_path):
    """Closing the terminal a server runs in sends SIGHUP: every segment, the one being written
    included, is finished and plays to its last frame, and the exit status says nothing failed."""
    video = write_video(tmp_path / "cam.mp4", 40, fps=20)
    out = tmp_path / "out"
    args = ["--source", str(video), "--loop", "--every-frame", "--record", str(out), "--record-segment", "2"]
    server = subprocess.Popen(
        _cli(model_path, *args),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_hangup,  # a suite run under nohup passes an ignored SIGHUP on to the server
    )
    try:
        wait_for(
            lambda: (
                (_segments(out / "cam") and any(PARTIAL_NAME.match(p.name) for p in (out / "cam").iterdir()))
                or server.poll() is not None
            ),
            90,
            "a finished segment and one in progress",
        )
        assert server.poll() is None, server.stderr.read()
        server.send_signal(signal.SIGHUP)
        _, stderr = server.communicate(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
    assert server.returncode == 0, stderr
    assert "Traceback" not in stderr
    left = sorted(p.name for p in (out / "cam").iterdir())
    segments = _segments(out / "cam")
    assert len(segments) >= 2 and left == [p.name for p in segments]  # nothing partial left
    for path in segments:
        codec, frames = _decoded(path)
        assert codec == "h264" and frames == _frames(path) >= 1, path  # every frame decodes
