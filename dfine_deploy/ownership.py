"""Folders we own: a command replaces or deletes only what it wrote.

Every writer describes what it writes as a `Claim`: the marker file that shows a folder is its own
(an artifact's model.json, a synthetic split's annotations.json, ...), how to tell that marker from a
stranger's file of the same name, and the paths it writes. Before it touches a folder it asks
`claim_folder`:

    missing or empty                          free: write it
    our marker, and nothing we did not write  ours: replace it (with --force where the command asks)
    anything else                             refused, in one line that names what is in the way

A refusal never suggests deleting anything, nor a flag that would: the way out is another folder.

A command that writes a folder whole does it `with replacing(target, claim, ...) as staging:` the
claim above, then work in a hidden sibling named after the target and the writer's pid, swapped in
whole when the block ends and removed when it fails. Before that, `sweep_leftovers` removes the
siblings a killed run left behind when they hold only what the writer writes, leaves any other, and
says which in one line each. Torch-free: the runtime's writers use it too.
"""

from __future__ import annotations

import contextlib
import fnmatch
import glob
import logging
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dfine_deploy.errors import DfineError, OwnershipError

log = logging.getLogger(__name__)

# files.atomic_write's temporary files (".NAME.XXXX.tmp"), left by a process killed mid-write
_TEMP_PATTERN = ".*.tmp"
# ".staging-PID-XXXX" / ".old-PID-XXXX" after ".TARGET"; earlier versions wrote ".staging-XXXX", ".old-PID"
_LEFTOVER = re.compile(r"\.(staging|old)-(?:(?P<pid>\d+)(?:-|$))?")
_SHOWN = 3  # names a message lists before "and N more"


def _lists_nothing(marker: Path) -> Iterable[str]:
    return ()


@dataclass(frozen=True)
class Claim:
    """What one command writes in a folder of its own."""

    command: str  # who writes, as the user types it: "dfine-export"
    kind: str  # what it writes, with its article: "an artifact folder"
    markers: tuple[str, ...]  # files (relative paths), any of which shows a folder is ours: "model.json"
    patterns: tuple[str, ...] = ()  # fnmatch patterns of every relative path it writes
    recognise: Callable[[Path], bool] = Path.is_file  # given a marker's path: did we write it?
    listed: Callable[[Path], Iterable[str]] = _lists_nothing  # more paths our marker says we wrote

    def marker(self, folder: Path) -> Path | None:
        """The first of our markers in `folder` that `recognise` accepts."""
        for name in self.markers:
            path = folder / name
            try:
                if path.is_file() and self.recognise(path):
                    return path
            except (OSError, ValueError):
                continue
        return None

    def is_ours(self, folder: Path) -> bool:
        return self.marker(folder) is not None

    def foreign(self, folder: Path) -> list[str]:
        """Relative paths under `folder` this command does not write (a folder counts when empty)."""
        marker = self.marker(folder)
        listed = set(self.listed(marker)) if marker is not None else set()
        unreadable: list[str] = []
        found = []
        for root, dirs, files in os.walk(folder, onerror=lambda exc: unreadable.append(exc.filename)):
            here = Path(root).relative_to(folder)
            links = [d for d in dirs if (Path(root) / d).is_symlink()]  # not followed: judged by name
            for name in (*files, *links):
                rel = (here / name).as_posix()
                if not self._writes(rel, listed):
                    found.append(rel)
            if not dirs and not files and here != Path(".") and not self._writes(here.as_posix(), listed):
                found.append(f"{here.as_posix()}/")
        found += [f"{Path(p).relative_to(folder).as_posix()}/ (unreadable)" for p in unreadable]
        return sorted(found)

    def _writes(self, rel: str, listed: set[str]) -> bool:
        if rel in listed or fnmatch.fnmatchcase(PurePosixPath(rel).name, _TEMP_PATTERN):
            return True
        return any(fnmatch.fnmatchcase(rel, p) for p in (*self.markers, *self.patterns))

    @property
    def what(self) -> str:
        return f"{self.kind} written by {self.command}"


def _some(names: list[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")


def check_writable_place(
    folder: str | os.PathLike, where: str, error: type[DfineError] = OwnershipError
) -> None:
    """Refuse, before any work, a place where nothing can be written: a file standing where a folder
    is needed (`out.txt/run`), or a folder the system refuses even to root (`/proc`, `/sys`, a
    read-only mount). The nearest folder that exists gets a nameless trial file, gone when closed,
    so that the answer is the file system's own and nothing is left behind."""
    folder = Path(folder)
    existing = next((p for p in (folder, *folder.parents) if p.exists()), Path("."))
    if not existing.is_dir():
        raise error(f"{where}: cannot write there: {existing} is a file, not a folder; choose another folder")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        raise error(
            f"{where}: cannot write in {existing} ({exc.strerror or exc}); choose another folder"
        ) from None


def claim_folder(
    folder: str | os.PathLike,
    claim: Claim,
    *,
    option: str,
    force: bool | None = None,
    replaces: bool = True,
    error: type[DfineError] = OwnershipError,
) -> bool:
    """Check, before any work, that `claim.command` may write `folder` (named on the command line by
    `option`, e.g. "-o"). Returns True when it holds an earlier output of ours, False when it is new
    or empty. `force`: the command's --force, or None where replacing its own output needs no flag.
    `replaces`: the command swaps the whole folder; False for one that only adds and rewrites its own
    files (a training run), where files of others are never touched and so need not be refused.
    Raises OwnershipError for anything else; `error` for a place where nothing can be written. A link
    is judged by the folder it points to (made when missing), which is where the command writes."""
    where = f"{option} {folder}".strip()
    folder = Path(os.path.realpath(folder)) if os.path.islink(folder) else Path(folder)
    if not folder.exists() and not folder.is_symlink():
        check_writable_place(folder, where, error)
        return False
    if not folder.is_dir():
        raise OwnershipError(f"{where}: exists and is not a folder; choose a new or empty folder")
    try:  # what a write killed half-way leaves (atomic_write's temporary files) does not count
        entries = sorted(p.name for p in folder.iterdir() if not fnmatch.fnmatchcase(p.name, _TEMP_PATTERN))
    except OSError as exc:
        raise OwnershipError(
            f"{where}: cannot be read ({exc.strerror or exc}); choose another folder"
        ) from None
    if not entries:
        return False
    if not claim.is_ours(folder):
        raise OwnershipError(
            f"{where}: is not {claim.what} (it holds {_some(entries)} and no {claim.markers[0]} of ours); "
            f"{claim.command} writes only into a new or empty folder or over its own output: "
            "choose another folder"
        )
    foreign = claim.foreign(folder) if replaces else []
    if foreign:
        raise OwnershipError(
            f"{where}: is {claim.what}, but it also holds {len(foreign)} "
            f"entr{'y' if len(foreign) == 1 else 'ies'} {claim.command} did not write "
            f"({_some(foreign)}), which replacing it would lose: choose another folder"
        )
    if force is False:
        raise OwnershipError(
            f"{where}: holds {claim.what}; pass --force to replace it, or choose another folder"
        )
    return True


def claim_file(
    path: str | os.PathLike, *, command: str, kind: str, recognise: Callable[[Path], bool], option: str
) -> bool:
    """`claim_folder` for one file `command` rewrites (`kind`: "a JSON report"): True when `recognise`
    reads it as an earlier output of ours, False when it is missing or empty; else OwnershipError."""
    path = Path(path)
    where = f"{option} {path}".strip()
    check_writable_place(path.parent, where)
    if not path.exists() and not path.is_symlink():
        return False
    if not path.is_file():
        raise OwnershipError(f"{where}: exists and is not a file; choose another file name")
    if path.stat().st_size == 0:
        return False
    try:
        ours = recognise(path)
    except (OSError, ValueError):
        ours = False
    if not ours:
        raise OwnershipError(
            f"{where}: is not {kind} written by {command}, and {command} replaces only its own: "
            "choose another file name"
        )
    return True


@contextlib.contextmanager
def replacing(
    target: str | os.PathLike,
    claim: Claim,
    *,
    option: str,
    force: bool | None = None,
    error: type[DfineError] = OwnershipError,
) -> Iterator[Path]:
    """Write the folder `target` whole: refuse it unless `claim_folder` allows, clear what a killed
    run left beside it, and yield an empty staging folder to fill; it becomes `target` when the block
    ends and is removed when the block raises. An unwritable place raises `error`.

    A link (`-o models/current`) is followed: the folder it points to is the one written, and the link
    stays. The block holds `writing_lock`, so a second writer of the same folder is refused at once."""
    given = Path(target)
    target = Path(os.path.realpath(given)) if given.is_symlink() else given
    with writing_lock(target, f"{option} {given}".strip()):
        claim_folder(target, claim, option=option, force=force, error=error)
        for line in sweep_leftovers(target, claim):
            log.info("%s", line)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            staging = target.with_name(f".{target.name}.staging-{os.getpid()}-{secrets.token_hex(4)}")
            staging.mkdir()  # the umask's mode, as a folder made by hand (mkdtemp's would be 0700)
        except OSError as exc:
            raise error(
                f"{option} {given}: cannot write there ({exc.strerror or exc}); the folder or its parent "
                "is read-only or missing: choose a writable folder"
            ) from exc
        try:
            yield staging
            _swap_in(staging, target)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise


@contextlib.contextmanager
def writing_lock(target: Path, where: str) -> Iterator[None]:
    """An exclusive flock on `.TARGET.lock` beside `target` while it is written: two commands started
    into one new folder would both stage it and the second swap would replace the first unasked (a
    training run's folder has its own lock inside, training/runlock.py). The kernel drops the flock
    when its holder dies, so a lock file a killed writer left is no obstacle."""
    import fcntl  # POSIX only, as the rest of the writers

    lock = target.with_name(f".{target.name}.lock")
    while True:
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # a place where nothing can be written: claim_folder names it
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            owner = os.read(fd, 64).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise OwnershipError(
                f"{where}: another process (pid {owner}) is writing this folder now; wait for it to "
                "finish, or choose another folder"
            ) from None
        with contextlib.suppress(OSError):
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                break
        os.close(fd)  # its holder removed the file as we opened it: take a new one
    try:
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                lock.unlink()
    finally:
        os.close(fd)


SHARED_FOLDER_MODE = 0o755
SHARED_FILE_MODE = 0o644


def share_folder(folder: Path) -> None:
    """Make `folder` and everything in it readable by every user (folders 0755, files 0644).

    For folders meant to be copied and read elsewhere, artifact folders: Frigate, Triton and
    DeepStream containers read them as another, non-root user. Our atomic writes create files 0600
    (`tempfile.mkstemp`, the right mode for checkpoints and logs, which stay as the umask and mkstemp
    make them), and a umask of 077 would make the folder 0700, so a plain copy was unreadable there.
    Links are left alone; an artifact holds no executables."""
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            path.chmod(SHARED_FOLDER_MODE if path.is_dir() else SHARED_FILE_MODE)


def _swap_in(staging: Path, target: Path) -> None:
    """Move the finished `staging` to `target`; an earlier `target` (checked to be ours) steps aside
    first and is removed only once the new one is in place."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}-{secrets.token_hex(4)}")
        os.replace(target, old)
    os.replace(staging, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _running(pid: int) -> bool:
    """Whether process `pid` lives (this one included: it may be writing that folder in another thread)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def sweep_leftovers(target: Path, claim: Claim) -> list[str]:
    """Remove the staging and swapped-out folders of `target` that a killed run of `claim.command`
    left beside it, when they hold only what it writes; returns one line for what was removed and one
    per folder left in place (another running process's, or holding files that are not ours)."""
    removed, kept = [], []
    try:
        siblings = sorted(target.parent.glob(f".{glob.escape(target.name)}.*-*"))
    except OSError:
        return []
    for path in siblings:
        match = _LEFTOVER.match(path.name[len(target.name) + 1 :])
        if match is None or not path.is_dir() or path.is_symlink():
            continue
        if match["pid"] and _running(int(match["pid"])):
            kept.append(f"left {path}: process {match['pid']} is still writing it")
            continue
        foreign = claim.foreign(path)
        if foreign:
            kept.append(f"left {path}: it holds what {claim.command} does not write ({_some(foreign)})")
            continue
        shutil.rmtree(path, ignore_errors=True)
        if path.exists():
            kept.append(f"left {path}: it could not be removed (permissions?)")
        else:
            removed.append(path.name)
    lines = []
    if removed:
        lines.append(
            f"removed {len(removed)} folder(s) an interrupted {claim.command} left beside {target}: "
            + _some(removed)
        )
    return lines + kept
