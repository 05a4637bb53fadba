"""The judge's end of the channel to the worker: one request, one validated answer.

The wire protocol between J and W lives here (and in :mod:`.remote`, whose every operation is
one of these requests); what a test means is :mod:`.judge`'s. Stdlib only.
"""

from __future__ import annotations

import array
import contextlib
import json
import os
import signal
import time
from collections import Counter, OrderedDict, defaultdict, deque
from collections.abc import Iterable, Iterator
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from . import codec, frames
from .codec import Wire
from .failures import (
    Gone,
    JudgeTimeout,
    SampleError,
    SampleFailure,
    Unsupported,
    Violation,
    sample_error,
)
from .remote import Remote, brief_repr, encode_arg, remote_class
from .verdicts import CATEGORIES, short

if TYPE_CHECKING:
    from .frames import Ask

#: items fetched per round trip when the judge iterates a sample's iterator
ITER_BATCH = 4096
#: the most items the judge takes from one sample iterator (beyond: unsupported)
ITER_MAX = 20_000_000
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
EXCHANGE = [False, False]


def on_alarm(signum: int, frame: FrameType | None) -> None:
    """The judge's own CPU timer ran out: a timeout, deferred while an exchange is under way."""
    if EXCHANGE[0]:  # mid-exchange: raising now would leave a frame half sent or half read
        EXCHANGE[1] = True
        return
    signal.setitimer(signal.ITIMER_PROF, 0)
    raise JudgeTimeout()


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

    def __init__(self, fd: int, per_test_s: float, cpu_usage: list[str] | None = None) -> None:
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
        self.prefetched: dict[str, Wire] = {}
        #: reference number -> its one stand-in (the worker numbers each object once)
        self.remotes: dict[int, Remote] = {}
        self.mut: Wire = None  # the last answer's changed arguments

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

    def ask(self, req: Ask) -> dict[str, Wire]:
        if self.dead:
            raise SampleFailure("timeout", "the sample's CPU limit was reached", cpu=True)
        self.round_trips += 1
        self.seq += 1
        rid = req["id"] = self.seq
        asked = False
        spent = 0.0  # the judge's CPU time encoding the request and decoding the answer
        EXCHANGE[0] = True
        try:
            start = time.thread_time()
            data = frames.encode_frame(req)
            spent = time.thread_time() - start
            try:
                frames.write_all(self.fd, data)
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
            EXCHANGE[0] = False
        self._settle(spent)
        return ans

    def _answer(self) -> tuple[dict[str, Wire], float]:
        """One record from the worker, whole, and the judge's CPU time decoding it."""
        try:
            raw = frames.read_raw_frame(self.fd, frames.MAX_VALUE_FRAME)
            start = time.thread_time()
            ans = json.loads(raw)
            took = time.thread_time() - start
        except frames.FrameTooLarge as exc:
            raise Violation(
                f"the sample sent a value of {exc.size} bytes (limit {frames.MAX_VALUE_FRAME})"
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
        if EXCHANGE[1]:  # the judge's own timer ran out during the exchange
            EXCHANGE[1] = False
            if extra - spent <= 0.001:
                raise JudgeTimeout()
            signal.setitimer(signal.ITIMER_PROF, extra - spent)  # what decoding earned it
        elif extra > 0.001:
            left = signal.getitimer(signal.ITIMER_PROF)[0]
            if left > 0:
                signal.setitimer(signal.ITIMER_PROF, left + extra)
        self.check()

    def value(self, ans: dict[str, Wire]) -> object:
        """One answer as a value for the test: data, a :class:`Remote`, or the sample's failure."""
        self.mut = ans.get("mut")  # arguments a call changed in place (see ``copy_back``)
        if "v" in ans:
            try:
                return codec.from_wire(ans["v"], ref=self.tagged)
            except (codec.WireError, RecursionError, MemoryError) as exc:
                raise Violation(f"malformed value: {exc}") from None
        if "r" in ans:
            ref, ty, flags = ans["r"], ans.get("ty"), ans.get("f", "")
            if type(ref) is not int or type(ty) is not str or type(flags) is not str:
                raise Violation("malformed reference")
            return self.remote(ref, ty, flags)
        cat, msg = ans.get("e"), ans.get("m")
        if cat == "nondata":
            raise Unsupported(short(str(msg)))
        if cat not in CATEGORIES or type(msg) is not str:
            raise Violation("malformed failure record")
        if ans.get("cpu"):
            self.dead = True
        if cat in ("timeout", "memory_limit"):
            raise SampleFailure(cat, short(msg), cpu=bool(ans.get("cpu")))
        raise sample_error(ans.get("xb") or ans.get("x"), cat, short(msg))

    def remote(self, ref: int, ty: str, flags: str) -> Remote:
        """The stand-in for the worker's object ``ref``: one per object, made on first sight."""
        got = self.remotes.get(ref)
        if got is None:
            got = self.remotes[ref] = remote_class(flags)(self, ref, ty[:100])
        return got

    def tagged(self, body: Wire) -> Remote:
        """A reference inside a value (``{"$r": [ref, type name, flags]}``)."""
        if type(body) is not list or len(body) != 3:
            raise codec.WireError("malformed reference")
        ref, ty, flags = body
        if type(ref) is not int or type(ty) is not str or type(flags) is not str:
            raise codec.WireError("malformed reference")
        return self.remote(ref, ty, flags)

    def request(self, req: Ask) -> object:
        req["b"] = self.budget()
        return self.value(self.ask(req))

    # ---- what a Remote does

    def call(self, target: Remote, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        req: Ask = {
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

    def copy_back(self, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
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
                new = codec.from_wire(wire, ref=self.tagged)
            except (codec.WireError, RecursionError, MemoryError) as exc:
                raise Violation(f"malformed value: {exc}") from None
            _merge(old, new)

    def shown(self, args: tuple[object, ...], kwargs: dict[str, object]) -> str | None:
        """A call's arguments for the failure message (None once it has enough calls)."""
        if len(self.calls) >= 8:
            return None
        shown = [brief_repr(a) for a in args] + [f"{k}={brief_repr(v)}" for k, v in kwargs.items()]
        return ", ".join(shown)

    def note(self, target: Remote, shown: str | None, got: str) -> None:
        if shown is not None and len(self.calls) < 8:
            self.calls.append(f"{target._fp_name}({shown}) -> {got}")

    def iterate(self, target: Remote) -> Iterator[object]:
        it = self.request({"op": "iter", "r": target._fp_ref})
        if not isinstance(it, Remote):  # iter() of a sample object gave data: iterate that
            yield from iter(cast("Iterable[object]", it))  # data: iter() raises as in Python
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


def _merge(old: Any, new: Any) -> object:  # Any: dispatched on t, as the codec
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
