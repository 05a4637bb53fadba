"""What the front sends a zygote for one sample, and what it reads back from the answer.

The request's fields are the contract with ``_child/zygote.py``; built here from a spec,
apart from the slot and process bookkeeping of :class:`~._runner.Sandbox`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, cast

from firstpass.errors import SandboxError

from ._child.asserts import infer_entry_point, prefetch_names, setup_imports
from ._child.closed import closed_spec
from ._result import TestResult
from ._spec import AssertSpec, TestSpec

if TYPE_CHECKING:
    from ._child.codec import Wire
    from ._child.frames import Response, RunRequest

__all__ = ["build_request", "read_behaviour", "read_tests", "setup_imports_of"]


def build_request(code: str, spec: TestSpec, entry_point: str | None) -> RunRequest:
    """The zygote's request to run ``code`` against ``spec`` (mode, tests, what the judge needs)."""
    if isinstance(spec, AssertSpec):
        # no entry point: a spec naming only builtins may test the sample's `sum`
        ep = entry_point or spec.entry_point or infer_entry_point(spec.asserts, spec.setup, code)
        return {
            "op": "run",
            "mode": "asserts",
            "code": code,
            "setup": spec.setup,
            "setup_imports": setup_imports_of(spec.setup),
            "prefetch": _prefetch(spec.asserts, ep),
            "entry_point": ep,
            "tests": list(spec.asserts),
            # judged by the shared judge of cases jobs when its evaluation cannot change
            # that process (the judge checks again); else by its request's own
            "closed": closed_spec(spec.asserts, spec.setup),
        }
    return {
        "op": "run",
        "mode": "cases",
        "code": code,
        "setup": spec.setup,
        "setup_imports": setup_imports_of(spec.setup),
        "prefetch": [entry_point or spec.entry_point],
        "entry_point": entry_point or spec.entry_point,
        "atol": spec.atol,
        "tests": [list(c.args) for c in spec.cases],
        # resolved (Sandbox.run resolves first): every case has its expected value
        "expected": cast("list[Wire]", [c.expected for c in spec.cases]),
    }


def read_tests(resp: Response, n: int) -> tuple[TestResult, ...]:
    """The zygote's verdicts as test results (exactly ``n``, else the sandbox failed)."""
    verdicts = resp.get("tests")
    if not isinstance(verdicts, list) or len(verdicts) != n:
        raise SandboxError("the sandbox answered with the wrong number of test results")
    return tuple(
        TestResult(
            index=i,
            passed=bool(v["passed"]),
            error_type=v.get("error_type"),
            message=v.get("message"),
        )
        for i, v in enumerate(verdicts)
    )


@functools.lru_cache(maxsize=1024)
def setup_imports_of(setup: str | None) -> str | None:
    """The setup's import lines, which the sample may use (its helpers stay the judge's)."""
    return setup_imports(setup)


@functools.lru_cache(maxsize=1024)
def _prefetch(asserts: tuple[str, ...], entry: str | None) -> list[str]:
    """What the worker reports with its load record (see ``_child.asserts.prefetch_names``)."""
    return prefetch_names(asserts, entry)


def read_behaviour(resp: Response, n: int) -> tuple[str, tuple[str, ...]] | None:
    """The verifier's behaviour record: (digest of the output vector, one digest per input)."""
    rec = resp.get("behaviour")
    if not isinstance(rec, dict):
        return None
    digest, outputs = rec.get("digest"), rec.get("outputs")
    if not isinstance(digest, str) or not isinstance(outputs, list) or len(outputs) != n:
        return None
    return digest, tuple(str(o) for o in outputs)
