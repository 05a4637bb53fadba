"""Probe inputs: seeded, type-preserving mutation of the visible tests' calls of the entry point."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import firstpass.probe
from firstpass.probe import (
    DEFAULT_COUNT,
    MAX_COUNT,
    build_probe_inputs,
    cached_probe_inputs,
    mutate_value,
    seed_calls,
)
from firstpass.sandbox import parse_spec
from firstpass.sandbox._child.codec import from_wire, to_wire

ASSERTS = parse_spec(
    [
        'assert remove_occ("hello", "l") == "heo"',
        'assert remove_occ("abcda", "a") == "bcd"',
        "assert set(remove_occ(*ARGS)) == set()",
    ],
    entry_point="remove_occ",
)
CASES = parse_spec(
    {
        "entry_point": "pick",
        "cases": [
            {"args": [[3, 1, 2], {"a": 1, "b": [1, 2]}, 2.5], "expected": 1},
            {"args": [[[1, 2], [3]], {}, -1.0], "expected": 2},
        ],
    }
)

data = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**6), 10**6)
    | st.floats(-1e6, 1e6, allow_nan=False)
    | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=12,
)


def test_the_package_exports_exactly_its_public_names() -> None:
    """`firstpass.probe.__all__` lists what the package defines, nothing private, and every
    public name the package defines is in it."""
    import types

    for name in firstpass.probe.__all__:
        assert hasattr(firstpass.probe, name) and not name.startswith("_")
    public = {
        name
        for name, value in vars(firstpass.probe).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }
    assert public <= set(firstpass.probe.__all__)


def test_same_spec_and_seed_give_the_same_inputs_and_another_seed_may_not() -> None:
    """Mutation is deterministic: rebuilding gives identical calls; the seed changes the draw."""
    first = build_probe_inputs(CASES, seed=7)
    again = build_probe_inputs(CASES, seed=7)
    other = build_probe_inputs(CASES, seed=8)
    assert first == again
    assert first is not None and again is not None and other is not None
    assert first.digest == again.digest
    assert first.args != other.args


def test_inputs_number_between_ten_and_twenty_and_are_distinct() -> None:
    """A request gets DEFAULT_COUNT (10-20) generated calls, no two alike, none a visible call."""
    for spec in (ASSERTS, CASES):
        inputs = build_probe_inputs(spec)
        assert inputs is not None
        assert 10 <= DEFAULT_COUNT <= MAX_COUNT == 20
        assert len(inputs) == DEFAULT_COUNT
        keys = [json.dumps(list(a), sort_keys=True) for a in inputs.args]
        assert len(set(keys)) == len(keys)
        _, seeds = seed_calls(spec)
        visible = {json.dumps(to_wire(list(s)), sort_keys=True) for s in seeds}
        assert visible  # every spec here has visible calls to compare with
        assert not visible & set(keys)


def test_generated_calls_keep_each_argument_type() -> None:
    """Every generated call has the seed's arity and each argument keeps its Python type."""
    inputs = build_probe_inputs(CASES)
    assert inputs is not None and inputs.entry_point == "pick"
    for wire in inputs.args:
        args = from_wire(list(wire))
        assert [type(a) for a in args] == [list, dict, float]


def test_assert_seeds_are_the_entry_point_calls_with_literal_arguments() -> None:
    """Calls nested inside other calls count; calls with non-literal arguments are skipped."""
    name, seeds = seed_calls(ASSERTS)
    assert name == "remove_occ"
    assert seeds == [("hello", "l"), ("abcda", "a")]


def test_without_a_named_entry_point_the_function_most_asserts_call_is_used() -> None:
    """The non-builtin name called in the most asserts is the entry point."""
    spec = parse_spec(["assert len(f(1)) == 1", "assert f(2) == [2]", "assert g(3) == 3"])
    assert seed_calls(spec)[0] == "f"


def test_no_entry_point_means_no_probe_inputs() -> None:
    """An assert spec that calls no function of the sample gives no probe inputs at all."""
    assert build_probe_inputs(parse_spec(["assert 1 + 1 == 2"])) is None


def test_request_inputs_come_first_and_are_not_repeated() -> None:
    """`firstpass.probe_inputs` are used as given (JSON objects as dicts), first, deduplicated."""
    inputs = build_probe_inputs(CASES, extra=[[[9], {"k": 1}, 0.5], [[9], {"k": 1}, 0.5]])
    assert inputs is not None and inputs.from_request == 1
    assert from_wire(list(inputs.args[0])) == [[9], {"k": 1}, 0.5]
    assert len(inputs) == 1 + DEFAULT_COUNT


def test_more_than_twenty_generated_inputs_are_refused() -> None:
    """The issue's 10-20 per request is a hard bound on ``count``."""
    with pytest.raises(ValueError, match="count"):
        build_probe_inputs(ASSERTS, count=MAX_COUNT + 1)


def test_cached_inputs_equal_freshly_built_ones() -> None:
    """The per-spec cache returns exactly what building afresh returns."""
    assert cached_probe_inputs(CASES) == build_probe_inputs(CASES)
    assert cached_probe_inputs(CASES, extra=[[[1], {}, 1.0]]) == build_probe_inputs(
        CASES, extra=[[[1], {}, 1.0]]
    )


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (5, {0, 1, -1, 6, 4, 10, -5, 10_007}),
        ("ab", {"", "a", "ba", "AB", " ab ", "a b", "abab"}),
        ([2, 1], {(), (2,), (1, 2), (2, 1, 2, 1), (2, 1, -2, -1)}),
    ],
)
def test_mutations_follow_the_issue_list(value: Any, expected: set[Any]) -> None:
    """ints: 0, 1, -1, x±1, 2x, a large value; strings: empty, one char, reversed, case, spaces."""
    got = mutate_value(value, random.Random(0))
    normal = {tuple(v) if isinstance(v, list) else v for v in got}
    assert expected <= normal
    assert value not in got


@settings(max_examples=200, deadline=None)
@given(value=data, seed=st.integers(0, 2**32))
def test_every_variant_has_the_type_of_its_value(value: Any, seed: int) -> None:
    """Type-preserving at the top level, deterministically, for arbitrary nested data."""
    a = mutate_value(value, random.Random(seed))
    b = mutate_value(value, random.Random(seed))
    assert a == b
    assert all(type(v) is type(value) for v in a)


def test_the_cache_tells_entry_points_apart() -> None:
    """The same asserts naming another entry point get that entry point's inputs."""
    asserts = ["assert f(1) == g(1)"]
    for name in ("f", "g"):
        inputs = cached_probe_inputs(parse_spec(asserts, entry_point=name))
        assert inputs is not None and inputs.entry_point == name
