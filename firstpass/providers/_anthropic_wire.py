"""Chat Completions <-> Anthropic Messages, both ways, as pure functions (no I/O, no clock).

``messages_body`` turns the chat body the pipeline passes a provider into a ``POST /v1/messages``
body; ``parse_message`` reads a Messages response into the parts of a ``Completion``;
``chat_completion`` writes those parts back as a ``chat.completion`` object, so a Chat
Completions client served by an Anthropic rung sees what any other upstream would send.

A chat field the Messages API has no equivalent for and that would change the answer
(``response_format``, ``seed``, ``logit_bias``...) is refused with a ``RequestError`` naming it,
never dropped in silence; fields that change nothing about the answer (``store``, OpenAI's
``metadata``, ``service_tier``...) are dropped. docs/providers.md has the whole table.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from firstpass._json import JSON
from firstpass.errors import RequestError
from firstpass.providers._base import ToolCall
from firstpass.providers._http import body_text

__all__ = [
    "DEFAULT_MAX_TOKENS",
    "STOP_REASONS",
    "MalformedMessage",
    "ParsedMessage",
    "chat_completion",
    "error_detail",
    "messages_body",
    "parse_message",
]

#: ``max_tokens`` sent when the request sets neither ``max_tokens`` nor
#: ``max_completion_tokens`` (the Messages API requires one); the same as the budgets'
#: ``default_max_tokens`` default, so a budget's hold and the call agree
DEFAULT_MAX_TOKENS: Final = 4096

#: Anthropic ``stop_reason`` -> Chat Completions ``finish_reason``. ``pause_turn`` (a
#: server-tool turn paused mid-way) and ``model_context_window_exceeded`` are answers cut short:
#: ``length``. An unknown reason is passed through as it came.
STOP_REASONS: Final[Mapping[str, str]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "length",
    "model_context_window_exceeded": "length",
}

#: chat fields dropped on the way: they change nothing about the answer (``model``, ``stream``
#: and ``n`` are the provider's own to set; ``metadata`` is OpenAI's stored-completion tags)
_DROPPED: Final = frozenset(
    {
        "firstpass",
        "model",
        "stream",
        "stream_options",
        "n",
        "store",
        "metadata",
        "service_tier",
        "prompt_cache_key",
        "prompt_cache_retention",
    }
)

#: chat fields with no Messages equivalent, each with the value that means "not used" (sent
#: with that value, the field is dropped; with any other, the request is refused)
_UNHONOURED: Final[Mapping[str, tuple[JSON, ...]]] = {
    "response_format": ({"type": "text"},),
    "logit_bias": ({},),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "seed": (),
    "presence_penalty": (0, 0.0),
    "frequency_penalty": (0, 0.0),
    "functions": ([],),
    "function_call": ("none",),
    "audio": (),
    "modalities": (["text"],),
    "prediction": (),
    "web_search_options": (),
    "reasoning_effort": (),
    "verbosity": (),
}

#: the fields ``messages_body`` translates
_TRANSLATED: Final = frozenset(
    {
        "messages",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_tokens",
        "max_completion_tokens",
        "stop",
        "temperature",
        "top_p",
        "top_k",
        "user",
        "safety_identifier",
        "cache_control",
    }
)

#: the most blocks Anthropic lets carry ``cache_control`` in one request
MAX_BREAKPOINTS: Final = 4

_IMAGE_TYPES: Final = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
_DATA_URL: Final = re.compile(r"^data:([^;,]+);base64,(.*)$", re.DOTALL)


class MalformedMessage(Exception):
    """A 2xx response that is not a usable Messages ``message`` (retried like a 5xx)."""


def _unsupported(param: str, what: str) -> RequestError:
    return RequestError(
        f"{param}: the anthropic provider cannot honour {what}; remove it, or route this "
        "request to a rung whose provider can",
        param=param,
        code="unsupported_parameter",
    )


def _invalid(param: str, message: str) -> RequestError:
    return RequestError(f"{param}: {message}", param=param, code="invalid_value")


# --- request -----------------------------------------------------------------------------


def messages_body(
    model: str, body: Mapping[str, object], *, default_max_tokens: int = DEFAULT_MAX_TOKENS
) -> dict[str, JSON]:
    """The Messages API body for ``model`` asked ``body`` (a chat body), or a ``RequestError``
    naming the first field that cannot be carried over.

    ``temperature`` is clamped to Anthropic's 0..1 (a chat client may send up to 2).
    """
    for key, value in body.items():
        if key in _DROPPED or key in _TRANSLATED or value is None:
            continue
        if key in _UNHONOURED:
            if value not in _UNHONOURED[key]:
                raise _unsupported(key, f"`{key}` (the Messages API has no equivalent)")
            continue
        raise _unsupported(key, f"the unknown field `{key}`")
    system, messages = _messages(body.get("messages"))
    out: dict[str, JSON] = {"model": model, "max_tokens": _max_tokens(body, default_max_tokens)}
    if system is not None:
        out["system"] = system
    out["messages"] = messages
    tools = _tools(body.get("tools"))
    if tools:
        out["tools"] = tools
    choice = _tool_choice(body.get("tool_choice"), body.get("parallel_tool_calls"), bool(tools))
    if choice is not None:
        out["tool_choice"] = choice
    stop = body.get("stop")
    if isinstance(stop, str):
        out["stop_sequences"] = [stop]
    elif isinstance(stop, list) and stop:
        if not all(isinstance(s, str) for s in stop):
            raise _invalid("stop", "expected a string or an array of strings")
        out["stop_sequences"] = [str(s) for s in stop]
    elif stop is not None and stop != []:
        raise _invalid("stop", "expected a string or an array of strings")
    temperature = _number(body, "temperature")
    if temperature is not None:
        out["temperature"] = min(1.0, max(0.0, temperature))
    top_p = _number(body, "top_p")
    if top_p is not None:
        out["top_p"] = top_p
    top_k = body.get("top_k")
    if top_k is not None:
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise _invalid("top_k", "expected a non-negative integer")
        out["top_k"] = top_k
    user = body.get("user", body.get("safety_identifier"))
    if isinstance(user, str) and user:
        out["metadata"] = {"user_id": user}
    mark = _mark(body.get("cache_control"), "cache_control")
    if mark is not None:  # automatic caching (the OpenRouter spelling is Anthropic's own)
        out["cache_control"] = mark
    _check_breakpoints(body)
    return out


def _mark(raw: object, where: str) -> dict[str, JSON] | None:
    """A ``cache_control`` mark (an object, e.g. ``{"type": "ephemeral"}``), carried as it
    came; None when absent."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _invalid(where, 'expected an object such as {"type": "ephemeral"}')
    return raw


def _check_breakpoints(body: Mapping[str, object]) -> None:
    """At most ``MAX_BREAKPOINTS`` marked blocks (Anthropic refuses more), counted in the
    order Anthropic reads the prompt: tools, then messages; a tool message's marks become one
    (on its ``tool_result``)."""
    marks: list[str] = []
    tools = body.get("tools")
    for i, tool in enumerate(tools if isinstance(tools, list) else []):
        if isinstance(tool, dict) and tool.get("cache_control") is not None:
            marks.append(f"tools[{i}].cache_control")
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict):
            continue
        found: list[str] = []
        for key in ("content", "tool_calls"):
            items = message.get(key)
            for j, item in enumerate(items if isinstance(items, list) else []):
                if isinstance(item, dict) and item.get("cache_control") is not None:
                    found.append(f"messages[{i}].{key}[{j}].cache_control")
        marks.extend(found[-1:] if message.get("role") == "tool" else found)
    if len(marks) > MAX_BREAKPOINTS:
        raise _invalid(
            marks[MAX_BREAKPOINTS],
            f"the Messages API allows at most {MAX_BREAKPOINTS} cache_control breakpoints; "
            f"this is breakpoint {MAX_BREAKPOINTS + 1}",
        )


def _number(body: Mapping[str, object], key: str) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _invalid(key, "expected a number")
    return float(value)


def _max_tokens(body: Mapping[str, object], default: int) -> int:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _invalid(key, "expected an integer >= 1")
        return value
    return default


def _messages(raw: object) -> tuple[JSON, list[JSON]]:
    """The top-level ``system`` (None without one) and the alternating ``messages``."""
    if not isinstance(raw, list) or not raw:
        raise _invalid("messages", "expected a non-empty array of messages")
    system: list[dict[str, JSON]] = []
    out: list[dict[str, JSON]] = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _invalid(where, "expected an object")
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system.extend(_text_blocks(content, f"{where}.content"))
            continue
        if role == "user":
            blocks = _user_blocks(content, f"{where}.content")
        elif role == "assistant":
            blocks = _assistant_blocks(message, where)
        elif role == "tool":
            role, blocks = "user", [_tool_result(message, where)]
        elif role == "function":
            raise _unsupported(
                f"{where}.role", "the legacy `function` role (send `tool` messages instead)"
            )
        else:
            raise _invalid(f"{where}.role", "expected system, developer, user, assistant or tool")
        if not blocks:  # an empty assistant turn: the Messages API refuses empty content
            continue
        if out and out[-1]["role"] == role:  # the Messages API wants roles to alternate
            previous = out[-1]["content"]
            assert isinstance(previous, list)  # built below: always a list of blocks
            previous.extend(blocks)
        else:
            out.append({"role": str(role), "content": list(blocks)})
    if not out:
        raise _invalid("messages", "the Messages API needs a user message besides the system ones")
    return _system(system), list(out)


def _system(blocks: list[dict[str, JSON]]) -> JSON:
    """One string, or the blocks themselves when one carries a ``cache_control`` mark."""
    if not blocks:
        return None
    if any("cache_control" in b for b in blocks):
        return list(blocks)
    return "\n\n".join(str(b["text"]) for b in blocks)


def _text_blocks(content: object, where: str) -> list[dict[str, JSON]]:
    """System content (a string or text parts) as text blocks."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    if not isinstance(content, list):
        raise _invalid(where, "expected a string or an array of text parts")
    out: list[dict[str, JSON]] = []
    for j, part in enumerate(content):
        block = _part(part, f"{where}[{j}]", images=False)
        if block is not None:
            out.append(block)
    return out


def _user_blocks(content: object, where: str) -> list[dict[str, JSON]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise _invalid(where, "expected a string or an array of content parts")
    out: list[dict[str, JSON]] = []
    for j, part in enumerate(content):
        block = _part(part, f"{where}[{j}]", images=True)
        if block is not None:
            out.append(block)
    return out


def _part(part: object, where: str, *, images: bool) -> dict[str, JSON] | None:
    """One chat content part as a Messages block (None: an empty text part, which the
    Messages API refuses); ``images``: whether ``image_url`` parts are allowed here."""
    if not isinstance(part, dict):
        raise _invalid(where, "expected a content part object")
    kind = part.get("type")
    if kind in ("text", "refusal"):
        text = part.get(kind)
        if not isinstance(text, str):
            raise _invalid(f"{where}.{kind}", "expected a string")
        if not text:
            return None
        block: dict[str, JSON] = {"type": "text", "text": text}
    elif kind == "image_url" and images:
        block = _image(part.get("image_url"), f"{where}.image_url")
    else:
        raise _unsupported(f"{where}.type", f"a content part of type {json.dumps(kind)} here")
    mark = _mark(part.get("cache_control"), f"{where}.cache_control")
    if mark is not None:
        block["cache_control"] = mark
    return block


def _image(image: JSON, where: str) -> dict[str, JSON]:
    url = image.get("url") if isinstance(image, dict) else image
    if not isinstance(url, str):
        raise _invalid(f"{where}.url", "expected a string")
    if url.startswith(("http://", "https://")):
        return {"type": "image", "source": {"type": "url", "url": url}}
    found = _DATA_URL.match(url)
    if found is None:
        raise _unsupported(
            f"{where}.url", "an image URL that is neither http(s) nor a base64 data: URL"
        )
    media_type = found.group(1).lower()
    if media_type not in _IMAGE_TYPES:
        raise _unsupported(
            f"{where}.url", f"an image of type {media_type} (jpeg, png, gif or webp only)"
        )
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": media_type, "data": found.group(2)},
    }


def _assistant_blocks(message: Mapping[str, JSON], where: str) -> list[dict[str, JSON]]:
    """Text then ``tool_use`` blocks; empty text is left out (the Messages API refuses it)."""
    content = message.get("content")
    out: list[dict[str, JSON]] = []
    if isinstance(content, str):
        if content:
            out.append({"type": "text", "text": content})
    elif isinstance(content, list):
        for j, part in enumerate(content):
            block = _part(part, f"{where}.content[{j}]", images=False)
            if block is not None:
                out.append(block)
    elif content is not None:
        raise _invalid(f"{where}.content", "expected a string, an array of parts, or null")
    if message.get("function_call") is not None:
        raise _unsupported(
            f"{where}.function_call", "the legacy `function_call` (send `tool_calls` instead)"
        )
    calls = message.get("tool_calls")
    if calls is None:
        return out
    if not isinstance(calls, list):
        raise _invalid(f"{where}.tool_calls", "expected an array")
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        call_id = call.get("id") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _invalid(f"{at}.function.name", "expected a string")
        if not isinstance(call_id, str) or not call_id:
            raise _invalid(f"{at}.id", "expected a string")
        use: dict[str, JSON] = {
            "type": "tool_use",
            "id": call_id,
            "name": str(function["name"]),
            "input": _arguments(function.get("arguments"), f"{at}.function.arguments"),
        }
        assert isinstance(call, dict)  # call_id came from it
        mark = _mark(call.get("cache_control"), f"{at}.cache_control")
        if mark is not None:
            use["cache_control"] = mark
        out.append(use)
    return out


def _arguments(raw: JSON, where: str) -> JSON:
    """A tool call's JSON-text arguments as the object ``tool_use.input`` holds."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, dict):
        return raw
    if not isinstance(raw, str):
        raise _invalid(where, "expected a JSON object, as text")
    try:
        value: JSON = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise _invalid(where, f"not valid JSON ({exc.msg})") from exc
    if not isinstance(value, dict):
        raise _invalid(where, "expected a JSON object (tool_use input is an object)")
    return value


def _tool_result(message: Mapping[str, JSON], where: str) -> dict[str, JSON]:
    """A tool message as a ``tool_result``. A part's ``cache_control`` mark moves to the
    ``tool_result`` itself (the last mark, if several): Anthropic refuses marks inside one,
    and the breakpoint ends where the result ends either way."""
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise _invalid(f"{where}.tool_call_id", "expected a string")
    block: dict[str, JSON] = {"type": "tool_result", "tool_use_id": call_id}
    content = message.get("content")
    mark: dict[str, JSON] | None = None
    if isinstance(content, str):
        if content:
            block["content"] = content
    elif isinstance(content, list):
        for j, part in enumerate(content):  # an empty text part may hold the mark too
            if isinstance(part, dict):
                at = f"{where}.content[{j}].cache_control"
                mark = _mark(part.get("cache_control"), at) or mark
        parts = _user_blocks(content, f"{where}.content")
        for part in parts:
            part.pop("cache_control", None)
        if parts:
            block["content"] = list(parts)
    elif content is not None:
        raise _invalid(f"{where}.content", "expected a string or an array of content parts")
    if mark is not None:
        block["cache_control"] = mark
    return block


def _tools(raw: object) -> list[JSON]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise _invalid("tools", "expected an array of tools")
    out: list[JSON] = []
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise _invalid(where, "expected an object")
        if tool.get("type") != "function":
            raise _unsupported(f"{where}.type", f"a tool of type {json.dumps(tool.get('type'))}")
        function = tool.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _invalid(f"{where}.function.name", "expected a string")
        schema = function.get("parameters")
        if schema is None:
            schema = {"type": "object", "properties": {}}
        elif not isinstance(schema, dict):
            raise _invalid(f"{where}.function.parameters", "expected a JSON Schema object")
        item: dict[str, JSON] = {"name": str(function["name"])}
        description = function.get("description")
        if isinstance(description, str) and description:
            item["description"] = description
        item["input_schema"] = schema
        mark = _mark(tool.get("cache_control"), f"{where}.cache_control")
        if mark is not None:  # on the chat tool object, where OpenRouter and LiteLLM put it
            item["cache_control"] = mark
        out.append(item)
    return out


def _tool_choice(raw: object, parallel: object, has_tools: bool) -> JSON:
    """``tool_choice`` in Anthropic's terms, ``disable_parallel_tool_use`` from
    ``parallel_tool_calls: false`` (None: leave the Messages default, ``auto``)."""
    single = parallel is False
    choice: dict[str, JSON]
    if raw is None:
        if not (single and has_tools):
            return None
        choice = {"type": "auto"}
    elif raw == "auto":
        choice = {"type": "auto"}
    elif raw == "none":
        return {"type": "none"}
    elif raw == "required":
        choice = {"type": "any"}
    elif isinstance(raw, dict) and raw.get("type") == "function":
        function = raw.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if not isinstance(name, str):
            raise _invalid("tool_choice.function.name", "expected a string")
        choice = {"type": "tool", "name": name}
    else:
        raise _unsupported("tool_choice", f"tool_choice {json.dumps(raw)}")
    if single:
        choice["disable_parallel_tool_use"] = True
    return choice


# --- response ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True, slots=True)
class ParsedMessage:
    """A Messages response in Chat Completions' terms. ``input_tokens`` counts every prompt
    token: Anthropic's ``input_tokens`` leaves out the cached ones, which are added back.
    ``cache_write_1h_tokens`` is the part of the cache writes made to 1-hour entries
    (``usage.cache_creation.ephemeral_1h_input_tokens``), billed dearer than 5-minute ones."""

    id: str
    model: str | None
    text: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str | None
    input_tokens: int
    output_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    cache_write_1h_tokens: int = 0


def parse_message(obj: JSON) -> ParsedMessage:
    """The text (text blocks joined), tool calls, finish reason and usage of a ``message``."""
    if not isinstance(obj, dict):
        raise MalformedMessage(f"expected a JSON object, got {type(obj).__name__}")
    if obj.get("type") != "message":
        raise MalformedMessage(f"expected type 'message', got {json.dumps(obj.get('type'))}")
    content = obj.get("content")
    if not isinstance(content, list):
        raise MalformedMessage("the message has no `content` array")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        if not isinstance(block, dict):
            raise MalformedMessage("`content` holds a non-object")
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(str(block["text"]))
        elif block.get("type") == "tool_use" and isinstance(block.get("name"), str):
            call_id = block.get("id")
            calls.append(
                ToolCall(
                    id=call_id if isinstance(call_id, str) else f"toolu_{len(calls)}",
                    name=str(block["name"]),
                    arguments=json.dumps(block.get("input") or {}, ensure_ascii=False),
                )
            )
        # thinking, redacted_thinking and server-tool blocks carry no answer text
    reason = obj.get("stop_reason")
    usage = obj.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    read = _count(usage.get("cache_read_input_tokens"))
    write = _count(usage.get("cache_creation_input_tokens"))
    by_ttl = usage.get("cache_creation")
    by_ttl = by_ttl if isinstance(by_ttl, dict) else {}
    write_1h = _count(by_ttl.get("ephemeral_1h_input_tokens"))
    # the breakdown is of the total; a total short of it (a proxy that dropped it) takes the sum
    write = max(write, write_1h + _count(by_ttl.get("ephemeral_5m_input_tokens")))
    message_id = obj.get("id")
    model = obj.get("model")
    return ParsedMessage(
        id=message_id if isinstance(message_id, str) else "msg",
        model=model if isinstance(model, str) else None,
        text="".join(texts),
        tool_calls=tuple(calls),
        finish_reason=STOP_REASONS.get(reason, reason) if isinstance(reason, str) else None,
        input_tokens=_count(usage.get("input_tokens")) + read + write,
        output_tokens=_count(usage.get("output_tokens")),
        cache_read_tokens=read,
        cache_write_tokens=write,
        cache_write_1h_tokens=write_1h,
    )


def _count(value: JSON) -> int:
    """A usage count as an int (0 when absent, null, negative, or not an integer)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def chat_completion(parsed: ParsedMessage, *, model: str, created: int) -> dict[str, JSON]:
    """``parsed`` as a one-choice ``chat.completion`` object (the pass-through body)."""
    message: dict[str, JSON] = {
        "role": "assistant",
        "content": parsed.text if parsed.text or not parsed.tool_calls else None,
        "refusal": None,
    }
    if parsed.tool_calls:
        message["tool_calls"] = [call.to_chat() for call in parsed.tool_calls]
    usage: dict[str, JSON] = {
        "prompt_tokens": parsed.input_tokens,
        "completion_tokens": parsed.output_tokens,
        "total_tokens": parsed.input_tokens + parsed.output_tokens,
    }
    if parsed.cache_read_tokens:
        usage["prompt_tokens_details"] = {"cached_tokens": parsed.cache_read_tokens}
    return {
        "id": parsed.id,
        "object": "chat.completion",
        "created": created,
        "model": parsed.model or model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": parsed.finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage,
    }


def error_detail(raw: bytes) -> str:
    """An error body as ``<error.type>: <error.message>`` (Anthropic's shape:
    ``{"type": "error", "error": {"type", "message"}}``), else the start of the body."""
    try:
        obj = json.loads(raw)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        error = obj.get("error")
        if isinstance(error, dict):
            kind, message = error.get("type"), error.get("message")
            if isinstance(message, str):
                return f"{kind}: {message}" if isinstance(kind, str) else message
            if isinstance(kind, str):
                return kind
        if isinstance(obj.get("message"), str):
            return str(obj["message"])
    return body_text(raw)
