"""The rules that turn one input row (a study line, a shadow receipt) into a labelled request.

Kept free of numpy and of the rest of the package: the process-pool workers that read large
receipt logs import this module and nothing heavier, and apply exactly the rules the main
process applies, so where a row comes from never changes what it says.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TypeGuard

from firstpass.config import NULL_UNKNOWN
from firstpass.errors import CalibrationError

__all__ = [
    "LEVEL_TOLERANCE",
    "MAX_K",
    "NULL_UNKNOWN_SKIP",
    "OTHER_SCORE",
    "PASS_SHARE",
    "VACUOUS_SKIP",
    "ContextKey",
    "RowValues",
    "bad",
    "context_key",
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

#: why a gap marker or a signed checkpoint (a line the writer added, with a ``kind`` and a
#: ``mode`` equal to it) is left out: it is not a request
NOT_A_REQUEST = "not a request (a gap marker or a checkpoint)"
_SPECIAL_MODES = ("gap", "checkpoint", "feedback")
#: why a row whose visible tests a null stub passes is left out: they carry no signal
VACUOUS_SKIP = "scored by visible tests a null answer passes (probe.vacuous_visible)"
#: why a row is left out when the sandbox could not tell whether a null stub passes (no slot,
#: a failed reference): not a vacuous row, counted apart so a busy sandbox shows as one
NULL_UNKNOWN_SKIP = (
    "scored by visible tests the sandbox could not check against a null answer "
    '(probe.vacuous_visible = "unknown")'
)

#: a row's slice key: (route, rung model, temperature, top_p, given as canonical JSON, the route's
#: listed visible checks' digest, the endpoint drawn from, the output cap the probe's call was sent
#: with (``probe.output_cap``; None: none), the route's gate checks' digest, whether the gate
#: included the request's hidden tests); the parts after the route are the context its certificate
#: records. All but the last must be one per route (the last is gathered: a certificate lists which
#: values its rows had). None in the endpoint, the gate checks or the last: the receipt predates
#: them (such rows certify nothing enforce can bind)
ContextKey = tuple[
    str | None,
    str | None,
    float | None,
    float | None,
    str,
    str | None,
    str | None,
    int | None,
    str | None,
    bool | None,
]
#: one labelled receipt: (score, failed, k, pass count, slice key)
RowValues = tuple[float, bool, int, int, ContextKey]


def bad(path: Path | str, lineno: int, message: str) -> CalibrationError:
    """The error for a bad row: names the file and the 1-based line."""
    return CalibrationError(f"{path}, line {lineno}: {message}")


def is_number(x: object) -> TypeGuard[int | float]:
    """A finite JSON number (``bool`` is not one; nor an integer too large for a float)."""
    if type(x) is int:
        return abs(x) <= _FLOAT_MAX_INT
    return type(x) is float and math.isfinite(x)


#: integers beyond this have no float (``math.isfinite`` would raise OverflowError on them)
_FLOAT_MAX_INT = int(sys.float_info.max)


def pass_share_levels(k: int) -> tuple[float, ...]:
    """The achievable pass shares 0/k … k/k (``i / k`` is correctly rounded, as numpy's is)."""
    return tuple(i / k for i in range(k + 1))


def snap(
    path: Path | str, lineno: int, score: object, levels: object
) -> tuple[float, tuple[float, ...]]:
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


def _get(record: Mapping[str, object], dotted: str) -> object:
    value: object = record
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


#: the skip reason of a receipt recorded under another score (its label belongs to that
#: score's candidate); ``read_receipts`` refuses a log that has any
OTHER_SCORE = "recorded under score "


def recorded_score(probe: Mapping[str, object]) -> object:
    """The score a probe was recorded under (receipts from before the field: ``pass_share``)."""
    named = probe.get("score")
    if named is None:
        return PASS_SHARE
    return named.get("name") if isinstance(named, dict) else named


def rung_probe(
    path: Path | str, lineno: int, probe: Mapping[str, object], rung: int
) -> Mapping[str, object] | None:
    """The probe record of ``rung``: the receipt's ``probe`` itself for rung 0, else the entry
    of ``probe.later`` shadow wrote when elastic would have reached that rung (None: none)."""
    if rung == 0:
        return probe
    later = probe.get("later")
    if later is None:
        return None
    if not isinstance(later, list):
        raise bad(path, lineno, f'"probe.later" must be a list, got {later!r}')
    for entry in later:
        if not isinstance(entry, dict):
            raise bad(path, lineno, '"probe.later" entries must be objects')
        if type(entry.get("rung")) is int and entry["rung"] == rung:
            return entry
    return None


def _text(value: object) -> TypeGuard[str | None]:
    return value is None or type(value) is str


def context_key(
    route: object,
    provider: object,
    model: object,
    temperature: object,
    top_p: object,
    given: str = "[]",
    checks: object = None,
    endpoint: object = None,
    output_cap: object = None,
    gate_checks: object = None,
    gate_hidden: object = None,
) -> ContextKey | None:
    """The slice key of a row; None when a part has the wrong type (the full parse names it)."""
    if route is not None and type(route) is not str:
        return None
    if not (_text(checks) and _text(endpoint) and _text(gate_checks)):
        return None
    if gate_hidden is not None and type(gate_hidden) is not bool:
        return None
    if output_cap is not None and not (type(output_cap) is int and output_cap >= 1):
        return None
    if temperature is not None and not is_number(temperature):
        return None
    if top_p is not None and not is_number(top_p):
        return None
    name = f"{provider}/{model}" if type(provider) is str and type(model) is str else None
    return (
        route,
        name,
        None if temperature is None else float(temperature),
        None if top_p is None else float(top_p),
        given,
        checks,
        endpoint,
        output_cap,
        gate_checks,
        gate_hidden,
    )


def _given_json(path: Path | str, lineno: int, raw: object) -> str:
    from firstpass.config import Given  # here: a pool worker imports the config only when needed

    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise bad(path, lineno, f'"given" must be a list, got {raw!r}')
    entries = []
    for g in raw:
        entry = Given.from_dict(g)
        if entry is None:
            raise bad(
                path,
                lineno,
                f'"given" entries must be {{rung, certificate, lambda, escalate_at, '
                f"max_gate_candidates}}, got {g!r}",
            )
        entries.append(entry.to_dict())
    return json.dumps(entries, sort_keys=True)


def receipt_values(
    path: Path | str, lineno: int, record: object, score: str, rung: int = 0
) -> RowValues | str:
    """One receipt as (score, failed, k, c, slice key), or the reason it is skipped.

    Reads ``mode``, ``probe`` (``k``, ``pass_count``, ``scores``, ``score.name``, ``provider``,
    ``model``, ``temperature``, ``top_p``; for a higher rung its ``probe.later`` entry, whose
    ``gate_label`` and ``given`` come with it), ``decision.gate_label`` and ``route``, nothing
    else. The slice key (``ContextKey``) carries the route and the context a certificate
    records; ``read_receipts`` splits it. Values of the wrong type raise ``CalibrationError``
    naming the line.
    """
    if not isinstance(record, dict):
        raise bad(path, lineno, "each receipt must be a JSON object")
    if "kind" in record or record.get("mode") in _SPECIAL_MODES:
        return NOT_A_REQUEST
    if record.get("mode") != "shadow":
        return "not shadow mode"
    top = record.get("probe")
    if not isinstance(top, dict):
        return "no probe"
    probe = rung_probe(path, lineno, top, rung)
    if probe is None:
        return f"no probe of rung {rung} (elastic would not have reached it)"
    label = probe.get("gate_label") if rung else _get(record, "decision.gate_label")
    if label is None:
        return "no gate label"
    where = f"probe.later[rung {rung}]" if rung else "decision"
    if type(label) is not bool:
        raise bad(path, lineno, f'"{where}.gate_label" must be true, false or null, got {label!r}')
    if probe.get("logit_bias"):
        return "drawn with logit_bias (no certificate covers it)"
    if probe.get("unbound_fields"):
        return "drawn with request fields no certificate binds (probe.unbound_fields)"
    vacuous = probe.get("vacuous_visible")
    if vacuous == NULL_UNKNOWN:
        return NULL_UNKNOWN_SKIP
    if vacuous:
        return VACUOUS_SKIP
    if probe.get("no_visible_tests"):
        return (
            "scored without visible tests where hidden tests are the gate (probe.no_visible_tests)"
        )
    if probe.get("request_checks"):
        return "scored with the request's own checks (no certificate covers it)"
    recorded = recorded_score(probe)
    if not isinstance(recorded, str):
        raise bad(path, lineno, f'"probe.score.name" must be a string, got {recorded!r}')
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
    key = context_key(
        route if isinstance(route, str) else None,
        probe.get("provider"),
        probe.get("model"),
        probe.get("temperature"),
        probe.get("top_p"),
        _given_json(path, lineno, probe.get("given")) if rung else "[]",
        probe.get("visible_checks_digest"),
        probe.get("endpoint"),
        probe.get("output_cap"),
        probe.get("gate_checks_digest"),
        probe.get("gate_hidden_tests"),
    )
    if key is None:
        raise bad(
            path,
            lineno,
            '"probe.temperature" and "probe.top_p" must be numbers or null, '
            '"probe.visible_checks_digest", "probe.endpoint" and "probe.gate_checks_digest" '
            'strings or absent, "probe.output_cap" a positive integer or absent, '
            '"probe.gate_hidden_tests" true, false or absent',
        )
    return value, not label, k, c, key
