"""A scriptable fake OpenAI-compatible upstream, in-process, for tests and benchmarks.

In a test::

    from tests.stub_upstream import Reply, StubUpstream

    async with StubUpstream(answer="def f(): return 1") as stub:
        stub.script(Reply.error(429, retry_after=0.2), Reply.ok("a", "b", "c"))
        ...  # point a provider at stub.url ("http://127.0.0.1:PORT/v1")
        assert [r.n for r in stub.completions] == [3, 3]

Each chat request takes the next scripted :class:`Reply` (those scripted for its ``model`` first,
then those for any model), else what ``responder(body)`` returns (a function of the request, for
answers that depend on the prompt), else the default: ``answers[model]`` or ``answer``, once per
choice, ``n`` choices when ``honours_n`` (else one). Every request is recorded
(:attr:`StubUpstream.requests`: path, parsed body, headers, arrival time), so a test can assert
exactly which calls were made. The fixture :func:`stub_upstream` yields a started stub
(``tests/conftest.py`` registers this module with ``pytest_plugins``).

Faults at random, for load tests: ``faults=FaultMix.parse("5xx=0.02,429=0.02,timeout=0.01")``
draws, per chat request in arrival order from a seeded generator, whether it gets one of the
:data:`MIX_FAULTS` instead of its answer (scripted replies still come first). ``marked_answers``
lets the *client* pick the answer: a last user message containing ``[answer:NAME]`` gets
``marked_answers[NAME]`` (only from ``marked_models`` when given), e.g. a hostile sample from the
cheap model and the default from the strong one.

Standalone, as the 0 ms upstream of the overhead benchmark (:class:`FastStub`: fixed JSON bytes
over a bare asyncio protocol, no recording; ``--server aiohttp`` for the full HTTP stack)::

    python -m tests.stub_upstream --port 9000 --latency-ms 0 --answer 'def f(): return 1'

and as the faulty upstream of the reliability benchmark (the aiohttp stub, nothing recorded;
``GET /v1/stub/stats`` reports the faults injected so far)::

    python -m tests.stub_upstream --port 9000 --faults 5xx=0.03,429=0.02,reset=0.01 --seed 7 \
        --answers-json answers.json --marked-model cheap-model
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import random
import re
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, cast

from aiohttp import web

__all__ = [
    "DEFAULT_ANSWER",
    "MIX_FAULTS",
    "FastStub",
    "FaultMix",
    "RecordedRequest",
    "Reply",
    "StubUpstream",
    "stub_upstream",
]

DEFAULT_ANSWER = "def solution(*args):\n    return None\n"

Fault = Literal[
    "timeout", "stall_body", "malformed_json", "cut", "cut_before_headers", "no_choices"
]


@dataclass(frozen=True, kw_only=True)
class Reply:
    """What the stub does with one chat request. Build one with the class methods.

    ``texts`` are the choices' contents: honouring ``n``, the first ``n`` of them; ignoring it,
    all of them whatever ``n`` was (``None``: the default answer, ``n`` times or once);
    ``honours_n`` overrides the stub's setting for this reply; ``usage`` is (prompt, completion)
    tokens (``None``: a len/4 estimate); ``latency_ms`` is waited before anything is sent.
    """

    texts: tuple[str, ...] | None = None
    status: int = 200
    latency_ms: float = 0.0
    headers: Mapping[str, str] = field(default_factory=dict)
    message: str | None = None
    fault: Fault | None = None
    fault_after_s: float = 30.0
    usage: tuple[int, int] | None = None
    finish_reason: str = "stop"
    honours_n: bool | None = None
    #: every choice's ``message.tool_calls`` (OpenAI's shape); its content is ``texts`` or null
    tool_calls: tuple[Mapping[str, Any], ...] | None = None
    #: the choices (by index) that carry ``tool_calls`` (None: every choice)
    tool_choices: frozenset[int] | None = None
    #: ``usage.prompt_tokens_details.cached_tokens`` (0: no details sent), of the prompt tokens
    cached_tokens: int = 0
    #: every choice's ``message`` exactly (a legacy ``function_call``, a ``refusal``...);
    #: ``texts`` then only counts the choices (default: one per ``n``)
    choice_message: Mapping[str, Any] | None = None

    @classmethod
    def tools(
        cls, *calls: tuple[str, Mapping[str, Any]], text: str | None = None, **kwargs: Any
    ) -> Reply:
        """Answer 200 with a turn that ends in tool calls: ``(name, arguments)`` each, ids
        ``call_0``, ``call_1``..., ``finish_reason: "tool_calls"``, content ``text`` (null)."""
        listed = tuple(
            {
                "id": f"call_{i}",
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
            for i, (name, arguments) in enumerate(calls)
        )
        kwargs.setdefault("finish_reason", "tool_calls")
        return cls(texts=(text,) if text else ("",), tool_calls=listed, **kwargs)

    @classmethod
    def ok(cls, *texts: str, latency_ms: float = 0.0, **kwargs: Any) -> Reply:
        """Answer 200 with these choice texts (none given: the default answer)."""
        return cls(texts=tuple(texts) or None, latency_ms=latency_ms, **kwargs)

    @classmethod
    def error(
        cls,
        status: int,
        message: str | None = None,
        *,
        retry_after: float | str | None = None,
        latency_ms: float = 0.0,
    ) -> Reply:
        """Answer ``status`` with an OpenAI-shaped error body, optionally with ``Retry-After``."""
        headers = {"Retry-After": str(retry_after)} if retry_after is not None else {}
        return cls(
            status=status,
            message=message or f"stub error {status}",
            headers=headers,
            latency_ms=latency_ms,
        )

    @classmethod
    def timeout(cls, seconds: float = 30.0) -> Reply:
        """Say nothing for ``seconds`` (past the client's timeout), then answer normally."""
        return cls(fault="timeout", fault_after_s=seconds)

    @classmethod
    def stall_body(cls, seconds: float = 30.0) -> Reply:
        """Send the headers and half the body, then stall for ``seconds`` before the rest."""
        return cls(fault="stall_body", fault_after_s=seconds)

    @classmethod
    def malformed_json(cls) -> Reply:
        """Answer 200 with a JSON content type and a truncated, unparsable body."""
        return cls(fault="malformed_json")

    @classmethod
    def cut(cls, *, before_headers: bool = False) -> Reply:
        """Close the connection mid-body (or before any byte of the response)."""
        return cls(fault="cut_before_headers" if before_headers else "cut")

    @classmethod
    def no_choices(cls) -> Reply:
        """Answer 200 with a well-formed completion object that lacks ``choices``."""
        return cls(fault="no_choices")


#: what a :class:`FaultMix` can inject: an upstream 5xx, a 429 with ``Retry-After``, no answer
#: within the client's timeout, a 200 with a truncated JSON body, the connection closed before
#: the response (``reset``) or mid-body (``cut``), and a body that stalls half-way (``slow``)
MIX_FAULTS = ("5xx", "429", "timeout", "malformed_json", "reset", "cut", "slow")


@dataclass(frozen=True, kw_only=True)
class FaultMix:
    """A seeded share of faulty replies: ``rates[fault]`` is the chance a request gets it.

    ``timeout_s`` is how long a ``timeout`` stays silent (set it past the provider's
    ``timeout_s``), ``slow_s`` how long a ``slow`` body stalls half-way (below it: a slow answer
    that still arrives), ``retry_after_s`` the ``Retry-After`` a 429 carries.
    """

    rates: Mapping[str, float]
    seed: int = 0
    timeout_s: float = 30.0
    slow_s: float = 0.5
    retry_after_s: float = 0.2

    def __post_init__(self) -> None:
        unknown = sorted(set(self.rates) - set(MIX_FAULTS))
        if unknown:
            raise ValueError(f"unknown fault(s) {unknown}; known: {', '.join(MIX_FAULTS)}")
        if any(r < 0 for r in self.rates.values()) or sum(self.rates.values()) > 1:
            raise ValueError("fault rates must be >= 0 and sum to at most 1")

    @classmethod
    def parse(cls, spec: str, **kwargs: Any) -> FaultMix:
        """``"5xx=0.03,429=0.02"`` (empty: no faults)."""
        rates: dict[str, float] = {}
        for part in filter(None, (p.strip() for p in spec.split(","))):
            name, _, value = part.partition("=")
            rates[name.strip()] = float(value)
        return cls(rates=rates, **kwargs)

    def drawer(self) -> Callable[[], str | None]:
        """A function drawing the next request's fault (``None``: answer normally)."""
        rng = random.Random(self.seed)
        table = [(name, self.rates[name]) for name in MIX_FAULTS if self.rates.get(name)]

        def draw() -> str | None:
            x = rng.random()
            for name, rate in table:
                if x < rate:
                    return name
                x -= rate
            return None

        return draw

    def reply(self, fault: str) -> Reply:
        """The :class:`Reply` that injects ``fault``."""
        if fault == "5xx":
            return Reply.error(503, "stub overloaded")
        if fault == "429":
            return Reply.error(429, "stub rate limit", retry_after=self.retry_after_s)
        if fault == "timeout":
            return Reply.timeout(self.timeout_s)
        if fault == "malformed_json":
            return Reply.malformed_json()
        if fault == "reset":
            return Reply.cut(before_headers=True)
        if fault == "cut":
            return Reply.cut()
        return Reply.stall_body(self.slow_s)


@dataclass(frozen=True, kw_only=True)
class RecordedRequest:
    """One request as the stub received it; ``time`` is ``time.perf_counter()`` at arrival."""

    method: str
    path: str
    body: Any
    headers: Mapping[str, str]
    time: float

    @property
    def model(self) -> str | None:
        return self.body.get("model") if isinstance(self.body, dict) else None

    @property
    def n(self) -> int:
        """The ``n`` asked for (1 when absent, as OpenAI defaults it)."""
        value = self.body.get("n", 1) if isinstance(self.body, dict) else 1
        return value if isinstance(value, int) else 1


def _estimate_tokens(text: str) -> int:
    return max(1, len(text) // 4)


class StubUpstream:
    """An aiohttp server on 127.0.0.1 (a free port unless given) speaking OpenAI chat."""

    def __init__(
        self,
        *,
        answer: str = DEFAULT_ANSWER,
        answers: Mapping[str, str] | None = None,
        responder: Callable[[dict[str, Any]], Reply | None] | None = None,
        honours_n: bool = True,
        latency_ms: float = 0.0,
        models: Sequence[str] = ("stub-model",),
        require_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        fast: bool = False,
        faults: FaultMix | None = None,
        marked_answers: Mapping[str, str] | None = None,
        marked_models: Sequence[str] | None = None,
        record: bool = True,
    ) -> None:
        self.answer = answer
        self.answers = dict(answers or {})
        self.responder = responder
        self.honours_n = honours_n
        self.latency_ms = latency_ms
        self.models = list(models)
        self.require_key = require_key
        self.requests: list[RecordedRequest] = []
        self.served = 0
        self._host = host
        self._port = port
        self._fast = fast
        self.faults = faults
        self._draw_fault = faults.drawer() if faults is not None else None
        #: faults injected so far, by name (:data:`MIX_FAULTS`)
        self.injected: dict[str, int] = {}
        self.marked_answers = dict(marked_answers or {})
        self.marked_models = frozenset(marked_models) if marked_models is not None else None
        self.record = record
        self._queues: dict[str | None, deque[Reply]] = {}
        self._ids = itertools.count(1)
        self._closing = asyncio.Event()
        self._released = asyncio.Event()
        self._runner: web.AppRunner | None = None
        self._fast_body = self._render([answer], model=models[0], usage=None, body={})

    # -- scripting -------------------------------------------------------------------------

    def script(self, *replies: Reply | Iterable[Reply], model: str | None = None) -> StubUpstream:
        """Queue replies for the next chat requests (for ``model`` only, if given); chainable."""
        queue = self._queues.setdefault(model, deque())
        for reply in replies:
            if isinstance(reply, Reply):
                queue.append(reply)
            else:
                queue.extend(reply)
        return self

    def script_samples(
        self, texts: Sequence[str], *, model: str | None = None, latency_ms: float = 0.0
    ) -> StubUpstream:
        """Queue ``texts`` as one probe's samples, whichever way the stub treats ``n``.

        Honouring ``n``: one reply with every text. Not honouring it: one single-text reply per
        sample; concurrent calls may then receive them in any order.
        """
        if self.honours_n:
            return self.script(Reply.ok(*texts, latency_ms=latency_ms), model=model)
        return self.script(*(Reply.ok(t, latency_ms=latency_ms) for t in texts), model=model)

    def pending(self, model: str | None = None) -> int:
        """Scripted replies not yet used (for ``model``, or the any-model queue)."""
        return len(self._queues.get(model, ()))

    @property
    def completions(self) -> list[RecordedRequest]:
        """The chat-completions requests received, in arrival order."""
        return [r for r in self.requests if r.path.endswith("/chat/completions")]

    def reset(self) -> None:
        """Forget recorded requests and queued replies."""
        self.requests.clear()
        self._queues.clear()

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def port(self) -> int:
        return self._port

    @property
    def url(self) -> str:
        """The base URL to configure a provider with: ``http://127.0.0.1:PORT/v1``."""
        if self._runner is None:
            raise RuntimeError("StubUpstream is not started")
        return f"http://{self._host}:{self._port}/v1"

    def app(self) -> web.Application:
        """The aiohttp application (also usable with aiohttp's own test client)."""
        app = web.Application(client_max_size=64 * 1024 * 1024)
        handler = self._fast_chat if self._fast else self._chat
        app.router.add_post("/v1/chat/completions", handler)
        app.router.add_get("/v1/models", self._list_models)
        app.router.add_get("/v1/stub/stats", self._stats)
        return app

    async def start(self) -> StubUpstream:
        """Bind and serve; the port is known afterwards."""
        self._closing = asyncio.Event()
        self._released = asyncio.Event()
        runner = web.AppRunner(
            self.app(), access_log=None, handle_signals=False, shutdown_timeout=0.5
        )
        await runner.setup()
        site = web.TCPSite(runner, self._host, self._port, backlog=1024)
        await site.start()
        self._port = int(runner.addresses[0][1])
        self._runner = runner
        return self

    async def close(self) -> None:
        """Stop serving; requests still waiting (scripted timeouts) are released at once."""
        self._closing.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def __aenter__(self) -> StubUpstream:
        return await self.start()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- handlers ----------------------------------------------------------------------------

    async def release(self) -> None:
        """End every scripted latency now and from now on: a test that needs a request held
        while it does something scripts a long latency and releases it when done, instead of
        betting that a short one outlasts its steps on a loaded machine."""
        self._released.set()

    async def _wait(self, seconds: float) -> None:
        """Sleep, but stop early when the stub closes or is ``release``d."""
        if seconds <= 0 or self._released.is_set():
            return
        waits = [asyncio.ensure_future(e.wait()) for e in (self._closing, self._released)]
        try:
            await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for wait in waits:
                wait.cancel()

    def _next_reply(self, model: str | None, body: dict[str, Any]) -> Reply:
        for key in (model, None):
            queue = self._queues.get(key)
            if queue:
                return queue.popleft()
        if self._draw_fault is not None and (fault := self._draw_fault()) is not None:
            assert self.faults is not None
            self.injected[fault] = self.injected.get(fault, 0) + 1
            return self.faults.reply(fault)
        if self.responder is not None and (reply := self.responder(body)) is not None:
            return reply
        return Reply(latency_ms=self.latency_ms)

    def _authorised(self, request: web.Request) -> bool:
        return self.require_key is None or (
            request.headers.get("Authorization") == f"Bearer {self.require_key}"
        )

    def _default_answer(self, model: str | None, body: Mapping[str, Any]) -> str:
        """``marked_answers[NAME]`` for a last user message holding ``[answer:NAME]`` (from a
        marked model), else ``answers[model]``, else ``answer``."""
        if self.marked_answers and (
            self.marked_models is None or (model or "") in self.marked_models
        ):
            match = _MARKER.search(_last_user_text(body))
            if match is not None and match.group(1) in self.marked_answers:
                return self.marked_answers[match.group(1)]
        return self.answers.get(model or "", self.answer)

    async def _stats(self, request: web.Request) -> web.Response:
        return web.json_response({"served": self.served, "faults": self.injected})

    async def _list_models(self, request: web.Request) -> web.Response:
        if self.record:
            self.requests.append(
                RecordedRequest(
                    method=request.method,
                    path=request.path,
                    body=None,
                    headers=dict(request.headers),
                    time=time.perf_counter(),
                )
            )
        data = [{"id": m, "object": "model", "created": 0, "owned_by": "stub"} for m in self.models]
        return web.json_response({"object": "list", "data": data})

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        raw = await request.read()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            body = None
        if self.record:
            self.requests.append(
                RecordedRequest(
                    method=request.method,
                    path=request.path,
                    body=body,
                    headers=dict(request.headers),
                    time=arrived,
                )
            )
        if not self._authorised(request):
            return _error_response(401, "Incorrect API key provided.", "invalid_api_key")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error_response(400, "the body must be a JSON object with `messages`")
        model = body.get("model") if isinstance(body.get("model"), str) else None
        reply = self._next_reply(model, body)
        await self._wait(reply.latency_ms / 1000.0)
        self.served += 1
        if reply.fault == "timeout":
            await self._wait(reply.fault_after_s)
        elif reply.fault == "cut_before_headers":
            assert request.transport is not None
            request.transport.close()
            return web.Response(status=200)  # never reaches the closed socket
        elif reply.fault == "malformed_json":
            return web.Response(
                status=200, body=b'{"id": "chatcmpl-bad", "choices": [{"ind', content_type=_JSON
            )
        if reply.status != 200:
            message = reply.message or "stub error"
            return _error_response(reply.status, message, headers=reply.headers)
        n = body.get("n", 1)
        n = n if isinstance(n, int) and n >= 1 else 1
        honours = self.honours_n if reply.honours_n is None else reply.honours_n
        if reply.texts:  # honouring n: at most n of them; ignoring it: all, whatever n was
            texts = list(reply.texts[:n] if honours else reply.texts)
        else:
            default = self._default_answer(model, body)
            texts = [default] * (n if honours else 1)
        payload = self._render(
            texts,
            model=model or self.models[0],
            usage=reply.usage,
            body=body,
            finish_reason=reply.finish_reason,
            with_choices=reply.fault != "no_choices",
            tool_calls=reply.tool_calls,
            tool_choices=reply.tool_choices,
            cached_tokens=reply.cached_tokens,
            choice_message=reply.choice_message,
        )
        if reply.fault in ("cut", "stall_body"):
            response = web.StreamResponse(status=200, headers=dict(reply.headers))
            response.content_type = _JSON
            response.content_length = len(payload)
            await response.prepare(request)
            half = len(payload) // 2
            await response.write(payload[:half])
            if reply.fault == "stall_body":
                await self._wait(reply.fault_after_s)
                with contextlib.suppress(ConnectionError):  # the client gave up meanwhile
                    await response.write(payload[half:])
                return response
            assert request.transport is not None
            request.transport.close()
            return response
        return web.Response(body=payload, content_type=_JSON, headers=reply.headers)

    async def _fast_chat(self, request: web.Request) -> web.Response:
        """Benchmark path: read the body, answer fixed bytes (parsed only when ``n`` is set)."""
        raw = await request.read()
        self.served += 1
        if self.latency_ms > 0:
            await self._wait(self.latency_ms / 1000.0)
        if b'"n"' in raw:
            body = json.loads(raw)
            n = body.get("n", 1)
            if self.honours_n and isinstance(n, int) and n > 1:
                payload = self._render(
                    [self.answer] * n, model=self.models[0], usage=None, body=body
                )
                return web.Response(body=payload, content_type=_JSON)
        return web.Response(body=self._fast_body, content_type=_JSON)

    def _render(
        self,
        texts: Sequence[str],
        *,
        model: str,
        usage: tuple[int, int] | None,
        body: Mapping[str, Any],
        finish_reason: str = "stop",
        with_choices: bool = True,
        tool_calls: Sequence[Mapping[str, Any]] | None = None,
        tool_choices: frozenset[int] | None = None,
        cached_tokens: int = 0,
        choice_message: Mapping[str, Any] | None = None,
    ) -> bytes:
        if usage is None:
            prompt = json.dumps(body.get("messages", []), ensure_ascii=False)
            usage = (_estimate_tokens(prompt), sum(_estimate_tokens(t) for t in texts))
        obj: dict[str, Any] = {
            "id": f"chatcmpl-stub-{next(self._ids)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "system_fingerprint": "stub",
        }
        if with_choices:
            obj["choices"] = [
                {
                    "index": i,
                    "message": dict(choice_message)
                    if choice_message is not None
                    else {"role": "assistant", "content": text}
                    if tool_calls is None or (tool_choices is not None and i not in tool_choices)
                    else {
                        "role": "assistant",
                        "content": text or None,
                        "tool_calls": [dict(c) for c in tool_calls],
                    },
                    "logprobs": None,
                    "finish_reason": finish_reason,
                }
                for i, text in enumerate(texts)
            ]
        obj["usage"] = {
            "prompt_tokens": usage[0],
            "completion_tokens": usage[1],
            "total_tokens": usage[0] + usage[1],
        }
        if cached_tokens:
            obj["usage"]["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
        return json.dumps(obj, ensure_ascii=False).encode("utf-8")


_JSON = "application/json"
_MARKER = re.compile(r"\[answer:([A-Za-z0-9_.-]+)\]")


def _last_user_text(body: Mapping[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else json.dumps(content)
    return ""


def _error_response(
    status: int, message: str, code: str | None = None, *, headers: Mapping[str, str] = {}
) -> web.Response:
    kind = "invalid_request_error" if status < 500 else "server_error"
    if status == 429:
        kind = "rate_limit_error"
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return web.json_response(body, status=status, headers=dict(headers))


try:  # the fixture exists only where pytest-asyncio does; the benchmark path needs neither
    import pytest_asyncio
except ImportError:  # pragma: no cover - standalone use without the test extras
    pass
else:

    @pytest_asyncio.fixture
    async def stub_upstream() -> AsyncIterator[StubUpstream]:
        """A started :class:`StubUpstream` with default settings, closed after the test."""
        async with StubUpstream() as stub:
            yield stub


class _FastProtocol(asyncio.Protocol):
    """Minimal HTTP/1.1 keep-alive server for :class:`FastStub`: Content-Length bodies only."""

    def __init__(self, owner: FastStub) -> None:
        self._owner = owner
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None
        self._pending: deque[tuple[float, bytes, bool]] = deque()
        self._timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._transport = None

    def data_received(self, data: bytes) -> None:
        self._buffer += data
        while self._transport is not None:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > 65536:
                    self._send(_raw_response(431, b'{"error": "headers too large"}'), close=True)
                return
            lines = bytes(self._buffer[:end]).decode("latin-1").split("\r\n")
            method, _, rest = lines[0].partition(" ")
            path = rest.partition(" ")[0]
            length, close = 0, False
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name = name.strip().lower()
                if name == "content-length" and value.strip().isdigit():
                    length = int(value)
                elif name == "transfer-encoding":
                    self._send(_raw_response(501, b'{"error": "chunked bodies"}'), close=True)
                    return
                elif name == "connection":
                    close = value.strip().lower() == "close"
            total = end + 4 + length
            if len(self._buffer) < total:
                return
            body = bytes(self._buffer[end + 4 : total])
            del self._buffer[:total]
            self._send(self._owner.respond(method, path, body), close=close)

    def _send(self, response: bytes, *, close: bool) -> None:
        delay = self._owner.latency_ms / 1000.0
        if delay <= 0 and not self._pending:
            self._write(response, close)
            return
        loop = asyncio.get_running_loop()
        self._pending.append((loop.time() + delay, response, close))
        if self._timer is None:
            self._timer = loop.call_at(self._pending[0][0], self._flush)

    def _flush(self) -> None:
        """Send every delayed response that is due, in request order."""
        self._timer = None
        loop = asyncio.get_running_loop()
        while self._pending and self._pending[0][0] <= loop.time():
            _, response, close = self._pending.popleft()
            self._write(response, close)
        if self._pending and self._transport is not None:
            self._timer = loop.call_at(self._pending[0][0], self._flush)

    def _write(self, response: bytes, close: bool) -> None:
        if self._transport is None:
            return
        self._transport.write(response)
        if close:
            self._transport.close()


_REASONS = {
    200: "OK",
    404: "Not Found",
    431: "Request Header Fields Too Large",
    501: "Not Implemented",
}


def _raw_response(status: int, body: bytes) -> bytes:
    head = (
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("ascii") + body


class FastStub:
    """The benchmark upstream: fixed answer bytes over a bare asyncio protocol, no recording.

    About a quarter of the CPU per request of the aiohttp stub (measured: 22 µs against 93 µs),
    so on a small machine the 0 ms upstream takes as little as possible from the proxy measured.
    It speaks just enough HTTP/1.1 for HTTP clients: keep-alive and Content-Length bodies;
    chunked uploads get 501.
    """

    def __init__(
        self,
        *,
        answer: str = DEFAULT_ANSWER,
        honours_n: bool = True,
        latency_ms: float = 0.0,
        models: Sequence[str] = ("stub-model",),
        host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.answer = answer
        self.honours_n = honours_n
        self.latency_ms = latency_ms
        self.models = list(models)
        self.served = 0
        self._host = host
        self._port = port
        self._server: asyncio.Server | None = None
        self._render = StubUpstream(answer=answer, models=self.models)._render
        self._one = _raw_response(
            200, self._render([answer], model=self.models[0], usage=None, body={})
        )
        listing = [{"id": m, "object": "model", "created": 0, "owned_by": "stub"} for m in models]
        self._models = _raw_response(200, json.dumps({"object": "list", "data": listing}).encode())
        self._missing = _raw_response(404, b'{"error": {"message": "not found"}}')

    @property
    def url(self) -> str:
        return f"http://{self._host}:{self._port}/v1"

    def respond(self, method: str, path: str, body: bytes) -> bytes:
        """The full HTTP response for one request."""
        if method == "POST" and path == "/v1/chat/completions":
            self.served += 1
            if b'"n"' in body and self.honours_n:
                try:
                    parsed = json.loads(body)
                except ValueError:
                    return self._one
                n = parsed.get("n", 1) if isinstance(parsed, dict) else 1
                if isinstance(n, int) and n > 1:
                    texts = [self.answer] * n
                    rendered = self._render(texts, model=self.models[0], usage=None, body=parsed)
                    return _raw_response(200, rendered)
            return self._one
        if method == "GET" and path == "/v1/models":
            return self._models
        return self._missing

    async def start(self) -> FastStub:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _FastProtocol(self), self._host, self._port, backlog=1024
        )
        self._port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def __aenter__(self) -> FastStub:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Serve the stub until interrupted (uvloop when installed)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.stub_upstream", description="A fake OpenAI-compatible upstream."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--answer", default=DEFAULT_ANSWER)
    parser.add_argument("--model", action="append", dest="models", help="listed by /v1/models")
    parser.add_argument("--no-n", action="store_true", help="ignore `n` (one choice per call)")
    parser.add_argument(
        "--server",
        choices=["raw", "aiohttp"],
        default="raw",
        help="raw: bare asyncio protocol, least CPU (default); aiohttp: the full HTTP stack",
    )
    parser.add_argument(
        "--faults",
        default=None,
        help=f"a seeded fault mix, e.g. '5xx=0.03,429=0.02' (known: {', '.join(MIX_FAULTS)}); "
        "implies the aiohttp stub with nothing recorded",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds the fault draws")
    parser.add_argument("--timeout-s", type=float, default=30.0, help="a `timeout` fault's silence")
    parser.add_argument("--slow-s", type=float, default=0.5, help="a `slow` body's stall")
    parser.add_argument(
        "--answers-json",
        default=None,
        help="a JSON object NAME -> answer text, chosen by '[answer:NAME]' in the last user "
        "message; implies the aiohttp stub with nothing recorded",
    )
    parser.add_argument(
        "--marked-model",
        action="append",
        dest="marked_models",
        help="only this model's answers follow the markers (repeatable; default: every model)",
    )
    args = parser.parse_args(argv)
    scripted = args.faults is not None or args.answers_json is not None

    async def serve() -> None:
        options: dict[str, Any] = {
            "answer": args.answer,
            "honours_n": not args.no_n,
            "latency_ms": args.latency_ms,
            "models": args.models or ["stub-model"],
            "host": args.host,
            "port": args.port,
        }
        stub: FastStub | StubUpstream
        if scripted:
            marked: dict[str, str] = {}
            if args.answers_json is not None:
                with open(args.answers_json, encoding="utf-8") as f:
                    marked = json.load(f)
            faults = None
            if args.faults is not None:
                faults = FaultMix.parse(
                    args.faults, seed=args.seed, timeout_s=args.timeout_s, slow_s=args.slow_s
                )
            stub = StubUpstream(
                **options,
                faults=faults,
                marked_answers=marked,
                marked_models=args.marked_models,
                record=False,
            )
        elif args.server == "raw":
            stub = FastStub(**options)
        else:
            stub = StubUpstream(**options, fast=True)
        async with stub:
            print(f"stub upstream on {stub.url} (latency {args.latency_ms:g} ms)", flush=True)
            await asyncio.Event().wait()

    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        runner = asyncio.run
    else:
        runner = uvloop.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(serve())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
