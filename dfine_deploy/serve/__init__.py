"""Serving D-FINE on video streams and uploaded images: `create_app(settings)` and `dfine-serve`.

The server needs the `serve` extra (fastapi, uvicorn, prometheus-client, python-multipart, trackers);
names that need it are imported on first use, so a missing extra gives an install hint, not a traceback.
"""

from __future__ import annotations

from typing import Any

from dfine_deploy.errors import require
from dfine_deploy.serve.settings import (
    CountingLine,
    CountingZone,
    ServeSettings,
    StreamSpec,
    load_streams_file,
)
from dfine_deploy.serve.sources import SourceKind, StreamState

__all__ = [
    "CountingLine",
    "CountingZone",
    "DetectorLike",
    "ServeSettings",
    "SourceKind",
    "StreamPipeline",
    "StreamSpec",
    "StreamState",
    "create_app",
    "load_streams_file",
]

_NEEDS_EXTRA = {
    "create_app": "dfine_deploy.serve.app",
    "StreamPipeline": "dfine_deploy.serve.pipeline",
    "DetectorLike": "dfine_deploy.serve.pipeline",
}


def require_serve_extra() -> None:
    for module in ("fastapi", "uvicorn", "prometheus_client", "fastapi_offline"):
        require(module, "serve", "dfine-serve")


def __getattr__(name: str) -> Any:
    if name not in _NEEDS_EXTRA:
        raise AttributeError(f"module 'dfine_deploy.serve' has no attribute {name!r}")
    require_serve_extra()
    import importlib

    return getattr(importlib.import_module(_NEEDS_EXTRA[name]), name)
