"""Expected values from a reference solution: :meth:`Sandbox.resolve <._runner.Sandbox>`.

A mixin of :class:`~._runner.Sandbox`, apart from it because resolving is its own policy (two
hash seeds, retries of what failed by accident, drop reasons) on top of one call: ``_submit``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import OrderedDict
from typing import TYPE_CHECKING

from firstpass.errors import SpecError

from ._child.judge import DROP, SLOW
from ._limits import Limits
from ._requests import setup_imports_of
from ._spec import Case, CasesSpec

if TYPE_CHECKING:
    from ._child.codec import Wire
    from ._child.frames import Response, RunRequest

__all__ = ["References"]

#: how many resolved reference specs to keep
RESOLVED_CACHE = 4096
#: runs of a reference before a case it gave no answer on (timeouts...) fails the resolution
RESOLVE_TRIES = 3
#: how many bytes of return values (as JSON) a reference solution may produce over all its
#: cases; each later run of the spec carries them, so they cost every run of it
REFERENCE_ALLOWANCE = 16 << 20
#: the stdout+stderr a reference may print (a sample's default is 1 MB)
REFERENCE_OUTPUT_BYTES = 16 << 20


class References:
    """``resolve`` and its caches; the class that mixes this in provides ``_submit``."""

    limits: Limits
    _resolved: OrderedDict[str, CasesSpec]  # LRU, RESOLVED_CACHE long
    _resolving: dict[str, asyncio.Lock]
    _resolve_failed: OrderedDict[str, SpecError]  # spec digest -> why its reference failed

    async def _submit(self, req: RunRequest, limits: Limits, *, alt: bool = False) -> Response:
        raise NotImplementedError

    async def resolve(self, spec: CasesSpec, limits: Limits | None = None) -> CasesSpec:
        """Fill in expected values by running ``spec.reference`` (cached per spec digest).

        The reference runs twice, in two zygotes (two interpreters, so two string-hash seeds:
        set-order-dependent outputs differ). A case is dropped (listed in ``dropped``, the
        reason in ``dropped_why``) only for a property of the reference: it raised, exited,
        returned non-data, answered differently in the two runs, or went over the output
        allowance. A case that failed by accident (a timeout or the memory limit on a loaded
        host, a worker killed, a sandbox restart) is run again, up to ``RESOLVE_TRIES`` times;
        if it still has no answer, ``SpecError`` says so and nothing is cached, so the next
        use tries again. Only a reference that fails every case for reasons of its own is a
        failure remembered for the spec.
        """
        if spec.resolved:
            return spec
        if spec.reference is None:
            raise SpecError("reference", "cases without expected values need a reference solution")
        key = spec.digest
        if key in self._resolved:
            self._resolved.move_to_end(key)
            return self._resolved[key]
        if key in self._resolve_failed:
            raise self._resolve_failed[key]
        lock = self._resolving.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                if key in self._resolved:
                    return self._resolved[key]
                if key in self._resolve_failed:
                    raise self._resolve_failed[key]
                limits = limits or self.limits
                limits = dataclasses.replace(
                    limits, output_bytes=max(limits.output_bytes, REFERENCE_OUTPUT_BYTES)
                )
                req: RunRequest = {
                    "op": "run",
                    "mode": "outputs",
                    "code": spec.reference,
                    "setup": spec.setup,
                    "setup_imports": setup_imports_of(spec.setup),
                    "entry_point": spec.entry_point,
                    "tests": [list(c.args) for c in spec.cases],
                    "allowance": REFERENCE_ALLOWANCE,
                }
                outcome = await self._reference_outcomes(spec, req, limits)
                unsettled = [i for i, o in outcome.items() if isinstance(o, _Transient)]
                if unsettled:  # never cached: a loaded host must not weaken a spec for good
                    raise SpecError(
                        "reference",
                        f"the reference gave no answer on {len(unsettled)} case(s) (first: "
                        f"case {unsettled[0]}, {outcome[unsettled[0]]}) in {RESOLVE_TRIES} "
                        "tries; the host may be overloaded: nothing was cached, the next use "
                        "tries again",
                    )
                cases, dropped, why = [], [], []
                for i, case in enumerate(spec.cases):
                    got = outcome[i]
                    if isinstance(got, _Value):
                        cases.append(Case(args=case.args, expected=got.value))
                    else:  # dropped (no case is still unsettled here)
                        dropped.append(i)
                        why.append(str(got))
                if not cases:
                    failed = SpecError(
                        "reference",
                        f"the reference solution failed on every case (first: {why[0]})",
                    )
                    self._resolve_failed[key] = failed
                    while len(self._resolve_failed) > RESOLVED_CACHE:
                        self._resolve_failed.popitem(last=False)
                    raise failed
                done = CasesSpec(
                    entry_point=spec.entry_point,
                    cases=tuple(cases),
                    atol=spec.atol,
                    reference=None,
                    setup=spec.setup,
                    dropped=tuple(dropped),
                    dropped_why=tuple(why),
                )
                self._resolved[key] = done
                while len(self._resolved) > RESOLVED_CACHE:
                    self._resolved.popitem(last=False)
                return done
        finally:  # a failed reference too: one lock per spec must not outlive its resolution
            self._resolving.pop(key, None)

    async def _reference_outcomes(
        self, spec: CasesSpec, req: RunRequest, limits: Limits
    ) -> dict[int, _Resolved]:
        """Each case's outcome, running the reference (in both interpreters) on the cases not
        settled yet until every case is, or ``RESOLVE_TRIES`` runs in a row settle nothing.

        Only the unsettled cases run again, so a spec whose cases together need more CPU than
        one process may use is resolved over several runs. A case that ran out of its own
        CPU-time budget in ``RESOLVE_TRIES`` runs is the reference's property (it needs more
        than a sample may use), so it is dropped; any other missing answer stays unsettled.
        """
        outcome: dict[int, _Resolved] = {}
        slow: dict[int, int] = {}
        todo = list(range(len(spec.cases)))
        idle = 0
        while todo and idle < RESOLVE_TRIES:
            sub: RunRequest = {**req, "tests": [req["tests"][i] for i in todo]}
            first, second = await asyncio.gather(
                self._submit(sub, limits), self._submit(sub, limits, alt=True)
            )
            settled = 0
            for j, i in enumerate(todo):
                got = _resolve_case(_output(first, j), _output(second, j))
                if isinstance(got, _Slow):
                    slow[i] = slow.get(i, 0) + 1
                    got = (
                        _Dropped(f"the reference ran out of its CPU-time budget ({got})")
                        if slow[i] >= RESOLVE_TRIES
                        else _Transient(str(got))
                    )
                outcome[i] = got
                settled += not isinstance(got, _Transient)
            todo = [i for i in todo if isinstance(outcome[i], _Transient)]
            idle = 0 if settled else idle + 1
        return outcome


def _output(resp: Response, i: int) -> tuple[Wire] | str | _Slow | None:
    """Case ``i`` of a reference run: ``(value,)``, the reason it failed for a reason of the
    reference's own (a str), ``_Slow`` (it used up its own CPU-time budget), or None (no
    answer: an accident of the host, or the process's CPU ran out on earlier cases)."""
    outputs = resp.get("outputs")
    tests = resp.get("tests")
    if not isinstance(outputs, list) or not isinstance(tests, list) or i >= len(outputs):
        return None
    out = outputs[i]
    if tests[i].get("passed"):  # a value came back: None too is a value (null on the wire)
        return (out,)
    if isinstance(out, dict) and set(out) == {DROP}:
        return str(out[DROP])
    if isinstance(out, dict) and set(out) == {SLOW}:
        return _Slow(str(out[SLOW]))
    return None


@dataclasses.dataclass(frozen=True)
class _Value:
    value: Wire


@dataclasses.dataclass(frozen=True)
class _Dropped:
    why: str

    def __str__(self) -> str:
        return self.why


@dataclasses.dataclass(frozen=True)
class _Transient:
    why: str

    def __str__(self) -> str:
        return self.why


@dataclasses.dataclass(frozen=True)
class _Slow:
    why: str

    def __str__(self) -> str:
        return self.why


_Resolved = _Value | _Dropped | _Transient | _Slow
_Run = tuple["Wire"] | str | _Slow | None


def _resolve_case(a: _Run, b: _Run) -> _Resolved:
    """One case from the reference's two runs (two hash seeds)."""
    for got in (a, b):
        if isinstance(got, str):
            return _Dropped(f"the reference failed: {got}")
    if isinstance(a, _Slow) and isinstance(b, _Slow):
        return a
    if not isinstance(a, tuple) or not isinstance(b, tuple):
        return _Transient("no answer: a timeout, the memory limit or a killed worker")
    if a != b:
        return _Dropped("the reference answered differently in two runs (two hash seeds)")
    return _Value(a[0])
