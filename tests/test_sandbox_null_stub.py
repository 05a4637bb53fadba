"""Null answers: which visible tests a stub returning None, or raising, passes (issue 25 item 3).

The pure part (which names are stubbed, the stub programs) is checked without a sandbox; the
verdicts come from the real sandbox, the same slots and judge a request's samples use.
"""

from __future__ import annotations

import ast
import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from blockbuster import BlockBuster

from firstpass.errors import SandboxBusy, SandboxError
from firstpass.sandbox import (
    Limits,
    NullVerdict,
    Sandbox,
    null_programs,
    parse_spec,
    stub_names,
)

GOOD = "def f(x):\n    return x + 1\n"
#: a setup helper that passes whenever ``f`` raises anything an ``except Exception`` catches
ONLY_RAISES = (
    "def check():\n    try:\n        f(1)\n        return False\n"
    "    except Exception:\n        return True\n"
)


@pytest.fixture
async def sb(blockbuster: BlockBuster) -> AsyncIterator[Sandbox]:
    # limits generous enough that a loaded CI machine never turns a verdict into a timeout
    async with Sandbox(concurrency=2, limits=Limits(cpu_s=5, wall_s=10)) as sandbox:
        yield sandbox


# ---------------------------------------------------------------- the stub programs (pure)


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        (["assert True"], ()),
        (["assert 1 == 1"], ()),
        (["assert f(1) == g(2)"], ("f", "g")),
        (["assert f is not None"], ("f",)),
        (["assert math.isclose(area(1), 3.14, rel_tol=0.01)"], ("area",)),
        (["assert sum(10, 15) == 6"], ()),
        ({"asserts": ["assert sum(10, 15) == 6"], "entry_point": "sum"}, ("sum",)),
        ({"asserts": ["assert check()"], "setup": ONLY_RAISES}, ("f",)),
        ({"asserts": ["assert f(root) == 1"], "setup": "root = Node(1)"}, ("Node", "f")),
        ({"asserts": ["assert helper(1)"], "setup": "def helper(x):\n    return x"}, ()),
        ({"entry_point": "f", "cases": [{"args": [1], "expected": 2}]}, ("f",)),
    ],
)
def test_the_stubbed_names_are_those_the_judge_takes_from_the_answer(
    spec: Any, names: tuple[str, ...]
) -> None:
    """Loaded names and the setup's free names, less builtins, setup-bound names and stdlib
    modules used as ``module.name``; the spec's entry point always."""
    assert stub_names(parse_spec(spec)) == names


def test_each_null_program_defines_every_stubbed_name_and_compiles() -> None:
    """One program per kind, returns_none first, each a function per stubbed name."""
    programs = null_programs(parse_spec(["assert f(1) == g(2)"]))
    assert [p.kind for p in programs] == ["returns_none", "raises"]
    for program in programs:
        tree = ast.parse(program.code)
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert defined == {"f", "g"}


def test_a_cases_spec_gets_only_the_returns_none_stub() -> None:
    """A raised case always fails (expected values are data): the raises stub is not run."""
    spec = parse_spec({"entry_point": "f", "cases": [{"args": [1], "expected": None}]})
    assert [p.kind for p in null_programs(spec)] == ["returns_none"]


def test_the_stub_exception_class_never_takes_a_stubbed_name() -> None:
    """A spec that calls ``_NullStub`` itself keeps its stub; the exception class moves aside."""
    (_, raises) = null_programs(parse_spec(["assert _NullStub(1) is None"]))
    ns: dict[str, Any] = {}
    exec(compile(raises.code, "<stub>", "exec"), ns)
    with pytest.raises(Exception) as info:
        ns["_NullStub"](1)
    assert type(info.value).__name__ == "_NullStub_"


# ---------------------------------------------------------------- verdicts in the sandbox


@pytest.mark.parametrize(
    ("spec", "verdict"),
    [
        (["assert True"], "returns_none"),
        (["assert 1 == 1"], "returns_none"),
        (["assert f is not None"], "returns_none"),
        (["assert callable(f)"], "returns_none"),
        (["assert f(1) is not None"], None),
        (["assert f(1) == 2", "assert f(2) == 3"], None),
        (["assert f(1) == 2", "assert True"], None),
        ({"asserts": ["assert check()"], "setup": ONLY_RAISES}, "raises"),
        (
            {
                "asserts": ["assert check()"],
                "setup": ONLY_RAISES.replace("Exception", "ValueError"),
            },
            None,
        ),
        ({"entry_point": "f", "cases": [{"args": [1], "expected": None}] * 2}, "returns_none"),
        ({"entry_point": "f", "cases": [{"args": [1], "expected": 2}]}, None),
        (
            {"asserts": ["assert f(1) == 2"], "setup": GOOD, "entry_point": "f"},
            "returns_none",
        ),
        # MBPP-style real asserts (tasks 2, 17, 126) carry signal
        (["assert similar_elements((3, 4, 5, 6), (5, 7, 4, 10)) == (4, 5)"], None),
        (["assert math.isclose(square_perimeter(10), 40)"], None),
        (["assert sum(10, 15) == 6"], None),
    ],
    ids=[
        "assert-true",
        "constant-comparison",
        "is-not-none",
        "callable",
        "detects-none",
        "real-asserts",
        "real-beside-assert-true",
        "except-exception-helper",
        "except-valueerror-helper",
        "cases-all-none",
        "cases-real",
        "setup-defines-entry-point",
        "mbpp-2",
        "mbpp-17-math",
        "mbpp-126-builtin-name",
    ],
)
async def test_a_spec_is_vacuous_when_a_null_answer_passes_every_test(
    sb: Sandbox, spec: Any, verdict: NullVerdict | None
) -> None:
    """The verdict names the null answer that passed every test, or is None when the tests
    reject both; a setup that defines the entry point wins over the stub, as over a sample."""
    assert await sb.null_passes(parse_spec(spec)) == verdict


async def test_a_cases_spec_with_a_reference_is_resolved_before_the_stubs_run(
    sb: Sandbox,
) -> None:
    """Expected values come from the reference first: one returning None makes it vacuous."""
    cases = [{"args": [1]}, {"args": [2]}]
    vacuous = {"entry_point": "f", "cases": cases, "reference": "def f(x):\n    return None\n"}
    real = {"entry_point": "f", "cases": cases, "reference": GOOD}
    assert await sb.null_passes(parse_spec(vacuous)) == "returns_none"
    assert await sb.null_passes(parse_spec(real)) is None


async def test_a_reference_that_fails_everywhere_is_unknown_not_a_crash(sb: Sandbox) -> None:
    """The spec's own failure (SpecError from resolve) is could-not-tell, never "no signal"."""
    spec = parse_spec(
        {
            "entry_point": "f",
            "cases": [{"args": [1]}],
            "reference": "def f(x):\n    raise ValueError('no')\n",
        }
    )
    assert await sb.null_passes(spec) == "unknown"


async def test_the_stubs_beside_the_samples_leave_the_samples_verdicts_alone(sb: Sandbox) -> None:
    """Run as the pipeline runs them (gathered with the probe's samples): same verdicts as
    alone, and the stubs' verdict does not depend on the samples."""
    vacuous, real = parse_spec(["assert f is not None"]), parse_spec(["assert f(1) == 2"])
    bad = "def f(x):\n    return None\n"
    samples, null_v = await asyncio.gather(
        sb.run_many([GOOD, bad], vacuous), sb.null_passes(vacuous)
    )
    assert [r.passed for r in samples] == [True, True] and null_v == "returns_none"
    samples, null_r = await asyncio.gather(sb.run_many([GOOD, bad], real), sb.null_passes(real))
    assert [r.passed for r in samples] == [True, False] and null_r is None


async def test_a_busy_sandbox_answers_unknown_so_could_not_tell_never_licenses_a_skip(
    blockbuster: BlockBuster,
) -> None:
    """No slot for the stubs (SandboxBusy) is ``"unknown"``, not None and not an exception."""
    async with Sandbox(concurrency=1, max_queue=0, limits=Limits(cpu_s=1, wall_s=1)) as sb:
        hold = "import time\ndef f(x):\n    time.sleep(30)\n"
        blocker = asyncio.ensure_future(sb.run(hold, parse_spec(["assert f(1) == 2"])))
        async with asyncio.timeout(10):
            while sb.stats.busy < 1:
                await asyncio.sleep(0.01)
        assert await sb.null_passes(parse_spec(["assert f(1) == 2"])) == "unknown"
        assert (await blocker).category == "timeout"


class _RaisesBusy(Sandbox):
    """A sandbox whose ``raises`` stub never gets a slot (the returns_none one runs)."""

    async def _submit(self, req: Any, limits: Limits, *, alt: bool = False) -> Any:
        if "raise _NullStub" in str(req.get("code")):
            raise SandboxBusy("no slot for the raises stub", retry_after_s=1.0)
        return await super()._submit(req, limits, alt=alt)


@pytest.mark.parametrize(
    ("spec", "verdict"),
    [(["assert f is not None"], "returns_none"), (["assert f(1) == 2"], "unknown")],
    ids=["a-pass-is-conclusive", "a-fail-beside-an-error-is-not"],
)
async def test_a_stub_that_passed_decides_and_a_stub_that_errored_leaves_it_unknown(
    blockbuster: BlockBuster, spec: list[str], verdict: NullVerdict
) -> None:
    """One null answer passing is proof enough; one failing beside one that could not run
    says nothing about the other, so it is ``"unknown"``."""
    async with _RaisesBusy(concurrency=2, limits=Limits(cpu_s=5, wall_s=10)) as sb:
        assert await sb.null_passes(parse_spec(spec)) == verdict


async def test_asking_a_sandbox_that_is_not_started_is_an_error() -> None:
    """A programming error of the caller is raised, not folded into ``"unknown"``."""
    with pytest.raises(SandboxError, match="not started"):
        await Sandbox(concurrency=1).null_passes(parse_spec(["assert True"]))
