"""Receipts in PostgreSQL from several replicas: what the sink costs pass-through throughput.

Measures, in one run and side by side, pass-through requests (no checks) through: one replica with
the file sink, one replica with the PostgreSQL sink, and three replicas with the PostgreSQL sink
(aggregate: the same total client concurrency split over them, no load balancer). Each
configuration is measured ``--rounds`` times, interleaved in rotating order so drift in the
machine's load falls on every configuration alike; the range over the rounds is printed, and the
ratio PG/file of single-replica throughput (the issue's bound: the sink must not cut it by more
than 10%). Afterwards every chain in the table is verified and its request rows counted against
the requests sent. Writes benchmarks/results/replicas.md.

    python -m benchmarks.replicas [--requests 3000] [--concurrency 30] [--rounds 3]
        [--fsync batch,durable] [--dsn-env VAR] [--pg-fsync on|off] [--note TEXT] [--no-write]

PostgreSQL: a throwaway server of its own (``initdb`` + ``pg_ctl`` in a temporary directory, on a
Unix socket; as root it runs as the ``postgres`` user), or ``--dsn-env VAR`` naming a variable
that holds the DSN of a server you run (the schema is migrated there and rows are added under
replica ids ``bench-*``). ``--pg-fsync off`` runs the throwaway server with ``fsync=off`` as the
test suite's server does; the default keeps PostgreSQL's own default (on).

The helpers here (``Replicas``, ``migrate``, ``table_receipts``, ``verify_table``) are shared with
tests/test_replicas.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks._reliability_stack import (
    MODEL,
    Proc,
    ProxySettings,
    free_port,
    scrape_metrics,
    start_proxy,
    write_proxy_config,
)
from benchmarks.loadgen import LoadResult, run_load

__all__ = [
    "DSN_ENV",
    "Replica",
    "Replicas",
    "local_pg",
    "main",
    "migrate",
    "table_receipts",
    "verify_table",
    "verify_table_by_file",
]

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
#: the variable the replicas read their DSN from (``[receipts] dsn_env``)
DSN_ENV = "FIRSTPASS_DSN"


def _firstpass() -> list[str]:
    exe = Path(sys.executable).parent / "firstpass"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "firstpass"]


def _env(dsn: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    env[DSN_ENV] = dsn
    return env


def migrate(dsn: str) -> str:
    """``firstpass db migrate --dsn-env FIRSTPASS_DSN``, as an operator runs it (its output)."""
    done = subprocess.run(
        [*_firstpass(), "db", "migrate", "--dsn-env", DSN_ENV],
        env=_env(dsn),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise RuntimeError(f"firstpass db migrate failed: {done.stdout}{done.stderr}")
    return (done.stdout + done.stderr).strip()


def verify_table(dsn: str, replicas: Sequence[str] = ()) -> tuple[bool, str]:
    """``firstpass receipts verify --dsn-env FIRSTPASS_DSN [--replica ID]...``: (exit 0, output)."""
    cmd = [*_firstpass(), "receipts", "verify", "--dsn-env", DSN_ENV]
    for r in replicas:
        cmd += ["--replica", r]
    done = subprocess.run(cmd, env=_env(dsn), capture_output=True, text=True, timeout=300, cwd=ROOT)
    return done.returncode == 0, (done.stdout + done.stderr).strip()


def table_receipts(dsn: str) -> dict[str, list[tuple[int, bytes]]]:
    """Every row of ``firstpass_receipts``: replica -> [(seq, line)] in seq order."""
    import psycopg

    out: dict[str, list[tuple[int, bytes]]] = {}
    with psycopg.connect(dsn) as conn:
        rows = conn.execute(
            "SELECT replica, seq, line FROM firstpass_receipts ORDER BY replica, seq"
        ).fetchall()
    for replica, seq, line in rows:
        out.setdefault(str(replica), []).append((int(seq), bytes(line)))
    return out


def verify_table_by_file(dsn: str, tmp: Path) -> dict[str, tuple[bool, str]]:
    """Each replica's lines written to a file in seq order and checked by the file verifier
    (``firstpass.receipts.verify_chain``, from the genesis hash): independent of the table
    reader behind ``receipts verify --dsn-env``. replica -> (ok, why not)."""
    from firstpass.receipts import verify_chain

    out: dict[str, tuple[bool, str]] = {}
    for replica, rows in table_receipts(dsn).items():
        path = tmp / f"verify-{replica}.jsonl"
        path.write_bytes(b"".join(line for _, line in rows))
        report = verify_chain(path)
        seqs = [seq for seq, _ in rows]
        why = "" if report.ok else f"line {report.first_bad_line}: {report.reason}"
        if seqs != list(range(1, len(seqs) + 1)):
            why += f" seq is not 1..{len(seqs)}"
        out[replica] = (not why, why.strip())
        path.unlink()
    return out


@dataclass
class Replica:
    """One ``firstpass serve`` of a set: its id, port, files and process (``None``: down)."""

    id: str
    port: int
    cfg: Path
    stderr: Path
    spill: Path | None
    env: dict[str, str]
    proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class Replicas:
    """``n`` replicas on one stub upstream, each in its own directory under ``tmp`` with its own
    port, replica id (``{prefix}1``..), spill file and config; no load balancer in front.
    ``sink="file"``: each writes its own JSONL log instead."""

    tmp: Path
    stub_url: str
    dsn: str | None
    n: int = 3
    sink: str = "postgresql"
    fsync: str = "durable"
    prefix: str = "r"
    settings: dict[str, Any] = field(default_factory=dict)
    members: list[Replica] = field(default_factory=list)

    def __post_init__(self) -> None:
        for i in range(1, self.n + 1):
            rid = f"{self.prefix}{i}"
            home = self.tmp / rid
            home.mkdir(parents=True, exist_ok=True)
            port = free_port()
            pg = self.sink == "postgresql"
            spill = home / f"{rid}.spill.jsonl" if pg else None
            s = ProxySettings(
                receipts=home / "receipts.jsonl",
                fsync=self.fsync,
                sink=self.sink,
                replica=rid if pg else None,
                spill_path=spill,
            )
            cfg = write_proxy_config(home, self.stub_url, port, replace(s, **self.settings))
            env = {DSN_ENV: self.dsn} if pg and self.dsn else {}
            self.members.append(
                Replica(
                    id=rid, port=port, cfg=cfg, stderr=home / "proxy.stderr", spill=spill, env=env
                )
            )

    def __getitem__(self, rid: str) -> Replica:
        return next(r for r in self.members if r.id == rid)

    @property
    def urls(self) -> dict[str, str]:
        return {r.id: r.url for r in self.members}

    def start(self, rid: str | None = None) -> None:
        """Start one replica (``rid``) or all that are down, at once; ready when ``/readyz``."""
        todo = [r for r in self.members if (rid is None or r.id == rid) and r.proc is None]

        def one(r: Replica) -> None:
            r.proc = start_proxy(r.cfg, r.port, r.stderr, env=r.env)

        with ThreadPoolExecutor(max_workers=max(1, len(todo))) as pool:
            for fut in [pool.submit(one, r) for r in todo]:
                fut.result()

    def kill9(self, rid: str) -> None:
        r = self[rid]
        assert r.proc is not None
        r.proc.kill9()
        r.proc = None

    def stop(self) -> dict[str, int]:
        """SIGTERM each running replica (each drains its receipts); exit codes by id."""
        codes: dict[str, int] = {}
        running = [r for r in self.members if r.proc is not None]

        def one(r: Replica) -> None:
            assert r.proc is not None
            codes[r.id] = r.proc.stop()
            r.proc = None

        with ThreadPoolExecutor(max_workers=max(1, len(running))) as pool:
            for fut in [pool.submit(one, r) for r in running]:
                fut.result()
        return codes

    def pids(self) -> dict[str, int]:
        return {r.id: r.proc.pid for r in self.members if r.proc is not None}


@contextmanager
def local_pg(*, fsync: bool = True) -> Iterator[tuple[str, Path]]:
    """A throwaway PostgreSQL (tests/pg_server.py's ``LocalPg``: initdb in a temporary directory,
    a Unix socket there; as root, run as ``postgres``); yields the DSN of its ``postgres``
    database and its data directory. ``fsync=False``: as the test suite runs it."""
    from tests.pg_server import LocalPg

    class _Pg(LocalPg):
        def start(self) -> None:
            opts = f"-k {self.root} -c listen_addresses='' -c max_connections=200" + (
                "" if fsync else " -c fsync=off"
            )
            log = self.root / "log"
            done = self._run(
                [self._pg_ctl, "-D", str(self.data), "-o", opts, "-l", str(log), "-w", "start"]
            )
            if done.returncode != 0:
                raise RuntimeError(f"pg_ctl start failed: {done.stderr[-300:]}")

    pg = _Pg()
    try:
        pg.start()
        yield pg.server.dsn("postgres"), pg.data
    finally:
        pg.stop()
        pg.remove()


# -- the benchmark -----------------------------------------------------------------------------

PLAIN = {"model": MODEL, "messages": [{"role": "user", "content": "write add(a, b)"}]}


def start_raw_stub(tmp: Path) -> Proc:
    """The stub upstream with its least-CPU server (``--server raw``), answering in 0 ms."""
    from benchmarks._reliability_stack import _wait_ready

    port = free_port()
    stderr_path = tmp / "stub.stderr"
    err = stderr_path.open("wb")
    popen = subprocess.Popen(
        [sys.executable, "-m", "tests.stub_upstream", "--port", str(port), "--latency-ms", "0"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=err,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_ready(f"{url}/v1/models", popen)
    return Proc(popen=popen, stderr_path=stderr_path, url=url, _stderr=err)


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) process ``pid`` has used; 0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pg_processes(data: Path) -> list[int]:
    """The postmaster of the server on ``data`` and its children (backends, WAL writer...)."""
    try:
        postmaster = int((data / "postmaster.pid").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return []
    pids = [postmaster]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                pids.append(int(entry))
    return pids


def _split(total: int, parts: int) -> list[int]:
    q, r = divmod(total, parts)
    return [q + (i < r) for i in range(parts)]


async def measure(urls: Sequence[str], *, concurrency: int, requests: int) -> LoadResult:
    """``requests`` pass-through POSTs from ``concurrency`` keep-alive clients split evenly over
    ``urls`` (each client stays on one replica); aggregate latencies, the longest wall time."""
    chat = [f"{u}/v1/chat/completions" for u in urls]
    conc = _split(concurrency, len(urls))
    reqs = _split(requests, len(urls))
    await asyncio.gather(
        *(
            run_load(u, PLAIN, concurrency=c, requests=20 * c, warmup=0)
            for u, c in zip(chat, conc, strict=True)
        )
    )
    parts = await asyncio.gather(
        *(
            run_load(u, PLAIN, concurrency=c, requests=n, warmup=0, max_seconds=120)
            for u, c, n in zip(chat, conc, reqs, strict=True)
        )
    )
    statuses: dict[int, int] = {}
    for p in parts:
        for s, c in p.statuses.items():
            statuses[s] = statuses.get(s, 0) + c
    return LoadResult(
        latencies_ms=tuple(x for p in parts for x in p.latencies_ms),
        wall_s=max(p.wall_s for p in parts),
        statuses=statuses,
    )


@dataclass
class Config:
    name: str
    sink: str
    n: int
    fsync: str
    replicas: Replicas | None = None
    runs: list[LoadResult] = field(default_factory=list)
    sent: int = 0
    proxy_cpu_us: list[float] = field(default_factory=list)  # per request, each run
    pg_cpu_us: list[float] = field(default_factory=list)
    per_batch: list[float] = field(default_factory=list)  # receipts per writer batch

    def rps(self) -> list[float]:
        return [r.rps for r in self.runs]


def _rng(xs: Sequence[float], fmt: str = "{:,.0f}") -> str:
    if not xs:
        return "-"
    lo, hi = min(xs), max(xs)
    return fmt.format(lo) if lo == hi else f"{fmt.format(lo)}–{fmt.format(hi)}"


def _writer_counts(url: str) -> tuple[float, float]:
    """The replica's receipt writer: (receipts written, batches) so far."""
    m = scrape_metrics(url)
    return m.get("firstpass_receipts_written", 0.0), m.get("firstpass_receipt_batches", 0.0)


async def _run_rounds(
    configs: list[Config],
    *,
    rounds: int,
    concurrency: int,
    requests: int,
    pg_data: Path | None,
) -> None:
    for rnd in range(rounds):
        order = configs[rnd % len(configs) :] + configs[: rnd % len(configs)]
        for cfg in order:
            assert cfg.replicas is not None
            urls = list(cfg.replicas.urls.values())
            pids = list(cfg.replicas.pids().values())
            pg = pg_processes(pg_data) if pg_data is not None else []
            before = [_writer_counts(u) for u in urls]
            cpu0, pg0 = sum(map(_cpu_s, pids)), {p: _cpu_s(p) for p in pg}
            res = await measure(urls, concurrency=concurrency, requests=requests)
            await asyncio.sleep(0.1)  # the last receipts' batch
            cpu1 = sum(map(_cpu_s, pids))
            pg_now = pg_processes(pg_data) if pg_data is not None else []
            pg_used = sum((_cpu_s(p) - pg0.get(p, 0.0) for p in pg_now), 0.0)
            after = [_writer_counts(u) for u in urls]
            n_sent = res.n + sum(20 * c for c in _split(concurrency, len(urls)))
            cfg.runs.append(res)
            cfg.sent += n_sent
            cfg.proxy_cpu_us.append((cpu1 - cpu0) / n_sent * 1e6)
            cfg.pg_cpu_us.append(pg_used / n_sent * 1e6)
            written = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
            batches = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
            cfg.per_batch.append(written / batches if batches else float("nan"))
            bad = {s: c for s, c in res.statuses.items() if s != 200}
            print(
                f"round {rnd + 1} {cfg.name:<22} {res.rps:8,.0f} req/s  p50 {res.p50:7.2f} ms"
                f"  p99 {res.pct(99):7.2f} ms  proxy CPU {cfg.proxy_cpu_us[-1]:5.0f} us/req"
                f"  PG CPU {cfg.pg_cpu_us[-1]:4.0f} us/req  {cfg.per_batch[-1]:5.1f} receipts/batch"
                f"  (n={res.n}){'  ERRORS ' + str(bad) if bad else ''}",
                flush=True,
            )


def _ratio_lines(configs: list[Config], fsyncs: Sequence[str]) -> list[str]:
    out = []
    by = {c.name: c for c in configs}
    for fs in fsyncs:
        f1, p1, p3 = by[f"file x1 {fs}"], by[f"postgresql x1 {fs}"], by[f"postgresql x3 {fs}"]
        per_round = [p.rps / f.rps for f, p in zip(f1.runs, p1.runs, strict=True) if f.rps]
        med = statistics.median(p1.rps()) / statistics.median(f1.rps())
        agg = statistics.median(p3.rps()) / statistics.median(f1.rps())
        verdict = "within" if med >= 0.9 else "BEYOND"
        cpu_f, cpu_p = statistics.median(f1.proxy_cpu_us), statistics.median(p1.proxy_cpu_us)
        pg_cpu = statistics.median(p1.pg_cpu_us) - statistics.median(f1.pg_cpu_us)
        out.append(
            f"fsync {fs}: PG/file single-replica throughput {med:.2f} (ratio of the medians; "
            f"per round, adjacent runs: {', '.join(f'{x:.2f}' for x in per_round)}): "
            f"{verdict} the 10% bound; three PG replicas / one file replica {agg:.2f}. Proxy CPU "
            f"per request PG/file {cpu_p / cpu_f:.2f} ({cpu_p:.0f} vs {cpu_f:.0f} µs), plus "
            f"{pg_cpu:.0f} µs in PostgreSQL"
        )
    return out


def _markdown(
    configs: list[Config],
    ratios: list[str],
    checks: list[str],
    args: argparse.Namespace,
    argv: Sequence[str],
    pg_note: str,
) -> str:
    lines = [
        "# Receipts in PostgreSQL: pass-through throughput, one and three replicas",
        "",
        f"- command: `python -m benchmarks.replicas {' '.join(_shown(argv))}`".rstrip(),
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, {platform.system()} {platform.release()}; stub upstream, "
        "proxies, PostgreSQL and the load generator all share these cores",
        f"- PostgreSQL: {pg_note}",
        f"- load: {args.concurrency} closed-loop keep-alive clients in total (three replicas: "
        f"split evenly, each client on one replica, no load balancer), {args.requests} "
        "pass-through requests a run after a warm-up; stub answers in 0 ms (raw server)",
        f"- {args.rounds} rounds, configurations interleaved in rotating order; ranges are "
        "min–max over the rounds",
        *([f"- {args.note}"] if args.note else []),
        "",
        "| sink | replicas | fsync | req/s (range) | req/s median | p50 ms (range) | "
        "p99 ms (range) | proxy CPU µs/req (median) | PG CPU µs/req (median) | receipts/batch |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in configs:
        lines.append(
            f"| {c.sink} | {c.n} | {c.fsync} | {_rng(c.rps())} | "
            f"{statistics.median(c.rps()):,.0f} | {_rng([r.p50 for r in c.runs], '{:.2f}')} | "
            f"{_rng([r.pct(99) for r in c.runs], '{:.2f}')} | "
            f"{statistics.median(c.proxy_cpu_us):,.0f} | {statistics.median(c.pg_cpu_us):,.0f} | "
            f"{statistics.median(c.per_batch):.1f} |"
        )
    lines += [
        "",
        "CPU µs/req: CPU time (user + system) the replica processes, and all of PostgreSQL's "
        "processes, spent per request over each run, divided by the requests sent (the median "
        "over the rounds); less exposed than req/s to other work on a shared machine. "
        "receipts/batch: the writer's receipts per batch (one INSERT each for PostgreSQL).",
    ]
    lines += ["", *[f"- {r}" for r in ratios], "", "After the runs:", ""]
    lines += [f"- {c}" for c in checks]
    return "\n".join(lines) + "\n"


def _shown(argv: Sequence[str]) -> list[str]:
    """``argv`` without ``--note`` (its text is a line of its own)."""
    out: list[str] = []
    skip = False
    for a in argv:
        if skip:
            skip = False
        elif a == "--note":
            skip = True
        elif not a.startswith("--note="):
            out.append(a)
    return out


def _after_checks(dsn: str, configs: list[Config], tmp: Path) -> tuple[list[str], bool]:
    """Every chain verifies (the CLI and the file verifier); each PG replica's request rows equal
    the 200s it answered (warm-ups included)."""
    ok, out = verify_table(dsn)
    by_file = verify_table_by_file(dsn, tmp)
    rows = table_receipts(dsn)
    checks = [f"`firstpass receipts verify --dsn-env`: {'ok' if ok else 'FAILED'} "
              f"({len(by_file)} chains)"]  # fmt: skip
    bad = {r: why for r, (good, why) in by_file.items() if not good}
    checks.append(f"file verifier over each replica's rows: {bad if bad else 'ok'}")
    held = ok and not bad
    for c in configs:
        if c.sink != "postgresql" or c.replicas is None:
            continue
        ids = [r.id for r in c.replicas.members]
        n = sum(1 for rid in ids for _, line in rows.get(rid, []) if "kind" not in json.loads(line))
        same = n == c.sent
        held = held and same
        checks.append(
            f"{c.name}: {n:,} request rows for {c.sent:,} requests sent"
            + ("" if same else " (MISMATCH)")
        )
    if not ok:
        checks.append("verify output: " + out[-500:])
    return checks, held


async def _bench(
    args: argparse.Namespace, tmp: Path, dsn: str, pg_data: Path | None
) -> list[Config]:
    fsyncs = [f.strip() for f in args.fsync.split(",") if f.strip()]
    configs = [
        Config(f"{sink} x{n} {fs}", sink, n, fs)
        for fs in fsyncs
        for sink, n in (("file", 1), ("postgresql", 1), ("postgresql", 3))
    ]
    stub = start_raw_stub(tmp)
    try:
        for i, c in enumerate(configs):
            c.replicas = Replicas(
                tmp / f"c{i}", stub.url, dsn, n=c.n, sink=c.sink, fsync=c.fsync,
                prefix=f"bench-{c.sink[:2]}{c.n}-{c.fsync}-{os.getpid()}-",
            )  # fmt: skip
            await asyncio.to_thread(c.replicas.start)
        await _run_rounds(
            configs,
            rounds=args.rounds,
            concurrency=args.concurrency,
            requests=args.requests,
            pg_data=pg_data,
        )
    finally:
        for c in configs:
            if c.replicas is not None:
                codes = await asyncio.to_thread(c.replicas.stop)
                if any(codes.values()):
                    print(f"{c.name}: exit codes {codes}", file=sys.stderr)
        stub.stop()
    return configs


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.replicas", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--requests", type=int, default=3000, help="per run (all replicas)")
    parser.add_argument("--concurrency", type=int, default=30, help="clients in total")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fsync", default="batch,durable", help="comma-separated policies")
    parser.add_argument("--dsn-env", default=None, help="use this server, not a throwaway one")
    parser.add_argument("--pg-fsync", choices=["on", "off"], default="on")
    parser.add_argument("--note", default="", help="a line added to the results file")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    try:
        import uvloop

        run = uvloop.run
    except ImportError:  # pragma: no cover - uvloop is a dependency
        run = asyncio.run  # type: ignore[assignment]
    with tempfile.TemporaryDirectory(prefix="fp-replicas-") as tmp_name:
        tmp = Path(tmp_name)
        with _database(args) as (dsn, pg_note, pg_data):
            migrate(dsn)
            t0 = time.perf_counter()
            configs = run(_bench(args, tmp, dsn, pg_data))
            checks, held = _after_checks(dsn, configs, tmp)
        fsyncs = [f.strip() for f in args.fsync.split(",") if f.strip()]
        ratios = _ratio_lines(configs, fsyncs)
    print()
    for line in [*ratios, *checks]:
        print(line)
    print(f"(measured in {time.perf_counter() - t0:.0f} s)")
    md = _markdown(configs, ratios, checks, args, argv, pg_note)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "replicas.md").write_text(md)
    print()
    print(md)
    return 0 if held else 1


@contextmanager
def _database(args: argparse.Namespace) -> Iterator[tuple[str, str, Path | None]]:
    if args.dsn_env:
        dsn = os.environ.get(args.dsn_env)
        if not dsn:
            raise SystemExit(f"--dsn-env {args.dsn_env}: the variable is not set")
        yield dsn, f"the server in ${args.dsn_env}", None
        return
    try:
        with local_pg(fsync=args.pg_fsync == "on") as (dsn, data):
            version = subprocess.run(
                [*_firstpass_psql_version()], capture_output=True, text=True, check=False
            ).stdout.strip()
            yield (
                dsn,
                (
                    f"throwaway local server ({version or 'version unknown'}), Unix socket, "
                    f"fsync={args.pg_fsync}, synchronous_commit on; same disk as the file sink"
                ),
                data,
            )
    except BaseException as exc:  # pytest.skip's outcome from LocalPg: no server binaries
        if type(exc).__name__ == "Skipped":
            raise SystemExit(f"no PostgreSQL: {exc}") from None
        raise


def _firstpass_psql_version() -> list[str]:
    from tests.pg_server import _bin

    return [_bin("pg_ctl") or "pg_ctl", "--version"]


if __name__ == "__main__":
    raise SystemExit(main())
