"""A loopback RTSP server for the serve tests, run under the system Python with GStreamer's gi bindings.

Usage: /usr/bin/python3 rtsp_server.py --port PORT --video FILE.avi [--mount /stream] [--stall-after N]

FILE is an MJPG AVI (the test writes it with OpenCV). Each client gets its own pipeline from the
start of the file: demux, decode, re-encode as baseline JPEG (OpenCV's JPEGs lose their colour in
RTP/JPEG's restricted header format) and send as RTP/JPEG, paced at the file's frame rate. The server
prints "READY rtsp://127.0.0.1:PORT/MOUNT" once it accepts clients and runs until SIGTERM/SIGINT.
With --stall-after N each client gets N frames, then nothing while its session stays open (a camera
whose encoder hung).

Needs the Debian packages gir1.2-gst-rtsp-server-1.0, python3-gi, gstreamer1.0-plugins-good and
gstreamer1.0-plugins-base (scripts/install-system-deps.sh).
"""

from __future__ import annotations

import argparse
import signal
import sys

import gi

gi.require_version("Gst", "1.0")
gi.require_version("GstRtspServer", "1.0")
from gi.repository import GLib, Gst, GstRtspServer  # noqa: E402


def stall_after(frames: int):
    """A media-configure handler: the client's payloader passes `frames` frames, then drops all."""

    def configure(factory: GstRtspServer.RTSPMediaFactory, media: GstRtspServer.RTSPMedia) -> None:
        passed = [0]

        def probe(pad: Gst.Pad, info: Gst.PadProbeInfo) -> Gst.PadProbeReturn:
            passed[0] += 1
            return Gst.PadProbeReturn.OK if passed[0] <= frames else Gst.PadProbeReturn.DROP

        payloader = media.get_element().get_by_name("pay0")
        payloader.get_static_pad("sink").add_probe(Gst.PadProbeType.BUFFER, probe)

    return configure


def build_server(port: int, video: str, mount: str, frames: int | None = None) -> GstRtspServer.RTSPServer:
    launch = (
        f'( filesrc location="{video}" ! avidemux ! jpegdec ! videoconvert ! jpegenc quality=90 '
        "! identity sync=true ! rtpjpegpay name=pay0 pt=26 )"
    )
    factory = GstRtspServer.RTSPMediaFactory()
    factory.set_launch(launch)
    factory.set_shared(False)
    if frames is not None:
        factory.connect("media-configure", stall_after(frames))
    server = GstRtspServer.RTSPServer()
    server.set_address("127.0.0.1")
    server.set_service(str(port))
    server.get_mount_points().add_factory(mount, factory)
    return server


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--video", required=True, help="an MJPG .avi file")
    parser.add_argument("--mount", default="/stream")
    parser.add_argument("--stall-after", type=int, help="frames each client gets before the stream stalls")
    args = parser.parse_args()

    Gst.init(None)
    server = build_server(args.port, args.video, args.mount, args.stall_after)
    if server.attach(None) == 0:
        print(f"could not listen on 127.0.0.1:{args.port}", file=sys.stderr)
        return 1
    loop = GLib.MainLoop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        GLib.unix_signal_add(GLib.PRIORITY_DEFAULT, sig, loop.quit)
    print(f"READY rtsp://127.0.0.1:{args.port}{args.mount}", flush=True)
    loop.run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
