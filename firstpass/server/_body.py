"""A request's body, read whole, in time, within memory, and decoded; or the refusal saying why.

Why not aiohttp's ``request.read()``: it has no deadline (a client sending one byte a minute
keeps its handler as long as it likes); it does not see a chunked body's framing go bad once
the handler is reading (aiohttp 3.14's C parser queues the error on the connection and leaves
the body's stream waiting until the client leaves); and with aiohttp decoding
``Content-Encoding`` itself, a coding it cannot decode (``br`` without Brotli) is refused
before any handler runs, in plain text and without a receipt. So the app turns
``auto_decompress`` off and ``read_body`` reads the stream itself. Each way a body can fail is
a ``RequestError``, answered by ``refusal_middleware`` with the request's one receipt:

- 408 ``body_read_timeout``: not whole within ``server.body_read_timeout_s``;
- 413 ``body_too_large``: past ``server.max_body_bytes``, as sent or once decoded;
- 415 ``unsupported_content_encoding``: a coding other than identity, gzip or deflate;
- 400 ``invalid_body``: chunked framing broken mid-body, bytes that do not decode as their
  coding says;
- 499 ``client_disconnected``: the connection closed (or failed) before the body was whole;
- 429 ``body_memory_limit``: the bodies still arriving already hold ``max_concurrency ×
  max_body_bytes`` bytes between them (what the concurrency bound allowed before bodies were
  read outside it). A body that came whole with its headers is not counted: its bytes are
  already in memory, and counting them would let stalled bodies lock out whole ones.

A body's decoding is bounded in CPU as well as bytes: at most ``MAX_CODINGS`` codings and
``MAX_GZIP_MEMBERS`` gzip members (each member's end copies the rest of the body, so a body of
many empty members, itself gzipped, made ~100 bytes cost seconds of the event loop).

A request aiohttp cannot parse up to its body (request line, headers, a chunk size broken in
the same packet as the headers) never reaches a handler: aiohttp answers it with a plain-text
400, and there is no request to receipt (docs/operations.md, "Request bodies").
"""

from __future__ import annotations

import asyncio
import contextlib
import zlib
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from firstpass.config import ServerConfig
from firstpass.errors import RequestError
from firstpass.server._keys import CONFIG, STATE, ServerState

__all__ = [
    "BODY",
    "BODY_WATCH",
    "CODINGS",
    "FRAMING_POLL_S",
    "MAX_CODINGS",
    "MAX_GZIP_MEMBERS",
    "BodyWatch",
    "decode_body",
    "read_body",
]

#: the body as read and decoded, once ``read_body`` has run
BODY = web.RequestKey("body", bytes)

#: the content codings a body may come in (identity aside), as ``zlib`` window bits;
#: ``deflate`` is zlib-wrapped (RFC 9110) or, as some clients send it, raw
CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}

#: the most content codings a body may list (``gzip, gzip`` is already unusual)
MAX_CODINGS = 2
#: the most members a gzip body may hold (RFC 1952 allows any number; a client concatenating
#: streams writes a few)
MAX_GZIP_MEMBERS = 16

#: how often the bodies being read are checked for a framing error aiohttp queued on their
#: connection instead of failing their stream (see ``BodyWatch``)
FRAMING_POLL_S = 0.25


class BodyWatch:
    """The bodies being read now, and one task that looks them over every ``FRAMING_POLL_S``
    for a framing error aiohttp queued on the connection instead of failing the body's stream
    (``_framing_error``): it fails the stream with that error, as aiohttp's pure-Python parser
    does itself. One task for every body: a timer per stalled connection would cost the loop in
    proportion to however many connections a client opens."""

    def __init__(self) -> None:
        self._reading: dict[int, web.Request] = {}
        self._task: asyncio.Task[None] | None = None

    @contextmanager
    def watching(self, request: web.Request) -> Iterator[None]:
        self._reading[id(request)] = request
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._watch())
        try:
            yield
        finally:
            del self._reading[id(request)]

    async def _watch(self) -> None:
        while self._reading:
            await asyncio.sleep(FRAMING_POLL_S)
            for request in list(self._reading.values()):
                content = request.content
                if content.exception() is None and not content.is_eof():
                    broken = _framing_error(request)
                    if broken is not None:
                        content.set_exception(broken)

    async def close(self) -> None:
        """Stop the task (the server is stopping)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


#: the app's ``BodyWatch``
BODY_WATCH = web.AppKey("body_watch", BodyWatch)


async def read_body(request: web.Request) -> bytes:
    """The request's body, decoded (read once: later calls return the same bytes), or the
    ``RequestError`` refusing it."""
    cached: bytes | None = request.get(BODY)
    if cached is not None:
        return cached
    server = request.app[CONFIG].server
    state = request.app[STATE]
    state.reading += 1
    deadline: asyncio.Timeout | None = None
    try:
        if request.content.is_eof():  # it came whole with the headers (the usual case)
            raw = await _receive(request, server, None)
        else:
            with request.app[BODY_WATCH].watching(request):
                async with asyncio.timeout(server.body_read_timeout_s) as deadline:
                    raw = await _receive(request, server, state)
    except TimeoutError:
        if deadline is None or not deadline.expired():  # pragma: no cover - _receive turns
            raise  # socket errors (TimeoutError is an OSError) into 499s
        raise RequestError(
            f"the request body did not arrive whole within {server.body_read_timeout_s:g} s "
            "(server.body_read_timeout_s)",
            status=408,
            code="body_read_timeout",
        ) from None
    finally:
        state.reading -= 1
    # repeated header lines form one list (RFC 9110, 5.3)
    codings = ", ".join(request.headers.getall("Content-Encoding", ()))
    body = decode_body(raw, codings, server.max_body_bytes)
    request[BODY] = body
    return body


async def _receive(request: web.Request, server: ServerConfig, state: ServerState | None) -> bytes:
    """The body's bytes as sent; with ``state``, what they hold counts against the shared
    bound of bodies still arriving."""
    limit = server.max_body_bytes
    if (request.content_length or 0) > limit:  # said too large: refused before reading it
        raise too_large(limit)
    shared = server.max_concurrency * limit
    body = bytearray()
    try:
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > limit:
                raise too_large(limit)
            if state is None:
                continue
            state.body_bytes += len(chunk)
            if state.body_bytes > shared:
                raise RequestError(
                    f"the server is reading request bodies holding {shared} bytes between "
                    "them (server.max_concurrency × server.max_body_bytes); retry after a "
                    "moment",
                    status=429,
                    code="body_memory_limit",
                    type="rate_limit_error",
                )
    except (OSError, RuntimeError) as exc:
        # OSError: the connection was lost (reset, or the peer closed before the body
        # ended); RuntimeError: aiohttp's "Connection closed." when it was lost before the
        # handler started. Any other RuntimeError is a bug of ours: a 500
        if isinstance(exc, RuntimeError) and request.transport is not None:
            raise
        raise RequestError(
            "the client closed the connection before the request body arrived",
            status=499,
            code="client_disconnected",
        ) from None
    except (web.RequestPayloadError, HttpProcessingError) as exc:
        # the stream was failed for its framing: by aiohttp's pure-Python parser, or by the
        # BodyWatch for its C parser
        raise _unreadable(exc) from None
    finally:
        if state is not None:
            state.body_bytes -= len(body)
    return bytes(body)


def _framing_error(request: web.Request) -> HttpProcessingError | None:
    """The parse error aiohttp queued on this connection while this body was being read.

    aiohttp 3.14's C parser, meeting a chunked body's bad framing (a chunk size that is not
    hex, chunk data not followed by CRLF) after the handler started, raises it into the
    connection, which queues it as the connection's next message, and never fails the body's
    stream: the read would wait for bytes that never come. Read-only use of private
    attributes: should they change, a body with bad framing waits out
    ``body_read_timeout_s`` (408) instead, and tests/test_server_body_read.py says so.
    """
    for message, _payload in getattr(request.protocol, "_messages", ()):
        error = getattr(message, "exc", None)
        if isinstance(error, HttpProcessingError):
            return error
    return None


def _unreadable(exc: Exception) -> RequestError:
    cause = exc.__cause__ or exc
    shown = (getattr(cause, "message", None) or str(cause) or type(cause).__name__).strip()
    return RequestError(
        f"the request body could not be read as sent ({type(cause).__name__}: "
        f"{shown.splitlines()[0].rstrip(':') if shown else ''}); check its Transfer-Encoding "
        "framing",
        code="invalid_body",
    )


def too_large(limit: int) -> RequestError:
    return RequestError(
        f"request body too large (limit {limit} bytes; see server.max_body_bytes)",
        status=413,
        code="body_too_large",
    )


def decode_body(raw: bytes, content_encoding: str, limit: int) -> bytes:
    """``raw`` decoded as ``content_encoding`` says (codings applied in the order listed, so
    undone in reverse), at most ``limit`` bytes at every step, or the ``RequestError``."""
    codings = [c.strip().lower() for c in content_encoding.split(",")]
    codings = [c for c in codings if c and c != "identity"]
    unknown = sorted({c for c in codings if c not in CODINGS})
    if len(codings) > MAX_CODINGS and not unknown:
        raise RequestError(
            f"Content-Encoding lists {len(codings)} codings; at most {MAX_CODINGS} are "
            "accepted: compress the JSON body once",
            status=415,
            code="unsupported_content_encoding",
        )
    if unknown:
        raise RequestError(
            f"Content-Encoding {', '.join(unknown)} is not supported; send the JSON body "
            f"uncompressed, or as {', '.join(sorted(CODINGS))}",
            status=415,
            code="unsupported_content_encoding",
        )
    for coding in reversed(codings):
        try:
            raw = _inflate(raw, coding, limit)
        except zlib.error as exc:
            raise RequestError(
                f"the request body does not decode as its Content-Encoding says ({coding}: "
                f"{exc}); send the JSON body uncompressed, or compressed as its "
                "Content-Encoding says",
                code="invalid_body",
            ) from None
    return raw


def _inflate(data: bytes, coding: str, limit: int) -> bytes:
    """One coding undone; gzip may hold several members (RFC 1952), deflate exactly one."""
    wbits = CODINGS[coding]
    if coding == "deflate" and data[:1] and data[0] & 0x0F != 8:
        wbits = -zlib.MAX_WBITS  # no zlib header: raw deflate
    out = bytearray()
    members = 0
    while data:
        members += 1
        if members > MAX_GZIP_MEMBERS:
            raise zlib.error(f"more than {MAX_GZIP_MEMBERS} gzip members")
        inflater = zlib.decompressobj(wbits)
        out += inflater.decompress(data, limit + 1 - len(out))
        if len(out) > limit or inflater.unconsumed_tail:
            raise too_large(limit)
        if not inflater.eof:
            raise zlib.error("the compressed data ends early")
        data = inflater.unused_data
        if data and wbits != CODINGS["gzip"]:
            raise zlib.error("data after the end of the compressed stream")
    return bytes(out)
