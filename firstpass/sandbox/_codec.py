"""Plain data <-> JSON, with tags for what JSON cannot say (stdlib only: the zygote imports it).

Values cross from the sample's process to the verifier in this form and nothing else, so a
sample can only ever hand back *data*: an object of its own class is refused here
(:class:`NonData`) instead of being compared. A subclass of a data type (``Counter``, a
namedtuple, an ``int`` with a forged ``__eq__``) travels as its base type's contents, read with
the base type's own C methods, so none of the sample's methods runs and a forged ``__eq__`` is
simply dropped. A ``deque`` travels as a list.

Wire form: ``None``/``bool``/``int``/``str``/finite ``float`` and ``list`` as themselves;
``{"$t": [...]}`` tuple, ``{"$s": [...]}`` set, ``{"$fs": [...]}`` frozenset,
``{"$d": [[k, v], ...]}`` dict, ``{"$b": "<latin-1>"}`` bytes, ``{"$c": [re, im]}`` complex,
``{"$f": "nan" | "inf" | "-inf"}`` non-finite float.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

__all__ = ["NonData", "WireError", "from_json", "from_wire", "to_wire"]

_DEQUE = deque  # captured before any sample runs: a sample rebinding the name changes nothing

#: how deep values may nest, and how many nodes one value may have
MAX_DEPTH = 100
MAX_NODES = 2_000_000


class NonData(ValueError):
    """A value that is not plain data (``type_name`` says what it was)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name
        super().__init__(f"returned a non-data value of type {type_name}")


class WireError(ValueError):
    """A wire value that does not decode (malformed, too deep or too large)."""


def to_wire(value: Any) -> Any:
    """Encode plain data; raise :class:`NonData` on anything else."""
    budget = [MAX_NODES]
    return _enc(value, 0, budget)


def _enc(v: Any, depth: int, budget: list[int]) -> Any:
    budget[0] -= 1
    if budget[0] < 0:
        raise NonData("oversized value")
    if depth > MAX_DEPTH:
        raise NonData("too deeply nested value")
    t = type(v)
    if v is None or t is bool or t is int or t is str:
        return v
    if t is float:
        return _float(v)
    d = depth + 1
    if t is list:
        return [_enc(x, d, budget) for x in v]
    if t is tuple:
        return {"$t": [_enc(x, d, budget) for x in v]}
    if t is dict:
        return {"$d": [[_enc(k, d, budget), _enc(x, d, budget)] for k, x in v.items()]}
    if t is set:
        return {"$s": [_enc(x, d, budget) for x in v]}
    if t is frozenset:
        return {"$fs": [_enc(x, d, budget) for x in v]}
    if t is bytes:
        return {"$b": v.decode("latin-1")}
    if t is complex:
        return {"$c": [_float(v.real), _float(v.imag)]}
    return _enc_subclass(v, t, d, budget)


def _float(v: float) -> Any:
    if math.isfinite(v):
        return v
    return {"$f": "nan" if v != v else ("inf" if v > 0 else "-inf")}


def _enc_subclass(v: Any, t: type, d: int, budget: list[int]) -> Any:
    """Subclasses of data types (Counter, OrderedDict, namedtuple, an ``int`` with its own
    ``__eq__``...) are encoded as their base type's *contents*, read through the base type's
    C-level methods, so no method the sample defined or patched ever runs."""
    if isinstance(v, int):
        return int.__index__(v)
    if isinstance(v, str):
        return str.__str__(v)
    if isinstance(v, float):
        return _float(float.__float__(v))
    if isinstance(v, dict):
        pairs = dict.items(v)
        return {"$d": [[_enc(k, d, budget), _enc(x, d, budget)] for k, x in pairs]}
    if isinstance(v, list):
        return [_enc(x, d, budget) for x in list.__iter__(v)]
    if isinstance(v, tuple):
        return {"$t": [_enc(x, d, budget) for x in tuple.__iter__(v)]}
    if isinstance(v, frozenset):
        return {"$fs": [_enc(x, d, budget) for x in frozenset.__iter__(v)]}
    if isinstance(v, set):
        return {"$s": [_enc(x, d, budget) for x in set.__iter__(v)]}
    if t is _DEQUE:
        return [_enc(x, d, budget) for x in _DEQUE.__iter__(v)]
    raise NonData(t.__name__ if type(t.__name__) is str else "?")


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def from_wire(w: Any, depth: int = 0) -> Any:
    """Decode a wire value into Python data; raise :class:`WireError` if malformed."""
    if depth > MAX_DEPTH + 2:
        raise WireError("value nests too deeply")
    t = type(w)
    if w is None or t is bool or t is int or t is str or t is float:
        return w
    d = depth + 1
    if t is list:
        return [from_wire(x, d) for x in w]
    if t is not dict or len(w) != 1:
        raise WireError(f"unexpected wire value of type {t.__name__}")
    ((tag, body),) = w.items()
    try:
        if tag == "$t":
            return tuple(from_wire(x, d) for x in _list(body))
        if tag == "$s":
            return {from_wire(x, d) for x in _list(body)}
        if tag == "$fs":
            return frozenset(from_wire(x, d) for x in _list(body))
        if tag == "$d":
            return {from_wire(k, d): from_wire(x, d) for k, x in (_pair(p) for p in _list(body))}
        if tag == "$b" and type(body) is str:
            return body.encode("latin-1")
        if tag == "$c":
            re_, im = _pair(body)
            return complex(from_wire(re_, d), from_wire(im, d))
        if tag == "$f" and body in _FLOATS:
            return _FLOATS[body]
    except TypeError as exc:  # unhashable set member or dict key
        raise WireError(f"malformed {tag} value: {exc}") from exc
    except UnicodeEncodeError as exc:
        raise WireError("malformed bytes value") from exc
    raise WireError(f"unknown wire tag {tag!r}")


def _list(body: Any) -> list[Any]:
    if type(body) is not list:
        raise WireError("tagged value is not a list")
    return body


def _pair(body: Any) -> tuple[Any, Any]:
    if type(body) is not list or len(body) != 2:
        raise WireError("expected a [key, value] pair")
    return body[0], body[1]


def from_json(value: Any) -> Any:
    """Plain JSON (as a user writes it in a spec) -> wire form: objects become tagged dicts."""
    if type(value) is dict:
        return {"$d": [[k, from_json(v)] for k, v in value.items()]}
    if type(value) is list:
        return [from_json(v) for v in value]
    if type(value) is float and not math.isfinite(value):
        return {"$f": "nan" if value != value else ("inf" if value > 0 else "-inf")}
    return value
