"""Everything that happened while answering one request, collected in order; it becomes the receipt.

The trace is the only place that turns upstream calls and sandbox results into receipt fields,
so the receipt schema (docs/receipts.md) has one writer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from firstpass import __version__
from firstpass.config import Config, RouteConfig, Rung
from firstpass.errors import UpstreamError
from firstpass.providers import Completion
from firstpass.receipts import sha256_text

__all__ = ["Served", "Trace"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Served:
    """The answer that went back to the client, and how much we vouch for it."""

    rung: int
    provider: str
    model: str
    text: str
    verification: str  # "verified" | "unverified" | "unchecked" | "gate_skipped"
    completion: Completion
    sample: int = 0  # which sample of the rung's call (the elastic probe draws several)
    revision: int = 0  # which revision of the rung's answer (0: the first answer)


def usd(value: Any) -> Any:
    """Dollars to 12 decimals (a picodollar): sums of per-token prices carry binary float
    noise (0.30000000000000004) that a receipt or a summary should not show."""
    return round(value, 12) if isinstance(value, float) else value


def _round(x: float, digits: int = 3) -> float:
    return round(x, digits)


_second: tuple[int, str] = (-1, "")  # the last whole second formatted, reused within it


def _utc_timestamp() -> str:
    """Now in UTC as ``2026-01-31T12:00:00.123Z`` (ISO 8601, milliseconds, truncated).

    Every request stamps one; formatting the date once per second instead of through
    ``datetime.isoformat`` each time keeps it off the per-request bill.
    """
    global _second
    seconds, millis = divmod(time.time_ns() // 1_000_000, 1000)
    cached_at, text = _second
    if cached_at != seconds:
        text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds))
        _second = (seconds, text)
    return f"{text}.{millis:03d}Z"


class Trace:
    """Accumulates calls, checks and steps for one request; ``record()`` makes the receipt dict."""

    def __init__(
        self,
        *,
        receipt_id: str,
        config: Config,
        route: RouteConfig | None,
        mode: str,
        request: dict[str, Any],
        started: float | None = None,
    ) -> None:
        self.receipt_id = receipt_id
        self.config = config
        self.route = route
        self.mode = mode
        self.request = request
        self.started = time.perf_counter() if started is None else started
        self.time = _utc_timestamp()
        self.upstream_calls: list[dict[str, Any]] = []
        self.checks: list[dict[str, Any]] = []
        self.steps: list[str] = []
        self.cost_usd = 0.0
        self.probe_cost_usd = 0.0
        self.upstream_ms = 0.0
        self.sandbox_ms = 0.0
        self.input_tokens_seen: int | None = None
        #: one entry per rung the revision loop ran on (``Steps.revise``)
        self.revisions: list[dict[str, Any]] = []
        self.checks_cost_usd = 0.0
        self.label_checks_usd = 0.0
        #: how long the last stage verification took (a revision must fit another like it)
        self.last_check_ms = 0.0
        #: wall time of the elastic probes (call and visible checks) and of the gate runs
        self.probe_ms = 0.0
        self.gate_ms = 0.0

    # -- what happened -------------------------------------------------------------------------

    def step(self, text: str) -> None:
        self.steps.append(text)

    def call(
        self,
        *,
        rung_index: int,
        rung: Rung,
        purpose: str,
        n: int,
        latency_ms: float,
        completion: Completion | None = None,
        error: UpstreamError | None = None,
    ) -> float:
        """Record one logical upstream request; returns its cost in USD."""
        self.upstream_ms += latency_ms
        cost = 0.0
        entry: dict[str, Any] = {
            "rung": rung_index,
            "provider": rung.provider,
            "model": rung.model,
            "purpose": purpose,
            "n": n,
            "latency_ms": _round(latency_ms),
        }
        if completion is not None:
            cost = self.config.price(rung.name).cost(
                completion.input_tokens, completion.output_tokens
            )
            if self.input_tokens_seen is None:
                self.input_tokens_seen = completion.input_tokens // max(1, completion.calls)
            entry.update(
                calls=completion.calls,
                attempts=completion.attempts,
                status=completion.status,
                input_tokens=completion.input_tokens,
                output_tokens=completion.output_tokens,
                cost_usd=usd(cost),
                error=None,
            )
        else:
            entry.update(
                calls=0,
                attempts=error.attempts if error else 0,
                status=error.status if error else None,
                input_tokens=0,
                output_tokens=0,
                cost_usd=0.0,
                error=str(error) if error else "unknown",
            )
        self.upstream_calls.append(entry)
        self.cost_usd += cost
        if purpose == "probe":
            self.probe_cost_usd += cost
        return cost

    def check(
        self,
        *,
        rung_index: int,
        sample: int,
        kind: str,
        result: Any,
        purpose: str | None = None,
        results: list[dict[str, Any]] | None = None,
    ) -> None:
        """Record one stage's verdict on one answer (``result``: a ``StageResult`` or the
        sandbox's ``SampleResult``); ``results`` are its listed checks' own, when it has any.

        ``purpose = "label"`` marks a gate run made only to label a shadow receipt,
        ``"revision:N"`` the checks of a rung's N-th revision.
        """
        entry: dict[str, Any] = {
            "rung": rung_index,
            "sample": sample,
            "kind": kind,
            "passed": bool(result.passed),
            "n_passed": int(result.n_passed),
            "n_total": int(result.n_total),
            "category": result.category,
            "isolation": result.isolation,
            "ms": _round(float(result.wall_ms)),
        }
        if purpose is not None:
            entry["purpose"] = purpose
        dropped = getattr(result, "dropped_cases", ())
        if dropped:  # hidden cases the reference could not answer: the verdict rests on fewer
            entry["dropped_cases"] = [{"case": i, "reason": why} for i, why in dropped]
        if results:
            entry["results"] = results
        self.last_check_ms = float(result.wall_ms)
        if kind == "gate":
            self.gate_ms += self.last_check_ms
        self.checks.append(entry)

    def check_cost(self, usd_spent: float, *, label: bool = False) -> None:
        """What a check spent upstream (a judge's call): part of the request's cost;
        ``label``: spent only to label a shadow receipt."""
        self.cost_usd += usd_spent
        self.checks_cost_usd += usd_spent
        if label:
            self.label_checks_usd += usd_spent

    def cascade_spend(self) -> float:
        """What the plain cascade would have spent so far on the calls shadow made for it: its
        attempts and revisions, one sample of each probe (the cascade's attempt is sample 0),
        and the checks it ran; not the calls and checks made only to label the receipt."""
        calls = 0.0
        for c in self.upstream_calls:
            if c["purpose"] == "probe":
                calls += c["cost_usd"] / max(1, c["n"])
            elif c["purpose"] in ("attempt", "revision", "passthrough"):
                calls += c["cost_usd"]
        return calls + self.checks_cost_usd - self.label_checks_usd

    def probe_wall(self, ms: float) -> None:
        """Wall time of one elastic probe: its k-sample call and its visible checks."""
        self.probe_ms += ms

    def sandbox_wall(self, ms: float) -> None:
        """Wall time spent waiting for the sandbox (a parallel batch counts once)."""
        self.sandbox_ms += ms

    # -- the receipt ---------------------------------------------------------------------------

    def top_rung_cost(self, served: Served | None) -> float:
        """What one call to the top rung would have cost for this request (an estimate).

        Input tokens: those of the first call that answered; output tokens: those of the served
        answer (else of the last answer seen). Zero when no call answered.
        """
        if self.route is None or self.input_tokens_seen is None:
            return 0.0
        if served is not None:
            out = served.completion.output_tokens // max(1, served.completion.n)
        else:
            answered = [c for c in self.upstream_calls if c["calls"]]
            out = answered[-1]["output_tokens"] // max(1, answered[-1]["n"]) if answered else 0
        top = self.route.ladder[-1]
        return self.config.price(top.name).cost(self.input_tokens_seen, out)

    def estimate_call_cost(self, rung: Rung) -> float:
        """One call to ``rung`` priced with this request's tokens (input seen, mean output seen)."""
        if self.input_tokens_seen is None:
            return 0.0
        answered = [c for c in self.upstream_calls if c["calls"]]
        outputs = sum(c["output_tokens"] for c in answered)
        choices = sum(c["n"] for c in answered) or 1
        return self.config.price(rung.name).cost(self.input_tokens_seen, outputs // choices)

    def elapsed_ms(self) -> float:
        return (time.perf_counter() - self.started) * 1000.0

    def record(
        self,
        *,
        action: str,
        served: Served | None,
        error: dict[str, Any] | None = None,
        decision: dict[str, Any] | None = None,
        probe: dict[str, Any] | None = None,
        extra_cost: dict[str, Any] | None = None,
        content: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        total = self.elapsed_ms()
        record: dict[str, Any] = {
            "id": self.receipt_id,
            "time": self.time,
            "mode": self.mode,
            "route": self.route.name if self.route else None,
            "config_digest": self.config.digest,
            "firstpass_version": __version__,
            "request": self.request,
            "upstream_calls": self.upstream_calls,
            "checks": self.checks,
            "decision": {
                "action": action,
                "steps": self.steps,
                "counterfactual": None,
                "gate_label": None,
                **(decision or {}),
            },
            "probe": probe,
            "served": None
            if served is None
            else {
                "rung": served.rung,
                "sample": served.sample,
                "provider": served.provider,
                "model": served.model,
                "answer_sha256": sha256_text(served.text),
                "verification": served.verification,
                **({"revision": served.revision} if served.revision else {}),
            },
            "cost": {
                key: usd(value)
                for key, value in {
                    "total_usd": self.cost_usd,
                    "top_rung_usd": self.top_rung_cost(served),
                    "probe_usd": self.probe_cost_usd,
                    **({"checks_usd": self.checks_cost_usd} if self.checks_cost_usd else {}),
                    **(extra_cost or {}),
                }.items()
            },
            "timings_ms": {
                "total": _round(total),
                "upstream": _round(self.upstream_ms),
                "sandbox": _round(self.sandbox_ms),
                "overhead": _round(max(0.0, total - self.upstream_ms)),
                **({"probe": _round(self.probe_ms)} if self.probe_ms else {}),
                **({"gate": _round(self.gate_ms)} if self.gate_ms else {}),
            },
            "error": error,
        }
        if self.revisions:
            record["revisions"] = self.revisions
        if content is not None:
            record["content"] = content
        return record
