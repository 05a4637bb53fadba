"""One elastic probe as values: the k samples of a rung, their visible verdicts, the regime,
and the receipt's view of it (``Probe.record``); what shadow learned from it (``Labelled``).

Apart from the runner (``_elastic.py``) so the probe's record, the request's sampling and the
per-sample view are readable, and testable, without the I/O that draws them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import cast

from firstpass._json import JSON
from firstpass.budgets import budget_record
from firstpass.config import Certificate, Given, Rung, candidate_rule
from firstpass.errors import BudgetExhausted, SandboxBusy
from firstpass.pipeline._state import Answer, RunRequest
from firstpass.pipeline._verify import StageResult
from firstpass.policy import Attempt, Regime
from firstpass.probe import ProbeInputs
from firstpass.providers import Completion
from firstpass.receipts import (
    UNSET,
    BudgetRecord,
    Counterfactual,
    ErrorBrief,
    GivenRecord,
    ProbeRecord,
    ProbeSample,
    ScoreRecord,
)

__all__ = ["Labelled", "Probe", "cert_id", "given_record", "sample_view", "sampling"]


@dataclass(frozen=True, kw_only=True)
class Probe:
    """k samples from one rung, their visible results, and what the policy makes of them."""

    rung_index: int
    rung: Rung
    k: int
    answers: tuple[Answer, ...]  # one per sample, each holding its own choice
    visible: tuple[StageResult, ...]  # one verdict per sample (tests and listed checks)
    pass_count: int
    regime: Regime
    order: tuple[int, ...]  # passing samples, best candidate first
    cost_usd: float
    calls: int
    score_name: str = "pass_share"
    #: what a sample had to pass: ``tests`` and the listed visible checks, by name
    visible_checks: tuple[str, ...] = ("tests",)
    #: the route's listed visible checks' digest (certificates carry it; None: none listed)
    checks_digest: str | None = None
    #: the checks the request added itself (such a probe is never certified, nor calibrated on)
    request_checks: tuple[str, ...] = ()
    #: λ in force at this (route, rung) for this request's mode; None: no certificate, it gates
    lam: float | None = None
    #: the certificate λ comes from (None: uncertified, see ``licence_problem``)
    certificate: Certificate | None = None
    licence_problem: str | None = None
    #: how the samples were drawn (part of a certificate's context)
    temperature: float | None = None
    top_p: float | None = None
    logit_bias: bool = False
    #: the upstream drawn from (``ProviderConfig.endpoint``; certificates bind it)
    endpoint: str | None = None
    #: what "failure" means for this request: the route's gate checks' digest (None: none)
    #: and whether its gate includes the request's hidden tests
    gate_checks_digest: str | None = None
    gate_hidden_tests: bool = False
    #: fields sent upstream that no certificate binds (``config.unbound_fields``)
    unbound_fields: tuple[str, ...] = ()
    #: how the visible tests also passed a null stub (None: they did not, or were not tried)
    vacuous_visible: str | None = None
    #: no visible tests where the request's hidden tests are the gate (``RequestDraw``)
    no_visible_tests: bool = False
    #: the output cap the probe's call was sent with (``Steps.sent_cap``: the request's own
    #: max_tokens or max_completion_tokens, else the one the budgets add; None: none, or two
    #: that differ, which ``unbound_fields`` then names); kept on the probe so that every record
    #: of it names it, however the request ends
    output_cap: int | None = None
    # behavioural scores only (None with the default pass_share: the receipt stays as it was)
    scores: dict[str, float] | None = None
    clusters: tuple[int, ...] = ()
    inputs: ProbeInputs | None = None
    #: the samples that ended in tool calls (route ``tool_turns = "pass"``): not answers, so
    #: never a pass, a candidate, a label or what is served (sample 0 never is one here)
    tool_samples: frozenset[int] = frozenset()

    @property
    def candidate(self) -> int:
        """The sample elastic would serve or gate: the best passing one, else the best failing
        answer (a sample that called a tool is neither)."""
        if self.order:
            return self.order[0]
        return max(
            (i for i in range(len(self.visible)) if i not in self.tool_samples),
            key=lambda i: (share(self.visible[i]), -i),
        )

    @property
    def score(self) -> float:
        """The value compared with λ: the configured score of this probe."""
        if self.scores is None:
            return self.pass_count / self.k
        return self.scores[self.score_name]

    def record(self, *, escalate_at: int, max_gate_candidates: int) -> ProbeRecord:
        """The receipt's view of this probe: what was drawn, what passed, the regime, and the
        certificate (or its absence) that decided it."""
        behavioural = self.scores is not None
        samples = [
            ProbeSample(
                n_passed=r.n_passed,
                n_total=r.n_total,
                category=r.category,
                behaviour=r.behaviour if behavioural else UNSET,
            )
            for r in self.visible
        ]
        cert = self.certificate
        inputs = self.inputs
        return ProbeRecord(
            rung=self.rung_index,
            provider=self.rung.provider,
            model=self.rung.model,
            temperature=self.temperature,
            top_p=self.top_p,
            logit_bias=True if self.logit_bias else UNSET,
            endpoint=UNSET if self.endpoint is None else self.endpoint,
            gate_checks_digest=UNSET
            if self.gate_checks_digest is None
            else self.gate_checks_digest,
            gate_hidden_tests=self.gate_hidden_tests,
            unbound_fields=list(self.unbound_fields) if self.unbound_fields else UNSET,
            vacuous_visible=UNSET if self.vacuous_visible is None else self.vacuous_visible,
            no_visible_tests=True if self.no_visible_tests else UNSET,
            output_cap=UNSET if self.output_cap is None else self.output_cap,
            k=self.k,
            visible_checks=list(self.visible_checks)
            if self.visible_checks != ("tests",)
            else UNSET,
            visible_checks_digest=UNSET if self.checks_digest is None else self.checks_digest,
            request_checks=list(self.request_checks) if self.request_checks else UNSET,
            pass_count=self.pass_count,
            regime=self.regime,
            score=ScoreRecord(name=self.score_name, value=self.score),
            scores=dict(self.scores) if self.scores is not None else UNSET,
            g=(self.clusters[0] if self.clusters else 0) if behavioural else UNSET,
            clusters=list(self.clusters) if behavioural else UNSET,
            probe_inputs=(len(inputs) if inputs is not None else 0) if behavioural else UNSET,
            probe_inputs_from_request=(inputs.from_request if inputs is not None else 0)
            if behavioural
            else UNSET,
            samples=samples,
            candidate=self.candidate,
            candidate_rule=candidate_rule(self.score_name),
            lambda_=self.lam,
            escalate_at=escalate_at,
            max_gate_candidates=max_gate_candidates,
            certificate=None if cert is None else cert.id,
            uncertified_because=self.licence_problem if cert is None else None,
            calibration_id=None if cert is None else cert.id,
            alpha=None if cert is None else cert.alpha,
            delta=None if cert is None else cert.delta,
            calls=self.calls,
            cost_usd=self.cost_usd,
        )


@dataclass(frozen=True, kw_only=True)
class Labelled:
    """What shadow learned from one probe: the gate's verdict on elastic's candidate, what
    elastic would have done, whether it goes up the ladder, and the cascade's attempt."""

    label: bool | None
    counterfactual: Counterfactual | None
    escalates: bool
    attempt: Attempt
    #: the cascade's gate on sample 0 (what a revision of it would be told), if it ran
    gate0: StageResult | None = None
    #: why a label gate did not run (a budget cap, no sandbox slot): the label is then
    #: absent, never guessed, and the request goes on as the cascade would
    refused: BudgetExhausted | SandboxBusy | None = None

    @property
    def label_budget(self) -> BudgetRecord | None:
        """The cap that refused a label gate (the label is then absent)."""
        if isinstance(self.refused, BudgetExhausted):
            return budget_record(self.refused)
        return None

    @property
    def label_error(self) -> ErrorBrief | None:
        """Why a label gate got no sandbox slot (the label is then absent)."""
        if self.refused is not None and not isinstance(self.refused, BudgetExhausted):
            return ErrorBrief(type="sandbox_busy", message=str(self.refused))
        return None


def sampling(req: RunRequest) -> tuple[float | None, float | None]:
    """The temperature and top_p the probe is drawn at (the route's temperature unless the
    request sets its own), as ``Pipeline._call`` sends them."""
    # admission checked that both are numbers when the request sets them (``_chat._NUMBERS``)
    temperature = cast("float | None", req.body.get("temperature", req.route.temperature))
    top_p = cast("float | None", req.body.get("top_p"))
    return (
        None if temperature is None else float(temperature),
        None if top_p is None else float(top_p),
    )


def cert_id(cert: Certificate | None) -> str | None:
    return None if cert is None else cert.id


def share(result: StageResult) -> float:
    return result.n_passed / result.n_total if result.n_total else 0.0


def sample_view(completion: Completion, i: int, *, keep_raw: bool = False) -> Completion:
    """The ``i``-th choice of an n-choice completion, as a one-choice completion.

    Usage is split evenly: input tokens per call, output tokens per choice. ``keep_raw``: keep
    the upstream's JSON with only that choice (re-indexed 0) and that usage, for an answer that
    goes out as the upstream sent it (a tool turn).
    """
    n = max(1, completion.n)
    reasons = completion.finish_reasons
    view = dataclasses.replace(
        completion,
        texts=(completion.texts[i],),
        finish_reasons=(reasons[i] if i < len(reasons) else None,),
        tool_calls=(completion.calls_of(i),),
        input_tokens=completion.input_tokens // max(1, completion.calls),
        cache_read_tokens=completion.cache_read_tokens // max(1, completion.calls),
        cache_write_tokens=completion.cache_write_tokens // max(1, completion.calls),
        cache_write_1h_tokens=completion.cache_write_1h_tokens // max(1, completion.calls),
        output_tokens=completion.output_tokens // n,
        calls=1,
        raw=None,
    )
    raw = completion.raw
    listed = raw.get("choices") if keep_raw and raw is not None else None
    if raw is None or not isinstance(listed, list) or i >= len(listed):
        return view
    choice = listed[i]
    usage: dict[str, JSON] = {
        "prompt_tokens": view.input_tokens,
        "completion_tokens": view.output_tokens,
        "total_tokens": view.input_tokens + view.output_tokens,
    }
    one: JSON = {**choice, "index": 0} if isinstance(choice, dict) else choice
    return dataclasses.replace(view, raw={**raw, "choices": [one], "usage": usage})


def given_record(given: Given) -> GivenRecord:
    """A lower probed rung as the receipt spells it (``Given.to_dict``'s keys)."""
    return GivenRecord(
        rung=given.rung,
        certificate=given.certificate,
        lambda_=given.lambda_,
        escalate_at=given.escalate_at,
        max_gate_candidates=given.max_gate_candidates,
    )
