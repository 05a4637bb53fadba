"""The licence monitor's state at scrape time: labels, failures, the bound and revocations per
(route, rung), pooled over every replica that shares the store (so sum nothing across
instances: take ``max``). Counts, bound and e-value are those of the last store state this
replica saw (the state revocation is decided on); ``revoked`` and ``suspended`` are what the
pipeline asks (``LicenceMonitor.revocation``), so a rung above a revoked one shows revoked too;
the store's age is this replica's own."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from firstpass.monitor import POLL_S, LicenceMonitor, Predated, Revocation, Suspension

__all__ = ["LicenceCollector"]


class LicenceCollector(Collector):
    """``firstpass_licence_*``: one series per monitored (route, rung) (docs/operations.md)."""

    def __init__(self, monitor: Callable[[], LicenceMonitor | None]) -> None:
        self._monitor = monitor

    def collect(self) -> Iterator[Metric]:
        labels = ("route", "rung")
        counted = ("route", "rung", "counted")
        n = GaugeMetricFamily(
            "firstpass_licence_labels",
            "Labels of would-be skips under the certificate in force, pooled over replicas: "
            'counted="random" (audits, shadow) feed the e-process, "feedback" is kept apart',
            labels=counted,
        )
        failed = GaugeMetricFamily(
            "firstpass_licence_failures",
            "Of those labels, the ones the gate (or the client) rejected",
            labels=counted,
        )
        bound = GaugeMetricFamily(
            "firstpass_licence_failure_bound",
            "Lower confidence bound (level: firstpass_licence_level) on the failure rate "
            "among skips, valid at every scrape at once",
            labels=labels,
        )
        alpha = GaugeMetricFamily(
            "firstpass_licence_alpha", "The certificate's alpha the monitor tests", labels=labels
        )
        level = GaugeMetricFamily(
            "firstpass_licence_level", "The monitor's level (gamma)", labels=labels
        )
        evalue = GaugeMetricFamily(
            "firstpass_licence_e_value",
            "The e-process's wealth against 'rate <= alpha' (revoked at 1/level)",
            labels=labels,
        )
        revoked = GaugeMetricFamily(
            "firstpass_licence_revoked",
            "1 when the licence at (route, rung), or a lower rung's on the route, is revoked: "
            "it gates every request",
            labels=labels,
        )
        suspended = GaugeMetricFamily(
            "firstpass_licence_suspended",
            "1 while the licence at (route, rung) gates because the licence store has not "
            "synced for monitor_stale_s (fail closed)",
            labels=labels,
        )
        age = GaugeMetricFamily(
            "firstpass_licence_store_age_seconds",
            "Seconds since this replica last synced with the licence store (polled every "
            f"{POLL_S:g} s)",
        )
        limit = GaugeMetricFamily(
            "firstpass_licence_store_max_age_seconds",
            "[escalation.elastic] monitor_stale_s: past this age the monitored licences gate",
        )
        monitor = self._monitor()
        for state in monitor.states() if monitor is not None else []:
            where = [state.key.route, str(state.key.rung)]
            tally = state.tally
            n.add_metric([*where, "random"], tally.audited)
            n.add_metric([*where, "feedback"], tally.feedback)
            failed.add_metric([*where, "random"], tally.failures)
            failed.add_metric([*where, "feedback"], tally.feedback_failures)
            bound.add_metric(where, state.bound)
            alpha.add_metric(where, state.terms.alpha)
            level.add_metric(where, state.terms.level)
            evalue.add_metric(where, math.exp(min(state.log_wealth, 700.0)))
            why = None if monitor is None else monitor.revocation(state.key.route, state.key.rung)
            revoked.add_metric(where, 1.0 if isinstance(why, Revocation | Predated) else 0.0)
            suspended.add_metric(where, 1.0 if isinstance(why, Suspension) else 0.0)
        store_age = monitor.store_age() if monitor is not None else None
        if monitor is not None and store_age is not None:
            age.add_metric([], store_age)
            if monitor.stale_s is not None:
                limit.add_metric([], monitor.stale_s)
        yield from (n, failed, bound, alpha, level, evalue, revoked, suspended, age, limit)
