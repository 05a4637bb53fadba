"""A request's body is read whole, within a deadline, before it takes a chat slot; every way a
body fails is a 4xx in OpenAI's shape with its one receipt (issue 26, items 1 and 2)."""

from __future__ import annotations

import gzip
import json
import socket
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from typing import Any
from urllib.parse import urlsplit

import pytest

from firstpass.server._keys import STATE
from tests.server_harness import CHEAP, MODEL
from tests.stub_upstream import Reply

#: each test drives a live server over raw sockets
pytestmark = pytest.mark.e2e

CHAT = json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "say hi"}]}).encode()
HEAD = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
#: how long a test waits for a state or an answer before failing (never a fixed sleep)
PATIENCE_S = 15.0


def _connect(stack: Any) -> socket.socket:
    url = urlsplit(stack.base_url)
    sock = socket.create_connection((url.hostname, url.port), timeout=PATIENCE_S)
    return sock


def _answer(sock: socket.socket) -> tuple[int, dict[str, str], Any]:
    """The response on ``sock``: status, headers (lower-case names), the JSON body (or text)."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"the server closed without an answer: {data!r}"
        data += piece
    head, _, rest = data.partition(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.strip().lower(): v.strip() for k, v in (ln.split(":", 1) for ln in lines)}
    length = int(headers.get("content-length", "0"))
    while len(rest) < length:
        piece = sock.recv(65536)
        assert piece, "the server closed mid-answer"
        rest += piece
    try:
        body: Any = json.loads(rest[:length])
    except ValueError:
        body = rest[:length].decode("latin-1")
    return int(status_line.split()[1]), headers, body


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _receipt(stack: Any, receipt_id: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = [r for r in stack.receipts_list() if r["id"] == receipt_id]
    assert len(found) == 1, found
    return found[0]


def _refused_with_receipt(
    stack: Any, answer: tuple[int, dict[str, str], Any], status: int, code: str
) -> dict[str, Any]:
    """``answer`` is ``status``/``code`` in OpenAI's shape, and its receipt says so."""
    got, headers, body = answer
    assert got == status, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == code and "Traceback" not in body["error"]["message"]
    assert headers["x-firstpass-action"] == "rejected"
    receipt = _receipt(stack, headers["x-firstpass-receipt"])
    assert receipt["decision"]["action"] == "rejected"
    assert receipt["error"]["status"] == status
    return receipt


@pytest.fixture
def slow_bodies() -> Iterator[Callable[[Any, int], list[socket.socket]]]:
    """Factory: ``n`` connections that sent headers and one byte of a 100-byte body."""
    with ExitStack() as opened:

        def open_slow(stack: Any, n: int) -> list[socket.socket]:
            socks = []
            for _ in range(n):
                sock = opened.enter_context(_connect(stack))
                sock.sendall(HEAD + b"Content-Length: 100\r\n\r\n{")
                socks.append(sock)
            return socks

        yield open_slow


def test_clients_still_sending_their_body_hold_no_chat_slot(
    live_stack: Any, slow_bodies: Any
) -> None:
    """Twice max_concurrency connections send headers and one body byte, then stall: a whole
    request from another client is still served (200, not 429), and the stalled ones, once
    they leave, each have their one receipt."""
    stack = live_stack(max_concurrency=4, tables={"server": {"body_read_timeout_s": 60.0}})
    state = stack.app[STATE]
    stalled = slow_bodies(stack, 8)
    _until(lambda: state.reading == 8, "the eight stalled bodies to be read")
    stack.stub.script(Reply.ok("hi"), model=CHEAP)
    with _connect(stack) as sock:
        sock.sendall(HEAD + f"Content-Length: {len(CHAT)}\r\n\r\n".encode() + CHAT)
        status, headers, body = _answer(sock)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "hi"
    assert state.reading == 8 and state.in_flight == 0  # they are still stalled, slotless
    for sock in stalled:
        sock.close()
    _until(lambda: state.reading == 0, "the stalled reads to end")
    receipts = stack.receipts_list()
    assert len(receipts) == 9
    assert sum(r["error"] is not None and r["error"]["status"] == 499 for r in receipts) == 8
    assert _receipt(stack, headers["x-firstpass-receipt"])["decision"]["action"] != "rejected"


def test_a_body_that_stalls_past_the_deadline_is_a_408_with_its_receipt(
    live_stack: Any, slow_bodies: Any
) -> None:
    """server.body_read_timeout_s bounds the body's arrival: each stalled request is answered
    408 body_read_timeout with its receipt, and no chat slot was ever held."""
    stack = live_stack(max_concurrency=2, tables={"server": {"body_read_timeout_s": 0.5}})
    stalled = slow_bodies(stack, 3)
    for sock in stalled:
        receipt = _refused_with_receipt(stack, _answer(sock), 408, "body_read_timeout")
        assert "server.body_read_timeout_s" in receipt["error"]["message"]
    assert stack.app[STATE].in_flight == 0


@pytest.mark.parametrize(
    "broken",
    [b"zz\r\nhello\r\n0\r\n\r\n", b"3\r\nabcXX\r\n0\r\n\r\n"],
    ids=["chunk_size_not_hex", "chunk_data_not_followed_by_crlf"],
)
def test_chunked_framing_that_breaks_mid_body_is_a_400_with_its_receipt(
    live_stack: Any, broken: bytes
) -> None:
    """A chunked body whose framing goes bad after the server started reading it: a 400
    invalid_body with its receipt at once, not a wait for the deadline or the client."""
    stack = live_stack(tables={"server": {"body_read_timeout_s": 60.0}})
    with _connect(stack) as sock:
        sock.sendall(HEAD + b'Transfer-Encoding: chunked\r\n\r\n5\r\n{"mod\r\n')
        _until(lambda: stack.app[STATE].reading == 1, "the body to be read")
        sock.sendall(broken)
        _refused_with_receipt(stack, _answer(sock), 400, "invalid_body")


def test_chunked_framing_broken_with_the_headers_is_aiohttps_plain_400_without_receipt(
    live_stack: Any,
) -> None:
    """What is documented as outside any request: framing broken in the packet that carried
    the headers is refused by aiohttp's parser before a handler exists (a plain 400, not a
    hang or a 500), so there is no receipt; the next request is served as usual."""
    stack = live_stack()
    with _connect(stack) as sock:
        sock.sendall(HEAD + b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n")
        status, headers, _body = _answer(sock)
    assert status == 400 and "x-firstpass-receipt" not in headers
    assert stack.receipts_list() == []


def _post(stack: Any, body: bytes, encoding: str) -> tuple[int, dict[str, str], Any]:
    with _connect(stack) as sock:
        sock.sendall(
            HEAD
            + f"Content-Encoding: {encoding}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
            + body
        )
        return _answer(sock)


@pytest.mark.parametrize("encoding", ["br", "zstd", "compress", "gzip, br"])
def test_a_content_encoding_the_server_does_not_decode_is_a_415_with_its_receipt(
    live_stack: Any, encoding: str
) -> None:
    """``br`` (aiohttp refused it before any handler when Brotli is missing: plain text, no
    receipt) and any other coding but gzip and deflate: a 415 in OpenAI's shape naming the
    codings the server takes, with its receipt."""
    stack = live_stack()
    answer = _post(stack, b"\x0b\x02\x80hello\x03", encoding)
    receipt = _refused_with_receipt(stack, answer, 415, "unsupported_content_encoding")
    assert "gzip" in receipt["error"]["message"]


@pytest.mark.parametrize(
    ("encoding", "pack"),
    [
        ("gzip", gzip.compress),
        ("x-gzip", gzip.compress),
        ("deflate", zlib.compress),
        ("deflate", lambda b: zlib.compress(b)[2:-4]),  # raw deflate, as some clients send
        ("gzip", lambda b: gzip.compress(b[:20]) + gzip.compress(b[20:])),  # two members
        ("identity", lambda b: b),
    ],
    ids=["gzip", "x-gzip", "deflate", "raw_deflate", "gzip_members", "identity"],
)
def test_a_compressed_body_the_server_decodes_is_served(
    live_stack: Any, encoding: str, pack: Callable[[bytes], bytes]
) -> None:
    """The codings the server takes still decode into the chat request they carry."""
    stack = live_stack()
    stack.stub.script(Reply.ok("hi"), model=CHEAP)
    status, _headers, body = _post(stack, pack(CHAT), encoding)
    assert status == 200, body
    assert body["choices"][0]["message"]["content"] == "hi"


@pytest.mark.parametrize(
    ("data", "status", "code"),
    [
        (gzip.compress(CHAT)[:-12], 400, "invalid_body"),
        (zlib.compress(b" " * 5000), 413, "body_too_large"),
    ],
    ids=["truncated_gzip", "deflate_past_max_body_bytes"],
)
def test_a_compressed_body_that_does_not_decode_within_bounds_is_refused_with_its_receipt(
    live_stack: Any, data: bytes, status: int, code: str
) -> None:
    """A gzip body cut short is a 400; one that inflates past max_body_bytes a 413 (its few
    compressed bytes notwithstanding); each with its receipt."""
    stack = live_stack(max_body_bytes=2048)
    encoding = "gzip" if data[:2] == b"\x1f\x8b" else "deflate"
    _refused_with_receipt(stack, _post(stack, data, encoding), status, code)


def test_bodies_being_read_share_a_bounded_memory(live_stack: Any) -> None:
    """Bodies still arriving hold at most max_concurrency × max_body_bytes between them: past
    it a request still sending its body is refused 429 body_memory_limit with its receipt; a
    request whose body came whole with its headers is served meanwhile (its bytes are already
    in memory: stalled bodies must not lock out whole ones); once the held body leaves,
    requests are served again."""
    stack = live_stack(max_concurrency=1, max_body_bytes=1000)
    state = stack.app[STATE]
    with _connect(stack) as holder:
        holder.sendall(HEAD + b"Content-Length: 1000\r\n\r\n" + b" " * 990)
        _until(lambda: state.body_bytes == 990, "the held body's bytes to be read")
        with _connect(stack) as sock:
            sock.sendall(HEAD + b"Content-Length: 1000\r\n\r\n")
            _until(lambda: state.reading == 2, "the second body's read to start")
            sock.sendall(b" " * 20)
            _refused_with_receipt(stack, _answer(sock), 429, "body_memory_limit")
        stack.stub.script(Reply.ok("hi"), model=CHEAP)
        with _connect(stack) as sock:
            sock.sendall(HEAD + f"Content-Length: {len(CHAT)}\r\n\r\n".encode() + CHAT)
            assert _answer(sock)[0] == 200
    _until(lambda: state.reading == 0, "the held body's read to end")
    assert state.body_bytes == 0
    stack.stub.script(Reply.ok("hi"), model=CHEAP)
    with _connect(stack) as sock:
        sock.sendall(HEAD + f"Content-Length: {len(CHAT)}\r\n\r\n".encode() + CHAT)
        assert _answer(sock)[0] == 200
