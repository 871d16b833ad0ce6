"""A served detection under its class threshold is not counted: dfine-serve applies the threshold the
export chose for the class (model.json `thresholds`) unless the user gives their own, and tracks, zone
counts and results only hold what passed it. The model is tests/serve/tiny_model.py's, whose one
detection scores the frame's mean red, in an artifact folder whose model.json chose 0.5 for it."""

from __future__ import annotations

import json
import unicodedata

import cv2
import numpy as np
import pytest
from conftest import wait_for
from tiny_model import red_score_model

from dfine_deploy.artifact import ArtifactInfo, GraphInfo, write_artifact
from dfine_deploy.files import sha256_file
from dfine_deploy.runtime.detector import Detector
from dfine_deploy.serve.settings import StreamSpec
from dfine_deploy.thresholds import CHOSEN as CHOSEN_SOURCE
from dfine_deploy.thresholds import YOURS

CHOSEN = 0.5
BRIGHT, DIM = 0.75, 0.35  # the frames' red, so their detections' scores: above and below CHOSEN
FRAMES = 12
ZONE = {"name": "all", "polygon": [[0, 0], [100, 0], [100, 100], [0, 100]]}


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    folder = tmp_path_factory.mktemp("red")
    red_score_model(folder / "model.onnx")
    record = {"rule": "f1", "images": 8, "iou": 0.5, "classes": {"red": {"threshold": CHOSEN}}}
    info = ArtifactInfo(
        model="custom",
        num_classes=1,
        class_names=["red"],
        input_height=64,
        input_width=64,
        graphs={"fp32": GraphInfo("model.onnx", sha256_file(folder / "model.onnx"), "fp32")},
        thresholds={"fp32": record},
    )
    write_artifact(folder, info)
    return folder


@pytest.fixture(scope="module")
def video(tmp_path_factory):
    path = tmp_path_factory.mktemp("video") / "v.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), 10, (64, 48))
    for i in range(FRAMES):
        image = np.zeros((48, 64, 3), np.uint8)
        image[..., 2] = round(255 * (BRIGHT if i % 2 == 0 else DIM))  # BGR: channel 2 is red
        writer.write(image)
    writer.release()
    return path


def _served(serve, tmp_path, artifact, video, **thresholds) -> list[dict]:
    out = tmp_path / f"results-{len(list(tmp_path.iterdir()))}.jsonl"
    spec = StreamSpec(url=str(video), name="v", every_frame=True, realtime=False, track=True, zones=[ZONE])
    server = serve(
        model=str(artifact),
        backend="onnxruntime",
        device="cpu",
        streams=[spec],
        output_json=out,
        **thresholds,
    )
    wait_for(lambda: out.is_file() and len(out.read_text().splitlines()) >= FRAMES, 30, "every frame served")
    server.client.get("/readyz")
    return [json.loads(line) for line in out.read_text().splitlines()][:FRAMES]


def _kept(results: list[dict]) -> list[int]:
    """The frames whose object was detected, tracked (ids are handed out from an object's second frame
    on) and counted in the zone."""
    kept, tracks = [], []
    for r in results:
        zone = r["counts"]["zones"]["all"]
        assert bool(r["detections"]) == bool(zone), r  # what is detected is what the zone counts
        if r["detections"]:
            (det,) = r["detections"]
            assert det["name"] == "red" and zone == {"red": 1}, r
            tracks.append(det["track_id"])
            kept.append(r["frame_index"])
    assert None not in tracks[1:] and len(set(tracks[1:])) <= 1  # one object, one track from its 2nd frame
    return kept


def test_the_chosen_class_threshold_keeps_dim_detections_out_of_tracks_and_counts(
    serve, tmp_path, artifact, video
):
    bright = list(range(0, FRAMES, 2))
    assert _kept(_served(serve, tmp_path, artifact, video)) == bright  # the dim 0.35 < 0.5 chosen
    # yours win: one threshold for every class (here the global default) counts the dim frames too
    assert _kept(_served(serve, tmp_path, artifact, video, score_threshold=0.25)) == list(range(FRAMES))
    assert _kept(_served(serve, tmp_path, artifact, video, class_thresholds={"red": 0.9})) == []


def test_the_chosen_threshold_follows_the_label_when_names_are_renamed(artifact, tmp_path):
    # --names shows the class under another name: the threshold chosen for its label still applies,
    # and a class threshold given under the new name in decomposed Unicode (NFD) finds it
    names = tmp_path / "names.txt"
    names.write_text("rouge\n")
    renamed = Detector.open(artifact, backend="onnxruntime", device="cpu", score_threshold=None, names=names)
    assert renamed.class_names == ["rouge"]
    assert renamed.thresholds.values.tolist() == [CHOSEN] and renamed.thresholds.sources == [CHOSEN_SOURCE]
    accented = tmp_path / "accented.txt"
    accented.write_text(unicodedata.normalize("NFC", "rosé") + "\n")
    yours = {unicodedata.normalize("NFD", "rosé"): 0.7}
    opened = Detector.open(
        artifact,
        backend="onnxruntime",
        device="cpu",
        score_threshold=None,
        names=accented,
        class_thresholds=yours,
    )
    assert opened.thresholds.values.tolist() == [pytest.approx(0.7)] and opened.thresholds.sources == [YOURS]


def test_the_thresholds_in_force_are_listed_with_every_stream_unrounded(serve, artifact, video):
    """GET /v1/streams shows each class's threshold as compared (float32, not rounded to the start-up
    log's 4 digits) and where it came from, keyed by class name."""
    spec = StreamSpec(url=str(video), name="v", every_frame=True, realtime=False)
    for given, expected in (
        ({}, {"red": {"threshold": CHOSEN, "source": CHOSEN_SOURCE}}),
        ({"class_thresholds": {"red": 0.123456}}, {"red": {"threshold": 0.123456, "source": YOURS}}),
    ):
        server = serve(model=str(artifact), backend="onnxruntime", device="cpu", streams=[spec], **given)
        wait_for(lambda s=server: s.client.get("/readyz").status_code == 200, 30, "the server to be ready")
        (listed,) = server.client.get("/v1/streams").json()
        assert listed["class_thresholds"] == expected
        assert server.client.get("/v1/streams/v").json()["class_thresholds"] == expected
        schema = server.client.get("/openapi.json").json()["components"]["schemas"]
        assert schema["ClassThreshold"]["required"] == ["threshold", "source"]
