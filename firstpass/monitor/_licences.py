"""A licence's monitored state as values: its key, its terms, the counts each replica keeps, and
the revocation the e-process decides (pure: the store and the loop are in ``_monitor.py``).

A licence is a (route, rung, certificate id): a new certificate is another licence, with counts
of its own, which is why only a new certificate lifts a revocation, and only one calibrated on
data newer than the revocation, all of it (``predating``): an older certificate, or one
calibrated on receipts from before it (a whole log with a few rows after it among them), never
saw what the revoked licence's audits saw, or outweighs it with the rows that did not.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from firstpass._json import JSON
from firstpass.config import ElasticConfig
from firstpass.monitor._eprocess import DEFAULT_LEVEL, log_wealth, lower_bound
from firstpass.receipts import parse_time

__all__ = [
    "LabelSource",
    "LicenceKey",
    "Predated",
    "Revocation",
    "Suspension",
    "Tally",
    "Terms",
    "decide",
    "level_for",
    "licence_terms",
    "pooled",
    "predating",
]

#: where a label came from: a random audit, shadow's label of a would-be skip (rate 1), or a
#: client's delayed feedback (not a random sample: counted apart, never in the e-process)
LabelSource = Literal["audit", "shadow", "feedback"]


@dataclass(frozen=True, slots=True, order=True)
class LicenceKey:
    """What a label is about: the certificate in force at (route, rung)."""

    route: str
    rung: int
    certificate: str

    def text(self) -> str:
        """``route/rung/certificate``: the key in the state file, logs and receipt lines."""
        return f"{self.route}/{self.rung}/{self.certificate}"

    @classmethod
    def parse(cls, text: str) -> LicenceKey:
        """The inverse of ``text`` (a route name may hold ``/``: the last two parts are ours)."""
        route, rung, cert = text.rsplit("/", 2)
        return cls(route=route, rung=int(rung), certificate=cert)


@dataclass(frozen=True, slots=True)
class Terms:
    """What a licence promises and how sure its monitor must be before revoking it, and the
    time of the oldest row its certificate was calibrated on (None: not recorded)."""

    alpha: float
    level: float
    data_since: str | None = None


@dataclass(frozen=True, slots=True)
class Tally:
    """One replica's (or the pooled) labels of a licence: those the e-process counts (random
    audits and shadow labels) and the client feedback kept apart."""

    audited: int = 0
    failures: int = 0
    feedback: int = 0
    feedback_failures: int = 0

    def add(self, *, failed: bool, source: LabelSource) -> Tally:
        if source == "feedback":
            return Tally(
                audited=self.audited,
                failures=self.failures,
                feedback=self.feedback + 1,
                feedback_failures=self.feedback_failures + int(failed),
            )
        return Tally(
            audited=self.audited + 1,
            failures=self.failures + int(failed),
            feedback=self.feedback,
            feedback_failures=self.feedback_failures,
        )

    def __add__(self, other: Tally) -> Tally:
        return Tally(
            audited=self.audited + other.audited,
            failures=self.failures + other.failures,
            feedback=self.feedback + other.feedback,
            feedback_failures=self.feedback_failures + other.feedback_failures,
        )

    def to_dict(self) -> dict[str, JSON]:
        return {
            "audited": self.audited,
            "failures": self.failures,
            "feedback": self.feedback,
            "feedback_failures": self.feedback_failures,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> Tally:
        """A stored tally. ``ValueError`` when a field is not a count, or more failed than were
        labelled: read as 0 it would restart the test (a new look, which voids its level), so
        the store refuses the state instead (``_store._parse``: a ``ReceiptError``)."""

        def count(name: str) -> int:
            value = raw.get(name)
            if type(value) is not int or value < 0:
                raise ValueError(f"{name} is {value!r}, not a count")
            return value

        audited, failures = count("audited"), count("failures")
        feedback, feedback_failures = count("feedback"), count("feedback_failures")
        if failures > audited or feedback_failures > feedback:
            raise ValueError(f"more failures than labels: {dict(raw)!r}")
        return cls(
            audited=audited,
            failures=failures,
            feedback=feedback,
            feedback_failures=feedback_failures,
        )


@dataclass(frozen=True, slots=True)
class Revocation:
    """A licence the monitor revoked, with its evidence: the pooled counts it was decided on,
    the e-value and the lower confidence bound on the rate."""

    key: LicenceKey
    alpha: float
    level: float
    audited: int
    failures: int
    #: log of the e-process's wealth K_n(α) when it reached 1/level
    log_wealth: float
    #: the lower end of the (1 − level) confidence sequence for the rate, above α
    bound: float
    time: str
    replica: str

    def evidence(self) -> str:
        """One sentence a receipt's ``uncertified_because`` and the log carry."""
        return (
            f"revoked: certificate {self.key.certificate} at route {self.key.route!r} rung "
            f"{self.key.rung}: {self.failures} of {self.audited} audited skips failed the gate; "
            f"e-value {math.exp(min(self.log_wealth, 700.0)):.4g} ≥ 1/{self.level:g}, the "
            f"failure rate is above {self.bound:.4f} > α {self.alpha:g} with confidence "
            f"{1 - self.level:g} (revoked {self.time} by {self.replica}); calibrate again and "
            "cite the new file to lift it"
        )

    def to_dict(self) -> dict[str, JSON]:
        return {
            "licence": self.key.text(),
            "route": self.key.route,
            "rung": self.key.rung,
            "certificate": self.key.certificate,
            "alpha": self.alpha,
            "level": self.level,
            "audited": self.audited,
            "failures": self.failures,
            "log_wealth": self.log_wealth,
            "bound": self.bound,
            "time": self.time,
            "replica": self.replica,
        }

    @classmethod
    def from_dict(cls, raw: Mapping[str, object]) -> Revocation | None:
        """A stored revocation; None when it does not read as one (the caller says so)."""
        try:
            key = LicenceKey.parse(str(raw["licence"]))
            return cls(
                key=key,
                alpha=float(raw["alpha"]),  # type: ignore[arg-type]
                level=float(raw["level"]),  # type: ignore[arg-type]
                audited=int(raw["audited"]),  # type: ignore[call-overload]
                failures=int(raw["failures"]),  # type: ignore[call-overload]
                log_wealth=float(raw["log_wealth"]),  # type: ignore[arg-type]
                bound=float(raw["bound"]),  # type: ignore[arg-type]
                time=str(raw["time"]),
                replica=str(raw["replica"]),
            )
        except (KeyError, TypeError, ValueError):
            return None


@dataclass(frozen=True, slots=True)
class Suspension:
    """A monitored licence that may not skip for now: the store has not been synced for longer
    than ``[escalation.elastic] monitor_stale_s``, so a revocation another replica decided, or
    the one this replica's own audits would decide, cannot be seen (fail closed). It lifts at
    the next sync; the pipeline reads ``key`` and ``evidence()`` as for a ``Revocation``."""

    key: LicenceKey
    #: seconds since the last sync, and the setting it exceeds
    age_s: float
    limit_s: float

    def evidence(self) -> str:
        """One sentence a receipt's ``uncertified_because`` carries."""
        return (
            f"suspended: certificate {self.key.certificate} at route {self.key.route!r} rung "
            f"{self.key.rung}: the licence store has not synced for {self.age_s:.0f} s (more "
            f"than [escalation.elastic] monitor_stale_s = {self.limit_s:g}), so a revocation "
            "cannot be seen; it gates until the store answers again (see the "
            "licence_store_unavailable log event)"
        )


@dataclass(frozen=True, slots=True)
class Predated:
    """A licence treated as revoked: its certificate was calibrated on data from before a
    revocation at the same (route, rung) under another certificate, so it cannot lift it (that
    data never held what the audits that revoked the other one saw, and rows after it mixed in
    do not undo that). It holds as long as that revocation does: only a certificate whose
    oldest row is from after it skips again."""

    key: LicenceKey
    #: the certificate's ``data_since`` (None: not recorded) and the revocation it predates
    data_since: str | None
    revocation: Revocation

    def evidence(self) -> str:
        """One sentence a receipt's ``uncertified_because`` and the log carry."""
        rev = self.revocation
        data = (
            "the time of its oldest row is not recorded"
            if self.data_since is None
            else f"its oldest row is from {self.data_since}"
        )
        return (
            f"revoked: certificate {self.key.certificate} at route {self.key.route!r} rung "
            f"{self.key.rung} was calibrated on data from before the revocation of "
            f"{rev.key.certificate} at {rev.time} ({data}): calibrate on shadow receipts "
            f"collected after it only (`--since {rev.time}`) and cite the new file to lift it"
        )


def predating(
    key: LicenceKey, data_since: str | None, revocations: Iterable[Revocation]
) -> Predated | None:
    """The latest revocation at ``key``'s (route, rung) under another certificate that the
    certificate's oldest row (``data_since``) is from before (any, when it is unknown), else
    None. Its newest row does not count: one row after a revocation in a log otherwise from
    before it would lift it. A time that does not read counts as unknown: the licence then
    gates (fail closed)."""
    since = parse_time(data_since)
    found: list[tuple[datetime, Revocation]] = []
    for rev in revocations:
        if (rev.key.route, rev.key.rung) != (key.route, key.rung) or rev.key == key:
            continue
        # a revocation whose time does not read is taken as the latest: nothing lifts it
        when = parse_time(rev.time) or _LATEST
        if since is None or since < when:
            found.append((when, rev))
    if not found:
        return None
    _, latest = max(found, key=lambda pair: (pair[0], pair[1].key))
    return Predated(key=key, data_since=data_since, revocation=latest)


_LATEST = datetime.max.replace(tzinfo=UTC)


def pooled(replicas: Iterable[Mapping[LicenceKey, Tally]]) -> dict[LicenceKey, Tally]:
    """Every replica's counts summed per licence: the e-process depends on counts only, so this
    is the wealth of all their labels together."""
    total: dict[LicenceKey, Tally] = {}
    for tallies in replicas:
        for key, tally in tallies.items():
            total[key] = total.get(key, Tally()) + tally
    return total


def decide(
    key: LicenceKey, tally: Tally, terms: Terms, *, time: str, replica: str
) -> Revocation | None:
    """The revocation of ``key`` when its pooled counts reject H0 "rate ≤ α" at the licence's
    level (``firstpass.monitor._eprocess``), else None. Feedback never enters it."""
    wealth = log_wealth(tally.audited, tally.failures, terms.alpha)
    if wealth < -math.log(terms.level):
        return None
    return Revocation(
        key=key,
        alpha=terms.alpha,
        level=terms.level,
        audited=tally.audited,
        failures=tally.failures,
        log_wealth=wealth,
        bound=lower_bound(tally.audited, tally.failures, terms.level),
        time=time,
        replica=replica,
    )


def level_for(monitor_level: float | None, delta: float | None) -> float:
    """The monitor's level γ for a licence: ``[escalation.elastic] monitor_level``, else the
    certificate's δ, else ``DEFAULT_LEVEL``."""
    if monitor_level is not None:
        return monitor_level
    return delta if delta is not None else DEFAULT_LEVEL


def licence_terms(elastic: ElasticConfig | None) -> dict[LicenceKey, Terms]:
    """The licences a server monitors: each probed (route, rung)'s certificate in force that
    bounds the failure rate among skips (Learn-then-Test; a CRC certificate's α bounds the
    joint rate P(skip and fail), which labels of skips alone cannot test)."""
    if elastic is None:
        return {}
    terms: dict[LicenceKey, Terms] = {}
    for (route, rung), licence in elastic.licences.items():
        cert = licence.certificate
        if cert is None or cert.delta is None:
            continue
        key = LicenceKey(route=route, rung=rung, certificate=cert.id)
        terms[key] = Terms(
            alpha=cert.alpha,
            level=level_for(elastic.monitor_level, cert.delta),
            data_since=cert.data_since,
        )
    return terms
