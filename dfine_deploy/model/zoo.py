"""The official D-FINE checkpoints, by name: `dfine-s-coco` names `dfine_s_coco.pth` (torch-free).

One row per checkpoint the official model zoo lists (github.com/Peterande/D-FINE README.md at
commit 4a1f73a, "Model Zoo"). The code is Apache-2.0 (D-FINE's LICENSE); the files are release assets
of github.com/Peterande/storage, whose LICENSE is MIT: both allow commercial use (docs/models.md).
`dfine_deploy/hub/download.py` fetches a row's file into the cache and checks it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from dfine_deploy.errors import ModelError

__all__ = [
    "OFFICIAL_BASE_URL",
    "OFFICIAL_WEIGHTS",
    "WEIGHTS_URL_ENV",
    "OfficialWeights",
    "weights_home",
    "weights_key",
]

OFFICIAL_BASE_URL = "https://github.com/Peterande/storage/releases/download/dfinev1.0/"
# A mirror that holds the same file names (an offline network's web server) replaces the base URL.
WEIGHTS_URL_ENV = "DFINE_WEIGHTS_URL"
HOME_ENV = "DFINE_HOME"
COCO_CLASSES, OBJECTS365_CLASSES = 80, 366  # the official Objects365 head has one padding class


@dataclass(frozen=True)
class OfficialWeights:
    """One released checkpoint: what it is and where it comes from."""

    name: str  # dfine-s-coco
    size: str  # n .. x
    dataset: str  # what the weights were trained on, as the official table says
    ap: float  # the AP the official table links the file with (obj365 rows: first 5000 val images)
    file: str  # the release asset's file name
    num_classes: int
    sha256: str | None = None  # a published hash; none is published today (docs/models.md)

    @property
    def url(self) -> str:
        base = os.environ.get(WEIGHTS_URL_ENV) or OFFICIAL_BASE_URL
        parts = urlsplit(base)
        if parts.scheme not in ("http", "https", "file") or (parts.scheme != "file" and not parts.netloc):
            raise ModelError(
                f"{WEIGHTS_URL_ENV}={base!r} is not a URL to download weights from: give "
                f"https://HOST/PATH/ (a mirror of {OFFICIAL_BASE_URL}) or file:///FOLDER/, or unset it"
            )
        return base.rstrip("/") + "/" + self.file


def _row(size: str, kind: str, ap: float, file: str = "") -> OfficialWeights:
    dataset, classes = {
        "coco": ("COCO", COCO_CLASSES),
        "obj2coco": ("Objects365, then COCO", COCO_CLASSES),
        "obj365": ("Objects365", OBJECTS365_CLASSES),
        "obj365-e25": ("Objects365 (25 epochs)", OBJECTS365_CLASSES),
    }[kind]
    stem = f"dfine_{size}_{kind.replace('-', '_')}"
    return OfficialWeights(f"dfine-{size}-{kind}", size, dataset, ap, file or f"{stem}.pth", classes)


OFFICIAL_WEIGHTS: dict[str, OfficialWeights] = {
    row.name: row
    for row in (
        _row("n", "coco", 42.8),
        _row("s", "coco", 48.5),
        _row("m", "coco", 52.3),
        _row("l", "coco", 54.0),
        _row("x", "coco", 55.8),
        _row("s", "obj2coco", 50.7),
        _row("m", "obj2coco", 55.1),
        _row("l", "obj2coco", 57.3, "dfine_l_obj2coco_e25.pth"),  # the table links the E25 file
        _row("x", "obj2coco", 59.3),
        _row("s", "obj365", 30.5),
        _row("m", "obj365", 37.4),
        _row("l", "obj365", 40.6),
        _row("l", "obj365-e25", 42.6, "dfine_l_obj365_e25.pth"),
        _row("x", "obj365", 46.5),
    )
}


def weights_key(name: str) -> str | None:
    """'dfine-s-coco' for 'dfine-s-coco', 'dfine_s_coco' or 'DFINE-S-COCO'; None for other names."""
    key = name.strip().lower().replace("_", "-")
    return key if key in OFFICIAL_WEIGHTS else None


def weights_home() -> Path:
    """Where downloaded weights live: $DFINE_HOME/weights, default ~/.cache/dfine-deploy/weights
    (under $XDG_CACHE_HOME when set)."""
    home = os.environ.get(HOME_ENV)
    given = bool(home)
    if not home:
        cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        home = os.path.join(cache, "dfine-deploy")
    folder = Path(home).expanduser().absolute() / "weights"
    for place in (folder.parent, folder):
        if place.exists() and not place.is_dir():
            where = f"{HOME_ENV}={home!r}" if given else f"the weights cache {folder.parent}"
            raise ModelError(
                f"{where}: {place} is a file, not a folder; "
                + (f"point {HOME_ENV} at a folder, or unset it" if given else f"move it, or set {HOME_ENV}")
            )
    return folder
