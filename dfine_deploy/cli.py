"""What every console script shares: error reporting and the one way to name a model."""

from __future__ import annotations

import functools
import sys
from typing import Callable, Sequence

from dfine_deploy.errors import DfineError
from dfine_deploy.model.reference import TORCH_KINDS, model_ref_forms

# The model argument of the commands that build a PyTorch model (dfine_deploy/model/reference.py).
MODEL_HELP = model_ref_forms(TORCH_KINDS) + "; a size name has random weights"


def friendly_errors(main: Callable[[Sequence[str] | None], int | None]):
    """Wrap a CLI entry point: user errors print one clear line and exit with status 2."""

    @functools.wraps(main)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        try:
            return main(argv) or 0
        except DfineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper
