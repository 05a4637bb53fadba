"""HTTP handlers: the API dialects (plain and streaming), models, health and readiness.

Every dialect (Chat Completions here; OpenAI Responses and Anthropic Messages in their own
modules) is a ``Codec``: it parses its body into the one ``ChatRequest`` and renders the one
``Outcome``; ``dialect_handler`` runs the rest, the same for all.

The API's middlewares (``_door``) run first: the client key, the receipt log's health, the
concurrency bound, and the one receipt of any request refused before the pipeline runs. A chat
handler raises its refusals (``RequestError``) and hands what admission let through to
``Pipeline.handle``, which writes that request's receipt.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Iterator
from typing import Protocol

from aiohttp import web

from firstpass._json import JSON
from firstpass.admission import ChatRequest, SpecParser, parse_chat_body
from firstpass.errors import RequestError
from firstpass.pipeline import Outcome
from firstpass.receipts import Dialect
from firstpass.server._body import read_body
from firstpass.server._door import CLIENT_KEY, admission, read_json
from firstpass.server._errors import RETRY_AFTER_S, error_body, request_error_for, retry_headers
from firstpass.server._keys import CONFIG, PARSE_SPEC, PIPELINE, RECEIPT_WRITER, STATE, Handler
from firstpass.server._responses import completion_body, sse_chunks, sse_error, summary_json

__all__ = [
    "PARSE_OFF_LOOP_BYTES",
    "ChatCodec",
    "Codec",
    "chat_completions",
    "cost_header",
    "dialect_handler",
    "healthz",
    "list_models",
    "readyz",
]

#: a chat body past this many bytes is parsed in a worker thread: a megabyte of test setup
#: takes the ast parser seconds, which would stall every other request on the loop
PARSE_OFF_LOOP_BYTES = 64 * 1024


class Codec(Protocol):
    """How one API dialect reads its requests and writes its answers; everything between (the
    door, admission, the pipeline, the receipt) is the same whatever the dialect."""

    @property
    def dialect(self) -> Dialect: ...

    def parse(self, body: JSON, *, header_mode: str | None, parse_spec: SpecParser) -> ChatRequest:
        """The request as every dialect parses it, or a ``RequestError`` naming the field."""
        ...

    def body(self, outcome: Outcome, chat: ChatRequest) -> dict[str, JSON]:
        """The answer of an outcome that served one, as a JSON object (``chat``: the request,
        for a dialect whose answer echoes its settings)."""
        ...

    def events(self, outcome: Outcome, chat: ChatRequest) -> Iterator[bytes]:
        """The served answer as the dialect's server-sent events, whole."""
        ...

    def error_events(
        self, err: RequestError, found: dict[str, JSON], chat: ChatRequest
    ) -> Iterator[bytes]:
        """The events of an error decided after a keep-alive went out (the status is 200 by
        then); ``found``: the response's ``firstpass`` object, with the receipt's id;
        ``chat``: the request, for a dialect whose error echoes its settings."""
        ...

    def keepalive(self) -> bytes:
        """What goes out every ``keepalive_s`` while the answer is being verified."""
        ...


def dialect_handler(codec: Codec) -> Handler:
    """The aiohttp handler of one dialect: read, parse, admit, run; answer plain or streamed."""

    async def handle(request: web.Request) -> web.StreamResponse:
        app = request.app
        body = await read_json(request)
        parse = functools.partial(
            codec.parse,
            body,
            header_mode=request.headers.get("X-Firstpass-Mode"),
            parse_spec=app[PARSE_SPEC],
        )
        # parsing is CPU (a test spec's setup is parsed with ast): a large body's, off the loop
        large = len(await read_body(request)) > PARSE_OFF_LOOP_BYTES  # the body read above, kept
        chat = await asyncio.to_thread(parse) if large else parse()
        admitted = await admission(request, chat)
        run = app[PIPELINE].handle(admitted)
        if chat.stream:
            keepalive_s = app[CONFIG].server.keepalive_s
            return await _stream(request, run, chat, codec, keepalive_s)
        return _respond(await run, codec, chat)

    handle.__name__ = handle.__qualname__ = f"{codec.dialect}_handler"
    return handle


class ChatCodec:
    """OpenAI Chat Completions: ``POST /v1/chat/completions``."""

    dialect: Dialect = "chat"

    def parse(self, body: JSON, *, header_mode: str | None, parse_spec: SpecParser) -> ChatRequest:
        return parse_chat_body(body, header_mode=header_mode, parse_spec=parse_spec)

    def body(self, outcome: Outcome, chat: ChatRequest) -> dict[str, JSON]:
        return completion_body(outcome)

    def events(self, outcome: Outcome, chat: ChatRequest) -> Iterator[bytes]:
        return sse_chunks(outcome, include_usage=chat.include_usage)

    def error_events(
        self, err: RequestError, found: dict[str, JSON], chat: ChatRequest
    ) -> Iterator[bytes]:
        yield sse_error(str(err), type=err.type, code=err.code, firstpass=found)
        yield b"data: [DONE]\n\n"

    def keepalive(self) -> bytes:
        return b": firstpass: verifying\n\n"


#: POST /v1/chat/completions
chat_completions = dialect_handler(ChatCodec())


def cost_header(usd: float) -> str:
    """Dollars as ``X-Firstpass-Cost-USD`` states them: plain decimal, never ``1e-07``."""
    text = f"{usd:.12f}".rstrip("0").rstrip(".")
    return text or "0"


def _headers(outcome: Outcome) -> dict[str, str]:
    headers = {
        "X-Firstpass-Action": outcome.action,
        "X-Firstpass-Mode": outcome.mode,
        "X-Firstpass-Overhead-Ms": f"{outcome.overhead_ms:.3f}",
    }
    if outcome.receipted:
        headers["X-Firstpass-Receipt"] = outcome.receipt_id
    if outcome.summary is not None:
        headers["X-Firstpass-Cost-USD"] = cost_header(outcome.summary.cost_usd)
    # the same regime the response's firstpass object states (see the pipeline's summary);
    # an outcome without a summary (the pipeline concluded nothing) states its mode
    regime = (outcome.summary.regime if outcome.summary is not None else None) or (
        "passthrough" if outcome.action == "passthrough" else outcome.mode
    )
    headers["X-Firstpass-Regime"] = regime
    return headers


def _respond(outcome: Outcome, codec: Codec, chat: ChatRequest) -> web.Response:
    headers = _headers(outcome)
    if outcome.error is not None:
        err = request_error_for(outcome.error)
        if err.status == 503:
            headers["Retry-After"] = RETRY_AFTER_S
        retry_headers(err, headers)
        body = error_body(
            str(err),
            type=err.type,
            param=err.param,
            code=err.code,
            dialect=codec.dialect,
            status=err.status,
        )
        found = body.get("firstpass")
        body["firstpass"] = {**(found if isinstance(found, dict) else {}), **summary_json(outcome)}
        return web.json_response(body, status=err.status, headers=headers)
    return web.json_response(codec.body(outcome, chat), headers=headers)


async def _stream(
    request: web.Request,
    run: Awaitable[Outcome],
    chat: ChatRequest,
    codec: Codec,
    keepalive_s: float,
) -> web.StreamResponse:
    """Decide first, then stream; send the dialect's keep-alive while the decision takes long.

    If the decision is ready within ``keepalive_s`` (the usual case), an error gets its real
    status code and the headers name the receipt, written by then. Only after a keep-alive went
    out is the status committed to 200; those headers name no receipt (it does not exist yet,
    and a client must never hold an id no log has): the id comes in the ``firstpass`` object
    of the event that ends the answer (or of the error event), sent after the receipt was
    written. An error after a keep-alive arrives as the dialect's error event, which the
    openai and anthropic SDKs raise as an ``APIError``.
    """
    task = asyncio.ensure_future(run)
    response: web.StreamResponse | None = None
    try:
        while True:
            try:
                outcome = await asyncio.wait_for(asyncio.shield(task), keepalive_s)
                break
            except TimeoutError:
                if response is None:
                    response = _sse_response({})
                    await response.prepare(request)
                await response.write(codec.keepalive())
    except (ConnectionResetError, asyncio.CancelledError):
        # the client left; the pipeline still finishes and writes its receipt
        await asyncio.shield(task)
        raise
    if response is None:
        if outcome.error is not None:
            return _respond(outcome, codec, chat)
        response = _sse_response(_headers(outcome))
        await response.prepare(request)
    with contextlib.suppress(ConnectionResetError):
        if outcome.error is not None:
            err = request_error_for(outcome.error)
            # the receipt is written now: the error event names it
            found = summary_json(outcome)
            if outcome.receipted:
                found.setdefault("receipt_id", outcome.receipt_id)
            for event in codec.error_events(err, found, chat):
                await response.write(event)
        else:
            for chunk in codec.events(outcome, chat):
                await response.write(chunk)
        await response.write_eof()
    return response


def _sse_response(headers: dict[str, str]) -> web.StreamResponse:
    return web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "Connection": "keep-alive",
            **headers,
        },
    )


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: each route's model names, as OpenAI lists models.

    With client keys configured it takes a key like chat does (route and ladder names are the
    operator's business) and lists only the routes that key may use."""
    config = request.app[CONFIG]
    key = request[CLIENT_KEY]  # the key middleware refused a request without one (401)
    allowed = key.routes if key is not None else None
    created = int(request.app[STATE].started_at)
    data = []
    seen: set[str] = set()
    for route in config.routes:
        if allowed is not None and route.name not in allowed:
            continue
        for name in route.models:
            if name == "*" or name in seen:
                continue
            seen.add(name)
            data.append(
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "firstpass",
                    "firstpass": {
                        "route": route.name,
                        "ladder": [r.name for r in route.ladder],
                    },
                }
            )
    return web.json_response({"object": "list", "data": data})


async def healthz(request: web.Request) -> web.Response:
    """GET /healthz: the process is up."""
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """GET /readyz: start-up finished (sandbox, providers, receipt writer all open), and
    receipts can be written (else every chat request would get a 503: route traffic away)."""
    state = request.app[STATE]
    if not state.ready:
        return web.json_response({"status": "starting"}, status=503)
    if not request.app[RECEIPT_WRITER].healthy:
        return web.json_response(
            {"status": "receipts_unavailable"}, status=503, headers={"Retry-After": RETRY_AFTER_S}
        )
    return web.json_response({"status": "ready", "in_flight": state.in_flight})
