"""The verified cascade through the real openai SDK, against a live server and a scripted stub."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

from firstpass.receipts import verify_chain
from tests.server_harness import CHEAP, MODEL, STRONG
from tests.stub_upstream import Reply

GOOD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
VISIBLE_ONLY = "```python\ndef add(a, b):\n    return 3\n```"  # passes add(1, 2) == 3 only

TESTS: dict[str, Any] = {
    "tests": {
        "visible": ["assert add(1, 2) == 3"],
        "hidden": {
            "entry_point": "add",
            "cases": [
                {"args": [1, 2], "expected": 3},
                {"args": [-1, 1], "expected": 0},
                {"args": [10, 5], "expected": 15},
            ],
        },
    },
    "entry_point": "add",
}


def _client(stack: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)


def _ask(stack: Any, **extra: Any) -> Any:
    return _client(stack).chat.completions.with_raw_response.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add(a, b)"}],
        extra_body={"firstpass": {**TESTS, **extra}},
    )


@pytest.mark.e2e
def test_cheap_answer_that_passes_is_served_without_escalating(live_stack: Any) -> None:
    """A cheap answer passing visible tests and the gate is served, from the cheap rung only."""
    stack = live_stack()
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    raw = _ask(stack)
    completion = raw.parse()
    assert completion.choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "served"
    assert raw.headers["X-Firstpass-Receipt"].startswith("rcpt_")
    assert float(raw.headers["X-Firstpass-Overhead-Ms"]) >= 0
    fp = completion.model_extra["firstpass"]
    assert fp["served_model"] == f"stub/{CHEAP}"
    assert fp["visible"] == {"passed": 1, "total": 1}
    assert fp["gate"] == "passed"
    assert [r.model for r in stack.stub.completions] == [CHEAP]


@pytest.mark.e2e
def test_wrong_cheap_answer_escalates_to_the_next_rung(live_stack: Any) -> None:
    """A cheap answer failing the visible tests is not served; the strong rung's answer is."""
    stack = live_stack()
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _ask(stack)
    completion = raw.parse()
    assert completion.choices[0].message.content == GOOD
    assert raw.headers["X-Firstpass-Action"] == "escalated"
    assert completion.model_extra["firstpass"]["served_model"] == f"stub/{STRONG}"
    assert [r.model for r in stack.stub.completions] == [CHEAP, STRONG]


@pytest.mark.e2e
def test_answer_passing_visible_but_failing_the_gate_escalates(live_stack: Any) -> None:
    """The gate (hidden tests) catches an answer the visible test lets through."""
    stack = live_stack()
    stack.stub.script(Reply.ok(VISIBLE_ONLY), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _ask(stack)
    assert raw.headers["X-Firstpass-Action"] == "escalated"
    (receipt,) = stack.receipts_list()
    kinds = [(c["rung"], c["kind"], c["passed"]) for c in receipt["checks"]]
    assert kinds == [
        (0, "visible", True),
        (0, "gate", False),
        (1, "visible", True),
        (1, "gate", True),
    ]


@pytest.mark.e2e
def test_exhausted_ladder_serves_best_attempt_marked_unverified(live_stack: Any) -> None:
    """When every rung fails and on_exhausted is "unverified", the best attempt comes back marked."""
    stack = live_stack()
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(VISIBLE_ONLY), model=STRONG)
    raw = _ask(stack)
    completion = raw.parse()
    assert raw.headers["X-Firstpass-Action"] == "exhausted_unverified"
    assert completion.choices[0].message.content == VISIBLE_ONLY  # passed visible: the better one
    assert completion.model_extra["firstpass"]["verification"] == "unverified"


@pytest.mark.e2e
def test_exhausted_ladder_with_on_exhausted_error_answers_422(live_stack: Any) -> None:
    """With on_exhausted = "error", an exhausted ladder is an OpenAI-shaped 422, not an answer."""
    stack = live_stack(on_exhausted="error")
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(WRONG), model=STRONG)
    with pytest.raises(openai.UnprocessableEntityError) as info:
        _ask(stack)
    assert info.value.code == "verification_exhausted"
    assert info.value.response.headers["X-Firstpass-Action"] == "exhausted_error"


@pytest.mark.e2e
def test_hidden_tests_and_firstpass_object_never_reach_the_upstream(live_stack: Any) -> None:
    """The `firstpass` object is stripped before the upstream call: models never see hidden tests."""
    stack = live_stack()
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    _ask(stack)
    (sent,) = stack.stub.completions
    assert "firstpass" not in sent.body
    assert "expected" not in json.dumps(sent.body)
    assert sent.body["model"] == CHEAP


@pytest.mark.e2e
def test_request_without_checks_is_passed_through(live_stack: Any) -> None:
    """No tests and a pass-through route: the cheapest rung answers, marked unchecked."""
    stack = live_stack()
    stack.stub.script(Reply.ok("hello"), model=CHEAP)
    raw = _client(stack).chat.completions.with_raw_response.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.parse().choices[0].message.content == "hello"
    assert raw.headers["X-Firstpass-Action"] == "passthrough"


@pytest.mark.e2e
def test_streaming_sends_the_verified_answer_and_usage_last(live_stack: Any) -> None:
    """stream=True yields the chosen answer in chunks, usage in the last chunk, then [DONE]."""
    stack = live_stack()
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    stream = _client(stack).chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "write add(a, b)"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"firstpass": TESTS},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == GOOD  # the escalated, verified answer: never the cheap wrong one
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0
    assert chunks[-1].choices == []
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals[-1].model_extra is not None
    assert finals[-1].model_extra["firstpass"]["action"] == "escalated"


@pytest.mark.e2e
async def test_async_client_gets_a_verified_answer(live_stack: Any) -> None:
    """The async SDK works unchanged against the proxy, except base_url."""
    stack = live_stack()
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    client = openai.AsyncOpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)
    async with client:
        completion = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "write add(a, b)"}],
            extra_body={"firstpass": TESTS},
        )
    assert completion.choices[0].message.content == GOOD


@pytest.mark.e2e
def test_every_request_gets_exactly_one_receipt_and_the_chain_verifies(live_stack: Any) -> None:
    """Served, escalated, rejected and failed requests each leave one receipt in one valid chain."""
    stack = live_stack(retries=0)
    client = _client(stack)
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    _ask(stack)  # served
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    _ask(stack)  # escalated
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user", "content": "x"}])
    stack.stub.script(Reply.error(500), model=CHEAP)
    stack.stub.script(Reply.error(500), model=STRONG)
    with pytest.raises(openai.APIStatusError) as info:
        _ask(stack)
    assert info.value.status_code == 502
    receipts = stack.receipts_list()
    assert [r["decision"]["action"] for r in receipts] == [
        "served",
        "escalated",
        "rejected",
        "upstream_error",
    ]
    assert len({r["id"] for r in receipts}) == 4
    report = verify_chain(stack.receipts)
    assert report.ok and report.n_lines == 4


@pytest.mark.e2e
def test_receipts_hold_hashes_not_text_by_default(live_stack: Any) -> None:
    """Privacy: without store_content, neither the prompt nor the answer appears in a receipt."""
    stack = live_stack()
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    _ask(stack)
    stack.flush()
    line = stack.receipts.read_text()
    assert "return a + b" not in line and "write add" not in line
    (receipt,) = stack.receipts_list()
    assert receipt["served"]["answer_sha256"].startswith("sha256:")
    assert receipt["request"]["prompt_sha256"]


def _raw_stream(stack: Any, body: dict[str, Any]) -> tuple[int, str, Any]:
    import asyncio

    import aiohttp

    async def go() -> tuple[int, str, Any]:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"{stack.base_url}/chat/completions", json=body) as r,
        ):
            return r.status, await r.text(), r.headers

    return asyncio.run(go())


def test_slow_decision_sends_keepalive_comments_before_the_answer(live_stack: Any) -> None:
    """While verification runs past keepalive_s, SSE comments keep the stream open; then chunks."""
    stack = live_stack(keepalive_s=0.1)
    stack.stub.script(Reply.ok(GOOD, latency_ms=600), model=CHEAP)
    status, text, _ = _raw_stream(
        stack,
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "write add"}],
            "stream": True,
            "firstpass": TESTS,
        },
    )
    assert status == 200
    first_data = text.index("data: ")
    assert ": firstpass: verifying" in text[:first_data]  # nothing but comments before the answer
    assert text.rstrip().endswith("data: [DONE]")


def test_streamed_request_that_fails_early_gets_its_real_status(live_stack: Any) -> None:
    """A streamed request whose decision fails before any keep-alive is a plain JSON error."""
    stack = live_stack(retries=0)
    stack.stub.script(Reply.error(500), model=CHEAP)
    stack.stub.script(Reply.error(500), model=STRONG)
    status, text, headers = _raw_stream(
        stack,
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "write add"}],
            "stream": True,
            "firstpass": TESTS,
        },
    )
    assert status == 502
    assert json.loads(text)["error"]["type"] == "upstream_error"
    assert headers["X-Firstpass-Action"] == "upstream_error"


@pytest.mark.e2e
def test_cascade_answers_name_their_regime_and_costs_without_float_noise(live_stack: Any) -> None:
    """X-Firstpass-Regime is "cascade" without a probe; receipt costs are rounded to 1e-12 USD."""
    stack = live_stack()
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _ask(stack)
    assert raw.headers["X-Firstpass-Regime"] == "cascade"
    (receipt,) = stack.receipts_list()
    for key in ("total_usd", "top_rung_usd", "probe_usd"):
        value = receipt["cost"][key]
        assert value == round(value, 12)
    assert receipt["cost"]["total_usd"] == round(
        sum(c["cost_usd"] for c in receipt["upstream_calls"]), 12
    )
