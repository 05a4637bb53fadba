"""The API's front door: everything between a request's arrival and ``Pipeline.handle``.

Three middlewares, outermost first, each acting on the endpoints ``ENDPOINTS`` names:

- ``refusal_middleware`` (receipted endpoints: the chat dialects) gives the request its
  ``Ticket`` (receipt id, arrival time, what is known of it) and answers every ``RequestError``
  raised past it with an OpenAI error and the request's one receipt, written by
  ``Pipeline.refuse``: a bad key, a failing receipt log, a full server, a body that does not
  read or parse, a rule of admission. The server never writes a receipt itself;
- ``auth_middleware`` (every API endpoint): the client key, or 401; the key it matched is
  ``request[CLIENT_KEY]``;
- ``capacity_middleware`` (receipted endpoints): 503 while no receipt can be written; then the
  body, read whole within ``server.body_read_timeout_s`` (``_body.read_body``); then 429 at
  the concurrency bound. A request takes its slot only once its body has arrived, so clients
  still sending one hold none; it counts as in flight until its handler returns, except while
  it waits in ``slot_released`` (a feedback's log search, which bounds itself).

A dialect's handler then decodes the body (``read_json``), parses it into a ``ChatRequest`` and
calls ``admission``: ``firstpass.admission`` with the I/O it needs, in the order refusals always
came (rules that need only the request, the budget ledger, the listed checks built off the
loop, the remaining rules).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import structlog
from aiohttp import web

from firstpass._json import JSON
from firstpass.admission import (
    ChatRequest,
    admit,
    request_info,
    screen,
    unparsed_info,
    with_listed_checks,
)
from firstpass.budgets import budget_record
from firstpass.config import ClientKey
from firstpass.errors import BudgetExhausted, RequestError
from firstpass.pipeline import Admitted, receipts_unavailable
from firstpass.receipts import ErrorRecord, RequestInfo, new_receipt_id
from firstpass.server._body import read_body
from firstpass.server._errors import RETRY_AFTER_S, dialect_of, error_response, retry_headers
from firstpass.server._keys import (
    CLIENT_KEYS,
    CONFIG,
    ENDPOINTS,
    PIPELINE,
    RECEIPT_WRITER,
    ROUTE_CHECKS,
    STATE,
    Endpoint,
    Handler,
)

log = structlog.get_logger("firstpass.server")

__all__ = [
    "CLIENT_KEY",
    "TICKET",
    "Ticket",
    "admission",
    "auth_middleware",
    "capacity_middleware",
    "read_json",
    "refusal_middleware",
    "slot_released",
]


@dataclass(kw_only=True, slots=True)
class Ticket:
    """A request at a receipted endpoint, before the pipeline takes it over."""

    receipt_id: str
    #: ``time.perf_counter()`` when it arrived
    started: float
    #: the receipt's ``request`` once the body parsed (None: not yet)
    request: RequestInfo | None = None
    #: handed to the pipeline, which writes its receipt from then on
    admitted: bool = False


TICKET = web.RequestKey("ticket", Ticket)
#: the client key the request came with (None: the server takes requests without one)
CLIENT_KEY = web.RequestKey[ClientKey | None]("client_key")


def _endpoint(request: web.Request) -> Endpoint | None:
    """How the middlewares treat the request's endpoint: as ``ENDPOINTS`` says; a registered
    route under ``/v1/`` that it does not name takes a key anyway (fail closed: an API route
    added without an entry is never open); the rest (``/healthz``, ``/readyz``,
    ``/metrics``, a 404 or 405) is open."""
    found = request.app[ENDPOINTS].get(request.match_info.handler)
    route = request.match_info.route
    if found is None and route.resource is not None and request.path.startswith("/v1/"):
        return "keyed"
    return found


@web.middleware
async def refusal_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A receipted endpoint's refusals, each answered with its one receipt."""
    if _endpoint(request) != "receipted":
        return await handler(request)
    ticket = Ticket(receipt_id=new_receipt_id(), started=time.perf_counter())
    request[TICKET] = ticket
    try:
        return await handler(request)
    except RequestError as exc:
        if ticket.admitted:  # the pipeline wrote its receipt: never a second one
            raise
        return await _refused(request, ticket, exc)
    except asyncio.CancelledError:
        if not ticket.admitted:  # the client left mid-body, or the server is stopping
            await asyncio.shield(_cancelled(request, ticket))
        raise
    except web.HTTPException:
        raise
    except Exception as exc:  # a bug of ours before the pipeline: a 500, still one receipt
        if ticket.admitted:
            raise
        log.exception("admission_error", receipt_id=ticket.receipt_id)
        err = RequestError(
            f"internal error while admitting {ticket.receipt_id}; see the server log",
            status=500,
            code="internal_error",
            type="server_error",
        )
        return await _refused(request, ticket, err, cause=type(exc).__name__)


async def _cancelled(request: web.Request, ticket: Ticket) -> None:
    """The one receipt of a request cancelled before admission let it through."""
    await request.app[PIPELINE].refuse(
        receipt_id=ticket.receipt_id,
        request=ticket.request or unparsed_info(request.get(CLIENT_KEY), dialect_of(request)),
        error=ErrorRecord(
            status=499,
            type="cancelled",
            message="cancelled before it ran (the client left, or the server stopped)",
        ),
        started=ticket.started,
        action="cancelled",
    )


async def _refused(
    request: web.Request, ticket: Ticket, exc: RequestError, *, cause: str | None = None
) -> web.Response:
    """Answer a refused request and write its one receipt; a refusal acknowledges no answer,
    so it answers even when the receipt could not be written (it then names none).
    ``cause``: what the receipt says instead of the message (an internal error's type)."""
    info = ticket.request
    if info is None:
        info = unparsed_info(request.get(CLIENT_KEY), dialect_of(request))
    written = await request.app[PIPELINE].refuse(
        receipt_id=ticket.receipt_id,
        request=info,
        error=ErrorRecord(status=exc.status, type=exc.type, message=cause or str(exc)),
        started=ticket.started,
        budget=budget_record(exc) if isinstance(exc, BudgetExhausted) else None,
    )
    headers = {"X-Firstpass-Action": "rejected"}
    if written:
        headers["X-Firstpass-Receipt"] = ticket.receipt_id
    if exc.status in (429, 503):
        headers["Retry-After"] = RETRY_AFTER_S
    retry_headers(exc, headers)
    return error_response(
        exc.status,
        str(exc),
        type=exc.type,
        param=exc.param,
        code=exc.code,
        headers=headers,
        dialect=dialect_of(request),
    )


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """With client keys configured, an API request must carry one (``Authorization: Bearer``)."""
    if _endpoint(request) is None:
        return await handler(request)
    ring = request.app[CLIENT_KEYS]
    key = None
    if ring:
        # Anthropic's clients send ``x-api-key``; OpenAI's (and Anthropic's ``auth_token``)
        # a bearer token
        # either header may carry the key: a client that sends both (an Anthropic SDK with a
        # key and an auth token) is let in by whichever is one of this server's keys
        api_key = request.headers.get("x-api-key")
        if api_key is not None:
            key = ring.match_token(api_key)
        if key is None:
            key = ring.match(request.headers.get("Authorization", ""))
        if key is None:
            raise RequestError(
                "invalid or missing API key: send 'Authorization: Bearer <key>' (or "
                "'x-api-key: <key>') with a key this "
                "server accepts (server.client_keys_env, [[server.client_key]])",
                status=401,
                code="invalid_api_key",
                type="authentication_error",
            )
    request[CLIENT_KEY] = key  # receipts and logs name the key, never carry it
    return await handler(request)


@web.middleware
async def capacity_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Refuse what could not be receipted; read the body; refuse what would pass the
    concurrency bound; count the rest."""
    if _endpoint(request) != "receipted":
        return await handler(request)
    app = request.app
    state = app[STATE]
    if not app[RECEIPT_WRITER].healthy:
        # the receipt log is failing: no answer could be receipted, so none is attempted
        raise receipts_unavailable()
    _check_concurrency(request)  # full already: refused without reading a body it cannot run
    # the slot is taken once the whole body is here: a client that sends headers and then
    # trickles (or stalls) holds no slot, only its bounded read (408 past the deadline)
    await read_body(request)
    _check_concurrency(request)
    state.in_flight += 1
    try:
        return await handler(request)
    finally:
        state.in_flight -= 1


def _check_concurrency(request: web.Request) -> None:
    limit = request.app[CONFIG].server.max_concurrency
    if request.app[STATE].in_flight >= limit:
        raise RequestError(
            f"the server is at its concurrency bound ({limit} requests in flight); retry after "
            "a moment",
            status=429,
            code="concurrency_limit",
            type="rate_limit_error",
        )


@contextmanager
def slot_released(request: web.Request) -> Iterator[None]:
    """Give a receipted request's concurrency slot back while it waits on work that the bound
    does not guard (``POST /v1/feedback``'s log search, one at a time and bounded by itself):
    a few such waits must not leave chat at 429."""
    state = request.app[STATE]
    state.in_flight -= 1
    try:
        yield
    finally:
        state.in_flight += 1


async def read_json(request: web.Request) -> JSON:
    """The body as a JSON document; a ``RequestError`` for each way it is not one: the ways a
    body fails to arrive (``_body.read_body``: 408, 413, 415, 499, 400), empty, not JSON,
    nested too deep, not text (400)."""
    raw = await read_body(request)
    if not raw:
        raise RequestError("the request body is empty; send a JSON object", code="invalid_body")
    try:
        body: JSON = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RequestError(
            f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from exc
    except RecursionError:  # ~1,000 nested arrays in 2 KB: a 400 like any other bad body
        raise RequestError(
            "the request body nests too deeply to be read (over Python's JSON nesting limit)",
            code="invalid_json",
        ) from None
    except ValueError as exc:  # an integer of more than 4,300 digits
        raise RequestError(
            f"the request body is not usable JSON: {exc}", code="invalid_json"
        ) from None
    # a lone surrogate is not text: "\udc00" escapes decode to one, and so do the bytes
    # ED A0 80-ED BF BF (json decodes bytes with surrogatepass) and UTF-16/32 bodies (NUL bytes)
    if b"\xed" in raw or b"\x00" in raw or _SURROGATE.search(raw):
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise RequestError(
                "the request body holds a lone UTF-16 surrogate (U+D800-U+DFFF, escaped or "
                "encoded): not valid text",
                code="invalid_json",
            ) from None
    return body


_SURROGATE = re.compile(rb"\\u[dD][89a-fA-F]")


async def admission(request: web.Request, chat: ChatRequest) -> Admitted:
    """``chat`` admitted, or the ``RequestError`` refusing it: ``screen`` before any I/O, then
    the budget ledger's refusal (429), the request's listed checks built off the loop (400),
    then ``admit``. Every refusal from here on names what was asked on its receipt."""
    app = request.app
    ticket, key, config = request[TICKET], request[CLIENT_KEY], app[CONFIG]
    ticket.request = request_info(chat, key)
    screen(chat, config=config, client_key=key)
    ledger = app[PIPELINE].budgets
    if ledger is not None:
        refused = await ledger.refusal(key.name if key is not None else None)
        if refused is not None:
            raise refused
    checks = await with_listed_checks(chat.checks, chat.listed_checks)
    admitted = admit(
        chat,
        checks=checks,
        config=config,
        client_key=key,
        route_checks=app[ROUTE_CHECKS],
        receipt_id=ticket.receipt_id,
        started=ticket.started,
    )
    ticket.admitted = True
    return admitted
