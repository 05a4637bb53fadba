"""The receipt as typed values: one line of the log, field by field (docs/receipts.md).

The pipeline builds a ``Receipt`` once, at the end of a request, from its typed working state;
the writer, the metrics, the request log, ``receipts summary`` and calibration all read these
same types. Encoding goes through ``msgspec.to_builtins`` and then the canonical JSON of
``_canonical.py``, so the bytes (and the hash chain) are exactly what a dict would give.

Two kinds of optional field, because the log's shape is a contract:

- ``T | None`` fields are always written (``null`` when empty): every line has them;
- ``T | UnsetType = UNSET`` fields are written only when set (``revision`` of a served answer
  that was never revised is absent, not ``0``), as the lines before schema version 2 were.

``SCHEMA_VERSION`` is written on every line; a line without ``schema_version`` is version 1
(written before 0.2.0) and reads into the same types: version 2 only added the field
(CHANGELOG.md, "Receipt schema").
"""

from __future__ import annotations

from typing import Literal

import msgspec
from msgspec import UNSET, Struct, UnsetType, field

__all__ = [
    "SCHEMA_VERSION",
    "UNSET",
    "Action",
    "AuditRecord",
    "BudgetRecord",
    "CheckEntry",
    "CheckResultRecord",
    "Content",
    "Cost",
    "Counterfactual",
    "Decision",
    "Dialect",
    "DroppedCase",
    "ErrorBrief",
    "ErrorRecord",
    "FollowUp",
    "FollowUpKind",
    "FollowUpStop",
    "GivenRecord",
    "Mode",
    "ProbeRecord",
    "ProbeSample",
    "Purpose",
    "Receipt",
    "Regime",
    "RequestInfo",
    "RevisionAttempt",
    "RevisionLoop",
    "RevisionStop",
    "ScoreRecord",
    "ServedRecord",
    "Stage",
    "Timings",
    "UnsetType",
    "UpstreamCall",
    "Verdict",
    "Verification",
    "receipt_from_builtins",
]

#: the version this code writes (``schema_version``); 1: lines without the field
SCHEMA_VERSION = 2

#: how the request was run (``rejected``: refused before it ran)
Mode = Literal["cascade", "passthrough", "shadow", "enforce", "rejected"]

#: what became of the request (docs/receipts.md, "decision.action")
Action = Literal[
    "served",
    "escalated",
    "served_without_gate",
    "served_after_gate",
    "exhausted_unverified",
    "exhausted_error",
    "upstream_error",
    "passthrough",
    "budget_exhausted",
    "timeout",
    "cancelled",
    "sandbox_busy",
    "internal_error",
    "rejected",
    "receipts_unavailable",
    "tool_turn",
]

#: the API a request came through: Chat Completions, OpenAI Responses, Anthropic Messages
Dialect = Literal["chat", "responses", "messages"]
#: what elastic would have done (shadow) on the probed rung
Counterfactual = Literal[
    "escalate", "serve_without_gate", "serve_after_gate", "escalate_after_gate"
]
#: the probe's regime: the pass share against λ and ``escalate_at``
Regime = Literal["escalate", "gate", "serve"]
#: why an upstream call was made (``label``: only to label a shadow receipt; ``reask`` and
#: ``self_check``: an SQL answer's follow-up calls, docs/checks.md "Follow-up calls")
Purpose = Literal["attempt", "probe", "revision", "passthrough", "label", "reask", "self_check"]
#: an SQL answer's follow-up call: the corrective re-ask, or the self-check
FollowUpKind = Literal["reask", "self_check"]
#: why a follow-up gave no answer to check
FollowUpStop = Literal["deadline", "budget", "upstream_error", "interrupted", "tool_turn"]
#: how much Firstpass vouches for the served answer
Verification = Literal["verified", "unverified", "unchecked", "gate_skipped"]
#: a check stage: the visible tests and checks, or the gate (hidden tests and gate checks)
Stage = Literal["visible", "gate"]
#: why a revision loop stopped (None: its last revision passed)
RevisionStop = Literal[
    "max_revisions",
    "not_revisable",
    "deadline",
    "budget",
    "upstream_error",
    "interrupted",
    "tool_turn",
]
#: a check's verdict before ``on_abstain`` is applied
Verdict = Literal["pass", "fail", "abstain"]

#: dollars and other numbers written as computed: an int stays an int (``0``), a float a float
Number = int | float


class _Part(Struct, kw_only=True):
    """A receipt part: keyword-only, unknown keys of a later schema ignored when read."""


class RequestInfo(_Part):
    """What was asked, without its text: the prompt only as a hash."""

    model: str | UnsetType | None = UNSET
    prompt_sha256: str | UnsetType | None = UNSET
    stream: bool | UnsetType | None = UNSET
    n_messages: int | UnsetType = UNSET
    n_visible: int | UnsetType = UNSET
    n_hidden: int | UnsetType = UNSET
    task_id: str | UnsetType | None = UNSET
    #: the configured name of the client key that authenticated it (never the key)
    client_key: str | UnsetType = UNSET
    #: the API it came through (unset on receipts written before dialects existed: chat)
    dialect: Dialect | UnsetType = UNSET


class UpstreamCall(_Part):
    """One logical upstream request (``n`` choices; ``calls`` HTTP calls made for them)."""

    rung: int
    provider: str
    model: str
    purpose: Purpose
    n: int
    latency_ms: Number
    calls: int
    attempts: int
    status: int | None
    input_tokens: int
    output_tokens: int
    cost_usd: Number
    error: str | None
    #: of ``input_tokens``: read from the provider's prompt cache, and written to it (priced
    #: apart, ``[[prices]] cache_read_per_mtok``/``cache_write_per_mtok``); unset when none
    cache_read_tokens: int | UnsetType = UNSET
    cache_write_tokens: int | UnsetType = UNSET
    #: of ``cache_write_tokens``: written to a 1-hour cache entry (Anthropic ``ttl: "1h"``,
    #: priced at ``[[price]] cache_write_1h_per_mtok``); unset when none
    cache_write_1h_tokens: int | UnsetType = UNSET


class DroppedCase(_Part):
    """A hidden case the reference could not answer: the verdict rests on fewer."""

    case: int
    reason: str


class CheckResultRecord(_Part):
    """One listed check's result (``CheckResult.to_dict``)."""

    name: str
    kind: str
    verdict: Verdict
    passed: bool
    score: Number
    category: str | None
    severity: str
    needs_revision: bool
    on_abstain: str | UnsetType = UNSET
    reasons: list[str] | UnsetType = UNSET
    details: dict[str, object] | UnsetType = UNSET
    cost_usd: Number | UnsetType = UNSET
    ms: Number | UnsetType = UNSET
    parts: list[CheckResultRecord] | UnsetType = UNSET


class CheckEntry(_Part):
    """One stage's verdict on one answer: its tests and listed checks as one."""

    rung: int
    sample: int
    kind: Stage
    passed: bool
    n_passed: int
    n_total: int
    #: the sandbox's category of a failed test run, or the check taxonomy's (docs/checks.md)
    category: str | None
    isolation: str
    ms: Number
    #: ``label`` (a gate run only to label a shadow receipt) or ``revision:N``
    purpose: str | UnsetType = UNSET
    dropped_cases: list[DroppedCase] | UnsetType = UNSET
    results: list[CheckResultRecord] | UnsetType = UNSET


class BudgetRecord(_Part):
    """The cap a call would have crossed (``budget_record``)."""

    exhausted: str
    limit_usd: Number
    spent_usd: Number
    needed_usd: Number
    store: Literal["unavailable"] | UnsetType = UNSET


class ErrorBrief(_Part):
    """Why a label gate did not run (no sandbox slot)."""

    type: str
    message: str


class AuditRecord(_Part):
    """A would-be skip drawn at random (``[escalation.elastic] audit_rate``) and gated anyway:
    ``label`` is the gate's verdict on the sample elastic would have served without it (None:
    the gate could not run). The gated outcome is what was served."""

    rung: int
    rate: Number
    certificate: str
    label: bool | None


class Decision(_Part):
    """What was decided, and the steps that led there."""

    action: Action
    steps: list[str]
    counterfactual: Counterfactual | None
    gate_label: bool | None
    label_sample: int | UnsetType | None = UNSET
    budget: BudgetRecord | UnsetType = UNSET
    label_budget: BudgetRecord | UnsetType = UNSET
    label_error: ErrorBrief | UnsetType = UNSET
    audit: AuditRecord | UnsetType = UNSET


class ScoreRecord(_Part):
    name: str
    value: Number


class ProbeSample(_Part):
    n_passed: int
    n_total: int
    category: str | None
    behaviour: str | UnsetType | None = UNSET


class GivenRecord(_Part):
    """A lower probed rung as it ran (``config.Given``): a higher rung's label depends on it."""

    rung: int
    certificate: str | None
    lambda_: Number | None = field(name="lambda")
    escalate_at: int
    max_gate_candidates: int


class ProbeRecord(_Part):
    """The elastic probe of one rung: k samples, their visible results, the regime and the
    certificate that decided it. A probe that could not be drawn has only ``rung`` and
    ``error`` (and ``budget`` when a cap refused it); ``later`` holds the higher probed rungs,
    each with its shadow label fields."""

    rung: int
    error: str | UnsetType | None = UNSET
    budget: BudgetRecord | UnsetType = UNSET
    sandbox_busy: bool | UnsetType = UNSET
    provider: str | UnsetType = UNSET
    model: str | UnsetType = UNSET
    temperature: Number | UnsetType | None = UNSET
    top_p: Number | UnsetType | None = UNSET
    logit_bias: bool | UnsetType = UNSET
    k: int | UnsetType = UNSET
    visible_checks: list[str] | UnsetType = UNSET
    visible_checks_digest: str | UnsetType = UNSET
    request_checks: list[str] | UnsetType = UNSET
    #: the upstream the samples came from (the rung's provider base URL, no credentials)
    endpoint: str | UnsetType = UNSET
    #: the output cap the probe's call was sent with: the request's own ``max_tokens`` or
    #: ``max_completion_tokens``, else a budget's ``default_max_tokens``, else an Anthropic
    #: rung's required default (what its provider sends); it shapes which
    #: answers pass, so certificates bind it; absent: none, or two fields that differ (then in
    #: ``unbound_fields``)
    output_cap: int | UnsetType = UNSET
    #: what "failure" meant: the route's gate checks' digest, and whether the request's hidden
    #: tests were part of the gate
    gate_checks_digest: str | UnsetType = UNSET
    gate_hidden_tests: bool | UnsetType = UNSET
    #: request fields sent upstream that are not on the list of fields that leave the probe's
    #: sampling alone (``config.SKIP_SAFE_FIELDS``): any of them voids the certificate
    unbound_fields: list[str] | UnsetType = UNSET
    #: the visible tests also passed a null stub of the entry point ("returns_none", "raises"):
    #: they carry no signal, so they license no skip
    vacuous_visible: str | UnsetType = UNSET
    #: the request brought no visible tests where its hidden tests are the gate: its pass share
    #: is the route's listed checks alone, so it licenses no skip and calibrates nothing
    no_visible_tests: bool | UnsetType = UNSET
    pass_count: int | UnsetType = UNSET
    regime: Regime | UnsetType = UNSET
    score: ScoreRecord | UnsetType = UNSET
    scores: dict[str, Number] | UnsetType = UNSET
    g: int | UnsetType = UNSET
    clusters: list[int] | UnsetType = UNSET
    probe_inputs: int | UnsetType = UNSET
    probe_inputs_from_request: int | UnsetType = UNSET
    samples: list[ProbeSample] | UnsetType = UNSET
    candidate: int | UnsetType = UNSET
    candidate_rule: str | UnsetType = UNSET
    lambda_: Number | UnsetType | None = field(default=UNSET, name="lambda")
    escalate_at: int | UnsetType = UNSET
    max_gate_candidates: int | UnsetType = UNSET
    certificate: str | UnsetType | None = UNSET
    uncertified_because: str | UnsetType | None = UNSET
    calibration_id: str | UnsetType | None = UNSET
    alpha: Number | UnsetType | None = UNSET
    delta: Number | UnsetType | None = UNSET
    calls: int | UnsetType = UNSET
    cost_usd: Number | UnsetType = UNSET
    # shadow's labels of a higher rung (rung 0's are on the decision)
    gate_label: bool | UnsetType | None = UNSET
    label_budget: BudgetRecord | UnsetType = UNSET
    label_error: ErrorBrief | UnsetType = UNSET
    counterfactual: Counterfactual | UnsetType | None = UNSET
    cascade_reached: bool | UnsetType = UNSET
    given: list[GivenRecord] | UnsetType = UNSET
    later: list[ProbeRecord] | UnsetType = UNSET

    @property
    def drawn(self) -> bool:
        """The k samples were drawn and judged (else the probe failed: see ``error``)."""
        return not isinstance(self.regime, UnsetType)


class ServedRecord(_Part):
    """The answer that went back, by hash."""

    rung: int
    sample: int
    provider: str
    model: str
    answer_sha256: str
    verification: Verification
    revision: int | UnsetType = UNSET
    #: the answer came from an SQL follow-up call (``followups``)
    followup: FollowUpKind | UnsetType = UNSET


class Cost(_Part):
    """Dollars: spent, what the top rung would have cost, and the other policy's estimate."""

    total_usd: Number
    top_rung_usd: Number
    probe_usd: Number
    checks_usd: Number | UnsetType = UNSET
    counterfactual_usd: Number | UnsetType = UNSET
    counterfactual_policy: Literal["cascade", "elastic"] | UnsetType = UNSET


class Timings(_Part):
    """Milliseconds (``overhead``: total minus the time upstream)."""

    total: Number
    upstream: Number
    sandbox: Number
    overhead: Number
    probe: Number | UnsetType = UNSET
    gate: Number | UnsetType = UNSET


class ErrorRecord(_Part):
    """The error the client got (its HTTP status and OpenAI error type)."""

    status: int
    type: str
    message: str


class RevisionAttempt(_Part):
    revision: int
    stage: Stage
    feedback_chars: int
    passed: bool | UnsetType = UNSET
    error: str | UnsetType = UNSET
    cost_usd: Number | UnsetType = UNSET


class RevisionLoop(_Part):
    """The bounded revision loop on one rung."""

    rung: int
    attempts: list[RevisionAttempt] = field(default_factory=list)
    stopped: RevisionStop | None = None


class FollowUp(_Part):
    """One SQL follow-up call on a rung's answer (docs/checks.md, "Follow-up calls"): its
    kind, the ``sql_evidence`` check that asked for it, whether its answer passed every check
    (unset: no answer, ``stopped`` says why), whether its numbers agreed with the first
    answer's (null: not compared), and what it cost (its call is in ``upstream_calls``)."""

    rung: int
    kind: FollowUpKind
    check: str
    passed: bool | UnsetType = UNSET
    answers_agree: bool | UnsetType | None = UNSET
    cost_usd: Number | UnsetType = UNSET
    stopped: FollowUpStop | UnsetType = UNSET
    error: str | UnsetType = UNSET


class Content(_Part):
    """The prompt and the answer as text (only with ``[receipts] store_content``)."""

    prompt: str
    answer: str


class Receipt(_Part):
    """One request's receipt: one line of the log (docs/receipts.md)."""

    id: str
    time: str
    mode: Mode
    route: str | None
    config_digest: str | None
    firstpass_version: str | None
    request: RequestInfo
    upstream_calls: list[UpstreamCall]
    checks: list[CheckEntry]
    decision: Decision
    probe: ProbeRecord | None
    served: ServedRecord | None
    cost: Cost
    timings_ms: Timings
    error: ErrorRecord | None
    revisions: list[RevisionLoop] | UnsetType = UNSET
    followups: list[FollowUp] | UnsetType = UNSET
    content: Content | UnsetType = UNSET
    schema_version: int | UnsetType = UNSET
    # the chain's links, on a line read back from a log (the writer adds them)
    prev_hash: str | UnsetType = UNSET
    hash: str | UnsetType = UNSET

    @property
    def version(self) -> int:
        """The schema version the line was written in (1: before the field existed)."""
        return 1 if isinstance(self.schema_version, UnsetType) else self.schema_version


def receipt_from_builtins(obj: object) -> Receipt:
    """A decoded JSON object as a ``Receipt``; ``msgspec.ValidationError`` names the field
    that does not fit (path included)."""
    return msgspec.convert(obj, Receipt)
