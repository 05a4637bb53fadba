"""Summary statistics over receipts: what was done, how often checks passed, what it cost.

Pure: it takes typed receipts (``firstpass.receipts.Receipt``) and returns numbers;
``read_lines`` turns a log's lines into them. A line that is not a receipt of the schema (not
JSON, a field missing or of the wrong type: a hand-edited line) is left out whole and counted
as unreadable, and the summary's warning names the first one and why; nothing is guessed.

Check runs are counted three ways. By stage (``visible``, ``gate``): one run per ``checks[]``
entry, its ``passed``, and its ``category`` as the receipt has it (the sandbox's finer names for
tests). By the one failure taxonomy (``firstpass.checks.categories()``), per stage: every failed
check run inside an entry, its tests under ``category_of_test_run`` of the entry's category and
each listed check (``results[]``) under its own ``category``. By check name: the stage's tests as
``tests`` (visible) or ``hidden tests`` (gate), listed checks by their ``name``. The first two
count every run, shadow label runs (``purpose: "label"``) included; the per-name pass rates leave
label runs out (``by_check``) and count them apart (``by_check_label``). Revision runs
(``purpose: "revision:N"``) count everywhere.

Numbers from a log whose hash chain does not verify describe lines nobody vouches for: the
caller attaches the ``verify_chain`` report (``ReceiptSummary.chain``), and ``warning`` then
says so, naming the first bad line.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

import msgspec

from firstpass.checks import category_of_test_run
from firstpass.receipts._chain import VerifyReport
from firstpass.receipts._schema import (
    CheckEntry,
    Decision,
    ProbeRecord,
    Receipt,
    RevisionLoop,
    ServedRecord,
    UnsetType,
    receipt_from_builtins,
)

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
    checked); ``unreadable`` counts lines left out because they are not receipts (not JSON, or
    not of the schema), ``first_unreadable`` says where the first was and why.

    Inside an entry that has ``results``, its tests are read from the counts: ``n_total`` minus
    the listed checks is how many tests ran, ``n_passed`` minus the listed checks that passed how
    many of them passed (an entry whose counts or results are malformed contributes no tests run
    and only its well-formed listed checks). A listed check is counted whatever its severity (a
    failed ``warning`` is a failed run), as itself: a composite's parts are not runs of their own.
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
    first_unreadable: str | None = None
    #: per check kind, the failure categories of the runs that failed (``timeout``...)
    failures: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: how the served answers were vouched for (``verified``, ``gate_skipped``...)
    verifications: Mapping[str, int] = field(default_factory=dict)
    #: served with the gate skipped, per certificate that licensed it
    skips_by_certificate: Mapping[str, int] = field(default_factory=dict)
    #: per stage, the failed check runs (tests and listed checks) by taxonomy category
    category_failures: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    #: per check name (``tests``, ``hidden tests``, a listed check's name), shadow label runs
    #: left out
    by_check: Mapping[str, CheckRate] = field(default_factory=dict)
    #: the same over shadow label runs only
    by_check_label: Mapping[str, CheckRate] = field(default_factory=dict)
    #: receipts where the revision loop made at least one attempt
    revised: int = 0
    revision_attempts: int = 0
    #: revision attempts whose answer then passed its checks
    revision_attempts_passed: int = 0
    #: receipts that served a revised answer (``served.revision`` ≥ 1)
    served_revised: int = 0
    #: why a rung's revision loop ended without a passing answer (``max_revisions``,
    #: ``not_revisable``, ``deadline``, ``budget``, ``upstream_error``), per loop
    revision_stops: Mapping[str, int] = field(default_factory=dict)
    #: what the checks spent upstream (``cost.checks_usd``: a judge's calls)
    checks_usd: float = 0.0
    #: the earliest and latest receipt ``time`` (UTC, as written), ``None`` without any
    first_time: str | None = None
    last_time: str | None = None
    #: receipts answered with an error, by ``error.type``
    errors: Mapping[str, int] = field(default_factory=dict)
    #: lines the writer added that are not requests (``kind``: ``gap``, ``checkpoint``), by kind
    markers: Mapping[str, int] = field(default_factory=dict)
    #: shadow labels on candidates elastic would have served without the gate (probe regime
    #: ``serve``), and how many of them failed the gate: the served failure a certificate's α
    #: bounds (LTT: among skips), observed
    skip_labels: int = 0
    skip_label_failures: int = 0

    @property
    def span_s(self) -> float | None:
        """Seconds from the first receipt's ``time`` to the last's (``None``: fewer than two
        readable times)."""
        first, last = _parse_time(self.first_time), _parse_time(self.last_time)
        if first is None or last is None:
            return None
        return max(0.0, last - first)

    @property
    def requests_per_minute(self) -> float | None:
        """Receipts per minute over the log's time span (``None`` for a span of zero)."""
        span = self.span_s
        return self.n / span * 60.0 if span else None

    @property
    def error_rate(self) -> float | None:
        """The share of receipts answered with an error (``None``: no receipts)."""
        return sum(self.errors.values()) / self.n if self.n else None

    @property
    def skip_rate(self) -> float | None:
        """The share of probes in regime ``serve``: the gate skipped (enforce) or that would have
        been (shadow); ``None`` without probes."""
        probes = sum(self.regimes.values())
        return self.regimes.get("serve", 0) / probes if probes else None

    @property
    def served_failure(self) -> float | None:
        """Of the shadow-labelled answers elastic would have served without the gate, the
        share that failed it; ``None`` without such labels."""
        return self.skip_label_failures / self.skip_labels if self.skip_labels else None

    @property
    def saved_share(self) -> float | None:
        """``1 - cost / top-rung cost``, from the unrounded sums: the share of the top-rung
        baseline saved, negative when the log cost more than always calling the top rung
        (escalations pay for the cheap rung as well); ``None`` when no receipt recorded a
        top-rung cost to compare with."""
        if not self.top_rung_usd > 0:
            return None
        return 1.0 - self.cost_usd / self.top_rung_usd

    @property
    def revision_rate(self) -> float | None:
        """The share of receipts the revision loop made an attempt on (``None``: no receipts)."""
        return self.revised / self.n if self.n else None

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
            first = f" (the first: {self.first_unreadable})" if self.first_unreadable else ""
            parts.append(f"{self.unreadable} {lines} not a receipt and left out{first}")
        return "; ".join(parts) if parts else None

    def to_dict(self) -> dict[str, object]:
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
            "failures_by_category": {
                kind: dict(self.category_failures.get(kind, {})) for kind in ("visible", "gate")
            },
            "by_check": {name: _rate_dict(rate) for name, rate in self.by_check.items()},
            "by_check_label": {
                name: _rate_dict(rate) for name, rate in self.by_check_label.items()
            },
            "revisions": {
                "requests": self.revised,
                "rate": self.revision_rate,
                "attempts": self.revision_attempts,
                "attempts_passed": self.revision_attempts_passed,
                "served_revised": self.served_revised,
                "stops": dict(self.revision_stops),
            },
            "verifications": dict(self.verifications),
            "skips_by_certificate": dict(self.skips_by_certificate),
            "cost": {
                "total_usd": self.cost_usd,
                "top_rung_usd": self.top_rung_usd,
                "probe_usd": self.probe_usd,
                "checks_usd": self.checks_usd,
                "saved_share": self.saved_share,
            },
            "latency_ms": {
                "p50": self.latency_p50_ms,
                "p95": self.latency_p95_ms,
                "n": self.n_timed,
            },
            "rate": {
                "first_time": self.first_time,
                "last_time": self.last_time,
                "span_s": self.span_s,
                "requests_per_minute": self.requests_per_minute,
            },
            "errors": {"rate": self.error_rate, "by_type": dict(self.errors)},
            "skip_rate": self.skip_rate,
            "served_failure": {
                "labelled_skips": self.skip_labels,
                "failed": self.skip_label_failures,
                "rate": self.served_failure,
            },
            "markers": dict(self.markers),
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


def summarize(
    receipts: Iterable[Receipt], *, markers: Mapping[str, int] | None = None
) -> ReceiptSummary:
    """Count and sum ``receipts`` (streamed: one pass, latencies kept); ``markers``: the lines
    the writer added that are not requests, by ``kind`` (``read_lines`` counts them)."""
    n = 0
    modes: Counter[str] = Counter()
    actions: Counter[str] = Counter()
    regimes: Counter[str] = Counter()
    counterfactuals: Counter[str] = Counter()
    checks = {"visible": [0, 0], "gate": [0, 0]}
    failures: dict[str, Counter[str]] = {"visible": Counter(), "gate": Counter()}
    taxonomy: dict[str, Counter[str]] = {"visible": Counter(), "gate": Counter()}
    by_check: dict[str, list[int]] = {}
    by_check_label: dict[str, list[int]] = {}
    revised = revision_attempts = revision_attempts_passed = served_revised = 0
    revision_stops: Counter[str] = Counter()
    checks_usd = 0.0
    verifications: Counter[str] = Counter()
    skips: Counter[str] = Counter()
    cost = top = probe_cost = 0.0
    latencies: list[float] = []
    labelled = label_passed = 0
    errors: Counter[str] = Counter()
    first_time: str | None = None
    last_time: str | None = None
    skip_labels = skip_label_failures = 0
    for receipt in receipts:
        n += 1
        stamp = receipt.time
        if _TIME.fullmatch(stamp):
            # the format sorts as text (fixed-width UTC); a log is in write order anyway
            first_time = stamp if first_time is None or stamp < first_time else first_time
            last_time = stamp if last_time is None or stamp > last_time else last_time
        if receipt.error is not None:
            errors[receipt.error.type] += 1
        modes[receipt.mode] += 1
        decision = receipt.decision
        actions[decision.action] += 1
        if decision.counterfactual is not None:
            counterfactuals[decision.counterfactual] += 1
        if decision.gate_label is not None:
            labelled += 1
            label_passed += decision.gate_label
        for check in receipt.checks:
            kind = check.kind
            per_name = by_check_label if check.purpose == "label" else by_check
            for name, passed, category in _runs(check):
                rate = per_name.setdefault(name, [0, 0])
                rate[0] += passed
                rate[1] += 1
                if not passed:
                    taxonomy[kind][category] += 1
            tally = checks[kind]
            tally[0] += check.passed
            tally[1] += 1
            if not check.passed:
                failures[kind][_label(check.category)] += 1
        if not isinstance(receipt.revisions, UnsetType):
            attempted, passed_attempts, stops = _revisions(receipt.revisions)
            revised += attempted > 0
            revision_attempts += attempted
            revision_attempts_passed += passed_attempts
            revision_stops.update(stops)
        costs = receipt.cost
        cost += _number(costs.total_usd)
        top += _number(costs.top_rung_usd)
        probe_cost += _number(costs.probe_usd)
        if not isinstance(costs.checks_usd, UnsetType):
            checks_usd += _number(costs.checks_usd)
        total_ms = _plausible(receipt.timings_ms.total)
        if total_ms is not None and total_ms >= 0:
            latencies.append(total_ms)
        probe = receipt.probe
        if probe is not None:
            regimes[_label(None if isinstance(probe.regime, UnsetType) else probe.regime)] += 1
            for label in _skip_labels(probe, decision):
                skip_labels += 1
                skip_label_failures += label is False
        served = receipt.served
        if served is not None:
            verifications[served.verification] += 1
            if served.verification == "gate_skipped":
                skips[_label(_skip_certificate(probe, served))] += 1
            served_revised += not isinstance(served.revision, UnsetType) and served.revision > 0
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
        category_failures={kind: dict(c.most_common()) for kind, c in taxonomy.items() if c},
        by_check={name: CheckRate(passed=p, total=t) for name, (p, t) in by_check.items()},
        by_check_label={
            name: CheckRate(passed=p, total=t) for name, (p, t) in by_check_label.items()
        },
        revised=revised,
        revision_attempts=revision_attempts,
        revision_attempts_passed=revision_attempts_passed,
        served_revised=served_revised,
        revision_stops=dict(revision_stops.most_common()),
        checks_usd=checks_usd,
        first_time=first_time,
        last_time=last_time,
        errors=dict(errors.most_common()),
        markers=dict(Counter(markers or {}).most_common()),
        skip_labels=skip_labels,
        skip_label_failures=skip_label_failures,
    )


@dataclass(kw_only=True)
class LineTally:
    """What ``read_lines`` left out of a summary: the writer's own lines (by ``kind``), and
    the lines that are not receipts (not JSON, or not of the schema: the first one's reason)."""

    markers: Counter[str] = field(default_factory=Counter)
    unreadable: int = 0
    first_unreadable: str | None = None

    def bad(self, where: str) -> None:
        self.unreadable += 1
        if self.first_unreadable is None:
            self.first_unreadable = where


def read_lines(lines: Iterable[tuple[str, bytes]], tally: LineTally) -> Iterator[Receipt]:
    """The request receipts among ``(where, line)`` pairs, typed; gap markers and checkpoints
    are counted in ``tally.markers``, lines that are not receipts in ``tally.unreadable``."""
    for where, raw in lines:
        try:
            record = json.loads(raw)
        except (ValueError, RecursionError):  # not JSON, not UTF-8, nested too deeply
            tally.bad(f"{where}: not JSON")
            continue
        if not isinstance(record, dict):
            tally.bad(f"{where}: not a JSON object")
            continue
        if "kind" in record:  # a gap marker or a checkpoint: not a request
            tally.markers[_label(record.get("kind"))] += 1
            continue
        try:
            receipt = receipt_from_builtins(record)
        except msgspec.ValidationError as exc:
            tally.bad(f"{where}: not a receipt ({exc})")
            continue
        except UnicodeEncodeError:  # a lone surrogate ("\udc00" escapes decode to one)
            tally.bad(f"{where}: not a receipt (a lone UTF-16 surrogate is not text)")
            continue
        yield receipt


def _skip_labels(probe: ProbeRecord, decision: Decision) -> list[bool]:
    """The gate labels of the probed rungs whose regime was ``serve`` (rung 0's label is on
    ``decision``, a later rung's on its own entry)."""
    rungs: list[tuple[ProbeRecord, bool | UnsetType | None]] = [(probe, decision.gate_label)]
    if not isinstance(probe.later, UnsetType):
        rungs += [(entry, entry.gate_label) for entry in probe.later]
    return [label for entry, label in rungs if entry.regime == "serve" and isinstance(label, bool)]


#: a receipt ``time``: fixed-width UTC, so such strings sort as the instants they name
_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")


def _parse_time(stamp: str | None) -> float | None:
    """A receipt ``time`` (``2026-01-31T12:00:00.123Z``) as POSIX seconds, else ``None``."""
    if stamp is None:
        return None
    try:
        return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC).timestamp()
    except ValueError:
        return None


#: what a stage's tests are called among the checks, per stage
_TESTS_NAME = {"visible": "tests", "gate": "hidden tests"}


def _runs(check: CheckEntry) -> list[tuple[str, bool, str]]:
    """The check runs one ``checks[]`` entry stands for: ``(name, passed, category)``, the
    category in the taxonomy (meaningful only on a failure). Without ``results`` the entry is
    its tests alone; with them, the tests (when the counts say any ran) and each listed check.
    """
    tests_name = _TESTS_NAME[check.kind]
    if isinstance(check.results, UnsetType) or not check.results:
        return [(tests_name, check.passed, _test_category(check.category))]
    listed = check.results
    runs: list[tuple[str, bool, str]] = []
    tests_total = check.n_total - len(listed)
    tests_passed = check.n_passed - sum(r.passed for r in listed)
    if tests_total > 0 and 0 <= tests_passed <= tests_total:
        passed = tests_passed == tests_total
        runs.append((tests_name, passed, _test_category(check.category)))
    runs.extend((r.name, r.passed, _label(r.category)) for r in listed)
    return runs


def _test_category(sandbox_category: str | None) -> str:
    """A failed test run's sandbox category in the taxonomy (``MISSING`` when there is none)."""
    return category_of_test_run(sandbox_category) if sandbox_category is not None else MISSING


def _revisions(loops: list[RevisionLoop]) -> tuple[int, int, Counter[str]]:
    """Of a receipt's ``revisions``: attempts made, attempts that passed, loops by why they
    stopped (a loop that stopped on a pass, ``stopped: null``, is not counted)."""
    attempts = passed = 0
    stops: Counter[str] = Counter()
    for loop in loops:
        attempts += len(loop.attempts)
        passed += sum(a.passed is True for a in loop.attempts)
        if loop.stopped is not None:
            stops[loop.stopped] += 1
    return attempts, passed, stops


def _rate_dict(rate: CheckRate) -> dict[str, object]:
    return {"passed": rate.passed, "total": rate.total, "rate": rate.rate}


def _skip_certificate(probe: ProbeRecord | None, served: ServedRecord) -> str | None:
    """The certificate of the probe whose rung served the answer without the gate."""
    if probe is None:
        return None
    later = [] if isinstance(probe.later, UnsetType) else probe.later
    for entry in [probe, *later]:
        if entry.rung == served.rung:
            return None if isinstance(entry.certificate, UnsetType) else entry.certificate
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


def _label(value: object) -> str:
    """A value as a counter's key: ``MISSING`` for None, text as it is, anything else (a
    marker's ``kind`` a hand-edited line made a list) as its ``str``."""
    if value is None:
        return MISSING
    return value if isinstance(value, str) else str(value)


#: a cost beyond this is no measurement: left out, so sums stay finite (and ``--json`` valid
#: JSON) whatever a hand-edited log holds
_IMPLAUSIBLE = 1e200


def _plausible(value: float) -> float | None:
    """A cost or a latency as a float, ``None`` when it is no measurement: not finite (JSON
    readers accept ``NaN`` and ``Infinity``), or beyond ``_IMPLAUSIBLE`` (an integer too large
    for a float included)."""
    if isinstance(value, int):
        return float(value) if abs(value) <= _IMPLAUSIBLE else None
    return value if math.isfinite(value) and abs(value) <= _IMPLAUSIBLE else None


def _number(value: float) -> float:
    """A cost to add to a sum: 0 when it is no measurement (``_plausible``)."""
    found = _plausible(value)
    return 0.0 if found is None else found
