"""An SQL answer's follow-up call (docs/checks.md, "Follow-up calls"): one tool-free call to the
same rung, after the first answer's checks and before the revision loop.

- **Corrective re-ask**: the answer's ``sql_evidence`` result shows a rerun that now fails or
  returns other rows. The model gets the conversation (its tool calls and results as plain
  text: the call offers no tools, and Anthropic refuses tool blocks without them), its answer
  and what the check reported of each such query (its rows now only when the operator opted
  in: the SQL is the client's, the answer goes to the client), and is asked to reconcile its
  answer with them; the new answer is checked against the evidence as the database gives it
  now (a query that fails now, or whose rows were not shown, supports nothing).
- **Self-check**: the answer passed every hard check but an ``sql_evidence`` warning failed.
  The model gets the question, the queries with their recorded rows, the warnings and its
  answer, and is asked to check the answer strictly against them and restate it.

The second answer is verified like any answer (deterministic verification decides) and, in
its ``sql_evidence`` result, compared number by number with the first (an ``answers_agree``
part, a warning). It replaces the first only when it passes every check; otherwise the normal
flow goes on from the first. Each switch is the check's own (``reask``, ``self_check``), and
the environment turns them off (``FIRSTPASS_SQL_REASK=0``, ``FIRSTPASS_SQL_SELF_CHECK=0``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import replace
from typing import Protocol, cast, runtime_checkable

from firstpass._json import JSON
from firstpass.checks import CheckRequest, CheckResult
from firstpass.config import Config, Rung
from firstpass.errors import BudgetExhausted, UpstreamError
from firstpass.pipeline._state import LadderState, RunRequest
from firstpass.pipeline._trace import ERROR_CHARS, usd
from firstpass.pipeline._verify import Stage, StageResult
from firstpass.policy import Attempt, CheckSummary, needs_gate
from firstpass.providers import Completion
from firstpass.receipts import FollowUpKind, FollowUpStop, Purpose, valid_text

__all__ = ["REASK_PROMPT", "SELF_CHECK_PROMPT", "SqlFollowUps", "sql_follow_up"]

#: the re-ask's turn (``{facts}``: each disagreeing query, with its rows now or its error)
REASK_PROMPT = (
    "Some of the queries your answer rests on give other results when run again on the "
    "database now:\n\n{facts}\n\nReconcile your answer with these results: use only what the "
    "queries return now; state no figure from a query whose rows now are not shown, and say "
    "it could not be confirmed. Reply with the complete corrected answer only, without calling "
    "any tool."
)
#: the self-check's one message (``{facts}``: the question, the queries with their recorded
#: rows and the warnings; ``{answer}``: the answer to check)
SELF_CHECK_PROMPT = (
    "Check an answer strictly against the query results it rests on. A deterministic check "
    "of the SQL warned, as stated below.\n\n{facts}\n\nThe answer:\n\n{answer}\n\n"
    "State only what these results hold, every number exactly as they hold it; if the SQL "
    "does not answer the question as asked, say so. Reply with the complete restated answer "
    "only, without calling any tool."
)
#: request fields that offer tools: a follow-up asks for text and offers none
TOOL_FIELDS = frozenset(
    {"tools", "tool_choice", "parallel_tool_calls", "functions", "function_call"}
)
AGREE = "answers_agree"
#: characters of one tool result a follow-up's conversation keeps
TOOL_RESULT_CHARS = 4_000


class _Reconciled(Protocol):
    """A re-ask's facts and the evidence its answer is checked against."""

    @property
    def facts(self) -> str: ...

    @property
    def evidence(self) -> tuple[Mapping[str, object], ...]: ...


@runtime_checkable
class SqlFollowUps(Protocol):
    """What an ``sql_evidence`` check offers the follow-ups (``SqlEvidenceCheck``)."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def reask(self) -> bool: ...

    @property
    def self_check(self) -> bool: ...

    async def reconcile(self, request: CheckRequest, result: CheckResult) -> _Reconciled | None: ...

    async def strict_facts(self, request: CheckRequest, result: CheckResult) -> str | None: ...

    def compared(self, result: CheckResult, first: str, second: str) -> CheckResult: ...


class _Steps(Protocol):
    """The steps a follow-up uses (``Steps``)."""

    config: Config

    async def call(
        self,
        req: RunRequest,
        rung_index: int,
        rung: Rung,
        *,
        purpose: Purpose,
        n: int,
        body: Mapping[str, JSON] | None = None,
    ) -> tuple[Completion | None, UpstreamError | None]: ...

    async def verify(self, req: RunRequest, stage: Stage, answer: str) -> StageResult | None: ...

    def record_check(
        self,
        req: RunRequest,
        rung_index: int,
        sample: int,
        kind: Stage,
        result: StageResult,
        purpose: str | None = None,
    ) -> None: ...


def _summary(result: StageResult) -> CheckSummary:
    return CheckSummary(passed=result.passed, n_passed=result.n_passed, n_total=result.n_total)


def _sql_result(
    req: RunRequest, stages: tuple[StageResult | None, ...]
) -> tuple[SqlFollowUps, CheckResult] | None:
    """The first ``sql_evidence`` result among ``stages``, and its check."""
    checks = {
        c.name: c
        for c in (*req.checks.visible_checks, *req.checks.gate_checks)
        if c.kind == "sql_evidence" and isinstance(c, SqlFollowUps)
    }
    for stage in stages:
        for r in stage.results if stage is not None else ():
            check = checks.get(r.name)
            if check is not None and r.kind == "sql_evidence":
                return check, r
    return None


def _text(content: JSON) -> str:
    """A message's text: the string, or its text parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n".join(t for t in parts if isinstance(t, str))
    return ""


def _tool_free(messages: list[JSON]) -> list[JSON]:
    """The conversation with its tool calls and results told as plain text: a follow-up offers
    no tools, and a body with tool history but no tools is refused (Anthropic: "Requests which
    include tool_use or tool_result blocks must define tools")."""
    names: dict[JSON, JSON] = {}  # tool_call_id -> the tool's name
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        for c in calls if isinstance(calls, list) else []:
            fn = c.get("function") if isinstance(c, dict) else None
            if isinstance(c, dict) and isinstance(fn, dict) and isinstance(c.get("id"), str):
                names[c["id"]] = fn.get("name")
    out: list[JSON] = []
    for m in messages:
        if not isinstance(m, dict):
            out.append(m)
            continue
        role, calls = m.get("role"), m.get("tool_calls")
        if role == "assistant" and (isinstance(calls, list) or "function_call" in m):
            said = [_text(m.get("content"))] if _text(m.get("content")) else []
            for call in [*(calls if isinstance(calls, list) else []), m.get("function_call")]:
                fn = call.get("function", call) if isinstance(call, dict) else None
                if isinstance(fn, dict):
                    said.append(f"I ran {fn.get('name')}: {fn.get('arguments')}")
            out.append({"role": "assistant", "content": "\n".join(said) or "(no text)"})
        elif role in ("tool", "function"):
            text = _text(m.get("content"))
            if len(text) > TOOL_RESULT_CHARS:
                text = text[:TOOL_RESULT_CHARS] + " ... (cut)"
            name = m.get("name", names.get(m.get("tool_call_id")))
            tool = f"The {name} tool" if isinstance(name, str) else "The tool"
            out.append({"role": "user", "content": f"{tool} returned: {text}"})
        else:
            out.append(m)
    return out


def _support(raw: tuple[Mapping[str, object], ...]) -> tuple[Mapping[str, object], ...]:
    """The request's evidence items beside the SQL (Python output, summaries: a ``kind``
    other than ``sql``), kept in a re-ask's evidence: nothing reruns them, they still hold."""
    return tuple(e for e in raw if e.get("kind", "sql") != "sql")


def _deadline(steps: _Steps, req: RunRequest) -> bool:
    """Another call like the last, and its checks, would not fit the request's deadline."""
    last = req.trace.last_call()
    if last is None:
        return False
    expected_s = (last.latency_ms + req.trace.last_check_ms) / 1000.0
    left = steps.config.server.request_timeout_s - req.trace.elapsed_ms() / 1000.0
    return expected_s >= left


async def sql_follow_up(
    steps: _Steps,
    req: RunRequest,
    state: LadderState,
    visible: StageResult | None,
    gate: StageResult | None,
) -> tuple[StageResult | None, StageResult | None]:
    """At most one follow-up call on ``state``'s last attempt; the stages of the attempt that
    is last afterwards (the follow-up's when its answer passed and was recorded)."""
    attempt, answer = state.attempts[-1], state.answers[-1]
    if answer is None or attempt.upstream_failed:
        return visible, gate
    found = _sql_result(req, (visible, gate))
    if found is None:
        return visible, gate
    check, result = found
    first = answer.completion.texts[0]
    rerun_failed = any(p.name == "rerun_matches" and not p.passed for p in result.parts)
    warned = any(p.severity == "warning" and not p.passed for p in result.parts)
    checked = req
    if rerun_failed and check.reask:
        reconciled = await check.reconcile(req.checks.request, result)
        if reconciled is None:
            return visible, gate
        kind: FollowUpKind = "reask"
        # a list of messages: admission checked it
        messages: list[JSON] = [
            *_tool_free(cast("list[JSON]", req.body.get("messages") or [])),
            {"role": "assistant", "content": first},
            {"role": "user", "content": REASK_PROMPT.format(facts=reconciled.facts)},
        ]
        evidence = (*reconciled.evidence, *_support(req.checks.request.evidence))
        request = replace(req.checks.request, evidence=evidence)
        checked = replace(req, checks=replace(req.checks, request=request))
    elif attempt.verified and warned and check.self_check:
        facts = await check.strict_facts(req.checks.request, result)
        if facts is None:
            return visible, gate
        kind = "self_check"
        messages = [
            {"role": "user", "content": SELF_CHECK_PROMPT.format(facts=facts, answer=first)}
        ]
    else:
        return visible, gate
    index, rung = answer.rung_index, answer.rung
    entry = req.trace.follow_up(rung=index, kind=kind, check=check.name)
    if _deadline(steps, req):
        entry.stopped = "deadline"
        return visible, gate
    body: dict[str, JSON] = {k: v for k, v in req.body.items() if k not in TOOL_FIELDS}
    body["messages"] = messages
    req.trace.step(f"{kind}:{index}")
    cost_before = req.trace.cost_usd
    stopped: FollowUpStop | None = None
    try:
        completion, error = await steps.call(req, index, rung, purpose=kind, n=1, body=body)
        if completion is None:
            entry.error = valid_text(str(error), ERROR_CHARS)
            stopped = "upstream_error"
            return visible, gate
        if completion.is_tool_turn(0):
            # asked for text, it called a tool: no answer to check, never one to serve
            stopped = "tool_turn"
            return visible, gate
        second = completion.texts[0]
        new_visible, new_gate = await _check(steps, checked, index, kind, check, first, second)
    except asyncio.CancelledError:
        stopped = "interrupted"
        raise
    except BudgetExhausted:
        stopped = "budget"
        raise
    finally:
        entry.cost_usd = usd(req.trace.cost_usd - cost_before)
        if stopped is not None:
            entry.stopped = stopped
    summaries = [None if s is None else _summary(s) for s in (new_visible, new_gate)]
    passed = Attempt(rung=index, visible=summaries[0], gate=summaries[1]).verified
    entry.passed = passed
    entry.answers_agree = _agreed(new_visible, new_gate, check.name)
    req.trace.step(f"{kind}:{index}:{'pass' if passed else 'fail'}")
    if not passed:
        return visible, gate
    state.attempts.append(Attempt(rung=index, visible=summaries[0], gate=summaries[1]))
    served = replace(answer, completion=completion, followup=kind)
    state.answers.append(served)
    if req.budget is not None:
        req.verified.append(served.served("verified"))
    return new_visible, new_gate


async def _check(
    steps: _Steps,
    req: RunRequest,
    index: int,
    kind: FollowUpKind,
    check: SqlFollowUps,
    first: str,
    second: str,
) -> tuple[StageResult | None, StageResult | None]:
    """The second answer's stages, as ``Steps.check`` runs them, with its ``sql_evidence``
    result compared to the first answer before it is recorded."""
    visible = await steps.verify(req, "visible", second)
    if visible is not None:
        visible = _compared(visible, check, first, second)
        steps.record_check(req, index, 0, "visible", visible, kind)
    gate: StageResult | None = None
    if needs_gate(None if visible is None else _summary(visible), req.checks.has_gate):
        gate = await steps.verify(req, "gate", second)
        if gate is not None:
            gate = _compared(gate, check, first, second)
            steps.record_check(req, index, 0, "gate", gate, kind)
    return visible, gate


def _compared(stage: StageResult, check: SqlFollowUps, first: str, second: str) -> StageResult:
    results = tuple(
        check.compared(r, first, second) if r.name == check.name and r.kind == "sql_evidence" else r
        for r in stage.results
    )
    return replace(stage, results=results)


def _agreed(visible: StageResult | None, gate: StageResult | None, name: str) -> bool | None:
    """Whether the second answer's numbers agreed with the first's (None: not compared)."""
    for stage in (visible, gate):
        for r in stage.results if stage is not None else ():
            if r.name != name or r.kind != "sql_evidence":
                continue
            part = next((p for p in r.parts if p.name == AGREE), None)
            if part is not None:
                return part.passed
    return None
