"""Drive the real proxy pipeline offline: replay providers, the real sandbox, a real receipt log.

Every request goes through ``firstpass.pipeline.Pipeline.handle`` exactly as the server calls it;
only the transport differs (no HTTP). The served answer is then judged by the oracle (the task's
hidden tests, in the same sandbox, from the program cache) and the receipt the pipeline wrote is
read back for calls, gate runs, cost and wall time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from benchmarks.datasets import Task
from firstpass.config import (
    Certificate,
    Config,
    Given,
    Licence,
    RequestMode,
    candidate_rule,
    config_digest,
    config_from_dict,
)
from firstpass.pipeline import Admitted, Checks, Pipeline
from firstpass.providers import build_provider
from firstpass.receipts import UNSET, Receipt, ReceiptWriter, RequestInfo, UnsetType

__all__ = [
    "ROUTES",
    "UNCERTIFIED_STUDY",
    "Ladder",
    "Policy",
    "RequestResult",
    "build_config",
    "run_policy",
    "uncertified_counterfactual",
]

#: route name -> the model name a request asks for (each route claims one)
ROUTES = {"cascade": "bench-cascade", "cheap": "bench-cheap", "top": "bench-top"}


@dataclass(frozen=True, kw_only=True)
class Ladder:
    """The two recorded models, their sample files and prices (USD per million tokens)."""

    cheap_model: str
    cheap_samples: Path
    cheap_price: tuple[float, float]
    top_model: str
    top_samples: Path
    top_price: tuple[float, float]
    temperature: float = 1.0


@dataclass(frozen=True, kw_only=True)
class Policy:
    """One way of answering: a route, a mode, the elastic block, and which checks are sent."""

    name: str
    route: str  # "cascade" | "cheap" | "top"
    mode: RequestMode
    elastic: dict[str, Any] | None = None
    visible: bool = True
    hidden: bool = True
    #: run enforce at this λ on every probed rung with no certificate behind it (a research
    #: counterfactual, see ``uncertified_counterfactual``); ``elastic`` then cites nothing
    uncertified_lambda: float | None = None


@dataclass(frozen=True, kw_only=True)
class RequestResult:
    """One request as the benchmark scores it (from the outcome, the receipt and the oracle)."""

    task_id: str
    action: str
    regime: str | None
    served: bool
    correct: bool
    gate_skipped: bool
    gate_runs: int
    model_calls: int
    samples: int
    cost_usd: float
    top_call_usd: float
    wall_ms: float
    sandbox_ms: float
    label: bool | None = None
    pass_count: int | None = None


def build_config(
    ladder: Ladder,
    receipts: Path,
    *,
    seed: int,
    elastic: dict[str, Any] | None = None,
) -> Config:
    """The benchmark's proxy config: two replay providers, three routes, the stated prices."""
    data: dict[str, Any] = {
        "receipts": {"path": str(receipts), "fsync": "batch"},
        "provider": [
            {"id": "cheap", "kind": "replay", "samples": str(ladder.cheap_samples), "seed": seed},
            {"id": "top", "kind": "replay", "samples": str(ladder.top_samples), "seed": seed},
        ],
        "route": [
            {
                "name": "cascade",
                "models": [ROUTES["cascade"]],
                "ladder": [f"cheap/{ladder.cheap_model}", f"top/{ladder.top_model}"],
                "temperature": ladder.temperature,
                "on_exhausted": "unverified",
            },
            {
                "name": "cheap",
                "models": [ROUTES["cheap"]],
                "ladder": [f"cheap/{ladder.cheap_model}"],
                "temperature": ladder.temperature,
            },
            {
                "name": "top",
                "models": [ROUTES["top"]],
                "ladder": [f"top/{ladder.top_model}"],
                "temperature": ladder.temperature,
            },
        ],
        "price": [
            {
                "model": f"cheap/{ladder.cheap_model}",
                "input_per_mtok": ladder.cheap_price[0],
                "output_per_mtok": ladder.cheap_price[1],
            },
            {
                "model": f"top/{ladder.top_model}",
                "input_per_mtok": ladder.top_price[0],
                "output_per_mtok": ladder.top_price[1],
            },
        ],
    }
    if elastic is not None:
        data["escalation"] = {"elastic": elastic}
    return config_from_dict(data, base_dir=receipts.parent, env={})


#: the certificate id receipts carry under ``uncertified_counterfactual``: no calibration file
#: has it, so a receipt of such a run can never be taken for one under a real certificate
UNCERTIFIED_STUDY = "uncertified-study"


def uncertified_counterfactual(config: Config, lam: float) -> Config:
    """``config`` with every probed (route, rung) skipping the gate at ``lam``, certified by
    nothing: what λ = ``lam`` without a certificate would cost. BENCHMARK-ONLY.

    No config file, environment variable or request can express this: under enforce the proxy
    skips the gate only where a calibration file's certificate licenses it, and refuses a
    hand-set λ (``firstpass.config._elastic``). This helper swaps the bound ``licences`` of an
    already validated config (an enforce block citing nothing, which on its own never skips)
    for a stand-in certificate with id ``UNCERTIFIED_STUDY``, α = δ = 1 (no guarantee at all)
    and the block's own k, score and escalate_at, so the pipeline runs the old fixed-λ policy
    as a reference point. Its receipts name that id and the config digest is recomputed, so
    they cannot pass for a certified run. Never use it outside a benchmark.
    """
    elastic = config.elastic
    if elastic is None or elastic.mode != "enforce":
        raise ValueError(
            "the uncertified counterfactual needs an enforce [escalation.elastic] block"
        )
    if any(lic.certificate is not None for lic in elastic.licences.values()):
        raise ValueError("the config already runs under a certificate: cite nothing to use this")
    routes = {route.name: route for route in config.routes}
    licences: dict[tuple[str, int], Licence] = {}
    for route_name, rung in sorted(elastic.licences):
        route = routes[route_name]
        rung_k = route.ladder[rung].k or elastic.k
        given = tuple(
            Given(
                rung=r,
                certificate=UNCERTIFIED_STUDY,
                lambda_=lam,
                escalate_at=elastic.escalate_at,
                max_gate_candidates=elastic.max_gate_candidates,
            )
            for (name, r) in sorted(elastic.licences)
            if name == route_name and r < rung
        )
        cert = Certificate(
            id=UNCERTIFIED_STUDY,
            path=Path(UNCERTIFIED_STUDY),
            route=route_name,
            routes=(route_name,),
            rung=rung,
            lambda_=lam,
            method="ltt",
            alpha=1.0,
            delta=1.0,
            score=elastic.score,
            k=rung_k,
            escalate_at=elastic.escalate_at,
            candidate_rule=candidate_rule(elastic.score),
            model=route.ladder[rung].name,
            temperature=route.temperature,  # requests here never set their own
            given=given,
        )
        licences[(route_name, rung)] = Licence(certificate=cert)
    bound = dataclasses.replace(elastic, licences=MappingProxyType(licences))
    changed = dataclasses.replace(config, elastic=bound)
    return dataclasses.replace(changed, digest=config_digest(changed))


@dataclass
class _CapturingWriter:
    """A real ``ReceiptWriter`` that also hands each receipt back to the benchmark."""

    writer: ReceiptWriter
    records: dict[str, Receipt] = field(default_factory=dict)

    async def write(self, record: Receipt) -> None:
        self.records[record.id] = record
        await self.writer.write(record)

    async def enqueue(self, record: Receipt) -> None:
        self.records[record.id] = record
        await self.writer.enqueue(record)


def _score(task: Task, record: Receipt, served_text: str | None, correct: bool) -> RequestResult:
    decision, probe = record.decision, record.probe
    regime = probe.regime if probe is not None else UNSET
    pass_count = probe.pass_count if probe is not None else UNSET
    return RequestResult(
        task_id=task.task_id,
        action=decision.action,
        regime=None if isinstance(regime, UnsetType) else regime,
        served=served_text is not None,
        correct=correct,
        gate_skipped=decision.action == "served_without_gate",
        gate_runs=sum(1 for c in record.checks if c.kind == "gate"),
        model_calls=sum(c.calls for c in record.upstream_calls),
        samples=sum(c.n for c in record.upstream_calls if c.calls),
        cost_usd=float(record.cost.total_usd),
        top_call_usd=float(record.cost.top_rung_usd),
        wall_ms=float(record.timings_ms.total),
        sandbox_ms=float(record.timings_ms.sandbox),
        label=decision.gate_label,
        pass_count=None if isinstance(pass_count, UnsetType) else pass_count,
    )


async def run_policy(
    policy: Policy,
    tasks: Sequence[Task],
    *,
    ladder: Ladder,
    sandbox: Any,
    receipts: Path,
    seed: int,
    concurrency: int = 4,
) -> list[RequestResult]:
    """Answer every task once under ``policy``; returns one result per task, in task order.

    The receipts go to ``receipts`` (a fresh hash-chained log); ``seed`` seeds the replay draws,
    so two policies run with the same seed see the same recorded samples in the same order.
    """
    # config_from_dict stats the sample files: keep that off the event loop
    config = await asyncio.to_thread(
        build_config, ladder, receipts, seed=seed, elastic=policy.elastic
    )
    if policy.uncertified_lambda is not None:
        config = uncertified_counterfactual(config, policy.uncertified_lambda)
    providers = {p.id: build_provider(p, session=None) for p in config.providers}
    await asyncio.gather(*(p.start() for p in providers.values()))
    writer = _CapturingWriter(ReceiptWriter(receipts, fsync="batch"))
    await writer.writer.start()
    pipeline = Pipeline(config=config, providers=providers, sandbox=sandbox, writer=writer)
    route = next(r for r in config.routes if r.name == policy.route)
    limit = asyncio.Semaphore(concurrency)

    async def one(i: int, task: Task) -> RequestResult:
        rid = f"{policy.name}-{seed}-{i}"
        visible = task.visible if policy.visible else None
        hidden = task.hidden if policy.hidden else None
        checks = Checks(
            visible=visible,
            hidden=hidden,
            n_visible=visible.n_tests if visible is not None else 0,
            n_hidden=hidden.n_tests if hidden is not None else 0,
        )
        async with limit:
            started = time.perf_counter()
            outcome = await pipeline.handle(
                Admitted(
                    receipt_id=rid,
                    route=route,
                    mode=policy.mode,
                    body={"messages": [{"role": "user", "content": task.prompt}]},
                    n=1,
                    checks=checks,
                    task_id=task.task_id,
                    request=RequestInfo(
                        model=ROUTES[policy.route],
                        stream=False,
                        n_visible=checks.n_visible,
                        n_hidden=checks.n_hidden,
                        task_id=task.task_id,
                    ),
                    started=started,
                )
            )
        text = outcome.served.text if outcome.served is not None else None
        correct = False
        if text is not None:
            correct = bool((await sandbox.run(text, task.hidden)).passed)
        return _score(task, writer.records[rid], text, correct)

    try:
        results = list(await asyncio.gather(*(one(i, t) for i, t in enumerate(tasks))))
    finally:
        await writer.writer.close()
        await asyncio.gather(*(p.aclose() for p in providers.values()))
    return results
