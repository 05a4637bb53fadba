"""Bad input, fuzzed: whatever body and headers a client sends, the real server never answers
500, refuses bad input with a 4xx in OpenAI's error shape, and writes exactly one receipt.

Bodies: arbitrary JSON, near-valid chat bodies with one field replaced by an arbitrary value,
huge and odd numbers, invalid UTF-8, deep nesting. Headers: Authorization, X-Firstpass-Mode,
Content-Type, odd values. One live server (tests/server_harness.py) serves every example;
each example counts the receipts before and after. Bounded for CI (``max_examples``).
"""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from tests.add_task import GOOD, TESTS
from tests.certificates import elastic_block
from tests.server_harness import MODEL, LiveStack

#: slow: each property runs hundreds of requests through a live server (5 to 10 s each)
pytestmark = pytest.mark.slow

FUZZ = settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    """One live server for every example: shadow by default, every mode open to a request."""
    receipts: Path = tmp_path_factory.mktemp("fuzz") / "receipts.jsonl"
    live = LiveStack(
        receipts,
        elastic=elastic_block("shadow"),
        client_modes=["cascade", "shadow", "enforce", "passthrough"],
        max_body_bytes=65_536,
        request_timeout_s=20.0,
    )
    live.stub.answer = GOOD
    try:
        yield live
    finally:
        live.close()


def _request_receipts(stack: LiveStack) -> list[dict[str, Any]]:
    """Request receipts only (the writer's own ``kind`` lines are not requests)."""
    return [r for r in stack.receipts_list() if "kind" not in r]


def _post(
    stack: LiveStack, body: bytes, headers: dict[str, str]
) -> tuple[int, str, bytes, str | None]:
    """(status, content type, body, receipt header): a raw POST, headers sent as given."""
    url = urlsplit(stack.base_url)
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    try:
        conn.putrequest("POST", "/v1/chat/completions", skip_accept_encoding=True)
        names = {k.lower() for k in headers}
        if "content-type" not in names:
            conn.putheader("Content-Type", "application/json")
        for name, value in headers.items():
            conn.putheader(name, value.encode("latin-1"))
        conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
        r = conn.getresponse()
        return (
            r.status,
            r.getheader("Content-Type") or "",
            r.read(),
            r.getheader("X-Firstpass-Receipt"),
        )
    finally:
        conn.close()


def _assert_one_clear_answer(stack: LiveStack, body: bytes, headers: dict[str, str]) -> None:
    before = len(_request_receipts(stack))
    status, ctype, raw, receipt_id = _post(stack, body, headers)
    event(f"status {status}")  # shown by --hypothesis-show-statistics
    assert status != 500 and status < 500, (status, raw[:300])
    if status >= 400:
        obj = json.loads(raw)
        err = obj["error"]
        assert isinstance(err["message"], str) and err["message"]
        assert isinstance(err["type"], str) and "param" in err and "code" in err
        assert "Traceback" not in err["message"]
    elif "text/event-stream" in ctype:
        assert raw.rstrip().endswith(b"data: [DONE]")
    else:
        assert json.loads(raw)["choices"]
    after = _request_receipts(stack)
    assert len(after) == before + 1, "exactly one receipt per request"
    assert receipt_id == after[-1]["id"]


# -- strategies -------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)

#: where a near-valid body gets its one wrong value
_FIELDS = (
    ("model",), ("messages",), ("messages", 0), ("messages", 0, "role"),
    ("messages", 0, "content"), ("n",), ("temperature",), ("top_p",), ("max_tokens",),
    ("seed",), ("stream",), ("stream_options",), ("tools",), ("firstpass",),
    ("firstpass", "tests"), ("firstpass", "tests", "visible"), ("firstpass", "tests", "hidden"),
    ("firstpass", "mode"), ("firstpass", "entry_point"), ("firstpass", "setup"),
    ("firstpass", "task_id"), ("firstpass", "checks"), ("firstpass", "probe_inputs"),
)  # fmt: skip


def _valid_body(verified: bool) -> dict[str, Any]:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "add"}]}
    if verified:
        body["firstpass"] = json.loads(json.dumps(TESTS))
    return body


def _set(body: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    node: Any = body
    for key in path[:-1]:
        if isinstance(node, dict):
            node = node.setdefault(key, {}) if isinstance(key, str) else node
        elif isinstance(node, list) and isinstance(key, int) and key < len(node):
            node = node[key]
        else:
            return body
    last = path[-1]
    in_list = isinstance(node, list) and isinstance(last, int) and last < len(node)
    if isinstance(node, dict) or in_list:
        node[last] = value
    return body


_odd_values = json_values | st.sampled_from(
    [10**400, -(10**30), 1e308, -0.0, 2**63, "", "\u2028", "x" * 5000, [], {}]
)


@st.composite
def near_valid_bodies(draw: st.DrawFn) -> bytes:
    """A valid chat body (with tests or without) with one field given an arbitrary value."""
    body = _valid_body(draw(st.booleans()))
    path = draw(st.sampled_from(_FIELDS))
    return json.dumps(_set(body, path, draw(_odd_values))).encode()


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    """Bytes that are not a good body: invalid UTF-8, NaN, deep nesting, truncation, junk."""
    kind = draw(st.sampled_from(["utf8", "nan", "deep", "truncated", "bytes", "empty"]))
    valid = json.dumps(_valid_body(True))
    if kind == "utf8":
        cut = draw(st.integers(0, len(valid)))
        junk = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80", b"\xf8"]))
        return valid[:cut].encode() + junk + valid[cut:].encode()
    if kind == "nan":
        value = draw(st.sampled_from(["NaN", "Infinity", "-Infinity", "1e400", "1" * 5000]))
        return valid.replace('"messages"', f'"temperature": {value}, "messages"', 1).encode()
    if kind == "deep":
        depth = draw(st.integers(50, 3000))
        inner = "[" * depth + "]" * depth
        where = draw(st.sampled_from(["body", "content", "tests"]))
        if where == "body":
            return inner.encode()
        if where == "content":
            return valid.replace('"add"', inner, 1).encode()
        return valid.replace('"visible": ', f'"visible": {inner}, "x": ', 1).encode()
    if kind == "truncated":
        return valid[: draw(st.integers(0, len(valid) - 1))].encode()
    if kind == "bytes":
        return draw(st.binary(max_size=200))
    return b""


_header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"),
    max_size=60,
)


@st.composite
def odd_headers(draw: st.DrawFn) -> dict[str, str]:
    headers: dict[str, str] = {}
    if draw(st.booleans()):
        headers["Authorization"] = draw(
            st.sampled_from(["", "Bearer", "Bearer ", "Basic abc", "bearer x y"]) | _header_text
        )
    if draw(st.booleans()):
        headers["X-Firstpass-Mode"] = draw(
            st.sampled_from(["cascade", "shadow", "enforce", "passthrough", "", "CASCADE", "off"])
            | _header_text
        )
    if draw(st.booleans()):
        headers["Content-Type"] = draw(
            st.sampled_from(
                ["text/plain", "application/json; charset=latin-1", "multipart/form-data", ""]
            )
            | _header_text
        )
    return headers


# -- properties -------------------------------------------------------------------------------


@FUZZ
@given(body=json_values.map(lambda v: json.dumps(v).encode()), headers=odd_headers())
def test_arbitrary_json_gets_a_clear_answer_and_one_receipt(
    stack: LiveStack, body: bytes, headers: dict[str, str]
) -> None:
    _assert_one_clear_answer(stack, body, headers)


@FUZZ
@given(body=near_valid_bodies(), headers=odd_headers())
@example(  # found by this test: an unhashable role was a 500
    body=b'{"model": "firstpass-code", "messages": [{"role": ["user"], "content": "add"}]}',
    headers={},
)
def test_near_valid_chat_bodies_never_get_a_500(
    stack: LiveStack, body: bytes, headers: dict[str, str]
) -> None:
    _assert_one_clear_answer(stack, body, headers)


@FUZZ
@given(body=raw_bodies(), headers=odd_headers())
@example(  # found by this test: a UTF-8-encoded surrogate in a key was a 500 and no receipt
    body=b'{"model": "firstpass-code", "messages": [{"role": "user", "content": "add"}], '
    b'"firstpass": {"\xed\xa0\x80entry_point": "add"}}',
    headers={},
)
@example(body='{"model": "firstpass-code", "messages": []}'.encode("utf-16"), headers={})
def test_bytes_that_are_not_a_good_body_are_a_clear_4xx(
    stack: LiveStack, body: bytes, headers: dict[str, str]
) -> None:
    _assert_one_clear_answer(stack, body, headers)
