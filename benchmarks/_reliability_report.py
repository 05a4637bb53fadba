"""What the reliability suite checks after a run, and how it prints the figures.

Receipt lines the writer adds itself (``kind``: ``gap``, ``checkpoint``) are not requests: every
count of receipts here is of records without a ``kind`` key.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks._reliability_load import Got

__all__ = ["LogContents", "Report", "build_report", "read_log", "verify_log"]


@dataclass(frozen=True, kw_only=True)
class LogContents:
    """A receipt log split into request receipts and the writer's own lines."""

    requests: tuple[dict[str, Any], ...]
    special: tuple[dict[str, Any], ...]
    unreadable: int

    def kinds(self) -> Counter[str]:
        return Counter(str(r.get("kind")) for r in self.special)


def read_log(path: Path) -> LogContents:
    """Every line of ``path`` (and of any file the writer moved aside is not read: only the log)."""
    requests: list[dict[str, Any]] = []
    special: list[dict[str, Any]] = []
    unreadable = 0
    if path.exists():
        with path.open("rb") as f:
            for line in f:
                try:
                    obj = json.loads(line)
                except ValueError:
                    unreadable += 1
                    continue
                if not isinstance(obj, dict):
                    unreadable += 1
                elif "kind" in obj:
                    special.append(obj)
                else:
                    requests.append(obj)
    return LogContents(requests=tuple(requests), special=tuple(special), unreadable=unreadable)


def verify_log(path: Path) -> tuple[bool, str]:
    """``firstpass receipts verify PATH``, as an operator runs it: (exit 0, its output)."""
    exe = Path(sys.executable).parent / "firstpass"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "firstpass"]
    done = subprocess.run(
        [*cmd, "receipts", "verify", str(path)], capture_output=True, text=True, timeout=300
    )
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def pct(xs: Sequence[float], q: float) -> float:
    """The q-th percentile, linear interpolation (numpy's default)."""
    if not xs:
        return float("nan")
    ys = sorted(xs)
    pos = (len(ys) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


@dataclass(frozen=True, kw_only=True)
class Report:
    """The figures of one scenario and the checks that failed (``problems`` empty: it held)."""

    scenario: str
    requests: int
    answered: int
    statuses: dict[str, int]
    errors: dict[str, int]
    unanswered: dict[str, int]
    receipts: int
    writer_lines: dict[str, int]
    p50_ms: float
    p99_ms: float
    wall_s: float
    peak_rss_mb: float | None
    restarts: int
    chain: str
    log_problems: int
    stub_faults: dict[str, int] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)
    problems: tuple[str, ...] = ()

    def lines(self) -> list[str]:
        out = [
            f"== {self.scenario}",
            f"requests {self.requests}, answered {self.answered} "
            f"(no answer: {dict(self.unanswered) or 0}), wall {self.wall_s:.1f} s",
            f"statuses {dict(sorted(self.statuses.items()))}",
            f"errors by type/code {dict(sorted(self.errors.items()))}",
            f"receipts {self.receipts} (writer lines {dict(self.writer_lines) or 0}); chain: {self.chain}",
            f"latency p50 {self.p50_ms:.0f} ms, p99 {self.p99_ms:.0f} ms; peak RSS "
            + (f"{self.peak_rss_mb:.0f} MB" if self.peak_rss_mb is not None else "n/a")
            + f"; restarts {self.restarts}; log lines with an exception {self.log_problems}",
        ]
        if self.stub_faults:
            out.append(f"upstream faults injected {dict(sorted(self.stub_faults.items()))}")
        for key, value in self.extra.items():
            out.append(f"{key}: {value}")
        out.append("checks: " + ("all held" if not self.problems else "FAILED"))
        out += [f"  - {p}" for p in self.problems]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items()}


def build_report(
    scenario: str,
    got: Sequence[Got],
    log: LogContents,
    *,
    chain: tuple[bool, str],
    wall_s: float,
    peak_rss_kb: int | None,
    restarts: int = 0,
    log_problems: tuple[int, list[str]] = (0, []),
    stub_faults: dict[str, int] | None = None,
    expect_all_answered: bool = True,
    expect_receipt_per_request: bool = True,
    unreceipted: Callable[[Got], bool] | None = None,
    extra: dict[str, Any] | None = None,
) -> Report:
    """The figures, and a problem for each property that did not hold.

    Every answered request's receipt id must be in the log exactly once; with
    ``expect_receipt_per_request`` the log must also hold no request receipt beyond those (a
    crash scenario relaxes that: a request the proxy took before the kill may be receipted but
    never answered). ``unreceipted`` exempts answers that say they were not receipted (the 503
    ``receipts_unavailable`` of a full disk).
    """
    problems: list[str] = []
    answered = [g for g in got if g.answered]
    statuses = Counter(str(g.status) if g.status is not None else "none" for g in got)
    errors = Counter(f"{g.error_type}/{g.error_code}" for g in got if g.shape == "error")
    unanswered = Counter(g.failure or g.shape for g in got if not g.answered)
    ids = Counter(str(r.get("id")) for r in log.requests)
    if expect_all_answered and unanswered:
        problems.append(f"{sum(unanswered.values())} request(s) got no answer: {dict(unanswered)}")
    malformed = sum(1 for g in got if g.shape == "malformed")
    if malformed:
        problems.append(f"{malformed} response(s) neither a completion nor an OpenAI error")
    checked = [g for g in answered if unreceipted is None or not unreceipted(g)]
    no_id = [g for g in checked if g.receipt_id is None]
    if no_id:
        kinds = Counter(
            f"{g.status} {'stream' if g.planned.stream else 'json'} {g.error_code}" for g in no_id
        )
        problems.append(
            f"{len(no_id)} answer(s) without a receipt id (header or stream id): {dict(kinds)}"
        )
    missing = [
        g.receipt_id for g in checked if g.receipt_id is not None and g.receipt_id not in ids
    ]
    if missing:
        problems.append(
            f"{len(missing)} answered request(s) missing from the log, e.g. {missing[:3]}"
        )
    dup = [i for i, c in ids.items() if c > 1]
    if dup:
        problems.append(f"{len(dup)} receipt id(s) written more than once, e.g. {dup[:3]}")
    if expect_receipt_per_request and len(log.requests) != len(got):
        problems.append(f"{len(log.requests)} request receipts for {len(got)} requests")
    if log.unreadable:
        problems.append(f"{log.unreadable} unreadable log line(s)")
    if not chain[0]:
        problems.append(f"the chain does not verify: {chain[1]}")
    if log_problems[0]:
        problems.append(f"{log_problems[0]} log line(s) show an exception: {log_problems[1][:3]}")
    lat = [g.latency_ms for g in answered]
    return Report(
        scenario=scenario,
        requests=len(got),
        answered=len(answered),
        statuses=dict(statuses),
        errors=dict(errors),
        unanswered=dict(unanswered),
        receipts=len(log.requests),
        writer_lines=dict(log.kinds()),
        p50_ms=statistics.median(lat) if lat else float("nan"),
        p99_ms=pct(lat, 99),
        wall_s=wall_s,
        peak_rss_mb=peak_rss_kb / 1024 if peak_rss_kb is not None else None,
        restarts=restarts,
        chain=chain[1].splitlines()[0] if chain[1] else ("ok" if chain[0] else "failed"),
        log_problems=log_problems[0],
        stub_faults=dict(stub_faults or {}),
        extra=dict(extra or {}),
        problems=tuple(problems),
    )
