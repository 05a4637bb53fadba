"""Summary statistics over receipts: what was done, how often checks passed, what it cost.

Pure: it takes records (any iterable of dicts, e.g. ``iter_receipts(path)``) and returns numbers.
Only ``id`` and ``mode`` are guaranteed on a receipt, so every other field is optional here: a
missing or non-numeric value is left out of the statistic it would feed, never guessed.

Numbers from a log whose hash chain does not verify describe lines nobody vouches for: the
caller attaches the ``verify_chain`` report (``ReceiptSummary.chain``), and ``warning`` then
says so, naming the first bad line.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from firstpass.receipts._chain import VerifyReport

#: the bucket for receipts that lack the field being counted
MISSING = "(missing)"


@dataclass(frozen=True, kw_only=True)
class CheckRate:
    """How many check runs of one kind passed, out of how many."""

    passed: int = 0
    total: int = 0

    @property
    def rate(self) -> float | None:
        """``passed / total``, or ``None`` when there were no checks of this kind."""
        return self.passed / self.total if self.total else None


@dataclass(frozen=True, kw_only=True)
class ReceiptSummary:
    """The numbers ``firstpass receipts summary`` prints.

    Costs are sums of ``cost.total_usd`` (what was spent), ``cost.top_rung_usd`` (what always
    calling the top rung would have cost) and ``cost.probe_usd``. Latency percentiles are over
    ``timings_ms.total`` (linear interpolation, numpy's default). ``regimes``, ``labelled`` and
    ``label_passed`` come from elastic-policy receipts and stay empty/zero without them.

    ``chain`` is the log's ``verify_chain`` report when the caller checked it (``None``: not
    checked); ``unreadable`` counts lines left out because they are not JSON objects.
    """

    n: int
    modes: Mapping[str, int] = field(default_factory=dict)
    actions: Mapping[str, int] = field(default_factory=dict)
    visible: CheckRate = field(default_factory=CheckRate)
    gate: CheckRate = field(default_factory=CheckRate)
    cost_usd: float = 0.0
    top_rung_usd: float = 0.0
    probe_usd: float = 0.0
    latency_p50_ms: float | None = None
    latency_p95_ms: float | None = None
    n_timed: int = 0
    regimes: Mapping[str, int] = field(default_factory=dict)
    counterfactuals: Mapping[str, int] = field(default_factory=dict)
    labelled: int = 0
    label_passed: int = 0
    chain: VerifyReport | None = None
    unreadable: int = 0
    #: per check kind, the failure categories of the runs that failed (``timeout``...)
    failures: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: how the served answers were vouched for (``verified``, ``gate_skipped``...)
    verifications: Mapping[str, int] = field(default_factory=dict)
    #: served with the gate skipped, per certificate that licensed it
    skips_by_certificate: Mapping[str, int] = field(default_factory=dict)

    @property
    def warning(self) -> str | None:
        """Why these numbers cannot be trusted as they stand, or ``None``: the hash chain does not
        verify (naming the first bad line), or lines were left out as unreadable."""
        parts = []
        chain = self.chain
        if chain is not None and not chain.ok:
            if chain.n_lines == 0:
                vouched = "no receipt is vouched for"
            else:
                before = "receipt" if chain.n_lines == 1 else f"{chain.n_lines} receipts"
                verb = "is" if chain.n_lines == 1 else "are"
                vouched = f"only the {before} before it {verb} vouched for (head {chain.head})"
            parts.append(
                f"the hash chain does not verify: line {chain.first_bad_line}: {chain.reason}. "
                f"Of this log, {vouched}; this summary counts every readable line as it stands, "
                "edited or not"
            )
        if self.unreadable:
            lines = "line was" if self.unreadable == 1 else "lines were"
            parts.append(f"{self.unreadable} {lines} not a JSON object and left out")
        return "; ".join(parts) if parts else None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready data (what ``summary --json`` prints)."""
        return {
            "n": self.n,
            "modes": dict(self.modes),
            "actions": dict(self.actions),
            "checks": {
                name: {
                    "passed": rate.passed,
                    "total": rate.total,
                    "rate": rate.rate,
                    "failures": dict(self.failures.get(name, {})),
                }
                for name, rate in (("visible", self.visible), ("gate", self.gate))
            },
            "verifications": dict(self.verifications),
            "skips_by_certificate": dict(self.skips_by_certificate),
            "cost": {
                "total_usd": self.cost_usd,
                "top_rung_usd": self.top_rung_usd,
                "probe_usd": self.probe_usd,
            },
            "latency_ms": {
                "p50": self.latency_p50_ms,
                "p95": self.latency_p95_ms,
                "n": self.n_timed,
            },
            "probe": {
                "regimes": dict(self.regimes),
                "counterfactuals": dict(self.counterfactuals),
                "labelled": self.labelled,
                "label_passed": self.label_passed,
            },
            "chain": None
            if self.chain is None
            else {
                "verified": self.chain.ok,
                "receipts_verified": self.chain.n_lines,
                "head": self.chain.head,
                "first_bad_line": self.chain.first_bad_line,
                "reason": self.chain.reason,
            },
            "unreadable_lines": self.unreadable,
            "warning": self.warning,
        }


def summarize(records: Iterable[Mapping[str, Any]]) -> ReceiptSummary:
    """Count and sum the receipts in ``records`` (streamed: one pass, latencies kept)."""
    n = 0
    modes: Counter[str] = Counter()
    actions: Counter[str] = Counter()
    regimes: Counter[str] = Counter()
    counterfactuals: Counter[str] = Counter()
    checks = {"visible": [0, 0], "gate": [0, 0]}
    failures: dict[str, Counter[str]] = {"visible": Counter(), "gate": Counter()}
    verifications: Counter[str] = Counter()
    skips: Counter[str] = Counter()
    cost = top = probe_cost = 0.0
    latencies: list[float] = []
    labelled = label_passed = 0
    for record in records:
        n += 1
        modes[_label(record.get("mode"))] += 1
        decision = _dict(record.get("decision"))
        actions[_label(decision.get("action"))] += 1
        counterfactual = decision.get("counterfactual")
        if counterfactual is not None:
            counterfactuals[_label(counterfactual)] += 1
        gate_label = decision.get("gate_label")
        if gate_label is not None:
            labelled += 1
            label_passed += gate_label is True
        raw_checks = record.get("checks")
        for check in raw_checks if isinstance(raw_checks, list) else ():
            if not isinstance(check, dict):
                continue
            kind = check.get("kind")
            if kind not in ("visible", "gate") or not isinstance(check.get("passed"), bool):
                continue
            tally = checks[str(kind)]
            tally[0] += check["passed"]
            tally[1] += 1
            if not check["passed"]:
                failures[str(kind)][_label(check.get("category"))] += 1
        costs = _dict(record.get("cost"))
        cost += _number(costs.get("total_usd")) or 0.0
        top += _number(costs.get("top_rung_usd")) or 0.0
        probe_cost += _number(costs.get("probe_usd")) or 0.0
        total_ms = _number(_dict(record.get("timings_ms")).get("total"))
        if total_ms is not None:
            latencies.append(total_ms)
        probe = record.get("probe")
        if isinstance(probe, dict):
            regimes[_label(probe.get("regime"))] += 1
        served = record.get("served")
        if isinstance(served, dict):
            verification = _label(served.get("verification"))
            verifications[verification] += 1
            if verification == "gate_skipped":
                skips[_label(_skip_certificate(record, served))] += 1
    latencies.sort()
    return ReceiptSummary(
        n=n,
        modes=dict(modes.most_common()),
        actions=dict(actions.most_common()),
        visible=CheckRate(passed=checks["visible"][0], total=checks["visible"][1]),
        gate=CheckRate(passed=checks["gate"][0], total=checks["gate"][1]),
        cost_usd=cost,
        top_rung_usd=top,
        probe_usd=probe_cost,
        latency_p50_ms=percentile(latencies, 0.50),
        latency_p95_ms=percentile(latencies, 0.95),
        n_timed=len(latencies),
        regimes=dict(regimes.most_common()),
        counterfactuals=dict(counterfactuals.most_common()),
        labelled=labelled,
        label_passed=label_passed,
        failures={kind: dict(c.most_common()) for kind, c in failures.items() if c},
        verifications=dict(verifications.most_common()),
        skips_by_certificate=dict(skips.most_common()),
    )


def _skip_certificate(record: Mapping[str, Any], served: Mapping[str, Any]) -> Any:
    """The certificate of the probe whose rung served the answer without the gate."""
    probe = _dict(record.get("probe"))
    rung = served.get("rung")
    later = probe.get("later")
    for entry in [probe, *(later if isinstance(later, list) else ())]:
        if isinstance(entry, dict) and entry.get("rung") == rung:
            return entry.get("certificate")
    return None


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile (0..1) of already-sorted values by linear interpolation between the
    closest ranks (numpy's default, "linear"); ``None`` for no values."""
    if not sorted_values:
        return None
    position = q * (len(sorted_values) - 1)
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    fraction = position - low
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * fraction


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, dict) else {}


def _label(value: Any) -> str:
    if value is None:
        return MISSING
    return value if isinstance(value, str) else str(value)


#: a cost or a latency beyond this is no measurement: left out, so sums stay finite (and
#: ``--json`` valid JSON) whatever a hand-edited log holds
_IMPLAUSIBLE = 1e200


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, int):
        return float(value) if abs(value) <= _IMPLAUSIBLE else None
    return value if math.isfinite(value) and abs(value) <= _IMPLAUSIBLE else None
