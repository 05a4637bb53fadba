"""Elastic vs uniform verification, end to end through the real pipeline, over random splits.

Ladder: a cheap recorded model -> an expensive one, both replayed from Sample sets. Each split
halves the tasks at random. On the calibration half the pipeline runs in **shadow** mode (the
cascade serves, the probe is labelled by the gate); λ is calibrated from those receipts with the
``calibration`` package (Learn-then-Test, each α, δ). On the test half the same pipeline answers
every task under each policy, all drawing the same recorded samples (same replay seed):

- ``always-cheap`` / ``always-top``: pass-through, no checks;
- ``cascade``: the verified cascade (visible tests + gate on every answer, escalate on failure);
- ``elastic@α``: enforce mode with the calibrated λ; when no λ is certified the policy is not run
  (the calibration's advice is to keep the cascade) and the split counts as "not certified".

The oracle is the task's hidden tests. The gate runs the same hidden tests, so the cascade serves
a wrong answer only when both rungs fail (``on_exhausted = "unverified"``).

    python -m benchmarks.elastic_vs_uniform --tasks TASKS.jsonl \
        --cheap-samples CHEAP.jsonl --top-samples TOP.jsonl --splits 20 --json OUT.json
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._e2e import Ladder, Policy, RequestResult, run_policy
from benchmarks._programs import DEFAULT_CACHE_DIR, CachingSandbox
from benchmarks._report import (
    RESULTS,
    bootstrap_ci,
    dump_json,
    header,
    load_inputs,
    pct,
    percentile,
    write_text,
)
from benchmarks.datasets import DataMissing, Task

__all__ = [
    "calibrate_lambda",
    "comparisons",
    "elastic_policy",
    "main",
    "markdown",
    "metrics",
    "paired",
    "policies",
    "run_splits",
    "uncertified_policy",
]

#: assumed list prices, USD per million tokens (input, output); override with flags
CHEAP_PRICE = (0.07, 0.16)
TOP_PRICE = (0.27, 1.10)
BASELINES = ("always-cheap", "always-top", "cascade")


def _opt_float(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _price(text: str) -> tuple[float, float]:
    a, b = (float(x) for x in text.split(","))
    return (a, b)


def elastic_policy(name: str, k: int, cal: dict[str, Any], score: str = "pass_share") -> Policy:
    """Enforce mode with the λ a calibration certified (its JSON is cited, so receipts name it)."""
    elastic = {
        "k": k,
        "escalate_at": 0,
        "mode": "enforce",
        "calibration": cal["path"],
        "score": score,
    }
    return Policy(name=name, route="cascade", mode="enforce", elastic=elastic)


def uncertified_policy(k: int, lam: float, score: str = "pass_share") -> Policy:
    """Enforce mode at a fixed λ no calibration vouches for: a reference point, never advice.

    No config can enforce a hand-set λ; the run applies it after the config is built
    (``benchmarks._e2e.uncertified_counterfactual``, a benchmark-only counterfactual).
    """
    elastic = {"k": k, "escalate_at": 0, "mode": "enforce", "score": score}
    return Policy(
        name=f"elastic λ={lam:g} uncertified",
        route="cascade",
        mode="enforce",
        elastic=elastic,
        uncertified_lambda=lam,
    )


def policies(args: argparse.Namespace, lambdas: dict[str, dict[str, Any]]) -> list[Policy]:
    """The policies compared on each test half."""
    out = [
        Policy(name="always-cheap", route="cheap", mode="passthrough", visible=False, hidden=False),
        Policy(name="always-top", route="top", mode="passthrough", visible=False, hidden=False),
        Policy(name="cascade", route="cascade", mode="cascade"),
    ]
    out += [
        elastic_policy(n, args.k, c, args.score)
        for n, c in lambdas.items()
        if c["lambda"] is not None
    ]
    if args.uncertified_lambda is not None:
        out.append(uncertified_policy(args.k, args.uncertified_lambda, args.score))
    return out


def comparisons(names: Sequence[str]) -> list[tuple[str, str]]:
    """Paired comparisons: every elastic policy against the cascade and against always-top."""
    return [
        (n, base) for n in names if n.startswith("elastic") for base in ("cascade", "always-top")
    ]


def calibrate_lambda(
    receipts: Path, alpha: float, delta: float, out: Path, score: str = "pass_share"
) -> dict[str, Any]:
    """λ̂ from shadow receipts via the calibration package (blocking); writes its JSON to ``out``."""
    from firstpass.calibration import Settings, calibrate, read_receipts, to_json_dict
    from firstpass.calibration.report import to_json_text

    data = read_receipts([receipts], score=score)
    cal = calibrate(data, Settings(method="ltt", alpha=alpha, delta=delta))
    doc = to_json_dict(cal)
    out.write_text(to_json_text(doc), encoding="utf-8")
    fit = cal.overall
    return {
        "lambda": fit.lam,
        "label": fit.lam_label,
        "n": fit.n,
        "skip_share": fit.skip_share,
        "explanation": fit.explanation,
        "path": str(out),
    }


def metrics(rs: Sequence[RequestResult], *, gate_cost_calls: float) -> dict[str, float]:
    """The per-policy numbers of one split (means per request unless named otherwise)."""
    n = len(rs)
    ok = sum(r.correct for r in rs)
    wrong = sum(r.served and not r.correct for r in rs)
    skips = [r for r in rs if r.gate_skipped]
    cost = sum(r.cost_usd for r in rs)
    gate_usd = sum(r.gate_runs * gate_cost_calls * r.top_call_usd for r in rs)
    return {
        "n": n,
        "success": ok / n if n else float("nan"),
        "served_failure": wrong / n if n else float("nan"),
        "gate_skips": len(skips) / n if n else float("nan"),
        "served_failure_among_skips": (
            sum(not r.correct for r in skips) / len(skips) if skips else float("nan")
        ),
        "escalated_at_once": sum(r.regime == "escalate" for r in rs) / n if n else float("nan"),
        "gate_runs": sum(r.gate_runs for r in rs) / n if n else float("nan"),
        "model_calls": sum(r.model_calls for r in rs) / n if n else float("nan"),
        "samples": sum(r.samples for r in rs) / n if n else float("nan"),
        "cost_per_request": (cost + gate_usd) / n if n else float("nan"),
        "cost_per_success": (cost + gate_usd) / ok if ok else float("nan"),
        "cost_per_success_pure_tests": cost / ok if ok else float("nan"),
        "p50_ms": percentile([r.wall_ms for r in rs], 50),
        "p95_ms": percentile([r.wall_ms for r in rs], 95),
    }


def paired(
    a: Sequence[RequestResult],
    b: Sequence[RequestResult],
    *,
    gate_cost_calls: float,
    seed: int,
) -> dict[str, dict[str, Any]]:
    """Paired differences a − b on the same tasks, each with a 95% task-bootstrap interval."""
    assert [r.task_id for r in a] == [r.task_id for r in b]

    def cols(rs: Sequence[RequestResult]) -> dict[str, np.ndarray]:
        return {
            "success": np.array([r.correct for r in rs], dtype=float),
            "served_failure": np.array([r.served and not r.correct for r in rs], dtype=float),
            "gate_runs": np.array([r.gate_runs for r in rs], dtype=float),
            "model_calls": np.array([r.model_calls for r in rs], dtype=float),
            "cost_per_request": np.array(
                [r.cost_usd + r.gate_runs * gate_cost_calls * r.top_call_usd for r in rs]
            ),
            "cost_per_request_pure_tests": np.array([r.cost_usd for r in rs]),
        }

    def mean_of(d: np.ndarray) -> Callable[[np.ndarray], float]:
        return lambda idx: float(d[idx].mean())

    ca, cb = cols(a), cols(b)
    out: dict[str, dict[str, Any]] = {}
    for key in ca:
        d = ca[key] - cb[key]
        lo, hi = bootstrap_ci(len(d), mean_of(d), seed=seed)
        out[key] = {"diff": float(d.mean()), "ci": [lo, hi]}
    return out


async def run_splits(
    args: argparse.Namespace,
    *,
    make_policies: Callable[
        [argparse.Namespace, dict[str, dict[str, Any]]], list[Policy]
    ] = policies,
    make_pairs: Callable[[Sequence[str]], list[tuple[str, str]]] = comparisons,
) -> dict[str, Any]:
    """Shadow + calibrate on one half, every policy on the other, ``args.splits`` times.

    Receipts and calibration files go to ``args.workdir`` (an existing directory).
    """
    t0 = time.perf_counter()
    tasks, (cheap_rows, top_rows) = await asyncio.to_thread(
        load_inputs, Path(args.tasks), [Path(args.cheap_samples), Path(args.top_samples)]
    )
    usable: list[Task] = [
        t
        for t in tasks
        if len(cheap_rows.get(t.task_id, {}).get("samples", ())) >= args.k and t.task_id in top_rows
    ]
    if args.limit:
        usable = usable[: args.limit]
    if len(usable) < 4:
        raise SystemExit("fewer than 4 tasks have samples from both models")
    ladder = Ladder(
        cheap_model=str(next(iter(cheap_rows.values()))["model"]),
        cheap_samples=Path(args.cheap_samples).resolve(),
        cheap_price=_price(args.cheap_price),
        top_model=str(next(iter(top_rows.values()))["model"]),
        top_samples=Path(args.top_samples).resolve(),
        top_price=_price(args.top_price),
    )
    alphas = [float(a) for a in args.alphas.split(",")]
    splits: list[dict[str, Any]] = []
    timing: dict[str, dict[str, float]] = {}
    rng = np.random.default_rng(args.seed)
    async with CachingSandbox(isolation=args.isolation, cache_dir=Path(args.cache_dir)) as sb:
        tmp = str(args.workdir)
        for s in range(args.splits):
            order = rng.permutation(len(usable))
            half = len(usable) // 2
            cal_tasks = [usable[i] for i in sorted(order[:half])]
            test_tasks = [usable[i] for i in sorted(order[half:])]
            seed = args.seed * 1000 + s
            shadow_path = Path(tmp) / f"shadow-{s}.jsonl"
            shadow = await run_policy(
                Policy(
                    name="shadow",
                    route="cascade",
                    mode="shadow",
                    elastic={
                        "k": args.k,
                        "lambda": 1.0,
                        "escalate_at": 0,
                        "mode": "shadow",
                        "score": args.score,
                    },
                ),
                cal_tasks,
                ladder=ladder,
                sandbox=sb,
                receipts=shadow_path,
                seed=seed,
                concurrency=args.concurrency,
            )
            lambdas: dict[str, dict[str, Any]] = {}
            for alpha in alphas:
                lambdas[f"elastic@{alpha:g}"] = await asyncio.to_thread(
                    calibrate_lambda,
                    shadow_path,
                    alpha,
                    args.delta,
                    Path(tmp) / f"calibration-{s}-{alpha:g}.json",
                    args.score,
                )
            results: dict[str, list[RequestResult]] = {}
            for policy in make_policies(args, lambdas):
                results[policy.name] = await run_policy(
                    policy,
                    test_tasks,
                    ladder=ladder,
                    sandbox=sb,
                    receipts=Path(tmp) / f"{policy.name}-{s}.jsonl",
                    seed=seed,
                    concurrency=args.concurrency,
                )
            if s == 0 and args.timing:
                timing = await _timing_pass(
                    sb, test_tasks, ladder, make_policies(args, lambdas), args, tmp, seed
                )
            split = {
                "split": s,
                "n_calibration": len(cal_tasks),
                "n_test": len(test_tasks),
                "shadow_labels": sum(r.label is not None for r in shadow),
                "shadow_label_failures": sum(r.label is False for r in shadow),
                "lambda": {
                    name: {k: v for k, v in cal.items() if k != "path"}
                    for name, cal in lambdas.items()
                },
                "policies": {
                    name: metrics(rs, gate_cost_calls=args.gate_cost_calls)
                    for name, rs in results.items()
                },
                "paired": {
                    f"{a} - {b}": paired(
                        results[a],
                        results[b],
                        gate_cost_calls=args.gate_cost_calls,
                        seed=args.seed + s,
                    )
                    for a, b in make_pairs(list(results))
                    if a in results and b in results
                },
            }
            splits.append(split)
            done = ", ".join(f"{n}: λ={c['label'] or 'none'}" for n, c in lambdas.items())
            print(
                f"  split {s + 1}/{args.splits} done ({done}; {time.perf_counter() - t0:.0f} s)",
                file=sys.stderr,
                flush=True,
            )
        stats = sb.stats
        isolation = sb.isolation
        fingerprint = sb.fingerprint
    return {
        "tasks_file": str(args.tasks),
        "cheap": {
            "model": ladder.cheap_model,
            "samples": str(args.cheap_samples),
            "price_per_mtok": list(ladder.cheap_price),
        },
        "top": {
            "model": ladder.top_model,
            "samples": str(args.top_samples),
            "price_per_mtok": list(ladder.top_price),
        },
        "k": args.k,
        "score": args.score,
        "alphas": alphas,
        "delta": args.delta,
        "gate_cost_calls": args.gate_cost_calls,
        "n_tasks": len(usable),
        "n_splits": args.splits,
        "isolation": isolation,
        "sandbox_fingerprint": fingerprint,
        "splits": splits,
        "summary": _summary(splits),
        "timing": timing,
        "programs": {"ran": stats.misses, "cached": stats.hits},
        "elapsed_s": time.perf_counter() - t0,
    }


async def _timing_pass(
    sb: CachingSandbox,
    tasks: list[Task],
    ladder: Ladder,
    policy_list: list[Policy],
    args: argparse.Namespace,
    tmp: str,
    seed: int,
) -> dict[str, dict[str, float]]:
    """Wall time per request with every sandbox run made for real, one request at a time."""
    sb.use_cache = False
    out: dict[str, dict[str, float]] = {}
    try:
        for policy in policy_list:
            rs = await run_policy(
                policy,
                tasks[: args.timing_tasks],
                ladder=ladder,
                sandbox=sb,
                receipts=Path(tmp) / f"timing-{policy.name}.jsonl",
                seed=seed,
                concurrency=1,
            )
            walls = [r.wall_ms for r in rs]
            out[policy.name] = {
                "n": len(rs),
                "p50_ms": percentile(walls, 50),
                "p95_ms": percentile(walls, 95),
                "sandbox_p50_ms": percentile([r.sandbox_ms for r in rs], 50),
            }
    finally:
        sb.use_cache = True
    return out


def _summary(splits: list[dict[str, Any]]) -> dict[str, Any]:
    names = sorted(
        {n for s in splits for n in s["policies"]}, key=lambda n: (n not in BASELINES, n)
    )
    out: dict[str, Any] = {}
    for name in names:
        rows = [s["policies"][name] for s in splits if name in s["policies"]]
        keys = rows[0].keys()
        entry: dict[str, Any] = {"splits_run": len(rows)}
        for key in keys:
            vals = np.array([r[key] for r in rows], dtype=float)
            ok = vals[~np.isnan(vals)]
            entry[key] = {
                "mean": float(ok.mean()) if ok.size else float("nan"),
                "min": float(ok.min()) if ok.size else float("nan"),
                "max": float(ok.max()) if ok.size else float("nan"),
            }
        out[name] = entry
    pairs = sorted({p for s in splits for p in s["paired"]})
    paired_out: dict[str, Any] = {}
    for p in pairs:
        rows = [s["paired"][p] for s in splits if p in s["paired"]]
        entry = {}
        for key in rows[0]:
            diffs = np.array([r[key]["diff"] for r in rows])
            worst = int(np.argmax(diffs)) if key != "success" else int(np.argmin(diffs))
            entry[key] = {
                "mean_diff": float(diffs.mean()),
                "worst_split_diff": float(diffs[worst]),
                "worst_split_ci": rows[worst][key]["ci"],
                "splits_ci_excludes_0": int(
                    sum((r[key]["ci"][0] > 0) or (r[key]["ci"][1] < 0) for r in rows)
                ),
            }
        paired_out[p] = entry
    certified: dict[str, dict[str, Any]] = {}
    for s in splits:
        for name, cal in s["lambda"].items():
            certified.setdefault(name, {"certified": 0, "lambdas": []})
            if cal["lambda"] is not None:
                certified[name]["certified"] += 1
            certified[name]["lambdas"].append(cal["label"])
    return {"policies": out, "paired": paired_out, "calibration": certified}


def _f(x: float, digits: int = 3) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def markdown(
    doc: dict[str, Any], command: str, *, title: str = "Elastic vs uniform verification"
) -> str:
    """The results file: provenance, calibration outcome, policy table, paired table, timing."""
    s = doc["summary"]
    lines = header(
        f"{title}: {doc['cheap']['model']} → {doc['top']['model']}",
        command,
        [
            f"tasks: {doc['n_tasks']} (cheap model has ≥ k = {doc['k']} samples, top model has "
            f"samples), {doc['n_splits']} random half/half splits (calibration / test)",
            f"prices (USD per million input, output tokens; assumed, set by flags): "
            f"{doc['cheap']['model']} {doc['cheap']['price_per_mtok']}, "
            f"{doc['top']['model']} {doc['top']['price_per_mtok']}; token counts are estimated "
            "(4 characters a token: the recorded samples carry none)",
            f"gate cost: one gate run is priced as {doc['gate_cost_calls']:g} call(s) of the top "
            "model for that request; 'pure tests' prices the gate at 0 (sandbox CPU only)",
            f"λ: Learn-then-Test over the shadow receipts of the calibration half, α ∈ "
            f"{doc['alphas']}, δ = {doc['delta']}; elastic routes on the probe score "
            f"`{doc.get('score', 'pass_share')}`",
            f"sandbox isolation: {doc['isolation']} (fingerprint {doc['sandbox_fingerprint']}); elapsed {doc['elapsed_s']:.0f} s; "
            f"sandbox runs {doc['programs']['ran']} (cache answered {doc['programs']['cached']})",
            "the oracle is the hidden test set, which is also the gate",
        ],
    )
    lines += ["## Calibration", ""]
    for name, c in s["calibration"].items():
        lines.append(
            f"- {name}: λ certified in {c['certified']}/{len(c['lambdas'])} splits; "
            f"λ̂ per split: {', '.join(x or 'none' for x in c['lambdas'])}"
        )
    ex = doc["splits"][0]["lambda"]
    for name, cal in ex.items():
        lines.append(f"- split 0, {name}: {cal['explanation']}")
    lines += [
        "",
        "## Test half, mean over splits (worst split in brackets)",
        "",
        "| policy | splits | success | served-failure | skip share | failure among skips | "
        "gate runs/req | model calls/req | samples/req | $ per success | $ per success, pure tests |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m in s["policies"].items():
        lines.append(
            f"| {name} | {m['splits_run']} | {pct(m['success']['mean'])} [{pct(m['success']['min'])}] "
            f"| {pct(m['served_failure']['mean'])} [{pct(m['served_failure']['max'])}] "
            f"| {pct(m['gate_skips']['mean'])} "
            f"| {pct(m['served_failure_among_skips']['mean'])} [{pct(m['served_failure_among_skips']['max'])}] "
            f"| {_f(m['gate_runs']['mean'], 2)} | {_f(m['model_calls']['mean'], 2)} "
            f"| {_f(m['samples']['mean'], 2)} "
            f"| {_f(m['cost_per_success']['mean'] * 1e3, 4)} m$ [{_f(m['cost_per_success']['max'] * 1e3, 4)}] "
            f"| {_f(m['cost_per_success_pure_tests']['mean'] * 1e3, 4)} m$ |"
        )
    lines += [
        "",
        "## Paired differences on the same test tasks (mean over splits; worst split with its 95% "
        "task-bootstrap CI; splits whose CI excludes 0)",
        "",
        "| comparison | metric | mean diff | worst split | worst-split CI | CI excludes 0 |",
        "|---|---|---:|---:|---|---:|",
    ]
    scale = {"cost_per_request": 1e3, "cost_per_request_pure_tests": 1e3}
    for pair, metrics_ in s["paired"].items():
        for key, v in metrics_.items():
            f = scale.get(key, 1.0)
            unit = " m$" if key in scale else ""
            lines.append(
                f"| {pair} | {key} | {_f(v['mean_diff'] * f, 4)}{unit} | {_f(v['worst_split_diff'] * f, 4)} "
                f"| {_f(v['worst_split_ci'][0] * f, 4)} – {_f(v['worst_split_ci'][1] * f, 4)} "
                f"| {v['splits_ci_excludes_0']}/{sum(1 for x in doc['splits'] if pair in x['paired'])} |"
            )
    if doc["timing"]:
        n = next(iter(doc["timing"].values()))["n"]
        lines += [
            "",
            f"## Wall time per request (split 0, first {n} test tasks, every sandbox run made "
            "for real, one request at a time; replay upstream answers in 0 ms)",
            "",
            "| policy | p50 ms | p95 ms | sandbox p50 ms |",
            "|---|---:|---:|---:|",
        ]
        for name, t in doc["timing"].items():
            lines.append(
                f"| {name} | {_f(t['p50_ms'], 1)} | {_f(t['p95_ms'], 1)} | {_f(t['sandbox_p50_ms'], 1)} |"
            )
    lines.append("")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", required=True, help="Task set JSONL")
    p.add_argument("--cheap-samples", required=True, help="Sample set of the cheap rung")
    p.add_argument("--top-samples", required=True, help="Sample set of the expensive rung")
    p.add_argument("--k", type=int, default=5)
    p.add_argument(
        "--score",
        default="pass_share",
        choices=("pass_share", "agreement", "unanimous_agreement"),
        help="the probe score elastic routes on (default pass_share)",
    )
    p.add_argument("--splits", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--alphas", default="0.05,0.10", help="comma-separated α values")
    p.add_argument("--delta", type=float, default=0.05)
    p.add_argument("--cheap-price", default=",".join(map(str, CHEAP_PRICE)), help="USD/Mtok in,out")
    p.add_argument("--top-price", default=",".join(map(str, TOP_PRICE)), help="USD/Mtok in,out")
    p.add_argument(
        "--gate-cost-calls",
        type=float,
        default=1.0,
        help="price of one gate run, in top-model calls (default 1)",
    )
    p.add_argument(
        "--uncertified-lambda",
        type=_opt_float,
        default=1.0,
        help="also run elastic at this fixed, uncalibrated λ as a reference ('none' to skip)",
    )
    p.add_argument("--limit", type=int, default=None, help="use only the first N usable tasks")
    p.add_argument("--concurrency", type=int, default=4, help="requests in flight")
    p.add_argument("--timing-tasks", type=int, default=60, help="tasks in the uncached timing pass")
    p.add_argument("--no-timing", dest="timing", action="store_false", help="skip the timing pass")
    p.add_argument("--isolation", default="auto")
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR))
    p.add_argument("--json", help="write the results as JSON here")
    p.add_argument("--md", help="markdown report path (default results/elastic_vs_uniform.md)")
    p.add_argument("--no-md", action="store_true")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    command = "python -m benchmarks.elastic_vs_uniform " + " ".join(
        sys.argv[1:] if argv is None else argv
    )
    try:
        with tempfile.TemporaryDirectory(prefix="fp-e2e-") as tmp:
            args.workdir = tmp  # receipts and calibration files of every split
            doc = asyncio.run(run_splits(args))
    except DataMissing as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    md = markdown(doc, command)
    print(md)
    if args.json:
        dump_json(Path(args.json), doc)
    if not args.no_md:
        write_text(Path(args.md) if args.md else RESULTS / "elastic_vs_uniform.md", md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
