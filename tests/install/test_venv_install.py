"""scripts/venv_install.py: pip's settings reach uv as uv's own flags, a setting uv has no word for
sends the install back to pip, and the real uv of the venv resolves with the flags it is given."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "venv_install.py"
spec = importlib.util.spec_from_file_location("venv_install", SCRIPT)
venv_install = importlib.util.module_from_spec(spec)
spec.loader.exec_module(venv_install)

UV = Path(sys.executable).with_name("uv")


def _needs_uv() -> None:
    if not UV.is_file():
        message = f"no uv beside {sys.executable}: `make test` installs it (Makefile, RUN_STAMP)"
        if os.environ.get("CI"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


def test_pip_settings_become_uv_flags_and_unknown_ones_send_the_install_to_pip():
    _needs_uv()
    settings = {
        "extra-index-url": "file:///a/simple file:///b/simple",
        "find-links": "/wheels",
        "constraint": "/etc/c.txt",
        "cert": "/etc/ca.crt",
        "default-timeout": "180",
    }
    args = ["install", "-q", "--no-compile", "--force-reinstall", "x==1"]
    planned = venv_install.uv_command(args, settings)
    assert not isinstance(planned, str), planned
    command, env = planned
    joined = " ".join(command)
    assert "--extra-index-url file:///a/simple --extra-index-url file:///b/simple" in joined
    assert "--find-links /wheels" in joined and "--constraint /etc/c.txt" in joined
    assert "--index-strategy unsafe-best-match" in joined  # pip's rule: the best version of any index
    assert "--no-compile" not in command and "--reinstall" in command and "--force-reinstall" not in command
    assert env["SSL_CERT_FILE"] == "/etc/ca.crt"
    uninstall, _ = venv_install.uv_command(["uninstall", "-q", "-y", "x"], {})
    assert "-y" not in uninstall and uninstall[-1] == "x"
    reason = venv_install.uv_command(["install", "x"], {**settings, "no-binary": ":all:"})
    assert isinstance(reason, str) and "no-binary" in reason
    assert "not a command" in venv_install.uv_command(["download", "x"], {})


def test_the_real_uv_resolves_with_this_machines_pip_settings():
    """What `make` runs, as a dry run: uv must accept every flag the script derives from pip here."""
    _needs_uv()
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "install", "--dry-run", "--no-deps", "--no-compile", "six"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "pip, not uv" not in proc.stderr, proc.stderr
    assert "six" in proc.stdout + proc.stderr


def test_a_pip_configuration_pip_cannot_read_is_one_line_naming_the_file(tmp_path, monkeypatch, capsys):
    broken = tmp_path / "pip.conf"
    broken.write_text("index-url = nowhere\n")  # no [global] section: pip refuses the file
    monkeypatch.setenv("PIP_CONFIG_FILE", str(broken))
    assert venv_install.main(["install", "nothing-to-install"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(broken) in err and "Traceback" not in err
    assert err.startswith("venv_install: pip cannot read its configuration") and "PIP_CONFIG_FILE" in err
