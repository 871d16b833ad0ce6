"""Load test of dfine-serve on loopback: N concurrent /v1/detect clients while K streams run.

    python benchmarks/serve_load.py MODEL [--clients 8] [--streams 2] [--seconds 20] [--backend onnxruntime]
    # served/raw and CPU per frame for 1..8 camera streams on each CPU backend, no upload clients
    python benchmarks/serve_load.py MODEL --sweep 1 8 --clients 0 --fps 10 --backend onnxruntime openvino

Starts `dfine-serve MODEL` as a subprocess on a free 127.0.0.1 port with K looped video files read at
25 fps (like cameras), one SSE client per stream, and N clients that post a JPEG as fast as answers
come back. Prints request throughput, p50/p99 latency, status counts (503 = the bounded upload queue
refusing work, as designed), per-stream frames in/processed/dropped, and the server's resident memory
sampled through the run and at its peak (VmHWM), to show that memory stays bounded under overload.
Bounded: --seconds of load (plus start-up, plus at most the server's 30 s upload timeout for
requests still in flight), at most --max-requests requests; the server is stopped at the end whatever
happens. Linux only (reads /proc for memory and CPU time).

Every run also reports, for the streams, served/raw (frames published over the frames the cameras
produced in the window: streams x fps x seconds) and the server's CPU time per served frame and per
stream (from /proc/PID/stat, user + system, all its threads: decode, inference, tracking, HTTP).
`--sweep LOW HIGH` repeats the run for each stream count and backend and prints one table.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import cv2
import httpx
import numpy as np


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memory_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MiB."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields.get("VmRSS", 0.0), fields.get("VmHWM", 0.0)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process and all its threads so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def make_inputs(folder: Path, width: int, height: int, fps: int) -> tuple[Path, bytes]:
    rng = np.random.default_rng(0)
    video = folder / "camera.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), fps, (width, height))
    background = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    for i in range(5 * fps):
        image = background.copy()
        cv2.rectangle(
            image, (i * 5 % (width - 100), 100), (i * 5 % (width - 100) + 90, 200), (0, 200, 255), -1
        )
        writer.write(image)
    writer.release()
    jpeg = cv2.imencode(".jpg", background)[1].tobytes()
    return video, jpeg


async def client(
    http: httpx.AsyncClient, jpeg: bytes, deadline: float, budget: list[int], latencies: list, statuses: dict
):
    while time.monotonic() < deadline and budget[0] > 0:
        budget[0] -= 1
        start = time.perf_counter()
        try:
            reply = await http.post("/v1/detect", content=jpeg, headers={"Content-Type": "image/jpeg"})
            code = reply.status_code
        except httpx.HTTPError as exc:
            code = type(exc).__name__
        if code == 200:
            latencies.append(time.perf_counter() - start)
        statuses[code] = statuses.get(code, 0) + 1
        if code == 503:
            await asyncio.sleep(0.05)  # what a polite client does with Retry-After


async def sse_listener(http: httpx.AsyncClient, name: str, deadline: float, counts: dict) -> None:
    try:
        async with http.stream("GET", f"/v1/streams/{name}/events", timeout=None) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    counts[name] = counts.get(name, 0) + 1
                if time.monotonic() > deadline:
                    return
    except httpx.HTTPError:
        return


async def run_load(base: str, pid: int, jpeg: bytes, args, stream_names: list[str]) -> dict:
    latencies: list[float] = []
    statuses: dict = {}
    sse_counts: dict = {}
    memory: list[float] = []
    deadline = time.monotonic() + args.seconds
    budget = [args.max_requests]
    limits = httpx.Limits(max_connections=args.clients + len(stream_names) + 4)
    async with httpx.AsyncClient(base_url=base, timeout=60, limits=limits) as http:

        async def sample_memory():
            while time.monotonic() < deadline:
                memory.append(memory_mb(pid)[0])
                await asyncio.sleep(0.5)

        served_before = sum(s["frames_processed"] for s in (await http.get("/v1/streams")).json())
        cpu_before = cpu_seconds(pid)
        started = time.perf_counter()
        await asyncio.gather(
            sample_memory(),
            *(sse_listener(http, name, deadline, sse_counts) for name in stream_names),
            *(client(http, jpeg, deadline, budget, latencies, statuses) for _ in range(args.clients)),
        )
        elapsed = time.perf_counter() - started
        streams = (await http.get("/v1/streams")).json()
        cpu = cpu_seconds(pid) - cpu_before
        served = sum(s["frames_processed"] for s in streams) - served_before
        healthy = (await http.get("/readyz")).status_code == 200
    return {
        "elapsed": elapsed, "latencies": latencies, "statuses": statuses, "sse": sse_counts,
        "memory": memory, "streams": streams, "healthy": healthy,
        "served": served, "raw": len(stream_names) * args.fps * elapsed, "cpu_s": cpu,
    }  # fmt: skip


def serve_once(args, backend: str, streams: int) -> dict | None:
    """Start the server with `streams` cameras on `backend`, run the load, stop it; None if it never
    became ready (the reason is printed)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        video, jpeg = make_inputs(Path(tmp), args.width, args.height, args.fps)
        command = [sys.executable, "-m", "dfine_deploy.serve.cli", args.model, "--backend", backend,
                   "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning",
                   "--max-pending-uploads", str(args.max_pending_uploads)]  # fmt: skip
        for _ in range(streams):
            command += ["--source", str(video)]
        command += ["--loop"] if streams else []  # --loop without a --source is refused
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if server.poll() is not None:
                    print(f"the server exited during start-up:\n{server.stderr.read()}", file=sys.stderr)
                    return None
                try:
                    if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            else:
                print("the server was not ready within 120 s", file=sys.stderr)
                return None
            idle_rss = memory_mb(server.pid)[0]
            names = [s["name"] for s in httpx.get(f"{base}/v1/streams").json()]
            time.sleep(args.settle)  # readers connect, the first batches run
            result = asyncio.run(run_load(base, server.pid, jpeg, args, names))
            result["rss"], result["peak_rss"] = memory_mb(server.pid)
            result["idle_rss"] = idle_rss
            result["alive"] = server.poll() is None
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)
    result.update(backend=backend, stream_count=streams)
    return result


def stream_figures(result: dict) -> dict:
    """served/raw, CPU ms per served frame and CPU cores per stream of one run."""
    served, cpu, streams = result["served"], result["cpu_s"], result["stream_count"]
    return {
        "served_raw": served / result["raw"] if result["raw"] else float("nan"),
        "cpu_ms_per_frame": 1000 * cpu / served if served else float("nan"),
        "cores_per_stream": cpu / result["elapsed"] / streams if streams else float("nan"),
    }


def print_run(result: dict, args) -> None:
    lat = sorted(result["latencies"])
    ok = len(lat)
    print(f"model {args.model}  backend {result['backend']}  {args.clients} detect clients, "
          f"{result['stream_count']} streams ({args.width}x{args.height} @ {args.fps} fps), "
          f"{result['elapsed']:.1f} s")  # fmt: skip
    print(f"/v1/detect  ok {ok} ({ok / result['elapsed']:.1f} req/s)  statuses {result['statuses']}")
    if lat:
        p99 = lat[min(len(lat) - 1, int(0.99 * len(lat)))]
        print(
            f"latency ms  p50 {1000 * statistics.median(lat):.0f}  p99 {1000 * p99:.0f}  "
            f"max {1000 * lat[-1]:.0f}"
        )
    for s in result["streams"]:
        print(f"stream {s['name']}: in {s['frames_in']}  processed {s['frames_processed']}  "
              f"dropped {s['frames_dropped']}  reconnects {s['reconnects']}  "
              f"SSE events received {result['sse'].get(s['name'], 0)}")  # fmt: skip
    if result["stream_count"]:
        f = stream_figures(result)
        print(f"streams: served/raw {f['served_raw']:.3f}  server CPU {f['cpu_ms_per_frame']:.1f} ms "
              f"per frame, {100 * f['cores_per_stream']:.0f} % of a core per stream")  # fmt: skip
    mem = result["memory"] or [result["rss"]]
    print(f"server memory MiB: idle {result['idle_rss']:.0f}  during load min {min(mem):.0f} / "
          f"max {max(mem):.0f}  at end {result['rss']:.0f}  peak {result['peak_rss']:.0f}")  # fmt: skip
    print(f"server alive after load: {result['alive']}  ready: {result['healthy']}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="artifact folder or .onnx/.engine file")
    p.add_argument("--backend", nargs="+", default=["auto"], help="one run (or sweep) per backend")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--sweep", nargs=2, type=int, metavar=("LOW", "HIGH"), help="every stream count LOW..HIGH")
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--settle", type=float, default=3.0, help="seconds between ready and the measured window")
    p.add_argument("--fps", type=int, default=25, help="frame rate of the looped camera video")
    p.add_argument("--max-requests", type=int, default=20_000)
    p.add_argument("--max-pending-uploads", type=int, default=32, help="the server's upload queue bound")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)

    counts = range(args.sweep[0], args.sweep[1] + 1) if args.sweep else [args.streams]
    runs, failed = [], False
    for backend in args.backend:
        for streams in counts:
            result = serve_once(args, backend, streams)
            if result is None:
                return 1
            print_run(result, args)
            print()
            failed |= not (result["alive"] and result["healthy"])
            runs.append(result)
    if args.sweep:
        print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs at the end")
        print(
            "| backend | streams | served/raw | server CPU ms/frame | % of a core per stream | peak RSS MiB |"
        )
        print("|---|---|---|---|---|---|")
        for r in runs:
            f = stream_figures(r)
            print(f"| {r['backend']} | {r['stream_count']} | {f['served_raw']:.3f} | "
                  f"{f['cpu_ms_per_frame']:.1f} | {100 * f['cores_per_stream']:.0f} | "
                  f"{r['peak_rss']:.0f} |")  # fmt: skip
    if args.json:
        summary = [
            {
                **{k: v for k, v in r.items() if k != "latencies"},
                "ok": len(r["latencies"]),
                **stream_figures(r),
            }
            for r in runs
        ]
        args.json.write_text(json.dumps(summary, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
