"""How many real visible tests the null-answer detector calls vacuous, and what it adds per request.

    python -m benchmarks.vacuous_tests [--limit N] [--timing-tasks 20] [--rounds 3]

Part 1, false positives: every MBPP task's visible tests through ``Sandbox.null_passes``. Real
tests check outputs, so a null answer (a stub returning None, or raising) should pass none of
them; every task flagged is a false positive that would cost a gate, and is listed. Specs:

- ``mbpp first assert``: original MBPP, ``test_list[0]`` with its ``test_setup_code`` (the
  visible test bigcode and EvalPlus show);
- ``mbpp all asserts``: the three ``test_list`` asserts as one spec;
- ``mbpp+ first assert``: MBPP+'s first assert with its ``entry_point`` named;
- ``specfix shown``: the assert the SpecFix models were shown (``requirement``), ``import math``
  as setup as the other benchmarks do.

Part 2, cost: on tasks with five SpecFix samples, a probe's ``run_many`` of five samples alone
and with ``null_passes`` beside it (``asyncio.gather``, as the pipeline runs them), interleaved,
``--rounds`` passes; p50/p90 wall ms and the p50 difference per round.
Data: ``$FIRSTPASS_DATA`` or ``<repo>/../shared/data``; exits 2 when it is absent.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence

from benchmarks.datasets import (
    DataMissing,
    load_mbpp_original,
    load_mbppplus,
    load_specfix_samples,
    shown_asserts,
)
from firstpass.errors import SpecError
from firstpass.sandbox import Limits, NullVerdict, Sandbox, TestSpec, parse_spec


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def specs_of_data(limit: int | None) -> dict[str, dict[str, TestSpec]]:
    """``set name -> task id -> visible spec`` (see the module docstring)."""
    original = load_mbpp_original()
    plus = load_mbppplus()
    shown = load_specfix_samples("deepseek-v3")
    sets: dict[str, dict[str, TestSpec]] = {
        "mbpp first assert": {},
        "mbpp all asserts": {},
        "mbpp+ first assert": {},
        "specfix shown": {},
    }
    for number, task in sorted(original.items()):
        if task.asserts:
            tid = f"Mbpp/{number}"
            sets["mbpp first assert"][tid] = parse_spec(list(task.asserts[:1]), setup=task.setup)
            sets["mbpp all asserts"][tid] = parse_spec(list(task.asserts), setup=task.setup)
    for t in plus:
        if t.asserts:
            spec = parse_spec([t.first_assert], entry_point=t.entry_point)
            sets["mbpp+ first assert"][t.task_id] = spec
    for tid, row in sorted(shown.items(), key=lambda kv: int(kv[0].split("/")[1])):
        asserts = shown_asserts(row["requirement"])[:1]
        if asserts:
            try:
                sets["specfix shown"][tid] = parse_spec(asserts, setup="import math")
            except SpecError:
                continue
    if limit is not None:
        sets = {name: dict(list(specs.items())[:limit]) for name, specs in sets.items()}
    return sets


async def flagged(sb: Sandbox, specs: dict[str, TestSpec]) -> dict[str, NullVerdict | None]:
    """Each task's verdict, ``2 * concurrency`` specs in flight at a time."""
    gate = asyncio.Semaphore(2 * sb.concurrency)

    async def one(spec: TestSpec) -> NullVerdict | None:
        async with gate:
            return await sb.null_passes(spec)

    verdicts = await asyncio.gather(*(one(s) for s in specs.values()))
    return dict(zip(specs, verdicts, strict=True))


async def timing(sb: Sandbox, n_tasks: int, rounds: int) -> None:
    """Print the probe's wall time with and without the null stubs beside it."""
    samples = load_specfix_samples("deepseek-v3")
    chosen = [
        tid
        for tid, row in sorted(samples.items(), key=lambda kv: int(kv[0].split("/")[1]))
        if len(row["samples"]) >= 5 and shown_asserts(row["requirement"])
    ]
    chosen = chosen[:: max(1, len(chosen) // n_tasks)][:n_tasks]
    specs = {
        t: parse_spec(shown_asserts(samples[t]["requirement"])[:1], setup="import math")
        for t in chosen
    }
    await sb.run_many(samples[chosen[0]]["samples"][:5], specs[chosen[0]])  # warm-up
    for r in range(rounds):
        alone: list[float] = []
        beside: list[float] = []
        for tid in chosen:
            five = samples[tid]["samples"][:5]
            t0 = time.perf_counter()
            await sb.run_many(five, specs[tid])
            alone.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            await asyncio.gather(sb.run_many(five, specs[tid]), sb.null_passes(specs[tid]))
            beside.append((time.perf_counter() - t0) * 1000)
        a50, b50 = statistics.median(alone), statistics.median(beside)
        print(
            f"round {r + 1}: 5 samples p50 {a50:.1f} ms (p90 {pct(alone, 0.9):.1f}); with null "
            f"stubs p50 {b50:.1f} ms (p90 {pct(beside, 0.9):.1f}); added p50 {b50 - a50:+.1f} ms "
            f"({len(chosen)} tasks)"
        )


async def bench(limit: int | None, n_tasks: int, rounds: int) -> int:
    try:
        sets = await asyncio.to_thread(specs_of_data, limit)
    except DataMissing as exc:
        print(f"vacuous_tests: {exc}", file=sys.stderr)
        return 2
    async with Sandbox(limits=Limits(cpu_s=5, wall_s=10)) as sb:
        print(
            f"vacuous_tests: isolation {sb.isolation}, {os.cpu_count()} cores, "
            f"concurrency {sb.concurrency}"
        )
        for name, specs in sets.items():
            t0 = time.perf_counter()
            verdicts = await flagged(sb, specs)
            took = time.perf_counter() - t0
            counts = Counter(v for v in verdicts.values() if v is not None)
            print(
                f"{name}: {sum(counts.values())}/{len(verdicts)} flagged "
                f"(returns_none {counts['returns_none']}, raises {counts['raises']}, "
                f"unknown {counts['unknown']}) in {took:.1f} s"
            )
            for tid, verdict in verdicts.items():
                if verdict is not None:
                    spec = specs[tid]
                    shown = getattr(spec, "asserts", ())
                    print(f"  {tid}: {verdict}: {' | '.join(shown)[:160]}")
        if n_tasks > 0:
            await timing(sb, n_tasks, rounds)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--limit", type=int, default=None, help="tasks per set (default: all)")
    parser.add_argument(
        "--timing-tasks", type=int, default=20, help="tasks timed (default 20; 0: no timing)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="timing passes (default 3)")
    args = parser.parse_args(argv)
    return asyncio.run(bench(args.limit, args.timing_tasks, args.rounds))


if __name__ == "__main__":
    sys.exit(main())
