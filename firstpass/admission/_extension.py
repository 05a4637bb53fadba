"""The request's ``firstpass`` object: tests, setup, entry point, mode, task id, probe inputs,
listed checks, context, evidence. Every API dialect carries the same object, so each parses it
here (``parse_extension``); it never goes upstream, so hidden tests never reach a model.

Every refusal is a ``RequestError`` naming the offending parameter (``firstpass.tests.hidden``).
The listed checks are only taken here as sent; ``with_listed_checks`` builds them off the event
loop.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from firstpass._json import JSON
from firstpass.admission._request import MODES, SpecParser, bad
from firstpass.checks import CheckRequest
from firstpass.config import RequestMode
from firstpass.errors import RequestError, SpecError
from firstpass.pipeline import Checks
from firstpass.sandbox import TestSpec

__all__ = ["FIRSTPASS_KEYS", "MAX_PROBE_INPUTS", "Extension", "parse_extension"]

FIRSTPASS_KEYS = frozenset(
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
#: at most this many request-supplied probe inputs, nested at most this deep
MAX_PROBE_INPUTS = 64
_MAX_PROBE_DEPTH = 32


@dataclass(frozen=True, kw_only=True, slots=True)
class Extension:
    """The ``firstpass`` object, validated."""

    mode: RequestMode | None
    mode_param: str
    task_id: str | None
    checks: Checks
    #: ``firstpass.checks`` as sent (None: none)
    listed_checks: JSON


def parse_extension(
    raw: JSON,
    *,
    messages: Sequence[Mapping[str, object]],
    header_mode: str | None,
    parse_spec: SpecParser,
) -> Extension:
    """Validate the ``firstpass`` object (None: absent); ``X-Firstpass-Mode`` (``header_mode``)
    wins over its ``mode``. ``messages`` are what its listed checks see of the request."""
    fp: JSON = {} if raw is None else raw
    if not isinstance(fp, Mapping):
        raise bad("firstpass", "expected an object")
    unknown = set(fp) - FIRSTPASS_KEYS
    if unknown:
        raise bad(
            f"firstpass.{sorted(unknown)[0]}",
            f"unknown key (known: {', '.join(sorted(FIRSTPASS_KEYS))})",
        )
    mode = header_mode if header_mode is not None else fp.get("mode")
    mode_param = "X-Firstpass-Mode" if header_mode is not None else "firstpass.mode"
    if mode is not None and mode not in MODES:
        raise bad(mode_param, f"unknown mode {mode!r} (use one of {', '.join(MODES)})")
    task_id = fp.get("task_id")
    if task_id is not None and not isinstance(task_id, str):
        raise bad("firstpass.task_id", "expected a string")
    return Extension(
        mode=cast("RequestMode | None", mode),
        mode_param=mode_param,
        task_id=task_id,
        checks=_parse_checks(fp, parse_spec, messages),
        listed_checks=fp.get("checks"),
    )


def _parse_checks(
    fp: Mapping[str, JSON], parse_spec: SpecParser, messages: Sequence[Mapping[str, object]]
) -> Checks:
    """The request's tests and what its checks see of it; its listed checks are built later,
    off the event loop (``with_listed_checks``)."""
    request = CheckRequest.from_messages(
        messages, _context(fp.get("context")), _evidence(fp.get("evidence"))
    )
    return dataclasses.replace(_parse_tests(fp, parse_spec), request=request)


def _evidence(raw: JSON) -> tuple[dict[str, JSON], ...]:
    """``firstpass.evidence``: the SQL an analytics answer stands on (``sql_evidence`` checks
    read it), each ``{sql, columns, rows, elapsed_ms, truncated}``. Only its outer shape is
    checked here, on the event loop; the items are checked off it (``with_listed_checks``), so
    a malformed one is still a 400 naming it."""
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(isinstance(item, Mapping) for item in raw):
        raise bad("firstpass.evidence", "expected a list of {sql, columns, rows, ...} objects")
    return tuple(cast("list[dict[str, JSON]]", raw))  # every item is an object: checked above


def _context(raw: JSON) -> tuple[str, ...]:
    """``firstpass.context``: the retrieved passages the answer should stay close to."""
    if raw is None:
        return ()
    if isinstance(raw, str):
        return (raw,)
    if not isinstance(raw, list) or not all(isinstance(c, str) for c in raw):
        raise bad("firstpass.context", "expected a string or an array of strings")
    return tuple(cast("list[str]", raw))  # every item is a string: checked above


def _parse_tests(fp: Mapping[str, JSON], parse_spec: SpecParser) -> Checks:
    tests = fp.get("tests")
    if tests is None:
        return Checks(visible=None, hidden=None, n_visible=0, n_hidden=0)
    if isinstance(tests, list):  # shorthand: a bare list is the visible tests
        tests = {"visible": tests}
    if not isinstance(tests, Mapping):
        raise bad("firstpass.tests", 'expected an object {"visible": ..., "hidden": ...}')
    unknown = set(tests) - {"visible", "hidden"}
    if unknown:
        raise bad(
            f"firstpass.tests.{sorted(unknown)[0]}", 'unknown key (use "visible" or "hidden")'
        )
    setup = fp.get("setup")
    entry_point = fp.get("entry_point")
    if setup is not None and not isinstance(setup, str):
        raise bad("firstpass.setup", "expected a string of Python code")
    if entry_point is not None and (
        not isinstance(entry_point, str) or not entry_point.isidentifier()
    ):
        raise bad("firstpass.entry_point", "expected a Python identifier")
    specs: dict[str, TestSpec | None] = {}
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


def _probe_inputs(raw: JSON) -> tuple[tuple[JSON, ...], ...]:
    """``firstpass.probe_inputs``: a list of argument lists (``[[1, 2], [[3], "x"]]``)."""
    if raw is None:
        return ()
    where = "firstpass.probe_inputs"
    if not isinstance(raw, list):
        raise bad(where, "expected an array of argument arrays, e.g. [[1, 2], [3, 4]]")
    if len(raw) > MAX_PROBE_INPUTS:
        raise bad(where, f"at most {MAX_PROBE_INPUTS} inputs, got {len(raw)}")
    out = []
    for i, args in enumerate(raw):
        if not isinstance(args, list):
            raise bad(f"{where}[{i}]", "expected an array of positional arguments")
        if _depth(args) > _MAX_PROBE_DEPTH:
            raise bad(f"{where}[{i}]", f"nested more than {_MAX_PROBE_DEPTH} levels deep")
        out.append(tuple(args))
    return tuple(out)


def _depth(value: JSON) -> int:
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


def _count(spec: TestSpec | None) -> int:
    if spec is None:
        return 0
    return int(
        getattr(spec, "n_tests", None)
        or len(getattr(spec, "asserts", ()) or getattr(spec, "cases", ()))
    )
