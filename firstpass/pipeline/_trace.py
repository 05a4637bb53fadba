"""Everything that happened while answering one request, collected in order; it becomes the receipt.

The trace keeps its working state as the receipt's own typed parts (``firstpass.receipts``:
``UpstreamCall``, ``CheckEntry``, ``RevisionLoop``), answers the pipeline's questions about them
(``last_call``, ``prompt_tokens``, ``cascade_spend``...) as typed values, and builds the
``Receipt`` once, in ``record``. Nothing reads a receipt back to decide anything.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from firstpass import __version__
from firstpass.config import Config, RouteConfig, Rung
from firstpass.errors import UpstreamError
from firstpass.pipeline._budget import call_cost_usd
from firstpass.pipeline._seams import StageVerdict
from firstpass.providers import Completion
from firstpass.receipts import (
    SCHEMA_VERSION,
    UNSET,
    Action,
    AuditRecord,
    BudgetRecord,
    CheckEntry,
    CheckResultRecord,
    Content,
    Cost,
    Counterfactual,
    Decision,
    DroppedCase,
    ErrorBrief,
    ErrorRecord,
    FollowUp,
    FollowUpKind,
    Mode,
    ProbeRecord,
    Purpose,
    Receipt,
    RequestInfo,
    RevisionLoop,
    ServedRecord,
    Stage,
    Timings,
    UpstreamCall,
    Verification,
    sha256_text,
    valid_text,
)

__all__ = ["Counterfactuals", "Served", "ShadowLabels", "StageVerdict", "Trace", "usd"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Served:
    """The answer that went back to the client, and how much we vouch for it."""

    rung: int
    provider: str
    model: str
    text: str
    verification: Verification
    completion: Completion
    sample: int = 0  # which sample of the rung's call (the elastic probe draws several)
    revision: int = 0  # which revision of the rung's answer (0: the first answer)
    #: the answer of an SQL follow-up call (``_sql_followup``), None: the rung's own
    followup: FollowUpKind | None = None

    @property
    def answer(self) -> str:
        """The answer as receipts hash and store it: its text, and its tool calls when it made
        any, in canonical JSON: as the upstream's message carried them (``tool_calls``, or a
        legacy ``function_call``), else as Chat Completions spells them; two tool turns that
        call different tools never share a hash."""
        calls = self.completion.calls_of(0)
        if not calls:
            return self.text
        raw = self.completion.raw_calls_of(0)
        shown: dict[str, object] = (
            dict(raw) if raw is not None else {"tool_calls": [c.to_chat() for c in calls]}
        )
        return json.dumps(
            {"content": self.text, **shown},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )


@dataclass(frozen=True, kw_only=True, slots=True)
class ShadowLabels:
    """What shadow learned about rung 0: elastic's counterfactual and the gate's label on its
    candidate (``decision`` on the receipt); a label that could not be bought says why."""

    counterfactual: Counterfactual | None
    gate_label: bool | None
    label_sample: int | None
    label_budget: BudgetRecord | None = None
    label_error: ErrorBrief | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class Counterfactuals:
    """The other policy's estimated cost (docs/receipts.md, ``cost.counterfactual_usd``)."""

    usd: float
    #: the policy estimated: ``cascade`` on enforce's receipts, ``elastic`` on shadow's
    policy: Literal["cascade", "elastic"]


#: an upstream's error as a receipt keeps it: at most this many characters (a provider can
#: answer a failure with megabytes)
ERROR_CHARS = 2000


def usd(value: float) -> float:
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


@dataclass(kw_only=True, slots=True)
class _Spend:
    """Running sums of what the request cost (dollars) and where its time went (ms)."""

    cost_usd: float = 0.0
    probe_cost_usd: float = 0.0
    checks_cost_usd: float = 0.0
    label_checks_usd: float = 0.0
    upstream_ms: float = 0.0
    sandbox_ms: float = 0.0
    probe_ms: float = 0.0
    gate_ms: float = 0.0
    #: how long the last stage verification took (a revision must fit another like it)
    last_check_ms: float = 0.0


@dataclass(kw_only=True, eq=False)
class Trace:
    """Accumulates calls, checks and steps for one request; ``record()`` makes the receipt."""

    receipt_id: str
    config: Config
    route: RouteConfig | None
    mode: Mode
    request: RequestInfo
    #: ``time.perf_counter()`` when the request arrived (None: now)
    started: float | None = None
    time: str = field(default_factory=_utc_timestamp)
    upstream_calls: list[UpstreamCall] = field(default_factory=list)
    checks: list[CheckEntry] = field(default_factory=list)
    steps: list[str] = field(default_factory=list)
    #: one loop per rung the revision loop ran on (``Steps.revise``)
    revisions: list[RevisionLoop] = field(default_factory=list)
    #: the SQL follow-up calls made (``_sql_followup``)
    followups: list[FollowUp] = field(default_factory=list)
    spend: _Spend = field(default_factory=_Spend)
    #: input tokens of the first call that answered (per call): prices the estimates
    input_tokens_seen: int | None = None
    #: of those, read from / written to the provider's prompt cache (per call, the same call):
    #: the top-rung estimate prices them as the request's own calls were priced
    cache_tokens_seen: tuple[int, int] = (0, 0)
    #: what a runner has learned so far (``learned``): the receipt of an ending that cuts the
    #: request short (the deadline, a cancellation, no sandbox slot, a bug of ours) still
    #: carries it, so a label known before the cut reaches the monitor and calibration. Labels
    #: lost only on such endings would be missing not at random: a failed label goes on to the
    #: slower rungs, a passing one ends the request
    known_probe: Callable[[], ProbeRecord] | None = None
    known_shadow: ShadowLabels | None = None
    known_audit: AuditRecord | None = None

    def __post_init__(self) -> None:
        if self.started is None:
            self.started = time.perf_counter()

    def learned(
        self,
        *,
        probe: Callable[[], ProbeRecord] | None = None,
        shadow: ShadowLabels | None = None,
        audit: AuditRecord | None = None,
    ) -> None:
        """Keep what the runner knows now (``probe`` builds the probe record as it stands when
        the receipt is made) for an ending that cuts the request short."""
        if probe is not None:
            self.known_probe = probe
        if shadow is not None:
            self.known_shadow = shadow
        if audit is not None:
            self.known_audit = audit

    # -- what happened -------------------------------------------------------------------------

    def step(self, text: str) -> None:
        self.steps.append(text)

    def call(
        self,
        *,
        rung_index: int,
        rung: Rung,
        purpose: Purpose,
        n: int,
        latency_ms: float,
        completion: Completion | None = None,
        error: UpstreamError | None = None,
    ) -> float:
        """Record one logical upstream request; returns its cost in USD. Both ``completion``
        and ``error``: the request failed after some of its calls answered (``n`` by
        concurrent calls); those were billed, so their tokens and cost are recorded with it."""
        self.spend.upstream_ms += latency_ms
        cost = 0.0
        if completion is not None:
            cost = call_cost_usd(self.config.price(rung.name), completion)
            if self.input_tokens_seen is None:
                calls = max(1, completion.calls)
                self.input_tokens_seen = completion.input_tokens // calls
                self.cache_tokens_seen = (
                    completion.cache_read_tokens // calls,
                    completion.cache_write_tokens // calls,
                )
        answered = completion is not None and error is None
        entry = UpstreamCall(
            rung=rung_index,
            provider=rung.provider,
            model=rung.model,
            purpose=purpose,
            n=n,
            latency_ms=_round(latency_ms),
            calls=completion.calls if completion else 0,
            attempts=(completion.attempts if completion else 0) + (error.attempts if error else 0),
            status=error.status if error else completion.status if completion else None,
            input_tokens=completion.input_tokens if completion else 0,
            output_tokens=completion.output_tokens if completion else 0,
            cost_usd=usd(cost),
            cache_read_tokens=(completion.cache_read_tokens or UNSET) if completion else UNSET,
            cache_write_tokens=(completion.cache_write_tokens or UNSET) if completion else UNSET,
            cache_write_1h_tokens=(
                (completion.cache_write_1h_tokens or UNSET) if completion else UNSET
            ),
            error=None if answered else valid_text(str(error), ERROR_CHARS) if error else "unknown",
        )
        self.upstream_calls.append(entry)
        self.spend.cost_usd += cost
        if purpose == "probe":
            self.spend.probe_cost_usd += cost
        return cost

    def check(
        self,
        *,
        rung_index: int,
        sample: int,
        kind: Stage,
        result: StageVerdict,
        purpose: str | None = None,
        results: list[CheckResultRecord] | None = None,
    ) -> CheckEntry:
        """Record one stage's verdict on one answer; ``results`` are its listed checks' own.

        ``purpose = "label"`` marks a gate run made only to label a shadow receipt,
        ``"revision:N"`` the checks of a rung's N-th revision. Hidden cases the reference
        could not answer (``dropped_cases``: the verdict rests on fewer) are named too.
        """
        entry = CheckEntry(
            rung=rung_index,
            sample=sample,
            kind=kind,
            passed=bool(result.passed),
            n_passed=int(result.n_passed),
            n_total=int(result.n_total),
            category=result.category,
            isolation=result.isolation,
            ms=_round(float(result.wall_ms)),
            purpose=UNSET if purpose is None else purpose,
            dropped_cases=[DroppedCase(case=i, reason=why) for i, why in result.dropped_cases]
            or UNSET,
            results=results or UNSET,
        )
        self.spend.last_check_ms = float(result.wall_ms)
        if kind == "gate":
            self.spend.gate_ms += self.spend.last_check_ms
        self.checks.append(entry)
        return entry

    def check_cost(self, usd_spent: float, *, label: bool = False) -> None:
        """What a check spent upstream (a judge's call): part of the request's cost;
        ``label``: spent only to label a shadow receipt."""
        self.spend.cost_usd += usd_spent
        self.spend.checks_cost_usd += usd_spent
        if label:
            self.spend.label_checks_usd += usd_spent

    def revision_loop(self, rung: int) -> RevisionLoop:
        """Start recording the revision loop on ``rung``."""
        loop = RevisionLoop(rung=rung)
        self.revisions.append(loop)
        return loop

    def follow_up(self, *, rung: int, kind: FollowUpKind, check: str) -> FollowUp:
        """Start recording an SQL follow-up call on ``rung``'s answer."""
        entry = FollowUp(rung=rung, kind=kind, check=check)
        self.followups.append(entry)
        return entry

    def probe_wall(self, ms: float) -> None:
        """Wall time of one elastic probe: its k-sample call and its visible checks."""
        self.spend.probe_ms += ms

    def sandbox_wall(self, ms: float) -> None:
        """Wall time spent waiting for the sandbox (a parallel batch counts once)."""
        self.spend.sandbox_ms += ms

    # -- what the pipeline asks of it ----------------------------------------------------------

    @property
    def cost_usd(self) -> float:
        """What the request has spent so far (calls and checks)."""
        return self.spend.cost_usd

    @property
    def last_check_ms(self) -> float:
        return self.spend.last_check_ms

    def last_call(self) -> UpstreamCall | None:
        return self.upstream_calls[-1] if self.upstream_calls else None

    def first_upstream_error(self) -> str | None:
        """The first failed call's error (why a probe that was never drawn failed)."""
        return next((c.error for c in self.upstream_calls if c.error is not None), None)

    def cost_above(self, rung: int) -> float:
        """What the calls this request made above ``rung`` cost."""
        return float(sum(c.cost_usd for c in self.upstream_calls if c.rung > rung))

    def called_above(self, rung: int) -> bool:
        return any(c.rung > rung for c in self.upstream_calls)

    def prompt_tokens(self, rung_index: int) -> int | None:
        """The request's prompt in input tokens as this very rung counted them (its own
        tokenizer), when a call of it to this rung answered with a count; else None (the byte
        bound holds). Another rung's count bounds nothing here, and neither does a count of 0."""
        for made in self.upstream_calls:
            if (
                made.rung == rung_index
                and made.purpose not in ("revision", "reask", "self_check")
                and made.error is None
                and made.calls > 0
                and made.input_tokens > 0
            ):
                return made.input_tokens // made.calls
        return None

    def cascade_spend(self) -> float:
        """What the plain cascade would have spent so far on the calls shadow made for it: its
        attempts and revisions, one sample of each probe (the cascade's attempt is sample 0),
        and the checks it ran; not the calls and checks made only to label the receipt."""
        calls = 0.0
        for c in self.upstream_calls:
            if c.purpose == "probe":
                calls += c.cost_usd / max(1, c.n)
            elif c.purpose in ("attempt", "revision", "passthrough", "reask", "self_check"):
                calls += c.cost_usd
        return calls + self.spend.checks_cost_usd - self.spend.label_checks_usd

    def stage_of(self, kind: Stage, served: Served) -> CheckEntry | None:
        """The last ``kind`` stage run on exactly the served answer (its rung, sample and
        revision; label runs excluded)."""
        purpose = (
            served.followup
            if served.followup is not None
            else f"revision:{served.revision}"
            if served.revision
            else UNSET
        )
        for entry in reversed(self.checks):
            if (
                entry.kind == kind
                and entry.rung == served.rung
                and entry.sample == served.sample
                and entry.purpose == purpose
            ):
                return entry
        return None

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
            answered = [c for c in self.upstream_calls if c.calls]
            out = answered[-1].output_tokens // max(1, answered[-1].n) if answered else 0
        top = self.route.ladder[-1]
        return self._priced(top, out)

    def estimate_call_cost(self, rung: Rung) -> float:
        """One call to ``rung`` priced with this request's tokens (input seen, mean output seen)."""
        if self.input_tokens_seen is None:
            return 0.0
        answered = [c for c in self.upstream_calls if c.calls]
        outputs = sum(c.output_tokens for c in answered)
        choices = sum(c.n for c in answered) or 1
        return self._priced(rung, outputs // choices)

    def _priced(self, rung: Rung, output_tokens: int) -> float:
        """One call to ``rung`` with the input seen (its cached parts at the rung's cache
        prices, as the request's own calls were billed) and ``output_tokens``."""
        assert self.input_tokens_seen is not None
        read, write = self.cache_tokens_seen
        return self.config.price(rung.name).cost(
            self.input_tokens_seen,
            output_tokens,
            cache_read_tokens=read,
            cache_write_tokens=write,
        )

    def elapsed_ms(self) -> float:
        assert self.started is not None  # set in __post_init__
        return (time.perf_counter() - self.started) * 1000.0

    # -- the receipt ---------------------------------------------------------------------------

    def record(
        self,
        *,
        action: Action,
        served: Served | None,
        error: ErrorRecord | None = None,
        budget: BudgetRecord | None = None,
        shadow: ShadowLabels | None = None,
        probe: ProbeRecord | None = None,
        counterfactual: Counterfactuals | None = None,
        content: Content | None = None,
        audit: AuditRecord | None = None,
    ) -> Receipt:
        """The receipt, built once from everything recorded; what the runner ``learned`` fills
        in the probe, shadow's labels and the audit its ending did not pass."""
        if probe is None and self.known_probe is not None:
            probe = self.known_probe()
        shadow = shadow if shadow is not None else self.known_shadow
        audit = audit if audit is not None else self.known_audit
        total = self.elapsed_ms()
        spend = self.spend
        decision = Decision(action=action, steps=self.steps, counterfactual=None, gate_label=None)
        if shadow is not None:
            decision.counterfactual = shadow.counterfactual
            decision.gate_label = shadow.gate_label
            decision.label_sample = shadow.label_sample
            if shadow.label_budget is not None:
                decision.label_budget = shadow.label_budget
            if shadow.label_error is not None:
                decision.label_error = shadow.label_error
        if budget is not None:
            decision.budget = budget
        if audit is not None:
            decision.audit = audit
        return Receipt(
            schema_version=SCHEMA_VERSION,
            id=self.receipt_id,
            time=self.time,
            mode=self.mode,
            route=self.route.name if self.route else None,
            config_digest=self.config.digest,
            firstpass_version=__version__,
            request=self.request,
            upstream_calls=self.upstream_calls,
            checks=self.checks,
            decision=decision,
            probe=probe,
            served=None
            if served is None
            else ServedRecord(
                rung=served.rung,
                sample=served.sample,
                provider=served.provider,
                model=served.model,
                answer_sha256=sha256_text(served.answer),
                verification=served.verification,
                revision=served.revision or UNSET,
                followup=served.followup or UNSET,
            ),
            cost=Cost(
                total_usd=usd(spend.cost_usd),
                top_rung_usd=usd(self.top_rung_cost(served)),
                probe_usd=usd(spend.probe_cost_usd),
                checks_usd=usd(spend.checks_cost_usd) if spend.checks_cost_usd else UNSET,
                counterfactual_usd=UNSET if counterfactual is None else usd(counterfactual.usd),
                counterfactual_policy=UNSET if counterfactual is None else counterfactual.policy,
            ),
            timings_ms=Timings(
                total=_round(total),
                upstream=_round(spend.upstream_ms),
                sandbox=_round(spend.sandbox_ms),
                overhead=_round(max(0.0, total - spend.upstream_ms)),
                probe=_round(spend.probe_ms) if spend.probe_ms else UNSET,
                gate=_round(spend.gate_ms) if spend.gate_ms else UNSET,
            ),
            error=error,
            revisions=self.revisions or UNSET,
            followups=self.followups or UNSET,
            content=UNSET if content is None else content,
        )
