"""Probe study: how much traffic does the k-sample visible-test probe decide on its own?

For one model's Sample set, every recorded program is run (once, cached) against its task's
visible test and hidden tests in the real sandbox. Then, many times per task, k samples are drawn
without replacement (seeded), c = how many pass the visible test, and the candidate the elastic
policy would serve is picked by the policy's own rule (``firstpass.policy.candidate_order``).
The regime table gives, for c = 0, 0 < c < k and c = k, the share of draws and the share whose
candidate is correct on the hidden tests (the oracle), with 95% task-level bootstrap intervals.

    python -m benchmarks.probe_study --tasks TASKS.jsonl --samples SAMPLES.jsonl \
        --k 5 --draws 200 --seed 0 --json OUT.json [--study-out STUDY.jsonl] [--md OUT.md]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
from benchmarks.datasets import DataMissing, Task, write_jsonl
from firstpass.policy import candidate_order

__all__ = ["ProgramResults", "choose_candidate", "draw_probes", "evaluate", "main", "summarise"]

REGIMES = ("0", "middle", "k")


@dataclass(frozen=True, kw_only=True)
class ProgramResults:
    """Every sample of one task: visible verdict and share, hidden (oracle) verdict, code key."""

    task_id: str
    visible: npt.NDArray[np.bool_]
    visible_share: npt.NDArray[np.float64]
    hidden: npt.NDArray[np.bool_]
    keys: tuple[str, ...]
    categories: tuple[str | None, ...]


def choose_candidate(passed: Sequence[bool], keys: Sequence[str], shares: Sequence[float]) -> int:
    """The sample elastic would serve or gate, by the pipeline's rule (``Probe.candidate``).

    Among passing samples the one most others agree with (``candidate_order``); with none
    passing, the one passing the largest share of visible tests, ties to the lowest index.
    """
    order = candidate_order(list(passed), list(keys))
    if order:
        return order[0]
    return max(range(len(shares)), key=lambda i: (shares[i], -i))


async def evaluate(
    sb: CachingSandbox,
    tasks: Sequence[Task],
    rows: dict[str, dict[str, Any]],
    *,
    min_samples: int,
    progress: bool = True,
) -> tuple[list[ProgramResults], dict[str, int]]:
    """Run every sample of every usable task on its visible and hidden tests (cached)."""
    usable = [t for t in tasks if len(rows.get(t.task_id, {}).get("samples", ())) >= min_samples]
    skipped = {
        "no_samples": sum(1 for t in tasks if t.task_id not in rows),
        "fewer_than_k_samples": sum(
            1 for t in tasks if t.task_id in rows and len(rows[t.task_id]["samples"]) < min_samples
        ),
    }
    jobs: list[tuple[str, Any]] = []
    for t in usable:
        for s in rows[t.task_id]["samples"]:
            jobs.append((s, t.visible))
            jobs.append((s, t.hidden))
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
        vis = results[i : i + 2 * n : 2]
        hid = results[i + 1 : i + 2 * n : 2]
        i += 2 * n
        out.append(
            ProgramResults(
                task_id=t.task_id,
                visible=np.array([r.passed for r in vis], dtype=bool),
                visible_share=np.array(
                    [r.n_passed / r.n_total if r.n_total else 0.0 for r in vis], dtype=float
                ),
                hidden=np.array([r.passed for r in hid], dtype=bool),
                keys=tuple(r.code_sha256 for r in vis),
                categories=tuple(r.category for r in vis),
            )
        )
    return out, skipped


def draw_probes(
    results: Sequence[ProgramResults], *, k: int, draws: int, seed: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.bool_]]:
    """``(c, correct)``, each of shape (tasks, draws): visible pass count and oracle verdict."""
    rng = np.random.default_rng(seed)
    c = np.zeros((len(results), draws), dtype=np.int64)
    ok = np.zeros((len(results), draws), dtype=bool)
    for ti, r in enumerate(results):
        n = r.visible.size
        for d in range(draws):
            pick = rng.choice(n, size=k, replace=False)
            passed = r.visible[pick]
            cand = choose_candidate(
                passed.tolist(), [r.keys[j] for j in pick], r.visible_share[pick].tolist()
            )
            c[ti, d] = int(passed.sum())
            ok[ti, d] = bool(r.hidden[pick[cand]])
    return c, ok


def _regime_masks(c: npt.NDArray[np.int64], k: int) -> dict[str, npt.NDArray[np.bool_]]:
    return {"0": c == 0, "middle": (c > 0) & (c < k), "k": c == k}


def summarise(
    c: npt.NDArray[np.int64],
    ok: npt.NDArray[np.bool_],
    *,
    k: int,
    reps: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """Regime and per-level tables with task-bootstrap intervals, and the two AUCs."""
    from calibration.stats import auc_mann_whitney, binary_entropy

    tasks, draws = c.shape

    def table(masks: dict[str, npt.NDArray[np.bool_]]) -> dict[str, Any]:
        n_t = {name: m.sum(axis=1) for name, m in masks.items()}  # per task
        ok_t = {name: (m & ok).sum(axis=1) for name, m in masks.items()}
        out: dict[str, Any] = {}
        for name in masks:
            n, good = n_t[name], ok_t[name]

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
                "correct": float(good.sum() / total) if total else float("nan"),
                "correct_ci": list(bootstrap_ci(tasks, correct, reps=reps, seed=seed + 1)),
            }
        return out

    regimes = table(_regime_masks(c, k))
    levels = table({f"{i}/{k}": c == i for i in range(k + 1)})
    score = (c / k).ravel()
    failed = ~ok.ravel()
    auc_h = auc_mann_whitney(binary_entropy(score), failed)
    auc_s = auc_mann_whitney(1.0 - score, failed)
    return {
        "regimes": regimes,
        "levels": levels,
        "auc_entropy": auc_h.auc,
        "auc_pass_share": auc_s.auc,
        "auc_n_failed": auc_h.n_positive,
        "auc_n_correct": auc_h.n_negative,
    }


def _markdown(doc: dict[str, Any], command: str) -> str:
    k = doc["k"]
    lines = header(
        f"Probe study: {doc['model']}, k = {k}",
        command,
        [
            f"tasks: {doc['n_tasks']} used ({doc['skipped']}), draws per task: {doc['draws']}, "
            f"seed {doc['seed']}",
            f"sandbox isolation: {doc['isolation']} (fingerprint {doc['sandbox_fingerprint']}); programs checked: {doc['programs']['checks']} "
            f"({doc['programs']['ran']} ran in the sandbox, {doc['programs']['cached']} from the "
            f"cache); wall time {doc['timing']['total_s']:.1f} s "
            f"(sandbox {doc['timing']['evaluate_s']:.1f} s)",
            f"one sample, oracle-correct (pass@1 over all samples): {pct(doc['pass_at_1'])}; "
            f"passes the visible test: {pct(doc['visible_pass_rate'])}",
            "intervals: 95% percentile bootstrap over tasks (1000 resamples)",
        ],
    )
    lines += [
        "| regime | share of draws | 95% CI | candidate correct | 95% CI |",
        "|---|---:|---|---:|---|",
    ]
    names = {"0": f"0/{k} (escalate)", "middle": f"1..{k - 1}/{k} (gate)", "k": f"{k}/{k} (serve)"}
    for key in REGIMES:
        r = doc["regimes"][key]
        lines.append(
            f"| {names[key]} | {pct(r['share'])} | {pct(r['share_ci'][0])} – {pct(r['share_ci'][1])} "
            f"| {pct(r['correct'])} | {pct(r['correct_ci'][0])} – {pct(r['correct_ci'][1])} |"
        )
    lines += ["", "| c | share | candidate correct | 95% CI |", "|---|---:|---:|---|"]
    for name, r in doc["levels"].items():
        lines.append(
            f"| {name} | {pct(r['share'])} | {pct(r['correct'])} | "
            f"{pct(r['correct_ci'][0])} – {pct(r['correct_ci'][1])} |"
        )
    auc_h, auc_s = doc["auc_entropy"], doc["auc_pass_share"]
    lines += [
        "",
        f"AUC for predicting a wrong candidate: binary entropy of c/k {auc_h:.3f}, "
        f"1 − c/k {auc_s:.3f} ({doc['auc_n_failed']} wrong, {doc['auc_n_correct']} correct draws). "
        "Entropy has no direction (0/k and k/k both score 0), so it cannot separate the two "
        "confident regimes; the pass share can.",
        "",
    ]
    return "\n".join(lines)


async def run_study(args: argparse.Namespace) -> dict[str, Any]:
    t0 = time.perf_counter()
    tasks, (rows,) = await asyncio.to_thread(load_inputs, Path(args.tasks), [Path(args.samples)])
    models = {r.get("model") for r in rows.values()}
    model = str(next(iter(models))) if models else "?"
    async with CachingSandbox(isolation=args.isolation, cache_dir=Path(args.cache_dir)) as sb:
        t1 = time.perf_counter()
        results, skipped = await evaluate(sb, tasks, rows, min_samples=args.k)
        t_eval = time.perf_counter() - t1
        isolation = sb.isolation
        stats = sb.stats
        fingerprint = sb.fingerprint
    if not results:
        raise SystemExit(f"no task has >= {args.k} samples in {args.samples}")
    c, ok = await asyncio.to_thread(draw_probes, results, k=args.k, draws=args.draws, seed=args.seed)
    summary = await asyncio.to_thread(summarise, c, ok, k=args.k, seed=args.seed)
    all_hidden = np.concatenate([r.hidden for r in results])
    all_visible = np.concatenate([r.visible for r in results])
    doc: dict[str, Any] = {
        "model": model,
        "tasks_file": str(args.tasks),
        "samples_file": str(args.samples),
        "k": args.k,
        "draws": args.draws,
        "seed": args.seed,
        "n_tasks": len(results),
        "skipped": skipped,
        "isolation": isolation,
        "sandbox_fingerprint": fingerprint,
        "pass_at_1": float(all_hidden.mean()),
        "visible_pass_rate": float(all_visible.mean()),
        "visible_pass_but_wrong": float((all_visible & ~all_hidden).sum() / max(1, all_visible.sum())),
        **summary,
        "programs": {"checks": stats.hits + stats.misses, "ran": stats.misses, "cached": stats.hits},
        "timing": {"total_s": time.perf_counter() - t0, "evaluate_s": t_eval},
    }
    if args.study_out:
        study = [
            {"k": args.k, "pass_count": int(c[t, d]), "label": bool(ok[t, d]), "task_id": results[t].task_id}
            for d in range(min(args.study_draws, args.draws))
            for t in range(len(results))
        ]
        await asyncio.to_thread(write_jsonl, Path(args.study_out), study)
    return doc


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", required=True, help="Task set JSONL")
    p.add_argument("--samples", required=True, help="Sample set JSONL (one model)")
    p.add_argument("--k", type=int, default=5, help="probe size (default 5)")
    p.add_argument("--draws", type=int, default=200, help="seeded draws of k samples per task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--md", help="write the markdown report here (default results/probe_study-<model>.md)")
    p.add_argument("--no-md", action="store_true", help="do not write the markdown report")
    p.add_argument("--study-out", help="write the labelled study file (k, pass_count, label) here")
    p.add_argument("--study-draws", type=int, default=1, help="draws per task in --study-out (default 1)")
    p.add_argument("--isolation", default="auto", help="sandbox isolation level (default auto)")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="program result cache")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.k < 1 or args.draws < 1:
        print("error: --k and --draws must be >= 1", file=sys.stderr)
        return 2
    command = "python -m benchmarks.probe_study " + " ".join(sys.argv[1:] if argv is None else argv)
    try:
        doc = asyncio.run(run_study(args))
    except DataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md = _markdown(doc, command)
    print(md)
    if args.json:
        dump_json(Path(args.json), doc)
    if not args.no_md:
        write_text(Path(args.md) if args.md else RESULTS / f"probe_study-{doc['model']}.md", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
