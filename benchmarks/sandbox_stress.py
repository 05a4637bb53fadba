"""Stress the sandbox: hostile samples beside samples whose verdict is known, then check the host.

    python -m benchmarks.sandbox_stress [--seconds 60] [--concurrency 4] [--in-flight 8]
        [--hostile 2] [--phase 5] [--cpu-s 2] [--wall-s 4] [--seed 0]

One ``Sandbox`` runs for ``--seconds`` (then stops launching, lets what is in flight finish and
closes; a run that does not finish by ``--seconds + 2·wall + 60`` s is reported as a hang):

- ``--in-flight`` *checked* streams (via ``asyncio.gather``) run samples whose verdict is known:
  correct ones (must pass) and deliberately wrong but harmless ones (must fail with
  ``assertion_failed`` / ``wrong_output``), on assert specs, case specs with expected values, a
  ``reference`` spec (resolved once) and a 500-term assert; now and then a ``run_many`` of five;
- ``--hostile`` *hostile* streams, in the mixed phases only (``--phase`` seconds mixed; then,
  once the hostile samples in flight have ended, as long without), run the hostile samples in
  turn (a fixed shuffled order): infinite loops, fork bombs, memory bombs
  (one process, and many processes), huge output, ~60 MB return values, deeply nested values, a
  hash-flooding list the judge turns into a set, signals to pid -1 and to the parent, closed
  descriptors, garbage and forged records on fd 3, sleeping past the wall limit with SIGALRM
  ignored, an interpreter crash through ctypes, a detached grandchild, files and a million
  hard links in /tmp. None of them may pass.

It prints markdown tables: runs per kind, wrong verdicts (a checked sample with the wrong
verdict, or a hostile one that passed: must be 0), the categories seen; then the p50 / p95
latency of checked samples (``sb.run`` from call to result, slot wait included) while hostile
samples were in flight beside them vs. while none was (nor had been for 1 s), both measured in
this run; every ``SandboxError``; ``sandbox_restarts`` and the zygote pids seen. After
``aclose()`` it checks the host: no process with a uid in ``sb.uid_range`` alive right after
it (a zombie awaiting init's reaping is listed, and fails only if still there 5 s later), no
``firstpass-*`` cgroup left under our memory cgroup (``/proc/self/cgroup``), no file left in
/tmp, /var/tmp or /dev/shm under the names the hostile samples used. Exit status 1 if any
check fails (a wrong verdict, a SandboxError, a hang, a leftover), else 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from firstpass.errors import SandboxError
from firstpass.sandbox import CasesSpec, Limits, Sandbox, parse_spec

#: files the hostile samples create start with this (the pid keeps concurrent runs apart)
TAG = f"fpstress-{os.getpid()}"
#: a checked sample that starts within this long after a hostile one ended is in neither column
SETTLE_S = 1.0


@dataclass(frozen=True)
class Kind:
    """One sample: ``group`` is correct / wrong / hostile; ``expect`` the category a wrong one
    must fail with (None: it must pass; hostile ones only must not pass)."""

    name: str
    group: str
    spec: str
    code: str
    expect: str | None = None


INC500 = " + ".join(f"inc({i})" for i in range(500))
SPECS: dict[str, Any] = {
    "add": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"],
    "desc": {
        "entry_point": "sort_desc",
        "cases": [
            {"args": [[3, 1, 2]], "expected": [3, 2, 1]},
            {"args": [[5]], "expected": [5]},
            {"args": [[2, 9, 4, 4]], "expected": [9, 4, 4, 2]},
        ],
    },
    "sq": {
        "entry_point": "sq",
        "cases": [{"args": [i]} for i in range(30)],
        "reference": "def sq(x):\n    return x * x\n",
    },
    "common": [
        "assert set(common([1, 2, 3], [2, 3, 4])) == {2, 3}",
        "assert set(common([1], [2])) == set()",
    ],
    "inc500": [f"assert {INC500} == {sum(range(1, 501))}"],
}

CHECKED: tuple[Kind, ...] = (
    Kind("add", "correct", "add", "def add(a, b):\n    return a + b\n"),
    Kind(
        "add, 500-term body",
        "correct",
        "add",
        "def add(a, b):\n    return " + " + ".join(["a", "b"] + ["(a - a)"] * 498) + "\n",
    ),
    Kind(
        "add, fenced answer",
        "correct",
        "add",
        "Here:\n```python\ndef add(a, b):\n    return b + a\n```\n",
    ),
    Kind(
        "sort_desc", "correct", "desc", "def sort_desc(xs):\n    return sorted(xs, reverse=True)\n"
    ),
    Kind("sq (reference spec)", "correct", "sq", "def sq(x):\n    return x ** 2\n"),
    Kind(
        "common (set assert)",
        "correct",
        "common",
        "def common(a, b):\n    return [x for x in a if x in b]\n",
    ),
    Kind("inc (500-term assert)", "correct", "inc500", "def inc(x):\n    return x + 1\n"),
    Kind("add, wrong", "wrong", "add", "def add(a, b):\n    return a - b\n", "assertion_failed"),
    Kind(
        "sort_desc, wrong",
        "wrong",
        "desc",
        "def sort_desc(xs):\n    return sorted(xs)\n",
        "wrong_output",
    ),
    Kind("sq, wrong", "wrong", "sq", "def sq(x):\n    return x * x + (x == 7)\n", "wrong_output"),
    Kind(
        "common, wrong",
        "wrong",
        "common",
        "def common(a, b):\n    return [min(a)]\n",
        "assertion_failed",
    ),
    Kind("inc, wrong", "wrong", "inc500", "def inc(x):\n    return x\n", "assertion_failed"),
)

HOSTILE: tuple[Kind, ...] = (
    Kind(
        "infinite loop (call)", "hostile", "add", "def add(a, b):\n    while True:\n        pass\n"
    ),
    Kind("infinite loop (load)", "hostile", "add", "while True:\n    pass\n"),
    Kind(
        "fork bomb",
        "hostile",
        "add",
        "import os\ndef add(a, b):\n    while True:\n        try:\n            os.fork()\n"
        "        except OSError:\n            pass\n",
    ),
    Kind(
        "memory bomb (one block)",
        "hostile",
        "add",
        "def add(a, b):\n    return len(bytearray(1 << 40))\n",
    ),
    Kind(
        "memory bomb (growing)",
        "hostile",
        "add",
        "def add(a, b):\n    keep = []\n    while True:\n        keep.append(b'x' * (1 << 24))\n",
    ),
    Kind(
        "memory in many processes",
        "hostile",
        "add",
        "import os, time\ndef add(a, b):\n    for _ in range(7):\n        if os.fork() == 0:\n"
        "            block = b'x' * (300 << 20)\n            time.sleep(60)\n            os._exit(0)\n"
        "    block = b'x' * (300 << 20)\n    time.sleep(60)\n    return 0\n",
    ),
    Kind(
        "huge output (stdout)",
        "hostile",
        "add",
        "def add(a, b):\n    while True:\n        print('x' * 10000)\n",
    ),
    Kind(
        "huge output (fd 2, at load)",
        "hostile",
        "add",
        "import os\nwhile True:\n    os.write(2, b'y' * 65536)\n",
    ),
    Kind(
        "huge return (60 MB str)", "hostile", "add", "def add(a, b):\n    return 'x' * 60_000_000\n"
    ),
    Kind(
        "huge return (60 MB list)",
        "hostile",
        "desc",
        "def sort_desc(xs):\n    return list(range(10_000_000, 17_500_000))\n",
    ),
    Kind(
        "deeply nested value",
        "hostile",
        "add",
        "def add(a, b):\n    v = []\n    for _ in range(200_000):\n        v = [v]\n    return v\n",
    ),
    Kind(
        "hash-flooding set",
        "hostile",
        "common",
        "def common(a, b):\n    m = (1 << 61) - 1\n    return [k * m for k in range(1, 80_000)]\n",
    ),
    Kind(
        "kill(-1) at load and in call",
        "hostile",
        "add",
        "import os, signal\nos.kill(-1, signal.SIGKILL)\ndef add(a, b):\n"
        "    os.kill(-1, signal.SIGKILL)\n    os.kill(-1, signal.SIGSTOP)\n    return 0\n",
    ),
    Kind(
        "kill parent / pid 1 / group",
        "hostile",
        "add",
        "import os, signal\ndef add(a, b):\n    for pid in (os.getppid(), 1, 0, -os.getpgrp()):\n"
        "        for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n"
        "            try:\n                os.kill(pid, sig)\n            except OSError:\n"
        "                pass\n    return 0\n",
    ),
    Kind(
        "kill every pid",
        "hostile",
        "add",
        "import os, signal\ndef add(a, b):\n    for pid in range(2, 40000):\n        try:\n"
        "            os.kill(pid, signal.SIGKILL)\n        except OSError:\n            pass\n"
        "    return 0\n",
    ),
    Kind(
        "close all fds (correct code)",
        "hostile",
        "add",
        "import os\nos.closerange(0, 4096)\ndef add(a, b):\n    return a + b\n",
    ),
    Kind(
        "garbage on fd 3 (correct code)",
        "hostile",
        "add",
        "import os\nos.write(3, b'\\x00\\x00\\x00\\x07garbage' + b'\\xff' * 100)\n"
        "def add(a, b):\n    return a + b\n",
    ),
    Kind(
        "forged records on fd 3",
        "hostile",
        "add",
        "import os, json, struct\ndef frame(o):\n    d = json.dumps(o).encode()\n"
        "    return struct.pack('>I', len(d)) + d\n"
        "os.write(3, frame({'t': 'load'}) + frame({'vals': [{'v': 3}]}) + frame({'v': True}))\n"
        "def add(a, b):\n    os.write(3, frame({'v': 3}) * 3)\n    return 0\n",
    ),
    Kind(
        "exit 0 at load",
        "hostile",
        "add",
        "import os\nos._exit(0)\n",
    ),
    Kind(
        "sleep past the wall limit",
        "hostile",
        "add",
        "import signal, time\nsignal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "signal.signal(signal.SIGXCPU, signal.SIG_IGN)\nsignal.setitimer(signal.ITIMER_REAL, 0)\n"
        "time.sleep(3600)\n",
    ),
    Kind(
        "sleep past the wall limit (call)",
        "hostile",
        "add",
        "import signal, time\ndef add(a, b):\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "    signal.setitimer(signal.ITIMER_REAL, 0)\n    time.sleep(3600)\n",
    ),
    Kind("ctypes crash (load)", "hostile", "add", "import ctypes\nctypes.string_at(0)\n"),
    Kind(
        "ctypes crash (call)",
        "hostile",
        "desc",
        "import ctypes\ndef sort_desc(xs):\n    ctypes.memset(0, 1, 1 << 20)\n",
    ),
    Kind(
        "detached grandchild",
        "hostile",
        "add",
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        time.sleep(3600)\n    os._exit(0)\ndef add(a, b):\n    return 0\n",
    ),
    Kind(
        "files in /tmp, /var/tmp, /dev/shm",
        "hostile",
        "add",
        "def add(a, b):\n    for d in ('/tmp', '/var/tmp', '/dev/shm', '.'):\n        try:\n"
        f"            with open(d + '/{TAG}-file', 'wb') as f:\n"
        "                f.write(b'z' * (1 << 20))\n        except OSError:\n            pass\n"
        "    return 0\n",
    ),
    Kind(
        "a million hard links in /tmp",
        "hostile",
        "add",
        f"import os\ndef add(a, b):\n    base = '/tmp/{TAG}-link'\n    open(base, 'w').close()\n"
        "    for i in range(1_000_000):\n        os.link(base, base + '-' + str(i))\n    return 0\n",
    ),
    Kind(
        "forged __eq__",
        "hostile",
        "add",
        "class Any:\n    def __eq__(self, other):\n        return True\n"
        "def add(a, b):\n    return Any()\n",
    ),
    Kind(
        "int subclass with forged __eq__",
        "hostile",
        "desc",
        "class I(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def sort_desc(xs):\n    return [I(0)] * len(xs)\n",
    ),
    Kind(
        "patched builtins and harness",
        "hostile",
        "add",
        "import builtins, sys\nbuiltins.AssertionError = type('N', (Exception,), {})\n"
        "for m in list(sys.modules.values()):\n    for n in ('verdict', 'failure', 'send'):\n"
        "        if hasattr(m, n):\n            try:\n                setattr(m, n, lambda *a, **k: None)\n"
        "            except Exception:\n                pass\ndef add(a, b):\n    return 0\n",
    ),
)


@dataclass
class Tally:
    """What the streams saw."""

    runs: Counter[str] = field(default_factory=Counter)
    wrong: Counter[str] = field(default_factory=Counter)
    wrong_examples: list[str] = field(default_factory=list)
    categories: dict[str, Counter[str]] = field(default_factory=dict)
    latency: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    restarts: int = 0
    zygote_pids: set[int] = field(default_factory=set)
    hostile_ms: list[float] = field(default_factory=list)


class Phases:
    """Which checked samples had a hostile one in flight beside them at any moment."""

    def __init__(self) -> None:
        self.hostile_active = 0
        self.hostile_last_end = -1e9
        self.running: dict[int, bool] = {}  # token -> saw a hostile sample
        self.tokens = 0

    def begin_checked(self) -> int:
        self.tokens += 1
        recent = time.monotonic() - self.hostile_last_end < SETTLE_S
        self.running[self.tokens] = self.hostile_active > 0 or recent
        return self.tokens

    def end_checked(self, token: int) -> bool:
        return self.running.pop(token)

    def begin_hostile(self) -> None:
        self.hostile_active += 1
        for token in self.running:
            self.running[token] = True

    def end_hostile(self) -> None:
        self.hostile_active -= 1
        self.hostile_last_end = time.monotonic()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def _record(tally: Tally, kind: Kind, result: Any) -> None:
    tally.runs[kind.name] += 1
    tally.restarts += result.sandbox_restarts
    tally.categories.setdefault(kind.name, Counter())[result.category or "pass"] += 1
    if kind.group == "correct":
        bad = not result.passed
    elif kind.group == "wrong":
        bad = result.passed or result.category != kind.expect
    else:
        bad = result.passed
    if bad:
        tally.wrong[kind.name] += 1
        if len(tally.wrong_examples) < 10:
            msgs = "; ".join(f"{t.error_type}: {t.message}" for t in result.tests if not t.passed)
            tally.wrong_examples.append(
                f"{kind.name}: passed={result.passed} category={result.category} ({msgs[:200]})"
            )


async def _run(sb: Sandbox, specs: dict[str, Any], kind: Kind, tally: Tally) -> Any:
    try:
        result = await sb.run(kind.code, specs[kind.spec])
    except SandboxError as exc:
        tally.errors.append(f"{kind.name}: {exc}")
        return None
    _record(tally, kind, result)
    return result


async def checked_stream(
    sb: Sandbox,
    specs: dict[str, Any],
    rng: random.Random,
    tally: Tally,
    phases: Phases,
    stop_at: float,
) -> None:
    n = 0
    while time.monotonic() < stop_at:
        n += 1
        if n % 10 == 0:  # run_many: five answers (3 correct, 2 wrong) of one spec
            spec = rng.choice(["add", "desc", "sq", "common"])
            group = [k for k in CHECKED if k.spec == spec]
            five = [
                rng.choice([k for k in group if k.group == g])
                for g in ("correct",) * 3 + ("wrong",) * 2
            ]
            token = phases.begin_checked()
            t0 = time.perf_counter()
            try:
                results = await sb.run_many([k.code for k in five], specs[spec])
            except SandboxError as exc:
                phases.end_checked(token)
                tally.errors.append(f"run_many {spec}: {exc}")
                continue
            ms = (time.perf_counter() - t0) * 1000
            beside = phases.end_checked(token)
            for kind, result in zip(five, results, strict=True):
                _record(tally, kind, result)
            tally.latency.setdefault("run_many of 5", {"alone": [], "beside": []})[
                "beside" if beside else "alone"
            ].append(ms)
            continue
        kind = rng.choice(CHECKED)
        token = phases.begin_checked()
        t0 = time.perf_counter()
        result = await _run(sb, specs, kind, tally)
        ms = (time.perf_counter() - t0) * 1000
        beside = phases.end_checked(token)
        if result is None:
            continue
        column = "beside" if beside else "alone"
        tally.latency.setdefault("sb.run, every checked sample", {"alone": [], "beside": []})[
            column
        ].append(ms)
        if kind.name == "add":
            tally.latency.setdefault("sb.run, `add` correct only", {"alone": [], "beside": []})[
                column
            ].append(ms)


async def hostile_stream(
    sb: Sandbox,
    specs: dict[str, Any],
    index: int,
    n_streams: int,
    tally: Tally,
    phases: Phases,
    mixed: asyncio.Event,
    stop_at: float,
) -> None:
    order = list(HOSTILE)
    random.Random(0).shuffle(order)  # slow and quick ones mixed: more kinds get their turn
    i = index
    while time.monotonic() < stop_at:
        if not mixed.is_set():  # an alone phase: wait for the next mixed one
            try:
                await asyncio.wait_for(mixed.wait(), max(0.01, stop_at - time.monotonic()))
            except TimeoutError:
                return
            continue
        kind = order[i % len(order)]
        i += n_streams
        phases.begin_hostile()
        t0 = time.perf_counter()
        try:
            await _run(sb, specs, kind, tally)
        finally:
            phases.end_hostile()
            tally.hostile_ms.append((time.perf_counter() - t0) * 1000)


async def schedule(phases: Phases, mixed: asyncio.Event, phase_s: float, stop_at: float) -> None:
    """Mixed for ``phase_s``, then, once the hostile samples in flight have ended, alone for
    ``phase_s``; again until ``stop_at``."""
    while time.monotonic() < stop_at:
        mixed.set()
        await asyncio.sleep(max(0.0, min(phase_s, stop_at - time.monotonic())))
        mixed.clear()
        while phases.hostile_active and time.monotonic() < stop_at:
            await asyncio.sleep(0.05)
        await asyncio.sleep(max(0.0, min(phase_s, stop_at - time.monotonic())))


async def monitor(sb: Sandbox, tally: Tally, stop: asyncio.Event) -> None:
    while not stop.is_set():
        pid = sb.zygote_pid
        if pid is not None:
            tally.zygote_pids.add(pid)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


# ---- host checks


def uid_processes(uids: range) -> list[str]:
    """``pid uid state cmdline`` of every process whose real or effective uid is in ``uids``
    (zombies included: state Z)."""
    found = []
    for status in glob.glob("/proc/[0-9]*/status"):
        try:
            with open(status) as f:
                fields = dict(ln.split(":", 1) for ln in f if ":" in ln)
        except OSError:
            continue
        ids = [int(x) for x in fields.get("Uid", "").split()[:2]]
        if any(u in uids for u in ids):
            pid = status.split("/")[2]
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:60]
            except OSError:
                cmd = "?"
            state = fields.get("State", "?").split()[0]
            found.append(
                f"pid {pid} uid {ids[0]} state {state} ppid {fields.get('PPid', '?').strip()} {cmd}".rstrip()
            )
    return found


def memory_cgroup_dirs() -> list[str]:
    """Our memory cgroup's directory in every mounted hierarchy that has it (v1 and v2)."""
    with open("/proc/self/cgroup") as f:
        lines = [ln.rstrip("\n").split(":", 2) for ln in f if ln.count(":") >= 2]
    v1 = next((p for h, c, p in lines if h != "0" and "memory" in c.split(",")), None)
    v2 = next((p for h, c, p in lines if h == "0" and c == ""), None)
    out = []
    with open("/proc/self/mounts") as f:
        for line in f:
            _src, mnt, fstype, opts, *_ = line.split()
            if fstype == "cgroup" and "memory" in opts.split(",") and v1 is not None:
                out.append(os.path.join(mnt, v1.lstrip("/")))
            elif fstype == "cgroup2" and v2 is not None:
                out.append(os.path.join(mnt, v2.lstrip("/")))
    return [d for d in out if os.path.isdir(d)]


def leftover_cgroups() -> list[str]:
    return sorted(
        path for d in memory_cgroup_dirs() for path in glob.glob(os.path.join(d, "firstpass-*"))
    )


def leftover_files(zygote_pids: set[int]) -> list[str]:
    names = []
    for d in ("/tmp", "/var/tmp", "/dev/shm"):
        names += glob.glob(os.path.join(d, f"{TAG}*"))
    names += [f"/tmp/firstpass-sandbox-{pid}" for pid in zygote_pids]
    return sorted(n for n in names if os.path.lexists(n))


async def wait_clean(check: Any, grace_s: float) -> tuple[list[str], list[str]]:
    """(what ``check`` finds right away, what it still finds after up to ``grace_s``)."""
    first = await asyncio.to_thread(check)
    left, deadline = first, time.monotonic() + grace_s
    while left and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        left = await asyncio.to_thread(check)
    return first, left


# ---- the run


async def stress(args: argparse.Namespace) -> int:
    limits = Limits(cpu_s=args.cpu_s, wall_s=args.wall_s, memory_mb=args.memory_mb)
    tally = Tally()
    phases = Phases()
    rng = random.Random(args.seed)
    hang = False
    sb = Sandbox(concurrency=args.concurrency, limits=limits)
    await sb.start()
    try:
        uids = sb.uid_range
        isolation, bound = sb.isolation, sb.memory_bound
        specs = {name: parse_spec(obj) for name, obj in SPECS.items()}
        t0 = time.perf_counter()
        reference = specs["sq"]
        assert isinstance(reference, CasesSpec)
        specs["sq"] = await sb.resolve(reference)
        resolve_ms = (time.perf_counter() - t0) * 1000
        start = time.monotonic()
        stop_at = start + args.seconds
        stop = asyncio.Event()
        mon = asyncio.create_task(monitor(sb, tally, stop))
        mixed = asyncio.Event()
        streams = [
            schedule(phases, mixed, args.phase, stop_at),
            *(
                checked_stream(sb, specs, random.Random(rng.random()), tally, phases, stop_at)
                for _ in range(args.in_flight)
            ),
            *(
                hostile_stream(sb, specs, i, args.hostile, tally, phases, mixed, stop_at)
                for i in range(args.hostile)
            ),
        ]
        try:
            await asyncio.wait_for(asyncio.gather(*streams), args.seconds + 2 * args.wall_s + 60)
        except TimeoutError:
            hang = True
        elapsed = time.monotonic() - start
        stop.set()
        await mon
    finally:
        await sb.aclose()
    procs_now, procs_left = await wait_clean(lambda: uid_processes(uids), 5.0)
    live_now = [p for p in procs_now if " state Z " not in p]
    cg_now, cg_left = await wait_clean(leftover_cgroups, 5.0)
    files_now, files_left = await wait_clean(lambda: leftover_files(tally.zygote_pids), 0.0)

    # ---- report
    wrong_total = sum(tally.wrong.values())
    print(
        f"sandbox_stress: {elapsed:.1f} s, isolation {isolation}, memory bound {bound}, "
        f"{os.cpu_count()} cores, concurrency {args.concurrency}, in flight: {args.in_flight} "
        f"checked + {args.hostile} hostile (mixed phases of {args.phase:g} s, alternating), "
        f"limits cpu {args.cpu_s:g} s / wall {args.wall_s:g} s / {args.memory_mb} MB, "
        f"uids {uids.start}..{uids.stop - 1}, load avg {os.getloadavg()[0]:.2f}; "
        f"reference spec resolved in {resolve_ms:.0f} ms"
    )
    print()
    print("| kind | group | runs | wrong verdicts | categories seen |")
    print("|---|---|---:|---:|---|")
    for kind in (*CHECKED, *HOSTILE):
        cats = ", ".join(f"{c} {n}" for c, n in sorted(tally.categories.get(kind.name, {}).items()))
        expect = "pass" if kind.group == "correct" else (kind.expect or "not pass")
        print(
            f"| {kind.name} | {kind.group} (expect {expect}) | {tally.runs[kind.name]} "
            f"| {tally.wrong[kind.name]} | {cats or '-'} |"
        )
    checked_runs = sum(tally.runs[k.name] for k in CHECKED)
    hostile_runs = sum(tally.runs[k.name] for k in HOSTILE)
    never = [k.name for k in HOSTILE if not tally.runs[k.name]]
    print(
        f"| **total** | | {checked_runs} checked + {hostile_runs} hostile | {wrong_total} | "
        f"hostile kinds never run: {', '.join(never) or 'none'} |"
    )
    print()
    print(
        "| latency (ms) | n alone | p50 alone | p95 alone | n beside hostile | p50 beside | p95 beside |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, cols in tally.latency.items():
        cells = []
        for col in ("alone", "beside"):
            xs = cols[col]
            cells += (
                [str(len(xs)), *(f"{statistics.median(xs):.1f}", f"{pct(xs, 0.95):.1f}")]
                if xs
                else [
                    "0",
                    "-",
                    "-",
                ]
            )
        print(f"| {name} | " + " | ".join(cells) + " |")
    if tally.hostile_ms:
        hs = tally.hostile_ms
        print(
            f"| (hostile samples themselves) | | | | {len(hs)} | {statistics.median(hs):.1f} | {pct(hs, 0.95):.1f} |"
        )
    print()
    checks = [
        (
            "wrong verdicts",
            wrong_total == 0,
            str(wrong_total) + "".join(f"; {e}" for e in tally.wrong_examples),
        ),
        (
            "SandboxError",
            not tally.errors,
            f"{len(tally.errors)}" + "".join(f"; {e}" for e in tally.errors[:5]),
        ),
        (
            "finished in time (no hang)",
            not hang,
            "hung: the streams did not finish" if hang else "yes",
        ),
        (
            "sandbox_restarts",
            True,
            f"{tally.restarts} (zygote pids seen: {', '.join(map(str, sorted(tally.zygote_pids)))})",
        ),
        (
            f"processes with a uid in {uids.start}..{uids.stop - 1} after aclose()",
            not live_now and not procs_left,
            (f"{len(live_now)} alive right after: {', '.join(live_now[:3])}; " if live_now else "")
            + _left(procs_now, procs_left),
        ),
        ("`firstpass-*` cgroups under our memory cgroup", not cg_left, _left(cg_now, cg_left)),
        (
            f"files named `{TAG}*` in /tmp, /var/tmp, /dev/shm; zygote roots",
            not files_left,
            _left(files_now, files_left),
        ),
    ]
    print("| check | ok | detail |")
    print("|---|---|---|")
    for name, ok, detail in checks:
        print(f"| {name} | {'yes' if ok else '**NO**'} | {detail} |")
    return 0 if all(ok for _, ok, _ in checks) else 1


def _left(now: list[str], left: list[str]) -> str:
    if not now:
        return "none"
    if not left:
        return f"none after a grace period ({len(now)} right after: {', '.join(now[:3])})"
    return f"{len(left)} left: {', '.join(left[:5])}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=60, help="how long to keep launching (default 60)"
    )
    parser.add_argument("--concurrency", type=int, default=4, help="sandbox slots (default 4)")
    parser.add_argument("--in-flight", type=int, default=8, help="checked streams (default 8)")
    parser.add_argument(
        "--hostile", type=int, default=2, help="hostile streams in mixed phases (default 2)"
    )
    parser.add_argument(
        "--phase", type=float, default=5, help="seconds per phase, mixed then alone (default 5)"
    )
    parser.add_argument("--cpu-s", type=float, default=2.0, help="Limits.cpu_s (default 2)")
    parser.add_argument("--wall-s", type=float, default=4.0, help="Limits.wall_s (default 4)")
    parser.add_argument(
        "--memory-mb", type=int, default=1024, help="Limits.memory_mb (default 1024)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.in_flight < 1 or args.hostile < 0 or args.phase <= 0:
        parser.error("--seconds and --phase must be > 0, --in-flight >= 1, --hostile >= 0")
    return asyncio.run(stress(args))


if __name__ == "__main__":
    sys.exit(main())
