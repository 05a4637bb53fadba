"""The rules that turn one input row (a study line, a shadow receipt) into a labelled request.

Kept free of numpy and of the rest of the package: the process-pool workers that read large
receipt logs import this module and nothing heavier, and apply exactly the rules the main
process applies, so where a row comes from never changes what it says.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from firstpass.errors import CalibrationError

__all__ = [
    "LEVEL_TOLERANCE",
    "MAX_K",
    "OTHER_SCORE",
    "PASS_SHARE",
    "RowValues",
    "bad",
    "is_number",
    "pass_share_levels",
    "receipt_values",
    "recorded_score",
    "rung_probe",
    "snap",
]

#: the default score: the visible pass share c/k
PASS_SHARE = "pass_share"
#: scores closer than this are the same level (c/k computed two ways, a level list in JSON)
LEVEL_TOLERANCE = 1e-9
#: the largest k a row may give: its k + 1 levels are listed, so an absurd k must not exhaust memory
MAX_K = 10_000

#: one labelled receipt: (score, failed, k, pass count, route name)
RowValues = tuple[float, bool, int, int, str | None]


def bad(path: Path | str, lineno: int, message: str) -> CalibrationError:
    """The error for a bad row: names the file and the 1-based line."""
    return CalibrationError(f"{path}, line {lineno}: {message}")


def is_number(x: Any) -> bool:
    """A finite JSON number (``bool`` is not one)."""
    return type(x) in (int, float) and math.isfinite(x)


def pass_share_levels(k: int) -> tuple[float, ...]:
    """The achievable pass shares 0/k … k/k (``i / k`` is correctly rounded, as numpy's is)."""
    return tuple(i / k for i in range(k + 1))


def snap(path: Path | str, lineno: int, score: Any, levels: Any) -> tuple[float, tuple[float, ...]]:
    """``score`` as the member of ``levels`` it denotes, and the levels; an error otherwise."""
    if not is_number(score) or not 0.0 <= score <= 1.0:
        raise bad(path, lineno, f'"score" must be a number in [0, 1], got {score!r}')
    if not isinstance(levels, list) or not levels:
        raise bad(path, lineno, '"score" needs "levels": a non-empty list of achievable levels')
    if not all(is_number(v) and 0.0 <= v <= 1.0 for v in levels):
        raise bad(path, lineno, '"levels" must hold numbers in [0, 1]')
    lv = tuple(float(v) for v in levels)
    nearest = min(lv, key=lambda v: abs(v - score))
    if abs(nearest - score) > LEVEL_TOLERANCE:
        raise bad(path, lineno, f'"score" {score!r} is not one of its "levels"')
    return nearest, lv


def _get(record: dict[str, Any], dotted: str) -> Any:
    value: Any = record
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


#: the skip reason of a receipt recorded under another score (its label belongs to that
#: score's candidate); ``read_receipts`` refuses a log that has any
OTHER_SCORE = "recorded under score "


def recorded_score(probe: dict[str, Any]) -> Any:
    """The score a probe was recorded under (receipts from before the field: ``pass_share``)."""
    named = probe.get("score")
    return named.get("name") if isinstance(named, dict) else PASS_SHARE


def rung_probe(probe: dict[str, Any], rung: int) -> dict[str, Any] | None:
    """The probe record of ``rung``: the receipt's ``probe`` itself for rung 0, else the entry
    of ``probe.later`` shadow wrote when elastic would have reached that rung."""
    if rung == 0:
        return probe
    for entry in probe.get("later") or ():
        if isinstance(entry, dict) and entry.get("rung") == rung:
            return entry
    return None


def receipt_values(
    path: Path | str, lineno: int, record: Any, score: str, rung: int = 0
) -> RowValues | str:
    """One receipt as (score, failed, k, c, route name), or the reason it is skipped.

    Reads ``mode``, ``probe`` (``k``, ``pass_count``, ``scores``, ``score.name``; for a higher
    rung its ``probe.later`` entry, whose ``gate_label`` and ``given`` come with it),
    ``decision.gate_label`` and ``route``, nothing else. For ``rung`` > 0 the route name is
    ``json.dumps([route, given])``: the lower rungs' policy is part of that rung's context, and
    ``read_receipts`` splits it off. Values of the wrong type raise ``CalibrationError`` naming
    the line.
    """
    if not isinstance(record, dict):
        raise bad(path, lineno, "each receipt must be a JSON object")
    if record.get("mode") != "shadow":
        return "not shadow mode"
    top = record.get("probe")
    if not isinstance(top, dict):
        return "no probe"
    probe = rung_probe(top, rung)
    if probe is None:
        return f"no probe of rung {rung} (elastic would not have reached it)"
    label = probe.get("gate_label") if rung else _get(record, "decision.gate_label")
    if label is None:
        return "no gate label"
    where = f"probe.later[rung {rung}]" if rung else "decision"
    if type(label) is not bool:
        raise bad(path, lineno, f'"{where}.gate_label" must be true, false or null, got {label!r}')
    recorded = recorded_score(probe)
    if recorded != score:
        return f"{OTHER_SCORE}{recorded!r}"
    k, c = probe.get("k"), probe.get("pass_count")
    if type(k) is not int or not 1 <= k <= MAX_K:
        raise bad(path, lineno, f'"probe.k" must be an integer in [1, {MAX_K}], got {k!r}')
    if type(c) is not int or not 0 <= c <= k:
        raise bad(path, lineno, f'"probe.pass_count" must be an integer in [0, {k}], got {c!r}')
    if score == PASS_SHARE:
        value = c / k
    else:
        scores = probe.get("scores")
        raw = scores.get(score) if isinstance(scores, dict) else None
        if raw is None:
            return f"no probe.scores.{score}"
        if not is_number(raw) or not 0.0 <= raw <= 1.0:
            raise bad(
                path, lineno, f'"probe.scores.{score}" must be a number in [0, 1], got {raw!r}'
            )
        value, _ = snap(path, lineno, raw, list(pass_share_levels(k)))
    route = record.get("route")
    name = route if isinstance(route, str) else None
    if rung:
        name = json.dumps([name, probe.get("given") or []], sort_keys=True)
    return value, not label, k, c, name
