"""The steps every policy is made of: call a rung, check an answer, run the cascade, conclude.

One object holds what they share (the config, the providers, the sandbox) and is handed to the
runners by composition: ``CascadeRunner`` (the plain verified cascade and pass-through) and
``ElasticRunner`` (the elastic probe, enforce and shadow) both call these and nothing else of
each other's. Every step records what it did on the request's ``Trace``; ``finish`` and
``error`` turn the trace into the receipt and the response's gist.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Literal, cast

import msgspec
import structlog

from firstpass._json import JSON
from firstpass.budgets import Hold
from firstpass.checks import CheckResult, run_all
from firstpass.config import BudgetsConfig, Config, RequestDraw, Rung, probe_output_cap
from firstpass.errors import BudgetExhausted, FirstpassError, RequestError, UpstreamError
from firstpass.pipeline._budget import (
    STAGE_REFUSALS,
    settled_usd,
    spent_before_failure,
    worst_case_usd,
)
from firstpass.pipeline._regime import request_regime
from firstpass.pipeline._seams import SandboxRunner, SandboxVerdict
from firstpass.pipeline._sql_followup import sql_follow_up
from firstpass.pipeline._state import (
    Answer,
    LadderResult,
    LadderState,
    Outcome,
    ResponseSummary,
    RunRequest,
    VisibleCount,
)
from firstpass.pipeline._trace import ERROR_CHARS, Counterfactuals, Served, ShadowLabels, usd
from firstpass.pipeline._verify import Stage, StageResult, feedback_for, stage_result
from firstpass.policy import (
    Attempt,
    CallRung,
    CheckSummary,
    Fail,
    Serve,
    ServeUnverified,
    needs_gate,
    next_step,
)
from firstpass.providers import ANTHROPIC_DEFAULT_MAX_TOKENS, Completion, Provider
from firstpass.receipts import (
    Action,
    AuditRecord,
    BudgetRecord,
    CheckResultRecord,
    Content,
    ErrorRecord,
    ProbeRecord,
    Purpose,
    Receipt,
    RevisionAttempt,
    valid_text,
)
from firstpass.receipts import (
    Stage as StageName,
)

__all__ = ["Concluded", "Endings", "RungRunner", "Steps", "summary_of"]

log = structlog.get_logger("firstpass.pipeline")

#: runs one rung in place of a plain cascade attempt (see ``Steps.run_ladder``)
RungRunner = Callable[[RunRequest, LadderState, int], Awaitable[LadderResult | None]]

#: the turn that asks a rung to revise its answer (``{feedback}``: what failed, truncated)
REVISION_PROMPT = (
    "Your previous answer did not pass verification:\n\n{feedback}\n\n"
    "Fix these problems and reply with the complete corrected answer only."
)

#: what ``conclude``, ``finish`` and ``error`` return: the response, and the receipt to write
Concluded = tuple[Outcome, Receipt]


@dataclass(frozen=True, kw_only=True, slots=True)
class Endings:
    """What a runner adds to the receipt as it concludes: the probe it drew, shadow's labels,
    the other policy's cost, the budget cap that stopped it, and an audit (each None when
    absent)."""

    probe: ProbeRecord | None = None
    shadow: ShadowLabels | None = None
    counterfactual: Counterfactuals | None = None
    budget: BudgetRecord | None = None
    #: a would-be skip gated anyway at random, and the gate's label (``decision.audit``)
    audit: AuditRecord | None = None


class Steps:
    """The shared steps, over one config, its providers and the sandbox."""

    def __init__(
        self, *, config: Config, providers: Mapping[str, Provider], sandbox: SandboxRunner
    ) -> None:
        self.config = config
        self.providers = providers
        self.sandbox = sandbox
        budgets = config.budgets or BudgetsConfig()
        #: output tokens a call's worst case assumes when the request sets no max_tokens
        self.default_max_tokens = budgets.default_max_tokens
        #: input tokens a call's worst case assumes for each image it sends
        self.image_tokens = budgets.image_tokens
        #: the ``max_tokens`` added to a call that sets none (None: spend is not counted)
        self.added_cap = probe_output_cap(config.budgets, config.server.client_key)

    async def run_ladder(
        self, req: RunRequest, state: LadderState, rung_runner: RungRunner | None = None
    ) -> LadderResult:
        """Continue the cascade from ``state`` (attempts already made) until it decides.

        Shadow mode hands over a state holding rung 0's attempt (a probe sample), so the cascade
        resumes at rung 1 and can still serve that attempt unverified at exhaustion.
        ``rung_runner`` replaces the plain cascade attempt for some rungs (the elastic policy
        probes rungs that have a ``k``); it returns a result to end the ladder, or ``None`` after
        recording an attempt that was not served.
        """
        ladder = req.route.ladder
        while True:
            step = next_step(
                state.attempts,
                ladder_len=len(ladder),
                on_exhausted=req.route.on_exhausted,
                first_rung=state.first_rung,
            )
            if isinstance(step, CallRung):
                if rung_runner is None:
                    await self.attempt_rung(req, state, step.rung)
                else:
                    done = await rung_runner(req, state, step.rung)
                    if done is not None:
                        return done
                if state.tool_turn is not None:
                    return LadderResult(
                        action="tool_turn", served=state.tool_turn.served("unchecked")
                    )
                continue
            if isinstance(step, Serve | ServeUnverified):
                answer = state.answers[step.attempt]
                assert answer is not None
                index = state.attempts[step.attempt].rung
                verified = isinstance(step, Serve)
                served = answer.served("verified" if verified else "unverified")
                if verified:
                    action = state.served_action if index == 0 else "escalated"
                else:
                    action = "exhausted_unverified"
                req.trace.step(f"serve:{index}" if verified else f"serve_unverified:{index}")
                return LadderResult(action=action, served=served)
            assert isinstance(step, Fail)
            if step.reason == "upstream":
                assert state.last_error is not None
                req.trace.step("upstream_failed")
                return LadderResult(action="upstream_error", error=state.last_error)
            req.trace.step("exhausted")
            err = RequestError(
                "no rung of the ladder produced an answer that passed its checks, and this "
                'route has on_exhausted = "error"',
                status=422,
                code="verification_exhausted",
                type="verification_error",
            )
            return LadderResult(action="exhausted_error", error=err)

    async def attempt_rung(
        self,
        req: RunRequest,
        state: LadderState,
        index: int,
        *,
        purpose: Literal["attempt", "label"] = "attempt",
    ) -> None:
        """One cascade attempt: call the rung for one answer, check it, record the attempt; a
        failed answer is then revised on the same rung while the route allows
        (``[route.revision]``).

        ``purpose = "label"``: shadow trying a rung only elastic would reach, for its verdict.
        """
        rung = req.route.ladder[index]
        req.trace.step(f"call:{index}" if purpose == "attempt" else f"{purpose}:{index}")
        completion, error = await self.call(req, index, rung, purpose=purpose, n=1)
        if completion is None:
            state.last_error = error
            state.attempts.append(Attempt(rung=index, upstream_failed=True))
            state.answers.append(None)
            return
        if self.is_tool_turn(req, completion):
            # not a final answer: the cascade serves it (``run_ladder``); a label run has
            # nothing to label
            state.tool_turn = Answer(rung_index=index, rung=rung, completion=completion)
            req.trace.step(f"tool_turn:{index}" if purpose == "attempt" else f"{purpose}:tool_turn")
            return
        label = None if purpose == "attempt" else purpose
        visible, gate = await self.check(req, index, 0, completion.texts[0], purpose=label)
        self.record_attempt(state, index, rung, completion, visible, gate)
        if purpose == "attempt":
            self.note_verified(req, state)
        if purpose == "attempt":
            # an SQL answer's follow-up call (a corrective re-ask, a self-check) may replace
            # it with one that passes; the revision loop goes on from whichever is last
            visible, gate = await sql_follow_up(self, req, state, visible, gate)
            await self.revise(req, state, visible, gate)

    @staticmethod
    def is_tool_turn(req: RunRequest, completion: Completion) -> bool:
        """Whether ``completion``'s first choice ends the turn in tool calls on a route that
        passes such turns through (``tool_turns = "pass"``): it is not a final answer, so
        neither the checks nor the cascade judge it; the agent comes back with the results."""
        return req.route.tool_turns == "pass" and completion.is_tool_turn(0)

    @staticmethod
    def note_verified(req: RunRequest, state: LadderState) -> None:
        """Remember ``state``'s last attempt if it passed every check: a budget that stops the
        request later serves the first such answer (``serve_best_verified``)."""
        if req.budget is None or not state.attempts or not state.attempts[-1].verified:
            return
        answer = state.answers[-1]
        if answer is not None:
            req.verified.append(answer.served("verified"))

    @staticmethod
    def record_attempt(
        state: LadderState,
        index: int,
        rung: Rung,
        completion: Completion,
        visible: StageResult | None,
        gate: StageResult | None,
        *,
        sample: int = 0,
        revision: int = 0,
    ) -> None:
        state.attempts.append(
            Attempt(
                rung=index,
                visible=None if visible is None else summary_of(visible),
                gate=None if gate is None else summary_of(gate),
            )
        )
        state.answers.append(
            Answer(
                rung_index=index,
                rung=rung,
                completion=completion,
                sample=sample,
                revision=revision,
            )
        )

    async def revise(
        self,
        req: RunRequest,
        state: LadderState,
        visible: StageResult | None,
        gate: StageResult | None,
    ) -> None:
        """The bounded revision loop on the rung of ``state``'s last attempt.

        While that attempt failed a check the model could fix, the route has revisions left, and
        the deadline and ``max_cost_usd`` leave room for one more call like the last, ask the
        same rung again: the conversation so far, its answer, and what failed. Every attempt
        is recorded (``Attempt``, a ``revision`` upstream call, its checks); the loop ends after
        ``max_revisions`` however the checks answer.
        """
        policy = req.route.revision
        attempt, answer = state.attempts[-1], state.answers[-1]
        if policy is None or answer is None or attempt.verified or attempt.upstream_failed:
            return
        index = attempt.rung
        loop = req.trace.revision_loop(index)
        # a list of messages: admission checked it (``_chat._check_messages``)
        messages = list(cast("list[JSON]", req.body.get("messages") or []))
        current = answer.completion.texts[0]
        for n in range(1, policy.max_revisions + 2):
            failed: tuple[Stage, StageResult] | None = (
                ("visible", visible)
                if visible is not None and not visible.passed
                else ("gate", gate)
                if gate is not None and not gate.passed
                else None
            )
            if failed is None:
                return
            if n > policy.max_revisions:
                loop.stopped = "max_revisions"
                return
            stage, result = failed
            if not result.needs_revision:
                loop.stopped = "not_revisable"
                return
            stop = self._revision_room(req, policy.max_cost_usd)
            if stop is not None:
                loop.stopped = stop
                return
            spec = req.checks.visible if stage == "visible" else req.checks.hidden
            feedback = feedback_for(
                stage,
                result,
                spec,
                limit=policy.feedback_chars,
                gate_reasons=policy.gate_reasons,
            )
            messages += [
                {"role": "assistant", "content": current},
                {"role": "user", "content": REVISION_PROMPT.format(feedback=feedback)},
            ]
            rung = req.route.ladder[index]
            req.trace.step(f"revise:{index}:{n}")
            cost_before = req.trace.cost_usd
            entry = RevisionAttempt(revision=n, stage=stage, feedback_chars=len(feedback))
            loop.attempts.append(entry)
            try:
                completion, error = await self.call(
                    req,
                    index,
                    rung,
                    purpose="revision",
                    n=1,
                    body={**req.body, "messages": messages},
                )
                if completion is None:
                    entry.error, entry.passed = str(error), False
                    loop.stopped = "upstream_error"
                    return
                if self.is_tool_turn(req, completion):
                    # asked for the corrected answer, it called a tool: no answer to check,
                    # and never one to serve as verified; the ladder goes on from here
                    entry.passed, entry.cost_usd = False, usd(req.trace.cost_usd - cost_before)
                    loop.stopped = "tool_turn"
                    return
                current = completion.texts[0]
                visible, gate = await self.check(req, index, 0, current, purpose=f"revision:{n}")
            except asyncio.CancelledError:
                # the request deadline (or shutdown) cut this revision off: the receipt says so
                entry.passed, entry.cost_usd = False, usd(req.trace.cost_usd - cost_before)
                loop.stopped = "interrupted"
                raise
            except BudgetExhausted:  # a budget cap: the revision (or its judge) was not run
                entry.passed, entry.cost_usd = False, usd(req.trace.cost_usd - cost_before)
                loop.stopped = "budget"
                raise
            self.record_attempt(state, index, rung, completion, visible, gate, revision=n)
            self.note_verified(req, state)
            entry.passed = state.attempts[-1].verified
            entry.cost_usd = usd(req.trace.cost_usd - cost_before)

    def _revision_room(
        self, req: RunRequest, max_cost_usd: float | None
    ) -> Literal["deadline", "budget"] | None:
        """Why one more revision does not fit (``deadline``, ``budget``), or None when it does.

        The next call is assumed to take as long as the rung's last one and to cost one sample
        of it. Shadow counts the spend the cascade it mirrors would have made (one sample of
        each probe, no label runs), so it revises exactly when the cascade would; the deadline
        is the request's own in every mode.
        """
        last = req.trace.last_call()
        if last is None:
            return None
        expected_s = (last.latency_ms + req.trace.last_check_ms) / 1000.0
        left = self.config.server.request_timeout_s - req.trace.elapsed_ms() / 1000.0
        if expected_s >= left:
            return "deadline"
        spent = req.trace.cascade_spend() if req.mode == "shadow" else req.trace.cost_usd
        one_more = last.cost_usd / max(1, last.n)
        if max_cost_usd is not None and spent + one_more > max_cost_usd:
            return "budget"
        return None

    def conclude(
        self, req: RunRequest, result: LadderResult, endings: Endings | None = None
    ) -> Concluded:
        if result.served is not None:
            return self.finish(req, action=result.action, served=result.served, endings=endings)
        assert result.error is not None
        return self.error(req, action=result.action, error=result.error, endings=endings)

    def output_cap(self, body: Mapping[str, JSON]) -> int | None:
        """The ``max_tokens`` the proxy adds to ``body`` (None: none).

        A budget's hold assumes ``default_max_tokens`` of output: the call asks for no more, or
        the cap holds only on paper (an upstream left unbounded can answer past it). Whether a
        budget counts is ``config.counts_spend``, the rule the ledger and the certificates'
        binding use too. The cap changes which answers pass, so the probe records it
        (``Probe.output_cap``) and certificates bind it.
        """
        if _bounds_output(body):
            return None
        return self.added_cap

    def sent_cap(self, body: Mapping[str, JSON], rung: Rung) -> int | None:
        """The output cap a call with ``body`` to ``rung`` is sent with: the request's own
        (``max_tokens`` or ``max_completion_tokens``), else the one the proxy adds
        (``output_cap``), else the one the rung's API requires (an Anthropic provider sends
        ``ANTHROPIC_DEFAULT_MAX_TOKENS``: "uncapped" is not what goes on its wire).

        What the probe records (``Probe.output_cap``) and a certificate must match
        (``applicable``). None: no cap, or two fields that differ (``unbound_fields`` names
        them, so no certificate covers the draw).
        """
        if _bounds_output(body):
            return RequestDraw.cap_of(body)
        if self.added_cap is not None:
            return self.added_cap
        if self.config.provider(rung.provider).kind == "anthropic":
            return ANTHROPIC_DEFAULT_MAX_TOKENS
        return None

    async def call(
        self,
        req: RunRequest,
        rung_index: int,
        rung: Rung,
        *,
        purpose: Purpose,
        n: int,
        body: Mapping[str, JSON] | None = None,
    ) -> tuple[Completion | None, UpstreamError | None]:
        provider = self.providers[rung.provider]
        # providers copy what they send; copy here only to change a field
        same_prompt = body is None
        body = req.body if body is None else body
        if "temperature" not in body and req.mode != "passthrough":
            body = {**body, "temperature": req.route.temperature}
        if purpose == "probe" and "seed" in body:
            # k probe samples must be independent draws: one seed on k separate calls (a
            # provider that ignores n) returns one sample k times, which would read as k agreeing
            body = {key: value for key, value in body.items() if key != "seed"}
        cap = self.output_cap(body)
        if cap is not None:
            body = {**body, "max_tokens": cap}
        hold = await self._reserve(req, rung_index, rung, body, n, same_prompt=same_prompt)
        spent = 0.0
        t0 = time.perf_counter()
        try:
            completion = await provider.complete(rung.model, body, n=n, request_key=req.task_id)
            if hold is not None:
                spent = settled_usd(self.config.price(rung.name), completion, hold.amount)
        except asyncio.CancelledError:
            # cut off (the request deadline, or shutdown): the call was made, so it is recorded
            ms = (time.perf_counter() - t0) * 1000.0
            cut = UpstreamError("cut off before it answered", provider=rung.provider)
            req.trace.call(
                rung_index=rung_index, rung=rung, purpose=purpose, n=n, latency_ms=ms, error=cut
            )
            raise
        except UpstreamError as exc:
            ms = (time.perf_counter() - t0) * 1000.0
            # calls of an n request that answered before one failed were billed: count them
            partial = spent_before_failure(exc)
            if hold is not None and partial is not None:
                spent = settled_usd(self.config.price(rung.name), partial, hold.amount)
            req.trace.call(
                rung_index=rung_index,
                rung=rung,
                purpose=purpose,
                n=n,
                latency_ms=ms,
                completion=partial,
                error=exc,
            )
            req.trace.step(f"upstream_error:{rung_index}")
            log.warning(
                "upstream_error",
                rung=rung.name,
                error=valid_text(str(exc), ERROR_CHARS),
                receipt_id=req.receipt_id,
            )
            return None, exc
        finally:
            if hold is not None and req.budget is not None:
                await req.budget.settle(hold, spent)
        ms = (time.perf_counter() - t0) * 1000.0
        req.trace.call(
            rung_index=rung_index,
            rung=rung,
            purpose=purpose,
            n=n,
            latency_ms=ms,
            completion=completion,
        )
        return completion, None

    async def _reserve(
        self,
        req: RunRequest,
        rung_index: int,
        rung: Rung,
        body: Mapping[str, JSON],
        n: int,
        *,
        same_prompt: bool,
    ) -> Hold | None:
        """Hold the call's worst case against the request's budgets, or raise
        ``BudgetExhausted`` (the call is not made; the runner serves what is verified)."""
        if req.budget is None:
            return None
        # a provider that ignores n makes n calls, each sending the whole prompt
        calls = 1 if self.config.provider(rung.provider).honours_n else max(1, n)
        need = worst_case_usd(
            self.config.price(rung.name),
            body,
            n,
            self.default_max_tokens,
            input_tokens=req.trace.prompt_tokens(rung_index) if same_prompt else None,
            calls=calls,
            image_tokens=self.image_tokens,
        )
        try:
            return await req.budget.reserve(need)
        except BudgetExhausted:
            req.trace.step(f"budget_exhausted:{rung_index}")
            raise

    async def check(
        self, req: RunRequest, rung_index: int, sample: int, answer: str, purpose: str | None = None
    ) -> tuple[StageResult | None, StageResult | None]:
        """The visible stage, then the gate only if the visible stage passed."""
        visible = await self.verify(req, "visible", answer)
        if visible is not None:
            self.record_check(req, rung_index, sample, "visible", visible, purpose)
            req.trace.step(f"visible:{rung_index}:{'pass' if visible.passed else 'fail'}")
        gate: StageResult | None = None
        if needs_gate(None if visible is None else summary_of(visible), req.checks.has_gate):
            gate = await self.verify(req, "gate", answer)
            if gate is not None:
                self.record_check(req, rung_index, sample, "gate", gate, purpose)
                req.trace.step(f"gate:{rung_index}:{'pass' if gate.passed else 'fail'}")
        return visible, gate

    async def verify(
        self,
        req: RunRequest,
        stage: Stage,
        answer: str,
        *,
        tests: SandboxVerdict | None = None,
    ) -> StageResult | None:
        """One stage on one answer: its tests in the sandbox (unless ``tests`` already ran, as
        in the probe's batch) and its listed checks, concurrently; None when the stage is empty."""
        spec = req.checks.visible if stage == "visible" else req.checks.hidden
        listed = req.checks.visible_checks if stage == "visible" else req.checks.gate_checks
        if spec is None and not listed:
            return None
        t0 = time.perf_counter()
        run_tests = spec is not None and tests is None

        async def listed_checks() -> tuple[list[CheckResult], float]:
            c0 = time.perf_counter()
            results = await run_all(listed, answer, req.checks.request) if listed else []
            return results, (time.perf_counter() - c0) * 1000.0

        refusals: list[BudgetExhausted] = []
        scope = STAGE_REFUSALS.set(refusals)  # this stage's own refusals, not a concurrent one's
        try:
            if run_tests:
                assert spec is not None
                both = (
                    asyncio.ensure_future(self.sandbox.run(answer, spec)),
                    asyncio.ensure_future(listed_checks()),
                )
                try:
                    tests, (results, ms) = await asyncio.gather(*both)
                except BaseException:
                    # no sandbox slot (503): a judge beside it stops too, not spending for a
                    # request already answered
                    for task in both:
                        task.cancel()
                    raise
            else:
                results, ms = await listed_checks()
        finally:
            STAGE_REFUSALS.reset(scope)
        req.trace.sandbox_wall((time.perf_counter() - t0) * 1000.0)
        if refusals:
            # a check's own call (a judge) was refused by a budget: the stage did not really
            # run, whatever the check made of it
            raise refusals[0]
        return stage_result(tests, results, answer, ms)

    def record_check(
        self,
        req: RunRequest,
        rung_index: int,
        sample: int,
        kind: StageName,
        result: StageResult,
        purpose: str | None = None,
    ) -> None:
        with_reasons = self.config.receipts.store_content
        req.trace.check(
            rung_index=rung_index,
            sample=sample,
            kind=kind,
            result=result,
            purpose=purpose,
            results=[
                msgspec.convert(r.to_dict(with_reasons=with_reasons), CheckResultRecord)
                for r in result.results
            ],
        )
        if result.cost_usd:
            req.trace.check_cost(result.cost_usd, label=purpose == "label")

    def content(self, req: RunRequest, served: Served | None) -> Content | None:
        if not self.config.receipts.store_content:
            return None
        return Content(prompt=req.prompt_text, answer=served.answer if served else "")

    def finish(
        self,
        req: RunRequest,
        *,
        action: Action,
        served: Served,
        raw: dict[str, JSON] | None = None,
        endings: Endings | None = None,
    ) -> Concluded:
        ends = endings or Endings()
        receipt = req.trace.record(
            action=action,
            served=served,
            budget=ends.budget,
            shadow=ends.shadow,
            probe=ends.probe,
            counterfactual=ends.counterfactual,
            audit=ends.audit,
            content=self.content(req, served),
        )
        return (
            Outcome(
                receipt_id=req.receipt_id,
                action=action,
                mode=req.mode,
                served=served,
                summary=response_summary(req, receipt, served),
                overhead_ms=float(receipt.timings_ms.overhead),
                raw=raw,
            ),
            receipt,
        )

    def error(
        self,
        req: RunRequest,
        *,
        action: Action,
        error: FirstpassError,
        endings: Endings | None = None,
    ) -> Concluded:
        ends = endings or Endings()
        status = error.http_status
        receipt = req.trace.record(
            action=action,
            served=None,
            budget=ends.budget,
            shadow=ends.shadow,
            probe=ends.probe,
            counterfactual=ends.counterfactual,
            audit=ends.audit,
            error=ErrorRecord(
                status=status,
                type=getattr(error, "type", "upstream_error"),
                message=valid_text(str(error), ERROR_CHARS),
            ),
            content=self.content(req, None),
        )
        return (
            Outcome(
                receipt_id=req.receipt_id,
                action=action,
                mode=req.mode,
                error=error,
                summary=response_summary(req, receipt, None),
                overhead_ms=float(receipt.timings_ms.overhead),
            ),
            receipt,
        )


def summary_of(result: SandboxVerdict | StageResult) -> CheckSummary:
    """The policy's view of a stage's verdict."""
    return CheckSummary(
        passed=bool(result.passed), n_passed=int(result.n_passed), n_total=int(result.n_total)
    )


def response_summary(req: RunRequest, receipt: Receipt, served: Served | None) -> ResponseSummary:
    """The ``firstpass`` object of the response: the receipt's gist, no hashes of content;
    the stages it states are those run on exactly the served answer."""
    visible = req.trace.stage_of("visible", served) if served is not None else None
    gate = req.trace.stage_of("gate", served) if served is not None else None
    action = receipt.decision.action
    summary = ResponseSummary(
        receipt_id=receipt.id,
        mode=receipt.mode,
        route=receipt.route,
        action=action,
        # as the log and the metrics state it (a pipeline's request is never "rejected")
        regime=request_regime(receipt) or "cascade",
        served_model=f"{served.provider}/{served.model}" if served else None,
        verification=served.verification if served else None,
        visible=VisibleCount(passed=visible.n_passed, total=visible.n_total) if visible else None,
        gate=("passed" if gate.passed else "failed") if gate else "skipped",
        cost_usd=receipt.cost.total_usd,
        overhead_ms=receipt.timings_ms.overhead,
    )
    if receipt.mode == "shadow":
        summary.counterfactual = receipt.decision.counterfactual
        summary.gate_label = receipt.decision.gate_label
    return summary


def _bounds_output(body: Mapping[str, JSON]) -> bool:
    """The body caps the output tokens an upstream may bill."""
    return body.get("max_tokens") is not None or body.get("max_completion_tokens") is not None
