"""Server and stream numbers out of range, or not finite, are refused where the settings are made:
`nan` passed every `<` test before (a NaN upload limit, score threshold or timeout was accepted)."""

from __future__ import annotations

import pytest

from dfine_deploy.errors import ServeError
from dfine_deploy.serve.cli import main as serve_main
from dfine_deploy.serve.settings import ServeSettings, StreamSpec

NAN = float("nan")
pytestmark = pytest.mark.timeout(60)  # before the fix a NaN threshold got as far as serving forever


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("score_threshold", NAN),
        ("score_threshold", 1.5),
        ("port", 70000),
        ("max_upload_mb", NAN),
        ("max_upload_mb", 0),
        ("max_pending_uploads", 0),
        ("upload_timeout_s", float("inf")),
        ("jpeg_quality", 0),
        ("threads", 0),
    ],
)
def test_server_settings_out_of_range(field, value):
    with pytest.raises(ServeError, match=rf"server settings: {field} must be a finite number"):
        ServeSettings(**{field: value})


@pytest.mark.parametrize(
    ("field", "value"), [("max_fps", NAN), ("max_fps", -1), ("read_timeout_s", NAN), ("vid_stride", 0)]
)
def test_stream_settings_out_of_range(field, value):
    with pytest.raises(ServeError, match=rf"stream 'cam': {field} must be a (finite|whole) number"):
        StreamSpec(url="rtsp://cam.local/x", name="cam", **{field: value})


@pytest.mark.parametrize(
    "argv",
    [
        ["--score-threshold", "nan"],
        ["--port", "-1"],
        ["--max-upload-mb", "inf"],
        ["--max-batch", "0"],
        ["--duration", "0"],
        ["--duration", "nan"],
    ],
)
def test_the_command_line_says_it_in_one_line(capsys, argv):
    code = serve_main(["dfine-n", *argv])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "must be a finite number" in err
