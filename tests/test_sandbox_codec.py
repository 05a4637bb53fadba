"""The wire codec (plain data across the trust boundary) and case-output comparison."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
import typing
from collections import Counter, OrderedDict, defaultdict, deque, namedtuple
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstpass.sandbox._child import boot, codec
from firstpass.sandbox._child.codec import MAX_DEPTH, NonData, Wire, WireError, from_wire, to_wire
from firstpass.sandbox._child.compare import values_equal

Point = namedtuple("Point", "x y")


class Typed(typing.NamedTuple):
    a: int
    b: str


def cross(value: Any) -> Any:
    """A value's trip: encoded, through JSON text (as the channel carries it), decoded."""
    return from_wire(json.loads(json.dumps(to_wire(value), allow_nan=False)))


def shape(v: Any) -> Any:
    """Types all the way down (a namedtuple by name and fields: the judge's is another class)."""
    t = type(v)
    if isinstance(v, tuple) and hasattr(t, "_fields"):
        return ("nt", t.__name__, t._fields, [shape(x) for x in v])
    if t in (list, tuple, deque) or t is type({}.keys()) or t is type({}.values()):
        return (t.__name__, [shape(x) for x in v])
    if t in (set, frozenset):
        return (t.__name__, sorted(repr(shape(x)) for x in v))
    if isinstance(v, dict) or t is type({}.items()):
        pairs = v.items() if isinstance(v, dict) else v
        return (t.__name__, sorted((repr(shape(k)), repr(shape(x))) for k, x in pairs))
    return t.__name__


def nest(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


# --------------------------------------------------------------------------- round trips

HUGE_INTS = st.builds(lambda m, e: m * 2**e + m, st.integers(), st.integers(0, 20_000)) | st.builds(
    lambda m, e: m * 10**e, st.integers(-9, 9), st.integers(4000, 6000)
)
HASHABLE = st.recursive(
    st.none() | st.booleans() | st.integers() | HUGE_INTS | st.text(max_size=4) | st.binary(),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=6,
)
LEAVES = (
    st.none()
    | st.booleans()
    | st.integers()
    | HUGE_INTS
    | st.floats()
    | st.text()
    | st.binary()
    | st.complex_numbers()
    | st.builds(range, st.integers(), HUGE_INTS, st.integers().filter(bool))
)
DATA: st.SearchStrategy[Any] = st.recursive(
    LEAVES,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.builds(Point, inner, inner)
        | st.builds(Typed, inner, inner)
        | st.builds(deque, st.lists(inner, max_size=3))
        | st.dictionaries(HASHABLE, inner, max_size=3)
        | st.dictionaries(HASHABLE, inner, max_size=3).map(Counter)
        | st.dictionaries(HASHABLE, inner, max_size=3).map(OrderedDict)
        | st.dictionaries(HASHABLE, inner, max_size=3).map(lambda d: defaultdict(None, d))
        | st.dictionaries(HASHABLE, inner, max_size=3).map(lambda d: d.keys())
        | st.dictionaries(HASHABLE, inner, max_size=3).map(lambda d: d.items())
        | st.sets(HASHABLE, max_size=3)
        | st.frozensets(HASHABLE, max_size=3)
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None)
@given(DATA)
def test_plain_data_of_every_kind_crosses_with_its_types_and_compares_equal(value: Any) -> None:
    """Random nested data (huge ints, NaN, namedtuples, stdlib containers, views) round-trips through JSON exactly."""
    back = cross(value)
    assert shape(back) == shape(value)
    assert values_equal(back, value, 0.0)


@settings(max_examples=200, deadline=None)
@given(HUGE_INTS | st.integers())
def test_every_int_round_trips_exactly_and_small_ones_stay_bare(n: int) -> None:
    """Ints of any size decode to the same int; only those of 2**64 and beyond are tagged."""
    wire = to_wire(n)
    assert cross(n) == n and type(cross(n)) is int
    assert (type(wire) is int) is (abs(n) < 2**64)


def test_ints_beyond_the_str_digit_limit_cross_as_hex() -> None:
    """A 5,000-digit int, which json.dumps cannot write bare, travels as a hex string."""
    n = -(10**5000) - 7
    with pytest.raises(ValueError, match="integer string conversion"):
        json.dumps(n)
    assert to_wire(n) == {"$i": hex(n)}
    assert cross([n, n + 1]) == [n, n + 1]


def test_the_bounds_of_bare_ints_are_exactly_two_to_the_sixty_four() -> None:
    """2**64 - 1 stays a JSON number, 2**64 is tagged, and so are their negatives."""
    assert to_wire(2**64 - 1) == 2**64 - 1
    assert to_wire(-(2**64 - 1)) == -(2**64 - 1)
    assert to_wire(2**64) == {"$i": "0x10000000000000000"}
    assert to_wire(-(2**64)) == {"$i": "-0x10000000000000000"}


_od = OrderedDict([("a", 1), ("b", 2)])
_od.move_to_end("a")


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (Point(1, 2), {"$nt": ["Point", ["x", "y"], [1, 2]]}),
        (Typed(1, "b"), {"$nt": ["Typed", ["a", "b"], [1, "b"]]}),
        (deque([1, (2,)]), {"$dq": [1, {"$t": [2]}]}),
        (Counter("aab"), {"$ctr": [["a", 2], ["b", 1]]}),
        (_od, {"$od": [["b", 2], ["a", 1]]}),
        (defaultdict(list, {1: [2]}), {"$ddf": ["list", [[1, [2]]]]}),
        (defaultdict(lambda: 0, {1: 2}), {"$dd": [[1, 2]]}),
        (range(1, 10, 3), {"$rg": [1, 10, 3]}),
        (range(2**70), {"$rg": [0, {"$i": hex(2**70)}, 1]}),
        ({1: "a"}.keys(), {"$dk": [1]}),
        ({1: "a"}.values(), {"$dv": ["a"]}),
        ({1: "a"}.items(), {"$di": [[1, "a"]]}),
        (_od.keys(), {"$dk": ["a", "b"]}),
        (Counter({"a": 1}).keys(), {"$dk": ["a"]}),
    ],
)
def test_stdlib_containers_travel_under_their_own_tags(value: Any, wire: Any) -> None:
    """namedtuple, deque, Counter, OrderedDict (in its order), defaultdict, range and dict views each have a tag."""
    assert to_wire(value) == wire
    assert to_wire(from_wire(wire)) == wire


def test_a_decoded_namedtuple_has_its_fields_and_still_equals_a_tuple() -> None:
    """The judge's namedtuple answers .x, equals the plain tuple, and its class is made once."""
    back = cross(Point(1, [2]))
    assert (back.x, back.y) == (1, [2])
    assert back == (1, [2]) and isinstance(back, tuple)
    assert type(back).__name__ == "Point" and cast(Any, type(back))._fields == ("x", "y")
    assert type(cross(Point(3, 4))) is type(back)


def test_decoded_stdlib_containers_behave_as_the_originals() -> None:
    """A deque is no list, a Counter counts, a defaultdict keeps a builtin factory (only), views are views."""
    assert type(cross(deque([1]))) is deque and cross(deque([1])) != [1]
    assert cross(Counter("ab"))["z"] == 0
    dd = cross(defaultdict(int, {1: 2}))
    assert type(dd) is defaultdict and dd.default_factory is int and dd == {1: 2}
    assert dd[5] == 0
    dd = cross(defaultdict(lambda: 7, {1: 2}))
    assert type(dd) is defaultdict and dd.default_factory is None and dd == {1: 2}
    assert list(cross(_od)) == ["b", "a"]
    assert cross({3: "x", 4: "y"}.keys()) == {3, 4}
    assert list(cross({3: "x", 4: "y"}.values())) == ["x", "y"]
    assert cross({3: "x"}.items()) == {(3, "x")}
    assert cross(range(0, 2**80, 2**70))[3] == 3 * 2**70


# --------------------------------------------------------------------------- hostile values


def test_a_tuple_subclass_with_a_fake_fields_property_travels_as_a_tuple() -> None:
    """A `_fields` property is not a namedtuple's field list, and it is never called."""
    called = []

    class Fake(tuple):  # type: ignore[type-arg]
        @property
        def _fields(self) -> tuple[str, ...]:
            called.append(1)
            return ("a", "b")

    assert to_wire(Fake((1, 2))) == {"$t": [1, 2]}
    assert not called


def test_a_tuple_subclass_with_patched_methods_travels_as_its_real_contents() -> None:
    """__iter__, __len__ and __getitem__ the sample wrote are not what reads the tuple."""

    class Liar(tuple):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter([99])

        def __len__(self) -> int:
            return 1

        def __getitem__(self, i: Any) -> Any:
            return 99

    assert to_wire(Liar((1, 2, 3))) == {"$t": [1, 2, 3]}


@pytest.mark.parametrize(
    "fields",
    [("a",), ("a", "1b"), ("a", "_b"), ("a", "class"), ("a", "a"), ["a", "b"], ("a", 7)],
    ids=["too_few", "not_identifier", "underscore", "keyword", "duplicate", "list", "not_str"],
)
def test_a_tuple_subclass_whose_fields_namedtuple_would_refuse_travels_as_a_tuple(
    fields: Any,
) -> None:
    """Only a `_fields` tuple of valid, distinct names matching the length makes a namedtuple."""
    cls = type("T", (tuple,), {"_fields": fields})
    assert to_wire(cls((1, 2))) == {"$t": [1, 2]}


def test_a_namedtuple_subclass_overriding_eq_travels_without_its_eq() -> None:
    """The forged __eq__ is dropped: the judge compares the fields' values."""

    class Always(Point):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = tuple.__hash__

    wire = to_wire(Always(1, 2))
    assert wire == {"$nt": ["Always", ["x", "y"], [1, 2]]}
    back = from_wire(wire)
    assert back == (1, 2) and back != (1, 3)
    assert not values_equal(back, (1, 3), 0)


def test_subclasses_of_stdlib_containers_travel_as_their_base_contents() -> None:
    """A Counter/OrderedDict/defaultdict/deque subclass travels as its base, read with the base's C methods."""

    class MyCounter(Counter):  # type: ignore[type-arg]
        def items(self) -> Any:
            return [("forged", 1)]

        def __iter__(self) -> Any:
            return iter(["forged"])

    class MyOD(OrderedDict):  # type: ignore[type-arg]
        pass

    class MyDeque(deque):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            return iter([0])

    assert to_wire(MyCounter("aa")) == {"$ctr": [["a", 2]]}
    assert to_wire(MyOD(a=1)) == {"$od": [["a", 1]]}
    assert to_wire(MyDeque([1, 2])) == {"$dq": [1, 2]}
    assert type(from_wire(to_wire(MyCounter("aa")))) is Counter
    assert type(from_wire(to_wire(MyOD(a=1)))) is OrderedDict


def test_scalar_subclasses_travel_as_their_base_values() -> None:
    """int, str, float, bytes and complex subclasses with forged methods cross as plain values."""

    class I(int):  # noqa: E742
        def __index__(self) -> int:
            return 0

        def __int__(self) -> int:
            return 0

    class S(str):
        def __str__(self) -> str:
            return "forged"

    class F(float):
        def __float__(self) -> float:
            return 0.0

    class B(bytes):
        def __bytes__(self) -> bytes:
            return b"forged"

    class C(complex):
        def __complex__(self) -> complex:
            return 0j

    assert to_wire([I(2**70), S("s"), F(1.5), B(b"b"), C(1j)]) == [
        {"$i": hex(2**70)},
        "s",
        1.5,
        {"$b": "b"},
        {"$c": [0.0, 1.0]},
    ]
    plain = to_wire([I(5), S("s"), F(1.5)])
    assert isinstance(plain, list)
    assert [type(x) for x in plain] == [int, str, float]


def test_an_object_spoofing_its_class_is_not_data_and_its_property_never_runs() -> None:
    """`__class__` as a property fools isinstance, but not the codec: NonData, nothing called."""
    called = []

    class Spoof:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            called.append(1)
            return int

    assert isinstance(Spoof(), int)  # what the codec must not rely on
    called.clear()
    with pytest.raises(NonData, match="type Spoof"):
        to_wire([Spoof()])
    assert not called


def test_a_hostile_metaclass_is_never_consulted() -> None:
    """A class whose metaclass forges __getattribute__, __hash__ and __eq__ is read without them."""

    class Meta(type):
        def __getattribute__(cls, name: str) -> Any:
            raise AssertionError(f"metaclass consulted for {name}")

        def __hash__(cls) -> int:
            raise AssertionError("metaclass hash")

        def __eq__(cls, other: object) -> bool:
            raise AssertionError("metaclass eq")

    NT = Meta("NT", (tuple,), {"_fields": ("p", "q")})
    Obj = Meta("Obj", (), {})
    assert to_wire([NT((1, 2)), NT((3, 4))]) == [
        {"$nt": ["NT", ["p", "q"], [1, 2]]},
        {"$nt": ["NT", ["p", "q"], [3, 4]]},
    ]
    with pytest.raises(NonData, match="type Obj"):
        to_wire(Obj())


def test_an_ordered_dict_with_hostile_keys_is_encoded_without_hashing_them() -> None:
    """Keys with a Python __hash__ are not hashed by the encoder (the dict's own order is used)."""
    calls = []

    class Key(str):
        def __hash__(self) -> int:
            calls.append(1)
            return str.__hash__(self)

        def __eq__(self, other: object) -> bool:
            calls.append(1)
            return str.__eq__(self, other)

    od = OrderedDict([(Key("a"), 1), (Key("b"), 2)])
    calls.clear()
    assert to_wire(od) == {"$od": [["a", 1], ["b", 2]]}
    assert not calls


def test_a_dict_subclass_with_forged_accessors_travels_as_its_real_contents() -> None:
    """items, keys, __iter__ and __getitem__ the sample wrote are not what reads a dict."""

    class Forged(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            return [("x", 0)]

        def keys(self) -> Any:
            return ["x"]

        def __iter__(self) -> Any:
            return iter(["x"])

        def __getitem__(self, k: Any) -> Any:
            return 0

    assert to_wire(Forged(a=1)) == {"$d": [["a", 1]]}


def test_user_objects_inside_containers_and_views_are_refused() -> None:
    """An object anywhere (a set member, a view's key, a namedtuple field) is NonData."""

    class A:
        pass

    a = A()
    for value in ([a], {a}, {a: 1}.keys(), {1: a}.values(), Point(1, a), deque([a]), Counter([a])):
        with pytest.raises(NonData, match="type A"):
            to_wire(value)
    with pytest.raises(NonData):
        to_wire(memoryview(b"x"))


# --------------------------------------------------------------------------- bounds


def test_nesting_is_bounded_without_recursion_errors() -> None:
    """MAX_DEPTH levels cross; deeper ones are NonData, even 100,000 levels deep."""
    assert cross(nest(MAX_DEPTH)) == nest(MAX_DEPTH)
    with pytest.raises(NonData, match="too deeply nested"):
        to_wire(nest(MAX_DEPTH + 1))
    with pytest.raises(NonData, match="too deeply nested"):
        to_wire(nest(100_000))


def test_a_three_million_element_list_round_trips() -> None:
    """Lists far beyond the old 2,000,000-node cap cross, in reasonable time."""
    value = list(range(3_000_000))
    value[7] = 2**100
    cpu = time.process_time()  # CPU time: a loaded machine cannot trip it
    back = from_wire(to_wire(value))
    assert back == value
    assert time.process_time() - cpu < 20


def test_both_directions_enforce_the_same_node_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """A value over MAX_NODES is NonData when encoded and WireError when a wire form claims it."""
    monkeypatch.setattr(codec, "MAX_NODES", 10)
    assert from_wire(to_wire(list(range(9)))) == list(range(9))
    assert to_wire({1: 2, 3: 4}) == {"$d": [[1, 2], [3, 4]]}  # 1 + 2 pairs = 5 nodes
    with pytest.raises(NonData, match="oversized"):
        to_wire(list(range(10)))
    with pytest.raises(NonData, match="oversized"):
        to_wire([[1, 2, 3], [4, 5, 6], [7, 8, 9]])
    with pytest.raises(WireError, match="too many nodes"):
        from_wire(list(range(10)))
    with pytest.raises(WireError, match="too many nodes"):
        from_wire({"$ctr": [[i, i] for i in range(5)]})


def test_one_value_carries_a_bounded_number_of_namedtuple_classes() -> None:
    """Past MAX_NT_CLASSES classes a namedtuple travels as a tuple, and the judge refuses more."""
    limit = codec.MAX_NT_CLASSES
    # classes made at run time: mypy sees plain tuple classes, so their uses are left untyped
    classes: list[Any] = [namedtuple(f"N{i}", "a") for i in range(limit + 1)]
    wire: Any = to_wire([cls(i) for i, cls in enumerate(classes)] + [classes[0](0)])
    assert [next(iter(w)) for w in wire] == ["$nt"] * limit + ["$t", "$nt"]
    assert from_wire(wire)[limit] == (limit,)
    forged: list[Wire] = [{"$nt": [f"N{i}", ["a"], [i]]} for i in range(limit + 1)]
    with pytest.raises(WireError, match="namedtuple classes"):
        from_wire(forged)
    with pytest.raises(WireError, match="invalid names"):
        from_wire(
            {
                "$nt": [
                    "N",
                    [f"f{i}" for i in range(codec.MAX_NT_FIELDS + 1)],
                    [0] * (codec.MAX_NT_FIELDS + 1),
                ]
            }
        )


def test_the_node_cap_is_twenty_million() -> None:
    """The cap admits lists ten times the old limit."""
    assert codec.MAX_NODES == 20_000_000 and MAX_DEPTH == 100


# --------------------------------------------------------------------------- malformed wire


@pytest.mark.parametrize(
    "wire",
    [
        {"$x": 1},
        {"$t": 1},
        {"$t": [1], "$s": [2]},
        {"$d": [[1]]},
        {"$d": [[[1], 2]]},
        {"$s": [[1]]},
        {"$s": [{"$dq": []}]},
        {"$b": "\u0100"},
        {"$b": 1},
        {"$c": [1, 2]},
        {"$c": ["a", 1.0]},
        {"$c": [1.0]},
        {"$f": "NaN"},
        {"$f": ["nan"]},
        {"$i": "12"},
        {"$i": "0x"},
        {"$i": "0x1_0"},
        {"$i": " 0x10"},
        {"$i": "0xG"},
        {"$i": 5},
        {"$nt": ["P", ["x"], [1, 2]]},
        {"$nt": ["P", ["x", "x"], [1, 2]]},
        {"$nt": ["P", ["_x"], [1]]},
        {"$nt": ["1P", ["x"], [1]]},
        {"$nt": ["P", ["def"], [1]]},
        {"$nt": ["P", [1], [1]]},
        {"$nt": ["P", "x", [1]]},
        {"$nt": ["P", ["x"]]},
        {"$nt": ["P", ["ﬁ", "fi"], [1, 2]]},
        {"$rg": [0, 1, 0]},
        {"$rg": [0, 1.5, 1]},
        {"$rg": [0, True, 1]},
        {"$rg": [0, 1]},
        {"$dk": [[1]]},
        {"$di": [[[1], 2]]},
        {"$ctr": [[1, 2, 3]]},
        {"$od": "ab"},
        {"$dv": {"$t": []}},
        {1: [1]},
        {},
        (1, 2),
        {1, 2},
        b"x",
        object(),
    ],
)
def test_malformed_wire_values_raise_wire_error(wire: Any) -> None:
    """Unknown tags, bad bodies, unhashable members, invalid names and bad ranges are all WireError."""
    with pytest.raises(WireError):
        from_wire(wire)


def test_deep_wire_values_raise_wire_error_not_recursion_error() -> None:
    """A wire value 100,000 lists deep (or tags deep) is refused before the stack is."""
    with pytest.raises(WireError, match="too deeply"):
        from_wire(nest(100_000))
    deep: Any = 1
    for _ in range(100_000):
        deep = {"$t": [deep]}
    with pytest.raises(WireError, match="too deeply"):
        from_wire(deep)


TAGS = ["$t", "$s", "$fs", "$d", "$b", "$c", "$f", "$i", "$nt", "$dq", "$ctr", "$od", "$dd"]
TAGS += ["$rg", "$dk", "$dv", "$di", "$x"]
TAGS += ["$fr", "$dec", "$date", "$td", "$time", "$dt", "$ba", "$arr", "$bt", "$ddf", "$r"]
JSONISH = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=6)
    | st.sampled_from(["nan", "inf", "0x1f", "-0xff", "P", "x", "\u0100", "int", "d", "u", "1.5"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=3), inner, max_size=2)
        | st.builds(lambda tag, body: {tag: body}, st.sampled_from(TAGS), inner)
    ),
    max_leaves=15,
)


@settings(max_examples=1000, deadline=None)
@given(JSONISH)
def test_from_wire_on_arbitrary_json_returns_or_raises_wire_error_only(wire: Any) -> None:
    """Fuzzed JSON-like input (tag-shaped dicts included) decodes or raises WireError, nothing else."""
    try:
        value = from_wire(wire)
    except WireError:
        return
    assert values_equal(value, value, 0.0) in (True, False)


def test_the_codec_loads_the_zygote_s_way_in_an_isolated_python() -> None:
    """The zygote's way in (`python -I -S`, the child package loaded by boot.py) works: stdlib only."""
    code = (
        f"import runpy, sys; runpy.run_path({boot.__file__!r})['load']()\n"
        f"from {boot.PACKAGE} import codec, compare\n"
        "w = codec.to_wire([2**70, (1,)])\n"
        "assert compare.values_equal(codec.from_wire(w), [2**70, (1,)], 0)\n"
        "assert not [m for m in sys.modules if m.startswith('firstpass')]\n"
    )
    subprocess.run([sys.executable, "-I", "-S", "-c", code], check=True, timeout=60)


# --------------------------------------------------------------------------- comparison

P2 = namedtuple("P2", "a b")
_nan = math.nan
_d = {1: "a", 2: "b"}

# (name, out, exp, atol, equal, python) - python: whether plain `out == exp` must agree
EQUALITY = [
    # numbers
    ("int_int", 3, 3, 0, True, True),
    ("int_int_differ", 3, 4, 0.5, False, True),
    ("ints_ignore_atol", 3, 4, 2.0, False, True),
    ("int_float", 1, 1.0, 0, True, True),
    ("bool_int", True, 1, 0, True, True),
    ("bool_bool", False, False, 0, True, True),
    ("bool_float", True, 1.0, 0, False, False),  # deliberate: not Python's True
    ("bool_complex", True, 1 + 0j, 0, False, False),  # deliberate
    ("str_int", "1", 1, 0, False, True),
    ("sum_at_atol_zero", sum([0.1, 0.2]), 0.3, 0, True, False),  # the relative 1e-7
    ("relative_edge_in", 1.0 + 0.9e-7, 1.0, 0, True, False),
    ("relative_edge_out", 1.0 + 1.1e-7, 1.0, 0, False, True),
    ("atol_in", 1.05, 1.0, 0.1, True, False),
    ("atol_out", 1.2, 1.0, 0.1, False, True),
    ("relative_is_of_expected", 0.0, 1e-8, 0, False, True),
    ("nan_nan", _nan, float("nan"), 0, True, False),  # deliberate
    ("nan_number", _nan, 1.0, 1e9, False, True),
    ("inf_inf", math.inf, math.inf, 0, True, True),
    ("inf_minus_inf", math.inf, -math.inf, 1e300, False, True),
    ("inf_finite_big_atol", math.inf, 1e308, 1e308, False, True),
    ("finite_inf_big_atol", 1e308, math.inf, 1e308, False, True),
    ("overflowing_difference", 1e308, -1e308, 0, False, True),
    ("huge_int_float", 10**400, 1.0, 0.5, False, True),
    ("float_huge_int", 1e308, 10**400, 1e300, False, True),
    ("huge_int_near_max_float", 2**1024, 1.7976931348623157e308, 0, True, False),
    ("huge_int_inf", 10**400, math.inf, 0, False, True),
    ("huge_int_huge_int", 10**400, 10**400, 0, True, True),
    ("complex_close", 1 + 1j + 1e-9, 1 + 1j, 1e-6, True, False),
    ("complex_far", 1 + 2j, 1 + 1j, 0.5, False, True),
    ("complex_int", 1 + 0j, 1, 0, True, True),
    ("complex_str", 1j, "1j", 1, False, True),
    ("complex_nan", complex(_nan, 1), complex(_nan, 1), 0, True, False),
    ("complex_inf", complex(math.inf, 0), complex(-math.inf, 0), 1e300, False, True),
    ("complex_huge_int", 1 + 0j, 10**400, 1, False, True),
    # sequences
    ("list_list", [1, (2, 3)], [1, (2, 3)], 0, True, True),
    ("tuple_list", (1, 2), [1, 2], 0, False, True),
    ("nested_tolerance", [[0.1 + 0.2]], [[0.3]], 0, True, False),
    ("list_length", [1, 2], [1, 2, 3], 0, False, True),
    ("namedtuple_tuple", Point(1, 2), (1, 2), 0, True, True),
    ("namedtuple_other_namedtuple", Point(1, 2), P2(1, 2), 0, True, True),
    ("namedtuple_list", Point(1, 2), [1, 2], 0, False, True),
    ("namedtuple_tolerance", Point(0.1 + 0.2, 1), (0.3, 1), 0, True, False),
    ("deque_deque", deque([1, 2]), deque([1, 2]), 0, True, True),
    ("deque_list", deque([1, 2]), [1, 2], 0, False, True),
    ("deque_tuple", deque([1, 2]), (1, 2), 0, False, True),
    ("range_same_sequence", range(0, 3, 2), range(0, 4, 2), 0, True, True),
    ("range_empty_empty", range(0), range(5, 5), 0, True, True),
    ("range_differ", range(3), range(4), 0, False, True),
    ("range_list", range(3), [0, 1, 2], 0, False, True),
    ("range_tuple", range(3), (0, 1, 2), 0, False, True),
    # mappings
    ("dict_dict", {"a": [1.0000001]}, {"a": [1.0]}, 1e-6, True, False),
    ("dict_keys_differ", {"a": 1}, {"b": 1}, 0, False, True),
    ("dict_int_float_value", {"a": 1}, {"a": 1.0}, 0, True, True),
    ("counter_dict", Counter("aab"), {"a": 2, "b": 1}, 0, True, True),
    ("counter_counter_zero", Counter({"a": 1, "b": 0}), Counter({"a": 1}), 0, True, True),
    ("counter_dict_zero", Counter({"a": 1, "b": 0}), {"a": 1}, 0, False, True),
    ("counter_counter_differ", Counter("ab"), Counter("abb"), 0, False, True),
    ("ordereddict_dict", OrderedDict(a=1, b=2), {"b": 2, "a": 1}, 0, True, True),
    ("ordereddict_order", OrderedDict(a=1, b=2), OrderedDict(b=2, a=1), 0, False, True),
    ("ordereddict_same", OrderedDict(a=1, b=2), OrderedDict(a=1, b=2), 0, True, True),
    ("defaultdict_dict", defaultdict(None, {1: 2}), {1: 2}, 0, True, True),
    ("defaultdict_counter", defaultdict(None, {1: 2}), Counter({1: 2}), 0, True, True),
    ("dict_list", {1: 2}, [(1, 2)], 0, False, True),
    # sets and views
    ("set_frozenset", {1, 2}, frozenset({1, 2}), 0, True, True),
    ("set_no_tolerance", {0.1 + 0.2}, {0.3}, 1, False, True),
    ("set_list", {1}, [1], 0, False, True),
    ("keys_keys", {1: "a"}.keys(), {1: "b"}.keys(), 0, True, True),
    ("keys_set", _d.keys(), {1, 2}, 0, True, True),
    ("keys_frozenset", _d.keys(), frozenset({1, 2}), 0, True, True),
    ("keys_list", _d.keys(), [1, 2], 0, False, True),
    ("keys_differ", _d.keys(), {1: 0}.keys(), 0, False, True),
    ("items_items", _d.items(), dict(_d).items(), 0, True, True),
    ("items_tolerance", {1: 0.1 + 0.2}.items(), {1: 0.3}.items(), 0, True, False),
    ("items_type_aware", {1: [1]}.items(), {1: (1,)}.items(), 0, False, True),
    ("items_set", {1: 2}.items(), {(1, 2)}, 0, True, True),
    ("items_keys", {1: 2}.items(), {1: 2}.keys(), 0, False, True),
    ("values_values", _d.values(), dict(_d).values(), 0, False, True),
    ("values_itself", _d.values(), _d.values(), 0, False, True),  # two views: not identical
    ("values_list", _d.values(), ["a", "b"], 0, False, True),
    ("items_set_unhashable_value", {1: [1]}.items(), {(1, 2)}, 0, False, False),  # Python raises
    # the rest
    ("none_none", None, None, 0, True, True),
    ("none_zero", None, 0, 0, False, True),
    ("bytes_str", b"a", "a", 0, False, True),
    ("object", object(), object(), 0, False, True),
]


@pytest.mark.parametrize(
    ("out", "exp", "atol", "equal", "python"),
    [row[1:] for row in EQUALITY],
    ids=[row[0] for row in EQUALITY],
)
def test_case_equality_follows_the_table_and_agrees_with_python_where_not_deliberate(
    out: Any, exp: Any, atol: float, equal: bool, python: bool
) -> None:
    """Each row's verdict is fixed; rows marked `python` also equal what plain `out == exp` says."""
    assert values_equal(out, exp, atol) is equal
    if python:
        assert bool(out == exp) is equal


def test_decoded_values_compare_as_the_originals_do() -> None:
    """The table holds after the wire: out and exp both rebuilt by from_wire."""
    for name, out, exp, atol, equal, _ in EQUALITY:
        if name in ("object", "values_itself"):
            continue
        assert values_equal(cross(out), cross(exp), atol) is equal, name


def test_huge_ints_against_floats_never_raise() -> None:
    """Overflow in int/float arithmetic makes values unequal or is done exactly: it never escapes."""
    for big in (10**400, -(10**400), 2**1024, 10**5000):
        for f in (0.0, 1e308, -1e308, math.inf, math.nan, 1.5):
            for atol in (0, 1e-9, 1e300, math.inf):
                assert values_equal(big, f, atol) in (True, False)
                assert values_equal(f, big, atol) in (True, False)
                assert values_equal([big], [complex(f, 0)], atol) in (True, False)
    assert values_equal(2**1024 + 2**900, 1.7976931348623157e308, 0)
    assert not values_equal(2**1030, 1.7976931348623157e308, 1e300)
    assert values_equal(10**400, 1e308, math.inf)


def test_deep_values_compare_unequal_instead_of_raising() -> None:
    """A 1,000-deep value is unequal (it cannot have come from the wire); wire-deep ones compare."""
    assert values_equal(nest(1000), nest(1000), 0) is False
    assert values_equal(nest(100_000), nest(100_000), 0) is False
    assert values_equal(nest(MAX_DEPTH), nest(MAX_DEPTH), 0) is True
    assert values_equal(nest(MAX_DEPTH), nest(MAX_DEPTH - 1), 0) is False
    deep_set: Any = frozenset()
    for _ in range(3000):
        deep_set = frozenset({deep_set})
    assert values_equal({deep_set}, {deep_set}, 0) in (True, False)


def test_the_comparison_walks_big_lists_in_reasonable_time() -> None:
    """Two equal 1,000,000-element lists compare in seconds, not minutes."""
    a = list(range(1_000_000))
    cpu = time.process_time()  # CPU time: a loaded machine cannot trip it
    assert values_equal(a, list(a), 0)
    assert time.process_time() - cpu < 10


@settings(max_examples=300, deadline=None)
@given(DATA, DATA, st.sampled_from([0, 1e-9, 1.0, math.inf]))
def test_the_comparison_never_raises_and_is_reflexive_on_wire_data(
    a: Any, b: Any, atol: float
) -> None:
    """Any two values give True or False; a value crossed equals itself."""
    assert values_equal(a, b, atol) in (True, False)
    assert values_equal(cross(a), a, atol)
