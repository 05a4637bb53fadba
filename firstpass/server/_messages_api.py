"""Anthropic Messages: ``POST /v1/messages``, its ``message`` bodies and its server-sent events.

The request is parsed to the one ``ChatRequest`` (``firstpass.admission.parse_messages_body``);
the answer is rendered from the served ``Completion`` as Anthropic shapes it: a text block, then
one ``tool_use`` block per tool call, ``stop_reason`` from the chat finish reason, and usage with
``input_tokens`` counting the prompt tokens neither read from nor written to the prompt cache
(as Anthropic counts them). A stream replays the decided answer as Anthropic's events
(``message_start`` ... ``message_stop``), ``ping`` while the answer is being verified.

The response's ``firstpass`` object rides on the message (plain), on ``message_start``'s message
(so the anthropic SDK's accumulated message carries it) and on ``message_delta``, the event that
ends the answer, with the receipt's id.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from typing import NoReturn

from firstpass._json import JSON
from firstpass.admission import ChatRequest, SpecParser, parse_messages_body
from firstpass.errors import RequestError
from firstpass.pipeline import Outcome
from firstpass.providers import ToolCall
from firstpass.receipts import Dialect
from firstpass.server._errors import error_body
from firstpass.server._handlers import dialect_handler
from firstpass.server._responses import pieces, summary_json

__all__ = [
    "RAW_ARGUMENTS_KEY",
    "MessagesCodec",
    "message_body",
    "message_events",
    "messages",
    "stop_reason",
    "tool_input",
]

#: chat finish reasons as Anthropic's stop reasons (an unknown or missing one: ``end_turn``);
#: ``tool_calls`` is not here: ``tool_use`` is said by the message's blocks, not the upstream
_STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "content_filter": "refusal",
}
#: where a ``tool_use`` block keeps arguments that were not a JSON object
RAW_ARGUMENTS_KEY = "_firstpass_raw_arguments"


def stop_reason(finish: str | None, *, called: bool) -> str:
    """Anthropic's ``stop_reason`` for a chat ``finish_reason``: ``tool_use`` exactly when the
    message holds ``tool_use`` blocks (whatever the upstream said), since a client that reads
    ``tool_use`` looks for a call to run; a ``tool_calls`` finish without calls ends the turn.
    An answer cut at the token limit is ``max_tokens`` even when it holds a call: its
    arguments may be cut too, and Anthropic's clients are told to raise the limit, not to run
    a half-written call."""
    if finish == "length":
        return "max_tokens"
    if called:
        return "tool_use"
    return _STOP_REASONS.get(finish or "stop", "end_turn")


def _not_json(constant: str) -> NoReturn:
    raise ValueError(f"{constant} is not JSON")


def _finite(text: str) -> float:
    """A JSON number as a float, refusing one that overflows (``1e999``): it would render as
    ``Infinity``, which is not JSON."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is not a finite number")
    return value


def _utf8(text: str) -> bool:
    """Whether ``text`` has no lone surrogate (a JSON ``"\\ud800"``): the anthropic SDK's
    stream accumulator refuses one in a tool's input."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def tool_input(arguments: str) -> dict[str, JSON]:
    """A tool call's arguments as ``tool_use.input`` (an object): empty text is ``{}``; text
    that is not a strict JSON object (broken, not an object, ``NaN``/``Infinity`` or a number
    out of float range, a lone surrogate, too deeply nested) is kept whole under
    ``_firstpass_raw_arguments``, so the client sees what the model wrote instead of an empty
    call or a body that is not JSON (a lone surrogate in it as its ``\\u`` escape)."""
    if not arguments.strip():
        return {}
    try:
        parsed = json.loads(arguments, parse_float=_finite, parse_constant=_not_json)
    except (ValueError, RecursionError):
        parsed = None
    if isinstance(parsed, dict) and _utf8(json.dumps(parsed, ensure_ascii=False)):
        return parsed
    return {RAW_ARGUMENTS_KEY: arguments.encode(errors="backslashreplace").decode()}


def _answer(outcome: Outcome) -> tuple[str, tuple[ToolCall, ...], str]:
    """The served answer's text, tool calls and stop reason."""
    served = outcome.served
    assert served is not None
    completion = served.completion
    index = served.sample if served.sample < len(completion.finish_reasons) else 0
    calls = completion.calls_of(index)
    finish = completion.finish_reasons[index] if completion.finish_reasons else None
    return served.text, calls, stop_reason(finish, called=bool(calls))


def _usage(outcome: Outcome) -> dict[str, JSON]:
    """Usage of the served answer: per call (input) and per choice (output), like Chat
    Completions' ``usage``; ``input_tokens`` leaves out cache reads and writes."""
    served = outcome.served
    if served is None:
        return {"input_tokens": 0, "output_tokens": 0}
    c = served.completion
    calls = max(1, c.calls)
    read, write = c.cache_read_tokens // calls, c.cache_write_tokens // calls
    return {
        "input_tokens": max(0, c.input_tokens // calls - read - write),
        "output_tokens": c.output_tokens // max(1, c.n),
        "cache_creation_input_tokens": write,
        "cache_read_input_tokens": read,
    }


def _tool_block(call: ToolCall) -> dict[str, JSON]:
    return {
        "type": "tool_use",
        "id": call.id,
        "name": call.name,
        "input": tool_input(call.arguments),
    }


def message_body(outcome: Outcome) -> dict[str, JSON]:
    """The ``message`` object for an outcome that served an answer."""
    served = outcome.served
    assert served is not None
    text, calls, reason = _answer(outcome)
    content: list[JSON] = [{"type": "text", "text": text}] if text else []
    content.extend(_tool_block(call) for call in calls)
    return {
        "id": f"msg_{outcome.receipt_id}",
        "type": "message",
        "role": "assistant",
        "model": served.model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": None,
        "usage": _usage(outcome),
        "firstpass": summary_json(outcome),
    }


def _event(kind: str, data: Mapping[str, object]) -> bytes:
    # ASCII, as the plain body is: text may hold lone surrogates (a JSON ``"\ud800"``
    # upstream), which have no UTF-8 encoding but do have a JSON escape
    body = json.dumps({"type": kind, **data}, separators=(",", ":"))
    return f"event: {kind}\ndata: {body}\n\n".encode()


def message_events(outcome: Outcome) -> Iterator[bytes]:
    """The served answer as Anthropic's stream: ``message_start`` (empty content), each block's
    start, deltas (text pieces; a tool call's input as ``input_json_delta`` pieces) and stop,
    ``message_delta`` (stop reason, usage, the ``firstpass`` object), ``message_stop``."""
    served = outcome.served
    assert served is not None
    text, calls, reason = _answer(outcome)
    usage = _usage(outcome)
    found = summary_json(outcome)
    start = message_body(outcome)
    start.update(content=[], stop_reason=None, usage={**usage, "output_tokens": 0})
    yield _event("message_start", {"message": start})
    index = 0
    if text:
        yield _event(
            "content_block_start", {"index": index, "content_block": {"type": "text", "text": ""}}
        )
        for piece in pieces(text):
            yield _event(
                "content_block_delta",
                {"index": index, "delta": {"type": "text_delta", "text": piece}},
            )
        yield _event("content_block_stop", {"index": index})
        index += 1
    for call in calls:
        block = {"type": "tool_use", "id": call.id, "name": call.name, "input": {}}
        yield _event("content_block_start", {"index": index, "content_block": block})
        # the JSON text of the input the plain message holds, not the upstream's text: the
        # accumulated message then equals the plain one whatever the upstream wrote
        for piece in pieces(json.dumps(tool_input(call.arguments))):
            yield _event(
                "content_block_delta",
                {"index": index, "delta": {"type": "input_json_delta", "partial_json": piece}},
            )
        yield _event("content_block_stop", {"index": index})
        index += 1
    yield _event(
        "message_delta",
        {
            "delta": {"stop_reason": reason, "stop_sequence": None},
            "usage": usage,
            "firstpass": found,
        },
    )
    yield _event("message_stop", {})


class MessagesCodec:
    """Anthropic Messages: ``POST /v1/messages``."""

    dialect: Dialect = "messages"

    def parse(self, body: JSON, *, header_mode: str | None, parse_spec: SpecParser) -> ChatRequest:
        return parse_messages_body(body, header_mode=header_mode, parse_spec=parse_spec)

    def body(self, outcome: Outcome, chat: ChatRequest) -> dict[str, JSON]:
        return message_body(outcome)

    def events(self, outcome: Outcome, chat: ChatRequest) -> Iterator[bytes]:
        return message_events(outcome)

    def error_events(
        self, err: RequestError, found: dict[str, JSON], chat: ChatRequest
    ) -> Iterator[bytes]:
        """Anthropic's ``error`` event (the anthropic SDK raises it as an ``APIStatusError``),
        its error type from the status the error would have had."""
        body = error_body(
            str(err),
            type=err.type,
            param=err.param,
            code=err.code,
            dialect="messages",
            status=err.status,
        )
        extra = body.get("firstpass")
        body["firstpass"] = {**(extra if isinstance(extra, dict) else {}), **found}
        yield _event("error", {k: v for k, v in body.items() if k != "type"})

    def keepalive(self) -> bytes:
        return b'event: ping\ndata: {"type": "ping"}\n\n'


#: POST /v1/messages
messages = dialect_handler(MessagesCodec())
