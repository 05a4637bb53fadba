"""CPU fairness: one sample's processes cannot starve other samples into a ``timeout``.

The attack (issue 23, item 2): a sample forks ~30 spinning children, each in a session of its
own (its own scheduler autogroup: one share of the CPUs per child). Before the slot cpu
cgroups, every concurrent correct sample, in another slot or in another sandbox on the host,
failed with ``timeout``: per-test budgets were wall clock and nothing bounded a sample's CPU
as a whole. Now each slot's sample is one scheduling entity (equal weight, at most one CPU)
and budgets are the sample's own CPU time, so the correct samples pass as they do alone.

The correct samples' work is a fixed amount of computation, far under their CPU budget; the
test waits on conditions (the hog's processes running), never on fixed sleeps.
"""

from __future__ import annotations

import asyncio
import os
import time

import pytest

from firstpass.sandbox import Limits, Sandbox, parse_spec
from tests.sandbox_helpers import processes_of

pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root (uid isolation and cgroups)"),
    pytest.mark.timeout(300),
    pytest.mark.slow,  # hogs run against real CPU limits (~8 s together)
]

#: 30 children, each in its own session, spinning; the sample itself then sleeps with its
#: timers ignored, so that it lives until its limits (here: generous ones) or the sandbox end it
HOG = """
import os, signal, time
for _ in range(30):
    if os.fork() == 0:
        os.setsid()
        while True:
            pass
def f(n):
    for sig in (signal.SIGALRM, signal.SIGPROF, signal.SIGXCPU):
        signal.signal(sig, signal.SIG_IGN)
    while True:
        time.sleep(1)
"""
HOG_LIMITS = Limits(cpu_s=120, wall_s=120, nproc=32)
#: a fixed amount of work per test: ~0.1 s of CPU here, a small part of the test's budget
GOOD = """
def f(n):
    s = 0
    for i in range(n):
        s += i * i
    return s
"""
N = 1_500_000
SPEC = parse_spec([f"assert f({N + k}) == {sum(i * i for i in range(N + k))}" for k in range(4)])
#: samples per sandbox per round: more than its slots, so slots are reused beside the hog
PER_SANDBOX = 6


def _hog_processes(sb: Sandbox) -> int:
    return len(processes_of(sb.worker_uids))


async def _until(cond: object, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s  # a bound on a hang, not a measurement
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def _correct(a: Sandbox, b: Sandbox) -> tuple[int, int, list[str]]:
    ra, rb = await asyncio.gather(
        a.run_many([GOOD] * PER_SANDBOX, SPEC), b.run_many([GOOD] * PER_SANDBOX, SPEC)
    )
    results = [*ra, *rb]
    failures = [f"{t.error_type}: {t.message}" for r in results for t in r.tests if not t.passed]
    return sum(r.passed for r in results), len(results), failures


async def test_a_hog_forking_spinners_in_their_own_sessions_starves_no_other_sample() -> None:
    """Correct samples in the hog's sandbox (other slots) and in a second sandbox (another
    "firstpass process") pass beside a sample of 30 spinning setsid() children, as they do
    alone."""
    limits = Limits(cpu_s=5, wall_s=10)
    async with Sandbox(concurrency=3, limits=limits) as a, Sandbox(concurrency=3) as b:
        if a.isolation != "netns+uid":
            pytest.skip("needs the netns+uid level")
        alone = await _correct(a, b)
        assert alone[0] == alone[1], alone[2][:3]

        hog = asyncio.ensure_future(a.run(HOG, SPEC, HOG_LIMITS))
        try:
            await _until(lambda: _hog_processes(a) >= 25, "the hog never started its children")
            beside = await _correct(a, b)
            still = _hog_processes(a)
        finally:
            hog.cancel()  # its slot stays taken until the sandbox ends it on close
        assert still >= 25, "the hog ended before the correct samples did: nothing was shown"
        assert beside[0] == beside[1], (
            f"{beside[0]}/{beside[1]} passed beside the hog ({alone[0]}/{alone[1]} alone): "
            f"{beside[2][:3]}"
        )


async def test_a_sample_s_processes_together_are_held_to_cpu_s() -> None:
    """Children that spin (each under RLIMIT_CPU alone) end with the sample's CPU limit of all
    its processes together, long before its wall-clock limit."""
    code = """
import os, signal, time
for _ in range(3):
    if os.fork() == 0:
        while True:
            pass
def f(n):
    for sig in (signal.SIGALRM, signal.SIGPROF, signal.SIGXCPU):
        signal.signal(sig, signal.SIG_IGN)
    time.sleep(1000)
"""
    async with Sandbox(concurrency=1) as sb:
        if sb.isolation != "netns+uid":
            pytest.skip("needs the netns+uid level")
        result = await sb.run(code, parse_spec(["assert f(1) is None"]), Limits(cpu_s=1, wall_s=60))
        if "all its processes" not in (result.tests[0].message or ""):
            pytest.skip("no cpu controller on this host: only RLIMIT_CPU per process holds")
        assert result.category == "timeout"
