"""Bounds on what a request costs before it is one (issue 26): a tiny body must not buy seconds
of the server's CPU, a request head that never ends must not hold a connection for an hour, and
a body's codings are read as HTTP lists them."""

from __future__ import annotations

import gzip
import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "say hi"}]}).encode()
#: how long a test waits for a state or an answer before failing (never a fixed sleep)
PATIENCE_S = 15.0


def _connect(stack: Any) -> socket.socket:
    url = urlsplit(stack.base_url)
    return socket.create_connection((url.hostname, url.port), timeout=PATIENCE_S)


def _status(sock: socket.socket) -> int:
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"the server closed without an answer: {data!r}"
        data += piece
    return int(data.split(b" ", 2)[1])


def test_a_tiny_body_of_many_gzip_members_costs_the_server_little_cpu(live_stack: Any) -> None:
    """About 100 bytes on the wire, ``Content-Encoding: gzip, gzip, gzip``, whose innermost layer is
    max_body_bytes of empty gzip members (20 bytes each, RFC 1952 allows any number): the
    server answers it (a 4xx) having spent well under a second of CPU. Decoding one member at
    a time from ``unused_data`` copies the rest of the body per member, so 2 MiB of members
    cost seconds of CPU on the event loop, during which no other request is answered."""
    limit = 2 * 1_048_576
    stack = live_stack(max_body_bytes=limit)
    member = gzip.compress(b"", mtime=0)
    members = member * (limit // len(member))
    body = gzip.compress(gzip.compress(members, 9, mtime=0), 9, mtime=0)
    assert len(body) < 200
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Encoding: gzip, gzip, gzip\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    with _connect(stack) as sock:
        sock.settimeout(120.0)  # the CPU bound below is the assertion, not this
        cpu = time.process_time()  # the server runs in this process (LiveStack's loop thread)
        sock.sendall(head + body)
        status = _status(sock)
        spent = time.process_time() - cpu
    assert 400 <= status < 500
    assert spent < 1.0, f"{spent:.2f} s of CPU for a {len(body)}-byte request"


def test_a_request_head_that_never_ends_does_not_hold_its_connection(live_stack: Any) -> None:
    """A client that sends part of a request head and stalls (slow-loris on the headers, the
    half that ``body_read_timeout_s`` does not cover) has its connection closed within a
    bounded time; aiohttp's own default (``keepalive_timeout``, 3630 s) holds it an hour, so
    enough of them exhaust the server's file descriptors and nobody is served. The bound is
    ``[server] idle_timeout_s``."""
    stack = live_stack(tables={"server": {"idle_timeout_s": 0.5}})
    with _connect(stack) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        try:
            left = sock.recv(65536)  # b"" (closed) or a 408, within the socket's PATIENCE_S
        except TimeoutError:
            pytest.fail(f"a stalled request head still holds its connection after {PATIENCE_S} s")
        assert left == b"" or left.startswith(b"HTTP/1.1 408"), left


def test_content_encoding_on_two_header_lines_is_one_list(live_stack: Any) -> None:
    """``Content-Encoding: gzip`` twice is the list ``gzip, gzip`` (RFC 9110, 5.3): the body is
    decoded twice and served, not read as gzip once and refused as not JSON."""
    stack = live_stack()
    stack.stub.script(Reply.ok("hi"), model=CHEAP)
    assert _send(stack, ["gzip", "gzip"], gzip.compress(gzip.compress(CHAT))) == 200


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        ("gzip, gzip, gzip", gzip.compress(gzip.compress(gzip.compress(CHAT)))),
        ("gzip", gzip.compress(b"") * 16 + gzip.compress(CHAT)),
    ],
    ids=["three_codings", "seventeen_members"],
)
def test_a_body_past_the_decoding_bounds_is_refused(
    live_stack: Any, encoding: str, body: bytes
) -> None:
    """At most two codings and sixteen gzip members: what costs more to decode is refused
    (415 for the codings, 400 for the members), whatever it holds."""
    status = _send(live_stack(), [encoding], body)
    assert status == (415 if "," in encoding else 400)


def _send(stack: Any, encodings: list[str], body: bytes) -> int:
    """POST ``body`` with one ``Content-Encoding`` header line per item; the status."""
    lines = "".join(f"Content-Encoding: {e}\r\n" for e in encodings)
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"{lines}Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with _connect(stack) as sock:
        sock.sendall(head + body)
        return _status(sock)
