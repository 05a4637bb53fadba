"""The Chat Completions dialect: validate a body and split it into what goes upstream and what
stays here (a ``ChatRequest``).

The ``firstpass`` object is removed before anything goes upstream (``_extension``). Every
refusal is a ``RequestError`` naming the offending parameter the way OpenAI does
(``messages[1].role``, ``firstpass.tests.hidden``).

Python's ``json`` accepts ``NaN``, ``Infinity`` and ``1e400`` (an infinite float), which no
JSON peer does: the numeric sampling fields are checked for type and range as OpenAI documents
them (``max_tokens``, ``seed``, ``n`` integers, never ``1.5`` or ``true``), and nothing that
would be forwarded may hold a non-finite number anywhere (``tools[0].function.parameters...``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeAlias, cast

from firstpass._json import JSON
from firstpass._messages import last_user_text
from firstpass.admission._extension import parse_extension
from firstpass.admission._request import ChatRequest, SpecParser, bad
from firstpass.errors import RequestError
from firstpass.providers import prompt_sha256

__all__ = ["check_finite", "parse_chat_body"]

#: where a value sits in the body: (its parent's node, None at the top; its key or index)
_Node: TypeAlias = tuple["_Node | None", str | int]

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


def _check_messages(messages: JSON) -> list[dict[str, JSON]]:
    """``messages``, checked: a non-empty array of objects, each with a known ``role``."""
    if not isinstance(messages, list) or not messages:
        raise bad("messages", "expected a non-empty array of messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise bad(where, "expected an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:  # a list or object is unhashable
            raise bad(f"{where}.role", f"expected one of {', '.join(sorted(_ROLES))}")
        content = message.get("content")
        if content is None and role == "assistant":
            continue
        if not isinstance(content, str | list):
            raise bad(f"{where}.content", "expected a string or an array of content parts")
    # every item is a Mapping (checked above), and a JSON object is a dict
    return cast("list[dict[str, JSON]]", messages)


#: keys of the body that are not forwarded upstream as they are
_NOT_FORWARDED = frozenset({"firstpass", "model", "stream", "stream_options", "n"})
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1
#: number fields OpenAI documents, with their ranges: (lo, hi)
_NUMBERS: dict[str, tuple[float, float]] = {
    "temperature": (0, 2),
    "top_p": (0, 1),
    "presence_penalty": (-2, 2),
    "frequency_penalty": (-2, 2),
}
#: integer fields OpenAI documents (``n`` is checked on its own: Firstpass uses it)
_INTEGERS: dict[str, tuple[int, int]] = {
    "max_tokens": (1, _INT64_MAX),
    "max_completion_tokens": (1, _INT64_MAX),
    "seed": (_INT64_MIN, _INT64_MAX),
    "top_logprobs": (0, 20),
}


def _shown(value: object) -> str:
    """What the client sent, in JSON's words, short: ``NaN``, ``1.5``, ``true``, ``a string``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if value != value else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= 24 else f"a number of {len(text)} characters"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, Mapping) else type(value).__name__


def _range(lo: float, hi: float) -> str:
    if hi >= _INT64_MAX:
        return f" >= {lo:g}" if lo > _INT64_MIN else ""
    return f" between {lo:g} and {hi:g}"


def _number(body: Mapping[str, JSON], key: str, lo: float, hi: float) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise bad(key, f"expected a number between {lo:g} and {hi:g}, got {_shown(value)}")


def _integer(body: Mapping[str, JSON], key: str, lo: int, hi: int) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise bad(key, f"expected an integer{_range(lo, hi)}, got {_shown(value)}")


def _logit_bias(value: JSON) -> None:
    """``logit_bias``: token ids (as strings) to a bias between −100 and 100."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise bad("logit_bias", f"expected an object of token id -> bias, got {_shown(value)}")
    for token, bias in value.items():
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise bad(
                f"logit_bias.{token}", f"expected a number between -100 and 100, got {_shown(bias)}"
            )


def check_finite(body: Mapping[str, JSON]) -> None:
    """Refuse a non-finite number anywhere in what goes upstream, naming where it is.

    Walks without recursion; paths are spelled out only for the number found.
    """
    # a node is (parent node or None, key or index): the path is built only when needed
    stack: list[tuple[JSON, _Node]] = [
        (v, (None, k)) for k, v in reversed(list(body.items())) if k not in _NOT_FORWARDED
    ]
    while stack:
        value, node = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                raise bad(
                    _path(node),
                    f"{_shown(value)} is not a JSON number; send a finite number",
                )
        elif isinstance(value, list):
            stack.extend((v, (node, i)) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, Mapping):
            stack.extend((v, (node, k)) for k, v in reversed(list(value.items())))


def _path(node: _Node | None) -> str:
    parts: list[str] = []
    while node is not None:
        node, key = node
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".")


def parse_chat_body(body: JSON, *, header_mode: str | None, parse_spec: SpecParser) -> ChatRequest:
    """Validate ``body`` (already JSON-decoded) and split off the ``firstpass`` object.

    ``parse_spec`` is the sandbox's spec parser, passed in so this module stays free of the
    sandbox import (and testable on its own); ``header_mode`` is ``X-Firstpass-Mode``.
    """
    try:
        return _parse(body, header_mode=header_mode, parse_spec=parse_spec)
    except RecursionError:  # tests or messages nested too deeply to parse
        raise RequestError(
            "the request nests too deeply to be a chat request", code="invalid_json"
        ) from None


def _parse(body: JSON, *, header_mode: str | None, parse_spec: SpecParser) -> ChatRequest:
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object", code="invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model", "expected a non-empty string", code="missing_model")
    messages = _check_messages(body.get("messages"))
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream", "expected true or false")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, Mapping):
        raise bad("stream_options", "expected an object")
    include_usage = bool(stream_options and stream_options.get("include_usage"))
    n = body.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
        raise bad("n", f"expected an integer between 1 and 128, got {_shown(n)}")
    for key, (lo, hi) in _NUMBERS.items():
        _number(body, key, lo, hi)
    for key, (ilo, ihi) in _INTEGERS.items():
        _integer(body, key, ilo, ihi)
    _logit_bias(body.get("logit_bias"))
    check_finite(body)
    fp = parse_extension(
        body.get("firstpass"), messages=messages, header_mode=header_mode, parse_spec=parse_spec
    )

    upstream = {k: v for k, v in body.items() if k not in _NOT_FORWARDED}
    if n != 1:
        upstream["n"] = n
    digest = prompt_sha256(body) or prompt_sha256({"messages": [{"role": "user", "content": ""}]})
    return ChatRequest(
        model=model,
        upstream_body=upstream,
        stream=stream,
        include_usage=include_usage,
        n=n,
        mode=fp.mode,
        mode_param=fp.mode_param,
        checks=fp.checks,
        listed_checks=fp.listed_checks,
        task_id=fp.task_id,
        prompt_sha256=str(digest),
        n_messages=len(messages),
        prompt_text=last_user_text(messages) or "",
    )
