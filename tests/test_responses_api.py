"""The OpenAI Responses dialect without a server: what each Responses body becomes upstream,
what it is refused for (naming the field as the client spelt it), and that the ``response``
objects and stream events it renders are what the openai SDK's own types accept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai.types.responses import Response, ResponseStreamEvent
from pydantic import TypeAdapter

from firstpass.admission import ChatRequest, parse_chat_body, parse_responses_body
from firstpass.errors import RequestError
from firstpass.pipeline import Outcome, Served
from firstpass.providers import Completion, ToolCall
from firstpass.sandbox import parse_spec
from firstpass.server._responses_api import ResponsesCodec, response_body, response_events

MODEL = "firstpass-code"
TESTS: dict[str, Any] = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}
WEATHER: dict[str, Any] = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "strict": True,
}


def _parse(**body: Any) -> ChatRequest:
    return parse_responses_body({"model": MODEL, **body}, header_mode=None, parse_spec=parse_spec)


def _upstream_messages(**body: Any) -> Any:
    return _parse(**body).upstream_body["messages"]


def test_string_input_is_one_user_message_and_instructions_the_first_system_message() -> None:
    """``instructions`` + a string ``input`` are the system and user messages a Chat
    Completions client would send, and the request records the responses dialect."""
    chat = _parse(input="write add(a, b)", instructions="answer in Python")
    assert chat.upstream_body["messages"] == [
        {"role": "system", "content": "answer in Python"},
        {"role": "user", "content": "write add(a, b)"},
    ]
    assert chat.dialect == "responses"
    assert chat.prompt_text == "write add(a, b)"


def test_same_task_as_chat_completions_has_the_same_prompt_hash_and_checks() -> None:
    """The same task through either API is the same request to admission: same prompt hash,
    same upstream messages, same checks from the top-level ``firstpass`` object."""
    responses = _parse(
        instructions="be brief",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "write add"}]}],
        firstpass=TESTS,
    )
    chat = parse_chat_body(
        {
            "model": MODEL,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "write add"}]},
            ],
            "firstpass": TESTS,
        },
        header_mode=None,
        parse_spec=parse_spec,
    )
    assert responses.prompt_sha256 == chat.prompt_sha256
    assert responses.upstream_body["messages"] == chat.upstream_body["messages"]
    assert responses.checks.n_visible == chat.checks.n_visible == 1
    assert "firstpass" not in responses.upstream_body


def test_item_messages_map_their_parts_to_chat_parts() -> None:
    """Typed and untyped message items, text and image parts, and an assistant's output_text
    become the chat messages and parts of the same meaning."""
    messages = _upstream_messages(
        input=[
            {"type": "message", "role": "developer", "content": "use snake_case"},
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "what is this?"},
                    {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                ],
            },
            {
                "type": "message",
                "id": "msg_1",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "a cat", "annotations": []}],
            },
            {"role": "user", "content": "and now?"},
        ]
    )
    assert messages == [
        {"role": "developer", "content": "use snake_case"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]},
        {"role": "user", "content": "and now?"},
    ]


def test_function_calls_join_one_assistant_message_and_outputs_become_tool_messages() -> None:
    """Consecutive function_call items (and the assistant text just before them) are one
    assistant message with ``tool_calls``; each function_call_output is a ``tool`` message
    answering its call id."""
    messages = _upstream_messages(
        input=[
            {"role": "user", "content": "weather in Paris and Rome?"},
            {"type": "message", "role": "assistant", "content": "Checking both."},
            {"type": "function_call", "call_id": "call_a", "name": "w", "arguments": '{"c":"P"}'},
            {"type": "function_call", "call_id": "call_b", "name": "w", "arguments": '{"c":"R"}'},
            {"type": "function_call_output", "call_id": "call_a", "output": "sunny"},
            {"type": "function_call_output", "call_id": "call_b", "output": "rain"},
        ]
    )
    assert messages[1] == {
        "role": "assistant",
        "content": "Checking both.",
        "tool_calls": [
            {
                "id": "call_a",
                "type": "function",
                "function": {"name": "w", "arguments": '{"c":"P"}'},
            },
            {
                "id": "call_b",
                "type": "function",
                "function": {"name": "w", "arguments": '{"c":"R"}'},
            },
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "rain"},
    ]


def test_settings_map_to_their_chat_completions_fields() -> None:
    """Function tools, tool_choice, the output cap, text format and reasoning effort become
    the Chat Completions fields that ask the same; metadata stays here."""
    body = _parse(
        input="hi",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        parallel_tool_calls=False,
        max_output_tokens=300,
        temperature=0.2,
        top_p=0.9,
        text={"format": {"type": "json_schema", "name": "w", "schema": {"type": "object"}}},
        reasoning={"effort": "low"},
        user="u-1",
        metadata={"team": "a"},
        stream=True,
    ).upstream_body
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "The weather in a city",
                "parameters": WEATHER["parameters"],
                "strict": True,
            },
        }
    ]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    assert body["max_completion_tokens"] == 300
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "w", "schema": {"type": "object"}},
    }
    assert body["reasoning_effort"] == "low"
    assert (body["parallel_tool_calls"], body["temperature"], body["top_p"]) == (False, 0.2, 0.9)
    assert body["user"] == "u-1"
    assert "metadata" not in body and "max_output_tokens" not in body and "text" not in body


def test_off_values_of_stateful_fields_are_accepted() -> None:
    """What the SDK may send as a matter of course (store false, no include, truncation
    disabled, null ids) is no reason to refuse."""
    chat = _parse(
        input="hi",
        store=False,
        background=False,
        include=[],
        truncation="disabled",
        previous_response_id=None,
        text={"format": {"type": "text"}},
    )
    assert set(chat.upstream_body) == {"messages"}


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"previous_response_id": "resp_1"}, "previous_response_id"),
        ({"conversation": "conv_1"}, "conversation"),
        ({"background": True}, "background"),
        ({"store": True}, "store"),
        ({"include": ["reasoning.encrypted_content"]}, "include"),
        ({"prompt": {"id": "pmpt_1"}}, "prompt"),
        ({"truncation": "auto"}, "truncation"),
        ({"reasoning": {"effort": "low", "summary": "auto"}}, "reasoning.summary"),
        ({"tools": [WEATHER, {"type": "web_search"}]}, "tools[1].type"),
        ({"tools": [{"type": "code_interpreter", "container": {}}]}, "tools[0].type"),
        ({"tools": [{**WEATHER, "defer_loading": True}]}, "tools[0].defer_loading"),
        ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"temperature": 3}, "temperature"),
        ({"metadata": {"k": 1}}, "metadata.k"),
        ({"frequency_penalty": 1}, "frequency_penalty"),
        ({"tools": [{**WEATHER, "parameters": {"x": float("nan")}}]}, "tools[0].parameters.x"),
        ({"input": []}, "input"),
        ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
        ({"input": [{"id": "msg_1"}]}, "input[0].type"),
        ({"input": ["hi", {"type": "reasoning", "summary": []}]}, "input[0]"),
        ({"input": [{"role": "user", "content": "a"}, {"type": "reasoning"}]}, "input[1].type"),
        ({"input": [{"role": "tool", "content": "a"}]}, "input[0].role"),
        ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input[0].content[0].type"),
        ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]}, "input[0].content[0].file_id"),
        ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
        ({"input": [{"type": "function_call_output", "call_id": "c", "output": 3}]}, "input[0].output"),
        ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
    ],
)  # fmt: skip
def test_what_cannot_be_honoured_is_a_400_naming_the_field(
    fields: dict[str, Any], param: str
) -> None:
    """Each field Firstpass cannot honour (or a malformed one) is refused, named as the client
    spelt it in its Responses body, never dropped in silence."""
    body = {"input": "hi", **fields}
    with pytest.raises(RequestError) as info:
        _parse(**body)
    assert info.value.status == 400
    assert info.value.param == param


def test_previous_response_id_refusal_says_to_send_the_whole_conversation() -> None:
    """The refusal of ``previous_response_id`` says why and what to do instead."""
    with pytest.raises(RequestError, match="send the whole conversation in input"):
        _parse(input="hi", previous_response_id="resp_1")


def _outcome(
    text: str, calls: tuple[ToolCall, ...] = (), finish: str = "stop", action: Any = "served"
) -> Outcome:
    completion = Completion(
        texts=(text,),
        finish_reasons=(finish,),
        input_tokens=40,
        output_tokens=12,
        latency_ms=5.0,
        attempts=1,
        status=200,
        calls=1,
        model="cheap-model",
        tool_calls=(calls,) if calls else (),
        cache_read_tokens=8,
    )
    served = Served(
        rung=0,
        provider="stub",
        model="stub/cheap-model",
        text=text,
        verification="verified",
        completion=completion,
    )
    return Outcome(receipt_id="rcpt_01TEST", action=action, mode="cascade", served=served)


CALL = ToolCall(id="call_up_1", name="get_weather", arguments='{"city": "Paris"}')


def _request() -> ChatRequest:
    body: Any = {
        "model": MODEL,
        "input": "weather?",
        "instructions": "be brief",
        "tools": [WEATHER],
    }
    return ResponsesCodec().parse(body, header_mode=None, parse_spec=parse_spec)


def test_a_text_answer_renders_as_a_response_the_sdk_accepts() -> None:
    """A served text is one ``message`` item; the object validates as the SDK's ``Response``
    (strictly, field by field), ``output_text`` reads it, and the request is echoed."""
    body = response_body(_outcome("def add(a, b): return a + b"), _request())
    response = Response.model_validate(body)
    assert response.output_text == "def add(a, b): return a + b"
    assert response.id == "resp_rcpt_01TEST" and response.status == "completed"
    assert response.output[0].id == "msg_rcpt_01TEST"
    assert response.usage is not None
    assert (response.usage.input_tokens, response.usage.output_tokens) == (40, 12)
    assert response.usage.input_tokens_details.cached_tokens == 8
    assert response.instructions == "be brief" and response.tools[0].type == "function"


def test_tool_calls_render_as_function_call_items_with_the_upstream_call_id() -> None:
    """Each tool call is a ``function_call`` item whose ``call_id`` is the upstream's id, so
    the next turn's ``function_call_output`` answers the call the upstream made."""
    response = Response.model_validate(
        response_body(_outcome("", (CALL,), "tool_calls", "tool_turn"), _request())
    )
    (item,) = response.output
    assert item.type == "function_call"
    assert (item.call_id, item.name, item.arguments) == ("call_up_1", "get_weather", CALL.arguments)
    assert item.id == "fc_rcpt_01TEST_0" and item.status == "completed"
    assert response.output_text == ""


def test_an_answer_cut_at_the_token_limit_is_incomplete() -> None:
    """``finish_reason: length`` is an ``incomplete`` response naming max_output_tokens."""
    response = Response.model_validate(response_body(_outcome("def add(", finish="length")))
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"


def _events(raw: bytes) -> list[dict[str, Any]]:
    out = []
    for block in raw.decode().split("\n\n"):
        if not block:
            continue
        event_line, data_line = block.split("\n")
        data = json.loads(data_line.removeprefix("data: "))
        assert event_line == f"event: {data['type']}"
        out.append(data)
    return out


def test_stream_events_are_the_sdk_event_types_in_order() -> None:
    """Text then a tool call stream as the Responses API's events, numbered in sequence, each
    valid as the SDK's ``ResponseStreamEvent``; the deltas add up to the text and the last
    event carries the whole response with its ``firstpass`` object."""
    text = "Let me look that up for you in the weather service."
    events = _events(b"".join(response_events(_outcome(text, (CALL,), "tool_calls"), _request())))
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    kinds = [e["type"] for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-8:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added",
        "response.function_call_arguments.delta",
        "response.function_call_arguments.done",
        "response.output_item.done",
        "response.completed",
    ]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) > 1 and "".join(deltas) == text
    final = events[-1]["response"]
    assert [i["type"] for i in final["output"]] == ["message", "function_call"]
    assert final["firstpass"] == {} and final["instructions"] == "be brief"
