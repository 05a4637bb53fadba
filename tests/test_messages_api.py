"""The Anthropic Messages dialect without a server: what each Messages body becomes upstream,
what it is refused for (naming the field as the client spelt it), and that the ``message``
objects and stream events it renders are what the anthropic SDK's own types and stream
accumulator accept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from anthropic.lib.streaming._messages import accumulate_event
from anthropic.types import Message, RawMessageStreamEvent
from pydantic import TypeAdapter

from firstpass.admission import ChatRequest, parse_chat_body, parse_messages_body
from firstpass.errors import RequestError
from firstpass.pipeline import Outcome, Served
from firstpass.providers import Completion, ToolCall
from firstpass.sandbox import parse_spec
from firstpass.server._messages_api import (
    RAW_ARGUMENTS_KEY,
    MessagesCodec,
    message_body,
    message_events,
    stop_reason,
    tool_input,
)

MODEL = "firstpass-code"
TESTS: dict[str, Any] = {"tests": {"visible": ["assert add(1, 2) == 3"]}, "entry_point": "add"}
WEATHER = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
EVENTS: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)


def _parse(**body: Any) -> ChatRequest:
    body = {"model": MODEL, "max_tokens": 256, **body}
    return parse_messages_body(body, header_mode=None, parse_spec=parse_spec)


def _sent(**body: Any) -> Any:
    return _parse(**body).upstream_body


def test_system_and_string_content_become_the_messages_a_chat_client_sends() -> None:
    """``system`` is the first system message, a string content stays a string, ``max_tokens``
    is kept, and the request records the messages dialect."""
    chat = _parse(system="be brief", messages=[{"role": "user", "content": "write add"}])
    assert chat.upstream_body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "write add"},
    ]
    assert chat.upstream_body["max_tokens"] == 256
    assert chat.dialect == "messages" and chat.prompt_text == "write add"


def test_same_task_as_chat_completions_is_the_same_request_to_admission() -> None:
    """The same task through either API: same upstream body, prompt hash and checks; only the
    dialect differs."""
    messages = _parse(
        system=[{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
        messages=[{"role": "user", "content": [{"type": "text", "text": "write add"}]}],
        firstpass=TESTS,
    )
    chat = parse_chat_body(
        {
            "model": MODEL,
            "max_tokens": 256,
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": [{"type": "text", "text": "write add"}]},
            ],
            "firstpass": TESTS,
        },
        header_mode=None,
        parse_spec=parse_spec,
    )
    assert messages.upstream_body == chat.upstream_body
    assert messages.prompt_sha256 == chat.prompt_sha256
    assert messages.checks.n_visible == chat.checks.n_visible == 1
    assert (messages.dialect, chat.dialect) == ("messages", "chat")


def test_images_become_image_url_parts() -> None:
    """A base64 image is a data URL; a URL image is that URL; text around them stays in
    order."""
    content = [
        {"type": "text", "text": "what is this?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBO"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"}},
    ]
    (user,) = _sent(messages=[{"role": "user", "content": content}])["messages"]
    assert user["content"] == [
        {"type": "text", "text": "what is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBO"}},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.jpg"}},
    ]


def test_tool_results_become_tool_messages_where_they_stand() -> None:
    """Each ``tool_result`` is a ``role: tool`` message with its id, in place; text blocks
    join; ``is_error`` says so in the text, as Chat Completions has no flag for it."""
    sent = _sent(
        tools=[WEATHER],
        messages=[
            {"role": "user", "content": "weather?"},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "A"}},
                    {"type": "tool_use", "id": "t2", "name": "get_weather", "input": {}},
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "t1",
                        "content": [
                            {"type": "text", "text": "sunny"},
                            {"type": "text", "text": "21C"},
                        ],
                    },
                    {
                        "type": "tool_result",
                        "tool_use_id": "t2",
                        "content": "no city",
                        "is_error": True,
                    },
                    {"type": "text", "text": "so?"},
                ],
            },
        ],
    )["messages"]
    assert sent[1] == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "t1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "A"}'},
            },
            {
                "id": "t2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": "{}"},
            },
        ],
    }
    assert sent[2:] == [
        {"role": "tool", "tool_call_id": "t1", "content": "sunny\n21C"},
        {"role": "tool", "tool_call_id": "t2", "content": "Error: no city"},
        {"role": "user", "content": [{"type": "text", "text": "so?"}]},
    ]


@pytest.mark.parametrize(
    ("choice", "tool_choice", "parallel"),
    [
        ({"type": "auto"}, "auto", None),
        ({"type": "any"}, "required", None),
        ({"type": "none"}, "none", None),
        (
            {"type": "tool", "name": "get_weather"},
            {"type": "function", "function": {"name": "get_weather"}},
            None,
        ),
        ({"type": "auto", "disable_parallel_tool_use": True}, "auto", False),
    ],
)
def test_tool_choice_maps_to_chat_completions(choice: Any, tool_choice: Any, parallel: Any) -> None:
    """auto, any (required), a named tool, none; ``disable_parallel_tool_use`` as
    ``parallel_tool_calls: false``; tools as function tools."""
    sent = _sent(messages=[{"role": "user", "content": "hi"}], tools=[WEATHER], tool_choice=choice)
    assert sent["tool_choice"] == tool_choice
    assert sent.get("parallel_tool_calls") == parallel
    assert sent["tools"][0]["function"]["parameters"] == WEATHER["input_schema"]


def test_sampling_stops_and_user_map_to_their_chat_names() -> None:
    """``stop_sequences`` → ``stop``, ``metadata.user_id`` → ``user``; temperature and top_p
    as they are; no-op settings (thinking disabled, service_tier auto, cache_control) pass."""
    sent = _sent(
        messages=[{"role": "user", "content": "hi"}],
        stop_sequences=["END"],
        metadata={"user_id": "u-1"},
        temperature=0.2,
        top_p=0.9,
        thinking={"type": "disabled"},
        service_tier="auto",
        cache_control={"type": "ephemeral"},
    )
    assert (sent["stop"], sent["user"], sent["temperature"], sent["top_p"]) == (
        ["END"],
        "u-1",
        0.2,
        0.9,
    )
    assert not {"thinking", "service_tier", "cache_control", "metadata"} & set(sent)


HI: list[Any] = [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": HI, "max_tokens": None}, "max_tokens"),
        ({"messages": HI, "max_tokens": 0}, "max_tokens"),
        ({"messages": HI, "top_k": 5}, "top_k"),
        ({"messages": HI, "thinking": {"type": "enabled", "budget_tokens": 2048}}, "thinking"),
        ({"messages": HI, "service_tier": "standard_only"}, "service_tier"),
        ({"messages": HI, "container": "c-1"}, "container"),
        (
            {"messages": HI, "mcp_servers": [{"type": "url", "url": "x", "name": "m"}]},
            "mcp_servers",
        ),
        ({"messages": HI, "temperature": 1.5}, "temperature"),
        ({"messages": HI, "metadata": {"team": "a"}}, "metadata.team"),
        ({"messages": HI, "tool_choice": {"type": "any"}}, "tool_choice"),
        (
            {"messages": HI, "tools": [{"type": "web_search_20250305", "name": "s"}]},
            "tools[0].type",
        ),
        (
            {"messages": HI, "tools": [WEATHER, {"type": "bash_20250124", "name": "bash"}]},
            "tools[1].type",
        ),
        (
            {"messages": HI, "tools": [{"type": "text_editor_20250728", "name": "e"}]},
            "tools[0].type",
        ),
        ({"messages": HI, "tools": [{"type": "computer_20250124", "name": "c"}]}, "tools[0].type"),
        ({"messages": HI, "tools": [{"name": "f"}]}, "tools[0].input_schema"),
        (
            {
                "messages": HI,
                "tools": [{**WEATHER, "input_schema": {"type": "object", "maximum": float("nan")}}],
            },
            "tools[0].input_schema.maximum",
        ),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
            "messages[0].content[0].type",
        ),
        (
            {
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}],
                    }
                ]
            },
            "messages[0].content[0].source.type",
        ),
        (
            {
                "messages": [
                    HI[0],
                    {
                        "role": "user",
                        "content": [
                            {
                                "type": "tool_result",
                                "tool_use_id": "t",
                                "content": [{"type": "image", "source": {}}],
                            }
                        ],
                    },
                ]
            },
            "messages[1].content[0].content[0].type",
        ),
        (
            {"messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {
                "messages": [
                    {
                        "role": "assistant",
                        "content": [{"type": "tool_use", "id": "t", "name": "f", "input": "x"}],
                    }
                ]
            },
            "messages[0].content[0].input",
        ),
    ],
)
def test_what_chat_completions_cannot_carry_is_a_400_naming_the_field(
    body: dict[str, Any], param: str
) -> None:
    """Every refusal names the field as the Messages client spelt it."""
    with pytest.raises(RequestError) as info:
        _parse(**body)
    assert info.value.param == param and info.value.status == 400


def test_a_missing_max_tokens_says_it_is_required() -> None:
    """Anthropic requires ``max_tokens``; so does its dialect here."""
    with pytest.raises(RequestError, match="max_tokens: required"):
        parse_messages_body(
            {"model": MODEL, "messages": HI}, header_mode=None, parse_spec=parse_spec
        )


# -- rendering --------------------------------------------------------------------------


def _outcome(text: str, calls: tuple[ToolCall, ...] = (), finish: str | None = "stop") -> Outcome:
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
        cache_write_tokens=2,
    )
    served = Served(
        rung=0,
        provider="stub",
        model="cheap-model",
        text=text,
        verification="verified",
        completion=completion,
    )
    return Outcome(receipt_id="rcpt_01TEST", action="served", mode="cascade", served=served)


CALL = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}')


def test_a_message_with_text_and_tool_calls_validates_as_the_sdks_message() -> None:
    """Text block first, then a ``tool_use`` block with the parsed input; ``stop_reason``
    tool_use; ``input_tokens`` without the cache's reads and writes."""
    body = message_body(_outcome("Let me look.", (CALL,), finish="tool_calls"))
    message = Message.model_validate(body)
    assert message.id == "msg_rcpt_01TEST" and message.type == "message"
    assert [b.type for b in message.content] == ["text", "tool_use"]
    assert body["content"][1] == {  # type: ignore[index]
        "type": "tool_use",
        "id": "call_1",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    assert message.stop_reason == "tool_use" and message.stop_sequence is None
    usage = message.usage
    assert (usage.input_tokens, usage.output_tokens) == (30, 12)
    assert (usage.cache_read_input_tokens, usage.cache_creation_input_tokens) == (8, 2)
    assert body["firstpass"] == {}  # the outcome has no summary


@pytest.mark.parametrize(
    ("finish", "reason"),
    [
        ("stop", "end_turn"),
        ("length", "max_tokens"),
        ("content_filter", "refusal"),
        ("tool_calls", "tool_use"),
        (None, "end_turn"),
    ],
)
def test_finish_reasons_map_to_anthropics_stop_reasons(finish: str | None, reason: str) -> None:
    """Chat's finish reasons in Anthropic's words."""
    assert stop_reason(finish, called=False) == reason
    assert stop_reason("stop", called=True) == "tool_use"


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"a": 1}', {"a": 1}),
        ("", {}),
        ("  ", {}),
        ('{"a": ', {RAW_ARGUMENTS_KEY: '{"a": '}),
        ("[1, 2]", {RAW_ARGUMENTS_KEY: "[1, 2]"}),
    ],
)
def test_tool_input_is_always_an_object_keeping_what_was_not_one(
    arguments: str, expected: dict[str, Any]
) -> None:
    """Arguments that are not a JSON object are kept whole, never turned into an empty call."""
    assert tool_input(arguments) == expected


def _accumulate(outcome: Outcome) -> tuple[list[str], Any, list[dict[str, Any]]]:
    """The stream's event names, the SDK's accumulated message, and the events' data."""
    names: list[str] = []
    datas: list[dict[str, Any]] = []
    snapshot: Any = None
    bufs: dict[int, bytes] = {}
    for raw in message_events(outcome):
        text = raw.decode()
        assert text.endswith("\n\n")
        head, data = text.rstrip("\n").split("\n")
        name = head.removeprefix("event: ")
        obj = json.loads(data.removeprefix("data: "))
        assert obj["type"] == name
        names.append(name)
        datas.append(obj)
        snapshot = accumulate_event(
            event=EVENTS.validate_python(obj), current_snapshot=snapshot, json_bufs=bufs
        )
    return names, snapshot, datas


def test_the_stream_accumulates_in_the_sdk_to_the_plain_message() -> None:
    """The events, fed to the SDK's own accumulator, build the same message the plain answer
    is: text in pieces, the tool input as ``input_json_delta`` pieces, stop reason, usage."""
    outcome = _outcome(
        "The weather in Paris is worth looking up, one moment.", (CALL,), "tool_calls"
    )
    names, final, datas = _accumulate(outcome)
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert names.count("content_block_start") == names.count("content_block_stop") == 2
    kinds = [d["delta"]["type"] for d in datas if d["type"] == "content_block_delta"]
    assert kinds.count("text_delta") > 1 and "input_json_delta" in kinds
    plain = message_body(outcome)
    got = final.to_dict()
    for key in ("id", "model", "content", "stop_reason", "usage", "firstpass"):
        assert got[key] == plain[key], key
    assert "firstpass" in datas[-2]


def test_arguments_that_are_not_json_still_stream_to_an_object() -> None:
    """Invalid arguments stream as the object the plain message holds: the SDK's accumulator
    (which raises on invalid JSON) accepts them."""
    outcome = _outcome("", (ToolCall(id="c", name="f", arguments="{oops"),), "tool_calls")
    _, final, _ = _accumulate(outcome)
    assert final.content[0].input == {RAW_ARGUMENTS_KEY: "{oops"}


@pytest.mark.parametrize(("status", "kind"), [(422, "invalid_request_error"), (502, "api_error")])
def test_an_error_event_is_anthropics_error_with_the_receipt(status: int, kind: str) -> None:
    """After a ping the status is 200: the error goes as ``event: error`` in Anthropic's shape,
    its type from the status it would have had, the firstpass object naming the receipt."""
    err = RequestError("no rung passed", status=status, code="verification_exhausted")
    (event,) = MessagesCodec().error_events(err, {"receipt_id": "rcpt_01TEST"})
    head, data = event.decode().rstrip("\n").split("\n")
    assert head == "event: error"
    obj = json.loads(data.removeprefix("data: "))
    assert obj["type"] == "error"
    assert obj["error"] == {"type": kind, "message": "no rung passed"}
    assert obj["firstpass"]["receipt_id"] == "rcpt_01TEST"
    assert obj["firstpass"]["code"] == "verification_exhausted"


def test_the_keepalive_is_anthropics_ping() -> None:
    """What goes out while verifying is the ping Anthropic itself sends (the SDK skips it)."""
    assert MessagesCodec().keepalive() == b'event: ping\ndata: {"type": "ping"}\n\n'
