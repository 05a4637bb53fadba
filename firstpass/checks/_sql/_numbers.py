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
    r"(?:[eE](?P<exp>[-+]?\d{1,3}))?(?P<suffix>bn|[kKMB])?(?P<pct>\s?%)?"
    r"(?!\.?\w)"  # "1.2M" is read whole, "3e2" as 300; "T2", "5th" are no numbers
)
_SCALE = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "bn": 1e9}


@dataclass(frozen=True, slots=True)
class Stated:
    """A number as the answer states it: its value, the decimals shown, a percent sign, and
    how far a value may be from it and still be what was written (half a unit of the last
    digit shown, scaled by an exponent or a k/M/B suffix)."""

    text: str
    value: float
    decimals: int
    percent: bool
    start: int
    tolerance: float = 0.5


def stated_numbers(text: str) -> list[Stated]:
    """Every number in ``text``, dates and times left out."""
    blanked = _DATES.sub(lambda m: " " * len(m.group()), text)
    found: list[Stated] = []
    for m in _NUMBER.finditer(blanked):
        digits = m.group("int").replace(",", "")
        frac = m.group("frac") or ""
        scale = 10.0 ** int(m.group("exp") or 0) * _SCALE.get(m.group("suffix") or "", 1.0)
        try:
            value = float(f"{digits}.{frac}" if frac else digits) * scale
        except OverflowError:
            continue
        if not math.isfinite(value):
            continue
        if m.group("sign"):
            value = -value
        found.append(
            Stated(
                text=m.group().strip(),
                value=value,
                decimals=len(frac),
                percent=m.group("pct") is not None,
                start=m.start(),
                tolerance=0.5 * 10.0 ** -len(frac) * scale,
            )
        )
    return found


def evidence_numbers(cells: Iterable[object]) -> list[float]:
    """The numbers the evidence holds: numeric cells, and cells that are numeric text."""
    out: list[float] = []
    for cell in cells:
        if isinstance(cell, bool):
            continue
        if isinstance(cell, int | float):
            try:
                value = float(cell)
            except OverflowError:  # an integer past a float's range holds no stated number
                continue
            if math.isfinite(value):
                out.append(value)
        elif isinstance(cell, str) and len(cell) < 40:
            try:
                value = float(cell.replace(",", ""))
            except ValueError:
                continue
            if math.isfinite(value):
                out.append(value)
    return out


def _close(number: Stated, value: float) -> bool:
    """``number`` is ``value`` as written: within half a unit of its last digit shown, or the
    integer part of it (truncated, not rounded)."""
    if abs(number.value - value) <= number.tolerance + 1e-9 * max(1.0, abs(value)):
        return True
    return number.decimals == 0 and number.tolerance == 0.5 and number.value == math.trunc(value)


def holds(number: Stated, values: Iterable[float]) -> bool:
    """Some evidence value is this number, as written (a percentage as a share too)."""
    as_share = (
        Stated(
            text=number.text,
            value=number.value / 100.0,
            decimals=number.decimals,
            percent=True,
            start=number.start,
            tolerance=number.tolerance / 100.0,
        )
        if number.percent
        else None
    )
    for value in values:
        if _close(number, value) or (as_share is not None and _close(as_share, value)):
            return True
    return False
