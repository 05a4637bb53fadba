"""Test specs: the accepted shapes, and errors that name the bad field."""

from __future__ import annotations

from typing import Any

import pytest

from firstpass.errors import SpecError
from firstpass.sandbox import AssertSpec, CasesSpec, parse_spec


def test_a_bare_list_is_shorthand_for_asserts() -> None:
    """A JSON list of strings parses as an assert spec."""
    spec = parse_spec(["assert f(1) == 2"], setup="import math")
    assert isinstance(spec, AssertSpec)
    assert spec.asserts == ("assert f(1) == 2",) and spec.setup == "import math"


def test_cases_keep_args_expected_and_atol() -> None:
    """A cases spec keeps its entry point, arguments, expected values and tolerance."""
    spec = parse_spec(
        {"entry_point": "f", "cases": [{"args": [[1, 2], {"a": 1}], "expected": 3.0}], "atol": 1e-6}
    )
    assert isinstance(spec, CasesSpec)
    assert spec.entry_point == "f" and spec.atol == 1e-6 and spec.resolved
    assert spec.cases[0].args == ([1, 2], {"$d": [["a", 1]]})


def test_reference_makes_expected_optional() -> None:
    """With a reference solution, cases need only their arguments."""
    spec = parse_spec(
        {"entry_point": "f", "cases": [{"args": [1]}], "reference": "def f(x): return x"}
    )
    assert isinstance(spec, CasesSpec) and not spec.resolved


BAD: list[tuple[Any, str]] = [
    ("assert x", ""),
    ({}, ""),
    ({"asserts": []}, "asserts"),
    ({"asserts": "assert f(1)"}, "asserts"),
    ({"asserts": [1]}, "asserts[0]"),
    ({"asserts": ["assert f(1) ==", "x"]}, "asserts[0]"),
    (["assert f(1) == 1", "x = 1"], "asserts[1]"),
    (["assert f(1) == 1\nassert f(2) == 2"], "asserts[0]"),
    ({"asserts": ["assert f(1)"], "setup": "import ("}, "setup"),
    ({"asserts": ["assert f(1)"], "setup": 3}, "setup"),
    ({"asserts": ["assert f(1)"], "bogus": 1}, "bogus"),
    ({"asserts": ["assert 1"], "cases": []}, "asserts"),
    ({"cases": [{"args": [1], "expected": 1}]}, "entry_point"),
    ({"entry_point": "1f", "cases": [{"args": [1], "expected": 1}]}, "entry_point"),
    ({"entry_point": "f", "cases": []}, "cases"),
    ({"entry_point": "f", "cases": [{"args": 1, "expected": 1}]}, "cases[0].args"),
    (
        {"entry_point": "f", "cases": [{"args": [1], "expected": 1}, {"args": [2]}]},
        "cases[1].expected",
    ),
    ({"entry_point": "f", "cases": [{"args": [1], "expected": 1, "kw": 2}]}, "cases[0].kw"),
    ({"entry_point": "f", "cases": ["x"]}, "cases[0]"),
    ({"entry_point": "f", "cases": [{"args": [1], "expected": 1}], "atol": -1}, "atol"),
    ({"entry_point": "f", "cases": [{"args": [1], "expected": 1}], "atol": "0"}, "atol"),
    ({"entry_point": "f", "cases": [{"args": [1]}], "reference": "def f(:"}, "reference"),
]


@pytest.mark.parametrize(
    ("obj", "field"), BAD, ids=[f"{i}-{b[1] or 'root'}" for i, b in enumerate(BAD)]
)
def test_malformed_spec_error_names_the_field(obj: Any, field: str) -> None:
    """Every malformed spec raises SpecError whose field and message name the bad part."""
    with pytest.raises(SpecError) as info:
        parse_spec(obj)
    assert info.value.field == field
    if field:
        assert str(info.value).startswith(f"{field}: ")


def test_an_assert_nested_past_pythons_parser_is_a_spec_error_not_a_memory_error() -> None:
    """100,000 unary minus signs make CPython's parser raise MemoryError: a client's test spec
    must get its 400 naming the assert (it was a 500 through every API)."""
    with pytest.raises(SpecError, match=r"asserts\[0\]: nests too deeply"):
        parse_spec({"asserts": ["assert " + "-" * 100_000 + "1"]})
