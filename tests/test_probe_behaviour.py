"""Behaviour in the sandbox: outputs on the probe inputs, recorded in the visible tests' process."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from blockbuster import BlockBuster

from firstpass.probe import ProbeInputs, build_probe_inputs
from firstpass.sandbox import Limits, Sandbox, parse_spec
from firstpass.sandbox._child.behaviour import behaviour, canonical_output
from firstpass.sandbox._child.codec import Wire

SPEC = parse_spec(["assert add(1, 2) == 3"], entry_point="add")
CASES = parse_spec({"entry_point": "add", "cases": [{"args": [1, 2], "expected": 3}]})
INPUTS = ProbeInputs(entry_point="add", args=((0, 5), (2, 2), (-1, 1), (10, 0)), per_input_s=0.1)

ADD = "def add(a, b):\n    return a + b\n"
ADD_OTHER_CODE = "def add(x, y):\n    total = 0\n    total += x\n    return total + y\n"
CONST = "def add(a, b):\n    return 3\n"
RAISES_VALUE = (
    "def add(a, b):\n    if (a, b) != (1, 2):\n        raise ValueError(a)\n    return 3\n"
)
RAISES_KEY = "def add(a, b):\n    if (a, b) != (1, 2):\n        raise KeyError(a)\n    return 3\n"
HANGS = "def add(a, b):\n    while (a, b) != (1, 2):\n        pass\n    return 3\n"
HANGS_TOO = (
    "def add(a, b):\n    if (a, b) == (1, 2):\n        return 3\n    while True:\n        a += 1\n"
)


@pytest.fixture
async def sb(blockbuster: BlockBuster) -> AsyncIterator[Sandbox]:
    async with Sandbox(concurrency=2, limits=Limits(cpu_s=4, wall_s=6)) as sandbox:
        yield sandbox


async def test_identical_outputs_cluster_whatever_the_code(sb: Sandbox) -> None:
    """Two different programs computing the same function get the same behaviour digest."""
    a, b, c = await sb.run_many([ADD, ADD_OTHER_CODE, CONST], SPEC, probe=INPUTS)
    assert a.passed and b.passed and c.passed
    assert a.code_sha256 != b.code_sha256
    assert a.behaviour == b.behaviour != c.behaviour
    assert a.behaviour is not None and a.behaviour.startswith("sha256:")
    assert len(a.probe_outputs) == len(INPUTS)


async def test_same_exception_type_clusters_and_another_type_does_not(sb: Sandbox) -> None:
    """Raising ValueError on every probe input is one behaviour; KeyError is another."""
    v1, v2, k = await sb.run_many([RAISES_VALUE, RAISES_VALUE, RAISES_KEY], SPEC, probe=INPUTS)
    assert v1.passed and k.passed
    assert v1.behaviour == v2.behaviour != k.behaviour


async def test_timeouts_are_recorded_as_timeouts_and_cluster(sb: Sandbox) -> None:
    """Two samples that hang on every probe input agree (each input a timeout), and differ from
    one that answers; the visible test still passes."""
    inputs = ProbeInputs(entry_point="add", args=((0, 5), (2, 2)), per_input_s=0.05)
    h1, h2, ok = await sb.run_many([HANGS, HANGS_TOO, CONST], SPEC, probe=inputs)
    assert h1.passed and h2.passed
    assert h1.behaviour == h2.behaviour != ok.behaviour
    assert h1.probe_outputs == tuple(behaviour([{"e": "timeout"}] * 2, 2)["outputs"])
    assert h1.wall_ms < 3_000  # the per-input limit, not the sample's wall limit


async def test_a_sample_that_mutates_its_inputs_does_not_affect_later_calls(sb: Sandbox) -> None:
    """Each call gets freshly decoded arguments, so clobbering them changes nothing later."""
    spec = parse_spec(["assert head([1, 2]) == 1"], entry_point="head")
    inputs = ProbeInputs(entry_point="head", args=(([5, 6],), ([5, 6],), ([7],)))
    clean = "def head(xs):\n    return xs[0]\n"
    clobber = "def head(xs):\n    x = xs[0]\n    xs.clear()\n    xs.append(99)\n    return x\n"
    a, b = await sb.run_many([clean, clobber], spec, probe=inputs)
    assert a.passed and b.passed
    assert a.behaviour == b.behaviour


async def test_unhashable_and_non_data_outputs_are_handled(sb: Sandbox) -> None:
    """Lists and dicts are outputs like any other; an object of the sample's class is recorded
    as non-data, not an error of the run."""
    spec = parse_spec(["assert len(f(1)) == 1"], entry_point="f")
    inputs = ProbeInputs(entry_point="f", args=((2,), (3,)))
    lists = "def f(n):\n    return [{'n': n}]\n"
    same = "def f(n):\n    out = []\n    out.append(dict(n=n))\n    return out\n"
    objects = "class R(list):\n    pass\nclass O:\n    pass\ndef f(n):\n    return [O()] if n > 1 else [1]\n"
    a, b, c = await sb.run_many([lists, same, objects], spec, probe=inputs)
    assert a.passed and b.passed and c.passed
    assert a.behaviour == b.behaviour != c.behaviour


async def test_non_deterministic_outputs_agree_with_nobody(sb: Sandbox) -> None:
    """A sample returning random values lands in its own cluster, and the run still completes."""
    rand = (
        "import random\ndef add(a, b):\n    return a + b if (a, b) == (1, 2) else random.random()\n"
    )
    x, y, z = await sb.run_many([rand, rand, ADD], SPEC, probe=INPUTS)
    assert x.passed and y.passed
    assert len({x.behaviour, y.behaviour, z.behaviour}) == 3


async def test_probe_outputs_never_change_the_verdict(sb: Sandbox) -> None:
    """A probe input that crashes or hangs the sample leaves its test results exactly as without
    the probe; a failing sample stays failing."""
    wrong = "def add(a, b):\n    return a - b\n"
    exits = (
        "import os\ndef add(a, b):\n    if (a, b) != (1, 2):\n        os._exit(0)\n    return 3\n"
    )
    with_probe = await sb.run_many([wrong, exits, HANGS], SPEC, probe=INPUTS)
    without = await sb.run_many([wrong, exits, HANGS], SPEC)
    for p, q in zip(with_probe, without, strict=True):
        assert (p.passed, p.n_passed, p.category) == (q.passed, q.n_passed, q.category)
        assert [t.to_dict() for t in p.tests] == [t.to_dict() for t in q.tests]
        assert q.behaviour is None and "behaviour" not in q.to_dict()
    assert with_probe[1].behaviour is not None  # killed mid-probe: the rest count as lost


async def test_cases_specs_record_behaviour_too(sb: Sandbox) -> None:
    """Input/output cases run the probe after the cases, in the same worker."""
    inputs = build_probe_inputs(CASES)
    assert inputs is not None
    a, b = await sb.run_many([ADD, ADD_OTHER_CODE], CASES, probe=inputs)
    assert a.passed and a.behaviour == b.behaviour
    assert len(a.probe_outputs) == len(inputs)


async def test_no_code_and_load_failures_have_no_behaviour(sb: Sandbox) -> None:
    """Nothing ran, so nothing is recorded: behaviour is None."""
    none, broken = await sb.run_many(
        ["no code here", "```python\nraise SystemExit(3)\n```"], SPEC, probe=INPUTS
    )
    assert none.behaviour is None and broken.behaviour is None


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ({"v": {"$s": [1, 2, 3]}}, {"v": {"$s": [3, 1, 2]}}, True),
        ({"v": {"$d": [["a", 1], ["b", 2]]}}, {"v": {"$d": [["b", 2], ["a", 1]]}}, True),
        ({"v": 0.1 + 0.2}, {"v": 0.3}, True),
        ({"v": -0.0}, {"v": 0.0}, True),
        ({"v": [1, 2]}, {"v": {"$t": [1, 2]}}, False),
        ({"v": 1}, {"v": 1.0}, False),
        ({"e": "ValueError"}, {"e": "TypeError"}, False),
        ({"e": "timeout"}, {"e": "timeout"}, True),
    ],
)
def test_canonical_outputs_ignore_order_and_float_noise_only(
    a: dict[str, Wire], b: dict[str, Wire], same: bool
) -> None:
    """Sets and dicts compare unordered, floats to 12 digits; types and error kinds still count."""
    assert (canonical_output(a) == canonical_output(b)) is same
    assert (behaviour([a], 1)["digest"] == behaviour([b], 1)["digest"]) is same


def test_a_lost_probe_record_is_every_output_lost() -> None:
    """When the record never arrived, the vector is n lost outputs (one digest for all such)."""
    lost = behaviour(None, 3)
    assert len(lost["outputs"]) == 3 and len(set(lost["outputs"])) == 1
    assert lost["digest"] != behaviour([{"e": "timeout"}] * 3, 3)["digest"]


async def test_large_outputs_travel_as_digests_and_still_cluster(sb: Sandbox) -> None:
    """Outputs over the per-output cap are digested in the worker: equal ones agree, different
    ones do not, and the run's verdict is unaffected."""
    spec = parse_spec(["assert len(f(1)) == 10"], entry_point="f")
    inputs = ProbeInputs(entry_point="f", args=((20_000,), (30_000,)), per_input_s=1.0)
    big = "def f(n):\n    return list(range(n * 10))\n"
    same = "def f(n):\n    return [i for i in range(10 * n)]\n"
    other = "def f(n):\n    return list(range(n * 10 - 1)) + [0]\n"
    a, b, c = await sb.run_many([big, same, other], spec, probe=inputs)
    assert a.passed and b.passed and c.passed
    assert a.behaviour == b.behaviour != c.behaviour
