"""Caches of decoded images: after the first epoch, JPEG decoding is skipped.

- ``off``: decode every time.
- ``ram``: one shared-memory buffer sized from the (validated) image sizes. Loader workers write
  into disjoint slots of the same buffer, so the cache is shared by all workers and survives the
  re-creation of non-persistent workers between epochs.
- a folder (for example ``/dev/shm/dfine-cache``): one ``.npy`` file per image, keyed by a hash of
  the source file's bytes and the reading policy's version, so neither an edited or replaced image
  nor one decoded under an earlier policy is served stale (a path, size and time stamp are not
  enough: ``cp -p`` and ``rsync -a`` keep them). Reading the bytes to hash them costs a fraction of
  decoding them. Written atomically, shared by workers, ranks and later runs.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from dfine_deploy.errors import DatasetError
from dfine_deploy.images import POLICY_VERSION

Decoder = Callable[[Path], np.ndarray]  # path -> [H, W, 3] uint8 RGB (dfine_deploy.images)


class NoCache:
    """Decode on every access."""

    mode = "off"

    def load(self, index: int, path: Path, decode: Decoder) -> np.ndarray:
        return decode(path)


class RamCache:
    """A shared-memory buffer with one slot per image (sizes known from the annotations)."""

    mode = "ram"

    def __init__(self, sizes: Sequence[tuple[int, int]]):
        import torch

        nbytes = [w * h * 3 for w, h in sizes]
        self.shapes = [(h, w, 3) for w, h in sizes]
        self.offsets = np.concatenate([[0], np.cumsum(nbytes, dtype=np.int64)])
        total = int(self.offsets[-1])
        _check_room(total)
        # share_memory_ backs the tensors with shared memory: workers forked or spawned later see
        # the same pages, so one worker's decode serves every other worker.
        self._buffer = torch.zeros(max(total, 1), dtype=torch.uint8).share_memory_()
        self._filled = torch.zeros(max(len(sizes), 1), dtype=torch.uint8).share_memory_()

    def load(self, index: int, path: Path, decode: Decoder) -> np.ndarray:
        start, end = int(self.offsets[index]), int(self.offsets[index + 1])
        slot = self._buffer.numpy()[start:end].reshape(self.shapes[index])
        if self._filled.numpy()[index]:
            return slot.copy()  # a copy: transforms must never write into the cache
        image = decode(path)  # the dataset's decoder checks the size the slot was made for
        slot[...] = image
        self._filled.numpy()[index] = 1  # written after the pixels: readers never see a half slot
        return image

    @property
    def nbytes(self) -> int:
        return int(self.offsets[-1])


class FolderCache:
    """One ``.npy`` per decoded image in a folder (tmpfs such as /dev/shm is fastest)."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DatasetError(
                f"cache folder {self.root} cannot be created ({exc}); choose a writable folder"
            ) from None
        self.mode = str(self.root)

    def _entry(self, path: Path) -> Path:
        """The entry of the bytes `path` holds now, as decoded under the current reading policy."""
        digest = hashlib.blake2b(path.read_bytes(), digest_size=16)
        digest.update(str(POLICY_VERSION).encode())
        return self.root / (digest.hexdigest() + ".npy")

    def load(self, index: int, path: Path, decode: Decoder) -> np.ndarray:
        entry = self._entry(path)
        try:
            return np.load(entry)
        except (FileNotFoundError, ValueError, EOFError, OSError):
            pass  # absent, or a partial file from a killed run: decode again
        image = decode(path)
        fd, tmp = tempfile.mkstemp(dir=self.root, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.save(fh, image)
            os.replace(tmp, entry)
        except OSError as exc:
            Path(tmp).unlink(missing_ok=True)
            raise DatasetError(
                f"cannot write the image cache {entry} ({exc}); free space or turn the cache off"
            ) from None
        return image


def _check_room(nbytes: int) -> None:
    """The RAM cache lives in shared memory: refuse up front rather than die of SIGBUS later."""
    try:
        stat = os.statvfs("/dev/shm")
        shm_free = stat.f_bavail * stat.f_frsize
    except OSError:
        return
    if nbytes > shm_free:
        raise DatasetError(
            f"cache: ram needs {nbytes / 2**30:.1f} GiB of shared memory but /dev/shm has "
            f"{shm_free / 2**30:.1f} GiB free; use cache: off, a folder on disk, or enlarge /dev/shm "
            "(docker: --shm-size)"
        )


def build_cache(mode: str | None, sizes: Sequence[tuple[int, int]]) -> NoCache | RamCache | FolderCache:
    """`cache` setting -> cache object: "off" (or None), "ram", or a folder path."""
    if mode in (None, "", "off", "none", False):
        return NoCache()
    if mode == "ram":
        return RamCache(sizes)
    return FolderCache(str(mode))
