"""Validate a chat-completions body and split it into what goes upstream and what stays here.

The ``firstpass`` object (tests, setup, entry point, mode, task id) is removed before anything
goes upstream: hidden tests never reach a model. Every refusal is a ``RequestError`` naming the
offending parameter the way OpenAI does (``messages[1].role``, ``firstpass.tests.hidden``).

Python's ``json`` accepts ``NaN``, ``Infinity`` and ``1e400`` (an infinite float), which no
JSON peer does: the numeric sampling fields are checked for type and range as OpenAI documents
them (``max_tokens``, ``seed``, ``n`` integers, never ``1.5`` or ``true``), and nothing that
would be forwarded may hold a non-finite number anywhere (``tools[0].function.parameters...``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from firstpass.checks import (
    Check,
    CheckRequest,
    build_check,
    field_path,
    off_loop,
    parse_checks,
    request_patterns_problem,
)
from firstpass.config._model import REQUEST_MODES
from firstpass.errors import CheckSpecError, RequestError, SpecError
from firstpass.pipeline import Checks
from firstpass.providers import message_text, prompt_sha256

__all__ = ["MAX_PROBE_INPUTS", "MODES", "ChatRequest", "parse_chat_body"]

#: request modes: the plain cascade, the elastic policy in shadow or enforce, or no checks at all
MODES = REQUEST_MODES

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
_FIRSTPASS_KEYS = frozenset(
    {
        "tests",
        "setup",
        "entry_point",
        "mode",
        "task_id",
        "probe_inputs",
        "checks",
        "context",
        "evidence",
    }
)
#: at most this many checks a request may add
MAX_REQUEST_CHECKS = 32
#: at most this many request-supplied probe inputs, nested at most this deep
MAX_PROBE_INPUTS = 64
_MAX_PROBE_DEPTH = 32


@dataclass(frozen=True, kw_only=True, slots=True)
class ChatRequest:
    """A validated request: the upstream body plus everything Firstpass keeps for itself."""

    model: str
    upstream_body: dict[str, Any]  # without `firstpass`, `model`, `stream`, `stream_options`
    stream: bool
    include_usage: bool
    n: int
    mode: str | None  # None: the route's default
    mode_param: str = "firstpass.mode"  # where the mode came from, for error messages
    checks: Checks
    #: ``firstpass.checks`` as sent; ``with_listed_checks`` builds it off the event loop
    listed_checks: Any = None
    task_id: str | None
    prompt_sha256: str
    n_messages: int
    prompt_text: str


def _bad(param: str, message: str, code: str | None = None) -> RequestError:
    return RequestError(f"{param}: {message}", param=param, code=code or "invalid_value")


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise _bad("messages", "expected a non-empty array of messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, Mapping):
            raise _bad(where, "expected an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in _ROLES:  # a list or object is unhashable
            raise _bad(f"{where}.role", f"expected one of {', '.join(sorted(_ROLES))}")
        content = message.get("content")
        if content is None and role == "assistant":
            continue
        if not isinstance(content, str | list):
            raise _bad(f"{where}.content", "expected a string or an array of content parts")


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


def _shown(value: Any) -> str:
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


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
        raise _bad(key, f"expected a number between {lo:g} and {hi:g}, got {_shown(value)}")


def _integer(body: Mapping[str, Any], key: str, lo: int, hi: int) -> None:
    value = body.get(key)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
        raise _bad(key, f"expected an integer{_range(lo, hi)}, got {_shown(value)}")


def _logit_bias(value: Any) -> None:
    """``logit_bias``: token ids (as strings) to a bias between −100 and 100."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise _bad("logit_bias", f"expected an object of token id -> bias, got {_shown(value)}")
    for token, bias in value.items():
        if isinstance(bias, bool) or not isinstance(bias, int | float) or not -100 <= bias <= 100:
            raise _bad(
                f"logit_bias.{token}", f"expected a number between -100 and 100, got {_shown(bias)}"
            )


def _check_finite(body: Mapping[str, Any]) -> None:
    """Refuse a non-finite number anywhere in what goes upstream, naming where it is.

    Walks without recursion; paths are spelled out only for the number found.
    """
    # a node is (parent node or None, key or index): the path is built only when needed
    stack: list[tuple[Any, tuple[Any, Any]]] = [
        (v, (None, k)) for k, v in reversed(list(body.items())) if k not in _NOT_FORWARDED
    ]
    while stack:
        value, node = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                raise _bad(
                    _path(node),
                    f"{_shown(value)} is not a JSON number; send a finite number",
                )
        elif isinstance(value, list):
            stack.extend((v, (node, i)) for i, v in reversed(list(enumerate(value))))
        elif isinstance(value, Mapping):
            stack.extend((v, (node, k)) for k, v in reversed(list(value.items())))


def _path(node: tuple[Any, Any]) -> str:
    parts: list[str] = []
    while node is not None:
        node, key = node
        parts.append(f"[{key}]" if isinstance(key, int) else f".{key}")
    return "".join(reversed(parts)).lstrip(".")


def _parse_checks(
    fp: Mapping[str, Any], parse_spec: Any, messages: list[Any] | None = None
) -> Checks:
    """The request's tests and what its checks see of it; its listed checks are built later,
    off the event loop (``with_listed_checks``)."""
    request = CheckRequest.from_messages(
        messages or [], _context(fp.get("context")), _evidence(fp.get("evidence"))
    )
    return dataclasses.replace(_parse_tests(fp, parse_spec), request=request)


T = TypeVar("T")

#: the longest a request's listed checks may take to validate and compile
BUILD_TIMEOUT_S = 5.0


async def with_listed_checks(checks: Checks, raw: Any) -> Checks:
    """``checks`` plus the request's ``firstpass.checks``, validated and compiled on the checks'
    own threads (a schema's metaschema check and a pattern's compile are CPU work), and its
    ``firstpass.evidence`` validated there too (up to 32 items of 10,000 rows); a
    ``RequestError`` names what is wrong, or says it took too long."""
    if checks.request.evidence:
        await _off_loop_or_400(_validate_evidence, checks.request.evidence, "firstpass.evidence")
    if raw is None:
        return checks
    listed = await _off_loop_or_400(_listed_checks, raw, "firstpass.checks")
    return dataclasses.replace(
        checks,
        visible_checks=listed["visible"],
        gate_checks=listed["gate"],
        from_request=tuple(c.name for c in (*listed["visible"], *listed["gate"])),
    )


async def _off_loop_or_400(fn: Callable[[Any], T], raw: Any, where: str) -> T:
    """``fn(raw)`` on the checks' threads within ``BUILD_TIMEOUT_S``; too slow or too deeply
    nested is a 400 naming ``where``."""
    try:
        return await asyncio.wait_for(off_loop(fn, raw), BUILD_TIMEOUT_S)
    except TimeoutError:
        raise _bad(where, f"took over {BUILD_TIMEOUT_S:g} s to validate: send less") from None
    except RecursionError:
        raise _bad(where, "nested too deeply") from None


def _evidence(raw: Any) -> tuple[Mapping[str, Any], ...]:
    """``firstpass.evidence``: the SQL an analytics answer stands on (``sql_evidence`` checks
    read it), each ``{sql, columns, rows, elapsed_ms, truncated}``. Only its outer shape is
    checked here, on the event loop; the items are checked off it (``with_listed_checks``), so
    a malformed one is still a 400 naming it."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(item, Mapping) for item in raw):
        raise _bad("firstpass.evidence", "expected a list of {sql, columns, rows, ...} objects")
    return tuple(raw)


def _validate_evidence(raw: tuple[Mapping[str, Any], ...]) -> None:
    from firstpass.checks._sql import evidence_from_list

    try:
        evidence_from_list(list(raw))
    except CheckSpecError as exc:
        field = field_path("firstpass.evidence", exc.field)
        raise RequestError(f"{field}: {exc.message}", param=field, code="invalid_evidence") from exc


def _context(raw: Any) -> tuple[str, ...]:
    """``firstpass.context``: the retrieved passages the answer should stay close to."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
        raise _bad("firstpass.context", "expected a string or an array of strings")
    return tuple(raw)


def _listed_checks(raw: Any) -> dict[str, tuple[Check, ...]]:
    """``firstpass.checks``: ``{"visible": [...], "gate": [...]}``, or a bare list (visible).

    Only the safe kinds (``firstpass.checks.REQUEST_KINDS``); each is named ``request:NAME`` on
    receipts so it never passes for a route's check of the same name.
    """
    out: dict[str, tuple[Check, ...]] = {"visible": (), "gate": ()}
    if raw is None:
        return out
    if isinstance(raw, list):
        raw = {"visible": raw}
    if not isinstance(raw, Mapping):
        raise _bad("firstpass.checks", 'expected {"visible": [...], "gate": [...]} or a list')
    unknown = set(raw) - {"visible", "gate"}
    if unknown:
        raise _bad(
            f"firstpass.checks.{sorted(unknown)[0]}", 'unknown key (use "visible" or "gate")'
        )
    total = sum(len(v) for v in raw.values() if isinstance(v, list))
    if total > MAX_REQUEST_CHECKS:
        raise _bad("firstpass.checks", f"at most {MAX_REQUEST_CHECKS} checks, got {total}")
    costly = request_patterns_problem(raw)
    if costly is not None:  # before anything is compiled: a compile holds the GIL
        raise _bad("firstpass.checks", costly)
    for stage in ("visible", "gate"):
        if raw.get(stage) is None:
            continue
        where = f"firstpass.checks.{stage}"
        try:
            defs = parse_checks(raw[stage], origin="request", prefix="request:")
        except CheckSpecError as exc:
            field = field_path(where, exc.field)
            raise RequestError(
                f"{field}: {exc.message}", param=field, code="invalid_checks"
            ) from exc
        except RecursionError:
            raise _bad(where, "nested too deeply") from None
        out[stage] = tuple(build_check(d) for d in defs)
    return out


def _parse_tests(fp: Mapping[str, Any], parse_spec: Any) -> Checks:
    tests = fp.get("tests")
    if tests is None:
        return Checks(visible=None, hidden=None, n_visible=0, n_hidden=0)
    if isinstance(tests, list):  # shorthand: a bare list is the visible tests
        tests = {"visible": tests}
    if not isinstance(tests, Mapping):
        raise _bad("firstpass.tests", 'expected an object {"visible": ..., "hidden": ...}')
    unknown = set(tests) - {"visible", "hidden"}
    if unknown:
        raise _bad(
            f"firstpass.tests.{sorted(unknown)[0]}", 'unknown key (use "visible" or "hidden")'
        )
    setup = fp.get("setup")
    entry_point = fp.get("entry_point")
    if setup is not None and not isinstance(setup, str):
        raise _bad("firstpass.setup", "expected a string of Python code")
    if entry_point is not None and (
        not isinstance(entry_point, str) or not entry_point.isidentifier()
    ):
        raise _bad("firstpass.entry_point", "expected a Python identifier")
    specs: dict[str, Any] = {}
    for kind in ("visible", "hidden"):
        raw = tests.get(kind)
        if raw is None:
            specs[kind] = None
            continue
        try:
            specs[kind] = parse_spec(raw, setup=setup, entry_point=entry_point)
        except SpecError as exc:
            field = f"firstpass.tests.{kind}" + (f".{exc.field}" if exc.field else "")
            raise RequestError(
                f"{field}: {str(exc).split(': ', 1)[-1]}", param=field, code="invalid_tests"
            ) from exc
    return Checks(
        visible=specs["visible"],
        hidden=specs["hidden"],
        probe_inputs=_probe_inputs(fp.get("probe_inputs")),
        n_visible=_count(specs["visible"]),
        n_hidden=_count(specs["hidden"]),
    )


def _probe_inputs(raw: Any) -> tuple[tuple[Any, ...], ...]:
    """``firstpass.probe_inputs``: a list of argument lists (``[[1, 2], [[3], "x"]]``)."""
    if raw is None:
        return ()
    where = "firstpass.probe_inputs"
    if not isinstance(raw, list):
        raise _bad(where, "expected an array of argument arrays, e.g. [[1, 2], [3, 4]]")
    if len(raw) > MAX_PROBE_INPUTS:
        raise _bad(where, f"at most {MAX_PROBE_INPUTS} inputs, got {len(raw)}")
    out = []
    for i, args in enumerate(raw):
        if not isinstance(args, list):
            raise _bad(f"{where}[{i}]", "expected an array of positional arguments")
        if _depth(args) > _MAX_PROBE_DEPTH:
            raise _bad(f"{where}[{i}]", f"nested more than {_MAX_PROBE_DEPTH} levels deep")
        out.append(tuple(args))
    return tuple(out)


def _depth(value: Any) -> int:
    """Nesting depth of JSON data, without recursion (a hostile body cannot blow the stack)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth > _MAX_PROBE_DEPTH:
            break
        if isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, Mapping):
            stack.extend((v, depth + 1) for v in item.values())
    return deepest


def _count(spec: Any) -> int:
    if spec is None:
        return 0
    return int(
        getattr(spec, "n_tests", None)
        or len(getattr(spec, "asserts", ()) or getattr(spec, "cases", ()))
    )


def parse_chat_body(body: Any, *, header_mode: str | None, parse_spec: Any) -> ChatRequest:
    """Validate ``body`` (already JSON-decoded) and split off the ``firstpass`` object.

    ``parse_spec`` is the sandbox's spec parser, passed in so this module stays free of the
    sandbox import (and testable on its own).
    """
    if not isinstance(body, Mapping):
        raise RequestError("the request body must be a JSON object", code="invalid_body")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "expected a non-empty string", code="missing_model")
    messages: list[Any] = body.get("messages")  # type: ignore[assignment]
    _check_messages(messages)
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _bad("stream", "expected true or false")
    stream_options = body.get("stream_options")
    if stream_options is not None and not isinstance(stream_options, Mapping):
        raise _bad("stream_options", "expected an object")
    include_usage = bool(stream_options and stream_options.get("include_usage"))
    n = body.get("n", 1)
    if n is None:
        n = 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 128:
        raise _bad("n", f"expected an integer between 1 and 128, got {_shown(n)}")
    for key, (lo, hi) in _NUMBERS.items():
        _number(body, key, lo, hi)
    for key, (ilo, ihi) in _INTEGERS.items():
        _integer(body, key, ilo, ihi)
    _logit_bias(body.get("logit_bias"))
    _check_finite(body)

    fp = body.get("firstpass")
    if fp is None:
        fp = {}
    if not isinstance(fp, Mapping):
        raise _bad("firstpass", "expected an object")
    unknown = set(fp) - _FIRSTPASS_KEYS
    if unknown:
        raise _bad(
            f"firstpass.{sorted(unknown)[0]}",
            f"unknown key (known: {', '.join(sorted(_FIRSTPASS_KEYS))})",
        )
    mode = header_mode if header_mode is not None else fp.get("mode")
    mode_param = "X-Firstpass-Mode" if header_mode is not None else "firstpass.mode"
    if mode is not None and mode not in MODES:
        raise _bad(mode_param, f"unknown mode {mode!r} (use one of {', '.join(MODES)})")
    task_id = fp.get("task_id")
    if task_id is not None and not isinstance(task_id, str):
        raise _bad("firstpass.task_id", "expected a string")
    checks = _parse_checks(fp, parse_spec, messages)
    listed = fp.get("checks")
    if (checks.any or listed is not None) and n != 1:
        raise _bad("n", "a verified request returns one answer: n must be 1 when checks are given")

    upstream = {k: v for k, v in body.items() if k not in _NOT_FORWARDED}
    if n != 1:
        upstream["n"] = n
    digest = prompt_sha256(body) or prompt_sha256({"messages": [{"role": "user", "content": ""}]})
    text = next(
        (message_text(m.get("content")) for m in reversed(messages) if m.get("role") == "user"), ""
    )
    return ChatRequest(
        model=model,
        upstream_body=upstream,
        stream=stream,
        include_usage=include_usage,
        n=n,
        mode=mode,
        mode_param=mode_param,
        checks=checks,
        listed_checks=listed,
        task_id=task_id,
        prompt_sha256=str(digest),
        n_messages=len(messages),
        prompt_text=text,
    )
