"""Case outputs against expected values: type-aware equality with a float tolerance (stdlib only).

:func:`values_equal` is what a ``cases`` spec means by "the output equals the expected value"
(EvalPlus's rule). Both sides are plain data as :func:`codec.from_wire` rebuilds it. Apart from
the numeric rules below, the answer is what plain Python ``out == exp`` says, recursively:

* Numbers: equal numbers are equal (``1 == 1.0``, ``Fraction(1, 2) == 0.5``, as Python says).
  Otherwise the tolerance applies only where the *expected* value is a float (or a complex),
  as EvalPlus applies its tolerance only to float expectations: the output, an ``int`` or a
  ``float`` (/``complex``), is equal when ``abs(out - exp) <= atol + 1e-7 * abs(exp)``, at
  ``atol == 0`` too; NaN equals NaN; an infinity equals only the same infinity, whatever
  ``atol`` is. An expected ``int`` (or ``Fraction``, ``Decimal``) is matched exactly: a float
  output within 1e-7 of a large expected int is wrong. ``Fraction`` and ``Decimal`` compare
  exactly, as Python compares them. Ints too large for a float are compared exactly (rational
  arithmetic), never by raising. A ``bool`` equals the int it is (``True == 1``, as in Python)
  but never a float, a complex, a Fraction or a Decimal (unlike Python: ``True`` is not
  ``1.0``).
* Sequences compare element by element, only with their own kind: a list with a list, a tuple
  with a tuple (a namedtuple *is* a tuple, whatever its class), a deque with a deque. A tuple is
  not a list, a deque is not a list. Ranges compare as Python compares them (the same
  sequence), and equal no list or tuple.
* Mappings: ``dict``, ``Counter``, ``OrderedDict`` and ``defaultdict`` all equal each other
  when their keys are equal and their values equal key by key, except as Python says: two
  ``OrderedDict`` must also have their keys in the same order, and two ``Counter`` compare
  with a missing key counting as 0.
* Set-likes (``set``, ``frozenset``, ``d.keys()``, ``d.items()``) compare as Python compares
  them: with each other, as sets (a keys view equals the set of its keys), without a float
  tolerance (membership is by hash), except that two items views compare as mappings, with the
  tolerance on their values. A values view equals nothing, as in Python (``d.values() ==
  d.values()`` is False).
* ``array.array`` compares element by element with another array only (any typecode, as in
  Python), with the tolerance on float elements.
* ``str``, ``bytes``, ``bytearray`` (equal to the same bytes, as in Python), ``None``, the
  ``datetime`` types (a naive datetime equals no aware one) and builtins (``int``, ``len``) as
  Python says; anything else (a type the wire never produces) equals nothing.

Containers deeper than the wire allows (``codec.MAX_DEPTH + 2``) are unequal, and no error
(overflow, recursion, an unhashable set member) ever escapes: it makes the values unequal.
The walk is iterative, so no depth of nesting raises ``RecursionError``.
"""

from __future__ import annotations

import array
import datetime
import math
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Iterator, Mapping
from decimal import Decimal
from fractions import Fraction
from itertools import chain
from typing import Any

from . import codec

__all__ = ["MAX_DEPTH", "values_equal"]

#: containers nested deeper than this (the top value is level 0) are unequal: from_wire
#: rebuilds no deeper ones
MAX_DEPTH = codec.MAX_DEPTH + 2
#: the relative tolerance (EvalPlus's, numpy's ``allclose`` default)
RTOL = 1e-7

_NUM, _BOOL, _SCALAR, _LIST, _TUPLE, _DEQUE, _RANGE, _MAP, _SET, _ITEMS, _VALUES = range(11)
_ARRAY = 11
_KINDS: dict[type, int] = {
    int: _NUM,
    float: _NUM,
    complex: _NUM,
    Fraction: _NUM,
    Decimal: _NUM,
    bool: _BOOL,
    str: _SCALAR,
    bytes: _SCALAR,
    bytearray: _SCALAR,
    type(None): _SCALAR,
    datetime.date: _SCALAR,
    datetime.datetime: _SCALAR,
    datetime.time: _SCALAR,
    datetime.timedelta: _SCALAR,
    array.array: _ARRAY,
    # the builtins the wire carries by name (``int``, ``len``, ``...``): equal only to themselves
    type: _SCALAR,
    type(len): _SCALAR,
    type(...): _SCALAR,
    type(NotImplemented): _SCALAR,
    list: _LIST,
    tuple: _TUPLE,
    deque: _DEQUE,
    range: _RANGE,
    dict: _MAP,
    Counter: _MAP,
    OrderedDict: _MAP,
    defaultdict: _MAP,
    set: _SET,
    frozenset: _SET,
    type({}.keys()): _SET,
    type(OrderedDict().keys()): _SET,
    type({}.items()): _ITEMS,
    type(OrderedDict().items()): _ITEMS,
    type({}.values()): _VALUES,
    type(OrderedDict().values()): _VALUES,
}

Pairs = Iterator[tuple[object, object]]


def values_equal(out: object, exp: object, atol: float) -> bool:
    """Whether the output ``out`` equals the expected value ``exp`` (see the module docstring).

    Never raises: an error while comparing (an overflow, an unhashable member) means unequal.
    """
    try:
        return _walk(out, exp, atol)
    except (ArithmeticError, LookupError, RecursionError, TypeError, ValueError):
        return False


def _walk(out: object, exp: object, atol: float) -> bool:
    """Compare pair by pair, with a stack of the containers being walked (no recursion)."""
    stack: list[Pairs] = [iter(((out, exp),))]
    while stack:
        pair = next(stack[-1], None)
        if pair is None:
            stack.pop()
            continue
        step = _step(pair[0], pair[1], atol)
        if step is True:
            continue
        if step is False or len(stack) > MAX_DEPTH + 1:
            return False
        stack.append(step)
    return True


def _kind(t: type) -> int | None:
    kind = _KINDS.get(t)
    if kind is None and issubclass(t, tuple) and type(getattr(t, "_fields", None)) is tuple:
        return _TUPLE  # a namedtuple (from_wire makes them; any class is its own here)
    return kind


# _step and _numbers_equal dispatch on ``type(a)``, ``type(b)`` (read once: the hot path), by
# which mypy cannot narrow ``a`` and ``b``: those are unchecked, their kinds say what they are


def _step(a: Any, b: Any, atol: float) -> bool | Pairs:
    """True or False for a pair that is decided, else the pairs of elements still to compare."""
    ta, tb = type(a), type(b)
    if ta is tb and (ta is int or ta is str or ta is bool):  # the common leaves, quickly
        return bool(a == b)
    ka, kb = _kind(ta), _kind(tb)
    if ka is None or kb is None:
        return False
    if ka == _NUM or kb == _NUM:
        if ka == _BOOL or kb == _BOOL:  # True == 1 as in Python, but True is not 1.0
            return (ta is int or tb is int) and bool(a == b)
        return ka == kb and _numbers_equal(a, b, atol)
    if ka in (_BOOL, _SCALAR) or kb in (_BOOL, _SCALAR):
        return ka in (_BOOL, _SCALAR) and kb in (_BOOL, _SCALAR) and bool(a == b)
    if ka == _ITEMS and kb == _ITEMS:  # as mappings, so that values get the tolerance
        if len(a) != len(b) or a.mapping.keys() != b.mapping.keys():
            return False
        return _values(a.mapping, b.mapping)
    if ka in (_SET, _ITEMS, _VALUES) or kb in (_SET, _ITEMS, _VALUES):
        return bool(a == b)  # set-like (or identity, for a values view), as Python says
    if ka != kb:
        return False
    if ka == _RANGE:
        return bool(a == b)
    if ka == _MAP:
        return _mappings(a, b)
    if len(a) != len(b):  # list, tuple, deque
        return False
    return zip(a, b, strict=True)


def _mappings(a: Mapping[object, object], b: Mapping[object, object]) -> bool | Pairs:
    ta, tb = type(a), type(b)
    if ta is Counter and tb is Counter:  # Python: a missing key counts as 0
        return ((a[k], b[k]) for k in chain(a, b))
    if a.keys() != b.keys():
        return False
    if ta is OrderedDict and tb is OrderedDict and list(a) != list(b):
        return False  # Python: two OrderedDicts are also equal in order
    return _values(a, b)


def _values(a: Mapping[object, object], b: Mapping[object, object]) -> Pairs:
    """Value pairs of two mappings with equal keys (``a`` the output's)."""
    return ((a[k], b[k]) for k in b)


def _numbers_equal(a: Any, b: Any, atol: float) -> bool:
    """int/float/complex ``a`` (the output) against ``b`` (the expected value)."""
    if a == b:  # exact, for any mix of the numeric types
        return True
    ta, tb = type(a), type(b)
    if tb is not float and tb is not complex:
        return False  # an expected int, Fraction or Decimal: exactly, never within a tolerance
    if ta is not int and ta is not float and ta is not complex:
        return False  # a Fraction or a Decimal output: exactly
    if ta is complex or tb is complex:
        return _complex_close(a, b, atol)
    if a != a or b != b:  # NaN equals only NaN
        return bool(a != a and b != b)
    if (ta is float and math.isinf(a)) or (tb is float and math.isinf(b)):
        return False  # an infinity equals only itself (a == b above), whatever atol is
    try:
        return bool(abs(a - b) <= atol + RTOL * abs(b))
    except OverflowError:  # an int beyond float range: exactly, in rationals
        return _exact_close(a, b, atol)


def _exact_close(a: float, b: float, atol: float) -> bool:
    """``abs(a - b) <= atol + RTOL * abs(b)`` in exact rational arithmetic (finite a, b)."""
    if atol != atol:
        return False
    if math.isinf(atol):
        return atol > 0
    (p1, q1), (p2, q2) = a.as_integer_ratio(), b.as_integer_ratio()
    p3, q3 = atol.as_integer_ratio()
    p4, q4 = RTOL.as_integer_ratio()
    # |p1/q1 - p2/q2| <= p3/q3 + (p4/q4)|p2/q2|, times q1*q2*q3*q4 (all positive)
    lhs: int = abs(p1 * q2 - p2 * q1) * q3 * q4
    return lhs <= p3 * q1 * q2 * q4 + p4 * abs(p2) * q1 * q3


def _complex_close(a: complex, b: complex, atol: float) -> bool:
    """The same rule on complex numbers (``abs`` is the modulus); NaN and infinite parts must
    match part by part. An int beyond float range equals no complex it is not exactly."""
    try:
        ca, cb = complex(a), complex(b)
    except OverflowError:
        return False
    parts = ((ca.real, cb.real), (ca.imag, cb.imag))
    if not all(math.isfinite(x) and math.isfinite(y) for x, y in parts):
        return all(x == y or (x != x and y != y) for x, y in parts)
    try:
        return bool(abs(ca - cb) <= atol + RTOL * abs(cb))
    except OverflowError:
        return False
