"""Official weights by name (`model/zoo.py`): downloaded once into the cache, then read from there.

A download goes to `<file>.part` (resumed with an HTTP Range request when a cut transfer left one),
is checked (the published sha256 when the table has one; the names and shapes of the official model of
its size, so an HTML error page or another model never lands in the cache) and only then renamed into
place, so the cache never holds half a file. No hash is published for these files, so the hash of the
first download is written beside it (`<file>.sha256`), shown, and checked on every later use.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from dfine_deploy.errors import CheckpointError
from dfine_deploy.files import sha256_file
from dfine_deploy.model.zoo import HOME_ENV, OFFICIAL_WEIGHTS, OfficialWeights, weights_home, weights_key

__all__ = ["check_official_layout", "download", "fetch_weights", "recorded_sha256", "weights_path"]

CHUNK = 1 << 20
TIMEOUT_S = 30  # per socket operation: a stalled server ends the attempt, the .part stays


def fetch_weights(name: str, *, quiet: bool = False) -> Path:
    """The cached file of the official weights `name` names, downloaded first when absent."""
    key = weights_key(name)
    if key is None:
        raise CheckpointError(f"'{name}' is not an official checkpoint name: expected one of {_names()}")
    entry = OFFICIAL_WEIGHTS[key]
    path = weights_home() / entry.file
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        with _locked(path):  # torchrun's ranks start together: one downloads, the others wait
            if not path.is_file():
                _fetch(entry, path, quiet)
    _check_recorded(path, entry)
    return path


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `<file>.lock` beside the file (POSIX flock; elsewhere no lock)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with path.with_name(path.name + ".lock").open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _fetch(entry: OfficialWeights, path: Path, quiet: bool) -> None:
    """Download, check and move into place; the hash is recorded beside the file and shown."""
    download(entry.url, path, sha256=entry.sha256, quiet=quiet, hand_hint=_hand_hint(entry, path))
    try:
        check_official_layout(path.with_name(path.name + ".part"), entry)
    except CheckpointError:
        path.with_name(path.name + ".part").unlink(missing_ok=True)
        raise
    os.replace(path.with_name(path.name + ".part"), path)
    digest = sha256_file(path)
    record = _record_path(path)
    record.with_name(record.name + ".tmp").write_text(digest + "\n", encoding="utf-8")
    os.replace(record.with_name(record.name + ".tmp"), record)
    if not quiet:
        print(f"{entry.name}: saved {path} (sha256 {digest}, recorded in {record.name})", file=sys.stderr)


def weights_path(ref: str) -> str:
    """The cached file for an official weights name (fetched when absent); any other `ref` as given."""
    return str(fetch_weights(ref)) if weights_key(ref) is not None and not Path(ref).exists() else ref


def _names() -> str:
    return ", ".join(OFFICIAL_WEIGHTS)


def _record_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def recorded_sha256(path: Path) -> str | None:
    """The hash written beside a cached file when it was downloaded, if any."""
    record = _record_path(path)
    return record.read_text(encoding="utf-8").strip() if record.is_file() else None


def _check_recorded(path: Path, entry: OfficialWeights) -> None:
    """A cached file must still have the hash it was downloaded with (or the published one)."""
    expected = entry.sha256 or recorded_sha256(path)
    if expected is None:  # put there by hand: checked once, then recorded like a download
        check_official_layout(path, entry)
        _record_path(path).write_text(sha256_file(path) + "\n", encoding="utf-8")
        return
    found = sha256_file(path)
    if found != expected:
        source = "published" if entry.sha256 else f"recorded in {_record_path(path).name} at download"
        raise CheckpointError(
            f"{path}: sha256 {found} differs from the {source} {expected}: the file changed since; delete "
            f"it (and {_record_path(path).name}) to download {entry.name} again"
        )


def _hand_hint(entry: OfficialWeights, path: Path) -> str:
    return f"download it by hand and put it at {path} (or set {HOME_ENV} to another folder)"


def download(
    url: str, path: Path, *, sha256: str | None = None, quiet: bool = False, hand_hint: str = ""
) -> Path:
    """Fetch `url` into `path`.part, resuming a part left by a cut transfer; returns the part.

    A cut transfer keeps the part and says so; a hash that differs from `sha256` removes it."""
    part = path.with_name(path.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.is_file() else 0
    request = urllib.request.Request(url, headers={"User-Agent": "dfine-deploy"})
    if have:
        request.add_header("Range", f"bytes={have}-")
    try:
        response = urllib.request.urlopen(request, timeout=TIMEOUT_S)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # the part is already whole (or longer than the file): start over
            part.unlink()
            return download(url, path, sha256=sha256, quiet=quiet, hand_hint=hand_hint)
        raise CheckpointError(f"cannot download {url}: HTTP {exc.code} {exc.reason}; {hand_hint}") from None
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise CheckpointError(f"cannot download {url} ({reason}); {hand_hint}") from None
    with response:
        resumed = have and response.status == 206
        if not resumed:
            have = 0  # the server ignored the range: the whole file comes again
        length = response.headers.get("Content-Length")
        total = have + int(length) if length is not None else None
        _receive(response, part, have, total, url, quiet)
    received = part.stat().st_size
    if total is not None and received < total:
        raise CheckpointError(
            f"download of {url} cut at {received} of {total} bytes; run the command again to resume "
            f"(kept: {part}), or {hand_hint}"
        )
    if sha256 is not None:
        found = sha256_file(part)
        if found != sha256.lower():
            part.unlink()
            raise CheckpointError(
                f"{url}: downloaded file has sha256 {found}, expected {sha256}; it was removed. Run the "
                f"command again, or {hand_hint}"
            )
    return part


def _receive(response, part: Path, have: int, total: int | None, url: str, quiet: bool) -> None:
    """Append the body to `part` with a progress bar; a dropped connection keeps what arrived."""
    from tqdm import tqdm

    name = url.rsplit("/", 1)[-1]
    with (
        part.open("ab" if have else "wb") as out,
        tqdm(
            total=total,
            initial=have,
            unit="B",
            unit_scale=True,
            unit_divisor=1024,
            desc=name,
            disable=quiet,
            file=sys.stderr,
        ) as bar,
    ):
        try:
            while chunk := response.read(CHUNK):
                out.write(chunk)
                bar.update(len(chunk))
        except (OSError, http.client.HTTPException) as exc:  # a dropped or stalled connection
            bar.write(f"{name}: transfer stopped ({type(exc).__name__})")


def check_official_layout(path: Path, entry: OfficialWeights) -> None:
    """The file must hold the official model of the row's size and class count: the same tensor names
    and shapes (BatchNorm step counters aside, which frozen BatchNorm lacks)."""
    from dfine_deploy.model.families import build_model
    from dfine_deploy.model.spec import size_spec
    from dfine_deploy.model.weights import BATCHNORM_COUNTER, DERIVED_KEYS, load_checkpoint

    state_dict = load_checkpoint(path).state_dict
    model = build_model(size_spec(entry.size).with_classes(entry.num_classes))
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    found = {k: tuple(v.shape) for k, v in state_dict.items()}
    missing = [k for k in expected if k not in found and k not in DERIVED_KEYS]
    extra = [k for k in found if k not in expected]
    missing, extra = ([k for k in keys if not k.endswith(BATCHNORM_COUNTER)] for keys in (missing, extra))
    wrong = [
        f"{k} {list(found[k])} (official {list(v)})" for k, v in expected.items() if found.get(k, v) != v
    ]
    problems = []
    if missing:
        problems.append(f"{len(missing)} tensors missing ({', '.join(missing[:3])})")
    if extra:
        problems.append(f"{len(extra)} tensors the official model lacks ({', '.join(extra[:3])})")
    if wrong:
        problems.append(f"shapes differ: {', '.join(wrong[:3])}")
    if problems:
        raise CheckpointError(
            f"{path}: not the official {entry.name} ({entry.num_classes} classes, dfine-{entry.size}): "
            f"{'; '.join(problems)}; it was not kept. Check {entry.url}"
        )
