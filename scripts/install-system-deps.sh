#!/bin/sh
# System packages the test suite needs beyond the Python venv:
# GStreamer's RTSP server, driven from the system Python through gi, serves a generated video to the
# dfine-serve RTSP tests; headless Chromium, driven by Playwright, loads the dfine-serve dashboard.
#   gir1.2-gst-rtsp-server-1.0   the RTSP server library and its introspection data
#   python3-gi                   gi bindings for /usr/bin/python3
#   gstreamer1.0-plugins-base    videoconvert
#   gstreamer1.0-plugins-good    avidemux, jpegdec/jpegenc, rtpjpegpay, rtpbin
#   chromium, chromium-driver    the browser (Playwright's own browser download cannot be used)
#   g++, make                    compile the DeepStream custom library (export/deepstream) in its test,
#                                and trtexec's own option parser per TensorRT tag when DFINE_TRT_SOURCES is set (scripts/trt_oracle)
#   mosquitto, redis-server      real MQTT and Redis brokers for the dfine-serve message bus tests
#   mosquitto-clients, redis-tools   mosquitto_sub and redis-cli: the bus tests' consumers, as separate processes
# Idempotent: installs only what is missing. Without root it prints the command and exits 0; the tests
# that need these then skip and say why, except in CI (CI=true), where they fail.
set -eu

# CPython 3.8 (JetPack 5's Python) for tests/install/test_python38.py: no Ubuntu release we build on
# ships it, so uv's standalone build is fetched when none is here (uv from PyPI into .venv).
py38_found() {
    command -v python3.8 >/dev/null 2>&1 && return 0
    for candidate in "$HOME"/.pyenv/versions/3.8*/bin/python3.8 "$HOME"/.local/share/uv/python/cpython-3.8*/bin/python3.8; do
        [ -x "$candidate" ] && return 0
    done
    return 1
}
if ! py38_found; then
    if [ -x .venv/bin/python ] && .venv/bin/python -m pip install -q uv && .venv/bin/uv python install 3.8; then
        echo "install-system-deps: installed CPython 3.8 with uv" >&2
    else
        echo "install-system-deps: no Python 3.8 and uv could not fetch one (the Python 3.8 tests skip; in CI they fail)" >&2
    fi
fi

PACKAGES="gir1.2-gst-rtsp-server-1.0 python3-gi gstreamer1.0-plugins-base gstreamer1.0-plugins-good chromium chromium-driver g++ make mosquitto mosquitto-clients redis-server redis-tools"

missing=""
for pkg in $PACKAGES; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $pkg"
    fi
done

if [ -z "$missing" ]; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install-system-deps: no apt-get here; install the equivalents of:$missing (those tests skip; in CI they fail)" >&2
    exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
    echo "install-system-deps: missing$missing; run as root: apt-get update && apt-get install -y --no-install-recommends$missing (those tests skip; in CI they fail)" >&2
    exit 0
fi
echo "install-system-deps: installing$missing" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends $missing >/dev/null
