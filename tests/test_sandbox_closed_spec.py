"""Which asserts specs may share a judge across requests: the closed language (a pure function,
table-tested), and the shared judge refusing anything else whatever Z decided."""

from __future__ import annotations

import asyncio

import pytest

from firstpass.sandbox._child import sharing
from firstpass.sandbox._child.closed import closed_spec

CLOSED = [
    (("assert f(1) == 2",), None),
    (("assert f(1) == 2",), "import math"),
    (("assert math.isclose(f(2), 3.14, rel_tol=1e-3)",), "import math"),
    (("assert sqrt(f(4)) == 2",), "from math import sqrt"),
    (("assert set(f([1, 2, 2])) == {1, 2} and len(f([])) == 0",), None),
    (("assert sorted(f(x), key=lambda v: -v) == [3, 1] and abs(f(-1)) == 1",), None),
    (("assert [f(i) for i in range(3)] == [0, 1, 4] and all(f(i) >= 0 for i in range(9))",), None),
    (("assert f('abc') == 'cba' and f'{f(1)!r:>3}' == '  1'",), None),
    (("assert (y := f(2)) == 4 and y + 1 == 5",), None),
    (("assert isinstance(f(1), (int, float)) and round(f(1.26), 1) == 1.3",), None),
    (("assert f(*[1, 2], **{'k': 3}) == {'k': (1, 2)}",), None),
    (("assert cmath.isclose(f(1j), 1j)",), "import cmath"),
]
OPEN = [
    # the round-two exploit: a module function that walks attributes named in a string
    (
        ("assert string.Formatter().get_field('0.__globals__', [lambda: 0], {}) is None",),
        "import string",
    ),
    (("assert '{0.__globals__}'.format(f)",), None),  # a method of a value
    (("assert f('a').upper() == 'A'",), None),
    (("assert getattr(f(1), 'x') == 1",), None),
    (("assert vars(f(1)) == {}",), None),
    (("assert type(f(1)) is int",), None),
    (("assert eval('1') == 1",), None),
    (("assert __import__('os')",), None),
    (("assert f.__globals__",), None),
    (("assert (lambda m: m)(math)",), "import math"),  # a module as a value
    (("assert math.isclose(f(1), 1)",), None),  # a module the setup did not import
    (("assert statistics.mean([1]) == 1",), "import statistics"),
    (("assert math.sys",), "import math"),  # not a member of math
    (("assert f(1) == 2",), "import math as m"),
    (("assert f(1) == 2",), "def helper():\n    return 1"),
    (("assert f(1) == 2",), "X = [1]"),
    (("assert f(1) == 2",), "from math import *"),
    (("assert f(1) == 2",), "import os"),
    (("assert open('x')",), None),
    (("assert f(1) == 2", "assert print(1) is None"), None),
    (("assert (yield)",), None),
    (("assert f(1) == 2",), "import math\nmath.pi = 3"),
    (("x = 1",), None),
    (("assert [0 for d['k'] in [f(1)]] == [0]",), None),  # a store into a value
]


@pytest.mark.parametrize(("asserts", "setup"), CLOSED)
def test_plain_expressions_of_the_sample_and_pure_builtins_are_closed(
    asserts: tuple[str, ...], setup: str | None
) -> None:
    """Literals, operators, displays, comprehensions, lambdas, f-strings, := and pure builtins
    and math.* on the sample's values: closed, so the shared judge may evaluate them."""
    assert closed_spec(asserts, setup)


@pytest.mark.parametrize(("asserts", "setup"), OPEN)
def test_anything_that_reaches_attributes_code_or_modules_is_not_closed(
    asserts: tuple[str, ...], setup: str | None
) -> None:
    """Any attribute of a value, a module but math/cmath, a module as a value, a builtin that
    reaches names or code, or setup code beyond imports: its request's own judge."""
    assert not closed_spec(asserts, setup)


def test_the_shared_judge_takes_only_jobs_that_cannot_change_it() -> None:
    """The shared judge checks each job itself: cases and outputs jobs and closed asserts
    specs, never an open one, whatever key Z chose."""
    assert sharing.shareable({"mode": "cases", "tests": [[1]]})
    assert sharing.shareable({"mode": "outputs", "tests": [[1]]})
    assert sharing.shareable({"mode": "asserts", "tests": ["assert f(1) == 2"], "setup": None})
    assert not sharing.shareable(
        {"mode": "asserts", "tests": ["assert f('a').upper() == 'A'"], "setup": None}
    )
    assert not sharing.shareable({"mode": "asserts", "tests": "assert f(1)", "setup": None})
    assert not sharing.shareable(["not", "a", "job"])


def test_the_judge_key_shares_only_closed_or_data_jobs() -> None:
    """Z's key: data for cases, outputs and closed specs; a request's own for the rest."""
    assert sharing.judge_key("cases", "r1", 1) == sharing.DATA_KEY
    assert sharing.judge_key("asserts", "r1", 1, closed=True) == sharing.DATA_KEY
    assert sharing.judge_key("asserts", "r1", 1) == "req:r1"
    assert sharing.judge_key("asserts", None, 7) == "job:7"
    assert sharing.judge_key("asserts", "data", 1) != sharing.DATA_KEY


@pytest.mark.parametrize("name", ["type", "object", "super", "property", "classmethod"])
def test_builtins_that_make_classes_never_cross_by_name(name: str) -> None:
    """A sample cannot hand the judge `type` (or another class-maker) as data: with it a
    closed test could build a class whose __del__ runs during a later request's job."""
    import subprocess
    import sys

    probe = (
        "import builtins\n"
        "from firstpass.sandbox._child import codec\n"
        f"name = {name!r}\n"
        "assert codec.from_wire({'$bt': name}) is getattr(builtins, name)  # to a worker: fine\n"
        "codec.judge_side()\n"
        "try:\n    codec.from_wire({'$bt': name})\nexcept codec.WireError:\n    pass\n"
        "else:\n    raise SystemExit('decoded in a judge')\n"
        "codec.worker_side()\n"
        "try:\n    codec.to_wire(getattr(builtins, name))\nexcept codec.NonData:\n    pass\n"
        "else:\n    raise SystemExit('sent by name from a worker')\n"
    )
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr + run.stdout


async def test_a_sample_handing_over_type_plants_nothing_in_the_shared_judge() -> None:
    """The review's attack: sample `f = type`, a closed test building a class with a __del__
    that burns CPU; a later request's correct cases job on the same slot still passes."""
    from firstpass.sandbox import Limits, Sandbox, parse_spec

    attack = parse_spec(
        [
            "assert f('Y', (), {'k': f('X', (), {'__del__': lambda s: sum(range(10**12))})()})"
            " is not None"
        ]
    )
    victim = parse_spec(
        {
            "entry_point": "h",
            "cases": [{"args": [i], "expected": [[i + 1]] * 1000} for i in range(20)],
        }
    )
    async with Sandbox(concurrency=1, limits=Limits(cpu_s=5, wall_s=10)) as sb:
        await sb.run("f = type\n", attack)
        for _ in range(2):
            result = await sb.run("def h(x):\n    return [[x + 1]] * 1000\n", victim)
            assert result.passed, result.category


@pytest.mark.slow
async def test_a_requests_judge_does_not_linger_beside_the_shared_judge() -> None:
    """Test code that leaves a timer whose handler spins: once the slot judges a shared job,
    that request's judge is gone (it would run in the slot's judge cgroup beside the shared
    judge)."""
    from firstpass.sandbox import Sandbox, parse_spec
    from tests.sandbox_helpers import processes_of

    spinner = parse_spec(
        {
            "setup": (
                "import signal\n"
                "def _h(*a):\n    while True:\n        pass\n"
                "signal.signal(signal.SIGALRM, _h)\n"
                "signal.setitimer(signal.ITIMER_REAL, 0.2)\n"
                "def helper(x):\n    return x\n"
            ),
            "asserts": ["assert helper(f(1)) == 1"],
        }
    )
    async with Sandbox(concurrency=1) as sb:
        request_judge = frozenset({sb.uid_range[1]})  # slot 0, lane 0: sample, request, shared
        assert (await sb.run("def f(x):\n    return x\n", spinner)).passed
        assert (
            await sb.run("def f(x):\n    return x + 1\n", parse_spec(["assert f(1) == 2"]))
        ).passed
        for _ in range(1000):  # killed as the shared job arrived: wait for it to be gone
            if not processes_of(request_judge):
                break
            await asyncio.sleep(0.01)
        assert processes_of(request_judge) == []
