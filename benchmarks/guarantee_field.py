"""The guarantee in the field (issue 25): calibrate, enforce with audits, shift, revoke.

Everything that touches a request goes through the real server (``firstpass.server``'s aiohttp
app on loopback, the real sandbox, the real ``openai`` SDK) with a scripted stub upstream whose
task mixture is known (``benchmarks._guarantee_traffic``), so the true failure rate among skips
is known exactly:

1. **Calibrate on shadow traffic**: a shadow run at 4% hard tasks, then the real
   ``firstpass calibrate --receipts LOG --out cal.json --alpha A --delta D``.
2. **Shift 4% → 12% under enforce with audits**: audited requests until the licence monitor
   revokes the licence (median, 90th percentile over repetitions). Revocation is driven by
   audited labels only, so runs at ``audit_rate = 1.0`` measure "audited requests until
   revocation" directly; at rate r the same count takes about 1/r times the requests.
3. **No shift** (4%, and a stream whose true rate is exactly α): the share of repetitions
   revoked within a horizon, a few through the server and many through the monitor's own
   simulation entry (``firstpass.monitor.simulate_revocation``), with Clopper–Pearson CIs:
   it must not exceed the monitor's level.
4. **Repeated calibration** under the documented workflow: ``benchmarks.recalibration_exceedance``.
5. **Cost**: gate runs per 1,000 requests at ``audit_rate = 0.05`` vs 0 (same stream, enforce,
   no shift), the server process's CPU per request with and without audits, and the monitor's
   CPU per label update.

    python -m benchmarks.guarantee_field [--reps 10] [--seed 0] [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from benchmarks._guarantee_stack import (
    Run,
    free_port,
    gate_runs,
    is_audited,
    run_stream,
    skip_outcomes,
)
from benchmarks._guarantee_traffic import Mixture, Traffic, true_rate_among_skips
from benchmarks._report import RESULTS, add_output_flags, command_line, header, pct, publish
from firstpass.calibration.stats import clopper_pearson
from firstpass.cli import main as firstpass_main

__all__ = ["ALPHA", "DELTA", "K", "main"]

K = 5
#: the promise calibrated: at most 8% of skipped answers fail the gate, with confidence 1 − δ
ALPHA = 0.08
DELTA = 0.05
#: the calibration stream (4% hard tasks: a true rate among skips at λ = 1 of 5%), the shifted
#: deployment (12%: 15%), and a stream whose true rate at λ = 1 is exactly α
CALIBRATED = Mixture(hard=0.04)
SHIFTED = Mixture(hard=0.12)
AT_ALPHA = CALIBRATED.with_rate_at_full_pass(ALPHA)
#: the audit rate the cost rows compare with 0 (the documented default)
AUDIT_RATE = 0.05


@dataclass(frozen=True, kw_only=True)
class Settings:
    """How much each part runs (``--quick`` shrinks everything but keeps every part)."""

    shadow: int
    shift_reps: int
    shift_horizon: int
    server_reps: int
    server_horizon: int
    sim_reps: int
    cost_requests: int
    monitor_updates: int
    recal_reps: int


def settings(args: argparse.Namespace) -> Settings:
    if args.quick:
        return Settings(
            shadow=600,
            shift_reps=args.reps or 2,
            shift_horizon=600,
            server_reps=1,
            server_horizon=150,
            sim_reps=4000,
            cost_requests=200,
            monitor_updates=20_000,
            recal_reps=200,
        )
    return Settings(
        shadow=1200,
        shift_reps=args.reps or 10,
        shift_horizon=1500,
        server_reps=2,
        server_horizon=400,
        sim_reps=10_000,
        cost_requests=600,
        monitor_updates=200_000,
        recal_reps=1000,
    )


def _ci(successes: int, n: int) -> list[float]:
    lo, hi = clopper_pearson(successes, n, 0.95)
    return [float(lo), float(hi)]


def _enforce(cal: Path, audit_rate: float) -> dict[str, object]:
    return {
        "k": K,
        "escalate_at": 0,
        "mode": "enforce",
        "calibration": str(cal),
        "audit_rate": audit_rate,
    }


# -- 1. calibrate on shadow traffic ------------------------------------------------------------


def calibrate(port: int, seed: int, s: Settings, out: Path) -> dict[str, object]:
    """A shadow run at the calibrated mixture, then ``firstpass calibrate`` on its receipts."""
    traffic = Traffic(CALIBRATED, seed=f"{seed}/shadow", k=K)
    logs = out / "shadow"
    run = run_stream({"k": K, "escalate_at": 0, "mode": "shadow"}, traffic, port=port,
                     n=s.shadow, receipts_dir=logs)  # fmt: skip
    cal = out / "cal.json"
    argv = ["calibrate", "--receipts", str(logs / "receipts.jsonl"), "--out", str(cal)]
    argv += ["--alpha", str(ALPHA), "--delta", str(DELTA)]
    report = io.StringIO()
    with contextlib.redirect_stdout(report):
        code = firstpass_main(argv)
    if code != 0 or not cal.exists():
        raise SystemExit(f"firstpass calibrate failed ({code}):\n{report.getvalue()}")
    doc = json.loads(cal.read_text("utf-8"))
    certs = doc.get("certificates") or []
    if not certs:
        raise SystemExit(
            f"{s.shadow} shadow requests certified nothing at α = {ALPHA}, δ = {DELTA}: "
            f"raise the shadow count\n{report.getvalue()}"
        )
    (cert,) = certs
    lam = float(cert["lambda"])
    skipped, failures = int(cert["skipped"]), int(cert["failures"])
    tested = [lv for lv in doc.get("levels", []) if lv.get("lambda") == lam]
    looks = cert.get("looks") if isinstance(cert.get("looks"), dict) else {}
    return {
        "requests": run.sent,
        "alpha": ALPHA,
        "delta": DELTA,
        "delta_spent": looks.get("delta_spent", DELTA),
        "file": str(cal),
        "id": doc["id"],
        "lambda": lam,
        "lambda_label": doc.get("lambda_label"),
        "skips": skipped,
        "failures": failures,
        "realized_rate": failures / skipped if skipped else math.nan,
        "realized_ci": _ci(failures, skipped),
        "risk_bound": tested[0]["risk_bound"] if tested else None,
        "true_rate": true_rate_among_skips(CALIBRATED, lam, K),
        "wall_s": run.wall_s,
    }


# -- 2. shift under enforce with audits -------------------------------------------------------


def _revoked_rep(run: Run) -> dict[str, object]:
    line = run.revocation
    audited = line.get("audited") if line is not None else None
    return {
        "revoked": line is not None,
        # the pooled count the monitor decided on (the line's evidence), else the chain's count
        "audited_until": audited if isinstance(audited, int) else run.audited_before,
        "requests_sent": run.sent,
        "audited_total": sum(is_audited(r) for r in run.receipts),
        "after_revocation": run.after_revocation,
        "audited_after_revocation": run.audited_after_revocation,
        "tail": run.tail,
        "tail_licensed": run.tail_licensed,
        "level": line.get("level") if line is not None else None,
        "bound": line.get("bound") if line is not None else None,
    }


def _reps(
    port: int, cal: Path, mix: Mixture, *, name: str, seed: int, reps: int, horizon: int
) -> list[dict[str, object]]:
    out = []
    for rep in range(reps):
        traffic = Traffic(mix, seed=f"{seed}/{name}/{rep}", k=K)
        run = run_stream(_enforce(cal, 1.0), traffic, port=port, n=horizon, until_revoked=True)
        row = _revoked_rep(run)
        skipped, failed = skip_outcomes(run.receipts, traffic)
        row["served_skipped"], row["served_skipped_failed"] = skipped, failed
        out.append(row)
        print(f"  {name} rep {rep}: {row}", file=sys.stderr)
    return out


def _summary(rows: Sequence[Mapping[str, object]], level: float) -> dict[str, object]:
    revoked = [r for r in rows if r["revoked"]]
    counts = [int(r["audited_until"]) for r in revoked]  # type: ignore[call-overload]
    return {
        "reps": len(rows),
        "revoked": len(revoked),
        "revoked_share": len(revoked) / len(rows) if rows else math.nan,
        "revoked_ci": _ci(len(revoked), len(rows)),
        "audited_until_median": statistics.median(counts) if counts else None,
        "audited_until_p90": float(np.percentile(counts, 90)) if counts else None,
        "level": level,
        "rows": list(rows),
    }


def _simulate(rate: float, level: float, audits: int, reps: int, seed: int) -> dict[str, object]:
    """The monitor's own simulation entry, ``reps`` times: revoked share and delays."""
    from firstpass.monitor import simulate_revocation

    rng = np.random.default_rng(seed)
    hits = [simulate_revocation(rate, ALPHA, level, audits, rng) for _ in range(reps)]
    delays = [h for h in hits if h is not None]
    return {
        "rate": rate,
        "audits": audits,
        "reps": reps,
        "revoked": len(delays),
        "revoked_share": len(delays) / reps,
        "revoked_ci": _ci(len(delays), reps),
        "delay_median": statistics.median(delays) if delays else None,
        "delay_p90": float(np.percentile(delays, 90)) if delays else None,
    }


def _monitor_level() -> float:
    """γ: no ``monitor_level`` is set, so the monitor runs at the certificate's δ."""
    from firstpass.monitor import level_for

    return level_for(None, DELTA)


# -- 5. cost ----------------------------------------------------------------------------------


def _cost_row(port: int, cal: Path, rate: float, seed: int, n: int) -> dict[str, object]:
    traffic = Traffic(CALIBRATED, seed=f"{seed}/cost", k=K)  # the same stream for both rates
    run = run_stream(_enforce(cal, rate), traffic, port=port, n=n)
    skipped, failed = skip_outcomes(run.receipts, traffic)
    requests = len(run.receipts)
    return {
        "audit_rate": rate,
        "requests": requests,
        "gate_runs_per_1000": 1000 * sum(gate_runs(r) for r in run.receipts) / requests,
        "audited": sum(is_audited(r) for r in run.receipts),
        "served_skipped": skipped,
        "served_skipped_failed": failed,
        "cpu_ms_per_request": 1000 * run.cpu_s / requests,
        "wall_ms_per_request": 1000 * run.wall_s / requests,
    }


def monitor_update_cost(updates: int, level: float) -> dict[str, object]:
    """CPU per label update of the monitor's pure decision (a tally step, then ``decide``)."""
    from firstpass.monitor import LicenceKey, Tally, Terms, decide

    key = LicenceKey(route="code", rung=0, certificate="cal_bench")
    terms = Terms(alpha=ALPHA, level=level)
    rng = np.random.default_rng(0)
    failed = (rng.random(updates) < CALIBRATED.hard / (1 - CALIBRATED.mixed)).tolist()
    tally = Tally()
    t0 = time.process_time()
    for f in failed:
        tally = tally.add(failed=f, source="audit")
        decide(key, tally, terms, time="", replica="bench")
    cpu = time.process_time() - t0
    return {"updates": updates, "cpu_us_per_update": 1e6 * cpu / updates}


# -- 4. repeated calibration ------------------------------------------------------------------


def recalibration(reps: int, seed: int) -> dict[str, object]:
    """Exceedance of "calibrate every 100 receipts until it certifies" (true rate above α at
    every level, so any certificate is wrong), with the looks ledger (the documented workflow)
    and naive, from ``benchmarks.recalibration_exceedance``."""
    from benchmarks import recalibration_exceedance as rx

    rows: dict[str, object] = {"alpha": rx.ALPHA, "delta": rx.DELTA, "reps": reps}
    for name, ledger in (("ledger", True), ("naive", False)):
        rate = rx.run(
            f"every 100, {name}", reps, seed, lambda r, b=ledger: rx.every_100(r, ledger=b)
        )
        rows[name] = {"hits": rate.hits, "exceedance": rate.hits / rate.reps, "ci": list(rate.ci)}
    return rows


# -- the report -------------------------------------------------------------------------------


def _n(x: object, fmt: str = "{:.0f}") -> str:
    return "-" if x is None else fmt.format(x)


def render(doc: Mapping[str, object], command: str) -> str:
    cal = doc["calibration"]
    assert isinstance(cal, Mapping)
    lines = header(
        "The guarantee in the field",
        command,
        [
            f"real server + real sandbox + scripted stub upstream; k = {K}; α = {ALPHA}, "
            f"δ = {DELTA}; {doc['settings']}",
            "stream: easy (all samples pass both), hard (all pass visible, fail the gate), "
            "mixed 20% (1..k-1 pass visible, each fails the gate w.p. 0.75)",
        ],
    )
    lines += [
        "## 1. Calibrated on shadow traffic (4% hard tasks)",
        "",
        "| shadow requests | certificate | λ | skips at λ | failures | realized rate (95% CI) "
        "| LTT risk bound | δ spent (looks ledger) | true rate at λ |",
        "|---:|---|---:|---:|---:|---|---:|---:|---:|",
        f"| {cal['requests']} | {cal['id']} | {cal['lambda']:g} ({cal['lambda_label']}) | "
        f"{cal['skips']} | {cal['failures']} | {pct(cal['realized_rate'])} "
        f"({pct(cal['realized_ci'][0])} – {pct(cal['realized_ci'][1])}) | "
        f"{pct(cal['risk_bound'])} | {cal['delta_spent']:.4g} | {pct(cal['true_rate'])} |",
        "",
    ]
    shift = doc.get("shift")
    if isinstance(shift, Mapping):
        srv, sim = shift["server"], shift["simulation"]
        assert isinstance(srv, Mapping) and isinstance(sim, Mapping)
        lines += [
            f"## 2. Shift 4% → 12% hard tasks (true rate among skips {pct(shift['true_rate'])} "
            f"> α), enforce, audit_rate = 1.0",
            "",
            "Revocation is driven by audited labels only, so runs at `audit_rate = 1.0` measure "
            "audited requests until revocation directly; at `audit_rate = r` it takes about "
            "1/r times as many requests.",
            "",
            "| source | reps | revoked within horizon | audited until revocation: median | p90 |",
            "|---|---:|---:|---:|---:|",
            f"| server (horizon {shift['horizon']} requests) | {srv['reps']} | {srv['revoked']} "
            f"| {_n(srv['audited_until_median'])} | {_n(srv['audited_until_p90'])} |",
            f"| monitor simulation (horizon {sim['audits']} audits) | {sim['reps']} | "
            f"{sim['revoked']} | {_n(sim['delay_median'])} | {_n(sim['delay_p90'])} |",
            "",
        ]
        rows = srv["rows"]
        assert isinstance(rows, Sequence)
        not_revoked = sum(1 for r in rows if not r["revoked"])
        in_flight = sum(int(r["audited_after_revocation"]) for r in rows)
        tail = sum(int(r["tail"]) for r in rows)
        licensed = sum(int(r["tail_licensed"]) for r in rows)
        lines += [
            f"Not revoked within the horizon: {not_revoked} repetition(s). Of the {tail} requests "
            f"sent once the revocation line was in the chain, {tail - licensed} were gated as "
            f"uncertified ({licensed} still audited or skipped). {in_flight} audited receipt(s) "
            "follow the revocation line: requests in flight when it was decided (gated by their "
            "audit).",
            "",
        ]
    calm = doc.get("no_shift")
    if isinstance(calm, Mapping):
        lines += [
            f"## 3. No shift: share of repetitions revoked (monitor level γ = {calm['level']:g})",
            "",
            "| stream | true rate | source | reps | horizon (audits) | revoked | share (95% CI) "
            "| ≤ γ? |",
            "|---|---:|---|---:|---:|---:|---|---|",
        ]
        for row in calm["rows"]:
            lo, hi = row["revoked_ci"]
            verdict = "yes" if lo <= calm["level"] else "NO"
            lines.append(
                f"| {row['stream']} | {pct(row['true_rate'])} | {row['source']} | {row['reps']} "
                f"| {row['horizon']} | {row['revoked']} | {pct(row['revoked_share'])} "
                f"({pct(lo)} – {pct(hi)}) | {verdict} |"
            )
        lines.append("")
    recal = doc.get("recalibration")
    if isinstance(recal, Mapping):
        lines += [
            f"## 4. Repeated calibration: every 100 shadow receipts until it certifies "
            f"(α = δ = {recal['delta']:g}, every level's true rate above α)",
            "",
            "| workflow | reps | wrongly certified | exceedance (95% CI) | ≤ δ? |",
            "|---|---:|---:|---|---|",
        ]
        for name, label in (("ledger", "looks ledger (documented)"), ("naive", "naive, δ a look")):
            row = recal[name]
            assert isinstance(row, Mapping)
            lo, hi = row["ci"]
            verdict = "yes" if lo <= recal["delta"] else "NO"
            lines.append(
                f"| {label} | {recal['reps']} | {row['hits']} | {pct(row['exceedance'])} "
                f"({pct(lo)} – {pct(hi)}) | {verdict} |"
            )
        lines.append("")
    cost = doc.get("cost")
    if isinstance(cost, Mapping):
        rows = cost["rows"]
        assert isinstance(rows, Sequence)
        lines += [
            "## 5. Cost (enforce, no shift, the same stream)",
            "",
            "| audit_rate | requests | audited | gate runs / 1,000 requests | in-process CPU "
            "ms / request | wall ms / request |",
            "|---:|---:|---:|---:|---:|---:|",
        ]
        for row in rows:
            lines.append(
                f"| {row['audit_rate']:g} | {row['requests']} | {row['audited']} | "
                f"{row['gate_runs_per_1000']:.1f} | {row['cpu_ms_per_request']:.2f} | "
                f"{row['wall_ms_per_request']:.1f} |"
            )
        mon = cost.get("monitor")
        ratio = cost.get("gate_runs_ratio")
        lines += [
            "",
            f"Gate runs at audit_rate {AUDIT_RATE:g} vs 0: ×{ratio:.3f}. In-process CPU is this "
            "process's (server, stub and SDK client threads, not the sandbox's processes).",
        ]
        if isinstance(mon, Mapping):
            lines.append(
                f"Monitor CPU per label update (tally + e-process decision, "
                f"{mon['updates']} updates, time.process_time): {mon['cpu_us_per_update']:.1f} µs."
            )
        lines.append("")
    lines.append(f"Total runtime: {doc['runtime_s']:.0f} s.")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=None, help="shift repetitions (default 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quick", action="store_true", help="small counts (about 2 minutes)")
    add_output_flags(parser, md_default="benchmarks/results/guarantee_field.md")
    args = parser.parse_args(argv)
    s = settings(args)
    t0 = time.perf_counter()
    port = free_port()
    doc: dict[str, object] = {"settings": s.__dict__ | {"seed": args.seed}}
    with tempfile.TemporaryDirectory(prefix="guarantee-field-") as tmp:
        out = Path(tmp)
        cal = calibrate(port, args.seed, s, out)
        doc["calibration"] = cal
        cal_path = Path(str(cal["file"]))
        level = _monitor_level()
        lam = float(cal["lambda"])  # type: ignore[arg-type]
        shifted = true_rate_among_skips(SHIFTED, lam, K)
        rows = _reps(port, cal_path, SHIFTED, name="shift", seed=args.seed,
                     reps=s.shift_reps, horizon=s.shift_horizon)  # fmt: skip
        server = _summary(rows, level)
        sim_audits = int(s.shift_horizon * (1 - SHIFTED.mixed))
        doc["shift"] = {
            "hard_share": SHIFTED.hard,
            "true_rate": shifted,
            "horizon": s.shift_horizon,
            "server": server,
            "simulation": _simulate(shifted, level, sim_audits, s.sim_reps, args.seed),
        }
        calm_rows: list[dict[str, object]] = []
        audits = int(s.server_horizon * (1 - CALIBRATED.mixed))
        for name, mix in (("4% hard", CALIBRATED), ("rate = α", AT_ALPHA)):
            rate = true_rate_among_skips(mix, lam, K)
            reps = _reps(port, cal_path, mix, name=name, seed=args.seed,
                         reps=s.server_reps, horizon=s.server_horizon)  # fmt: skip
            summ = _summary(reps, level)
            seen = round(statistics.mean(int(r["audited_total"]) for r in reps))  # type: ignore[call-overload]
            calm_rows.append({"stream": name, "true_rate": rate, "source": "server",
                              "horizon": seen, **summ})  # fmt: skip
            sim = _simulate(rate, level, 10 * audits, s.sim_reps, args.seed + 1)
            calm_rows.append({"stream": name, "true_rate": rate, "source": "monitor simulation",
                              "horizon": 10 * audits, **sim})  # fmt: skip
        doc["no_shift"] = {"level": level, "rows": calm_rows}
        doc["recalibration"] = recalibration(s.recal_reps, args.seed)
        cost_rows = [_cost_row(port, cal_path, r, args.seed, s.cost_requests)
                     for r in (AUDIT_RATE, 0.0)]  # fmt: skip
        audited_gates, plain_gates = (float(str(r["gate_runs_per_1000"])) for r in cost_rows)
        doc["cost"] = {
            "rows": cost_rows,
            "gate_runs_ratio": audited_gates / max(plain_gates, 1e-9),
            "monitor": monitor_update_cost(s.monitor_updates, level),
        }
    doc["runtime_s"] = time.perf_counter() - t0
    md = render(doc, command_line("benchmarks.guarantee_field", argv))
    publish(args, md, RESULTS / "guarantee_field.md", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
