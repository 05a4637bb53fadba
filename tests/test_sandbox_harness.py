"""The pure parts of the harness: assert splitting, the data codec, output equality."""

from __future__ import annotations

import ast
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstpass.sandbox._codec import NonData, from_json, from_wire, to_wire
from firstpass.sandbox._harness import bindings, plan_asserts, setup_is_simple, values_equal


def plan(test: str, sample: str, setup: str | None = None) -> tuple[tuple[str, ...], str, bool]:
    setup_tree = ast.parse(setup) if setup else None
    (p,) = plan_asserts(
        [test],
        bindings(ast.parse(sample)),
        bindings(setup_tree) if setup_tree else None,
        setup_is_simple(setup_tree),
    )
    return p.leaves, p.skeleton, p.weak


SPLITS = [
    ("call_compared", "assert f(1) == 2", "def f(x): pass", None, ("f(1)",), "__fp_leaf(0) == 2"),
    (
        "trusted_wrappers",
        "assert set(f(x)) == set([1, 2])",
        "def f(x): pass\nx = 1",
        None,
        ("f(x)",),
        "set(__fp_leaf(0)) == set([1, 2])",
    ),
    (
        "setup_module",
        "assert math.isclose(f(2), 3.0)",
        "def f(x): pass",
        "import math",
        ("f(2)",),
        "math.isclose(__fp_leaf(0), 3.0)",
    ),
    (
        "sample_imports_safe_module",
        "assert math.isclose(f(2), 3.0)",
        "import math\ndef f(x): pass",
        None,
        ("f(2)",),
        "math.isclose(__fp_leaf(0), 3.0)",
    ),
    (
        "sample_shadows_builtin",
        "assert sorted(f(1)) == [1]",
        "def sorted(x): return x\ndef f(x): pass",
        None,
        ("sorted(f(1))",),
        "__fp_leaf(0) == [1]",
    ),
    (
        "boolean_structure",
        "assert not f(1) and g(2) > 3",
        "def f(x): pass\ndef g(x): pass",
        None,
        ("f(1)", "g(2)"),
        "not __fp_leaf(0) and __fp_leaf(1) > 3",
    ),
    ("unknown_name_is_the_samples", "assert h(1) == 1", "", None, ("h(1)",), "__fp_leaf(0) == 1"),
    (
        "subscript_of_result",
        "assert f(1)[0] == 'a'",
        "def f(x): pass",
        None,
        ("f(1)",),
        "__fp_leaf(0)[0] == 'a'",
    ),
]

SPLITS.append(
    (
        "star_import_makes_every_name_the_samples",
        "assert sorted([1]) == f(1)",
        "from os import *\ndef f(x): pass",
        None,
        ("sorted([1])", "f(1)"),
        "__fp_leaf(0) == __fp_leaf(1)",
    )
)


@pytest.mark.parametrize(
    ("name", "test", "sample", "setup", "leaves", "skeleton"), SPLITS, ids=[s[0] for s in SPLITS]
)
def test_asserts_split_into_sample_leaves_and_a_trusted_skeleton(
    name: str, test: str, sample: str, setup: str | None, leaves: tuple[str, ...], skeleton: str
) -> None:
    """Only sub-expressions that mention the sample's names are evaluated in the worker."""
    assert plan(test, sample, setup) == (leaves, skeleton, False)


@pytest.mark.parametrize(
    ("test", "sample"),
    [
        ("assert all(f(i) == i for i in range(3))", "def f(x): pass"),
        ("assert (lambda: f(1))() == 1", "def f(x): pass"),
    ],
)
def test_unsplittable_asserts_run_whole_in_the_worker_and_are_marked_weak(
    test: str, sample: str
) -> None:
    """Comprehensions and lambdas over sample calls make the check weak."""
    leaves, skeleton, weak = plan(test, sample)
    assert (len(leaves), skeleton) == (1, "__fp_leaf(0)")
    assert weak


PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text() | st.binary(),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        | st.frozensets(st.integers(), max_size=3)
    ),
    max_leaves=20,
)


@given(PLAIN)
def test_plain_data_survives_the_wire_with_its_types(value: Any) -> None:
    """Any plain value decodes to an equal value of the same types (NaN equal to NaN)."""
    back = from_wire(to_wire(value))
    assert values_equal(back, value, 0.0)
    assert type(back) is type(value)


def test_objects_are_refused_and_subclasses_travel_as_their_base() -> None:
    """An object is not data; an int subclass with a forged __eq__ travels as a plain int."""

    class Forged(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    with pytest.raises(NonData, match="type object"):
        to_wire(object())
    assert to_wire(Forged(3)) == 3 and type(to_wire(Forged(3))) is int
    assert from_wire(to_wire({"a": (1, {2}), "b": complex(1, math.inf)})) == {
        "a": (1, {2}),
        "b": complex(1, math.inf),
    }


@pytest.mark.parametrize(
    ("out", "exp", "atol", "equal"),
    [
        ([1, (2, 3)], [1, (2, 3)], 0, True),
        ([1, (2, 3)], [1, [2, 3]], 0, False),
        (0.1 + 0.2, 0.3, 0, False),
        (0.1 + 0.2, 0.3, 1e-9, True),
        (math.nan, math.nan, 0, True),
        (True, 1, 0, True),
        ("1", 1, 0, False),
        ({"a": [1.0000001]}, {"a": [1.0]}, 1e-6, True),
    ],
)
def test_output_equality_is_type_aware_with_a_float_tolerance(
    out: Any, exp: Any, atol: float, equal: bool
) -> None:
    """Containers compare by type and element; floats within atol; NaN equals NaN."""
    assert values_equal(out, exp, atol) is equal


def test_user_json_objects_become_dicts_on_the_wire() -> None:
    """A JSON object in a spec is a dict on the wire, not a wire tag."""
    assert from_wire(from_json({"$t": [1]})) == {"$t": [1]}
