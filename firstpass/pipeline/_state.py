"""The values the pipeline passes around: a request's checks, its progress, and its outcome."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import msgspec

from firstpass._json import JSON
from firstpass.budgets import RequestBudget
from firstpass.checks import Check, CheckRequest
from firstpass.config import RouteConfig, Rung
from firstpass.errors import FirstpassError, UpstreamError
from firstpass.pipeline._trace import Served, Trace
from firstpass.policy import Attempt
from firstpass.providers import Completion
from firstpass.receipts import (
    UNSET,
    Action,
    Counterfactual,
    FollowUpKind,
    Mode,
    RequestInfo,
    UnsetType,
    Verification,
)
from firstpass.sandbox import TestSpec

__all__ = [
    "Admitted",
    "Answer",
    "Checks",
    "LadderResult",
    "LadderState",
    "Outcome",
    "ResponseSummary",
    "RunRequest",
    "VisibleCount",
]


@dataclass(frozen=True, kw_only=True, slots=True)
class Checks:
    """What one request is verified with, per stage: the tests (sandbox ``TestSpec`` objects,
    or ``None``) and the listed checks (``firstpass.checks``: the route's, then the request's).

    The visible stage runs on every answer and every probe sample; the gate only on answers
    that passed it. ``request`` is what the listed checks see of the request.
    """

    visible: TestSpec | None = None
    hidden: TestSpec | None = None
    n_visible: int = 0
    n_hidden: int = 0
    #: the request's own probe inputs (``firstpass.probe_inputs``): one plain-JSON argument list
    #: per call of the entry point, run for behavioural agreement and never judged
    probe_inputs: tuple[tuple[JSON, ...], ...] = ()
    visible_checks: tuple[Check, ...] = ()
    gate_checks: tuple[Check, ...] = ()
    #: names of the visible checks the request itself added (no certificate covers them)
    from_request: tuple[str, ...] = ()
    request: CheckRequest = field(default_factory=CheckRequest)

    @property
    def any(self) -> bool:
        return self.has_visible or self.has_gate

    @property
    def has_visible(self) -> bool:
        return self.visible is not None or bool(self.visible_checks)

    @property
    def has_gate(self) -> bool:
        return self.hidden is not None or bool(self.gate_checks)

    def names(self, stage: str) -> list[str]:
        """The stage's checks by name (``tests`` for its test spec), as receipts list them."""
        spec, listed = (
            (self.visible, self.visible_checks)
            if stage == "visible"
            else (self.hidden, self.gate_checks)
        )
        return (["tests"] if spec is not None else []) + [c.name for c in listed]


class VisibleCount(msgspec.Struct):
    passed: int
    total: int


class ResponseSummary(msgspec.Struct, kw_only=True):
    """The ``firstpass`` object of a response (docs/api.md): the receipt's gist, no hashes.

    ``counterfactual`` and ``gate_label`` appear in shadow mode only."""

    receipt_id: str
    mode: Mode
    route: str | None
    action: Action
    regime: str
    served_model: str | None
    verification: Verification | None
    visible: VisibleCount | None
    gate: Literal["passed", "failed", "skipped"]
    cost_usd: float
    overhead_ms: float
    counterfactual: Counterfactual | UnsetType | None = UNSET
    gate_label: bool | UnsetType | None = UNSET

    def to_json(self) -> dict[str, JSON]:
        """As the response carries it."""
        out: dict[str, JSON] = msgspec.to_builtins(self)  # a Struct's builtins: a JSON object
        return out


@dataclass(frozen=True, kw_only=True)
class Outcome:
    """What the server answers with: a served answer or an error, plus the receipt's gist."""

    receipt_id: str
    action: Action
    mode: Mode
    served: Served | None = None
    error: FirstpassError | None = None
    #: None when the pipeline concluded nothing (a timeout, a refusal): the response's
    #: ``firstpass`` object is then empty
    summary: ResponseSummary | None = None
    overhead_ms: float = 0.0
    raw: dict[str, JSON] | None = None  # pass-through: the upstream JSON as it came
    #: ``False`` only when the receipt writer had failed for good and nothing was written:
    #: the response then names no receipt
    receipted: bool = True

    @property
    def status(self) -> int:
        return 200 if self.error is None else self.error.http_status


@dataclass(frozen=True, kw_only=True)
class Admitted:
    """A request admission let through, as the pipeline runs it: the one value that crosses
    from the server (any API dialect) into the pipeline (``Pipeline.handle``)."""

    receipt_id: str
    route: RouteConfig
    mode: Mode
    #: what goes upstream: the chat body without Firstpass's own fields
    body: dict[str, JSON]
    n: int
    checks: Checks
    task_id: str | None
    #: the receipt's ``request`` part: what was asked, hashed
    request: RequestInfo
    #: the prompt as text (on the receipt only with ``[receipts] store_content``)
    prompt_text: str = ""
    #: ``time.perf_counter()`` when the request arrived (None: when the pipeline starts)
    started: float | None = None
    #: the configured name of the client key it came with (its budgets)
    client_key: str | None = None


@dataclass(kw_only=True)
class RunRequest:
    """One request as the pipeline sees it (built by the server from a parsed ChatRequest)."""

    receipt_id: str
    route: RouteConfig
    mode: Mode
    body: dict[str, JSON]
    n: int
    checks: Checks
    task_id: str | None
    trace: Trace
    prompt_text: str
    #: this request's share of the budgets (None: no budget configured)
    budget: RequestBudget | None = None
    #: every answer that passed all its checks so far, in order: what ``serve_best_verified``
    #: serves when a budget stops the request
    verified: list[Served] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True, slots=True)
class Answer:
    """One answer from a rung (``completion`` holds exactly this answer's choice)."""

    rung_index: int
    rung: Rung
    completion: Completion
    sample: int = 0
    #: 0 for the rung's first answer, n for its n-th revision
    revision: int = 0
    #: the answer of an SQL follow-up call (``_sql_followup``), None: the rung's own
    followup: FollowUpKind | None = None

    def served(self, verification: Verification) -> Served:
        return Served(
            rung=self.rung_index,
            provider=self.rung.provider,
            model=self.rung.model,
            text=self.completion.texts[0],
            verification=verification,
            completion=self.completion,
            sample=self.sample,
            revision=self.revision,
            followup=self.followup,
        )


@dataclass(kw_only=True)
class LadderState:
    """The cascade's progress: one attempt (and answer, or None on upstream failure) per rung."""

    attempts: list[Attempt] = field(default_factory=list)
    answers: list[Answer | None] = field(default_factory=list)
    last_error: UpstreamError | None = None
    first_rung: int = 0
    served_action: Action = "served"  # the action name for serving a verified rung-0 attempt
    #: an answer that ended its turn in tool calls (route ``tool_turns = "pass"``): the ladder
    #: stops and serves it as the upstream sent it, unchecked
    tool_turn: Answer | None = None


@dataclass(frozen=True, kw_only=True, slots=True)
class LadderResult:
    """How the cascade ended: an answer to serve, or an error; ``action`` names which."""

    action: Action
    served: Served | None = None
    error: FirstpassError | None = None
