"""Length-prefixed JSON frames: how the proxy, Z, W and J talk (stdlib only).

One format for every channel, so that each reader bounds a frame before it reads it. The
records they carry are typed here, each as its sender builds it; a reader that does not trust
its sender (J reading W, Z reading J) takes a frame as plain :data:`~.codec.Wire` instead and
checks each field it uses.
"""

from __future__ import annotations

import json
import os
import struct
from typing import TYPE_CHECKING, NotRequired, TypedDict, cast

if TYPE_CHECKING:
    from .behaviour import Behaviour
    from .codec import Wire
    from .verdicts import Verdict

FRAME = struct.Struct(">I")
#: the largest frame between the proxy and the zygote (reference outputs travel in one)
MAX_FRAME = 256 << 20
#: the largest frame the worker may send the judge (one value; a 2M-element list fits)
MAX_VALUE_FRAME = 128 << 20


def encode_frame(obj: object) -> bytes:
    data = json.dumps(obj, separators=(",", ":"), allow_nan=False).encode()
    return FRAME.pack(len(data)) + data


def raw_frame(data: bytes) -> bytes:
    return FRAME.pack(len(data)) + data


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def read_frame(fd: int, max_frame: int = MAX_FRAME) -> Wire:
    """Blocking read of one frame (used only where blocking is the point: worker, judge)."""
    return cast("Wire", json.loads(read_raw_frame(fd, max_frame)))  # JSON gives nothing else


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

    def feed(self, data: bytes) -> list[Wire | bytes]:
        self.buf += data
        out: list[Wire | bytes] = []
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


# --------------------------------------------------------------------------- the records


class WireLimits(TypedDict):
    """A sample's limits as the front sends them (``Limits.to_wire``)."""

    cpu_s: float
    wall_s: float
    memory_mb: int
    file_size_mb: float
    nproc: int
    nofile: int
    output_bytes: int
    scratch_mb: int
    site_packages: bool
    test_s: NotRequired[float]  # each test's budget (the front never sets it: Z's default)


class Mounts(TypedDict):
    """The host paths a zygote covers, and those it binds back (``mounts.private_mounts``)."""

    hide: list[str]
    keep: list[str]
    default_hide: NotRequired[list[str]]


class ZygoteConfig(TypedDict, total=False):
    """One zygote's configuration, its command line's JSON (``Sandbox._argv``; ``probe``:
    only set up the mounts and exit, the isolation probe's)."""

    probe: bool
    mounts: Mounts
    lane: int
    uid_base: int | None
    slots: int
    private_tmp: bool
    sweep_at_start: bool
    limits: WireLimits
    wall_stretch: float
    keep: list[str]
    sample_ns: bool
    sample_netns: bool
    cgroups: bool
    tmp: str
    trace: bool


class RunRequest(TypedDict, total=False):
    """The front's request to run one sample (``_requests.build_request``; ``id``, ``slot``,
    ``limits`` and ``sweep_first`` are added as it is sent). Its keys depend on ``mode``."""

    op: str
    id: int
    slot: int
    limits: WireLimits
    sweep_first: bool
    mode: str  # asserts | cases | outputs
    code: str
    setup: str | None
    setup_imports: str | None
    entry_point: str | None
    prefetch: list[str]
    tests: list[Wire]  # per test: an assert's source (asserts), else its argument list
    closed: bool
    atol: float
    expected: list[Wire]
    allowance: int
    judge_key: str
    probe: list[list[Wire]]
    probe_s: float
    probe_entry: str


class Hello(TypedDict, total=False):
    """Z's first frame: ready (its pid, its private root, how memory is bounded), or why not."""

    ready: bool
    pid: int
    root: str
    memory_bound: str
    error: str


class Response(TypedDict, total=False):
    """Z's answer to a request (``Zygote.respond``; ``{"id", "ack"}`` as it takes one on), with
    what the front adds: the reference outputs (the frame after it), ``sandbox_restarts``."""

    id: int
    ack: bool
    tests: list[Verdict]
    wall_ms: float
    behaviour: dict[str, Wire]  # the judge's record as it sent it: the front checks it
    trace: dict[str, Wire]
    aborted: bool
    fault: str
    has_outputs: bool
    outputs: Wire
    sandbox_restarts: int


class Header(TypedDict):
    """Z's word to T that a job starts (with its descriptors), handed on to its W and J."""

    job: int
    slot: int
    uid: int | None
    judge_uid: int | None
    workdir: str
    limits: WireLimits
    judge_key: str


class WorkerJob(TypedDict):
    """What W loads (from Z, or from J when it did not fit W's socket)."""

    code: str
    load_s: float
    setup_imports: NotRequired[str | None]
    prefetch: NotRequired[list[str]]  # names to report with the load record


class JudgeJob(TypedDict, total=False):
    """Z's job for J (``Zygote.start_job``): the spec's side of one sample's run; ``code``
    only when Z did not write W's job into W's socket itself (``w_job_sent``)."""

    mode: str
    setup_imports: str | None
    setup: str | None
    entry_point: str | None
    tests: list[Wire]
    expected: list[Wire] | None
    atol: float | None
    per_test_s: float
    load_s: float
    allowance: int | None
    prefetch: list[str]
    probe: list[list[Wire]]
    probe_s: float
    probe_entry: str | None
    cpu_usage: list[str]  # the slot's CPU usage file and its unit (see ``link.Link``)
    w_job_sent: bool
    code: str


class JudgeResult(TypedDict, total=False):
    """J's answer to Z (``run_judge``), which Z reads as plain wire (J ran client code)."""

    ready: bool
    tests: list[Verdict | None]  # None: W ended before the test was judged
    load_failed: bool
    outputs: list[Wire]  # the reference's outputs (the frame after this one)
    behaviour: Behaviour | None
    gone: bool
    round_trips: int
    has_outputs: bool


#: J's request to W (``link.Link``, ``remote.Remote``): ``op`` says which keys it has and
#: their shape (``a``: the operand in wire form, a call's list of them, a batch's list of
#: argument lists, format's spec; ``n``: get's names, attr's name)
Ask = TypedDict(
    "Ask",
    {
        "op": str,
        "id": int,
        "r": int,  # the reference the op is on
        "a": "Wire",
        "k": "list[list[Wire]]",  # a call's keyword arguments, [name, wire] each
        "n": str | list[str],
        "o": str,  # an operator's name
        "rev": bool,
        "b": float,  # the budget (CPU seconds)
        "m": int,  # how many items next() may take
        "f": str | None,  # the probe's entry point
        "in": "list[list[Wire]]",  # the probe's argument lists
    },
    total=False,
)


class Answer(TypedDict, total=False):
    """W's answer to one request, as W builds it (J reads it as plain wire: W is the sample's).

    A value (``v``: data, with references inside where allowed), a reference to an object of
    the sample (``r``, its type's name ``ty``, protocol flags ``f``), or a failure (``e`` its
    category, ``m`` its message, ``x`` and ``xb`` the exception's class and builtin bases,
    ``cpu`` when the process's CPU limit was reached); ``mut``: a call's arguments it changed
    in place; ``vals``, ``items`` and ``end``, ``outs``: get's, next's and probe's records.
    """

    id: Wire
    v: Wire
    r: int
    ty: str
    f: str
    e: str
    m: str
    x: str
    xb: list[str]
    cpu: bool
    mut: list[list[Wire]]
    vals: list[Answer]
    items: list[Answer]
    end: bool
    outs: list[dict[str, Wire]]
    __raw__: bytes  # a batch's whole answer, already JSON (its id inside)
