"""Expected values from a reference: a case is dropped only for a property of the reference,
never for an accident of time, and an accident is never cached."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from firstpass.errors import SpecError
from firstpass.receipts import UNSET, DroppedCase, RequestInfo
from firstpass.sandbox import Limits, Sandbox, parse_spec
from firstpass.sandbox._child.frames import Response, RunRequest
from firstpass.sandbox._spec import CasesSpec

#: slow: references resolved against real CPU budgets (up to 5 s each, ~15 s together)
pytestmark = pytest.mark.slow

REF = "def f(x):\n    if x == 3:\n        raise ValueError('no threes: secret-input')\n    return x * 2\n"


@pytest.fixture
async def sb() -> AsyncIterator[Sandbox]:
    async with Sandbox(concurrency=2, limits=Limits(cpu_s=2, wall_s=4)) as sandbox:
        yield sandbox


def _spec(reference: str = REF, args: tuple[int, ...] = (1, 2, 3)) -> CasesSpec:
    spec = parse_spec(
        {"entry_point": "f", "cases": [{"args": [a]} for a in args], "reference": reference}
    )
    assert isinstance(spec, CasesSpec)
    return spec


class LoadedHost:
    """Wraps ``Sandbox._submit``: the first ``bad_tries`` reference runs time out on case 0,
    as they would on a host a neighbour starves (the real run's other answers are kept)."""

    def __init__(self, sb: Sandbox, bad_tries: int) -> None:
        self.real = sb._submit
        self.bad_tries = bad_tries
        self.calls = 0

    async def __call__(self, req: RunRequest, limits: Limits, *, alt: bool = False) -> Response:
        resp = await self.real(req, limits, alt=alt)
        if req.get("mode") == "outputs":
            self.calls += 1
            if (self.calls + 1) // 2 <= self.bad_tries:
                outputs = resp["outputs"]
                assert isinstance(outputs, list)  # a reference run's outputs: one per case
                tests, outputs = list(resp["tests"]), list(outputs)
                tests[0] = {"passed": False, "error_type": "timeout", "message": "budget"}
                outputs[0] = None
                resp = {**resp, "tests": tests, "outputs": outputs}
        return resp


async def test_a_case_the_reference_raises_on_is_dropped_and_said_on_the_result(
    sb: Sandbox,
) -> None:
    """The raising case is dropped with its reason (no message: it can quote hidden inputs)."""
    resolved = await sb.resolve(_spec())
    assert [c.expected for c in resolved.cases] == [2, 4]
    assert resolved.dropped == (2,)
    assert resolved.dropped_why == ("the reference failed: runtime_error (ValueError)",)
    result = await sb.run("def f(x):\n    return x * 2\n", _spec())
    assert result.passed and result.n_total == 2
    assert result.to_dict()["dropped_cases"] == [
        {"case": 2, "reason": "the reference failed: runtime_error (ValueError)"}
    ]
    assert "secret-input" not in str(result.to_dict())


async def test_a_timed_out_reference_case_is_run_again_not_dropped(
    sb: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One try that times out on a case (a loaded host): the case is tried again and kept, so a
    wrong answer failing only that case still fails."""
    host = LoadedHost(sb, bad_tries=1)
    monkeypatch.setattr(sb, "_submit", host)
    resolved = await sb.resolve(_spec(args=(1, 2)))
    assert [c.expected for c in resolved.cases] == [2, 4]
    assert resolved.dropped == ()
    assert host.calls == 4  # two tries, each in two interpreters
    wrong = "def f(x):\n    return 4 if x == 2 else 0\n"  # wrong only on case 0
    assert not (await sb.run(wrong, _spec(args=(1, 2)))).passed


async def test_a_reference_that_never_answers_a_case_fails_without_caching_it(
    sb: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every try times out on a case: SpecError says so, and once the load is gone the same
    spec resolves whole (the failure was not remembered)."""
    host = LoadedHost(sb, bad_tries=99)
    monkeypatch.setattr(sb, "_submit", host)
    with pytest.raises(SpecError, match="gave no answer on 1 case"):
        await sb.resolve(_spec(args=(1, 2)))
    monkeypatch.setattr(sb, "_submit", host.real)
    resolved = await sb.resolve(_spec(args=(1, 2)))
    assert [c.expected for c in resolved.cases] == [2, 4]


async def test_a_case_the_reference_cannot_finish_in_its_cpu_budget_is_dropped_and_said(
    sb: Sandbox,
) -> None:
    """A reference that uses up a case's own CPU-time budget in every one of three runs needs
    more than a sample may use: a property of the reference, dropped with that reason."""
    hang = "def f(x):\n    while x == 2:\n        pass\n    return x * 2\n"
    resolved = await sb.resolve(_spec(reference=hang, args=(1, 2)))
    assert [c.expected for c in resolved.cases] == [2]
    assert resolved.dropped == (1,)
    assert "CPU-time budget" in resolved.dropped_why[0]


async def test_cases_that_need_more_cpu_together_than_one_process_has_all_resolve(
    sb: Sandbox,
) -> None:
    """Cases not reached because earlier ones used the process's CPU limit are run again in a
    fresh process (never dropped): six cases of ~0.45 s CPU each under a 2 s process limit."""
    slow = (
        "import time\ndef f(x):\n    end = time.process_time() + 0.45\n"
        "    while time.process_time() < end:\n        pass\n    return x * 2\n"
    )
    resolved = await sb.resolve(_spec(reference=slow, args=(1, 2, 3, 4, 5, 6)))
    assert [c.expected for c in resolved.cases] == [2, 4, 6, 8, 10, 12]
    assert resolved.dropped == ()


async def test_a_reference_that_fails_on_every_case_is_remembered(sb: Sandbox) -> None:
    """Failing every case for a reason of its own is a property of the spec: cached."""
    bad = "def f(x):\n    raise KeyError(x)\n"
    with pytest.raises(SpecError, match=r"every case \(first: the reference failed"):
        await sb.resolve(_spec(reference=bad))
    assert _spec(reference=bad).digest in sb._resolve_failed


async def test_a_reference_that_does_not_load_is_a_property_of_the_reference(
    sb: Sandbox,
) -> None:
    """A reference raising as it loads fails every case for that reason, not as a timeout."""
    with pytest.raises(SpecError, match=r"runtime_error while loading"):
        await sb.resolve(_spec(reference="raise RuntimeError('x')\ndef f(x):\n    return x\n"))


async def test_a_reference_that_catches_its_own_timeout_gives_no_expected_value(
    sb: Sandbox,
) -> None:
    """A reference whose bare except swallows the case's timeout and returns a fallback: the
    case ran out of time all the same, so the fallback never becomes an expected value."""
    swallow = (
        "def f(x):\n    try:\n        while x == 2:\n            pass\n"
        "    except BaseException:\n        return -1\n    return x * 2\n"
    )
    resolved = await sb.resolve(_spec(reference=swallow, args=(1, 2)))
    assert [c.expected for c in resolved.cases] == [2]
    assert resolved.dropped == (1,) and "CPU-time budget" in resolved.dropped_why[0]


async def test_a_reference_that_returns_none_gives_none_as_the_expected_value(
    sb: Sandbox,
) -> None:
    """None is an answer (null on the wire), not a missing one: the case is kept."""
    ref = "def f(x):\n    return None if x == 2 else x\n"
    resolved = await sb.resolve(_spec(reference=ref, args=(1, 2)))
    assert [c.expected for c in resolved.cases] == [1, None]
    assert resolved.dropped == ()
    assert not (await sb.run("def f(x):\n    return x\n", _spec(reference=ref, args=(1, 2)))).passed


async def test_a_gate_on_a_shortened_spec_says_so_on_its_receipt_entry(sb: Sandbox) -> None:
    """The receipt's check entry of a run on a spec with dropped cases lists them (and one on
    a whole spec has no such field)."""
    from pathlib import Path

    from firstpass.config import load_config
    from firstpass.pipeline._trace import Trace
    from firstpass.pipeline._verify import StageResult

    config = load_config(Path(__file__).resolve().parent.parent / "firstpass.toml")
    trace = Trace(
        receipt_id="rcpt_test", config=config, route=None, mode="cascade", request=RequestInfo()
    )
    shortened = await sb.run("def f(x):\n    return x * 2\n", _spec())
    whole = await sb.run("def f(x):\n    return x * 2\n", _spec(args=(1, 2)))
    trace.check(rung_index=0, sample=0, kind="gate", result=StageResult(tests=shortened))
    trace.check(rung_index=0, sample=1, kind="gate", result=whole)
    assert trace.checks[0].dropped_cases == [
        DroppedCase(case=2, reason="the reference failed: runtime_error (ValueError)")
    ]
    assert trace.checks[1].dropped_cases is UNSET
