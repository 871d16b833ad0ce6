from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from dfine_deploy.data.cache import FolderCache, NoCache, RamCache, build_cache
from dfine_deploy.data.loader import build_dataloader, build_dataset
from dfine_deploy.data.synthetic import SyntheticSpec, generate
from dfine_deploy.errors import DatasetError
from dfine_deploy.images import read_image
from dfine_deploy.settings import DataSettings


class CountingDecoder:
    def __init__(self):
        self.calls = 0

    def __call__(self, path: Path) -> np.ndarray:
        self.calls += 1
        return read_image(path)


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cache")
    generate(out, SyntheticSpec(images=6, seed=4, size=64, val_images=0))
    return out / "train"


def files(folder: Path) -> list[Path]:
    return sorted(folder.glob("*.jpg"))


@pytest.mark.parametrize("mode", ["ram", "folder"])
def test_cached_pixels_equal_decoded_pixels_and_skip_decoding(synth, tmp_path, mode):
    paths = files(synth)
    cache = RamCache([(64, 64)] * len(paths)) if mode == "ram" else FolderCache(tmp_path / "c")
    decoder = CountingDecoder()
    first = [cache.load(i, p, decoder) for i, p in enumerate(paths)]
    second = [cache.load(i, p, decoder) for i, p in enumerate(paths)]
    assert decoder.calls == len(paths)  # the second pass decoded nothing
    for p, a, b in zip(paths, first, second):
        expected = read_image(p)
        assert np.array_equal(a, expected) and np.array_equal(b, expected)
    second[0][...] = 0  # callers own their copy: the cache is not written through
    assert np.array_equal(cache.load(0, paths[0], decoder), read_image(paths[0]))


def test_folder_cache_notices_an_edited_image(synth, tmp_path):
    image = tmp_path / "img.jpg"
    image.write_bytes(files(synth)[0].read_bytes())
    cache, decoder = FolderCache(tmp_path / "c"), CountingDecoder()
    cache.load(0, image, decoder)
    image.write_bytes(files(synth)[1].read_bytes())
    os.utime(image, ns=(1, 1))  # a different mtime, as an edit gives
    assert np.array_equal(cache.load(0, image, decoder), read_image(files(synth)[1]))
    assert decoder.calls == 2


@pytest.mark.parametrize("stale", [None, 0])
def test_folder_cache_never_serves_pixels_of_another_reading_policy(synth, tmp_path, monkeypatch, stale):
    """An entry decoded under another policy (None: before the policy had a version; 0: an older
    one), such as a photo cached unturned, is decoded again."""
    import hashlib

    import dfine_deploy.data.cache as cache_module

    path = files(synth)[2]
    stat = path.stat()
    key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}" + ("" if stale is None else f"|{stale}")
    old_pixels = np.zeros_like(read_image(path))
    (tmp_path / "c").mkdir()
    np.save(tmp_path / "c" / (hashlib.sha1(key.encode()).hexdigest()[:24] + ".npy"), old_pixels)
    cache, decoder = FolderCache(tmp_path / "c"), CountingDecoder()
    assert np.array_equal(cache.load(0, path, decoder), read_image(path)) and decoder.calls == 1
    monkeypatch.setattr(cache_module, "POLICY_VERSION", cache_module.POLICY_VERSION + 1)
    cache.load(0, path, decoder)
    assert decoder.calls == 2  # a new policy version: decoded again


def test_folder_cache_recovers_from_a_partial_entry(synth, tmp_path):
    cache, decoder = FolderCache(tmp_path / "c"), CountingDecoder()
    path = files(synth)[0]
    cache.load(0, path, decoder)
    entry = next((tmp_path / "c").glob("*.npy"))
    entry.write_bytes(entry.read_bytes()[:100])  # a run killed mid-write (atomic writes prevent it; be safe)
    assert np.array_equal(cache.load(0, path, decoder), read_image(path)) and decoder.calls == 2


def test_ram_cache_is_shared_by_loader_workers(synth):
    settings = DataSettings(
        img_folder=str(synth),
        ann_file=str(synth / "annotations.json"),
        num_classes=4,
        total_batch_size=2,
        num_workers=2,
        cache="ram",
    )
    dataset = build_dataset(settings)
    assert isinstance(dataset.cache, RamCache)
    for _ in build_dataloader(settings, dataset):
        pass
    # the workers (separate processes, gone by now) filled the slots of the main process's buffer
    assert dataset.cache._filled.numpy()[: len(dataset)].all()
    image, _ = dataset.load_item(3)
    assert np.array_equal(image.permute(1, 2, 0).numpy(), read_image(synth / dataset.records[3].file_name))


def test_build_cache_modes_and_size_check(tmp_path):
    assert isinstance(build_cache("off", []), NoCache)
    assert isinstance(build_cache(str(tmp_path / "x"), []), FolderCache)
    with pytest.raises(DatasetError, match="shared memory"):
        RamCache([(100_000, 100_000)] * 10_000)
