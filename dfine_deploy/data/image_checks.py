"""The image files of a dataset, checked with the one reader (`dfine_deploy.images`).

`inspect_all` reads every header (and decodes where asked or where the end is missing);
`note_conversions` counts what the reading policy changes in a file (orientation, bit depth, alpha,
colour mode); `match_size` settles the annotations' width/height against the image as shown,
including sizes that fit only the stored pixels of a turned photo. `act(problem, where)` is the
validation's own: it counts the problem under its policy and returns the action.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import unquote

from dfine_deploy.cores import usable_cores
from dfine_deploy.errors import ImageError
from dfine_deploy.images import ORIENTATIONS, ImageInfo, probe_image, read_image

Act = Callable[[str, str], str]


def inspect_image(path: Path, level: str = "header") -> tuple[str | None, ImageInfo | None, str]:
    """Check one image file with the one reader (dfine_deploy.images). Returns (problem or None,
    what its header says or None, detail)."""
    if not path.is_file():
        return "missing_image", None, _backslash_hint(path)
    try:
        info = probe_image(path)
        if level == "decode" or (level == "header" and not _end_marker_ok(path, info.format)):
            # A missing end marker is a fast hint; only a full decode proves the damage.
            read_image(path)
    except ImageError as exc:
        return ("corrupt_image" if exc.corrupt else "unreadable_image"), None, exc.reason
    return None, info, ""


def _backslash_hint(path: Path) -> str:
    """A json written on Windows may part folders with a backslash: say so, and where '/' finds the
    file when it does (every reader's missing_image comes here)."""
    if "\\" not in path.name:
        return ""
    slashed = Path(str(path).replace("\\", "/"))
    found = f" ({slashed} exists)" if slashed.is_file() else ""
    return f"the json parts folders with '\\'; write '/'{found}"


# Label Studio's server paths of an image: an upload (`/data/upload/<project>/<8 hex>-<name>`) or a
# local-storage file (`/data/local-files/?d=<path>`); the export lists them where it has no copy
LABEL_STUDIO_PATH = re.compile(r"^/?data/(?:upload/\d+/|local-files/\?d=)(?P<path>.+)$")
UPLOAD_TAG = re.compile(r"^[0-9a-f]{8}-(?P<name>.+)$")  # the tag Label Studio puts before an upload


def located_name(folder: Path, name: str) -> tuple[str, str | None]:
    """The name under `folder` that a json's file name means, and the problem of validation.py that
    reading it so is (None: as written). A URL-encoded name (`a%20b.jpg`) whose decoded name is
    the file: `url_encoded_name`. A Label Studio server path: the file of its name in the folder
    (as uploaded, with its tag, or as the user had it, without): `server_path`."""
    if "%" not in name and not LABEL_STUDIO_PATH.match(name):
        return name, None
    if (folder / name).is_file():
        return name, None
    decoded = unquote(name)
    if decoded != name and (folder / decoded).is_file():
        return decoded, "url_encoded_name"
    server = LABEL_STUDIO_PATH.match(decoded)
    if server:
        base = PurePosixPath(server["path"]).name
        untagged = UPLOAD_TAG.match(base)
        for candidate in (base, untagged["name"] if untagged else None):
            if candidate and (folder / candidate).is_file():
                return candidate, "server_path"
    return name, None


# how many of a json's first file names choose its image folder (`folder_of_names`)
NAMES_SAMPLED = 50


def folder_of_names(images: Any, folders: tuple[Path, ...]) -> Path:
    """Of `folders`, the one under which most of the first file names of a COCO `images` list are
    found, as written or with '/' for a Windows '\\' (which validation then hints): a json beside an
    `images/` folder may name `a.jpg` (in it) or `images/a.jpg` (beside it). The first on a tie."""
    entries = images[:NAMES_SAMPLED] if isinstance(images, list) else []
    names = [e["file_name"] for e in entries if isinstance(e, dict) and isinstance(e.get("file_name"), str)]

    def found(folder: Path) -> int:
        return sum(
            (folder / located_name(folder, n)[0]).is_file() or (folder / n.replace("\\", "/")).is_file()
            for n in names
        )

    return max(folders, key=found)


def _end_marker_ok(path: Path, fmt: str | None) -> bool:
    """JPEG ends with FFD9, PNG with the IEND chunk; other formats are not checked here."""
    if fmt not in ("JPEG", "PNG"):
        return True
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - 64))
        tail = fh.read().rstrip(b"\x00\r\n ")
    if fmt == "JPEG":
        return tail.endswith(b"\xff\xd9")
    return tail.endswith(b"IEND\xaeB`\x82")


def inspect_all(paths: list[Path], level: str) -> list[tuple[str | None, ImageInfo | None, str]]:
    """`inspect_image` of every path at `level` (none: nothing read), in order, over a few threads."""
    if level == "none":
        return [(None, None, "")] * len(paths)
    from tqdm import tqdm

    workers = min(8, usable_cores() * 2)  # mostly file I/O: threads overlap it
    with ThreadPoolExecutor(max_workers=workers) as pool:
        checks = pool.map(lambda p: inspect_image(p, level), paths)
        # a bar only where it helps: big datasets on a terminal (disable=None hides it elsewhere)
        bar = tqdm(
            checks,
            total=len(paths),
            desc="checking images",
            unit="img",
            disable=None if len(paths) > 2000 else True,
        )
        found = list(bar)
    listings: dict[Path, dict[str, str]] = {}
    return [
        (problem, info, detail or _case_hint(path, listings))
        if problem == "missing_image"
        else (problem, info, detail)
        for path, (problem, info, detail) in zip(paths, found)
    ]


def _case_hint(path: Path, listings: dict[Path, dict[str, str]]) -> str:
    """A file named in the annotations that is on disk in other letter case (000001.jpg, 000001.JPG):
    Windows and macOS do not tell them apart, Linux does. `listings` keeps each folder's names."""
    if path.parent not in listings:
        try:
            listings[path.parent] = {p.name.lower(): p.name for p in path.parent.iterdir()}
        except OSError:
            listings[path.parent] = {}
    actual = listings[path.parent].get(path.name.lower())
    if actual is None:
        return ""
    return (
        f"on disk it is {actual}: the names differ in letter case, which Linux tells apart; rename the "
        "file or correct the name in the annotations"
    )


def note_conversions(image: ImageInfo, path: Path, act: Act) -> None:
    """Count what the reader changes in this file: orientation, bit depth, alpha, colour mode, frames."""
    if image.orientation != 1:
        act("exif_orientation", f"{path}: orientation {image.orientation}, {ORIENTATIONS[image.orientation]}")
    if image.bits > 8:
        act("high_bit_depth", f"{path}: {image.bits}-bit {image.mode}")
    if image.alpha:
        act("alpha_channel", f"{path}: {image.mode}")
    if image.converted_mode:
        act("converted_mode", f"{path}: {image.mode}")
    if image.frames > 1:
        act("multi_frame", f"{path}: {image.frames} frames in a {image.format}")


def match_size(info: dict[str, Any], image: ImageInfo, path: Path, act: Act) -> bool:
    """Settle the image's width/height against the file (the image as shown); False: skip the image.

    Sizes that fit only the stored pixels of a turned image mean the boxes were drawn on those
    pixels; `fix` records the turn in info["turn"] for the boxes to follow."""
    declared = (info["width"], info["height"])
    shown, stored = image.size, image.stored_size
    if None in declared or declared == shown:  # left out of the json: the file's
        if None not in declared and shown != stored:
            act(
                "size_as_shown",
                f"{path}: json says {shown[0]}x{shown[1]}, the image as shown; stored "
                f"{stored[0]}x{stored[1]} with EXIF orientation {image.orientation}",
            )
        info["width"], info["height"] = shown
        return True
    said = f"{path}: json says {declared[0]}x{declared[1]}"
    if declared == stored:
        action = act(
            "size_as_stored",
            f"{said}, the stored pixels; viewers show {shown[0]}x{shown[1]} "
            f"({ORIENTATIONS[image.orientation]}, EXIF orientation {image.orientation})",
        )
        if action == "fix":
            info["width"], info["height"] = shown
            info["turn"] = (image.orientation, stored)
        return action != "skip"
    turned = ""
    if shown != stored:
        turned = f" ({stored[0]}x{stored[1]} stored, EXIF orientation {image.orientation})"
    if act("size_mismatch", f"{said}, file is {shown[0]}x{shown[1]}{turned}") == "fix":
        info["width"], info["height"] = shown
    return True
