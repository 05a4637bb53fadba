"""Why a calibration has no rows left, in words that say what to do.

``read_receipts`` raises this when nothing is left to calibrate on. Labelled shadow receipts that
a flag filtered out (``--route``, ``--since``/``--until``, ``--model``/``--temperature``,
``--output-cap``) are
not a log without shadow labels: the message names the flag, what the log holds instead, and
how to ask for it. Only when no labelled receipt was there at all does it say to collect some.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from firstpass.calibration._window import NO_TIME, OTHER_ROUTE, OUTSIDE

__all__ = ["OTHER_CAP", "OTHER_DRAW", "caps_listed", "nothing_left"]

#: the skip reason of a row ``--model``/``--temperature`` left out
OTHER_DRAW = "drawn from another model or temperature (--model/--temperature)"
#: the skip reason of a row ``--output-cap`` left out
OTHER_CAP = "drawn under another output cap (--output-cap)"
#: at most this many route names or models are listed
_SHOWN = 10


def nothing_left(
    files: str,
    skipped: Mapping[str, int],
    *,
    route: str | None,
    other_routes: Mapping[str | None, int],
    drawn: Sequence[tuple[str | None, float | None]],
    caps: Sequence[int | None] = (),
) -> str:
    """The message for ``files`` when no row is left: ``skipped`` counts every line left out by
    reason, ``other_routes`` the labelled rows ``--route`` left out by their route, ``drawn``
    the (model, temperature) pairs of the rows there were before ``--model``/``--temperature``,
    ``caps`` their output caps before ``--output-cap``.
    """
    why = ", ".join(f"{n} {reason}" for reason, n in sorted(skipped.items())) or "no lines"
    parts = []
    n_route = skipped.get(OTHER_ROUTE, 0)
    if n_route:
        ranked = sorted(other_routes.items(), key=lambda item: -item[1])
        routes = [f"{_route_name(name)} ({n})" for name, n in ranked]
        parts.append(
            f"{_receipts(n_route)} of another route than --route {route!r}: "
            f"{_listed(routes)}. --route takes a route's name as "
            'receipts record it (their "route": the [[route]] name, not a model a client '
            "sends): pass one of these, or leave --route out"
        )
    n_time = skipped.get(OUTSIDE, 0) + skipped.get(NO_TIME, 0)
    if n_time:
        parts.append(
            f"{_receipts(n_time)} outside --since/--until (or without a readable time): widen "
            "the window, or leave it out"
        )
    n_drawn = skipped.get(OTHER_DRAW, 0)
    if n_drawn:
        pairs = list(dict.fromkeys(f"{model} at temperature {_number(t)}" for model, t in drawn))
        parts.append(
            f"{_receipts(n_drawn)} drawn from another model or temperature: the log has "
            f"{_listed(pairs)}; pass one of these with "
            "--model/--temperature, or leave them out"
        )
    n_cap = skipped.get(OTHER_CAP, 0)
    if n_cap:
        seen = caps_listed(caps)
        parts.append(
            f"{_receipts(n_cap)} drawn under another output cap: the log has "
            f"{_listed(seen)}; pass one of these with --output-cap, or leave it out"
        )
    if not parts:
        return (
            f"no labelled shadow receipts in {files} ({why}); "
            'run the proxy with [escalation.elastic] mode = "shadow" to collect labels'
        )
    return (
        f"no labelled shadow receipts left to calibrate on in {files}: the flags left out "
        f"every one: {'; '.join(parts)} (all lines: {why})"
    )


def caps_listed(caps: Iterable[int | None]) -> list[str]:
    """Output caps as ``--output-cap`` takes them, once each, smallest first, ``none`` last."""
    ordered = sorted(set(caps), key=lambda cap: (cap is None, cap or 0))
    return ["none" if cap is None else str(cap) for cap in ordered]


def _receipts(n: int) -> str:
    return "1 labelled shadow receipt is" if n == 1 else f"{n} labelled shadow receipts are"


def _number(value: float | None) -> str:
    return "(none)" if value is None else f"{value:g}"


def _route_name(route: str | None) -> str:
    return "(none)" if route is None else repr(route)


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:_SHOWN])
    return shown + (f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else "")
