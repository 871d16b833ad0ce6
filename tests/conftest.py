"""Session-wide test settings: the run's first line names the CPU's ISA class.

Numeric tolerances and the INT8/BF16 paths depend on that class (dfine_deploy/cpu.py), so a report
from another machine is read against the class it ran on.
"""

from __future__ import annotations

import pytest

from dfine_deploy import cpu


def pytest_report_header(config: pytest.Config) -> str:
    return f"CPU ISA class: {cpu.describe()}"
