"""Probe study: how much traffic does the k-sample visible-test probe decide on its own?

For one model's Sample set, every recorded program is run (once, cached) against its task's
visible test and hidden tests in the real sandbox. Then, many times per task, k samples are drawn
without replacement (seeded), c = how many pass the visible test, and the candidate the elastic
policy would serve is picked by the policy's own rule (``firstpass.policy.candidate_order``).
The regime table gives, for c = 0, 0 < c < k and c = k, the share of draws and the share whose
candidate is correct on the hidden tests (the oracle), with 95% task-level bootstrap intervals.
The runs and draws are ``benchmarks._draws``, shared with score_study: this study is its
``pass_share`` column, on visible runs without probe inputs.

    python -m benchmarks.probe_study --tasks TASKS.jsonl --samples SAMPLES.jsonl \
        --k 5 --draws 200 --seed 0 --json OUT.json [--study-out STUDY.jsonl] [--md OUT.md]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks._draws import add_run_flags, aucs, draw_all, run_line, run_samples
from benchmarks._report import (
    RESULTS,
    add_output_flags,
    command_line,
    header,
    pct,
    pct_ci,
    publish,
    rate_table,
)
from benchmarks.datasets import DataMissing, write_jsonl

__all__ = ["main", "summarise"]

REGIMES = ("0", "middle", "k")


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
    from firstpass.calibration.stats import auc_mann_whitney, binary_entropy

    def table(masks: dict[str, npt.NDArray[np.bool_]]) -> dict[str, Any]:
        return rate_table(masks, ok, rate="correct", seed=seed, reps=reps)

    score = c / k
    auc_s = aucs(c, score, ok)
    auc_h = auc_mann_whitney(binary_entropy(score.ravel()), ~ok.ravel())
    return {
        "regimes": table(_regime_masks(c, k)),
        "levels": table({f"{i}/{k}": c == i for i in range(k + 1)}),
        "auc_entropy": auc_h.auc,
        "auc_pass_share": auc_s["auc"],
        "auc_n_failed": auc_s["auc_n_failed"],
        "auc_n_correct": auc_s["auc_n_passed"],
    }


def _markdown(doc: dict[str, Any], command: str) -> str:
    k = doc["k"]
    lines = header(
        f"Probe study: {doc['model']}, k = {k}",
        command,
        [
            f"tasks: {doc['n_tasks']} used ({doc['skipped']}), draws per task: {doc['draws']}, "
            f"seed {doc['seed']}",
            run_line(doc, checks="programs checked"),
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
            f"| {names[key]} | {pct(r['share'])} | {pct_ci(r['share_ci'])} "
            f"| {pct(r['correct'])} | {pct_ci(r['correct_ci'])} |"
        )
    lines += ["", "| c | share | candidate correct | 95% CI |", "|---|---:|---:|---|"]
    for name, r in doc["levels"].items():
        lines.append(
            f"| {name} | {pct(r['share'])} | {pct(r['correct'])} | {pct_ci(r['correct_ci'])} |"
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
    # the pass share needs no probe inputs: plain runs, which keep their cache keys
    ev = await run_samples(args, probe=False)
    draws = await asyncio.to_thread(
        draw_all, ev.results, k=args.k, draws=args.draws, seed=args.seed
    )
    c, ok = draws.c, draws.ok["pass_share"]
    summary = await asyncio.to_thread(summarise, c, ok, k=args.k, seed=args.seed)
    doc: dict[str, Any] = {
        **ev.inputs_doc(k=args.k, draws=args.draws, seed=args.seed),
        **ev.samples_doc(wrong_key="visible_pass_but_wrong"),
        **summary,
        **ev.cost_doc(),
    }
    if args.study_out:
        study = [
            {
                "k": args.k,
                "pass_count": int(c[t, d]),
                "label": bool(ok[t, d]),
                "task_id": ev.results[t].task_id,
            }
            for d in range(min(args.study_draws, args.draws))
            for t in range(len(ev.results))
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
    add_output_flags(p, md_default="results/probe_study-<model>.md")
    p.add_argument("--study-out", help="write the labelled study file (k, pass_count, label) here")
    p.add_argument(
        "--study-draws", type=int, default=1, help="draws per task in --study-out (default 1)"
    )
    add_run_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.k < 1 or args.draws < 1:
        print("error: --k and --draws must be >= 1", file=sys.stderr)
        return 2
    command = command_line("benchmarks.probe_study", argv)
    try:
        doc = asyncio.run(run_study(args))
    except DataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    publish(args, _markdown(doc, command), RESULTS / f"probe_study-{doc['model']}.md", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
