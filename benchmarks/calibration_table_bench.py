"""Calibration from PostgreSQL against calibration from the file: the same receipts both ways.

    FIRSTPASS_DSN=postgresql://... python -m benchmarks.calibration_table_bench [--n 1000000]
        [--runs 3] [--dsn-env FIRSTPASS_DSN] [--dir SCRATCH]

Writes N shadow receipts (``calibration_bench.write_receipts``: ~2.6 KB each, the pipeline's
shape) into a file chain, imports it into ``firstpass_receipts`` as a fresh replica
(``bench-<random>``, deleted afterwards), then times, median over ``--runs``: the chain check
(``verify_chain`` on the file, ``verify_replica`` on the table) and ``python -m firstpass.calibration``
in a fresh process (``--receipts LOG`` against ``--dsn-env VAR --replica ID``). Both
calibrations must give the same λ. Without the DSN variable it says so and exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.calibration_bench import write_receipts
from firstpass.db import migrate
from firstpass.db._chains import connect, list_chains, verify_replica
from firstpass.db._transfer import import_chain, plan_import
from firstpass.receipts import verify_chain


@dataclass(frozen=True)
class Timed:
    """Wall seconds over the runs: the median and the range."""

    median: float
    lo: float
    hi: float

    def __str__(self) -> str:
        return f"{self.median:.2f} s ({self.lo:.2f}-{self.hi:.2f})"


def _median(fn: Callable[[], Any], runs: int) -> tuple[Timed, Any]:
    walls, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()
        walls.append(time.perf_counter() - t0)
    return Timed(statistics.median(walls), min(walls), max(walls)), result


def _calibrate_cli(source: list[str], out: Path, env: dict[str, str]) -> dict[str, Any]:
    """``python -m firstpass.calibration SOURCE --out OUT`` in a fresh process; the calibration JSON."""
    out.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "firstpass.calibration", *source, "--out", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, env=env)
    doc: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="shadow receipts (default 1M)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--dsn-env", default="FIRSTPASS_DSN", metavar="VAR")
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: tmp)")
    ap.add_argument("--out", type=Path, default=None, help="also write the lines printed here")
    args = ap.parse_args(argv)
    lines: list[str] = []

    def say(text: str) -> None:
        print(text, flush=True)
        lines.append(text)

    dsn = os.environ.get(args.dsn_env, "").strip()
    if not dsn:
        print(f"skipped: set {args.dsn_env} to a PostgreSQL DSN (the bench adds a replica there)")
        return 0
    asyncio.run(migrate(dsn))
    replica = f"bench-{uuid.uuid4().hex[:8]}"
    say(f"{os.cpu_count()} cores; N = {args.n:,}; median (range) of {args.runs} runs")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        log = Path(tmp) / "receipts.jsonl"
        t0 = time.perf_counter()
        size = write_receipts(log, args.n)
        say(f"file : wrote {size / 1e9:.2f} GB in {time.perf_counter() - t0:.1f} s")
        try:
            with connect(dsn) as conn:
                t0 = time.perf_counter()
                inserted = import_chain(conn, plan_import(conn, replica, [log]))
            say(f"table: imported {inserted:,} rows in {time.perf_counter() - t0:.1f} s")
            _compare(dsn, replica, log, Path(tmp), args, say)
        finally:
            with connect(dsn) as conn:
                conn.execute("DELETE FROM firstpass_receipts WHERE replica = %s", (replica,))
    if args.out is not None:
        body = "\n".join(lines)
        args.out.write_text(
            f"# Calibration from the table against the file\n\n`python -m "
            f"benchmarks.calibration_table_bench --n {args.n} --runs {args.runs}`\n\n"
            f"```\n{body}\n```\n",
            encoding="utf-8",
        )
    return 0


def _compare(
    dsn: str,
    replica: str,
    log: Path,
    tmp: Path,
    args: argparse.Namespace,
    say: Callable[[str], None],
) -> None:
    file_verify, report = _median(lambda: verify_chain(log), args.runs)
    assert report.ok and report.n_lines == args.n, report

    def table_verify() -> Any:
        with connect(dsn) as conn:
            return verify_replica(conn, list_chains(conn, [replica])[0])

    table_verify_s, result = _median(table_verify, args.runs)
    assert result.ok and result.report.head == report.head, result
    env = {**os.environ, args.dsn_env: dsn}
    out = tmp / "calibration.json"
    file_cal, file_doc = _median(
        lambda: _calibrate_cli(["--receipts", str(log)], out, env), args.runs
    )
    table_src = ["--dsn-env", args.dsn_env, "--replica", replica]
    table_cal, table_doc = _median(lambda: _calibrate_cli(table_src, out, env), args.runs)
    assert file_doc["lambda"] == table_doc["lambda"], (file_doc["lambda"], table_doc["lambda"])
    assert file_doc["source"]["chain_heads"] == table_doc["source"]["chain_heads"]
    per = 1e6 / args.n
    say(f"{'':28}{'file':>22}{'table':>22}{'table/file':>12}")
    for name, a, b in (
        ("verify the chain", file_verify, table_verify_s),
        ("calibrate (CLI, fresh proc)", file_cal, table_cal),
    ):
        say(f"{name:28}{a!s:>22}{b!s:>22}{b.median / a.median:11.2f}x")
    say(
        f"calibrate per receipt: file {file_cal.median * per:.1f} µs, table "
        f"{table_cal.median * per:.1f} µs; λ̂ = {table_doc['lambda']} both ways"
    )


if __name__ == "__main__":
    sys.exit(main())
