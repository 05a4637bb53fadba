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
        system=[{"type": "text", "text": "be brief"}],
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
    as they are; no-op settings (thinking disabled, service_tier auto) pass."""
    sent = _sent(
        messages=[{"role": "user", "content": "hi"}],
        stop_sequences=["END"],
        metadata={"user_id": "u-1"},
        temperature=0.2,
        top_p=0.9,
        thinking={"type": "disabled"},
        service_tier="auto",
    )
    assert (sent["stop"], sent["user"], sent["temperature"], sent["top_p"]) == (
        ["END"],
        "u-1",
        0.2,
        0.9,
    )
    assert not {"thinking", "service_tier", "metadata"} & set(sent)


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
        ("tool_calls", "end_turn"),
        ("function_call", "end_turn"),
        (None, "end_turn"),
    ],
)
def test_finish_reasons_map_to_anthropics_stop_reasons(finish: str | None, reason: str) -> None:
    """Chat's finish reasons in Anthropic's words; ``tool_use`` only for a message that calls
    tools (a ``tool_calls`` finish without calls is a final answer)."""
    assert stop_reason(finish, called=False) == reason
    assert stop_reason("stop", called=True) == "tool_use"


def test_a_tool_call_cut_at_the_token_limit_is_max_tokens_not_tool_use() -> None:
    """A call whose answer hit the limit may have half its arguments: Anthropic's clients are
    told ``max_tokens`` (raise the limit), as the other APIs say ``length``/``incomplete``,
    never ``tool_use`` (run the call)."""
    assert stop_reason("length", called=True) == "max_tokens"


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
    chat = _parse(messages=[{"role": "user", "content": "hi"}])
    (event,) = MessagesCodec().error_events(err, {"receipt_id": "rcpt_01TEST"}, chat)
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


# -- tool inputs are strict JSON, plain and streamed alike -----------------------------------


def _strict(text: str) -> Any:
    """``json.loads`` refusing what is not JSON but Python accepts (``NaN``, ``Infinity``)."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


NOT_STRICT = [
    '{"x": 1e999}',
    '{"x": -1e999}',
    '{"x": NaN}',
    '{"x": Infinity}',
    '{"x": [1, {"y": -Infinity}]}',
    "[" * 100_000,
    "1" * 5000,
]


@pytest.mark.parametrize("arguments", NOT_STRICT, ids=range(len(NOT_STRICT)))
def test_arguments_that_are_not_strict_json_are_kept_raw_in_a_json_body(arguments: str) -> None:
    """A number out of float range, ``NaN``/``Infinity`` or nesting too deep is not a JSON
    object a client can parse: the input keeps the text under ``_firstpass_raw_arguments``,
    and the plain message is strict JSON."""
    outcome = _outcome("", (ToolCall(id="c", name="f", arguments=arguments),), "tool_calls")
    body = message_body(outcome)
    assert body["content"] == [
        {"type": "tool_use", "id": "c", "name": "f", "input": {RAW_ARGUMENTS_KEY: arguments}}
    ]
    assert _strict(json.dumps(body)) == body


@pytest.mark.parametrize(
    "arguments",
    ['{"x": 1e999}', '{"x": NaN}', '{"a": 1, "a": 2}', '{"big": 1e308, "s": "caf\u00e9"}'],
)
def test_the_streamed_input_is_the_json_text_of_the_plain_input(arguments: str) -> None:
    """``input_json_delta`` pieces join to exactly the JSON text of the input the plain message
    holds (not the upstream's text), so the SDK's accumulated message equals the plain one."""
    outcome = _outcome("", (ToolCall(id="c", name="f", arguments=arguments),), "tool_calls")
    plain = message_body(outcome)
    _, final, datas = _accumulate(outcome)
    sent = "".join(
        d["delta"]["partial_json"]
        for d in datas
        if d["type"] == "content_block_delta" and d["delta"]["type"] == "input_json_delta"
    )
    content: Any = plain["content"]
    (block,) = content
    assert sent == json.dumps(block["input"])
    assert _strict(sent) == block["input"]
    assert final.to_dict()["content"] == content


def test_a_tool_calls_finish_without_calls_is_an_end_turn() -> None:
    """The pipeline serves a ``tool_calls`` finish without calls as a final answer: the message
    has no ``tool_use`` block, so it does not say ``tool_use``, plain or streamed."""
    outcome = _outcome("no tool needed", finish="tool_calls")
    assert message_body(outcome)["stop_reason"] == "end_turn"
    _, final, _ = _accumulate(outcome)
    assert final.stop_reason == "end_turn"


def test_lone_surrogates_stream_as_json_escapes_the_sdk_accepts() -> None:
    """An upstream's ``"\\ud800"`` decodes to a character UTF-8 cannot encode: the events are
    ASCII JSON (as the plain body is), so the stream is sent instead of failing mid-answer; in
    a tool's arguments (which the SDK's stream accumulator refuses) the text is kept raw."""
    escaped = '{"k": "\\udfff"}'
    calls = (
        ToolCall(id="c", name="f", arguments=escaped),
        ToolCall(id="d", name="f", arguments='{"k": "\udfff"}'),
    )
    outcome = _outcome("half \ud800 pair", calls, "stop")
    assert all(e.isascii() for e in message_events(outcome))
    _, final, _ = _accumulate(outcome)
    assert final.content[0].text == "half \ud800 pair"
    assert [b.input for b in final.content[1:]] == [{RAW_ARGUMENTS_KEY: escaped}] * 2
    assert final.to_dict()["content"] == message_body(outcome)["content"]


# --- prompt caching: cache_control marks -------------------------------------------------

EPHEMERAL: dict[str, Any] = {"type": "ephemeral"}
HOUR: dict[str, Any] = {"type": "ephemeral", "ttl": "1h"}
AGENT_TURN: dict[str, Any] = {
    "system": [
        {"type": "text", "text": "You are a coding agent.", "cache_control": HOUR},
        {"type": "text", "text": "Today is Monday."},
    ],
    "tools": [{**WEATHER, "cache_control": HOUR}],
    "messages": [
        {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Looking.", "cache_control": EPHEMERAL},
                {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_1",
                    "is_error": True,
                    "content": "timeout",
                    "cache_control": EPHEMERAL,
                },
                {"type": "text", "text": "try again"},
            ],
        },
    ],
}


def test_cache_marks_ride_on_the_chat_parts_they_mark() -> None:
    """Each mark stays on its block in the chat body: marked system blocks as text parts, the
    tool object, the assistant's text part, the tool message's last part; unmarked blocks as
    before (the system prompt's unmarked sibling, the user's text)."""
    sent = _sent(**AGENT_TURN)
    system, user, assistant, tool, after = sent["messages"]
    assert system == {
        "role": "system",
        "content": [
            {"type": "text", "text": "You are a coding agent.", "cache_control": HOUR},
            {"type": "text", "text": "Today is Monday."},
        ],
    }
    assert sent["tools"][0]["cache_control"] == HOUR
    assert user["content"] == [{"type": "text", "text": "weather?"}]
    assert assistant["content"] == [
        {"type": "text", "text": "Looking.", "cache_control": EPHEMERAL}
    ]
    assert tool == {
        "role": "tool",
        "tool_call_id": "toolu_1",
        "content": [{"type": "text", "text": "Error: timeout", "cache_control": EPHEMERAL}],
    }
    assert after == {"role": "user", "content": [{"type": "text", "text": "try again"}]}
    assert "cache_control" not in sent


def test_marks_on_images_tool_uses_and_the_request_are_kept() -> None:
    """An image's mark rides on its ``image_url`` part, a ``tool_use``'s on its ``tool_calls``
    entry, the top-level (automatic caching) mark at the top level."""
    image = {"type": "url", "url": "https://example.com/a.png"}
    sent = _sent(
        cache_control=EPHEMERAL,
        messages=[
            {"role": "user", "content": [{"type": "image", "source": image, **_mark()}]},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}, **_mark()}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
        ],
    )
    assert sent["cache_control"] == EPHEMERAL
    assert sent["messages"][0]["content"][0]["cache_control"] == EPHEMERAL
    assert sent["messages"][1]["tool_calls"][0]["cache_control"] == EPHEMERAL
    assert sent["messages"][1]["content"] is None


def _mark() -> dict[str, Any]:
    return {"cache_control": EPHEMERAL}


def test_a_mark_inside_a_tool_result_moves_to_the_tool_messages_last_part() -> None:
    """Blocks inside a ``tool_result`` (where Anthropic refuses marks) keep their text; the
    mark is one breakpoint at the end of the tool message."""
    blocks = [{"type": "text", "text": "a", **_mark()}, {"type": "text", "text": "b"}]
    sent = _sent(
        messages=[
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": blocks}],
            },
        ]
    )
    assert sent["messages"][2]["content"] == [
        {"type": "text", "text": "a"},
        {"type": "text", "text": "b", "cache_control": EPHEMERAL},
    ]


def test_without_marks_the_agent_turn_is_the_chat_body_it_always_was() -> None:
    """Strip every mark and the translation is the plain chat body: joined system text,
    string tool results, string assistant text, no tool ``cache_control`` keys."""
    plain = json.loads(
        json.dumps(AGENT_TURN)
        .replace(', "cache_control": {"type": "ephemeral", "ttl": "1h"}', "")
        .replace(', "cache_control": {"type": "ephemeral"}', "")
    )
    assert "cache_control" not in json.dumps(plain)
    sent = _sent(**plain)
    assert sent["messages"][0] == {
        "role": "system",
        "content": "You are a coding agent.\nToday is Monday.",
    }
    assert sent["messages"][2]["content"] == "Looking."
    assert sent["messages"][3]["content"] == "Error: timeout"
    assert "cache_control" not in json.dumps(sent)


def test_a_fifth_breakpoint_is_a_400_naming_it() -> None:
    """Anthropic allows 4 marked blocks: the fifth, counted tools, system, messages, is named
    (the top-level automatic mark is not a block and is not counted here)."""
    text = [{"type": "text", "text": f"t{i}", **_mark()} for i in range(3)]
    with pytest.raises(RequestError) as caught:
        _parse(
            cache_control=EPHEMERAL,
            system=[{"type": "text", "text": "s", **_mark()}],
            tools=[{**WEATHER, **_mark()}],
            messages=[{"role": "user", "content": text}],
        )
    assert caught.value.param == "messages[0].content[2].cache_control"
    _parse(  # four is fine
        cache_control=EPHEMERAL,
        system=[{"type": "text", "text": "s", **_mark()}],
        tools=[{**WEATHER, **_mark()}],
        messages=[{"role": "user", "content": text[:2]}],
    )


@pytest.mark.parametrize(
    ("mark", "param"),
    [
        ("ephemeral", "messages[0].content[0].cache_control"),
        ({"type": "persistent"}, "messages[0].content[0].cache_control"),
        ({"type": "ephemeral", "ttl": 3600}, "messages[0].content[0].cache_control.ttl"),
    ],
)
def test_a_malformed_mark_is_a_400_naming_it(mark: Any, param: str) -> None:
    """A mark Anthropic would refuse is refused here, naming where it is."""
    with pytest.raises(RequestError) as caught:
        _parse(
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "x", "cache_control": mark}]}
            ]
        )
    assert caught.value.param == param


def test_the_anthropic_provider_gets_the_breakpoints_the_client_marked() -> None:
    """Messages -> chat -> Messages (the anthropic provider's body): every mark is back on the
    block the client marked, and no other block carries one."""
    from firstpass.providers import messages_body

    back: Any = messages_body("claude-haiku-4-5", _sent(**AGENT_TURN))
    assert back["system"] == AGENT_TURN["system"]
    assert back["tools"] == [AGENT_TURN["tools"][0]]
    assert back["messages"][1]["content"][0] == AGENT_TURN["messages"][1]["content"][0]
    result = back["messages"][2]["content"][0]
    assert result["cache_control"] == EPHEMERAL
    assert result["content"] == [{"type": "text", "text": "Error: timeout"}]
    assert json.dumps(back).count("cache_control") == 4


# -- conversations Anthropic refuses, refused before a rung is paid ------------------------


def _use(*ids: str) -> dict[str, Any]:
    """An assistant message calling ``get_weather`` once per id."""
    return {
        "role": "assistant",
        "content": [
            {"type": "tool_use", "id": i, "name": "get_weather", "input": {"city": "A"}}
            for i in ids
        ],
    }


def _result(call_id: str, **extra: Any) -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": call_id, "content": "sunny", **extra}


ASKED: dict[str, Any] = {"role": "user", "content": "weather?"}


@pytest.mark.parametrize(
    ("messages", "param", "words"),
    [
        (
            [ASKED, _use("t1"), {"role": "user", "content": [_result("zz")]}],
            "messages[2].content[0].tool_use_id",
            "unexpected `tool_use_id` found in `tool_result` blocks: zz",
        ),
        (
            [{"role": "user", "content": [_result("t1")]}],
            "messages[0].content[0].tool_use_id",
            "unexpected `tool_use_id` found in `tool_result` blocks: t1",
        ),
        (  # a result answers the turn just before it, not an older one
            [
                ASKED,
                _use("t1"),
                {"role": "user", "content": [_result("t1")]},
                {"role": "assistant", "content": "done"},
                {"role": "user", "content": [_result("t1")]},
            ],
            "messages[4].content[0].tool_use_id",
            "unexpected `tool_use_id`",
        ),
        (
            [ASKED, _use("t1", "t1"), {"role": "user", "content": [_result("t1")]}],
            "messages[1].content[1].id",
            "`tool_use` ids must be unique",
        ),
        (  # unique across the request, not only within a message
            [
                ASKED,
                _use("t1"),
                {"role": "user", "content": [_result("t1")]},
                _use("t1"),
                {"role": "user", "content": [_result("t1")]},
            ],
            "messages[3].content[0].id",
            "`tool_use` ids must be unique",
        ),
        (
            [ASKED, _use("t1"), {"role": "user", "content": "next"}],
            "messages[1].content[0].id",
            "`tool_use` ids were found without `tool_result` blocks immediately after: t1",
        ),
        (
            [ASKED, _use("t1", "t2"), {"role": "user", "content": [_result("t2")]}],
            "messages[1].content[0].id",
            "without `tool_result` blocks immediately after: t1.",
        ),
        (
            [ASKED, _use("t1"), {"role": "user", "content": [_result("t1"), _result("t1")]}],
            "messages[2].content[1].tool_use_id",
            "each tool_use must have a single result",
        ),
        (
            [
                ASKED,
                _use("t1"),
                {"role": "user", "content": [{"type": "text", "text": "here:"}, _result("t1")]},
            ],
            "messages[2].content[1]",
            "a tool_result must come before any other content of its turn",
        ),
        (
            [{"role": "user", "content": []}],
            "messages[0].content",
            "all messages must have non-empty content",
        ),
        (
            [ASKED, {"role": "assistant", "content": []}, ASKED],
            "messages[1].content",
            "all messages must have non-empty content",
        ),
        (
            [{"role": "user", "content": [{"type": "text", "text": ""}]}],
            "messages[0].content[0].text",
            "text content blocks must be non-empty",
        ),
        (
            [ASKED, {"role": "assistant", "content": [{"type": "text", "text": "{"}]}],
            "messages[1].role",
            "prefill",
        ),
        ([ASKED, {"role": "assistant", "content": "The answer is"}], "messages[1].role", "prefill"),
    ],
)
def test_a_conversation_anthropic_refuses_is_a_400_in_its_words(
    messages: list[Any], param: str, words: str
) -> None:
    """Tool calls and results that do not pair up, empty content, and a prefill: each is
    refused here, naming the field as the client numbered it, in Anthropic's words where they
    are known, so no rung is paid to be told the same."""
    with pytest.raises(RequestError) as info:
        _parse(tools=[WEATHER], messages=messages)
    assert (info.value.param, info.value.status) == (param, 400)
    assert words in str(info.value)


def test_a_prefill_refusal_says_why_it_cannot_be_carried() -> None:
    """The refusal names the role and the reason: a chat upstream starts over."""
    with pytest.raises(RequestError) as info:
        _parse(messages=[ASKED, {"role": "assistant", "content": "{"}])
    assert "Chat Completions upstream answers it from scratch" in str(info.value)


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        (
            {"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}},
            "tool_choice.name",
        ),
        ({"tools": [WEATHER, {**WEATHER, "description": "again"}]}, "tools[1].name"),
    ],
)
def test_a_tool_choice_or_tool_name_anthropic_refuses_is_a_400(
    extra: dict[str, Any], param: str
) -> None:
    """``tool_choice`` naming a tool not in ``tools``, and two tools of one name."""
    with pytest.raises(RequestError) as info:
        _parse(messages=HI, **extra)
    assert info.value.param == param


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param(  # parallel calls, all results (one an error) first, then text
            [
                ASKED,
                _use("t1", "t2"),
                {
                    "role": "user",
                    "content": [
                        _result("t2"),
                        _result("t1", is_error=True),
                        {"type": "text", "text": "so?"},
                    ],
                },
            ],
            id="parallel",
        ),
        pytest.param(  # text before the calls, several rounds
            [
                ASKED,
                {
                    "role": "assistant",
                    "content": [{"type": "text", "text": "Looking."}, *_use("t1")["content"]],
                },
                {"role": "user", "content": [_result("t1")]},
                _use("t2"),
                {"role": "user", "content": [_result("t2"), {"type": "text", "text": "more"}]},
                {"role": "assistant", "content": "Sunny twice."},
                {"role": "user", "content": "thanks"},
            ],
            id="rounds",
        ),
        pytest.param(  # consecutive user messages are one turn to Anthropic
            [
                ASKED,
                _use("t1", "t2"),
                {"role": "user", "content": [_result("t1")]},
                {"role": "user", "content": [_result("t2")]},
                {"role": "user", "content": "and?"},
            ],
            id="split-turn",
        ),
        pytest.param(
            [
                ASKED,
                _use("t1"),
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1"}]},
            ],
            id="no-content-result",
        ),
    ],
)
def test_a_legitimate_tool_loop_is_admitted(messages: list[Any]) -> None:
    """What Anthropic accepts is not refused: parallel calls answered in one user turn, in any
    order, ``is_error`` results, text after the results, results spread over consecutive user
    messages, a result without content."""
    sent = _sent(tools=[WEATHER], messages=messages)["messages"]
    assert [m["role"] for m in sent][:2] == ["user", "assistant"]
