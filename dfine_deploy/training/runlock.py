"""One run owns its output folder: a lock file that names the owner, held for the whole run.

Two runs in one `--output-dir` used to interleave `log.jsonl` and overwrite each other's checkpoints
(and each one's start-up cleanup deleted the other's half-written checkpoint). Now rank 0 of a run
creates `<output-dir>/.dfine-run.lock` and holds an exclusive `flock` on it until the run ends:

- the file says who owns the folder (host, pid, start time, command), for the refusal message;
- the kernel drops the flock when the owner dies, however it dies (SIGKILL, OOM kill), so a lock
  file whose flock can be taken, written on this host, was left by a dead run: it is taken over
  with a printed note, and the next attempt resumes from `last.pth` as before;
- a lock written on another host (shared storage) is never taken over automatically, since that
  host's processes cannot be seen from here; the message says how to break it by hand.

The lock is removed when the run ends, also on an exception or SIGTERM (`exit_on_sigterm`).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from dfine_deploy.errors import TrainingError

LOCK_NAME = ".dfine-run.lock"


class RunLock:
    """The lock on one output folder. `acquire` checks the folder (a folder, writable), creates it if
    needed and takes the lock; `release` removes the lock, and the folder too when this run created
    it and left nothing in it (a run refused before it started leaves no empty folder behind)."""

    def __init__(self, folder: str | os.PathLike, *, flag: str = "--output-dir"):
        # a link (runs/current) is followed: its folder, made when missing, is the run's
        self.folder = Path(os.path.realpath(folder)) if os.path.islink(folder) else Path(folder)
        self.path = self.folder / LOCK_NAME
        self.flag = flag
        self._fd: int | None = None
        self._created: list[Path] = []  # folders this run made, innermost first

    def acquire(self, note: Callable[[str], None] = print) -> None:
        """Take the lock or raise TrainingError in one line; `note` prints a take-over."""
        self._make_folder()
        try:
            while True:
                fd = self._open()
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError as exc:
                    owner = _read_owner(fd)
                    os.close(fd)
                    if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                        raise TrainingError(self._held_message(owner)) from None
                    raise TrainingError(f"{self.path}: cannot lock ({exc.strerror})") from None
                if _same_file(fd, self.path):
                    break
                os.close(fd)  # the previous owner removed the file while we waited: open it anew
            previous = _read_owner(fd)
            if previous and previous.get("host") != socket.gethostname():
                os.close(fd)
                raise TrainingError(self._held_message(previous))
            if previous:
                note(
                    f"note: {self.path} was left by pid {previous.get('pid')} on this host, which is "
                    f"no longer running (started {previous.get('started', '?')}); taking the folder over"
                )
            _write_owner(fd)
            self._fd = fd
        except BaseException:
            self._remove_created()
            raise

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            os.close(self._fd)  # drops the flock
            self._fd = None
        self._remove_created()

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    # -- the pieces -------------------------------------------------------------------------------
    def _make_folder(self) -> None:
        """Create the folder (recording which levels were new); refuse a file or a read-only place."""
        if self.folder.exists() and not self.folder.is_dir():
            raise TrainingError(f"{self.flag} {self.folder}: is a file, not a folder; give a folder path")
        missing = []
        for level in (self.folder, *self.folder.parents):
            if level.exists():
                break
            missing.append(level)
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise TrainingError(
                f"{self.flag} {self.folder}: cannot create it ({exc.strerror}); give a folder you can write"
            ) from None
        self._created = missing

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise TrainingError(
                f"{self.flag} {self.folder}: cannot write there ({exc.strerror}); give a folder you can write"
            ) from None

    def _held_message(self, owner: dict[str, Any]) -> str:
        host, pid = owner.get("host", "?"), owner.get("pid", "?")
        since = owner.get("started", "?")
        if host == socket.gethostname():
            return (
                f"{self.flag} {self.folder} is in use by another run (pid {pid} on this host, started "
                f"{since}): wait for it to end or stop it, or give another {self.flag}"
            )
        return (
            f"{self.flag} {self.folder} is in use by a run on host {host} (pid {pid}, started {since}); "
            f"wait for it to end, or give another {self.flag}. If that run is gone (its host crashed), "
            f"remove {self.path} and start again"
        )

    def _remove_created(self) -> None:
        for level in self._created:  # innermost first; rmdir refuses anything not empty
            try:
                level.rmdir()
            except OSError:
                break
        self._created = []


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _read_owner(fd: int) -> dict[str, Any]:
    """What the lock file says about its owner ({} when empty or unreadable)."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        data = json.loads(os.read(fd, 65536) or b"{}")
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _write_owner(fd: int) -> None:
    owner = {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "command": " ".join(sys.argv),
    }
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps(owner) + "\n").encode())
    os.fsync(fd)


@contextlib.contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """Turn SIGTERM (what torchrun, Kubernetes and `kill` send) into SystemExit(143) while the block
    runs, so that `finally` blocks run: the lock is removed and the log closed. Checkpoint writes are
    atomic, so an exit in the middle of one keeps the previous file. Outside the main thread (where
    Python cannot take signals) it does nothing."""
    try:
        previous = signal.signal(signal.SIGTERM, _raise_exit)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        _TERMINATED.clear()


_TERMINATED: list[int] = []  # the SIGTERM taken, should its SystemExit be dropped (`exit_if_terminated`)


def _raise_exit(signum: int, frame: object) -> None:
    _TERMINATED.append(signum)
    raise SystemExit(128 + signum)


def exit_if_terminated() -> None:
    """Raise again the SystemExit of a SIGTERM whose handler ran where Python drops exceptions (a
    weakref callback or a `__del__`, such as importlib's module-lock cleanup prints "Exception ignored
    in ..."): the run went on to its end instead. The training and validation loops call it once a
    step."""
    if _TERMINATED:
        raise SystemExit(128 + _TERMINATED[0])
