"""The async front: :class:`Sandbox` keeps a zygote running and hands it samples.

The proxy's event loop only ever writes a request frame and awaits the answer: all process
work (forks, rlimits, pipes, cleanup) happens in the zygote (``_zygote.py``), and the few
blocking steps here (uid-block lock file) run in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import fcntl
import functools
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
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from firstpass.errors import SandboxBusy, SandboxError, SpecError

from . import _contain, _harness, _judge
from ._extract import extract_code
from ._isolation import DEFAULT_HIDE, Isolation, detect_isolation
from ._limits import WALL_STRETCH, Limits
from ._result import SampleResult, TestResult
from ._spec import AssertSpec, Case, CasesSpec, TestSpec

if TYPE_CHECKING:  # firstpass.probe imports the sandbox's codec: no import cycle at run time
    from firstpass.probe import ProbeInputs

__all__ = ["Sandbox"]

_ZYGOTE = str(Path(__file__).with_name("_zygote.py"))
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
#: per-sandbox uid blocks; in a block, each zygote lane has 2 uids (worker, judge) per slot
UID_START = 61_000_000
UID_BLOCK = 1024
UID_BLOCKS = 256
#: zygote lanes: (site_packages, alt) -> lane; one-shot interpreters use LANES - 1
LANES = {(False, False): 0, (True, False): 1, (False, True): 2, (True, True): 3}
N_LANES = len(LANES) + 1
MAX_CONCURRENCY = UID_BLOCK // (_contain.UIDS_PER_SLOT * N_LANES)
#: how many resolved reference specs to keep
RESOLVED_CACHE = 4096
#: the run_many call a run() belongs to: its samples may share a judge (see judge_key in
#: _zygote), no other call's may
_REQUEST: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "firstpass_sandbox_request", default=None
)
#: runs of a reference before a case it gave no answer on (timeouts...) fails the resolution
RESOLVE_TRIES = 3
_LOCK_DIR = "/run/firstpass-sandbox"
#: how many bytes of return values (as JSON) a reference solution may produce over all its
#: cases; each later run of the spec carries them, so they cost every run of it
REFERENCE_ALLOWANCE = 16 << 20
#: the stdout+stderr a reference may print (a sample's default is 1 MB)
REFERENCE_OUTPUT_BYTES = 16 << 20
_log = logging.getLogger("firstpass.sandbox")


class _ZygoteDied(Exception):
    """The zygote ended; ``started`` says whether it had begun running the request."""

    def __init__(self, started: bool = False) -> None:
        self.started = started
        super().__init__("the sandbox process died")


class _Zygote:
    """One zygote process and the requests in flight on it."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.proc: asyncio.subprocess.Process | None = None
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.acked: set[int] = set()
        self.reader: asyncio.Task[None] | None = None
        self.errlog: asyncio.Task[None] | None = None
        self.pid = 0
        self.root = ""
        self.memory_bound = "per-process"
        self.alive = False
        self.stderr_tail = b""

    async def start(self) -> None:
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *self.argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env={},
                start_new_session=True,
            )
        except OSError as exc:
            raise SandboxError(f"cannot start the sandbox interpreter: {exc}") from exc
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.errlog = asyncio.create_task(self._drain_stderr(self.proc.stderr))
        try:
            hello = await asyncio.wait_for(self._read_frame(), 20)
        except (TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            await self.kill()
            tail = self.stderr_tail.decode(errors="replace").strip()[-500:]
            raise SandboxError(f"the sandbox did not start: {tail or exc!r}") from exc
        if not hello.get("ready"):
            await self.kill()
            raise SandboxError(f"the sandbox refused to start: {hello.get('error')}")
        self.pid, self.root, self.alive = int(hello["pid"]), str(hello["root"]), True
        self.memory_bound = str(hello.get("memory_bound") or "per-process")
        self.reader = asyncio.create_task(self._read_loop())

    async def _drain_stderr(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(1 << 16):
            self.stderr_tail = (self.stderr_tail + chunk)[-4096:]

    async def _read_raw(self) -> bytes:
        assert self.proc is not None and self.proc.stdout is not None
        head = await self.proc.stdout.readexactly(_harness.FRAME.size)
        (size,) = _harness.FRAME.unpack(head)
        if size > _harness.MAX_FRAME:
            raise ValueError("oversized frame from the zygote")
        return await self.proc.stdout.readexactly(size)

    async def _read_frame(self) -> Any:
        raw = await self._read_raw()
        if len(raw) > 1 << 20:  # a large answer is decoded off the event loop
            return await asyncio.to_thread(json.loads, raw)
        return json.loads(raw)

    async def _read_loop(self) -> None:
        try:
            while True:
                msg = await self._read_frame()
                if msg.get("has_outputs"):  # reference outputs follow in their own frame
                    msg["outputs"] = await self._read_frame()
                if msg.get("ack"):
                    self.acked.add(msg.get("id"))
                    continue
                self.acked.discard(msg.get("id"))
                fut = self.pending.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except (asyncio.IncompleteReadError, ValueError, ConnectionError):
            pass
        finally:
            self.alive = False
            for key, fut in self.pending.items():
                if not fut.done():
                    fut.set_exception(_ZygoteDied(started=key in self.acked))
            self.pending.clear()

    async def request(self, req: dict[str, Any]) -> dict[str, Any]:
        if not self.alive or self.proc is None or self.proc.stdin is None:
            raise _ZygoteDied()
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.pending[req["id"]] = fut
        try:
            self.proc.stdin.write(_harness.encode_frame(req))
            await self.proc.stdin.drain()
        except (ConnectionError, RuntimeError) as exc:
            self.pending.pop(req["id"], None)
            raise _ZygoteDied() from exc
        return await fut

    async def close(self, timeout: float = 10.0) -> None:
        if self.proc is None:
            return
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), timeout)
        except TimeoutError:
            await self.kill()
        await self._finish_tasks()

    async def kill(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, 9)
            await self.proc.wait()
        self.alive = False
        await self._finish_tasks()

    async def _finish_tasks(self) -> None:
        for task in (self.reader, self.errlog):
            if task is not None and not task.done():
                try:
                    await asyncio.wait_for(task, 5)
                except TimeoutError:
                    task.cancel()


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


class Sandbox:
    """Run untrusted answers against test specs, isolated, in parallel (``concurrency`` at once).

    Use as ``async with Sandbox() as sb: await sb.run(answer, spec)``. ``isolation`` forces a
    level (``"auto"`` picks the strongest available); ``hide`` lists host paths mounted over
    with an empty read-only tmpfs inside the sandbox (data sets with reference answers, say).
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
        self._zygotes: dict[tuple[bool, bool], _Zygote] = {}
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
        self._mounts: dict[bool, dict[str, list[str]]] = {}
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
                "keep": list(await asyncio.to_thread(_contain.keep_paths, hide, sp, _PACKAGE_DIR)),
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
        n = _contain.UIDS_PER_SLOT * self.concurrency * N_LANES
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
        return frozenset(self.uid_range[:: _contain.UIDS_PER_SLOT])

    @property
    def zygote_pid(self) -> int | None:
        """The running zygote's pid (its private /tmp is ``/proc/<pid>/root/tmp``)."""
        zyg = self._zygotes.get((False, False))
        return zyg.pid if zyg is not None and zyg.alive else None

    def _argv(self, site_packages: bool, *, alt: bool = False, oneshot: bool = False) -> list[str]:
        assert self._iso is not None
        cfg: dict[str, Any] = {
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
        return self._iso.command([sys.executable, *flags, _ZYGOTE, json.dumps(cfg)])

    async def _zygote(self, site_packages: bool, alt: bool = False) -> _Zygote:
        async with self._zygote_lock:
            key = (site_packages, alt)
            zyg = self._zygotes.get(key)
            if zyg is not None and zyg.alive:
                return zyg
            if zyg is not None:
                self._deaths.append(time.monotonic())
                self._restarts += 1
                await zyg.kill()
            zyg = _Zygote(self._argv(site_packages, alt=alt))
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
        sha = hashlib.sha256(found.code.encode()).hexdigest()
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
            req = self._request(found.code, spec, ep)
            if judge_key is not None:
                req["judge_key"] = judge_key
            if probe is not None:
                req["probe"] = [list(a) for a in probe.args]
                req["probe_s"] = float(probe.per_input_s)
                req["probe_entry"] = probe.entry_point
            resp = await self._submit(req, limits)
            tests = self._tests(resp, spec.n_tests)
            behaviour = _behaviour(resp, len(probe.args)) if probe is not None else None
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

    @staticmethod
    def _request(code: str, spec: TestSpec, entry_point: str | None) -> dict[str, Any]:
        if isinstance(spec, AssertSpec):
            # no entry point: a spec naming only builtins may test the sample's `sum`
            ep = (
                entry_point
                or spec.entry_point
                or _judge.infer_entry_point(spec.asserts, spec.setup, code)
            )
            return {
                "op": "run",
                "mode": "asserts",
                "code": code,
                "setup": spec.setup,
                "setup_imports": _setup_imports(spec.setup),
                "prefetch": _prefetch(spec.asserts, ep),
                "entry_point": ep,
                "tests": list(spec.asserts),
                # judged by the shared judge of cases jobs when its evaluation cannot change
                # that process (the judge checks again); else by its request's own
                "closed": _judge.closed_spec(spec.asserts, spec.setup),
            }
        return {
            "op": "run",
            "mode": "cases",
            "code": code,
            "setup": spec.setup,
            "setup_imports": _setup_imports(spec.setup),
            "prefetch": [entry_point or spec.entry_point],
            "entry_point": entry_point or spec.entry_point,
            "atol": spec.atol,
            "tests": [list(c.args) for c in spec.cases],
            "expected": [c.expected for c in spec.cases],
        }

    @staticmethod
    def _tests(resp: dict[str, Any], n: int) -> tuple[TestResult, ...]:
        verdicts = resp.get("tests")
        if not isinstance(verdicts, list) or len(verdicts) != n:
            raise SandboxError("the sandbox answered with the wrong number of test results")
        return tuple(
            TestResult(
                index=i,
                passed=bool(v["passed"]),
                error_type=v.get("error_type"),
                message=v.get("message"),
            )
            for i, v in enumerate(verdicts)
        )

    async def _submit(
        self, req: dict[str, Any], limits: Limits, *, alt: bool = False
    ) -> dict[str, Any]:
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

    def _release(self, slot: int, task: asyncio.Future[Any]) -> None:
        self._free(slot)
        if not task.cancelled():
            task.exception()  # retrieved: nobody awaits an abandoned run

    async def _submit_on(
        self, slot: int, req: dict[str, Any], limits: Limits, alt: bool
    ) -> dict[str, Any]:
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
            except _ZygoteDied:
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

    async def _oneshot(self, req: dict[str, Any], limits: Limits) -> dict[str, Any]:
        """A fresh interpreter for one request: the fallback while zygotes keep dying."""
        zyg = _Zygote(self._argv(limits.site_packages, oneshot=True))
        await zyg.start()
        try:
            return await asyncio.wait_for(
                zyg.request({**req, "sweep_first": True}), _answer_within(limits)
            )
        except _ZygoteDied:
            raise SandboxError(
                "a one-shot sandbox interpreter died while running this sample"
            ) from None
        except TimeoutError:
            await zyg.kill()
            raise SandboxError("a one-shot sandbox interpreter stopped answering") from None
        finally:
            await zyg.close()

    # ---- reference outputs

    async def resolve(self, spec: CasesSpec, limits: Limits | None = None) -> CasesSpec:
        """Fill in expected values by running ``spec.reference`` (cached per spec digest).

        The reference runs twice, in two zygotes (two interpreters, so two string-hash seeds:
        set-order-dependent outputs differ). A case is dropped (listed in ``dropped``, the
        reason in ``dropped_why``) only for a property of the reference: it raised, exited,
        returned non-data, answered differently in the two runs, or went over the output
        allowance. A case that failed by accident (a timeout or the memory limit on a loaded
        host, a worker killed, a sandbox restart) is run again, up to ``RESOLVE_TRIES`` times;
        if it still has no answer, ``SpecError`` says so and nothing is cached, so the next
        use tries again. Only a reference that fails every case for reasons of its own is a
        failure remembered for the spec.
        """
        if spec.resolved:
            return spec
        if spec.reference is None:
            raise SpecError("reference", "cases without expected values need a reference solution")
        key = spec.digest
        if key in self._resolved:
            self._resolved.move_to_end(key)
            return self._resolved[key]
        if key in self._resolve_failed:
            raise self._resolve_failed[key]
        lock = self._resolving.setdefault(key, asyncio.Lock())
        try:
            async with lock:
                if key in self._resolved:
                    return self._resolved[key]
                if key in self._resolve_failed:
                    raise self._resolve_failed[key]
                limits = limits or self.limits
                limits = dataclasses.replace(
                    limits, output_bytes=max(limits.output_bytes, REFERENCE_OUTPUT_BYTES)
                )
                req = {
                    "op": "run",
                    "mode": "outputs",
                    "code": spec.reference,
                    "setup": spec.setup,
                    "setup_imports": _setup_imports(spec.setup),
                    "entry_point": spec.entry_point,
                    "tests": [list(c.args) for c in spec.cases],
                    "allowance": REFERENCE_ALLOWANCE,
                }
                outcome = await self._reference_outcomes(spec, req, limits)
                unsettled = [i for i, o in outcome.items() if isinstance(o, _Transient)]
                if unsettled:  # never cached: a loaded host must not weaken a spec for good
                    raise SpecError(
                        "reference",
                        f"the reference gave no answer on {len(unsettled)} case(s) (first: "
                        f"case {unsettled[0]}, {outcome[unsettled[0]]}) in {RESOLVE_TRIES} "
                        "tries; the host may be overloaded: nothing was cached, the next use "
                        "tries again",
                    )
                cases, dropped, why = [], [], []
                for i, case in enumerate(spec.cases):
                    got = outcome[i]
                    if isinstance(got, _Value):
                        cases.append(Case(args=case.args, expected=got.value))
                    else:  # dropped (no case is still unsettled here)
                        dropped.append(i)
                        why.append(str(got))
                if not cases:
                    failed = SpecError(
                        "reference",
                        f"the reference solution failed on every case (first: {why[0]})",
                    )
                    self._resolve_failed[key] = failed
                    while len(self._resolve_failed) > RESOLVED_CACHE:
                        self._resolve_failed.popitem(last=False)
                    raise failed
                done = CasesSpec(
                    entry_point=spec.entry_point,
                    cases=tuple(cases),
                    atol=spec.atol,
                    reference=None,
                    setup=spec.setup,
                    dropped=tuple(dropped),
                    dropped_why=tuple(why),
                )
                self._resolved[key] = done
                while len(self._resolved) > RESOLVED_CACHE:
                    self._resolved.popitem(last=False)
                return done
        finally:  # a failed reference too: one lock per spec must not outlive its resolution
            self._resolving.pop(key, None)

    async def _reference_outcomes(
        self, spec: CasesSpec, req: dict[str, Any], limits: Limits
    ) -> dict[int, _Resolved]:
        """Each case's outcome, running the reference (in both interpreters) on the cases not
        settled yet until every case is, or ``RESOLVE_TRIES`` runs in a row settle nothing.

        Only the unsettled cases run again, so a spec whose cases together need more CPU than
        one process may use is resolved over several runs. A case that ran out of its own
        CPU-time budget in ``RESOLVE_TRIES`` runs is the reference's property (it needs more
        than a sample may use), so it is dropped; any other missing answer stays unsettled.
        """
        outcome: dict[int, _Resolved] = {}
        slow: dict[int, int] = {}
        todo = list(range(len(spec.cases)))
        idle = 0
        while todo and idle < RESOLVE_TRIES:
            sub = {**req, "tests": [req["tests"][i] for i in todo]}
            first, second = await asyncio.gather(
                self._submit(sub, limits), self._submit(sub, limits, alt=True)
            )
            settled = 0
            for j, i in enumerate(todo):
                got = _resolve_case(_output(first, j), _output(second, j))
                if isinstance(got, _Slow):
                    slow[i] = slow.get(i, 0) + 1
                    got = (
                        _Dropped(f"the reference ran out of its CPU-time budget ({got})")
                        if slow[i] >= RESOLVE_TRIES
                        else _Transient(str(got))
                    )
                outcome[i] = got
                settled += not isinstance(got, _Transient)
            todo = [i for i in todo if isinstance(outcome[i], _Transient)]
            idle = 0 if settled else idle + 1
        return outcome


def _answer_within(limits: Limits) -> float:
    """How long the zygote may take to answer one request: its hard deadline (the wall limit
    stretched for waiting on a CPU), the judge's grace, and a margin."""
    return (WALL_STRETCH + 1) * limits.wall_s + 15


@functools.lru_cache(maxsize=1024)
def _setup_imports(setup: str | None) -> str | None:
    """The setup's import lines, which the sample may use (its helpers stay the judge's)."""
    return _judge.setup_imports(setup)


@functools.lru_cache(maxsize=1024)
def _prefetch(asserts: tuple[str, ...], entry: str | None) -> list[str]:
    """What the worker reports with its load record (see ``_judge.prefetch_names``)."""
    return _judge.prefetch_names(asserts, entry)


def _behaviour(resp: dict[str, Any], n: int) -> tuple[str, tuple[str, ...]] | None:
    """The verifier's behaviour record: (digest of the output vector, one digest per input)."""
    rec = resp.get("behaviour")
    if not isinstance(rec, dict):
        return None
    digest, outputs = rec.get("digest"), rec.get("outputs")
    if not isinstance(digest, str) or not isinstance(outputs, list) or len(outputs) != n:
        return None
    return digest, tuple(str(o) for o in outputs)


def _output(resp: dict[str, Any], i: int) -> tuple[Any] | str | _Slow | None:
    """Case ``i`` of a reference run: ``(value,)``, the reason it failed for a reason of the
    reference's own (a str), ``_Slow`` (it used up its own CPU-time budget), or None (no
    answer: an accident of the host, or the process's CPU ran out on earlier cases)."""
    outputs = resp.get("outputs")
    tests = resp.get("tests")
    if not isinstance(outputs, list) or not isinstance(tests, list) or i >= len(outputs):
        return None
    out = outputs[i]
    if tests[i].get("passed"):  # a value came back: None too is a value (null on the wire)
        return (out,)
    if isinstance(out, dict) and set(out) == {_judge.DROP}:
        return str(out[_judge.DROP])
    if isinstance(out, dict) and set(out) == {_judge.SLOW}:
        return _Slow(str(out[_judge.SLOW]))
    return None


@dataclasses.dataclass(frozen=True)
class _Value:
    value: Any


@dataclasses.dataclass(frozen=True)
class _Dropped:
    why: str

    def __str__(self) -> str:
        return self.why


@dataclasses.dataclass(frozen=True)
class _Transient:
    why: str

    def __str__(self) -> str:
        return self.why


@dataclasses.dataclass(frozen=True)
class _Slow:
    why: str

    def __str__(self) -> str:
        return self.why


_Resolved = _Value | _Dropped | _Transient | _Slow
_Run = tuple[Any] | str | _Slow | None


def _resolve_case(a: _Run, b: _Run) -> _Resolved:
    """One case from the reference's two runs (two hash seeds)."""
    for got in (a, b):
        if isinstance(got, str):
            return _Dropped(f"the reference failed: {got}")
    if isinstance(a, _Slow) and isinstance(b, _Slow):
        return a
    if not isinstance(a, tuple) or not isinstance(b, tuple):
        return _Transient("no answer: a timeout, the memory limit or a killed worker")
    if a != b:
        return _Dropped("the reference answered differently in two runs (two hash seeds)")
    return _Value(a[0])
