"""The reliability suite's clients: a seeded traffic mix, closed-loop clients, and what each
request got back (an answer in OpenAI's shape or not, its receipt id, its latency).

A request "got an answer" when the whole HTTP response arrived and is either a completion
(``choices``, or an SSE stream ending in ``[DONE]``) or an OpenAI-shaped error
(``{"error": {"message": str, "type": str, ...}}``, or such an SSE ``error`` event).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from benchmarks._reliability_stack import MODEL
from tests.add_task import TESTS

__all__ = ["Got", "Mix", "Planned", "plan", "run_clients"]


@dataclass(frozen=True, kw_only=True)
class Mix:
    """The traffic: mode shares (``passthrough`` sends no tests), the cheap model's answers
    among verified requests, and the share of streamed requests."""

    modes: dict[str, float] = field(
        default_factory=lambda: {
            "passthrough": 0.3,
            "cascade": 0.25,
            "shadow": 0.25,
            "enforce": 0.2,
        }
    )
    answers: dict[str, float] = field(
        default_factory=lambda: {"good": 0.6, "wrong": 0.25, "visible_only": 0.15}
    )
    stream: float = 0.2
    #: send the mode in the ``X-Firstpass-Mode`` header instead of the body, this share of times
    header_mode: float = 0.2
    model: str = MODEL


@dataclass(frozen=True, kw_only=True)
class Planned:
    """One request to send."""

    index: int
    mode: str
    answer: str
    stream: bool
    header_mode: bool
    model: str = MODEL

    def body(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [
                {
                    "role": "user",
                    "content": f"Write add(a, b). [answer:{self.answer}] #{self.index}",
                }
            ],
        }
        if self.stream:
            body["stream"] = True
        if self.mode != "passthrough":
            body["firstpass"] = dict(TESTS)
            if not self.header_mode:
                body["firstpass"]["mode"] = self.mode
        return body

    def headers(self) -> dict[str, str]:
        if self.header_mode and self.mode != "passthrough":
            return {"X-Firstpass-Mode": self.mode}
        return {}


def _pick(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


def plan(n: int, mix: Mix, *, seed: int, start: int = 0) -> list[Planned]:
    """``n`` requests drawn from ``mix`` with a seeded generator."""
    rng = random.Random(seed)
    out = []
    for i in range(start, start + n):
        mode = _pick(rng, mix.modes)
        out.append(
            Planned(
                index=i,
                mode=mode,
                answer=_pick(rng, mix.answers) if mode != "passthrough" else "good",
                stream=rng.random() < mix.stream,
                header_mode=rng.random() < mix.header_mode,
                model=mix.model,
            )
        )
    return out


@dataclass(frozen=True, kw_only=True)
class Got:
    """What one request got back."""

    planned: Planned
    status: int | None  # None: no HTTP response at all
    shape: str  # "completion" | "error" | "malformed" | "none"
    receipt_id: str | None
    error_type: str | None = None
    error_code: str | None = None
    failure: str | None = None  # the client-side exception when there was no response
    retry_after: str | None = None
    started: float = 0.0
    latency_ms: float = 0.0

    @property
    def answered(self) -> bool:
        return self.shape in ("completion", "error")


def _error_fields(obj: Any) -> tuple[str, str | None] | None:
    """(type, code) of an OpenAI-shaped error object, else None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("error"), dict):
        return None
    err = obj["error"]
    if not isinstance(err.get("message"), str) or not err["message"]:
        return None
    if not isinstance(err.get("type"), str):
        return None
    code = err.get("code")
    return err["type"], code if isinstance(code, str) else None


def classify(
    status: int, content_type: str, raw: bytes
) -> tuple[str, str | None, str | None, str | None]:
    """(shape, error type, error code, receipt id from the body) of one response."""
    if "text/event-stream" in content_type:
        rid = None
        done = False
        for line in raw.decode("utf-8", "replace").split("\n"):
            if not line.startswith("data: "):
                continue
            data = line[6:].strip()
            if data == "[DONE]":
                done = True
                continue
            try:
                obj = json.loads(data)
            except ValueError:
                return "malformed", None, None, rid
            fields = _error_fields(obj)
            if fields is not None:
                return "error", fields[0], fields[1], rid
            cid = obj.get("id") if isinstance(obj, dict) else None
            if isinstance(cid, str) and cid.startswith("chatcmpl-rcpt_"):
                rid = cid.removeprefix("chatcmpl-")
        return ("completion" if done and status == 200 else "malformed"), None, None, rid
    try:
        obj = json.loads(raw)
    except ValueError:
        return "malformed", None, None, None
    if status == 200:
        ok = isinstance(obj, dict) and isinstance(obj.get("choices"), list) and obj["choices"]
        return ("completion" if ok else "malformed"), None, None, None
    fields = _error_fields(obj)
    if fields is None:
        return "malformed", None, None, None
    return "error", fields[0], fields[1], None


async def _one(session: aiohttp.ClientSession, url: str, p: Planned, timeout_s: float) -> Got:
    t0 = time.perf_counter()
    try:
        async with session.post(
            url,
            data=json.dumps(p.body()),
            headers={"Content-Type": "application/json", **p.headers()},
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as r:
            raw = await r.read()
            shape, etype, ecode, body_rid = classify(
                r.status, r.headers.get("Content-Type", ""), raw
            )
            return Got(
                planned=p,
                status=r.status,
                shape=shape,
                receipt_id=r.headers.get("X-Firstpass-Receipt") or body_rid,
                error_type=etype,
                error_code=ecode,
                retry_after=r.headers.get("Retry-After"),
                started=t0,
                latency_ms=(time.perf_counter() - t0) * 1000,
            )
    except (aiohttp.ClientError, TimeoutError, ConnectionError) as exc:
        return Got(
            planned=p,
            status=None,
            shape="none",
            receipt_id=None,
            failure=type(exc).__name__,
            started=t0,
            latency_ms=(time.perf_counter() - t0) * 1000,
        )


async def run_clients(
    base_url: str,
    requests: Sequence[Planned],
    *,
    clients: int,
    timeout_s: float = 120.0,
    stop: asyncio.Event | None = None,
    out: list[Got] | None = None,
) -> list[Got]:
    """Send ``requests`` from ``clients`` closed-loop clients (each sends its next request when
    its last one is answered) until they run out or ``stop`` is set; returns what each got, in
    completion order (``out``, when given, is filled as they complete)."""
    url = f"{base_url}/v1/chat/completions"
    results: list[Got] = out if out is not None else []
    queue: Iterator[Planned] = iter(requests)
    connector = aiohttp.TCPConnector(limit=clients, force_close=False)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def client() -> None:
            for p in queue:
                if stop is not None and stop.is_set():
                    return
                results.append(await _one(session, url, p, timeout_s))

        await asyncio.gather(*(client() for _ in range(clients)))
    return results
