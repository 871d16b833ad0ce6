"""The generated demo video (dfine_deploy/data/moving.py): objects on known paths, decoded from a real
file and served with tracking, keep their track ids, and the counting line counts exactly the crossings
the generator lists."""

from __future__ import annotations

import json
import statistics
from collections import Counter

import cv2
import numpy as np
import pytest
from conftest import wait_for
from fake_detector import DemoColourDetector

from dfine_deploy.boxes import box_iou
from dfine_deploy.data.moving import CLASS_COLOURS, DemoVideo
from dfine_deploy.errors import DatasetError
from dfine_deploy.serve.settings import StreamSpec


def _decoded(path) -> list[np.ndarray]:
    capture = cv2.VideoCapture(str(path))
    frames = []
    while True:
        ok, image = capture.read()
        if not ok:
            return frames
        frames.append(image)


@pytest.mark.parametrize("codec", ["mp4v", "h264"])
def test_the_video_decodes_with_each_object_where_the_truth_says(tmp_path, codec):
    video = DemoVideo(frames=30)
    frames = _decoded(video.write(tmp_path / f"demo-{codec}.mp4", codec=codec))
    assert len(frames) == 30 and frames[0].shape == (video.height, video.width, 3)
    for i in (0, 14, 29):
        for _, name, (x1, y1, x2, y2) in video.truth(i):
            cx, cy = (x1 + x2) // 2, (y1 + y2) // 2 if name != "ring" else y1 + 3  # a ring's centre is empty
            assert np.abs(frames[i][cy, cx].astype(int) - CLASS_COLOURS[name]).max() < 40, (codec, i, name)


def test_the_generator_is_deterministic_and_checks_its_size():
    a, b = DemoVideo(), DemoVideo()
    np.testing.assert_array_equal(a.render(57), b.render(57))
    assert not np.array_equal(a.render(57), DemoVideo(seed=1).render(57))
    with pytest.raises(DatasetError, match="even size"):
        DemoVideo(width=101)


def test_served_demo_video_keeps_track_ids_and_counts_the_known_crossings(serve, tmp_path):
    video = DemoVideo()
    path = video.write(tmp_path / "demo.mp4")
    spec = StreamSpec(
        url=str(path), name="demo", every_frame=True, realtime=False, track=True, lines=[video.line]
    )
    server = serve(detector=DemoColourDetector(), streams=[spec], output_json=tmp_path / "results.jsonl")
    wait_for(server.pipeline.all_finished, 60, "the demo video to be tracked to its end")
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["frame_index"] for r in results] == list(range(video.frames))

    ids: dict[int, list[int | None]] = {i: [] for i in range(len(video.objects))}
    for result in results:
        truth = video.truth(result["frame_index"])
        assert len(result["detections"]) == len(truth)
        boxes = np.array([d["box"] for d in result["detections"]], np.float32)
        for index, name, box in truth:  # each object's detection: the one over its true box
            iou = box_iou(np.array([box], np.float32), boxes)[0]
            det = result["detections"][int(iou.argmax())]
            assert iou.max() > 0.8 and det["name"] == name
            ids[index].append(det["track_id"])
    main_ids = set()
    for index, seen in ids.items():
        main_id, frames = Counter(i for i in seen if i is not None).most_common(1)[0]
        assert frames >= 0.9 * video.frames_in_view(index), f"object {index} kept its id {frames} frames"
        main_ids.add(main_id)
    assert len(main_ids) == len(video.objects)  # one track per object, none shared
    lengths = Counter(d["track_id"] for r in results for d in r["detections"] if d["track_id"] is not None)
    in_view = [video.frames_in_view(i) for i in range(len(video.objects))]
    assert statistics.median(lengths.values()) >= 0.9 * statistics.median(in_view)

    expected = video.expected_crossings(video.line)
    assert sum(n for by_class in expected.values() for n in by_class.values()) == 6  # the scene's design
    assert results[-1]["counts"]["lines"] == {"middle": expected}
