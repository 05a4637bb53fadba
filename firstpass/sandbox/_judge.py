"""The judge (J): evaluates every test itself, in a process that never runs sample code.

J is forked per sample, under its own uid, with trusted builtins and the spec's ``setup``.
Asserts are evaluated here whole — comparisons, ``set``/``sorted``/``math``, setup helpers,
comprehensions and lambdas included. A name the sample defines is looked up in the worker (W)
and arrives as plain data or as a :class:`Remote`: a stub whose calls, attribute reads and
iteration are round trips to W, each answered with plain data or another reference. A
sample's object is never compared, hashed or truth-tested with its own methods here: that
is refused with an ``unsupported`` failure that says so (compare its attributes instead).

Cases are judged here too (expected values never reach W), and reference outputs collected.
Stdlib only: the zygote imports this file.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import hashlib
import json
import signal
import sys
import time
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
    signal.setitimer(signal.ITIMER_REAL, 0)
    raise _JudgeTimeout()


class Link:
    """The judge's end of the channel to W: one request, one answer, validated."""

    def __init__(self, fd: int, per_test_s: float) -> None:
        self.fd = fd
        self.per_test_s = per_test_s
        self.test_end = 0.0
        self.calls: list[str] = []  # "f(1) -> 10", for the failure message
        self.dead = False  # W hit its CPU limit: nothing more can run there
        self.round_trips = 0
        #: name -> the worker's answer, sent with its load record (used once, then asked)
        self.prefetched: dict[str, Any] = {}

    def start_test(self) -> None:
        self.test_end = time.monotonic() + self.per_test_s
        self.calls = []

    def budget(self) -> float:
        left = self.test_end - time.monotonic()
        if left <= 0:
            raise SampleFailure("timeout", "test exceeded its time budget")
        return left

    def ask(self, req: dict[str, Any]) -> dict[str, Any]:
        if self.dead:
            raise SampleFailure("timeout", "the sample's CPU limit was reached", cpu=True)
        self.round_trips += 1
        try:
            H.write_all(self.fd, H.encode_frame(req))
            asked = True
        except OSError:
            # the worker is gone; what it wrote before going is still in the channel, and must
            # be judged the same whichever side won the race (a forged record is a violation)
            asked = False
        try:
            ans = H.read_frame(self.fd, H.MAX_VALUE_FRAME)
        except H.FrameTooLarge as exc:
            raise Violation(
                f"the sample sent a value of {exc.size} bytes (limit {H.MAX_VALUE_FRAME})"
            ) from None
        except (EOFError, OSError):
            raise Gone() from None
        except (ValueError, RecursionError):
            raise Violation("the result channel carried bytes that are not a record") from None
        if not asked:
            raise Violation("the sample wrote on the result channel without being asked")
        if type(ans) is not dict:
            raise Violation("the result channel carried a record of the wrong shape")
        return ans

    def value(self, ans: dict[str, Any]) -> Any:
        """One answer as a value for the test: data, a :class:`Remote`, or the sample's failure."""
        if "v" in ans:
            try:
                return _codec.from_wire(ans["v"])
            except (_codec.WireError, RecursionError, MemoryError) as exc:
                raise Violation(f"malformed value: {exc}") from None
        if "r" in ans:
            ref, ty, flags = ans["r"], ans.get("ty"), ans.get("f", "")
            if type(ref) is not int or type(ty) is not str or type(flags) is not str:
                raise Violation("malformed reference")
            return remote_class(flags)(self, ref, ty[:100])
        cat, msg = ans.get("e"), ans.get("m")
        if cat == "nondata":
            raise Unsupported(H.short(str(msg)))
        if cat not in H.CATEGORIES or type(msg) is not str:
            raise Violation("malformed failure record")
        if ans.get("cpu"):
            self.dead = True
        if cat in ("timeout", "memory_limit"):
            raise SampleFailure(cat, H.short(msg), cpu=bool(ans.get("cpu")))
        raise sample_exception(ans.get("x"))(cat, H.short(msg))

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
        try:
            out = self.request(req)
        except SampleError as exc:
            self.note(target, args, kwargs, f"raised {exc.msg}")
            raise
        self.note(target, args, kwargs, brief_repr(out))
        return out

    def note(self, target: Remote, args: tuple[Any, ...], kwargs: dict[str, Any], got: str) -> None:
        if len(self.calls) < 8:
            shown = [brief_repr(a) for a in args] + [
                f"{k}={brief_repr(v)}" for k, v in kwargs.items()
            ]
            self.calls.append(f"{target._fp_name}({', '.join(shown)}) -> {got}")

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


def encode_arg(value: Any) -> Any:
    if isinstance(value, Remote):
        return {"$r": value._fp_ref}
    try:
        return _codec.to_wire(value)
    except _codec.NonData:
        raise Unsupported(
            f"the test passes a {type(value).__name__} to the sample; only plain data (and "
            "the sample's own objects) can cross the sandbox boundary"
        ) from None


def brief_repr(value: Any) -> str:
    if isinstance(value, Remote):  # never a round trip (or the sample's words) in a message
        return f"<{value._fp_ty} object of the sample>"
    try:
        return H.short(repr(value), 120)
    except Exception:  # a repr of plain data cannot fail, but a message must never crash
        return "<unprintable>"


def _refuse(what: str) -> Any:
    def method(self: Remote, *args: Any) -> Any:
        raise Unsupported(
            f"the test {what} an object of the sample's type {self._fp_ty}; the judge does not "
            "run a sample's own methods for that (compare its attributes or convert it to data)"
        )

    return method


#: dunder attributes of a sample's object the judge reads from the worker (``f.__name__``)
_READABLE_DUNDERS = frozenset({"__name__", "__qualname__", "__annotations__", "__wrapped__"})


class Remote:
    """A value that lives in the worker: a function, class, or an object that is not data.

    What Python asks of a type itself (``callable``, ``iter``, ``next``, ``len``,
    ``collections.abc`` checks) follows the worker's object: each reference arrives with
    flags saying which of those its type has, and gets a class of exactly those methods
    (:func:`remote_class`). Names, docstrings, ``repr``, ``str``, ``format``, arithmetic and
    attributes are round trips. Comparing, hashing and truth-testing are refused.
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

    def __setattr__(self, name: str, value: Any) -> None:
        raise Unsupported("the test sets an attribute of an object of the sample")

    def __instancecheck__(self, obj: Any) -> bool:
        return self._fp_ask("inst", a=encode_arg(obj)) is True

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
    __eq__ = _refuse("compares (==)")
    __ne__ = _refuse("compares (!=)")
    __lt__ = _refuse("orders (<)")
    __le__ = _refuse("orders (<=)")
    __gt__ = _refuse("orders (>)")
    __ge__ = _refuse("orders (>=)")
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


_SAMPLE_EXCEPTIONS: dict[str, type[SampleError]] = {}


def sample_exception(name: Any) -> type[SampleError]:
    """SampleError that is also the builtin exception the sample raised (``ValueError``...),
    so ``hasattr``, a length hint or a setup helper's ``except ValueError`` sees it as such."""
    if type(name) is not str:
        return SampleError
    cls = _SAMPLE_EXCEPTIONS.get(name)
    if cls is None:
        base = getattr(builtins, name, None)
        if not (isinstance(base, type) and issubclass(base, Exception)) or issubclass(
            base, SampleError
        ):
            return SampleError
        try:
            cls = type(f"Sample{name}", (SampleError, base), {})
        except TypeError:  # a layout conflict (an exception with its own C struct)
            return SampleError
        _SAMPLE_EXCEPTIONS[name] = cls
    return cls


# --------------------------------------------------------------------------- asserts


def assert_names(src: str) -> tuple[Any, frozenset[str]]:
    """The compiled test expression of one assert and the free names it loads."""
    code, names, _ = assert_uses(src)
    return code, names


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


#: modules whose functions cannot change the judge's state for a later job (no seeds,
#: contexts or caches that alter results); a pure test may call into these and nothing else
PURE_MODULES = frozenset(
    {
        "math",
        "cmath",
        "operator",
        "string",
        "itertools",
        "functools",
        "collections",
        "re",
        "statistics",
        "fractions",
        "heapq",
        "bisect",
        "copy",
    }
)
#: builtins a pure test may use: they compute, and cannot reach the judge's globals
PURE_BUILTINS = frozenset(
    """abs all any ascii bin bool bytearray bytes callable chr complex dict divmod enumerate
    filter float format frozenset hash hex int isinstance issubclass iter len list map max min
    next oct ord pow range repr reversed round set slice sorted str sum tuple type zip True
    False None Exception ValueError TypeError KeyError IndexError ZeroDivisionError
    ArithmeticError LookupError NotImplemented Ellipsis""".split()  # noqa: SIM905 (a word list)
)
_PURE_NODES = (
    ast.Expression,
    ast.BoolOp,
    ast.BinOp,
    ast.UnaryOp,
    ast.Lambda,
    ast.IfExp,
    ast.Dict,
    ast.Set,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.Compare,
    ast.Call,
    ast.FormattedValue,
    ast.JoinedStr,
    ast.Constant,
    ast.Attribute,
    ast.Subscript,
    ast.Starred,
    ast.Name,
    ast.List,
    ast.Tuple,
    ast.Slice,
    ast.keyword,
    ast.comprehension,
    ast.arguments,
    ast.arg,
    ast.expr_context,
    ast.boolop,
    ast.operator,
    ast.unaryop,
    ast.cmpop,
    ast.NamedExpr,
)


#: attributes that lead from a value to frames, and from frames to globals and modules
FRAME_ATTRS = frozenset(
    {
        "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code", "tb_frame",
        "tb_next", "f_globals", "f_builtins", "f_locals", "f_back", "f_code", "mro",
    }
)  # fmt: skip
#: module functions that reach attributes by name at run time (a string is not checked here)
NAME_REACHERS = frozenset({("operator", "attrgetter"), ("operator", "methodcaller")})


def pure_spec(asserts: tuple[str, ...] | list[str] | None, setup: str | None) -> bool:
    """True when judging the spec cannot change the judge process for a later job.

    Such a spec may be judged by a judge that lives across jobs (no fork and no cold pages per
    sample). Pure: setup only imports modules of ``PURE_MODULES``; each assert uses only
    expressions, builtins of ``PURE_BUILTINS``, names of its own or the sample's, no
    attribute starting with ``_`` or leading to frames, and a module only as ``module.name``
    where ``name`` is a function, class or constant of it (never a module: ``statistics.sys``
    would reach everything). The resident judge also checks after each job that no module it
    relies on changed (see ``Integrity``): this is the first line, that the second.
    """
    modules: set[str] = set()
    if setup:
        for stmt in ast.parse(setup).body:
            if isinstance(stmt, ast.Import):
                if any(
                    a.name not in PURE_MODULES or (a.asname or a.name) != a.name for a in stmt.names
                ):
                    return False
                modules.update(a.name for a in stmt.names)
            elif isinstance(stmt, ast.ImportFrom):
                if stmt.level or stmt.module not in PURE_MODULES:
                    return False
                if any(not _pure_member(stmt.module, a.name) for a in stmt.names):
                    return False
            else:
                return False
    for src in asserts or ():
        stmt = ast.parse(src).body[0]
        if not isinstance(stmt, ast.Assert):
            return False
        bases: set[int] = set()  # Name nodes that are the base of an attribute
        for node in ast.walk(stmt.test):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                bases.add(id(node.value))
        for node in ast.walk(stmt.test):
            if not isinstance(node, _PURE_NODES):
                return False
            if isinstance(node, ast.Attribute):
                if node.attr.startswith("_") or node.attr in FRAME_ATTRS:
                    return False
                base = node.value
                if (
                    isinstance(base, ast.Name)
                    and base.id in STDLIB
                    and (base.id not in PURE_MODULES or not _pure_member(base.id, node.attr))
                ):
                    return False
            if isinstance(node, ast.Name):
                name = node.id
                if name.startswith("__"):
                    return False
                if name in BUILTIN_NAMES and name not in PURE_BUILTINS:
                    return False
                if name in STDLIB and id(node) not in bases:
                    return False  # a module as a value: `(lambda m: m.sys)(statistics)`
    return True


def _pure_member(module: str, name: str) -> bool:
    """``module.name`` computes and cannot reach other modules or run-time attribute names."""
    if (module, name) in NAME_REACHERS or name.startswith("_"):
        return False
    try:
        value = getattr(__import__(module), name)
    except (ImportError, AttributeError):
        return False
    return not isinstance(value, type(ast))  # a module reaches everything


class Integrity:
    """What a resident judge relies on, by identity: the modules it runs and the pure stdlib
    modules tests may call. After each job it checks nothing was rebound; if anything was,
    the judge exits (T forks a fresh one) before it judges another job."""

    def __init__(self) -> None:
        names = ("builtins", "_judge", "_compare", "_codec", "_harness", *sorted(PURE_MODULES))
        self.watched = [(n, sys.modules[n]) for n in names if n in sys.modules]
        self.snapshot = [dict(vars(m)) for _, m in self.watched]
        self.modules = dict(sys.modules)

    def intact(self) -> bool:
        for (_, module), before in zip(self.watched, self.snapshot, strict=True):
            now = vars(module)
            if now.keys() != before.keys() or any(now[k] is not v for k, v in before.items()):
                return False
        return all(sys.modules.get(k) is v for k, v in self.modules.items())


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


def trusted_namespace(setup: str | None) -> tuple[dict[str, Any], str | None]:
    """Builtins and the spec's setup, run here (test code from the client)."""
    ns: dict[str, Any] = {"__builtins__": builtins, "__name__": "__test__"}
    if setup:
        try:
            exec(compile(setup, "<setup>", "exec", dont_inherit=True), ns)
        except BaseException as exc:  # setup naming sample functions fails here: reported
            return ns, H.short(f"setup raised {type(exc).__name__}: {exc}")
    return ns, None


def _stdlib_module(name: str) -> Any:
    if name not in STDLIB or name.startswith("_"):
        return None
    try:
        return __import__(name)
    except ImportError:
        return None


def judge_asserts(link: Link, job: dict[str, Any]) -> list[dict[str, Any] | None]:
    ns, setup_error = trusted_namespace(job.get("setup"))
    n = len(job["tests"])
    if setup_error:
        return [H.verdict(False, "runtime_error", setup_error)] * n
    entry = job.get("entry_point")
    uses = [assert_uses(src) for src in job["tests"]]
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
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, link.per_test_s + JUDGE_SLACK_S)
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
        signal.setitimer(signal.ITIMER_REAL, 0)
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
    """Reference outputs: the verdict says whether a value came back; outputs hold it (wire)."""
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
                outputs.append(None)
                continue
            verdicts.append(H.verdict(True))
            outputs.append(ans["v"])
        else:
            cat = ans.get("e") if ans.get("e") in H.CATEGORIES else "wrong_output"
            verdicts.append(H.verdict(False, cat, H.short(str(ans.get("m") or "non-data"))))
            outputs.append(None)
    return verdicts, outputs


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
    if tag == "$b" and type(body) is str:
        return w
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
    link = Link(wfd, float(job["per_test_s"]))
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
        with contextlib.suppress(OSError):
            H.write_all(wfd, H.encode_frame({"op": "bye"}))
    return result
