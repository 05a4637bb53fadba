"""Time budgets and the judge<->worker link (issue 23, items 2 and 6).

* A test's budget is the CPU time of the sample's processes, not wall clock; the codec's work
  on large values has its own allowance, so a correct function returning 2.5M elements passes.
* Every request carries an id its answer echoes, and the judge's own timer never interrupts an
  exchange: a late answer is never taken for a later test's.
* A sample that sleeps still times out, test by test (the wall-clock backstop).
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from firstpass.sandbox import Limits, Sandbox, parse_spec
from firstpass.sandbox._child import frames
from firstpass.sandbox._child.failures import JudgeTimeout, SampleFailure, Violation
from firstpass.sandbox._child.link import EXCHANGE, Link, on_alarm
from tests.sandbox_helpers import processes_of

#: slow: samples run to their real CPU and wall budgets (~9 s together)
pytestmark = pytest.mark.slow

N = 2_500_000

# --------------------------------------------------------------------------- the link, alone


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    j, w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    yield j, w
    j.close()
    w.close()


def _worker(w: socket.socket, answers: list[Any]) -> threading.Thread:
    """A stand-in worker: reads one request per answer and writes what ``answers`` says (a
    function of the request's id: a list of records to send)."""

    def serve() -> None:
        for make in answers:
            req = frames.read_frame(w.fileno())
            assert isinstance(req, dict)
            for rec in make(req["id"]):
                frames.write_all(w.fileno(), frames.encode_frame(rec))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return t


def test_an_answer_must_echo_its_request_id(pair: tuple[socket.socket, socket.socket]) -> None:
    j, w = pair
    link = Link(j.fileno(), per_test_s=10.0)
    _worker(w, [lambda i: [{"v": 1, "id": i}], lambda i: [{"v": 2, "id": i + 1}]])
    assert link.ask({"op": "get", "n": ["x"]})["v"] == 1
    with pytest.raises(Violation, match="no pending request"):
        link.ask({"op": "get", "n": ["x"]})  # an answer to a request not made yet


def test_an_answer_without_an_id_is_a_violation(pair: tuple[socket.socket, socket.socket]) -> None:
    j, w = pair
    link = Link(j.fileno(), per_test_s=10.0)
    _worker(w, [lambda i: [{"v": 1}]])
    with pytest.raises(Violation):
        link.ask({"op": "get", "n": ["x"]})


def test_the_late_answer_to_a_request_given_up_on_is_skipped(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """The answer to an abandoned request arrives before the next one's: the next request
    still gets its own answer; the same late answer a second time is a violation."""
    j, w = pair
    link = Link(j.fileno(), per_test_s=10.0)
    link.seq += 1  # request 1 was sent and given up on
    link.abandoned.add(link.seq)
    _worker(
        w,
        [
            lambda i: [{"v": "late", "id": i - 1}, {"v": "mine", "id": i}],
            lambda i: [{"v": "late", "id": 1}],
        ],
    )
    assert link.ask({"op": "get", "n": ["x"]})["v"] == "mine"
    assert not link.abandoned
    with pytest.raises(Violation):
        link.ask({"op": "get", "n": ["x"]})


def test_the_judge_s_timer_takes_effect_after_the_exchange_never_inside_it(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    """The judge's timer fires while half an answer has arrived: the answer is still read
    whole (then the timeout is raised), and the next request gets its own answer."""
    j, w = pair
    link = Link(j.fileno(), per_test_s=10.0)
    main = threading.get_ident()
    old = signal.signal(signal.SIGPROF, on_alarm)

    def serve() -> None:
        req = frames.read_frame(w.fileno())
        assert isinstance(req, dict)
        frame = frames.encode_frame({"v": list(range(1000)), "id": req["id"]})
        frames.write_all(w.fileno(), frame[:100])
        signal.pthread_kill(main, signal.SIGPROF)  # the judge is blocked reading the rest
        deadline = time.monotonic() + 30
        while not EXCHANGE[1] and time.monotonic() < deadline:
            time.sleep(0.001)
        frames.write_all(w.fileno(), frame[100:])
        req = frames.read_frame(w.fileno())
        assert isinstance(req, dict)
        frames.write_all(w.fileno(), frames.encode_frame({"v": "second", "id": req["id"]}))

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    try:
        with pytest.raises(JudgeTimeout):
            link.ask({"op": "get", "n": ["x"]})
        assert link.ask({"op": "get", "n": ["y"]})["v"] == "second"
    finally:
        # a CPU timer the exchange armed must not outlive the test: with the default handler
        # back, its SIGPROF would end the whole pytest process ("Profiling timer expired")
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
        EXCHANGE[:] = [False, False]
    t.join(5)


def _usage(path: Path, seconds: float) -> None:
    path.write_text(f"{int(seconds * 1e9)}\n")


def test_a_test_s_budget_is_the_sample_s_cpu_time_not_wall_clock(
    pair: tuple[socket.socket, socket.socket], tmp_path: Path
) -> None:
    """Measured in the slot's CPU usage (a stand-in file here): time passing without CPU use
    costs the test nothing; CPU beyond the budget is a timeout even when the worker answers."""
    j, w = pair
    usage = tmp_path / "cpuacct.usage"
    _usage(usage, 100.0)
    link = Link(j.fileno(), per_test_s=1.0, cpu_usage=[str(usage), "ns"])
    try:
        _worker(w, [lambda i: [{"v": 1, "id": i}]] * 2)
        link.start_test()
        assert link.budget() == pytest.approx(1.0)  # no CPU used: the whole budget, any time
        _usage(usage, 100.9)
        assert link.ask({"op": "get", "n": ["x"]})["v"] == 1  # within its budget
        assert 0 < link.budget() < 0.11
        link.start_test()
        _usage(usage, 102.5)  # the sample computed 1.6 s for this test, its timer stopped
        with pytest.raises(SampleFailure) as exc:
            link.ask({"op": "get", "n": ["x"]})
        assert exc.value.cat == "timeout"
    finally:
        link.close()


# --------------------------------------------------------------------------- end to end


@pytest.fixture
async def sb() -> Any:
    async with Sandbox(concurrency=2) as sandbox:
        yield sandbox


async def test_a_correct_function_returning_2_5m_elements_passes(sb: Sandbox) -> None:
    """Encoding and decoding 2.5M elements is the codec's work, not the test's budget: with
    several tests (a quarter of the budget each) and in cases (a case's budget) alike. The
    codec's time depends on the machine; the budgets here are CPU time."""
    code = "def f(n):\n    return list(range(n))\ndef g(x):\n    return x + 1\n"
    asserts = parse_spec(
        [f"assert f({N}) == list(range({N}))", "assert g(1) == 2", "assert g(2) == 3"]
    )
    cases = parse_spec(
        {
            "entry_point": "f",
            "cases": [
                {"args": [N], "expected": list(range(N))},
                {"args": [3], "expected": [0, 1, 2]},
            ],
        }
    )
    for spec in (asserts, cases):  # 0.5 s a test; the codec's work is more than that here
        result = await sb.run(code, spec, Limits(cpu_s=2, wall_s=10))
        assert result.passed, [t.message for t in result.tests]


#: test 1's function stops the worker's timer from ending it (it swallows the timeout) and
#: answers after ~2.5 s of CPU time: past its 1 s budget, past the judge's old wall timer
LATE = """
import time
def slow(x):
    end = time.process_time() + 2.5
    while True:
        try:
            while time.process_time() < end:
                pass
            return x
        except BaseException:
            continue
def g(x):
    return x + 1
"""
LATE_SPEC = parse_spec(
    ["assert slow(1) == 1", "assert g(1) == 2", "assert g(2) == 3", "assert g(3) == 4"]
)


async def test_a_late_answer_is_a_timeout_and_later_tests_get_their_own_answers(
    sb: Sandbox,
) -> None:
    """Test 1's answer arrives long after its budget: test 1 is a timeout (the judge checks
    the sample's CPU time itself), and tests 2..4 are judged on their own answers."""
    result = await sb.run(LATE, LATE_SPEC, Limits(cpu_s=4, wall_s=30))
    got = [(t.passed, t.error_type) for t in result.tests]
    assert got == [(False, "timeout"), (True, None), (True, None), (True, None)], [
        t.message for t in result.tests
    ]


async def test_a_sleeping_test_times_out_alone(sb: Sandbox) -> None:
    """Sleeping uses no CPU: the wall-clock backstop ends that test, and only that one."""
    code = "import time\ndef f(x):\n    if x == 1:\n        time.sleep(600)\n    return x\n"
    spec = parse_spec(["assert f(1) == 1", "assert f(2) == 2", "assert f(3) == 3"])
    result = await sb.run(code, spec, Limits(cpu_s=2, wall_s=60))
    assert [t.error_type for t in result.tests] == ["timeout", None, None]
    assert "wall clock" in (result.tests[0].message or "")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root (uids and cgroups)")
async def test_the_sample_and_its_judge_run_in_their_slot_s_cgroups(sb: Sandbox) -> None:
    """The sample's processes are in its slot's cgroups; its judge in the slot's judge cgroups
    (cpu, and memory with the judge's own limit), never in the sample's."""
    code = (
        "import time\n"
        "def where():\n"
        "    return open('/proc/self/cgroup').read().splitlines()\n"
        "def wait(x):\n"
        "    time.sleep(x)\n"
        "    return x\n"
    )
    spec = parse_spec(
        [
            "assert any('/firstpass-' in ln and '/slot-' in ln for ln in where())",
            "assert not any('/judge-' in ln for ln in where())",
            "assert wait(0.5) == 0.5",
        ]
    )
    run = asyncio.ensure_future(sb.run(code, spec, Limits(cpu_s=4, wall_s=30)))
    judges = frozenset(sb.uid_range) - sb.worker_uids
    deadline = time.monotonic() + 30
    seen: list[str] = []
    while not run.done() and not seen and time.monotonic() < deadline:
        for pid in processes_of(judges):
            seen.append(Path(f"/proc/{pid}/cgroup").read_text())
        await asyncio.sleep(0.01)
    result = await run
    if not seen:
        pytest.skip("no judge process seen while the job ran")
    lines = {ln.split(":", 2)[1]: ln.split(":", 2)[2] for ln in seen[0].splitlines()}
    cpu = next((p for c, p in lines.items() if "cpu" in c.split(",")), None)
    if cpu is None or "/firstpass-" not in cpu:
        pytest.skip("no cpu cgroup on this host")
    assert "/judge-" in cpu
    memory = lines.get("memory")
    if memory and "/firstpass-" in memory:
        assert "/judge-" in memory
        limit = Path("/sys/fs/cgroup/memory" + memory, "memory.limit_in_bytes")
        if limit.exists():
            assert int(limit.read_text()) >= 1024 << 20
    assert result.passed, [t.message for t in result.tests]
