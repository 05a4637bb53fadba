"""The judge (J): evaluates every test itself, in a process that never runs sample code.

J is forked per sample, under its own uid, with trusted builtins and the spec's ``setup``.
Asserts are evaluated here whole — comparisons, ``set``/``sorted``/``math``, setup helpers,
comprehensions and lambdas included. A name the sample defines is looked up in the worker (W)
and arrives as plain data or as a :class:`Remote`: a stub whose calls, attribute reads and
iteration are round trips to W, each answered with plain data (which may hold references)
or another reference. A sample's object is never compared with the test's data, hashed or
truth-tested with its own methods here: that is refused with an ``unsupported`` failure that
says so (compare its attributes instead). Two of the sample's objects compare as the sample
says, asked of W: plain Python trusts their ``__eq__`` as much.

Cases are judged here too (expected values never reach W), and reference outputs collected.
Stdlib only: the zygote imports this file.
"""

from __future__ import annotations

import array
import ast
import builtins
import contextlib
import functools
import hashlib
import json
import os
import reprlib
import signal
import sys
import time
from collections import Counter, OrderedDict, defaultdict, deque
from typing import Any

try:  # imported as firstpass.sandbox._judge by the proxy, as a top-level module by the zygote
    from . import _codec, _compare
    from . import _harness as H
except ImportError:  # pragma: no cover - the zygote's import path
    import _codec  # type: ignore[no-redef]
    import _compare  # type: ignore[no-redef]
    import _harness as H  # type: ignore[no-redef]

BUILTIN_NAMES = frozenset(dir(builtins))
STDLIB = frozenset(getattr(sys, "stdlib_module_names", ()))
#: items fetched per round trip when the judge iterates a sample's iterator
ITER_BATCH = 4096
#: the most items the judge takes from one sample iterator (beyond: unsupported)
ITER_MAX = 20_000_000
#: cases sent to the worker in one round trip (each still under its own time budget)
CASE_BATCH = 64
#: extra time the judge allows itself per test for its own evaluation
JUDGE_SLACK_S = 1.0
#: the worker's codec work on a round trip (decoding the request, encoding its answer) is not
#: the test's: it is allowed this many times the judge's own CPU time to encode that request
#: and decode that answer (the same values the other way round, measured: it follows the
#: machine's speed and the values' shape), plus ROUND_TRIP_S for the harness around a call
CODEC_FACTOR = 4.0
ROUND_TRIP_S = 0.0002
#: how far past its budget a test's sample CPU time may go, the worker having answered, before
#: the judge calls it a timeout all the same (the worker's own timer overshoots a little)
CPU_SLACK_S = 0.1
#: the judge's own timer gets this many times its CPU time reading an answer on top: it then
#: decodes the value (from_wire) and compares it, at about that cost again per node each
DECODE_FACTOR = 4.0
#: without a CPU controller a test's time is wall clock, less the judge's own CPU time and the
#: codec allowance, divided by this: lenient, but a neighbour's load can still steal it there
WALL_CLOCK_FACTOR = 2.0
#: [the judge is inside an exchange with the worker, its own timer fired meanwhile]
_IO = [False, False]


class Gone(BaseException):
    """The worker's channel ended (it exited or was killed): the rest is for the zygote to say."""


class Violation(BaseException):
    """The worker sent something that is not an answer to the judge's request."""


class SampleFailure(BaseException):
    """Sample code failed in a way plain Python would not let a test catch (timeout, memory)."""

    def __init__(self, cat: str, msg: str, cpu: bool = False) -> None:
        self.cat, self.msg, self.cpu = cat, msg, cpu
        super().__init__(msg)


class SampleError(Exception):
    """Sample code raised: catchable by a setup helper, as it would be in plain Python."""

    def __init__(self, cat: str, msg: str) -> None:
        self.cat, self.msg = cat, msg
        super().__init__(msg)


class Unsupported(Exception):
    """The test needs something that cannot cross the sandbox boundary."""


class _JudgeTimeout(BaseException):
    pass


def _on_alarm(signum: int, frame: Any) -> None:
    if _IO[0]:  # mid-exchange: raising now would leave a frame half sent or half read
        _IO[1] = True
        return
    signal.setitimer(signal.ITIMER_PROF, 0)
    raise _JudgeTimeout()


class Link:
    """The judge's end of the channel to W: one request, one answer, validated.

    Each request carries an id that its answer must echo: an answer to a request the judge
    gave up on is skipped, any other id is a violation, so a test is never judged on another
    test's answer. The judge's own timer never interrupts an exchange (it takes effect once
    the answer is read whole), so the channel stays in step.

    A test's time (``budget``) is the CPU time the sample's processes used together since the
    test began, from the slot's cpu cgroup (``cpu_usage``: its usage file and unit), less an
    allowance for the worker's codec work (see ``CODEC_FACTOR``): another sample's load can
    neither stretch nor shorten it. Without a CPU controller it is wall clock (see
    ``WALL_CLOCK_FACTOR``). The worker times each call itself; the judge checks every answer
    against the budget as well, since a sample can stop its own timer.
    """

    def __init__(self, fd: int, per_test_s: float, cpu_usage: Any = None) -> None:
        self.fd = fd
        self.per_test_s = per_test_s
        self.t0: float | None = None  # the clock when the test began; None between tests
        self.allow = 0.0  # the test's codec allowance so far
        self.seq = 0  # the last request's id
        self.abandoned: set[int] = set()  # requests whose answers never came (skipped if so)
        self._usage: tuple[int, str] | None = None
        self._last = 0.0
        if type(cpu_usage) is list and len(cpu_usage) == 2:
            with contextlib.suppress(OSError, ValueError, TypeError):
                fd_usage = os.open(str(cpu_usage[0]), os.O_RDONLY | os.O_CLOEXEC)
                self._usage = (fd_usage, str(cpu_usage[1]))
                if self._read_usage() is None:
                    self.close()
        self.calls: list[str] = []  # "f(1) -> 10", for the failure message
        self.dead = False  # W hit its CPU limit: nothing more can run there
        self.round_trips = 0
        #: name -> the worker's answer, sent with its load record (used once, then asked)
        self.prefetched: dict[str, Any] = {}
        #: reference number -> its one stand-in (the worker numbers each object once)
        self.remotes: dict[int, Remote] = {}
        self.mut: Any = None  # the last answer's changed arguments

    def close(self) -> None:
        if self._usage is not None:
            with contextlib.suppress(OSError):
                os.close(self._usage[0])
            self._usage = None

    def _read_usage(self) -> float | None:
        assert self._usage is not None
        fd, unit = self._usage
        try:
            raw = os.pread(fd, 4096, 0)
            if unit == "ns":
                return int(raw) / 1e9
            for line in raw.splitlines():
                key, _, value = line.partition(b" ")
                if key == b"usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            pass
        return None

    def clock(self) -> float:
        """The sample's time so far: its processes' CPU seconds (or, without a CPU
        controller, wall clock less the judge's own CPU time, slowed down)."""
        if self._usage is not None:
            now = self._read_usage()
            if now is not None:
                self._last = now
            return self._last
        return (time.monotonic() - time.thread_time()) / WALL_CLOCK_FACTOR

    def start_test(self) -> None:
        self.t0 = self.clock()
        self.allow = 0.0
        self.calls = []

    def end_test(self) -> None:
        self.t0 = None

    def used(self) -> float:
        """The sample's time in the current test, less its codec allowance."""
        return 0.0 if self.t0 is None else self.clock() - self.t0 - self.allow

    def budget(self) -> float:
        left = self.per_test_s - self.used()
        if left <= 0:
            raise SampleFailure("timeout", "test exceeded its time budget")
        return left

    def check(self) -> None:
        """After an answer: the sample's time in this test may not exceed its budget, whatever
        the worker's own timer said (the sample can stop that one)."""
        if self.t0 is not None and self.used() > self.per_test_s + CPU_SLACK_S:
            raise SampleFailure("timeout", "test exceeded its time budget")

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.dead:
            raise SampleFailure("timeout", "the sample's CPU limit was reached", cpu=True)
        self.round_trips += 1
        self.seq += 1
        rid = req["id"] = self.seq
        asked = False
        spent = 0.0  # the judge's CPU time encoding the request and decoding the answer
        _IO[0] = True
        try:
            start = time.thread_time()
            data = H.encode_frame(req)
            spent = time.thread_time() - start
            try:
                H.write_all(self.fd, data)
                asked = True
            except OSError:
                # the worker is gone; what it wrote before going is still in the channel, and
                # must be judged the same whichever side won the race (a forged record is a
                # violation)
                pass
            while True:
                ans, took = self._answer()
                spent += took
                if not asked:
                    raise Violation("the sample wrote on the result channel without being asked")
                got = ans.get("id")
                if type(got) is int and got == rid:
                    break
                if type(got) is int and got in self.abandoned:
                    self.abandoned.discard(got)  # the late answer to a request given up on
                    continue
                raise Violation("the result channel carried an answer to no pending request")
        except BaseException:
            if asked:
                self.abandoned.add(rid)
            raise
        finally:
            _IO[0] = False
        self._settle(spent)
        return ans

    def _answer(self) -> tuple[dict[str, Any], float]:
        """One record from the worker, whole, and the judge's CPU time decoding it."""
        try:
            raw = H.read_raw_frame(self.fd, H.MAX_VALUE_FRAME)
            start = time.thread_time()
            ans = json.loads(raw)
            took = time.thread_time() - start
        except H.FrameTooLarge as exc:
            raise Violation(
                f"the sample sent a value of {exc.size} bytes (limit {H.MAX_VALUE_FRAME})"
            ) from None
        except (EOFError, OSError):
            raise Gone() from None
        except (ValueError, RecursionError):
            raise Violation("the result channel carried bytes that are not a record") from None
        if type(ans) is not dict:
            raise Violation("the result channel carried a record of the wrong shape")
        return ans, took

    def _settle(self, spent: float) -> None:
        """After an exchange: the codec allowances (the test's, and the judge's own timer's),
        a judge timeout that came during it, and the test's budget."""
        self.allow += CODEC_FACTOR * spent + ROUND_TRIP_S
        extra = DECODE_FACTOR * spent
        if _IO[1]:  # the judge's own timer ran out during the exchange
            _IO[1] = False
            if extra - spent <= 0.001:
                raise _JudgeTimeout()
            signal.setitimer(signal.ITIMER_PROF, extra - spent)  # what decoding earned it
        elif extra > 0.001:
            left = signal.getitimer(signal.ITIMER_PROF)[0]
            if left > 0:
                signal.setitimer(signal.ITIMER_PROF, left + extra)
        self.check()

    def value(self, ans: dict[str, Any]) -> Any:
        """One answer as a value for the test: data, a :class:`Remote`, or the sample's failure."""
        self.mut = ans.get("mut")  # arguments a call changed in place (see ``copy_back``)
        if "v" in ans:
            try:
                return _codec.from_wire(ans["v"], ref=self.tagged)
            except (_codec.WireError, RecursionError, MemoryError) as exc:
                raise Violation(f"malformed value: {exc}") from None
        if "r" in ans:
            ref, ty, flags = ans["r"], ans.get("ty"), ans.get("f", "")
            if type(ref) is not int or type(ty) is not str or type(flags) is not str:
                raise Violation("malformed reference")
            return self.remote(ref, ty, flags)
        cat, msg = ans.get("e"), ans.get("m")
        if cat == "nondata":
            raise Unsupported(H.short(str(msg)))
        if cat not in H.CATEGORIES or type(msg) is not str:
            raise Violation("malformed failure record")
        if ans.get("cpu"):
            self.dead = True
        if cat in ("timeout", "memory_limit"):
            raise SampleFailure(cat, H.short(msg), cpu=bool(ans.get("cpu")))
        raise sample_error(ans.get("xb") or ans.get("x"), cat, H.short(msg))

    def remote(self, ref: int, ty: str, flags: str) -> Remote:
        """The stand-in for the worker's object ``ref``: one per object, made on first sight."""
        got = self.remotes.get(ref)
        if got is None:
            got = self.remotes[ref] = remote_class(flags)(self, ref, ty[:100])
        return got

    def tagged(self, body: Any) -> Remote:
        """A reference inside a value (``{"$r": [ref, type name, flags]}``)."""
        if type(body) is not list or len(body) != 3:
            raise _codec.WireError("malformed reference")
        ref, ty, flags = body
        if type(ref) is not int or type(ty) is not str or type(flags) is not str:
            raise _codec.WireError("malformed reference")
        return self.remote(ref, ty, flags)

    def request(self, req: dict[str, Any]) -> Any:
        req["b"] = self.budget()
        return self.value(self.ask(req))

    # ---- what a Remote does

    def call(self, target: Remote, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        req = {
            "op": "call",
            "r": target._fp_ref,
            "a": [encode_arg(a) for a in args],
            "k": [[k, encode_arg(v)] for k, v in kwargs.items()],
        }
        shown = self.shown(args, kwargs)  # before the call: it may change the arguments
        self.mut = None
        try:
            out = self.request(req)
        except SampleError as exc:
            self.note(target, shown, f"raised {exc.msg}")
            raise
        finally:
            self.copy_back(args, kwargs)
        self.note(target, shown, brief_repr(out))
        return out

    def copy_back(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The call changed arguments in place (``mut`` of its answer): so do the test's own
        values, as they would have changed in plain Python."""
        mut, self.mut = self.mut, None
        if mut is None:
            return
        if type(mut) is not list:
            raise Violation("malformed record of changed arguments")
        for item in mut:
            if type(item) is not list or len(item) != 2:
                raise Violation("malformed record of changed arguments")
            key, wire = item
            if type(key) is int and 0 <= key < len(args):
                old = args[key]
            elif type(key) is str and key in kwargs:
                old = kwargs[key]
            else:
                raise Violation("malformed record of changed arguments")
            try:
                new = _codec.from_wire(wire, ref=self.tagged)
            except (_codec.WireError, RecursionError, MemoryError) as exc:
                raise Violation(f"malformed value: {exc}") from None
            _merge(old, new)

    def shown(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | None:
        """A call's arguments for the failure message (None once it has enough calls)."""
        if len(self.calls) >= 8:
            return None
        shown = [brief_repr(a) for a in args] + [f"{k}={brief_repr(v)}" for k, v in kwargs.items()]
        return ", ".join(shown)

    def note(self, target: Remote, shown: str | None, got: str) -> None:
        if shown is not None and len(self.calls) < 8:
            self.calls.append(f"{target._fp_name}({shown}) -> {got}")

    def iterate(self, target: Remote) -> Any:
        it = self.request({"op": "iter", "r": target._fp_ref})
        if not isinstance(it, Remote):  # iter() of a sample object gave data: iterate that
            yield from iter(it)
            return
        taken = 0
        while True:
            ans = self.ask({"op": "next", "r": it._fp_ref, "m": ITER_BATCH, "b": self.budget()})
            items = ans.get("items")
            if type(items) is not list or type(ans.get("end")) is not bool:
                self.value(ans)  # a failure record: raises
                raise Violation("malformed iteration record")
            for item in items:
                if type(item) is not dict:
                    raise Violation("malformed iteration record")
                yield self.value(item)
            taken += len(items)
            if ans["end"]:
                return
            if taken >= ITER_MAX:
                raise Unsupported(f"the sample's iterator gave over {ITER_MAX} items")


def _merge(old: Any, new: Any) -> Any:
    """``old`` (a test's value the sample changed in place) given ``new``'s contents in place
    where it is a mutable container of the same type, else ``new``.

    One level only: what ``old`` holds afterwards are ``new``'s (fresh) objects. Objects
    nested inside it that the test also holds elsewhere keep their old contents: the wire
    does not say whether the sample changed them in place or put new ones in their slots,
    and merging into them could make the test's other values (an expected value, say) equal
    to what the sample returned, a pass plain Python would not give (docs/sandbox.md).
    Only types and identities are looked at (a sample's object inside is never compared).
    """
    t = type(old)
    if t is not type(new) or t not in _IN_PLACE:
        return new
    if t is list or t is deque:
        old.clear()
        old.extend(new)
    elif t is tuple:  # immutable: nothing of it can change in place at this level
        return old
    elif t is set:
        old.clear()
        old.update(new)
    elif t is bytearray or t is array.array:
        old[:] = new
    else:  # dict, Counter, OrderedDict, defaultdict
        old.clear()
        if t is Counter:  # Counter.update adds counts
            dict.update(old, new)
        else:
            old.update(new)
    return old


_IN_PLACE = frozenset(
    {list, tuple, dict, set, bytearray, deque, Counter, OrderedDict, defaultdict, array.array}
)


def _remote_ref(value: Any) -> Any:
    return value._fp_ref if isinstance(value, Remote) else None


def encode_arg(value: Any) -> Any:
    if isinstance(value, Remote):
        return {"$r": value._fp_ref}
    if value is _Type:  # the judge's stand-in is the builtin `type` to the sample
        return {"$bt": "type"}
    try:
        return _codec.to_wire(value, ref=_remote_ref)  # the sample's objects inside: by ref
    except _codec.NonData:
        raise Unsupported(
            f"the test passes a {type(value).__name__} to the sample; only plain data (and "
            "the sample's own objects) can cross the sandbox boundary"
        ) from None


def brief_repr(value: Any) -> str:
    if isinstance(value, Remote):  # never a round trip (or the sample's words) in a message
        return f"<{value._fp_ty} object of the sample>"
    try:
        if _holds_remote(value, 0):
            return H.short(_OwnRepr().repr(value), 120)
        return H.short(repr(value), 120)
    except Exception:  # a repr of plain data cannot fail, but a message must never crash
        return "<unprintable>"


def _holds_remote(value: Any, depth: int) -> bool:
    """Whether a value the judge holds has a sample's object inside (its repr would ask)."""
    if isinstance(value, Remote):
        return True
    t = type(value)
    if depth > _codec.MAX_DEPTH + 2 or t not in (list, tuple, dict, deque, defaultdict,
                                                  OrderedDict):  # fmt: skip
        return False
    items = value.values() if isinstance(value, dict) else value
    return any(_holds_remote(x, depth + 1) for x in items)


class _OwnRepr(reprlib.Repr):
    """repr for data holding the sample's objects: those are named, never asked."""

    def repr1(self, x: Any, level: int) -> str:
        if isinstance(x, Remote):
            return f"<{x._fp_ty} object of the sample>"
        return super().repr1(x, level)


def _refuse(what: str) -> Any:
    def method(self: Remote, *args: Any) -> Any:
        raise Unsupported(
            f"the test {what} an object of the sample's type {self._fp_ty}; the judge does not "
            "run a sample's own methods for that (compare its attributes or convert it to data)"
        )

    return method


def _compare_op(op: str, what: str) -> Any:
    """A comparison of two of the sample's objects is the sample's own, as in plain Python
    (its ``__eq__`` decides either way): asked of the worker. Against anything else — the
    test's data, an expected value — it is refused: the sample could forge the answer."""
    refuse = _refuse(what)

    def method(self: Remote, other: Any) -> Any:
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

    def __init__(self, link: Link, ref: int, ty: str, name: str | None = None) -> None:
        object.__setattr__(self, "_fp_link", link)
        object.__setattr__(self, "_fp_ref", ref)
        object.__setattr__(self, "_fp_ty", ty)
        object.__setattr__(self, "_fp_name", name or f"<{ty}>")

    def _fp_ask(self, op: str, **extra: Any) -> Any:
        return self._fp_link.request({"op": op, "r": self._fp_ref, **extra})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__") and name not in _READABLE_DUNDERS:
            raise AttributeError(name)
        value = self._fp_ask("attr", n=name)
        if isinstance(value, Remote):
            object.__setattr__(value, "_fp_name", f"{self._fp_name}.{name}")
        return value

    def __setattr__(self, name: str, value: Any) -> None:  # `root.left = Node(2)` in setup
        self._fp_ask("setattr", n=name, a=encode_arg(value))

    def __delattr__(self, name: str) -> None:
        self._fp_ask("delattr", n=name)

    def __instancecheck__(self, obj: Any) -> bool:
        return self._fp_ask("inst", a=encode_arg(obj)) is True

    def __subclasscheck__(self, cls: Any) -> bool:
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


def _exact(value: Any, t: type, what: str) -> Any:
    if type(value) is not t:
        raise Unsupported(f"the sample's object did not give an exact {t.__name__} for {what}")
    return value


def _binop(name: str, reflected: bool) -> Any:
    def method(self: Remote, other: Any) -> Any:
        return self._fp_ask("binop", o=name, a=encode_arg(other), rev=reflected)

    return method


def _unop(name: str) -> Any:
    def method(self: Remote) -> Any:
        return self._fp_ask("unop", o=name)

    return method


for _op in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or",
            "xor", "lshift", "rshift"):  # fmt: skip
    setattr(Remote, f"__{_op}__", _binop(_op, False))
    setattr(Remote, f"__r{_op}__", _binop(_op, True))
for _op in ("neg", "pos", "abs", "invert"):
    setattr(Remote, f"__{_op}__", _unop(_op))


def _r_call(self: Remote, *args: Any, **kwargs: Any) -> Any:
    return self._fp_link.call(self, args, kwargs)


def _r_iter(self: Remote) -> Any:
    return self._fp_link.iterate(self)


def _r_next(self: Remote) -> Any:
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


def _r_contains(self: Remote, item: Any) -> bool:
    return self._fp_ask("contains", a=encode_arg(item)) is True


def _r_getitem(self: Remote, key: Any) -> Any:
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


_SAMPLE_EXCEPTIONS: dict[Any, type[SampleError]] = {}


def sample_exception(names: Any) -> type[SampleError]:
    """SampleError that is also the builtin exception the sample raised (``ValueError``...),
    so ``hasattr``, a length hint or a setup helper's ``except ValueError`` sees it as such.

    ``names`` is the exception's class name or the names of its nearest builtin ancestors
    (``class E(ValueError)``: ``["ValueError"]``), as the worker read them. A name that is not
    a builtin ``Exception`` class is ignored; a builtin whose class cannot be combined or
    built this way (``UnicodeDecodeError`` needs five arguments, ``ExceptionGroup`` has its
    own layout) gives way to its own nearest ancestor that can (``UnicodeError``,
    ``ValueError``...), and at worst to a plain SampleError: this never raises.
    """
    if type(names) is str:
        names = [names]
    if type(names) is not list or not names or not all(type(n) is str for n in names):
        return SampleError
    bases: list[type] = []
    for name in names[:4]:
        base = getattr(builtins, name, None)
        if (
            isinstance(base, type)
            and issubclass(base, Exception)
            and not issubclass(base, SampleError)
            and base not in bases
        ):
            bases.append(base)
    if not bases:
        return SampleError
    key = tuple(bases)  # builtin classes only: the cache stays small whatever the worker says
    cls = _SAMPLE_EXCEPTIONS.get(key)
    if cls is None:
        cls = _SAMPLE_EXCEPTIONS[key] = _build_sample_exception(bases)
    return cls


def _build_sample_exception(bases: list[type]) -> type[SampleError]:
    if len(bases) > 1:
        cls = _try_sample_exception(tuple(bases))
        if cls is not None:
            return cls
    for base in bases:  # each alone, then its own ancestors, nearest first
        for ancestor in base.__mro__:
            if ancestor is Exception or not issubclass(ancestor, Exception):
                break
            cls = _try_sample_exception((ancestor,))
            if cls is not None:
                return cls
    return SampleError


def _try_sample_exception(bases: tuple[type, ...]) -> type[SampleError] | None:
    """The class, if Python lets it be made and raised as the judge raises it."""
    try:
        name = "Sample" + "".join(b.__name__ for b in bases)
        cls = type(name, (SampleError, *bases), {})
        cls("runtime_error", "probe")  # a constructor that needs other arguments fails here
    except Exception:
        return None
    return cls


def sample_error(names: Any, cat: str, msg: str) -> SampleError:
    """The judge-side exception for a failure record of the sample's (never raises itself)."""
    try:
        return sample_exception(names)(cat, msg)
    except Exception:
        return SampleError(cat, msg)


# --------------------------------------------------------------------------- asserts


def assert_names(src: str) -> tuple[Any, frozenset[str]]:
    """The compiled test expression of one assert and the free names it loads."""
    code, names, _ = assert_uses(src)
    return code, names


#: the builtins a closed spec may name: each is a pure function of its arguments on data (C
#: code, or it calls only what it is given: a lambda of the same language, or a sample's
#: object, which is a round trip to W). Nothing here reaches an attribute by a name held in
#: a string (getattr, hasattr, str.format), a namespace (vars, globals), code (eval, exec,
#: compile, __import__), a file, or makes a class (type with three arguments)
CLOSED_BUILTINS = frozenset(
    """abs all any bin bool bytes callable chr complex dict divmod enumerate filter float
    format frozenset hash hex int isinstance iter len list map max min next oct ord pow range
    repr reversed round set slice sorted str sum tuple zip True False None""".split()  # noqa: SIM905
)
#: modules a closed spec may import (whole, by their own name, or names from them) and call
#: into: C functions of numbers, with no state
CLOSED_MODULES = frozenset({"math", "cmath"})
#: what a closed spec may name in each: its public functions and constants (numbers)
CLOSED_MEMBERS = {
    m: frozenset(
        n
        for n in dir(__import__(m))
        if not n.startswith("_")
        and isinstance(getattr(__import__(m), n), type(abs) | float | int)
    )
    for m in CLOSED_MODULES
}
#: the expression nodes of the closed language (plus the contexts and operators)
_CLOSED_NODES = (
    ast.Expression, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.Compare, ast.Call, ast.Constant,
    ast.Name, ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Subscript, ast.Slice, ast.IfExp,
    ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp, ast.comprehension, ast.Lambda,
    ast.arguments, ast.arg, ast.keyword, ast.Starred, ast.JoinedStr, ast.FormattedValue,
    ast.NamedExpr, ast.Attribute, ast.expr_context, ast.boolop, ast.operator, ast.unaryop,
    ast.cmpop,
)  # fmt: skip


@functools.lru_cache(maxsize=1024)
def closed_spec(asserts: tuple[str, ...], setup: str | None) -> bool:
    """True when every test of an asserts spec is written in the closed expression language,
    whose evaluation cannot change the judge process: such a spec may be judged by the shared
    judge of cases jobs (``_zygote.DATA_KEY``); any other gets a judge of its own request.

    Why it is closed, by construction rather than by a list of tricks: the setup only binds
    ``CLOSED_MODULES`` (or names from them) in the job's own namespace; a test is one
    expression of the nodes in ``_CLOSED_NODES``, and every name it uses is its own (a lambda
    argument, a comprehension target, a ``:=`` target: all in a per-test scope), the
    sample's (values from W: data decoded by the codec, or references whose every operation
    is a round trip to W), a builtin of ``CLOSED_BUILTINS``, or a closed module as the base of
    ``module.member`` and nothing else. There is no other attribute access at all, so nothing
    reaches a method of a value (``str.format`` walks attributes named in a string), a module
    other than those, or a frame; no statement runs, so nothing is assigned anywhere but the
    test's own scope. Every operation left is a pure function of its operands or a round
    trip to W. (Exceptions and ``Decimal`` signal flags are the only state such an
    evaluation leaves, and neither changes any later result.)
    """
    imported: set[str] = set()
    if setup:
        try:
            body = ast.parse(setup).body
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return False
        for stmt in body:
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    if alias.name not in CLOSED_MODULES or alias.asname not in (None, alias.name):
                        return False
                    imported.add(alias.name)
            elif isinstance(stmt, ast.ImportFrom):
                if stmt.level or stmt.module not in CLOSED_MODULES:
                    return False
                for alias in stmt.names:
                    if alias.name not in CLOSED_MEMBERS[stmt.module]:
                        return False
            else:
                return False
    for src in asserts:
        try:
            stmt = ast.parse(src).body[0]
        except (SyntaxError, ValueError, RecursionError, MemoryError, IndexError):
            return False
        if not isinstance(stmt, ast.Assert):
            return False
        bases = {
            id(n.value)
            for n in ast.walk(stmt.test)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
        }
        for node in ast.walk(stmt.test):
            if not isinstance(node, _CLOSED_NODES):
                return False
            if isinstance(node, ast.Subscript) and not isinstance(node.ctx, ast.Load):
                return False  # `for d[k] in ...`: a store into a value, not a name of its own
            if isinstance(node, ast.Attribute):
                base = node.value
                if not (
                    isinstance(base, ast.Name)
                    and base.id in imported
                    and node.attr in CLOSED_MEMBERS[base.id]
                    and isinstance(node.ctx, ast.Load)
                ):
                    return False
            elif isinstance(node, ast.Name):
                name = node.id
                if name.startswith("__"):
                    return False
                if name in CLOSED_MODULES or name in STDLIB:
                    if id(node) not in bases or name not in imported:
                        return False  # a module as a value, or one the setup did not import
                elif name in BUILTIN_NAMES and name not in CLOSED_BUILTINS:
                    return False
    return True


def assert_uses(src: str) -> tuple[Any, frozenset[str], frozenset[str]]:
    """The compiled test expression, the names it loads, and those it uses as the base of
    ``name.attribute`` somewhere (``math.isclose``: the module; ``calendar(2020)`` alone is a
    call of the sample's ``calendar``)."""
    tree = ast.parse(src)
    stmt = tree.body[0]
    assert isinstance(stmt, ast.Assert)  # parse_spec guarantees one assert statement
    loads = [
        n for n in ast.walk(stmt.test) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
    ]
    bases = {
        id(n.value)
        for n in ast.walk(stmt.test)
        if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)
    }
    names = frozenset(n.id for n in loads)
    based = frozenset(n.id for n in loads if id(n) in bases)
    code = compile(ast.Expression(body=stmt.test), "<test>", "eval", dont_inherit=True)
    return code, names, based


def prefetch_names(asserts: tuple[str, ...] | list[str], entry: str | None) -> list[str]:
    """Names the worker should report with its load record, saving the judge a round trip:
    every name the asserts load that the judge would look up in the sample (a superset:
    setup's names are left to the judge, which ignores what it does not need)."""
    out: set[str] = set()
    for src in asserts:
        _, names, bases = assert_uses(src)
        for name in names:
            if name in BUILTIN_NAMES and name != entry:
                continue
            if name in bases and name != entry and name in STDLIB:
                continue
            out.add(name)
    return sorted(out)


def setup_imports(setup: str | None) -> str | None:
    """Only the import statements of ``setup``: the sample may use them, never its helpers."""
    if not setup:
        return None
    tree = ast.parse(setup)
    imports = [s for s in tree.body if isinstance(s, ast.Import | ast.ImportFrom)]
    return "\n".join(ast.unparse(s) for s in imports) or None


class _TypeCheck(type):
    """``isinstance(x, type)`` and ``issubclass(C, type)`` mean with the judge's ``type`` what
    they mean with the real one."""

    def __instancecheck__(cls, obj: Any) -> bool:
        if isinstance(obj, Remote):  # `isinstance(Point, type)`: is the sample's object a class
            return obj._fp_ask("isa", a={"$bt": "type"}) is True
        return isinstance(obj, type)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, type)


class _Type(type, metaclass=_TypeCheck):
    """The judge's ``type``: of a sample's object, its class in the worker — the same stand-in
    the name ``Point`` is, so ``type(p) is Point`` and ``type(p).__name__`` work; of anything
    else, the real ``type`` (``type(name, bases, ns)`` makes a class, and a setup's
    ``class Meta(type)`` is a metaclass as usual)."""

    def __new__(mcs, *args: Any, **kwargs: Any) -> Any:
        if mcs is not _Type:  # a subclass: a metaclass making its class
            return super().__new__(mcs, *args, **kwargs)
        if len(args) == 1 and not kwargs and isinstance(args[0], Remote):
            cls = args[0]._fp_ask("type")
            if not isinstance(cls, Remote):  # an object that is not data has a class that is
                # not a data type: an answer of `int` would be the worker's word, not its type
                raise Unsupported("the sample's object gave a type that is not its class")
            return cls
        return type(*args, **kwargs)


_Type.__name__ = _Type.__qualname__ = "type"


def trusted_namespace(
    setup: str | None, link: Link | None = None
) -> tuple[dict[str, Any], str | None]:
    """Builtins and the spec's setup, run here (test code from the client).

    With ``link``, a name the setup uses but neither binds nor finds among the builtins
    (``root = Node(1)``, MBPP's setups build trees of the sample's class) is the sample's, as
    it would be in plain Python where the setup runs after the sample's code; a stdlib
    module used as ``module.name`` is the real module. Its calls run under the first test's
    budget.
    """
    ns: dict[str, Any] = {"__builtins__": builtins, "__name__": "__test__", "type": _Type}
    if setup:
        try:
            if link is not None:
                link.start_test()
                ns.update(_setup_sample_names(link, setup))
            exec(compile(setup, "<setup>", "exec", dont_inherit=True), ns)
        except (Gone, Violation):
            raise
        except (SampleFailure, SampleError) as exc:
            return ns, H.short(f"setup raised {type(exc).__name__}: {exc.msg}")
        except BaseException as exc:  # setup naming sample functions fails here: reported
            return ns, H.short(f"setup raised {type(exc).__name__}: {exc}")
    return ns, None


def _setup_sample_names(link: Link, setup: str) -> dict[str, Any]:
    """The sample's values (and real stdlib modules) for the setup's free names."""
    loaded, bound, bases = _names(ast.parse(setup))
    out: dict[str, Any] = {}
    free = sorted(loaded - bound - BUILTIN_NAMES)
    ask = []
    for name in free:
        module = _stdlib_module(name) if name in bases else None
        if module is not None:
            out[name] = module
        else:
            ask.append(name)
    if ask:
        for name, value in _fetch(link, ask).items():
            if not isinstance(value, _Missing):
                out[name] = value
    return out


def _top_level_defs(code: Any) -> frozenset[str]:
    """Names the sample's code defines at top level with ``def`` or ``class`` (parsed, never
    run; code that does not parse defines nothing)."""
    if type(code) is not str:
        return frozenset()
    try:
        tree = ast.parse(code)
    except Exception:  # SyntaxError, a parser's RecursionError or MemoryError
        return frozenset()
    kinds = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef
    return frozenset(n.name for n in tree.body if isinstance(n, kinds))


def infer_entry_point(asserts: tuple[str, ...], setup: str | None, code: str) -> str | None:
    """The builtin-named function an asserts spec without an entry point tests, if it tests
    one (MBPP 126 calls the sample's ``sum(a, b)``), else None. The proxy sends it as the
    request's entry point: the one name that may be the sample's although a builtin has it.

    Builtins stay the real ones (a sample's ``sorted`` never stands in for the test's) unless
    the spec names nothing of the sample's but builtins: every name its asserts use is a
    builtin, bound by the setup, or a stdlib module used as ``module.name`` (any other name
    would be the function under test, and then every builtin is the real one). The function
    under test is then one of the builtin names: the one the sample's code defines at top
    level with ``def`` or ``class`` (parsed here, never run), when it defines exactly one of
    the builtin names the asserts use and every assert calls it. Everything else in the test
    is still the judge's own: what that function returns is checked by real builtins.
    """
    called = _builtin_candidates(tuple(asserts), setup)
    if not called:
        return None
    mine = _top_level_defs(code) & called[1]
    if len(mine) != 1:
        return None
    (name,) = mine
    return name if name in called[0] else None


@functools.lru_cache(maxsize=1024)
def _builtin_candidates(
    asserts: tuple[str, ...], setup: str | None
) -> tuple[frozenset[str], frozenset[str]] | None:
    """(builtin names every assert calls, builtin names the asserts use), or None when an
    assert uses a name that is not a builtin, the setup's, or a stdlib module's base."""
    try:
        bound = _bound_names(ast.parse(setup)) if setup else frozenset()
        trees = [ast.parse(src) for src in asserts]
    except (SyntaxError, ValueError):
        return None
    used: set[str] = set()
    every: set[str] | None = None
    for src, tree in zip(asserts, trees, strict=True):
        _, names, bases = assert_uses(src)
        for name in names:
            if name in bound:
                continue
            if name in BUILTIN_NAMES:
                used.add(name)
            elif not (name in bases and name in STDLIB):
                return None  # a name of the sample's that is not a builtin: that is tested
        calls = {
            n.func.id
            for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in used
        }
        every = calls if every is None else every & calls
    if not every:
        return None
    return frozenset(every), frozenset(used)


def _bound_names(tree: Any) -> frozenset[str]:
    """Every name a piece of code binds anywhere (assigned, defined, imported, an argument)."""
    return _names(tree)[1]


def _names(tree: Any) -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """(names loaded, names bound, names used as the base of ``name.attribute``)."""
    loaded: set[str] = set()
    bound: set[str] = set()
    bases: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (loaded if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            bound.add(node.name)
        elif isinstance(node, ast.alias):
            bound.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            bound.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            bases.add(node.value.id)
    return frozenset(loaded), frozenset(bound), frozenset(bases)


def _stdlib_module(name: str) -> Any:
    if name not in STDLIB or name.startswith("_"):
        return None
    try:
        return __import__(name)
    except ImportError:
        return None


def judge_asserts(link: Link, job: dict[str, Any]) -> list[dict[str, Any] | None]:
    ns, setup_error = trusted_namespace(job.get("setup"), link)
    n = len(job["tests"])
    if setup_error:
        return [H.verdict(False, "runtime_error", setup_error)] * n
    uses = [assert_uses(src) for src in job["tests"]]
    entry = job.get("entry_point")
    if entry is not None and ns.get(entry) is _Type:  # the sample's `type` is under test
        del ns[entry]
    compiled: list[tuple[Any, frozenset[str]]] = []
    modules: list[dict[str, Any]] = []  # per test: names that are the real stdlib module there
    wanted: set[str] = set()
    for code, names, bases in uses:
        mine: dict[str, Any] = {}
        for name in names:
            if name in ns and name != "__builtins__":
                continue  # setup's names are the test's own
            if name in BUILTIN_NAMES and name != entry:
                continue  # a sample's `set` or `sorted` never stands in for the real one
            # `math.isclose` is the real math, whatever the sample bound; a name used only
            # as a value or a call (`calendar(2020)`, the entry point) is the sample's
            module = None if name == entry or name not in bases else _stdlib_module(name)
            if module is not None:
                mine[name] = module
                continue
            wanted.add(name)
        compiled.append((code, names))
        modules.append(mine)
    order = sorted(wanted)
    fetched: dict[str, Any] = {}
    out: list[dict[str, Any] | None] = []
    refetch: list[str] = []
    try:
        if order:
            fetched = _fetch(link, order)
            refetch = [k for k, v in fetched.items() if not isinstance(v, Remote | _Missing)]
    except (SampleFailure, SampleError, Unsupported) as exc:
        msg = getattr(exc, "msg", str(exc))
        return [
            H.verdict(False, "runtime_error", H.short(f"reading the sample's names: {msg}"))
        ] * n
    for i, (code, names) in enumerate(compiled):
        link.start_test()
        if i and refetch:  # a data name may have changed since: read it again
            with contextlib.suppress(SampleFailure, SampleError, Unsupported):
                fetched.update(_fetch(link, refetch))
        scope = dict(ns)
        for name in names:
            if name in fetched and not isinstance(fetched[name], _Missing):
                scope[name] = fetched[name]
        scope.update(modules[i])
        out.append(_one_assert(link, code, scope))
        if out[-1] is None:  # the worker is gone: the zygote says why
            out.extend([None] * (n - len(out)))
            break
    return out


class _Missing:
    pass


def _fetch(link: Link, names: list[str]) -> dict[str, Any]:
    pre = link.prefetched
    ask = [n for n in names if n not in pre]
    vals: Any = []
    if ask:
        vals = link.ask({"op": "get", "n": ask}).get("vals")
        if type(vals) is not list or len(vals) != len(ask):
            raise Violation("malformed name record")
    answers = dict(zip(ask, vals, strict=True))
    out: dict[str, Any] = {}
    for name in names:
        item = pre.pop(name) if name in pre else answers[name]
        if type(item) is not dict:
            raise Violation("malformed name record")
        if item.get("e") == "missing":
            out[name] = _Missing()
            continue
        value = link.value(item)
        if isinstance(value, Remote):
            object.__setattr__(value, "_fp_name", name)
        out[name] = value
    return out


def _one_assert(link: Link, code: Any, scope: dict[str, Any]) -> dict[str, Any] | None:
    # the judge's own CPU time (waiting for the worker is not: that is the sample's budget)
    signal.signal(signal.SIGPROF, _on_alarm)
    signal.setitimer(signal.ITIMER_PROF, link.per_test_s + JUDGE_SLACK_S)
    try:
        value = eval(code, scope)
        ok = bool(value)
    except Gone:
        return None
    except (SampleFailure, SampleError) as exc:
        return H.verdict(False, exc.cat, exc.msg)
    except Unsupported as exc:
        return H.verdict(False, "unsupported", H.short(str(exc)))
    except _JudgeTimeout:
        return H.verdict(False, "timeout", "evaluating the test expression timed out")
    except MemoryError:
        return H.verdict(False, "memory_limit", "MemoryError in the test expression")
    except Exception as exc:
        return H.verdict(False, "runtime_error", H.short(f"{type(exc).__name__}: {exc}"))
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, signal.SIG_IGN)  # one that fired just now is dropped
        _IO[1] = False
    if ok:
        return H.verdict(True)
    got = "; ".join(link.calls)
    return H.verdict(
        False, "assertion_failed", H.short("assertion failed" + (f": {got}" if got else ""))
    )


# --------------------------------------------------------------------------- cases and outputs


def _entry(link: Link, job: dict[str, Any]) -> Remote | str:
    name = str(job.get("entry_point"))
    try:
        got = _fetch(link, [name])[name]
    except (SampleFailure, SampleError, Unsupported) as exc:
        return getattr(exc, "msg", str(exc))
    if not isinstance(got, Remote):
        return (
            f"entry point {name!r} is not defined"
            if isinstance(got, _Missing)
            else (f"entry point {name!r} is not callable")
        )
    return got


def call_cases(link: Link, job: dict[str, Any]) -> list[dict[str, Any]]:
    """Call the entry point on each case; each answer is the raw record (data or failure)."""
    fn = _entry(link, job)
    n = len(job["tests"])
    if isinstance(fn, str):
        return [{"e": "runtime_error", "m": H.short(fn)}] * n
    out: list[dict[str, Any]] = []
    tests = job["tests"]
    while len(out) < n:
        if link.dead:
            out.append({"e": "timeout", "m": "the sample's CPU limit was reached"})
            continue
        batch = tests[len(out) : len(out) + CASE_BATCH]
        try:
            ans = link.ask({"op": "batch", "r": fn._fp_ref, "a": batch, "b": link.per_test_s})
        except Gone:
            out.extend([{"gone": True}] * (n - len(out)))
            break
        outs = ans.get("outs")
        if type(outs) is not list or not 0 < len(outs) <= len(batch):
            raise Violation("malformed batch record")
        for item in outs:
            if type(item) is not dict:
                raise Violation("malformed batch record")
            out.append(item)
            if item.get("cpu"):
                link.dead = True
    return out


def judge_cases(link: Link, job: dict[str, Any]) -> list[dict[str, Any] | None]:
    expected, atol = job["expected"], float(job.get("atol") or 0)
    out: list[dict[str, Any] | None] = []
    for exp_wire, ans in zip(expected, call_cases(link, job), strict=False):
        if "gone" in ans:
            out.append(None)
        elif "v" in ans:
            try:
                got = _codec.from_wire(ans["v"])
            except (_codec.WireError, RecursionError) as exc:
                raise Violation(f"malformed value: {exc}") from None
            exp = _codec.from_wire(exp_wire)
            try:
                same = _compare.values_equal(got, exp, atol)
            except (OverflowError, ValueError, RecursionError):
                same = False
            out.append(
                H.verdict(True)
                if same
                else H.verdict(
                    False, "wrong_output", f"expected {brief_repr(exp)}, got {brief_repr(got)}"
                )
            )
        elif "r" in ans:
            ty = str(ans.get("ty"))[:100]
            out.append(H.verdict(False, "wrong_output", f"returned a non-data value of type {ty}"))
        else:
            cat, msg = ans.get("e"), ans.get("m")
            if cat == "nondata":
                cat = "wrong_output"
            if cat not in H.CATEGORIES or type(msg) is not str:
                raise Violation("malformed failure record")
            out.append(H.verdict(False, cat, H.short(msg)))
    return out


def collect_outputs(
    link: Link, job: dict[str, Any], allowance: int
) -> tuple[list[dict[str, Any] | None], list[Any]]:
    """Reference outputs: the verdict says whether a value came back; outputs hold it (wire).

    A case whose reference failed for a reason of its own (it raised, exited, gave non-data,
    or went over the allowance) holds ``{"$drop": why}``; one that failed by accident of
    time or memory (a loaded host, a hostile neighbour) holds None, so the caller tries it
    again rather than drop it (``$drop`` is no tag of the codec: no output can look like it).
    """
    verdicts: list[dict[str, Any] | None] = []
    outputs: list[Any] = []
    used = 0
    for ans in call_cases(link, job):
        if "gone" in ans:
            verdicts.append(None)
            outputs.append(None)
        elif "v" in ans:
            size = len(json.dumps(ans["v"], separators=(",", ":")))
            used += size
            if used > allowance:
                msg = f"the reference's outputs exceed the {allowance}-byte allowance"
                verdicts.append(H.verdict(False, "output_limit", msg))
                outputs.append({DROP: "output_limit (over the allowance)"})
                continue
            verdicts.append(H.verdict(True))
            outputs.append(ans["v"])
        else:
            cat = str(ans["e"]) if ans.get("e") in H.CATEGORIES else "wrong_output"
            msg = H.short(str(ans.get("m") or "non-data"))
            verdicts.append(H.verdict(False, cat, msg))
            if cat not in TRANSIENT:
                outputs.append({DROP: _drop_reason(cat, ans.get("x"))})
            elif cat == "timeout" and (
                CPU_TIME_TIMEOUT in msg or (ans.get("cpu") and len(job["tests"]) == 1)
            ):  # this case's own CPU budget (alone in its process: the process's limit)
                outputs.append({SLOW: "timeout (CPU time)"})
            else:  # the wall-clock backstop, or the process's CPU spent on earlier cases
                outputs.append(None)
    return verdicts, outputs


#: the key of an output the reference could not give for a reason of its own
DROP = "$drop"
#: the key of an output whose case used up its own CPU-time budget (the caller drops the
#: case only if it does so in every run: see Sandbox.resolve)
SLOW = "$slow"
#: how the worker says a call ran out of its CPU-time budget (``_harness._KINDS``)
CPU_TIME_TIMEOUT = "(CPU time)"


def _drop_reason(cat: str, exc_name: Any) -> str:
    """Why a case was dropped, without the message (it can quote hidden inputs: receipts
    carry this reason)."""
    if type(exc_name) is str and exc_name.isidentifier():
        return f"{cat} ({exc_name[:60]})"
    return "wrong_output (non-data)" if cat == "wrong_output" else cat
#: failures that say nothing about the reference (time and memory depend on the host)
TRANSIENT = frozenset({"timeout", "memory_limit"})


# --------------------------------------------------------------------------- behaviour

#: significant digits floats are compared to (sum order must not split a cluster)
FLOAT_DIGITS = 12
#: what a probe output that never arrived counts as
LOST = {"$e": "lost"}
_UNORDERED = ("$s", "$fs", "$d", "$ctr", "$dd", "$dk", "$di")


def canonical_output(item: Any) -> Any:
    """One probe output as canonical data: sets and dicts sorted, floats rounded, errors tagged.

    Runs in the judge on what the worker sent; raises ValueError on a malformed record.
    """
    if type(item) is not dict:
        raise ValueError("probe output is not an object")
    if "v" in item:
        return _canon(item["v"], 0)
    if "h" in item:
        digest = item["h"]
        if type(digest) is not str or len(digest) != 64:
            raise ValueError("malformed probe output digest")
        return {"$h": digest}
    err = item.get("e")
    if type(err) is not str or not err or len(err) > 100:
        raise ValueError("malformed probe error")
    return {"$e": err}


def _canon(w: Any, depth: int) -> Any:
    if depth > _codec.MAX_DEPTH + 2:
        raise ValueError("probe output nests too deeply")
    t = type(w)
    if w is None or t is bool or t is int or t is str:
        return w
    if t is float:
        return {"$f": format(w + 0.0, f".{FLOAT_DIGITS}g")}  # + 0.0: -0.0 is 0.0
    d = depth + 1
    if t is list:
        return [_canon(x, d) for x in w]
    if t is not dict or len(w) != 1:
        raise ValueError("malformed probe output")
    ((tag, body),) = w.items()
    if tag in ("$f", "$i") and type(body) is str:
        return {tag: body}
    if tag in ("$b", "$ba", "$dec", "$bt") and type(body) is str:
        return w
    if tag == "$ddf" and type(body) is list and len(body) == 2 and type(body[0]) is str:
        pairs = _canon({"$dd": body[1]}, depth)  # unordered, as a defaultdict's pairs
        return {tag: [body[0], pairs["$dd"]]}
    if type(body) is not list:
        raise ValueError("malformed probe output")
    items = [_canon(x, d) for x in body]
    if tag in _UNORDERED:  # unordered: the order a hash seed gave is not behaviour
        items.sort(key=_text)
    return {tag: items}


def _text(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def behaviour(outs: list[Any] | None, n: int) -> dict[str, Any]:
    """The digest of a sample's output vector and each output's digest (``sha256:`` hex).

    ``outs`` None (the record never arrived: the sample was killed mid-probe) counts every
    output as lost. Raises ValueError on a malformed record.
    """
    items = [canonical_output(o) for o in outs] if outs is not None else [LOST] * n
    if len(items) != n:
        raise ValueError("wrong number of probe outputs")
    texts = [_text(item) for item in items]
    per = [hashlib.sha256(t.encode()).hexdigest()[:16] for t in texts]
    whole = hashlib.sha256(("[" + ",".join(texts) + "]").encode()).hexdigest()
    return {"digest": "sha256:" + whole, "outputs": per}


def _probe(link: Link, job: dict[str, Any]) -> dict[str, Any] | None:
    inputs = job["probe"]
    try:
        ans = link.ask(
            {"op": "probe", "f": job.get("probe_entry"), "in": inputs, "b": float(job["probe_s"])}
        )
    except Gone:
        return behaviour(None, len(inputs))
    outs = ans.get("outs")
    try:
        return behaviour(outs if type(outs) is list else [], len(inputs))
    except (ValueError, TypeError, RecursionError):
        return None  # a malformed record: the sample agrees with nobody


# --------------------------------------------------------------------------- the judge's run


def run_judge(zfd: int, wfd: int, job: dict[str, Any]) -> dict[str, Any]:
    """Load the sample in W, judge every test, and return the result for the zygote.

    ``tests`` holds a verdict per test, or None where W ended before that test was judged
    (the zygote knows why: its exit status, the deadline or the output cap).
    """
    n = len(job["tests"])
    link = Link(wfd, float(job["per_test_s"]), job.get("cpu_usage"))
    result: dict[str, Any] = {}
    wjob = {"code": job.get("code"), "load_s": job["load_s"]}
    if job.get("setup_imports"):
        wjob["setup_imports"] = job["setup_imports"]
    try:
        if not job.get("w_job_sent"):  # else the zygote put it in W's socket already
            H.write_all(wfd, H.encode_frame(wjob))
        try:
            ready = H.read_frame(wfd, 1 << 10)
        except (EOFError, OSError):
            result["ready"] = False  # the worker died before the sample ran: not the sample's
            raise Gone() from None
        except (ValueError, RecursionError):
            raise Violation("the result channel carried bytes that are not a record") from None
        if ready != {"t": "ready"}:
            raise Violation("the worker's first record was not its ready record")
        result["ready"] = True
        try:
            load = H.read_frame(wfd, H.MAX_VALUE_FRAME)
        except (EOFError, OSError):
            raise Gone() from None
        except (ValueError, RecursionError):
            raise Violation("the result channel carried bytes that are not a record") from None
        if type(load) is not dict or load.get("t") != "load":
            raise Violation("the first record was not the load record")
        if "cat" in load:
            cat, msg = load.get("cat"), load.get("msg")
            if cat not in H.CATEGORIES or type(msg) is not str:
                raise Violation("malformed load record")
            result["tests"] = [H.verdict(False, cat, H.short(msg))] * n
            result["load_failed"] = True
            if job["mode"] == "outputs" and cat not in TRANSIENT:  # the reference's own fault
                result["outputs"] = [{DROP: _drop_reason(str(cat), None) + " while loading"}] * n
            return result
        pre, names = load.get("vals"), job.get("prefetch") or []
        if pre is not None:
            if type(pre) is not list or len(pre) != len(names):
                raise Violation("malformed load record")
            link.prefetched = dict(zip(names, pre, strict=True))
        mode = job["mode"]
        if mode == "asserts":
            tests = judge_asserts(link, job)
        elif mode == "cases":
            tests = judge_cases(link, job)
        else:
            tests, outputs = collect_outputs(link, job, int(job.get("allowance") or 0))
            result["outputs"] = outputs
        result["tests"] = tests
        if job.get("probe") is not None and not link.dead and None not in tests:
            link.end_test()  # the probe has its own timer per input, no test's budget
            result["behaviour"] = _probe(link, job)
    except Gone:
        done = result.get("tests") or []
        result["tests"] = list(done) + [None] * (n - len(done))
        result["gone"] = True
    except Violation as exc:
        msg = H.short(str(exc))
        result = {"tests": [H.verdict(False, "sandbox_violation", msg)] * n}
    finally:
        result["round_trips"] = link.round_trips
        link.close()
        with contextlib.suppress(OSError):
            H.write_all(wfd, H.encode_frame({"op": "bye"}))
    return result
