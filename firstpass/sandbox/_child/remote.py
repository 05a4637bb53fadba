"""Stand-ins in the judge for the sample's objects: every operation is a round trip to W.

A name the sample defines reaches the judge as plain data or as a :class:`Remote`, a stub whose
calls, attribute reads and iteration are requests over the :class:`~.link.Link`, each answered
with plain data (which may hold references) or another reference. A sample's object is never
compared with the test's data, hashed or truth-tested with its own methods here: that is
refused with an ``unsupported`` failure that says so (compare its attributes instead). Two of
the sample's objects compare as the sample says, asked of W: plain Python trusts their
``__eq__`` as much. Stdlib only.
"""

from __future__ import annotations

import reprlib
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar, cast

from . import codec
from .codec import Wire
from .failures import Unsupported, Violation
from .verdicts import short

if TYPE_CHECKING:
    from .frames import Ask

_T = TypeVar("_T")


class Channel(Protocol):
    """What a stand-in asks of the judge's end of the channel (:class:`.link.Link`): an
    interface, so that this module does not import the one that builds its stand-ins."""

    def request(self, req: Ask) -> object: ...

    def ask(self, req: Ask) -> dict[str, Wire]: ...

    def value(self, ans: dict[str, Wire]) -> object: ...

    def budget(self) -> float: ...

    def call(
        self, target: Remote, args: tuple[object, ...], kwargs: dict[str, object]
    ) -> object: ...

    def iterate(self, target: Remote) -> Iterator[object]: ...


def _remote_ref(value: object) -> int | None:
    return value._fp_ref if isinstance(value, Remote) else None


def encode_arg(value: object) -> Wire:
    if isinstance(value, Remote):
        return {"$r": value._fp_ref}
    if value is JudgeType:  # the judge's stand-in is the builtin `type` to the sample
        return {"$bt": "type"}
    try:
        return codec.to_wire(value, ref=_remote_ref)  # the sample's objects inside: by ref
    except codec.NonData:
        raise Unsupported(
            f"the test passes a {type(value).__name__} to the sample; only plain data (and "
            "the sample's own objects) can cross the sandbox boundary"
        ) from None


def brief_repr(value: object) -> str:
    if isinstance(value, Remote):  # never a round trip (or the sample's words) in a message
        return f"<{value._fp_ty} object of the sample>"
    try:
        if _holds_remote(value, 0):
            return short(_OwnRepr().repr(value), 120)
        return short(repr(value), 120)
    except Exception:  # a repr of plain data cannot fail, but a message must never crash
        return "<unprintable>"


def _holds_remote(value: object, depth: int) -> bool:
    """Whether a value the judge holds has a sample's object inside (its repr would ask)."""
    if isinstance(value, Remote):
        return True
    t = type(value)
    if depth > codec.MAX_DEPTH + 2 or t not in (list, tuple, dict, deque, defaultdict,
                                                  OrderedDict):  # fmt: skip
        return False
    items = value.values() if isinstance(value, dict) else cast("Iterable[object]", value)  # t
    return any(_holds_remote(x, depth + 1) for x in items)


class _OwnRepr(reprlib.Repr):
    """repr for data holding the sample's objects: those are named, never asked."""

    def repr1(self, x: object, level: int) -> str:
        if isinstance(x, Remote):
            return f"<{x._fp_ty} object of the sample>"
        return super().repr1(x, level)


def _refuse(what: str) -> Callable[..., NoReturn]:
    def method(self: Remote, *args: object) -> NoReturn:
        raise Unsupported(
            f"the test {what} an object of the sample's type {self._fp_ty}; the judge does not "
            "run a sample's own methods for that (compare its attributes or convert it to data)"
        )

    return method


# returns what the sample's comparison gave (data, as in plain Python): typeshed's is bool
def _compare_op(op: str, what: str) -> Callable[[Remote, object], Any]:
    """A comparison of two of the sample's objects is the sample's own, as in plain Python
    (its ``__eq__`` decides either way): asked of the worker. Against anything else — the
    test's data, an expected value — it is refused: the sample could forge the answer."""
    refuse = _refuse(what)

    def method(self: Remote, other: object) -> object:
        if not isinstance(other, Remote):
            return refuse(self, other)
        return self._fp_ask("binop", o=op, a={"$r": other._fp_ref}, rev=False)

    return method


#: dunder attributes of a sample's object the judge reads from the worker (``f.__name__``,
#: ``C.__mro__``; ``__bases__`` also lets ``issubclass(C, ValueError)`` walk the classes)
_READABLE_DUNDERS = frozenset(
    {"__name__", "__qualname__", "__annotations__", "__wrapped__", "__bases__", "__mro__",
     "__dict__", "__members__"}
)  # fmt: skip


class Remote:
    """A value that lives in the worker: a function, class, or an object that is not data.

    What Python asks of a type itself (``callable``, ``iter``, ``next``, ``len``,
    ``collections.abc`` checks) follows the worker's object: each reference arrives with
    flags saying which of those its type has, and gets a class of exactly those methods
    (:func:`remote_class`). Names, docstrings, ``repr``, ``str``, ``format``, arithmetic,
    reading and setting attributes, ``issubclass`` and the judge's ``type()`` are round trips.
    One object of the worker has one stand-in (``x is x``). Comparing two of the sample's
    objects is the sample's own comparison, asked of the worker (plain Python would trust
    their ``__eq__`` too); comparing one with anything else, hashing and truth-testing are
    refused.
    """

    __slots__ = ("_fp_link", "_fp_name", "_fp_ref", "_fp_ty")

    def __init__(self, link: Channel, ref: int, ty: str, name: str | None = None) -> None:
        object.__setattr__(self, "_fp_link", link)
        object.__setattr__(self, "_fp_ref", ref)
        object.__setattr__(self, "_fp_ty", ty)
        object.__setattr__(self, "_fp_name", name or f"<{ty}>")
        if TYPE_CHECKING:  # the slots' types, for mypy only: an annotation in the class body
            # would give it an ``__annotations__``, which must be the worker's object's
            self._fp_link, self._fp_ref, self._fp_ty, self._fp_name = link, ref, ty, ty

    def _fp_ask(self, op: str, **extra: Wire) -> object:
        # extra: the op's own keys (see frames.Ask)
        return self._fp_link.request(cast("Ask", {"op": op, "r": self._fp_ref, **extra}))

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__") and name not in _READABLE_DUNDERS:
            raise AttributeError(name)
        value = self._fp_ask("attr", n=name)
        if isinstance(value, Remote):
            object.__setattr__(value, "_fp_name", f"{self._fp_name}.{name}")
        return value

    def __setattr__(self, name: str, value: object) -> None:  # `root.left = Node(2)` in setup
        self._fp_ask("setattr", n=name, a=encode_arg(value))

    def __delattr__(self, name: str) -> None:
        self._fp_ask("delattr", n=name)

    def __instancecheck__(self, obj: object) -> bool:
        return self._fp_ask("inst", a=encode_arg(obj)) is True

    def __subclasscheck__(self, cls: object) -> bool:
        return self._fp_ask("subc", a=encode_arg(cls)) is True

    def __str__(self) -> str:
        got = self._fp_ask("str")
        return got if type(got) is str else ""

    def __repr__(self) -> str:
        got = self._fp_ask("repr")
        return got if type(got) is str else ""

    def __format__(self, spec: str) -> str:
        got = self._fp_ask("format", a=spec)
        return got if type(got) is str else ""

    def __int__(self) -> int:
        return int(_exact(self._fp_ask("unop", o="int"), int, "int()"))

    def __float__(self) -> float:
        return float(_exact(self._fp_ask("unop", o="float"), float, "float()"))

    def __index__(self) -> int:
        return int(_exact(self._fp_ask("unop", o="index"), int, "an index"))

    __doc__ = property(lambda self: self._fp_ask("attr", n="__doc__"))
    __module__ = property(lambda self: self._fp_ask("attr", n="__module__"))
    __eq__ = _compare_op("eq", "compares (==)")
    __ne__ = _compare_op("ne", "compares (!=)")
    __lt__ = _compare_op("lt", "orders (<)")
    __le__ = _compare_op("le", "orders (<=)")
    __gt__ = _compare_op("gt", "orders (>)")
    __ge__ = _compare_op("ge", "orders (>=)")
    __hash__ = _refuse("hashes")
    __bool__ = _refuse("takes the truth value of")


def _exact(value: object, t: type[_T], what: str) -> _T:
    if type(value) is not t:
        raise Unsupported(f"the sample's object did not give an exact {t.__name__} for {what}")
    return value


def _binop(name: str, reflected: bool) -> Callable[[Remote, object], object]:
    def method(self: Remote, other: object) -> object:
        return self._fp_ask("binop", o=name, a=encode_arg(other), rev=reflected)

    return method


def _unop(name: str) -> Callable[[Remote], object]:
    def method(self: Remote) -> object:
        return self._fp_ask("unop", o=name)

    return method


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
            "xor", "lshift", "rshift"):  # fmt: skip
    setattr(Remote, f"__{_op}__", _binop(_op, False))
    setattr(Remote, f"__r{_op}__", _binop(_op, True))
for _op in ("neg", "pos", "abs", "invert"):
    setattr(Remote, f"__{_op}__", _unop(_op))


def _r_call(self: Remote, *args: object, **kwargs: object) -> object:
    return self._fp_link.call(self, args, kwargs)


def _r_iter(self: Remote) -> Iterator[object]:
    return self._fp_link.iterate(self)


def _r_next(self: Remote) -> object:
    ans = self._fp_link.ask({"op": "next", "r": self._fp_ref, "m": 1, "b": self._fp_link.budget()})
    items = ans.get("items")
    if type(items) is not list or type(ans.get("end")) is not bool:
        self._fp_link.value(ans)  # a failure record: raises
        raise Violation("malformed iteration record")
    if not items:
        raise StopIteration
    if type(items[0]) is not dict:
        raise Violation("malformed iteration record")
    return self._fp_link.value(items[0])


def _r_len(self: Remote) -> int:
    n = self._fp_ask("len")
    if type(n) is not int or n < 0:
        raise Unsupported("len() of the sample's object is not a non-negative int")
    return n


def _r_contains(self: Remote, item: object) -> bool:
    return self._fp_ask("contains", a=encode_arg(item)) is True


def _r_getitem(self: Remote, key: object) -> object:
    return self._fp_ask("getitem", a=encode_arg(key))


#: the worker's flag for each protocol method, and the method it gives a Remote's class
_PROTOCOL = {
    "c": ("__call__", _r_call),
    "i": ("__iter__", _r_iter),
    "n": ("__next__", _r_next),
    "l": ("__len__", _r_len),
    "k": ("__contains__", _r_contains),
    "g": ("__getitem__", _r_getitem),
}
_REMOTE_CLASSES: dict[str, type[Remote]] = {}


def remote_class(flags: str) -> type[Remote]:
    """The Remote class with exactly the protocol methods ``flags`` names (cached)."""
    key = "".join(sorted(set(flags) & set(_PROTOCOL)))
    cls = _REMOTE_CLASSES.get(key)
    if cls is None:
        methods = dict(_PROTOCOL[f] for f in key)
        # type() would put __doc__ and __module__ in the new class: keep the round trips
        inherited = {k: Remote.__dict__[k] for k in ("__doc__", "__module__")}
        cls = type("Remote", (Remote,), {"__slots__": (), **inherited, **methods})
        _REMOTE_CLASSES[key] = cls
    return cls


class _TypeCheck(type):
    """``isinstance(x, type)`` and ``issubclass(C, type)`` mean with the judge's ``type`` what
    they mean with the real one."""

    def __instancecheck__(cls, obj: object) -> bool:
        if isinstance(obj, Remote):  # `isinstance(Point, type)`: is the sample's object a class
            return obj._fp_ask("isa", a={"$bt": "type"}) is True
        return isinstance(obj, type)

    def __subclasscheck__(cls, sub: type) -> bool:
        return issubclass(sub, type)


class JudgeType(type, metaclass=_TypeCheck):
    """The judge's ``type``: of a sample's object, its class in the worker — the same stand-in
    the name ``Point`` is, so ``type(p) is Point`` and ``type(p).__name__`` work; of anything
    else, the real ``type`` (``type(name, bases, ns)`` makes a class, and a setup's
    ``class Meta(type)`` is a metaclass as usual)."""

    # unchecked: the arguments go straight to type() (whose overloads they meet at run time),
    # and what comes back is a class: the sample's stand-in (a Remote), or type()'s own
    def __new__(mcs, *args: Any, **kwargs: Any) -> Any:
        if mcs is not JudgeType:  # a subclass: a metaclass making its class
            return super().__new__(mcs, *args, **kwargs)
        if len(args) == 1 and not kwargs and isinstance(args[0], Remote):
            cls = args[0]._fp_ask("type")
            if not isinstance(cls, Remote):  # an object that is not data has a class that is
                # not a data type: an answer of `int` would be the worker's word, not its type
                raise Unsupported("the sample's object gave a type that is not its class")
            return cls
        return type(*args, **kwargs)


JudgeType.__name__ = JudgeType.__qualname__ = "type"
