"""The Prometheus metric families a server exports, on a registry of its own.

One ``CollectorRegistry`` per app, never the process-wide default: tests and benchmarks build
many apps in one process, and each must count only its own requests. Names follow Prometheus
conventions (``firstpass_`` prefix, base units, ``_total`` on counters, ``_seconds`` on
durations). Every label value comes from the config or from a fixed set the code defines (modes,
actions, regimes, categories): never a receipt id, a task id or a model name a client sent.
"""

from __future__ import annotations

from typing import TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, disable_created_metrics

__all__ = ["LATENCY_BUCKETS", "OVERHEAD_BUCKETS", "RequestMetrics"]

# no ``*_created`` series: they double every scrape and say only when a label set first appeared
# (process-wide in prometheus_client; the server is its only user in the process)
disable_created_metrics()  # type: ignore[no-untyped-call]  # untyped upstream

#: whole requests, upstream calls, probes: a millisecond (a stub) to two minutes (the deadline)
LATENCY_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0,
)  # fmt: skip
#: what the proxy adds and what checks take: from a fifth of a millisecond
OVERHEAD_BUCKETS = (
    0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0,
)  # fmt: skip


M = TypeVar("M", Counter, Histogram)


class RequestMetrics:
    """The per-request families, updated from each receipt (``firstpass.observe.observe_record``).

    The scrape-time families (receipt writer, sandbox, in-flight requests, certificates) are
    registered on the same ``registry`` by ``firstpass.observe.register_collectors``.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        #: (family, label values) -> the labelled child, so a request pays a dict lookup per
        #: metric instead of ``labels()``'s validation and lock (bounded: labels are bounded)
        self._children: dict[tuple[int, tuple[str, ...]], Counter | Histogram] = {}
        r = self.registry
        self.requests = Counter(
            "firstpass_requests",
            "Requests handled (one per receipt), by route, mode, decision.action and probe regime",
            ("route", "mode", "action", "regime"),
            registry=r,
        )
        self.errors = Counter(
            "firstpass_request_errors",
            "Requests answered with an error, by error type (the receipt's error.type)",
            ("type",),
            registry=r,
        )
        self.duration = Histogram(
            "firstpass_request_duration_seconds",
            "Arrival to response (timings_ms.total)",
            ("route", "mode"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.overhead = Histogram(
            "firstpass_overhead_seconds",
            "Time not spent waiting on a provider, checks included (timings_ms.overhead)",
            ("route", "mode"),
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.sandbox = Histogram(
            "firstpass_sandbox_duration_seconds",
            "Time a request waited on its checks (timings_ms.sandbox), requests with checks only",
            ("route",),
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.probe = Histogram(
            "firstpass_probe_duration_seconds",
            "The elastic probe: its k-sample call and its visible checks (timings_ms.probe)",
            ("route",),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.gate = Histogram(
            "firstpass_gate_duration_seconds",
            "Gate runs of a request, summed (timings_ms.gate), requests that ran the gate only",
            ("route",),
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.upstream = Histogram(
            "firstpass_upstream_duration_seconds",
            "One logical upstream call including its retries, by provider, model and rung",
            ("provider", "model", "rung"),
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.upstream_calls = Counter(
            "firstpass_upstream_calls",
            "Logical upstream calls by provider, model, rung, purpose and outcome (ok, error)",
            ("provider", "model", "rung", "purpose", "outcome"),
            registry=r,
        )
        self.tokens = Counter(
            "firstpass_tokens",
            "Tokens reported by providers, by provider, model and direction (input, output)",
            ("provider", "model", "direction"),
            registry=r,
        )
        self.cost = Counter(
            "firstpass_cost_usd",
            "Spend in USD by route and part: total (everything), probe, checks (judges), gate "
            "(the gate stage's checks)",
            ("route", "part"),
            registry=r,
        )
        self.check_duration = Histogram(
            "firstpass_check_duration_seconds",
            "One stage's run on one answer (checks[].ms), by stage (visible, gate)",
            ("stage",),
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.check_kind_duration = Histogram(
            "firstpass_check_kind_duration_seconds",
            "One listed check's run on one answer (checks[].results[].ms), by stage and check "
            "kind (regex, json_schema, judge, sql_evidence...); a stage's tests are in "
            "firstpass_sandbox_duration_seconds",
            ("stage", "kind"),
            buckets=OVERHEAD_BUCKETS,
            registry=r,
        )
        self.check_runs = Counter(
            "firstpass_check_runs",
            "Check runs by stage, check name (tests, hidden tests, a configured check; "
            "request-added checks as 'request') and verdict (pass, fail)",
            ("stage", "check", "verdict"),
            registry=r,
        )
        self.check_failures = Counter(
            "firstpass_check_failures",
            "Failed stage runs by stage and category (the receipt's checks[].category)",
            ("stage", "category"),
            registry=r,
        )
        self.served = Counter(
            "firstpass_served",
            "Answers served, by route, rung, model and verification (verified, gate_skipped, "
            "unverified, unchecked)",
            ("route", "rung", "model", "verification"),
            registry=r,
        )
        self.escalations = Counter(
            "firstpass_escalations",
            "Requests that called a rung above the first, by route",
            ("route",),
            registry=r,
        )
        self.revisions = Counter(
            "firstpass_revisions",
            "Revision attempts (an answer sent back with feedback), by route",
            ("route",),
            registry=r,
        )
        self.revised = Counter(
            "firstpass_revised_requests",
            "Requests on which the revision loop made at least one attempt, by route",
            ("route",),
            registry=r,
        )
        self.probes = Counter(
            "firstpass_probes",
            "Elastic probes by route, rung, mode and regime (serve, gate, escalate); the skip "
            "rate is firstpass_gate_skipped_total over the probes of mode enforce",
            ("route", "rung", "mode", "regime"),
            registry=r,
        )
        self.gate_skipped = Counter(
            "firstpass_gate_skipped",
            "Answers served without the gate on a certificate's licence (enforce), by route "
            "and rung",
            ("route", "rung"),
            registry=r,
        )
        self.gate_labels = Counter(
            "firstpass_gate_labels",
            "Shadow gate labels by route, rung, whether elastic would have skipped the gate "
            "(would_skip) and the gate's verdict (pass, fail): the served failure rate a "
            "certificate's alpha bounds is fail/all where would_skip is true",
            ("route", "rung", "would_skip", "label"),
            registry=r,
        )
        self.audits = Counter(
            "firstpass_audits",
            "Audits drawn (would-be skips gated anyway, audit_rate) by route, rung and outcome: "
            "labelled, or served unaudited because the gate's budget (budget) or a sandbox "
            "slot (sandbox_busy) was missing",
            ("route", "rung", "outcome"),
            registry=r,
        )

    def child(self, family: M, *labels: str) -> M:
        """``family.labels(*labels)``, cached."""
        key = (id(family), labels)
        found = self._children.get(key)
        if found is None:
            found = self._children[key] = family.labels(*labels)
        return found  # type: ignore[return-value]  # the key's family made it
