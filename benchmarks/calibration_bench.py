"""How long calibration takes on large inputs: study files, and shadow receipts end to end.

    python benchmarks/calibration_bench.py [--rows 1000000] [--receipts 1000000] [--runs 3]

Study: a synthetic study file (k = 5, a realistic regime mix); the median over ``--runs`` of
reading and validating it (``read_study``) and of calibrating it (``calibrate``).

Receipts: a log of N shadow receipts shaped as the pipeline writes them (five probe checks and
a label gate run, the probe call, the probe with its samples: ~2.6 KB each), encoded and chained
by the writer's own code (``encode_record`` + ``link``), each with its own id, c and label. Timed:
``verify_chain`` alone (the sequential check ``firstpass receipts verify`` runs), the whole
calibration in this process (``read_receipts``: chain verified and rows read in one pass by a
process pool; then ``calibrate``), and ``python -m firstpass.calibration`` end to end in a fresh process.
CPU seconds over all processes are printed too: on a loaded machine the wall time says little,
the CPU time says what the work costs. ``--compare N`` times, on the first N lines in one
process, the one-pass read against the sequential path it replaces (verify, then ``json`` for
every line). ``--log`` keeps the 2.6 GB log between runs. Target: 1,000,000 receipts calibrated
in ≤ 5 s on the 2-core reference machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest.mock import patch

import numpy as np

from firstpass.calibration import Settings, calibrate, read_receipts, read_study
from firstpass.calibration import _onepass as calibration_onepass
from firstpass.calibration import _scan as calibration_scan
from firstpass.receipts import GENESIS_HASH, sha256_text, verify_chain
from firstpass.receipts._canonical import EncodedRecord, encode_record
from firstpass.receipts._chain import link

SHARE = (0.05, 0.05, 0.05, 0.10, 0.15, 0.60)  # π_c, c = 0..5
FAIL = (0.9, 0.6, 0.3, 0.12, 0.06, 0.02)  # P(gate rejects | c)


def write_study(path: Path, rows: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    c = rng.choice(6, size=rows, p=SHARE)
    label = rng.random(rows) >= np.asarray(FAIL)[c]
    text = {True: "true", False: "false"}
    with path.open("w", encoding="utf-8") as fh:
        fh.writelines(
            f'{{"k": 5, "pass_count": {ci}, "label": {text[li]}}}\n'
            for ci, li in zip(c.tolist(), label.tolist(), strict=True)
        )


def shadow_receipt(c: int, label: bool, k: int = 5) -> dict[str, Any]:
    """A shadow receipt as the pipeline writes one for a k-sample pass-share probe."""
    regime = "escalate" if c == 0 else ("serve" if c == k else "gate")
    counterfactual = {
        "escalate": "escalate",
        "serve": "serve_without_gate",
        "gate": "serve_after_gate" if label else "escalate_after_gate",
    }[regime]
    checks = [
        {
            "rung": 0,
            "sample": s,
            "kind": "visible",
            "passed": s < c,
            "n_passed": int(s < c),
            "n_total": 1,
            "category": None if s < c else "assertion_failed",
            "isolation": "netns+uid",
            "ms": 21.3 + s,
        }
        for s in range(k)
    ]
    checks.append(
        {
            "rung": 0,
            "sample": 0,
            "kind": "gate",
            "passed": label,
            "n_passed": 12 if label else 9,
            "n_total": 12,
            "category": None if label else "assertion_failed",
            "isolation": "netns+uid",
            "ms": 48.1,
            "purpose": "label",
        }
    )
    return {
        "id": "rcpt_" + "0" * 26,
        "time": "2026-11-30T01:02:03.456Z",
        "mode": "shadow",
        "route": "code",
        "config_digest": "sha256:" + "c" * 64,
        "firstpass_version": "0.1.0",
        "request": {
            "model": "code",
            "prompt_sha256": sha256_text(f"prompt {c} {label}"),
            "n_messages": 2,
            "n_visible": 1,
            "n_hidden": 12,
            "stream": False,
            "task_id": "mbpp/17",
        },
        "upstream_calls": [
            {
                "rung": 0,
                "provider": "replay",
                "model": "demo-cheap",
                "purpose": "probe",
                "n": k,
                "calls": 1,
                "attempts": 1,
                "status": 200,
                "input_tokens": 180,
                "output_tokens": 95 * k,
                "cost_usd": 0.0005,
                "latency_ms": 312.3,
                "error": None,
            }
        ],
        "checks": checks,
        "decision": {
            "action": "served",
            "steps": ["call:0", "visible:0:pass", "gate:0:pass"],
            "counterfactual": counterfactual,
            "gate_label": label,
            "label_sample": 0,
        },
        "probe": {
            "rung": 0,
            "provider": "replay",
            "model": "demo-cheap",
            "temperature": 0.8,
            "top_p": None,
            "k": k,
            "pass_count": c,
            "regime": regime,
            "score": {"name": "pass_share", "value": c / k},
            "samples": [
                {
                    "n_passed": int(s < c),
                    "n_total": 1,
                    "category": None if s < c else "assertion_failed",
                }
                for s in range(k)
            ],
            "candidate": 0 if c else None,
            "candidate_rule": "most_shared_code",
            "lambda": 0.8,
            "escalate_at": 0,
            "max_gate_candidates": 1,
            "certificate": None,
            "uncertified_because": "route 'demo' rung 0: no certificate for it in no calibration file",
            "calibration_id": None,
            "alpha": None,
            "delta": None,
            "calls": 1,
            "cost_usd": 0.0005,
        },
        "served": {
            "rung": 0,
            "sample": 0,
            "provider": "replay",
            "model": "demo-cheap",
            "answer_sha256": sha256_text(f"answer {c}"),
            "verification": "verified",
        },
        "cost": {"total_usd": 0.0005, "top_rung_usd": 0.0021, "probe_usd": 0.0005},
        "timings_ms": {"total": 380.1, "upstream": 312.3, "sandbox": 60.2, "overhead": 67.8},
        "error": None,
    }


def write_receipts(path: Path, rows: int, seed: int = 1) -> int:
    """Write ``rows`` chained shadow receipts; returns the file size in bytes.

    One encoded template per (c, label); each line gets a fresh id of the same length swapped
    into the template's bytes, then is linked by the writer's own ``link``.
    """
    rng = np.random.default_rng(seed)
    c = rng.choice(6, size=rows, p=SHARE)
    label = rng.random(rows) >= np.asarray(FAIL)[c]
    templates = {}
    for ci in range(6):
        for li in (False, True):
            encoded = encode_record(shadow_receipt(ci, li))
            id_at = encoded.data.index(b'"id":"rcpt_') + len('"id":"')
            templates[ci, li] = (encoded, id_at)
    prev, size = GENESIS_HASH, 0
    with path.open("wb", buffering=1 << 20) as fh:
        for i, (ci, li) in enumerate(zip(c.tolist(), label.tolist(), strict=True)):
            encoded, id_at = templates[ci, li]
            data = bytearray(encoded.data)
            data[id_at + 5 : id_at + 31] = b"%026d" % i
            line, prev = link(
                EncodedRecord(
                    id="", data=bytes(data), prev_at=encoded.prev_at, hash_at=encoded.hash_at
                ),
                prev,
            )
            fh.write(line)
            size += len(line)
    return size


def _cpu() -> float:
    """CPU seconds used so far by this process and its finished children (the pool's workers)."""
    me, kids = (
        resource.getrusage(resource.RUSAGE_SELF),
        resource.getrusage(resource.RUSAGE_CHILDREN),
    )
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _median_seconds(fn: Callable[[], Any], runs: int) -> tuple[float, float, Any]:
    """Median wall seconds over ``runs`` calls, median CPU seconds (all processes), last result."""
    walls, cpus, result = [], [], None
    for _ in range(runs):
        c0, t0 = _cpu(), time.perf_counter()
        result = fn()
        walls.append(time.perf_counter() - t0)
        cpus.append(_cpu() - c0)
    return statistics.median(walls), statistics.median(cpus), result


def _cli_seconds(log: Path, runs: int) -> tuple[float, float]:
    """Median wall and CPU seconds of ``python -m firstpass.calibration --receipts LOG`` in a fresh
    process: what a user waits for, interpreter start and imports included."""
    walls, cpus = [], []
    with tempfile.TemporaryDirectory() as out:
        cmd = [
            sys.executable,
            "-m",
            "firstpass.calibration",
            "--receipts",
            str(log),
            "--out",
            str(Path(out) / "calibration.json"),
        ]
        for _ in range(runs):
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, capture_output=True)
            walls.append(time.perf_counter() - t0)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="study rows (0: skip)")
    ap.add_argument("--receipts", type=int, default=1_000_000, help="shadow receipts (0: skip)")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument(
        "--compare", type=int, default=0, help="also time the sequential path on N lines"
    )
    ap.add_argument("--dir", type=Path, default=None, help="scratch directory (default: tmp)")
    ap.add_argument(
        "--log", type=Path, default=None, help="reuse this receipt log (written if absent)"
    )
    args = ap.parse_args()
    print(
        f"{os.cpu_count()} cores; median of {args.runs} runs; load average at start "
        f"{os.getloadavg()[0]:.2f}"
    )
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        if args.rows:
            study = Path(tmp) / "study.jsonl"
            write_study(study, args.rows)
            size_mb = study.stat().st_size / 1e6
            parse_s, _, data = _median_seconds(lambda: read_study(study), args.runs)
            fit_s, _, cal = _median_seconds(lambda: calibrate(data, Settings()), args.runs)
            crc_s, _, _ = _median_seconds(
                lambda: calibrate(data, Settings(method="crc")), args.runs
            )
            print(f"study rows: {args.rows:,} ({size_mb:.1f} MB)")
            print(f"  parse + validate : {parse_s:6.2f} s")
            print(f"  calibrate (ltt)  : {fit_s:6.2f} s   λ̂ = {cal.overall.lam_label}")
            print(f"  calibrate (crc)  : {crc_s:6.2f} s")
            print(f"  total (ltt)      : {parse_s + fit_s:6.2f} s   (target ≤ 5 s)")
        if args.receipts:
            n = args.receipts
            log = args.log or Path(tmp) / "receipts.jsonl"
            if not log.exists():
                t0 = time.perf_counter()
                write_receipts(log, n)
                print(f"receipts: wrote {n:,} shadow receipts in {time.perf_counter() - t0:.0f} s")
            size = log.stat().st_size
            print(f"receipts: {n:,} shadow receipts, {size / 1e9:.2f} GB ({size / n:,.0f} B each)")
            verify_s, _, report = _median_seconds(lambda: verify_chain(log), args.runs)
            assert report.ok and report.n_lines == n, report

            def end_to_end() -> Any:
                labelled = read_receipts([log])
                return labelled, calibrate(labelled, Settings())

            total_s, total_cpu, (labelled, cal) = _median_seconds(end_to_end, args.runs)
            assert labelled.n == n and labelled.source.verified
            cli_s, cli_cpu = _cli_seconds(log, args.runs)
            print(f"  verify_chain alone (sequential) : {verify_s:6.2f} s")
            print(
                f"  read_receipts + calibrate       : {total_s:6.2f} s "
                f"({1e6 * total_s / n:.1f} µs/receipt; CPU {total_cpu:.1f} s over all processes)"
                f"   λ̂ = {cal.overall.lam_label}   (target ≤ 5 s)"
            )
            print(
                f"  python -m firstpass.calibration (CLI)     : {cli_s:6.2f} s "
                f"(fresh process, imports included; CPU {cli_cpu:.1f} s)"
            )
            if args.compare:
                _compare(log, min(args.compare, n), args.runs)
    print(f"load average at end {os.getloadavg()[0]:.2f}")


def _compare(log: Path, lines: int, runs: int) -> None:
    """Per-receipt cost on the first ``lines`` lines, in one process: the one-pass read, and
    the sequential path (``verify_chain``, then ``json`` for every line) it replaces."""
    part = log.with_name("part.jsonl")
    with log.open("rb") as src, part.open("wb") as dst:
        for _, line in zip(range(lines), src, strict=False):
            dst.write(line)
    gives_up = calibration_scan.Span(lines=0, chain_ok=False)
    with patch.object(calibration_onepass, "PARALLEL_BYTES", 1 << 62):  # one process for both
        fast_s, _, _ = _median_seconds(lambda: read_receipts([part]), runs)
        # the one pass gives up (as on a line it cannot vouch for): verify_chain, then json
        with patch.object(calibration_onepass, "scan_span", lambda *a: gives_up):
            slow_s, _, _ = _median_seconds(lambda: read_receipts([part]), runs)
    print(
        f"  first {lines:,} lines, one process: one pass {1e6 * fast_s / lines:.1f} µs/receipt, "
        f"verify + full parse {1e6 * slow_s / lines:.1f} µs/receipt"
    )


if __name__ == "__main__":
    main()
