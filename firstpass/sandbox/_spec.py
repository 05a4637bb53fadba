"""Test specs: the one JSON shape (asserts or input/output cases), validated into frozen objects.

    ["assert f(1) == 2", ...]                                   shorthand for {"asserts": [...]}
    {"asserts": ["assert f(1) == 2"], "setup": "import math"}
    {"entry_point": "f", "cases": [{"args": [1, 2], "expected": 3}], "atol": 0}
    {"entry_point": "f", "cases": [{"args": [1, 2]}], "reference": "def f(a, b): ..."}

Every error is a :class:`~firstpass.errors.SpecError` whose ``field`` names the bad part.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from firstpass.errors import SpecError

from ._codec import from_json

__all__ = ["AssertSpec", "Case", "CasesSpec", "TestSpec", "parse_spec"]

_NO_EXPECTED = object()


@dataclass(frozen=True, kw_only=True)
class AssertSpec:
    """Assert statements (MBPP/HumanEval style), each checked separately, after ``setup``."""

    asserts: tuple[str, ...]
    setup: str | None = None
    entry_point: str | None = None

    @property
    def n_tests(self) -> int:
        return len(self.asserts)

    @property
    def digest(self) -> str:
        return _digest({"asserts": list(self.asserts), "setup": self.setup})


@dataclass(frozen=True, kw_only=True, eq=True)
class Case:
    """One call of the entry point; ``args``/``expected`` are in wire form (see ``_codec``)."""

    args: tuple[Any, ...]
    expected: Any = _NO_EXPECTED

    @property
    def has_expected(self) -> bool:
        return self.expected is not _NO_EXPECTED


@dataclass(frozen=True, kw_only=True)
class CasesSpec:
    """Input/expected-output cases for ``entry_point`` (MBPP+/EvalPlus style).

    With ``reference`` the expected values are computed by running it in the sandbox
    (:meth:`firstpass.sandbox.Sandbox.resolve`); ``dropped`` then lists the indices of the
    original cases left out because the reference raised on them or was not deterministic,
    and ``dropped_why`` the reason for each (never a timeout: those are run again).
    """

    entry_point: str
    cases: tuple[Case, ...]
    atol: float = 0.0
    reference: str | None = None
    setup: str | None = None
    dropped: tuple[int, ...] = field(default=())
    dropped_why: tuple[str, ...] = field(default=())

    @property
    def n_tests(self) -> int:
        return len(self.cases)

    @property
    def resolved(self) -> bool:
        return all(c.has_expected for c in self.cases)

    @property
    def digest(self) -> str:
        return _digest(
            {
                "entry_point": self.entry_point,
                "atol": self.atol,
                "reference": self.reference,
                "setup": self.setup,
                "cases": [
                    [list(c.args), c.expected if c.has_expected else None] for c in self.cases
                ],
            }
        )


TestSpec = AssertSpec | CasesSpec


def _digest(obj: Any) -> str:
    data = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(data.encode()).hexdigest()


def parse_spec(obj: Any, *, setup: str | None = None, entry_point: str | None = None) -> TestSpec:
    """Validate a JSON-decoded spec (dict or list) into an AssertSpec or a CasesSpec.

    ``setup`` and ``entry_point`` fill in what the object itself does not say.
    """
    if isinstance(obj, list):
        obj = {"asserts": obj}
    if not isinstance(obj, dict):
        raise SpecError("", f"a spec is a JSON object or a list of asserts, not {_kind(obj)}")
    if "asserts" in obj and "cases" in obj:
        raise SpecError("asserts", "give either 'asserts' or 'cases', not both")
    setup = _code(obj, "setup", setup)
    entry_point = _ident(obj.get("entry_point", entry_point), "entry_point")
    if "asserts" in obj:
        _only(obj, {"asserts", "setup", "entry_point"})
        return AssertSpec(asserts=_asserts(obj["asserts"]), setup=setup, entry_point=entry_point)
    if "cases" in obj:
        _only(obj, {"cases", "entry_point", "atol", "reference", "setup"})
        if entry_point is None:
            raise SpecError("entry_point", "cases need the name of the function to call")
        reference = _code(obj, "reference", None)
        atol = obj.get("atol", 0)
        if (
            isinstance(atol, bool)
            or not isinstance(atol, int | float)
            or not math.isfinite(atol)
            or atol < 0
        ):
            raise SpecError("atol", f"must be a number >= 0, got {atol!r}")
        cases = _cases(obj["cases"], need_expected=reference is None)
        return CasesSpec(
            entry_point=entry_point, cases=cases, atol=float(atol), reference=reference, setup=setup
        )
    raise SpecError("", "a spec needs 'asserts' or 'cases'")


def _kind(value: Any) -> str:
    names: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}
    return names.get(type(value), type(value).__name__)


def _only(obj: dict[str, Any], allowed: set[str]) -> None:
    for key in obj:
        if key not in allowed:
            raise SpecError(
                str(key), f"unknown field; expected one of {', '.join(sorted(allowed))}"
            )


def _code(obj: dict[str, Any], key: str, default: str | None) -> str | None:
    value = obj.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecError(key, f"must be Python source text, not {_kind(value)}")
    try:
        ast.parse(value)
    except (SyntaxError, ValueError) as exc:
        raise SpecError(key, f"is not valid Python: {exc}") from exc
    return value or None


def _ident(value: Any, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise SpecError(key, f"must be a Python identifier, got {value!r}")
    return value


def _asserts(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise SpecError("asserts", "must be a non-empty list of assert statements")
    out = []
    for i, src in enumerate(value):
        where = f"asserts[{i}]"
        if not isinstance(src, str):
            raise SpecError(where, f"must be a string, not {_kind(src)}")
        try:
            body = ast.parse(src.strip()).body
        except (SyntaxError, ValueError) as exc:
            raise SpecError(where, f"is not valid Python: {exc}") from exc
        if len(body) != 1 or not isinstance(body[0], ast.Assert):
            raise SpecError(where, "must be exactly one assert statement")
        out.append(src.strip())
    return tuple(out)


def _cases(value: Any, *, need_expected: bool) -> tuple[Case, ...]:
    if not isinstance(value, list) or not value:
        raise SpecError("cases", 'must be a non-empty list of {"args": [...], "expected": ...}')
    out = []
    for i, case in enumerate(value):
        where = f"cases[{i}]"
        if not isinstance(case, dict):
            raise SpecError(where, f"must be an object, not {_kind(case)}")
        for key in case:
            if key not in ("args", "expected"):
                raise SpecError(f"{where}.{key}", "unknown field; expected args, expected")
        args = case.get("args")
        if not isinstance(args, list):
            raise SpecError(f"{where}.args", "must be a list of positional arguments")
        if "expected" in case:
            out.append(
                Case(args=tuple(from_json(a) for a in args), expected=from_json(case["expected"]))
            )
        elif need_expected:
            raise SpecError(f"{where}.expected", "is missing (or give a 'reference' solution)")
        else:
            out.append(Case(args=tuple(from_json(a) for a in args)))
    return tuple(out)
