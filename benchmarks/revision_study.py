"""What revision buys, measured where the data allows: RETRY WITHOUT FEEDBACK on the same rung.

Firstpass's revision loop (docs/checks.md) sends a failed answer back to the same rung with
feedback, at most ``max_revisions`` times, then escalates. No recorded revision samples (answers
a model gave after seeing its failures) exist in ``../shared/data``, so this study measures the
closest real thing: the same loop where every further attempt is a **fresh, independent sample**
from the same rung (the recorded SpecFix samples: i.i.d. chat calls at temperature 1.0). That is
a proxy, not the feature: a real revision sees the failing assert and may do better (it is told
what is wrong) or worse (it anchors on its own wrong answer; errors are correlated).

Every recorded sample of every model on the ladder is run once (cached, the real sandbox, the
cache ``probe_study`` uses) on its task's visible test and on the hidden tests (MBPP+ inputs:
the gate and the oracle). Then, per task and per draw (``--draws``, seeded), each rung's
attempts are that rung's samples drawn **without replacement** (a seeded permutation of the
task's pool), and the ladder is walked by the pipeline's own state machine
(``firstpass.policy.next_step``: serve the first verified attempt, else the next rung, else the
best attempt unverified) with the revision loop's rules (``Steps.revise``: another attempt on the
same rung while one failed a revisable check, at most ``r`` times). r = 0 is plain escalation.
Every r sees the same permutations (paired). Retries on every rung (what ``[route.revision]``
does) and on rung 0 only (what the cheap rung's retries alone buy). The rung table reports how
diverse each pool is (distinct texts per task): a resample of an all-identical pool changes
nothing. Two check settings:

- ``visible``: the request carries only its visible test (MBPP's one shown assert): it decides
  retry and escalation; the hidden tests judge the served answer (success = served answer is
  correct).
- ``visible+gate``: the verified cascade, the hidden tests as the gate (run on answers that pass
  the visible test) and as the oracle, so a verified answer is always correct.

Cost: the assumed list prices below (USD per million tokens; ``--price MODEL=IN,OUT``), tokens
estimated at 4 characters a token as the replay provider does (the samples carry no counts);
input = the task prompt. "$ if revisions" prices each retry as a revision would be billed (the
conversation grows by the previous answer and the feedback each round), output as recorded.

    python -m benchmarks.revision_study [--converted DIR] [--data DIR] [--ladder A,B[,C]]...
        [--max-r 2] [--draws 200] [--seed 0] [--limit N] [--json OUT] [--md OUT]

``--converted`` (default ``benchmarks/.cache/data``) holds ``tasks.jsonl`` and
``samples-<model>.jsonl`` (``python -m benchmarks.datasets``); when it has no ``tasks.jsonl`` the
study converts ``--data`` (default ``$FIRSTPASS_DATA``, else ``<repo>/../shared/data``) there
first, and stops with a message naming the path when the data is absent.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks._programs import DEFAULT_CACHE_DIR, CachingSandbox, run_all
from benchmarks._report import bootstrap_ci, command_line, dump_json, header, pct, write_text
from benchmarks.datasets import (
    DEFAULT_OUT,
    DataMissing,
    Task,
    data_dir,
    load_sample_rows,
    load_tasks,
)
from firstpass.pipeline._steps import REVISION_PROMPT
from firstpass.policy import Attempt, CallRung, CheckSummary, Serve, ServeUnverified, next_step
from firstpass.policy import needs_gate as _needs_gate

__all__ = ["DEFAULT_LADDERS", "PRICES", "main", "simulate"]

#: the ladders studied by default, cheapest rung first
DEFAULT_LADDERS = (
    "qwen2.5-coder-7b,qwen2.5-coder-32b",
    "qwen2.5-coder-7b,qwen2.5-coder-32b,deepseek-v3",
    "qwen2.5-coder-32b,deepseek-v3",
)
#: assumed list prices, USD per million (input, output) tokens: 32B and V3 as the other
#: benchmarks (README "Prices"); 7B is this study's assumption (hosted 7B coder list prices)
PRICES: dict[str, tuple[float, float]] = {
    "qwen2.5-coder-7b": (0.03, 0.09),
    "qwen2.5-coder-32b": (0.07, 0.16),
    "deepseek-v3": (0.27, 1.10),
}
SETTINGS = ("visible", "visible+gate")
#: which rungs retry: every rung (what ``[route.revision]`` does) or only the cheapest (to
#: separate what the cheap rung's retries buy from what the top rung's retries buy)
RETRIES = ("every rung", "rung 0 only")
#: feedback a hidden-test failure gets (counts only), roughly: "3 of 104 held-out tests failed
#: (3 AssertionError)."
_HIDDEN_FEEDBACK_CHARS = 60
#: beside the quoted assert, a visible failure's feedback: "1 of 1 tests failed.\n- ...\n  E: msg"
_VISIBLE_FEEDBACK_EXTRA = 90


def tokens(chars: int) -> int:
    """The replay provider's estimate (``firstpass.providers.estimate_tokens``)."""
    return max(1, chars // 4)


# -- samples, run once ------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Pool:
    """One model's recorded samples for one task, each run on the visible and hidden tests."""

    vis: npt.NDArray[np.bool_]
    vis_np: npt.NDArray[np.int64]
    vis_nt: npt.NDArray[np.int64]
    vis_revisable: npt.NDArray[np.bool_]
    hid: npt.NDArray[np.bool_]
    hid_np: npt.NDArray[np.int64]
    hid_nt: npt.NDArray[np.int64]
    hid_revisable: npt.NDArray[np.bool_]
    out_chars: npt.NDArray[np.int64]
    distinct: int  # distinct answer texts in the pool

    @property
    def n(self) -> int:
        return int(self.vis.size)


def _revisable(category: str | None) -> bool:
    # StageResult.needs_revision: failed tests are revisable unless the sandbox could not run
    # the spec at all ("unsupported")
    return category != "unsupported"


async def run_pools(
    tasks: Sequence[Task],
    rows: dict[str, dict[str, dict[str, Any]]],
    needed: dict[str, set[str]],
    *,
    isolation: str,
    cache_dir: Path,
) -> tuple[dict[tuple[str, str], Pool], dict[str, Any]]:
    """Every needed (model, task) pool run on visible and hidden tests (cached)."""
    from firstpass.errors import SpecError
    from firstpass.sandbox import CasesSpec

    by_id = {t.task_id: t for t in tasks}
    pools: dict[tuple[str, str], Pool] = {}
    dropped: list[str] = []
    async with CachingSandbox(isolation=isolation, cache_dir=cache_dir) as sb:
        ok_tasks = set()
        for tid in sorted({t for ids in needed.values() for t in ids}):
            t = by_id[tid]
            try:
                for spec in (t.visible, t.hidden):
                    if isinstance(spec, CasesSpec) and not spec.resolved:
                        await sb.sandbox.resolve(spec)
            except SpecError as exc:
                dropped.append(tid)
                print(f"  {tid}: dropped ({exc})", file=sys.stderr, flush=True)
                continue
            ok_tasks.add(tid)
        order: list[tuple[str, str]] = []
        jobs: list[tuple[str, Any]] = []
        for model in sorted(needed):
            for tid in sorted(needed[model] & ok_tasks):
                order.append((model, tid))
                for s in rows[model][tid]["samples"]:
                    jobs.append((s, by_id[tid].visible))
                    jobs.append((s, by_id[tid].hidden))
        last = [0.0]

        def report(done: int, total: int) -> None:
            now = time.perf_counter()
            if now - last[0] > 15 or done == total:
                last[0] = now
                print(f"  programs: {done}/{total} checks done", file=sys.stderr, flush=True)

        t0 = time.perf_counter()
        results = await run_all(sb, jobs, progress=report)
        sandbox_s = time.perf_counter() - t0
        i = 0
        for model, tid in order:
            samples = rows[model][tid]["samples"]
            n = len(samples)
            vis, hid = results[i : i + 2 * n : 2], results[i + 1 : i + 2 * n : 2]
            i += 2 * n
            pools[(model, tid)] = Pool(
                vis=np.array([r.passed for r in vis], dtype=bool),
                vis_np=np.array([r.n_passed for r in vis], dtype=np.int64),
                vis_nt=np.array([r.n_total for r in vis], dtype=np.int64),
                vis_revisable=np.array([_revisable(r.category) for r in vis], dtype=bool),
                hid=np.array([r.passed for r in hid], dtype=bool),
                hid_np=np.array([r.n_passed for r in hid], dtype=np.int64),
                hid_nt=np.array([r.n_total for r in hid], dtype=np.int64),
                hid_revisable=np.array([_revisable(r.category) for r in hid], dtype=bool),
                out_chars=np.array([len(s) for s in samples], dtype=np.int64),
                distinct=len(set(samples)),
            )
        info = {
            "isolation": sb.isolation,
            "fingerprint": sb.fingerprint,
            "checks": sb.stats.hits + sb.stats.misses,
            "ran": sb.stats.misses,
            "cached": sb.stats.hits,
            "sandbox_s": sandbox_s,
            "dropped": dropped,
        }
    return pools, info


# -- one request ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class Outcome:
    correct: bool  # the served answer passes the hidden tests (the oracle)
    verified: bool  # served as verified (not exhausted)
    first_verified: bool  # rung 0's first attempt passed the checks
    rung0_verified: bool  # rung 0 produced a verified answer (within 1 + r attempts)
    top_rung: int  # the highest rung called
    calls: int
    gate_runs: int
    cost: float  # USD, every call priced as a fresh sample (what was measured)
    cost_revision: float  # USD, retries priced as revisions (the conversation grows)
    served_attempt: int  # which attempt on its rung was served (0 = the first)
    served_rung: int


def simulate(
    pools: Sequence[Pool],
    perms: Sequence[npt.NDArray[np.int64]],
    *,
    r: Sequence[int],
    gate: bool,
    prompt_chars: int,
    visible_chars: int,
    prices: Sequence[tuple[float, float]],
) -> Outcome:
    """One request through the ladder by the pipeline's rules, with at most ``r[i]`` retries on
    rung i; attempt j on rung i is ``pools[i]``'s sample ``perms[i][j]``."""
    attempts: list[Attempt] = []
    served_from: list[tuple[int, int, int]] = []  # (rung, sample, attempt no. on the rung)
    calls = gate_runs = 0
    cost = cost_rev = 0.0
    while True:
        step = next_step(attempts, ladder_len=len(pools), on_exhausted="unverified")
        if isinstance(step, CallRung):
            i = step.rung
            pool, (p_in, p_out) = pools[i], prices[i]
            history = 0  # characters the conversation grew by on this rung (revision pricing)
            for j in range(r[i] + 1):
                s = int(perms[i][j])
                vis = CheckSummary(
                    passed=bool(pool.vis[s]),
                    n_passed=int(pool.vis_np[s]),
                    n_total=int(pool.vis_nt[s]),
                )
                g = None
                if gate and _needs_gate(vis, True):
                    g = CheckSummary(
                        passed=bool(pool.hid[s]),
                        n_passed=int(pool.hid_np[s]),
                        n_total=int(pool.hid_nt[s]),
                    )
                    gate_runs += 1
                attempts.append(Attempt(rung=i, visible=vis, gate=g))
                served_from.append((i, s, j))
                calls += 1
                out_tok = tokens(int(pool.out_chars[s]))
                cost += (tokens(prompt_chars) * p_in + out_tok * p_out) / 1e6
                cost_rev += (tokens(prompt_chars + history) * p_in + out_tok * p_out) / 1e6
                if attempts[-1].verified:
                    break
                revisable = (
                    bool(pool.vis_revisable[s]) if not vis.passed else bool(pool.hid_revisable[s])
                )
                if not revisable:  # "not_revisable": the loop stops, the ladder goes on
                    break
                feedback = (
                    visible_chars + _VISIBLE_FEEDBACK_EXTRA
                    if not vis.passed
                    else _HIDDEN_FEEDBACK_CHARS
                )
                history += int(pool.out_chars[s]) + len(REVISION_PROMPT) - 10 + feedback
            continue
        assert isinstance(step, Serve | ServeUnverified), step  # on_exhausted = "unverified"
        rung, s, j = served_from[step.attempt]
        first = attempts[0]
        return Outcome(
            correct=bool(pools[rung].hid[s]),
            verified=isinstance(step, Serve),
            first_verified=first.verified,
            rung0_verified=any(a.verified for a in attempts if a.rung == 0),
            top_rung=max(a.rung for a in attempts),
            calls=calls,
            gate_runs=gate_runs,
            cost=cost,
            cost_revision=cost_rev,
            served_attempt=j,
            served_rung=rung,
        )


# -- the study --------------------------------------------------------------------------------

FIELDS = (
    "correct",
    "verified",
    "first_verified",
    "rung0_verified",
    "rung0_correct",
    "escalated",
    "reached_top",
    "exhausted",
    "wrong_verified",
    "calls",
    "gate_runs",
    "cost",
    "cost_revision",
    "served_retry",
)


def _arrays(t: int, d: int) -> dict[str, npt.NDArray[np.float64]]:
    return {f: np.zeros((t, d)) for f in FIELDS}


def run_ladder(
    ladder: Sequence[str],
    task_ids: Sequence[str],
    tasks: dict[str, Task],
    pools: dict[tuple[str, str], Pool],
    *,
    max_r: int,
    draws: int,
    seed: int,
    prices: dict[str, tuple[float, float]],
    ladder_index: int,
) -> dict[str, Any]:
    """Every (setting, r) over the same seeded permutations: (tasks, draws) arrays per field."""
    rng = np.random.default_rng([seed, ladder_index])
    T = len(task_ids)
    schemes = [
        (s, how, r)
        for s in SETTINGS
        for how in RETRIES
        for r in range(max_r + 1)
        if how == RETRIES[0] or r > 0  # r = 0 is the same under both
    ]
    out: dict[tuple[str, str, int], dict[str, npt.NDArray[np.float64]]] = {
        key: _arrays(T, draws) for key in schemes
    }
    K = len(ladder)
    top_only = {"correct": np.zeros((T, draws)), "cost": np.zeros((T, draws))}
    rung_prices = [prices[m] for m in ladder]
    for ti, tid in enumerate(task_ids):
        task = tasks[tid]
        task_pools = [pools[(m, tid)] for m in ladder]
        prompt_chars = len(task.prompt)
        visible_chars = sum(len(a) for a in getattr(task.visible, "asserts", ()))
        top = task_pools[-1]
        for d in range(draws):
            perms = [rng.permutation(p.n)[: max_r + 1] for p in task_pools]
            s_top = int(perms[-1][0])
            top_only["correct"][ti, d] = top.hid[s_top]
            p_in, p_out = rung_prices[-1]
            top_only["cost"][ti, d] = (
                tokens(prompt_chars) * p_in + tokens(int(top.out_chars[s_top])) * p_out
            ) / 1e6
            for setting, how, r in schemes:
                per_rung = [r] * K if how == RETRIES[0] else [r] + [0] * (K - 1)
                o = simulate(
                    task_pools,
                    perms,
                    r=per_rung,
                    gate=setting == "visible+gate",
                    prompt_chars=prompt_chars,
                    visible_chars=visible_chars,
                    prices=rung_prices,
                )
                a = out[(setting, how, r)]
                a["correct"][ti, d] = o.correct
                a["verified"][ti, d] = o.verified
                a["first_verified"][ti, d] = o.first_verified
                a["rung0_verified"][ti, d] = o.rung0_verified
                a["rung0_correct"][ti, d] = o.served_rung == 0 and o.correct
                a["escalated"][ti, d] = o.top_rung > 0
                a["reached_top"][ti, d] = o.top_rung == len(ladder) - 1
                a["exhausted"][ti, d] = not o.verified
                a["wrong_verified"][ti, d] = o.verified and not o.correct
                a["calls"][ti, d] = o.calls
                a["gate_runs"][ti, d] = o.gate_runs
                a["cost"][ti, d] = o.cost
                a["cost_revision"][ti, d] = o.cost_revision
                a["served_retry"][ti, d] = o.served_attempt > 0
    return {"runs": out, "top_only": top_only}


def _mean_ci(per_task: npt.NDArray[np.float64], seed: int) -> tuple[float, tuple[float, float]]:
    mean = float(per_task.mean())
    ci = bootstrap_ci(len(per_task), lambda idx: float(per_task[idx].mean()), seed=seed)
    return mean, ci


def summarise(result: dict[str, Any], *, seed: int) -> dict[str, Any]:
    """Means over (tasks, draws); success and its paired difference vs r = 0 with task-bootstrap
    95% intervals."""
    runs = result["runs"]
    table: dict[str, dict[str, Any]] = {}
    for setting, how, r in runs:
        base = runs[(setting, RETRIES[0], 0)]
        a = runs[(setting, how, r)]
        row: dict[str, Any] = {f: float(a[f].mean()) for f in FIELDS}
        row["correct"], row["correct_ci"] = _mean_ci(a["correct"].mean(axis=1), seed)
        diff = (a["correct"] - base["correct"]).mean(axis=1)
        row["d_correct"], row["d_correct_ci"] = _mean_ci(diff, seed + 1)
        row["d_cost"] = float((a["cost"] - base["cost"]).mean())
        row["cost_per_success"] = row["cost"] / row["correct"] if row["correct"] else math.nan
        table[f"{setting}|{how}|{r}"] = row
    top = result["top_only"]
    mean, ci = _mean_ci(top["correct"].mean(axis=1), seed)
    return {
        "table": table,
        "top_only": {"correct": mean, "correct_ci": ci, "cost": float(top["cost"].mean())},
    }


def rung_stats(
    model: str, task_ids: Sequence[str], pools: dict[tuple[str, str], Pool], max_r: int
) -> dict[str, Any]:
    """Per rung, over the ladder's tasks: pass rates, where retries can help, and the exact
    chance that 1 + r draws without replacement hold a visible-passing sample."""
    ps = [pools[(model, t)] for t in task_ids]
    vis_rate = np.array([p.vis.mean() for p in ps])
    hid_rate = np.array([p.hid.mean() for p in ps])
    vis_wrong = np.array(
        [(p.vis & ~p.hid).sum() / max(1, p.vis.sum()) for p in ps]
    )  # per task: visible-passing samples that fail the hidden tests
    within = {}
    for r in range(max_r + 1):
        k = r + 1
        vals = []
        for p in ps:
            n, v = p.n, int(p.vis.sum())
            vals.append(1.0 - math.comb(n - v, k) / math.comb(n, k))
        within[r] = float(np.mean(vals))
    return {
        "model": model,
        "tasks": len(ps),
        "samples_per_task": f"{min(p.n for p in ps)}–{max(p.n for p in ps)}",
        "distinct_per_task": float(np.mean([p.distinct for p in ps])),
        "tasks_one_distinct": int(sum(p.distinct == 1 for p in ps)),
        "visible_pass": float(vis_rate.mean()),
        "hidden_pass": float(hid_rate.mean()),
        "visible_pass_but_wrong": float(
            sum(int((p.vis & ~p.hid).sum()) for p in ps) / max(1, sum(int(p.vis.sum()) for p in ps))
        ),
        "tasks_visible_0": int((vis_rate == 0).sum()),
        "tasks_visible_mid": int(((vis_rate > 0) & (vis_rate < 1)).sum()),
        "tasks_visible_1": int((vis_rate == 1).sum()),
        "tasks_all_visible_pass_wrong": int(((vis_rate > 0) & (vis_wrong == 1)).sum()),
        "within_exact": within,
    }


# -- report -----------------------------------------------------------------------------------


def _usd(x: float) -> str:
    return f"{x * 1e3:.4f} m$"


def _ci(ci: Sequence[float]) -> str:
    return f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _pp(x: float) -> str:
    return f"{100 * x:+.1f}"


def ladder_markdown(doc: dict[str, Any]) -> list[str]:
    ladder = doc["ladder"]
    max_r = doc["max_r"]
    lines = [
        f"## {' → '.join(ladder)}",
        "",
        f"{doc['n_tasks']} tasks (every rung has ≥ {max_r + 1} recorded samples), "
        f"{doc['draws']} draws a task, seed {doc['seed']}; attempts on a rung drawn without "
        "replacement from that task's recorded pool.",
        "",
        "| rung | samples/task | distinct texts/task (tasks with 1) | visible pass | hidden pass (pass@1) | visible-pass but wrong | "
        "tasks 0 / some / all visible-pass | "
        + " | ".join(f"P(visible pass within {1 + r}), exact" for r in range(max_r + 1))
        + " |",
        "|---|---|---|---:|---:|---:|---|" + "---:|" * (max_r + 1),
    ]
    for s in doc["rungs"]:
        lines.append(
            f"| {s['model']} | {s['samples_per_task']} | {s['distinct_per_task']:.1f} "
            f"({s['tasks_one_distinct']}) | {pct(s['visible_pass'])} | "
            f"{pct(s['hidden_pass'])} | {pct(s['visible_pass_but_wrong'])} | "
            f"{s['tasks_visible_0']} / {s['tasks_visible_mid']} / {s['tasks_visible_1']} | "
            + " | ".join(pct(s["within_exact"][r]) for r in range(max_r + 1))
            + " |"
        )
    lines += [
        "",
        "| checks | retries on | r | success [95% CI] | Δ success vs r=0 [95% CI], points | first attempt "
        "passes | rung 0 passes within 1+r | served from rung 0 and correct | served a retry | escalates | reaches top | "
        "exhausted | verified but wrong | calls/req | gate runs/req | $/req | Δ $/req vs r=0 | "
        "$/req if revisions | $/success |",
        "|---|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for key, row in doc["table"].items():
        setting, how, r = key.split("|")
        delta = (
            "–"
            if r == "0"
            else f"{_pp(row['d_correct'])} [{_pp(row['d_correct_ci'][0])}, "
            f"{_pp(row['d_correct_ci'][1])}]"
        )
        dcost = "–" if r == "0" else f"{row['d_cost'] * 1e3:+.4f} m$"
        lines.append(
            f"| {setting} | {'–' if r == '0' else how} | {r} | {pct(row['correct'])} {_ci(row['correct_ci'])} | {delta} | "
            f"{pct(row['first_verified'])} | {pct(row['rung0_verified'])} | "
            f"{pct(row['rung0_correct'])} | "
            f"{pct(row['served_retry'])} | {pct(row['escalated'])} | {pct(row['reached_top'])} | "
            f"{pct(row['exhausted'])} | {pct(row['wrong_verified'])} | {row['calls']:.2f} | "
            f"{row['gate_runs']:.2f} | {_usd(row['cost'])} | "
            f"{dcost} | "
            f"{_usd(row['cost_revision'])} | {_usd(row['cost_per_success'])} |"
        )
    top = doc["top_only"]
    lines += [
        "",
        f"Reference, top rung only ({ladder[-1]}, one sample, no checks): success "
        f"{pct(top['correct'])} {_ci(top['correct_ci'])}, {_usd(top['cost'])}/req.",
        "",
    ]
    return lines


def markdown(docs: list[dict[str, Any]], meta: dict[str, Any], command: str) -> str:
    prices = ", ".join(f"{m} {p[0]:g} / {p[1]:g}" for m, p in meta["prices"].items())
    lines = header(
        "Revision study: retry without feedback on the same rung (a proxy for revision)",
        command,
        [
            "what this measures: the revision loop's control flow with every revision replaced "
            "by an independent resample of the same rung (no feedback). No recorded revision "
            "samples exist in the data; a real revision sees its failing assert and may do "
            "better or worse (correlated errors). r = 0 is plain escalation.",
            f"tasks: {meta['tasks_file']} ({meta['n_tasks']} tasks); samples: "
            f"{meta['converted']}/samples-<model>.jsonl",
            f"sandbox isolation: {meta['isolation']} (fingerprint {meta['fingerprint']}); "
            f"checks: {meta['checks']} ({meta['ran']} ran in the sandbox, {meta['cached']} from "
            f"the cache, {meta['sandbox_s']:.1f} s); wall time {meta['wall_s']:.1f} s",
            f"prices (assumed, USD per million input / output tokens): {prices}; tokens "
            "estimated at 4 characters a token; input = the task prompt ('if revisions': plus "
            "each earlier answer on the rung and its feedback)",
            "intervals: 95% percentile bootstrap over tasks (1000 resamples); Δ are paired "
            "(every r sees the same permutations)",
        ],
    )
    for doc in docs:
        lines += (
            ladder_markdown(doc)
            if doc["n_tasks"]
            else [
                f"## {' → '.join(doc['ladder'])}",
                "",
                "No task has enough samples on every rung.",
                "",
            ]
        )
    return "\n".join(lines)


# -- CLI --------------------------------------------------------------------------------------


def _ensure_converted(args: argparse.Namespace) -> Path | None:
    """The converted directory, converting ``--data`` into it first when it has no tasks."""
    converted = Path(args.converted)
    tasks = Path(args.tasks) if args.tasks else converted / "tasks.jsonl"
    if tasks.exists():
        return tasks
    data = Path(args.data) if args.data else data_dir()
    if not (data / "mbppplus" / "MbppPlus.jsonl.gz").exists():
        print(
            f"skipped: shared data not found at {data} (and no {tasks}): set FIRSTPASS_DATA or "
            "--data to the directory holding mbppplus/ and specfix-llm-samples/",
            file=sys.stderr,
        )
        return None
    from benchmarks import datasets

    print(f"converting {data} into {converted} (once)", file=sys.stderr, flush=True)
    argv = ["--out", str(converted), "--data", str(data), "--isolation", args.isolation]
    if args.limit:
        argv += ["--limit", str(args.limit)]
    if datasets.main(argv) != 0:
        return None
    return tasks


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--converted",
        default=str(DEFAULT_OUT),
        help="directory with tasks.jsonl and samples-<model>.jsonl (default %(default)s)",
    )
    p.add_argument("--tasks", help="Task set JSONL (default: <converted>/tasks.jsonl)")
    p.add_argument(
        "--data",
        help="shared data directory (default $FIRSTPASS_DATA, else "
        "<repo>/../shared/data); read only to convert when --converted has no tasks",
    )
    p.add_argument(
        "--ladder",
        action="append",
        help="comma-separated models, cheapest first (repeatable; default: "
        + "; ".join(DEFAULT_LADDERS)
        + ")",
    )
    p.add_argument("--max-r", type=int, default=2, help="largest max_revisions studied (default 2)")
    p.add_argument("--draws", type=int, default=200, help="seeded draws per task (default 200)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="only the first N tasks")
    p.add_argument(
        "--price",
        action="append",
        default=[],
        help="MODEL=IN,OUT in USD per million tokens (repeatable)",
    )
    p.add_argument("--isolation", default="auto", help="sandbox isolation level (default auto)")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="program result cache")
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--md", help="also write the markdown report here (it is always printed)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.max_r < 0 or args.draws < 1:
        print("error: --max-r must be >= 0 and --draws >= 1", file=sys.stderr)
        return 2
    started = time.perf_counter()
    command = command_line("benchmarks.revision_study", argv)
    prices = dict(PRICES)
    for item in args.price:
        model, _, vals = item.partition("=")
        a, b = (float(x) for x in vals.split(","))
        prices[model] = (a, b)
    ladders = [tuple(x.split(",")) for x in (args.ladder or DEFAULT_LADDERS)]
    for ladder in ladders:
        missing = [m for m in ladder if m not in prices]
        if missing or len(ladder) < 1:
            print(f"error: no price for {missing} (give --price MODEL=IN,OUT)", file=sys.stderr)
            return 2
    tasks_path = _ensure_converted(args)
    if tasks_path is None:
        return 2
    converted = Path(args.converted) if not args.tasks else tasks_path.parent
    try:
        task_list = load_tasks(tasks_path)
        models = sorted({m for ladder in ladders for m in ladder})
        rows = {m: load_sample_rows(converted / f"samples-{m}.jsonl") for m in models}
    except DataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.limit:
        task_list = task_list[: args.limit]
    tasks = {t.task_id: t for t in task_list}
    need = args.max_r + 1
    ladder_tasks = {
        ladder: [
            t.task_id
            for t in task_list
            if all(len(rows[m].get(t.task_id, {}).get("samples", ())) >= need for m in ladder)
        ]
        for ladder in ladders
    }
    needed: dict[str, set[str]] = {m: set() for m in models}
    for ladder, ids in ladder_tasks.items():
        for m in ladder:
            needed[m].update(ids)
    pools, info = asyncio.run(
        run_pools(task_list, rows, needed, isolation=args.isolation, cache_dir=Path(args.cache_dir))
    )
    dropped = set(info["dropped"])
    docs = []
    for li, ladder in enumerate(ladders):
        ids = [t for t in ladder_tasks[ladder] if t not in dropped]
        doc: dict[str, Any] = {
            "ladder": list(ladder),
            "n_tasks": len(ids),
            "draws": args.draws,
            "seed": args.seed,
            "max_r": args.max_r,
        }
        if ids:
            result = run_ladder(
                ladder,
                ids,
                tasks,
                pools,
                max_r=args.max_r,
                draws=args.draws,
                seed=args.seed,
                prices=prices,
                ladder_index=li,
            )
            doc.update(summarise(result, seed=args.seed))
            doc["rungs"] = [rung_stats(m, ids, pools, args.max_r) for m in ladder]
        docs.append(doc)
    meta = {
        **info,
        "tasks_file": str(tasks_path),
        "converted": str(converted),
        "n_tasks": len(task_list),
        "prices": {m: prices[m] for m in models},
        "wall_s": time.perf_counter() - started,
    }
    md = markdown(docs, meta, command)
    print(md)
    if args.md:
        write_text(Path(args.md), md)
    if args.json:
        dump_json(Path(args.json), {"meta": meta, "ladders": docs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
