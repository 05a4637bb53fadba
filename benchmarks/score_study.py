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

The runs and the draws are ``benchmarks._draws``, the code probe_study uses for ``pass_share``.

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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from benchmarks._draws import (
    TaskSamples,
    add_run_flags,
    aucs,
    draw_all,
    draw_task,
    run_line,
    run_samples,
)
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
from benchmarks.datasets import DataMissing
from firstpass.policy import SCORES

__all__ = [
    "NOT_CERTIFIED",
    "SplitResult",
    "combine",
    "level_table",
    "ltt_cells",
    "main",
    "markdown",
    "run_split",
    "run_splits",
    "summarise_splits",
]

#: what a table cell says when LTT certified no λ in any split: a result, not a failure
NOT_CERTIFIED = "not certified in any split"


# -- the level table ------------------------------------------------------------------------


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
    rows = rate_table(masks, ok, rate="gate_pass", seed=seed, reps=reps)
    total = c.size
    for i in range(k + 1):
        skip = (c > 0) & (level >= i)
        n = int(skip.sum())
        rows[f"{i}/{k}"]["skip_share_at_lambda"] = n / total if total else float("nan")
        rows[f"{i}/{k}"]["failure_among_skips_at_lambda"] = (
            float((skip & ~ok).sum() / n) if n else float("nan")
        )
    return rows


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
    """Study rows (score, levels i/k, k, pass count, label) as a ``firstpass.calibration.Labelled``."""
    from firstpass.calibration.data import Labelled, Source

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
    from firstpass.calibration import Settings, calibrate

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
        probes = [draw_task(results[t], rng, k) for t in order]
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
        # the same splits as the elastic mean, so the two can be read side by side
        "gate_runs_uniform_certified_mean": _mean([r.gate_runs_uniform for r in cert]),
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
        f"{s['gate_runs_elastic_mean']:.2f} / {s['gate_runs_uniform_certified_mean']:.2f}",
        saved,
    ]


LTT_HEAD = (
    "| certified | λ̂ (splits) | held-out skip share | served-failure among skips, mean [worst] "
    "| served-failure overall | gate runs/req elastic / uniform "
    "| gate runs saved: certified splits (over all splits) |"
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
            f"| {label} | {pct(r['share'])} | {pct_ci(r['share_ci'])} "
            f"| {pct(r['gate_pass'])} | {pct_ci(r['gate_pass_ci'])} "
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
            run_line(doc, checks="checks"),
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
        "Held-out numbers, gate runs included, are means over the certified splits (an "
        "uncertified row shows uniform's gate runs over all splits); uniform gates every request with "
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
        "Held-out numbers, gate runs included, are means over the certified splits (worst = the largest served-failure "
        "among skips of any certified split); *over all* counts an uncertified split as saving "
        "nothing, since the calibration's advice there is to keep uniform verification. Uniform "
        "gates every request with a passing candidate; the gate is the oracle, so it serves no "
        "wrong answer.",
        "",
    ]
    return "\n".join(lines)


# -- the run ---------------------------------------------------------------------------------


async def run_study(args: argparse.Namespace) -> dict[str, Any]:
    ev = await run_samples(args, probe=True)
    results = ev.results
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
    recorded = [
        b is not None for r in results for b, ok in zip(r.behaviours, r.visible, strict=True) if ok
    ]
    return {
        "setting": args.setting_name,
        **ev.inputs_doc(k=args.k, draws=args.draws, seed=args.seed),
        "splits": args.splits,
        "alphas": alphas,
        "delta": args.delta,
        **ev.samples_doc(wrong_key="visible_pass_but_gate_fails"),
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
        **ev.cost_doc(),
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
    add_output_flags(
        p, md_default="results/score_study-<setting>-<model>.md, or results/score_study.md"
    )
    p.add_argument(
        "--combine",
        nargs="+",
        metavar="JSON",
        help="instead of running: one side-by-side report from these JSON results",
    )
    add_run_flags(p)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = command_line("benchmarks.score_study", argv)
    if args.combine:
        docs = [json.loads(Path(p).read_text(encoding="utf-8")) for p in args.combine]
        publish(args, combine(docs, command), RESULTS / "score_study.md")
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
    default = RESULTS / f"score_study-{doc['setting']}-{doc['model']}.md"
    publish(args, markdown(doc, command), default, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
