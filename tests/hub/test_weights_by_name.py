"""Official weights by name: the real download code against a local HTTP server (no network).

The server (stdlib http.server, with Range requests) serves checkpoints made here in the official
layout (`{"model": state_dict}`, names, shapes and dtypes from tests/data/official_keys/keys_n.txt).
It can cut its first transfer short, as a dropped connection does.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import subprocess
import sys
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from dfine_deploy.errors import CheckpointError
from dfine_deploy.hub.download import fetch_weights
from dfine_deploy.model import zoo

KEYS = Path(__file__).resolve().parents[1] / "data" / "official_keys" / "keys_n.txt"
NAME, FILE = "dfine-n-coco", "dfine_n_coco.pth"


def official_state_dict() -> dict[str, torch.Tensor]:
    """Every tensor the official D-FINE-N (80 classes) holds, by the recorded key list, filled like a
    trained model's scale (fan-in scaled weights, unit norms, the official `up` and `reg_scale`), so
    the exported graph meets no NaN."""
    generator = torch.Generator().manual_seed(0)
    fixed = {"running_var": 1.0, "running_mean": 0.0, ".up": 0.5, "reg_scale": 4.0}
    state = {}
    for line in KEYS.read_text().splitlines():
        name, shape, dtype = line.split("\t")
        size = tuple(int(n) for n in shape.strip("()").split(",") if n.strip())
        kind = getattr(torch, dtype.removeprefix("torch."))
        noise = torch.randn(size, generator=generator)
        constant = next((v for k, v in fixed.items() if name.endswith(k)), None)
        if constant is not None:  # the official reg_scale is an integer tensor
            value = torch.full(size, constant)
        elif not kind.is_floating_point:
            value = torch.zeros(size)
        elif len(size) >= 2:
            value = noise / math.sqrt(math.prod(size[1:]))
        else:
            value = (1.0 if name.endswith(".weight") else 0.0) + 0.02 * noise
        state[name] = value.to(kind)
    return state


def saved(state: dict[str, torch.Tensor]) -> bytes:
    buffer = io.BytesIO()
    torch.save({"model": state, "date": "made by the test"}, buffer)
    return buffer.getvalue()


class Server:
    """Serves `files` by name, honouring `Range: bytes=N-`; `cut_next` bytes end the next transfer."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.ranges: list[str | None] = []
        self.cut_next: int | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.files.get(self.path.lstrip("/"))
                if body is None:
                    self.send_error(404)
                    return
                asked = self.headers.get("Range")
                outer.ranges.append(asked)
                start = int(asked.removeprefix("bytes=").rstrip("-")) if asked else 0
                self.send_response(206 if asked else 200)
                if asked:
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                cut, outer.cut_next = outer.cut_next, None
                self.wfile.write(body[start : cut if cut is not None else len(body)])
                if cut is not None:
                    self.close_connection = True

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/"


def kept(home: Path) -> list[str]:
    """What the cache holds besides the lock file that downloads take turns by."""
    return [p.name for p in home.iterdir() if not p.name.endswith(".lock")]


@pytest.fixture(scope="module")
def official() -> bytes:
    return saved(official_state_dict())


@pytest.fixture(scope="module")
def server():
    served = Server()
    yield served
    served.httpd.shutdown()


@pytest.fixture
def home(tmp_path, monkeypatch, server):
    monkeypatch.setenv("DFINE_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DFINE_WEIGHTS_URL", server.url)
    server.ranges.clear()
    return tmp_path / "home" / "weights"


def test_a_cut_transfer_resumes_and_the_first_hash_is_recorded(home, server, official, capsys):
    server.files[FILE] = official
    server.cut_next = len(official) // 3
    with pytest.raises(CheckpointError, match=r"cut at \d+ of \d+ bytes; run the command again to resume"):
        fetch_weights(NAME)
    part = home / (FILE + ".part")
    assert part.stat().st_size == len(official) // 3
    assert not (home / FILE).exists()  # nothing half-written in the cache

    path = fetch_weights(NAME)
    assert server.ranges == [None, f"bytes={len(official) // 3}-"]
    assert path == home / FILE and path.read_bytes() == official and not part.exists()
    digest = hashlib.sha256(official).hexdigest()
    assert (home / (FILE + ".sha256")).read_text().strip() == digest
    assert digest in capsys.readouterr().err  # shown once, at download

    assert fetch_weights(NAME) == path and len(server.ranges) == 2  # read from the cache


def test_a_file_that_changed_since_download_is_refused(home, server, official):
    server.files[FILE] = official
    path = fetch_weights(NAME)
    path.write_bytes(official[:-1] + bytes([official[-1] ^ 1]))
    with pytest.raises(CheckpointError, match=r"differs from the recorded .* delete it"):
        fetch_weights(NAME)


def test_a_published_hash_that_differs_is_refused(home, server, official, monkeypatch):
    server.files[FILE] = official
    row = replace(zoo.OFFICIAL_WEIGHTS[NAME], sha256="0" * 64)
    monkeypatch.setitem(zoo.OFFICIAL_WEIGHTS, NAME, row)
    with pytest.raises(CheckpointError, match="expected 0000.*it was removed"):
        fetch_weights(NAME)
    assert kept(home) == []


@pytest.mark.parametrize(
    ("change", "said"),
    [
        (lambda s: s.pop("decoder.dec_bbox_head.2.layers.2.bias"), "1 tensors missing"),
        (lambda s: s.update({"encoder.extra.weight": torch.zeros(1)}), "tensors the official model lacks"),
        (lambda s: s.update({"decoder.enc_score_head.weight": torch.zeros(81, 128)}), "shapes differ"),
        (lambda s: s.update({"decoder.query_pos_head.layers.0.weight": torch.zeros(5, 4)}), "shapes differ"),
    ],
)
def test_other_tensors_are_refused_and_not_kept(home, server, change, said):
    state = official_state_dict()
    change(state)
    server.files[FILE] = saved(state)
    with pytest.raises(CheckpointError, match=f"not the official {NAME} .*{said}"):
        fetch_weights(NAME)
    assert kept(home) == []


def _console(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_a_name_exports(home, server, official, tmp_path):
    server.files[FILE] = official
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    small = ["--imgsz", "256", "256", "--batch", "1", "1", "1", "--no-fp16", "--no-cpu-graph", "--json"]
    proc = _console(["dfine_deploy.export.cli", NAME, "-o", "out", *small], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    sidecar = json.loads((tmp_path / "out" / "model.json").read_text())
    assert sidecar["checkpoint"]["sha256"] == hashlib.sha256(official).hexdigest()
    assert sidecar["class_names"][0] == "person" and sidecar["num_classes"] == 80


def test_a_name_benches(home, server, official, tmp_path):
    """dfine-bench refused official weights by name as 'no such file or folder', though its own
    error listed them among the models it takes."""
    server.files[FILE] = official
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    small = ["--backend", "torch", "--imgsz", "256", "--frame-size", "160", "120", "--device", "cpu"]
    small += ["--runs", "1", "--warmup", "0", "--json", "bench.json"]
    proc = _console(["dfine_deploy.bench.cli", "--model", NAME, *small], env, tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "bench.json").read_text())["rows"], proc.stdout


def test_without_network_one_line_names_the_url_and_the_place(tmp_path):
    """The real URL through a proxy that refuses, as on a machine whose network blocks github.com."""
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("DFINE_WEIGHTS_URL", "no_proxy", "NO_PROXY")},
        "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        "DFINE_HOME": str(tmp_path / "home"),
        "https_proxy": "http://127.0.0.1:9",
        "HTTPS_PROXY": "http://127.0.0.1:9",
    }
    proc = _console(["dfine_deploy.export.cli", "dfine-s-coco", "-o", "out"], env, tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert zoo.OFFICIAL_BASE_URL + "dfine_s_coco.pth" in lines[0]
    assert f"put it at {tmp_path / 'home' / 'weights' / 'dfine_s_coco.pth'}" in lines[0]


def test_the_docs_table_lists_every_name_with_its_source():
    page = (Path(__file__).resolve().parents[2] / "docs" / "models.md").read_text(encoding="utf-8")
    rows = [line for line in page.splitlines() if line.startswith("| `dfine-")]
    assert len(rows) == len(zoo.OFFICIAL_WEIGHTS)
    for row, entry in zip(rows, zoo.OFFICIAL_WEIGHTS.values(), strict=True):
        assert row.startswith(f"| `{entry.name}` |") and f"]({zoo.OFFICIAL_BASE_URL}{entry.file})" in row
