"""The I/O half of a request: pick the runner for its mode, run it, write one receipt.

``Pipeline.handle`` never raises for anything a client or an upstream can cause: it returns an
``Outcome`` carrying either the served answer or the error to answer with, and it has written
exactly one receipt by the time it returns (``finally``), whatever happened. The runners
(``CascadeRunner``, ``ElasticRunner``) are composed over one ``Steps`` object: the shared steps.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

import structlog

from firstpass.checks import Check, JudgeBinding, build_check
from firstpass.config import Config, RouteConfig
from firstpass.errors import FirstpassError, UpstreamTimeout
from firstpass.pipeline._cascade import CascadeRunner
from firstpass.pipeline._elastic import ElasticRunner
from firstpass.pipeline._seams import ReceiptSink, SandboxRunner
from firstpass.pipeline._state import Checks, Outcome, RunRequest
from firstpass.pipeline._steps import Steps
from firstpass.pipeline._trace import Trace
from firstpass.providers import Provider

__all__ = ["Checks", "Outcome", "Pipeline", "route_checks"]

log = structlog.get_logger("firstpass.pipeline")


def route_checks(
    config: Config, providers: Mapping[str, Provider]
) -> dict[str, tuple[tuple[Check, ...], tuple[Check, ...]]]:
    """Each route's ``visible_checks`` and ``gate_checks``, runnable (validated at load)."""

    def judge(label: str) -> JudgeBinding:
        provider, model = label.split("/", 1)
        return JudgeBinding(grader=providers[provider], model=model, price=config.prices.get(label))

    return {
        route.name: (
            tuple(build_check(d, judge) for d in route.visible_checks),
            tuple(build_check(d, judge) for d in route.gate_checks),
        )
        for route in config.routes
        if route.visible_checks or route.gate_checks
    }


class Pipeline:
    """Runs requests through providers and the sandbox under the configured policy."""

    def __init__(
        self,
        *,
        config: Config,
        providers: Mapping[str, Provider],
        sandbox: SandboxRunner,
        writer: ReceiptSink,
    ) -> None:
        self.config = config
        self.writer = writer
        self.steps = Steps(config=config, providers=providers, sandbox=sandbox)
        #: each route's listed checks, built once (a judge bound to its provider)
        self.route_checks = route_checks(config, providers)
        self.cascade = CascadeRunner(self.steps)
        # built only with [escalation.elastic]: without it no request reaches shadow or enforce
        self.elastic = (
            ElasticRunner(self.steps, self.cascade) if config.elastic is not None else None
        )

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
        listed = self.route_checks.get(route.name)
        if listed is not None and mode != "passthrough":
            checks = dataclasses.replace(
                checks,
                visible_checks=listed[0] + checks.visible_checks,
                gate_checks=listed[1] + checks.gate_checks,
            )
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
                outcome, record = await self._run(req)
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

    async def _run(self, req: RunRequest) -> tuple[Outcome, dict[str, Any]]:
        """The runner for the request's mode (the server has already checked it is allowed)."""
        if req.mode == "passthrough":
            return await self.cascade.passthrough(req)
        if req.mode in ("shadow", "enforce"):
            if self.elastic is None:
                raise FirstpassError(f"mode {req.mode!r} needs [escalation.elastic]")
            if req.mode == "shadow":
                return await self.elastic.shadow(req)
            return await self.elastic.enforce(req)
        return await self.cascade.cascade(req)
