"""Naming, writing and hashing files: a path as the user meant it, a write that readers see whole or
not at all, and a file's sha256 remembered between runs. Ground floor: every stage that reads a
user's path, or writes or verifies a file, uses these.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def user_path(text: str | os.PathLike) -> Path:
    """A path a user typed (an option, a config or stream-list field): `~` expanded, and absolute
    against the folder the command started in. Code below the command line joins paths with other
    folders (a COCO file name under its annotation file's folder, a graph under its artifact); an
    absolute path joins the same from any folder, a relative one would be joined twice."""
    return Path(os.path.expanduser(os.fspath(text))).absolute()


def no_file(path: str | os.PathLike) -> str:
    """Why a path where a file is read names none: 'is a folder, not a file' (a folder is no missing
    file) or 'no such file'."""
    return "is a folder, not a file" if Path(path).is_dir() else "no such file"


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def _hash_cache_path() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "dfine-deploy" / "sha256.json"


def cached_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, remembered by (real path, size, mtime, ctime, inode) so an unchanged graph or
    engine is hashed once, not at every open. The change time is in the key because a write in place
    that restores the old size and mtime (`cp -p`, `rsync -a`, `touch -r`) still moves it. The cache
    is a user file; when it cannot be written, every call hashes (correct, only slower)."""
    path = Path(path).resolve()
    stat = path.stat()
    key = f"{path}|{stat.st_size}|{stat.st_mtime_ns}|{stat.st_ctime_ns}|{stat.st_ino}"
    cache_path = _hash_cache_path()
    try:
        cache = json.loads(cache_path.read_text())
        if not isinstance(cache, dict):
            cache = {}
    except (OSError, ValueError):
        cache = {}
    if isinstance(cache.get(key), str):
        return cache[key]
    digest = sha256_file(path)
    cache = {k: v for k, v in cache.items() if not k.startswith(f"{path}|")}  # one entry per file
    cache[key] = digest
    with contextlib.suppress(OSError):  # a read-only home: correctness does not depend on the cache
        atomic_write_bytes(cache_path, json.dumps(cache).encode())
    return digest


def _umask() -> int:
    """The process's umask: Linux shows it in /proc/self/status; elsewhere it is read by setting it
    and back (os.umask has no read-only form)."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Let `write` fill a temporary file in the same folder, fsync it, rename it over `path`, then
    fsync the folder: readers see the old file or the whole new one, never half a file. A link is
    followed: its target is rewritten, and the link stays (a rename would replace the link itself).
    The file gets the mode a plain `open` creates (0666 less the umask), not the temporary file's
    0600: the files of one folder that a deployment copies as another user (a PVC, Frigate's
    container) must all read alike, verify.json as model.json."""
    path = Path(os.path.realpath(path)) if os.path.islink(path) else Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    atomic_write(path, lambda fh: fh.write(data))
