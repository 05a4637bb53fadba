"""The receipt writers in-process: CPU per receipt of the file sink against the PostgreSQL sink,
and what the batch INSERT's parameter format costs the client.

    python -m benchmarks.receipt_sink_bench [--n 20000] [--runs 3] [--dsn-env VAR] [--out FILE]

Part 1 queues ``--n`` receipts of about 2 KB (the pipeline's size) as concurrent requests would
(``enqueue``, fsync policy ``batch``) into a ``ReceiptWriter`` on a file and into a
``PostgresReceiptWriter`` on the table, and reports the process CPU (user + system) per receipt
until ``close()`` returns, median and range over ``--runs``, the configurations interleaved.
PostgreSQL's own CPU is not in it (``benchmarks/replicas.py`` measures that end to end).

Part 2 inserts the same rows with ``firstpass.db._rows.INSERT_ROWS`` (binary parameters, what
the sink uses) and with the same statement with text parameters, and reports the client CPU
per row: why the sink sends binary.

PostgreSQL: a throwaway server (``benchmarks.replicas.local_pg``), or ``--dsn-env VAR`` naming a
variable holding the DSN of a server you run (rows are added under ``bench-*`` and deleted).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from firstpass.db import PostgresReceiptWriter, migrate
from firstpass.db._rows import INSERT_ROWS, ReceiptRow, insert_params, receipt_row
from firstpass.receipts import GENESIS_HASH, ReceiptWriter, new_receipt_id
from firstpass.receipts._canonical import encode_record
from firstpass.receipts._chain import link

#: the same statement with text parameters (psycopg escapes every array in Python)
INSERT_TEXT = INSERT_ROWS.replace("b,", "s,").replace("b::", "s::")
PAD = "x" * 1900  # with the rest of the record, about the size of a real receipt


def _record(i: int) -> dict[str, object]:
    return {
        "id": new_receipt_id(),
        "mode": "cascade",
        "time": "2026-12-03T12:00:00.000Z",
        "route": "code",
        "n": i,
        "pad": PAD,
    }


async def _write_all(writer: ReceiptWriter | PostgresReceiptWriter, n: int) -> float:
    """CPU seconds to start, enqueue ``n`` receipts in waves of 64 and close."""
    cpu = time.process_time()
    await writer.start()
    for wave in range(0, n, 64):
        await asyncio.gather(*(writer.enqueue(_record(i)) for i in range(wave, min(n, wave + 64))))
    await writer.close()
    return time.process_time() - cpu


def _rows(replica: str, n: int) -> list[ReceiptRow]:
    rows, prev = [], GENESIS_HASH
    for i in range(n):
        line, digest = link(encode_record(_record(i)), prev)
        side = {"hash": digest, "prev_hash": prev, "time": "2026-12-03T12:00:00.000Z"}
        rows.append(receipt_row(replica, i + 1, line, side))
        prev = digest
    return rows


def _insert_cpu(dsn: str, sql: str, n: int) -> float:
    """Client CPU seconds per row to insert ``n`` rows in batches of 256 with ``sql``."""
    replica = f"bench-{uuid.uuid4().hex[:8]}"
    rows = _rows(replica, n)
    with psycopg.connect(dsn, autocommit=True) as conn:
        cpu = time.process_time()
        for start in range(0, n, 256):
            conn.execute(sql, insert_params(replica, rows[start : start + 256]))
        spent = time.process_time() - cpu
        conn.execute("DELETE FROM firstpass_receipts WHERE replica = %s", (replica,))
    return spent / n


@contextmanager
def _database(dsn_env: str | None) -> Iterator[str]:
    if dsn_env is not None:
        dsn = os.environ.get(dsn_env, "").strip()
        if not dsn:
            raise SystemExit(f"skipped: {dsn_env} is not set")
        yield dsn
        return
    from benchmarks.replicas import local_pg

    with local_pg() as (dsn, _):
        yield dsn


def _stats(xs: list[float]) -> str:
    us = [x * 1e6 for x in xs]
    return f"{statistics.median(us):6.1f} µs ({min(us):.1f}-{max(us):.1f})"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=20_000, help="receipts per run")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dsn-env", default=None, metavar="VAR")
    ap.add_argument("--out", type=Path, default=None, help="also write the lines printed here")
    args = ap.parse_args(argv)
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    say(f"{os.cpu_count()} cores; {args.n:,} receipts a run; median (range) of {args.runs} runs")
    with _database(args.dsn_env) as dsn, tempfile.TemporaryDirectory() as tmp:
        asyncio.run(migrate(dsn))
        cpu: dict[str, list[float]] = {"file": [], "postgresql": []}
        makers: dict[str, Callable[[int], ReceiptWriter | PostgresReceiptWriter]] = {
            "file": lambda r: ReceiptWriter(Path(tmp) / f"f{r}.jsonl"),
            "postgresql": lambda r: PostgresReceiptWriter(
                dsn, replica=f"bench-{uuid.uuid4().hex[:8]}", spill_path=Path(tmp) / f"s{r}"
            ),
        }
        for run in range(args.runs):
            for name, make in makers.items():
                cpu[name].append(asyncio.run(_write_all(make(run), args.n)) / args.n)
        say("writer CPU per receipt (this process, enqueue to close):")
        for name, xs in cpu.items():
            say(f"  {name:<11}{_stats(xs)}")
        say(
            "  postgresql/file "
            f"{statistics.median(cpu['postgresql']) / statistics.median(cpu['file']):.2f}x"
        )
        n = min(args.n, 10_000)
        fmt = {"binary (the sink)": INSERT_ROWS, "text": INSERT_TEXT}
        per_row: dict[str, list[float]] = {name: [] for name in fmt}
        for _ in range(args.runs):
            for name, sql in fmt.items():
                per_row[name].append(_insert_cpu(dsn, sql, n))
        say(f"batch INSERT, client CPU per row ({n:,} rows of ~2 KB, 256 a statement):")
        for name, xs in per_row.items():
            say(f"  {name:<18}{_stats(xs)}")
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DELETE FROM firstpass_receipts WHERE replica LIKE 'bench-%'")
            conn.execute("DELETE FROM firstpass_replicas WHERE replica LIKE 'bench-%'")
    if args.out is not None:
        body = "\n".join(lines)
        args.out.write_text(
            "# Receipt writers in-process: file against PostgreSQL\n\n"
            f"`python -m benchmarks.receipt_sink_bench --n {args.n} --runs {args.runs}`\n\n"
            f"```\n{body}\n```\n",
            encoding="utf-8",
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
