"""Every refusal is an OpenAI-shaped error with the right status, and still leaves one receipt."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from typing import Any

import aiohttp
import anthropic
import openai
import pytest

from firstpass.receipts import verify_chain
from tests.server_harness import CHEAP, MODEL, STRONG
from tests.stub_upstream import Reply

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
TESTS = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}


def _client(stack: Any, **kw: Any) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=stack.base_url, api_key=kw.pop("api_key", "unused"), max_retries=0, **kw
    )


def _error_shape(body: dict[str, Any]) -> dict[str, Any]:
    error: dict[str, Any] = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def _post_raw(
    stack: Any, data: bytes, headers: dict[str, str] | None = None
) -> tuple[int, Any, Any]:
    async def go() -> tuple[int, Any, Any]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(
                f"{stack.base_url}/chat/completions",
                data=data,
                headers={"Content-Type": "application/json", **(headers or {})},
            ) as r,
        ):
            return r.status, await r.json(content_type=None), r.headers

    return asyncio.run(go())


def test_malformed_json_is_a_400_in_openai_shape(live_stack: Any) -> None:
    """A body that is not JSON gets 400 invalid_json, never a 500 or a traceback."""
    stack = live_stack()
    status, body, headers = _post_raw(stack, b'{"model": "x", "messages": [')
    assert status == 400
    err = _error_shape(body)
    assert err["code"] == "invalid_json" and "Traceback" not in err["message"]
    assert headers["X-Firstpass-Action"] == "rejected"


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 1000 + b"]" * 1000,
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "firstpass": {"tests": '
        + b"[" * 900
        + b"]" * 900
        + b"}}",
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": '
        + b"9" * 5000
        + b"}",
        b'{"model": "m", "messages": [{"role": "user", "content": "\\udc00"}]}',
    ],
    ids=["deep_body", "deep_tests", "int_of_5000_digits", "lone_surrogate"],
)
def test_a_deeply_nested_body_is_a_400_with_its_receipt(live_stack: Any, data: bytes) -> None:
    """About 1,000 nested arrays in 2 KB: a 400 in OpenAI's shape and one receipt, no 500."""
    stack = live_stack()
    status, body, headers = _post_raw(stack, data)
    assert status == 400
    err = _error_shape(body)
    assert "Traceback" not in err["message"]
    assert headers["X-Firstpass-Action"] == "rejected"
    (receipt,) = stack.receipts_list()
    assert receipt["error"]["status"] == 400


@pytest.mark.parametrize(
    ("encoding", "data"),
    [
        ("gzip", b"this is not gzip at all"),
        ("deflate", b"nor is this deflate"),
        ("gzip", b"\x1f\x8b\x08\x00" + b"\x00" * 6 + b"garbage after a gzip header"),
    ],
    ids=["gzip", "deflate", "gzip_header_then_garbage"],
)
def test_a_body_that_does_not_decompress_is_a_400_with_its_receipt(
    live_stack: Any, encoding: str, data: bytes
) -> None:
    """``Content-Encoding: gzip`` (or deflate) over bytes that do not decompress: a 400 in
    OpenAI's shape and its one receipt, never a 500 with a traceback (issue 26, item 1)."""
    stack = live_stack()
    status, body, headers = _post_raw(stack, data, {"Content-Encoding": encoding})
    assert status == 400, body
    err = _error_shape(body)
    assert err["code"] == "invalid_body" and "Traceback" not in err["message"]
    assert "Content-Encoding" in err["message"]
    assert headers["X-Firstpass-Action"] == "rejected"
    (receipt,) = stack.receipts_list()
    assert receipt["error"]["status"] == 400
    assert receipt["id"] == headers["X-Firstpass-Receipt"]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "model"),
        ({"model": MODEL, "messages": []}, "messages"),
        ({"model": MODEL, "messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        (
            {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "temperature": 7},
            "temperature",
        ),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "firstpass": {"tests": {"visible": 3}},
            },
            "firstpass.tests.visible",
        ),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "firstpass": {"bogus": 1},
            },
            "firstpass.bogus",
        ),
        (
            {
                "model": MODEL,
                "messages": [{"role": "user", "content": "x"}],
                "firstpass": {"mode": "yolo"},
            },
            "firstpass.mode",
        ),
    ],
)
def test_bad_fields_are_400_naming_the_parameter(
    live_stack: Any, body: dict[str, Any], param: str
) -> None:
    """Each malformed field is refused with 400 and `param` pointing at it."""
    stack = live_stack()
    status, resp, _ = _post_raw(stack, json.dumps(body).encode())
    assert status == 400
    err = _error_shape(resp)
    assert err["param"] is not None and err["param"].startswith(param)
    assert err["type"] == "invalid_request_error"


@pytest.mark.e2e
def test_wrong_client_key_is_401(live_stack: Any) -> None:
    """With client keys configured, a wrong key is refused before anything else happens."""
    stack = live_stack(client_keys_env=("FP_TEST_KEY",), env={"FP_TEST_KEY": "sesame"})
    with pytest.raises(openai.AuthenticationError) as info:
        _client(stack, api_key="wrong").chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.code == "invalid_api_key"
    stack.stub.script(Reply.ok("fine"), model=CHEAP)
    ok = _client(stack, api_key="sesame").chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}]
    )
    assert ok.choices[0].message.content == "fine"
    assert len(stack.stub.completions) == 1  # the refused request never went upstream


@pytest.mark.e2e
def test_unknown_model_is_404(live_stack: Any) -> None:
    """A model that matches no route is a 404 naming the model parameter."""
    stack = live_stack()
    with pytest.raises(openai.NotFoundError) as info:
        _client(stack).chat.completions.create(
            model="gpt-nope", messages=[{"role": "user", "content": "x"}]
        )
    assert info.value.param == "model"


def test_body_over_the_limit_is_413(live_stack: Any) -> None:
    """A body larger than server.max_body_bytes is refused with 413."""
    stack = live_stack(max_body_bytes=2048)
    big = json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "x" * 5000}]}
    ).encode()
    status, body, _ = _post_raw(stack, big)
    assert status == 413
    assert _error_shape(body)["code"] == "body_too_large"


@pytest.mark.e2e
def test_full_concurrency_bound_is_429(live_stack: Any) -> None:
    """Past server.max_concurrency requests in flight, new ones get 429 at once."""
    stack = live_stack(max_concurrency=2)
    stack.stub.script(
        Reply.ok("slow", latency_ms=800), Reply.ok("slow", latency_ms=800), model=CHEAP
    )
    client = _client(stack)

    def slow() -> Any:
        return client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "x"}]
        )

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(slow), pool.submit(slow)]
        time.sleep(0.3)
        with pytest.raises(openai.RateLimitError) as info:
            slow()
        assert info.value.code == "concurrency_limit"
        assert all(f.result().choices[0].message.content == "slow" for f in futures)


@pytest.mark.e2e
def test_upstream_errors_are_retried_then_502(live_stack: Any) -> None:
    """5xx from every rung, after retries, is a clean 502 in OpenAI's shape."""
    stack = live_stack(retries=1)
    stack.stub.script(Reply.error(503), Reply.error(503), model=CHEAP)
    stack.stub.script(Reply.error(500), Reply.error(500), model=STRONG)
    with pytest.raises(openai.APIStatusError) as info:
        _client(stack).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"firstpass": TESTS},
        )
    assert info.value.status_code == 502
    assert len(stack.stub.completions) == 4  # two attempts on each rung


@pytest.mark.e2e
def test_an_upstream_that_refuses_the_request_itself_is_the_clients_400_not_a_502(
    live_stack: Any,
) -> None:
    """Every rung answers 400 (a tool result with no call before it, say): the client hears
    its own mistake as a 400 naming the upstream's reason, which its SDK does not retry,
    instead of a 502 it would retry into more receipts; the receipt says 400."""
    stack = live_stack(retries=1)
    stack.stub.script(Reply.error(400, "tool_call_id nope matches no call"), model=CHEAP)
    stack.stub.script(Reply.error(400, "tool_call_id nope matches no call"), model=STRONG)
    with pytest.raises(openai.BadRequestError) as info:
        openai.OpenAI(base_url=stack.base_url, api_key="unused").chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"firstpass": TESTS},
        )
    assert info.value.code == "upstream_rejected_request"
    assert "matches no call" in str(info.value)
    assert len(stack.stub.completions) == 2  # one per rung: a 400 is never retried
    (receipt,) = stack.receipts_list()
    assert receipt["error"]["status"] == 400


@pytest.mark.e2e
def test_upstream_error_then_success_is_served(live_stack: Any) -> None:
    """A 429 with Retry-After, then an answer: the client sees only the answer."""
    stack = live_stack()
    stack.stub.script(Reply.error(429, retry_after=0.05), Reply.ok(GOOD), model=CHEAP)
    raw = _client(stack).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], extra_body={"firstpass": TESTS}
    )
    assert raw.headers["X-Firstpass-Action"] == "served"
    (receipt,) = stack.receipts_list()
    assert receipt["upstream_calls"][0]["attempts"] == 2


@pytest.mark.e2e
def test_upstream_timeout_is_504(live_stack: Any) -> None:
    """An upstream that never answers in time, on every rung, is a 504."""
    stack = live_stack(retries=0, timeout_s=0.3)
    stack.stub.script(Reply.timeout(2.0), model=CHEAP)
    stack.stub.script(Reply.timeout(2.0), model=STRONG)
    with pytest.raises(openai.APIStatusError) as info:
        _client(stack).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"firstpass": TESTS},
        )
    assert info.value.status_code == 504


@pytest.mark.e2e
def test_one_deadline_bounds_a_request_across_rungs_and_retries(live_stack: Any) -> None:
    """A hung upstream costs request_timeout_s, not rungs x (1 + retries) x timeout_s (here
    60 s, however idle the machine: the bound of 30 s is one load cannot reach)."""
    import time

    stack = live_stack(retries=2, timeout_s=10.0, request_timeout_s=1.2)
    stack.stub.script(*[Reply.timeout(30.0)] * 3, model=CHEAP)
    stack.stub.script(*[Reply.timeout(30.0)] * 3, model=STRONG)
    t0 = time.monotonic()
    with pytest.raises(openai.APIStatusError) as info:
        _client(stack).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"firstpass": TESTS},
        )
    assert info.value.status_code == 504
    assert "request_timeout_s" in info.value.message
    assert time.monotonic() - t0 < 30.0  # 2 rungs x 3 attempts x 10 s would be 60 s
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "timeout" and receipt["error"]["status"] == 504


@pytest.mark.e2e
def test_cut_connection_on_cheap_rung_escalates(live_stack: Any) -> None:
    """A cheap rung that fails at the network level does not fail the request: the next rung answers."""
    stack = live_stack(retries=0)
    stack.stub.script(Reply.cut(), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _client(stack).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "x"}], extra_body={"firstpass": TESTS}
    )
    assert raw.headers["X-Firstpass-Action"] == "escalated"


@pytest.mark.e2e
async def test_concurrent_burst_each_gets_an_answer_and_a_receipt(live_stack: Any) -> None:
    """64 concurrent verified requests: all answered, 64 receipts, one valid chain."""
    stack = live_stack()
    stack.stub.script(*[Reply.ok(GOOD, latency_ms=20)] * 64, model=CHEAP)
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    async with client:
        results = await asyncio.gather(
            *(
                client.chat.completions.create(
                    model=MODEL,
                    messages=[{"role": "user", "content": f"req {i}"}],
                    extra_body={"firstpass": TESTS},
                )
                for i in range(64)
            )
        )
    assert all(r.choices[0].message.content == GOOD for r in results)
    receipts = stack.receipts_list()
    assert len(receipts) == 64 and len({r["id"] for r in receipts}) == 64
    assert verify_chain(stack.receipts).ok


@pytest.mark.e2e
def test_models_health_and_readiness_endpoints(live_stack: Any) -> None:
    """GET /v1/models lists routes as models; /healthz and /readyz answer 200 once started."""
    stack = live_stack()
    models = _client(stack).models.list()
    assert [m.id for m in models.data] == [MODEL]

    async def get(path: str) -> int:
        async with (
            aiohttp.ClientSession() as s,
            s.get(stack.base_url.removesuffix("/v1") + path) as r,
        ):
            return r.status

    assert asyncio.run(get("/healthz")) == 200
    assert asyncio.run(get("/readyz")) == 200
    assert asyncio.run(get("/nope")) == 404


class _BrokenSandbox:
    """A sandbox with a bug: every run raises something we never planned for."""

    isolation = "none"

    async def __aenter__(self) -> _BrokenSandbox:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def run(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internal detail")


@pytest.mark.parametrize("debug", [False, True])
@pytest.mark.e2e
def test_a_bug_of_ours_is_a_500_without_traceback_and_still_one_receipt(
    live_stack: Any, debug: bool
) -> None:
    """An unexpected exception answers 500 in OpenAI's shape; debug names it, never a traceback."""
    stack = live_stack(sandbox_factory=lambda _config: _BrokenSandbox(), debug=debug)
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    with pytest.raises(openai.InternalServerError) as info:
        _client(stack).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"firstpass": TESTS},
        )
    message = info.value.message
    assert "Traceback" not in message and "internal error" in message
    assert ("RuntimeError: secret internal detail" in message) is debug
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "internal_error"
    assert receipt["error"]["status"] == 500


def test_a_client_that_leaves_mid_body_still_gets_one_receipt(live_stack: Any) -> None:
    """A POST whose body stops short and whose connection closes is a `client_disconnected`
    receipt (499), not a missing receipt or an `unhandled_error` in the log."""
    import socket
    from urllib.parse import urlsplit

    stack = live_stack()
    url = urlsplit(stack.base_url)
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n" + b'{"model": "'
        )
        time.sleep(0.2)  # let the server start reading the body before the client leaves
    deadline = time.monotonic() + 10
    while not (records := stack.receipts_list()) and time.monotonic() < deadline:
        time.sleep(0.05)
    (receipt,) = records
    assert receipt["decision"]["action"] == "rejected"
    assert receipt["error"]["status"] == 499
    assert "closed the connection" in receipt["error"]["message"]


def test_a_bug_before_admission_is_a_500_in_openai_shape_with_its_one_receipt(
    live_stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An exception of ours while reading or admitting a request (not a refusal) still ends in
    one receipt and an OpenAI-shaped 500 naming that receipt, never a bare traceback."""
    from firstpass.server import _handlers

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(_handlers, "parse_chat_body", broken)
    stack = live_stack()
    status, body, headers = _post_raw(
        stack, json.dumps({"model": MODEL, "messages": [{"role": "user", "content": "x"}]}).encode()
    )
    assert status == 500
    err = _error_shape(body)
    assert err["type"] == "server_error" and "Traceback" not in err["message"]
    (receipt,) = stack.receipts_list()
    assert receipt["error"] == {"status": 500, "type": "server_error", "message": "KeyError"}
    assert headers["X-Firstpass-Receipt"] == receipt["id"] and receipt["id"] in err["message"]


@pytest.mark.parametrize(
    ("firstpass", "param"),
    [
        ({"checks": {"visible": [{"kind": "json_schema", "schema": {"$schema": 5}}]}}, "schema"),
        (
            {
                "evidence": [
                    {"sql": "select 1", "columns": ["a"], "rows": [[1]], "elapsed_ms": 10**400}
                ]
            },
            "elapsed_ms",
        ),
    ],
    ids=["non_string_schema_dialect", "elapsed_ms_past_a_float"],
)
def test_a_request_field_a_library_would_choke_on_is_a_400_naming_it(
    live_stack: Any, firstpass: dict[str, Any], param: str
) -> None:
    """Values that made jsonschema raise AttributeError or float() raise OverflowError (a 500
    without a receipt once) are refused as what they are, with their receipt."""
    stack = live_stack()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "firstpass": firstpass}
    status, answer, _ = _post_raw(stack, json.dumps(body).encode())
    assert status == 400, answer
    err = _error_shape(answer)
    assert param in (err["param"] or "") + err["message"]
    (receipt,) = stack.receipts_list()
    assert receipt["error"]["status"] == 400 and receipt["decision"]["action"] == "rejected"


@pytest.mark.e2e
def test_an_upstream_error_text_that_is_not_unicode_or_huge_still_gets_its_receipt(
    live_stack: Any,
) -> None:
    """An upstream failing with a lone surrogate (a ``\\ud800`` escape) and megabytes of text
    in its error: the client gets its 502, and the receipt is written with that text repaired
    and cut (once, it could not be encoded and the request lost its receipt, answering 503)."""
    stack = live_stack(retries=0)
    stack.stub.script(Reply.error(500, "bad \ud800 text " + "x" * 100_000), model=CHEAP)
    stack.stub.script(Reply.error(500, "also \udfff bad"), model=STRONG)
    with pytest.raises(openai.APIStatusError) as info:
        _client(stack).chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "x"}],
            extra_body={"firstpass": TESTS},
        )
    assert info.value.status_code == 502
    (receipt,) = stack.receipts_list()
    errors = [call["error"] for call in receipt["upstream_calls"]]
    assert len(errors) == 2 and all(isinstance(e, str) for e in errors)
    assert "\ufffd" in errors[0] and "more characters)" in errors[0] and len(errors[0]) < 2_200
    assert receipt["error"]["status"] == 502
    assert verify_chain(stack.receipts).ok


def test_a_large_chat_body_is_parsed_off_the_event_loop(
    live_stack: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A body past PARSE_OFF_LOOP_BYTES (a megabyte of test setup takes the parser seconds) is
    parsed in a worker thread, so other requests are not stalled; a small one on the loop."""
    import threading

    from firstpass.admission import parse_chat_body as real
    from firstpass.server import _handlers

    threads: list[str] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(_handlers, "parse_chat_body", recording)
    stack = live_stack()
    stack.stub.script(Reply.ok(GOOD), Reply.ok(GOOD), model=CHEAP)
    setup = "# padding\n" * (_handlers.PARSE_OFF_LOOP_BYTES // 10 + 1)
    for extra in ({}, {"setup": setup}):
        firstpass = {**TESTS, **extra}
        body = {"model": MODEL, "messages": [{"role": "user", "content": "x"}]}
        status, answer, _ = _post_raw(stack, json.dumps({**body, "firstpass": firstpass}).encode())
        assert status == 200, answer
    loop_thread = stack._thread.name
    assert threads[0] == loop_thread and threads[1] != loop_thread


@pytest.mark.e2e
def test_a_base_url_one_v1_off_gets_a_404_saying_which_path_it_meant(live_stack: Any) -> None:
    """The anthropic SDK given ``.../v1`` asks for /v1/v1/messages (Anthropic's 404 shape, the
    hint to use the root); the openai SDK given the root asks for /responses (the hint to end
    its base_url in /v1)."""
    stack = live_stack()
    root = stack.base_url.removesuffix("/v1")
    with pytest.raises(anthropic.NotFoundError) as messages:
        anthropic.Anthropic(base_url=stack.base_url, api_key="x", max_retries=0).messages.create(
            model=MODEL, max_tokens=10, messages=[{"role": "user", "content": "x"}]
        )
    assert "did you mean /v1/messages" in str(messages.value)
    assert messages.value.body["error"]["type"] == "not_found_error"  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as responses:
        openai.OpenAI(base_url=root, api_key="x", max_retries=0).responses.create(
            model=MODEL, input="x"
        )
    assert "did you mean /v1/responses" in str(responses.value)
