"""Score study: the three probe scores under one gate setting, and where a calibrated λ pays.

For one model's Sample set and one Task set (a gate setting: ``strict`` = MBPP+ hidden inputs,
``aligned`` = MBPP's three original asserts), every sample of every task with at least k samples
is run once (cached) in the real sandbox: on the visible tests *with* the probe inputs the
pipeline would generate (``build_probe_inputs(task.visible)``, one run, as the pipeline does), and
on the gate (the task's hidden spec). Then, exactly as ``firstpass/pipeline/_elastic.py`` decides:

- c = samples passing the visible tests; escalate when c = 0 (``escalate_at`` 0);
- ``pass_share`` = c/k, candidate by ``candidate_order`` keyed by the code's hash (with the
  default score the pipeline runs no probe, so there is no behaviour and the key falls back to
  ``code_sha256``);
- ``agreement`` = g/k and ``unanimous_agreement`` (g/k when c = k, else 0), g the largest cluster
  of passing samples with equal behaviour (``behaviour_keys``), candidate from that cluster;
- with no passing sample, the candidate passing the largest share of visible tests;
- label = the gate's verdict on the candidate.

Reported per score: AUC of 1 − score for predicting gate failure, the level table (share of
draws and candidate gate-pass rate per level, 95% task-bootstrap intervals), and Learn-then-Test
over random task-level calibration/test splits (one fresh draw per task per split):
how often λ is certified, the held-out share of requests that skip the gate, served failure among
them, and gate runs against uniform verification (every request with a passing candidate gated).

    python -m benchmarks.score_study --tasks TASKS.jsonl --samples SAMPLES.jsonl \
        [--setting-name strict|aligned] --k 5 --splits 20 --alphas 0.05,0.10,0.20 \
        --delta 0.05 --draws 200 --seed 0 --json OUT.json --md OUT.md
    python -m benchmarks.score_study --combine results/score_study-*.json --md results/score_study.md
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from benchmarks._programs import DEFAULT_CACHE_DIR, CachingSandbox, run_all
from benchmarks._report import (
    RESULTS,
    bootstrap_ci,
    dump_json,
    header,
    load_inputs,
    pct,
    write_text,
)
from benchmarks.datasets import DataMissing, Task
from benchmarks.probe_study import choose_candidate
from firstpass.policy import SCORES, behaviour_keys, cluster_sizes, probe_scores

__all__ = [
    "NOT_CERTIFIED",
    "SCORE_NAMES",
    "Draws",
    "ProbeDraw",
    "SplitResult",
    "TaskSamples",
    "aucs",
    "combine",
    "draw_all",
    "evaluate",
    "level_table",
    "ltt_cells",
    "main",
    "markdown",
    "probe_draw",
    "run_split",
    "run_splits",
    "summarise_splits",
]

#: the scores compared, the default first (``firstpass.policy.SCORES``)
SCORE_NAMES: tuple[str, ...] = tuple(SCORES)
#: what a table cell says when LTT certified no λ in any split: a result, not a failure
NOT_CERTIFIED = "not certified in any split"


# -- per sample ------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class TaskSamples:
    """Every sample of one task: visible verdict and share, gate verdict, code hash, behaviour."""

    task_id: str
    visible: npt.NDArray[np.bool_]
    visible_share: npt.NDArray[np.float64]
    gate: npt.NDArray[np.bool_]
    code_keys: tuple[str, ...]
    behaviours: tuple[str | None, ...]
    n_inputs: int  # probe inputs the pipeline would run (0: none, all passing samples agree)


async def evaluate(
    sb: CachingSandbox,
    tasks: Sequence[Task],
    rows: dict[str, dict[str, Any]],
    *,
    min_samples: int,
    progress: bool = True,
) -> tuple[list[TaskSamples], dict[str, int]]:
    """Run every sample of every usable task: visible tests with the probe inputs, then the gate."""
    from firstpass.probe import build_probe_inputs

    usable = [t for t in tasks if len(rows.get(t.task_id, {}).get("samples", ())) >= min_samples]
    skipped = {
        "no_samples": sum(1 for t in tasks if t.task_id not in rows),
        "fewer_than_k_samples": sum(
            1 for t in tasks if t.task_id in rows and len(rows[t.task_id]["samples"]) < min_samples
        ),
    }
    inputs = {t.task_id: build_probe_inputs(t.visible) for t in usable}
    jobs: list[tuple[str, Any, Any]] = []
    for t in usable:
        probe = inputs[t.task_id] or None  # the pipeline runs no probe when there is no input
        for s in rows[t.task_id]["samples"]:
            jobs.append((s, t.visible, probe))
            jobs.append((s, t.hidden, None))
    last = [0.0]

    def report(done: int, total: int) -> None:
        now = time.perf_counter()
        if progress and (now - last[0] > 10 or done == total):
            last[0] = now
            print(f"  programs: {done}/{total} checks done", file=sys.stderr, flush=True)

    results = await run_all(sb, jobs, progress=report)
    out = []
    i = 0
    for t in usable:
        n = len(rows[t.task_id]["samples"])
        vis, hid = results[i : i + 2 * n : 2], results[i + 1 : i + 2 * n : 2]
        i += 2 * n
        probe = inputs[t.task_id]
        out.append(
            TaskSamples(
                task_id=t.task_id,
                visible=np.array([r.passed for r in vis], dtype=bool),
                visible_share=np.array(
                    [r.n_passed / r.n_total if r.n_total else 0.0 for r in vis], dtype=float
                ),
                gate=np.array([r.passed for r in hid], dtype=bool),
                code_keys=tuple(r.code_sha256 for r in vis),
                behaviours=tuple(r.behaviour for r in vis),
                n_inputs=len(probe) if probe else 0,
            )
        )
    return out, skipped


# -- one probe -------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class ProbeDraw:
    """One probe of k samples: c, the clusters, and per score its value, candidate and label."""

    c: int
    clusters: tuple[int, ...]
    scores: dict[str, float]
    candidates: dict[str, int]  # index into the draw
    labels: dict[str, bool]  # the gate's verdict on that candidate

    @property
    def g(self) -> int:
        return self.clusters[0] if self.clusters else 0


def probe_draw(
    passed: Sequence[bool],
    shares: Sequence[float],
    gate: Sequence[bool],
    code_keys: Sequence[str],
    behaviours: Sequence[str | None],
    n_inputs: int,
) -> ProbeDraw:
    """Scores, candidates and labels of one probe, by the pipeline's own rules.

    ``pass_share`` keys candidates by the code hash (the pipeline runs no probe for it, so
    ``behaviour or code_sha256`` is the code hash); the agreement scores key them by
    ``behaviour_keys`` and take the candidate from the largest cluster.
    """
    keys: dict[str, Sequence[Hashable]] = {}
    keys["pass_share"] = list(code_keys)
    keys["agreement"] = keys["unanimous_agreement"] = behaviour_keys(list(behaviours), n_inputs)
    values = probe_scores(list(passed), keys["agreement"])
    scores = {str(name): float(v) for name, v in values.items()}
    candidates = {  # choose_candidate passes the keys to candidate_order, which takes any Hashable
        name: choose_candidate(list(passed), cast(Sequence[str], keys[name]), list(shares))
        for name in SCORE_NAMES
    }
    return ProbeDraw(
        c=sum(1 for ok in passed if ok),
        clusters=cluster_sizes(list(passed), keys["agreement"]),
        scores=scores,
        candidates=candidates,
        labels={name: bool(gate[i]) for name, i in candidates.items()},
    )


def _draw_task(t: TaskSamples, pick: npt.NDArray[np.int64]) -> ProbeDraw:
    return probe_draw(
        t.visible[pick].tolist(),
        t.visible_share[pick].tolist(),
        t.gate[pick].tolist(),
        [t.code_keys[j] for j in pick],
        [t.behaviours[j] for j in pick],
        t.n_inputs,
    )


@dataclass(frozen=True, kw_only=True)
class Draws:
    """Many probes per task, as (tasks, draws) arrays: c, g, and per score value and label."""

    c: npt.NDArray[np.int64]
    g: npt.NDArray[np.int64]
    score: dict[str, npt.NDArray[np.float64]]
    ok: dict[str, npt.NDArray[np.bool_]]
    same_candidate: npt.NDArray[np.bool_]  # agreement picked pass_share's candidate


def draw_all(results: Sequence[TaskSamples], *, k: int, draws: int, seed: int) -> Draws:
    """``draws`` seeded draws of k samples without replacement per task (like probe_study)."""
    rng = np.random.default_rng(seed)
    shape = (len(results), draws)
    c, g = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    same = np.zeros(shape, dtype=bool)
    score: dict[str, npt.NDArray[np.float64]] = {s: np.zeros(shape) for s in SCORE_NAMES}
    ok: dict[str, npt.NDArray[np.bool_]] = {s: np.zeros(shape, dtype=bool) for s in SCORE_NAMES}
    for ti, t in enumerate(results):
        for d in range(draws):
            p = _draw_task(t, rng.choice(t.visible.size, size=k, replace=False))
            c[ti, d], g[ti, d] = p.c, p.g
            same[ti, d] = p.candidates["agreement"] == p.candidates["pass_share"]
            for s in SCORES:
                score[s][ti, d] = p.scores[s]
                ok[s][ti, d] = p.labels[s]
    return Draws(c=c, g=g, score=score, ok=ok, same_candidate=same)


# -- the level table and the AUCs ------------------------------------------------------------


def _rows(
    masks: dict[str, npt.NDArray[np.bool_]], ok: npt.NDArray[np.bool_], *, seed: int, reps: int
) -> dict[str, dict[str, Any]]:
    """Share of draws and candidate gate-pass rate per mask, with task-bootstrap intervals."""
    tasks, draws = ok.shape
    out: dict[str, dict[str, Any]] = {}
    for name, m in masks.items():
        n, good = m.sum(axis=1), (m & ok).sum(axis=1)

        def share(idx: npt.NDArray[np.int64], n: Any = n) -> float:
            return float(n[idx].sum() / (idx.size * draws))

        def correct(idx: npt.NDArray[np.int64], n: Any = n, good: Any = good) -> float:
            tot = n[idx].sum()
            return float(good[idx].sum() / tot) if tot else float("nan")

        total = int(n.sum())
        out[name] = {
            "n": total,
            "share": total / (tasks * draws) if tasks else float("nan"),
            "share_ci": list(bootstrap_ci(tasks, share, reps=reps, seed=seed)),
            "gate_pass": float(good.sum() / total) if total else float("nan"),
            "gate_pass_ci": list(bootstrap_ci(tasks, correct, reps=reps, seed=seed + 1)),
        }
    return out


def level_table(
    c: npt.NDArray[np.int64],
    score: npt.NDArray[np.float64],
    ok: npt.NDArray[np.bool_],
    *,
    k: int,
    reps: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """The regime/level table of one score: escalate (c = 0), then each level i/k among c > 0.

    Each level row also says what serving from that level up would do (λ = i/k): the share of
    draws that skip the gate and the gate-failure rate among them.
    """
    level = np.rint(score * k).astype(np.int64)
    masks = {"escalate": c == 0} | {f"{i}/{k}": (c > 0) & (level == i) for i in range(k + 1)}
    rows = _rows(masks, ok, seed=seed, reps=reps)
    total = c.size
    for i in range(k + 1):
        skip = (c > 0) & (level >= i)
        n = int(skip.sum())
        rows[f"{i}/{k}"]["skip_share_at_lambda"] = n / total if total else float("nan")
        rows[f"{i}/{k}"]["failure_among_skips_at_lambda"] = (
            float((skip & ~ok).sum() / n) if n else float("nan")
        )
    return rows


def aucs(
    c: npt.NDArray[np.int64], score: npt.NDArray[np.float64], ok: npt.NDArray[np.bool_]
) -> dict[str, Any]:
    """AUC of 1 − score for predicting gate failure: over all draws, and over draws with c > 0."""
    from calibration.stats import auc_mann_whitney

    every = auc_mann_whitney(1.0 - score.ravel(), ~ok.ravel())
    some = c.ravel() > 0
    passing = auc_mann_whitney(1.0 - score.ravel()[some], ~ok.ravel()[some])
    return {
        "auc": every.auc,
        "auc_n_failed": every.n_positive,
        "auc_n_passed": every.n_negative,
        "auc_c_pos": passing.auc,
    }


# -- Learn then Test over splits -------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SplitResult:
    """One split, one score, one α: λ̂ and what it does on the held-out half."""

    lam: float | None  # None: nothing certified; elastic is not run, the cascade is kept
    lam_label: str | None  # λ̂ as the calibration names it ("c/k")
    n_test: int
    skip_share: float  # held-out requests that skip the gate at λ̂
    served_failure_skips: float | None  # gate failure among them (None when none skip)
    served_failure_overall: float  # skipped and wrong, over all held-out requests
    gate_runs_elastic: float  # per request: the gate regime (c > 0, score < λ̂)
    gate_runs_uniform: float  # per request: every request with a passing candidate

    @property
    def gate_runs_saved(self) -> float | None:
        """Share of uniform's gate runs elastic does not make (None when uniform makes none)."""
        if self.gate_runs_uniform == 0:
            return None
        return 1.0 - self.gate_runs_elastic / self.gate_runs_uniform


def _labelled(
    score: npt.NDArray[np.float64],
    failed: npt.NDArray[np.bool_],
    c: npt.NDArray[np.int64],
    k: int,
    name: str,
) -> Any:
    """Study rows (score, levels i/k, k, pass count, label) as a ``calibration.Labelled``."""
    from calibration.data import Labelled, Source

    n = int(score.size)
    return Labelled(
        score=np.asarray(score, dtype=np.float64),
        failed=np.asarray(failed, dtype=bool),
        k=np.full(n, k, dtype=np.int64),
        pass_count=np.asarray(c, dtype=np.int64),
        route=np.zeros(n, dtype=np.int64),
        route_names=(None,),
        level_set=np.zeros(n, dtype=np.int64),
        level_sets=(tuple(i / k for i in range(k + 1)),),
        score_name=name,
        source=Source(kind="study", paths=(), file_sha256=(), lines=n, used=n),
    )


def run_split(
    calib: tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.int64]],
    test: tuple[npt.NDArray[np.float64], npt.NDArray[np.bool_], npt.NDArray[np.int64]],
    *,
    k: int,
    alpha: float,
    delta: float,
    name: str = "score",
) -> SplitResult:
    """Calibrate λ on ``calib`` (score, gate passed, c) with LTT, then apply it to ``test``."""
    from calibration import Settings, calibrate

    score, ok, c = calib
    cal = calibrate(
        _labelled(score, ~ok, c, k, name), Settings(method="ltt", alpha=alpha, delta=delta)
    )
    lam = cal.overall.lam
    t_score, t_ok, t_c = test
    n = int(t_score.size)
    candidate = t_c > 0
    skip = candidate & (t_score + 1e-9 >= lam) if lam is not None else np.zeros(n, dtype=bool)
    n_skip = int(skip.sum())
    wrong = int((skip & ~t_ok).sum())
    return SplitResult(
        lam=lam,
        lam_label=cal.overall.lam_label,
        n_test=n,
        skip_share=n_skip / n if n else float("nan"),
        served_failure_skips=wrong / n_skip if n_skip else None,
        served_failure_overall=wrong / n if n else float("nan"),
        gate_runs_elastic=float((candidate & ~skip).sum() / n) if n else float("nan"),
        gate_runs_uniform=float(candidate.sum() / n) if n else float("nan"),
    )


def run_splits(
    results: Sequence[TaskSamples],
    *,
    k: int,
    splits: int,
    alphas: Sequence[float],
    delta: float,
    seed: int,
) -> dict[str, dict[str, list[SplitResult]]]:
    """Per split: halve the tasks at random, draw one fresh probe per task, calibrate, test."""
    out: dict[str, dict[str, list[SplitResult]]] = {
        s: {f"{a:g}": [] for a in alphas} for s in SCORES
    }
    n = len(results)
    for split in range(splits):
        rng = np.random.default_rng([seed, split + 1])
        order = rng.permutation(n)
        probes = [
            _draw_task(results[t], rng.choice(results[t].visible.size, size=k, replace=False))
            for t in order
        ]
        half = n // 2
        c = np.array([p.c for p in probes], dtype=np.int64)
        for s in SCORES:
            score = np.array([p.scores[s] for p in probes])
            ok = np.array([p.labels[s] for p in probes], dtype=bool)
            calib, test = (score[:half], ok[:half], c[:half]), (score[half:], ok[half:], c[half:])
            for a in alphas:
                out[s][f"{a:g}"].append(run_split(calib, test, k=k, alpha=a, delta=delta, name=s))
    return out


def _mean(xs: Sequence[float]) -> float | None:
    return float(np.mean(xs)) if xs else None


def summarise_splits(rs: Sequence[SplitResult]) -> dict[str, Any]:
    """Over splits: how often λ is certified; over certified splits the held-out outcomes.

    ``gate_runs_saved_all_splits`` counts an uncertified split as saving nothing (the advice
    there is to keep the cascade).
    """
    cert = [r for r in rs if r.lam is not None]
    fails = [r.served_failure_skips for r in cert if r.served_failure_skips is not None]
    saved = [r.gate_runs_saved for r in cert if r.gate_runs_saved is not None]
    saved_all = [r.gate_runs_saved if r.lam is not None else 0.0 for r in rs]
    lams: dict[str, int] = {}
    for r in sorted(cert, key=lambda r: -(r.lam or 0.0)):  # strictest first
        key = r.lam_label or f"{r.lam:g}"
        lams[key] = lams.get(key, 0) + 1
    return {
        "splits": len(rs),
        "certified": len(cert),
        "lambdas": lams,
        "skip_share_mean": _mean([r.skip_share for r in cert]),
        "served_failure_skips_mean": _mean(fails),
        "served_failure_skips_worst": max(fails) if fails else None,
        "certified_without_test_skips": sum(1 for r in cert if r.served_failure_skips is None),
        "served_failure_overall_mean": _mean([r.served_failure_overall for r in cert]),
        "gate_runs_elastic_mean": _mean([r.gate_runs_elastic for r in cert]),
        "gate_runs_uniform_mean": float(np.mean([r.gate_runs_uniform for r in rs])) if rs else None,
        "gate_runs_saved_mean": _mean(saved),
        "gate_runs_saved_all_splits": _mean([x for x in saved_all if x is not None]),
        "per_split": [
            {
                "lambda": r.lam,
                "lambda_label": r.lam_label,
                "skip_share": r.skip_share,
                "served_failure_skips": r.served_failure_skips,
                "served_failure_overall": r.served_failure_overall,
                "gate_runs_elastic": r.gate_runs_elastic,
                "gate_runs_uniform": r.gate_runs_uniform,
            }
            for r in rs
        ],
    }


def ltt_cells(s: dict[str, Any]) -> list[str]:
    """Table cells of one (score, α) summary: certified x/N, λ̂, skip share, served failure among
    skips mean [worst], served failure overall, gate runs elastic / uniform, saved."""
    head = f"{s['certified']}/{s['splits']}"
    if s["certified"] == 0:
        return [head, NOT_CERTIFIED, "–", "–", "–", f"– / {s['gate_runs_uniform_mean']:.2f}", "0%"]
    lams = ", ".join(f"{lam} ({n})" for lam, n in s["lambdas"].items())
    mean, worst = s["served_failure_skips_mean"], s["served_failure_skips_worst"]
    fail = f"{pct(mean)} [{pct(worst)}]" if mean is not None else "no held-out skip"
    saved = f"{pct(s['gate_runs_saved_mean'])} ({pct(s['gate_runs_saved_all_splits'])} over all)"
    return [
        head,
        lams,
        pct(s["skip_share_mean"]),
        fail,
        pct(s["served_failure_overall_mean"]),
        f"{s['gate_runs_elastic_mean']:.2f} / {s['gate_runs_uniform_mean']:.2f}",
        saved,
    ]


LTT_HEAD = (
    "| certified | λ̂ (splits) | held-out skip share | served-failure among skips, mean [worst] "
    "| served-failure overall | gate runs/req elastic / uniform | gate runs saved (all splits) |"
)


# -- reports ---------------------------------------------------------------------------------


def _level_md(rows: dict[str, Any], k: int) -> list[str]:
    lines = [
        "| level | share of draws | 95% CI | candidate passes the gate | 95% CI "
        "| skip share at λ = level | gate failure among skips at λ |",
        "|---|---:|---|---:|---|---:|---:|",
    ]
    for name, r in rows.items():
        label = "escalate (c = 0)" if name == "escalate" else name
        lines.append(
            f"| {label} | {pct(r['share'])} | {pct(r['share_ci'][0])} – {pct(r['share_ci'][1])} "
            f"| {pct(r['gate_pass'])} | {pct(r['gate_pass_ci'][0])} – {pct(r['gate_pass_ci'][1])} "
            f"| {pct(r.get('skip_share_at_lambda'))} | {pct(r.get('failure_among_skips_at_lambda'))} |"
        )
    return lines


def markdown(doc: dict[str, Any], command: str) -> str:
    """The per-(setting, model) report."""
    k = doc["k"]
    lines = header(
        f"Score study: {doc['setting']} gate, {doc['model']}, k = {k}",
        command,
        [
            f"tasks: {doc['n_tasks']} used ({doc['skipped']}), draws per task: {doc['draws']}, "
            f"seed {doc['seed']}; LTT: {doc['splits']} splits, δ = {doc['delta']}",
            f"sandbox isolation: {doc['isolation']} (fingerprint {doc['sandbox_fingerprint']}); "
            f"checks: {doc['programs']['checks']} ({doc['programs']['ran']} ran in the sandbox, "
            f"{doc['programs']['cached']} from the cache); wall time {doc['timing']['total_s']:.1f} s "
            f"(sandbox {doc['timing']['evaluate_s']:.1f} s)",
            f"probe inputs per task: mean {doc['probe_inputs']['mean']:.1f}, "
            f"{doc['probe_inputs']['tasks_without']} tasks without any; visible-passing samples "
            f"with a recorded behaviour: {pct(doc['behaviour_recorded'])}",
            f"one sample passes the gate (pass@1): {pct(doc['pass_at_1'])}; passes the visible "
            f"tests: {pct(doc['visible_pass_rate'])}; of those, fails the gate: "
            f"{pct(doc['visible_pass_but_gate_fails'])}",
            f"agreement's candidate is pass_share's in {pct(doc['same_candidate'])} of draws",
            "intervals: 95% percentile bootstrap over tasks (1000 resamples)",
        ],
    )
    lines += [
        "## AUC of 1 − score for predicting gate failure",
        "",
        "| score | AUC (all draws) | AUC (draws with c > 0) |",
        "|---|---:|---:|",
    ]
    for s in SCORES:
        a = doc["scores"][s]
        lines.append(f"| {s} | {_auc(a['auc'])} | {_auc(a['auc_c_pos'])} |")
    lines.append("")
    for s in SCORES:
        lines += [f"## Levels: {s}", "", *_level_md(doc["scores"][s]["levels"], k), ""]
    lines += [
        f"## Learn then Test (δ = {doc['delta']}), {doc['splits']} random half/half task splits",
        "",
        "Held-out numbers are means over the certified splits; uniform gates every request with "
        "a passing candidate. The gate is the oracle here, so uniform serves no wrong answer; "
        "what escalated requests get from a higher rung is not modelled.",
        "",
    ]
    for a in doc["alphas"]:
        key = f"{a:g}"
        lines += [
            f"### α = {key}",
            "",
            "| score " + LTT_HEAD,
            "|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        for s in SCORES:
            lines.append(f"| {s} | " + " | ".join(ltt_cells(doc["ltt"][s][key])) + " |")
        lines.append("")
    return "\n".join(lines)


def _auc(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def combine(docs: Sequence[dict[str, Any]], command: str) -> str:
    """One side-by-side report: AUCs, and one LTT table per α with rows (setting, model, score)."""
    order = {"strict": 0, "aligned": 1}
    docs = sorted(docs, key=lambda d: (order.get(d["setting"], 9), d["model"]))
    lines = header(
        "Score study: strict vs aligned gate, three scores, three models",
        command,
        [
            "inputs: "
            + ", ".join(f"{d['setting']}/{d['model']} ({d['n_tasks']} tasks)" for d in docs),
            f"k = {docs[0]['k']}, {docs[0]['draws']} draws per task for AUC and levels; LTT over "
            f"{docs[0]['splits']} splits, δ = {docs[0]['delta']}",
        ],
    )
    lines += [
        "## AUC of 1 − score for predicting gate failure (all draws / draws with c > 0)",
        "",
        "| setting | model | tasks | pass@1 | visible-pass but gate-fail | "
        + " | ".join(SCORES)
        + " |",
        "|---|---|---:|---:|---:|" + "---:|" * len(SCORES),
    ]
    for d in docs:
        cells = [
            f"{_auc(d['scores'][s]['auc'])} / {_auc(d['scores'][s]['auc_c_pos'])}" for s in SCORES
        ]
        lines.append(
            f"| {d['setting']} | {d['model']} | {d['n_tasks']} | {pct(d['pass_at_1'])} "
            f"| {pct(d['visible_pass_but_gate_fails'])} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "## Top level k/k: share of draws and candidate gate-pass rate",
        "",
        "| setting | model | " + " | ".join(SCORES) + " |",
        "|---|---|" + "---|" * len(SCORES),
    ]
    for d in docs:
        k = d["k"]
        cells = []
        for s in SCORES:
            r = d["scores"][s]["levels"][f"{k}/{k}"]
            cells.append(f"{pct(r['share'])} → {pct(r['gate_pass'])}")
        lines.append(f"| {d['setting']} | {d['model']} | " + " | ".join(cells) + " |")
    lines.append("")
    for a in docs[0]["alphas"]:
        key = f"{a:g}"
        lines += [
            f"## α = {key}: Learn then Test, held-out half",
            "",
            "| setting | model | score " + LTT_HEAD,
            "|---|---|---|---:|---|---:|---:|---:|---:|---:|",
        ]
        for d in docs:
            for s in SCORES:
                cells = ltt_cells(d["ltt"][s][key])
                lines.append(f"| {d['setting']} | {d['model']} | {s} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += [
        "Held-out numbers are means over the certified splits (worst = the largest served-failure "
        "among skips of any certified split); *over all* counts an uncertified split as saving "
        "nothing, since the calibration's advice there is to keep uniform verification. Uniform "
        "gates every request with a passing candidate; the gate is the oracle, so it serves no "
        "wrong answer.",
        "",
    ]
    return "\n".join(lines)


# -- the run ---------------------------------------------------------------------------------


async def run_study(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    tasks, (rows,) = await asyncio.to_thread(load_inputs, Path(args.tasks), [Path(args.samples)])
    models = {r.get("model") for r in rows.values()}
    model = str(next(iter(models))) if models else "?"
    async with CachingSandbox(isolation=args.isolation, cache_dir=Path(args.cache_dir)) as sb:
        t1 = time.perf_counter()
        results, skipped = await evaluate(sb, tasks, rows, min_samples=args.k)
        t_eval = time.perf_counter() - t1
        isolation, stats, fingerprint = sb.isolation, sb.stats, sb.fingerprint
    if not results:
        raise SystemExit(f"no task has >= {args.k} samples in {args.samples}")
    alphas = [float(a) for a in args.alphas.split(",")]
    draws = await asyncio.to_thread(draw_all, results, k=args.k, draws=args.draws, seed=args.seed)
    scores = {}
    for s in SCORES:
        scores[s] = {
            **aucs(draws.c, draws.score[s], draws.ok[s]),
            "levels": level_table(draws.c, draws.score[s], draws.ok[s], k=args.k, seed=args.seed),
        }
    splits = await asyncio.to_thread(
        run_splits,
        results,
        k=args.k,
        splits=args.splits,
        alphas=alphas,
        delta=args.delta,
        seed=args.seed,
    )
    gate = np.concatenate([r.gate for r in results])
    visible = np.concatenate([r.visible for r in results])
    recorded = [
        b is not None for r in results for b, ok in zip(r.behaviours, r.visible, strict=True) if ok
    ]
    return {
        "setting": args.setting_name,
        "model": model,
        "tasks_file": str(args.tasks),
        "samples_file": str(args.samples),
        "k": args.k,
        "draws": args.draws,
        "seed": args.seed,
        "splits": args.splits,
        "alphas": alphas,
        "delta": args.delta,
        "n_tasks": len(results),
        "skipped": skipped,
        "isolation": isolation,
        "sandbox_fingerprint": fingerprint,
        "pass_at_1": float(gate.mean()),
        "visible_pass_rate": float(visible.mean()),
        "visible_pass_but_gate_fails": float((visible & ~gate).sum() / max(1, visible.sum())),
        "probe_inputs": {
            "mean": float(np.mean([r.n_inputs for r in results])),
            "tasks_without": sum(1 for r in results if r.n_inputs == 0),
        },
        "behaviour_recorded": float(np.mean(recorded)) if recorded else float("nan"),
        "same_candidate": float(draws.same_candidate.mean()),
        "scores": scores,
        "ltt": {
            s: {a: summarise_splits(rs) for a, rs in by_a.items()} for s, by_a in splits.items()
        },
        "programs": {
            "checks": stats.hits + stats.misses,
            "ran": stats.misses,
            "cached": stats.hits,
        },
        "timing": {"total_s": time.perf_counter() - t0, "evaluate_s": t_eval},
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--tasks", help="Task set JSONL (one gate setting)")
    p.add_argument("--samples", help="Sample set JSONL (one model)")
    p.add_argument(
        "--setting-name",
        default="strict",
        help="the gate setting's name in reports (strict, aligned)",
    )
    p.add_argument("--k", type=int, default=5, help="probe size (default 5)")
    p.add_argument(
        "--splits", type=int, default=20, help="random calibration/test splits (default 20)"
    )
    p.add_argument("--alphas", default="0.05,0.10,0.20", help="target served-failure rates")
    p.add_argument(
        "--delta", type=float, default=0.05, help="LTT confidence parameter (default 0.05)"
    )
    p.add_argument("--draws", type=int, default=200, help="seeded draws of k samples per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument(
        "--md",
        help="write the markdown report here "
        "(default results/score_study-<setting>-<model>.md, or results/score_study.md)",
    )
    p.add_argument("--no-md", action="store_true", help="do not write the markdown report")
    p.add_argument(
        "--combine",
        nargs="+",
        metavar="JSON",
        help="instead of running: one side-by-side report from these JSON results",
    )
    p.add_argument("--isolation", default="auto", help="sandbox isolation level (default auto)")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="program result cache")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python -m benchmarks.score_study " + " ".join(sys.argv[1:] if argv is None else argv)
    if args.combine:
        docs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in args.combine]
        md = combine(docs, command)
        print(md)
        if not args.no_md:
            write_text(Path(args.md) if args.md else RESULTS / "score_study.md", md)
        return 0
    if not args.tasks or not args.samples:
        print("error: --tasks and --samples are required (or --combine)", file=sys.stderr)
        return 2
    if args.k < 1 or args.draws < 1 or args.splits < 1:
        print("error: --k, --draws and --splits must be >= 1", file=sys.stderr)
        return 2
    try:
        doc = asyncio.run(run_study(args))
    except DataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md = markdown(doc, command)
    print(md)
    if args.json:
        dump_json(Path(args.json), doc)
    if not args.no_md:
        default = RESULTS / f"score_study-{doc['setting']}-{doc['model']}.md"
        write_text(Path(args.md) if args.md else default, md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
