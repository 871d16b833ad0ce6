"""Processes a test starts and stops as a user would."""

from __future__ import annotations

import signal
import subprocess


def interrupt(process: subprocess.Popen, timeout: float) -> int:
    """Stop `process` with Ctrl-C (SIGINT) and wait for it; one still running after `timeout` s is
    killed (its status is then -9, which no test takes for a clean end). Returns its exit status."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        return process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        return process.wait()
