"""A small closed-loop HTTP/1.1 load generator: keep-alive connections, pre-built request bytes.

Light enough (raw asyncio streams, uvloop when installed) that at the request rates we measure it
is not the bottleneck; latencies are per request, from the first byte written to the last byte
of the body read. Used by ``benchmarks/overhead.py`` and ``benchmarks/probe_latency.py``.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

__all__ = ["LoadResult", "build_post", "run_load"]


@dataclass(frozen=True, kw_only=True)
class LoadResult:
    """Latencies (ms) of completed requests, wall time, and the statuses seen."""

    latencies_ms: tuple[float, ...]
    wall_s: float
    statuses: dict[int, int]

    @property
    def n(self) -> int:
        return len(self.latencies_ms)

    def pct(self, q: float) -> float:
        xs = sorted(self.latencies_ms)
        if not xs:
            return float("nan")
        i = min(len(xs) - 1, max(0, round(q / 100 * (len(xs) - 1))))
        return xs[i]

    @property
    def p50(self) -> float:
        return statistics.median(self.latencies_ms) if self.latencies_ms else float("nan")

    @property
    def rps(self) -> float:
        return self.n / self.wall_s if self.wall_s else 0.0


def build_post(
    url: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> tuple[str, int, bytes]:
    """(host, port, raw request bytes) for a JSON POST to ``url`` with keep-alive."""
    parts = urlsplit(url)
    payload = json.dumps(body).encode()
    lines = [
        f"POST {parts.path or '/'} HTTP/1.1",
        f"Host: {parts.hostname}:{parts.port}",
        "Content-Type: application/json",
        f"Content-Length: {len(payload)}",
        "Connection: keep-alive",
    ]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    raw = ("\r\n".join(lines) + "\r\n\r\n").encode() + payload
    return parts.hostname or "127.0.0.1", parts.port or 80, raw


async def _read_response(reader: asyncio.StreamReader) -> int:
    head = await reader.readuntil(b"\r\n\r\n")
    status = int(head[9:12])
    length = 0
    chunked = False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        lname = name.strip().lower()
        if lname == b"content-length":
            length = int(value)
        elif lname == b"transfer-encoding" and b"chunked" in value.lower():
            chunked = True
    if chunked:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.strip().split(b";")[0], 16)
            await reader.readexactly(size + 2)
            if size == 0:
                break
    elif length:
        await reader.readexactly(length)
    return status


async def _worker(
    host: str,
    port: int,
    raw: bytes,
    deadline: float,
    budget: list[int],
    out: list[float],
    statuses: dict[int, int],
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        while budget[0] > 0 and time.perf_counter() < deadline:
            budget[0] -= 1
            t0 = time.perf_counter()
            writer.write(raw)
            status = await _read_response(reader)
            out.append((time.perf_counter() - t0) * 1000.0)
            statuses[status] = statuses.get(status, 0) + 1
    finally:
        writer.close()


async def run_load(
    url: str,
    body: dict[str, Any],
    *,
    concurrency: int,
    requests: int,
    max_seconds: float = 30.0,
    warmup: int = 50,
    headers: dict[str, str] | None = None,
) -> LoadResult:
    """``requests`` POSTs over ``concurrency`` keep-alive connections (after a warm-up)."""
    host, port, raw = build_post(url, body, headers)
    if warmup:
        await run_load(
            url, body, concurrency=concurrency, requests=warmup, warmup=0, headers=headers
        )
    out: list[float] = []
    statuses: dict[int, int] = {}
    budget = [requests]
    deadline = time.perf_counter() + max_seconds
    t0 = time.perf_counter()
    await asyncio.gather(
        *(_worker(host, port, raw, deadline, budget, out, statuses) for _ in range(concurrency))
    )
    return LoadResult(latencies_ms=tuple(out), wall_s=time.perf_counter() - t0, statuses=statuses)
