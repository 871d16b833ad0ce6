"""Every cache is keyed by content, not by path: the bench's exports, the sha256 memo, the decoded
image cache and onnxruntime's TensorRT engine cache. A file replaced at the same path, even with its
old size and time stamps put back (`cp -p`, `rsync -a`), is never served from the old entry."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dfine_deploy.bench import runner
from dfine_deploy.errors import BackendError


def _replace_keeping_size_and_times(path: Path, data: bytes) -> None:
    """Overwrite `path` in place with as many bytes, then put its old access and modification times back."""
    stat = path.stat()
    assert len(data) == stat.st_size
    with open(path, "r+b") as fh:
        fh.write(data)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))


@pytest.fixture
def fake_export(monkeypatch, tmp_path):
    """dfine-export replaced by a stand-in that records what it was asked and writes a model.json:
    the cache logic is what is under test, and a real export takes minutes here."""
    import dfine_deploy.export.cli as export_cli

    calls = []

    def export_main(argv):
        calls.append((argv[0], Path(argv[0]).read_bytes() if Path(argv[0]).is_file() else b""))
        out = Path(argv[argv.index("-o") + 1])
        out.mkdir(parents=True)
        (out / "model.json").write_text("{}")
        return 0

    monkeypatch.setattr(export_cli, "main", export_main)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))  # a fresh sha256 memo
    return calls


def test_a_checkpoint_replaced_at_the_same_path_is_exported_again(tmp_path, fake_export):
    checkpoint, work = tmp_path / "best.pth", tmp_path / "work"
    checkpoint.write_bytes(b"A" * 64)

    def export():
        return runner.export_for_bench(str(checkpoint), (320, 320), work, fp16=False, trt=False)

    first = export()
    assert export() == first and len(fake_export) == 1  # unchanged: reused
    checkpoint.write_bytes(b"B" * 80)  # a new training run's best.pth
    second = export()
    _replace_keeping_size_and_times(checkpoint, b"C" * 80)
    third = export()
    assert len({first, second, third}) == 3
    assert [data[:1] for _, data in fake_export] == [b"A", b"B", b"C"]
    checkpoint.write_bytes(b"A" * 64)  # the first file back: its export is still the right one
    assert export() == first and len(fake_export) == 3
    other = runner.export_for_bench(str(checkpoint), (640, 640), work, fp16=False, trt=False)
    assert other != first  # the input size is part of the key too


def test_a_config_is_keyed_by_its_merged_content_includes_and_all(tmp_path, fake_export):
    base, config = tmp_path / "base.yml", tmp_path / "model.yml"
    base.write_text("num_classes: 5\n")
    config.write_text("__include__: [base.yml]\n")
    first = runner.export_key(str(config))
    assert runner.export_key(str(config)) == first
    base.write_text("num_classes: 7\n")  # only the included file changed
    assert runner.export_key(str(config)) != first
    assert runner.export_key("dfine-n") != runner.export_key("dfine-s")


def test_the_sha256_memo_notices_a_rewrite_that_keeps_size_and_mtime(tmp_path, monkeypatch):
    from dfine_deploy.files import cached_sha256, sha256_file

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = tmp_path / "model.onnx"
    path.write_bytes(b"x" * 100)
    assert cached_sha256(path) == sha256_file(path)
    _replace_keeping_size_and_times(path, b"y" * 100)
    assert cached_sha256(path) == sha256_file(path)


def test_the_image_cache_serves_the_bytes_a_file_holds_now(tmp_path):
    import cv2

    from dfine_deploy.data.cache import FolderCache
    from dfine_deploy.images import read_image

    image = tmp_path / "img.bmp"  # uncompressed: every image of this size has the same file size
    cv2.imwrite(str(image), np.full((16, 16, 3), 10, np.uint8))
    cache = FolderCache(tmp_path / "cache")
    assert cache.load(0, image, read_image).max() == 10
    cv2.imwrite(str(tmp_path / "other.bmp"), np.full((16, 16, 3), 200, np.uint8))
    _replace_keeping_size_and_times(image, (tmp_path / "other.bmp").read_bytes())
    assert cache.load(0, image, read_image).min() == 200


def test_onnxruntime_s_tensorrt_engines_are_kept_per_graph_content(tmp_path, monkeypatch):
    """onnxruntime names a TensorRT engine after the graph's name and structure, not its weights."""
    from dfine_deploy.runtime import onnxruntime_backend
    from tests.runtime.tiny_graphs import dfine_like

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    graph = dfine_like(tmp_path / "model.onnx", classes=5)
    first = onnxruntime_backend.engine_cache_dir(graph)
    assert first.parent == tmp_path / "trt_cache"
    assert onnxruntime_backend.engine_cache_dir(graph) == first
    dfine_like(tmp_path / "other.onnx", classes=5, queries=7)
    graph.write_bytes((tmp_path / "other.onnx").read_bytes())
    assert onnxruntime_backend.engine_cache_dir(graph) != first
    asked = []
    real_chain = onnxruntime_backend.provider_chain
    monkeypatch.setattr(
        onnxruntime_backend,
        "provider_chain",
        lambda *args, **kwargs: asked.append(args[3]) or real_chain(*args, **kwargs),
    )
    with pytest.raises(BackendError):  # no TensorRT provider here: refused after the chain is made
        onnxruntime_backend.OnnxRuntimeBackend(graph, provider="tensorrt", device="cuda")
    assert asked == [onnxruntime_backend.engine_cache_dir(graph)]
