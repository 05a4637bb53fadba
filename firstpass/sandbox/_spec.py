"""Test specs: the one JSON shape (asserts or input/output cases), validated into frozen objects.

    ["assert f(1) == 2", ...]                                   shorthand for {"asserts": [...]}
    {"asserts": ["assert f(1) == 2"], "setup": "import math"}
    {"entry_point": "f", "cases": [{"args": [1, 2], "expected": 3}], "atol": 0}
    {"entry_point": "f", "cases": [{"args": [1, 2]}], "reference": "def f(a, b): ..."}

``ProbeInputs`` sits beside them: the extra calls of the entry point a probe makes (built by
``firstpass.probe``, run by the sandbox after a sample's tests).

Every error is a :class:`~firstpass.errors.SpecError` whose ``field`` names the bad part.
"""

from __future__ import annotations

import ast
import hashlib
import json
import math
from dataclasses import dataclass, field

from firstpass.errors import SpecError

from ._child.codec import Wire, from_json

__all__ = [
    "DEFAULT_PER_INPUT_S",
    "AssertSpec",
    "Case",
    "CasesSpec",
    "ProbeInputs",
    "TestSpec",
    "parse_spec",
]

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
    """One call of the entry point; ``args``/``expected`` in wire form (``_child/codec.py``)."""

    args: tuple[Wire, ...]
    expected: object = _NO_EXPECTED  # wire form too, unless it is _NO_EXPECTED

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

#: each probe input's time limit inside the sample's process
DEFAULT_PER_INPUT_S = 0.05


@dataclass(frozen=True, kw_only=True)
class ProbeInputs:
    """The calls a probe makes of ``entry_point``: ``args`` holds one wire-form list per call.

    ``from_request`` of them came from the request's ``firstpass.probe_inputs``, the rest were
    generated. Outputs are recorded, never judged: they cannot make a sample pass.
    """

    entry_point: str
    args: tuple[tuple[Wire, ...], ...]
    per_input_s: float = DEFAULT_PER_INPUT_S
    from_request: int = 0

    def __len__(self) -> int:
        return len(self.args)

    @property
    def digest(self) -> str:
        """``sha256:`` over the entry point and the calls (what the behaviour digests are over)."""
        body = json.dumps(
            [self.entry_point, [list(a) for a in self.args]],
            separators=(",", ":"),
            ensure_ascii=False,
            sort_keys=True,
        )
        return "sha256:" + hashlib.sha256(body.encode()).hexdigest()


def _digest(obj: object) -> str:
    data = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return "sha256:" + hashlib.sha256(data.encode()).hexdigest()


def parse_spec(
    obj: object, *, setup: str | None = None, entry_point: str | None = None
) -> TestSpec:
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


def _kind(value: object) -> str:
    names: dict[type, str] = {dict: "an object", list: "a list", str: "a string"}
    return names.get(type(value), type(value).__name__)


def _only(obj: dict[str, object], allowed: set[str]) -> None:
    for key in obj:
        if key not in allowed:
            raise SpecError(
                str(key), f"unknown field; expected one of {', '.join(sorted(allowed))}"
            )


def _code(obj: dict[str, object], key: str, default: str | None) -> str | None:
    value = obj.get(key, default)
    if value is None:
        return None
    if not isinstance(value, str):
        raise SpecError(key, f"must be Python source text, not {_kind(value)}")
    _python(value, key)
    return value or None


def _python(src: str, where: str) -> ast.Module:
    """``src`` parsed, or a ``SpecError`` naming ``where``: not Python, or nested past what
    CPython's parser can hold (``assert --...--1`` with 100,000 signs raises ``MemoryError``
    there, which must be the client's 400, not a 500)."""
    try:
        return ast.parse(src)
    except (SyntaxError, ValueError) as exc:
        raise SpecError(where, f"is not valid Python: {exc}") from exc
    except (MemoryError, RecursionError):
        raise SpecError(where, "nests too deeply for Python's parser") from None


def _ident(value: object, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.isidentifier():
        raise SpecError(key, f"must be a Python identifier, got {value!r}")
    return value


def _asserts(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise SpecError("asserts", "must be a non-empty list of assert statements")
    out = []
    for i, src in enumerate(value):
        where = f"asserts[{i}]"
        if not isinstance(src, str):
            raise SpecError(where, f"must be a string, not {_kind(src)}")
        body = _python(src.strip(), where).body
        if len(body) != 1 or not isinstance(body[0], ast.Assert):
            raise SpecError(where, "must be exactly one assert statement")
        out.append(src.strip())
    return tuple(out)


def _cases(value: object, *, need_expected: bool) -> tuple[Case, ...]:
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
