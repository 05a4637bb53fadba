"""The steps every policy is made of: call a rung, check an answer, run the cascade, conclude.

One object holds what they share (the config, the providers, the sandbox) and is handed to the
runners by composition: ``CascadeRunner`` (the plain verified cascade and pass-through) and
``ElasticRunner`` (the elastic probe, enforce and shadow) both call these and nothing else of
each other's. Every step records what it did on the request's ``Trace``; ``finish`` and
``error`` turn the trace into the receipt and the response's gist.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from firstpass.config import Config, Rung
from firstpass.errors import FirstpassError, RequestError, UpstreamError
from firstpass.pipeline._seams import CheckResult, SandboxRunner
from firstpass.pipeline._state import (
    Answer,
    LadderResult,
    LadderState,
    Outcome,
    RunRequest,
)
from firstpass.pipeline._trace import Served
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
from firstpass.providers import Completion, Provider
from firstpass.sandbox import TestSpec

__all__ = ["RungRunner", "Steps", "summary_of"]

log = structlog.get_logger("firstpass.pipeline")

#: runs one rung in place of a plain cascade attempt (see ``Steps.run_ladder``)
RungRunner = Callable[[RunRequest, LadderState, int], Awaitable[LadderResult | None]]

#: what ``conclude``, ``finish`` and ``error`` return: the response, and the receipt to write
Concluded = tuple[Outcome, dict[str, Any]]


class Steps:
    """The shared steps, over one config, its providers and the sandbox."""

    def __init__(
        self, *, config: Config, providers: Mapping[str, Provider], sandbox: SandboxRunner
    ) -> None:
        self.config = config
        self.providers = providers
        self.sandbox = sandbox

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
                    continue
                done = await rung_runner(req, state, step.rung)
                if done is not None:
                    return done
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
        self, req: RunRequest, state: LadderState, index: int, *, purpose: str = "attempt"
    ) -> None:
        """One cascade attempt: call the rung for one answer, check it, record the attempt.

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
        label = None if purpose == "attempt" else purpose
        visible, gate = await self.check(req, index, 0, completion.texts[0], purpose=label)
        state.attempts.append(Attempt(rung=index, visible=visible, gate=gate))
        state.answers.append(Answer(rung_index=index, rung=rung, completion=completion))

    def conclude(
        self,
        req: RunRequest,
        result: LadderResult,
        *,
        decision: dict[str, Any] | None = None,
        probe: dict[str, Any] | None = None,
        extra_cost: dict[str, Any] | None = None,
    ) -> tuple[Outcome, dict[str, Any]]:
        if result.served is not None:
            return self.finish(
                req,
                action=result.action,
                served=result.served,
                decision=decision,
                probe=probe,
                extra_cost=extra_cost,
            )
        assert result.error is not None
        return self.error(
            req,
            action=result.action,
            error=result.error,
            decision=decision,
            probe=probe,
            extra_cost=extra_cost,
        )

    async def call(
        self, req: RunRequest, rung_index: int, rung: Rung, *, purpose: str, n: int
    ) -> tuple[Completion | None, UpstreamError | None]:
        provider = self.providers[rung.provider]
        body = req.body  # providers copy what they send; copy here only to change a field
        if "temperature" not in body and req.mode != "passthrough":
            body = {**body, "temperature": req.route.temperature}
        if purpose == "probe" and "seed" in body:
            # k probe samples must be independent draws: one seed on k separate calls (a
            # provider that ignores n) returns one sample k times, which would read as k agreeing
            body = {key: value for key, value in body.items() if key != "seed"}
        t0 = time.perf_counter()
        try:
            completion = await provider.complete(rung.model, body, n=n, request_key=req.task_id)
        except UpstreamError as exc:
            ms = (time.perf_counter() - t0) * 1000.0
            req.trace.call(
                rung_index=rung_index, rung=rung, purpose=purpose, n=n, latency_ms=ms, error=exc
            )
            req.trace.step(f"upstream_error:{rung_index}")
            log.warning("upstream_error", rung=rung.name, error=str(exc), receipt_id=req.receipt_id)
            return None, exc
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

    async def check(
        self, req: RunRequest, rung_index: int, sample: int, answer: str, purpose: str | None = None
    ) -> tuple[CheckSummary | None, CheckSummary | None]:
        """Visible tests, then the gate only if the visible tests passed."""
        visible: CheckSummary | None = None
        if req.checks.visible is not None:
            result = await self.sandbox_run(req, answer, req.checks.visible)
            req.trace.check(
                rung_index=rung_index, sample=sample, kind="visible", result=result, purpose=purpose
            )
            visible = summary_of(result)
            req.trace.step(f"visible:{rung_index}:{'pass' if visible.passed else 'fail'}")
        gate: CheckSummary | None = None
        hidden = req.checks.hidden
        if hidden is not None and needs_gate(visible, True):
            result = await self.sandbox_run(req, answer, hidden)
            req.trace.check(
                rung_index=rung_index, sample=sample, kind="gate", result=result, purpose=purpose
            )
            gate = summary_of(result)
            req.trace.step(f"gate:{rung_index}:{'pass' if gate.passed else 'fail'}")
        return visible, gate

    async def sandbox_run(self, req: RunRequest, answer: str, spec: TestSpec) -> CheckResult:
        t0 = time.perf_counter()
        result = await self.sandbox.run(answer, spec)
        req.trace.sandbox_wall((time.perf_counter() - t0) * 1000.0)
        return result

    def content(self, req: RunRequest, served: Served | None) -> dict[str, str] | None:
        if not self.config.receipts.store_content:
            return None
        return {"prompt": req.prompt_text, "answer": served.text if served else ""}

    def finish(
        self,
        req: RunRequest,
        *,
        action: str,
        served: Served,
        raw: dict[str, Any] | None = None,
        decision: dict[str, Any] | None = None,
        probe: dict[str, Any] | None = None,
        extra_cost: dict[str, Any] | None = None,
    ) -> tuple[Outcome, dict[str, Any]]:
        record = req.trace.record(
            action=action,
            served=served,
            decision=decision,
            probe=probe,
            extra_cost=extra_cost,
            content=self.content(req, served),
        )
        return (
            Outcome(
                receipt_id=req.receipt_id,
                action=action,
                mode=req.mode,
                served=served,
                summary=_response_summary(record),
                overhead_ms=record["timings_ms"]["overhead"],
                raw=raw,
            ),
            record,
        )

    def error(
        self,
        req: RunRequest,
        *,
        action: str,
        error: FirstpassError,
        decision: dict[str, Any] | None = None,
        probe: dict[str, Any] | None = None,
        extra_cost: dict[str, Any] | None = None,
    ) -> tuple[Outcome, dict[str, Any]]:
        outcome = Outcome(receipt_id=req.receipt_id, action=action, mode=req.mode, error=error)
        record = req.trace.record(
            action=action,
            served=None,
            decision=decision,
            probe=probe,
            extra_cost=extra_cost,
            error={
                "status": outcome.status,
                "type": getattr(error, "type", "upstream_error"),
                "message": str(error),
            },
            content=self.content(req, None),
        )
        summary = _response_summary(record)
        return (
            Outcome(
                receipt_id=req.receipt_id,
                action=action,
                mode=req.mode,
                error=error,
                summary=summary,
                overhead_ms=record["timings_ms"]["overhead"],
            ),
            record,
        )


def summary_of(result: CheckResult) -> CheckSummary:
    """The policy's view of a sandbox verdict."""
    return CheckSummary(
        passed=bool(result.passed), n_passed=int(result.n_passed), n_total=int(result.n_total)
    )


def _response_summary(record: dict[str, Any]) -> dict[str, Any]:
    """The ``firstpass`` object of the response: the receipt's gist, no hashes of content."""
    served = record.get("served") or {}
    where = (served.get("rung"), served.get("sample", 0))

    def last(kind: str) -> dict[str, Any] | None:
        found = [
            c
            for c in record["checks"]
            if c["kind"] == kind and (c["rung"], c["sample"]) == where and not c.get("purpose")
        ]
        return found[-1] if found else None

    visible = last("visible")
    gate = last("gate")
    probe = record.get("probe")
    decision = record["decision"]
    summary = {
        "receipt_id": record["id"],
        "mode": record["mode"],
        "route": record["route"],
        "action": decision["action"],
        # the elastic probe's regime; without one (no visible tests, or the probe call failed)
        # what ran instead: "cascade" (every served answer was checked) or "passthrough"
        "regime": (probe.get("regime") if probe else None)
        or ("passthrough" if decision["action"] == "passthrough" else "cascade"),
        "served_model": f"{served['provider']}/{served['model']}" if served else None,
        "verification": served.get("verification") if served else None,
        "visible": {"passed": visible["n_passed"], "total": visible["n_total"]}
        if visible
        else None,
        "gate": ("passed" if gate["passed"] else "failed") if gate else "skipped",
        "cost_usd": record["cost"]["total_usd"],
        "overhead_ms": record["timings_ms"]["overhead"],
    }
    if record["mode"] == "shadow":
        summary["counterfactual"] = decision.get("counterfactual")
        summary["gate_label"] = decision.get("gate_label")
    return summary
