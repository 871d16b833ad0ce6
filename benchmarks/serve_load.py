"""Load test of dfine-serve on loopback: N concurrent /v1/detect clients while K streams run.

    python benchmarks/serve_load.py MODEL [--clients 8] [--streams 2] [--seconds 20] [--backend onnxruntime]

Starts `dfine-serve MODEL` as a subprocess on a free 127.0.0.1 port with K looped video files read at
25 fps (like cameras), one SSE client per stream, and N clients that post a JPEG as fast as answers
come back. Prints request throughput, p50/p99 latency, status counts (503 = the bounded upload queue
refusing work, as designed), per-stream frames in/processed/dropped, and the server's resident memory
sampled through the run and at its peak (VmHWM), to show that memory stays bounded under overload.
Bounded: --seconds of load (plus start-up, plus at most the server's 30 s upload timeout for
requests still in flight), at most --max-requests requests; the server is stopped at the end whatever
happens. Linux only (reads /proc for memory).
"""

from __future__ import annotations

import argparse
import asyncio
import json
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


def make_inputs(folder: Path, width: int, height: int) -> tuple[Path, bytes]:
    rng = np.random.default_rng(0)
    video = folder / "camera.mp4"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"mp4v"), 25, (width, height))
    background = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    for i in range(50):
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

        started = time.perf_counter()
        await asyncio.gather(
            sample_memory(),
            *(sse_listener(http, name, deadline, sse_counts) for name in stream_names),
            *(client(http, jpeg, deadline, budget, latencies, statuses) for _ in range(args.clients)),
        )
        elapsed = time.perf_counter() - started
        streams = (await http.get("/v1/streams")).json()
        healthy = (await http.get("/readyz")).status_code == 200
    return {
        "elapsed": elapsed, "latencies": latencies, "statuses": statuses, "sse": sse_counts,
        "memory": memory, "streams": streams, "healthy": healthy,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="artifact folder or .onnx/.engine file")
    p.add_argument("--backend", default="auto")
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--streams", type=int, default=2)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--max-requests", type=int, default=20_000)
    p.add_argument("--max-pending-uploads", type=int, default=32, help="the server's upload queue bound")
    p.add_argument("--width", type=int, default=640)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryDirectory() as tmp:
        video, jpeg = make_inputs(Path(tmp), args.width, args.height)
        command = [sys.executable, "-m", "dfine_deploy.serve.cli", args.model, "--backend", args.backend,
                   "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--loop",
                   "--max-pending-uploads", str(args.max_pending_uploads)]  # fmt: skip
        for _ in range(args.streams):
            command += ["--source", str(video)]
        server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                if server.poll() is not None:
                    print(f"the server exited during start-up:\n{server.stderr.read()}", file=sys.stderr)
                    return 1
                try:
                    if httpx.get(f"{base}/readyz", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.2)
            else:
                print("the server was not ready within 120 s", file=sys.stderr)
                return 1
            idle_rss = memory_mb(server.pid)[0]
            names = [s["name"] for s in httpx.get(f"{base}/v1/streams").json()]
            result = asyncio.run(run_load(base, server.pid, jpeg, args, names))
            rss, peak = memory_mb(server.pid)
            alive = server.poll() is None
        finally:
            server.terminate()
            try:
                server.wait(30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait(10)

    lat = sorted(result["latencies"])
    ok = len(lat)
    print(f"model {args.model}  backend {args.backend}  {args.clients} detect clients, "
          f"{args.streams} streams ({args.width}x{args.height} @ 25 fps), "
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
    mem = result["memory"] or [rss]
    print(f"server memory MiB: idle {idle_rss:.0f}  during load min {min(mem):.0f} / max {max(mem):.0f}  "
          f"at end {rss:.0f}  peak (VmHWM) {peak:.0f}")  # fmt: skip
    print(f"server alive after load: {alive}  ready: {result['healthy']}")
    if args.json:
        summary = {k: v for k, v in result.items() if k != "latencies"}
        summary.update(ok=ok, idle_rss=idle_rss, peak_rss=peak, alive=alive)
        args.json.write_text(json.dumps(summary, indent=2, default=str))
    return 0 if alive and result["healthy"] else 1


if __name__ == "__main__":
    sys.exit(main())
