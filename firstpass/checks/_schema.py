"""``json_schema``: the answer is JSON, and valid against a JSON Schema.

Validation is the ``jsonschema`` library's, full draft 2020-12 by default and the draft the
schema's ``$schema`` names otherwise (4, 6, 7, 2019-09, 2020-12). The schema is checked against
its metaschema when the check is built, so a schema that is not one is refused at config load
or with a 400, never at the first answer. Remote ``$ref``s are never fetched (a check must not
reach the network); one that is not in the schema itself makes the check abstain.

The answer's JSON is the whole answer when it parses, else the first fenced block (```json or
```) that does. Patterns (``pattern``, ``patternProperties``) may come from a request, so they
run on the ``regex`` engine with a time limit, and validation runs off the event loop.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import referencing.exceptions
import regex
from jsonschema import validators
from jsonschema.protocols import Validator

from firstpass._json import JSON
from firstpass.checks._base import CheckRequest, Options
from firstpass.checks._offload import off_loop
from firstpass.checks._patterns import REGEX_TIMEOUT_S, compile_pattern, install_in_jsonschema
from firstpass.checks._result import CheckResult
from firstpass.errors import CheckSpecError

__all__ = ["JsonSchemaCheck", "extract_json"]

#: the longest validation may take before the check abstains (a backstop to the pattern limit)
VALIDATE_TIMEOUT_S = 5.0
_NOT_FOUND = object()

# every pattern jsonschema matches goes through the cost check and the time limit
install_in_jsonschema()


class _NotJson(ValueError):
    """Text ``json.loads`` accepts that is not JSON (``NaN``), or an object with a key twice."""


def _no_constant(name: str) -> object:
    raise _NotJson(f"{name} is not JSON")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400: JSON, but no number a schema can bound
        raise _NotJson(f"{text} is too large to be a number")
    return value


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _NotJson(f"the key {key!r} appears twice in one object")
        out[key] = value
    return out


def _strict_loads(text: str) -> JSON:
    """``json.loads`` of strict JSON: no ``NaN``/``Infinity`` and no number too large for a
    float (they pass any numeric bound), no duplicate keys (the last would silently win)."""
    value: JSON = json.loads(
        text, parse_constant=_no_constant, parse_float=_finite, object_pairs_hook=_unique_keys
    )
    return value


def fenced_blocks(text: str) -> list[str]:
    """The bodies of the answer's fenced blocks (```` ```lang ```` ... ```` ``` ````), found by
    a linear scan: a regular expression here backtracks quadratically on a long unclosed
    fence, and the answer is the model's."""
    bodies: list[str] = []
    pos = 0
    while (start := text.find("```", pos)) != -1:
        line_end = text.find("\n", start + 3)
        if line_end == -1:
            break
        close = text.find("```", line_end + 1)
        if close == -1:
            break
        bodies.append(text[line_end + 1 : close])
        pos = close + 3
    return bodies


def extract_json(answer: str) -> tuple[bool, JSON]:
    """``(True, value)`` for the answer's one JSON value: the whole answer, else its one fenced
    block that parses; ``(False, reason)`` when there is none, when it is not strict JSON, or
    when several fenced blocks hold JSON (which one is the answer is ambiguous: a block that is
    JSON only to a lenient parser counts too)."""
    text = answer.strip()
    try:
        return True, _strict_loads(text)
    except _NotJson as exc:
        return False, str(exc)
    except (ValueError, RecursionError):
        pass
    found: list[JSON] = []
    problem: str | None = None
    for body in fenced_blocks(answer):
        try:
            found.append(_strict_loads(body))
        except _NotJson as exc:
            problem = problem or str(exc)
            found.append(None)
        except (ValueError, RecursionError):
            continue
    if len(found) > 1:
        return False, f"{len(found)} fenced blocks hold JSON: an answer must hold one"
    if problem is not None:
        return False, problem
    if found:
        return True, found[0]
    return False, "the answer is not JSON (nor does a fenced block hold JSON)"


def _is_pattern(value: object) -> bool:
    if isinstance(value, str):
        compile_pattern(value)  # raises regex.error: the metaschema check reports it
    return True


def _metaschema_formats() -> jsonschema.FormatChecker:
    """The metaschema check's formats, with ``regex`` judged by the engine that will run the
    patterns (Python's ``re`` refuses ``\\p{Letter}``, which ``regex`` and ECMA 262 accept),
    after its cost check."""
    checker = jsonschema.FormatChecker()
    checker.checks("regex", raises=regex.error)(_is_pattern)
    return checker


def _validator_class(schema: Mapping[str, object]) -> type[Validator]:
    named = schema.get("$schema", _NOT_FOUND)
    if named is not _NOT_FOUND and not isinstance(named, str):
        # jsonschema looks a non-string $schema up as a key and fails with AttributeError
        raise CheckSpecError("schema.$schema", f"expected a dialect URI string, got {named!r}")
    # jsonschema ships no types here: this is a validator class, or _NOT_FOUND
    cls: Any = validators.validator_for(schema, default=_NOT_FOUND)
    if cls is _NOT_FOUND:
        if named is _NOT_FOUND:
            default: type[Validator] = jsonschema.Draft202012Validator
            return default
        raise CheckSpecError(
            "schema.$schema",
            f"unknown dialect {named!r}; name a JSON Schema draft (e.g. "
            '"https://json-schema.org/draft/2020-12/schema") or leave $schema out for 2020-12',
        )
    found: type[Validator] = cls
    return found


@dataclass(frozen=True, kw_only=True)
class JsonSchemaCheck:
    """The answer parses as JSON and validates against ``schema``; one reason per violation,
    with its JSON path (``$.items[2].price: 'x' is not of type 'number'``).
    ``assert_formats`` also checks ``format`` (``date``, ``email``...), which the drafts make
    an annotation only by default."""

    options: Options
    schema: Mapping[str, object] | bool
    assert_formats: bool = False
    kind: str = "json_schema"

    def __post_init__(self) -> None:
        if isinstance(self.schema, bool):
            schema: Mapping[str, object] = {} if self.schema else {"not": {}}
        elif isinstance(self.schema, Mapping):
            schema = self.schema
        else:
            raise CheckSpecError("schema", f"expected a JSON Schema object, got {self.schema!r}")
        if not isinstance(self.assert_formats, bool):
            raise CheckSpecError("assert_formats", "expected true or false")
        base = _validator_class(schema)
        try:
            base.check_schema(schema, format_checker=_metaschema_formats())
        except jsonschema.SchemaError as exc:
            where = "schema" + "".join(
                f"[{p}]" if isinstance(p, int) else f".{p}" for p in exc.absolute_path
            )
            raise CheckSpecError(where, f"not a valid JSON Schema: {exc.message}") from exc
        except RecursionError as exc:
            raise CheckSpecError("schema", "nested too deeply to be checked") from exc
        checker = base.FORMAT_CHECKER if self.assert_formats else None
        # an empty registry: a $ref the schema does not hold is never fetched (jsonschema would
        # otherwise urlopen it, file:// included)
        validator = base(schema, format_checker=checker, registry=referencing.Registry())
        object.__setattr__(self, "_validator", validator)

    @property
    def name(self) -> str:
        return self.options.name

    async def run(self, answer: str, request: CheckRequest) -> CheckResult:
        try:
            return await asyncio.wait_for(off_loop(self._run, answer), timeout=VALIDATE_TIMEOUT_S)
        except TimeoutError:
            return self.options.result(
                self.kind,
                verdict="abstain",
                score=0.0,
                reasons=(
                    f"validation took over {VALIDATE_TIMEOUT_S:g} s (still queued or running)",
                ),
                category="timeout",
            )

    def _run(self, answer: str) -> CheckResult:
        found, value = extract_json(answer)
        if not found:
            return self.options.result(
                self.kind,
                verdict="fail",
                score=0.0,
                reasons=(str(value),),
                category="invalid_format",
                needs_revision=True,
            )
        validator: Validator = self.__dict__["_validator"]
        try:
            errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path)))
        except referencing.exceptions.Unresolvable as exc:
            return self._abstain(
                f"the schema refers to {exc} which is not in it (never fetched)", "check_error"
            )
        except TimeoutError:
            return self._abstain(
                f"a pattern took over {REGEX_TIMEOUT_S:g} s to search the answer", "timeout"
            )
        except RecursionError:
            return self._abstain(
                "the answer's JSON is nested too deeply to validate", "check_error"
            )
        except Exception as exc:  # a schema jsonschema cannot apply: never a 500
            return self._abstain(
                f"the schema could not be applied ({type(exc).__name__}: {exc})", "check_error"
            )
        if not errors:
            return self.options.result(self.kind, verdict="pass", score=1.0)
        return self.options.result(
            self.kind,
            verdict="fail",
            score=0.0,
            reasons=tuple(f"{e.json_path}: {e.message}" for e in errors),
            category="schema_violation",
            needs_revision=True,
            details={"violations": len(errors)},
        )

    def _abstain(self, reason: str, category: str) -> CheckResult:
        return self.options.result(
            self.kind, verdict="abstain", score=0.0, reasons=(reason,), category=category
        )
