"""The worker (W): loads the sample and serves the judge's requests (stdlib only).

Trust split (see docs/sandbox.md): W answers the judge's requests — "call this name with these
plain-data arguments", "read this attribute" — with plain data (:mod:`.codec`), or with a
numbered reference when a value is not data. It never sees a test, an expected value or a
verdict. The *judge* (J, :mod:`.judge`) evaluates every assert itself, with its own builtins
and the spec's setup; names the sample defines are stubs there. Everything in W is forgeable
by the sample, which is why W only ever sends values.
"""

from __future__ import annotations

import _signal
import builtins
import hashlib
import json
import operator
import os
import signal
import sys
import time
import types
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final, cast

from . import codec, frames
from .codec import Wire
from .verdicts import short

if TYPE_CHECKING:
    from .frames import Answer, Ask, WorkerJob

#: how many non-data objects one worker keeps for the judge to use
MAX_REFS = 100_000
#: a batch of case answers stops growing past this (the judge asks again for the rest), so
#: that a frame holds many small values or one large one, never over frames.MAX_VALUE_FRAME
BATCH_BYTES = 32 << 20
#: key of an answer that is already an encoded frame body
RAW: Final = "__raw__"


class _TestTimeout(BaseException):
    """Raised by the alarm inside the worker; a BaseException so ``except Exception`` misses it."""


#: a time budget is CPU time (ITIMER_PROF: this process's, all its threads); its wall-clock
#: backstop, for a sample that sleeps or blocks (which uses no CPU), is this many budgets of
#: wall clock *not counting the time the process waited for a CPU*: a sample starved by other
#: samples' or processes' load is not a sleeping one
WALL_FACTOR = 2.0
#: what the backstop of the budget in force measures from: [monotonic start, run-queue wait
#: then (ns) or None, allowed wall clock]; and the descriptor on this thread's schedstat
_BACKSTOP: list[float | None] = [0.0, None, 0.0]
#: the kind of budget that ran out since the last ``arm``, or None: a call that caught the
#: timeout (a bare ``except:``) and returned anyway still ran out of time (see ``timed_out``)
_FIRED: list[str | None] = [None]
_SCHEDSTAT = [-1]
_KINDS = {
    int(signal.SIGXCPU): "cpu",
    int(signal.SIGPROF): "CPU time",
    int(signal.SIGALRM): "wall clock",
}
#: the signals a budget ends with, as ints for the C-level calls (``signal.signal`` converts
#: to and from enums: several microseconds a call, on every request)
_TIMER_SIGNALS = tuple(int(s) for s in (signal.SIGALRM, signal.SIGPROF, signal.SIGXCPU))


def _run_delay() -> int | None:
    """How long (ns) this thread has waited on a run queue so far (runnable, not running)."""
    if _SCHEDSTAT[0] < 0:
        return None
    try:
        return int(os.pread(_SCHEDSTAT[0], 128, 0).split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _starved(now: float) -> bool:
    """Whether the wall backstop fired only because the process waited for a CPU; if so, it
    is re-armed for the rest of its allowance."""
    start, waited0, allowed = cast("tuple[float, int | None, float]", _BACKSTOP)  # as above
    waited = _run_delay()
    if waited0 is None or waited is None:
        return False
    idle = now - start - max(0, waited - waited0) / 1e9  # wall clock not spent waiting
    if idle >= allowed - 0.001:
        return False
    signal.setitimer(signal.ITIMER_REAL, max(0.005, allowed - idle))
    return True


def _on_alarm(signum: int, frame: types.FrameType | None) -> None:
    if signum == signal.SIGALRM and _starved(time.monotonic()):
        return
    # disarm before raising: the timers and the CPU limit's SIGXCPU may fire together, and a
    # second alarm inside the except block would cut the report short
    disarm()
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.signal(signal.SIGPROF, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    _FIRED[0] = _KINDS.get(signum, "wall clock")
    raise _TestTimeout(_FIRED[0])


def arm(seconds: float) -> None:
    """Start a time budget of ``seconds`` of CPU time, with its wall-clock backstop (see
    ``WALL_FACTOR``): (re)install the handlers where changed, then the timers."""
    for sig in _TIMER_SIGNALS:
        if _signal.getsignal(sig) is not _on_alarm:
            _signal.signal(sig, _on_alarm)
    cpu = max(0.001, seconds)
    _FIRED[0] = None
    _BACKSTOP[0], _BACKSTOP[1], _BACKSTOP[2] = time.monotonic(), _run_delay(), cpu * WALL_FACTOR
    signal.setitimer(signal.ITIMER_PROF, cpu)
    signal.setitimer(signal.ITIMER_REAL, cpu * WALL_FACTOR)


def disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.setitimer(signal.ITIMER_PROF, 0)


def timed_out() -> Answer | None:
    """The timeout record if the budget ran out during a call that returned all the same
    (its code caught the timeout): its answer came too late, whatever it is. Honest code's
    safety net only (a reference with a bare ``except``); a sample can forge anything here."""
    return failure(_TestTimeout(_FIRED[0])) if _FIRED[0] is not None else None


def failure(exc: BaseException) -> Answer:
    """An exception raised by sample code, as the record the judge reads."""
    if isinstance(exc, _TestTimeout):
        out: Answer = {
            "e": "timeout",
            "m": f"test exceeded its time budget ({exc.args[0]})",
        }
        if exc.args and exc.args[0] == "cpu":
            out["cpu"] = True
        return out
    if isinstance(exc, MemoryError):
        return {"e": "memory_limit", "m": "MemoryError"}
    if isinstance(exc, SyntaxError):
        line = f" (line {exc.lineno})" if exc.lineno else ""
        return {"e": "syntax_error", "m": short(f"{type(exc).__name__}: {exc.msg}{line}")}
    if isinstance(exc, SystemExit):
        return {
            "e": "runtime_error",
            "m": f"the sample exited (SystemExit: {_safe_repr(exc.code)})",
        }
    name = _type_name(type(exc))
    try:
        text = str(exc)
    except BaseException:  # a sample's __str__ may raise or hang: the message is not worth it
        text = ""
    out = {"e": "runtime_error", "m": short(f"{name}: {text}" if text else name), "x": name}
    bases = _builtin_bases(type(exc))
    if bases:
        out["xb"] = bases
    return out


_TYPE_NAME = type.__dict__["__name__"]
_MRO = type.__dict__["__mro__"]
#: the builtin exception classes, by identity (captured before any sample runs)
_BUILTIN_EXC = {
    id(x): (n, x)
    for n, x in vars(builtins).items()
    if isinstance(x, type) and issubclass(x, BaseException) and not n.startswith("_")
}


def _builtin_bases(t: type) -> list[str]:
    """The nearest builtin exception classes of ``t`` (``class E(ValueError)``: ValueError), by
    the real MRO, so that the judge can raise an exception a test's ``except ValueError``
    catches. The sample could raise a ValueError itself: a name here gives it nothing more."""
    out: list[tuple[str, type]] = []
    try:
        mro = _MRO.__get__(t)
    except Exception:
        return []
    for cls in mro:
        found = _BUILTIN_EXC.get(id(cls))
        if found is None or found[1] is not cls:
            continue
        if not any(issubclass(kept, cls) for _, kept in out):  # builtins only: C checks
            out.append(found)
        if len(out) >= 4:
            break
    return [n for n, _ in out]


def _type_name(t: type) -> str:
    try:
        name = _TYPE_NAME.__get__(t)
    except Exception:
        return "?"
    return name[:100] if type(name) is str else "?"


def _safe_repr(value: object) -> str:
    try:
        return short(repr(value), 100) if type(value) in (int, str, type(None)) else "..."
    except Exception:
        return "?"


def _frame_depth() -> int:
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back  # type: ignore[assignment]
    return depth


class _Server:
    """W's table of the sample's objects the judge holds references to, and its ops.

    One object has one reference number for the whole job (``ids``), so the judge's stand-in
    for it is one object too (``x is x``, ``type(p) is Point``)."""

    def __init__(self, ns: dict[str, object]) -> None:
        self.ns = ns
        #: unchecked: the judge's requests operate on them (call, iterate, index...) as they
        #: come, and what fails at run time is the sample's failure, as in plain Python
        self.refs: dict[int, Any] = {}
        self.ids: dict[int, int] = {}  # id(object) -> its reference (refs keeps it alive)
        self.next_ref = 1

    def ref(self, value: object) -> int | None:
        """The reference number of a sample's object (a new one the first time), or None."""
        ref = self.ids.get(id(value))
        if ref is not None and self.refs.get(ref) is value:
            return ref
        if len(self.refs) >= MAX_REFS:
            return None
        ref = self.next_ref
        self.next_ref += 1
        self.refs[ref] = value
        self.ids[id(value)] = ref
        return ref

    def tag(self, value: object) -> list[Wire] | None:
        """A reference inside data (``{"$r": [ref, type name, protocol flags]}``)."""
        ref = self.ref(value)
        return None if ref is None else [ref, _type_name(type(value)), _protocols(value)]

    def result(self, value: object, mixed: bool = True) -> Answer:
        """Data (with references to the sample's objects inside it when ``mixed``), or a
        reference to the whole value. A case's output is never mixed: it must be data."""
        try:
            return {"v": codec.to_wire(value, self.tag if mixed else None)}
        except codec.NonData as exc:
            if exc.type_name == "oversized value":
                return {"e": "nondata", "m": str(exc)}
            # not data, or nested too deeply to be (``g(f(x))`` still works: by reference)
            ref = self.ref(value)
            if ref is None:
                return {"e": "nondata", "m": "too many objects held for the judge"}
            return {"r": ref, "ty": _type_name(type(value)), "f": _protocols(value)}
        except (ValueError, RecursionError) as exc:  # e.g. an int too long to write
            return {"e": "nondata", "m": short(f"{type(exc).__name__}: {exc}")}

    def binop(self, req: Ask) -> object:
        a, b = self.refs[req["r"]], self.arg(req["a"])
        fn = _BINOPS[req["o"]]
        return fn(b, a) if req.get("rev") else fn(a, b)

    def deref(self, body: Wire) -> object:
        if type(body) is not int or body not in self.refs:
            raise codec.WireError("unknown reference")
        return self.refs[body]

    def arg(self, w: Wire) -> Any:  # Any: as refs (it is one, or data holding them)
        """A value from the judge: data, references to the sample's objects inside it."""
        return codec.from_wire(w, ref=self.deref)

    def changed(self, req: Ask, args: list[object], kwargs: dict[str, object]) -> list[list[Wire]]:
        """The arguments a call changed in place, as ``[[index or name, wire], ...]``: the
        judge copies them back into the test's own values (``f(lst)`` sorting ``lst``)."""
        out: list[list[Wire]] = []
        sent = [*enumerate(cast("list[Wire]", req.get("a", []))), *req.get("k", [])]
        for key, wire in sent:
            value = args[key] if type(key) is int else kwargs.get(cast(str, key))  # a name
            if type(value) not in _MUTABLE:
                continue
            try:  # first as the judge wrote it (a reference as its number), then in full
                if codec.to_wire(value, self.known) == wire:
                    continue
                out.append([key, codec.to_wire(value, self.tag)])
            except (codec.NonData, ValueError, RecursionError):
                continue  # no longer data: the test keeps its own value
        return out

    def known(self, value: object) -> int:
        """The number of an object the judge already holds a reference to, else -1."""
        ref = self.ids.get(id(value))
        return ref if ref is not None and self.refs.get(ref) is value else -1

    def handle(self, req: Ask) -> Answer:
        """Serve one request; its keys are its op's (see ``frames.Ask``: the casts say which)."""
        op = req["op"]
        if op == "get":
            out = []
            for name in req["n"]:
                if name in self.ns and not name.startswith("__"):
                    out.append(self.result(self.ns[name]))
                else:
                    out.append({"e": "missing"})
            return {"vals": out}
        budget = float(req.get("b") or 1.0)
        if op == "batch":  # one function, many argument lists: one round trip for all cases
            fn = self.refs[req["r"]]
            outs: list[str] = []  # each answer already as JSON: the frame is their sum
            size = 0
            for wire_args in cast("list[list[Wire]]", req["a"]):  # an argument list per case
                try:
                    decoded = [self.arg(a) for a in wire_args]  # codec work: not the budget's
                    arm(budget)
                    value = fn(*decoded)
                    disarm()
                    item = timed_out() or self.result(value, mixed=False)
                except BaseException as exc:  # the sample's failure on this case
                    disarm()
                    item = failure(exc)
                try:
                    text = json.dumps(item, separators=(",", ":"), allow_nan=False)
                except (ValueError, TypeError) as exc:
                    text = json.dumps({"e": "nondata", "m": short(str(exc))})
                if outs and size + len(text) > BATCH_BYTES:
                    break  # the judge asks again for the cases after this one
                outs.append(text)
                size += len(text)
                if item.get("cpu"):  # the CPU limit is per process: nothing more can run
                    break
            rid = json.dumps(req.get("id"))
            return {RAW: ('{"id":' + rid + ',"outs":[' + ",".join(outs) + "]}").encode()}
        try:
            if op != "call":
                arm(budget)
            if op == "call":
                fn = self.refs[req["r"]]
                args = [self.arg(a) for a in cast("list[Wire]", req.get("a", []))]
                kwargs = {cast(str, k): self.arg(v) for k, v in req.get("k", [])}  # names
                arm(budget)  # after decoding the arguments: the codec's work is not the budget's
                try:
                    value = fn(*args, **kwargs)
                except BaseException as exc:
                    disarm()
                    answer = failure(exc)
                else:
                    disarm()
                    answer = timed_out() or self.result(value)
                mut = self.changed(req, args, kwargs)
                return {**answer, "mut": mut} if mut else answer
            elif op == "attr":
                value = getattr(self.refs[req["r"]], cast(str, req["n"]))
            elif op == "iter":
                value = iter(self.refs[req["r"]])
            elif op == "next":
                it = self.refs[req["r"]]
                items: list[object] = []
                end = False
                for _ in range(int(req["m"])):
                    try:
                        items.append(next(it))
                    except StopIteration:
                        end = True
                        break
                disarm()
                return {"items": [self.result(x) for x in items], "end": end}
            elif op == "len":
                value = len(self.refs[req["r"]])
            elif op == "contains":
                value = self.arg(req["a"]) in self.refs[req["r"]]
            elif op == "getitem":
                value = self.refs[req["r"]][self.arg(req["a"])]
            elif op in ("str", "repr", "format"):
                obj = self.refs[req["r"]]
                if op == "format":
                    value = format(obj, cast(str, req["a"]))  # the format spec
                else:
                    value = str(obj) if op == "str" else repr(obj)
                value = str.__str__(value) if isinstance(value, str) else ""
            elif op == "binop":
                value = self.binop(req)
            elif op == "unop":
                value = _UNOPS[req["o"]](self.refs[req["r"]])
            elif op == "inst":
                value = isinstance(self.arg(req["a"]), self.refs[req["r"]])
                value = value is True
            elif op == "isa":  # the other way round: is the sample's object one of these
                value = isinstance(self.refs[req["r"]], self.arg(req["a"]))
                value = value is True
            elif op == "subc":
                value = issubclass(self.arg(req["a"]), self.refs[req["r"]])
                value = value is True
            elif op == "type":
                value = type(self.refs[req["r"]])
            elif op == "setattr":
                setattr(self.refs[req["r"]], cast(str, req["n"]), self.arg(req["a"]))
                value = None
            elif op == "delattr":
                delattr(self.refs[req["r"]], cast(str, req["n"]))
                value = None
            else:
                disarm()
                return {"e": "runtime_error", "m": f"unknown request {op!r}"}
            disarm()
        except BaseException as exc:  # the sample's failure on this call is its result
            disarm()
            return failure(exc)
        return self.result(value)


_BINOPS: dict[str, Callable[..., object]] = {
    name: getattr(operator, name if name not in ("and", "or") else f"{name}_")
    for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
                 "or", "xor", "lshift", "rshift", "eq", "ne", "lt", "le", "gt", "ge")
}  # fmt: skip
#: argument types a call may change in place (the judge copies the change back); tuples
#: and namedtuples too, for the mutable values inside them
_MUTABLE = frozenset(
    {list, dict, set, bytearray, tuple, codec._DEQUE, codec._COUNTER, codec._ODICT,
     codec._DDICT, codec._ARRAY}
)  # fmt: skip
_UNOPS: dict[str, Callable[..., object]] = {
    "neg": operator.neg,
    "pos": operator.pos,
    "abs": abs,
    "invert": operator.invert,
    "int": int,
    "float": float,
    "index": operator.index,
}


def _protocols(value: object) -> str:
    """Which of Python's protocol methods the value's type has, for the judge's stand-in."""
    t = type(value)
    flags = "c" if callable(value) else ""
    for flag, name in (("i", "__iter__"), ("n", "__next__"), ("l", "__len__"),
                       ("k", "__contains__"), ("g", "__getitem__")):  # fmt: skip
        try:
            if getattr(t, name, None) is not None:
                flags += flag
        except Exception:  # a metaclass may raise: then the judge sees no such method
            pass
    return flags


def run_worker(fd: int, job: WorkerJob) -> None:
    """Load the sample, say so, then answer the judge's requests until it says ``bye``.

    Runs after privileges are dropped; everything here is forgeable by the sample, which is
    why only values (never verdicts) are sent.
    """
    send, recv = _make_channel(fd)
    write, frame = frames.write_all, frames.raw_frame

    def send_raw(data: bytes) -> None:
        write(fd, frame(data))

    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGPROF, _on_alarm)
    signal.signal(signal.SIGXCPU, _on_alarm)
    try:  # the wall backstop's measure of starvation (see WALL_FACTOR); none: plain wall clock
        _SCHEDSTAT[0] = os.open("/proc/thread-self/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        _SCHEDSTAT[0] = -1
    send(
        {"t": "ready"}
    )  # before any sample code: a worker that dies earlier is the sandbox's fault
    # the sample gets the interpreter's usual recursion depth above the frames of this harness
    sys.setrecursionlimit(sys.getrecursionlimit() + _frame_depth() + 8)
    module = types.ModuleType("__sample__")
    sys.modules["__sample__"] = module  # dataclasses, pickle and typing look their module up
    ns = module.__dict__
    ns["__builtins__"] = builtins
    try:
        arm(float(job["load_s"]))
        if job.get("setup_imports"):  # only the setup's imports: its helpers stay the judge's
            imports = cast(str, job["setup_imports"])  # there: just checked
            exec(compile(imports, "<setup>", "exec", dont_inherit=True), ns)
        exec(compile(job["code"], "<sample>", "exec", dont_inherit=True), ns)
        disarm()
    except BaseException as exc:  # the sample's exit, crash or timeout is a result
        disarm()
        rec = failure(exc)
        if rec["e"] != "syntax_error":
            rec["m"] = "loading the sample: " + rec["m"]
        send(
            {
                "t": "load",
                "cat": rec["e"],
                "msg": rec["m"],
                **({"cpu": True} if rec.get("cpu") else {}),
            }
        )
        return
    server = _Server(ns)
    if job.get("prefetch"):  # the judge's first question, answered with the load record
        send({"t": "load", "vals": server.handle({"op": "get", "n": job["prefetch"]})["vals"]})
    else:
        send({"t": "load"})
    while True:
        try:
            req = recv()
        except (EOFError, OSError, ValueError):
            return
        if type(req) is not dict or req.get("op") == "bye":
            return
        ask = cast("Ask", req)  # the judge's (a malformed one fails as a bad request below)
        rid = req.get("id")  # every answer names its request: the judge checks it is its own
        if req.get("op") == "probe":
            send({"outs": _run_probe(ask, ns), "id": rid})
            continue
        try:
            answer = server.handle(ask)
            if RAW in answer:
                send_raw(answer[RAW])  # the id is in it
            else:
                answer["id"] = rid
                send(answer)
        except (KeyError, TypeError, codec.WireError) as exc:
            send({"e": "runtime_error", "m": short(f"bad request: {exc}"), "id": rid})


def _run_probe(req: Ask, ns: dict[str, object]) -> list[dict[str, Wire]]:
    """Call the entry point on every probe input, each under its own timer; record, never judge.

    Each output is ``{"v": wire value}``, ``{"h": sha256 hex}`` for one whose JSON is longer
    than ``PROBE_OUTPUT_CAP``, or ``{"e": what went wrong}`` (the exception's type name,
    ``timeout``, ``nondata``). Arguments are decoded afresh for each call, so a sample
    that mutates its inputs changes nothing for the next call.
    """
    fn = ns.get(req["f"])  # type: ignore[arg-type]  # None (no entry point): not found
    budget = float(req["b"])
    inputs = req["in"]
    outs: list[dict[str, Wire]] = []
    for args in inputs:
        if not callable(fn):
            outs.append({"e": "NameError"})
            continue
        try:
            arm(budget)
            value = codec.to_wire(fn(*codec.from_wire(args)))
            text = json.dumps(value, separators=(",", ":"), sort_keys=True)
            disarm()
            if len(text) > PROBE_OUTPUT_CAP:  # keeps the record small
                outs.append({"h": hashlib.sha256(text.encode()).hexdigest()})
            else:
                outs.append({"v": value})
        except BaseException as exc:  # the sample's failure on this input is its behaviour
            disarm()
            if isinstance(exc, _TestTimeout):
                outs.append({"e": "timeout"})
                if exc.args and exc.args[0] == "cpu":  # nothing more can run in this process
                    outs.extend({"e": "timeout"} for _ in range(len(inputs) - len(outs)))
                    break
            elif isinstance(exc, codec.NonData):
                outs.append({"e": "nondata"})
            else:
                outs.append({"e": _type_name(type(exc)) or "?"})
    return outs


#: a probe output longer than this (JSON characters) travels as its SHA-256 only
PROBE_OUTPUT_CAP = 64 << 10


def _make_channel(fd: int) -> tuple[Callable[[object], None], Callable[[], Wire]]:
    # bound before the sample runs
    write, encode, read = frames.write_all, frames.encode_frame, frames.read_frame

    def send(obj: object) -> None:
        write(fd, encode(obj))

    def recv() -> Wire:
        return read(fd)

    return send, recv
