"""The reliability suite: the real proxy under load with upstream faults, killed mid-load, beside
hostile samples, and with its receipt disk full. Loopback only, bounded in count and time.

Each scenario runs the stub upstream (``python -m tests.stub_upstream`` with a seeded fault mix)
and the proxy (``firstpass serve --config <tmp toml>``) as their own processes and checks, from
the outside, what a user and an auditor can see: every request got an answer (a completion or an
OpenAI-shaped error), its ``X-Firstpass-Receipt`` id is in the log exactly once, the log's chain
verifies (``firstpass receipts verify``), the proxy's peak RSS (``VmHWM``), and its log holds no
unhandled exception. Exit status 1 when any check failed.

    python -m benchmarks.reliability [load] [pressure] [crash] [diskfull]
        [--clients 500] [--requests 20000] [--seed 0] [--json OUT]

Scenarios (all four by default):

- ``load``: ``--clients`` closed-loop clients send ``--requests`` requests (cascade, shadow,
  enforce and pass-through, 20% streamed) while the upstream injects 5xx, 429 + Retry-After,
  timeouts, malformed JSON, connection resets, cuts and slow bodies.
- ``pressure``: healthy verified requests alone, then beside clients whose cheap answers are
  hostile (infinite loop, sleep, memory bomb, fork bomb); prints how much healthy latency rose
  against what the sandbox's concurrency bound explains.
- ``crash``: ``[receipts] fsync = "durable"``, ``kill -9`` mid-load, restart on the same log:
  the log verifies (a gap marker where the kill tore a line) and holds every answered request.
- ``diskfull``: in a user + mount namespace (``unshare``), the receipts on a 512 KiB tmpfs that
  is then filled: chat requests get 503 ``receipts_unavailable`` with Retry-After, and 200s
  again once space is freed (skipped with a message where ``unshare`` is not permitted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks._reliability_load import Got, Mix, plan, run_clients
from benchmarks._reliability_report import Report, build_report, pct, read_log, verify_log
from benchmarks._reliability_stack import (
    HOSTILE,
    Proc,
    ProxySettings,
    StubSettings,
    free_port,
    log_problems,
    start_proxy,
    start_stub,
    stub_faults,
    write_proxy_config,
)

__all__ = ["SCENARIOS", "Skip", "main", "run_crash", "run_load", "run_pressure"]

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("load", "pressure", "crash", "diskfull")


class Stack:
    """A stub and a proxy on loopback, for one scenario (``async with``)."""

    def __init__(self, tmp: Path, stub: StubSettings, proxy: ProxySettings) -> None:
        self.tmp = tmp
        self.stub_settings = stub
        self.proxy_settings = proxy
        self.port = free_port()
        self.stub: Proc | None = None
        self.proxy: Proc | None = None
        self.cfg: Path | None = None
        self.stderr = tmp / "proxy.stderr"
        self.restarts = 0
        self.peak_rss_kb: int | None = None

    async def __aenter__(self) -> Stack:
        self.stub = await asyncio.to_thread(start_stub, self.tmp, self.stub_settings)
        try:
            self.cfg = await asyncio.to_thread(
                write_proxy_config, self.tmp, self.stub.url, self.port, self.proxy_settings
            )
            await self.start_proxy()
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def start_proxy(self) -> None:
        assert self.cfg is not None
        self.proxy = await asyncio.to_thread(start_proxy, self.cfg, self.port, self.stderr)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def note_rss(self) -> None:
        """Keep the proxy's peak RSS (``VmHWM``) across restarts."""
        if self.proxy is not None and (hwm := self.proxy.status_kb("VmHWM")) is not None:
            self.peak_rss_kb = max(self.peak_rss_kb or 0, hwm)

    async def kill9(self) -> None:
        assert self.proxy is not None
        self.note_rss()
        await asyncio.to_thread(self.proxy.kill9)
        self.restarts += 1

    async def stop_proxy(self) -> None:
        if self.proxy is not None:
            self.note_rss()
            await asyncio.to_thread(self.proxy.stop)

    async def __aexit__(self, *exc: object) -> None:
        await self.stop_proxy()
        if self.stub is not None:
            await asyncio.to_thread(self.stub.stop)

    def faults(self) -> dict[str, int]:
        assert self.stub is not None
        return stub_faults(self.stub)


async def _finish(
    stack: Stack,
    scenario: str,
    got: Sequence[Got],
    wall_s: float,
    *,
    faults: dict[str, int] | None = None,
    **kwargs: Any,
) -> Report:
    """Stop the proxy (draining its receipts), then check the log against what clients got."""
    await stack.stop_proxy()
    receipts = stack.proxy_settings.receipts
    log = await asyncio.to_thread(read_log, receipts)
    chain = await asyncio.to_thread(verify_log, receipts)
    problems = await asyncio.to_thread(log_problems, stack.stderr)
    return build_report(
        scenario,
        got,
        log,
        chain=chain,
        wall_s=wall_s,
        peak_rss_kb=stack.peak_rss_kb,
        restarts=stack.restarts,
        log_problems=problems,
        stub_faults=faults,
        **kwargs,
    )


async def run_load(
    tmp: Path,
    *,
    clients: int,
    requests: int,
    seed: int = 0,
    stub: StubSettings | None = None,
    mix: Mix | None = None,
    sandbox_max_queue: int | None = 8192,
) -> Report:
    """Scenario 1: load with upstream faults and mixed traffic.

    ``sandbox_max_queue``: 500 clients put ~1,750 samples in the sandbox's queue at once, past
    the default bound of 1,024, which answers the excess with 503 ``sandbox_busy`` at once
    (``None`` keeps that default, to see it).
    """
    stub = replace(stub or StubSettings(), seed=seed)
    proxy = ProxySettings(receipts=tmp / "receipts.jsonl", sandbox_max_queue=sandbox_max_queue)
    async with Stack(tmp, stub, proxy) as stack:
        planned = plan(requests, mix or Mix(), seed=seed)
        rss: list[int] = []
        sampler = asyncio.ensure_future(_sample_rss(stack, rss))
        t0 = time.perf_counter()
        got = await run_clients(stack.url, planned, clients=clients)
        wall = time.perf_counter() - t0
        sampler.cancel()
        faults = stack.faults()
        by_mode: dict[str, int] = {}
        for g in got:
            by_mode[g.planned.mode] = by_mode.get(g.planned.mode, 0) + 1
        return await _finish(
            stack, "load", got, wall, faults=faults,
            extra={"requests by mode": dict(sorted(by_mode.items())),
                   "streamed": sum(g.planned.stream for g in got),
                   "proxy RSS MB at each fifth of the run": _fifths_mb(rss)},
        )  # fmt: skip


async def _sample_rss(stack: Stack, out: list[int]) -> None:
    """The proxy's RSS (kB) once a second, to show it levels off rather than grows."""
    while True:
        if stack.proxy is not None and (kb := stack.proxy.status_kb("VmRSS")) is not None:
            out.append(kb)
        await asyncio.sleep(1.0)


def _fifths_mb(samples: Sequence[int]) -> list[int]:
    if not samples:
        return []
    idx = [min(len(samples) - 1, round(i * (len(samples) - 1) / 5)) for i in range(1, 6)]
    return [round(samples[i] / 1024) for i in idx]


def _hostile_holds_ms(log_requests: Sequence[dict[str, Any]], ids: set[str]) -> list[float]:
    """The sandbox time of each hostile (failed, rung 0) sample of the given requests."""
    holds = []
    for r in log_requests:
        if r.get("id") not in ids:
            continue
        for c in r.get("checks") or []:
            if c.get("rung") == 0 and not c.get("passed") and isinstance(c.get("ms"), int | float):
                holds.append(float(c["ms"]))
    return holds


async def run_pressure(
    tmp: Path,
    *,
    healthy_clients: int,
    healthy_requests: int,
    hostile_clients: int,
    seed: int = 0,
    check_bound: bool = False,
) -> Report:
    """Scenario 4: healthy verified requests alone, then beside hostile ones (no upstream faults).

    The model: the sandbox runs at most S samples at once. A hostile sample holds its slot up to
    the wall limit W; ``hostile_clients`` = H closed-loop clients keep at most H hostile samples
    in the sandbox at once, so healthy samples keep at least S - H slots. Measured: the share of
    slot-time hostile samples held, rho = (sum of their sandbox times) / (S x phase wall). If
    healthy work only lost that share of the sandbox, healthy latency would grow by at most
    1 / (1 - rho) (worst case, rho = H / S). The run reports measured against explained;
    ``check_bound`` makes a slowdown beyond the larger of the two (+10%) a problem (timings:
    the benchmark's check, never a unit test's).
    """
    settings = ProxySettings(receipts=tmp / "receipts.jsonl")
    slots = settings.sandbox_concurrency or os.cpu_count() or 1
    mix = Mix(modes={"cascade": 1.0}, answers={"good": 1.0}, stream=0.0, header_mode=0.0)
    hostile_mix = Mix(
        modes={"cascade": 1.0}, answers={h: 1.0 for h in HOSTILE}, stream=0.0, header_mode=0.0
    )
    async with Stack(tmp, StubSettings(faults="", seed=seed), settings) as stack:
        # warm-up, then phase A: healthy alone
        warm = await run_clients(stack.url, plan(20, mix, seed=seed, start=10**6), clients=4)
        t0 = time.perf_counter()
        alone = await run_clients(
            stack.url, plan(healthy_requests, mix, seed=seed), clients=healthy_clients
        )
        wall_a = time.perf_counter() - t0
        # phase B: the same healthy load beside hostile clients, until the healthy ones finish
        stop = asyncio.Event()
        hostile_got: list[Got] = []
        hostile_task = asyncio.ensure_future(
            run_clients(
                stack.url,
                plan(10**5, hostile_mix, seed=seed + 1, start=2 * 10**6),
                clients=hostile_clients,
                stop=stop,
                out=hostile_got,
            )
        )
        await asyncio.sleep(0.5)  # the hostile samples are in the sandbox first
        t1 = time.perf_counter()
        beside = await run_clients(
            stack.url,
            plan(healthy_requests, mix, seed=seed + 2, start=3 * 10**6),
            clients=healthy_clients,
        )
        wall_b = time.perf_counter() - t1
        stop.set()
        await hostile_task
        report = await _finish(
            stack, "pressure", [*warm, *alone, *beside, *hostile_got], wall_a + wall_b
        )
    log = await asyncio.to_thread(read_log, settings.receipts)
    hostile_ids = {g.receipt_id for g in hostile_got if g.receipt_id is not None}
    holds = _hostile_holds_ms(log.requests, hostile_ids)
    hostile_wall = wall_b + 0.5
    rho = min(0.99, sum(holds) / 1000 / (slots * hostile_wall)) if hostile_wall > 0 else 0.0
    worst = slots / (slots - hostile_clients) if hostile_clients < slots else float("inf")
    lat_a = [g.latency_ms for g in alone if g.answered]
    lat_b = [g.latency_ms for g in beside if g.answered]
    mean_a = sum(lat_a) / len(lat_a) if lat_a else float("nan")
    mean_b = sum(lat_b) / len(lat_b) if lat_b else float("nan")
    measured = mean_b / mean_a if mean_a else float("nan")
    explained = 1 / (1 - rho)
    extra = {
        "sandbox": f"S = {slots} slots, wall limit W = {settings.wall_s:g} s, cpu limit "
        f"{settings.cpu_s:g} s; H = {hostile_clients} hostile clients",
        "healthy alone": f"{len(lat_a)} requests, mean {mean_a:.0f} ms, p50 {pct(lat_a, 50):.0f} ms, "
        f"p99 {pct(lat_a, 99):.0f} ms, {healthy_clients} clients",
        "healthy beside hostile": f"{len(lat_b)} requests, mean {mean_b:.0f} ms, "
        f"p50 {pct(lat_b, 50):.0f} ms, p99 {pct(lat_b, 99):.0f} ms",
        "hostile": f"{len(hostile_got)} requests, {len(holds)} hostile samples, mean hold "
        f"{(sum(holds) / len(holds) if holds else 0):.0f} ms (sandbox time incl. its queue wait)",
        "slowdown (mean latency beside / alone)": f"measured {measured:.2f}x; explained by "
        f"slots lost, 1/(1-rho) with rho = {rho:.2f}: {explained:.2f}x; worst case S/(S-H) = "
        f"{worst:.2f}x",
    }
    problems = list(report.problems)
    if check_bound and not measured <= max(explained, worst) * 1.1:
        problems.append(f"healthy latency rose {measured:.2f}x, beyond what the bound explains")
    return replace(report, extra={**report.extra, **extra}, problems=tuple(problems))


def _tear(path: Path) -> None:
    """Append the first half of a receipt line without its newline (a torn last write)."""
    with path.open("rb") as f:
        first = f.readline()
    with path.open("ab") as f:
        f.write(first[: len(first) // 2])


async def run_crash(
    tmp: Path, *, clients: int, requests: int, kill_after: int, seed: int = 0, tear: bool = True
) -> Report:
    """Scenario 2: durable receipts, ``kill -9`` after ``kill_after`` answers, restart, more load.

    With ``tear`` and a kill that tore nothing, half a line is appended before the restart, as
    a crash mid-write leaves it: the writer must move it aside and chain a gap marker.
    """
    settings = ProxySettings(receipts=tmp / "receipts.jsonl", fsync="durable")
    stub = StubSettings(seed=seed)
    try:
        stack = await Stack(tmp, stub, settings).__aenter__()
    except RuntimeError as exc:
        if "durable" in str(exc) or "fsync" in str(exc):
            raise Skip(
                f'[receipts] fsync = "durable" is not available in this build: {exc}'
            ) from None
        raise
    try:
        got: list[Got] = []
        stop = asyncio.Event()
        load = asyncio.ensure_future(
            run_clients(
                stack.url, plan(requests, Mix(), seed=seed), clients=clients, stop=stop, out=got
            )
        )
        t0 = time.perf_counter()
        while sum(g.answered for g in got) < kill_after and not load.done():
            await asyncio.sleep(0.01)
        stop.set()  # clients send nothing new; what is in flight now dies with the proxy
        await stack.kill9()
        await load
        answered_before = sum(g.answered for g in got)
        lines_before = await asyncio.to_thread(read_log, settings.receipts)
        torn_by_kill = not (await asyncio.to_thread(verify_log, settings.receipts))[0]
        if tear and not torn_by_kill:
            # one os.write per batch: a kill -9 rarely tears a line on a local disk, so leave
            # what a crash mid-write leaves (half a line, no newline) to exercise the repair
            await asyncio.to_thread(_tear, settings.receipts)
        await stack.start_proxy()  # the same log: the writer repairs a torn last line
        after = await run_clients(
            stack.url, plan(max(50, requests // 10), Mix(), seed=seed + 1, start=10**6),
            clients=min(clients, 50),
        )  # fmt: skip
        wall = time.perf_counter() - t0
        report = await _finish(
            stack, "crash", [*got, *after], wall, faults=stack.faults(),
            expect_all_answered=False, expect_receipt_per_request=False,
        )  # fmt: skip
    finally:
        await stack.__aexit__(None, None, None)
    aside = sorted(
        p.name
        for p in tmp.iterdir()
        if p.name.startswith("receipts") and p.name != "receipts.jsonl"
    )
    extra = {
        "killed after": f"{answered_before} answers ({sum(not g.answered for g in got)} "
        f"requests in flight lost their connection); {len(lines_before.requests)} request "
        "receipts on disk at the kill",
        "after restart": f"{sum(g.answered for g in after)}/{len(after)} answered",
        "torn line": "by the kill"
        if torn_by_kill
        else ("simulated after the kill" if tear else "none"),
        "gap markers": report.writer_lines.get("gap", 0),
        "files beside the log": aside or "none",
    }
    problems = list(report.problems)
    if (torn_by_kill or tear) and report.writer_lines.get("gap", 0) < 1:
        problems.append("a torn last line was not replaced by a gap marker")
    return replace(report, extra={**report.extra, **extra}, problems=tuple(problems))


class Skip(Exception):
    """A scenario that cannot run here (says why)."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.reliability", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "scenarios", nargs="*", help=f"any of {', '.join(SCENARIOS)} (default: all)"
    )
    parser.add_argument("--clients", type=int, default=500)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directories")
    parser.add_argument("--inner-diskfull", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.inner_diskfull is not None:
        from benchmarks._reliability_disk import inner_main

        return inner_main(args.inner_diskfull, seed=args.seed)
    scenarios = args.scenarios or list(SCENARIOS)
    if unknown := sorted(set(scenarios) - set(SCENARIOS)):
        parser.error(f"unknown scenario(s) {unknown}; choose from {', '.join(SCENARIOS)}")
    reports: list[Report] = []
    failed = False
    for name in scenarios:
        tmp = Path(tempfile.mkdtemp(prefix=f"fp-rel-{name}-"))
        try:
            report = asyncio.run(_scenario(name, tmp, args))
        except Skip as exc:
            print(f"== {name}\nSKIPPED: {exc}\n", flush=True)
            continue
        finally:
            if not args.keep:
                shutil.rmtree(tmp, ignore_errors=True)
        reports.append(report)
        failed |= bool(report.problems)
        print("\n".join(report.lines()) + "\n", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps([r.to_dict() for r in reports], indent=2, default=str))
    return 1 if failed else 0


async def _scenario(name: str, tmp: Path, args: argparse.Namespace) -> Report:
    if name == "load":
        return await run_load(tmp, clients=args.clients, requests=args.requests, seed=args.seed)
    if name == "pressure":
        return await run_pressure(
            tmp, healthy_clients=8, healthy_requests=max(100, args.requests // 20),
            hostile_clients=1, seed=args.seed, check_bound=True,
        )  # fmt: skip
    if name == "crash":
        return await run_crash(
            tmp, clients=min(args.clients, 200), requests=max(400, args.requests // 4),
            kill_after=max(100, args.requests // 20), seed=args.seed,
        )  # fmt: skip
    from benchmarks._reliability_disk import run_diskfull

    report = await asyncio.to_thread(run_diskfull, tmp, seed=args.seed)
    if report is None:
        raise Skip("unshare --user --map-root-user --mount is not permitted here")
    return report


if __name__ == "__main__":
    raise SystemExit(main())
