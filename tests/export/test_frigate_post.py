"""Our emulation of Frigate's post-processing (dfine_deploy/export/frigate_post.py) does what Frigate's
code does, fact by fact (read at Frigate commit e3fa701: frigate/util/model.py post_process_dfine,
frigate/object_detection/base.py and frigate/video/detect.py detect, frigate/util/object.py
is_object_filtered and reduce_detections, frigate/track/tracked_object.py). Each case is built so that
the fact decides its outcome."""

from __future__ import annotations

import numpy as np

from dfine_deploy.export import frigate_post as fp

NAMES = ["car", "person", "dog"]
FRAME = (640, 480)
WHOLE = (0, 0, 640, 640)  # a region at the frame's corner: no box in it counts as clipped


def outputs(rows: list[tuple[int, float, tuple[float, float, float, float]]]):
    """Graph outputs [1, K] labels, [1, K, 4] boxes (x1, y1, x2, y2 in model pixels), [1, K] scores."""
    labels = np.array([[r[0] for r in rows]], np.int64)
    scores = np.array([[r[1] for r in rows]], np.float32)
    boxes = np.array([[r[2] for r in rows]], np.float32).reshape(1, -1, 4)
    return labels, boxes, scores


def kept(rows: np.ndarray) -> list[tuple[int, float]]:
    return [(int(r[0]), round(float(r[1]), 4)) for r in rows if r[1] > 0]


def test_the_detector_keeps_scores_above_0_4_only():
    rows = fp.detector_rows(*outputs([(0, 0.4, (0, 0, 10, 10)), (1, 0.41, (50, 50, 60, 60))]), 100, 100)
    assert kept(rows) == [(1, 0.41)]


def test_the_detectors_nms_runs_across_classes():
    same_place = (20, 20, 40, 40)
    rows = fp.detector_rows(*outputs([(0, 0.9, same_place), (1, 0.8, same_place)]), 100, 100)
    assert kept(rows) == [(0, 0.9)]  # the person under the car is gone


def test_the_detectors_nms_reads_corners_as_x_y_width_height():
    """Two objects that do not touch: near the top-left both stay, toward the bottom-right (where the
    misread widths grow with x2, y2) the weaker is suppressed, at the same distance apart."""
    near_origin = [(0, 0.9, (0, 0, 10, 10)), (0, 0.8, (12, 0, 22, 10))]
    far = [(0, 0.9, (60, 60, 70, 70)), (0, 0.8, (72, 60, 82, 70))]
    assert kept(fp.detector_rows(*outputs(near_origin), 100, 100)) == [(0, 0.9), (0, 0.8)]
    assert kept(fp.detector_rows(*outputs(far), 100, 100)) == [(0, 0.9)]


def test_the_detector_reports_20_rows_best_first_as_class_score_y1_x1_y2_x2_of_the_input():
    # 30 boxes apart even as Frigate's NMS misreads them ([x1, x1 + x2] wide): each step past the last
    steps = [1, 4, 10, 22, 46, 94]
    spread = [
        (i % 3, 0.5 + i / 100, (x, y, x + 1, y + 1))
        for i, (x, y) in enumerate((x, y) for x in steps for y in steps[:5])
    ]
    rows = fp.detector_rows(*outputs(spread), 640, 320)  # width 640, height 320
    assert rows.shape == (20, 6) and (rows[:, 1] > 0).all()
    assert (np.diff(rows[:, 1]) <= 0).all()
    best = spread[-1]
    x1, y1, x2, y2 = best[2]
    # divided by (height, width, height, width) of the input: our graphs' boxes scale the swap back
    np.testing.assert_allclose(rows[0], [best[0], best[1], y1 / 640, x1 / 320, y2 / 640, x2 / 320], rtol=1e-6)


def test_detect_reads_rows_until_the_first_under_0_4_and_skips_unknown_classes():
    rows = np.zeros((20, 6), np.float32)
    rows[0] = [7, 0.9, 0.1, 0.1, 0.2, 0.2]  # no class 7 in the label map
    rows[1] = [1, 0.8, 0.3, 0.3, 0.4, 0.4]
    rows[2] = [1, 0.3, 0.5, 0.5, 0.6, 0.6]
    rows[3] = [2, 0.9, 0.7, 0.7, 0.8, 0.8]  # after a row under 0.4: never read
    loose = dict.fromkeys(NAMES, fp.ClassFilter(0.0, 0.0))
    found = fp.frame_detections(rows, NAMES, WHOLE, FRAME, loose)
    assert [(d.label, round(d.score, 2)) for d in found] == [("person", 0.8)]
    assert found[0].box == (192, 192, 256, 256)  # scaled by the region's side, whole pixels


def test_min_score_lets_a_score_equal_to_it_through():
    rows = np.zeros((20, 6), np.float32)
    rows[0] = [1, 0.625, 0.1, 0.1, 0.2, 0.2]  # 0.625: exact in float32
    at = fp.frame_detections(rows, NAMES, WHOLE, FRAME, {"person": fp.ClassFilter(0.625, 0.7)})
    above = fp.frame_detections(rows, NAMES, WHOLE, FRAME, {"person": fp.ClassFilter(0.626, 0.7)})
    assert len(at) == 1 and above == []


def det(label: str, score: float, box, region=WHOLE) -> fp.FrameDetection:
    return fp.FrameDetection(label, score, box, region)


def test_reduce_drops_scores_of_0_5_or_less_unless_the_box_touches_an_inner_region_edge():
    inner = (100, 100, 300, 300)  # a region inside the frame
    found = fp.reduce_detections(
        [
            det("dog", 0.5, (10, 10, 50, 50)),
            det("dog", 0.51, (100, 100, 150, 150)),
            det("person", 0.45, (102, 150, 160, 200), inner),  # 2 px from the region's left edge: 0.6 for NMS
            det("person", 0.45, (150, 150, 200, 200), inner),
        ],
        FRAME,
    )
    assert sorted((d.label, d.score, d.box[0]) for d in found) == [("dog", 0.51, 100), ("person", 0.45, 102)]


def test_reduce_runs_nms_per_class_and_consolidates_nested_boxes_of_one_class():
    found = fp.reduce_detections(
        [
            det("dog", 0.9, (100, 100, 200, 200)),
            det("person", 0.8, (100, 100, 200, 200)),  # same box, other class: stays
            det("dog", 0.95, (110, 110, 150, 150)),  # inside the larger dog, its better score no help
            det("person", 0.7, (300, 300, 340, 340)),
        ],
        FRAME,
    )
    assert sorted((d.label, d.box) for d in found) == [
        ("dog", (100, 100, 200, 200)),
        ("person", (100, 100, 200, 200)),
        ("person", (300, 300, 340, 340)),
    ]


def test_an_object_is_reported_when_its_score_reaches_the_threshold():
    objects = [det("dog", 0.7, (0, 0, 10, 10)), det("dog", 0.69, (20, 20, 30, 30))]
    assert [d.score for d in fp.reported(objects, {})] == [0.7]  # Frigate's default threshold, inclusive
    assert len(fp.reported(objects, {"dog": fp.ClassFilter(0.5, 0.6)})) == 2


def test_frigate_defaults_are_its_filter_configs():
    assert fp.ClassFilter(min_score=0.5, threshold=0.7) == fp.FRIGATE_DEFAULT


def test_a_still_image_is_fed_as_one_square_region_black_past_its_edge():
    image = np.full((100, 200, 3), 255, np.uint8)  # width 200, height 100
    region = fp.still_image_region((200, 100))
    assert region == (0, 0, 200, 200)
    tensor = fp.region_tensor(image, region, 64, 64)
    assert tensor.shape == (1, 3, 64, 64) and tensor.dtype == np.float32
    assert tensor[0, :, :30].min() == 1.0 and tensor[0, :, 34:].max() == 0.0
    assert fp.region_sizes(64, 32).tolist() == [[32, 64]] and fp.region_sizes(64, 32).dtype == np.int64
