"""Image files that readers get wrong, each beside the pixels a viewer shows for it.

The expected pixels are made with numpy from the arrays written, never by the reader under test;
`stored_for` undoes an EXIF orientation the way the EXIF standard defines it (orientation 6: the
viewer turns the stored pixels 90 degrees clockwise).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
from PIL import Image

ORIENTATION_TAG = 0x0112
BLOCK = 8  # flat 8x8 blocks keep JPEG's loss small and every orientation distinguishable


def pattern(rows: int = 4, cols: int = 6, seed: int = 0) -> np.ndarray:
    """[rows*8, cols*8, 3] uint8 RGB: flat blocks of distinct colours, so no turn or mirror maps it
    onto itself."""
    rng = np.random.default_rng(seed)
    colours = rng.permutation(256)[: rows * cols * 3].reshape(rows, cols, 3).astype(np.uint8)
    return np.kron(colours, np.ones((BLOCK, BLOCK, 1), dtype=np.uint8))


def stored_for(shown: np.ndarray, orientation: int) -> np.ndarray:
    """The stored pixels that a viewer shows as `shown` under EXIF `orientation` (1..8)."""
    undo = {
        1: lambda a: a,
        2: lambda a: a[:, ::-1],
        3: lambda a: a[::-1, ::-1],
        4: lambda a: a[::-1],
        5: lambda a: a.transpose(1, 0, *range(2, a.ndim)),
        6: lambda a: np.rot90(a, 1),  # shown = stored turned clockwise: stored = shown turned back
        7: lambda a: np.rot90(a, 2).transpose(1, 0, *range(2, a.ndim)),
        8: lambda a: np.rot90(a, -1),
    }[orientation]
    return np.ascontiguousarray(undo(shown))


def exif_bytes(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[ORIENTATION_TAG] = orientation
    return exif.tobytes()


def write_oriented(path: Path, shown: np.ndarray, orientation: int) -> Path:
    """A file (JPEG or PNG by suffix) that a viewer shows as `shown` (RGB, or 16-bit gray)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    extra = {
        ".jpg": {"quality": 95, "subsampling": 0},
        ".webp": {"lossless": True},
    }.get(path.suffix.lower(), {})
    Image.fromarray(stored_for(shown, orientation)).save(path, exif=exif_bytes(orientation), **extra)
    return path


@dataclass
class Case:
    """A file and what a viewer shows: `expected` RGB uint8 [H, W, 3]; `tolerance` the mean absolute
    difference JPEG's loss allows (0: lossless, exact)."""

    name: str
    path: Path
    expected: np.ndarray
    tolerance: float
    exif: bool = False  # carries an orientation other than 1
    wide: bool = False  # 16-bit samples
    alpha: bool = False
    converted: bool = False  # stored colours are not RGB


def _gray3(gray: np.ndarray) -> np.ndarray:
    return np.repeat(gray[:, :, None], 3, axis=2)


CASE_NAMES = [f"exif{o}" for o in range(1, 9)] + [
    "gray16",
    "rgb16",
    "gray16_exif6",
    "palette",
    "palette_transparent",
    "cmyk",
    "gray_jpeg",
    "gray_png",
    "rgba",
    "la",
    "webp_exif8",
    "tiff_exif5",
    "exif_out_of_range",
]


def write_cases(folder: Path) -> list[Case]:
    """Every kind of file the reading policy names, written into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    shown = pattern()
    cases = [
        Case(f"exif{o}", write_oriented(folder / f"exif{o}.jpg", shown, o), shown, 3.0, exif=o != 1)
        for o in range(1, 9)
    ]
    ramp = (np.arange(32 * 48).reshape(32, 48) * 42).astype(np.uint16)  # 0 .. 64470
    ramp[0, :4] = (255, 256, 65280, 65535)  # high bytes 0, 1, 255, 255: no clipping, no stretching
    assert cv2.imwrite(str(folder / "gray16.png"), ramp)
    high = _gray3((ramp >> 8).astype(np.uint8))
    cases.append(Case("gray16", folder / "gray16.png", high, 0, wide=True, converted=True))
    bgr16 = np.stack([ramp, ramp[::-1], 65535 - ramp], axis=2)
    assert cv2.imwrite(str(folder / "rgb16.png"), bgr16)  # OpenCV writes its BGR arrays as RGB files
    cases.append(Case("rgb16", folder / "rgb16.png", (bgr16[:, :, ::-1] >> 8).astype(np.uint8), 0, wide=True))
    write_oriented(folder / "gray16_exif6.png", ramp, 6)
    turned = Case("gray16_exif6", folder / "gray16_exif6.png", high, 0, exif=True, wide=True, converted=True)
    cases.append(turned)
    indices = (np.arange(32 * 48).reshape(32, 48) % 5).astype(np.uint8)
    palette = np.array([[255, 0, 0], [0, 128, 0], [0, 0, 255], [250, 250, 250], [10, 20, 30]], np.uint8)
    for name, transparency in (("palette", None), ("palette_transparent", 0)):
        img = Image.frombytes("P", (48, 32), indices.tobytes())
        img.putpalette(palette.reshape(-1).tolist())
        img.save(folder / f"{name}.png", **({} if transparency is None else {"transparency": transparency}))
        cases.append(
            Case(
                name,
                folder / f"{name}.png",
                palette[indices],
                0,
                alpha=transparency is not None,
                converted=True,
            )
        )
    Image.fromarray(shown).convert("CMYK").save(folder / "cmyk.jpg", quality=95)
    cases.append(Case("cmyk", folder / "cmyk.jpg", shown, 3.0, converted=True))
    gray = shown[:, :, 1]
    Image.fromarray(gray).save(folder / "gray.jpg", quality=95)
    cases.append(Case("gray_jpeg", folder / "gray.jpg", _gray3(gray), 3.0, converted=True))
    Image.fromarray(gray).save(folder / "gray.png")
    cases.append(Case("gray_png", folder / "gray.png", _gray3(gray), 0, converted=True))
    alpha = (np.arange(32 * 48).reshape(32, 48, 1) % 256).astype(np.uint8)  # 0 (transparent) .. 255
    Image.fromarray(np.concatenate([shown, alpha], axis=2)).save(folder / "rgba.png")
    cases.append(Case("rgba", folder / "rgba.png", shown, 0, alpha=True))
    Image.fromarray(np.concatenate([gray[:, :, None], alpha], axis=2)).save(folder / "la.png")  # LA
    cases.append(Case("la", folder / "la.png", _gray3(gray), 0, alpha=True, converted=True))
    for name, file, orientation in (("webp_exif8", "p.webp", 8), ("tiff_exif5", "p.tiff", 5)):
        cases.append(Case(name, write_oriented(folder / file, shown, orientation), shown, 0, exif=True))
    Image.fromarray(shown).save(folder / "bad.jpg", exif=exif_bytes(9), quality=95, subsampling=0)
    cases.append(Case("exif_out_of_range", folder / "bad.jpg", shown, 3.0))  # 9 is no orientation
    assert [c.name for c in cases] == CASE_NAMES
    return cases


def close_enough(case: Case, pixels: np.ndarray) -> bool:
    """Same shape, and within the case's tolerance of what a viewer shows."""
    if pixels.shape != case.expected.shape or pixels.dtype != np.uint8:
        return False
    return float(np.abs(pixels.astype(np.int16) - case.expected).mean()) <= case.tolerance


# ---------------------------------------------------------------------------- scenes with objects

COLOURS = {"red": (230, 30, 30), "blue": (30, 30, 230)}  # one flat colour per class
SCENE_SIZE = (96, 64)  # (w, h) as shown


def scene(index: int) -> tuple[np.ndarray, list[tuple[str, list[float]]]]:
    """A [64, 96, 3] RGB scene on grey: a red and a blue rectangle placed by `index` (8-pixel grid);
    returns (pixels, [(class name, xyxy box), ...]) in the image as shown."""
    w, h = SCENE_SIZE
    pixels = np.full((h, w, 3), 110, dtype=np.uint8)
    red = (8 * (index % 3), 8 * (index % 4), 24 + 8 * (index % 2), 16)  # x, y, w, h: left half
    blue = (48 + 8 * ((index + 1) % 2), 8 * ((index + 2) % 3), 24, 24)  # right half: never overlaps
    objects = []
    for name, (x, y, bw, bh) in zip(COLOURS, (red, blue)):
        pixels[y : y + bh, x : x + bw] = COLOURS[name]
        objects.append((name, [float(x), float(y), float(x + bw), float(y + bh)]))
    return pixels, objects


def find_boxes(rgb: np.ndarray) -> list[tuple[str, list[float]]]:
    """A perfect detector for `scene`s: the box around each class's colour in these pixels."""
    found = []
    for name, colour in COLOURS.items():
        near = np.abs(rgb.astype(np.int16) - np.array(colour)).max(axis=2) < 60
        ys, xs = np.nonzero(near)
        if len(xs):
            found.append((name, [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]))
    return found
