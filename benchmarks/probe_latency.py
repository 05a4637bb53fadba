"""What the elastic probe costs in wall time, against a stub upstream of fixed latency L.

For real MBPP+ tasks (the canonical solution as every sample's answer, the first MBPP assert as
the visible test, the base inputs as the gate), through the real proxy and sandbox:

- cascade: one upstream call (n=1), visible test, gate;
- enforce, k/k: ONE upstream call with n=k, the visible test on all k samples in parallel, serve
  (the probe alone: its wall time is what the target "≤ L + 30 ms p50" is about);
- enforce without ``n``: k concurrent one-sample calls;
- enforce with ``score = "agreement"``: the same one-call probe, plus every sample's entry point
  called on the generated probe inputs in its visible-test process (what behavioural agreement
  adds; the target is <= 50 ms p50 on top of the plain probe).

Prints p50/p90 request wall time and upstream round trips per request, side by side.

    python -m benchmarks.probe_latency [--tasks 30] [--reps 3] [--latency-ms 50] [--k 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai

from benchmarks._e2e import uncertified_counterfactual
from benchmarks.datasets import DataMissing, load_mbppplus
from tests.server_harness import CHEAP, MODEL, LiveStack
from tests.stub_upstream import Reply

RESULTS = Path(__file__).resolve().parent / "results"


#: the λ the enforce rows run at; no calibration certifies it (this measures time, not risk)
LAMBDA = 0.9


class _UncertifiedStack(LiveStack):
    """The live stack with enforce at ``LAMBDA`` on every probed rung and no certificate behind
    it (``benchmarks._e2e.uncertified_counterfactual``: a benchmark-only counterfactual no config
    can express), so k/k passing samples are served without the gate and the probe's own wall
    time is what is measured."""

    async def _start_server(self) -> str:
        self.config = uncertified_counterfactual(self.config, LAMBDA)
        return await super()._start_server()


def _fenced(code: str) -> str:
    return f"Here is the function:\n```python\n{code.strip()}\n```\n"


def _request(task: Any, mode: str) -> dict[str, Any]:
    return {
        "tests": {
            "visible": [task.first_assert],
            "hidden": {
                "entry_point": task.entry_point,
                "cases": [{"args": list(a)} for a in task.base_inputs],
                "reference": task.canonical_solution,
                "atol": task.atol,
            },
        },
        "entry_point": task.entry_point,
        "mode": mode,
    }


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def run_setting(
    name: str,
    tasks: list[Any],
    *,
    mode: str,
    k: int,
    latency_ms: float,
    honours_n: bool,
    reps: int,
    score: str = "pass_share",
) -> dict[str, Any]:
    elastic = {"k": k, "escalate_at": 0, "mode": "enforce", "score": score}
    with tempfile.TemporaryDirectory() as tmp:
        stack = _UncertifiedStack(
            Path(tmp) / "r.jsonl", honours_n=honours_n, elastic=elastic, timeout_s=30.0
        )
        try:
            client = openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
            walls: list[float] = []
            for task in tasks:  # warm the reference cache and the zygote first
                stack.stub.script(Reply.ok(_fenced(task.canonical_solution)), model=CHEAP)
                client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": task.prompt}],
                    extra_body={"firstpass": _request(task, "cascade")},
                )
            stack.stub.reset()
            for _ in range(reps):
                for task in tasks:
                    answer = _fenced(task.canonical_solution)
                    if mode == "cascade":
                        stack.stub.script(Reply.ok(answer, latency_ms=latency_ms), model=CHEAP)
                    elif honours_n:
                        stack.stub.script(
                            Reply.ok(*[answer] * k, latency_ms=latency_ms), model=CHEAP
                        )
                    else:
                        stack.stub.script(
                            *[Reply.ok(answer, latency_ms=latency_ms)] * k, model=CHEAP
                        )
                    t0 = time.perf_counter()
                    client.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": task.prompt}],
                        extra_body={"firstpass": _request(task, mode)},
                    )
                    walls.append((time.perf_counter() - t0) * 1000.0)
            receipts = stack.receipts_list()[len(tasks) :]
            calls = [sum(c["calls"] for c in r["upstream_calls"]) for r in receipts]
            trips = [len(r["upstream_calls"]) for r in receipts]
            regimes = [r["probe"]["regime"] for r in receipts if r.get("probe")]
            sandbox = [r["timings_ms"]["sandbox"] for r in receipts]
            inputs = [r["probe"].get("probe_inputs", 0) for r in receipts if r.get("probe")]
        finally:
            stack.close()
    return {
        "name": name,
        "n": len(walls),
        "p50": statistics.median(walls),
        "p90": _pct(walls, 90),
        "sandbox_p50": statistics.median(sandbox),
        "http_calls": statistics.mean(calls),
        "round_trips": statistics.mean(trips),
        "serve_share": regimes.count("serve") / len(regimes) if regimes else None,
        "probe_inputs": statistics.mean(inputs) if inputs else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=30)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--k", type=int, default=5)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    try:
        all_tasks = load_mbppplus()
    except DataMissing as exc:
        print(f"skipped: {exc}")
        return 0
    # tasks whose canonical solution passes its own first assert (NOTES.md lists the exceptions)
    tasks = [t for t in all_tasks if "math." not in t.first_assert and "sys." not in t.first_assert]
    tasks = tasks[: args.tasks]
    L = args.latency_ms
    rows = [
        run_setting(
            "cascade (n=1, visible + gate)",
            tasks,
            mode="cascade",
            k=args.k,
            latency_ms=L,
            honours_n=True,
            reps=args.reps,
        ),
        run_setting(
            f"enforce probe (one call, n={args.k})",
            tasks,
            mode="enforce",
            k=args.k,
            latency_ms=L,
            honours_n=True,
            reps=args.reps,
        ),
        run_setting(
            f"enforce probe ({args.k} calls, no n)",
            tasks,
            mode="enforce",
            k=args.k,
            latency_ms=L,
            honours_n=False,
            reps=args.reps,
        ),
        run_setting(
            f"enforce probe + agreement (one call, n={args.k})",
            tasks,
            mode="enforce",
            k=args.k,
            latency_ms=L,
            honours_n=True,
            reps=args.reps,
            score="agreement",
        ),
    ]
    lines = [
        "# Probe latency",
        "",
        f"- command: `python -m benchmarks.probe_latency {' '.join(sys.argv[1:] if argv is None else argv)}`",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        f"- stub upstream latency L = {L:.0f} ms; k = {args.k}; {len(tasks)} MBPP+ tasks x {args.reps} reps; "
        "canonical solutions as answers (so enforce lands in the serve regime)",
        "",
        "| setting | requests | p50 ms | p90 ms | p50 - L ms | sandbox p50 ms | HTTP calls/req | upstream round trips/req | probe inputs/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} | {r['n']} | {r['p50']:.1f} | {r['p90']:.1f} | {r['p50'] - L:+.1f} | "
            f"{r['sandbox_p50']:.1f} | {r['http_calls']:.2f} | {r['round_trips']:.2f} | "
            f"{r['probe_inputs']:.1f} |"
        )
    plain, agreement = rows[1], rows[3]
    lines += [
        "",
        f"Agreement adds {agreement['p50'] - plain['p50']:+.1f} ms to the probe's p50 request wall "
        f"time ({agreement['sandbox_p50'] - plain['sandbox_p50']:+.1f} ms of sandbox p50) for "
        f"{agreement['probe_inputs']:.1f} probe inputs per sample, k = {args.k} (target <= 50 ms; "
        "both rows from this one run, so the machine's load is shared).",
    ]
    md = "\n".join(lines) + "\n"
    print(md)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "probe_latency.md").write_text(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
