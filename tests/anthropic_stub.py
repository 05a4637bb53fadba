"""A scriptable in-process Anthropic Messages API (``POST /v1/messages``) for tests.

It serves the recorded wire shapes in ``tests/wire/anthropic/`` (written from Anthropic's public
API reference) and records every request, so a test can assert what the anthropic provider sent
(headers, the translated body) and how it reacted to each answer (retries, errors, usage).
"""

from __future__ import annotations

import asyncio
import copy
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

WIRE = Path(__file__).parent / "wire" / "anthropic"


@dataclass(frozen=True)
class Wire:
    """One recorded answer: status, headers and JSON body."""

    status: int
    headers: dict[str, str]
    body: dict[str, Any]

    @classmethod
    def load(cls, name: str) -> Wire:
        """``tests/wire/anthropic/<name>.json``."""
        data = json.loads((WIRE / f"{name}.json").read_text("utf-8"))
        return cls(status=data["status"], headers=dict(data["headers"]), body=data["body"])

    def text(self, text: str) -> Wire:
        """This message with its text blocks replaced by one block holding ``text``."""
        body = copy.deepcopy(self.body)
        others = [b for b in body["content"] if b["type"] != "text"]
        body["content"] = [{"type": "text", "text": text}, *others]
        return Wire(status=self.status, headers=dict(self.headers), body=body)

    def with_headers(self, **headers: str) -> Wire:
        return Wire(status=self.status, headers={**self.headers, **headers}, body=self.body)


@dataclass(frozen=True)
class Seen:
    """One request as the stub received it."""

    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    at: float


@dataclass
class AnthropicStub:
    """``url`` is the API root (``http://127.0.0.1:<port>``), as ``base_url`` takes it."""

    require_key: str | None = None
    default: Wire = field(default_factory=lambda: Wire.load("message_text"))
    requests: list[Seen] = field(default_factory=list)
    _queue: list[Wire] = field(default_factory=list)
    _barrier: int = 0
    _arrived: int = 0
    _all_in: asyncio.Event | None = None
    _runner: web.AppRunner | None = None
    url: str = ""

    def script(self, *replies: Wire) -> None:
        """Answer the next requests with these, in arrival order; then ``default``."""
        self._queue.extend(replies)

    def hold(self, count: int) -> None:
        """Keep each of the next ``count`` requests waiting until all ``count`` have arrived:
        answered only if they were in flight together (else each fails with 504 after 5 s)."""
        self._barrier, self._arrived, self._all_in = count, 0, asyncio.Event()

    async def _messages(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.requests.append(Seen(request.path, dict(request.headers), body, time.perf_counter()))
        if self._all_in is not None and self._arrived < self._barrier:
            self._arrived += 1
            if self._arrived == self._barrier:
                self._all_in.set()
            try:
                await asyncio.wait_for(self._all_in.wait(), 5.0)
            except TimeoutError:
                return web.json_response({"error": "calls were not concurrent"}, status=504)
        if self.require_key is not None and request.headers.get("x-api-key") != self.require_key:
            wire = Wire.load("error_401_authentication")
        else:
            wire = self._queue.pop(0) if self._queue else self.default
        return web.json_response(wire.body, status=wire.status, headers=wire.headers)

    async def start(self) -> AnthropicStub:
        app = web.Application()
        app.router.add_post("/v1/messages", self._messages)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> AnthropicStub:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
