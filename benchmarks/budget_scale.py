"""The shared budget under contention: N replica ledgers reserving and settling on ONE hot key.

Each replica is its own process (its own event loop and connections, as real replicas), running
``concurrency / N`` request loops on the key ``hot``: reserve a call's worst case, "call" for a
few milliseconds, settle a real cost at most the hold. Two modes:

- ``plenty``: caps far above what the run spends: reserves/s, p50/p99 reserve latency, and how
  many reserves failed with ``BudgetStoreUnavailable`` (a 503 ``budget_store_unavailable``; the
  database is healthy throughout, so the right number is 0);
- ``near``: a small key cap the loops race to exhaustion: the same numbers, plus the overshoot
  check (table spend <= cap, and table spend = the sum of what the loops settled).

``--design direct`` runs every reserve as its own transaction on the key's rows (the design
before leases; on a tree without leases it is the only one); ``--design lease`` (the default
when the tree has it) lets each replica lease a slice of the remaining budget.

    python -m benchmarks.budget_scale [--replicas 3,8] [--concurrency 60] [--seconds 8]
        [--modes plenty,near] [--design lease|direct] [--rounds 3] [--pg-fsync on|off]
        [--out FILE.jsonl]
    python -m benchmarks.budget_scale --compare BEFORE.jsonl AFTER.jsonl   # a markdown table

``--servers REQUESTS`` instead runs three real replicas (``firstpass serve`` with the PostgreSQL
sink and ``[budgets] daily_usd``) and sends REQUESTS pass-through requests at ``--concurrency``
round-robin, counting 503 ``budget_store_unavailable`` (the issue's check: 0 with a healthy
database). It runs whatever design the tree's ``SharedLedger`` defaults to.

PostgreSQL: a throwaway server of its own (benchmarks/replicas.py ``local_pg``).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
AMOUNTS = (0.01, 0.02, 0.03, 0.05)


# -- one replica --------------------------------------------------------------------------------


async def _worker(args: argparse.Namespace) -> None:
    import random

    from firstpass.budgets import IN_FLIGHT_RETRY_S
    from firstpass.db import SharedLedger
    from firstpass.errors import BudgetExhausted, BudgetStoreUnavailable

    settings: dict[str, object] = {}
    if "lease_calls" in inspect.signature(SharedLedger).parameters:
        if args.design == "direct":
            settings["lease_calls"] = 0
        elif args.lease_calls >= 0:
            settings["lease_calls"] = args.lease_calls
    elif args.design != "direct":
        raise SystemExit("this tree has no leases: run with --design direct")
    ledger = SharedLedger(
        args.dsn,
        replica=args.replica,
        daily_usd=args.daily,
        per_request_usd=None,
        key_caps={"hot": args.key_cap},
        **settings,  # type: ignore[arg-type]
    )
    await ledger.start()
    await asyncio.sleep(max(0.0, args.at - time.time()))
    deadline = time.monotonic() + args.seconds
    rng = random.Random(args.replica)
    lat: list[float] = []
    out = {"unavailable": 0, "in_flight": 0, "spent_out": 0, "settled": 0.0, "calls": 0}

    async def loop() -> None:
        while time.monotonic() < deadline:
            need = rng.choice(AMOUNTS)
            budget = ledger.open("hot")
            t0 = time.perf_counter()
            try:
                hold = await budget.reserve(need)
            except BudgetStoreUnavailable:
                out["unavailable"] += 1
                await asyncio.sleep(0.05)
                continue
            except BudgetExhausted as exc:
                if exc.retry_after_s == IN_FLIGHT_RETRY_S:
                    out["in_flight"] += 1
                    await asyncio.sleep(rng.uniform(0.0, 0.02))
                    continue
                out["spent_out"] += 1
                return
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(rng.uniform(0.0, 2 * args.call_ms / 1000))
            actual = need if rng.random() < 0.3 else round(rng.uniform(0.0, need), 9)
            await budget.settle(hold, actual)
            out["calls"] += 1
            out["settled"] += actual

    started = time.monotonic()
    await asyncio.gather(*(loop() for _ in range(args.loops)))
    elapsed = time.monotonic() - started
    await ledger.aclose()
    print(json.dumps({**out, "elapsed": elapsed, "lat_ms": [round(x * 1000, 3) for x in lat]}))


# -- the run ------------------------------------------------------------------------------------


def _database(base_dsn: str) -> str:
    import psycopg

    from firstpass.db import migrate

    name = f"bs_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(base_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    dsn = base_dsn.replace("dbname=postgres", f"dbname={name}")
    asyncio.run(migrate(dsn))
    return dsn


def _table(dsn: str) -> tuple[float, float]:
    import psycopg

    with psycopg.connect(dsn) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(spent_usd), 0), coalesce(sum(held_usd), 0) FROM firstpass_spend "
            "WHERE scope = 'key' AND key = 'hot'"
        ).fetchone()
    assert row is not None
    return float(row[0]), float(row[1])


def run_one(
    base_dsn: str,
    *,
    replicas: int,
    concurrency: int,
    seconds: float,
    mode: str,
    design: str,
    lease_calls: int,
    call_ms: float,
) -> dict[str, object]:
    dsn = _database(base_dsn)
    key_cap = 1e6 if mode == "plenty" else 8.0
    at = time.time() + 2.0 + 0.2 * replicas
    loops = [
        concurrency // replicas + (1 if i < concurrency % replicas else 0) for i in range(replicas)
    ]
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "benchmarks.budget_scale", "--worker", dsn, f"r{i}",
             str(loops[i]), str(seconds), str(at), str(1e7), str(key_cap), design,
             str(lease_calls), str(call_ms)],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for i in range(replicas)
    ]  # fmt: skip
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=seconds + 120)
        if proc.returncode != 0:
            raise RuntimeError(f"worker failed: {err[-2000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    lat = sorted(x for r in results for x in r["lat_ms"])
    elapsed = max(r["elapsed"] for r in results)
    spent, held = _table(dsn)
    settled = sum(r["settled"] for r in results)
    return {
        "replicas": replicas,
        "mode": mode,
        "design": design,
        "reserves": len(lat),
        "reserves_per_s": len(lat) / elapsed,
        "p50_ms": statistics.median(lat) if lat else 0.0,
        "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else 0.0,
        "unavailable": sum(r["unavailable"] for r in results),
        "in_flight_refusals": sum(r["in_flight"] for r in results),
        "cap": key_cap,
        "table_spent": spent,
        "table_held_after": held,
        "settled_sum": settled,
        "within_cap": spent <= key_cap + 1e-9,
        "counted_once": abs(spent - settled) < 1e-6,
    }


def run_servers(base_dsn: str, *, requests: int, concurrency: int) -> dict[str, object]:
    """Three real replicas (``firstpass serve``, PostgreSQL sink, ``[budgets] daily_usd`` far
    from spent) on the stub upstream, ``concurrency`` closed-loop clients round-robin over them,
    pass-through requests: how many got 503 ``budget_store_unavailable``."""
    import tempfile
    from collections import Counter

    import aiohttp

    from benchmarks._reliability_load import Mix, _one, plan
    from benchmarks._reliability_stack import StubSettings, start_stub
    from benchmarks.replicas import Replicas

    dsn = _database(base_dsn)
    mix = Mix(modes={"passthrough": 1.0}, answers={"good": 1.0}, stream=0.0, header_mode=0.0)
    with tempfile.TemporaryDirectory(prefix="budget-scale-") as tmp:
        stub = start_stub(Path(tmp), StubSettings(faults=""))
        reps = Replicas(Path(tmp), stub.url, dsn, n=3, fsync="batch", settings={"daily_usd": 1e6})
        try:
            reps.start()
            urls = [r.url for r in reps.members]
            queue = iter(plan(requests, mix, seed=5))
            codes: Counter[str] = Counter()

            async def load() -> float:
                connector = aiohttp.TCPConnector(limit=concurrency)
                async with aiohttp.ClientSession(connector=connector) as session:

                    async def client(c: int) -> None:
                        k = c
                        for p in queue:
                            url = f"{urls[k % len(urls)]}/v1/chat/completions"
                            k += 1
                            got = await _one(session, url, p, 60.0)
                            codes[f"{got.status} {got.error_code or ''}".strip()] += 1

                    t0 = time.monotonic()
                    await asyncio.gather(*(client(c) for c in range(concurrency)))
                    return time.monotonic() - t0

            elapsed = asyncio.run(load())
        finally:
            reps.stop()
            stub.stop()
    return {
        "requests": sum(codes.values()),
        "requests_per_s": sum(codes.values()) / elapsed,
        "unavailable_503": codes.get("503 budget_store_unavailable", 0),
        "statuses": dict(codes),
    }


def _line(r: dict[str, object]) -> str:
    return (
        f"{r['design']:>6} {r['mode']:>6} replicas={r['replicas']} "
        f"reserves/s={r['reserves_per_s']:,.0f} p50={r['p50_ms']:.2f}ms p99={r['p99_ms']:.2f}ms "
        f"unavailable={r['unavailable']} in_flight_429={r['in_flight_refusals']} "
        f"spent={r['table_spent']:.6f} settled={r['settled_sum']:.6f} "
        f"held_after={r['table_held_after']:.6f} cap={r['cap']:g} "
        f"within_cap={r['within_cap']} counted_once={r['counted_once']}"
    )


def compare(before: Path, after: Path) -> str:
    """A markdown table of two runs' JSON lines side by side: the range over rounds of each
    number, per (replicas, mode)."""

    def load(path: Path) -> dict[tuple[int, str], list[dict[str, object]]]:
        out: dict[tuple[int, str], list[dict[str, object]]] = {}
        for line in path.read_text().splitlines():
            r = json.loads(line)
            out.setdefault((int(r["replicas"]), str(r["mode"])), []).append(r)
        return out

    def rng(rows: list[dict[str, object]], name: str, fmt: str) -> str:
        xs = [float(r[name]) for r in rows]  # type: ignore[arg-type]
        lo, hi = min(xs), max(xs)
        return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"

    b, a = load(before), load(after)
    lines = [
        "| replicas | mode | design | rounds | reserves/s | p50 ms | p99 ms | 503 unavailable "
        "| 429 in flight | within cap | counted once |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key in sorted(set(b) | set(a)):
        for label, runs in (("before", b.get(key)), ("after", a.get(key))):
            if not runs:
                continue
            lines.append(
                f"| {key[0]} | {key[1]} | {label} ({runs[0]['design']}) | {len(runs)} "
                f"| {rng(runs, 'reserves_per_s', '{:,.0f}')} | {rng(runs, 'p50_ms', '{:.2f}')} "
                f"| {rng(runs, 'p99_ms', '{:.0f}')} | {rng(runs, 'unavailable', '{:.0f}')} "
                f"| {rng(runs, 'in_flight_refusals', '{:.0f}')} "
                f"| {all(r['within_cap'] for r in runs)} | {all(r['counted_once'] for r in runs)} |"
            )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--compare":
        print(compare(Path(argv[1]), Path(argv[2])))
        return 0
    if argv and argv[0] == "--worker":
        names = ["dsn", "replica", "loops", "seconds", "at", "daily", "key_cap", "design",
                 "lease_calls", "call_ms"]  # fmt: skip
        ns = argparse.Namespace(**dict(zip(names, argv[1:], strict=True)))
        ns.loops, ns.lease_calls = int(ns.loops), int(ns.lease_calls)
        ns.seconds, ns.at, ns.call_ms = float(ns.seconds), float(ns.at), float(ns.call_ms)
        ns.daily, ns.key_cap = float(ns.daily), float(ns.key_cap)
        asyncio.run(_worker(ns))
        return 0
    p = argparse.ArgumentParser(prog="python -m benchmarks.budget_scale")
    p.add_argument("--replicas", default="3,8")
    p.add_argument("--concurrency", type=int, default=60)
    p.add_argument("--seconds", type=float, default=8.0)
    p.add_argument("--modes", default="plenty,near")
    p.add_argument("--design", default="lease", choices=["lease", "direct"])
    p.add_argument(
        "--lease-calls", type=int, default=-1, help="SharedLedger's lease_calls (-1: its default)"
    )
    p.add_argument("--call-ms", type=float, default=5.0, help="mean simulated call time")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--pg-fsync", choices=["on", "off"], default="on")
    p.add_argument("--out", type=Path, help="append the results as JSON lines here")
    p.add_argument(
        "--servers",
        type=int,
        metavar="REQUESTS",
        help="instead: REQUESTS pass-through requests at --concurrency over 3 real replicas",
    )
    args = p.parse_args(argv)
    from benchmarks.replicas import local_pg

    with local_pg(fsync=args.pg_fsync == "on") as (base_dsn, _data):
        if args.servers:
            for _ in range(args.rounds):
                r = run_servers(base_dsn, requests=args.servers, concurrency=args.concurrency)
                print(json.dumps(r), flush=True)
                if args.out is not None:
                    with args.out.open("a") as f:
                        f.write(json.dumps(r) + "\n")
            return 0
        for _ in range(args.rounds):
            for n in (int(x) for x in args.replicas.split(",")):
                for mode in args.modes.split(","):
                    r = run_one(
                        base_dsn, replicas=n, concurrency=args.concurrency,
                        seconds=args.seconds, mode=mode, design=args.design,
                        lease_calls=args.lease_calls, call_ms=args.call_ms,
                    )  # fmt: skip
                    print(_line(r), flush=True)
                    if args.out is not None:
                        with args.out.open("a") as f:
                            f.write(json.dumps(r) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
