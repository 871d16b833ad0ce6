"""What every console script shares: error reporting and the one way to name a model."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Sequence

from dfine_deploy.errors import DfineError
from dfine_deploy.model.reference import TORCH_KINDS, model_ref_forms

# The model argument of the commands that build a PyTorch model (dfine_deploy/model/reference.py).
MODEL_HELP = model_ref_forms(TORCH_KINDS) + "; a size name has random weights"


SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left (`| head`)


def friendly_errors(main: Callable[[Sequence[str] | None], int | None]) -> Callable[..., int]:
    """Wrap a console script: user errors print one clear line and exit with status 2; a reader that
    leaves early (`dfine-info --print-config | head`) ends the command quietly, not with a traceback."""

    @functools.wraps(main)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        try:
            try:
                return main(argv) or 0
            finally:
                sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        except BrokenPipeError:
            _discard_stdout()
            return SIGPIPE_EXIT
        except DfineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper


def _discard_stdout() -> None:
    """Point stdout at /dev/null so that what is still buffered cannot fail again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (tests capturing it)
        pass
