"""What runs inside the sandbox: the worker loop, the assert splitter and the judges (stdlib only).

Trust split (see docs/sandbox.md): the *worker* loads the sample and evaluates only the parts of
each test that mention the sample (the "leaves"); it ships their values back as plain data
(:mod:`_codec`). The *judge* never runs sample code: it evaluates each assert's skeleton over
those values (``f(1) == 2`` becomes ``__fp_leaf(0) == 2``) or compares case outputs with the
expected values, which never enter the worker.
"""

from __future__ import annotations

import ast
import builtins
import cmath
import contextlib
import hashlib
import json
import math
import os
import signal
import struct
import sys
from dataclasses import dataclass
from typing import Any

try:  # imported as firstpass.sandbox._harness by the proxy, as a top-level module by the zygote
    from . import _codec
except ImportError:  # pragma: no cover - the zygote's import path
    import _codec  # type: ignore[no-redef]

BUILTIN_NAMES = frozenset(dir(builtins))
#: pure stdlib modules the judge imports itself when the sample merely ``import``s them
SAFE_MODULES = frozenset(
    {
        "math",
        "cmath",
        "re",
        "collections",
        "itertools",
        "heapq",
        "functools",
        "operator",
        "string",
        "statistics",
        "fractions",
        "decimal",
        "bisect",
        "copy",
    }
)
#: callables the zygote may evaluate in-process on plain data (no setup code needed)
SIMPLE_CALLS = frozenset(
    {
        "set",
        "sorted",
        "list",
        "tuple",
        "frozenset",
        "abs",
        "len",
        "round",
        "bool",
        "int",
        "float",
        "str",
        "min",
        "max",
        "sum",
        "dict",
        "all",
        "any",
        "isinstance",
        "type",
        "repr",
        "__fp_leaf",
    }
)
SIMPLE_ATTRS = {
    "math": {"isclose", "inf", "nan", "pi", "e", "sqrt", "fabs", "floor", "ceil"},
    "cmath": {"isclose"},
}
LEAF = "__fp_leaf"
MSG_MAX = 300
FRAME = struct.Struct(">I")
MAX_FRAME = 64 << 20

CATEGORIES = (
    "syntax_error",
    "runtime_error",
    "assertion_failed",
    "wrong_output",
    "timeout",
    "memory_limit",
    "output_limit",
    "no_code",
    "sandbox_violation",
)


def short(text: str, limit: int = MSG_MAX) -> str:
    """Cut a message to ``limit`` characters (messages are for humans, not for logs of data)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def brief_repr(value: Any) -> str:
    try:
        return short(repr(value), 120)
    except Exception:  # a repr of plain data cannot fail, but a message must never crash
        return "<unprintable>"


# --------------------------------------------------------------------------- static analysis


@dataclass(frozen=True, kw_only=True)
class Bindings:
    """Names a piece of code binds at module level (over-approximated: more is safer)."""

    names: frozenset[str]
    safe_imports: frozenset[str]  # bound *only* by ``import m`` of a SAFE_MODULES module
    star: bool


class _Binder(ast.NodeVisitor):
    def __init__(self) -> None:
        self.kinds: dict[str, set[str]] = {}
        self.star = False

    def add(self, name: str, kind: str = "other") -> None:
        self.kinds.setdefault(name, set()).add(kind)

    def visit_FunctionDef(self, node: ast.AST) -> None:
        self.add(node.name)  # type: ignore[attr-defined]
        for deco in node.decorator_list:  # type: ignore[attr-defined]
            self.visit(deco)

    visit_AsyncFunctionDef = visit_ClassDef = visit_FunctionDef

    def visit_Lambda(self, node: ast.Lambda) -> None:
        return None

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self.add(node.id)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            if alias.asname:
                self.add(alias.asname)
            else:
                top = alias.name.split(".")[0]
                self.add(top, f"import:{top}" if alias.name == top else "other")

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        for alias in node.names:
            if alias.name == "*":
                self.star = True
            else:
                self.add(alias.asname or alias.name)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.add(node.name)
        self.generic_visit(node)

    def visit_MatchAs(self, node: ast.MatchAs) -> None:
        if node.name:
            self.add(node.name)
        self.generic_visit(node)

    def visit_MatchStar(self, node: ast.MatchStar) -> None:
        if node.name:
            self.add(node.name)

    def visit_MatchMapping(self, node: ast.MatchMapping) -> None:
        if node.rest:
            self.add(node.rest)
        self.generic_visit(node)


def bindings(tree: ast.Module) -> Bindings:
    """Names ``tree`` binds at module level, including ``global`` names of its functions."""
    binder = _Binder()
    binder.visit(tree)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            for name in node.names:
                binder.add(name)
    safe = frozenset(
        n for n, kinds in binder.kinds.items() if kinds == {f"import:{n}"} and n in SAFE_MODULES
    )
    return Bindings(names=frozenset(binder.kinds), safe_imports=safe, star=binder.star)


def setup_is_simple(setup_tree: ast.Module | None) -> bool:
    """True when setup is only ``import m`` of modules the zygote itself provides."""
    if setup_tree is None:
        return True
    return all(
        isinstance(stmt, ast.Import)
        and all(a.asname is None and a.name in SIMPLE_ATTRS for a in stmt.names)
        for stmt in setup_tree.body
    )


# --------------------------------------------------------------------------- assert splitting


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How one assert is checked: ``leaves`` run in the worker, ``skeleton`` in the judge.

    ``weak``: the assert could not be split, so its single leaf is the whole test expression,
    evaluated (truthiness included) inside the sample's process.
    """

    leaves: tuple[str, ...]
    skeleton: str
    weak: bool
    simple: bool


class _Unsplittable(Exception):
    pass


_SCOPES = (
    ast.Lambda,
    ast.ListComp,
    ast.SetComp,
    ast.DictComp,
    ast.GeneratorExp,
    ast.NamedExpr,
    ast.Await,
    ast.Yield,
    ast.YieldFrom,
)
_STRUCTURE = (
    ast.BoolOp,
    ast.UnaryOp,
    ast.BinOp,
    ast.Compare,
    ast.Tuple,
    ast.List,
    ast.Set,
    ast.Dict,
    ast.Subscript,
    ast.IfExp,
    ast.Slice,
    ast.Attribute,
    ast.JoinedStr,
    ast.FormattedValue,
    ast.Starred,
    ast.keyword,
)


class _Splitter:
    def __init__(self, untrusted: frozenset[str] | None, trusted: frozenset[str]) -> None:
        self.untrusted = untrusted  # None: every name is the sample's (star import)
        self.trusted = trusted
        self.leaves: list[str] = []

    def is_sample(self, name: str) -> bool:
        if self.untrusted is None or name.startswith("__fp_"):
            return True
        return name in self.untrusted or name not in self.trusted

    def mentions(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and self.is_sample(n.id) for n in ast.walk(node))

    def leaf(self, node: ast.expr) -> ast.expr:
        for sub in ast.walk(node):
            if isinstance(sub, _SCOPES) and self.mentions(sub):
                raise _Unsplittable
        self.leaves.append(ast.unparse(node))
        index = len(self.leaves) - 1
        return ast.Call(func=ast.Name(LEAF, ast.Load()), args=[ast.Constant(index)], keywords=[])

    def split(self, node: Any) -> Any:
        if not isinstance(node, ast.AST) or not self.mentions(node):
            return node
        if isinstance(node, _SCOPES):
            raise _Unsplittable
        structural = isinstance(node, _STRUCTURE) or (
            isinstance(node, ast.Call) and not self.mentions(node.func)
        )
        if not structural:
            assert isinstance(node, ast.expr)  # statements never reach here: we split expressions
            return self.leaf(node)
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                setattr(node, field, [self.split(v) for v in value])
            else:
                setattr(node, field, self.split(value))
        return node


def _is_simple(tree: ast.AST) -> bool:
    allowed = (
        ast.Expression,
        ast.Compare,
        ast.BoolOp,
        ast.UnaryOp,
        ast.Constant,
        ast.Tuple,
        ast.List,
        ast.Set,
        ast.Dict,
        ast.Call,
        ast.keyword,
        ast.Name,
        ast.Attribute,
        ast.Load,
        ast.cmpop,
        ast.boolop,
        ast.Not,
        ast.USub,
        ast.UAdd,
    )
    for node in ast.walk(tree):
        if not isinstance(node, allowed):
            return False
        if (
            isinstance(node, ast.Name)
            and node.id not in SIMPLE_CALLS
            and node.id not in SIMPLE_ATTRS
        ):
            return False
        if isinstance(node, ast.Attribute) and not (
            isinstance(node.value, ast.Name) and node.attr in SIMPLE_ATTRS.get(node.value.id, ())
        ):
            return False
    return True


def plan_asserts(
    asserts: list[str], sample: Bindings, setup: Bindings | None, setup_simple: bool
) -> list[Plan]:
    """Split every assert into worker leaves and a judge skeleton."""
    setup_names = setup.names if setup else frozenset()
    untrusted = None if sample.star else sample.names - sample.safe_imports
    trusted = setup_names | BUILTIN_NAMES | sample.safe_imports
    plans = []
    for src in asserts:
        stmt = ast.parse(src).body[0]
        assert isinstance(stmt, ast.Assert)  # parse_spec guarantees one assert statement
        splitter = _Splitter(untrusted, trusted)
        try:
            expr = splitter.split(stmt.test)
            weak = False
        except _Unsplittable:
            splitter.leaves = [ast.unparse(stmt.test)]
            expr = ast.Call(func=ast.Name(LEAF, ast.Load()), args=[ast.Constant(0)], keywords=[])
            weak = True
        tree = ast.fix_missing_locations(ast.Expression(body=expr))
        plans.append(
            Plan(
                leaves=tuple(splitter.leaves),
                skeleton=ast.unparse(tree),
                weak=weak,
                simple=setup_simple and _is_simple(tree),
            )
        )
    return plans


# --------------------------------------------------------------------------- framing


def encode_frame(obj: Any) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    return FRAME.pack(len(data)) + data


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_frame(fd: int) -> Any:
    """Blocking read of one frame (used only where blocking is the point: worker, judge)."""
    head = _read_exact(fd, FRAME.size)
    (size,) = FRAME.unpack(head)
    if size > MAX_FRAME:
        raise ValueError("frame too large")
    return json.loads(_read_exact(fd, size))


def _read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("channel closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class FrameBuffer:
    """Incremental frame parser for a non-blocking reader; raises ValueError on garbage."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.buf = bytearray()
        self.max_frame = max_frame

    def feed(self, data: bytes) -> list[Any]:
        self.buf += data
        out = []
        while len(self.buf) >= FRAME.size:
            (size,) = FRAME.unpack_from(self.buf)
            if size > self.max_frame:
                raise ValueError("oversized frame")
            if len(self.buf) < FRAME.size + size:
                break
            body = bytes(self.buf[FRAME.size : FRAME.size + size])
            del self.buf[: FRAME.size + size]
            out.append(json.loads(body))
        return out

    @property
    def partial(self) -> bool:
        return bool(self.buf)


# --------------------------------------------------------------------------- the worker


class _TestTimeout(BaseException):
    """Raised by the alarm inside the worker; a BaseException so ``except Exception`` misses it."""


def _on_alarm(signum: int, frame: Any) -> None:
    # disarm before raising: the wall timer and the CPU limit's SIGXCPU often fire together, and
    # a second alarm inside the except block would cut the report short (the process would then
    # exit without saying why, and a timeout would read as "exited before reporting")
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    raise _TestTimeout("cpu" if signum == signal.SIGXCPU else "wall")


def _arm(seconds: float) -> None:
    """Start a time budget: (re)install the alarm handlers, then the wall timer."""
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGXCPU, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def _failure(exc: BaseException) -> tuple[str, str]:
    if isinstance(exc, _TestTimeout):
        return "timeout", f"test exceeded its time budget ({exc.args[0]})"
    if isinstance(exc, MemoryError):
        return "memory_limit", "MemoryError"
    if isinstance(exc, _codec.NonData):
        return "", str(exc)
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return "runtime_error", short(text)


def run_worker(fd: int, job: dict[str, Any]) -> None:
    """Load the sample, evaluate every test's leaves, send one frame per test, then ``done``.

    Runs after privileges are dropped; everything here is forgeable by the sample, which is
    why only values (never verdicts) are sent.
    """
    send = _make_sender(fd)
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGXCPU, _on_alarm)
    budget = float(job["per_test_s"])
    ns: dict[str, Any] = {"__name__": "__sample__", "__builtins__": builtins}
    try:
        _arm(float(job["load_s"]))
        if job.get("setup"):
            exec(compile(job["setup"], "<setup>", "exec"), ns)
        exec(compile(job["code"], "<sample>", "exec"), ns)
        signal.setitimer(signal.ITIMER_REAL, 0)
    except BaseException as exc:  # the sample's exit, crash or timeout is a result
        signal.setitimer(signal.ITIMER_REAL, 0)
        cat, msg = _failure(exc)
        if isinstance(exc, SystemExit):
            msg = f"the sample exited while loading (SystemExit: {exc.code!r})"
        send({"t": "load", "cat": cat or "runtime_error", "msg": "loading the sample: " + msg})
        return
    send({"t": "load"})
    fn = None
    if job["mode"] == "cases":
        fn = ns.get(job["entry_point"])
    for i, test in enumerate(job["tests"]):
        try:
            _arm(budget)
            if job["mode"] == "cases":
                if not callable(fn):
                    raise NameError(f"entry point {job['entry_point']!r} is not defined")
                values = [_codec.to_wire(fn(*_codec.from_wire(test)))]
            else:
                values = []
                for src in test:
                    try:
                        value = eval(compile(src, "<test>", "eval"), ns)
                        values.append({"v": _codec.to_wire(value)})
                    except (Exception, SystemExit) as exc:  # recorded; the judge decides
                        cat, msg = _failure(exc)
                        values.append({"e": cat or "nondata", "m": msg})
            signal.setitimer(signal.ITIMER_REAL, 0)
            send({"t": "test", "i": i, "values": values})
        except BaseException as exc:
            signal.setitimer(signal.ITIMER_REAL, 0)
            cat, msg = _failure(exc)
            if isinstance(exc, SystemExit):
                cat, msg = "runtime_error", f"the sample exited during the test ({exc.code!r})"
            send({"t": "test", "i": i, "cat": cat or "nondata", "msg": msg})
            if cat == "timeout" and exc.args and exc.args[0] == "cpu":
                break  # the CPU limit is per process: nothing more can run
    else:
        if job.get("probe") is not None:
            send({"t": "probe", "outs": _run_probe(job, ns)})
    send({"t": "done"})


def _run_probe(job: dict[str, Any], ns: dict[str, Any]) -> list[dict[str, Any]]:
    """Call the entry point on every probe input, each under its own timer; record, never judge.

    Each output is ``{"v": wire value}``, ``{"h": sha256 hex}`` for one whose JSON is longer
    than ``PROBE_OUTPUT_CAP``, or ``{"e": what went wrong}`` (the exception's type name,
    ``timeout``, ``nondata``). Arguments are decoded afresh for each call, so a sample
    that mutates its inputs changes nothing for the next call. Runs after every test record
    was sent: nothing here can change a test's verdict.
    """
    fn = ns.get(job["probe_entry"])
    budget = float(job["probe_s"])
    outs: list[dict[str, Any]] = []
    for args in job["probe"]:
        if not callable(fn):
            outs.append({"e": "NameError"})
            continue
        try:
            _arm(budget)
            value = _codec.to_wire(fn(*_codec.from_wire(args)))
            text = json.dumps(value, separators=(",", ":"), sort_keys=True)
            signal.setitimer(signal.ITIMER_REAL, 0)
            if len(text) > PROBE_OUTPUT_CAP:  # keeps the record small: the channel has a cap
                outs.append({"h": hashlib.sha256(text.encode()).hexdigest()})
            else:
                outs.append({"v": value})
        except BaseException as exc:  # the sample's failure on this input is its behaviour
            signal.setitimer(signal.ITIMER_REAL, 0)
            if isinstance(exc, _TestTimeout):
                outs.append({"e": "timeout"})
                if exc.args and exc.args[0] == "cpu":  # nothing more can run in this process
                    outs.extend({"e": "timeout"} for _ in range(len(job["probe"]) - len(outs)))
                    break
            elif isinstance(exc, _codec.NonData):
                outs.append({"e": "nondata"})
            else:
                name = type(exc).__name__
                outs.append({"e": name[:100] if type(name) is str and name else "?"})
    return outs


# --------------------------------------------------------------------------- behaviour

#: a probe output longer than this (JSON characters) travels as its SHA-256 only
PROBE_OUTPUT_CAP = 64 << 10
#: significant digits floats are compared to (sum order must not split a cluster)
FLOAT_DIGITS = 12
#: what a probe output that never arrived counts as
LOST = {"$e": "lost"}


def canonical_output(item: Any) -> Any:
    """One probe output as canonical data: sets and dicts sorted, floats rounded, errors tagged.

    Runs in the verifier (Z) on what the worker sent; raises ValueError on a malformed record.
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
    if tag in ("$t", "$s", "$fs", "$d", "$c"):
        if type(body) is not list:
            raise ValueError("malformed probe output")
        items = [_canon(x, d) for x in body]
        if tag in ("$s", "$fs", "$d"):  # unordered: the order a hash seed gave is not behaviour
            items.sort(key=_text)
        return {tag: items}
    if tag == "$f":
        return {"$f": str(body)}
    if tag == "$b" and type(body) is str:
        return w
    raise ValueError("malformed probe output")


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


def _make_sender(fd: int) -> Any:
    write, encode = write_all, encode_frame  # bound before the sample can patch the module

    def send(obj: Any) -> None:
        write(fd, encode(obj))

    return send


# --------------------------------------------------------------------------- the judges


def values_equal(out: Any, exp: Any, atol: float) -> bool:
    """Type-aware equality, recursively; floats within ``atol`` (plus 1e-7 relative), NaN == NaN."""
    to, te = type(out), type(exp)
    if to is float or te is float:
        if to not in (int, float) or te not in (int, float):
            return False
        if out == exp or (out != out and exp != exp):
            return True
        return atol > 0 and abs(out - exp) <= atol + 1e-7 * abs(exp)
    if to in (list, tuple) and te is to:
        if len(out) != len(exp):
            return False
        return all(values_equal(a, b, atol) for a, b in zip(out, exp, strict=True))
    if to is dict and te is dict:
        return out.keys() == exp.keys() and all(values_equal(out[k], exp[k], atol) for k in exp)
    if to is complex or te is complex:
        return out == exp or (atol > 0 and abs(out - exp) <= atol)
    return bool(out == exp) if {to, te} <= _PLAIN else False


_PLAIN = {type(None), bool, int, str, bytes, set, frozenset, list, tuple, dict, complex, float}


def verdict(passed: bool, cat: str | None = None, msg: str | None = None) -> dict[str, Any]:
    return {"passed": passed, "error_type": None if passed else cat, "message": msg}


def judge_cases(
    expected: list[Any], atol: float, raws: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Compare each case's output with its expected value (both plain data)."""
    out = []
    for exp_wire, raw in zip(expected, raws, strict=True):
        if "cat" in raw:
            cat = "wrong_output" if raw["cat"] == "nondata" else raw["cat"]
            out.append(verdict(False, cat, raw.get("msg")))
            continue
        try:
            got = _codec.from_wire(raw["values"][0])
            exp = _codec.from_wire(exp_wire)
        except (_codec.WireError, KeyError, IndexError, TypeError) as exc:
            out.append(verdict(False, "sandbox_violation", f"malformed result record: {exc}"))
            continue
        if values_equal(got, exp, atol):
            out.append(verdict(True))
        else:
            out.append(
                verdict(False, "wrong_output", f"expected {brief_repr(exp)}, got {brief_repr(got)}")
            )
    return out


class _LeafError(Exception):
    def __init__(self, cat: str, msg: str) -> None:
        self.cat, self.msg = cat, msg
        super().__init__(msg)


def judge_asserts(
    plans: list[Plan], raws: list[dict[str, Any]], namespace: dict[str, Any]
) -> list[dict[str, Any]]:
    """Evaluate each assert's skeleton over the leaf values the worker shipped."""
    out = []
    for plan, raw in zip(plans, raws, strict=True):
        if "cat" in raw:
            cat = "assertion_failed" if raw["cat"] == "nondata" else raw["cat"]
            out.append(verdict(False, cat, raw.get("msg")))
            continue
        try:
            leaves = _decode_leaves(raw["values"], len(plan.leaves))
        except (_codec.WireError, KeyError, TypeError, ValueError) as exc:
            out.append(verdict(False, "sandbox_violation", f"malformed result record: {exc}"))
            continue
        shown: dict[int, Any] = {}

        def leaf(i: int, _leaves: list[Any] = leaves, _shown: dict[int, Any] = shown) -> Any:
            kind, value = _leaves[i]
            if kind == "e":
                raise _LeafError(*value)
            _shown[i] = value
            return value

        ns = dict(namespace)
        ns[LEAF] = leaf
        try:
            ok = eval(compile(plan.skeleton, "<assert>", "eval"), ns)
            if plan.weak and type(ok) is not bool:
                ok = False
        except _LeafError as exc:
            out.append(verdict(False, exc.cat, exc.msg))
            continue
        except MemoryError:
            out.append(verdict(False, "memory_limit", "MemoryError in the test expression"))
            continue
        except Exception as exc:
            out.append(verdict(False, "runtime_error", short(f"{type(exc).__name__}: {exc}")))
            continue
        if ok:
            out.append(
                verdict(True, msg="checked inside the sample's process" if plan.weak else None)
            )
        else:
            got = "; ".join(
                f"{plan.leaves[i]} -> {brief_repr(v)}" for i, v in sorted(shown.items())
            )
            msg = "assertion failed" + (f": {got}" if got and not plan.weak else "")
            out.append(verdict(False, "assertion_failed", short(msg)))
    return out


def _decode_leaves(values: Any, n: int) -> list[tuple[str, Any]]:
    if type(values) is not list or len(values) != n:
        raise ValueError("wrong number of values")
    leaves: list[tuple[str, Any]] = []
    for item in values:
        if type(item) is not dict:
            raise ValueError("value record is not an object")
        if "v" in item:
            leaves.append(("v", _codec.from_wire(item["v"])))
        else:
            cat = "assertion_failed" if item.get("e") == "nondata" else str(item.get("e"))
            if cat not in CATEGORIES:
                raise ValueError("unknown error category")
            leaves.append(("e", (cat, short(str(item.get("m"))))))
    return leaves


def simple_namespace() -> dict[str, Any]:
    """The namespace for skeletons the zygote evaluates itself (no setup code to run)."""
    return {"__builtins__": builtins, "math": math, "cmath": cmath}


def judge_namespace(
    setup: str | None, modules: frozenset[str]
) -> tuple[dict[str, Any], str | None]:
    """Run setup (client test code) for the judge; only ever called in the sandboxed judge."""
    ns: dict[str, Any] = {"__builtins__": builtins, "__name__": "__test__"}
    for name in sorted(modules):
        with contextlib.suppress(ImportError):
            ns[name] = __import__(name)
    if setup:
        try:
            exec(compile(setup, "<setup>", "exec"), ns)
        except BaseException as exc:  # setup naming sample functions fails here: reported
            return ns, short(f"setup raised {type(exc).__name__}: {exc}")
    return ns, None


if __name__ == "__main__":  # pragma: no cover
    sys.exit("this module is loaded by the zygote")
