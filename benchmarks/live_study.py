"""What the revision loop buys on a LIVE model: MBPP+ tasks through a real Firstpass over HTTP.

A real Firstpass (``firstpass serve``, its own process) fronts any OpenAI-compatible server
(vLLM, llama.cpp, Ollama, a hosted API) as an ``openai`` provider. Each task's prompt is sent as
a chat request carrying the task's **visible** test (MBPP's shown assert) as its check; the
**hidden** tests (MBPP+ inputs) are never sent: they are the oracle, run here in the sandbox on
the answer Firstpass served. Arms, paired on the same tasks (their order shuffled per task, so
a server's prompt cache favours none):

- ``none``: no revision (a route without ``[route.revision]``: ``max_revisions`` 0).
- ``retry``: retry WITHOUT feedback. Firstpass has no switch for "another fresh sample on the
  same rung" (``[route.revision]`` always sends the failure back), so the harness makes the
  retries itself: when ``none``'s answer is not verified, the same request again (a fresh
  sample, nothing about the failure), at most ``--retries`` more times; it serves the first
  verified answer, else ``none``'s. Attempt 0 IS ``none``'s request, so the paired difference is
  exactly what the retries changed. With a ``--strong`` rung each retry is the whole cascade.
- ``revise1`` / ``revise2``: Firstpass's revision loop with its feedback (the failing assert
  and its error), ``max_revisions`` 1 and 2.

Plus the elastic probe on real samples (``--k`` > 0): the same prompt in shadow mode
(``[escalation.elastic]``, k samples from the cheapest rung): the regimes 0/k, partial and k/k,
their visible pass shares and the oracle's verdict on what shadow served.

Per arm: success (the oracle passes the served answer), tokens in / out and cost (from the
receipts: the upstream's own usage, priced at ``--price``), latency p50 / p95 (client wall time
per task, all of an arm's requests), and paired differences against ``none``: success by
Newcombe's hybrid score interval for paired proportions (method 10) with McNemar's exact p;
tokens, cost and latency by a paired bootstrap over tasks. The results file names the model,
``GET /v1/models``, the llama-cpp-python release with ``--local``, the code's revision, the
command, the machine and the date.

    python -m benchmarks.live_study --base-url URL --model M [--strong-base-url U --strong M2]
        [--tasks N] [--k 3] [--retries 2] [--seed 0] [--max-tokens 256] [--out PATH]
    python -m benchmarks.live_study --local [--tasks N] ...   # the bundled SmolLM2-135M

Tasks: the ``--tasks`` easiest MBPP+ tasks by the length of MBPP's reference solution (or the
file's order, ``--order file``), from ``benchmarks/.cache/data/tasks.jsonl``, converted from
``../shared/data`` (``$FIRSTPASS_DATA``) on first use; absent data is a clean skip (exit 2).
``--budget-s`` stops starting tasks after that many seconds and reports the tasks done.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks._programs import DEFAULT_CACHE_DIR, CachingSandbox
from benchmarks._report import (
    RESULTS,
    bootstrap_ci,
    command_line,
    dump_json,
    header,
    pct,
    percentile,
    revision,
    write_text,
)
from benchmarks.datasets import DEFAULT_OUT, DataMissing, Task, data_dir, load_tasks

__all__ = [
    "ARMS",
    "TaskResult",
    "main",
    "mcnemar_exact",
    "newcombe_paired",
    "write_config",
]

#: the arms, in report order; ``none`` is the baseline every difference is taken against
ARMS = ("none", "retry", "revise1", "revise2")
#: the route each Firstpass arm asks for, and its ``max_revisions`` (None: no revision loop)
ROUTES: dict[str, int | None] = {"live-r0": None, "live-r1": 1, "live-r2": 2}
ARM_ROUTE = {"none": "live-r0", "retry": "live-r0", "revise1": "live-r1", "revise2": "live-r2"}
#: assumed price of the live model, USD per million input / output tokens (a hosted small
#: coder's list price; the local 135M model costs nothing but electricity)
DEFAULT_PRICE = (0.03, 0.09)
DEFAULT_STRONG_PRICE = (0.27, 1.10)


# -- the Firstpass in front of the model -------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Upstream:
    """One OpenAI-compatible server and the model the study asks it for."""

    base_url: str
    model: str
    price: tuple[float, float]
    honours_n: bool = True
    api_key_env: str | None = None


def write_config(
    path: Path,
    *,
    port: int,
    weak: Upstream,
    strong: Upstream | None,
    k: int,
    temperature: float,
    request_timeout_s: float,
) -> Path:
    """The proxy's config: one provider per upstream, a route per revision setting (each with
    the whole ladder), the prices and, for the probe, a shadow ``[escalation.elastic]``."""
    ups = [("weak", weak)] + ([("strong", strong)] if strong is not None else [])
    lines = [
        "[server]",
        'host = "127.0.0.1"',
        f"port = {port}",
        f"request_timeout_s = {request_timeout_s}",
        "",
        "[receipts]",
        f"path = {json.dumps(str(path.parent / 'receipts.jsonl'))}",
        'fsync = "batch"',
        "",
    ]
    for pid, up in ups:
        lines += [
            "[[provider]]",
            f'id = "{pid}"',
            'kind = "openai"',
            f"base_url = {json.dumps(up.base_url)}",
            f"honours_n = {str(up.honours_n).lower()}",
            f"timeout_s = {request_timeout_s}",
            "retries = 1",
            *([f"api_key_env = {json.dumps(up.api_key_env)}"] if up.api_key_env else []),
            "",
            "[[price]]",
            f"model = {json.dumps(f'{pid}/{up.model}')}",
            f"input_per_mtok = {up.price[0]}",
            f"output_per_mtok = {up.price[1]}",
            "",
        ]
    ladder = ", ".join(json.dumps(f"{pid}/{up.model}") for pid, up in ups)
    for name, max_r in ROUTES.items():
        lines += [
            "[[route]]",
            f'name = "{name}"',
            f'models = ["{name}"]',
            f"ladder = [{ladder}]",
            f"temperature = {temperature}",
            'on_exhausted = "unverified"',
            "",
        ]
        if max_r is not None:
            lines += ["[route.revision]", f"max_revisions = {max_r}", ""]
    if k > 0:
        lines += ["[escalation.elastic]", 'mode = "shadow"', f"k = {k}", ""]
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


# -- one request -------------------------------------------------------------------------------


@dataclass(kw_only=True)
class Reply:
    """One HTTP answer from Firstpass: what it served and the receipt id to look up."""

    status: int
    text: str | None
    receipt_id: str | None
    verification: str | None
    wall_s: float
    error: str | None = None


def request_body(task: Task, route: str, *, mode: str, max_tokens: int) -> dict[str, Any]:
    """The chat request for ``task``: its prompt, and its visible test as the check."""
    visible: Any = list(task.row.get("visible_tests") or [])
    if task.setup:
        visible = {"asserts": visible, "setup": task.setup}
    return {
        "model": route,
        "messages": [{"role": "user", "content": task.prompt}],
        "max_tokens": max_tokens,
        "firstpass": {
            "tests": {"visible": visible},
            "entry_point": task.entry_point,
            "mode": mode,
        },
    }


async def ask(session: Any, url: str, body: dict[str, Any]) -> Reply:
    """POST one chat request; a non-200 or a lost connection is a ``Reply`` with its error
    (status 0: no answer), never an exception, so one failure does not end the run."""
    import aiohttp

    started = time.perf_counter()
    try:
        return await _ask(session, url, body, started)
    except (aiohttp.ClientError, TimeoutError) as exc:
        return Reply(
            status=0,
            text=None,
            receipt_id=None,
            verification=None,
            wall_s=time.perf_counter() - started,
            error=f"{type(exc).__name__}: {exc}",
        )


async def _ask(session: Any, url: str, body: dict[str, Any], started: float) -> Reply:
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        raw = await resp.read()
        wall = time.perf_counter() - started
        rid = resp.headers.get("X-Firstpass-Receipt")
        try:
            data = json.loads(raw)
        except ValueError:
            data = {}
        if resp.status != 200:
            err = data.get("error", {}) if isinstance(data, dict) else {}
            return Reply(
                status=resp.status,
                text=None,
                receipt_id=rid,
                verification=None,
                wall_s=wall,
                error=str(err.get("message") or raw[:200]),
            )
        choice = (data.get("choices") or [{}])[0]
        fp = data.get("firstpass") or {}
        return Reply(
            status=200,
            text=(choice.get("message") or {}).get("content"),
            receipt_id=rid or fp.get("receipt_id"),
            verification=fp.get("verification"),
            wall_s=wall,
        )


# -- one task, every arm -----------------------------------------------------------------------


@dataclass(kw_only=True)
class ArmResult:
    """One arm on one task: the requests it made and what it served."""

    replies: list[Reply] = field(default_factory=list)
    served: int = 0  # which reply's answer the arm served
    correct: bool = False  # filled in by the oracle
    tokens_in: int = 0  # filled in from the receipts
    tokens_out: int = 0
    cost_usd: float = 0.0
    calls: int = 0
    revisions: int = 0  # revision calls Firstpass made
    probe: dict[str, Any] | None = None  # the shadow probe's record (the ``probe`` arm)

    @property
    def wall_s(self) -> float:
        return sum(r.wall_s for r in self.replies)

    @property
    def text(self) -> str | None:
        return self.replies[self.served].text if self.replies else None

    @property
    def verified(self) -> bool:
        return bool(self.replies) and self.replies[self.served].verification == "verified"

    @property
    def later(self) -> bool:
        """Verified by a later attempt: a retry (``served`` > 0) or a revision (on one rung the
        loop stops at the first passing attempt, so a verified answer after revisions is a
        revision's; with a ``--strong`` rung it may be the strong rung's first answer)."""
        return self.verified and (self.served > 0 or self.revisions > 0)

    @property
    def errors(self) -> int:
        return sum(1 for r in self.replies if r.status != 200)


@dataclass(kw_only=True)
class TaskResult:
    task_id: str
    order: list[str]
    arms: dict[str, ArmResult]


async def run_task(
    session: Any,
    url: str,
    task: Task,
    *,
    retries: int,
    k: int,
    max_tokens: int,
    rng: random.Random,
) -> TaskResult:
    """Every arm on ``task``, in a shuffled order (``retry`` right after ``none``: it starts
    from ``none``'s answer)."""
    units = ["none+retry", "revise1", "revise2"] + (["probe"] if k > 0 else [])
    rng.shuffle(units)
    arms: dict[str, ArmResult] = {}
    for unit in units:
        if unit == "none+retry":
            first = await ask(
                session, url, request_body(task, "live-r0", mode="cascade", max_tokens=max_tokens)
            )
            arms["none"] = ArmResult(replies=[first])
            retry = ArmResult(replies=[first])
            while retry.replies[-1].verification != "verified" and len(retry.replies) <= retries:
                again = await ask(
                    session,
                    url,
                    request_body(task, "live-r0", mode="cascade", max_tokens=max_tokens),
                )
                retry.replies.append(again)
            verified = [i for i, r in enumerate(retry.replies) if r.verification == "verified"]
            retry.served = verified[0] if verified else 0
            arms["retry"] = retry
        elif unit == "probe":
            body = request_body(task, "live-r0", mode="shadow", max_tokens=max_tokens)
            arms["probe"] = ArmResult(replies=[await ask(session, url, body)])
        else:
            route = ARM_ROUTE[unit]
            body = request_body(task, route, mode="cascade", max_tokens=max_tokens)
            arms[unit] = ArmResult(replies=[await ask(session, url, body)])
    order = [a for u in units for a in (("none", "retry") if u == "none+retry" else (u,))]
    return TaskResult(task_id=task.task_id, order=order, arms=arms)


def apply_receipts(results: Sequence[TaskResult], receipts: dict[str, dict[str, Any]]) -> int:
    """Tokens, cost, calls, revisions and the probe from each request's receipt; returns how
    many replies had no receipt."""
    missing = 0
    for tr in results:
        for arm in tr.arms.values():
            for reply in arm.replies:
                rec = receipts.get(reply.receipt_id or "")
                if rec is None:
                    missing += 1
                    continue
                for call in rec.get("upstream_calls") or []:
                    arm.tokens_in += int(call.get("input_tokens") or 0)
                    arm.tokens_out += int(call.get("output_tokens") or 0)
                    arm.calls += int(call.get("calls") or 0)
                    arm.revisions += call.get("purpose") == "revision"
                arm.cost_usd += float((rec.get("cost") or {}).get("total_usd") or 0.0)
                if rec.get("probe"):
                    arm.probe = rec["probe"]
    return missing


async def judge(results: Sequence[TaskResult], tasks: dict[str, Task], sb: CachingSandbox) -> None:
    """The oracle: every served answer on its task's hidden tests."""

    async def one(arm: ArmResult, task: Task) -> None:
        text = arm.text
        arm.correct = bool(text) and bool((await sb.run(text or "", task.hidden)).passed)

    await asyncio.gather(
        *(one(arm, tasks[tr.task_id]) for tr in results for arm in tr.arms.values())
    )


# -- statistics ---------------------------------------------------------------------------------


def wilson(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson's score interval for a proportion."""
    if n == 0:
        return (math.nan, math.nan)
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def newcombe_paired(x: Sequence[bool], y: Sequence[bool]) -> tuple[float, float, float]:
    """p(x) − p(y) for paired binary outcomes and its 95% interval: Newcombe's hybrid score
    interval (1998, method 10: Wilson intervals without continuity correction, phi's numerator
    corrected as in the paper), good at small n and rates near 0. Fagerland et al. (2014) give
    −0.507 to −0.026 for their 1 / 1 / 7 / 12 example; this reproduces it."""
    n = len(x)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    a = sum(1 for u, v in zip(x, y, strict=True) if u and v)
    b = sum(1 for u, v in zip(x, y, strict=True) if u and not v)
    c = sum(1 for u, v in zip(x, y, strict=True) if v and not u)
    d = n - a - b - c
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson(a + b, n)
    l2, u2 = wilson(a + c, n)
    den = (a + b) * (c + d) * (a + c) * (b + d)
    num: float = a * d - b * c
    if num > 0:  # Newcombe's correction of phi's numerator
        num = max(num - n / 2, 0.0)
    phi = num / math.sqrt(den) if den else 0.0
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    eps = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    diff = p1 - p2
    return (diff, max(-1.0, diff - delta), min(1.0, diff + eps))


def mcnemar_exact(x: Sequence[bool], y: Sequence[bool]) -> float:
    """Two-sided exact McNemar p: the discordant pairs against a fair coin."""
    b = sum(1 for u, v in zip(x, y, strict=True) if u and not v)
    c = sum(1 for u, v in zip(x, y, strict=True) if v and not u)
    m = b + c
    if m == 0:
        return 1.0
    tail = sum(math.comb(m, i) for i in range(min(b, c) + 1)) / 2**m
    return float(min(1.0, 2.0 * tail))


def _paired_mean_ci(diff: npt.NDArray[np.float64], seed: int) -> tuple[float, float, float]:
    if diff.size == 0:
        return (math.nan, math.nan, math.nan)
    lo, hi = bootstrap_ci(diff.size, lambda idx: float(diff[idx].mean()), seed=seed)
    return (float(diff.mean()), lo, hi)


def summarise(results: Sequence[TaskResult], *, seed: int) -> dict[str, Any]:
    """Per arm: success, tokens, cost, latency; paired differences against ``none``."""
    arms: dict[str, Any] = {}
    base = [tr.arms["none"] for tr in results]
    for name in ARMS:
        rows = [tr.arms[name] for tr in results]
        ok = [a.correct for a in rows]
        n = len(rows)
        wall = [a.wall_s for a in rows]
        row: dict[str, Any] = {
            "tasks": n,
            "success": sum(ok) / n if n else math.nan,
            "success_ci": list(wilson(sum(ok), n)),
            "successes": sum(ok),
            "verified": sum(a.verified for a in rows) / n if n else math.nan,
            "later_verified": sum(a.later for a in rows),
            "later_correct": sum(a.later and a.correct for a in rows),
            "requests": sum(len(a.replies) for a in rows),
            "errors": sum(a.errors for a in rows),
            "calls": sum(a.calls for a in rows) / n if n else math.nan,
            "revisions": sum(a.revisions for a in rows) / n if n else math.nan,
            "tokens_in": sum(a.tokens_in for a in rows) / n if n else math.nan,
            "tokens_out": sum(a.tokens_out for a in rows) / n if n else math.nan,
            "cost_usd": sum(a.cost_usd for a in rows) / n if n else math.nan,
            "latency_p50_s": percentile(wall, 50),
            "latency_p95_s": percentile(wall, 95),
        }
        if name != "none":
            b_ok = [a.correct for a in base]
            d, lo, hi = newcombe_paired(ok, b_ok)
            row["d_success"], row["d_success_ci"] = d, [lo, hi]
            row["wins_losses"] = [
                sum(1 for u, v in zip(ok, b_ok, strict=True) if u and not v),
                sum(1 for u, v in zip(ok, b_ok, strict=True) if v and not u),
            ]
            row["mcnemar_p"] = mcnemar_exact(ok, b_ok)
            measures: tuple[tuple[str, Callable[[ArmResult], float]], ...] = (
                ("tokens", lambda a: float(a.tokens_in + a.tokens_out)),
                ("cost_usd", lambda a: a.cost_usd),
                ("latency_s", lambda a: a.wall_s),
            )
            for key, get in measures:
                diff = np.array(
                    [get(x) - get(y) for x, y in zip(rows, base, strict=True)], dtype=np.float64
                )
                m, lo, hi = _paired_mean_ci(diff, seed)
                row[f"d_{key}"], row[f"d_{key}_ci"] = m, [lo, hi]
        arms[name] = row
    return {"arms": arms, "probe": probe_table(results)}


def probe_table(results: Sequence[TaskResult]) -> dict[str, Any] | None:
    """The shadow probe's regimes: tasks with 0/k, partial and k/k visible passes."""
    probes = [(tr.arms["probe"], tr.arms["probe"].probe) for tr in results if "probe" in tr.arms]
    if not probes:
        return None
    rows: dict[str, dict[str, Any]] = {}
    k = None
    regimes: tuple[tuple[str, Callable[[int, int], bool]], ...] = (
        ("0/k", lambda c, k: c == 0),
        ("partial", lambda c, k: 0 < c < k),
        ("k/k", lambda c, k: c == k),
    )
    for name, test in regimes:
        hits = []
        for arm, rec in probes:
            if not rec or not isinstance(rec.get("pass_count"), int) or not rec.get("k"):
                continue
            k = int(rec["k"])
            if test(int(rec["pass_count"]), k):
                hits.append((arm, rec))
        n = len(hits)
        rows[name] = {
            "tasks": n,
            "visible_pass_share": (
                sum(r["pass_count"] / r["k"] for _, r in hits) / n if n else math.nan
            ),
            "served_correct": sum(a.correct for a, _ in hits) / n if n else math.nan,
            "regimes": sorted({str(r.get("regime")) for _, r in hits}),
        }
    missing = sum(1 for _, rec in probes if not rec or not isinstance(rec.get("pass_count"), int))
    return {"k": k, "tasks": len(probes), "no_probe_record": missing, "rows": rows}


# -- report -------------------------------------------------------------------------------------


def _pp(x: float) -> str:
    return "-" if x != x else f"{100 * x:+.1f}"


def _m(x: float, digits: int = 1) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def markdown(doc: dict[str, Any], command: str) -> str:
    meta, s = doc["meta"], doc["summary"]
    price = "; ".join(f"{m} {p[0]:g} / {p[1]:g}" for m, p in meta["prices"].items())
    lines = header(
        f"Live study: revision vs retry vs nothing on {meta['model']}",
        command,
        [
            f"model: {meta['model']} at {meta['base_url']}"
            + (f"; strong rung: {meta['strong']}" if meta.get("strong") else ""),
            f"server: GET /v1/models answered {json.dumps(meta['models'])}"
            + (f"; llama-cpp-python {meta['llama_cpp']}" if meta.get("llama_cpp") else ""),
            f"firstpass {meta['firstpass_version']} at {meta['code']}"
            + (f"; the run ended {meta['date']}" if meta.get("date") else ""),
            f"tasks: {meta['n_tasks']} of {meta['tasks_file']} ({meta['order']}); "
            f"{meta['tasks_skipped_budget']} not started (--budget-s); wall {meta['wall_s']:.0f} s",
            f"requests: max_tokens {meta['max_tokens']}, temperature {meta['temperature']}, "
            f"retries {meta['retries']}, probe k = {meta['k']}, seed {meta['seed']}",
            f"prices (assumed, USD per million input / output tokens): {price}",
            "success = the hidden tests (MBPP+ inputs, never sent) pass on the served answer; "
            "the request's only check is the visible assert",
            "intervals (95%): success by Wilson; Δ success by Newcombe's hybrid score interval "
            "for paired proportions (method 10) with McNemar's exact p; Δ tokens, cost and "
            "latency by a paired percentile bootstrap over tasks (1000 resamples)",
            "latency: client wall time per task of all the arm's requests (the upstream serves "
            "one request at a time)",
        ],
    )
    lines += [
        "| arm | tasks | success [95% CI] | Δ success vs none, points [95% CI] | won / lost vs "
        "none | McNemar p | verified | verified by a later attempt (and correct) | requests | upstream calls/task | revision calls/task | "
        "tokens in / out per task | $/task | Δ $/task [95% CI] | latency p50 / p95 s | "
        "Δ latency s [95% CI] | errors |",
        "|---|---:|---|---|---|---:|---:|---|---:|---:|---:|---|---:|---|---|---|---:|",
    ]
    for name in ARMS:
        r = s["arms"][name]
        ci = r["success_ci"]
        base = name == "none"
        lines.append(
            f"| {name} | {r['tasks']} | {pct(r['success'])} [{pct(ci[0])}, {pct(ci[1])}] | "
            + (
                "–"
                if base
                else f"{_pp(r['d_success'])} [{_pp(r['d_success_ci'][0])}, "
                f"{_pp(r['d_success_ci'][1])}]"
            )
            + f" | {'–' if base else '{} / {}'.format(*r['wins_losses'])} | "
            + f"{'–' if base else _m(r['mcnemar_p'], 3)} | {pct(r['verified'])} | "
            + f"{r['later_verified']} ({r['later_correct']}) | "
            + f"{r['requests']} | {_m(r['calls'], 2)} | {_m(r['revisions'], 2)} | "
            + f"{_m(r['tokens_in'], 0)} / {_m(r['tokens_out'], 0)} | "
            + f"{r['cost_usd'] * 1e6:.2f} µ$ | "
            + (
                "–"
                if base
                else f"{r['d_cost_usd'] * 1e6:+.2f} µ$ [{r['d_cost_usd_ci'][0] * 1e6:+.2f}, "
                f"{r['d_cost_usd_ci'][1] * 1e6:+.2f}]"
            )
            + f" | {_m(r['latency_p50_s'])} / {_m(r['latency_p95_s'])} | "
            + (
                "–"
                if base
                else f"{r['d_latency_s']:+.1f} [{r['d_latency_s_ci'][0]:+.1f}, "
                f"{r['d_latency_s_ci'][1]:+.1f}]"
            )
            + f" | {r['errors']} |"
        )
    probe = s.get("probe")
    if probe:
        lines += [
            "",
            f"Elastic probe (shadow mode, k = {probe['k']} samples from the cheapest rung, one "
            f"request per task; {probe['tasks']} tasks, {probe['no_probe_record']} without a "
            "probe record):",
            "",
            "| regime (visible passes) | tasks | mean visible pass share | served answer correct "
            "| receipts' regime |",
            "|---|---:|---:|---:|---|",
        ]
        for name, row in probe["rows"].items():
            lines.append(
                f"| {name} | {row['tasks']} | {pct(row['visible_pass_share'])} | "
                f"{pct(row['served_correct'])} | {', '.join(row['regimes']) or '-'} |"
            )
    lines += ["", *[f"- {note}" for note in doc.get("notes", [])], ""]
    return "\n".join(lines)


# -- tasks ---------------------------------------------------------------------------------------


def choose_tasks(tasks: list[Task], n: int | None, order: str, data: Path) -> list[Task]:
    """The first ``n`` tasks: the file's order, or the easiest by MBPP's reference length."""
    if order == "easiest":
        from benchmarks.datasets import load_mbppplus

        ref = {t.task_id: len(t.canonical_solution) for t in load_mbppplus(data)}
        tasks = sorted(tasks, key=lambda t: (ref.get(t.task_id, 10**9), t.task_id))
    return tasks[:n] if n else tasks


def ensure_tasks(tasks_file: Path | None, data: Path, isolation: str) -> Path | None:
    """The Task set, converted from ``data`` first when absent; None (said why) if no data."""
    path = tasks_file or DEFAULT_OUT / "tasks.jsonl"
    if path.exists():
        return path
    if not (data / "mbppplus" / "MbppPlus.jsonl.gz").exists():
        print(
            f"skipped: no task set at {path} and no shared data at {data}: set FIRSTPASS_DATA "
            "or --data to the directory holding mbppplus/",
            file=sys.stderr,
        )
        return None
    from benchmarks import datasets

    print(f"converting {data} into {path.parent} (once)", file=sys.stderr, flush=True)
    if datasets.main(["--out", str(path.parent), "--data", str(data), "--isolation", isolation]):
        return None
    return path


# -- the run --------------------------------------------------------------------------------------


def _models(base_url: str, api_key: str | None) -> object:
    req = urllib.request.Request(base_url.rstrip("/") + "/models")
    if api_key:
        req.add_header("Authorization", f"Bearer {api_key}")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return json.loads(resp.read())
    except (OSError, ValueError) as exc:
        return f"unavailable ({exc})"


async def run_tasks(
    url: str,
    tasks: Sequence[Task],
    *,
    retries: int,
    k: int,
    max_tokens: int,
    seed: int,
    budget_s: float | None,
    timeout_s: float,
    progress: Callable[[int, TaskResult], None] | None = None,
) -> list[TaskResult]:
    """Every task, one at a time (the latency is a request's, not a queue's)."""
    import aiohttp

    rng = random.Random(seed)
    started = time.monotonic()
    out: list[TaskResult] = []
    timeout = aiohttp.ClientTimeout(total=timeout_s + 60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for i, task in enumerate(tasks):
            if budget_s is not None and time.monotonic() - started > budget_s:
                break
            tr = await run_task(
                session, url, task, retries=retries, k=k, max_tokens=max_tokens, rng=rng
            )
            out.append(tr)
            if progress is not None:
                progress(i, tr)
    return out


def _at_least(least: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"expected a whole number >= {least}, got {value}")
        return value

    return parse


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


def _http_url(text: str) -> str:
    if not text.startswith(("http://", "https://")) or len(text) <= len("https://"):
        raise argparse.ArgumentTypeError(f"expected an http(s) URL ending in /v1, got {text!r}")
    return text


def _price_arg(text: str) -> str:
    try:
        _price(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected IN,OUT: two finite numbers >= 0, USD per million tokens, got {text!r}"
        ) from None
    return text


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base-url", type=_http_url, help="the OpenAI-compatible server, ending in /v1")
    p.add_argument("--model", help="the model name to ask it for")
    p.add_argument("--local", action="store_true", help="start the bundled SmolLM2-135M server")
    p.add_argument(
        "--strong-base-url", type=_http_url, help="a second rung's server (default: --base-url)"
    )
    p.add_argument("--strong", help="a second rung's model (the cascade escalates to it)")
    p.add_argument("--api-key-env", help="environment variable holding the upstream's key")
    p.add_argument("--honours-n", choices=("yes", "no"), help="default: no with --local")
    p.add_argument(
        "--price",
        type=_price_arg,
        default="{:g},{:g}".format(*DEFAULT_PRICE),
        help="IN,OUT USD per Mtok",
    )
    p.add_argument(
        "--strong-price", type=_price_arg, default="{:g},{:g}".format(*DEFAULT_STRONG_PRICE)
    )
    p.add_argument("--tasks", type=_at_least(1), default=None, help="how many tasks (default all)")
    p.add_argument("--order", choices=("easiest", "file"), default="easiest")
    p.add_argument("--task-file", help="a Task set JSONL (default benchmarks/.cache/data)")
    p.add_argument("--data", help="shared data (default $FIRSTPASS_DATA or ../shared/data)")
    p.add_argument("--k", type=_at_least(0), default=3, help="probe samples (0: no probe)")
    p.add_argument("--retries", type=_at_least(0), default=2, help="retries without feedback")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-tokens", type=_at_least(1), default=256)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--request-timeout-s", type=_positive, default=1800.0)
    p.add_argument("--budget-s", type=_positive, default=None, help="start no task after this")
    p.add_argument("--isolation", default="auto", help="the oracle's sandbox isolation")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR))
    p.add_argument(
        "--out", help="markdown results (default benchmarks/results/live_study-<model>.md)"
    )
    p.add_argument("--json", help="JSON results (default: --out with .json)")
    p.add_argument("--from-json", help="summarise a run's JSON again (no model is called)")
    p.add_argument("--run-command", help="with --from-json: the run's command, if not in it")
    p.add_argument("--run-date", help="with --from-json: the run's date, if not in it")
    return p


def _price(text: str) -> tuple[float, float]:
    """``IN,OUT``; ValueError for anything else (two finite numbers >= 0)."""
    parts = [float(x) for x in text.split(",")]
    if len(parts) != 2 or not all(math.isfinite(x) and x >= 0 for x in parts):
        raise ValueError(text)
    return (parts[0], parts[1])


def main(argv: Sequence[str] | None = None) -> int:
    """The study; a file, upstream or proxy that cannot be used is one line on stderr, exit 2."""
    try:
        return _main(argv)
    except (OSError, ValueError, RuntimeError) as exc:  # JSONDecodeError is a ValueError
        print(f"error: {type(exc).__name__}: {exc}"[:2000], file=sys.stderr)
        return 2


def _main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = command_line("benchmarks.live_study", argv)
    if threading.current_thread() is threading.main_thread():
        # SIGTERM (a `timeout`, a CI cancel) unwinds like Ctrl-C, so the proxy and the model
        # server this run started are stopped, not left running
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.from_json:
        return resummarise(args, command)
    if not args.local and not (args.base_url and args.model):
        print("error: give --base-url and --model, or --local", file=sys.stderr)
        return 2
    data = Path(args.data) if args.data else data_dir()
    tasks_path = ensure_tasks(
        Path(args.task_file) if args.task_file else None, data, args.isolation
    )
    if tasks_path is None:
        return 2
    try:
        tasks = choose_tasks(load_tasks(tasks_path), args.tasks, args.order, data)
    except DataMissing as exc:
        print(f"skipped: {exc}", file=sys.stderr)
        return 2
    local = None
    if args.local:
        from firstpass.demo.local_model import start_local_server

        print("starting the bundled model server", file=sys.stderr, flush=True)
        local = start_local_server()
        args.base_url, args.model = local.base_url, local.model
    try:
        return _run(args, command, tasks, tasks_path, local)
    finally:
        if local is not None:
            local.stop()


def _run(
    args: argparse.Namespace, command: str, tasks: list[Task], tasks_path: Path, local: Any
) -> int:
    import firstpass
    from benchmarks._reliability_stack import start_proxy
    from benchmarks.overhead import free_port, loop_runner
    from firstpass.receipts import iter_receipts

    honours = (args.honours_n or ("no" if args.local else "yes")) == "yes"
    weak = Upstream(
        base_url=args.base_url,
        model=args.model,
        price=_price(args.price),
        honours_n=honours,
        api_key_env=args.api_key_env,
    )
    strong = (
        Upstream(
            base_url=args.strong_base_url or args.base_url,
            model=args.strong,
            price=_price(args.strong_price),
            api_key_env=args.api_key_env,
        )
        if args.strong
        else None
    )
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    models = _models(args.base_url, api_key)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="live-study-") as tmp:
        port = free_port()
        cfg = write_config(
            Path(tmp) / "firstpass.toml",
            port=port,
            weak=weak,
            strong=strong,
            k=args.k,
            temperature=args.temperature,
            request_timeout_s=args.request_timeout_s,
        )
        proxy = start_proxy(cfg, port, Path(tmp) / "firstpass.log")
        total = len(tasks)

        def progress(i: int, tr: TaskResult) -> None:
            print(
                f"  task {i + 1}/{total} {tr.task_id}: "
                + ", ".join(
                    f"{a} {len(r.replies)} req {'V' if r.verified else '-'}"
                    for a, r in tr.arms.items()
                )
                + f" ({time.perf_counter() - started:.0f} s)",
                file=sys.stderr,
                flush=True,
            )

        try:
            results = loop_runner()(
                run_tasks(
                    proxy.url,
                    tasks,
                    retries=args.retries,
                    k=args.k,
                    max_tokens=args.max_tokens,
                    seed=args.seed,
                    budget_s=args.budget_s,
                    timeout_s=args.request_timeout_s,
                    progress=progress,
                )
            )
        finally:
            proxy.stop()
        receipts = {
            str(r["id"]): r for r in iter_receipts(Path(tmp) / "receipts.jsonl") if "id" in r
        }
        proxy_log = (Path(tmp) / "firstpass.log").read_text(errors="replace")
    missing = apply_receipts(results, receipts)
    by_id = {t.task_id: t for t in tasks}

    async def oracle() -> str:
        async with CachingSandbox(isolation=args.isolation, cache_dir=Path(args.cache_dir)) as sb:
            await judge(results, by_id, sb)
            return sb.isolation

    isolation = loop_runner()(oracle())
    prices = {f"weak/{weak.model}": weak.price}
    if strong is not None:
        prices[f"strong/{strong.model}"] = strong.price
    notes = [
        f"oracle sandbox isolation: {isolation}; replies without a receipt: {missing}",
        "retry: Firstpass has no 'resample without feedback' switch ([route.revision] always "
        "sends the failure back), so the harness re-sends the same request (route live-r0) "
        "while the answer is not verified; its first request is none's",
    ]
    if "Traceback" in proxy_log:
        notes.append("the proxy's log holds a Traceback: see its stderr")
    doc: dict[str, Any] = {
        "meta": {
            "model": args.model,
            "base_url": args.base_url,
            "strong": f"{args.strong} at {strong.base_url}" if strong else None,
            "models": models,
            "llama_cpp": getattr(local, "version", None),
            "firstpass_version": getattr(firstpass, "__version__", "unknown"),
            "code": revision(),
            "tasks_file": str(tasks_path),
            "order": "easiest by MBPP reference length" if args.order == "easiest" else "file",
            "n_tasks": len(results),
            "tasks_skipped_budget": len(tasks) - len(results),
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "retries": args.retries,
            "k": args.k,
            "seed": args.seed,
            "prices": prices,
            "honours_n": honours,
            "wall_s": time.perf_counter() - started,
            "command": command,
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
        },
        "summary": summarise(results, seed=args.seed),
        "notes": notes,
        "tasks": [
            {
                "task_id": tr.task_id,
                "order": tr.order,
                "arms": {
                    name: {
                        "correct": arm.correct,
                        "verified": arm.verified,
                        "served": arm.served,
                        "tokens_in": arm.tokens_in,
                        "tokens_out": arm.tokens_out,
                        "cost_usd": arm.cost_usd,
                        "calls": arm.calls,
                        "revisions": arm.revisions,
                        "wall_s": arm.wall_s,
                        "probe": (
                            {
                                key: arm.probe.get(key)
                                for key in ("k", "pass_count", "regime", "calls")
                            }
                            if arm.probe
                            else None
                        ),
                        "replies": [
                            {key: v for key, v in asdict(r).items() if key != "text"}
                            for r in arm.replies
                        ],
                    }
                    for name, arm in tr.arms.items()
                },
            }
            for tr in results
        ],
    }
    publish(args, doc, command)
    replies = [r for tr in results for arm in tr.arms.values() for r in arm.replies]
    if replies and all(r.status != 200 for r in replies):
        print(
            f"error: all {len(replies)} requests failed (first: status {replies[0].status}); "
            "the report above measures nothing: check --base-url, --model and the proxy's log",
            file=sys.stderr,
        )
        return 1
    return 0


def publish(args: argparse.Namespace, doc: dict[str, Any], command: str) -> None:
    """Print the report; write it and the JSON (default: results/live_study-<model>.md)."""
    slug = "".join(c if c.isalnum() or c in "-." else "-" for c in str(doc["meta"]["model"]))
    md_path = Path(args.out) if args.out else RESULTS / f"live_study-{slug}.md"
    json_path = Path(args.json) if args.json else md_path.with_suffix(".json")
    md = markdown(doc, command)
    print(md)
    write_text(md_path, md)
    dump_json(json_path, doc)


def _reply(data: dict[str, Any]) -> Reply:
    return Reply(
        status=int(data["status"]),
        text=None,
        receipt_id=data.get("receipt_id"),
        verification=data.get("verification"),
        wall_s=float(data["wall_s"]),
        error=data.get("error"),
    )


def results_from_json(doc: dict[str, Any]) -> list[TaskResult]:
    """A run's per-task records back as results (answers' texts are not kept: the oracle's
    verdicts are), to summarise them again without calling the model."""
    out = []
    for row in doc["tasks"]:
        arms = {}
        for name, a in row["arms"].items():
            arms[name] = ArmResult(
                replies=[_reply(r) for r in a["replies"]],
                served=int(a["served"]),
                correct=bool(a["correct"]),
                tokens_in=int(a["tokens_in"]),
                tokens_out=int(a["tokens_out"]),
                cost_usd=float(a["cost_usd"]),
                calls=int(a["calls"]),
                revisions=int(a["revisions"]),
                probe=a.get("probe"),
            )
        out.append(TaskResult(task_id=row["task_id"], order=list(row["order"]), arms=arms))
    return out


def resummarise(args: argparse.Namespace, command: str) -> int:
    """``--from-json``: the statistics and the report again from a run's JSON (its command
    and date stay the run's; this command is noted)."""
    doc = json.loads(Path(args.from_json).read_text(encoding="utf-8"))
    results = results_from_json(doc)
    meta = doc["meta"]
    doc["summary"] = summarise(results, seed=int(meta.get("seed", args.seed)))
    original = meta.get("command") or args.run_command
    if not original:
        print("error: the JSON names no command: give --run-command", file=sys.stderr)
        return 2
    meta.setdefault("command", original)
    if args.run_date:
        meta.setdefault("date", args.run_date)
    doc["notes"] = [n for n in doc.get("notes", []) if not n.startswith("summarised again")]
    doc["notes"].append(f"summarised again from the run's JSON by `{command}`")
    publish(args, doc, original)
    return 0


if __name__ == "__main__":
    sys.exit(main())
