"""The torch-free boundary of docs/ARCHITECTURE.md: these packages import no torch when imported.

Every module below them is imported (new ones are covered without editing this file), in a fresh
interpreter, and the first module that pulls torch in is named.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TORCH_FREE_PACKAGES = (
    "dfine_deploy.runtime",
    "dfine_deploy.bench",
    "dfine_deploy.serve",
    "dfine_deploy.config",
    "dfine_deploy.verify",
)
TORCH_FREE_MODULES = (
    "dfine_deploy",
    "dfine_deploy.artifact",
    "dfine_deploy.boxes",
    "dfine_deploy.class_names",
    "dfine_deploy.cli",
    "dfine_deploy.cpu",
    "dfine_deploy.errors",
    "dfine_deploy.files",
    "dfine_deploy.images",
    "dfine_deploy.ownership",
    "dfine_deploy.settings",
    "dfine_deploy.yaml_unique",
    "dfine_deploy.model",
    "dfine_deploy.hub.loader",
    "dfine_deploy.model.reference",
    "dfine_deploy.model.spec",
    "dfine_deploy.model.ecdet_spec",
    "dfine_deploy.data.classmap",
    "dfine_deploy.data.image_checks",
    "dfine_deploy.data.validation",
    "dfine_deploy.evaluation",
    "dfine_deploy.export.parity",
    "dfine_deploy.export.tensorrt",
    "dfine_deploy.runtime.tensorrt_plan",
    "dfine_deploy.export.tensorrt_verify",
)

PROBE = """
import importlib, json, pkgutil, sys
packages, modules = json.loads(sys.argv[1])
names = list(modules)
for package in packages:
    names.append(package)
    names += [m.name for m in pkgutil.walk_packages(importlib.import_module(package).__path__, package + ".")]
pulled = []
for name in names:
    before = "torch" in sys.modules
    importlib.import_module(name)
    if not before and "torch" in sys.modules:
        pulled.append(name)
print(json.dumps({"imported": len(names), "pulled_torch": pulled}))
"""


def test_the_runtime_side_imports_no_torch():
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps([TORCH_FREE_PACKAGES, TORCH_FREE_MODULES])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["imported"] > 40  # the walk found the modules, not just the package names
    pulled = report["pulled_torch"]
    assert pulled == [], f"these modules import torch at import time: {pulled}"
