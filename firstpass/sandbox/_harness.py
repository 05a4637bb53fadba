"""The worker's side of the sandbox (stdlib only): framing, and the loop that serves the judge.

Trust split (see docs/sandbox.md): the *worker* (W) loads the sample and answers the judge's
requests — "call this name with these plain-data arguments", "read this attribute" — with plain
data (:mod:`_codec`), or with a numbered reference when a value is not data. It never sees a
test, an expected value or a verdict. The *judge* (J, :mod:`_judge`) evaluates every assert
itself, with its own builtins and the spec's setup; names the sample defines are stubs there.
Everything in W is forgeable by the sample, which is why W only ever sends values.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import operator
import os
import signal
import struct
import sys
import types
from typing import Any

try:  # imported as firstpass.sandbox._harness by the proxy, as a top-level module by the zygote
    from . import _codec
except ImportError:  # pragma: no cover - the zygote's import path
    import _codec  # type: ignore[no-redef]

MSG_MAX = 300
FRAME = struct.Struct(">I")
#: the largest frame between the proxy and the zygote (reference outputs travel in one)
MAX_FRAME = 256 << 20
#: the largest frame the worker may send the judge (one value; a 2M-element list fits)
MAX_VALUE_FRAME = 128 << 20
#: how many non-data objects one worker keeps for the judge to use
MAX_REFS = 100_000
#: a batch of case answers stops growing past this (the judge asks again for the rest), so
#: that a frame holds many small values or one large one, never over MAX_VALUE_FRAME
BATCH_BYTES = 32 << 20
#: key of an answer that is already an encoded frame body
RAW = "__raw__"

CATEGORIES = (
    "syntax_error",
    "runtime_error",
    "assertion_failed",
    "wrong_output",
    "timeout",
    "memory_limit",
    "output_limit",
    "no_code",
    "unsupported",
    "sandbox_violation",
)


def short(text: str, limit: int = MSG_MAX) -> str:
    """Cut a message to ``limit`` characters (messages are for humans, not for logs of data)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def verdict(passed: bool, cat: str | None = None, msg: str | None = None) -> dict[str, Any]:
    return {"passed": passed, "error_type": None if passed else cat, "message": msg}


# --------------------------------------------------------------------------- framing


def encode_frame(obj: Any) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    return FRAME.pack(len(data)) + data


def raw_frame(data: bytes) -> bytes:
    return FRAME.pack(len(data)) + data


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_frame(fd: int, max_frame: int = MAX_FRAME) -> Any:
    """Blocking read of one frame (used only where blocking is the point: worker, judge)."""
    return json.loads(read_raw_frame(fd, max_frame))


def read_raw_frame(fd: int, max_frame: int = MAX_FRAME) -> bytes:
    head = read_exact(fd, FRAME.size)
    (size,) = FRAME.unpack(head)
    if size > max_frame:
        raise FrameTooLarge(size)
    return read_exact(fd, size)


class FrameTooLarge(ValueError):
    def __init__(self, size: int) -> None:
        self.size = size
        super().__init__(f"frame of {size} bytes is over the limit")


def read_exact(fd: int, n: int) -> bytes:
    chunks = []
    while n:
        chunk = os.read(fd, min(n, 1 << 20))
        if not chunk:
            raise EOFError("channel closed")
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


class FrameBuffer:
    """Incremental frame parser for a non-blocking reader; raises ValueError on garbage.

    ``raw`` frame indices are returned as bytes, undecoded (the zygote forwards them).
    """

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self.buf = bytearray()
        self.max_frame = max_frame
        self.count = 0
        self.raw: set[int] = set()

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
            out.append(body if self.count in self.raw else json.loads(body))
            self.count += 1
        return out

    @property
    def partial(self) -> bool:
        return bool(self.buf)


# --------------------------------------------------------------------------- the worker


class _TestTimeout(BaseException):
    """Raised by the alarm inside the worker; a BaseException so ``except Exception`` misses it."""


def _on_alarm(signum: int, frame: Any) -> None:
    # disarm before raising: the wall timer and the CPU limit's SIGXCPU often fire together, and
    # a second alarm inside the except block would cut the report short
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, signal.SIG_IGN)
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    raise _TestTimeout("cpu" if signum == signal.SIGXCPU else "wall")


def arm(seconds: float) -> None:
    """Start a time budget: (re)install the alarm handlers, then the wall timer."""
    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGXCPU, _on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.001, seconds))


def disarm() -> None:
    signal.setitimer(signal.ITIMER_REAL, 0)


def failure(exc: BaseException) -> dict[str, Any]:
    """An exception raised by sample code, as the record the judge reads."""
    if isinstance(exc, _TestTimeout):
        out: dict[str, Any] = {
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
    return {"e": "runtime_error", "m": short(f"{name}: {text}" if text else name), "x": name}


_TYPE_NAME = type.__dict__["__name__"]


def _type_name(t: type) -> str:
    try:
        name = _TYPE_NAME.__get__(t)
    except Exception:
        return "?"
    return name[:100] if type(name) is str else "?"


def _safe_repr(value: Any) -> str:
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
    """W's table of the sample's objects the judge holds references to, and its ops."""

    def __init__(self, ns: dict[str, Any]) -> None:
        self.ns = ns
        self.refs: dict[int, Any] = {}
        self.next_ref = 1

    def result(self, value: Any) -> dict[str, Any]:
        try:
            return {"v": _codec.to_wire(value)}
        except _codec.NonData as exc:
            if exc.type_name in ("oversized value", "too deeply nested value"):
                return {"e": "nondata", "m": str(exc)}
            if len(self.refs) >= MAX_REFS:
                return {"e": "nondata", "m": "too many objects held for the judge"}
            ref = self.next_ref
            self.next_ref += 1
            self.refs[ref] = value
            return {"r": ref, "ty": _type_name(type(value)), "f": _protocols(value)}
        except (ValueError, RecursionError) as exc:  # e.g. an int too long to write
            return {"e": "nondata", "m": short(f"{type(exc).__name__}: {exc}")}

    def binop(self, req: dict[str, Any]) -> Any:
        a, b = self.refs[req["r"]], self.arg(req["a"])
        fn = _BINOPS[req["o"]]
        return fn(b, a) if req.get("rev") else fn(a, b)

    def arg(self, w: Any) -> Any:
        if type(w) is dict and len(w) == 1 and "$r" in w:
            return self.refs[w["$r"]]
        return _codec.from_wire(w)

    def handle(self, req: dict[str, Any]) -> dict[str, Any]:
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
            for args in req["a"]:
                try:
                    arm(budget)
                    value = fn(*[self.arg(a) for a in args])
                    disarm()
                    item = self.result(value)
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
            return {RAW: ('{"outs":[' + ",".join(outs) + "]}").encode()}
        try:
            arm(budget)
            if op == "call":
                fn = self.refs[req["r"]]
                args = [self.arg(a) for a in req.get("a", [])]
                kwargs = {k: self.arg(v) for k, v in req.get("k", [])}
                value = fn(*args, **kwargs)
            elif op == "attr":
                value = getattr(self.refs[req["r"]], req["n"])
            elif op == "iter":
                value = iter(self.refs[req["r"]])
            elif op == "next":
                it = self.refs[req["r"]]
                items: list[Any] = []
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
                    value = format(obj, req["a"])
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
            else:
                disarm()
                return {"e": "runtime_error", "m": f"unknown request {op!r}"}
            disarm()
        except BaseException as exc:  # the sample's failure on this call is its result
            disarm()
            return failure(exc)
        return self.result(value)


_BINOPS = {
    name: getattr(operator, name if name not in ("and", "or") else f"{name}_")
    for name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and",
                 "or", "xor", "lshift", "rshift")
}  # fmt: skip
_UNOPS: dict[str, Any] = {
    "neg": operator.neg,
    "pos": operator.pos,
    "abs": abs,
    "invert": operator.invert,
    "int": int,
    "float": float,
    "index": operator.index,
}


def _protocols(value: Any) -> str:
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


def run_worker(fd: int, job: dict[str, Any]) -> None:
    """Load the sample, say so, then answer the judge's requests until it says ``bye``.

    Runs after privileges are dropped; everything here is forgeable by the sample, which is
    why only values (never verdicts) are sent.
    """
    send, recv = _make_channel(fd)
    write, frame = write_all, raw_frame

    def send_raw(data: bytes) -> None:
        write(fd, frame(data))

    signal.signal(signal.SIGALRM, _on_alarm)
    signal.signal(signal.SIGXCPU, _on_alarm)
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
            exec(compile(job["setup_imports"], "<setup>", "exec", dont_inherit=True), ns)
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
        if req.get("op") == "probe":
            send({"outs": _run_probe(req, ns)})
            continue
        try:
            answer = server.handle(req)
            if RAW in answer:
                send_raw(answer[RAW])
            else:
                send(answer)
        except (KeyError, TypeError, _codec.WireError) as exc:
            send({"e": "runtime_error", "m": short(f"bad request: {exc}")})


def _run_probe(req: dict[str, Any], ns: dict[str, Any]) -> list[dict[str, Any]]:
    """Call the entry point on every probe input, each under its own timer; record, never judge.

    Each output is ``{"v": wire value}``, ``{"h": sha256 hex}`` for one whose JSON is longer
    than ``PROBE_OUTPUT_CAP``, or ``{"e": what went wrong}`` (the exception's type name,
    ``timeout``, ``nondata``). Arguments are decoded afresh for each call, so a sample
    that mutates its inputs changes nothing for the next call.
    """
    fn = ns.get(req["f"])
    budget = float(req["b"])
    inputs = req["in"]
    outs: list[dict[str, Any]] = []
    for args in inputs:
        if not callable(fn):
            outs.append({"e": "NameError"})
            continue
        try:
            arm(budget)
            value = _codec.to_wire(fn(*_codec.from_wire(args)))
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
            elif isinstance(exc, _codec.NonData):
                outs.append({"e": "nondata"})
            else:
                outs.append({"e": _type_name(type(exc)) or "?"})
    return outs


#: a probe output longer than this (JSON characters) travels as its SHA-256 only
PROBE_OUTPUT_CAP = 64 << 10


def _make_channel(fd: int) -> Any:
    write, encode, read = write_all, encode_frame, read_frame  # bound before the sample runs

    def send(obj: Any) -> None:
        write(fd, encode(obj))

    def recv() -> Any:
        return read(fd)

    return send, recv


if __name__ == "__main__":  # pragma: no cover
    sys.exit("this module is loaded by the zygote")
