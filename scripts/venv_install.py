"""`pip install ARGS` into the project's venv, done by uv when uv is there: the Makefile's installer.

Why: the torch wheel pulls about 4 GB of CUDA libraries even on a CPU machine, and pip unpacks them
one file at a time; uv (https://docs.astral.sh/uv/) unpacks in parallel. On a 2-core AMD EPYC under
the same load, `torch==2.14.1 torchvision==0.29.1` took pip 108 s (already without byte-compiling)
and uv 35 s, which is most of `make quickstart`'s set-up.

uv does not read pip's configuration (https://docs.astral.sh/uv/pip/compatibility/), so the
settings pip would use here (`pip config list`: files and PIP_* variables) are handed to uv as its
own flags. A setting with no uv equivalent below, or no uv at all, means pip does the install, and a
line says why: the result is the same packages, only slower.

    python scripts/venv_install.py -q torch==2.14.1 -e ".[train]"      # any `pip install` arguments
    python scripts/venv_install.py uninstall -q -y opencv-python      # other pip commands pass too
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# pip setting -> the uv flag that means the same; a list setting gives the flag once per value
LIST_FLAGS = {
    "extra-index-url": "--extra-index-url",
    "find-links": "--find-links",
    "constraint": "--constraint",
}
ONE_FLAGS = {"index-url": "--index-url"}
# settings that change nothing uv resolves or installs (the certificate is passed as SSL_CERT_FILE)
NO_EFFECT = {"cert", "default-timeout", "disable-pip-version-check", "no-input", "progress-bar", "quiet"}


class PipConfigError(Exception):
    """pip cannot read its own configuration, so neither pip nor uv would install anything."""


def pip_settings() -> dict[str, str]:
    """pip's effective settings, `name -> value`, as `pip config list` reports them (later wins)."""
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    if listed.returncode:
        # pip says it in several lines (what, why, "file: '...', line: N", the line itself): one here
        said = " ".join(line.strip() for line in listed.stderr.splitlines()[:3] if line.strip())
        raise PipConfigError(
            f"venv_install: pip cannot read its configuration: {said or 'no message'}; fix that file, "
            "or point PIP_CONFIG_FILE elsewhere (`pip config debug` lists the files pip reads)"
        )
    settings: dict[str, str] = {}
    for line in listed.stdout.splitlines():
        key, _, value = line.partition("=")
        settings[key.rpartition(".")[2]] = value.strip().strip("'\"")
    return settings


def uv_command(
    args: list[str], settings: dict[str, str], python: str = sys.executable
) -> tuple[list[str], dict[str, str]] | str:
    """The uv command line and environment for `pip ARGS` run by `python` (this venv's by default;
    tests/install/test_install_lines.py fills other venvs), or why uv cannot stand in for pip."""
    uv = Path(sys.executable).with_name("uv")
    if not uv.is_file():
        return "uv is not installed in this venv"
    if not args or args[0] not in ("install", "uninstall"):
        return f"pip {args[:1]} is not a command uv's pip interface runs here"
    unknown = sorted(set(settings) - set(LIST_FLAGS) - set(ONE_FLAGS) - NO_EFFECT)
    if unknown:
        return f"pip setting(s) {unknown} have no uv equivalent here"
    command, rest = args[0], list(args[1:])
    flags: list[str] = ["--python", python]
    env = dict(os.environ)
    if command == "install":
        # pip picks the best version across all its indexes; uv's default stops at the first index
        flags += ["--index-strategy", "unsafe-best-match"]
        for name, flag in ONE_FLAGS.items():
            flags += [flag, settings[name]] if name in settings else []
        for name, flag in LIST_FLAGS.items():
            for value in settings.get(name, "").split():
                flags += [flag, value]
        rest = [a for a in rest if a != "--no-compile"]  # uv never byte-compiles unless asked
        rest = ["--reinstall" if a == "--force-reinstall" else a for a in rest]
    else:
        rest = [a for a in rest if a not in ("-y", "--yes")]  # uv does not ask
    if "cert" in settings:
        env["SSL_CERT_FILE"] = settings["cert"]
    return [str(uv), "pip", command, *flags, *rest], env


def main(argv: list[str]) -> int:
    args = argv if argv and not argv[0].startswith("-") else ["install", *argv]
    try:
        planned = uv_command(args, pip_settings())
    except PipConfigError as error:
        print(error, file=sys.stderr)
        return 2
    if isinstance(planned, str):
        print(f"venv_install: pip, not uv: {planned}", file=sys.stderr, flush=True)
        return subprocess.call([sys.executable, "-m", "pip", *args])
    command, env = planned
    return subprocess.call(command, env=env)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
