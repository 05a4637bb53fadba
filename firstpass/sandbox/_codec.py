"""Plain data <-> JSON, with tags for what JSON cannot say (stdlib only: the zygote imports it).

Values cross from the sample's process to the verifier in this form and nothing else, so a
sample can only ever hand back *data*: an object of its own class is refused here
(:class:`NonData`) instead of being compared. Every value is read with the C-level methods of
the type it is encoded as (``tuple.__iter__``, ``dict.items``, class attributes through
``type.__dict__`` descriptors), never through the value's own methods or ``__getattribute__``,
so none of the sample's code runs while it is encoded and a forged ``__eq__`` is simply dropped.

Which type a value travels as is decided by ``type(value)`` (which a sample cannot spoof; a
``__class__`` property is never consulted) against classes captured when this module is
imported. The stdlib containers below travel as themselves when their type is exactly that
class. Any other subclass of a data type (an ``int`` with a forged ``__eq__``, a ``Counter``
subclass, a sample's own ``dict`` subclass) travels as its base type's contents; a subclass of
``deque`` as a deque. A tuple whose class has a ``_fields`` class attribute that is a tuple of
valid field names (a namedtuple, ``typing.NamedTuple``, a subclass of one) travels as a
namedtuple; any other tuple subclass as a tuple.

Wire form: ``None``/``bool``/``str``/finite ``float``, ``int`` with ``abs(i) < 2**64`` and
``list`` as themselves;

* ``{"$i": "-0x1f..."}`` an int with ``abs(i) >= 2**64`` (hex: no digit limit, exact),
* ``{"$t": [...]}`` tuple, ``{"$s": [...]}`` set, ``{"$fs": [...]}`` frozenset,
* ``{"$d": [[k, v], ...]}`` dict,
* ``{"$b": "<latin-1>"}`` bytes, ``{"$c": [re, im]}`` complex,
* ``{"$f": "nan" | "inf" | "-inf"}`` non-finite float,
* ``{"$nt": [typename, [field, ...], [v, ...]]}`` namedtuple (decoded as a
  ``collections.namedtuple`` of that name and fields: it still equals a plain tuple),
* ``{"$dq": [...]}`` deque (``maxlen`` is not kept), ``{"$ctr": [[k, v], ...]}`` Counter,
  ``{"$od": [[k, v], ...]}`` OrderedDict (in its order), ``{"$dd": [[k, v], ...]}``
  defaultdict (decoded with no default factory: a factory is code and cannot cross),
* ``{"$rg": [start, stop, step]}`` range (each an int in wire form),
* ``{"$dk": [...]}``, ``{"$dv": [...]}``, ``{"$di": [[k, v], ...]}`` the views ``d.keys()``,
  ``d.values()``, ``d.items()`` of a dict (of any dict, OrderedDict included); decoded as views
  of a fresh dict (a values view's dict has the keys ``0..n-1``).

Both directions enforce the same bounds: at most :data:`MAX_DEPTH` levels of nesting and
:data:`MAX_NODES` values in all (a container with ``n`` elements counts ``n``, a mapping with
``n`` pairs ``2n``, plus one for the root). :func:`from_wire` raises :class:`WireError`, and
nothing else, on any value it cannot decode.
"""

from __future__ import annotations

import keyword
import math
from collections import Counter, OrderedDict, defaultdict, deque, namedtuple
from collections.abc import Iterator
from itertools import islice
from typing import Any
from unicodedata import is_normalized as _is_normalized

__all__ = ["MAX_DEPTH", "MAX_NODES", "NonData", "WireError", "from_json", "from_wire", "to_wire"]

#: how deep values may nest, and how many nodes one value may have
MAX_DEPTH = 100
MAX_NODES = 20_000_000
#: a namedtuple with more fields than this travels as a plain tuple, and so does one of a
#: class beyond the first MAX_NT_CLASSES (by name and fields) in one value: the judge makes
#: each class anew, which must stay cheap whatever a sample sends
MAX_NT_FIELDS = 1000
MAX_NT_CLASSES = 100

# Captured before any sample runs: a sample rebinding a name (``collections.deque = list``)
# or patching ``collections`` changes nothing here.
_DEQUE = deque
_COUNTER = Counter
_ODICT = OrderedDict
_DDICT = defaultdict
_NAMEDTUPLE = namedtuple
_KEYS: Any = type({}.keys())
_VALUES: Any = type({}.values())
_ITEMS: Any = type({}.items())
_OD_KEYS: Any = type(OrderedDict().keys())
_OD_VALUES: Any = type(OrderedDict().values())
_OD_ITEMS: Any = type(OrderedDict().items())
_OD_ITER = OrderedDict.__iter__
_VIEWS = (_KEYS, _VALUES, _ITEMS, _OD_KEYS, _OD_VALUES, _OD_ITEMS)
_ISKEYWORD = keyword.iskeyword
#: C-level class attributes, read without the metaclass's ``__getattribute__``
_MRO = type.__dict__["__mro__"]
_CLASS_DICT = type.__dict__["__dict__"]
_CLASS_NAME = type.__dict__["__name__"]
_PROXY_ITEMS = type(_CLASS_DICT.__get__(int)).items
_MISSING = object()
#: ints at least this large (in absolute value) travel as hex
_BIG = 1 << 64
#: exact types whose hash runs no Python code (an OrderedDict is walked in order only when
#: every key is of one of these). Types are matched by identity, never by hashing them: a
#: sample's metaclass may define ``__hash__``.
_SAFE_HASH = (type(None), bool, int, str, float, bytes, complex, range)


class NonData(ValueError):
    """A value that is not plain data (``type_name`` says what it was)."""

    def __init__(self, type_name: str) -> None:
        self.type_name = type_name
        super().__init__(f"returned a non-data value of type {type_name}")


class WireError(ValueError):
    """A wire value that does not decode (malformed, too deep or too large)."""


# --------------------------------------------------------------------------- encoding


class _Budget:
    """What one value may still use: nodes, and namedtuple classes (by name and fields);
    also the namedtuple fields already read, by class id."""

    __slots__ = ("error", "fields", "named", "nodes")

    def __init__(self, error: type[ValueError]) -> None:
        self.nodes = MAX_NODES - 1  # the root
        self.named: set[tuple[str, tuple[str, ...]]] = set()
        self.fields: dict[int, tuple[str, tuple[str, ...]] | None] = {}
        self.error = error

    def take(self, n: int) -> None:
        self.nodes -= n
        if self.nodes < 0:
            raise self.error(
                "oversized value" if self.error is NonData else "value has too many nodes"
            )

    def admit(self, named: tuple[str, tuple[str, ...]]) -> bool:
        """Whether a namedtuple of this name and fields may be one of the value's classes."""
        if named not in self.named:
            if len(self.named) >= MAX_NT_CLASSES:
                return False
            self.named.add(named)
        return True


def to_wire(value: Any) -> Any:
    """Encode plain data; raise :class:`NonData` on anything else."""
    return _enc(value, 0, _Budget(NonData))


def _enc(v: Any, depth: int, b: _Budget) -> Any:
    t = type(v)
    if v is None or t is bool or t is str:
        return v
    if t is int:
        return v if -_BIG < v < _BIG else {"$i": hex(v)}
    if t is float:
        return _float(v)
    if depth >= MAX_DEPTH and _nonempty(v, t):
        raise NonData("too deeply nested value")
    d = depth + 1
    if t is list:
        return _seq(v, len(v), d, b)
    if t is tuple:
        return {"$t": _seq(v, len(v), d, b)}
    if t is dict:
        return {"$d": _pairs(dict.items(v), len(v), d, b)}
    if t is set:
        return {"$s": _seq(v, len(v), d, b)}
    if t is frozenset:
        return {"$fs": _seq(v, len(v), d, b)}
    if t is bytes:
        return {"$b": v.decode("latin-1")}
    if t is complex:
        return {"$c": [_float(v.real), _float(v.imag)]}
    if t is range:
        return {"$rg": [_int(v.start), _int(v.stop), _int(v.step)]}
    if t is _DEQUE:
        return {"$dq": _seq(v, len(v), d, b)}
    if t is _COUNTER or t is _DDICT:
        return {"$ctr" if t is _COUNTER else "$dd": _pairs(dict.items(v), dict.__len__(v), d, b)}
    if t is _ODICT:
        return {"$od": _pairs(_od_items(v), dict.__len__(v), d, b)}
    if t is _KEYS or t is _OD_KEYS:
        return {"$dk": _seq(_KEYS.__iter__(v), len(v), d, b)}
    if t is _VALUES or t is _OD_VALUES:
        return {"$dv": _seq(_VALUES.__iter__(v), len(v), d, b)}
    if t is _ITEMS or t is _OD_ITEMS:
        return {"$di": _pairs(_ITEMS.__iter__(v), len(v), d, b)}
    return _enc_subclass(v, t, d, b)


def _nonempty(v: Any, t: type) -> bool:
    """Whether a container has elements (read with C methods): an empty one may sit at the
    deepest level, as a scalar may. Anything else is not a container here."""
    for base in (list, tuple, dict, set, frozenset, _DEQUE):
        if issubclass(t, base):
            return base.__len__(v) > 0
    if _one_of(t, _VIEWS):
        return len(v) > 0
    return False


def _seq(items: Any, n: int, d: int, b: _Budget) -> list[Any]:
    """Encode the ``n`` elements of an iterable (``n`` read before: a thread of the sample's
    that grows the container meanwhile cannot take the value past the budget)."""
    b.take(n)
    out: list[Any] = []
    add = out.append
    for x in islice(items, n):
        tx = type(x)
        if (
            tx is str
            or tx is bool
            or x is None
            or (tx is int and -_BIG < x < _BIG)
            or (tx is float and x - x == 0.0)  # finite
        ):
            add(x)
        else:
            add(_enc(x, d, b))
    return out


def _pairs(items: Any, n: int, d: int, b: _Budget) -> list[list[Any]]:
    """Encode the ``n`` key-value pairs of an iterable."""
    b.take(2 * n)
    return [[_enc(k, d, b), _enc(x, d, b)] for k, x in islice(items, n)]


def _int(v: int) -> Any:
    return v if -_BIG < v < _BIG else {"$i": hex(v)}


def _float(v: float) -> Any:
    if math.isfinite(v):
        return v
    return {"$f": "nan" if v != v else ("inf" if v > 0 else "-inf")}


def _od_items(v: Any) -> Iterator[tuple[Any, Any]]:
    """An OrderedDict's pairs in its own order (``move_to_end`` changes only that order),
    lazily, so that the budget is taken before anything is read.

    Walking that order hashes every key, so it is walked only when every key's hash is C code;
    otherwise (a key of the sample's own ``str`` subclass, say) the pairs come in the order of
    the underlying dict, which differs only after ``move_to_end``.
    """
    pairs = list(dict.items(v))
    if all(_safe_hash(k, 0) for k, _ in pairs):
        by_id = {id(k): x for k, x in pairs}
        ordered = [(k, by_id.get(id(k), _MISSING)) for k in _OD_ITER(v)]
        if len(ordered) == len(pairs) and all(x is not _MISSING for _, x in ordered):
            pairs = ordered  # else not the same key objects: keep the dict's order, not guess
    yield from pairs


def _safe_hash(k: Any, depth: int) -> bool:
    t = type(k)
    if _one_of(t, _SAFE_HASH):
        return True
    if (t is tuple or t is frozenset) and depth < MAX_DEPTH:
        return all(_safe_hash(x, depth + 1) for x in k)
    return False


def _one_of(t: type, types: tuple[type, ...]) -> bool:
    return any(t is x for x in types)


def _enc_subclass(v: Any, t: type, d: int, b: _Budget) -> Any:
    """Subclasses of data types (an ``int`` with its own ``__eq__``, a ``Counter`` subclass,
    a namedtuple...) are encoded as their base type's *contents*, read through the base type's
    C-level methods, so no method the sample defined or patched ever runs. ``issubclass`` on
    ``type(v)`` follows the real MRO; ``isinstance`` would consult a forgeable ``__class__``."""
    if issubclass(t, int):
        return _int(int.__index__(v))
    if issubclass(t, str):
        return str.__str__(v)
    if issubclass(t, float):
        return _float(float.__float__(v))
    if issubclass(t, dict):
        return {"$d": _pairs(dict.items(v), dict.__len__(v), d, b)}
    if issubclass(t, list):
        return _seq(list.__iter__(v), list.__len__(v), d, b)
    if issubclass(t, tuple):
        items = _seq(tuple.__iter__(v), tuple.__len__(v), d, b)
        named = _namedtuple_of(t, b)
        if named is not None and len(named[1]) == len(items) and b.admit(named):
            return {"$nt": [named[0], list(named[1]), items]}
        return {"$t": items}
    if issubclass(t, frozenset):
        return {"$fs": _seq(frozenset.__iter__(v), frozenset.__len__(v), d, b)}
    if issubclass(t, set):
        return {"$s": _seq(set.__iter__(v), set.__len__(v), d, b)}
    if issubclass(t, _DEQUE):
        return {"$dq": _seq(_DEQUE.__iter__(v), _DEQUE.__len__(v), d, b)}
    if issubclass(t, bytes):
        return {"$b": bytes.__bytes__(v).decode("latin-1")}
    if issubclass(t, complex):
        c = complex.__complex__(v)
        return {"$c": [_float(c.real), _float(c.imag)]}
    raise NonData(_type_name(t))


def _type_name(t: type) -> str:
    name = _CLASS_NAME.__get__(t)
    return name if type(name) is str else "?"


def _namedtuple_of(t: type, b: _Budget) -> tuple[str, tuple[str, ...]] | None:
    """``(typename, fields)`` when the tuple subclass ``t`` is a namedtuple, else None.

    ``_fields`` is looked up as a class attribute along the real MRO, in each class's own
    ``__dict__``, by comparing keys as exact strings, so no descriptor, property, metaclass
    or hash the sample defined runs; a property named ``_fields`` is not a tuple, so such a
    class travels as a plain tuple.
    """
    key = id(t)
    if key in b.fields:
        return b.fields[key]
    found: tuple[str, tuple[str, ...]] | None = None
    for cls in _MRO.__get__(t):
        attr = _class_attr(cls, "_fields")
        if attr is _MISSING:
            continue
        name = _CLASS_NAME.__get__(t)
        if type(attr) is tuple and type(name) is str and _nt_names_ok(name, attr):
            found = (name, attr)
        break
    b.fields[key] = found
    return found


def _class_attr(cls: type, name: str) -> Any:
    for k, x in _PROXY_ITEMS(_CLASS_DICT.__get__(cls)):
        if type(k) is str and k == name:
            return x
    return _MISSING


def _nt_names_ok(typename: Any, fields: Any) -> bool:
    """Whether ``collections.namedtuple(typename, fields)`` accepts these names."""
    if type(fields) is not tuple or len(fields) > MAX_NT_FIELDS or not _ident(typename):
        return False
    if not all(_ident(f) and not f.startswith("_") for f in fields):
        return False
    return len(set(fields)) == len(fields)


def _ident(name: Any) -> bool:
    return (
        type(name) is str
        and name.isidentifier()
        and not _ISKEYWORD(name)
        and _is_normalized("NFKC", name)  # the names go through compile(), which normalizes
    )


# --------------------------------------------------------------------------- decoding

_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_HEX = frozenset("0123456789abcdef")
_BARE = (type(None), bool, int, str, float)
#: namedtuple classes made for decoded values, by (typename, fields)
_NT_CLASSES: dict[tuple[str, tuple[str, ...]], type] = {}
_NT_CLASSES_MAX = 512


def from_wire(w: Any, depth: int = 0) -> Any:
    """Decode a wire value into Python data; raise :class:`WireError` if malformed."""
    try:
        return _dec(w, depth, _Budget(WireError))
    except RecursionError as exc:  # only if the caller's own stack is nearly exhausted
        raise WireError("value nests too deeply") from exc


def _dec(w: Any, depth: int, budget: _Budget) -> Any:
    t = type(w)
    if w is None or t is bool or t is int or t is str or t is float:
        return w
    if depth > MAX_DEPTH + 2:
        raise WireError("value nests too deeply")
    d = depth + 1
    if t is list:
        return _dec_seq(w, d, budget)
    if t is not dict or len(w) != 1:
        raise WireError(f"unexpected wire value of type {t.__name__}")
    ((tag, body),) = w.items()
    if type(tag) is not str:
        raise WireError("wire tag is not a string")
    try:
        return _dec_tagged(tag, body, d, budget)
    except WireError:
        raise
    except UnicodeEncodeError as exc:
        raise WireError("malformed bytes value") from exc
    except (TypeError, ValueError, OverflowError) as exc:  # an unhashable key, a bad range...
        raise WireError(f"malformed {tag} value: {exc}") from exc


def _dec_tagged(tag: str, body: Any, d: int, budget: _Budget) -> Any:
    if tag == "$t":
        return tuple(_dec_seq(_list(body), d, budget))
    if tag == "$d":
        return dict(_dec_pairs(body, d, budget))
    if tag == "$i":
        return _dec_int(body)
    if tag == "$f" and type(body) is str and body in _FLOATS:
        return _FLOATS[body]
    if tag == "$s":
        return set(_dec_seq(_list(body), d, budget))
    if tag == "$fs":
        return frozenset(_dec_seq(_list(body), d, budget))
    if tag == "$b" and type(body) is str:
        return body.encode("latin-1")
    if tag == "$c":
        re_, im = (_dec(x, d, budget) for x in _pair(body))
        if type(re_) is not float or type(im) is not float:
            raise WireError("complex parts must be floats")
        return complex(re_, im)
    if tag == "$nt":
        return _dec_namedtuple(body, d, budget)
    if tag == "$dq":
        return _DEQUE(_dec_seq(_list(body), d, budget))
    if tag == "$ctr":
        counter: Counter[Any] = _COUNTER()
        dict.update(counter, _dec_pairs(body, d, budget))
        return counter
    if tag == "$od":
        return _ODICT(_dec_pairs(body, d, budget))
    if tag == "$dd":
        return _DDICT(None, _dec_pairs(body, d, budget))
    if tag == "$rg":
        start, stop, step = _triple(body)
        ints = [_dec(x, d, budget) for x in (start, stop, step)]
        if not all(type(i) is int for i in ints):
            raise WireError("range bounds must be ints")
        return range(*ints)
    if tag == "$dk":
        return dict.fromkeys(_dec_seq(_list(body), d, budget)).keys()
    if tag == "$dv":
        values = _dec_seq(_list(body), d, budget)
        return dict(zip(range(len(values)), values, strict=True)).values()
    if tag == "$di":
        return dict(_dec_pairs(body, d, budget)).items()
    raise WireError(f"unknown wire tag {tag!r}")


def _dec_seq(items: list[Any], d: int, budget: _Budget) -> list[Any]:
    budget.take(len(items))
    if items and d > MAX_DEPTH + 2:
        raise WireError("value nests too deeply")
    bare = _BARE
    return [x if type(x) in bare else _dec(x, d, budget) for x in items]


def _dec_pairs(body: Any, d: int, budget: _Budget) -> list[tuple[Any, Any]]:
    pairs = _list(body)
    budget.take(2 * len(pairs))
    if pairs and d > MAX_DEPTH + 2:
        raise WireError("value nests too deeply")
    out = []
    for p in pairs:
        k, x = _pair(p)
        out.append((_dec(k, d, budget), _dec(x, d, budget)))
    return out


def _dec_int(body: Any) -> int:
    if type(body) is not str:
        raise WireError("malformed $i value")
    digits = body[1:] if body.startswith("-") else body
    if not digits.startswith("0x") or len(digits) < 3 or not _HEX.issuperset(digits[2:]):
        raise WireError("malformed $i value")
    value = int(digits[2:], 16)
    return -value if body.startswith("-") else value


def _dec_namedtuple(body: Any, d: int, budget: _Budget) -> Any:
    typename, fields, values = _triple(body)
    fields = tuple(_list(fields))
    if not _nt_names_ok(typename, fields):
        raise WireError("malformed $nt value: invalid names")
    items = _dec_seq(_list(values), d, budget)
    if len(items) != len(fields):
        raise WireError("malformed $nt value: fields and values differ in number")
    key = (typename, fields)
    if not budget.admit(key):
        raise WireError(f"malformed $nt value: more than {MAX_NT_CLASSES} namedtuple classes")
    cls = _NT_CLASSES.get(key)
    if cls is None:
        try:
            cls = _NAMEDTUPLE(typename, fields)
        except Exception as exc:  # what namedtuple refuses that _nt_names_ok let through
            raise WireError(f"malformed $nt value: {exc}") from exc
        if len(_NT_CLASSES) >= _NT_CLASSES_MAX:
            _NT_CLASSES.clear()
        _NT_CLASSES[key] = cls
    return tuple.__new__(cls, items)


def _list(body: Any) -> list[Any]:
    if type(body) is not list:
        raise WireError("tagged value is not a list")
    return body


def _pair(body: Any) -> tuple[Any, Any]:
    if type(body) is not list or len(body) != 2:
        raise WireError("expected a [key, value] pair")
    return body[0], body[1]


def _triple(body: Any) -> tuple[Any, Any, Any]:
    if type(body) is not list or len(body) != 3:
        raise WireError("expected a list of three")
    return body[0], body[1], body[2]


def from_json(value: Any) -> Any:
    """Plain JSON (as a user writes it in a spec) -> wire form: objects become tagged dicts."""
    if type(value) is dict:
        return {"$d": [[k, from_json(v)] for k, v in value.items()]}
    if type(value) is list:
        return [from_json(v) for v in value]
    if type(value) is float and not math.isfinite(value):
        return {"$f": "nan" if value != value else ("inf" if value > 0 else "-inf")}
    return value
