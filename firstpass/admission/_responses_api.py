"""The OpenAI Responses dialect (``POST /v1/responses``): a Responses body, validated, as the
Chat Completions body it asks for, then parsed like any chat body (``parse_chat_body``).

Translating to one chat body is what makes the dialects one pipeline: the same task sent as
Chat Completions ``messages`` or as Responses ``instructions`` + ``input`` gives the same
messages, so the same prompt hash, checks and verdicts. ``instructions`` becomes the first
``system`` message; a string ``input`` one ``user`` message; ``function_call`` items the
assistant message's ``tool_calls`` (consecutive calls, and the assistant message just before
them, make one message, as Chat Completions has it); ``function_call_output`` items ``tool``
messages. An assistant message of text parts is its one string, as the upstream sent it, so a
response's ``output`` fed back is the same turn (the same body, tokens and cost) as through
Chat Completions; calls and outputs must pair up as a Chat Completions upstream requires.

What a Chat Completions upstream cannot do, or what needs state Firstpass does not keep
(``previous_response_id``, ``conversation``, ``store``, item references, hosted tools), is
refused with a 400 naming the field as the client spelt it (``input[3].type``,
``tools[0].type``), never dropped: docs/api-responses.md lists each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import cast

from firstpass._json import JSON
from firstpass.admission._chat import check_finite, parse_chat_body
from firstpass.admission._request import ChatRequest, SpecParser, bad
from firstpass.errors import RequestError

__all__ = ["parse_responses_body"]

#: request fields read here (each either translated, checked and echoed, or refused below)
_HANDLED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "max_output_tokens",
        "temperature",
        "top_p",
        "text",
        "reasoning",
        "user",
        "safety_identifier",
        "prompt_cache_key",
        "service_tier",
        "metadata",
        "stream",
        "stream_options",
        "firstpass",
        "store",
        "background",
        "include",
        "truncation",
    }
)
#: fields forwarded upstream as they are: Chat Completions has the same field
_SAME = ("parallel_tool_calls", "temperature", "top_p", "user", "safety_identifier")
_SAME_TOO = ("prompt_cache_key", "service_tier", "stream", "firstpass")

#: fields refused when set (not null), and why
_STATEFUL = {
    "previous_response_id": "Firstpass keeps no response state; send the whole conversation "
    "in input",
    "conversation": "Firstpass keeps no conversation state; send the whole conversation in input",
    "prompt": "stored prompts are not resolved by Firstpass; send the prompt's text in "
    "instructions and input",
    "max_tool_calls": "it limits hosted tools, which Firstpass does not run",
    "top_logprobs": "Firstpass returns no log probabilities",
}

_TOO_DEEP = "the request nests too deeply to be a Responses request"
_INT64_MAX = 2**63 - 1
#: string fields forwarded as they are (their values are the upstream's business)
_STRINGS = ("user", "safety_identifier", "prompt_cache_key", "service_tier")
_ROLES = frozenset({"user", "system", "developer", "assistant"})
_TOOL_CHOICES = frozenset({"auto", "none", "required"})
_FUNCTION_KEYS = frozenset({"type", "name", "description", "parameters", "strict"})


def parse_responses_body(
    body: JSON, *, header_mode: str | None, parse_spec: SpecParser
) -> ChatRequest:
    """Validate a Responses body and parse the chat body it asks for, as ``dialect="responses"``.

    ``header_mode`` and ``parse_spec`` as for ``parse_chat_body``; the ``firstpass`` object
    rides at the top level as it does there (the openai SDK: ``extra_body``).
    """
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object", code="invalid_body")
    try:
        chat_body = _chat_body(body)
    except RecursionError:
        raise RequestError(_TOO_DEEP, code="invalid_json") from None
    try:
        chat = parse_chat_body(chat_body, header_mode=header_mode, parse_spec=parse_spec)
    except RequestError as err:
        if err.code != "invalid_json":  # the only one: chat's nesting refusal, in its words
            raise
        raise RequestError(_TOO_DEEP, code="invalid_json") from None
    return dataclasses.replace(chat, dialect="responses")


def _chat_body(body: Mapping[str, JSON]) -> dict[str, JSON]:
    _refuse_unhonoured(body)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "expected a non-empty string", code="missing_model")
    messages: list[JSON] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise bad("instructions", "expected a string")
        messages.append({"role": "system", "content": instructions})
    messages.extend(_input_messages(body.get("input")))
    check_finite(body)
    out: dict[str, JSON] = {"model": model, "messages": messages}
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise bad("parallel_tool_calls", "expected true or false")
    for key in _STRINGS:
        if body.get(key) is not None and not isinstance(body.get(key), str):
            raise bad(key, "expected a string")
    for key in (*_SAME, *_SAME_TOO):
        if body.get(key) is not None:
            out[key] = body[key]
    tools = _tools(body.get("tools"))
    choice = _tool_choice(body.get("tool_choice"), tools)
    if tools:
        out["tools"] = tools
        if choice is not None:
            out["tool_choice"] = choice
    else:
        # without tools there is no call to run in parallel: OpenAI's Responses API accepts
        # the field then, its Chat Completions API refuses it (a 502 here), so it stays here
        out.pop("parallel_tool_calls", None)
    limit = body.get("max_output_tokens")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= _INT64_MAX:
            shown = repr(limit) if len(repr(limit)) <= 24 else f"{len(repr(limit))} characters"
            raise bad("max_output_tokens", f"expected an integer >= 1, got {shown}")
        out["max_completion_tokens"] = limit
    out.update(_text(body.get("text")))
    effort = _reasoning(body.get("reasoning"))
    if effort is not None:
        out["reasoning_effort"] = effort
    _metadata(body.get("metadata"))
    return out


def _refuse_unhonoured(body: Mapping[str, JSON]) -> None:
    """A field Firstpass cannot honour is a 400 naming it, never dropped in silence."""
    for key, why in _STATEFUL.items():
        if body.get(key) is not None:
            raise bad(key, f"not supported: {why}", code="unsupported_parameter")
    if body.get("store") not in (None, False):
        raise bad(
            "store",
            "Firstpass stores no responses (each has a receipt instead); send store: false "
            "or leave it out",
            code="unsupported_parameter",
        )
    if body.get("background") not in (None, False):
        raise bad(
            "background",
            "Firstpass answers in the request (stream: true for events); background responses "
            "need stored state it does not keep",
            code="unsupported_parameter",
        )
    include = body.get("include")
    if include is not None and include != []:
        raise bad(
            "include",
            "Firstpass adds no extra output data (a Chat Completions upstream has none of it); "
            "send an empty list or leave it out",
            code="unsupported_parameter",
        )
    truncation = body.get("truncation")
    if truncation not in (None, "disabled"):
        raise bad(
            "truncation",
            'only "disabled": Firstpass never drops input to fit a context window',
            code="unsupported_parameter",
        )
    options = body.get("stream_options")
    if options is not None and not isinstance(options, Mapping):
        raise bad("stream_options", "expected an object")
    for key, value in body.items():
        if key not in _HANDLED and key not in _STATEFUL and value is not None:
            raise bad(
                key,
                "not supported through Firstpass (docs/api-responses.md lists what is)",
                code="unsupported_parameter",
            )


def _input_messages(raw: JSON) -> list[JSON]:
    """``input`` as chat messages: a string is one user message; items in order."""
    if isinstance(raw, str):
        return [{"role": "user", "content": raw}]
    if not isinstance(raw, list) or not raw:
        raise bad("input", "expected a string or a non-empty array of input items")
    messages: list[JSON] = []
    #: the assistant message that a following function_call item joins (None: none may)
    open_turn: dict[str, JSON] | None = None
    pairing = _Pairing()
    for i, item in enumerate(raw):
        where = f"input[{i}]"
        if not isinstance(item, Mapping):
            raise bad(where, "expected an object")
        kind = item.get("type")
        if kind is None:  # an easy input message has no type; an item reference may have none
            kind = "message" if "role" in item else "item_reference" if "id" in item else None
        if kind == "message":
            message = _message(item, where)
            pairing.close()
            messages.append(message)
            open_turn = message if message["role"] == "assistant" else None
        elif kind == "function_call":
            call = _function_call(item, where)
            if open_turn is None:
                pairing.close()
                open_turn = {"role": "assistant", "content": None}
                messages.append(open_turn)
            pairing.call(call["id"], where)
            calls = open_turn.setdefault("tool_calls", [])
            cast("list[JSON]", calls).append(call)
        elif kind == "function_call_output":
            output = _function_output(item, where)
            pairing.answer(output["tool_call_id"], where)
            messages.append(output)
            open_turn = None
        else:
            raise _unknown_item(kind, where)
    pairing.close()
    return messages


class _Pairing:
    """Each ``function_call`` answered by exactly one ``function_call_output`` before the
    conversation moves on, as a Chat Completions upstream requires of ``tool_calls`` and
    ``tool`` messages (and OpenAI's Responses API of its items): a conversation that breaks
    it is a 400 naming the item here, not the upstream's 400 relayed as a 502."""

    def __init__(self) -> None:
        #: every call id seen, and where its function_call item is
        self.calls: dict[JSON, str] = {}
        #: the current turn's calls still waiting for their outputs
        self.waiting: dict[JSON, str] = {}

    def call(self, call_id: JSON, where: str) -> None:
        if call_id in self.calls:
            raise bad(
                f"{where}.call_id",
                f"call id {call_id!r} is used twice ({self.calls[call_id]} has it too); "
                "each function_call needs its own",
            )
        self.calls[call_id] = self.waiting[call_id] = where

    def answer(self, call_id: JSON, where: str) -> None:
        if call_id not in self.calls:
            raise bad(
                f"{where}.call_id",
                f"no function_call with call id {call_id!r} earlier in input: send the "
                "function_call item before its output",
            )
        if call_id not in self.waiting:
            raise bad(
                f"{where}.call_id",
                f"the function call {call_id!r} ({self.calls[call_id]}) already has its "
                "output: each call takes one, right after its turn",
            )
        del self.waiting[call_id]

    def close(self) -> None:
        """The conversation moves on (or ends): every call of the turn must have its output."""
        for call_id, where in self.waiting.items():
            raise bad(
                f"{where}.call_id",
                f"no tool output found for function call {call_id!r}: send its "
                "function_call_output right after the turn's function_call items",
            )


def _unknown_item(kind: JSON, where: str) -> RequestError:
    if kind == "item_reference":
        return bad(
            f"{where}.type",
            "item references need stored responses, which Firstpass does not keep; send the "
            "item itself",
            code="unsupported_parameter",
        )
    if kind == "reasoning":
        return bad(
            f"{where}.type",
            "reasoning items cannot be forwarded to a Chat Completions upstream; leave them out",
            code="unsupported_parameter",
        )
    if not isinstance(kind, str):
        return bad(f"{where}.type", "expected a string")
    return bad(
        f"{where}.type",
        f"input items of type {kind!r} are not supported (supported: message, function_call, "
        "function_call_output)",
        code="unsupported_parameter",
    )


def _message(item: Mapping[str, JSON], where: str) -> dict[str, JSON]:
    role = item.get("role")
    if not isinstance(role, str) or role not in _ROLES:
        raise bad(f"{where}.role", f"expected one of {', '.join(sorted(_ROLES))}")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise bad(f"{where}.content", "expected a string or an array of content parts")
    parts: list[JSON] = []
    message: dict[str, JSON] = {"role": role, "content": parts}
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, Mapping):
            raise bad(at, "expected an object")
        kind = part.get("type")
        if kind in ("input_text", "output_text"):
            parts.append({"type": "text", "text": _string(part, "text", at)})
        elif kind == "refusal" and role == "assistant":
            message["refusal"] = _string(part, "refusal", at)
        elif kind == "input_image" and role == "user":
            parts.append(_image(part, at))
        elif kind == "input_file" and role == "user":
            parts.append(_file(part, at))
        elif not isinstance(kind, str):
            raise bad(f"{at}.type", "expected a string")
        else:
            raise bad(
                f"{at}.type",
                f"content parts of type {kind!r} are not supported in a {role} message",
                code="unsupported_parameter",
            )
    if role == "assistant":
        # the assistant's turn as the upstream sent it: its text one string (a response's
        # output_text parts), or null beside a refusal, so a fed-back output is the same turn
        texts = [p["text"] for p in parts if isinstance(p, Mapping) and p.get("type") == "text"]
        if len(texts) == len(parts):
            joined = "".join(t for t in texts if isinstance(t, str))
            message["content"] = None if not joined and "refusal" in message else joined
    return message


def _string(obj: Mapping[str, JSON], key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise bad(f"{where}.{key}", "expected a string")
    return value


def _image(part: Mapping[str, JSON], at: str) -> dict[str, JSON]:
    url = part.get("image_url")
    if not isinstance(url, str) or not url:
        if part.get("file_id") is not None:
            raise bad(
                f"{at}.file_id",
                "images by file id have no Chat Completions form; send image_url (a URL or a "
                "data: URL)",
                code="unsupported_parameter",
            )
        raise bad(f"{at}.image_url", "expected a URL or a data: URL")
    image: dict[str, JSON] = {"url": url}
    detail = part.get("detail")
    if detail is not None:
        if detail not in ("auto", "low", "high"):
            raise bad(f"{at}.detail", 'expected "auto", "low" or "high"')
        image["detail"] = detail
    return {"type": "image_url", "image_url": image}


def _file(part: Mapping[str, JSON], at: str) -> dict[str, JSON]:
    if part.get("file_url") is not None:
        raise bad(
            f"{at}.file_url",
            "files by URL have no Chat Completions form; send file_data or file_id",
            code="unsupported_parameter",
        )
    file: dict[str, JSON] = {}
    for key in ("file_data", "file_id", "filename"):
        value = part.get(key)
        if value is not None:
            file[key] = _string(part, key, at)
    if "file_data" not in file and "file_id" not in file:
        raise bad(f"{at}.file_data", "expected file_data or file_id")
    return {"type": "file", "file": file}


def _function_call(item: Mapping[str, JSON], where: str) -> dict[str, JSON]:
    call_id = _string(item, "call_id", where)
    name = _string(item, "name", where)
    arguments = _string(item, "arguments", where)
    if not call_id:
        raise bad(f"{where}.call_id", "expected a non-empty string")
    if not name:
        raise bad(f"{where}.name", "expected a non-empty string")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _function_output(item: Mapping[str, JSON], where: str) -> dict[str, JSON]:
    call_id = _string(item, "call_id", where)
    if not call_id:
        raise bad(f"{where}.call_id", "expected a non-empty string")
    output = item.get("output")
    content: JSON
    if isinstance(output, str):
        content = output
    elif isinstance(output, list):
        texts: list[JSON] = []
        for j, part in enumerate(output):
            at = f"{where}.output[{j}]"
            if not isinstance(part, Mapping) or part.get("type") != "input_text":
                raise bad(
                    f"{at}.type",
                    "a tool's output reaches a Chat Completions upstream as text only: "
                    "input_text parts, or a string",
                    code="unsupported_parameter",
                )
            texts.append({"type": "text", "text": _string(part, "text", at)})
        content = texts
    else:
        raise bad(f"{where}.output", "expected a string or an array of input_text parts")
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def _tools(raw: JSON) -> list[JSON]:
    """Function tools as Chat Completions has them; any other tool type is refused."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise bad("tools", "expected an array of tools")
    tools: list[JSON] = []
    names: set[str] = set()
    for i, tool in enumerate(raw):
        where = f"tools[{i}]"
        if not isinstance(tool, Mapping):
            raise bad(where, "expected an object")
        kind = tool.get("type")
        if kind != "function":
            if not isinstance(kind, str):
                raise bad(f"{where}.type", "expected a string")
            raise bad(
                f"{where}.type",
                f"{kind!r} tools cannot pass through Firstpass: hosted tools run on OpenAI's "
                'side, and only "function" tools (which the client runs) reach a Chat '
                "Completions upstream",
                code="unsupported_parameter",
            )
        for key, value in tool.items():
            if key not in _FUNCTION_KEYS and value is not None:
                raise bad(
                    f"{where}.{key}",
                    "not supported through Firstpass (a function tool takes name, "
                    "description, parameters, strict)",
                    code="unsupported_parameter",
                )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise bad(f"{where}.name", "expected a non-empty string")
        if name in names:
            raise bad(f"{where}.name", f"two tools are named {name!r}; names must be unique")
        names.add(name)
        function: dict[str, JSON] = {"name": name}
        description = tool.get("description")
        if description is not None:
            function["description"] = _string(tool, "description", where)
        parameters = tool.get("parameters")
        if parameters is not None:
            if not isinstance(parameters, Mapping):
                raise bad(f"{where}.parameters", "expected a JSON schema object")
            function["parameters"] = parameters
        strict = tool.get("strict")
        if strict is not None:
            if not isinstance(strict, bool):
                raise bad(f"{where}.strict", "expected true or false")
            function["strict"] = strict
        tools.append({"type": "function", "function": function})
    return tools


def _tool_choice(raw: JSON, tools: list[JSON]) -> JSON:
    """``tool_choice`` as Chat Completions has it. Without tools, ``"auto"`` and ``"none"``
    mean what no tools mean (and a Chat Completions upstream refuses the field then), while
    ``"required"`` or a named function ask for a call no tool can make: refused."""
    if raw is None:
        return None
    if isinstance(raw, str):
        if raw not in _TOOL_CHOICES:
            raise bad("tool_choice", 'expected "auto", "none", "required" or a function')
        if raw == "required" and not tools:
            raise bad("tool_choice", '"required" asks for a tool call; the request has no tools')
        return raw
    if not isinstance(raw, Mapping):
        raise bad("tool_choice", 'expected "auto", "none", "required" or a function')
    if raw.get("type") != "function":
        raise bad(
            "tool_choice.type",
            'only {"type": "function", "name": ...} passes through Firstpass (hosted tools '
            "are not run)",
            code="unsupported_parameter",
        )
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise bad("tool_choice.name", "expected a non-empty string")
    if name not in _tool_names(tools):
        raise bad("tool_choice.name", f"no function tool named {name!r} in tools")
    return {"type": "function", "function": {"name": name}}


def _tool_names(tools: list[JSON]) -> set[str]:
    names: set[str] = set()
    for tool in tools:
        function = tool.get("function") if isinstance(tool, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if isinstance(name, str):
            names.add(name)
    return names


def _text(raw: JSON) -> dict[str, JSON]:
    """``text``: its format as ``response_format``, its verbosity as ``verbosity``."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise bad("text", "expected an object")
    out: dict[str, JSON] = {}
    for key in raw:
        if key not in ("format", "verbosity") and raw[key] is not None:
            raise bad(f"text.{key}", "not supported through Firstpass")
    verbosity = raw.get("verbosity")
    if verbosity is not None:
        if verbosity not in ("low", "medium", "high"):
            raise bad("text.verbosity", 'expected "low", "medium" or "high"')
        out["verbosity"] = verbosity
    form = raw.get("format")
    if form is None:
        return out
    if not isinstance(form, Mapping):
        raise bad("text.format", "expected an object")
    kind = form.get("type")
    if kind == "text":
        return out
    if kind == "json_object":
        out["response_format"] = {"type": "json_object"}
        return out
    if kind != "json_schema":
        raise bad("text.format.type", 'expected "text", "json_object" or "json_schema"')
    name = form.get("name")
    if not isinstance(name, str) or not name:
        raise bad("text.format.name", "expected a non-empty string")
    schema = form.get("schema")
    if not isinstance(schema, Mapping):
        raise bad("text.format.schema", "expected a JSON schema object")
    spec: dict[str, JSON] = {"name": name, "schema": schema}
    if form.get("description") is not None:
        spec["description"] = _string(form, "description", "text.format")
    strict = form.get("strict")
    if strict is not None:
        if not isinstance(strict, bool):
            raise bad("text.format.strict", "expected true or false")
        spec["strict"] = strict
    out["response_format"] = {"type": "json_schema", "json_schema": spec}
    return out


def _reasoning(raw: JSON) -> str | None:
    """``reasoning.effort`` as Chat Completions' ``reasoning_effort``; summaries are refused
    (a Chat Completions upstream returns none)."""
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise bad("reasoning", "expected an object")
    for key in raw:
        if key != "effort" and raw[key] is not None:
            raise bad(
                f"reasoning.{key}",
                "reasoning summaries are not available through a Chat Completions upstream; "
                "only reasoning.effort is forwarded",
                code="unsupported_parameter",
            )
    effort = raw.get("effort")
    if effort is None:
        return None
    if not isinstance(effort, str):
        raise bad("reasoning.effort", "expected a string")
    return effort


def _metadata(raw: JSON) -> None:
    """``metadata``: up to 16 string pairs, echoed on the response and not forwarded."""
    if raw is None:
        return
    if not isinstance(raw, Mapping):
        raise bad("metadata", "expected an object of string keys to string values")
    if len(raw) > 16:
        raise bad("metadata", f"at most 16 pairs, got {len(raw)}")
    for key, value in raw.items():
        if len(key) > 64:
            raise bad(f"metadata.{key[:64]}", "a key has at most 64 characters")
        if not isinstance(value, str) or len(value) > 512:
            raise bad(f"metadata.{key}", "expected a string of at most 512 characters")
