"""Validate a route's ``[route.checks]`` test specs at start, not at the first request.

The sandbox owns the spec format (``firstpass.sandbox.parse_spec``); when it is importable we ask
it. Otherwise a structural check of the same documented shape runs, so a broken config still
fails at start with a key path. Assert strings are parsed (``ast``), never executed.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from firstpass.config._fields import check_keys, describe, join
from firstpass.config._model import RouteChecks
from firstpass.errors import ConfigError, SpecError

if TYPE_CHECKING:
    from firstpass.sandbox import TestSpec

_SPEC_KEYS = ("asserts", "setup", "entry_point", "cases", "reference", "atol")
_CASE_KEYS = ("args", "expected")


class _ParseSpec(Protocol):
    """``firstpass.sandbox.parse_spec``."""

    def __call__(
        self, obj: object, /, *, setup: str | None = ..., entry_point: str | None = ...
    ) -> TestSpec: ...


def _sandbox_parse_spec() -> _ParseSpec | None:
    try:
        from firstpass.sandbox import parse_spec
    except ImportError:
        return None
    return parse_spec


def validate_checks(checks: RouteChecks, path: str) -> None:
    """Raise ConfigError (``route[0].checks.hidden.cases[1].args: ...``) for a malformed spec."""
    if checks.setup is not None:
        _check_python(checks.setup, join(path, "setup"))
    if checks.entry_point is not None and not checks.entry_point.isidentifier():
        raise ConfigError(
            join(path, "entry_point"),
            f"expected a function name, got {describe(checks.entry_point)}",
        )
    parse_spec = _sandbox_parse_spec()
    for name in ("visible", "hidden"):
        spec = getattr(checks, name)
        if spec is None:
            continue
        key_path = join(path, name)
        if parse_spec is None:
            check_spec_shape(spec, key_path, entry_point=checks.entry_point)
            continue
        try:
            parse_spec(spec, setup=checks.setup, entry_point=checks.entry_point)
        except SpecError as exc:
            prefix = f"{exc.field}: "
            message = str(exc)[len(prefix) :] if str(exc).startswith(prefix) else str(exc)
            field = exc.field or ""
            if not field:
                where = key_path
            elif field.startswith("["):
                where = f"{key_path}{field}"
            else:
                where = join(key_path, field)
            raise ConfigError(where, message) from exc


def check_spec_shape(spec: object, path: str, *, entry_point: str | None = None) -> None:
    """The structural check: asserts (a list, or ``{"asserts": [...]}``) or input/output cases."""
    if isinstance(spec, list):
        _check_asserts(spec, path)
        return
    if not isinstance(spec, Mapping):
        raise ConfigError(path, f"expected an array of asserts or a table, got {describe(spec)}")
    check_keys(spec, path, _SPEC_KEYS)
    if "setup" in spec:
        if not isinstance(spec["setup"], str):
            raise ConfigError(
                join(path, "setup"), f"expected a string, got {describe(spec['setup'])}"
            )
        _check_python(spec["setup"], join(path, "setup"))
    if "asserts" in spec:
        extra = sorted(set(spec) - {"asserts", "setup"})
        if extra:
            raise ConfigError(join(path, extra[0]), 'not allowed beside "asserts"')
        _check_asserts(spec["asserts"], join(path, "asserts"))
        return
    if "cases" not in spec:
        raise ConfigError(path, 'expected "asserts" or "cases"')
    _check_cases(spec, path, entry_point)


def _check_asserts(asserts: object, path: str) -> None:
    if not isinstance(asserts, list) or not asserts:
        raise ConfigError(
            path, f"expected a non-empty array of assert strings, got {describe(asserts)}"
        )
    for i, item in enumerate(asserts):
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(f"{path}[{i}]", f"expected an assert statement, got {describe(item)}")
        _check_python(item, f"{path}[{i}]")


def _check_cases(spec: Mapping[str, object], path: str, entry_point: str | None) -> None:
    name = spec.get("entry_point", entry_point)
    if not isinstance(name, str) or not name.isidentifier():
        where = join(path, "entry_point")
        raise ConfigError(
            where, f"cases need a function name (an identifier), got {describe(name)}"
        )
    reference = spec.get("reference")
    if reference is not None:
        if not isinstance(reference, str):
            raise ConfigError(join(path, "reference"), f"expected code, got {describe(reference)}")
        _check_python(reference, join(path, "reference"))
    atol = spec.get("atol", 0)
    if (
        isinstance(atol, bool)
        or not isinstance(atol, int | float)
        or not math.isfinite(atol)
        or atol < 0
    ):
        raise ConfigError(join(path, "atol"), f"expected a number >= 0, got {describe(atol)}")
    cases = spec["cases"]
    if not isinstance(cases, list) or not cases:
        raise ConfigError(
            join(path, "cases"), f"expected a non-empty array of cases, got {describe(cases)}"
        )
    for i, case in enumerate(cases):
        where = f"{join(path, 'cases')}[{i}]"
        if not isinstance(case, Mapping):
            raise ConfigError(
                where, f'expected a table with "args" and "expected", got {describe(case)}'
            )
        check_keys(case, where, _CASE_KEYS)
        if not isinstance(case.get("args"), list):
            raise ConfigError(
                join(where, "args"), f"expected an array, got {describe(case.get('args'))}"
            )
        if "expected" not in case and reference is None:
            raise ConfigError(
                join(where, "expected"), 'missing (give it, or a "reference" solution)'
            )


def _check_python(source: str, path: str) -> None:
    try:
        ast.parse(source)
    except SyntaxError as exc:
        raise ConfigError(path, f"not valid Python: {exc.msg} (line {exc.lineno})") from exc
