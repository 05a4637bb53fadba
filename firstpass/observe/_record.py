"""One receipt → the per-request metric updates.

The receipt is the single source of truth: every per-request number on ``/metrics`` is read from
the record the pipeline wrote (docs/receipts.md), so metrics and receipts cannot disagree.
Records that carry ``kind`` (gap markers, checkpoints) are not requests and are not counted.
Every field is read defensively: a missing one leaves its metric alone, never raises.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from firstpass.checks import CONFIG_KINDS, REQUEST_KINDS
from firstpass.observe._metrics import RequestMetrics

__all__ = ["NONE", "check_label", "observe_record"]

#: the label value for "not applicable" (no route on a refused request, no probe regime...)
NONE = "none"
#: the prefix of check names a request added itself (``request:NAME``): one label for all
_REQUEST_PREFIX = "request:"
#: what a stage's tests are called among the checks
_TESTS = {"visible": "tests", "gate": "hidden tests"}
#: the check kinds a label may name (anything else counts as "other")
_CHECK_KINDS = frozenset(CONFIG_KINDS) | frozenset(REQUEST_KINDS) | {"composite"}


def check_label(name: str) -> str:
    """A check name as a label: configured names as they are, request-added ones as
    ``request`` (a client picks those names, so they would make the label unbounded)."""
    return "request" if name.startswith(_REQUEST_PREFIX) else name


def observe_record(m: RequestMetrics, record: Mapping[str, Any]) -> None:
    """Count one request's receipt into ``m``."""
    if "kind" in record:
        return
    route = _text(record.get("route"))
    mode = _text(record.get("mode"))
    decision = _dict(record.get("decision"))
    probe = _dict(record.get("probe"))
    regime = _text(probe.get("regime"))
    m.child(m.requests, route, mode, _text(decision.get("action")), regime).inc()
    error = record.get("error")
    if isinstance(error, dict):
        m.child(m.errors, _text(error.get("type"))).inc()
    _timings(m, record, route, mode)
    _upstream(m, record.get("upstream_calls"), route)
    gate_usd = _checks(m, record.get("checks"))
    _cost(m, _dict(record.get("cost")), route, gate_usd)
    _served(m, record.get("served"), route)
    _revisions(m, record.get("revisions"), route)
    if probe:
        _probes(m, probe, decision, route, mode)


def _timings(m: RequestMetrics, record: Mapping[str, Any], route: str, mode: str) -> None:
    timings = _dict(record.get("timings_ms"))
    total = _ms(timings.get("total"))
    if total is not None:
        m.child(m.duration, route, mode).observe(total)
    overhead = _ms(timings.get("overhead"))
    if overhead is not None:
        m.child(m.overhead, route, mode).observe(overhead)
    if record.get("checks"):
        sandbox = _ms(timings.get("sandbox"))
        if sandbox is not None:
            m.child(m.sandbox, route).observe(sandbox)
    probe = _ms(timings.get("probe"))
    if probe:
        m.child(m.probe, route).observe(probe)
    gate = _ms(timings.get("gate"))
    if gate:
        m.child(m.gate, route).observe(gate)


def _upstream(m: RequestMetrics, calls: Any, route: str) -> None:
    escalated = False
    for call in calls if isinstance(calls, list) else ():
        if not isinstance(call, dict):
            continue
        provider, model = _text(call.get("provider")), _text(call.get("model"))
        rung = _text(call.get("rung"))
        latency = _ms(call.get("latency_ms"))
        if latency is not None:
            m.child(m.upstream, provider, model, rung).observe(latency)
        outcome = "ok" if call.get("error") is None else "error"
        m.child(m.upstream_calls, provider, model, rung, _text(call.get("purpose")), outcome).inc()
        for direction in ("input", "output"):
            tokens = call.get(f"{direction}_tokens")
            if isinstance(tokens, int) and tokens > 0:
                m.child(m.tokens, provider, model, direction).inc(tokens)
        rung_index = call.get("rung")
        if isinstance(rung_index, int) and rung_index > 0 and call.get("purpose") != "label":
            escalated = True
    if escalated:
        m.child(m.escalations, route).inc()


def _checks(m: RequestMetrics, checks: Any) -> float:
    """Count every stage run and its checks; returns what the gate stage's checks spent."""
    gate_usd = 0.0
    for entry in checks if isinstance(checks, list) else ():
        if not isinstance(entry, dict):
            continue
        stage = entry.get("kind")
        if stage not in _TESTS:
            continue
        ms = _ms(entry.get("ms"))
        if ms is not None:
            m.child(m.check_duration, stage).observe(ms)
        passed = entry.get("passed")
        if passed is False:
            m.child(m.check_failures, stage, _text(entry.get("category"))).inc()
        results = entry.get("results")
        listed = [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []
        n_total = entry.get("n_total")
        # the stage's tests ran when the counts hold more runs than its listed checks
        if not listed or (isinstance(n_total, int) and n_total > len(listed)):
            tests_passed = passed if not listed else _tests_passed(entry, listed)
            if isinstance(tests_passed, bool):
                m.child(m.check_runs, stage, _TESTS[stage], _verdict(tests_passed)).inc()
        for result in listed:
            kind_ms = _ms(result.get("ms"))
            if kind_ms is not None:
                kind = _text(result.get("kind"))
                kind = kind if kind in _CHECK_KINDS else "other"  # bounded, whatever it says
                m.child(m.check_kind_duration, stage, kind).observe(kind_ms)
            ok = result.get("passed")
            if isinstance(ok, bool):
                name = check_label(_text(result.get("name")))
                m.child(m.check_runs, stage, name, _verdict(ok)).inc()
            cost = result.get("cost_usd")
            if stage == "gate" and isinstance(cost, int | float) and cost > 0:
                gate_usd += float(cost)
    return gate_usd


def _tests_passed(entry: Mapping[str, Any], listed: list[dict[str, Any]]) -> bool | None:
    n_total, n_passed = entry.get("n_total"), entry.get("n_passed")
    if not isinstance(n_total, int) or not isinstance(n_passed, int):
        return None
    listed_passed = sum(r.get("passed") is True for r in listed)
    return n_passed - listed_passed == n_total - len(listed)


def _cost(m: RequestMetrics, cost: Mapping[str, Any], route: str, gate_usd: float) -> None:
    for part, key in (("total", "total_usd"), ("probe", "probe_usd"), ("checks", "checks_usd")):
        value = cost.get(key)
        if isinstance(value, int | float) and value > 0:
            m.child(m.cost, route, part).inc(value)
    if gate_usd > 0:
        m.child(m.cost, route, "gate").inc(gate_usd)


def _served(m: RequestMetrics, served: Any, route: str) -> None:
    if not isinstance(served, dict):
        return
    rung = _text(served.get("rung"))
    verification = _text(served.get("verification"))
    m.child(m.served, route, rung, _text(served.get("model")), verification).inc()
    if verification == "gate_skipped":
        m.child(m.gate_skipped, route, rung).inc()


def _revisions(m: RequestMetrics, loops: Any, route: str) -> None:
    attempts = 0
    for loop in loops if isinstance(loops, list) else ():
        tries = loop.get("attempts") if isinstance(loop, dict) else None
        attempts += len(tries) if isinstance(tries, list) else 0
    if attempts:
        m.child(m.revisions, route).inc(attempts)
        m.child(m.revised, route).inc()


def _probes(
    m: RequestMetrics,
    probe: Mapping[str, Any],
    decision: Mapping[str, Any],
    route: str,
    mode: str,
) -> None:
    """Each probed rung's regime, and in shadow its gate label (rung 0's is on ``decision``);
    a label on a rung in regime ``serve`` is about an answer elastic would serve ungated."""
    later = probe.get("later")
    first = {**probe, "gate_label": decision.get("gate_label")}
    for entry in [first, *(later if isinstance(later, list) else ())]:
        if not isinstance(entry, dict) or entry.get("regime") is None:
            continue
        rung = _text(entry.get("rung"))
        m.child(m.probes, route, rung, mode, _text(entry.get("regime"))).inc()
        label = entry.get("gate_label")
        if isinstance(label, bool):
            would_skip = "true" if entry.get("regime") == "serve" else "false"
            m.child(m.gate_labels, route, rung, would_skip, "pass" if label else "fail").inc()


def _verdict(passed: bool) -> str:
    return "pass" if passed else "fail"


def _text(value: Any) -> str:
    if value is None:
        return NONE
    return value if isinstance(value, str) else str(value)


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _ms(value: Any) -> float | None:
    """Milliseconds from a receipt as seconds; ``None`` when absent or not a finite number ≥ 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not 0 <= value < float("inf"):
        return None
    return value / 1000.0
