"""``POST /v1/messages`` through the real ``anthropic`` SDK (sync, async, streaming, tools) against
a live server and a scripted stub upstream that speaks Chat Completions."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types import MessageParam, ToolParam

from tests.server_harness import CHEAP, MODEL, STRONG, LiveStack
from tests.stub_upstream import Reply, StubUpstream

#: each test drives a live server
pytestmark = pytest.mark.e2e

GOOD = "Here you go:\n```python\ndef add(a, b):\n    return a + b\n```\n"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
TESTS: dict[str, Any] = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}
KEYS = {"TEAM_A_KEY": "sk-team-a-0123456789"}
NAMED = {"client_key": [{"name": "team-a", "key_env": "TEAM_A_KEY", "routes": ["code"]}]}
ASK: list[MessageParam] = [{"role": "user", "content": "write add(a, b)"}]
WEATHER_TOOL: ToolParam = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}
CALL = {"id": "call_w1", "name": "get_weather", "arguments": '{"city": "Paris"}'}


class ToolStub(StubUpstream):
    """The stub upstream, able to answer with ``tool_calls`` (queued with ``call_tools``) and to
    report prompt-cache reads (``cached_tokens``), which ``Reply`` cannot express."""

    def __init__(self) -> None:
        self.tool_turns: deque[Sequence[dict[str, str]]] = deque()
        self.cached_tokens: int | None = None
        super().__init__()  # renders a body already

    def call_tools(self, *calls: dict[str, str], text: str = "") -> None:
        """The next chat request is answered with ``text`` and these tool calls."""
        self.tool_turns.append(calls)
        self.script(Reply.ok(text, finish_reason="tool_calls"))

    def _render(self, texts: Sequence[str], **kwargs: Any) -> bytes:
        obj = json.loads(super()._render(texts, **kwargs))
        if self.tool_turns and kwargs.get("finish_reason") == "tool_calls":
            message = obj["choices"][0]["message"]
            message["tool_calls"] = [
                {
                    "id": c["id"],
                    "type": "function",
                    "function": {"name": c["name"], "arguments": c["arguments"]},
                }
                for c in self.tool_turns.popleft()
            ]
            message["content"] = message["content"] or None
        if self.cached_tokens is not None:
            obj["usage"]["prompt_tokens_details"] = {"cached_tokens": self.cached_tokens}
        return json.dumps(obj).encode()


class ToolStack(LiveStack):
    """A ``LiveStack`` whose upstream is a ``ToolStub``."""

    stub: ToolStub

    async def _start_stub(self) -> ToolStub:
        stub = ToolStub()
        await stub.start()
        return stub


@pytest.fixture
def stack_of(tmp_path: Path) -> Iterator[Any]:
    """Factory: ``stack_of(**config)`` starts a ``ToolStack``; closed at teardown."""
    stacks: list[ToolStack] = []

    def start(**kwargs: Any) -> ToolStack:
        stack = ToolStack(tmp_path / f"receipts-{len(stacks)}.jsonl", **kwargs)
        stacks.append(stack)
        return stack

    yield start
    for stack in stacks:
        stack.close()


def _root(stack: ToolStack) -> str:
    """The server's root: the SDK appends ``/v1/messages`` itself."""
    return stack.base_url.removesuffix("/v1")


def _client(stack: ToolStack, **kwargs: Any) -> anthropic.Anthropic:
    kwargs.setdefault("api_key", "unused")
    return anthropic.Anthropic(base_url=_root(stack), max_retries=0, timeout=30, **kwargs)


def test_a_message_comes_back_in_anthropics_shape_naming_its_receipt(stack_of: Any) -> None:
    """A plain create: one text block, end_turn, Anthropic's usage, ``msg_<receipt id>``; the
    system prompt went upstream as the first system message, and the receipt says
    ``messages``."""
    stack = stack_of()
    stack.stub.script(Reply.ok("hello there", usage=(30, 4)))
    raw = _client(stack).messages.with_raw_response.create(
        model=MODEL, max_tokens=64, system="be brief", messages=[{"role": "user", "content": "hi"}]
    )
    message: Any = raw.parse()
    (receipt,) = stack.receipts_list()
    assert (
        message.id == f"msg_{receipt['id']}" and raw.headers["X-Firstpass-Receipt"] == receipt["id"]
    )
    assert [(b.type, getattr(b, "text", None)) for b in message.content] == [
        ("text", "hello there")
    ]
    assert message.stop_reason == "end_turn" and message.role == "assistant"
    assert (message.usage.input_tokens, message.usage.output_tokens) == (30, 4)
    assert message.model_extra is not None
    assert message.model_extra["firstpass"]["receipt_id"] == receipt["id"]
    assert receipt["request"]["dialect"] == "messages"
    sent = stack.stub.completions[0].body
    assert sent["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hi"},
    ]
    assert sent["max_tokens"] == 64


def test_usage_counts_input_tokens_apart_from_prompt_cache_reads(stack_of: Any) -> None:
    """An upstream prompt of 100 tokens, 40 read from its cache: ``input_tokens`` 60 and
    ``cache_read_input_tokens`` 40, as Anthropic counts them."""
    stack = stack_of()
    stack.stub.cached_tokens = 40
    stack.stub.script(Reply.ok("cached", usage=(100, 2)))
    message: Any = _client(stack).messages.create(model=MODEL, max_tokens=16, messages=ASK)
    assert message.usage.input_tokens == 60
    assert message.usage.cache_read_input_tokens == 40
    assert message.usage.cache_creation_input_tokens == 0


def test_the_async_client_gets_the_same_message(stack_of: Any) -> None:
    """``AsyncAnthropic.messages.create`` against the same endpoint."""
    stack = stack_of()
    stack.stub.script(Reply.ok("async hello"))

    async def go() -> Any:
        client = anthropic.AsyncAnthropic(
            base_url=_root(stack), api_key="unused", max_retries=0, timeout=30
        )
        async with client:
            return await client.messages.create(model=MODEL, max_tokens=16, messages=ASK)

    message: Any = asyncio.run(go())
    assert message.content[0].text == "async hello"
    assert message.stop_reason == "end_turn"


def test_checks_sent_in_extra_body_verify_the_answer(stack_of: Any) -> None:
    """``extra_body={"firstpass": ...}`` carries the tests: the cheap wrong answer escalates, the
    strong right one is served as verified, and the firstpass object says so."""
    stack = stack_of()
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    message: Any = _client(stack).messages.create(
        model=MODEL, max_tokens=256, messages=ASK, extra_body={"firstpass": TESTS}
    )
    assert message.content[0].text == GOOD
    assert message.model_extra is not None
    fp = message.model_extra["firstpass"]
    assert fp["verification"] == "verified" and fp["served_model"] == f"stub/{STRONG}"
    assert all("firstpass" not in r.body for r in stack.stub.completions)


def test_a_stream_accumulates_to_the_final_message_with_its_receipt(stack_of: Any) -> None:
    """``messages.stream`` yields the text in pieces; the accumulated final message is the
    whole answer, verified, and names the receipt written."""
    stack = stack_of()
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    with _client(stack).messages.stream(
        model=MODEL, max_tokens=256, messages=ASK, extra_body={"firstpass": TESTS}
    ) as stream:
        pieces = list(stream.text_stream)
        final: Any = stream.get_final_message()
    assert len(pieces) > 1 and "".join(pieces) == GOOD
    assert final.content[0].type == "text" and final.content[0].text == GOOD
    assert final.stop_reason == "end_turn" and final.usage.output_tokens > 0
    (receipt,) = stack.receipts_list()
    assert final.model_extra is not None
    assert final.model_extra["firstpass"]["receipt_id"] == receipt["id"]
    assert final.model_extra["firstpass"]["verification"] == "verified"
    assert receipt["request"]["dialect"] == "messages" and receipt["request"]["stream"] is True


def test_stream_true_yields_anthropics_events_in_order(stack_of: Any) -> None:
    """``stream=True``: message_start, the text block's start, deltas and stop, message_delta
    (stop reason, output tokens, the firstpass object), message_stop."""
    stack = stack_of()
    stack.stub.script(Reply.ok("one two three four five six seven eight nine ten eleven"))
    events: list[Any] = list(
        _client(stack).messages.create(model=MODEL, max_tokens=64, messages=ASK, stream=True)
    )
    kinds = [e.type for e in events]
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    assert set(kinds[2:-3]) == {"content_block_delta"} and len(kinds) > 6
    start, delta = events[0], events[-2]
    assert start.type == "message_start" and start.message.content == []
    assert delta.type == "message_delta" and delta.delta.stop_reason == "end_turn"
    assert delta.usage.output_tokens > 0
    (receipt,) = stack.receipts_list()
    assert delta.model_extra is not None
    assert delta.model_extra["firstpass"]["receipt_id"] == receipt["id"]


def test_a_missing_max_tokens_is_a_bad_request_in_anthropics_error_shape(stack_of: Any) -> None:
    """Anthropic requires ``max_tokens``: without it, a 400 ``invalid_request_error`` naming it,
    and nothing goes upstream."""
    stack = stack_of()
    with pytest.raises(anthropic.BadRequestError) as info:
        _client(stack).messages.create(model=MODEL, max_tokens=anthropic.omit, messages=ASK)  # type: ignore[call-overload]
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]
    assert body["firstpass"]["param"] == "max_tokens"
    assert stack.stub.completions == []


def test_a_server_tool_is_refused_naming_its_type(stack_of: Any) -> None:
    """A hosted tool (web search) cannot run through a chat upstream: 400 naming
    ``tools[1].type``, never dropped in silence."""
    stack = stack_of()
    with pytest.raises(anthropic.BadRequestError) as info:
        _client(stack).messages.create(
            model=MODEL,
            max_tokens=64,
            messages=ASK,
            tools=[WEATHER_TOOL, {"type": "web_search_20250305", "name": "web_search"}],
        )
    assert isinstance(info.value.body, dict)
    assert info.value.body["firstpass"]["param"] == "tools[1].type"
    assert stack.stub.completions == []


def test_x_api_key_and_bearer_auth_token_are_both_accepted(stack_of: Any) -> None:
    """With client keys configured, the SDK's ``api_key`` (``x-api-key``) and ``auth_token``
    (Bearer) both authenticate; the receipt names the key."""
    stack = stack_of(env=KEYS, tables={"server": NAMED})
    key = KEYS["TEAM_A_KEY"]
    for client in (
        _client(stack, api_key=key),
        anthropic.Anthropic(base_url=_root(stack), auth_token=key, max_retries=0, timeout=30),
    ):
        stack.stub.script(Reply.ok("hi"))
        message: Any = client.messages.create(model=MODEL, max_tokens=8, messages=ASK)
        assert message.content[0].text == "hi"
    receipts = stack.receipts_list()
    assert [r["request"]["client_key"] for r in receipts] == ["team-a", "team-a"]


def test_a_wrong_key_is_an_authentication_error(stack_of: Any) -> None:
    """A key the server does not know: 401, Anthropic's ``authentication_error``."""
    stack = stack_of(env=KEYS, tables={"server": NAMED})
    with pytest.raises(anthropic.AuthenticationError) as info:
        _client(stack, api_key="sk-wrong").messages.create(model=MODEL, max_tokens=8, messages=ASK)
    assert isinstance(info.value.body, dict)
    assert info.value.body["error"]["type"] == "authentication_error"
    assert stack.stub.completions == []


def test_a_tool_call_comes_back_as_a_tool_use_block(stack_of: Any) -> None:
    """The upstream answers with tool_calls: the message holds its text, then a ``tool_use``
    block with the parsed input, and stops for ``tool_use``; the tools went upstream as
    function tools."""
    stack = stack_of()
    stack.stub.call_tools(CALL, text="Let me look.")
    message: Any = _client(stack).messages.create(
        model=MODEL,
        max_tokens=64,
        messages=[{"role": "user", "content": "weather in Paris?"}],
        tools=[WEATHER_TOOL],
        tool_choice={"type": "auto"},
    )
    assert [b.type for b in message.content] == ["text", "tool_use"]
    block = message.content[1]
    assert block.type == "tool_use"
    assert (block.id, block.name, block.input) == ("call_w1", "get_weather", {"city": "Paris"})
    assert message.stop_reason == "tool_use"
    sent = stack.stub.completions[0].body
    assert sent["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": WEATHER_TOOL["input_schema"],
            },
        }
    ]
    assert sent["tool_choice"] == "auto"


def test_a_streamed_tool_call_accumulates_to_a_tool_use_block(stack_of: Any) -> None:
    """Streamed, the tool call's input arrives as ``input_json_delta`` pieces; the SDK's final
    message holds the parsed input and stops for ``tool_use``."""
    stack = stack_of()
    stack.stub.call_tools(
        CALL, {"id": "call_w2", "name": "get_weather", "arguments": '{"city": "Lyon"}'}
    )
    with _client(stack).messages.stream(
        model=MODEL,
        max_tokens=64,
        messages=ASK,
        tools=[WEATHER_TOOL],
    ) as stream:
        deltas: list[Any] = [e for e in stream if e.type == "content_block_delta"]
        final: Any = stream.get_final_message()
    assert deltas and all(d.delta.type == "input_json_delta" for d in deltas)
    assert [(b.type, getattr(b, "input", None)) for b in final.content] == [
        ("tool_use", {"city": "Paris"}),
        ("tool_use", {"city": "Lyon"}),
    ]
    assert final.stop_reason == "tool_use"


def test_a_tool_turn_on_a_verified_route_comes_back_intact_plain_and_streamed(
    stack_of: Any,
) -> None:
    """With checks sent, a turn that ends in tool calls is not judged as a final answer: it
    comes back as the tool_use the cheap rung asked for (no escalation), receipted as a tool
    turn, plain and streamed alike."""
    stack = stack_of()
    client = _client(stack)
    ask: dict[str, Any] = {
        "model": MODEL,
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "tools": [WEATHER_TOOL],
        "extra_body": {"firstpass": TESTS},
    }
    stack.stub.call_tools(CALL)
    plain: Any = client.messages.create(**ask)
    stack.stub.call_tools(CALL)
    with client.messages.stream(**ask) as stream:
        streamed: Any = stream.get_final_message()
    for message in (plain, streamed):
        assert [(b.type, b.id, b.input) for b in message.content] == [
            ("tool_use", "call_w1", {"city": "Paris"})
        ]
        assert message.stop_reason == "tool_use"
        assert message.model_extra["firstpass"]["action"] == "tool_turn"
    assert [r.model for r in stack.stub.completions] == [CHEAP, CHEAP]
    receipts = stack.receipts_list()
    assert [r["decision"]["action"] for r in receipts] == ["tool_turn", "tool_turn"]
    assert {r["request"]["dialect"] for r in receipts} == {"messages"}


def test_a_tool_result_turn_is_forwarded_as_a_tool_message(stack_of: Any) -> None:
    """The client's next turn: its ``tool_use`` becomes the assistant's tool_calls and its
    ``tool_result`` a ``role: tool`` message with the same id, in place, before the user's
    text."""
    stack = stack_of()
    stack.stub.script(Reply.ok("It is sunny in Paris."))
    message: Any = _client(stack).messages.create(
        model=MODEL,
        max_tokens=64,
        tools=[WEATHER_TOOL],
        messages=[
            {"role": "user", "content": "weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me look."},
                    {
                        "type": "tool_use",
                        "id": "call_w1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": "call_w1", "content": "sunny, 21C"},
                    {"type": "text", "text": "and briefly?"},
                ],
            },
        ],
    )
    assert message.content[0].text == "It is sunny in Paris."
    sent = stack.stub.completions[0].body["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": "Let me look.",
        "tool_calls": [
            {
                "id": "call_w1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert sent[2] == {"role": "tool", "tool_call_id": "call_w1", "content": "sunny, 21C"}
    assert sent[3] == {"role": "user", "content": [{"type": "text", "text": "and briefly?"}]}


def test_a_stream_verified_past_keepalive_still_yields_the_final_message(stack_of: Any) -> None:
    """Verification outlasts ``keepalive_s``: pings go out first (so the headers, sent before the
    receipt existed, name none), the SDK skips them, and the final message names the receipt."""
    stack = stack_of(keepalive_s=0.05)
    stack.stub.script(Reply.ok(GOOD, latency_ms=500), model=CHEAP)
    with _client(stack).messages.stream(
        model=MODEL, max_tokens=256, messages=ASK, extra_body={"firstpass": TESTS}
    ) as stream:
        final: Any = stream.get_final_message()
        headers = stream.response.headers
    assert "X-Firstpass-Receipt" not in headers
    assert final.content[0].type == "text" and final.content[0].text == GOOD
    (receipt,) = stack.receipts_list()
    assert final.model_extra is not None
    assert final.model_extra["firstpass"]["receipt_id"] == receipt["id"]


def test_the_keepalive_is_anthropics_ping_event(stack_of: Any) -> None:
    """On the wire, before ``message_start``: ``event: ping`` with ``{"type": "ping"}``."""
    stack = stack_of(keepalive_s=0.05)
    stack.stub.script(Reply.ok(GOOD, latency_ms=500), model=CHEAP)
    with _client(stack).messages.with_streaming_response.create(
        model=MODEL, max_tokens=256, messages=ASK, stream=True, extra_body={"firstpass": TESTS}
    ) as response:
        text = response.read().decode()
    before = text[: text.index("event: message_start")]
    assert 'event: ping\ndata: {"type": "ping"}\n\n' in before
    assert before.replace('event: ping\ndata: {"type": "ping"}\n\n', "") == ""


def test_an_error_decided_after_a_ping_raises_in_the_sdk(stack_of: Any) -> None:
    """Exhausted with ``on_exhausted = "error"`` after pings went out (status 200 by then): an
    ``error`` event in Anthropic's shape, which the SDK raises, naming the receipt."""
    stack = stack_of(keepalive_s=0.05, on_exhausted="error")
    stack.stub.script(Reply.ok(WRONG, latency_ms=300), model=CHEAP)
    stack.stub.script(Reply.ok(WRONG), model=STRONG)
    with (
        pytest.raises(anthropic.APIStatusError) as info,
        _client(stack).messages.stream(
            model=MODEL, max_tokens=256, messages=ASK, extra_body={"firstpass": TESTS}
        ) as stream,
    ):
        stream.get_final_message()
    body = info.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"  # a 422 in Anthropic's types
    assert body["firstpass"]["code"] == "verification_exhausted"
    (receipt,) = stack.receipts_list()
    assert body["firstpass"]["receipt_id"] == receipt["id"]


# -- tool inputs, stop reasons and receipt headers --------------------------------------------

F_TOOL: ToolParam = {"name": "f", "input_schema": {"type": "object"}}


def _strict_json(text: str) -> Any:
    """``json.loads`` refusing ``NaN`` and ``Infinity``, which Python accepts and JSON does not."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def _same_message(a: Any, b: Any) -> None:
    """Two answers to the same scripted turn: equal but for ids and the firstpass object."""
    keep = {"type", "role", "model", "content", "stop_reason", "stop_sequence", "usage"}
    assert a.model_dump(include=keep) == b.model_dump(include=keep)


@pytest.mark.parametrize("arguments", ['{"x": 1e999}', '{"x": NaN}', '{"x": [-Infinity]}'])
def test_tool_arguments_that_are_not_strict_json_come_back_raw_plain_and_streamed(
    stack_of: Any, arguments: str
) -> None:
    """Arguments Python's json reads but JSON forbids (a number out of range, ``NaN``) are kept
    as text under ``_firstpass_raw_arguments``: the plain body is strict JSON, the stream's
    ``input_json_delta`` pieces are strict JSON too, and the SDK's streamed final message is
    the plain message."""
    stack = stack_of()
    client = _client(stack)
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "messages": ASK, "tools": [F_TOOL]}
    call = {"id": "call_f", "name": "f", "arguments": arguments}

    stack.stub.call_tools(call)
    raw = client.messages.with_raw_response.create(**ask)
    body = _strict_json(raw.http_response.text)
    assert body["content"] == [
        {
            "type": "tool_use",
            "id": "call_f",
            "name": "f",
            "input": {"_firstpass_raw_arguments": arguments},
        }
    ]
    plain: Any = raw.parse()

    stack.stub.call_tools(call)
    with client.messages.stream(**ask) as stream:
        streamed: Any = stream.get_final_message()
    _same_message(plain, streamed)

    stack.stub.call_tools(call)
    with client.messages.with_streaming_response.create(**ask, stream=True) as response:
        wire = response.read().decode()
    datas = [_strict_json(line[6:]) for line in wire.splitlines() if line.startswith("data: ")]
    sent = "".join(
        d["delta"]["partial_json"]
        for d in datas
        if d["type"] == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    )
    assert _strict_json(sent) == body["content"][0]["input"]


def test_a_tool_calls_finish_without_calls_ends_the_turn_plain_and_streamed(
    stack_of: Any,
) -> None:
    """An upstream that says ``finish_reason: "tool_calls"`` but calls nothing gave a final
    answer: ``stop_reason`` is ``end_turn`` (a client reading ``tool_use`` would look for a
    call to run and find none), plain and streamed."""
    stack = stack_of()
    client = _client(stack)
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 16, "messages": ASK, "tools": [F_TOOL]}
    stack.stub.script(Reply.ok("no tool needed", finish_reason="tool_calls"))
    plain: Any = client.messages.create(**ask)
    stack.stub.script(Reply.ok("no tool needed", finish_reason="tool_calls"))
    with client.messages.stream(**ask) as stream:
        streamed: Any = stream.get_final_message()
    for message in (plain, streamed):
        assert [(b.type, b.text) for b in message.content] == [("text", "no tool needed")]
        assert message.stop_reason == "end_turn"
    _same_message(plain, streamed)


def test_every_answer_and_stream_names_the_receipt_it_wrote_in_a_header(stack_of: Any) -> None:
    """Plain or streamed, served, a tool turn, or an error decided before the stream began:
    each response that wrote a receipt names it in ``X-Firstpass-Receipt``."""
    stack = stack_of(retries=0, on_exhausted="error")
    client = _client(stack)
    ask: dict[str, Any] = {"model": MODEL, "max_tokens": 64, "messages": ASK}
    checked: dict[str, Any] = {**ask, "extra_body": {"firstpass": TESTS}}
    tools: dict[str, Any] = {**ask, "tools": [WEATHER_TOOL]}

    def plain(kwargs: dict[str, Any]) -> Any:
        try:
            return client.messages.with_raw_response.create(**kwargs).headers
        except anthropic.APIStatusError as err:
            return err.response.headers

    def streamed(kwargs: dict[str, Any]) -> Any:
        try:
            with client.messages.stream(**kwargs) as stream:
                stream.get_final_message()
                return stream.response.headers
        except anthropic.APIStatusError as err:
            return err.response.headers

    def exhausted() -> None:
        stack.stub.script(Reply.ok(WRONG), model=CHEAP)
        stack.stub.script(Reply.ok(WRONG), model=STRONG)

    cases = [
        (plain, ask, lambda: stack.stub.script(Reply.ok("hi"))),
        (streamed, ask, lambda: stack.stub.script(Reply.ok("hi"))),
        (plain, tools, lambda: stack.stub.call_tools(CALL)),
        (streamed, tools, lambda: stack.stub.call_tools(CALL)),
        (plain, checked, exhausted),
        (streamed, checked, exhausted),
        (plain, ask, lambda: stack.stub.script(Reply.error(500, "upstream down"))),
        (streamed, ask, lambda: stack.stub.script(Reply.error(500, "upstream down"))),
    ]
    named: list[str] = []
    for send, kwargs, script in cases:
        script()
        before = len(stack.receipts_list())
        headers = send(kwargs)
        (receipt,) = stack.receipts_list()[before:]
        named.append(headers.get("X-Firstpass-Receipt"))
        assert named[-1] == receipt["id"], (send.__name__, len(named))
    assert len(set(named)) == len(cases)


def test_a_tool_result_answering_no_call_is_refused_before_any_rung_is_paid(
    stack_of: Any,
) -> None:
    """A ``tool_result`` whose id no ``tool_use`` of the turn before made: Anthropic's own 400,
    naming the field as the client spelt it, and no upstream call (a chat upstream would refuse
    it too, one paid call per rung)."""
    stack = stack_of()
    with pytest.raises(anthropic.BadRequestError) as info:
        _client(stack).messages.create(
            model=MODEL,
            max_tokens=64,
            tools=[WEATHER_TOOL],
            messages=[
                {"role": "user", "content": "weather in Paris?"},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "tool_use", "id": "call_w1", "name": "get_weather", "input": {}}
                    ],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "zz", "content": "x"}],
                },
            ],
        )
    body = info.value.body
    assert isinstance(body, dict)
    assert body["firstpass"]["param"] == "messages[2].content[0].tool_use_id"
    assert "unexpected `tool_use_id` found in `tool_result` blocks: zz" in body["error"]["message"]
    assert stack.stub.completions == []


def test_an_assistant_prefill_is_refused_naming_its_role(stack_of: Any) -> None:
    """A conversation ending in an assistant message asks the model to continue it; a chat
    upstream would answer from scratch, so it is a 400 naming ``messages[1].role`` and why."""
    stack = stack_of()
    with pytest.raises(anthropic.BadRequestError) as info:
        _client(stack).messages.create(
            model=MODEL,
            max_tokens=64,
            messages=[*ASK, {"role": "assistant", "content": "```python\n"}],
        )
    body = info.value.body
    assert isinstance(body, dict)
    assert body["firstpass"]["param"] == "messages[1].role"
    assert "prefill" in body["error"]["message"]
    assert stack.stub.completions == []


def test_a_parallel_tool_loop_round_trips_through_the_sdk(stack_of: Any) -> None:
    """The SDK's own loop: the upstream calls two tools at once, the client sends the message
    back with both results (one an error) and a question after them, and gets the answer."""
    stack = stack_of()
    second = {"id": "call_w2", "name": "get_weather", "arguments": '{"city": "Rome"}'}
    stack.stub.call_tools(CALL, second)
    stack.stub.script(Reply.ok("Sunny in Paris; Rome unknown."))
    client = _client(stack)
    history: list[MessageParam] = [{"role": "user", "content": "weather in Paris and Rome?"}]
    turn: Any = client.messages.create(
        model=MODEL, max_tokens=64, tools=[WEATHER_TOOL], messages=history
    )
    assert [b.id for b in turn.content if b.type == "tool_use"] == ["call_w1", "call_w2"]
    history += [
        {"role": "assistant", "content": turn.content},
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "call_w2",
                    "content": "no data",
                    "is_error": True,
                },
                {"type": "tool_result", "tool_use_id": "call_w1", "content": "sunny"},
                {"type": "text", "text": "briefly?"},
            ],
        },
    ]
    final: Any = client.messages.create(
        model=MODEL, max_tokens=64, tools=[WEATHER_TOOL], messages=history
    )
    assert final.content[0].text == "Sunny in Paris; Rome unknown."
    sent = stack.stub.completions[1].body["messages"]
    assert [m["role"] for m in sent] == ["user", "assistant", "tool", "tool", "user"]
    assert sent[2] == {"role": "tool", "tool_call_id": "call_w2", "content": "Error: no data"}
