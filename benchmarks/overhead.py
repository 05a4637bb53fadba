"""How much latency the proxy adds, and how many requests a second it serves.

Runs, in one go and side by side: the stub upstream alone (direct) and Firstpass in front of it
(proxy), for a request without checks (pass-through) and a verified one (visible test + gate),
at concurrency 1 and 32. Each of stub, proxy and load generator is its own process, as in
production; the stub answers in 0 ms. Prints medians and p99, the added latency (proxy minus
direct, same path and concurrency) and throughput, and writes benchmarks/results/overhead.md.

Beside ours, in the same run, the peer proxy from PyPI (``firstpass==0.9.0``: an unrelated Rust
package with the same name) in its own venv: ``FIRSTPASS_MODE=observe`` for pass-through, and
``enforce`` with a subprocess gate running the same visible assert and 10 cases for the verified
path. If it cannot be installed or started, the peer is skipped with a message.

    python -m benchmarks.overhead [--requests 3000] [--verified-requests 300] [--no-peer]
                                  [--workers N]
    python -m benchmarks.overhead --observability [--requests 3000]
    python -m benchmarks.overhead --dialects [--requests 3000] [--rounds 6]

``--workers N`` runs the proxy with ``[server] workers = N`` (N processes on one port).
``--observability`` measures instead what ``/metrics``, the request log and receipt signing cost:
one proxy per variant (off, on, on with signing), measured interleaved in the same run.
``--dialects`` measures the pass-through path through each API the proxy speaks (Chat
Completions, OpenAI Responses, Anthropic Messages) on one proxy, the same task in each dialect,
interleaved in rounds so drift hits all alike; it prints each dialect's added p50 and its
difference from Chat Completions' in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from benchmarks.loadgen import LoadResult, run_load

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

T = TypeVar("T")

ANSWER = "def add(a, b):\n    return a + b\n"
CHECKS = {
    "tests": {
        "visible": ["assert add(1, 2) == 3"],
        "hidden": {
            "entry_point": "add",
            "cases": [{"args": [i, 2 * i], "expected": 3 * i} for i in range(10)],
        },
    },
    "entry_point": "add",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{url} did not become ready in {timeout} s")


def bench_env(**extra: str) -> dict[str, str]:
    """The environment a benchmark's processes run with: ours without any ``FIRSTPASS_``
    override (a developer's shell must not change what is measured), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    env.update(extra)
    return env


def start_stub(port: int, env: dict[str, str]) -> subprocess.Popen[bytes]:
    """The 0 ms stub upstream (``tests.stub_upstream``) as its own process on ``port``."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.stub_upstream",
            "--port",
            str(port),
            "--latency-ms",
            "0",
            "--answer",
            ANSWER,
        ],
        cwd=ROOT,
        env=env,
    )


def stop_all(procs: list[subprocess.Popen[bytes]]) -> None:
    """Terminate every process, then wait (kill what does not stop within 10 s)."""
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def loop_runner() -> Callable[[Coroutine[Any, Any, T]], T]:
    """``uvloop.run`` where installed (the server runs on uvloop too), else ``asyncio.run``."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


def write_config(
    tmp: Path,
    stub_port: int,
    proxy_port: int,
    workers: int = 1,
    *,
    name: str = "firstpass",
    metrics: bool = True,
    request_log: bool = True,
    signing_key: Path | None = None,
) -> Path:
    """The proxy's config; ``name`` keeps several proxies' files apart in one run,
    ``metrics`` and ``request_log`` are ``[observability]``'s, ``signing_key`` signs receipt
    checkpoints."""
    cfg = tmp / f"{name}.toml"
    workers_line = f"workers = {workers}" if workers > 1 else ""
    signing = f'signing_key = "{signing_key}"' if signing_key is not None else ""
    cfg.write_text(
        f"""
[server]
host = "127.0.0.1"
port = {proxy_port}
max_concurrency = 4096
{workers_line}

[observability]
metrics = {str(metrics).lower()}
request_log = {str(request_log).lower()}

[receipts]
path = "{tmp / f"{name}-receipts.jsonl"}"
fsync = "batch"
{signing}

[[provider]]
id = "stub"
kind = "openai"
base_url = "http://127.0.0.1:{stub_port}/v1"
retries = 0
max_concurrency = 1024

[[route]]
name = "bench"
models = ["bench"]
ladder = ["stub/m"]
without_checks = "passthrough"

[[price]]
model = "stub/m"
input_per_mtok = 0.1
output_per_mtok = 0.4
"""
    )
    return cfg


#: the peer proxy's venv (made on first use) and the version compared against
PEER_VENV = Path(os.environ.get("FIRSTPASS_PEER_VENV", "/tmp/firstpass-peer-venv"))
PEER_VERSION = "0.9.0"

#: the peer's gate: a subprocess reading {"candidate": ...} on stdin, running the same checks as
#: our verified path (the visible assert and the 10 cases), in its own process, no sandbox
PEER_GATE = r"""
import json, re, sys
data = json.load(sys.stdin)
text = data.get("candidate") or ""
m = re.search(r"```(?:python)?\n(.*?)```", text, re.S)
code = m.group(1) if m else text
ns = {}
passed = total = 0
try:
    exec(code, ns)
    total = 11
    try:
        assert ns["add"](1, 2) == 3
        passed += 1
    except Exception:
        pass
    for i in range(10):
        try:
            passed += ns["add"](i, 2 * i) == 3 * i
        except Exception:
            pass
except Exception:
    total = 11
print(json.dumps({"verdict": "pass" if passed == total else "fail", "score": passed / total}))
"""


def peer_binary(venv: Path = PEER_VENV) -> tuple[Path | None, str]:
    """The peer's ``firstpass`` executable, installing it into ``venv`` if needed (blocking)."""
    exe = venv / "bin" / "firstpass"
    if exe.exists():
        return exe, "found"
    try:
        subprocess.run(
            [sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True, timeout=120
        )
        subprocess.run(
            [str(venv / "bin" / "pip"), "install", "-q", f"firstpass=={PEER_VERSION}"],
            check=True,
            capture_output=True,
            timeout=600,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        return (
            None,
            f"pip install firstpass=={PEER_VERSION} failed: {exc} {detail.decode(errors='replace')[-300:]}",
        )
    return (exe, "installed") if exe.exists() else (None, f"no {exe} after installing")


def write_peer_config(tmp: Path, stub_port: int, mode: str) -> Path:
    """The peer's TOML: the stub as an OpenAI-dialect provider, one rung, our checks as its gate."""
    gate = tmp / "peer_gate.py"
    gate.write_text(PEER_GATE)
    cfg = tmp / f"peer-{mode}.toml"
    gates = '["tests"]' if mode == "enforce" else "[]"
    cfg.write_text(
        f"""
[[provider]]
id       = "stub"
dialect  = "openai"
base_url = "http://127.0.0.1:{stub_port}"

[[route]]
match  = {{}}
mode   = "{mode}"
ladder = ["stub/m"]
gates  = {gates}

[[gate]]
id  = "tests"
cmd = ["{sys.executable}", "-I", "{gate}"]

[[price]]
model = "stub/m"
input_per_mtok = 0.1
output_per_mtok = 0.4
"""
    )
    return cfg


def start_peer(
    exe: Path, tmp: Path, stub_port: int, mode: str, port: int
) -> subprocess.Popen[bytes]:
    """``firstpass up`` of the peer in ``mode`` (observe = pass-through, enforce = gated)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    env.update(
        FIRSTPASS_MODE=mode,
        FIRSTPASS_BIND=f"127.0.0.1:{port}",
        FIRSTPASS_CONFIG=str(write_peer_config(tmp, stub_port, mode)),
        FIRSTPASS_DB=str(tmp / f"peer-{mode}.db"),
        FIRSTPASS_UPSTREAM_OPENAI=f"http://127.0.0.1:{stub_port}",
        FIRSTPASS_PROMPT_SALT="overhead-benchmark",
        RUST_LOG="error",
    )
    return subprocess.Popen(
        [str(exe), "up"], cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def fmt(r: LoadResult) -> str:
    return f"p50 {r.p50:7.3f} ms  p99 {r.pct(99):7.3f} ms  {r.rps:8.0f} req/s  (n={r.n})"


async def measure(
    direct: str,
    proxy: str,
    *,
    requests: int,
    verified_requests: int,
    peer: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    plain = {"model": "bench", "messages": [{"role": "user", "content": "write add(a, b)"}]}
    verified = {**plain, "firstpass": CHECKS}
    rows: list[dict[str, Any]] = []
    for path, body, n in (
        ("pass-through", plain, requests),
        ("verified", verified, verified_requests),
    ):
        for conc in (1, 32):
            d = await run_load(direct, plain, concurrency=conc, requests=n)
            p = await run_load(proxy, body, concurrency=conc, requests=n)
            bad = {s: c for s, c in p.statuses.items() if s != 200}
            q = None
            if peer is not None:
                q = await run_load(
                    peer[path],
                    plain,
                    concurrency=conc,
                    requests=n,
                    headers={"Authorization": "Bearer benchmark"},
                )
                bad.update({f"peer {s}": c for s, c in q.statuses.items() if s != 200})
            rows.append(
                {
                    "path": path,
                    "concurrency": conc,
                    "direct": d,
                    "proxy": p,
                    "peer": q,
                    "added_p50": p.p50 - d.p50,
                    "added_p99": p.pct(99) - d.pct(99),
                    "errors": bad,
                }
            )
            print(f"{path:<12} c={conc:<3} direct {fmt(d)}")
            print(
                f"{'':<12} {'':<5} proxy  {fmt(p)}   added p50 {p.p50 - d.p50:+.3f} ms"
                f"{'  ERRORS ' + str(bad) if bad else ''}"
            )
            if q is not None:
                print(f"{'':<12} {'':<5} peer   {fmt(q)}   added p50 {q.p50 - d.p50:+.3f} ms")
    return rows


#: the observability comparison: proxy name -> (metrics on, request log on, signing on)
OBSERVABILITY_VARIANTS: dict[str, tuple[bool, bool, bool]] = {
    "off": (False, False, False),
    "metrics": (True, False, False),
    "log": (False, True, False),
    "metrics+log": (True, True, False),
    "metrics+log+signing": (True, True, True),
}


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) the process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure_observability(
    direct: str,
    proxies: dict[str, str],
    *,
    requests: int,
    rounds: int = 10,
    pids: dict[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Pass-through through each proxy variant, interleaved: ``rounds`` short runs per variant in
    rotating order, so drift in the machine's load falls on every variant alike. With ``pids``,
    also each proxy process's CPU time per request (latencies on a busy machine wander; the
    CPU a process spent on its own requests much less)."""
    plain = {"model": "bench", "messages": [{"role": "user", "content": "write add(a, b)"}]}
    urls = {"direct": direct, **proxies}
    rows: list[dict[str, Any]] = []
    for conc in (1, 32):
        latencies: dict[str, list[float]] = {name: [] for name in urls}
        walls = dict.fromkeys(urls, 0.0)
        statuses: dict[str, dict[int, int]] = {name: {} for name in urls}
        names = list(urls)
        cpu = dict.fromkeys(urls, 0.0)
        sent = dict.fromkeys(urls, 0)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                pid = (pids or {}).get(name)
                before = process_cpu_s(pid) if pid else 0.0
                res = await run_load(
                    urls[name], plain, concurrency=conc, requests=requests // rounds, warmup=20
                )
                if pid:
                    await asyncio.sleep(0.06)  # the post-response work and the log batch
                    cpu[name] += process_cpu_s(pid) - before
                sent[name] += res.n + 20
                latencies[name].extend(res.latencies_ms)
                walls[name] += res.wall_s
                for status, count in res.statuses.items():
                    statuses[name][status] = statuses[name].get(status, 0) + count
        results = {
            name: LoadResult(
                latencies_ms=tuple(latencies[name]), wall_s=walls[name], statuses=statuses[name]
            )
            for name in urls
        }
        d = results["direct"]
        print(f"pass-through c={conc:<3} direct {fmt(d)}")
        cpu_us = {name: cpu[name] / max(1, sent[name]) * 1e6 for name in urls}
        for name in proxies:
            p = results[name]
            bad = {st: c for st, c in p.statuses.items() if st != 200}
            vs_off = p.p50 - results["off"].p50
            print(
                f"{'':<16} {name:<20} {fmt(p)}  added p50 {p.p50 - d.p50:+.3f} ms"
                f"  vs off {vs_off:+.3f} ms  CPU/req {cpu_us[name]:.0f} us"
                f"{'  ERRORS ' + str(bad) if bad else ''}"
            )
            rows.append(
                {
                    "variant": name,
                    "concurrency": conc,
                    "direct": d,
                    "proxy": p,
                    "added_p50": p.p50 - d.p50,
                    "vs_off_p50": vs_off,
                    "vs_off_rps": p.rps / results["off"].rps if results["off"].rps else 0.0,
                    "cpu_us": cpu_us[name] if pids else None,
                    "cpu_vs_off_us": cpu_us[name] - cpu_us["off"] if pids else None,
                    "errors": bad,
                }
            )
    return rows


def observe_cpu_us(record: dict[str, Any], n: int = 20_000) -> dict[str, float]:
    """CPU per request (µs) of what the server does for one receipt after the response, in this
    process on a real receipt: the metric updates, and the JSON ``request`` event rendered and
    handed to the log thread. Less exposed to the machine's load than latencies are."""
    import structlog

    from firstpass.logs import close_logging, configure_logging
    from firstpass.observe import ObservedSink, RequestMetrics, observe_record

    metrics = RequestMetrics()
    out: dict[str, float] = {}
    t0 = time.process_time()
    for _ in range(n):
        observe_record(metrics, record)
    out["metrics"] = (time.process_time() - t0) / n * 1e6
    with open(os.devnull, "w") as devnull:
        configure_logging({"FIRSTPASS_LOG_FORMAT": "json"}, background=True, stream=devnull)
        sink = ObservedSink(None, metrics=None, request_log=True)  # type: ignore[arg-type]
        t0 = time.process_time()
        for _ in range(n):
            sink.observe(record)
        close_logging()  # the writes are counted too: process time covers the thread
        out["request log"] = (time.process_time() - t0) / n * 1e6
    structlog.reset_defaults()
    return out


def observability_markdown(
    rows: list[dict[str, Any]], argv: list[str], note: str, cpu: dict[str, float]
) -> str:
    lines = [
        "# What metrics, the request log and signing cost on the pass-through path",
        "",
        f"- command: `python -m benchmarks.overhead {' '.join(argv)}`",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}",
        "- stub upstream: 0 ms; one `firstpass serve` per variant, all running, measured "
        "interleaved in rotating order; logs JSON at level info to a file; receipts fsync batch",
        *([f"- {note}"] if note else []),
        "",
        "| variant | concurrency | direct p50 ms | proxy p50 ms | added p50 ms | p50 vs off ms | proxy p99 ms | req/s | req/s vs off | proxy CPU µs/req | CPU vs off µs/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d, p = r["direct"], r["proxy"]
        cpu_text = "-" if r["cpu_us"] is None else f"{r['cpu_us']:.0f}"
        cpu_vs = "-" if r["cpu_vs_off_us"] is None else f"{r['cpu_vs_off_us']:+.0f}"
        lines.append(
            f"| {r['variant']} | {r['concurrency']} | {d.p50:.3f} | {p.p50:.3f} | "
            f"{r['added_p50']:+.3f} | {r['vs_off_p50']:+.3f} | {p.pct(99):.3f} | {p.rps:.0f} | "
            f"{r['vs_off_rps']:.2f}x | {cpu_text} | {cpu_vs} |"
        )
    lines += [
        "",
        "`off` is `[observability] metrics = false, request_log = false`; `metrics`, `log` one "
        "of them on; `metrics+log` the defaults; `+signing` adds `[receipts] signing_key` (a "
        "checkpoint every 60 s). p50 vs off: the variant's p50 minus off's, same run.",
        "",
        "CPU per request, in process, on a pass-through receipt of this run: "
        + ", ".join(f"{name} {us:.1f} µs" for name, us in cpu.items())
        + f" (total {sum(cpu.values()):.1f} µs).",
    ]
    return "\n".join(lines) + "\n"


def run_observability(args: argparse.Namespace, argv: list[str]) -> int:
    """``--observability``: one stub, one proxy per variant, measured side by side."""
    stub_port = free_port()
    env = bench_env(FIRSTPASS_LOG_LEVEL="info", FIRSTPASS_LOG_FORMAT="json")
    procs: list[subprocess.Popen[bytes]] = []
    note = ""
    with tempfile.TemporaryDirectory(prefix="fp-observability-") as tmp_name:
        tmp = Path(tmp_name)
        try:
            procs.append(start_stub(stub_port, env))
            key = tmp / "signing.key"
            made = subprocess.run(
                [sys.executable, "-m", "firstpass", "keygen", "--out", str(key)],
                cwd=ROOT,
                env=env,
                capture_output=True,
                timeout=60,
            )
            proxies: dict[str, str] = {}
            pids: dict[str, int] = {}
            for name, (metrics, request_log, sign) in OBSERVABILITY_VARIANTS.items():
                if sign and made.returncode != 0:
                    note = f"signing skipped: firstpass keygen failed ({made.stderr[-200:]!r})"
                    continue
                port = free_port()
                cfg = write_config(
                    tmp,
                    stub_port,
                    port,
                    name=name.replace("+", "-"),
                    metrics=metrics,
                    request_log=request_log,
                    signing_key=key if sign else None,
                )
                log = open(tmp / f"{cfg.stem}.log", "wb")  # noqa: SIM115 - closed with the process
                procs.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "firstpass", "serve", "--config", str(cfg)],
                        cwd=ROOT,
                        env=env,
                        stderr=log,
                    )
                )
                log.close()
                proxies[name] = f"http://127.0.0.1:{port}/v1/chat/completions"
                pids[name] = procs[-1].pid
            wait_ready(f"http://127.0.0.1:{stub_port}/v1/models")
            for name, url in list(proxies.items()):
                try:
                    wait_ready(url.replace("/v1/chat/completions", "/readyz"), timeout=20)
                except RuntimeError as exc:
                    if not any(OBSERVABILITY_VARIANTS[name]):
                        raise
                    note = f"{name} skipped: {exc}"
                    del proxies[name]
            run = loop_runner()
            rows = run(
                measure_observability(
                    f"http://127.0.0.1:{stub_port}/v1/chat/completions",
                    proxies,
                    requests=args.requests,
                    pids=pids,
                )
            )
            with open(tmp / "metrics-log-receipts.jsonl", "rb") as fh:
                sample = json.loads(fh.readline())
            sample = {k: v for k, v in sample.items() if k not in ("hash", "prev_hash")}
            cpu = observe_cpu_us(sample)
            print("CPU per request (µs): " + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items()))
        finally:
            stop_all(procs)
    md = observability_markdown(rows, argv, note, cpu)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "overhead-observability.md").write_text(md)
    print()
    print(md)
    return 0


#: the same pass-through task in each dialect: (path, body, headers)
DIALECT_REQUESTS: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {
    "chat": (
        "/v1/chat/completions",
        {
            "model": "bench",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "write add(a, b)"}],
        },
        {},
    ),
    "responses": (
        "/v1/responses",
        {"model": "bench", "max_output_tokens": 256, "input": "write add(a, b)"},
        {},
    ),
    "messages": (
        "/v1/messages",
        {
            "model": "bench",
            "max_tokens": 256,
            "messages": [{"role": "user", "content": "write add(a, b)"}],
        },
        {"anthropic-version": "2023-06-01"},
    ),
}


async def measure_dialects(
    direct: str, proxy_root: str, *, requests: int, rounds: int
) -> list[dict[str, Any]]:
    """Per concurrency: the stub alone and each dialect through the proxy, ``rounds`` rounds
    of ``requests / rounds`` each, the order rotated every round; latencies pooled."""
    plain = DIALECT_REQUESTS["chat"][1]
    rows: list[dict[str, Any]] = []
    per_round = max(1, requests // rounds)
    for conc in (1, 32):
        names = ["direct", *DIALECT_REQUESTS]
        pooled: dict[str, list[float]] = {name: [] for name in names}
        walls: dict[str, float] = dict.fromkeys(names, 0.0)
        bad: dict[str, dict[int, int]] = {}
        for r in range(rounds):
            order = names[r % len(names) :] + names[: r % len(names)]
            for name in order:
                if name == "direct":
                    result = await run_load(direct, plain, concurrency=conc, requests=per_round)
                else:
                    path, body, headers = DIALECT_REQUESTS[name]
                    result = await run_load(
                        proxy_root + path,
                        body,
                        concurrency=conc,
                        requests=per_round,
                        headers=headers,
                    )
                pooled[name].extend(result.latencies_ms)
                walls[name] += result.wall_s
                errors = {s: c for s, c in result.statuses.items() if s != 200}
                if errors:
                    bad.setdefault(name, {}).update(errors)
        results = {
            name: LoadResult(latencies_ms=tuple(pooled[name]), wall_s=walls[name], statuses={})
            for name in names
        }
        d = results["direct"]
        chat_added = results["chat"].p50 - d.p50
        print(f"c={conc:<3} direct     {fmt(d)}")
        for name in DIALECT_REQUESTS:
            p = results[name]
            added = p.p50 - d.p50
            print(
                f"{'':<5} {name:<10} {fmt(p)}   added p50 {added:+.3f} ms"
                f"   vs chat {added - chat_added:+.3f} ms"
                f"{'  ERRORS ' + str(bad[name]) if name in bad else ''}"
            )
            rows.append(
                {
                    "dialect": name,
                    "concurrency": conc,
                    "direct": d,
                    "proxy": p,
                    "added_p50": added,
                    "vs_chat_p50": added - chat_added,
                    "errors": bad.get(name, {}),
                }
            )
    return rows


def dialects_markdown(rows: list[dict[str, Any]], argv: list[str]) -> str:
    lines = [
        "# Pass-through overhead per API dialect",
        "",
        f"`python -m benchmarks.overhead {' '.join(argv)}` on {platform.node()} "
        f"({os.cpu_count()} CPUs), {datetime.now(UTC):%Y-%m-%d %H:%M} UTC. One stub (0 ms), one "
        "proxy (`firstpass serve`, uvloop), the same task in each dialect, measured in "
        "interleaved rounds; added = proxy p50 minus the stub's own p50 in the same rounds.",
        "",
        "| concurrency | dialect | p50 ms | p99 ms | req/s | added p50 ms | vs chat ms | errors |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        p = r["proxy"]
        lines.append(
            f"| {r['concurrency']} | {r['dialect']} | {p.p50:.3f} | {p.pct(99):.3f} | "
            f"{p.rps:.0f} | {r['added_p50']:+.3f} | {r['vs_chat_p50']:+.3f} | "
            f"{r['errors'] or ''} |"
        )
    return "\n".join(lines) + "\n"


def run_dialects(args: argparse.Namespace, argv: list[str]) -> int:
    """``--dialects``: one stub, one proxy, the pass-through path through each API."""
    stub_port, proxy_port = free_port(), free_port()
    env = bench_env(FIRSTPASS_LOG_LEVEL="warning")
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="fp-dialects-") as tmp:
        try:
            procs.append(start_stub(stub_port, env))
            cfg = write_config(Path(tmp), stub_port, proxy_port)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "firstpass", "serve", "--config", str(cfg)],
                    cwd=ROOT,
                    env=env,
                )
            )
            wait_ready(f"http://127.0.0.1:{stub_port}/v1/models")
            wait_ready(f"http://127.0.0.1:{proxy_port}/readyz")
            run = loop_runner()
            rows = run(
                measure_dialects(
                    f"http://127.0.0.1:{stub_port}/v1/chat/completions",
                    f"http://127.0.0.1:{proxy_port}",
                    requests=args.requests,
                    rounds=args.rounds,
                )
            )
        finally:
            stop_all(procs)
    md = dialects_markdown(rows, argv)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "overhead-dialects.md").write_text(md)
    print()
    print(md)
    return 0


def markdown(
    rows: list[dict[str, Any]], argv: list[str], peer_note: str = "", workers: int = 1
) -> str:
    proxy = "`firstpass serve` (uvloop" + (f", {workers} workers)" if workers > 1 else ")")
    lines = [
        "# Proxy overhead",
        "",
        f"- command: `python -m benchmarks.overhead {' '.join(argv)}`",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}",
        f"- stub upstream: 0 ms, separate process; proxy: {proxy}, receipts on (fsync batch)",
        "",
        "| path | concurrency | direct p50 ms | proxy p50 ms | added p50 ms | direct p99 ms | proxy p99 ms | added p99 ms | proxy req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d, p = r["direct"], r["proxy"]
        lines.append(
            f"| {r['path']} | {r['concurrency']} | {d.p50:.3f} | {p.p50:.3f} | {r['added_p50']:+.3f} | "
            f"{d.pct(99):.3f} | {p.pct(99):.3f} | {r['added_p99']:+.3f} | {p.rps:.0f} |"
        )
    lines.append("")
    lines.append(
        "The verified path runs one visible assert and a 10-case gate in the sandbox per request."
    )
    lines += ["", f"## Peer: `firstpass=={PEER_VERSION}` from PyPI (Rust, unrelated project)", ""]
    if not any(r.get("peer") for r in rows):
        lines.append(f"Skipped: {peer_note or 'not run (--no-peer)'}.")
        return "\n".join(lines) + "\n"
    lines += [
        f"{peer_note}. Same stub, same load generator, measured right after ours in the same run. "
        "Pass-through = its `FIRSTPASS_MODE=observe`; verified = `enforce` with one subprocess "
        "gate (`cmd`) running the same visible assert and 10 cases in a fresh Python process, "
        "without a sandbox (ours runs them isolated in the sandbox).",
        "",
        "| path | concurrency | ours added p50 ms | peer added p50 ms | ours/peer p50 | "
        "ours added p99 ms | peer added p99 ms | ours req/s | peer req/s | ours/peer req/s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        d, p, q = r["direct"], r["proxy"], r.get("peer")
        if q is None:
            continue
        qa50, qa99 = q.p50 - d.p50, q.pct(99) - d.pct(99)
        ratio = f"{r['added_p50'] / qa50:.2f}" if qa50 > 0 else "-"
        lines.append(
            f"| {r['path']} | {r['concurrency']} | {r['added_p50']:+.3f} | {qa50:+.3f} | {ratio} | "
            f"{r['added_p99']:+.3f} | {qa99:+.3f} | {p.rps:.0f} | {q.rps:.0f} | "
            f"{p.rps / q.rps:.2f} |"
        )
    lines.append("")
    lines.append(
        "ours/peer p50 is the ratio of added latencies (below 1: ours adds less); "
        "ours/peer req/s is the throughput ratio (above 1: ours serves more)."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="per pass-through measurement")
    parser.add_argument(
        "--verified-requests", type=int, default=300, help="per verified measurement"
    )
    parser.add_argument("--no-write", action="store_true", help="do not write results/overhead.md")
    parser.add_argument(
        "--no-peer", action="store_true", help=f"skip the peer firstpass=={PEER_VERSION}"
    )
    parser.add_argument("--workers", type=int, default=1, help="[server] workers of the proxy")
    parser.add_argument(
        "--observability",
        action="store_true",
        help="instead: pass-through with metrics and the request log off, on, and on with "
        "signing, side by side in one run (writes results/overhead-observability.md)",
    )
    parser.add_argument(
        "--dialects",
        action="store_true",
        help="instead: pass-through through Chat Completions, Responses and Messages on one "
        "proxy, interleaved (writes results/overhead-dialects.md)",
    )
    parser.add_argument(
        "--rounds", type=int, default=6, help="--dialects: interleaved rounds per concurrency"
    )
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)
    if args.observability:
        return run_observability(args, argv)
    if args.dialects:
        return run_dialects(args, argv)

    stub_port, proxy_port = free_port(), free_port()
    env = bench_env(FIRSTPASS_LOG_LEVEL="warning")
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="fp-overhead-") as tmp:
        try:
            procs.append(start_stub(stub_port, env))
            cfg = write_config(Path(tmp), stub_port, proxy_port, args.workers)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "firstpass", "serve", "--config", str(cfg)],
                    cwd=ROOT,
                    env=env,
                )
            )
            wait_ready(f"http://127.0.0.1:{stub_port}/v1/models")
            for _ in range(4 * args.workers):  # each new connection may reach another worker
                wait_ready(f"http://127.0.0.1:{proxy_port}/readyz")
            peer: dict[str, str] | None = None
            peer_note = "not run (--no-peer)"
            if not args.no_peer:
                exe, how = peer_binary()
                if exe is None:
                    peer_note = how
                    print(f"peer skipped: {how}", file=sys.stderr)
                else:
                    ports = {"observe": free_port(), "enforce": free_port()}
                    try:
                        for mode, port in ports.items():
                            procs.append(start_peer(exe, Path(tmp), stub_port, mode, port))
                            wait_ready(f"http://127.0.0.1:{port}/healthz")
                        peer = {
                            "pass-through": f"http://127.0.0.1:{ports['observe']}/v1/chat/completions",
                            "verified": f"http://127.0.0.1:{ports['enforce']}/v1/chat/completions",
                        }
                        peer_note = f"peer {exe} ({how})"
                    except (OSError, RuntimeError) as exc:
                        peer_note = f"the peer did not start: {exc}"
                        print(f"peer skipped: {peer_note}", file=sys.stderr)
            run = loop_runner()
            rows = run(
                measure(
                    f"http://127.0.0.1:{stub_port}/v1/chat/completions",
                    f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
                    requests=args.requests,
                    verified_requests=args.verified_requests,
                    peer=peer,
                )
            )
        finally:
            stop_all(procs)
    md = markdown(rows, argv, peer_note, args.workers)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "overhead.md").write_text(md)
    print()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
