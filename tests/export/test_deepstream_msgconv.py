"""The nvmsgconv payload library and the deepstream-app config that loads it, checked without DeepStream.

export/deepstream/nvmsgconv_dfine is built with -Werror against tests/fakes/nvmsgconv (our
transcription of NVIDIA's nvdsmeta_schema.h and nvmsgconv.h, it says so at its top) and GLib's type
names from scripts/ds_headers; a driver loads it as gst-nvmsgconv does and the JSON it makes is
compared with the event dfine-serve's own `make_event` builds from the same values.
tests/data/deepstream_headers.json (scripts/record_deepstream_headers.py) holds what the same probe
and driver printed against NVIDIA's DeepStream 9.0.0 and 9.1.0 headers, and the keys deepstream-app's
config parser accepts per group; our transcription and our config are checked against those facts.
g++ and make are system requirements of the suite (scripts/install-system-deps.sh): never skipped.
"""

from __future__ import annotations

import configparser
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from dfine_deploy.export import deepstream
from dfine_deploy.serve.events import EVENT_ID, Occurrence, make_event
from dfine_deploy.serve.settings import ServeSettings

ROOT = Path(__file__).parents[2]
SOURCE = ROOT / "export" / "deepstream" / "nvmsgconv_dfine"
HEADERS = ROOT / "tests" / "fakes" / "nvmsgconv"
GLIB = ROOT / "scripts" / "ds_headers"  # our stand-in for GLib's type names
RECORD = ROOT / "tests" / "data" / "deepstream_headers.json"
LIBRARY = "libnvmsgconv_dfine.so"
ENTRY_POINTS = (
    "nvds_msg2p_ctx_create",
    "nvds_msg2p_ctx_destroy",
    "nvds_msg2p_generate",
    "nvds_msg2p_generate_multiple",
    "nvds_msg2p_generate_new",
    "nvds_msg2p_generate_multiple_new",
    "nvds_msg2p_release",
)
FLAGS = ["-std=c++17", "-Wall", "-Wextra", "-Werror", "-isystem", str(HEADERS), "-isystem", str(GLIB)]
# the fields the event message cannot fill (export/deepstream/README.md), always null in the payload
UNFILLED = ("line", "zone", "direction", "frame_size", "snapshot", "clip")


def _make(folder: Path, *targets: str, includes: Path = HEADERS) -> subprocess.CompletedProcess:
    compiler = shutil.which("g++")
    assert compiler and shutil.which("make"), "g++ and make: run scripts/install-system-deps.sh"
    return subprocess.run(
        [
            "make",
            "-C",
            str(folder),
            *targets,
            f"DS_INCLUDES={includes}",
            f"MSGCONV_INCLUDES={includes}",
            f"GLIB_CFLAGS=-isystem {GLIB}",
            "WERROR=-Werror",
            f"CXX={compiler}",
        ],
        capture_output=True,
        text=True,
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    """The library built with its Makefile against our transcription, probe and driver beside it."""
    folder = tmp_path_factory.mktemp("msgconv")
    build = folder / "lib"
    shutil.copytree(SOURCE, build)
    made = _make(build)
    assert made.returncode == 0, made.stderr
    for name in ("nvmsgconv_layout_probe", "nvmsgconv_check"):
        source = ROOT / "tests" / "export" / f"{name}.cpp"
        subprocess.run(["g++", *FLAGS, str(source), "-o", str(folder / name), "-ldl"], check=True)
    return folder


def _run(built: Path, name: str) -> list[str]:
    argv = [str(built / name)] + ([str(built / "lib" / LIBRARY)] if name == "nvmsgconv_check" else [])
    return subprocess.run(argv, check=True, capture_output=True, text=True).stdout.splitlines()


def _payloads(lines: list[str]) -> list[dict]:
    """The JSON of every `payload <bytes> <text>` line; the byte count must be the text's."""
    events = []
    for line in lines:
        if line.startswith("payload ") and line != "payload none":
            _, size, text = line.split(" ", 2)
            assert int(size) == len(text.encode())
            events.append(json.loads(text))
    return events


def _record() -> dict:
    record = json.loads(RECORD.read_text())
    assert set(record["tags"]) == {"v9.0.0", "v9.1.0"}
    return record


def _masked(lines: list[str]) -> list[str]:
    """Driver output with each event id's random part (6 of [a-z0-9]) replaced: it differs per run."""
    return [re.sub(r'("id": "\d+\.\d{6}-)[a-z0-9]{6}"', r'\1......"', line) for line in lines]


def test_library_builds_with_its_makefile_and_exports_what_nvmsgconv_resolves(built):
    library = built / "lib" / LIBRARY
    listed = subprocess.run(["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True)
    for name in ENTRY_POINTS:  # gst-nvmsgconv dlsym()s all seven and refuses a library lacking one
        assert f" T {name}\n" in listed.stdout, name


def test_install_puts_the_library_where_the_app_config_names_it(built, tmp_path):
    made = _make(built / "lib", "install", f"ARTIFACT={tmp_path}")
    assert made.returncode == 0, made.stderr
    assert (tmp_path / deepstream.MSGCONV_LIB).is_file()


def test_makefile_without_deepstream_says_what_is_missing(tmp_path):
    shutil.copytree(SOURCE, tmp_path / "lib")
    made = _make(tmp_path / "lib", includes=tmp_path / "nowhere")
    assert made.returncode != 0
    assert f"error: {tmp_path / 'nowhere'}/nvdsmeta_schema.h not found" in made.stderr


def test_payloads_are_dfine_serve_events_as_far_as_the_message_carries(built):
    """Each payload has exactly the keys of dfine-serve's event, with make_event's values for the
    same object; the fields an event message cannot fill are null and `kind` says "detection"."""
    lines = _run(built, "nvmsgconv_check")
    assert lines[0] == f"context payloadType {deepstream.PAYLOAD_TYPE_CUSTOM}"
    assert "generate_multiple count 2" in lines
    assert "timeless within 60 s of now yes" in lines  # no readable ts: the clock's time
    assert lines[-1] == "new api payloads none count 0"
    events = _payloads(lines)
    # the driver's event messages (tests/export/nvmsgconv_check.cpp), as dfine-serve would describe them
    expected = [
        ("source2", 1796135201.513, 4211, "person", 17, 0.87312, (412.5, 188.0, 470.25, 355.75)),
        ("source0", 1796135201.5, 7, "class3", None, 0.5, (20.0, 10.0, 50.0, 50.0)),
        ("dock-west", 1796135201.0, 0, 'fork "lift"\t2', 0, 1.0, (0.0, 0.0, 1.0, 1.0)),
    ]
    assert len(events) == len(expected)
    for event, (stream, time, frame, label, track, score, box) in zip(events, expected, strict=False):
        occurrence = Occurrence("line_cross", "door", "in", label, track, box, score)
        reference = make_event(stream, frame, time, (1920, 1080), occurrence, None)
        assert set(event) == set(reference)
        assert EVENT_ID.match(event["id"]) and event["id"].startswith(f"{time:.6f}-")
        assert event["kind"] == "detection"
        assert all(event[key] is None for key in UNFILLED)
        for key in ("stream", "frame_index", "class", "track_id", "score", "box"):
            assert event[key] == reference[key], key
        assert event["time"] == pytest.approx(reference["time"], abs=1e-6)


def test_our_transcription_prints_what_nvidias_headers_printed(built):
    """NVIDIA's 9.0.0 and 9.1.0 headers built the library with -Werror; the probe (enum values,
    sizes, member offsets, the seven signatures) and the driver printed there what they print here."""
    probe, driver = _run(built, "nvmsgconv_layout_probe"), _run(built, "nvmsgconv_check")
    for tag, facts in _record()["tags"].items():
        assert facts["msgconv_library_builds_with_werror"], (tag, facts["msgconv_library_errors"])
        assert probe == facts["msgconv_probe"], f"our nvmsgconv transcription differs from NVIDIA's {tag}"
        assert f"enum NVDS_PAYLOAD_CUSTOM {deepstream.PAYLOAD_TYPE_CUSTOM}" in facts["msgconv_probe"]
        assert _masked(driver) == _masked(facts["msgconv_driver"]), f"the driver differs on NVIDIA's {tag}"


def test_every_key_of_the_app_config_is_one_deepstream_app_accepts(artifact):
    """deepstream-app warns about an unknown key and ignores it, so a misspelt one would silently do
    nothing: each key must be one its parser compares keys with, in every recorded tag."""
    paths = deepstream.write_config(artifact)
    app = next(path for path in paths if path.name == deepstream.APP_CONFIG_NAME)
    parser = configparser.ConfigParser(interpolation=None, delimiters=("=",), comment_prefixes=("#",))
    parser.optionxform = str  # GLib's key files are case-sensitive
    parser.read_string(app.read_text())
    for tag, facts in _record()["tags"].items():
        accepted = facts["deepstream_app_keys"]
        for section in parser.sections():
            group = section.rstrip("0123456789")
            assert group in accepted, f"[{section}]: no recorded keys for this group"
            unknown = sorted(set(parser[section]) - set(accepted[group]))
            assert unknown == [], f"[{section}] keys deepstream-app {tag} does not know: {unknown}"
    sink = next(parser[s] for s in parser.sections() if parser[s].get("type") == "6")
    assert sink["msg-conv-msg2p-lib"] == deepstream.MSGCONV_LIB
    assert sink["msg-conv-payload-type"] == str(deepstream.PAYLOAD_TYPE_CUSTOM)
    assert sink["msg-broker-proto-lib"].endswith("/libnvds_mqtt_proto.so")
    assert sink["topic"] == f"{ServeSettings.mqtt_prefix}/events"  # where dfine-serve publishes events
    assert parser["tracker"]["ll-lib-file"].endswith("/libnvds_nvmultiobjecttracker.so")
    assert parser["primary-gie"]["config-file"] == deepstream.CONFIG_NAME


def test_the_broker_and_topic_are_the_callers(artifact):
    from dfine_deploy.artifact import read_artifact

    text = deepstream.app_config_text(read_artifact(artifact), broker="mqtt.local;8883", topic="site/events")
    assert "msg-broker-conn-str=mqtt.local;8883\n" in text and "topic=site/events\n" in text
