"""The OpenAI Responses dialect's answers: ``response`` objects and their streaming events.

The served answer (its text, then its tool calls) becomes the response's ``output``: one
``message`` item when there is text, one ``function_call`` item per tool call, each
``call_id`` the upstream's own tool call id, so the client's next ``function_call_output``
reaches the upstream as the ``tool`` message it expects. A verified answer is known whole
only after its checks: the events replay it (``response.created`` ... ``response.completed``),
and the final event carries the response with its ``firstpass`` object (the receipt's id).

A response echoes the request's settings (``instructions``, ``tools``, ``metadata``...):
``parse`` keeps them on the request (``ResponsesRequest``), which ``events`` receives, and
``body`` too when its caller hands it over.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator, Mapping

from firstpass._json import JSON
from firstpass.admission import ChatRequest, SpecParser, parse_responses_body
from firstpass.errors import RequestError
from firstpass.pipeline import Outcome
from firstpass.providers import ToolCall
from firstpass.receipts import Dialect
from firstpass.server._handlers import dialect_handler
from firstpass.server._responses import pieces, summary_json, upstream_json, usage_of

__all__ = ["ResponsesCodec", "ResponsesRequest", "response_body", "response_events", "responses"]

#: finish reasons (Chat Completions' words) that leave a response ``incomplete``, and the
#: reason the Responses API gives
_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ResponsesRequest(ChatRequest):
    """A parsed Responses request: the chat request, and the settings its response echoes."""

    echo: dict[str, JSON] = dataclasses.field(default_factory=dict)


def _echo(body: Mapping[str, JSON]) -> dict[str, JSON]:
    """The request's settings as the response object states them (the body has been
    validated by then); defaults as OpenAI's API reports them."""
    text = body.get("text")
    return {
        "instructions": body.get("instructions"),
        "tools": body.get("tools") or [],
        "tool_choice": body.get("tool_choice") or "auto",
        "parallel_tool_calls": body.get("parallel_tool_calls", True) is not False,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "text": text if isinstance(text, Mapping) and text else {"format": {"type": "text"}},
        "reasoning": body.get("reasoning"),
        "user": body.get("user"),
        "safety_identifier": body.get("safety_identifier"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "service_tier": body.get("service_tier"),
        "truncation": "disabled",
        "store": False,
        "background": False,
        "previous_response_id": None,
    }


class ResponsesCodec:
    """OpenAI Responses: ``POST /v1/responses``."""

    dialect: Dialect = "responses"

    def parse(self, body: JSON, *, header_mode: str | None, parse_spec: SpecParser) -> ChatRequest:
        chat = parse_responses_body(body, header_mode=header_mode, parse_spec=parse_spec)
        assert isinstance(body, Mapping)  # parse_responses_body refuses anything else
        fields = {f.name: getattr(chat, f.name) for f in dataclasses.fields(chat)}
        return ResponsesRequest(**fields, echo=_echo(body))

    def body(self, outcome: Outcome, chat: ChatRequest) -> dict[str, JSON]:
        return response_body(outcome, chat)

    def events(self, outcome: Outcome, chat: ChatRequest) -> Iterator[bytes]:
        return response_events(outcome, chat)

    def error_events(
        self, err: RequestError, found: dict[str, JSON], chat: ChatRequest
    ) -> Iterator[bytes]:
        """An ``error`` event, then ``response.failed``. The error event also carries an
        ``error`` object (OpenAI's error shape), which is what makes the openai SDK raise
        ``APIError`` on it, as it does for Chat Completions' error chunk. ``chat``: the
        request, whose settings (and model) the failed response echoes."""
        error: dict[str, JSON] = {
            "message": str(err),
            "type": err.type,
            "param": err.param,
            "code": err.code,
        }
        event: dict[str, JSON] = {
            "type": "error",
            "sequence_number": 0,
            "code": err.code or err.type,
            "message": str(err),
            "param": err.param,
            "error": error,
        }
        if found:
            event["firstpass"] = found
        yield _sse(event)
        receipt = found.get("receipt_id")
        failed: dict[str, JSON] = {
            **_base(
                f"resp_{receipt}" if isinstance(receipt, str) else "resp_unreceipted",
                # nothing was served: the model asked for, as OpenAI's failed response has it
                chat.model if chat is not None else "",
                _echo_of(chat),
            ),
            "status": "failed",
            # the Responses API's own codes are a closed list (the SDK's ``ResponseError``);
            # Firstpass's code is in the error event just before
            "error": {
                "code": "rate_limit_exceeded" if err.status == 429 else "server_error",
                "message": str(err),
            },
            "output": [],
            "firstpass": found,
        }
        yield _sse({"type": "response.failed", "sequence_number": 1, "response": failed})

    def keepalive(self) -> bytes:
        # an SSE comment: the openai SDK's decoder skips lines starting with ":"
        return b": firstpass: verifying\n\n"


def _echo_of(chat: ChatRequest | None) -> dict[str, JSON]:
    return chat.echo if isinstance(chat, ResponsesRequest) else _echo({})


def _base(response_id: str, model: str, echo: dict[str, JSON]) -> dict[str, JSON]:
    return {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "error": None,
        "incomplete_details": None,
        "model": model,
        "output": [],
        "usage": None,
        **echo,
    }


def _text_part(text: str) -> dict[str, JSON]:
    return {"type": "output_text", "text": text, "annotations": []}


def _refusal_part(refusal: str) -> dict[str, JSON]:
    return {"type": "refusal", "refusal": refusal}


def _message_item(
    item_id: str, text: str, status: str, refusal: str | None = None
) -> dict[str, JSON]:
    """The assistant's message: its text, and the refusal the upstream gave (OpenAI's
    ``message.refusal``) as a ``refusal`` part, the text part only beside text then."""
    content: list[JSON] = []
    if text or refusal is None:
        content.append(_text_part(text))
    if refusal is not None:
        content.append(_refusal_part(refusal))
    return {
        "type": "message",
        "id": item_id,
        "status": status,
        "role": "assistant",
        "content": content,
    }


def _call_item(item_id: str, call: ToolCall, status: str, arguments: str) -> dict[str, JSON]:
    return {
        "type": "function_call",
        "id": item_id,
        "call_id": call.id,
        "name": call.name,
        "arguments": arguments,
        "status": status,
    }


def _usage(outcome: Outcome) -> dict[str, JSON]:
    """The served answer's tokens in the Responses API's words (``usage_of``: per answer)."""
    counts = usage_of(outcome)
    served = outcome.served
    cached = written = reasoning = 0
    if served is not None:
        c = served.completion
        calls = max(1, c.calls)
        cached, written = c.cache_read_tokens // calls, c.cache_write_tokens // calls
        reasoning = _reasoning_tokens(c.raw)
    return {
        "input_tokens": counts["prompt_tokens"],
        "input_tokens_details": {"cached_tokens": cached, "cache_write_tokens": written},
        "output_tokens": counts["completion_tokens"],
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": counts["total_tokens"],
    }


def _reasoning_tokens(raw: Mapping[str, JSON] | None) -> int:
    """``usage.completion_tokens_details.reasoning_tokens`` as the upstream reported it."""
    usage = raw.get("usage") if raw is not None else None
    details = usage.get("completion_tokens_details") if isinstance(usage, Mapping) else None
    value = details.get("reasoning_tokens") if isinstance(details, Mapping) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class _Answer:
    """The served answer as output items: ids, texts and the status they end in."""

    def __init__(self, outcome: Outcome) -> None:
        served = outcome.served
        assert served is not None
        completion = served.completion
        self.receipt_id = outcome.receipt_id
        # the model as the upstream named it, as Chat Completions' ``model`` states it
        raw = upstream_json(outcome)
        named = raw.get("model") if raw is not None else None
        self.model = named if isinstance(named, str) else served.model
        named_tier = raw.get("service_tier") if raw is not None else None
        #: the tier the upstream says it served with (None: as the request asked)
        self.service_tier = named_tier if isinstance(named_tier, str) else None
        self.text = served.text
        self.refusal = completion.refusal_of(0)
        # the served choice's tool calls and finish reason, as Chat Completions renders them
        self.calls = completion.calls_of(0)
        reason = completion.finish_reasons[0] if completion.finish_reasons else None
        self.incomplete = _INCOMPLETE.get(reason or "")
        #: the response's status, and its last item's: an answer cut short (at the token
        #: limit) was cut in its last item, text or call; the items before it are whole
        self.status = "incomplete" if self.incomplete else "completed"
        self.message_id = f"msg_{outcome.receipt_id}"
        #: a message item when there is text or a refusal, or nothing else to say
        self.has_message = bool(self.text) or self.refusal is not None or not self.calls

    def call_id(self, index: int) -> str:
        return f"fc_{self.receipt_id}_{index}"

    def message_status(self) -> str:
        return "completed" if self.calls else self.status

    def call_status(self, index: int) -> str:
        return self.status if index == len(self.calls) - 1 else "completed"

    def output(self) -> list[JSON]:
        items: list[JSON] = []
        if self.has_message:
            items.append(
                _message_item(self.message_id, self.text, self.message_status(), self.refusal)
            )
        for index, call in enumerate(self.calls):
            items.append(
                _call_item(self.call_id(index), call, self.call_status(index), call.arguments)
            )
        return items


def response_body(outcome: Outcome, chat: ChatRequest | None = None) -> dict[str, JSON]:
    """The ``response`` object of an outcome that served an answer; ``chat``: the parsed
    request, whose settings it echoes (None: OpenAI's defaults)."""
    answer = _Answer(outcome)
    body = _base(f"resp_{outcome.receipt_id}", answer.model, _echo_of(chat))
    if answer.service_tier is not None:
        body["service_tier"] = answer.service_tier
    body["status"] = answer.status
    if answer.incomplete is not None:
        body["incomplete_details"] = {"reason": answer.incomplete}
    body["output"] = answer.output()
    body["usage"] = _usage(outcome)
    body["firstpass"] = summary_json(outcome)
    return body


def _sse(event: Mapping[str, JSON]) -> bytes:
    data = json.dumps(event, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


def response_events(outcome: Outcome, chat: ChatRequest | None = None) -> Iterator[bytes]:
    """The served answer as the Responses API streams one: the lifecycle events, each output
    item added, its text in pieces (or its arguments), done; then ``response.completed``
    (``response.incomplete`` when the answer was cut short) with the whole response."""
    answer = _Answer(outcome)
    final = response_body(outcome, chat)
    started = {**final, "status": "in_progress", "output": [], "usage": None}
    started["incomplete_details"] = None
    started.pop("firstpass", None)
    sequence = 0

    def event(kind: str, **fields: JSON) -> bytes:
        nonlocal sequence
        out = _sse({"type": kind, "sequence_number": sequence, **fields})
        sequence += 1
        return out

    yield event("response.created", response=started)
    yield event("response.in_progress", response=started)
    index = 0
    if answer.has_message:
        item_id = answer.message_id
        added = {**_message_item(item_id, "", "in_progress"), "content": []}
        yield event("response.output_item.added", output_index=index, item=added)
        item = _message_item(item_id, answer.text, answer.message_status(), answer.refusal)
        parts = item["content"]
        assert isinstance(parts, list)
        for content_index, part in enumerate(parts):
            assert isinstance(part, dict)
            where: dict[str, JSON] = {
                "item_id": item_id,
                "output_index": index,
                "content_index": content_index,
            }
            if part["type"] == "refusal":
                yield event("response.content_part.added", **where, part=_refusal_part(""))
                for piece in pieces(answer.refusal or ""):
                    yield event("response.refusal.delta", **where, delta=piece)
                yield event("response.refusal.done", **where, refusal=answer.refusal or "")
            else:
                yield event("response.content_part.added", **where, part=_text_part(""))
                for piece in pieces(answer.text):
                    yield event("response.output_text.delta", **where, delta=piece, logprobs=[])
                yield event("response.output_text.done", **where, text=answer.text, logprobs=[])
            yield event("response.content_part.done", **where, part=part)
        yield event("response.output_item.done", output_index=index, item=item)
        index += 1
    for position, call in enumerate(answer.calls):
        item_id = answer.call_id(position)
        added = _call_item(item_id, call, "in_progress", "")
        yield event("response.output_item.added", output_index=index, item=added)
        where = {"item_id": item_id, "output_index": index}
        yield event("response.function_call_arguments.delta", **where, delta=call.arguments)
        yield event(
            "response.function_call_arguments.done",
            **where,
            name=call.name,
            arguments=call.arguments,
        )
        item = _call_item(item_id, call, answer.call_status(position), call.arguments)
        yield event("response.output_item.done", output_index=index, item=item)
        index += 1
    last = "response.incomplete" if answer.incomplete is not None else "response.completed"
    yield event(last, response=final)


#: POST /v1/responses
responses = dialect_handler(ResponsesCodec())
