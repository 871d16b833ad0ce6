"""The D-FINE network (torch side): build it from a spec, run it, post-process, deploy.

The spec names import without torch (config and runtime code read them); the torch-side names
load on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from dfine_deploy.model.spec import SIZES, ModelSpec, size_spec

__all__ = ["DFINE", "SIZES", "DeployModel", "ModelSpec", "PostProcessor", "build_model", "size_spec"]

_LAZY = {
    "DFINE": "dfine_deploy.model.dfine",
    "DeployModel": "dfine_deploy.model.dfine",
    "build_model": "dfine_deploy.model.families",
    "PostProcessor": "dfine_deploy.model.postprocess",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'dfine_deploy.model' has no attribute '{name}'")
