"""What every console script shares: error reporting and the one way to name a model."""

from __future__ import annotations

import functools
import sys
from typing import Callable, Sequence

from dfine_deploy.errors import DfineError

MODEL_HELP = (
    "a size name (dfine-n, dfine-s, dfine-m, dfine-l, dfine-x: random weights), "
    "a config file (.yml), or a checkpoint (.pth)"
)


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
