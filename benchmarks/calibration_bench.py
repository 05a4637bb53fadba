"""How long calibration takes on large inputs: parse and calibrate timed separately.

    python benchmarks/calibration_bench.py [--rows 1000000] [--runs 3] [--receipts 100000]

Writes a synthetic study file (k = 5, a realistic regime mix) to a temp dir, then prints the
median over ``--runs`` of: reading and validating it (``read_study``), and calibrating it
(``calibrate``: per-level counts, LTT, regimes, AUCs). With ``--receipts N`` it also times
reading N hash-chained shadow receipts, chain verification included. Target: 1,000,000 study
rows in ≤ 5 s in total on the 2-core reference machine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from calibration import Settings, calibrate, read_receipts, read_study

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


def _canonical(record: dict[str, object]) -> bytes:
    return json.dumps(record, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def write_receipts(path: Path, rows: int, seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    c = rng.choice(6, size=rows, p=SHARE)
    label = rng.random(rows) >= np.asarray(FAIL)[c]
    prev = "sha256:" + "0" * 64
    with path.open("w", encoding="utf-8") as fh:
        for i, (ci, li) in enumerate(zip(c.tolist(), label.tolist(), strict=True)):
            record = {
                "mode": "shadow",
                "id": f"rcpt_{i:026d}",
                "route": "code",
                "probe": {"k": 5, "pass_count": ci, "regime": "gate"},
                "decision": {"action": "serve", "gate_label": li},
                "prev_hash": prev,
            }
            record["hash"] = prev = "sha256:" + hashlib.sha256(_canonical(record)).hexdigest()
            fh.write(_canonical(record).decode() + "\n")  # the proxy writes canonical lines


def _median_seconds(fn: object, runs: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs):
        t0 = time.perf_counter()
        result = fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--receipts", type=int, default=0, help="also time N shadow receipts")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        study = Path(tmp) / "study.jsonl"
        write_study(study, args.rows)
        size_mb = study.stat().st_size / 1e6
        parse_s, data = _median_seconds(lambda: read_study(study), args.runs)
        fit_s, cal = _median_seconds(lambda: calibrate(data, Settings()), args.runs)  # type: ignore[arg-type]
        crc_s, _ = _median_seconds(lambda: calibrate(data, Settings(method="crc")), args.runs)  # type: ignore[arg-type]
        print(f"study rows: {args.rows:,} ({size_mb:.1f} MB), median of {args.runs} runs")
        print(f"  parse + validate : {parse_s:6.2f} s")
        print(f"  calibrate (ltt)  : {fit_s:6.2f} s   λ̂ = {cal.overall.lam_label}")  # type: ignore[attr-defined]
        print(f"  calibrate (crc)  : {crc_s:6.2f} s")
        print(f"  total (ltt)      : {parse_s + fit_s:6.2f} s   (target ≤ 5 s)")
        if args.receipts:
            log = Path(tmp) / "receipts.jsonl"
            write_receipts(log, args.receipts)
            rec_s, _ = _median_seconds(lambda: read_receipts([log]), args.runs)
            print(
                f"receipts: {args.receipts:,} shadow receipts, read + chain verified: "
                f"{rec_s:6.2f} s ({1e6 * rec_s / args.receipts:.1f} µs/receipt)"
            )


if __name__ == "__main__":
    main()
