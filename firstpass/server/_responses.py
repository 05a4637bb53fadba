"""OpenAI response bodies: ``chat.completion`` objects and ``chat.completion.chunk`` SSE events.

A verified answer is only known whole, after the checks, so streaming replays the chosen answer
as chunks; nothing is streamed before the decision (see ``_handlers._stream``). The chunk with
``finish_reason`` (or the ``error`` event) carries the response's ``firstpass`` object, with the
receipt's id: a stream whose headers went out before the decision learns the id only there.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping

from firstpass._json import JSON
from firstpass.pipeline import Outcome
from firstpass.providers import Completion, ToolCall

__all__ = [
    "completion_body",
    "pieces",
    "sse_chunks",
    "summary_json",
    "upstream_json",
    "usage_of",
]


def summary_json(outcome: Outcome) -> dict[str, JSON]:
    """The response's ``firstpass`` object: the outcome's summary, ``{}`` when it has none."""
    return outcome.summary.to_json() if outcome.summary is not None else {}


def usage_of(outcome: Outcome) -> dict[str, JSON]:
    """Usage of the served call, per answer (what an OpenAI client expects for one choice),
    with the prompt's cached part as OpenAI reports it (``prompt_tokens_details``)."""
    served = outcome.served
    if served is None:
        return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
    c = served.completion
    return _usage(
        c.input_tokens // max(1, c.calls),
        c.output_tokens // max(1, c.n),
        c.cache_read_tokens // max(1, c.calls),
    )


def _usage(prompt: int, completion: int, cached: int) -> dict[str, JSON]:
    usage: dict[str, JSON] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }
    if cached:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    return usage


def upstream_json(outcome: Outcome) -> dict[str, JSON] | None:
    """The upstream's own response, for an answer that goes out as the upstream sent it:
    pass-through (all its choices), and a tool turn (its one choice); else None."""
    served = outcome.served
    if outcome.action == "passthrough":
        return outcome.raw
    if outcome.action == "tool_turn" and served is not None:
        return served.completion.raw
    return None


def _message(text: str, calls: tuple[ToolCall, ...], refusal: str | None) -> dict[str, JSON]:
    """An assistant message: its text, and its tool calls when it made any (content is null
    for a message of tool calls only, or of a refusal, as OpenAI sends them)."""
    message: dict[str, JSON] = {
        "role": "assistant",
        "content": text if text or not (calls or refusal) else None,
        "refusal": refusal,
    }
    if calls:
        message["tool_calls"] = [call.to_chat() for call in calls]
    return message


def completion_body(outcome: Outcome) -> dict[str, JSON]:
    """The ``chat.completion`` for an outcome that served an answer."""
    served = outcome.served
    assert served is not None
    raw = upstream_json(outcome)
    if raw is not None:
        body: dict[str, JSON] = dict(raw)
        body.setdefault("object", "chat.completion")
        body["firstpass"] = summary_json(outcome)
        return body
    finish = served.completion.finish_reasons[0] if served.completion.finish_reasons else "stop"
    return {
        "id": f"chatcmpl-{outcome.receipt_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": served.model,
        "choices": [
            {
                "index": 0,
                "message": _message(
                    served.text, served.completion.calls_of(0), served.completion.refusal_of(0)
                ),
                "logprobs": None,
                "finish_reason": finish or "stop",
            }
        ],
        "usage": dict(usage_of(outcome)),
        "system_fingerprint": None,
        "firstpass": summary_json(outcome),
    }


def _event(obj: Mapping[str, object]) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def pieces(text: str, size: int = 24) -> Iterator[str]:
    """Split at whitespace near ``size`` characters, so chunks look like a model's tokens."""
    start = 0
    while start < len(text):
        end = min(len(text), start + size)
        if end < len(text):
            space = text.rfind(" ", start + 1, end + 1)
            if space > start:
                end = space
        yield text[start:end]
        start = end


def _call_deltas(
    completion: Completion, index: int, calls: tuple[ToolCall, ...]
) -> Iterator[dict[str, object]]:
    """Choice ``index``'s tool calls as deltas: the upstream's own items when its JSON was
    kept (each whole, with its ``index``; a legacy ``function_call`` as one), so a streamed
    tool turn carries exactly what a plain one does; else each ``ToolCall`` whole."""
    raw = completion.raw_calls_of(index)
    if raw is None:
        for position, call in enumerate(calls):
            yield {"tool_calls": [{"index": position, **call.to_chat()}]}
        return
    listed = raw.get("tool_calls")
    for position, item in enumerate(listed if isinstance(listed, list) else []):
        if isinstance(item, dict):
            yield {"tool_calls": [_streamable({"index": position, **item})]}
    if "function_call" in raw:
        yield {"function_call": raw["function_call"]}


def _streamable(item: dict[str, JSON]) -> dict[str, JSON]:
    """A tool call item as a delta may carry it: ``arguments`` as text (a stream's clients
    append argument pieces as strings; an upstream that sent an object gets it as JSON)."""
    function = item.get("function")
    if isinstance(function, dict) and not isinstance(function.get("arguments", ""), str):
        item = {**item, "function": {**function, "arguments": json.dumps(function["arguments"])}}
    return item


def sse_chunks(outcome: Outcome, *, include_usage: bool) -> Iterator[bytes]:
    """The chosen answer (or answers, pass-through with n > 1) as SSE events, then ``[DONE]``:
    its text in pieces, then each tool call whole (id, name and arguments in one delta, which
    the openai SDK's stream accumulator merges by ``index`` like any other)."""
    served = outcome.served
    assert served is not None
    created = int(time.time())
    raw = upstream_json(outcome)
    raw_id = raw.get("id") if raw is not None else None
    base = {
        "id": raw_id if isinstance(raw_id, str) else f"chatcmpl-{outcome.receipt_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": served.model,
        "system_fingerprint": None,
    }
    completion = served.completion
    texts = completion.texts if outcome.action == "passthrough" else (served.text,)
    reasons = completion.finish_reasons
    for index, text in enumerate(texts):
        calls = completion.calls_of(index)

        def chunk(
            delta: dict[str, object], finish: str | None = None, index: int = index
        ) -> dict[str, object]:
            return {
                **base,
                "choices": [
                    {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
                ],
            }

        yield _event(chunk({"role": "assistant", "content": "" if text or not calls else None}))
        for piece in pieces(text):
            yield _event(chunk({"content": piece}))
        for delta in _call_deltas(completion, index, calls):
            yield _event(chunk(delta))
        finish = (reasons[index] if index < len(reasons) else None) or "stop"
        last = chunk({}, finish)
        if index == len(texts) - 1:
            last["firstpass"] = summary_json(outcome)
        yield _event(last)
    if include_usage:
        usage = usage_of(outcome)
        if outcome.action == "passthrough":
            usage = _usage(
                completion.input_tokens, completion.output_tokens, completion.cache_read_tokens
            )
        yield _event({**base, "choices": [], "usage": usage})
    yield b"data: [DONE]\n\n"


def sse_error(
    message: str, *, type: str, code: str | None, firstpass: Mapping[str, JSON] | None = None
) -> bytes:
    """An error event for the rare case the decision fails after keep-alives already went out;
    ``firstpass``: the response's ``firstpass`` object (its ``receipt_id`` above all, which
    the headers, sent before the receipt existed, could not carry)."""
    event: dict[str, object] = {
        "error": {"message": message, "type": type, "param": None, "code": code}
    }
    if firstpass:
        event["firstpass"] = dict(firstpass)
    return _event(event)
