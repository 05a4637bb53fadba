"""How much latency the proxy adds, and how many requests a second it serves.

Runs, in one go and side by side: the stub upstream alone (direct) and Firstpass in front of it
(proxy), for a request without checks (pass-through) and a verified one (visible test + gate),
at concurrency 1 and 32. Each of stub, proxy and load generator is its own process, as in
production; the stub answers in 0 ms. Prints medians and p99, the added latency (proxy minus
direct, same path and concurrency) and throughput, and writes benchmarks/results/overhead.md.

    python -m benchmarks.overhead [--requests 3000] [--verified-requests 300]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from benchmarks.loadgen import LoadResult, run_load

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"

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


def write_config(tmp: Path, stub_port: int, proxy_port: int) -> Path:
    cfg = tmp / "firstpass.toml"
    cfg.write_text(
        f"""
[server]
host = "127.0.0.1"
port = {proxy_port}
max_concurrency = 4096

[receipts]
path = "{tmp / "receipts.jsonl"}"
fsync = "batch"

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


def fmt(r: LoadResult) -> str:
    return f"p50 {r.p50:7.3f} ms  p99 {r.pct(99):7.3f} ms  {r.rps:8.0f} req/s  (n={r.n})"


async def measure(
    direct: str, proxy: str, *, requests: int, verified_requests: int
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
            rows.append(
                {
                    "path": path,
                    "concurrency": conc,
                    "direct": d,
                    "proxy": p,
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
    return rows


def markdown(rows: list[dict[str, Any]], argv: list[str]) -> str:
    lines = [
        "# Proxy overhead",
        "",
        f"- command: `python -m benchmarks.overhead {' '.join(argv)}`",
        f"- date: {datetime.now(UTC).isoformat(timespec='seconds')}",
        f"- machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, {platform.system()} {platform.release()}",
        "- stub upstream: 0 ms, separate process; proxy: `firstpass serve` (uvloop), receipts on (fsync batch)",
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
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000, help="per pass-through measurement")
    parser.add_argument(
        "--verified-requests", type=int, default=300, help="per verified measurement"
    )
    parser.add_argument("--no-write", action="store_true", help="do not write results/overhead.md")
    args = parser.parse_args(argv)
    argv = list(sys.argv[1:] if argv is None else argv)

    stub_port, proxy_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    env["FIRSTPASS_LOG_LEVEL"] = "warning"
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="fp-overhead-") as tmp:
        try:
            procs.append(
                subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "tests.stub_upstream",
                        "--port",
                        str(stub_port),
                        "--latency-ms",
                        "0",
                        "--answer",
                        ANSWER,
                    ],
                    cwd=ROOT,
                    env=env,
                )
            )
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
            try:
                import uvloop

                run = uvloop.run
            except ImportError:
                run = asyncio.run
            rows = run(
                measure(
                    f"http://127.0.0.1:{stub_port}/v1/chat/completions",
                    f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
                    requests=args.requests,
                    verified_requests=args.verified_requests,
                )
            )
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    md = markdown(rows, argv)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "overhead.md").write_text(md)
    print()
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
