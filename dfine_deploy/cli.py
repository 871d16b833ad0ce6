"""What every console script shares: error reporting and the one way to name a model."""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import logging
import math
import os
import sys
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from dfine_deploy.errors import DfineError
from dfine_deploy.files import user_path
from dfine_deploy.model.reference import TORCH_KINDS, classify_model_ref, model_ref_forms

# The model argument of the commands that build a PyTorch model (dfine_deploy/model/reference.py).
MODEL_HELP = model_ref_forms(TORCH_KINDS) + "; a size name has random weights"


# Failures of the machine, not of the code: a full disk or quota, a read-only place. Where a command
# knows more (a checkpoint that was not replaced), it says so itself; this catches the other writes.
_ENVIRONMENT_ERRNOS = {
    errno.ENOSPC: "free space or choose another place, then run again",
    errno.EDQUOT: "free space or choose another place, then run again",
    errno.EFBIG: "raise the file size limit (ulimit -f) or choose another place",
    errno.EROFS: "choose another place",
    errno.EACCES: "check its permissions, or choose another place",
    errno.EPERM: "check its permissions, or choose another place",
}
SIGPIPE_EXIT = 141  # 128 + SIGPIPE: what a shell reports for a writer whose reader left (`| head`)


def friendly_errors(main: Callable[[Sequence[str] | None], int | None]) -> Callable[..., int]:
    """Wrap a console script: user errors print one clear line and exit with status 2; a reader that
    leaves early (`dfine-info --print-config | head`) ends the command quietly, not with a traceback."""

    @functools.wraps(main)
    def wrapper(argv: Sequence[str] | None = None) -> int:
        formatted = warnings.formatwarning
        warnings.formatwarning = _one_line_if_ours(formatted)
        try:
            try:
                return main(argv) or 0
            finally:
                warnings.formatwarning = formatted
                sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's last flush
        except BrokenPipeError:
            _discard_stdout()
            return SIGPIPE_EXIT
        except DfineError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            hint = _ENVIRONMENT_ERRNOS.get(exc.errno or 0)
            if hint is None:
                raise
            where = f"{exc.filename}: " if exc.filename else ""
            print(f"error: {where}{exc.strerror or exc}; {hint}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            print("interrupted", file=sys.stderr)
            return 130

    return wrapper


def _is_ours(filename: str, category: type[Warning]) -> bool:
    return (
        str(Path(filename).resolve()).startswith(_PACKAGE_DIR)
        and category.__name__ not in _FOREIGN_CATEGORIES
    )


def _one_line_if_ours(formatted: Callable[..., str]) -> Callable[..., str]:
    """A `warnings.formatwarning` that prints our own warnings as one 'warning: ...' line, as the
    commands print everything else, instead of Python's 'FILE:LINE: UserWarning: ...' and a line of
    our code; other libraries' warnings keep Python's form."""

    def format_warning(message, category, filename, lineno, line=None) -> str:
        if not _is_ours(filename, category):
            return formatted(message, category, filename, lineno, line)
        text = str(message)
        return (text if text.startswith("warning:") else f"warning: {text}") + "\n"

    return format_warning


def _discard_stdout() -> None:
    """Point stdout at /dev/null so that what is still buffered cannot fail again at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # stdout without a file descriptor (tests capturing it)
        pass


class ArgumentParser(argparse.ArgumentParser):
    """The parser of every console script: an empty value (`--out ""`, `--config=`) is refused in
    one line instead of turning into the current folder (`Path("")` is `.`) or the default."""

    def _get_values(self, action: argparse.Action, arg_strings: list[str]):
        if action.nargs != argparse.PARSER and any(not s.strip() for s in arg_strings):
            name = "/".join(action.option_strings) or action.metavar or action.dest
            self.error(f"argument {name}: the value is empty; give a value, or leave the option out")
        return super()._get_values(action, arg_strings)

    def parse_args(self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None):
        words = sys.argv[1:] if args is None else list(args)
        parsed, extra = self.parse_known_args(words, namespace)
        if extra:
            self.error(self._unrecognized(words, extra))
        return parsed

    def _unrecognized(self, words: list[str], extra: list[str]) -> str:
        """argparse's "unrecognized arguments", and where the first one follows the value of a repeatable
        option (`--source a.mp4 b.mp4`), that it takes one value each time."""
        said = f"unrecognized arguments: {' '.join(extra)}"
        if extra[0] not in words or words.index(extra[0]) < 2:
            return said
        before = words[words.index(extra[0]) - 2 : words.index(extra[0])]
        for action in self._actions:
            repeatable = isinstance(action, argparse._AppendAction) and action.nargs is None
            if repeatable and any(
                w in action.option_strings or w.split("=")[0] in action.option_strings for w in before
            ):
                flag = action.option_strings[-1]
                return f"{said}; {flag} takes one value each time: repeat it for each ({flag} A {flag} B)"
        return said


def path_text(text: str) -> str:
    """An argparse `type=` for a path option kept as text (the training flags): `user_path`'s."""
    return str(user_path(text))


def model_argument(text: str) -> str:
    """An argparse `type=` for a model argument: a file or folder as `user_path` makes it, a size
    name (`dfine-s`, `dfine-s-coco`) or a name that matches nothing as typed, so that its refusal shows it."""
    ref = classify_model_ref(os.path.expanduser(text))
    named = ref.is_name or (ref.kind == "unknown" and not ref.exists)
    return text if named else str(user_path(text))


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse `type=` for a whole number >= `low`: a negative seed or a count of 0 is refused by
    the parser in one line, before anything is built."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{value} is below {low}; give a whole number >= {low}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


class _InputSize(argparse.Action):
    """`--imgsz S` (a square, as Ultralytics writes it) or `--imgsz H W`, kept as (H, W)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if len(values) not in (1, 2):
            parser.error(f"argument {option_string}: give S (a square) or H W, not {len(values)} values")
        setattr(namespace, self.dest, (values[0], values[-1]))


def _pixels(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        # nargs="+": `dfine-export --imgsz 640 dfine-n` reads the model as the width
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size in pixels; --imgsz reads the words after it as S or H W, so a model "
            "or file written after them is taken as one: write it before --imgsz"
        ) from None


def add_input_size(parser: argparse.ArgumentParser, default: tuple[int, int] | None, help: str) -> None:
    """The `--imgsz` of every command: S or H W pixels, multiples of 32 (checked where the model is
    sized, with the model's own reason)."""
    parser.add_argument(
        "--imgsz", nargs="+", type=_pixels, action=_InputSize, metavar=("S", "W"), default=default, help=help
    )


def option_dest(flag: str) -> str:
    """Where argparse keeps an option named as its value ('--tile-overlap' -> 'tile_overlap'); one
    with a dest of its own (`--no-fp16` keeps `fp16`) is found by `option_flags`' actions."""
    return flag.lstrip("-").replace("-", "_")


def option_flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each option of `parser` by its long name ('--output' of '-o/--output'), help left out."""
    return {
        action.option_strings[-1]: action
        for action in parser._actions  # argparse keeps its options there, and offers no public list
        if action.option_strings and not isinstance(action, argparse._HelpAction)
    }


def check_option_owners(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    owners: dict[str, tuple[str, ...]],
    error: type[DfineError],
) -> None:
    """Refuse an option given without any of the options it belongs to, `owners` (`--tile-overlap` of
    dfine-bench's `--tiles`): it would be ignored without a word. "Given" is read from the command line
    itself, so an option written at its default value (`--fps 10` without `--streams`) counts too."""

    given = set(given_options(parser, argv, {*owners, *(f for belongs in owners.values() for f in belongs)}))
    for flag in owners:
        if flag in given and not given.intersection(owners[flag]):
            owner = " or ".join(owners[flag])
            raise error(
                f"{flag} belongs to {owner}, and is ignored without it: add {owner}, or leave {flag} out"
            )


def check_reads(
    parser: argparse.ArgumentParser,
    argv: Sequence[str] | None,
    mode: str,
    reads: Iterable[str],
    error: type[DfineError],
    also: Sequence[str] = (),
) -> None:
    """Refuse the options given beside `mode` (a task of its own, `--tables` of dfine-bench) that it
    does not read: they would be ignored without a word. `also`: what else was given that it does not
    read, named first (a model)."""
    reads = set(reads)
    given = [f for f in given_options(parser, argv, option_flags(parser)) if f != mode and f not in reads]
    others = [*also, *given]
    if others:
        them = "it" if len(others) == 1 else "them"
        raise error(f"{mode} does not read {' or '.join(others)}, and would ignore {them}: leave {them} out")


_ABSENT = object()


def given_options(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, flags: Iterable[str]
) -> list[str]:
    """Which of `flags` the command line names (in the order of `flags`), at any value. argparse fills
    an option's default only where the namespace it is handed lacks the name, so a second parse into a
    namespace holding a marker for each flag leaves the marker exactly where the option was not written
    (abbreviations and `--flag=value` included, as argparse reads them)."""

    actions = option_flags(parser)
    chosen = {flag: actions[flag] for flag in flags}
    probe = parser.parse_args(argv, argparse.Namespace(**{a.dest: _ABSENT for a in chosen.values()}))
    return [flag for flag, action in chosen.items() if _wrote(action, getattr(probe, action.dest))]


def _wrote(action: argparse.Action, value: object) -> bool:
    """Whether `action` stored `value`: of two flags sharing a place (`--smoke` / `--no-smoke`), the
    one whose constant is there."""
    if value is _ABSENT:
        return False
    # store_true and store_false are store_const actions
    return value == action.const if isinstance(action, argparse._StoreConstAction) else True


class _LevelWord(logging.Formatter):
    """A log line as our other lines read: 'warning: ' or 'error: ' before a message at that level
    (the word friendly_errors and our warnings print), nothing before the rest."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        if record.levelno >= logging.ERROR:
            return f"error: {text}"
        return f"warning: {text}" if record.levelno >= logging.WARNING else text


def configure_logging(level: int | str = logging.INFO, server: bool = False) -> None:
    """The log lines of every command, on stderr: a tool's as its other lines (`warning: ...`), a
    server's with the time, level and logger (`server`). Does nothing where logging is already set up
    (an embedding program, a test runner)."""
    handler = logging.StreamHandler(sys.stderr)
    server_form = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    handler.setFormatter(server_form if server else _LevelWord("%(message)s"))
    logging.basicConfig(level=level.upper() if isinstance(level, str) else level, handlers=[handler])


def non_negative_float(text: str) -> float:
    """An argparse `type=` for a finite number >= 0 (seconds, factors): "nan", "inf" and negatives are
    refused by the parser in one line."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is not a finite number >= 0")
    return value


_PACKAGE_DIR = str(Path(__file__).resolve().parent)
_FOREIGN_CATEGORIES = ("TracerWarning",)  # torch's, although they point at the traced line of our code


@contextlib.contextmanager
def quiet_third_party_warnings(verbose: bool = False) -> Iterator[Counter]:
    """Hold back the warnings libraries print during a long tool run, and say how many in one line.

    Tracing, ONNX conversion and FP16 conversion warn about things that are expected and handled
    (e.g. onnxconverter-common's "the float32 number ... will be truncated"). Our own warnings (such as
    "random weights") still print; `verbose` prints everything. Yields the hidden counts by source.
    """
    hidden: Counter = Counter()
    if verbose:
        yield hidden
        return
    with warnings.catch_warnings():
        shown = warnings.showwarning

        def sort(message, category, filename, lineno, file=None, line=None):
            if _is_ours(filename, category):
                shown(message, category, filename, lineno, file, line)
            else:
                module = category.__module__ if category.__name__ in _FOREIGN_CATEGORIES else filename
                hidden[_source_name(module)] += 1

        warnings.showwarning = sort
        try:
            yield hidden
        finally:
            if hidden:
                parts = ", ".join(f"{name} {count}" for name, count in hidden.most_common())
                print(
                    f"note: {sum(hidden.values())} warnings from other libraries hidden ({parts}); "
                    "--verbose shows them",
                    file=sys.stderr,
                )


def _source_name(where: str) -> str:
    """'onnxconverter_common' from a site-packages path, 'torch' from torch.jit."""
    parts = Path(where).parts
    if "site-packages" in parts:
        return parts[parts.index("site-packages") + 1]
    return where.split(".")[0] if "/" not in where else Path(where).stem
