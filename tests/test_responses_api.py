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
    """Typed and untyped message items, text and image parts become the chat messages and
    parts of the same meaning; an assistant's output_text parts its one string, as the
    upstream sent the turn."""
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
        {"role": "assistant", "content": "a cat"},
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


def test_a_fed_back_assistant_message_is_the_turn_the_upstream_sent() -> None:
    """A response's message fed back (output_text parts, a refusal part) reaches the upstream
    as the assistant message it sent: the texts joined into one string, a refusal beside a
    null content, so the next turn's body is the one a Chat Completions client would send."""
    messages = _upstream_messages(
        input=[
            {"role": "user", "content": "hi"},
            {
                "type": "message",
                "role": "assistant",
                "content": [
                    {"type": "output_text", "text": "Checking ", "annotations": []},
                    {"type": "output_text", "text": "now.", "annotations": []},
                ],
            },
            {"type": "function_call", "call_id": "call_0", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_0", "output": "1"},
            {"role": "assistant", "content": [{"type": "refusal", "refusal": "I can't."}]},
            {"role": "user", "content": "please"},
        ]
    )
    assert messages[1] == {
        "role": "assistant",
        "content": "Checking now.",
        "tool_calls": [
            {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    }
    assert messages[3] == {"role": "assistant", "content": None, "refusal": "I can't."}


def test_tool_settings_without_tools_are_not_forwarded() -> None:
    """Without tools, ``parallel_tool_calls`` and a ``tool_choice`` of auto or none say
    nothing a Chat Completions upstream would accept (it refuses them then): they stay here,
    as OpenAI's Responses API accepts them; with tools they go upstream."""
    for choice in ("auto", "none"):
        body = _parse(input="hi", parallel_tool_calls=False, tool_choice=choice).upstream_body
        assert "parallel_tool_calls" not in body and "tool_choice" not in body
    body = _parse(
        input="hi", tools=[WEATHER], parallel_tool_calls=False, tool_choice="none"
    ).upstream_body
    assert (body["parallel_tool_calls"], body["tool_choice"]) == (False, "none")


CALL_ITEM: dict[str, Any] = {
    "type": "function_call",
    "call_id": "call_a",
    "name": "f",
    "arguments": "{}",
}
USER: dict[str, Any] = {"role": "user", "content": "hi"}


def _output(call_id: str, output: str = "1") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


@pytest.mark.parametrize(
    ("items", "param", "says"),
    [
        ([USER, _output("nope")], "input[1].call_id", "no function_call with call id 'nope'"),
        ([CALL_ITEM, _output("")], "input[1].call_id", "non-empty"),
        ([USER, CALL_ITEM, CALL_ITEM, _output("call_a"), _output("call_a")], "input[2].call_id", "used twice"),
        ([USER, CALL_ITEM, _output("call_a"), _output("call_a")], "input[3].call_id", "already has its output"),
        ([USER, {**CALL_ITEM, "name": ""}], "input[1].name", "non-empty"),
        ([USER, CALL_ITEM], "input[1].call_id", "no tool output found"),
        ([USER, CALL_ITEM, USER, _output("call_a")], "input[1].call_id", "no tool output found"),
        ([CALL_ITEM, {**CALL_ITEM, "call_id": "b"}, _output("b")], "input[0].call_id", "no tool output found"),
    ],
)  # fmt: skip
def test_a_conversation_that_breaks_call_pairing_is_a_400_naming_the_item(
    items: list[Any], param: str, says: str
) -> None:
    """Each function_call answered by one function_call_output right after its turn, as a
    Chat Completions upstream (and OpenAI's Responses API) requires: an orphan output, a
    reused or empty call id, an unnamed call, a call left without output, are refused here
    naming the item, not relayed from the upstream as a 502."""
    with pytest.raises(RequestError) as info:
        _parse(input=items)
    assert info.value.status == 400
    assert info.value.param == param
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"max_output_tokens": 10**30}, "max_output_tokens"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "nope"}}, "tool_choice.name"),
        ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
        ({"user": 5}, "user"),
        ({"safety_identifier": 5}, "safety_identifier"),
        ({"prompt_cache_key": {"a": 1}}, "prompt_cache_key"),
        ({"service_tier": 1}, "service_tier"),
    ],
)  # fmt: skip
def test_a_setting_the_upstream_would_refuse_is_a_400_naming_it_as_sent(
    fields: dict[str, Any], param: str
) -> None:
    """Settings a Chat Completions upstream would refuse (a huge output cap, a tool choice
    with no such tool, a non-string identifier) are refused naming the Responses field."""
    with pytest.raises(RequestError) as info:
        _parse(input="hi", **fields)
    assert info.value.status == 400
    assert info.value.param == param


def test_a_too_deep_check_is_refused_naming_it_not_a_chat_request() -> None:
    """A test nested too deeply for Python's parser is a 400 naming that test in the request
    the client sent, never one about a chat request it never sent."""
    deep = {"tests": {"visible": ["assert " + "1+" * 100_000 + "1"]}, "entry_point": "f"}
    with pytest.raises(RequestError) as info:
        _parse(input="hi", firstpass=deep)
    assert info.value.code == "invalid_tests"
    assert info.value.param == "firstpass.tests.visible.asserts[0]"
    assert "nests too deeply" in str(info.value) and "chat" not in str(info.value)


def _refused(text: str = "") -> Outcome:
    """An outcome served as the upstream sent it: its message a refusal."""
    message: Any = {"role": "assistant", "content": text or None, "refusal": "I can't help."}
    raw: Any = {
        "model": "cheap-model-2025",
        "service_tier": "default",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
    }
    completion = Completion(
        texts=(text,),
        finish_reasons=("stop",),
        input_tokens=5,
        output_tokens=3,
        latency_ms=1.0,
        attempts=1,
        status=200,
        calls=1,
        model="cheap-model",
        raw=raw,
    )
    served = Served(
        rung=0,
        provider="stub",
        model="cheap-model",
        text=text,
        verification="unchecked",
        completion=completion,
    )
    return Outcome(
        receipt_id="rcpt_01TEST", action="passthrough", mode="passthrough", served=served, raw=raw
    )


def test_an_upstream_refusal_is_a_refusal_part_plain_and_streamed() -> None:
    """The upstream's ``message.refusal`` is the message's ``refusal`` part (no empty text
    beside it), and streamed arrives as ``response.refusal.delta`` / ``.done`` events the
    SDK's types accept; the response's model and service tier are the upstream's."""
    response = Response.model_validate(response_body(_refused(), _request()))
    (item,) = response.output
    assert item.type == "message"
    assert [p.model_dump() for p in item.content] == [
        {"type": "refusal", "refusal": "I can't help."}
    ]
    assert response.output_text == ""
    assert (response.model, response.service_tier) == ("cheap-model-2025", "default")
    events = _events(b"".join(response_events(_refused(), _request())))
    adapter: TypeAdapter[Any] = TypeAdapter(ResponseStreamEvent)
    for event in events:
        adapter.validate_python(event)
    kinds = [e["type"] for e in events]
    assert "response.output_text.delta" not in kinds
    assert "".join(e["delta"] for e in events if e["type"] == "response.refusal.delta") == (
        "I can't help."
    )
    (done,) = [e for e in events if e["type"] == "response.refusal.done"]
    assert done["refusal"] == "I can't help." and done["content_index"] == 0


def test_a_tool_call_cut_at_the_token_limit_is_incomplete() -> None:
    """A call cut at the token limit is ``incomplete``, the text before it whole: the client
    must not run a call whose arguments were cut off."""
    outcome = _outcome("Let me look.", (CALL, CALL), "length", "tool_turn")
    response = Response.model_validate(response_body(outcome, _request()))
    statuses = [getattr(o, "status", None) for o in response.output]
    assert statuses == ["completed", "completed", "incomplete"]
    events = _events(b"".join(response_events(outcome, _request())))
    done = [e["item"]["status"] for e in events if e["type"] == "response.output_item.done"]
    assert done == ["completed", "completed", "incomplete"]


def test_the_response_echoes_the_identifiers_the_request_set() -> None:
    """``safety_identifier``, ``prompt_cache_key`` and ``service_tier`` are echoed, as the
    SDK's ``Response`` states them."""
    body: Any = {
        "model": MODEL,
        "input": "hi",
        "safety_identifier": "user-1",
        "prompt_cache_key": "k-1",
        "service_tier": "flex",
    }
    chat = ResponsesCodec().parse(body, header_mode=None, parse_spec=parse_spec)
    response = Response.model_validate(response_body(_outcome("hello"), chat))
    assert (response.safety_identifier, response.prompt_cache_key) == ("user-1", "k-1")
    assert response.service_tier == "flex"


def test_a_failed_response_after_a_keepalive_echoes_the_request() -> None:
    """An error decided after a keep-alive ends in ``response.failed`` whose response echoes
    the request's settings and names the model asked for, as any other response does."""
    chat = _request()
    err = RequestError("no rung passed", status=502, code="verification_exhausted")
    events = _events(
        b"".join(ResponsesCodec().error_events(err, {"receipt_id": "rcpt_01TEST"}, chat))
    )
    assert [e["type"] for e in events] == ["error", "response.failed"]
    failed = Response.model_validate(events[-1]["response"])
    assert failed.status == "failed" and failed.id == "resp_rcpt_01TEST"
    assert failed.instructions == "be brief" and failed.model == MODEL
    assert failed.tools[0].type == "function"
