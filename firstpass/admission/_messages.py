"""The Anthropic Messages dialect: validate a ``POST /v1/messages`` body and translate it to the
Chat Completions body every dialect becomes, then parse that as Chat Completions does.

The translation is what a task sent through either API must share: the ``system`` prompt is the
first ``{"role": "system"}`` message, a string content stays a string (same prompt hash, same
checks), ``tool_use`` blocks are the assistant's ``tool_calls``, and each ``tool_result`` block is
a ``{"role": "tool"}`` message in the place it stood. What Chat Completions cannot carry
(``top_k``, extended ``thinking``, server tools, documents, containers, MCP servers) is a 400
naming the field as the client spelt it (``tools[1].type``, ``messages[2].content[0].source``),
never dropped in silence. ``cache_control`` marks are the one thing dropped: they change what a
request costs, never what it asks.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import cast

from firstpass._json import JSON
from firstpass.admission._chat import check_finite, parse_chat_body
from firstpass.admission._request import ChatRequest, SpecParser, bad
from firstpass.errors import RequestError

__all__ = ["parse_messages_body"]

#: top-level keys translated to the chat body (``cache_control``: a caching hint, ignored)
_MAPPED = frozenset(
    {
        "model",
        "max_tokens",
        "messages",
        "system",
        "tools",
        "tool_choice",
        "stop_sequences",
        "temperature",
        "top_p",
        "metadata",
        "stream",
        "firstpass",
        "cache_control",
    }
)
#: keys Anthropic documents that Chat Completions has no place for, and why
_REFUSED: dict[str, str] = {
    "top_k": "Chat Completions has no top_k; leave it out or use top_p",
    "thinking": "extended thinking is not supported through Firstpass",
    "container": "containers (server-side code execution) are not supported through Firstpass",
    "mcp_servers": "MCP servers are not supported through Firstpass; send the tools yourself",
    "output_config": "output_config is not supported through Firstpass",
    "context_management": "context management is not supported through Firstpass",
}
#: Anthropic's image media types
_MEDIA_TYPES = frozenset({"image/jpeg", "image/png", "image/gif", "image/webp"})
#: what a custom tool may hold: the chat function's fields, and hints that change nothing
_TOOL_KEYS = frozenset(
    {
        "name",
        "description",
        "input_schema",
        "type",
        "cache_control",
        "strict",
        "eager_input_streaming",
    }
)


def parse_messages_body(
    body: JSON, *, header_mode: str | None, parse_spec: SpecParser
) -> ChatRequest:
    """Validate an Anthropic Messages ``body`` and return the ``ChatRequest`` its Chat
    Completions translation parses to, marked as the ``messages`` dialect."""
    try:
        chat = to_chat_body(body)
    except RecursionError:
        raise RequestError(
            "the request nests too deeply to be a messages request", code="invalid_json"
        ) from None
    parsed = parse_chat_body(chat, header_mode=header_mode, parse_spec=parse_spec)
    return dataclasses.replace(parsed, dialect="messages")


def to_chat_body(body: JSON) -> dict[str, JSON]:
    """The Chat Completions body of a Messages body, or a ``RequestError`` naming the field."""
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object", code="invalid_body")
    for key, value in body.items():
        if key in _MAPPED:
            continue
        if key == "service_tier" and value in (None, "auto"):  # the default: nothing changes
            continue
        if key == "thinking" and (
            value is None or (isinstance(value, Mapping) and value.get("type") == "disabled")
        ):
            continue
        if value is None:
            continue
        reason = _REFUSED.get(key, f"{key!r} is not supported through Firstpass")
        if key == "service_tier":
            reason = "only 'auto' is supported through Firstpass"
        raise bad(key, reason, code="unsupported_parameter")
    check_finite(body)  # paths as the client spelt them (``tools[0].input_schema...``)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "expected a non-empty string", code="missing_model")
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise bad("max_tokens", "required: the most tokens to generate", code="missing_required")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise bad("max_tokens", "expected an integer >= 1")
    chat: dict[str, JSON] = {"model": model, "max_tokens": max_tokens}
    system = _system(body.get("system"))
    messages: list[JSON] = [{"role": "system", "content": system}] if system else []
    messages.extend(_messages(body.get("messages")))
    chat["messages"] = messages
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), chat, has_tools=bool(tools))
    _sampling(body, chat)
    for key in ("stream", "firstpass"):
        if key in body:
            chat[key] = body[key]
    return chat


def _text_of(block: Mapping[str, JSON], where: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise bad(f"{where}.text", "expected a string")
    return text


def _blocks(content: JSON, where: str) -> list[Mapping[str, JSON]]:
    """A content array's blocks, each an object with a string ``type``."""
    if not isinstance(content, list):
        raise bad(where, "expected a string or an array of content blocks")
    for j, block in enumerate(content):
        if not isinstance(block, Mapping):
            raise bad(f"{where}[{j}]", "expected a content block object")
        if not isinstance(block.get("type"), str):
            raise bad(f"{where}[{j}].type", "expected a string")
    return cast("list[Mapping[str, JSON]]", content)


def _system(system: JSON, where: str = "system") -> str:
    """A system prompt: a string, or text blocks joined with newlines (their ``cache_control``
    ignored)."""
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for j, block in enumerate(_blocks(system, where)):
        if block.get("type") != "text":
            raise bad(f"{where}[{j}].type", "expected 'text': a system prompt is text blocks")
        texts.append(_text_of(block, f"{where}[{j}]"))
    return "\n".join(texts)


def _messages(messages: JSON) -> list[JSON]:
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "expected a non-empty array of messages")
    out: list[JSON] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad(where, "expected an object")
        role = message.get("role")
        content = message.get("content")
        if role == "user":
            out.extend(_user(content, f"{where}.content"))
        elif role == "assistant":
            out.append(_assistant(content, f"{where}.content"))
        elif role == "system":  # the SDK's types allow one among the messages
            out.append({"role": "system", "content": _system(content, f"{where}.content")})
        else:
            raise bad(
                f"{where}.role",
                "expected 'user', 'assistant' or 'system'",
            )
    return out


def _image(block: Mapping[str, JSON], where: str) -> dict[str, JSON]:
    """An image block as a chat ``image_url`` part: a base64 source as a data URL."""
    source = block.get("source")
    if not isinstance(source, Mapping):
        raise bad(f"{where}.source", "expected an object")
    kind = source.get("type")
    if kind == "base64":
        media, data = source.get("media_type"), source.get("data")
        if not isinstance(media, str) or media not in _MEDIA_TYPES:
            raise bad(
                f"{where}.source.media_type", f"expected one of {', '.join(sorted(_MEDIA_TYPES))}"
            )
        if not isinstance(data, str):
            raise bad(f"{where}.source.data", "expected a base64 string")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        link = source.get("url")
        if not isinstance(link, str) or not link:
            raise bad(f"{where}.source.url", "expected a URL")
        url = link
    else:
        raise bad(f"{where}.source.type", "expected 'base64' or 'url' (files are not supported)")
    return {"type": "image_url", "image_url": {"url": url}}


def _user(content: JSON, where: str) -> list[JSON]:
    """A user turn: its text and images as one user message, each ``tool_result`` as a tool
    message where it stands (Anthropic puts them first, so they follow the assistant's calls)."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[JSON] = []
    parts: list[JSON] = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}[{j}]"
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": _text_of(block, at)})
        elif kind == "image":
            parts.append(_image(block, at))
        elif kind == "tool_result":
            if parts:
                out.append({"role": "user", "content": parts})
                parts = []
            out.append(_tool_result(block, at))
        elif kind == "tool_use":
            raise bad(f"{at}.type", "a tool_use block belongs in an assistant message")
        else:
            raise bad(f"{at}.type", f"content block {kind!r} is not supported through Firstpass")
    if parts or not out:
        out.append({"role": "user", "content": parts})
    return out


def _tool_result(block: Mapping[str, JSON], where: str) -> dict[str, JSON]:
    """A ``tool_result`` as a tool message; ``is_error`` prefixes its text with ``Error: ``
    (Chat Completions has no such flag, and the model must still learn the call failed)."""
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad(f"{where}.tool_use_id", "expected the id of the tool_use it answers")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts = []
        for k, part in enumerate(_blocks(content, f"{where}.content")):
            if part.get("type") != "text":
                raise bad(
                    f"{where}.content[{k}].type",
                    "only text is supported in a tool_result through Firstpass "
                    "(Chat Completions' tool messages carry text)",
                )
            texts.append(_text_of(part, f"{where}.content[{k}]"))
        text = "\n".join(texts)
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise bad(f"{where}.is_error", "expected true or false")
    if is_error:
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant(content: JSON, where: str) -> dict[str, JSON]:
    """An assistant turn: its text blocks joined, its ``tool_use`` blocks as ``tool_calls``
    (``input`` as JSON text, as Chat Completions spells arguments)."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[str] = []
    calls: list[JSON] = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}[{j}]"
        kind = block.get("type")
        if kind == "text":
            texts.append(_text_of(block, at))
        elif kind == "tool_use":
            call_id, name, args = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id:
                raise bad(f"{at}.id", "expected a string")
            if not isinstance(name, str) or not name:
                raise bad(f"{at}.name", "expected a string")
            if not isinstance(args, Mapping):
                raise bad(f"{at}.input", "expected an object")
            arguments = json.dumps(args, ensure_ascii=False)
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": arguments},
                }
            )
        elif kind == "tool_result":
            raise bad(f"{at}.type", "a tool_result block belongs in a user message")
        else:
            raise bad(f"{at}.type", f"content block {kind!r} is not supported through Firstpass")
    message: dict[str, JSON] = {
        "role": "assistant",
        "content": "\n".join(texts) if texts or not calls else None,
    }
    if calls:
        message["tool_calls"] = calls
    return message


def _tools(tools: JSON) -> list[JSON]:
    """Custom tools as chat function tools; a server tool (``web_search_...``, ``bash_...``,
    ``text_editor_...``, ``computer_...``) is a 400 naming its ``type``."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad("tools", "expected an array of tools")
    out: list[JSON] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise bad(where, "expected an object")
        kind = tool.get("type")
        if kind is not None and kind != "custom":
            raise bad(
                f"{where}.type",
                f"server tool {kind!r} is not supported through Firstpass; send custom tools "
                "(name, description, input_schema) and run them yourself",
                code="unsupported_tool",
            )
        unknown = sorted(k for k, v in tool.items() if k not in _TOOL_KEYS and v is not None)
        if unknown:
            raise bad(f"{where}.{unknown[0]}", "not supported through Firstpass")
        name, schema = tool.get("name"), tool.get("input_schema")
        if not isinstance(name, str) or not name:
            raise bad(f"{where}.name", "expected a non-empty string")
        if not isinstance(schema, Mapping):
            raise bad(f"{where}.input_schema", "expected a JSON Schema object")
        function: dict[str, JSON] = {"name": name}
        description = tool.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise bad(f"{where}.description", "expected a string")
            function["description"] = description
        function["parameters"] = dict(schema)
        strict = tool.get("strict")
        if strict is not None:
            if not isinstance(strict, bool):
                raise bad(f"{where}.strict", "expected true or false")
            function["strict"] = strict
        out.append({"type": "function", "function": function})
    return out


def _tool_choice(choice: JSON, chat: dict[str, JSON], *, has_tools: bool) -> None:
    """``tool_choice`` as Chat Completions spells it: auto, any (required), a named tool, none;
    ``disable_parallel_tool_use`` as ``parallel_tool_calls: false``."""
    if choice is None:
        return
    if not isinstance(choice, Mapping):
        raise bad("tool_choice", "expected an object with a 'type'")
    kind = choice.get("type")
    mapped: JSON
    if kind == "auto":
        mapped = "auto"
    elif kind == "any":
        mapped = "required"
    elif kind == "none":
        mapped = "none"
    elif kind == "tool":
        name = choice.get("name")
        if not isinstance(name, str) or not name:
            raise bad("tool_choice.name", "expected the name of one of the tools")
        mapped = {"type": "function", "function": {"name": name}}
    else:
        raise bad("tool_choice.type", "expected one of auto, any, tool, none")
    disable = choice.get("disable_parallel_tool_use")
    if disable is not None and not isinstance(disable, bool):
        raise bad("tool_choice.disable_parallel_tool_use", "expected true or false")
    if not has_tools:
        if kind in ("any", "tool"):
            raise bad("tool_choice", f"tool_choice {kind!r} needs tools")
        return  # auto or none without tools: nothing to choose from, nothing to say upstream
    chat["tool_choice"] = mapped
    if disable:
        chat["parallel_tool_calls"] = False


def _sampling(body: Mapping[str, JSON], chat: dict[str, JSON]) -> None:
    """``temperature`` and ``top_p`` (Anthropic's ranges, 0 to 1), ``stop_sequences`` as
    ``stop``, ``metadata.user_id`` as ``user``."""
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
            raise bad(key, "expected a number between 0 and 1")
        chat[key] = value
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise bad("stop_sequences", "expected an array of strings")
        if stops:
            chat["stop"] = stops
    metadata = body.get("metadata")
    if metadata is not None:
        if not isinstance(metadata, Mapping):
            raise bad("metadata", "expected an object")
        for key in metadata:
            if key != "user_id":
                raise bad(f"metadata.{key}", "unknown key (known: user_id)")
        user = metadata.get("user_id")
        if user is not None:
            if not isinstance(user, str):
                raise bad("metadata.user_id", "expected a string")
            chat["user"] = user
