"""What the check library costs per answer, in-process and end to end through the proxy.

In-process: median and p90 of ``await check.run(answer, request)`` for each kind
(``firstpass.checks``), one call at a time on one event loop (uvloop when installed, as the
server runs): ``basic``, ``regex``, ``context`` (a ~2 KB context), ``json_schema`` (an order
schema with nested objects, patterns and enums: a valid answer, an invalid one, a fenced one), a
``composite`` of basic + regex + json_schema, what a request-supplied schema costs to parse and
build (``parse_check`` + ``build_check``: the metaschema check a request's schema gets on every
request), and ``command`` (a tiny Python grader in a temp dir: two interpreter starts, the
launcher and the grader) beside a bare ``python -I -S -c pass`` started the same way; and, as
a reference for the kinds that work off the event loop (``regex``, ``json_schema``), one
``await firstpass.checks.off_loop`` of a no-op (the hop to the checks' own thread pool).

End to end: the stub upstream (0 ms, its own process) and ``firstpass serve`` (its own process,
receipts on) as ``benchmarks/overhead.py`` runs them, the load generator in this process. The
stub always answers the same valid order JSON. Paths, on one proxy and one single-rung route
pair, measured in interleaved rounds so that drift hits them alike:

- ``direct``: the stub alone (the baseline "added" latency is measured against);
- ``passthrough``: route ``plain``, a request without checks (forwarded, no verification);
- ``verified, basic``: route ``plain``, the request adds ``firstpass.checks.visible =
  [{"kind": "basic"}]``: the verified cascade with the cheapest check there is;
- ``verified, route json_schema``: route ``orders`` with ``[[route.visible_checks]]`` = the
  order schema, a plain request: the verified cascade with one real check;
- ``verified, request json_schema``: route ``plain``, the request carries the same schema as
  its visible check (validated against the metaschema and compiled per request, on the
  checks' threads: milliseconds of CPU, so this path gets ``--requests`` / 8 requests).

The fair pair for "what a visible json_schema check costs on a route" is ``verified, route
json_schema`` minus ``verified, basic``: both run the cascade, one visible check, a receipt with
checks; only the check differs. ``verified, basic`` minus ``passthrough`` is the cost of the
verification machinery itself. Prints numbers only; never asserts times.

    python -m benchmarks.checks_bench [--iters 2000] [--command-iters 60] [--requests 1200]
                                      [--rounds 4] [--no-e2e]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from benchmarks._report import machine, percentile, revision
from benchmarks.loadgen import LoadResult, run_load
from benchmarks.overhead import free_port, wait_ready
from firstpass.checks import CheckRequest, build_check, off_loop, parse_check

__all__ = ["ORDER_SCHEMA", "end_to_end", "main", "micro"]

ROOT = Path(__file__).resolve().parent.parent

#: a realistic order: nested objects, an array of line items with patterns and bounds, enums
ORDER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id", "customer", "items", "currency", "shipping"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "integer", "minimum": 1},
        "customer": {
            "type": "object",
            "required": ["name", "email"],
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 200},
                "email": {"type": "string", "format": "email"},
                "vip": {"type": "boolean"},
            },
        },
        "items": {
            "type": "array",
            "minItems": 1,
            "maxItems": 100,
            "items": {
                "type": "object",
                "required": ["sku", "qty", "unit_price"],
                "additionalProperties": False,
                "properties": {
                    "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{4}$"},
                    "qty": {"type": "integer", "minimum": 1, "maximum": 1000},
                    "unit_price": {"type": "number", "minimum": 0},
                    "note": {"type": "string", "maxLength": 500},
                },
            },
        },
        "currency": {"enum": ["EUR", "USD", "GBP", "CHF"]},
        "shipping": {
            "type": "object",
            "required": ["street", "city", "country"],
            "properties": {
                "street": {"type": "string"},
                "city": {"type": "string"},
                "postcode": {"type": "string", "pattern": "^[0-9A-Z -]{3,10}$"},
                "country": {"type": "string", "pattern": "^[A-Z]{2}$"},
            },
        },
        "express": {"type": "boolean"},
    },
}

_ORDER: dict[str, Any] = {
    "id": 48213,
    "customer": {"name": "Ada Lovelace", "email": "ada@example.com", "vip": True},
    "items": [
        {"sku": "BRK-1042", "qty": 2, "unit_price": 19.9},
        {"sku": "PAD-0007", "qty": 1, "unit_price": 4.5, "note": "gift wrap"},
        {"sku": "CHN-3310", "qty": 4, "unit_price": 12.0},
        {"sku": "LUB-0100", "qty": 1, "unit_price": 7.25},
        {"sku": "TYR-2800", "qty": 2, "unit_price": 39.0},
    ],
    "currency": "EUR",
    "shipping": {
        "street": "12 Analytical Row",
        "city": "London",
        "postcode": "NW1 6XE",
        "country": "GB",
    },
    "express": False,
}
#: the valid answer, as a model returning bare JSON would (~700 bytes)
ORDER_ANSWER = json.dumps(_ORDER, indent=2)
#: three violations: a bad SKU, a zero quantity, an unknown currency
ORDER_INVALID = json.dumps(
    {
        **_ORDER,
        "items": [{"sku": "brk-1042", "qty": 0, "unit_price": 19.9}, *_ORDER["items"][1:]],
        "currency": "YEN",
    },
    indent=2,
)
#: the valid order inside prose and a ```json fence (the whole answer does not parse)
ORDER_FENCED = (
    "Here is the order you asked for, with the five items from the basket:\n\n```json\n"
    + ORDER_ANSWER
    + "\n```\n\nLet me know if the shipping address should change."
)

_PASSAGES = (
    "The Analytical Engine was a proposed mechanical general-purpose computer designed by the "
    "English mathematician and computer pioneer Charles Babbage. It was first described in "
    "1837 as the successor to the Difference Engine, which was a design for a simpler "
    "mechanical calculator. The Analytical Engine incorporated an arithmetic logic unit, "
    "control flow in the form of conditional branching and loops, and integrated memory.",
    "Ada Lovelace translated an article on the engine by the Italian military engineer Luigi "
    "Menabrea and added extensive notes of her own. Note G describes an algorithm for the "
    "engine to compute Bernoulli numbers; it is often called the first published algorithm "
    "ever specifically tailored for implementation on a computer, and Lovelace is therefore "
    "often cited as the first computer programmer.",
    "Babbage was never able to complete construction of any of his machines due to conflicts "
    "with his chief engineer and inadequate funding. It was not until 1941 that Konrad Zuse "
    "built the first general-purpose computer, the Z3, more than a century after Babbage had "
    "proposed the pioneering Analytical Engine in 1837.",
    "The engine's input, programs and data, was to be provided to the machine via punched "
    "cards, a method being used at the time to direct mechanical looms such as the Jacquard "
    "loom. For output, the machine would have a printer, a curve plotter and a bell. The "
    "store was to hold one thousand numbers of forty decimal digits each.",
    "In 1878 a committee of the British Association for the Advancement of Science described "
    "the Analytical Engine as a marvel of mechanical ingenuity, but recommended against "
    "constructing it. Parts of the mill and the printing mechanism were assembled by his son "
    "Henry Babbage after his death in 1871.",
)
#: ~2 KB of retrieved passages
CONTEXT = _PASSAGES
CONTEXT_ANSWER = (
    "Charles Babbage first described the Analytical Engine in 1837 as the successor to his "
    "Difference Engine. Ada Lovelace's Note G gave an algorithm to compute Bernoulli numbers "
    "on it, which is why she is often called the first computer programmer. The engine was "
    "never completed, for lack of funding and after conflicts with his chief engineer."
)
PROSE_ANSWER = (
    "The order ships in two parcels: the brake set and the chain on Tuesday, the tyres on "
    "Thursday. Total 221.45 EUR including VAT; tracking numbers follow by email. " * 4
)

GRADER = """
import json, sys
doc = json.load(sys.stdin)
try:
    order = json.loads(doc["answer"])
    ok = isinstance(order, dict) and isinstance(order.get("items"), list) and order["items"]
except ValueError:
    ok = False
print(json.dumps({"verdict": "pass" if ok else "fail", "reason": "" if ok else "no items"}))
"""

#: (label, definition, answer, context?, expected verdict)
Case = tuple[str, dict[str, Any], str, bool, str]


def cases(grader: Path) -> list[Case]:
    schema = {"kind": "json_schema", "name": "order", "schema": ORDER_SCHEMA}
    regex = {
        "kind": "regex",
        "name": "tone",
        "must_match": r"\d+(\.\d+)? EUR",
        "must_not_match": [r"(?i)\bas an ai\b", r"(?i)\bi (cannot|can't)\b"],
    }
    return [
        ("basic", {"kind": "basic", "min_length": 20}, PROSE_ANSWER, False, "pass"),
        ("regex (1 must, 2 must-not, ~1 KB)", regex, PROSE_ANSWER, False, "pass"),
        ("context (~2 KB context)", {"kind": "context"}, CONTEXT_ANSWER, True, "pass"),
        ("json_schema, valid order", schema, ORDER_ANSWER, False, "pass"),
        ("json_schema, invalid (3 violations)", schema, ORDER_INVALID, False, "fail"),
        ("json_schema, fenced in prose", schema, ORDER_FENCED, False, "pass"),
        (
            "composite: basic + regex + json_schema",
            {
                "kind": "composite",
                "checks": [
                    {"kind": "basic"},
                    {"kind": "regex", "must_match": r"^\s*\{", "must_not_match": r"(?i)sorry"},
                    schema,
                ],
            },
            ORDER_ANSWER,
            False,
            "pass",
        ),
        (
            "command (tiny Python grader)",
            {"kind": "command", "argv": [sys.executable, "-I", "-S", str(grader)]},
            ORDER_ANSWER,
            False,
            "pass",
        ),
    ]


async def _time(fn: Callable[[], Awaitable[Any]], n: int, warmup: int) -> tuple[list[float], Any]:
    """Per-call wall times in µs of ``n`` awaited calls (after ``warmup`` untimed ones)."""
    last = None
    for _ in range(warmup):
        last = await fn()
    out: list[float] = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        last = await fn()
        out.append((time.perf_counter_ns() - t0) / 1000)
    return out, last


def _noop() -> None:
    return None


async def _bare_start() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-I", "-S", "-c", "pass", env={}, stdin=asyncio.subprocess.DEVNULL
    )
    await proc.wait()


async def micro(iters: int, command_iters: int) -> list[dict[str, Any]]:
    """One row per case: n, median and p90 µs, the verdict it gave and the one expected."""
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="fp-checks-bench-") as tmp:
        grader = Path(tmp) / "grade.py"
        grader.write_text(GRADER)
        with_ctx = CheckRequest(
            prompt="Summarise the sources on the Analytical Engine.", context=CONTEXT
        )
        plain = CheckRequest(prompt="Give the order as JSON.")
        for label, raw, answer, ctx, expected in cases(grader):
            origin = "config" if raw["kind"] == "command" else "request"
            check = build_check(parse_check(raw, origin=origin))
            request = with_ctx if ctx else plain
            n = command_iters if raw["kind"] == "command" else iters
            lat, result = await _time(
                lambda c=check, a=answer, r=request: c.run(a, r), n, max(3, n // 10)
            )
            rows.append(_row(label, lat, result.verdict, expected))
        # a request's own schema is parsed and checked against its metaschema on every request
        raw_schema = {"kind": "json_schema", "name": "order", "schema": ORDER_SCHEMA}

        async def parse_build() -> Any:
            return build_check(parse_check(raw_schema, origin="request"))

        lat, _ = await _time(parse_build, max(1, iters // 20), 3)
        rows.append(_row("parse + build a request's json_schema", lat, "-", "-"))
        # regex and json_schema run on the checks' own threads: what the hop alone costs
        lat, _ = await _time(lambda: off_loop(_noop), iters, max(3, iters // 10))
        rows.append(_row("reference: `await off_loop(noop)` (the checks' pool)", lat, "-", "-"))
        lat, _ = await _time(_bare_start, command_iters, 3)
        rows.append(_row("reference: bare `python -I -S -c pass`", lat, "-", "-"))
    return rows


def _row(label: str, lat: list[float], verdict: str, expected: str) -> dict[str, Any]:
    return {
        "case": label,
        "n": len(lat),
        "p50_us": statistics.median(lat),
        "p90_us": percentile(lat, 90),
        "verdict": verdict,
        "expected": expected,
    }


# -- end to end -------------------------------------------------------------------------------

PATHS = (
    "direct",
    "passthrough",
    "verified, basic",
    "verified, route json_schema",
    "verified, request json_schema",
)

#: the path that parses a schema per request, and the share of ``--requests`` it gets
SLOW_PATH = "verified, request json_schema"
SLOW_SHARE = 8


def write_config(tmp: Path, stub_port: int, proxy_port: int) -> Path:
    """One proxy, two single-rung routes on the stub: ``plain`` and ``orders`` (schema)."""
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
name = "plain"
models = ["plain"]
ladder = ["stub/m"]
without_checks = "passthrough"

[[route]]
name = "orders"
models = ["orders"]
ladder = ["stub/m"]

[[route.visible_checks]]
kind = "json_schema"
name = "order"
schema = {_toml_inline(ORDER_SCHEMA)}

[[price]]
model = "stub/m"
input_per_mtok = 0.1
output_per_mtok = 0.4
"""
    )
    return cfg


def _toml_inline(value: Any) -> str:
    """A JSON value as a TOML inline value (the schema has no nulls)."""
    if isinstance(value, dict):
        return (
            "{ "
            + ", ".join(f"{json.dumps(k)} = {_toml_inline(v)}" for k, v in value.items())
            + " }"
        )
    if isinstance(value, list):
        return "[" + ", ".join(_toml_inline(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value)


def bodies() -> dict[str, dict[str, Any]]:
    msg = [{"role": "user", "content": "Give order 48213 as JSON."}]
    return {
        "direct": {"model": "m", "messages": msg},
        "passthrough": {"model": "plain", "messages": msg},
        "verified, basic": {
            "model": "plain",
            "messages": msg,
            "firstpass": {"checks": {"visible": [{"kind": "basic"}]}},
        },
        "verified, route json_schema": {"model": "orders", "messages": msg},
        "verified, request json_schema": {
            "model": "plain",
            "messages": msg,
            "firstpass": {
                "checks": {
                    "visible": [{"kind": "json_schema", "name": "order", "schema": ORDER_SCHEMA}]
                }
            },
        },
    }


def _merge(parts: list[LoadResult]) -> LoadResult:
    statuses: dict[int, int] = {}
    for p in parts:
        for s, c in p.statuses.items():
            statuses[s] = statuses.get(s, 0) + c
    return LoadResult(
        latencies_ms=tuple(x for p in parts for x in p.latencies_ms),
        wall_s=sum(p.wall_s for p in parts),
        statuses=statuses,
    )


async def measure(
    urls: dict[str, str], *, requests: int, rounds: int, concurrencies: tuple[int, ...]
) -> dict[int, dict[str, LoadResult]]:
    """Per concurrency and path: ``requests`` requests in ``rounds`` interleaved rounds."""
    body = bodies()
    out: dict[int, dict[str, LoadResult]] = {}
    for conc in concurrencies:
        parts: dict[str, list[LoadResult]] = {p: [] for p in PATHS}
        for r in range(rounds):
            order = PATHS if r % 2 == 0 else tuple(reversed(PATHS))
            for path in order:
                # a request's own schema costs milliseconds of CPU per request: fewer of those
                n = requests // SLOW_SHARE if path == SLOW_PATH else requests
                per_round = max(1, n // rounds)
                url = urls["direct"] if path == "direct" else urls["proxy"]
                await run_load(
                    url, body[path], concurrency=min(conc, 4), requests=min(20, per_round)
                )
                parts[path].append(
                    await run_load(url, body[path], concurrency=conc, requests=per_round)
                )
        out[conc] = {p: _merge(v) for p, v in parts.items()}
    return out


async def _check_paths(urls: dict[str, str]) -> dict[str, str]:
    """One request per path, read back: what the proxy did (so a misrouted pairing shows)."""
    import aiohttp

    seen: dict[str, str] = {}
    async with aiohttp.ClientSession() as s:
        for path, body in bodies().items():
            url = urls["direct"] if path == "direct" else urls["proxy"]
            async with s.post(url, json=body) as r:
                await r.read()
                action = r.headers.get("X-Firstpass-Action", "-")
                seen[path] = f"{r.status} {action}"
    return seen


def end_to_end(
    *, requests: int, rounds: int, concurrencies: tuple[int, ...]
) -> tuple[dict[int, dict[str, LoadResult]], dict[str, str]]:
    stub_port, proxy_port = free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FIRSTPASS_")}
    env["FIRSTPASS_LOG_LEVEL"] = "warning"
    procs: list[subprocess.Popen[bytes]] = []
    with tempfile.TemporaryDirectory(prefix="fp-checks-e2e-") as tmp:
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
                        ORDER_ANSWER,
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
            urls = {
                "direct": f"http://127.0.0.1:{stub_port}/v1/chat/completions",
                "proxy": f"http://127.0.0.1:{proxy_port}/v1/chat/completions",
            }
            try:
                import uvloop

                run = uvloop.run
            except ImportError:
                run = asyncio.run
            seen = run(_check_paths(urls))
            results = run(
                measure(urls, requests=requests, rounds=rounds, concurrencies=concurrencies)
            )
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
    return results, seen


# -- report -----------------------------------------------------------------------------------


def print_micro(rows: list[dict[str, Any]]) -> None:
    print("| in-process `await check.run(answer, request)` | n | p50 µs | p90 µs | verdict |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        flag = "" if r["verdict"] == r["expected"] else f" (EXPECTED {r['expected']})"
        print(
            f"| {r['case']} | {r['n']} | {r['p50_us']:,.1f} | {r['p90_us']:,.1f} | "
            f"{r['verdict']}{flag} |"
        )


def print_e2e(results: dict[int, dict[str, LoadResult]], seen: dict[str, str]) -> None:
    print()
    print(
        "| path (what the proxy answered) | c | p50 ms | p90 ms | added p50 ms vs direct | "
        "req/s | non-200 |"
    )
    print("|---|---:|---:|---:|---:|---:|---|")
    for conc, by_path in results.items():
        d = by_path["direct"]
        for path in PATHS:
            r = by_path[path]
            bad = {s: c for s, c in r.statuses.items() if s != 200}
            added = "-" if path == "direct" else f"{r.p50 - d.p50:+.3f}"
            print(
                f"| {path} ({seen.get(path, '?')}) | {conc} | {r.p50:.3f} | {r.pct(90):.3f} | "
                f"{added} | {r.rps:,.0f} | {bad or ''} |"
            )
    for conc, by_path in results.items():
        basic, route, req = (by_path[p] for p in PATHS[2:])
        pt = by_path["passthrough"]
        print(
            f"c={conc}: verified basic − passthrough {basic.p50 - pt.p50:+.3f} ms p50; "
            f"route json_schema − verified basic {route.p50 - basic.p50:+.3f} ms p50 "
            f"(req/s ratio {route.rps / basic.rps:.2f}); request json_schema − route json_schema "
            f"{req.p50 - route.p50:+.3f} ms p50 (req/s ratio {req.rps / route.rps:.2f})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=2000, help="timed calls per in-process case")
    parser.add_argument(
        "--command-iters",
        type=int,
        default=60,
        help="timed calls of the command check and the bare interpreter start",
    )
    parser.add_argument(
        "--requests", type=int, default=1200, help="requests per path and concurrency, end to end"
    )
    parser.add_argument("--rounds", type=int, default=4, help="interleaved rounds end to end")
    parser.add_argument("--concurrency", default="1,32", help="end-to-end concurrencies")
    parser.add_argument("--no-e2e", action="store_true", help="in-process numbers only")
    parser.add_argument("--json", help="also write the numbers as JSON here")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        import uvloop

        loop_name, run = "uvloop", uvloop.run
    except ImportError:
        loop_name, run = "asyncio", asyncio.run
    print(
        f"# checks_bench: python -m benchmarks.checks_bench "
        f"{' '.join(sys.argv[1:] if argv is None else argv)}"
    )
    print(
        f"machine: {machine()}; code: {revision()}; event loop: {loop_name}; "
        f"load average {os.getloadavg()[0]:.2f} at start"
    )
    print()
    rows = run(micro(args.iters, args.command_iters))
    print_micro(rows)
    doc: dict[str, Any] = {"micro": rows}
    if not args.no_e2e:
        concs = tuple(int(c) for c in args.concurrency.split(","))
        results, seen = end_to_end(requests=args.requests, rounds=args.rounds, concurrencies=concs)
        print_e2e(results, seen)
        doc["e2e"] = {
            str(c): {
                p: {
                    "p50_ms": r.p50,
                    "p90_ms": r.pct(90),
                    "rps": r.rps,
                    "n": r.n,
                    "statuses": {str(s): n for s, n in r.statuses.items()},
                }
                for p, r in by_path.items()
            }
            for c, by_path in results.items()
        }
        doc["e2e_seen"] = seen
    print(
        f"\nwall time {time.perf_counter() - started:.1f} s; "
        f"load average {os.getloadavg()[0]:.2f} at the end"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
