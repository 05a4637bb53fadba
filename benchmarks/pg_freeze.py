"""PostgreSQL frozen (SIGSTOP) and resumed (SIGCONT) under load, many times: the replicas'
receipt writers must survive every cycle and lose nothing (issue 26, item 3: a replica died with
SIGSEGV when a frozen server resumed, on the path where the writer closed a connection under a
statement that had timed out).

Starts a throwaway PostgreSQL (``benchmarks.replicas.local_pg``), a stub upstream and
``--replicas`` Firstpass replicas with the PostgreSQL receipt sink, each under
``PYTHONFAULTHANDLER=1``, and drives paced pass-through requests at each, a new connection per
request (``--keep-alive``: one per client). Each cycle stops every PostgreSQL process
(postmaster and backends), waits ``--freeze-s`` (past the writer's 5 s statement timeout, so
its statement is given up on and receipts go to the spill file), resumes them, waits until
every replica writes to the table again with its spill shipped, and checks that every replica
process is alive. A dead replica is counted as a crash and started again. At the end every
chain is verified and its request rows are counted against the requests the replicas
answered; the replicas' stderr is searched for fault-handler dumps and psycopg's "query
cancellation failed". Writes benchmarks/results/pg_freeze.md (``--no-write``: not).

``--perturb`` runs the replicas with glibc's ``malloc.perturb`` tunable (freed memory
overwritten, no thread cache), so that a use after free crashes at once rather than now and
then. ``--daily-usd`` gives the replicas a shared daily budget, kept in the same database (its
statements are frozen too).

    python -m benchmarks.pg_freeze [--cycles 30] [--replicas 3] [--freeze-s 7]
        [--rate 100] [--fsync batch] [--keep-alive] [--perturb] [--daily-usd USD]
        [--note TEXT] [--no-write]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from benchmarks._reliability_stack import scrape_metrics
from benchmarks.loadgen import build_post
from benchmarks.replicas import (
    PLAIN,
    RESULTS,
    Replica,
    Replicas,
    local_pg,
    migrate,
    pg_processes,
    start_raw_stub,
    table_receipts,
    verify_table,
    verify_table_by_file,
)

__all__ = ["main"]

#: what a replica's stderr shows when it died of a fault, or psycopg gave up cancelling
_FAULT = re.compile(r"Fatal Python error|Segmentation fault|Current thread 0x|Thread 0x")
_CANCEL_FAILED = "query cancellation failed"
#: how long a resumed server may take until every replica writes to the table again
RECOVER_S = 90.0
#: glibc: freed memory filled with a byte, and no per-thread cache (whose chunks are not filled)
PERTURB = "glibc.malloc.tcache_count=0:glibc.malloc.perturb=165"


@dataclass
class Tally:
    """What one replica's clients saw: answers by status, and failed connections."""

    statuses: dict[int, int] = field(default_factory=dict)
    errors: int = 0

    @property
    def answered(self) -> int:
        return sum(self.statuses.values())


@dataclass
class Outcome:
    cycles: int = 0
    crashes: list[str] = field(default_factory=list)
    unrecovered: list[str] = field(default_factory=list)


def _signal_pg(data: Path, sig: signal.Signals) -> int:
    """Send ``sig`` to the postmaster first (so it forks no backend meanwhile), then to every
    child, listed twice (one forked between the two looks is caught by the second)."""
    sent: set[int] = set()
    for _ in range(2):
        for pid in pg_processes(data):
            if pid not in sent:
                try:
                    os.kill(pid, sig)
                    sent.add(pid)
                except ProcessLookupError:
                    pass
    return len(sent)


async def _paced_client(
    url: str, rate: float, tally: Tally, stop: asyncio.Event, *, keep_alive: bool
) -> None:
    """Pass-through POSTs to ``url`` at about ``rate`` per second: on one keep-alive
    connection (opened again after an error: a replica restarted), or a new one each."""
    from benchmarks.loadgen import _read_response

    host, port, raw = build_post(f"{url}/v1/chat/completions", PLAIN)
    if not keep_alive:
        raw = raw.replace(b"Connection: keep-alive", b"Connection: close")
    loop = asyncio.get_running_loop()
    gap = 1.0 / rate
    next_at = loop.time()
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError:
            tally.errors += 1
            await asyncio.sleep(0.2)
            continue
        try:
            while not stop.is_set():
                writer.write(raw)
                status = await asyncio.wait_for(_read_response(reader), 120)
                tally.statuses[status] = tally.statuses.get(status, 0) + 1
                next_at = max(next_at + gap, loop.time())
                await asyncio.sleep(next_at - loop.time())
                if not keep_alive:
                    break
        except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError):
            tally.errors += 1
        finally:
            writer.close()


def _writer_state(r: Replica) -> tuple[bool, int]:
    """(database up, spill lines) of a replica's receipt writer, from its /metrics."""
    m = scrape_metrics(r.url)
    return m.get("firstpass_receipt_database_up", 0.0) == 1.0, int(
        m.get("firstpass_receipt_spill_lines", 0.0)
    )


def _alive(r: Replica) -> bool:
    return r.proc is not None and r.proc.popen.poll() is None


def _died(r: Replica) -> str:
    assert r.proc is not None
    code = r.proc.popen.returncode
    how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit {code}"
    r.proc.stop()  # reaped; closes its stderr file
    r.proc = None
    return f"{r.id}: {how}"


async def _recovered(reps: Replicas, deadline_s: float) -> list[str]:
    """Wait until every live replica writes to the table with an empty spill; the replicas
    that did not within ``deadline_s``, with their last state."""
    loop = asyncio.get_running_loop()
    end = loop.time() + deadline_s
    left = {r.id: "" for r in reps.members}
    while left and loop.time() < end:
        for r in reps.members:
            if r.id not in left:
                continue
            if not _alive(r):
                left[r.id] = "dead"
                continue
            try:
                up, spill = await asyncio.to_thread(_writer_state, r)
            except OSError as exc:
                left[r.id] = f"metrics: {exc}"
                continue
            if up and spill == 0:
                del left[r.id]
            else:
                left[r.id] = f"database_up={up} spill_lines={spill}"
        if left:
            await asyncio.sleep(0.25)
    return [f"{rid}: {why}" for rid, why in left.items()]


async def _cycles(args: argparse.Namespace, reps: Replicas, data: Path, out: Outcome) -> None:
    for n in range(1, args.cycles + 1):
        stopped = _signal_pg(data, signal.SIGSTOP)
        await asyncio.sleep(args.freeze_s)  # the experiment's freeze, past the writer's timeout
        _signal_pg(data, signal.SIGCONT)
        left = await _recovered(reps, RECOVER_S)
        dead = [r for r in reps.members if r.proc is not None and not _alive(r)]
        for r in dead:
            out.crashes.append(f"cycle {n}: {_died(r)}")
        if dead:
            await asyncio.to_thread(reps.start)  # carry on with the same ids and spill files
        out.unrecovered += [f"cycle {n}: {why}" for why in left if "dead" not in why]
        out.cycles = n
        print(
            f"cycle {n:3d}: {stopped} PostgreSQL processes frozen {args.freeze_s:g} s;"
            f" crashes so far {len(out.crashes)}" + (f"; not recovered: {left}" if left else ""),
            flush=True,
        )
        await asyncio.sleep(args.pause_s)  # traffic to a healthy table between freezes


def _stderr_counts(reps: Replicas) -> dict[str, tuple[int, int, int]]:
    """Per replica: (fault-handler lines, 'query cancellation failed' lines, tracebacks)."""
    out: dict[str, tuple[int, int, int]] = {}
    for r in reps.members:
        text = r.stderr.read_text(errors="replace") if r.stderr.exists() else ""
        out[r.id] = (
            sum(1 for line in text.splitlines() if _FAULT.search(line)),
            text.count(_CANCEL_FAILED),
            text.count("Traceback"),
        )
    return out


async def _run(args: argparse.Namespace, tmp: Path) -> tuple[list[str], bool]:
    with local_pg(fsync=False) as (dsn, data):
        migrate(dsn)
        stub = start_raw_stub(tmp)
        settings = {} if args.daily_usd is None else {"daily_usd": args.daily_usd}
        reps = Replicas(
            tmp / "replicas",
            stub.url,
            dsn,
            n=args.replicas,
            fsync=args.fsync,
            prefix="freeze-",
            settings=settings,
        )
        for r in reps.members:
            r.env["PYTHONFAULTHANDLER"] = "1"
            if args.perturb:
                r.env["GLIBC_TUNABLES"] = PERTURB
        out = Outcome()
        tallies = {r.id: Tally() for r in reps.members}
        stop = asyncio.Event()
        clients: list[asyncio.Task[None]] = []
        try:
            await asyncio.to_thread(reps.start)
            clients = [
                asyncio.create_task(
                    _paced_client(r.url, args.rate, tallies[r.id], stop, keep_alive=args.keep_alive)
                )
                for r in reps.members
            ]
            t0 = time.perf_counter()
            await _cycles(args, reps, data, out)
            stop.set()
            await asyncio.wait(clients, timeout=150)
            left = await _recovered(reps, RECOVER_S)
            wall = time.perf_counter() - t0
        finally:
            stop.set()
            for task in clients:
                task.cancel()
            codes = await asyncio.to_thread(reps.stop)
            stub.stop()
        counts = _stderr_counts(reps)
        ok, verify_out = await asyncio.to_thread(verify_table, dsn)
        by_file = await asyncio.to_thread(verify_table_by_file, dsn, tmp)
        rows = await asyncio.to_thread(table_receipts, dsn)
    return _summary(args, out, tallies, rows, counts, codes, ok, verify_out, by_file, left, wall)


def _summary(
    args: argparse.Namespace,
    out: Outcome,
    tallies: dict[str, Tally],
    rows: dict[str, list[tuple[int, bytes]]],
    counts: dict[str, tuple[int, int, int]],
    codes: dict[str, int],
    verified: bool,
    verify_out: str,
    by_file: dict[str, tuple[bool, str]],
    left: list[str],
    wall: float,
) -> tuple[list[str], bool]:
    lines = [
        f"cycles: {out.cycles} (each: every PostgreSQL process SIGSTOPped {args.freeze_s:g} s,"
        " then SIGCONT)",
        f"replicas: {args.replicas}, fsync {args.fsync}, {args.rate:g} req/s each"
        f" ({'keep-alive' if args.keep_alive else 'a new connection per request'}"
        f"{', glibc malloc perturb' if args.perturb else ''}"
        f"{'' if args.daily_usd is None else f', shared budget {args.daily_usd:g} USD/day'});"
        f" {wall:.0f} s of cycles",
        f"crashes: {len(out.crashes)}" + (f" ({'; '.join(out.crashes)})" if out.crashes else ""),
    ]
    faults = sum(c[0] for c in counts.values())
    warnings = sum(c[1] for c in counts.values())
    tracebacks = sum(c[2] for c in counts.values())
    lines.append(f"fault-handler lines in stderr: {faults}")
    lines.append(f"'{_CANCEL_FAILED}' warnings: {warnings}")
    lines.append(f"tracebacks in stderr: {tracebacks}")
    lines.append(f"exit codes at SIGTERM: {codes}")
    requests = receipts = 0
    held = not out.crashes and not faults and not left and not any(codes.values())
    for rid, tally in tallies.items():
        n = sum(1 for _, line in rows.get(rid, []) if "kind" not in json.loads(line))
        requests += tally.answered
        receipts += n
        held = held and n == tally.answered
        lines.append(
            f"{rid}: {tally.answered:,} requests answered {dict(sorted(tally.statuses.items()))},"
            f" {n:,} request receipts in the table, {tally.errors} client connection errors"
            + ("" if n == tally.answered else " (MISMATCH)")
        )
    bad = {r: why for r, (good, why) in by_file.items() if not good}
    held = held and verified and not bad
    lines.append(f"requests answered: {requests:,}; request receipts: {receipts:,}")
    lines.append(
        f"`firstpass receipts verify --dsn-env`: {'ok' if verified else 'FAILED'};"
        f" file verifier per chain: {bad or 'ok'}"
    )
    if out.unrecovered or left:
        lines.append(f"not recovered in {RECOVER_S:g} s: {out.unrecovered + left}")
    if not verified:
        lines.append("verify output: " + verify_out[-500:])
    lines.append(f"result: {'CLEAN' if held else 'NOT CLEAN'}")
    return lines, held


def _code_under_test() -> str:
    import firstpass

    return str(Path(firstpass.__file__).resolve().parent)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=30)
    p.add_argument("--replicas", type=int, default=3)
    p.add_argument("--freeze-s", type=float, default=7.0, help="past the writer's 5 s timeout")
    p.add_argument("--pause-s", type=float, default=1.0, help="healthy traffic between freezes")
    p.add_argument("--rate", type=float, default=100.0, help="requests per second per replica")
    p.add_argument("--fsync", default="batch", choices=["batch", "durable", "always", "never"])
    p.add_argument("--keep-alive", action="store_true", help="one connection per client")
    p.add_argument(
        "--daily-usd", type=float, default=None, help="a shared daily budget (in the database)"
    )
    p.add_argument("--perturb", action="store_true", help="freed memory overwritten (glibc)")
    p.add_argument("--note", default="", help="a line for the results file")
    p.add_argument("--no-write", action="store_true")
    args = p.parse_args(argv)
    print(f"code under test: {_code_under_test()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="firstpass-freeze-") as tmp:
        lines, held = asyncio.run(_run(args, Path(tmp)))
    for line in lines:
        print(line)
    if not args.no_write:
        _write(args, argv, lines)
    return 0 if held else 1


def _write(args: argparse.Namespace, argv: Sequence[str] | None, lines: list[str]) -> None:
    shown = shlex.join(
        ["python", "-m", "benchmarks.pg_freeze", *(sys.argv[1:] if argv is None else argv)]
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / "pg_freeze.md"
    header = "" if path.exists() else "# PostgreSQL frozen and resumed under load\n\n"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    body = [
        f"## {stamp}" + (f": {args.note}" if args.note else ""),
        "",
        f"`{shown}`",
        "",
        f"machine: {platform.machine()}, {os.cpu_count()} cores, Python"
        f" {platform.python_version()}; code under test: {_code_under_test()}",
        "",
        "```",
        *lines,
        "```",
        "",
    ]
    with path.open("a") as f:
        f.write(header + "\n".join(body) + "\n")


if __name__ == "__main__":
    raise SystemExit(main())
