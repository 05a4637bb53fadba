"""One receipt → the per-request metric updates.

The receipt is the single source of truth: every per-request number on ``/metrics`` is read from
the ``Receipt`` the pipeline wrote (docs/receipts.md), so metrics and receipts cannot disagree.
Only request receipts reach here: gap markers and checkpoints are the writer's own lines.
"""

from __future__ import annotations

from firstpass.checks import CONFIG_KINDS, REQUEST_KINDS
from firstpass.monitor import audit_outcome
from firstpass.observe._metrics import RequestMetrics
from firstpass.pipeline import request_regime
from firstpass.receipts import (
    UNSET,
    CheckEntry,
    CheckResultRecord,
    Decision,
    ProbeRecord,
    Receipt,
    RevisionLoop,
    ServedRecord,
    UnsetType,
    UpstreamCall,
)

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


def observe_record(m: RequestMetrics, receipt: Receipt) -> None:
    """Count one request's receipt into ``m``."""
    route = _text(receipt.route)
    mode = receipt.mode
    regime = _text(request_regime(receipt))  # as the response and the log state it
    m.child(m.requests, route, mode, receipt.decision.action, regime).inc()
    if receipt.error is not None:
        m.child(m.errors, receipt.error.type).inc()
    _timings(m, receipt, route, mode)
    _upstream(m, receipt.upstream_calls, route)
    gate_usd = _checks(m, receipt.checks)
    _cost(m, receipt, route, gate_usd)
    if receipt.served is not None:
        _served(m, receipt.served, route)
    if not isinstance(receipt.revisions, UnsetType):
        _revisions(m, receipt.revisions, route)
    if receipt.probe is not None:
        _probes(m, receipt.probe, receipt.decision, route, mode)
    audited = audit_outcome(receipt)
    if audited is not None:
        m.child(m.audits, route, str(audited[0]), audited[1]).inc()


def _timings(m: RequestMetrics, receipt: Receipt, route: str, mode: str) -> None:
    timings = receipt.timings_ms
    m.child(m.duration, route, mode).observe(_s(timings.total))
    m.child(m.overhead, route, mode).observe(_s(timings.overhead))
    if receipt.checks:
        m.child(m.sandbox, route).observe(_s(timings.sandbox))
    if not isinstance(timings.probe, UnsetType) and timings.probe:
        m.child(m.probe, route).observe(_s(timings.probe))
    if not isinstance(timings.gate, UnsetType) and timings.gate:
        m.child(m.gate, route).observe(_s(timings.gate))


def _upstream(m: RequestMetrics, calls: list[UpstreamCall], route: str) -> None:
    escalated = False
    for call in calls:
        rung = str(call.rung)
        m.child(m.upstream, call.provider, call.model, rung).observe(_s(call.latency_ms))
        outcome = "ok" if call.error is None else "error"
        m.child(m.upstream_calls, call.provider, call.model, rung, call.purpose, outcome).inc()
        if call.input_tokens > 0:
            m.child(m.tokens, call.provider, call.model, "input").inc(call.input_tokens)
        if call.output_tokens > 0:
            m.child(m.tokens, call.provider, call.model, "output").inc(call.output_tokens)
        if call.rung > 0 and call.purpose != "label":
            escalated = True
    if escalated:
        m.child(m.escalations, route).inc()


def _checks(m: RequestMetrics, checks: list[CheckEntry]) -> float:
    """Count every stage run and its checks; returns what the gate stage's checks spent."""
    gate_usd = 0.0
    for entry in checks:
        stage = entry.kind
        m.child(m.check_duration, stage).observe(_s(entry.ms))
        if not entry.passed:
            m.child(m.check_failures, stage, _text(entry.category)).inc()
        listed = [] if isinstance(entry.results, UnsetType) else entry.results
        # the stage's tests ran when the counts hold more runs than its listed checks
        if not listed or entry.n_total > len(listed):
            tests_passed = entry.passed if not listed else _tests_passed(entry, listed)
            m.child(m.check_runs, stage, _TESTS[stage], _verdict(tests_passed)).inc()
        for result in listed:
            if not isinstance(result.ms, UnsetType):
                kind = result.kind if result.kind in _CHECK_KINDS else "other"  # bounded
                m.child(m.check_kind_duration, stage, kind).observe(_s(result.ms))
            m.child(m.check_runs, stage, check_label(result.name), _verdict(result.passed)).inc()
            cost = result.cost_usd
            if stage == "gate" and not isinstance(cost, UnsetType) and cost > 0:
                gate_usd += float(cost)
    return gate_usd


def _tests_passed(entry: CheckEntry, listed: list[CheckResultRecord]) -> bool:
    listed_passed = sum(r.passed for r in listed)
    return entry.n_passed - listed_passed == entry.n_total - len(listed)


def _cost(m: RequestMetrics, receipt: Receipt, route: str, gate_usd: float) -> None:
    cost = receipt.cost
    checks = cost.checks_usd if not isinstance(cost.checks_usd, UnsetType) else 0.0
    for part, value in (("total", cost.total_usd), ("probe", cost.probe_usd), ("checks", checks)):
        if value > 0:
            m.child(m.cost, route, part).inc(value)
    if gate_usd > 0:
        m.child(m.cost, route, "gate").inc(gate_usd)


def _served(m: RequestMetrics, served: ServedRecord, route: str) -> None:
    rung = str(served.rung)
    m.child(m.served, route, rung, served.model, served.verification).inc()
    if served.verification == "gate_skipped":
        m.child(m.gate_skipped, route, rung).inc()


def _revisions(m: RequestMetrics, loops: list[RevisionLoop], route: str) -> None:
    attempts = sum(len(loop.attempts) for loop in loops)
    if attempts:
        m.child(m.revisions, route).inc(attempts)
        m.child(m.revised, route).inc()


def _probes(
    m: RequestMetrics, probe: ProbeRecord, decision: Decision, route: str, mode: str
) -> None:
    """Each probed rung's regime, and in shadow its gate label (rung 0's is on ``decision``);
    a label on a rung in regime ``serve`` is about an answer elastic would serve ungated."""
    later = [] if isinstance(probe.later, UnsetType) else probe.later
    rungs: list[tuple[ProbeRecord, bool | UnsetType | None]] = [(probe, decision.gate_label)]
    rungs += [(entry, entry.gate_label) for entry in later]
    for entry, label in rungs:
        if isinstance(entry.regime, UnsetType):
            continue
        rung = str(entry.rung)
        m.child(m.probes, route, rung, mode, entry.regime).inc()
        if isinstance(label, bool):
            would_skip = "true" if entry.regime == "serve" else "false"
            m.child(m.gate_labels, route, rung, would_skip, "pass" if label else "fail").inc()


def _verdict(passed: bool) -> str:
    return "pass" if passed else "fail"


def _text(value: str | UnsetType | None) -> str:
    return NONE if value is None or value is UNSET else str(value)


def _s(ms: float) -> float:
    """Milliseconds from a receipt as seconds."""
    return ms / 1000.0
