"""The recorded work an analytics answer stands on: each SQL query and what it returned.

It comes from the conversation the way agent harnesses send it (an assistant's ``tool_calls``
to the configured SQL tool, its argument holding the SQL, and the ``tool`` message answering it
with the result), or from an explicit list (``firstpass.evidence``, ``firstpass check
--evidence``): ``{"sql", "columns", "rows", "elapsed_ms", "truncated"}``.

The list may also carry work beside the SQL that supports numbers (``Support``): a Python run's
output, ``{"kind": "python", "code", "output"}``, and a summary, ``{"kind": "summary",
"text"}``. Their numbers count as held; nothing reruns them (the harness's word is taken).
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from firstpass.errors import CheckSpecError

__all__ = [
    "Evidence",
    "Support",
    "evidence_from_list",
    "evidence_from_messages",
    "support_from_list",
]

#: evidence items one answer may carry, and rows kept per item
MAX_ITEMS = 32
MAX_ROWS = 10_000

Cell = str | int | float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class Evidence:
    """One query and its recorded result (``rows`` None: the result was not recorded)."""

    sql: str
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[Cell, ...], ...] | None = None
    elapsed_ms: float | None = None
    truncated: bool = False


#: support kinds and the field holding each one's text
SUPPORT_TEXT = {"python": "output", "summary": "text"}
#: characters kept of one support item's text
MAX_SUPPORT_CHARS = 100_000


@dataclass(frozen=True, kw_only=True, slots=True)
class Support:
    """Work beside the SQL that may support the answer's numbers (a Python run's output, a
    summary): its numbers count as held, and it is never rerun. ``where``: its place in the
    list (``[2]``)."""

    kind: str
    text: str
    where: str


#: the largest run time a float holds: an integer past it would fail to convert (OverflowError)
MAX_ELAPSED_MS = sys.float_info.max


def _cell(value: object) -> Cell:
    if value is None or isinstance(value, str | int):
        return value  # bool is an int
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, bytes | bytearray):
        return bytes(value).hex()
    try:
        return json.dumps(value, sort_keys=True, default=str)  # nested data: its JSON text
    except (TypeError, ValueError):
        return str(value)


def _item(raw: object, where: str) -> Evidence:
    if not isinstance(raw, Mapping):
        raise CheckSpecError(
            where, 'expected {"sql", "columns", "rows", "elapsed_ms", "truncated"}'
        )
    sql = raw.get("sql")
    if not isinstance(sql, str) or not sql.strip():
        raise CheckSpecError(f"{where}.sql", "expected the query's SQL text")
    columns = raw.get("columns", [])
    if not isinstance(columns, list) or not all(isinstance(c, str) for c in columns):
        raise CheckSpecError(f"{where}.columns", "expected a list of column names")
    rows = raw.get("rows")
    parsed: tuple[tuple[Cell, ...], ...] | None = None
    if rows is not None:
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise CheckSpecError(f"{where}.rows", "expected a list of rows (lists of cells)")
        parsed = tuple(tuple(_cell(c) for c in r) for r in rows[:MAX_ROWS])
    elapsed = raw.get("elapsed_ms")
    if elapsed is not None and (
        isinstance(elapsed, bool)
        or not isinstance(elapsed, int | float)
        or not 0 <= elapsed <= MAX_ELAPSED_MS  # NaN, infinity, an integer past a float
    ):
        raise CheckSpecError(f"{where}.elapsed_ms", "expected a number of milliseconds")
    truncated = raw.get("truncated", False)
    if not isinstance(truncated, bool):
        raise CheckSpecError(f"{where}.truncated", "expected true or false")
    return Evidence(
        sql=sql,
        columns=tuple(columns),
        rows=parsed,
        elapsed_ms=None if elapsed is None else float(elapsed),
        truncated=truncated or (rows is not None and len(rows) > MAX_ROWS),
    )


def _support(raw: Mapping[str, object], where: str) -> Support | None:
    """A support item, or None for an SQL item (no ``kind``, or ``"sql"``)."""
    kind = raw.get("kind", "sql")
    if kind == "sql":
        return None
    if not isinstance(kind, str) or kind not in SUPPORT_TEXT:
        raise CheckSpecError(
            f"{where}.kind", f'expected "sql", "python" or "summary", got {kind!r}'
        )
    field = SUPPORT_TEXT[kind]
    text = raw.get(field)
    if not isinstance(text, str):
        raise CheckSpecError(f"{where}.{field}", f"expected the {kind} item's {field} as text")
    code = raw.get("code")
    if kind == "python" and code is not None and not isinstance(code, str):
        raise CheckSpecError(f"{where}.code", "expected the Python code as text")
    return Support(kind=kind, text=text[:MAX_SUPPORT_CHARS], where=where)


def _checked_list(raw: object) -> list[tuple[str, Evidence | Support]]:
    if not isinstance(raw, list):
        raise CheckSpecError("", "expected a list of {sql, columns, rows, elapsed_ms, truncated}")
    if len(raw) > MAX_ITEMS:
        raise CheckSpecError("", f"at most {MAX_ITEMS} evidence items, got {len(raw)}")
    out: list[tuple[str, Evidence | Support]] = []
    for i, item in enumerate(raw):
        where = f"[{i}]"
        support = _support(item, where) if isinstance(item, Mapping) else None
        out.append((where, support if support is not None else _item(item, where)))
    return out


def evidence_from_list(raw: object) -> tuple[Evidence, ...]:
    """An explicit evidence list's SQL items (its support items are checked, and left to
    ``support_from_list``); ``CheckSpecError`` names the bad item (``[2].rows``)."""
    return tuple(e for _, e in _checked_list(raw) if isinstance(e, Evidence))


def support_from_list(raw: object) -> tuple[Support, ...]:
    """An explicit evidence list's support items (Python output, summaries)."""
    return tuple(e for _, e in _checked_list(raw) if isinstance(e, Support))


def _arguments(call: Mapping[str, object]) -> Mapping[str, object] | None:
    function = call.get("function")
    if not isinstance(function, Mapping):
        return None
    args = function.get("arguments")
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    return args if isinstance(args, Mapping) else None


def evidence_from_messages(
    messages: Sequence[Mapping[str, object]], *, tool: str, argument: str = "sql"
) -> tuple[Evidence, ...]:
    """Every call to ``tool`` in the conversation, with the ``tool`` message that answered it
    (matched by ``tool_call_id``). A result is used when it is JSON with ``columns``/``rows``
    (and optionally ``elapsed_ms``, ``truncated``); otherwise the query counts without rows."""
    calls: dict[str, str] = {}
    order: list[str] = []
    results: dict[str, Mapping[str, object]] = {}
    for message in messages:
        if not isinstance(message, Mapping):
            continue
        tool_calls = message.get("tool_calls")
        if message.get("role") == "assistant" and isinstance(tool_calls, list):
            for call in tool_calls:
                if not isinstance(call, Mapping):
                    continue
                function = call.get("function")
                name = function.get("name") if isinstance(function, Mapping) else None
                args = _arguments(call)
                sql = args.get(argument) if args is not None else None
                call_id = call.get("id")
                if name == tool and isinstance(sql, str) and isinstance(call_id, str):
                    calls[call_id] = sql
                    order.append(call_id)
        elif message.get("role") == "tool" and isinstance(
            answered := message.get("tool_call_id"), str
        ):
            content = message.get("content")
            try:
                doc = json.loads(content) if isinstance(content, str) else None
            except ValueError:
                doc = None
            if isinstance(doc, Mapping):
                results[answered] = doc
    out: list[Evidence] = []
    for call_id in order[:MAX_ITEMS]:
        doc = results.get(call_id, {})
        try:
            out.append(_item({**doc, "sql": calls[call_id]}, call_id))
        except CheckSpecError:
            out.append(Evidence(sql=calls[call_id]))  # a result we cannot read: no rows
    return tuple(out)
