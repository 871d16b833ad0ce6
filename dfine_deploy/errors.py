"""One exception hierarchy for everything a user can get wrong.

    DfineError                      base: CLIs print it without a traceback and exit 2
    ├── ConfigError                 a YAML key, value or include is wrong
    ├── DatasetError                images or annotations are missing, corrupt or inconsistent
    │   └── ImageError              an image file cannot be read (no image, damaged, refused mode)
    ├── CheckpointError             a weights file is unreadable, truncated or for another model
    ├── ModelError                  a model name, size or input size cannot be built
    ├── ExportError                 an artifact cannot be made or is refused
    │   └── ParityError             the exported graph disagrees with PyTorch
    ├── BackendError                an inference backend is missing or cannot run the artifact
    ├── BenchError                  a benchmark request cannot be measured as asked
    ├── ServeError                  a server setting or stream request is invalid
    ├── TrainingError               training cannot go on (non-finite losses, bad resume state)
    ├── OwnershipError              a file or folder to replace or delete was not written by us
    └── MissingDependency           an optional extra is not installed (says which to install)

Every message says what was expected, what arrived, and what to do about it.
"""

from __future__ import annotations


class DfineError(Exception):
    """Base class: an error caused by user input or environment, never a bug."""


class ConfigError(DfineError):
    pass


class DatasetError(DfineError):
    pass


class ImageError(DatasetError):
    """An image file that `dfine_deploy.images` cannot read: `reason` is the short cause, `corrupt`
    tells damaged data (truncated, bad chunks) from a file that is no image it reads."""

    def __init__(self, name: str, reason: str, *, corrupt: bool):
        super().__init__(f"cannot read image {name}: {reason}; check the data with dfine-data validate")
        self.reason = reason
        self.corrupt = corrupt


class CheckpointError(DfineError):
    pass


class ModelError(DfineError):
    pass


class ExportError(DfineError):
    pass


class ParityError(ExportError):
    pass


class BackendError(DfineError):
    pass


class BenchError(DfineError):
    pass


class ServeError(DfineError):
    pass


class StreamLimit(ServeError):
    """The server already runs its maximum number of streams."""


class DuplicateStream(ServeError):
    """A stream of that name exists."""


class Overloaded(ServeError):
    """Too many requests are waiting for the detector."""


class TrainingError(DfineError):
    pass


class OwnershipError(DfineError):
    """Raised instead of replacing or deleting what a command did not write (dfine_deploy/ownership.py)."""


class MissingDependency(DfineError):
    """Raised instead of ImportError for optional extras."""

    def __init__(self, module: str, extra: str, purpose: str, install: str = ""):
        install = install or f"pip install -e '.[{extra}]'"
        super().__init__(
            f"{purpose} needs the Python package '{module}', which is not installed. "
            f"Install it with: {install}"
        )
        self.module = module
        self.extra = extra


def require(module: str, extra: str, purpose: str):
    """Import an optional dependency or raise MissingDependency with an install hint."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependency(module, extra, purpose) from exc
