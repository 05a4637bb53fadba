"""The setup-code judge (J) under concurrency: every job gets its own judge's verdict, once.

Asserts whose skeleton calls setup code are judged in a process the zygote forks per sample.
While J runs, the job's other events (its worker's exit status, its stdout closing in the same
``select`` batch as its result channel) must neither start a second judge nor read a pipe whose
number was just freed and handed to another judge.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator

import pytest

from firstpass.sandbox import Limits, Sandbox, parse_spec

#: ``helper`` and ``sys`` come from setup, so both skeletons run in J
SPEC = parse_spec(
    {
        "asserts": [
            "assert helper(f(1)) == 2",
            "assert sys.getsizeof(f(2)) == sys.getsizeof(2)",
        ],
        "setup": "import sys\ndef helper(x):\n    return x + 1\n",
    }
)
GOOD = "def f(x):\n    return x\n"
NOISY = "print('x' * 50_000)\n" + GOOD  # its stdout closes in the same batch as its channel
BAD = "def f(x):\n    return str(x)\n"
ROUNDS = 40


@pytest.fixture
async def sb() -> AsyncIterator[Sandbox]:
    # generous limits: a loaded machine must not turn a verdict into a timeout
    async with Sandbox(concurrency=4, limits=Limits(cpu_s=5, wall_s=10)) as sandbox:
        yield sandbox


async def test_correct_samples_judged_by_setup_code_pass_when_run_concurrently(
    sb: Sandbox,
) -> None:
    """Correct samples judged in J next to noisy and failing ones all pass, round after round."""
    for _ in range(ROUNDS):
        results = await sb.run_many([GOOD, NOISY, BAD, GOOD], SPEC)
        got = [r.n_passed for r in results]
        assert got == [2, 2, 0, 2], [t.message for r in results for t in r.tests]


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


async def _settled_fds(pid: int) -> int:
    """The zygote's descriptor count once it has stopped changing (the answer to a run is sent
    before the slot's cleanup closes the run's pipes, so a count taken at once may include
    them)."""
    last, stable_since = _open_fds(pid), time.monotonic()
    deadline = stable_since + 3
    while time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        now = _open_fds(pid)
        if now != last:
            last, stable_since = now, time.monotonic()
        elif time.monotonic() - stable_since >= 0.3:
            break
    return last


async def test_zygote_keeps_no_descriptor_of_a_finished_judged_job(sb: Sandbox) -> None:
    """After judged runs the zygote holds no more descriptors than it held before them (the old
    code leaked a judge pipe on about half of the judged jobs)."""
    pid = sb.zygote_pid
    assert pid is not None
    await sb.run(GOOD, SPEC)
    try:
        before = await _settled_fds(pid)
    except PermissionError:
        pytest.skip("the zygote's /proc/<pid>/fd is not readable here")
    for _ in range(10):
        results = await sb.run_many([GOOD, GOOD], SPEC)
        assert [r.n_passed for r in results] == [2, 2]
    assert await _settled_fds(pid) <= before
