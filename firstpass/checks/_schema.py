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
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import jsonschema
import referencing.exceptions
import regex
from jsonschema import ValidationError, validators
from jsonschema.protocols import Validator

from firstpass.checks._base import CheckRequest, Options
from firstpass.checks._offload import off_loop
from firstpass.checks._result import CheckResult
from firstpass.checks._text import REGEX_TIMEOUT_S
from firstpass.errors import CheckSpecError

__all__ = ["JsonSchemaCheck", "extract_json"]

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
#: the longest validation may take before the check abstains (a backstop to the regex limit)
VALIDATE_TIMEOUT_S = 5.0
_NOT_FOUND = object()


def extract_json(answer: str) -> tuple[bool, Any]:
    """``(True, value)`` for the answer's JSON (whole, else the first fenced block that parses;
    ```json blocks before other ones), ``(False, None)`` when there is none."""
    text = answer.strip()
    try:
        return True, json.loads(text)
    except (ValueError, RecursionError):
        pass
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE.finditer(answer)]
    blocks.sort(key=lambda b: b[0] != "json")  # stable: ```json first, then the rest in order
    for _, body in blocks:
        try:
            return True, json.loads(body)
        except (ValueError, RecursionError):
            continue
    return False, None


def _search(pattern: str, text: str) -> bool:
    try:
        return regex.search(pattern, text, timeout=REGEX_TIMEOUT_S) is not None
    except regex.error:
        return False


def _pattern(
    validator: Validator, patrn: str, instance: object, schema: object
) -> Iterator[ValidationError]:
    if validator.is_type(instance, "string") and not _search(patrn, str(instance)):
        yield ValidationError(f"{instance!r} does not match {patrn!r}")


def _pattern_properties(
    validator: Validator, patterns: Mapping[str, object], instance: object, schema: object
) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "object"):
        return
    assert isinstance(instance, Mapping)
    for pattern, subschema in patterns.items():
        for key, value in instance.items():
            if _search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _is_pattern(value: object) -> bool:
    if isinstance(value, str):
        regex.compile(value)  # raises regex.error: the metaschema check reports it
    return True


def _metaschema_formats() -> jsonschema.FormatChecker:
    """The metaschema check's formats, with ``regex`` judged by the engine that will run the
    patterns: Python's ``re`` refuses ``\\p{Letter}``, which ``regex`` (and ECMA 262) accept."""
    checker = jsonschema.FormatChecker()
    checker.checks("regex", raises=regex.error)(_is_pattern)
    return checker


def _validator_class(schema: Mapping[str, Any]) -> type[Validator]:
    named = schema.get("$schema", _NOT_FOUND)
    cls: Any = validators.validator_for(schema, default=_NOT_FOUND)
    if cls is _NOT_FOUND:
        if named is _NOT_FOUND:
            cls = jsonschema.Draft202012Validator
        else:
            raise CheckSpecError(
                "schema.$schema",
                f"unknown dialect {named!r}; name a JSON Schema draft (e.g. "
                '"https://json-schema.org/draft/2020-12/schema") or leave $schema out for 2020-12',
            )
    keywords = cls.VALIDATORS
    overrides: dict[str, Any] = {}
    if "pattern" in keywords:
        overrides["pattern"] = _pattern
    if "patternProperties" in keywords:
        overrides["patternProperties"] = _pattern_properties
    extended: type[Validator] = validators.extend(cls, overrides)
    return extended


@dataclass(frozen=True, kw_only=True)
class JsonSchemaCheck:
    """The answer parses as JSON and validates against ``schema``; one reason per violation,
    with its JSON path (``$.items[2].price: 'x' is not of type 'number'``).
    ``assert_formats`` also checks ``format`` (``date``, ``email``...), which the drafts make
    an annotation only by default."""

    options: Options
    schema: Mapping[str, Any] | bool
    assert_formats: bool = False
    kind: str = "json_schema"

    def __post_init__(self) -> None:
        if isinstance(self.schema, bool):
            schema: Mapping[str, Any] = {} if self.schema else {"not": {}}
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
        object.__setattr__(self, "_validator", base(schema, format_checker=checker))

    @property
    def name(self) -> str:
        return self.options.name

    async def run(self, answer: str, request: CheckRequest) -> CheckResult:
        try:
            return await asyncio.wait_for(
                off_loop(self._run, answer), timeout=VALIDATE_TIMEOUT_S
            )
        except TimeoutError:
            return self.options.result(
                self.kind,
                verdict="abstain",
                score=0.0,
                reasons=(f"validation took over {VALIDATE_TIMEOUT_S:g} s",),
                category="timeout",
            )

    def _run(self, answer: str) -> CheckResult:
        found, value = extract_json(answer)
        if not found:
            return self.options.result(
                self.kind,
                verdict="fail",
                score=0.0,
                reasons=("the answer is not JSON (nor does a fenced block hold JSON)",),
                category="invalid_format",
                needs_revision=True,
            )
        validator: Validator = self.__dict__["_validator"]
        try:
            errors = sorted(validator.iter_errors(value), key=lambda e: list(map(str, e.path)))
        except referencing.exceptions.Unresolvable as exc:
            return self.options.result(
                self.kind,
                verdict="abstain",
                score=0.0,
                reasons=(f"the schema refers to {exc} which is not in it (never fetched)",),
                category="check_error",
            )
        except RecursionError:
            return self.options.result(
                self.kind,
                verdict="abstain",
                score=0.0,
                reasons=("the answer's JSON is nested too deeply to validate",),
                category="check_error",
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
