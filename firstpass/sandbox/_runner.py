"""The async front: :class:`Sandbox` keeps a zygote running and hands it samples.

The proxy's event loop only ever writes a request frame and awaits the answer: all process
work (forks, rlimits, pipes, cleanup) happens in the zygote (``_child/``), and the few
blocking steps here (uid-block lock file) run in a thread. Beside it: ``_client.py`` (one
zygote process), ``_requests.py`` (what a request holds), ``_reference.py`` (``resolve``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import fcntl
import hashlib
import itertools
import json
import logging
import math
import os
import secrets
import sys
import time
from collections import OrderedDict, deque
from typing import IO, TYPE_CHECKING

from firstpass.errors import SandboxBusy, SandboxError, SpecError

from ._child.mounts import keep_paths
from ._child.uids import UIDS_PER_SLOT
from ._client import ZygoteDied, ZygoteProcess
from ._extract import extract_code
from ._isolation import DEFAULT_HIDE, ZYGOTE, Isolation, detect_isolation
from ._limits import WALL_STRETCH, Limits
from ._null import NullVerdict, null_programs
from ._reference import References
from ._requests import build_request, read_behaviour, read_tests
from ._result import SampleResult, TestResult
from ._spec import CasesSpec, ProbeInputs, TestSpec

if TYPE_CHECKING:
    from ._child.frames import Mounts, Response, RunRequest, ZygoteConfig

__all__ = ["Sandbox"]

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: per-sandbox uid blocks; in a block, each zygote lane has 2 uids (worker, judge) per slot
UID_START = 61_000_000
UID_BLOCK = 1024
UID_BLOCKS = 256
#: zygote lanes: (site_packages, alt) -> lane; one-shot interpreters use LANES - 1
LANES = {(False, False): 0, (True, False): 1, (False, True): 2, (True, True): 3}
N_LANES = len(LANES) + 1
MAX_CONCURRENCY = UID_BLOCK // (UIDS_PER_SLOT * N_LANES)
#: the run_many call a run() belongs to: its samples may share a judge (see judge_key in
#: _child/sharing.py), no other call's may
_REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "firstpass_sandbox_request", default=None
)
_LOCK_DIR = "/run/firstpass-sandbox"
_log = logging.getLogger("firstpass.sandbox")


def _lock_uid_block() -> tuple[int, IO[str]]:
    """Claim a uid block no other sandbox on this host holds (blocking: run in a thread)."""
    os.makedirs(_LOCK_DIR, mode=0o700, exist_ok=True)
    for block in range(UID_BLOCKS):
        handle = open(os.path.join(_LOCK_DIR, f"uids-{block}.lock"), "w")  # noqa: SIM115
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        return UID_START + block * UID_BLOCK, handle
    raise SandboxError(f"all {UID_BLOCKS} sandbox uid blocks are in use on this host")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SandboxStats:
    """A snapshot of the sandbox's load: ``busy`` of ``slots`` run a sample now;
    ``zygote_restarts`` counts dead zygotes replaced since start (each one a fault to look at)."""

    slots: int
    busy: int
    zygote_restarts: int


class Sandbox(References):
    """Run untrusted answers against test specs, isolated, in parallel (``concurrency`` at once).

    Use as ``async with Sandbox() as sb: await sb.run(answer, spec)``. ``isolation`` forces a
    level (``"auto"`` picks the strongest available); ``hide`` lists host paths mounted over
    with an empty read-only tmpfs inside the sandbox (data sets with reference answers, say).
    ``resolve`` (expected values from a reference solution) is :class:`~._reference.References`'.
    """

    def __init__(
        self,
        concurrency: int | None = None,
        limits: Limits | None = None,
        *,
        isolation: str = "auto",
        hide: tuple[str, ...] = (),
        max_queue: int | None = None,
        slot_timeout_s: float | None = None,
    ) -> None:
        self.concurrency = int(concurrency or os.cpu_count() or 1)
        #: samples allowed to wait for a slot, and how long each may wait (None: no bound);
        #: past either, ``run`` raises ``SandboxBusy`` instead of queueing (the server's 503)
        self.max_queue = max_queue
        self.slot_timeout_s = slot_timeout_s
        self._waiting = 0
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise SandboxError(f"concurrency must be between 1 and {MAX_CONCURRENCY}")
        self.limits = limits or Limits()
        self.hide = tuple(str(p) for p in hide)
        self._requested = isolation
        self._iso: Isolation | None = None
        self._uid_base: int | None = None
        self._uid_lock: IO[str] | None = None
        #: (site_packages, alt) -> zygote; the alt one has another hash seed (see resolve)
        self._zygotes: dict[tuple[bool, bool], ZygoteProcess] = {}
        self._zygote_lock = asyncio.Lock()
        self._deaths: list[float] = []
        self._restarts = 0
        self._slots: asyncio.Queue[int] = asyncio.Queue()
        #: samples waiting for a slot, oldest first: a freed slot is handed to the first
        self._slot_waiters: deque[asyncio.Future[int]] = deque()
        self._dirty: set[int] = set()
        self._ids = itertools.count(1)
        self._resolved: OrderedDict[str, CasesSpec] = OrderedDict()  # LRU, RESOLVED_CACHE long
        self._resolving: dict[str, asyncio.Lock] = {}
        self._started = False
        self._closing = False
        self._mounts: dict[bool, Mounts] = {}
        #: spec digest -> why its reference failed (a failure is not re-run per sample)
        self._resolve_failed: OrderedDict[str, SpecError] = OrderedDict()

    # ---- lifecycle

    async def __aenter__(self) -> Sandbox:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Probe isolation, claim uids and start the zygote (``async with`` does this)."""
        if self._started:
            return
        self._closing = False
        self._iso = await detect_isolation(self._requested)
        hide = tuple(dict.fromkeys((*DEFAULT_HIDE, *self.hide)))
        missing = [p for p in self.hide if not await asyncio.to_thread(os.path.lexists, p)]
        if missing:
            raise SandboxError(f"hide= names a path that does not exist: {missing[0]}")
        self._mounts = {
            sp: {
                "hide": list(self.hide),
                "default_hide": list(DEFAULT_HIDE),
                "keep": list(await asyncio.to_thread(keep_paths, hide, sp, _PACKAGE_DIR)),
            }
            for sp in (False, True)
        }
        if self._iso.drop_uid:
            self._uid_base, self._uid_lock = await asyncio.to_thread(_lock_uid_block)
        for slot in range(self.concurrency):
            self._slots.put_nowait(slot)
        self._started = True
        await self._zygote(self.limits.site_packages)

    async def aclose(self) -> None:
        """Stop the zygotes (they kill whatever still runs) and release the uid block.

        Runs still in flight then raise ``SandboxError`` (no verdict), never a failure of
        their sample."""
        self._closing = True
        for zyg in list(self._zygotes.values()):
            await zyg.close()
        self._zygotes.clear()
        if self._uid_lock is not None:
            await asyncio.to_thread(self._uid_lock.close)
            self._uid_lock = None
        self._started = False

    @property
    def stats(self) -> SandboxStats:
        """What ``/metrics`` reads: slots, how many are running a sample, zygote restarts."""
        busy = self.concurrency - self._slots.qsize() if self._started else 0
        return SandboxStats(slots=self.concurrency, busy=busy, zygote_restarts=self._restarts)

    @property
    def isolation(self) -> str:
        """The isolation level in force (``netns+uid``, ``netns``, ``uid`` or ``none``)."""
        if self._iso is None:
            raise SandboxError("the sandbox is not started: use 'async with Sandbox() as sb'")
        return self._iso.level

    @property
    def uid_range(self) -> range:
        """The uids this sandbox's samples and judges run as (empty without uid isolation)."""
        if self._uid_base is None:
            return range(0)
        n = UIDS_PER_SLOT * self.concurrency * N_LANES
        return range(self._uid_base, self._uid_base + n)

    @property
    def memory_bound(self) -> str:
        """How a sample's memory is bounded: ``cgroup2`` or ``cgroup1`` (all its processes
        together, scratch files included, under ``memory_mb + scratch_mb``), or
        ``per-process`` (only RLIMIT_AS per process: see docs/sandbox.md for the arithmetic)."""
        zyg = self._zygotes.get((self.limits.site_packages, False))
        return zyg.memory_bound if zyg is not None else "per-process"

    @property
    def worker_uids(self) -> frozenset[int]:
        """The uids samples run as (no process of these outlives its sample); the others in
        ``uid_range`` are judges', some of which live across jobs by design."""
        if self._uid_base is None:
            return frozenset()
        return frozenset(self.uid_range[::UIDS_PER_SLOT])

    @property
    def zygote_pid(self) -> int | None:
        """The running zygote's pid (its private /tmp is ``/proc/<pid>/root/tmp``)."""
        zyg = self._zygotes.get((False, False))
        return zyg.pid if zyg is not None and zyg.alive else None

    def _argv(self, site_packages: bool, *, alt: bool = False, oneshot: bool = False) -> list[str]:
        assert self._iso is not None
        cfg: ZygoteConfig = {
            "lane": N_LANES - 1 if oneshot else LANES[(site_packages, alt)],
            "uid_base": self._uid_base,
            "slots": self.concurrency,
            "private_tmp": self._iso.private_tmp,
            # a lane belongs to one zygote at a time (a restarted one sweeps what the dead one
            # left); one-shots share theirs, so each sweeps only its own slot
            "sweep_at_start": not oneshot,
            "limits": self.limits.to_wire(),
            "wall_stretch": WALL_STRETCH,
        }
        if self._iso.private_tmp:
            cfg["mounts"] = self._mounts[site_packages]
            cfg["keep"] = self._mounts[site_packages]["keep"]
            cfg["sample_ns"] = True
        flags = ["-I"] if site_packages else ["-I", "-S"]
        return self._iso.command([sys.executable, *flags, ZYGOTE, json.dumps(cfg)])

    async def _zygote(self, site_packages: bool, alt: bool = False) -> ZygoteProcess:
        async with self._zygote_lock:
            key = (site_packages, alt)
            zyg = self._zygotes.get(key)
            if zyg is not None and zyg.alive:
                return zyg
            if zyg is not None:
                self._deaths.append(time.monotonic())
                self._restarts += 1
                await zyg.kill()
            zyg = ZygoteProcess(self._argv(site_packages, alt=alt))
            await zyg.start()
            self._zygotes[key] = zyg
            return zyg

    def _crash_looping(self) -> bool:
        now = time.monotonic()
        self._deaths = [t for t in self._deaths if now - t < 60]
        return len(self._deaths) >= 3

    # ---- running samples

    async def run(
        self,
        answer: str,
        spec: TestSpec,
        limits: Limits | None = None,
        entry_point: str | None = None,
        *,
        probe: ProbeInputs | None = None,
    ) -> SampleResult:
        """Extract the code from ``answer`` and run it against ``spec``.

        With ``probe`` (``firstpass.probe.ProbeInputs``), the same worker process then calls
        ``probe.entry_point`` on each probe input (``probe.per_input_s`` each) and the result's
        ``behaviour`` is the digest of those outputs: recorded, never judged.
        A bad sample is a result, never an exception; ``SandboxError`` means the sandbox failed.
        Called by :meth:`run_many` for each of its samples (a subclass may wrap it).
        """
        t0 = time.perf_counter()
        judge_key = _REQUEST.get()
        if not self._started:
            raise SandboxError("the sandbox is not started: use 'async with Sandbox() as sb'")
        limits = limits or self.limits
        ep = entry_point or spec.entry_point
        found = extract_code(answer, ep)
        # surrogatepass: a model's answer can hold a lone surrogate (an upstream's "\ud800"
        # escape); it is a result (the code does not compile), never an exception here
        sha = hashlib.sha256(found.code.encode("utf-8", "surrogatepass")).hexdigest()
        if isinstance(spec, CasesSpec) and not spec.resolved:
            spec = await self.resolve(spec, limits)
        behaviour: tuple[str, tuple[str, ...]] | None = None
        restarts = 0
        if not found.code:
            tests = tuple(
                TestResult(
                    index=i,
                    passed=False,
                    error_type="no_code",
                    message="no code found in the answer",
                )
                for i in range(spec.n_tests)
            )
        else:
            req = build_request(found.code, spec, ep)
            if judge_key is not None:
                req["judge_key"] = judge_key
            if probe is not None:
                req["probe"] = [list(a) for a in probe.args]
                req["probe_s"] = float(probe.per_input_s)
                req["probe_entry"] = probe.entry_point
            resp = await self._submit(req, limits)
            tests = read_tests(resp, spec.n_tests)
            behaviour = read_behaviour(resp, len(probe.args)) if probe is not None else None
            restarts = int(resp.get("sandbox_restarts") or 0)
        return SampleResult.build(
            tests,
            isolation=self.isolation,
            wall_ms=(time.perf_counter() - t0) * 1000,
            extraction=found.rule,
            code_sha256=sha,
            behaviour=behaviour,
            sandbox_restarts=restarts,
            dropped_cases=(
                tuple(zip(spec.dropped, spec.dropped_why, strict=False))
                if isinstance(spec, CasesSpec)
                else ()
            ),
        )

    async def run_many(
        self,
        answers: list[str],
        spec: TestSpec,
        limits: Limits | None = None,
        entry_point: str | None = None,
        *,
        probe: ProbeInputs | None = None,
    ) -> list[SampleResult]:
        """Run several answers against one spec in parallel; results keep the answers' order.

        The first failure (``SandboxBusy``: a sample got no slot) ends the batch: the other
        samples stop waiting for slots (one already running finishes, its slot kept until then).

        The batch is one request: its samples may share a judge process on a slot (the spec's
        test code runs there), which no sample of another call ever does."""
        if isinstance(spec, CasesSpec) and not spec.resolved:
            spec = await self.resolve(spec, limits)
        token = _REQUEST.set(secrets.token_hex(8))
        try:  # each task copies the context as it is created: its run() sees the batch's key
            tasks = [
                asyncio.ensure_future(self.run(a, spec, limits, entry_point, probe=probe))
                for a in answers
            ]
        finally:
            _REQUEST.reset(token)
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()
            raise

    async def null_passes(self, spec: TestSpec, limits: Limits | None = None) -> NullVerdict | None:
        """Which null answer passes every test of ``spec`` (``"returns_none"`` first, then
        ``"raises"``), or None when both fail one: whether the tests carry any signal at all.

        The stubs (``_null.py``) run as samples do, on the same slots, in parallel with each
        other and with the request's samples; they never involve a sample, so none can fool it.
        When the sandbox cannot tell (``SandboxBusy``, ``SandboxError``, a reference that
        fails: ``SpecError``) and no stub passed, it returns ``"unknown"``, never None:
        could-not-tell must not license a skip.
        """
        if not self._started:
            raise SandboxError("the sandbox is not started: use 'async with Sandbox() as sb'")
        limits = limits or self.limits
        try:
            if isinstance(spec, CasesSpec) and not spec.resolved:
                spec = await self.resolve(spec, limits)
        except (SandboxError, SpecError):
            return "unknown"
        programs = null_programs(spec)
        key = secrets.token_hex(8)  # the two stubs may share a judge, as one request's samples

        async def passes(code: str) -> bool:
            req = build_request(code, spec, spec.entry_point)
            req["judge_key"] = key
            resp = await self._submit(req, limits)
            return all(t.passed for t in read_tests(resp, spec.n_tests))

        got = await asyncio.gather(*(passes(p.code) for p in programs), return_exceptions=True)
        for program, ok in zip(programs, got, strict=True):
            if ok is True:
                return program.kind
        for ok in got:  # SandboxBusy is a SandboxError; anything else is a bug of ours
            if isinstance(ok, BaseException) and not isinstance(ok, SandboxError):
                raise ok
        return "unknown" if any(isinstance(ok, BaseException) for ok in got) else None

    async def _submit(self, req: RunRequest, limits: Limits, *, alt: bool = False) -> Response:
        """Run ``req`` on a free slot. If the caller is cancelled, the slot stays taken until
        the zygote answers: its uid must not be reused while the sample may still run."""
        slot = await self._take_slot(limits)
        task = asyncio.ensure_future(self._submit_on(slot, req, limits, alt))
        try:
            return await asyncio.shield(task)
        finally:
            if task.done():
                self._free(slot)
            else:
                task.add_done_callback(lambda t: self._release(slot, t))

    async def _take_slot(self, limits: Limits) -> int:
        """A free slot, waiting at most ``slot_timeout_s`` behind at most ``max_queue`` others;
        ``SandboxBusy`` (retry after about one sample's wall time) when it cannot be had.

        First come, first served: a sample arriving while others wait queues behind them, and
        a freed slot is handed to the oldest waiter (``_free``), so arrivals cannot starve it."""
        if not self._slot_waiters and not self._slots.empty():
            return self._slots.get_nowait()
        retry = max(1.0, math.ceil(limits.wall_s))
        if self.max_queue is not None and self._waiting >= self.max_queue:
            raise SandboxBusy(
                f"the sandbox is busy: {self._waiting} samples already wait for its "
                f"{self.concurrency} slots ([sandbox] max_queue = {self.max_queue}); retry "
                "after a moment",
                retry_after_s=retry,
            )
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        self._waiting += 1
        got = False
        try:
            async with asyncio.timeout(self.slot_timeout_s):
                slot = await waiter
                got = True
                return slot
        except TimeoutError:
            raise SandboxBusy(
                f"the sandbox is busy: no slot came free within {self.slot_timeout_s:g} s "
                "([sandbox] slot_timeout_s); retry after a moment",
                retry_after_s=retry,
            ) from None
        finally:
            self._waiting -= 1
            if not got:
                if waiter.done() and not waiter.cancelled():
                    # handed a slot in the instant the wait ended (timed out, cancelled)
                    self._free(waiter.result())
                else:
                    waiter.cancel()
                    with contextlib.suppress(ValueError):
                        self._slot_waiters.remove(waiter)

    def _free(self, slot: int) -> None:
        """``slot`` is free: to the sample that has waited longest, else back to the pool."""
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(slot)
                return
        self._slots.put_nowait(slot)

    def _release(self, slot: int, task: asyncio.Future[Response]) -> None:
        self._free(slot)
        if not task.cancelled():
            task.exception()  # retrieved: nobody awaits an abandoned run

    async def _submit_on(self, slot: int, req: RunRequest, limits: Limits, alt: bool) -> Response:
        req = {
            **req,
            "id": next(self._ids),
            "slot": slot,
            "limits": limits.to_wire(),
            "sweep_first": slot in self._dirty,
        }
        restarts = 0
        for _attempt in range(2):
            if self._crash_looping():
                resp = await self._oneshot(req, limits)
                return {**resp, "sandbox_restarts": restarts}
            zyg = await self._zygote(limits.site_packages, alt)
            try:
                resp = await asyncio.wait_for(zyg.request(req), _answer_within(limits))
                self._dirty.discard(slot)
                if resp.get("aborted"):
                    raise SandboxError("the sandbox was closed while this sample ran: no verdict")
                if resp.get("fault"):  # never the sample's verdict: the sample never ran
                    raise SandboxError(
                        f"{resp['fault']} (a fault of the sandbox, not of the sample; the "
                        "zygote's stderr says more)"
                    )
                return {**resp, "sandbox_restarts": restarts} if restarts else resp
            except ZygoteDied:
                if self._closing:
                    raise SandboxError(
                        "the sandbox was closed while this sample ran: no verdict"
                    ) from None
                # the shared machinery died: never this sample's verdict. It is restarted, and
                # every sample it had in flight runs once more on the new one.
                self._dirty.add(slot)
                restarts += 1
                req = {**req, "id": next(self._ids), "sweep_first": True}
                _log.warning(
                    "firstpass sandbox: the zygote died with samples in flight (stderr: %r); "
                    "restarted, retrying them once",
                    zyg.stderr_tail.decode(errors="replace").strip()[-200:],
                )
            except TimeoutError:
                self._dirty.update(range(self.concurrency))
                await zyg.kill()
                raise SandboxError("the sandbox stopped answering; it has been restarted") from None
        raise SandboxError(
            "the sandbox died twice while running this sample (it has been restarted); "
            "no verdict was reached"
        )

    async def _oneshot(self, req: RunRequest, limits: Limits) -> Response:
        """A fresh interpreter for one request: the fallback while zygotes keep dying."""
        zyg = ZygoteProcess(self._argv(limits.site_packages, oneshot=True))
        await zyg.start()
        try:
            return await asyncio.wait_for(
                zyg.request({**req, "sweep_first": True}), _answer_within(limits)
            )
        except ZygoteDied:
            raise SandboxError(
                "a one-shot sandbox interpreter died while running this sample"
            ) from None
        except TimeoutError:
            await zyg.kill()
            raise SandboxError("a one-shot sandbox interpreter stopped answering") from None
        finally:
            await zyg.close()


def _answer_within(limits: Limits) -> float:
    """How long the zygote may take to answer one request: its hard deadline (the wall limit
    stretched for waiting on a CPU), the judge's grace, and a margin."""
    return (WALL_STRETCH + 1) * limits.wall_s + 15
