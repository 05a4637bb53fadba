"""The I/O half of a request: ask the policy what to do, do it, write one receipt.

``Pipeline.handle`` never raises for anything a client or an upstream can cause: it returns an
``Outcome`` carrying either the served answer or the error to answer with, and it has written
exactly one receipt by the time it returns (``finally``), whatever happened.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import structlog

from firstpass.config import Config, RouteConfig, Rung
from firstpass.errors import FirstpassError, RequestError, UpstreamError, UpstreamTimeout
from firstpass.pipeline._elastic import ElasticMixin
from firstpass.pipeline._state import (
    Answer,
    Checks,
    LadderResult,
    LadderState,
    Outcome,
    RunRequest,
)
from firstpass.pipeline._trace import Served, Trace
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
from firstpass.providers import Provider

__all__ = ["Answer", "Checks", "LadderResult", "LadderState", "Outcome", "Pipeline"]

log = structlog.get_logger("firstpass.pipeline")

#: runs one rung in place of a plain cascade attempt (see ``Pipeline._run_ladder``)
RungRunner = Callable[[RunRequest, LadderState, int], Awaitable[LadderResult | None]]


class Pipeline(ElasticMixin):
    """Runs requests through providers and the sandbox under the configured policy."""

    def __init__(
        self,
        *,
        config: Config,
        providers: Mapping[str, Provider],
        sandbox: Any,
        writer: Any,
    ) -> None:
        self.config = config
        self.providers = providers
        self.sandbox = sandbox
        self.writer = writer

    # -- entry point ---------------------------------------------------------------------------

    async def handle(
        self,
        *,
        receipt_id: str,
        route: RouteConfig,
        mode: str,
        body: dict[str, Any],
        n: int,
        checks: Checks,
        task_id: str | None,
        request_info: dict[str, Any],
        prompt_text: str = "",
        started: float | None = None,
    ) -> Outcome:
        trace = Trace(
            receipt_id=receipt_id,
            config=self.config,
            route=route,
            mode=mode,
            request=request_info,
            started=started,
        )
        req = RunRequest(
            receipt_id=receipt_id,
            route=route,
            mode=mode,
            body=body,
            n=n,
            checks=checks,
            task_id=task_id,
            trace=trace,
            prompt_text=prompt_text,
        )
        outcome: Outcome | None = None
        record: dict[str, Any] | None = None
        deadline = self.config.server.request_timeout_s
        try:
            async with asyncio.timeout(deadline):
                if mode == "passthrough":
                    outcome, record = await self._passthrough(req)
                elif mode == "shadow":
                    outcome, record = await self._shadow(req)
                elif mode == "enforce":
                    outcome, record = await self._enforce(req)
                else:
                    outcome, record = await self._cascade(req)
        except TimeoutError:
            # one deadline for the whole request, however many rungs and retries it took
            late: FirstpassError = UpstreamTimeout(
                f"no verified answer within the request deadline of {deadline:g} s "
                "(server.request_timeout_s)"
            )
            record = trace.record(
                action="timeout",
                served=None,
                error={"status": 504, "type": "request_timeout", "message": str(late)},
            )
            outcome = Outcome(receipt_id=receipt_id, action="timeout", mode=mode, error=late)
        except asyncio.CancelledError:
            # the client went away: still one receipt, then let the cancellation through
            record = trace.record(
                action="cancelled",
                served=None,
                error={"status": 499, "type": "cancelled", "message": "client disconnected"},
            )
            raise
        except Exception as exc:  # a bug of ours: answer 500 without a traceback, keep the receipt
            log.exception("pipeline_error", receipt_id=receipt_id)
            message = f"internal error while handling {receipt_id}; see the server log"
            if self.config.server.debug:  # name the exception, never the traceback
                message += f" ({type(exc).__name__}: {exc})"
            err = FirstpassError(message)
            record = trace.record(
                action="internal_error",
                served=None,
                error={"status": 500, "type": "server_error", "message": type(exc).__name__},
            )
            outcome = Outcome(receipt_id=receipt_id, action="internal_error", mode=mode, error=err)
        finally:
            if record is not None:
                await self.writer.write(record)
        return outcome

    # -- pass-through --------------------------------------------------------------------------

    async def _passthrough(self, req: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        rung = req.route.ladder[0]
        req.trace.step("call:0")
        completion, error = await self._call(req, 0, rung, purpose="passthrough", n=req.n)
        if completion is None:
            assert error is not None
            req.trace.step("upstream_failed")
            return self._error(req, action="upstream_error", error=error)
        served = Served(
            rung=0,
            provider=rung.provider,
            model=rung.model,
            text=completion.texts[0] if completion.texts else "",
            verification="unchecked",
            completion=completion,
        )
        return self._finish(req, action="passthrough", served=served, raw=completion.raw)

    # -- the verified cascade ------------------------------------------------------------------

    async def _cascade(self, req: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        result = await self._run_ladder(req, LadderState())
        return self._conclude(req, result)

    async def _run_ladder(
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
                    await self._attempt_rung(req, state, step.rung)
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

    async def _attempt_rung(
        self, req: RunRequest, state: LadderState, index: int, *, purpose: str = "attempt"
    ) -> None:
        """One cascade attempt: call the rung for one answer, check it, record the attempt.

        ``purpose = "label"``: shadow trying a rung only elastic would reach, for its verdict.
        """
        rung = req.route.ladder[index]
        req.trace.step(f"call:{index}" if purpose == "attempt" else f"{purpose}:{index}")
        completion, error = await self._call(req, index, rung, purpose=purpose, n=1)
        if completion is None:
            state.last_error = error
            state.attempts.append(Attempt(rung=index, upstream_failed=True))
            state.answers.append(None)
            return
        label = None if purpose == "attempt" else purpose
        visible, gate = await self._check(req, index, 0, completion.texts[0], purpose=label)
        state.attempts.append(Attempt(rung=index, visible=visible, gate=gate))
        state.answers.append(Answer(rung_index=index, rung=rung, completion=completion))

    def _conclude(
        self,
        req: RunRequest,
        result: LadderResult,
        *,
        decision: dict[str, Any] | None = None,
        probe: dict[str, Any] | None = None,
        extra_cost: dict[str, Any] | None = None,
    ) -> tuple[Outcome, dict[str, Any]]:
        if result.served is not None:
            return self._finish(
                req,
                action=result.action,
                served=result.served,
                decision=decision,
                probe=probe,
                extra_cost=extra_cost,
            )
        assert result.error is not None
        return self._error(
            req,
            action=result.action,
            error=result.error,
            decision=decision,
            probe=probe,
            extra_cost=extra_cost,
        )

    # -- I/O helpers ---------------------------------------------------------------------------

    async def _call(
        self, req: RunRequest, rung_index: int, rung: Rung, *, purpose: str, n: int
    ) -> tuple[Any, UpstreamError | None]:
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

    async def _check(
        self, req: RunRequest, rung_index: int, sample: int, answer: str, purpose: str | None = None
    ) -> tuple[CheckSummary | None, CheckSummary | None]:
        """Visible tests, then the gate only if the visible tests passed."""
        visible: CheckSummary | None = None
        if req.checks.visible is not None:
            result = await self._sandbox_run(req, answer, req.checks.visible)
            req.trace.check(
                rung_index=rung_index, sample=sample, kind="visible", result=result, purpose=purpose
            )
            visible = _summary(result)
            req.trace.step(f"visible:{rung_index}:{'pass' if visible.passed else 'fail'}")
        gate: CheckSummary | None = None
        if needs_gate(visible, req.checks.hidden is not None):
            result = await self._sandbox_run(req, answer, req.checks.hidden)
            req.trace.check(
                rung_index=rung_index, sample=sample, kind="gate", result=result, purpose=purpose
            )
            gate = _summary(result)
            req.trace.step(f"gate:{rung_index}:{'pass' if gate.passed else 'fail'}")
        return visible, gate

    async def _sandbox_run(self, req: RunRequest, answer: str, spec: Any) -> Any:
        t0 = time.perf_counter()
        result = await self.sandbox.run(answer, spec)
        req.trace.sandbox_wall((time.perf_counter() - t0) * 1000.0)
        return result

    # -- endings -------------------------------------------------------------------------------

    def _content(self, req: RunRequest, served: Served | None) -> dict[str, str] | None:
        if not self.config.receipts.store_content:
            return None
        return {"prompt": req.prompt_text, "answer": served.text if served else ""}

    def _finish(
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
            content=self._content(req, served),
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

    def _error(
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
            content=self._content(req, None),
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


def _summary(result: Any) -> CheckSummary:
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
        # the elastic probe's regime; without one, what the mode did: "cascade" (every served
        # answer went through the gate) or "passthrough" (nothing was checked)
        "regime": (probe.get("regime") if probe else None)
        or ("passthrough" if decision["action"] == "passthrough" else record["mode"]),
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
