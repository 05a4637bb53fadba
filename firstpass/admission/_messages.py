"""The Anthropic Messages dialect: validate a ``POST /v1/messages`` body and translate it to the
Chat Completions body every dialect becomes, then parse that as Chat Completions does.

The translation is what a task sent through either API must share: the ``system`` prompt is the
first ``{"role": "system"}`` message, a string content stays a string (same prompt hash, same
checks), ``tool_use`` blocks are the assistant's ``tool_calls``, and each ``tool_result`` block is
a ``{"role": "tool"}`` message in the place it stood. What Chat Completions cannot carry
(``top_k``, extended ``thinking``, server tools, documents, containers, MCP servers) is a 400
naming the field as the client spelt it (``tools[1].type``, ``messages[2].content[0].source``),
never dropped in silence. So is a conversation Anthropic refuses (tool calls and results that
do not pair up, an empty message or text block) or a Chat Completions upstream cannot carry
(an assistant prefill), before any rung is paid for.

``cache_control`` marks (prompt-cache breakpoints, most of an agent's input bill) travel with
the block they mark, in the shape OpenAI-compatible gateways that honour them use (OpenRouter,
LiteLLM): on a text or image part, on the last part of a tool message, on a chat tool object,
on a ``tool_calls`` entry, and at the top level. A block marked is the one place the chat body
changes shape (a system prompt or an assistant's text becomes text parts), so a request without
marks is the chat body a Chat Completions client sends for the same task. The anthropic
provider maps them back; more than Anthropic's 4 breakpoints is a 400 naming the fifth.
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

#: top-level keys translated to the chat body
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
#: what a custom tool may hold: the chat function's fields, its cache mark, and a streaming
#: hint that changes nothing
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
    _check_conversation(cast("list[Mapping[str, JSON]]", body["messages"]))
    chat["messages"] = messages
    tools = _tools(body.get("tools"))
    if tools:
        chat["tools"] = tools
    _tool_choice(body.get("tool_choice"), chat, names=_tool_names(tools))
    _sampling(body, chat)
    for key in ("stream", "firstpass"):
        if key in body:
            chat[key] = body[key]
    if body.get("cache_control") is not None:  # automatic caching: Anthropic places the mark
        chat["cache_control"] = body["cache_control"]
    _check_breakpoints(body)
    return chat


#: the most cache breakpoints Anthropic accepts in one request
MAX_BREAKPOINTS = 4


def _marked(part: dict[str, JSON], block: Mapping[str, JSON]) -> dict[str, JSON]:
    """``part`` with ``block``'s ``cache_control`` mark, if it has one."""
    mark = block.get("cache_control")
    if mark is not None:
        part["cache_control"] = mark
    return part


def _check_mark(mark: JSON, where: str) -> bool:
    """Whether ``mark`` (``where``: its path) is a breakpoint; a malformed one is a 400."""
    if mark is None:
        return False
    if not isinstance(mark, Mapping) or mark.get("type") != "ephemeral":
        raise bad(where, 'expected {"type": "ephemeral"}, with an optional "ttl"')
    ttl = mark.get("ttl")
    if ttl is not None and not isinstance(ttl, str):
        raise bad(f"{where}.ttl", "expected a string such as '5m' or '1h'")
    return True


def _check_breakpoints(body: Mapping[str, JSON]) -> None:
    """Every ``cache_control`` mark well formed, and at most ``MAX_BREAKPOINTS`` on blocks
    (Anthropic refuses a fifth), counted in prompt order: tools, system, messages. Runs after
    the translation, so the structure is already known good."""
    _check_mark(body.get("cache_control"), "cache_control")
    marks: list[str] = []

    def visit(block: JSON, where: str) -> None:
        if isinstance(block, Mapping):
            if _check_mark(block.get("cache_control"), f"{where}.cache_control"):
                marks.append(f"{where}.cache_control")
            inner = block.get("content")
            if block.get("type") == "tool_result" and isinstance(inner, list):
                for k, part in enumerate(inner):
                    visit(part, f"{where}.content[{k}]")

    for name in ("tools", "system"):
        items = body.get(name)
        if isinstance(items, list):
            for i, item in enumerate(items):
                visit(item, f"{name}[{i}]")
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, list):
            for j, block in enumerate(content):
                visit(block, f"messages[{i}].content[{j}]")
    if len(marks) > MAX_BREAKPOINTS:
        raise bad(
            marks[MAX_BREAKPOINTS],
            f"at most {MAX_BREAKPOINTS} blocks may carry cache_control (Anthropic's limit); "
            f"this is mark {MAX_BREAKPOINTS + 1}",
        )


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


def _system(system: JSON, where: str = "system") -> JSON:
    """A system prompt's chat content: a string, or its text blocks joined with newlines; text
    parts, one a block, when a block carries ``cache_control`` (a mark needs its block)."""
    if system is None or isinstance(system, str):
        return system or ""
    blocks = _blocks(system, where)
    parts: list[JSON] = []
    for j, block in enumerate(blocks):
        if block.get("type") != "text":
            raise bad(f"{where}[{j}].type", "expected 'text': a system prompt is text blocks")
        parts.append(_marked({"type": "text", "text": _text_of(block, f"{where}[{j}]")}, block))
    if any(block.get("cache_control") is not None for block in blocks):
        return parts
    return "\n".join(str(block["text"]) for block in blocks)


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
    return _marked({"type": "image_url", "image_url": {"url": url}}, block)


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
            parts.append(_marked({"type": "text", "text": _text_of(block, at)}, block))
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
    (Chat Completions has no such flag, and the model must still learn the call failed).

    Marked (on the block, or on a block inside it), the content is text parts with the mark on
    the last: one breakpoint where the result ends, which is where Anthropic takes it (it
    refuses marks inside a ``tool_result``; the anthropic provider puts it back on the block).
    """
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise bad(f"{where}.tool_use_id", "expected the id of the tool_use it answers")
    content = block.get("content")
    mark = block.get("cache_control")
    if content is None:
        texts = [""]
    elif isinstance(content, str):
        texts = [content]
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
            if mark is None:
                mark = part.get("cache_control")
        texts = texts or [""]
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise bad(f"{where}.is_error", "expected true or false")
    if is_error:
        texts[0] = f"Error: {texts[0]}" if "\n".join(texts) else "Error"
    message: dict[str, JSON] = {"role": "tool", "tool_call_id": call_id}
    if mark is None:
        message["content"] = "\n".join(texts)
        return message
    parts: list[JSON] = [{"type": "text", "text": text} for text in texts]
    parts[-1] = {"type": "text", "text": texts[-1], "cache_control": mark}
    message["content"] = parts
    return message


def _assistant(content: JSON, where: str) -> dict[str, JSON]:
    """An assistant turn: its text blocks joined, its ``tool_use`` blocks as ``tool_calls``
    (``input`` as JSON text, as Chat Completions spells arguments)."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    texts: list[dict[str, JSON]] = []
    calls: list[JSON] = []
    for j, block in enumerate(_blocks(content, where)):
        at = f"{where}[{j}]"
        kind = block.get("type")
        if kind == "text":
            texts.append(_marked({"type": "text", "text": _text_of(block, at)}, block))
        elif kind == "tool_use":
            call_id, name, args = block.get("id"), block.get("name"), block.get("input")
            if not isinstance(call_id, str) or not call_id:
                raise bad(f"{at}.id", "expected a string")
            if not isinstance(name, str) or not name:
                raise bad(f"{at}.name", "expected a string")
            if not isinstance(args, Mapping):
                raise bad(f"{at}.input", "expected an object")
            arguments = json.dumps(args, ensure_ascii=False)
            call: dict[str, JSON] = {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": arguments},
            }
            calls.append(_marked(call, block))
        elif kind == "tool_result":
            raise bad(f"{at}.type", "a tool_result block belongs in a user message")
        else:
            raise bad(f"{at}.type", f"content block {kind!r} is not supported through Firstpass")
    text: JSON = "\n".join(str(part["text"]) for part in texts) if texts or not calls else None
    if any("cache_control" in part for part in texts):
        parts: list[JSON] = list(texts)
        text = parts
    message: dict[str, JSON] = {"role": "assistant", "content": text}
    if calls:
        message["tool_calls"] = calls
    return message


def _check_conversation(messages: list[Mapping[str, JSON]]) -> None:
    """Refuse, before anything is paid for, the conversations Anthropic answers with a 400 and
    a Chat Completions upstream refuses or answers wrongly: a prefill, an empty message or text
    block, and tool calls that do not pair up. Runs after the translation, so every message and
    block is already known well formed; messages are named as the client numbered them."""
    last = len(messages) - 1
    if messages[last].get("role") == "assistant":
        raise bad(
            f"messages[{last}].role",
            "the conversation ends in an assistant message (a prefill for the answer to "
            "continue); a Chat Completions upstream answers it from scratch instead of "
            "continuing it, so it cannot be carried through Firstpass: end with a user message",
            code="unsupported_parameter",
        )
    for i, message in enumerate(messages):
        if message.get("role") not in ("user", "assistant"):
            continue
        content = message.get("content")
        if content == "" or content == []:
            raise bad(
                f"messages[{i}].content",
                "all messages must have non-empty content (Anthropic's rule)",
            )
        for j, block in enumerate(content if isinstance(content, list) else []):
            if isinstance(block, Mapping) and block.get("type") == "text" and not block["text"]:
                raise bad(
                    f"messages[{i}].content[{j}].text", "text content blocks must be non-empty"
                )
    _check_tool_pairs(messages)


#: a block of a turn: its path (``messages[2].content[0]``) and the block
_Placed = tuple[str, Mapping[str, JSON]]


def _turns(messages: list[Mapping[str, JSON]]) -> list[tuple[str, list[_Placed]]]:
    """The conversation's turns: consecutive messages of one role are one turn (Anthropic
    combines them), each with its role and blocks in order; a string content is a text block."""
    turns: list[tuple[str, list[_Placed]]] = []
    for i, message in enumerate(messages):
        role, content = str(message.get("role")), message.get("content")
        blocks: list[_Placed] = (
            [
                (f"messages[{i}].content[{j}]", cast("Mapping[str, JSON]", block))
                for j, block in enumerate(content)
            ]
            if isinstance(content, list)
            else [(f"messages[{i}].content", {"type": "text"})]
        )
        if turns and turns[-1][0] == role and role != "system":
            turns[-1][1].extend(blocks)
        else:
            turns.append((role, blocks))
    return turns


def _check_tool_pairs(messages: list[Mapping[str, JSON]]) -> None:
    """Anthropic's pairing rule, which a Chat Completions upstream shares: every ``tool_use``
    id is unique in the request, and the user turn right after an assistant turn that calls
    tools begins with exactly one ``tool_result`` per call (text and images may follow them);
    a ``tool_result`` answers a call of the assistant turn just before it, or none at all.
    The wording is Anthropic's own where it is known."""
    seen: dict[str, str] = {}  # tool_use id -> where it is
    calls: dict[str, str] = {}  # the previous assistant turn's calls, id -> where
    for role, blocks in _turns(messages):
        answered: set[str] = set()
        other = ""  # where the turn's first block that is not a tool_result is
        for at, block in blocks:
            kind = block.get("type")
            if role == "assistant" and kind == "tool_use":
                call_id = str(block["id"])
                if call_id in seen:
                    raise bad(
                        f"{at}.id",
                        f"`tool_use` ids must be unique: {call_id!r} is also {seen[call_id]}",
                    )
                seen[call_id] = f"{at}.id"
            elif kind == "tool_result":
                call_id = str(block["tool_use_id"])
                if call_id not in calls:
                    raise bad(
                        f"{at}.tool_use_id",
                        f"unexpected `tool_use_id` found in `tool_result` blocks: {call_id}. "
                        "Each `tool_result` block must have a corresponding `tool_use` block "
                        "in the previous message.",
                    )
                if call_id in answered:
                    raise bad(
                        f"{at}.tool_use_id",
                        "each tool_use must have a single result. Found multiple "
                        f"`tool_result` blocks with id: {call_id}",
                    )
                if other:
                    raise bad(
                        at,
                        f"a tool_result must come before any other content of its turn "
                        f"({other} is before it): the message after tool_use blocks begins "
                        "with their tool_result blocks, and text may follow them",
                    )
                answered.add(call_id)
            elif not other:
                other = at
        missing = [call_id for call_id in calls if call_id not in answered]
        if missing:
            raise bad(
                calls[missing[0]],
                "`tool_use` ids were found without `tool_result` blocks immediately after: "
                f"{', '.join(missing)}. Each `tool_use` block must have a corresponding "
                "`tool_result` block in the next message.",
            )
        calls = (
            {str(b["id"]): f"{at}.id" for at, b in blocks if b.get("type") == "tool_use"}
            if role == "assistant"
            else {}
        )


def _tool_names(tools: list[JSON]) -> frozenset[str]:
    """The names of the chat function tools ``_tools`` built."""
    names: set[str] = set()
    for tool in tools:
        function = cast("Mapping[str, JSON]", tool)["function"]
        names.add(str(cast("Mapping[str, JSON]", function)["name"]))
    return frozenset(names)


def _tools(tools: JSON) -> list[JSON]:
    """Custom tools as chat function tools (a ``cache_control`` mark on the tool object, where
    OpenRouter and LiteLLM read it); a server tool (``web_search_...``, ``bash_...``,
    ``text_editor_...``, ``computer_...``) is a 400 naming its ``type``."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise bad("tools", "expected an array of tools")
    out: list[JSON] = []
    named: dict[str, str] = {}  # name -> where
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
        if name in named:
            raise bad(f"{where}.name", f"Tool names must be unique: {name!r} is also {named[name]}")
        named[name] = f"{where}.name"
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
        out.append(_marked({"type": "function", "function": function}, tool))
    return out


def _tool_choice(choice: JSON, chat: dict[str, JSON], *, names: frozenset[str]) -> None:
    """``tool_choice`` as Chat Completions spells it: auto, any (required), a named tool (one
    of ``names``, the tools'), none; ``disable_parallel_tool_use`` as
    ``parallel_tool_calls: false``."""
    has_tools = bool(names)
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
        if names and name not in names:
            raise bad("tool_choice.name", f"no tool named {name!r} in tools")
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
