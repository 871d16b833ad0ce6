"""The one image reader (dfine_deploy/images.py): every kind of file reads as a viewer shows it.

The expected pixels come from the arrays the files were written from (tests/support/images.py),
and for the EXIF JPEGs also from OpenCV, which applies JPEG orientation on its own code path.
"""

from __future__ import annotations

import struct
import zlib

import cv2
import numpy as np
import pytest
from PIL import Image

from dfine_deploy.data.image_checks import inspect_image
from dfine_deploy.errors import ImageError
from dfine_deploy.images import IMAGE_SUFFIXES, READ_FORMATS, orient_boxes, probe_image, read_image
from dfine_deploy.serve.uploads import ImageRejected, decode_upload
from tests.support.images import (
    CASE_NAMES,
    Case,
    close_enough,
    find_boxes,
    pattern,
    scene,
    stored_for,
    write_cases,
    write_oriented,
)


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return {c.name: c for c in write_cases(tmp_path_factory.mktemp("cases"))}


@pytest.mark.parametrize("name", CASE_NAMES)
def test_every_kind_of_file_reads_as_a_viewer_shows_it(cases, name):
    case = cases[name]
    pixels = read_image(case.path)
    assert close_enough(case, pixels), (name, pixels.shape, case.expected.shape)
    assert pixels.flags.c_contiguous and pixels.flags.writeable
    bgr = read_image(case.path, color="BGR")
    assert bgr.flags.c_contiguous and np.array_equal(bgr, pixels[:, :, ::-1])
    assert np.array_equal(read_image(case.path.read_bytes()), pixels)  # an upload: the same pixels


@pytest.mark.parametrize("orientation", range(1, 9))
def test_expected_orientation_agrees_with_opencv_on_jpeg(cases, orientation):
    """OpenCV turns JPEGs by their EXIF tag on its own: it agrees with the expected pixels, so the
    test's idea of 'as shown' is not the reader's own."""
    case = cases[f"exif{orientation}"]
    bgr = cv2.imread(str(case.path), cv2.IMREAD_COLOR)
    assert close_enough(case, bgr[:, :, ::-1])


@pytest.mark.parametrize("name", CASE_NAMES)
def test_the_header_says_what_the_reader_gives(cases, name):
    case = cases[name]
    info = probe_image(case.path)
    height, width = read_image(case.path).shape[:2]
    assert info.size == (width, height)
    assert (info.orientation != 1, info.bits > 8, info.alpha, info.converted_mode) == (
        case.exif,
        case.wide,
        case.alpha,
        case.converted,
    )


def test_refused_and_damaged_files_are_one_line_errors(tmp_path, cases):
    Image.fromarray(np.ones((4, 5), np.float32)).save(tmp_path / "depth.tiff")
    data = cases["exif6"].path.read_bytes()
    (tmp_path / "cut.jpg").write_bytes(data[: len(data) // 2])
    (tmp_path / "notes.png").write_bytes(b"not an image")
    expected = {
        "depth.tiff": (False, "mode F: 32-bit floating-point"),
        "cut.jpg": (True, ""),
        "notes.png": (False, "Pillow cannot identify it as an image"),
        "absent.jpg": (False, "no such file"),
    }
    for name, (corrupt, reason) in expected.items():
        for read in (probe_image, read_image):
            with pytest.raises(ImageError) as err:
                read(tmp_path / name)
            assert err.value.corrupt is corrupt and reason in err.value.reason, (name, err.value.reason)
            assert str(tmp_path / name) in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("orientation", range(1, 9))
def test_boxes_drawn_on_the_stored_pixels_follow_the_turn(tmp_path, orientation):
    shown, objects = scene(orientation)
    path = write_oriented(tmp_path / "a.png", shown, orientation)
    stored = stored_for(shown, orientation)
    drawn = np.array([box for _, box in find_boxes(stored)], dtype=np.float32)  # boxes on the stored pixels
    moved = orient_boxes(drawn, orientation, (stored.shape[1], stored.shape[0]))
    np.testing.assert_array_equal(moved, [box for _, box in find_boxes(read_image(path))])
    np.testing.assert_array_equal(moved, [box for _, box in objects])


def test_every_suffix_searched_for_is_a_format_the_reader_reads(tmp_path):
    """A folder search (IMAGE_SUFFIXES) and the reader (READ_FORMATS) agree on what an image is."""
    for suffix in IMAGE_SUFFIXES:
        Image.fromarray(pattern()).save(tmp_path / f"a{suffix.upper()}")  # Pillow picks the format by suffix
        assert probe_image(tmp_path / f"a{suffix.upper()}").format in READ_FORMATS, suffix


@pytest.mark.parametrize("name", ["moving.gif", "moving.jpg"])  # named for what it is, or as a JPEG
def test_a_format_no_folder_search_finds_is_refused_by_every_reader(tmp_path, name):
    frames = [Image.fromarray(np.roll(pattern(), 8 * i, axis=1)) for i in range(3)]
    frames[0].save(tmp_path / name, format="GIF", save_all=True, append_images=frames[1:])
    for read in (probe_image, read_image):
        with pytest.raises(ImageError) as err:
            read(tmp_path / name)
        assert not err.value.corrupt and "GIF is not a format the tools read" in err.value.reason
        assert "\n" not in str(err.value)
    assert inspect_image(tmp_path / name)[0] == "unreadable_image"  # dfine-data validate
    with pytest.raises(ImageRejected) as rejected:  # POST /v1/detect
        decode_upload((tmp_path / name).read_bytes(), "image/jpeg", 10**6)
    assert rejected.value.status == 400


def test_files_of_several_frames_give_the_first_and_say_how_many(tmp_path):
    pages = [np.roll(pattern(), 8 * i, axis=1) for i in range(3)]
    # a phone's MPO (a JPEG with more pictures after it) is named .jpg and must read as one
    formats = (
        ("pages.tiff", {}),
        ("moving.webp", {"lossless": True}),
        ("phone.jpg", {"format": "MPO", "quality": 95, "subsampling": 0}),
    )
    for name, extra in formats:
        Image.fromarray(pages[0]).save(
            tmp_path / name, save_all=True, append_images=[Image.fromarray(p) for p in pages[1:]], **extra
        )
        assert probe_image(tmp_path / name).frames == 3, name
        assert close_enough(
            Case(name, tmp_path / name, pages[0], 3.0 if name.endswith(".jpg") else 0),
            read_image(tmp_path / name),
        ), name
    Image.fromarray(pages[0]).save(tmp_path / "still.png")
    assert probe_image(tmp_path / "still.png").frames == 1


def test_a_header_declaring_too_many_pixels_is_refused_with_the_fix(tmp_path):
    """30000 x 30000 declared in a PNG of a few bytes: refused from the header, before any decoding."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 30000, 30000, 8, 2, 0, 0, 0)
    png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(b"\0" * 64))
    (tmp_path / "bomb.png").write_bytes(png + chunk(b"IEND", b""))
    for read in (probe_image, read_image):
        with pytest.raises(ImageError) as err:
            read(tmp_path / "bomb.png")
        assert "900000000 pixels" in err.value.reason and "downscale it" in err.value.reason
        assert not err.value.corrupt and "\n" not in str(err.value)
