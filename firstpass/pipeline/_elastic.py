"""The elastic policy's I/O: draw the k-sample probe, route on it (enforce) or label it (shadow).

Enforce: probe → ``escalate`` (rung 1 at once, no gate paid on rung 0), ``serve`` (a passing
sample, gate skipped), or ``gate`` (gate the best candidates, serve on pass, else escalate).

Shadow: the client gets exactly what the plain cascade serves. The cascade's first attempt is
probe sample 0 (the k samples are drawn i.i.d., so sample 0 is distributed exactly like a fresh
cascade call, and the call is saved). Whatever elastic would have done, the gate runs on the
candidate it would have served, so every shadow receipt carries the label calibration learns from.

With a behavioural score (``score = "agreement"`` or ``"unanimous_agreement"``) the probe also
calls each sample's entry point on the probe inputs (``firstpass.probe``), in the same sandbox
process as its visible tests; samples with identical outputs form a cluster, and the candidate
comes from the largest one. With the default ``pass_share`` nothing extra runs and the receipt
is what it always was.

The decisions themselves are the pure functions of ``firstpass.policy``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TypeVar

from firstpass.budgets import budget_record
from firstpass.config import (
    ElasticConfig,
    Given,
    RequestDraw,
    applicable,
    unbound_fields,
)
from firstpass.errors import BudgetExhausted, FirstpassError, SandboxBusy, UpstreamError
from firstpass.monitor import LicenceMonitor
from firstpass.pipeline._cascade import CascadeRunner
from firstpass.pipeline._probe import (
    Labelled,
    Probe,
    cert_id,
    given_record,
    sample_view,
    sampling,
)
from firstpass.pipeline._seams import SandboxVerdict
from firstpass.pipeline._state import Answer, LadderResult, LadderState, RunRequest
from firstpass.pipeline._steps import Concluded, Endings, Steps, summary_of
from firstpass.pipeline._trace import Counterfactuals, ShadowLabels
from firstpass.pipeline._verify import StageResult
from firstpass.policy import (
    Attempt,
    behaviour_keys,
    candidate_order,
    cluster_sizes,
    counterfactual_action,
    needs_gate,
    probe_scores,
    regime_for,
)
from firstpass.probe import ProbeInputs, cached_probe_inputs
from firstpass.providers import upstream_body
from firstpass.receipts import (
    AuditRecord,
    Counterfactual,
    ProbeRecord,
)

__all__ = ["ElasticRunner", "Probe"]

_A = TypeVar("_A")
_B = TypeVar("_B")


async def _side_by_side(
    first: Coroutine[object, object, _A], second: Coroutine[object, object, _B]
) -> tuple[_A, _B]:
    """Both results. The first to fail (or a cancellation of this) cancels the other and waits
    for it, so its sandbox work stops and its cleanup runs before the error goes on; the error
    is raised as itself (``SandboxBusy`` stays ``SandboxBusy``), never as a group."""
    a, b = asyncio.ensure_future(first), asyncio.ensure_future(second)
    tasks = (a, b)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    finally:
        for task in tasks:
            task.cancel()  # a task already done is left as it is
        await asyncio.wait(tasks)
    failures = [task.exception() for task in tasks if not task.cancelled()]
    failure = next((exc for exc in failures if exc is not None), None)
    if failure is not None:
        raise failure
    return a.result(), b.result()


class ElasticRunner:
    """Shadow and enforce modes, over the shared steps; requests without visible tests, which
    the probe cannot score, run the plain cascade."""

    def __init__(
        self,
        steps: Steps,
        cascade: CascadeRunner,
        *,
        monitor: LicenceMonitor | None = None,
        audit_draw: Callable[[], float] | None = None,
    ) -> None:
        self.steps = steps
        self.cascade = cascade
        #: the licence monitor: which (route, rung) may no longer skip (None: nothing revoked)
        self.monitor = monitor
        #: a uniform draw in [0, 1) deciding whether a would-be skip is audited; unpredictable
        #: by default (a client who could predict it could aim bad answers at unaudited skips)
        self.audit_draw = audit_draw if audit_draw is not None else random.SystemRandom().random

    @property
    def elastic(self) -> ElasticConfig:
        """The elastic block (a runner is only built for a config that has one)."""
        elastic = self.steps.config.elastic
        if elastic is None:
            raise FirstpassError("the elastic policy runs only with [escalation.elastic]")
        return elastic

    # -- the probe -----------------------------------------------------------------------------

    async def _probe(
        self, req: RunRequest, index: int
    ) -> tuple[Probe | Answer | None, UpstreamError | None]:
        """Draw k samples from rung ``index`` in one call (``n = k``) and run the visible tests.

        An ``Answer`` instead of a probe: sample 0 ended its turn in tool calls (route
        ``tool_turns = "pass"``). The probe then does nothing: no checks run, no regime, no
        label; sample 0 is what the cascade would have served (its first attempt, drawn
        exactly like it), so shadow and enforce both serve it as the tool turn it is."""
        elastic = self.elastic
        rung = req.route.ladder[index]
        k = rung.k or elastic.k
        req.trace.step(f"probe:{index}:k={k}")
        began = time.perf_counter()
        completion, error = await self.steps.call(req, index, rung, purpose="probe", n=k)
        if completion is None:
            return None, error
        if self.steps.is_tool_turn(req, completion):
            req.trace.step(f"tool_turn:{index}")
            view = sample_view(completion, 0, keep_raw=True)
            return Answer(rung_index=index, rung=rung, completion=view), None
        texts = list(completion.texts[:k])
        if not req.checks.has_visible:  # the runners probe only requests with visible checks
            raise FirstpassError("the probe needs visible checks")
        spec = req.checks.visible
        score_name = elastic.score
        behavioural = score_name != "pass_share"
        # mutation is pure CPU (about a millisecond): off the event loop
        inputs = (
            await asyncio.to_thread(self._probe_inputs, req)
            if behavioural and spec is not None
            else None
        )
        t0 = time.perf_counter()
        runs: list[SandboxVerdict | None] = [None] * len(texts)
        vacuous: str | None = None
        if spec is not None:
            # the samples and, beside them in the same trip, the tests against null answers
            sampled = (  # with probe inputs, their outputs are recorded in the tests' process
                self.steps.sandbox.run_many(texts, spec, probe=inputs)
                if inputs
                else self.steps.sandbox.run_many(texts, spec)
            )
            if self._needs_null_check(req, index):
                verdicts, vacuous = await _side_by_side(
                    sampled, self.steps.sandbox.null_passes(spec)
                )
            else:
                verdicts = await sampled
            runs = list(verdicts)
        req.trace.sandbox_wall((time.perf_counter() - t0) * 1000.0)
        staged = await asyncio.gather(
            *(
                self.steps.verify(req, "visible", t, tests=r)
                for t, r in zip(texts, runs, strict=True)
            )
        )
        results: list[StageResult] = [r for r in staged if r is not None]
        req.trace.probe_wall((time.perf_counter() - began) * 1000.0)
        for i, result in enumerate(results):
            self.steps.record_check(req, index, i, "visible", result)
        # a sample that ended in tool calls is not an answer: it never counts as a pass, nor is
        # it ever a candidate to serve (its check records still say what the checks made of
        # its text)
        tool_samples = frozenset(
            i
            for i in range(len(results))
            if req.route.tool_turns == "pass" and completion.is_tool_turn(i)
        )
        passed = [bool(r.passed) and i not in tool_samples for i, r in enumerate(results)]
        c = sum(passed)
        if behavioural:
            # no probe input: every output vector is the empty one, so all passing samples agree
            keys = behaviour_keys(
                [getattr(r, "behaviour", None) for r in results], len(inputs) if inputs else 0
            )
            all_scores: dict[str, float] = {n: v for n, v in probe_scores(passed, keys).items()}
            scores: dict[str, float] | None = all_scores
            value = all_scores[score_name]
        else:
            # no probe inputs ran: samples agree when their extracted code is the same
            keys = [r.code_sha256 for r in results]
            scores, value = None, None
        temperature, top_p = sampling(req)
        biased = bool(req.body.get("logit_bias"))
        # decided from the body as the provider puts it on the wire, so the list of fields a
        # skip tolerates and what is sent cannot drift apart
        unbound = unbound_fields(upstream_body(rung.model, req.body, k))
        # the cap the probe's call went with (its own, else the budgets'): bound like temperature
        cap = self.steps.sent_cap(req.body, rung)
        route = req.route
        hidden = req.checks.hidden is not None
        # where the request's hidden tests are the gate, a request without visible tests is
        # scored by the route's listed checks alone: neither licensed nor calibrated on
        no_visible = not route.gate_checks and req.checks.visible is None
        applied = applicable(
            lam=elastic.lambda_for(route.name, index, req.mode),
            licence=elastic.licence(route.name, index),
            draw=RequestDraw(
                temperature=temperature,
                top_p=top_p,
                output_cap=cap,
                unbound=unbound,
                request_checks=req.checks.from_request,
                # on a route with operator gate checks only the operator's visible checks
                # license a skip: the client's tests alone could be `assert True`
                unlicensed_visible=bool(route.gate_checks) and not route.visible_checks,
                no_visible_tests=no_visible,
                vacuous_visible=vacuous,
                gate_hidden_tests=hidden,
            ),
            enforce=req.mode == "enforce",
            shadow_lambda=elastic.lambda_,
        )
        lam, cert, problem = applied.lam, applied.certificate, applied.problem
        regime = regime_for(c, k, lam=lam, escalate_at=elastic.escalate_at, score=value)
        req.trace.step(f"regime:{regime}:{c}/{k}")
        made = req.trace.last_call()
        assert made is not None  # the probe's own call, just recorded
        cost = made.cost_usd
        probe = Probe(
            rung_index=index,
            rung=rung,
            k=k,
            answers=tuple(
                Answer(rung_index=index, rung=rung, completion=sample_view(completion, i), sample=i)
                for i in range(len(texts))
            ),
            visible=tuple(results),
            pass_count=c,
            regime=regime,
            order=tuple(candidate_order(passed, keys)),
            cost_usd=cost,
            calls=completion.calls,
            score_name=score_name,
            visible_checks=tuple(req.checks.names("visible")),
            checks_digest=req.route.visible_checks_digest,
            request_checks=req.checks.from_request,
            lam=lam,
            certificate=cert,
            licence_problem=problem,
            temperature=temperature,
            top_p=top_p,
            logit_bias=biased,
            endpoint=self.steps.config.provider(rung.provider).endpoint,
            gate_checks_digest=route.gate_checks_digest,
            gate_hidden_tests=hidden,
            unbound_fields=unbound,
            vacuous_visible=vacuous,
            no_visible_tests=no_visible,
            # a probe's body is the request's (``call`` only sets temperature, drops seed)
            output_cap=cap,
            scores=scores,
            clusters=cluster_sizes(passed, keys) if behavioural else (),
            inputs=inputs,
            tool_samples=tool_samples,
        )
        return probe, None

    def _needs_null_check(self, req: RunRequest, index: int) -> bool:
        """Whether the visible tests must be run against null answers: where they alone could
        license a skip. On a route with operator gate checks the route's own visible checks
        license it (``applicable``), so the client's tests need no such run; under enforce only
        a rung with a certificate in force can skip; shadow records it on every probe, so
        calibration leaves vacuous rows out."""
        if req.route.gate_checks:
            return False
        if req.mode == "enforce":
            return self.elastic.licence(req.route.name, index).certificate is not None
        return True

    def _probe_inputs(self, req: RunRequest) -> ProbeInputs | None:
        """Generated from the visible tests (never the hidden ones), plus the request's own."""
        return cached_probe_inputs(req.checks.visible, extra=req.checks.probe_inputs)

    async def _gate(
        self, req: RunRequest, probe: Probe, sample: int, purpose: str | None
    ) -> StageResult:
        result = await self.steps.verify(req, "gate", probe.answers[sample].completion.texts[0])
        if result is None:  # the runners gate only requests that have a gate
            raise FirstpassError("the gate needs gate checks")
        self.steps.record_check(req, probe.rung_index, sample, "gate", result, purpose)
        return result

    def _enforce_record(self, probes: Sequence[Probe]) -> ProbeRecord:
        """Enforce's probe record: rung 0's, the higher probed rungs' in ``later``."""
        record = self._probe_record(probes[0])
        if len(probes) > 1:
            record.later = [self._probe_record(p) for p in probes[1:]]
        return record

    def _probe_record(self, probe: Probe) -> ProbeRecord:
        elastic = self.elastic
        return probe.record(
            escalate_at=elastic.escalate_at, max_gate_candidates=elastic.max_gate_candidates
        )

    # -- enforce -------------------------------------------------------------------------------

    async def enforce(self, req: RunRequest) -> Concluded:
        """Probe rung 0 (and any higher rung with its own ``k``); other rungs the cascade way."""
        if not req.checks.has_visible:
            req.trace.step("probe:skipped:no_visible_tests")
            return await self.cascade.cascade(req)
        probes: list[Probe] = []
        audits: list[AuditRecord] = []

        async def run_rung(req: RunRequest, state: LadderState, index: int) -> LadderResult | None:
            if index == 0 or req.route.ladder[index].k:
                return await self._enforce_rung(req, state, index, probes, audits)
            await self.steps.attempt_rung(req, state, index)
            return None

        result = await self.steps.run_ladder(req, LadderState(), rung_runner=run_rung)
        if not probes and result.action == "tool_turn":  # rung 0's turn: nothing was probed
            return self.steps.conclude(req, result)
        if not probes:  # the probe call itself failed upstream
            failed = ProbeRecord(rung=0, error=req.trace.first_upstream_error())
            return self.steps.conclude(req, result, Endings(probe=failed))
        escalated = result.served is None or result.served.rung > 0
        return self.steps.conclude(
            req,
            result,
            Endings(
                probe=self._enforce_record(probes),
                counterfactual=self._cascade_estimate(req, probes[0], escalated=escalated),
                audit=audits[0] if audits else None,
            ),
        )

    async def _enforce_rung(
        self,
        req: RunRequest,
        state: LadderState,
        index: int,
        probes: list[Probe],
        audits: list[AuditRecord],
    ) -> LadderResult | None:
        """One elastic rung: serve, gate, or record a declined attempt and let the ladder go on.

        A licence the monitor revoked gates as an uncertified rung does. A would-be skip drawn
        for an audit (``audit_rate``; at most one a request) runs the gate as the ``gate``
        regime would, and what the gate decides is what is served: the skip's answer is labelled
        without the client ever getting an unchecked answer because of it.
        """
        probe, error = await self._probe(req, index)
        if isinstance(probe, Answer):  # a tool turn: served as it came (``run_ladder``)
            state.tool_turn = probe
            return None
        if probe is None:
            state.attempts.append(Attempt(rung=index, upstream_failed=True))
            state.answers.append(None)
            state.last_error = error
            return None
        probe = self._unless_revoked(req, probe, audits)
        probes.append(probe)
        req.trace.learned(probe=lambda: self._enforce_record(probes))
        first = index == 0
        audit: AuditRecord | None = None
        if probe.regime == "serve":
            audit = self._audit_draw(req, probe, audits)
            if audit is None:
                req.trace.step(f"serve_without_gate:{index}:{probe.candidate}")
                return LadderResult(
                    action="served_without_gate" if first else "escalated",
                    served=probe.answers[probe.candidate].served("gate_skipped"),
                )
            audits.append(audit)
            req.trace.learned(audit=audit)  # its label is set on it once the gate has run
            req.trace.step(f"audit:{index}:{probe.candidate}")
        gate_results: dict[int, StageResult] = {}
        if audit is not None:
            # the sample the skip would have served is gated first (it heads ``order``): its
            # verdict is the label; a gate that cannot run (budget, no sandbox slot) leaves the
            # label unknown and the skip serves as it would have without the audit
            try:
                label_result = await self._gate(req, probe, probe.candidate, purpose=None)
            except (BudgetExhausted, SandboxBusy) as exc:
                why = "budget" if isinstance(exc, BudgetExhausted) else "sandbox_busy"
                req.trace.step(f"audit:{index}:{probe.candidate}:{why}")
                req.trace.step(f"serve_without_gate:{index}:{probe.candidate}")
                return LadderResult(
                    action="served_without_gate" if first else "escalated",
                    served=probe.answers[probe.candidate].served("gate_skipped"),
                )
            audit.label = bool(label_result.passed)
            gate_results[probe.candidate] = label_result
            req.trace.step(
                f"gate:{index}:{probe.candidate}:{'pass' if label_result.passed else 'fail'}"
            )
            if label_result.passed:
                return LadderResult(
                    action="served_after_gate" if first else "escalated",
                    served=probe.answers[probe.candidate].served("verified"),
                )
        if probe.regime == "gate" or audit is not None:
            if not req.checks.has_gate:  # the visible checks were the whole check
                req.trace.step(f"serve:{index}:{probe.candidate}")
                return LadderResult(
                    action="served_after_gate" if first else "escalated",
                    served=probe.answers[probe.candidate].served("verified"),
                )
            for sample in probe.order[: self.elastic.max_gate_candidates]:
                if sample in gate_results:  # the audit's label gate: already failed
                    continue
                result = await self._gate(req, probe, sample, purpose=None)
                gate_results[sample] = result
                req.trace.step(f"gate:{index}:{sample}:{'pass' if result.passed else 'fail'}")
                if result.passed:
                    return LadderResult(
                        action="served_after_gate" if first else "escalated",
                        served=probe.answers[sample].served("verified"),
                    )
        # escalate: at once (regime escalate) or after the gate failed every candidate
        best = probe.candidate
        gate = gate_results.get(best)
        state.attempts.append(
            Attempt(
                rung=index,
                visible=summary_of(probe.visible[best]),
                gate=summary_of(gate) if gate is not None else None,
                declined=True,
            )
        )
        state.answers.append(probe.answers[best])
        req.trace.step(f"escalate:{index}")
        return None

    def _unless_revoked(
        self, req: RunRequest, probe: Probe, audits: Sequence[AuditRecord] = ()
    ) -> Probe:
        """``probe`` as it runs when its certificate does not hold here: the monitor revoked
        its licence (or a lower rung's on the route), or the request reached this rung because
        an audit below rejected the skip's answer (no calibration request ever arrived that way:
        a lower rung's skip never escalated, so this rung's ``given`` does not cover it). No
        certificate, no λ, the regime an uncertified rung gets; the receipt's
        ``uncertified_because`` says why."""
        if probe.certificate is None:
            return probe
        revoked = (
            None
            if self.monitor is None
            else self.monitor.revocation(req.route.name, probe.rung_index)
        )
        audited = next((a for a in audits if a.label is False), None)
        if revoked is not None:
            why = revoked.evidence()
            if revoked.key.rung != probe.rung_index:
                why = f"rung {revoked.key.rung} below is revoked; " + why
            req.trace.step(f"revoked:{probe.rung_index}")
        elif audited is not None and audited.rung < probe.rung_index:
            why = (
                f"this request reached rung {probe.rung_index} because the audit of rung "
                f"{audited.rung}'s skip failed; the certificate's data never had a skip "
                "escalate, so it does not cover such requests"
            )
            req.trace.step(f"after_audit:{probe.rung_index}")
        else:
            return probe
        regime = regime_for(
            probe.pass_count,
            probe.k,
            lam=None,
            escalate_at=self.elastic.escalate_at,
            score=probe.score,
        )
        return dataclasses.replace(
            probe, lam=None, certificate=None, licence_problem=why, regime=regime
        )

    def _audit_draw(
        self, req: RunRequest, probe: Probe, audits: list[AuditRecord]
    ) -> AuditRecord | None:
        """Whether this would-be skip is audited: drawn at ``audit_rate`` (once a request, and
        only where there is a gate to run and a certificate to label)."""
        rate = self.elastic.audit_rate
        cert = probe.certificate
        if rate <= 0.0 or cert is None or audits or not req.checks.has_gate:
            return None
        if self.audit_draw() >= rate:
            return None
        return AuditRecord(rung=probe.rung_index, rate=rate, certificate=cert.id, label=None)

    # -- shadow --------------------------------------------------------------------------------

    async def shadow(self, req: RunRequest) -> Concluded:
        """Serve what the cascade serves; probe and label every rung elastic would reach.

        Rung 0 is probed on every request. A higher rung with its own ``k`` is probed exactly
        when elastic would reach it (its lower probed rungs escalate, at once or after the gate),
        so its labels come from the very requests enforce would send there: the population its
        certificate must hold for. Where the cascade reaches it too, the cascade's attempt is
        that probe's sample 0; where only elastic would, the probe is drawn for the label alone
        (its cost is in ``cost.probe_usd``).
        """
        if not req.checks.has_visible:
            req.trace.step("probe:skipped:no_visible_tests")
            return await self.cascade.cascade(req)
        try:
            probe, error = await self._probe(req, 0)
        except BudgetExhausted as exc:
            # k samples (or their checks' calls) do not fit where the cascade's one call may:
            # no probe, no label, and the client gets what the plain cascade makes of it
            req.trace.step("probe:0:budget")
            result = await self.steps.run_ladder(req, LadderState())
            refused = ProbeRecord(rung=0, error=str(exc), budget=budget_record(exc))
            return self.steps.conclude(req, result, Endings(probe=refused))
        if isinstance(probe, Answer):
            # sample 0 is the cascade's first attempt: a tool turn, which the cascade serves
            # as it came; there is no final answer to label
            served = probe.served("unchecked")
            return self.steps.conclude(req, LadderResult(action="tool_turn", served=served))
        if probe is None:
            # no probe, no label: the cascade makes its own rung-0 call as it always would
            result = await self.steps.run_ladder(req, LadderState())
            failed = ProbeRecord(rung=0, error=str(error))
            return self.steps.conclude(req, result, Endings(probe=failed))
        labelled = await self._label_probe(req, probe, cascade=True)
        labels = ShadowLabels(
            counterfactual=labelled.counterfactual,
            gate_label=labelled.label,
            label_sample=probe.candidate if labelled.label is not None else None,
            label_budget=labelled.label_budget,
            label_error=labelled.label_error,
        )
        later: list[ProbeRecord] = []

        def shadow_record() -> ProbeRecord:
            record = self._probe_record(probe)
            if later:
                record.later = list(later)
            return record

        req.trace.learned(probe=shadow_record, shadow=labels)
        state = LadderState(attempts=[labelled.attempt], answers=[probe.answers[0]])
        self.steps.note_verified(req, state)
        # the cascade's attempt is sample 0: it revises it as the cascade would
        await self.steps.revise(req, state, probe.visible[0], labelled.gate0)
        reach: dict[int, bool] = {1: labelled.escalates}
        ran: dict[int, Given] = {0: self._given(probe)}  # the probed rungs as they ran

        async def run_rung(req: RunRequest, state: LadderState, index: int) -> LadderResult | None:
            await self._shadow_rung(req, state, index, reach, later, ran)
            return None

        result = await self.steps.run_ladder(req, state, rung_runner=run_rung)
        # rungs elastic would reach that the cascade did not: probed for their labels only
        # (none past a tool turn: elastic, reaching that rung, would have met one as well)
        index = max(a.rung for a in state.attempts) + 1
        if state.tool_turn is not None:
            index = len(req.route.ladder)
        stopped: BudgetExhausted | None = None
        try:
            while index < len(req.route.ladder) and reach.get(index):
                await self._shadow_rung(req, None, index, reach, later, ran)
                index += 1
        except BudgetExhausted as exc:
            # only labels were left to buy: the client still gets what the cascade decided
            later.append(ProbeRecord(rung=index, error=str(exc), budget=budget_record(exc)))
            stopped = exc
        except SandboxBusy as exc:
            # the label's samples got no sandbox slot: likewise, the cascade's answer stands
            later.append(ProbeRecord(rung=index, error=str(exc), sandbox_busy=True))
        return self.steps.conclude(
            req,
            result,
            Endings(
                probe=shadow_record(),
                shadow=labels,
                counterfactual=self._elastic_estimate(req, probe, labelled.counterfactual),
                budget=budget_record(stopped) if stopped is not None else None,
            ),
        )

    async def _shadow_rung(
        self,
        req: RunRequest,
        state: LadderState | None,
        index: int,
        reach: dict[int, bool],
        later: list[ProbeRecord],
        ran: dict[int, Given],
    ) -> None:
        """Rung ``index`` in shadow: the cascade's attempt (``state``; None when only elastic
        reaches it), as a probe when the rung has its own ``k`` and elastic reaches it."""
        rung = req.route.ladder[index]
        elastic_here = bool(reach.get(index))
        if not (elastic_here and rung.k):
            target = state if state is not None else LadderState()
            # on ``state``: the cascade's attempt; on a scratch state: a plain rung elastic
            # would try, whose verdict decides whether elastic goes on
            await self.steps.attempt_rung(
                req, target, index, purpose="attempt" if state is not None else "label"
            )
            if target.tool_turn is not None:
                # a tool turn: served (the cascade's) or nothing to label (elastic's alone)
                reach[index + 1] = False
                return
            attempt = target.attempts[-1]
            # enforce runs a rung without k the cascade way: it goes on when the attempt fails
            reach[index + 1] = elastic_here and not attempt.verified
            return
        given = [given_record(ran[j]) for j in sorted(ran) if j < index]
        try:
            probe, error = await self._probe(req, index)
        except BudgetExhausted as exc:
            if state is None:  # only a label was to be bought: the caller records the refusal
                raise
            # the cascade's attempt still fits where k samples do not: made the cascade way
            req.trace.step(f"probe:{index}:budget")
            later.append(
                ProbeRecord(rung=index, error=str(exc), budget=budget_record(exc), given=given)
            )
            reach[index + 1] = False  # unknown: nothing above is labelled for this request
            await self.steps.attempt_rung(req, state, index)
            return
        if isinstance(probe, Answer):
            # a tool turn: the cascade (when it reached this rung) serves it as it came;
            # nothing is labelled here or above
            later.append(ProbeRecord(rung=index, error="ended in tool calls", given=given))
            reach[index + 1] = False
            if state is not None:
                state.tool_turn = probe
            return
        if probe is None:
            later.append(ProbeRecord(rung=index, error=str(error), given=given))
            reach[index + 1] = False  # unknown: nothing above is labelled for this request
            if state is not None:
                state.attempts.append(Attempt(rung=index, upstream_failed=True))
                state.answers.append(None)
                state.last_error = error
            return
        ran[index] = self._given(probe)
        labelled = await self._label_probe(req, probe, cascade=state is not None)
        if state is not None:
            state.attempts.append(labelled.attempt)
            state.answers.append(probe.answers[0])
            self.steps.note_verified(req, state)
            await self.steps.revise(req, state, probe.visible[0], labelled.gate0)
        reach[index + 1] = labelled.escalates
        record = self._probe_record(probe)
        record.gate_label = labelled.label
        if labelled.label_budget is not None:
            record.label_budget = labelled.label_budget
        if labelled.label_error is not None:
            record.label_error = labelled.label_error
        record.counterfactual = labelled.counterfactual
        record.cascade_reached = state is not None
        record.given = given
        later.append(record)

    def _given(self, probe: Probe) -> Given:
        """A probed rung as it ran for this request: what a higher rung's label depends on."""
        elastic = self.elastic
        return Given(
            rung=probe.rung_index,
            certificate=cert_id(probe.certificate),
            lambda_=probe.lam,
            escalate_at=elastic.escalate_at,
            max_gate_candidates=elastic.max_gate_candidates,
        )

    async def _label_probe(self, req: RunRequest, probe: Probe, *, cascade: bool) -> Labelled:
        """Gate what shadow needs: sample 0 as the cascade would (``cascade``), and elastic's
        candidate for the label; with ``max_gate_candidates`` > 1 and a failed label, the next
        candidates too, so the counterfactual says what enforce would really have done."""
        has_gate = req.checks.has_gate
        first = probe.visible[0]
        cascade_gate = cascade and needs_gate(summary_of(first), has_gate)
        candidate = probe.candidate
        separate_label = has_gate and not (cascade_gate and candidate == 0)
        refused: list[BudgetExhausted | SandboxBusy] = []

        async def label_gate(sample: int) -> StageResult | None:
            """A gate run for the label alone: a budget that refuses it (its judge) or a sandbox
            with no slot for it leaves the label unknown and never fails the request, which
            gets what the cascade serves."""
            try:
                return await self._gate(req, probe, sample, purpose="label")
            except (BudgetExhausted, SandboxBusy) as exc:
                why = "budget" if isinstance(exc, BudgetExhausted) else "sandbox_busy"
                req.trace.step(f"label:{probe.rung_index}:{sample}:{why}")
                refused.append(exc)
                return None

        jobs: list[Coroutine[object, object, StageResult | None]] = []
        if cascade_gate:
            jobs.append(self._gate(req, probe, 0, purpose=None))
        if separate_label:
            jobs.append(label_gate(candidate))
        tasks = [asyncio.ensure_future(job) for job in jobs]
        try:
            results = await asyncio.gather(*tasks)
        except BaseException:  # the cascade's gate failed the request: its label stops too
            for task in tasks:
                task.cancel()
            raise
        gate0 = results[0] if cascade_gate else None
        label_result = results[-1] if separate_label else gate0
        label = bool(label_result.passed) if label_result is not None else None
        if gate0 is not None:
            req.trace.step(f"gate:{probe.rung_index}:{'pass' if gate0.passed else 'fail'}")
        gate_any = label
        if probe.regime == "gate" and label is False:
            tried = {candidate}
            for sample in probe.order[: self.elastic.max_gate_candidates]:
                if sample in tried:
                    continue
                tried.add(sample)
                found = await label_gate(sample)
                if found is None:  # not run: whether enforce would have served is unknown
                    gate_any = None
                    break
                if found.passed:
                    gate_any = True
                    break
        if probe.regime == "escalate":
            counterfactual: Counterfactual | None = "escalate"
        elif probe.regime == "serve":
            counterfactual = "serve_without_gate"
        elif not has_gate:  # the visible tests were the whole check
            counterfactual = "serve_after_gate"
        elif gate_any is None:  # a label gate that could not run: nothing is claimed
            counterfactual = None
        else:
            counterfactual = counterfactual_action("gate", gate_any)
        return Labelled(
            label=label,
            counterfactual=counterfactual,
            escalates=counterfactual in ("escalate", "escalate_after_gate"),
            attempt=Attempt(
                rung=probe.rung_index,
                visible=summary_of(first),
                gate=summary_of(gate0) if gate0 is not None else None,
            ),
            gate0=gate0,
            refused=refused[0] if refused else None,
        )

    # -- counterfactual costs (estimates, documented in docs/receipts.md) ---------------------

    def _higher_rung_cost(self, req: RunRequest) -> float:
        """Cost of the calls this request made above rung 0; if none, an estimate of rung 1."""
        if req.trace.called_above(0):
            return req.trace.cost_above(0)
        if len(req.route.ladder) < 2:
            return 0.0
        return req.trace.estimate_call_cost(req.route.ladder[1])

    def _cascade_estimate(
        self, req: RunRequest, probe: Probe, *, escalated: bool
    ) -> Counterfactuals:
        """Enforce: what the plain cascade would have cost (one cheap sample, plus what went up)."""
        one_sample = probe.cost_usd / max(1, probe.k)
        if not escalated:
            return Counterfactuals(usd=one_sample, policy="cascade")
        return Counterfactuals(usd=one_sample + self._higher_rung_cost(req), policy="cascade")

    def _elastic_estimate(
        self, req: RunRequest, probe: Probe, counterfactual: Counterfactual | None
    ) -> Counterfactuals:
        """Shadow: what elastic would have cost (the probe, plus rung 1 when it escalates)."""
        cost = probe.cost_usd
        if counterfactual in ("escalate", "escalate_after_gate"):
            cost += self._higher_rung_cost(req)
        return Counterfactuals(usd=cost, policy="elastic")
