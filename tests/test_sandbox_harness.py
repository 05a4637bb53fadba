"""Pure pieces of the sandbox's two sides: the wire codec, case comparison, the judge's parsing."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstpass.sandbox._child.asserts import assert_names, setup_imports
from firstpass.sandbox._child.codec import NonData, from_json, from_wire, to_wire
from firstpass.sandbox._child.compare import values_equal

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
        (0.1 + 0.2, 0.3, 0, True),
        (0.1 + 0.3, 0.3, 0, False),
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


def test_the_sample_gets_only_the_setups_imports() -> None:
    """Setup helpers stay with the judge; the sample sees the setup's import lines only."""
    setup = "import math\nfrom collections import Counter as C\ndef ref(x):\n    return x\nK = 3\n"
    assert setup_imports(setup) == "import math\nfrom collections import Counter as C"
    assert setup_imports("def ref(x):\n    return x\n") is None


def test_an_asserts_loaded_names_are_what_the_judge_may_look_up() -> None:
    """Every name an assert loads, inside comprehensions and lambdas too, is a candidate."""
    _, names = assert_names("assert all(f(i) == g for i in range(3)) and (lambda y: h(y))(1)")
    assert {"all", "f", "g", "range", "h"} <= names
