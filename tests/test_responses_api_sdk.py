"""``POST /v1/responses`` through the real openai SDK (``client.responses``), against a live
server and a scripted stub upstream: plain and streamed answers, function tools over two
turns, refusals naming their field, verified answers, and receipts that record the dialect."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import openai
import pydantic
import pytest

from tests.server_harness import CHEAP, MODEL, STRONG, LiveStack
from tests.stub_upstream import Reply, StubUpstream

#: each test drives a live server with the real SDK
pytestmark = pytest.mark.e2e

GOOD = "```python\ndef add(a, b):\n    return a + b\n```"
WRONG = "```python\ndef add(a, b):\n    return a - b\n```"
TESTS = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}
WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}
#: a scripted reply text starting with this is sent as the upstream's refusal (the rest)
REFUSE_MARK = "REFUSE:"


def tool_calls(*calls: tuple[str, str, dict[str, Any]]) -> Reply:
    """A stub reply whose message makes these tool calls (id, name, arguments)."""
    listed = tuple(
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a)}}
        for i, n, a in calls
    )
    return Reply(texts=("",), tool_calls=listed, finish_reason="tool_calls")


def refusal(text: str) -> Reply:
    """A stub reply whose message is a refusal (``content: null``, ``refusal``), as OpenAI
    sends one for a request its model declines."""
    return Reply.ok(REFUSE_MARK + text)


class RefusingStub(StubUpstream):
    """The stub upstream, able to refuse (``refusal(...)`` replies)."""

    def _render(self, texts: Sequence[str], **kwargs: Any) -> bytes:
        payload = super()._render(texts, **kwargs)
        if not any(t.startswith(REFUSE_MARK) for t in texts):
            return payload
        obj = json.loads(payload)
        for choice in obj.get("choices", []):
            content = choice["message"]["content"]
            if content.startswith(REFUSE_MARK):
                choice["message"] = {
                    "role": "assistant",
                    "content": None,
                    "refusal": content[len(REFUSE_MARK) :],
                }
        return json.dumps(obj).encode()


class Stack(LiveStack):
    """A live stack whose stub upstream can refuse."""

    async def _start_stub(self) -> StubUpstream:
        stub = RefusingStub()
        await stub.start()
        return stub


@pytest.fixture
def stack_of(tmp_path: Path) -> Iterator[Callable[..., Stack]]:
    """Factory: ``stack_of(**config)`` starts a stub upstream + Firstpass; closed after."""
    stacks: list[Stack] = []

    def start(**kwargs: Any) -> Stack:
        stack = Stack(tmp_path / f"receipts-{len(stacks)}.jsonl", **kwargs)
        stacks.append(stack)
        return stack

    yield start
    for stack in stacks:
        stack.close()


def _client(stack: LiveStack) -> openai.OpenAI:
    return openai.OpenAI(base_url=stack.base_url, api_key="unused", max_retries=0)


def test_string_input_comes_back_as_a_response_with_output_text(
    stack_of: Callable[..., Stack],
) -> None:
    """A string ``input`` is the upstream's one user message; the answer comes back as a
    ``response`` whose ``output_text`` is the upstream's text, receipted as ``responses``."""
    stack = stack_of()
    stack.stub.script(Reply.ok("Paris."), model=CHEAP)
    response = _client(stack).responses.create(model=MODEL, input="capital of France?")
    assert response.output_text == "Paris."
    assert response.status == "completed" and response.object == "response"
    (receipt,) = stack.receipts_list()
    assert response.id == f"resp_{receipt['id']}"
    assert response.model_extra is not None
    assert response.model_extra["firstpass"]["receipt_id"] == receipt["id"]
    assert receipt["request"]["dialect"] == "responses"
    assert stack.stub.completions[0].body["messages"] == [
        {"role": "user", "content": "capital of France?"}
    ]


def test_items_with_instructions_reach_the_upstream_as_chat_messages(
    stack_of: Callable[..., Stack],
) -> None:
    """``instructions`` and message items (parts, a developer message, an earlier assistant
    turn) are the chat messages of the same meaning upstream."""
    stack = stack_of()
    response = _client(stack).responses.create(
        model=MODEL,
        instructions="Answer in one word.",
        input=[
            {"role": "developer", "content": "No punctuation."},
            {"role": "user", "content": [{"type": "input_text", "text": "capital of Italy?"}]},
            {"type": "message", "role": "assistant", "content": "Rome"},
            {"role": "user", "content": "and of Spain?"},
        ],
        max_output_tokens=50,
    )
    assert response.output_text
    # the response echoes the request's settings, as OpenAI's does
    assert response.instructions == "Answer in one word."
    assert response.max_output_tokens == 50
    body = stack.stub.completions[0].body
    assert body["messages"] == [
        {"role": "system", "content": "Answer in one word."},
        {"role": "developer", "content": "No punctuation."},
        {"role": "user", "content": [{"type": "text", "text": "capital of Italy?"}]},
        {"role": "assistant", "content": "Rome"},
        {"role": "user", "content": "and of Spain?"},
    ]
    assert body["max_completion_tokens"] == 50


def test_checks_in_extra_body_verify_the_answer(stack_of: Callable[..., Stack]) -> None:
    """Firstpass's checks ride in ``extra_body``: a wrong cheap answer escalates and the
    verified one is served, ``firstpass.verification == "verified"``."""
    stack = stack_of()
    stack.stub.script(Reply.ok(WRONG), model=CHEAP)
    stack.stub.script(Reply.ok(GOOD), model=STRONG)
    raw = _client(stack).responses.with_raw_response.create(
        model=MODEL, input="write add(a, b)", extra_body={"firstpass": TESTS}
    )
    response = raw.parse()
    assert response.output_text == GOOD
    assert response.model_extra is not None
    assert response.model_extra["firstpass"]["verification"] == "verified"
    assert raw.headers["X-Firstpass-Action"] == "escalated"
    (receipt,) = stack.receipts_list()
    assert receipt["request"]["dialect"] == "responses"
    assert "firstpass" not in stack.stub.completions[0].body  # tests never reach a model


def test_a_tool_call_comes_back_as_a_function_call_item(
    stack_of: Callable[..., Stack],
) -> None:
    """An upstream answer of ``tool_calls`` is a ``function_call`` output item, its
    ``call_id`` the upstream's, its arguments intact; the tool reaches upstream as a chat
    function tool."""
    stack = stack_of()
    stack.stub.script(tool_calls(("call_up_7", "get_weather", {"city": "Paris"})))
    response = _client(stack).responses.create(
        model=MODEL, input="weather in Paris?", tools=[WEATHER]
    )
    (item,) = response.output
    assert item.type == "function_call"
    assert (item.call_id, item.name) == ("call_up_7", "get_weather")
    assert json.loads(item.arguments) == {"city": "Paris"}
    assert response.output_text == ""
    (tool,) = stack.stub.completions[0].body["tools"]
    assert tool == {
        "type": "function",
        "function": {k: WEATHER[k] for k in ("name", "description", "parameters", "strict")},
    }


def test_a_streamed_tool_call_arrives_as_function_call_events_and_final_item(
    stack_of: Callable[..., Stack],
) -> None:
    """Streamed (``stream=True``, and the SDK's ``responses.stream`` helper), the tool call
    arrives as ``function_call`` events whose arguments add up, and the final response holds
    the same ``function_call`` item."""
    stack = stack_of()
    client = _client(stack)
    stack.stub.script(tool_calls(("call_up_8", "get_weather", {"city": "Rome"})))
    events = list(client.responses.create(model=MODEL, input="Rome?", tools=[WEATHER], stream=True))
    kinds = [e.type for e in events]
    assert kinds == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    done = events[-2]
    assert done.type == "response.output_item.done" and done.item.type == "function_call"
    assert done.item.call_id == "call_up_8"
    stack.stub.script(tool_calls(("call_up_9", "get_weather", {"city": "Oslo"})))
    with client.responses.stream(model=MODEL, input="Oslo?", tools=[WEATHER]) as stream:
        deltas = [e.delta for e in stream if e.type == "response.function_call_arguments.delta"]
        final = stream.get_final_response()
    assert json.loads("".join(deltas)) == {"city": "Oslo"}
    (item,) = final.output
    assert item.type == "function_call" and item.call_id == "call_up_9"
    assert final.model_extra is not None and final.model_extra["firstpass"]["receipt_id"]


def test_the_next_turns_function_call_output_reaches_upstream_as_a_tool_message(
    stack_of: Callable[..., Stack],
) -> None:
    """The agent loop's second turn: the first response's output fed back with a
    ``function_call_output`` reaches the upstream as the assistant's ``tool_calls`` and a
    ``tool`` message answering the upstream's own call id."""
    stack = stack_of()
    client = _client(stack)
    stack.stub.script(tool_calls(("call_up_1", "get_weather", {"city": "Paris"})))
    first = client.responses.create(model=MODEL, input="weather in Paris?", tools=[WEATHER])
    (call,) = first.output
    assert call.type == "function_call"
    stack.stub.script(Reply.ok("Sunny in Paris."))
    turn: list[Any] = [
        {"role": "user", "content": "weather in Paris?"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 24C"},
    ]
    second = client.responses.create(model=MODEL, tools=[WEATHER], input=turn)
    assert second.output_text == "Sunny in Paris."
    messages = stack.stub.completions[1].body["messages"]
    assert messages[1:] == [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_up_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": call.arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_up_1", "content": "sunny, 24C"},
    ]


def test_streamed_text_adds_up_to_the_verified_answer(stack_of: Callable[..., Stack]) -> None:
    """``stream=True`` with checks: the text deltas add up to the verified answer and the
    completed response carries the ``firstpass`` object naming the receipt."""
    stack = stack_of()
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    events = list(
        _client(stack).responses.create(
            model=MODEL, input="write add(a, b)", stream=True, extra_body={"firstpass": TESTS}
        )
    )
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert "".join(deltas) == GOOD
    completed = events[-1]
    assert completed.type == "response.completed"
    assert completed.response.output_text == GOOD
    extra = completed.response.model_extra
    assert extra is not None and extra["firstpass"]["verification"] == "verified"
    (receipt,) = stack.receipts_list()
    assert extra["firstpass"]["receipt_id"] == receipt["id"]
    assert receipt["request"]["dialect"] == "responses"


def test_a_stream_held_open_by_keepalives_still_parses_in_the_sdk(
    stack_of: Callable[..., Stack],
) -> None:
    """The decision outlives ``keepalive_s``: the SDK skips the keep-alive comments and gets
    the answer, and the final event names the receipt (which the headers, sent before it
    existed, could not)."""
    stack = stack_of(keepalive_s=0.05)
    stack.stub.script(Reply.ok(GOOD, latency_ms=300), model=CHEAP)
    raw = _client(stack).responses.with_raw_response.create(
        model=MODEL, input="write add(a, b)", stream=True, extra_body={"firstpass": TESTS}
    )
    assert "X-Firstpass-Receipt" not in raw.headers  # the 200 went out before the decision
    events = list(raw.parse())
    final = events[-1]
    assert final.type == "response.completed" and final.response.output_text == GOOD
    (receipt,) = stack.receipts_list()
    assert final.response.model_extra is not None
    assert final.response.model_extra["firstpass"]["receipt_id"] == receipt["id"]


def test_an_error_decided_after_a_keepalive_raises_in_the_sdk(
    stack_of: Callable[..., Stack],
) -> None:
    """The decision outlives ``keepalive_s`` (a comment keeps the stream open) and ends in an
    error: the stream's error event makes the SDK raise ``APIError`` with its message."""
    stack = stack_of(keepalive_s=0.05, on_exhausted="error")
    stack.stub.script(Reply.ok(WRONG, latency_ms=300), model=CHEAP)
    stack.stub.script(Reply.ok(WRONG), model=STRONG)
    stream = _client(stack).responses.create(
        model=MODEL, input="write add(a, b)", stream=True, extra_body={"firstpass": TESTS}
    )
    with pytest.raises(openai.APIError) as info:
        list(stream)
    # raised from the stream's error event, not from an HTTP status (the 200 went out first)
    assert not isinstance(info.value, openai.APIStatusError)
    assert "on_exhausted" in info.value.message
    assert isinstance(info.value.body, dict) and info.value.body["code"] == "verification_exhausted"
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "exhausted_error"


def test_previous_response_id_is_refused_naming_it(stack_of: Callable[..., Stack]) -> None:
    """Firstpass keeps no response state: ``previous_response_id`` is a 400 that names it and
    says to send the whole conversation; nothing goes upstream."""
    stack = stack_of()
    with pytest.raises(openai.BadRequestError) as info:
        _client(stack).responses.create(model=MODEL, input="and then?", previous_response_id="r")
    assert "previous_response_id" in info.value.message
    assert "send the whole conversation in input" in info.value.message
    assert info.value.param == "previous_response_id"
    assert stack.stub.completions == []
    (receipt,) = stack.receipts_list()  # the refusal is receipted, as from the API it came by
    assert receipt["decision"]["action"] == "rejected"
    assert receipt["request"]["dialect"] == "responses"


def test_a_hosted_tool_is_refused_naming_its_type(stack_of: Callable[..., Stack]) -> None:
    """A hosted tool cannot pass through: a 400 naming ``tools[0].type``."""
    stack = stack_of()
    with pytest.raises(openai.BadRequestError) as info:
        _client(stack).responses.create(
            model=MODEL, input="news today?", tools=[{"type": "web_search"}]
        )
    assert info.value.param == "tools[0].type"
    assert "web_search" in info.value.message
    assert stack.stub.completions == []


def test_the_same_task_through_chat_and_responses_is_the_same_request(
    stack_of: Callable[..., Stack],
) -> None:
    """One task sent through Chat Completions and through Responses: the same messages
    upstream, the same prompt hash and verdict on the receipts, apart from the dialect."""
    stack = stack_of()
    client = _client(stack)
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    client.chat.completions.create(
        model=MODEL,
        messages=[
            {"role": "system", "content": "You write Python."},
            {"role": "user", "content": "write add(a, b)"},
        ],
        extra_body={"firstpass": TESTS},
    )
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    client.responses.create(
        model=MODEL,
        instructions="You write Python.",
        input="write add(a, b)",
        extra_body={"firstpass": TESTS},
    )
    chat, responses = stack.receipts_list()
    assert chat["request"]["prompt_sha256"] == responses["request"]["prompt_sha256"]
    assert chat["request"]["dialect"] == "chat" and responses["request"]["dialect"] == "responses"
    assert chat["decision"] == responses["decision"]
    first, second = stack.stub.completions
    assert first.body["messages"] == second.body["messages"]


class Answer(pydantic.BaseModel):
    """A structured answer, for ``responses.parse``."""

    city: str


def test_an_upstream_refusal_arrives_as_a_refusal_part(
    stack_of: Callable[..., Stack],
) -> None:
    """The upstream refuses (``message.refusal``, content null): the response's message holds
    a ``refusal`` part, streamed as ``response.refusal.delta``/``.done``, and
    ``responses.parse`` gives ``output_parsed`` None instead of raising on empty text."""
    stack = stack_of()
    client = _client(stack)
    stack.stub.script(refusal("I can't help with that."), model=CHEAP)
    response = client.responses.create(model=MODEL, input="help me")
    (item,) = response.output
    assert item.type == "message"
    assert [(p.type, getattr(p, "refusal", None)) for p in item.content] == [
        ("refusal", "I can't help with that.")
    ]
    stack.stub.script(refusal("I can't help with that."), model=CHEAP)
    parsed = client.responses.parse(model=MODEL, input="help me", text_format=Answer)
    assert parsed.output_parsed is None
    stack.stub.script(refusal("I can't help with that."), model=CHEAP)
    events = list(client.responses.create(model=MODEL, input="help me", stream=True))
    deltas = [e.delta for e in events if e.type == "response.refusal.delta"]
    assert "".join(deltas) == "I can't help with that."
    assert [e.refusal for e in events if e.type == "response.refusal.done"] == [
        "I can't help with that."
    ]
    assert not any(e.type == "response.output_text.delta" for e in events)


def test_parallel_tool_calls_without_tools_is_answered_not_relayed_as_a_502(
    stack_of: Callable[..., Stack],
) -> None:
    """``parallel_tool_calls`` (and ``tool_choice: "auto"``) without tools, which OpenAI's
    Responses API accepts and its Chat Completions API refuses, are not sent upstream: the
    client gets its answer, not the upstream's 400 as a 502."""
    stack = stack_of()

    def openai_like(body: dict[str, Any]) -> Reply | None:
        if ("parallel_tool_calls" in body or "tool_choice" in body) and not body.get("tools"):
            return Reply.error(400, "'parallel_tool_calls' is only allowed when 'tools' are set")
        return None

    stack.stub.responder = openai_like
    stack.stub.script(Reply.ok("hello"), model=CHEAP)
    response = _client(stack).responses.create(
        model=MODEL, input="hi", parallel_tool_calls=False, tool_choice="auto"
    )
    assert response.output_text == "hello"
    assert response.parallel_tool_calls is False  # echoed as the client set it
    body = stack.stub.completions[0].body
    assert "parallel_tool_calls" not in body and "tool_choice" not in body


def test_an_orphan_function_call_output_is_a_400_before_any_rung_is_paid(
    stack_of: Callable[..., Stack],
) -> None:
    """On a verified route, a ``function_call_output`` answering no earlier call is a 400
    naming ``input[1].call_id``: no upstream call is paid for, nothing escalates."""
    stack = stack_of()
    with pytest.raises(openai.BadRequestError) as info:
        _client(stack).responses.create(
            model=MODEL,
            input=[
                {"role": "user", "content": "write add(a, b)"},
                {"type": "function_call_output", "call_id": "call_nope", "output": "1"},
            ],
            tools=[WEATHER],
            extra_body={"firstpass": TESTS},
        )
    assert info.value.param == "input[1].call_id"
    assert "call_nope" in info.value.message
    assert stack.stub.completions == []
    (receipt,) = stack.receipts_list()
    assert receipt["decision"]["action"] == "rejected"


SQL_TOOL: Any = {
    "type": "function",
    "name": "run_sql",
    "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
}


def test_an_agent_loop_sends_the_same_turns_and_costs_as_through_chat_completions(
    stack_of: Callable[..., Stack],
) -> None:
    """The same two-turn tool loop through Chat Completions and through Responses (feeding
    ``response.output`` back, text beside the call): turn 2 reaches the upstream as the
    identical body, and the receipts state identical costs."""
    stack = stack_of()
    client = _client(stack)
    chat_tool: Any = {
        "type": "function",
        "function": {"name": "run_sql", "parameters": SQL_TOOL["parameters"]},
    }
    stack.stub.script(Reply.tools(("run_sql", {"q": "select 1"}), text="Checking."), model=CHEAP)
    messages: list[Any] = [
        {"role": "system", "content": "You write Python."},
        {"role": "user", "content": "write add(a, b)"},
    ]
    first = client.chat.completions.create(
        model=MODEL, messages=messages, tools=[chat_tool], extra_body={"firstpass": TESTS}
    )
    message = first.choices[0].message
    assert message.tool_calls is not None
    messages += [
        message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "1"},
    ]
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    client.chat.completions.create(
        model=MODEL, messages=messages, tools=[chat_tool], extra_body={"firstpass": TESTS}
    )
    stack.stub.script(Reply.tools(("run_sql", {"q": "select 1"}), text="Checking."), model=CHEAP)
    turn = client.responses.create(
        model=MODEL,
        instructions="You write Python.",
        input="write add(a, b)",
        tools=[SQL_TOOL],
        extra_body={"firstpass": TESTS},
    )
    assert [o.type for o in turn.output] == ["message", "function_call"]
    call = turn.output[1]
    assert call.type == "function_call"
    fed_back: Any = [
        {"role": "user", "content": "write add(a, b)"},
        *[item.model_dump(exclude_none=True) for item in turn.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "1"},
    ]
    stack.stub.script(Reply.ok(GOOD), model=CHEAP)
    client.responses.create(
        model=MODEL,
        instructions="You write Python.",
        input=fed_back,
        tools=[SQL_TOOL],
        extra_body={"firstpass": TESTS},
    )
    chat_1, chat_2, responses_1, responses_2 = stack.stub.completions
    assert responses_1.body == chat_1.body and responses_2.body == chat_2.body
    receipts = stack.receipts_list()
    assert [r["request"]["dialect"] for r in receipts] == ["chat", "chat", "responses", "responses"]
    assert [r["cost"] for r in receipts[:2]] == [r["cost"] for r in receipts[2:]]


def test_a_response_failed_after_a_keepalive_echoes_the_request(
    stack_of: Callable[..., Stack],
) -> None:
    """An error decided after a keep-alive ends the stream with ``response.failed`` whose
    response echoes the request (instructions, metadata) and the model asked for."""
    stack = stack_of(keepalive_s=0.05, on_exhausted="error")
    stack.stub.script(Reply.ok(WRONG, latency_ms=300), model=CHEAP)
    stack.stub.script(Reply.ok(WRONG), model=STRONG)
    with _client(stack).responses.with_streaming_response.create(
        model=MODEL,
        instructions="You write Python.",
        input="write add(a, b)",
        metadata={"team": "a"},
        stream=True,
        extra_body={"firstpass": TESTS},
    ) as raw:
        lines = [line for line in raw.iter_lines() if line.startswith("data: ")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    failed = events[-1]
    assert failed["type"] == "response.failed"
    response = failed["response"]
    assert response["instructions"] == "You write Python."
    assert response["metadata"] == {"team": "a"}
    assert response["model"] == MODEL
