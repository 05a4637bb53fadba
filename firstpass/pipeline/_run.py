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

import msgspec
import structlog

from firstpass.budgets import CURRENT_BUDGET, BudgetLedger, budget_record
from firstpass.checks import Check, Grader, JudgeBinding, build_check
from firstpass.config import BudgetsConfig, Config, counts_spend
from firstpass.errors import (
    BudgetExhausted,
    FirstpassError,
    ReceiptError,
    ReceiptUnavailable,
    ReceiptValueError,
    RequestError,
    SandboxBusy,
    UpstreamTimeout,
)
from firstpass.monitor import LicenceMonitor, licence_labels
from firstpass.pipeline._budget import BudgetedGrader
from firstpass.pipeline._cascade import CascadeRunner
from firstpass.pipeline._elastic import ElasticRunner
from firstpass.pipeline._seams import ReceiptSink, SandboxRunner
from firstpass.pipeline._state import Admitted, Checks, Outcome, RunRequest
from firstpass.pipeline._steps import Concluded, Endings, Steps
from firstpass.pipeline._trace import Trace
from firstpass.providers import Provider
from firstpass.receipts import (
    Action,
    BudgetRecord,
    ErrorRecord,
    Receipt,
    RequestInfo,
    receipt_from_builtins,
    valid_strings,
)

__all__ = [
    "WITHHELD_ACTION",
    "Admitted",
    "Checks",
    "Outcome",
    "Pipeline",
    "receipts_unavailable",
    "route_checks",
    "withheld",
]

log = structlog.get_logger("firstpass.pipeline")


def route_checks(
    config: Config, providers: Mapping[str, Provider]
) -> dict[str, tuple[tuple[Check, ...], tuple[Check, ...]]]:
    """Each route's ``visible_checks`` and ``gate_checks``, runnable (validated at load)."""

    budgeted = counts_spend(config.budgets, config.server.client_key)
    budgets = config.budgets or BudgetsConfig()

    def judge(label: str) -> JudgeBinding:
        provider, model = label.split("/", 1)
        price = config.prices.get(label)
        grader: Grader = providers[provider]
        if budgeted:  # the judge's calls count against the request's budgets too
            grader = BudgetedGrader(
                providers[provider], price, budgets.default_max_tokens, budgets.image_tokens
            )
        return JudgeBinding(grader=grader, model=model, price=price)

    return {
        route.name: (
            tuple(build_check(d, judge) for d in route.visible_checks),
            tuple(build_check(d, judge) for d in route.gate_checks),
        )
        for route in config.routes
        if route.visible_checks or route.gate_checks
    }


#: ``decision.action`` of a request whose answer was withheld because its receipt could not be
#: made durable (``[receipts] fsync = "durable"`` on a failing disk)
WITHHELD_ACTION: Action = "receipts_unavailable"


def receipts_unavailable(exc: BaseException | None = None) -> RequestError:
    """The 503 a request gets when its receipt cannot be written now (clients retry)."""
    cause = f" ({exc})" if exc is not None else ""
    return RequestError(
        "the receipt log cannot be written now, so no answer is served (retry after a moment)"
        + cause,
        status=503,
        code="receipts_unavailable",
        type="server_error",
    )


def withheld(receipt: Receipt, err: RequestError) -> Receipt:
    """``receipt`` as it must read when its answer was not sent: everything done (calls,
    checks, cost, the probe) kept, nothing served, the 503 stated."""
    return msgspec.structs.replace(
        receipt,
        decision=msgspec.structs.replace(receipt.decision, action=WITHHELD_ACTION),
        served=None,
        error=ErrorRecord(status=503, type="receipts_unavailable", message=str(err)),
    )


class Pipeline:
    """Runs requests through providers and the sandbox under the configured policy."""

    def __init__(
        self,
        *,
        config: Config,
        providers: Mapping[str, Provider],
        sandbox: SandboxRunner,
        writer: ReceiptSink,
        budgets: BudgetLedger | None = None,
        monitor: LicenceMonitor | None = None,
    ) -> None:
        self.config = config
        self.writer = writer
        #: the licence monitor (``firstpass.monitor``): fed the labels of each written receipt,
        #: asked by enforce whether a licence still holds; ``observe_label`` is its hook for
        #: labels that arrive later (client feedback). None: nothing is monitored
        self.monitor = monitor
        #: today's spend against the caps (None: no budget configured)
        self.budgets = budgets
        self.steps = Steps(config=config, providers=providers, sandbox=sandbox)
        #: each route's listed checks, built once (a judge bound to its provider)
        self.route_checks = route_checks(config, providers)
        self.cascade = CascadeRunner(self.steps)
        # built only with [escalation.elastic]: without it no request reaches shadow or enforce
        self.elastic = (
            ElasticRunner(self.steps, self.cascade, monitor=monitor)
            if config.elastic is not None
            else None
        )

    # -- entry point ---------------------------------------------------------------------------

    async def handle(self, admitted: Admitted) -> Outcome:
        """Run one admitted request; never raises for anything a client or an upstream can
        cause, and has written its one receipt by the time it returns."""
        receipt_id, mode = admitted.receipt_id, admitted.mode
        route, checks = admitted.route, admitted.checks
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
            request=admitted.request,
            started=admitted.started,
        )
        req = RunRequest(
            receipt_id=receipt_id,
            route=route,
            mode=mode,
            body=admitted.body,
            n=admitted.n,
            checks=checks,
            task_id=admitted.task_id,
            trace=trace,
            prompt_text=admitted.prompt_text,
            budget=self.budgets.open(admitted.client_key) if self.budgets is not None else None,
        )
        budget_token = CURRENT_BUDGET.set(req.budget)
        outcome: Outcome | None = None
        receipt: Receipt | None = None
        deadline = self.config.server.request_timeout_s
        try:
            async with asyncio.timeout(deadline):
                outcome, receipt = await self._run(req)
        except TimeoutError:
            # one deadline for the whole request, however many rungs and retries it took
            late: FirstpassError = UpstreamTimeout(
                f"no verified answer within the request deadline of {deadline:g} s "
                "(server.request_timeout_s)"
            )
            receipt = trace.record(
                action="timeout",
                served=None,
                error=ErrorRecord(status=504, type="request_timeout", message=str(late)),
            )
            outcome = Outcome(receipt_id=receipt_id, action="timeout", mode=mode, error=late)
        except asyncio.CancelledError:
            # the client went away: still one receipt, then let the cancellation through
            receipt = trace.record(
                action="cancelled",
                served=None,
                error=ErrorRecord(status=499, type="cancelled", message="client disconnected"),
            )
            raise
        except RequestError as exc:
            # a rung's API could not carry the request (admission refuses what it can see
            # coming; this is what it could not): the client's 4xx, stated on the receipt
            receipt = trace.record(
                action="rejected",
                served=None,
                error=ErrorRecord(status=exc.status, type=exc.type, message=str(exc)),
            )
            outcome = Outcome(receipt_id=receipt_id, action="rejected", mode=mode, error=exc)
        except SandboxBusy as exc:
            # no sandbox slot in time: a clean 503 the client may retry, stated on the receipt
            receipt = trace.record(
                action="sandbox_busy",
                served=None,
                error=ErrorRecord(status=exc.http_status, type="sandbox_busy", message=str(exc)),
            )
            outcome = Outcome(receipt_id=receipt_id, action="sandbox_busy", mode=mode, error=exc)
        except Exception as exc:  # a bug of ours: answer 500 without a traceback, keep the receipt
            log.exception("pipeline_error", receipt_id=receipt_id)
            message = f"internal error while handling {receipt_id}; see the server log"
            if self.config.server.debug:  # name the exception, never the traceback
                message += f" ({type(exc).__name__}: {exc})"
            err = FirstpassError(message)
            receipt = trace.record(
                action="internal_error",
                served=None,
                error=ErrorRecord(status=500, type="server_error", message=type(exc).__name__),
            )
            outcome = Outcome(receipt_id=receipt_id, action="internal_error", mode=mode, error=err)
        finally:
            CURRENT_BUDGET.reset(budget_token)
            if receipt is not None:
                try:
                    if receipt.decision.action == "cancelled":
                        # a second cancellation (shutdown) must cut neither this receipt's
                        # write nor its labels' way to the monitor
                        await asyncio.shield(self._write_observed(receipt))
                    else:
                        await self._write_observed(receipt)
                except ReceiptUnavailable as exc:
                    # durable receipts and the disk failed: withhold the answer (503) and
                    # write, without waiting, a receipt that says so instead of the one that
                    # claims it was sent
                    err = receipts_unavailable(exc)
                    receipted = await self._enqueue(withheld(receipt, err), receipt_id)
                    # queued on a failing disk: not on disk, so the 503 names no id
                    receipted = receipted and not self._durable
                    outcome = Outcome(
                        receipt_id=receipt_id,
                        action=WITHHELD_ACTION,
                        mode=mode,
                        error=err,
                        receipted=receipted,
                    )
                except ReceiptError as exc:
                    # the writer failed for good (a bug, a replica id taken over): nothing can
                    # be receipted, so no answer is sent either
                    log.error("receipt_not_written", receipt_id=receipt_id, error=str(exc))
                    outcome = Outcome(
                        receipt_id=receipt_id,
                        action=WITHHELD_ACTION,
                        mode=mode,
                        error=receipts_unavailable(exc),
                        receipted=False,
                    )
        return outcome

    async def refuse(
        self,
        *,
        receipt_id: str,
        request: RequestInfo,
        error: ErrorRecord,
        started: float | None = None,
        budget: BudgetRecord | None = None,
        action: Action = "rejected",
    ) -> bool:
        """Write the one receipt of a request refused before it ran (``decision.action =
        "rejected"``; ``"cancelled"`` when it was cancelled before admission let it through);
        ``False`` when the response must name no receipt: nothing was written (the writer
        failed for good), or, with ``fsync = "durable"``, the receipt is not on disk yet (the
        disk is failing: it waits in memory). With ``"durable"`` a refusal waits for the disk
        like an answer, so no client holds an id a crash could take out of the log."""
        trace = Trace(
            receipt_id=receipt_id,
            config=self.config,
            route=None,
            mode="rejected",
            request=request,
            started=started,
        )
        trace.step(action)
        receipt = trace.record(action=action, served=None, error=error, budget=budget)
        if not self._durable:
            return await self._enqueue(receipt, receipt_id)
        try:
            await self._write(receipt)
        except ReceiptUnavailable:
            await self._enqueue(receipt, receipt_id)  # kept for when the disk is back
            return False
        except ReceiptError as exc:
            log.error("receipt_not_written", receipt_id=receipt_id, error=str(exc))
            return False
        return True

    @property
    def _durable(self) -> bool:
        """Whether a response may name a receipt only once it is on disk (``fsync =
        "durable"``); otherwise once it is queued, as the fsync policy documents."""
        return self.config.receipts.fsync == "durable"

    def _observe_labels(self, receipt: Receipt) -> None:
        """A written receipt's labels of would-be skips (an audit, shadow's) to the monitor.

        Shadow's labels count only when shadow is the configured mode: a request that chose
        shadow itself (``client_modes``) would otherwise label every request it likes at a
        rate of 1, so one client could revoke a licence for everyone, or drown a drift in
        labels that pass. Audits are drawn by the server, whoever chose the mode."""
        if self.monitor is None:
            return
        configured = self.config.elastic.mode if self.config.elastic is not None else None
        for label in licence_labels(receipt):
            if label.source == "shadow" and configured != "shadow":
                continue
            self.monitor.observe_label(
                label.route, label.rung, label.certificate, label.failed, label.source
            )

    async def _write(self, receipt: Receipt) -> None:
        """``writer.write``; a receipt holding text that is not Unicode (a lone surrogate an
        upstream's error or a check's reason carried in) is written with that text repaired
        (``valid_text``) rather than lost."""
        try:
            await self.writer.write(receipt)
        except ReceiptValueError as exc:
            log.warning("receipt_text_repaired", receipt_id=receipt.id, error=str(exc))
            await self.writer.write(_repaired(receipt))

    async def _write_observed(self, receipt: Receipt) -> None:
        """``_write``, then the written receipt's labels to the monitor (``_observe_labels``):
        one coroutine, so that a shield over it covers both."""
        await self._write(receipt)
        self._observe_labels(receipt)

    async def _enqueue(self, record: Receipt, receipt_id: str) -> bool:
        """Queue a receipt that acknowledges no answer; ``False`` when the writer has failed
        for good (logged: the receipt is lost, the response must not name it)."""
        try:
            try:
                await self.writer.enqueue(record)
            except ReceiptValueError as exc:
                log.warning("receipt_text_repaired", receipt_id=receipt_id, error=str(exc))
                await self.writer.enqueue(_repaired(record))
        except ReceiptError as exc:
            log.error("receipt_not_written", receipt_id=receipt_id, error=str(exc))
            return False
        return True

    async def _run(self, req: RunRequest) -> Concluded:
        """The request's runner; a budget that refuses a call ends it here (``_budget_stop``)."""
        try:
            return await self._runner(req)
        except BudgetExhausted as exc:
            return self._budget_stop(req, exc)

    def _budget_stop(self, req: RunRequest, exc: BudgetExhausted) -> Concluded:
        """A call would have crossed a cap and was not made: serve the first answer that passed
        every check so far (``serve_best_verified``), else answer the 429; the receipt says
        which cap, its limit and what was spent (``decision.budget``)."""
        stop = Endings(budget=budget_record(exc))
        on_exhausted = (self.config.budgets or BudgetsConfig()).on_exhausted
        if on_exhausted == "serve_best_verified" and req.verified:
            served = req.verified[0]
            req.trace.step(f"budget:serve:{served.rung}")
            action: Action = "served" if served.rung == 0 else "escalated"
            return self.steps.finish(req, action=action, served=served, endings=stop)
        req.trace.step("budget:error")
        return self.steps.error(req, action="budget_exhausted", error=exc, endings=stop)

    async def _runner(self, req: RunRequest) -> Concluded:
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


def _repaired(receipt: Receipt) -> Receipt:
    """``receipt`` with every string made valid Unicode (``valid_strings``)."""
    return receipt_from_builtins(valid_strings(msgspec.to_builtins(receipt)))
