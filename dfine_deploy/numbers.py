"""The range a number must lie in, for every setting that has one (config keys, server settings).

One definition so that each place refuses the same way: a value must be a finite number (`.nan` in
YAML or `nan` on a command line passed every `<` test before, and `lr: .nan` trained on NaN) inside
the range, and the message says which range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from dfine_deploy.errors import DfineError


@dataclass(frozen=True)
class Range:
    """[low, high] by default; `low_open` / `high_open` leave that end out; None: no bound."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self) -> str:
        """'a finite number > 0', 'a finite number in [0, 1)', ..."""
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            bound = f" in {left}{self.low:g}, {self.high:g}{right}"
        elif self.low is not None:
            bound = f" {'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            bound = f" {'<' if self.high_open else '<='} {self.high:g}"
        else:
            bound = ""
        return f"a finite number{bound}"

    def check(self, value: Any, what: str, error: type[DfineError]) -> None:
        """Raise `error` naming `what` when `value` is outside the range."""
        if not self.holds(value):
            raise error(f"{what} must be {self.describe()}; found {value!r}")


FINITE = Range()
POSITIVE = Range(0, low_open=True)
NON_NEGATIVE = Range(0)
AT_LEAST_1 = Range(1)
FRACTION = Range(0, 1)
BELOW_1 = Range(0, 1, high_open=True)  # Adam's betas, dropout: 1 itself stops learning
