"""The sandbox's async API: verdicts, comparisons, reference outputs, recovery, loop hygiene."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator

import pytest
from blockbuster import BlockBuster

import firstpass.sandbox as sandbox_pkg
from firstpass.errors import ConfigError, SpecError
from firstpass.sandbox import CasesSpec, Limits, SampleResult, Sandbox, _isolation, parse_spec

GOOD = "def f(x):\n    return x + 1\n"


@pytest.fixture
async def sb(blockbuster: BlockBuster) -> AsyncIterator[Sandbox]:
    # limits generous enough that a loaded CI machine never turns a verdict into a timeout
    async with Sandbox(concurrency=2, limits=Limits(cpu_s=5, wall_s=10)) as sandbox:
        yield sandbox


def test_public_names_are_exactly_all() -> None:
    """The package exports exactly the names in __all__."""
    public = {n for n in dir(sandbox_pkg) if not n.startswith("_")}
    assert public == set(sandbox_pkg.__all__)


async def test_result_to_dict_has_exactly_the_contract_keys(sb: Sandbox) -> None:
    """SampleResult.to_dict gives the documented keys and the isolation level in force."""
    result = await sb.run(GOOD, parse_spec(["assert f(1) == 2"]))
    data = result.to_dict()
    assert set(data) == {
        "passed",
        "n_passed",
        "n_total",
        "category",
        "isolation",
        "tests",
        "wall_ms",
        "extraction",
        "code_sha256",
    }
    assert data["passed"] is True and data["category"] is None
    assert data["isolation"] == sb.isolation and sb.isolation in _isolation.LEVELS


async def test_failed_assert_reports_the_value_the_sample_returned(sb: Sandbox) -> None:
    """A failing assert says what the sample's call returned."""
    result = await sb.run("def f(x):\n    return x * 10\n", parse_spec(["assert f(1) == 2"]))
    assert result.category == "assertion_failed"
    assert result.tests[0].message == "assertion failed: f(1) -> 10"


async def test_syntax_error_is_its_own_category(sb: Sandbox) -> None:
    """A sample that does not compile fails every test as syntax_error."""
    result = await sb.run("def f(x) return x", parse_spec(["assert f(1) == 1", "assert f(2) == 2"]))
    assert [t.error_type for t in result.tests] == ["syntax_error", "syntax_error"]


async def test_sample_category_is_the_first_failing_test(sb: Sandbox) -> None:
    """The sample's category is that of its first failing test, in spec order."""
    code = "def f(x):\n    if x == 2:\n        raise ValueError('two')\n    return x\n"
    result = await sb.run(
        code, parse_spec(["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 4"])
    )
    assert [t.error_type for t in result.tests] == [None, "runtime_error", "assertion_failed"]
    assert result.category == "runtime_error" and result.n_passed == 1
    assert result.tests[1].message == "ValueError: two"


async def test_asserts_using_setup_helpers_are_judged_outside_the_sample(sb: Sandbox) -> None:
    """Setup code the skeleton calls runs in the judge; the verdict follows the values."""
    spec = parse_spec(
        {
            "asserts": ["assert f(3) == helper(3)", "assert math.isclose(g(), 0.5)"],
            "setup": "import math\ndef helper(x):\n    return x + 1\n",
        }
    )
    good = "def f(x):\n    return x + 1\ndef g():\n    return 0.5\n"
    bad = "def f(x):\n    return x\ndef g():\n    return 0.25\n"
    results = await sb.run_many([good, bad], spec)
    assert [r.n_passed for r in results] == [2, 0]


async def test_comprehension_asserts_are_judged_whole_outside_the_sample(sb: Sandbox) -> None:
    """An assert with sample calls inside a comprehension is evaluated by the judge, call by call."""
    spec = parse_spec(["assert all(f(i) == i + 1 for i in range(3))"])
    result = await sb.run(GOOD, spec)
    assert result.passed and result.tests[0].message is None
    assert not (await sb.run("def f(x):\n    return x\n", spec)).passed
    forged = "import builtins\nbuiltins.all = lambda it: True\nall = builtins.all\n"
    assert not (await sb.run(forged + "def f(x):\n    return x\n", spec)).passed


CASES = [
    ("exact", "def f(x):\n    return x + 1\n", {"args": [1], "expected": 2}, 0, True),
    ("int_for_float", "def f(x):\n    return 2\n", {"args": [1], "expected": 2.0}, 0, True),
    (
        "float_within_atol",
        "def f(x):\n    return 0.1 + 0.2\n",
        {"args": [1], "expected": 0.3},
        1e-9,
        True,
    ),
    (
        "float_outside_atol",
        "def f(x):\n    return 0.3 + 1e-6\n",
        {"args": [1], "expected": 0.3},
        0,
        False,
    ),
    (
        "nested_atol",
        "def f(x):\n    return [[0.1 + 0.2]]\n",
        {"args": [1], "expected": [[0.3]]},
        1e-9,
        True,
    ),
    (
        "tuple_is_not_list",
        "def f(x):\n    return (1, 2)\n",
        {"args": [1], "expected": [1, 2]},
        0,
        False,
    ),
    (
        "dict_output",
        "def f(x):\n    return {'a': x}\n",
        {"args": [1], "expected": {"a": 1}},
        0,
        True,
    ),
    (
        "args_are_fresh_lists",
        "def f(x):\n    x.append(9)\n    return len(x)\n",
        {"args": [[1]], "expected": 2},
        0,
        True,
    ),
    ("none_output", "def f(x):\n    pass\n", {"args": [1], "expected": None}, 0, True),
]


@pytest.mark.parametrize(
    ("name", "code", "case", "atol", "passed"), CASES, ids=[c[0] for c in CASES]
)
async def test_cases_compare_outputs_by_type_and_tolerance(
    sb: Sandbox, name: str, code: str, case: dict[str, object], atol: float, passed: bool
) -> None:
    """Case outputs equal the expected values by type, recursively, floats within atol."""
    spec = parse_spec({"entry_point": "f", "cases": [case], "atol": atol})
    result = await sb.run(code, spec)
    assert result.passed is passed, result.tests
    if not passed:
        assert result.category == "wrong_output"


async def test_non_data_output_fails_as_wrong_output(sb: Sandbox) -> None:
    """A case returning an object (which could forge __eq__) fails and names the type."""
    code = "class A:\n    def __eq__(self, o):\n        return True\ndef f(x):\n    return A()\n"
    result = await sb.run(
        code, parse_spec({"entry_point": "f", "cases": [{"args": [1], "expected": 1}]})
    )
    assert result.category == "wrong_output"
    assert result.tests[0].message == "returned a non-data value of type A"


async def test_missing_entry_point_is_a_runtime_error(sb: Sandbox) -> None:
    """Cases against a program without the entry point fail as runtime_error."""
    result = await sb.run(
        "def g(x):\n    return x\n",
        parse_spec({"entry_point": "f", "cases": [{"args": [1], "expected": 1}]}),
    )
    assert result.category == "runtime_error"


async def test_reference_outputs_drop_raising_and_unstable_inputs(sb: Sandbox) -> None:
    """Expected values come from the reference; inputs where it raises or varies are dropped."""
    reference = (
        "def f(x):\n"
        "    if x == 0:\n"
        "        raise ZeroDivisionError\n"
        "    if x == 5:\n"
        "        return hash('unstable')  # the two zygotes have different string-hash seeds\n"
        "    return 10 // x\n"
    )
    spec = parse_spec(
        {
            "entry_point": "f",
            "reference": reference,
            "cases": [{"args": [1]}, {"args": [0]}, {"args": [2]}, {"args": [5]}],
        }
    )
    assert isinstance(spec, CasesSpec)
    resolved = await sb.resolve(spec)
    assert resolved.dropped == (1, 3)
    assert [c.expected for c in resolved.cases] == [10, 5]
    assert await sb.resolve(spec) is resolved
    result = await sb.run("def f(x):\n    return 10 // x\n", spec)
    assert (result.passed, result.n_total) == (True, 2)


async def test_a_reference_that_fails_says_so_and_leaves_nothing_behind(sb: Sandbox) -> None:
    """A reference failing on every case is a SpecError, each time it is asked for, and the
    per-spec lock of a failed resolution is not kept (a client could otherwise grow it at will)."""
    for n in range(3):
        spec = parse_spec(
            {
                "entry_point": "f",
                "reference": f"def f(x):\n    raise ValueError({n})\n",
                "cases": [{"args": [1]}],
            }
        )
        assert isinstance(spec, CasesSpec)
        for _ in range(2):
            with pytest.raises(SpecError, match="failed on every case"):
                await sb.resolve(spec)
    assert sb._resolving == {}


def test_time_limits_beyond_a_day_are_refused() -> None:
    """A huge (or infinite) time limit would overflow the zygote's select() timeout and take the
    sandbox down, blaming every sample: it is refused when the limits are built."""
    for value in (86_401.0, 1e9, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match=r"limits.wall_s: must be a number in \(0, 86400\]"):
            Limits(wall_s=value)
    assert Limits(wall_s=86_400.0, cpu_s=86_400.0).wall_s == 86_400.0


async def test_run_many_keeps_the_answers_order(sb: Sandbox) -> None:
    """run_many returns one result per answer, in the answers' order."""
    answers = [GOOD if i % 3 else "def f(x):\n    return 0\n" for i in range(7)]
    results = await sb.run_many(answers, parse_spec(["assert f(1) == 2"]))
    assert [r.passed for r in results] == [bool(i % 3) for i in range(7)]
    assert all(isinstance(r, SampleResult) for r in results)


async def test_a_killed_zygote_is_replaced(sb: Sandbox) -> None:
    """If the zygote dies, the next sample still runs (in a new zygote)."""
    pid = sb.zygote_pid
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    result = await sb.run(GOOD, parse_spec(["assert f(1) == 2"]))
    assert result.passed
    assert sb.zygote_pid not in (None, pid)


async def test_a_crash_looping_zygote_falls_back_to_fresh_interpreters(sb: Sandbox) -> None:
    """After three zygote deaths in a minute, samples still run, each in a fresh interpreter."""
    spec = parse_spec(["assert f(1) == 2"])
    for _ in range(3):
        pid = sb.zygote_pid
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        assert (await sb.run(GOOD, spec)).passed
    assert sb._crash_looping()
    results = await sb.run_many([GOOD, "def f(x):\n    return 0\n"], spec)
    assert [r.passed for r in results] == [True, False]
    assert {r.isolation for r in results} == {sb.isolation}


async def test_no_isolation_is_reported_in_every_result_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forcing isolation 'none' warns once and says 'none' in each result."""
    monkeypatch.setattr(_isolation, "_warned", False)
    with pytest.warns(RuntimeWarning, match="no network namespace"):
        async with Sandbox(concurrency=1, isolation="none") as sandbox:
            results = await sandbox.run_many(
                [GOOD, "def f(x):\n    return 0\n"], parse_spec(["assert f(1) == 2"])
            )
    assert [(r.passed, r.isolation) for r in results] == [(True, "none"), (False, "none")]


async def test_unknown_isolation_level_is_refused() -> None:
    """Asking for an isolation level that does not exist raises SandboxError."""
    from firstpass.errors import SandboxError

    with pytest.raises(SandboxError, match="unknown isolation level"):
        async with Sandbox(isolation="chroot"):
            pass


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("level", ["netns", "uid", "none"])
async def test_weaker_levels_still_judge_and_report_themselves(level: str) -> None:
    """Each fallback level gives the same verdicts and names itself in every result."""
    if level != "none" and os.geteuid() != 0:
        pytest.skip("forcing this level needs root")
    tamper = "import os\nos.write(3, b'zz')\ndef f(x):\n    return x + 1\n"
    async with Sandbox(concurrency=2, isolation=level) as sandbox:
        results = await sandbox.run_many(
            [GOOD, "def f(x):\n    return x\n", tamper], parse_spec(["assert f(1) == 2"])
        )
    assert [(r.passed, r.category) for r in results] == [
        (True, None),
        (False, "assertion_failed"),
        (False, "sandbox_violation"),
    ]
    assert {r.isolation for r in results} == {level}


async def test_a_cancelled_run_keeps_its_slot_until_the_sample_is_stopped() -> None:
    """Cancelling a run does not let the next sample share its slot while it still runs. The
    cancel comes once the hanging sample runs (its worker is alive, where uids show it); the
    good samples after it get a roomy wall limit, as a loaded machine is slow, not hung."""
    from tests.sandbox_helpers import processes_of

    async with Sandbox(concurrency=1, limits=Limits(cpu_s=1, wall_s=1)) as sandbox:
        spec = parse_spec(["assert f(1) == 2"])
        hang = asyncio.ensure_future(sandbox.run("while True:\n    pass\n", spec))
        if sandbox.worker_uids:
            deadline = time.monotonic() + 60
            while not await asyncio.to_thread(processes_of, sandbox.worker_uids):
                assert time.monotonic() < deadline and not hang.done(), "it never started"
                await asyncio.sleep(0.01)
        else:  # no uids to watch: give it a moment to start
            await asyncio.sleep(0.2)
        hang.cancel()
        with pytest.raises(asyncio.CancelledError):
            await hang
        t0 = time.monotonic()
        results = await sandbox.run_many([GOOD] * 3, spec, limits=Limits(cpu_s=5, wall_s=60))
    assert all(r.passed for r in results)
    assert time.monotonic() - t0 >= 0.5  # it waited for the hanging sample's limits


async def test_an_answer_holding_a_lone_surrogate_is_a_failed_result_not_an_exception(
    sb: Sandbox,
) -> None:
    """A model's answer can carry a lone surrogate (an upstream's ``\\ud800`` escape): its
    code is no text Python can load, so it fails as a result with a hash of its own, instead
    of raising (once a 500 ``internal_error`` for the request)."""
    answer = "```python\ndef f(x):\n    # \ud800\n    return x + 1\n```"
    result = await sb.run(answer, parse_spec(["assert f(1) == 2"]))
    assert not result.passed and result.category == "runtime_error"
    assert len(result.code_sha256) == 64
