"""Samples run once, probes drawn many times: the core that probe_study and score_study share.

Every sample of every task with at least k samples is run once (cached) in the real sandbox on
the visible tests and on the gate (the task's hidden spec; the oracle). A probe is then k of a
task's samples drawn without replacement (seeded), and everything the pipeline decides from it
is recomputed by the pipeline's own rules (``firstpass.policy``): c, the behaviour clusters, the
three scores, each score's candidate and the gate's verdict on it.

probe_study is the ``pass_share`` column of these draws, on runs without probe inputs (so its
programs keep their cache keys); score_study uses all three scores, on runs with the probe inputs
the pipeline would generate.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks._programs import DEFAULT_CACHE_DIR, CacheStats, CachingSandbox, run_all
from benchmarks._report import load_inputs
from benchmarks.datasets import Task
from firstpass.policy import SCORES, behaviour_keys, candidate_order, cluster_sizes, probe_scores

__all__ = [
    "SCORE_NAMES",
    "Draws",
    "Evaluated",
    "ProbeDraw",
    "TaskSamples",
    "add_run_flags",
    "aucs",
    "choose_candidate",
    "draw_all",
    "draw_task",
    "evaluate",
    "probe_draw",
    "run_line",
    "run_samples",
]

#: the scores compared, the default first (``firstpass.policy.SCORES``)
SCORE_NAMES: tuple[str, ...] = tuple(SCORES)


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
    probe: bool,
    progress: bool = True,
) -> tuple[list[TaskSamples], dict[str, int]]:
    """Run every sample of every usable task on its visible tests, then on the gate.

    With ``probe`` the visible run carries the probe inputs the pipeline would generate
    (``build_probe_inputs(task.visible)``, one run, as the pipeline does) and records each
    sample's behaviour; without, behaviours stay unrecorded and the cache keys are those of a
    plain run.
    """
    from firstpass.errors import SpecError
    from firstpass.probe import build_probe_inputs
    from firstpass.sandbox import CasesSpec

    usable = [t for t in tasks if len(rows.get(t.task_id, {}).get("samples", ())) >= min_samples]
    skipped = {
        "no_samples": sum(1 for t in tasks if t.task_id not in rows),
        "fewer_than_k_samples": sum(
            1 for t in tasks if t.task_id in rows and len(rows[t.task_id]["samples"]) < min_samples
        ),
        "reference_failed": 0,
    }
    resolvable = []
    for t in usable:  # a task whose reference fails everywhere is that task's problem only
        try:
            for spec in (t.visible, t.hidden):
                if isinstance(spec, CasesSpec) and not spec.resolved:
                    await sb.sandbox.resolve(spec)
        except SpecError as exc:
            skipped["reference_failed"] += 1
            print(f"  {t.task_id}: dropped ({exc})", file=sys.stderr, flush=True)
            continue
        resolvable.append(t)
    usable = resolvable
    inputs = {t.task_id: build_probe_inputs(t.visible) if probe else None for t in usable}
    jobs: list[tuple[str, Any, Any]] = []
    for t in usable:
        visible_probe = inputs[t.task_id] or None  # the pipeline runs no probe without inputs
        for s in rows[t.task_id]["samples"]:
            jobs.append((s, t.visible, visible_probe))
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
        task_inputs = inputs[t.task_id]
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
                n_inputs=len(task_inputs) if task_inputs else 0,
            )
        )
    return out, skipped


@dataclass(frozen=True, kw_only=True)
class Evaluated:
    """One study's samples, run: the per-task results and what a report says about the run."""

    model: str
    tasks_file: str
    samples_file: str
    results: list[TaskSamples]
    skipped: dict[str, int]
    isolation: str
    fingerprint: str
    stats: CacheStats
    started: float  # time.perf_counter() when the study began
    evaluate_s: float

    def inputs_doc(self, *, k: int, draws: int, seed: int) -> dict[str, Any]:
        """The JSON keys naming the inputs and the draws (model, files, k, draws, seed)."""
        return {
            "model": self.model,
            "tasks_file": self.tasks_file,
            "samples_file": self.samples_file,
            "k": k,
            "draws": draws,
            "seed": seed,
        }

    def samples_doc(self, *, wrong_key: str) -> dict[str, Any]:
        """The JSON keys on the samples themselves: tasks, sandbox, pass rates.

        ``wrong_key`` names the share of visible-passing samples the gate rejects (each study
        has its own name for it in its committed results).
        """
        gate = np.concatenate([r.gate for r in self.results])
        visible = np.concatenate([r.visible for r in self.results])
        return {
            "n_tasks": len(self.results),
            "skipped": self.skipped,
            "isolation": self.isolation,
            "sandbox_fingerprint": self.fingerprint,
            "pass_at_1": float(gate.mean()),
            "visible_pass_rate": float(visible.mean()),
            wrong_key: float((visible & ~gate).sum() / max(1, visible.sum())),
        }

    def cost_doc(self) -> dict[str, Any]:
        """The JSON keys on what the run cost: checks (cached or run) and wall time so far."""
        return {
            "programs": {
                "checks": self.stats.hits + self.stats.misses,
                "ran": self.stats.misses,
                "cached": self.stats.hits,
            },
            "timing": {
                "total_s": time.perf_counter() - self.started,
                "evaluate_s": self.evaluate_s,
            },
        }


def run_line(doc: dict[str, Any], *, checks: str) -> str:
    """The report line on the run (the keys of ``samples_doc`` and ``cost_doc``); ``checks``
    names what was checked, as each study's committed reports say it."""
    programs, timing = doc["programs"], doc["timing"]
    return (
        f"sandbox isolation: {doc['isolation']} (fingerprint {doc['sandbox_fingerprint']}); "
        f"{checks}: {programs['checks']} ({programs['ran']} ran in the sandbox, "
        f"{programs['cached']} from the cache); wall time {timing['total_s']:.1f} s "
        f"(sandbox {timing['evaluate_s']:.1f} s)"
    )


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The ``--isolation`` and ``--cache-dir`` flags that :func:`run_samples` reads."""
    parser.add_argument(
        "--isolation", default="auto", help="sandbox isolation level (default auto)"
    )
    parser.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="program result cache")


async def run_samples(args: argparse.Namespace, *, probe: bool) -> Evaluated:
    """Load a Task set and one model's Sample set, and run every usable sample (cached).

    ``args`` carries the flags both studies share: ``--tasks``, ``--samples``, ``--k``,
    ``--isolation``, ``--cache-dir``.
    """
    started = time.perf_counter()
    tasks, (rows,) = await asyncio.to_thread(load_inputs, Path(args.tasks), [Path(args.samples)])
    models = {r.get("model") for r in rows.values()}
    model = str(next(iter(models))) if models else "?"
    async with CachingSandbox(isolation=args.isolation, cache_dir=Path(args.cache_dir)) as sb:
        t1 = time.perf_counter()
        results, skipped = await evaluate(sb, tasks, rows, min_samples=args.k, probe=probe)
        evaluate_s = time.perf_counter() - t1
        isolation, stats, fingerprint = sb.isolation, sb.stats, sb.fingerprint
    if not results:
        raise SystemExit(f"no task has >= {args.k} samples in {args.samples}")
    return Evaluated(
        model=model,
        tasks_file=str(args.tasks),
        samples_file=str(args.samples),
        results=results,
        skipped=skipped,
        isolation=isolation,
        fingerprint=fingerprint,
        stats=stats,
        started=started,
        evaluate_s=evaluate_s,
    )


# -- one probe -------------------------------------------------------------------------------


def choose_candidate(
    passed: Sequence[bool], keys: Sequence[Hashable], shares: Sequence[float]
) -> int:
    """The sample elastic would serve or gate, by the pipeline's rule (``Probe.candidate``).

    Among passing samples the one most others agree with (``candidate_order``); with none
    passing, the one passing the largest share of visible tests, ties to the lowest index.
    """
    order = candidate_order(list(passed), list(keys))
    if order:
        return order[0]
    return max(range(len(shares)), key=lambda i: (shares[i], -i))


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

    ``pass_share`` keys candidates by the code hash (the pipeline runs no probe inputs for it);
    the agreement scores key them by
    ``behaviour_keys`` and take the candidate from the largest cluster.
    """
    passed, shares = list(passed), list(shares)
    behaviour = behaviour_keys(list(behaviours), n_inputs)
    values = probe_scores(passed, behaviour)
    scores = {str(name): float(v) for name, v in values.items()}
    by_behaviour = choose_candidate(passed, behaviour, shares)  # both agreement scores
    candidates = {
        "pass_share": choose_candidate(passed, list(code_keys), shares),
        "agreement": by_behaviour,
        "unanimous_agreement": by_behaviour,
    }
    return ProbeDraw(
        c=sum(1 for ok in passed if ok),
        clusters=cluster_sizes(passed, behaviour),
        scores=scores,
        candidates=candidates,
        labels={name: bool(gate[i]) for name, i in candidates.items()},
    )


def draw_task(t: TaskSamples, rng: np.random.Generator, k: int) -> ProbeDraw:
    """One fresh probe of task ``t``: k of its samples, drawn without replacement."""
    pick = rng.choice(t.visible.size, size=k, replace=False)
    return probe_draw(
        t.visible[pick].tolist(),
        t.visible_share[pick].tolist(),
        t.gate[pick].tolist(),
        [t.code_keys[j] for j in pick],
        [t.behaviours[j] for j in pick],
        t.n_inputs,
    )


# -- many probes -----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Draws:
    """Many probes per task, as (tasks, draws) arrays: c, g, and per score value and label."""

    c: npt.NDArray[np.int64]
    g: npt.NDArray[np.int64]
    score: dict[str, npt.NDArray[np.float64]]
    ok: dict[str, npt.NDArray[np.bool_]]
    same_candidate: npt.NDArray[np.bool_]  # agreement picked pass_share's candidate


def draw_all(results: Sequence[TaskSamples], *, k: int, draws: int, seed: int) -> Draws:
    """``draws`` seeded draws of k samples without replacement per task, task by task."""
    rng = np.random.default_rng(seed)
    shape = (len(results), draws)
    c, g = np.zeros(shape, dtype=np.int64), np.zeros(shape, dtype=np.int64)
    same = np.zeros(shape, dtype=bool)
    score: dict[str, npt.NDArray[np.float64]] = {s: np.zeros(shape) for s in SCORE_NAMES}
    ok: dict[str, npt.NDArray[np.bool_]] = {s: np.zeros(shape, dtype=bool) for s in SCORE_NAMES}
    for ti, t in enumerate(results):
        for d in range(draws):
            p = draw_task(t, rng, k)
            c[ti, d], g[ti, d] = p.c, p.g
            same[ti, d] = p.candidates["agreement"] == p.candidates["pass_share"]
            for s in SCORE_NAMES:
                score[s][ti, d] = p.scores[s]
                ok[s][ti, d] = p.labels[s]
    return Draws(c=c, g=g, score=score, ok=ok, same_candidate=same)


def aucs(
    c: npt.NDArray[np.int64], score: npt.NDArray[np.float64], ok: npt.NDArray[np.bool_]
) -> dict[str, Any]:
    """AUC of 1 − score for predicting gate failure: over all draws, and over draws with c > 0."""
    from firstpass.calibration.stats import auc_mann_whitney

    every = auc_mann_whitney(1.0 - score.ravel(), ~ok.ravel())
    some = c.ravel() > 0
    passing = auc_mann_whitney(1.0 - score.ravel()[some], ~ok.ravel()[some])
    return {
        "auc": every.auc,
        "auc_n_failed": every.n_positive,
        "auc_n_passed": every.n_negative,
        "auc_c_pos": passing.auc,
    }
