"""Numbers stated in an answer, and whether the evidence holds each one.

Tolerant the way people write numbers: thousands separators (``1,234``), rounding (``3.14`` for
3.14159: equal within half a unit of the last digit shown), percentages (``42%`` for 0.42 or
42), a minus or a Unicode minus. Dates and times (``2021-03-04``, ``3/4/2021``, ``10:30``) and
digits inside words (``T2``, ``COVID-19``) are not numbers here. Scans are linear regular
expressions over the model's text.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Stated", "evidence_numbers", "holds", "stated_numbers"]

_DATES = re.compile(
    r"\b\d{4}-\d{1,2}-\d{1,2}(?:[ T]\d{1,2}:\d{2}(?::\d{2}(?:\.\d+)?)?)?\b"
    r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"
    r"|\b\d{1,2}:\d{2}(?::\d{2})?\b"
)
_NUMBER = re.compile(
    r"(?<![\w.])(?<![\w][-−])(?P<sign>[-−])?(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?:\.(?P<frac>\d+))?"
    r"(?P<pct>\s?%)?"
    r"(?![\w])"
)


@dataclass(frozen=True, slots=True)
class Stated:
    """A number as the answer states it: its value, the decimals shown, a percent sign."""

    text: str
    value: float
    decimals: int
    percent: bool
    start: int


def stated_numbers(text: str) -> list[Stated]:
    """Every number in ``text``, dates and times left out."""
    blanked = _DATES.sub(lambda m: " " * len(m.group()), text)
    found: list[Stated] = []
    for m in _NUMBER.finditer(blanked):
        digits = m.group("int").replace(",", "")
        frac = m.group("frac") or ""
        value = float(f"{digits}.{frac}" if frac else digits)
        if m.group("sign"):
            value = -value
        found.append(
            Stated(
                text=m.group().strip(),
                value=value,
                decimals=len(frac),
                percent=m.group("pct") is not None,
                start=m.start(),
            )
        )
    return found


def evidence_numbers(cells: Iterable[object]) -> list[float]:
    """The numbers the evidence holds: numeric cells, and cells that are numeric text."""
    out: list[float] = []
    for cell in cells:
        if isinstance(cell, bool):
            continue
        if isinstance(cell, int | float) and math.isfinite(cell):
            out.append(float(cell))
        elif isinstance(cell, str) and len(cell) < 40:
            try:
                value = float(cell.replace(",", ""))
            except ValueError:
                continue
            if math.isfinite(value):
                out.append(value)
    return out


def _close(shown: float, decimals: int, value: float) -> bool:
    """``shown`` is ``value`` written with ``decimals`` digits (rounded or truncated)."""
    half = 0.5 * 10.0**-decimals
    return abs(shown - value) <= half + 1e-9 * max(1.0, abs(value)) or (
        decimals == 0 and abs(shown - math.trunc(value)) < 1e-9
    )


def holds(number: Stated, values: Iterable[float]) -> bool:
    """Some evidence value is this number, as written (a percentage as a share too)."""
    for value in values:
        if _close(number.value, number.decimals, value):
            return True
        if number.percent and _close(number.value, number.decimals, value * 100.0):
            return True
    return False
