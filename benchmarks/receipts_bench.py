"""Receipt log numbers: writer throughput and write() latency, and how fast a chain verifies.

    python benchmarks/receipts_bench.py        # 20,000 writes per policy, 1M-line verify
    python benchmarks/receipts_bench.py --writes 5000 --verify-lines 100000

Writer: a realistic cascade receipt (~2 KB of canonical JSON: two upstream calls, four checks)
written by 32 coroutines that yield after each write, as request handlers do; throughput is
receipts per second from the first write() to close() returning (all on disk), latency is each
``await write()`` alone (validation + encoding + enqueue, on the event loop). Verify: a log of
N such receipts with distinct ids, built with the writer's own linking code, then verified by
``verify_chain`` (the default byte-level check) and, on a slice, with ``strict=True``, and
scanned by ``verify_checkpoints`` (``--pubkey``: it parses checkpoint lines only). Checkpoints:
what making one signed checkpoint costs the writer thread, and verifying it (3 runs, ranges).
Prints markdown tables.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from firstpass.receipts import (
    GENESIS_HASH,
    CheckpointSigner,
    KeyFiles,
    ReceiptWriter,
    load_public_key,
    new_receipt_id,
    verify_chain,
    verify_checkpoints,
    write_key_files,
)
from firstpass.receipts._canonical import EncodedRecord, encode_record
from firstpass.receipts._chain import link


def receipt(i: int) -> dict[str, Any]:
    """A cascade receipt as the pipeline writes one: escalated once, verified on rung 1."""
    return {
        "id": new_receipt_id(),
        "time": "2026-11-30T01:02:03.456Z",
        "mode": "cascade",
        "route": "code",
        "config_digest": "sha256:" + "c" * 64,
        "firstpass_version": "0.1.0",
        "request": {
            "model": "code",
            "prompt_sha256": "sha256:" + "d" * 64,
            "n_messages": 2,
            "n_visible": 1,
            "n_hidden": 12,
            "stream": False,
            "task_id": f"mbpp/{i % 500}",
        },
        "upstream_calls": [
            {
                "rung": rung,
                "provider": "replay",
                "model": model,
                "purpose": "attempt",
                "n": 1,
                "calls": 1,
                "attempts": 1,
                "status": 200,
                "input_tokens": 180,
                "output_tokens": 95,
                "cost_usd": cost,
                "latency_ms": 12.3 + rung,
                "error": None,
            }
            for rung, model, cost in ((0, "demo-cheap", 0.0001), (1, "demo-big", 0.0021))
        ],
        "checks": [
            {
                "rung": rung,
                "sample": 0,
                "kind": kind,
                "passed": passed,
                "n_passed": n_passed,
                "n_total": n_total,
                "category": None if passed else "assertion_failed",
                "isolation": "netns+uid",
                "ms": 21.0,
            }
            for rung, kind, passed, n_passed, n_total in (
                (0, "visible", True, 1, 1),
                (0, "gate", False, 9, 12),
                (1, "visible", True, 1, 1),
                (1, "gate", True, 12, 12),
            )
        ],
        "decision": {
            "action": "escalated",
            "steps": [
                "call:0",
                "visible:0:pass",
                "gate:0:fail",
                "call:1",
                "visible:1:pass",
                "gate:1:pass",
            ],
            "counterfactual": None,
            "gate_label": None,
        },
        "probe": None,
        "served": {
            "rung": 1,
            "provider": "replay",
            "model": "demo-big",
            "answer_sha256": "sha256:" + "e" * 64,
            "verification": "verified",
        },
        "cost": {"total_usd": 0.0022, "top_rung_usd": 0.0021, "probe_usd": 0.0},
        "timings_ms": {"total": 80.1, "upstream": 25.6, "sandbox": 50.2, "overhead": 4.3},
        "error": None,
    }


async def bench_writer(path: Path, policy: str, n: int, producers: int) -> dict[str, float]:
    """``producers`` coroutines share ``n`` writes, yielding to the loop after each one the way
    request handlers do, so the writer drains while they produce."""
    records = [receipt(i) for i in range(n)]
    latencies: list[float] = []
    writer = ReceiptWriter(path, fsync=policy)  # type: ignore[arg-type]
    await writer.start()
    clock = time.perf_counter

    async def produce(chunk: list[dict[str, Any]]) -> None:
        for record in chunk:
            t0 = clock()
            await writer.write(record)
            latencies.append(clock() - t0)
            await asyncio.sleep(0)

    started = clock()
    await asyncio.gather(*(produce(records[i::producers]) for i in range(producers)))
    await writer.close()
    elapsed = clock() - started
    stats = writer.stats
    assert stats.written == n, stats
    report = await asyncio.to_thread(verify_chain, path)
    assert report.ok and report.n_lines == n, report
    latencies.sort()
    return {
        "per_s": n / elapsed,
        "p50_us": statistics.median(latencies) * 1e6,
        "p99_us": latencies[int(0.99 * (n - 1))] * 1e6,
        "batches": stats.batches,
        "fsyncs": stats.fsyncs,
        "bytes_per_line": stats.bytes / n,
        "queue_full": stats.queue_full,
    }


def bench_durable(root: Path, n: int, producers: int, runs: int) -> dict[str, list[float]]:
    """``durable`` against ``batch``: each run writes ``n`` receipts from ``producers``
    coroutines; in ``durable`` each ``await write()`` is the ack wait (enqueue, batch, write,
    fsync), in ``batch`` just the enqueue. Per policy: receipts/s, and the median and p99 of the
    per-write latency, one value per run."""
    out: dict[str, list[float]] = {}
    for run in range(runs):
        for policy in ("batch", "durable"):
            r = asyncio.run(bench_writer(root / f"d-{policy}-{run}.jsonl", policy, n, producers))
            for key in ("per_s", "p50_us", "p99_us", "fsyncs"):
                out.setdefault(f"{policy}:{key}", []).append(r[key])
    return out


def build_log(path: Path, n: int) -> float:
    """Write an ``n``-line chain of distinct receipts; returns the size in bytes.

    Encodes one receipt, then swaps a fresh id (same length) into its bytes for each line and
    links it with the writer's own code: the file is what the writer would have written.
    """
    template = encode_record(receipt(0))
    id_at = template.data.index(f'"id":"{template.id}"'.encode()) + len('"id":"')
    data = bytearray(template.data)
    prev = GENESIS_HASH
    size = 0
    with open(path, "wb", buffering=1 << 20) as fh:
        for _ in range(n):
            data[id_at : id_at + len(template.id)] = new_receipt_id().encode()
            record = EncodedRecord(
                id="", data=bytes(data), prev_at=template.prev_at, hash_at=template.hash_at
            )
            line, prev = link(record, prev)
            fh.write(line)
            size += len(line)
    return size


def bench_checkpoints(root: Path, keys: KeyFiles, n: int, runs: int) -> list[dict[str, float]]:
    """What one signed checkpoint costs: making it (canonical JSON of the signed fields, one
    Ed25519 signature, base64), as the writer thread does, and checking it in a log of ``n``
    checkpoints with ``verify_checkpoints`` (which parses checkpoint lines only)."""
    signer = CheckpointSigner.from_file(keys.private, interval_s=60.0)
    public = load_public_key(keys.public)
    out = []
    for run in range(runs):
        head = GENESIS_HASH
        clock = time.perf_counter
        lines = []
        t0 = clock()
        for _ in range(n):
            record = signer.checkpoint(head)
            line, head = link(encode_record(record), head)
            lines.append(line)
        made = clock() - t0
        t0 = clock()
        for _ in range(n):
            signer.checkpoint(head)
        sign_only = clock() - t0
        log = root / f"checkpoints-{run}.jsonl"
        log.write_bytes(b"".join(lines))
        t0 = clock()
        report = verify_checkpoints([log], public)
        checked = clock() - t0
        assert report.ok and report.n_checkpoints == n, report
        out.append(
            {
                "sign_us": sign_only / n * 1e6,
                "line_us": made / n * 1e6,
                "verify_us": checked / n * 1e6,
            }
        )
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--writes", type=int, default=20_000, help="receipts per fsync policy")
    parser.add_argument("--producers", type=int, default=32, help="concurrent writing coroutines")
    parser.add_argument(
        "--durable-writes", type=int, default=5000, help="receipts per durable/batch run (3 runs)"
    )
    parser.add_argument("--verify-lines", type=int, default=1_000_000, help="lines to verify")
    parser.add_argument("--strict-lines", type=int, default=100_000, help="lines for strict")
    parser.add_argument(
        "--checkpoints", type=int, default=2000, help="signed checkpoints per run (3 runs)"
    )
    parser.add_argument("--dir", type=Path, default=None, help="scratch directory (default: tmp)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        root = Path(scratch)
        print(f"# Receipts benchmark ({os.cpu_count()} cores, Python {sys.version.split()[0]})\n")
        print(
            "| writer fsync | receipts/s | write() p50 µs | write() p99 µs | batches | fsyncs "
            "| bytes/line |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|")
        for policy in ("never", "batch", "always"):
            r = asyncio.run(
                bench_writer(root / f"w-{policy}.jsonl", policy, args.writes, args.producers)
            )
            print(
                f"| {policy} | {r['per_s']:,.0f} | {r['p50_us']:.1f} | {r['p99_us']:.1f} "
                f"| {r['batches']:,} | {r['fsyncs']:,} | {r['bytes_per_line']:,.0f} |"
            )

        if args.durable_writes:
            runs_d = bench_durable(root, args.durable_writes, args.producers, 3)
            print(
                f'\nDurable (`fsync = "durable"`: write() returns once fsynced) against batch,'
                f" {args.durable_writes:,} writes by {args.producers} coroutines, 3 runs"
                " (min–max of the runs; p50/p99 are each run's median/p99 write() wait):\n"
            )
            print("| fsync | receipts/s | write() p50 µs | write() p99 µs | fsyncs |")
            print("|---|---:|---:|---:|---:|")
            for policy in ("batch", "durable"):
                cells = []
                for key, fmt in (
                    ("per_s", "{:,.0f}"),
                    ("p50_us", "{:,.1f}"),
                    ("p99_us", "{:,.1f}"),
                    ("fsyncs", "{:,.0f}"),
                ):
                    values = runs_d[f"{policy}:{key}"]
                    cells.append(f"{fmt.format(min(values))}–{fmt.format(max(values))}")
                print(f"| {policy} | " + " | ".join(cells) + " |")

        keys = write_key_files(root / "bench-signing.key")
        if args.checkpoints:
            runs = bench_checkpoints(root, keys, args.checkpoints, 3)
            print(
                f"\nSigned checkpoints ({args.checkpoints:,} per run, 3 runs; made in the writer"
                " thread, off the request path):\n"
            )
            print("| per checkpoint | min µs | max µs |")
            print("|---|---:|---:|")
            for key, label in (
                ("sign_us", "make the record (canonical JSON + Ed25519 sign + base64)"),
                ("line_us", "... and encode and link it into the chain"),
                ("verify_us", "verify it (`verify_checkpoints`, parse + verify)"),
            ):
                values = [r[key] for r in runs]
                print(f"| {label} | {min(values):.1f} | {max(values):.1f} |")

        log = root / "verify.jsonl"
        t0 = time.perf_counter()
        size = build_log(log, args.verify_lines)
        built = time.perf_counter() - t0
        print(f"\nBuilt a {args.verify_lines:,}-line log ({size / 1e9:.2f} GB) in {built:.1f} s.\n")
        print("| verify | lines | seconds | lines/s | MB/s |")
        print("|---|---:|---:|---:|---:|")
        t0 = time.perf_counter()
        report = verify_chain(log)
        elapsed = time.perf_counter() - t0
        assert report.ok and report.n_lines == args.verify_lines, report
        print(
            f"| default (byte-level) | {report.n_lines:,} | {elapsed:.2f} "
            f"| {report.n_lines / elapsed:,.0f} | {size / elapsed / 1e6:,.0f} |"
        )
        t0 = time.perf_counter()
        signatures = verify_checkpoints([log], load_public_key(keys.public))
        elapsed = time.perf_counter() - t0
        assert signatures.n_lines == args.verify_lines, signatures
        print(
            f"| --pubkey scan (no checkpoint to check) | {signatures.n_lines:,} | {elapsed:.2f} "
            f"| {signatures.n_lines / elapsed:,.0f} | {size / elapsed / 1e6:,.0f} |"
        )
        if args.strict_lines:
            small = root / "strict.jsonl"
            with open(log, "rb") as src, open(small, "wb") as dst:
                for _, line in zip(range(args.strict_lines), src, strict=False):
                    dst.write(line)
            t0 = time.perf_counter()
            report = verify_chain(small, strict=True)
            elapsed = time.perf_counter() - t0
            assert report.ok, report
            print(
                f"| strict (parse + re-serialise) | {report.n_lines:,} | {elapsed:.2f} "
                f"| {report.n_lines / elapsed:,.0f} | {small.stat().st_size / elapsed / 1e6:,.0f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
