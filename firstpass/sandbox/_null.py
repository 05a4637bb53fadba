"""Null answers: stub programs that show a spec's tests carry no signal about the answer.

A visible test licenses a gate skip only if passing it says something about the answer. A spec
that a *null* answer also passes says nothing: ``assert True``, ``assert f is not None``,
``assert callable(f)``, a setup helper that only checks ``f`` raises (``except Exception``), or
cases whose expected outputs are all None. :func:`null_programs` builds two null answers of a
spec (pure: parsed, never run); :meth:`firstpass.sandbox.Sandbox.null_passes` runs them in the
sandbox beside the samples and says which one passed every test.

- ``"returns_none"``: every name the test takes from the answer is a function returning None
  (any arguments).
- ``"raises"``: every such name is a function raising ``_NullStub``, a fresh ``Exception``
  subclass: no test expects it by name, but ``except Exception:`` catches it, and a test that
  passes when the function raises anything learns nothing about its outputs either. Not run
  for a ``CasesSpec``: a case whose call raised has failed, so it could never pass.

The names stubbed are the ones the judge would take from the sample: for a ``CasesSpec`` its
``entry_point``; for an ``AssertSpec`` every name its asserts load (called or not:
``assert f is not None`` reads ``f``) and every free name of its setup (``root = Node(1)``),
less builtins, names the setup binds and stdlib modules used as ``module.name`` (the judge keeps
its own of those), plus the ``entry_point`` when the spec names one (even a builtin's name).
A builtin-named function under test without an ``entry_point`` (MBPP's ``sum``) is not stubbed:
the null answer then defines nothing and the real builtin answers, which is what a sample that
does not define it would face.

The stubs are run exactly as a sample is (same request, same judge), so they face what a sample
faces: a setup that defines the entry point itself wins over the stub as it wins over any sample
(the judge keeps the setup's names), and such asserts, which test the setup and not the answer,
come out vacuous. That is the point: the verdict is about the spec as it is judged.

Why the verdict is per spec (a stub passes **every** test) and not per test (a stub passes
**any** test): a spec mixing a real assert with ``assert True`` still rejects wrong answers,
through the real one. The weakness, left as is: one weak real assert beside vacuous ones is all
the signal there is, and this detector cannot say how much that is; it only finds specs with none.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Literal

from ._child.asserts import BUILTIN_NAMES, STDLIB, assert_uses, names_in
from ._spec import AssertSpec, CasesSpec, TestSpec

__all__ = ["NullKind", "NullProgram", "NullVerdict", "null_programs", "stub_names"]

#: the two null answers, in the order they are reported
NullKind = Literal["returns_none", "raises"]
#: what ``Sandbox.null_passes`` returns besides None: the null answer that passed every test, or
#: ``"unknown"`` when the sandbox could not tell (which must never license a skip)
NullVerdict = Literal["returns_none", "raises", "unknown"]

_BODIES: dict[NullKind, str] = {
    "returns_none": "return None",
    "raises": 'raise {exc}("a null stub of {name!r}: it raises whatever it is given")',
}
_KINDS: tuple[NullKind, ...] = ("returns_none", "raises")


@dataclass(frozen=True, kw_only=True)
class NullProgram:
    """One null answer of a spec: its ``kind``, the ``names`` it stubs, its source ``code``."""

    kind: NullKind
    names: tuple[str, ...]
    code: str


def stub_names(spec: TestSpec) -> tuple[str, ...]:
    """The names a spec's tests take from the answer, sorted (see the module docstring)."""
    if not isinstance(spec, AssertSpec):
        return (spec.entry_point,)
    entry = spec.entry_point
    found: set[str] = set()
    bound: frozenset[str] = frozenset()
    if spec.setup:
        loaded, bound, bases = names_in(ast.parse(spec.setup))
        found.update(n for n in loaded - bound if _from_answer(n, bases, entry))
    for src in spec.asserts:
        _, names, bases = assert_uses(src)
        found.update(n for n in names if n not in bound and _from_answer(n, bases, entry))
    if entry is not None:
        found.add(entry)
    return tuple(sorted(found))


def _from_answer(name: str, bases: frozenset[str], entry: str | None) -> bool:
    """Whether the judge would look ``name`` up in the answer (as ``judge_asserts`` does)."""
    if name == entry:
        return True
    if name in BUILTIN_NAMES:
        return False
    return not (name in bases and name in STDLIB and not name.startswith("_"))


def null_programs(spec: TestSpec) -> tuple[NullProgram, ...]:
    """The spec's null answers, ``returns_none`` first; one program per kind.

    A ``CasesSpec`` gets ``returns_none`` alone: its expected values are data, so a case whose
    call raised has failed and the ``raises`` stub can never pass one (a slot saved per request).
    """
    names = stub_names(spec)
    kinds: tuple[NullKind, ...] = ("returns_none",) if isinstance(spec, CasesSpec) else _KINDS
    exc = "_NullStub"
    while exc in names:  # never shadow a stubbed name (nor be shadowed by one)
        exc += "_"
    head = f"class {exc}(Exception):\n    pass\n"
    out = []
    for kind in kinds:
        defs = [
            f"\n\ndef {name}(*args, **kwargs):\n    {_BODIES[kind].format(exc=exc, name=name)}\n"
            for name in names
        ]
        out.append(NullProgram(kind=kind, names=names, code=head + "".join(defs)))
    return tuple(out)
