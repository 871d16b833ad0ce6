"""How tests run export/jetson/build_engine.sh: this interpreter's python3 and this checkout first."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).parents[2]
SCRIPT = ROOT / "export" / "jetson" / "build_engine.sh"
GPU = "Fake T4:7.5"  # DFINE_TRT_GPU of the tests: the fake tensorrt's device (FAKE_GPU)


def script_env(
    version: str, *, gpu: str = GPU, path_first: Path | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a build_engine.sh run for TensorRT `version` on GPU `gpu` ("NAME:CC")."""
    dirs = [str(path_first)] if path_first else []
    dirs += [str(Path(sys.executable).parent), os.environ["PATH"]]
    return {
        **os.environ,
        **extra,
        "PATH": os.pathsep.join(dirs),
        "PYTHONPATH": str(ROOT),
        "DFINE_TRT_VERSION": version,
        "DFINE_TRT_GPU": gpu,
    }
