"""Scenario 5, a real full disk: the receipt log on a 512 KiB tmpfs, filled, then freed.

Mounting a tmpfs needs a mount namespace, which an unprivileged user gets inside a user
namespace: :func:`run_diskfull` re-executes the benchmark under
``unshare --user --map-root-user --mount``, and the inner process (:func:`inner_main`) mounts
the tmpfs, runs the stub and the proxy there, and writes its report as JSON for the outer one.
The sandbox cannot run samples inside that namespace, so verified requests use a route whose
visible check is a regex (no sandbox); pass-through requests go beside them. Receipts are
``durable``: an answer waits for its receipt, so none may be a 200 while the disk is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from benchmarks._reliability_load import Got, Mix, plan, run_clients
from benchmarks._reliability_report import Report, build_report, read_log, verify_log
from benchmarks._reliability_stack import ProxySettings, StubSettings, log_problems

__all__ = ["inner_main", "run_diskfull"]

ROOT = Path(__file__).resolve().parent.parent
DISK_BYTES = 512 * 1024
_UNSHARE = ["unshare", "--user", "--map-root-user", "--mount"]

#: verified by a regex (no sandbox), and pass-through, on the route ``rel-regex``
MIX = Mix(
    modes={"cascade": 0.7, "passthrough": 0.3},
    answers={"good": 1.0},
    stream=0.2,
    header_mode=0.0,
    model="rel-regex",
)


def unshare_permitted() -> bool:
    if shutil.which("unshare") is None:
        return False
    done = subprocess.run([*_UNSHARE, "true"], capture_output=True, timeout=30)
    return done.returncode == 0


def run_diskfull(tmp: Path, *, seed: int = 0) -> Report | None:
    """The scenario in a fresh user + mount namespace; ``None`` where unshare is refused."""
    if not unshare_permitted():
        return None
    done = subprocess.run(
        [*_UNSHARE, sys.executable, "-m", "benchmarks.reliability", "--inner-diskfull", str(tmp),
         "--seed", str(seed)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = tmp / "diskfull.json"
    if not out.exists():
        raise RuntimeError(
            f"the disk-full scenario failed (exit {done.returncode}): "
            f"{(done.stdout + done.stderr)[-3000:]}"
        )
    data = json.loads(out.read_text())
    data["problems"] = tuple(data["problems"])
    return Report(**data)


def inner_main(tmp: Path, *, seed: int = 0) -> int:
    """Inside the namespace: mount the tmpfs, run the scenario, write its report."""
    disk = tmp / "disk"
    disk.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_BYTES}", "tmpfs", str(disk)], check=True
    )
    report = asyncio.run(_scenario(tmp, disk, seed))
    (tmp / "diskfull.json").write_text(json.dumps(report.to_dict(), default=str))
    return 0


def _fill(path: Path) -> int:
    """Write ``path`` until the disk is full; the bytes written."""
    written = 0
    chunk = b"\0" * 4096
    with path.open("wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError:
                break
    return written


def _metrics(url: str) -> list[str]:
    """The receipt lines of ``/metrics`` (none if the endpoint is not there)."""
    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError as exc:
        return [f"/metrics unavailable: {exc}"]
    return [ln for ln in text.splitlines() if ln.startswith("firstpass_receipt")]


def _refused(g: Got) -> bool:
    return g.status == 503 and g.error_code == "receipts_unavailable"


async def _scenario(tmp: Path, disk: Path, seed: int) -> Report:
    from benchmarks.reliability import Stack

    settings = ProxySettings(
        receipts=disk / "receipts.jsonl", fsync="durable", visible_checks_route=True
    )
    got: list[Got] = []
    t0 = time.perf_counter()
    async with Stack(tmp, StubSettings(faults="", seed=seed), settings) as stack:
        before = await run_clients(stack.url, plan(40, MIX, seed=seed), clients=4)
        got += before
        filler = disk / "filler"
        filled = await asyncio.to_thread(_fill, filler)
        during = await run_clients(stack.url, plan(40, MIX, seed=seed + 1, start=1000), clients=4)
        got += during
        metrics_during = await asyncio.to_thread(_metrics, stack.url)
        await asyncio.to_thread(filler.unlink)
        # recovery: one request at a time until a 200, for at most 30 s
        recovered_after: float | None = None
        t_free = time.perf_counter()
        i = 0
        while time.perf_counter() - t_free < 30:
            (g,) = await run_clients(
                stack.url, plan(1, MIX, seed=seed + 2, start=2000 + i), clients=1
            )
            got.append(g)
            i += 1
            if g.status == 200:
                recovered_after = time.perf_counter() - t_free
                break
            await asyncio.sleep(0.2)
        after = await run_clients(stack.url, plan(40, MIX, seed=seed + 3, start=3000), clients=4)
        got += after
        metrics_after = await asyncio.to_thread(_metrics, stack.url)
        await stack.stop_proxy()
        wall = time.perf_counter() - t0
        log = await asyncio.to_thread(read_log, settings.receipts)
        chain = await asyncio.to_thread(verify_log, settings.receipts)
        problems_in_log = await asyncio.to_thread(log_problems, stack.stderr)
        text = stack.stderr.read_text(errors="replace")
        report = build_report(
            "diskfull", got, log, chain=chain, wall_s=wall, peak_rss_kb=stack.peak_rss_kb,
            log_problems=problems_in_log, expect_receipt_per_request=False, unreceipted=_refused,
        )  # fmt: skip
    problems = list(report.problems)
    refused = [g for g in got if _refused(g)]
    if not refused:
        problems.append("no 503 receipts_unavailable while the disk was full")
    if any(g.retry_after is None for g in refused):
        problems.append("a 503 receipts_unavailable without Retry-After")
    if any(g.status == 200 for g in during):  # durable: an answer waits for its receipt
        problems.append("answers were served while no receipt could be written")
    if recovered_after is None:
        problems.append("no 200 within 30 s of freeing the disk")
    if any(g.status != 200 for g in after):
        problems.append(f"after recovery: statuses {sorted({str(g.status) for g in after})}")
    for event in ("receipt_write_failed", "receipt_write_recovered"):
        if not re.search(rf"\b{event}\b", text):
            problems.append(f"the proxy's log has no {event} event")
    errors_metric = [
        ln for ln in metrics_after if ln.startswith("firstpass_receipt_write_errors_total")
    ]
    if not errors_metric or all(float(ln.split()[-1]) == 0 for ln in errors_metric):
        problems.append("/metrics shows no firstpass_receipt_write_errors_total > 0")
    with contextlib.suppress(OSError):
        shutil.copy(stack.stderr, tmp / "proxy-diskfull.stderr")
    extra = {
        "disk": f"tmpfs {DISK_BYTES // 1024} KiB, filler {filled} bytes",
        "before full": _statuses(before),
        "while full": _statuses(during),
        "refused 503 receipts_unavailable": len(refused),
        "recovered": f"{recovered_after:.2f} s after the filler was deleted"
        if recovered_after is not None
        else "no",
        "after recovery": _statuses(after),
        "gap markers": report.writer_lines.get("gap", 0),
        "metrics while full": metrics_during[:10],
        "metrics after": metrics_after[:10],
    }
    return replace(report, extra={**report.extra, **extra}, problems=tuple(problems))


def _statuses(got: list[Got]) -> dict[str, int]:
    out: dict[str, int] = {}
    for g in got:
        key = str(g.status) + (f" {g.error_code}" if g.error_code else "")
        out[key] = out.get(key, 0) + 1
    return out
