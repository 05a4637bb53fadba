"""Workers and judges forked ahead of their jobs: their isolation, then the job they serve.

T (:mod:`.template`) keeps one of each ready per slot; what happens inside one, from its fork
to its exit, is here. Stdlib only.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import signal
import socket
import sys
from typing import TYPE_CHECKING, cast

from . import codec
from .asserts import assert_uses
from .cgroups import cover_cgroup_files
from .compare import values_equal
from .frames import encode_frame, read_frame, write_all
from .judge import run_judge, trusted_namespace
from .namespaces import (
    enter_sample_namespaces,
    fork_sample,
    own_pid_namespace,
    slot_network_namespaces,
)
from .remote import brief_repr
from .rlimits import MAX_CPU_S, judge_limits, resident_limits, set_limits
from .seccomp import install_seccomp
from .sharing import DATA_KEY, shareable
from .syscalls import libc
from .uids import drop_privileges, slot_uid
from .worker import run_worker

if TYPE_CHECKING:
    from .cgroups import SlotCgroups
    from .frames import Header, JudgeJob, WireLimits, WorkerJob, ZygoteConfig

MAXFD = 4096
#: one network namespace per slot, as descriptors (see namespaces.slot_network_namespaces)
NETNS: list[int] = []
#: T's own PID namespace, to return to after forking a sample into a new one (root only)
PIDNS: int | None = None
#: a standby's scheduling niceness until its job arrives: forking and warming the next
#: request's judge must not take CPU from the samples running now
STANDBY_NICE = 19
#: jobs a judge serves (for its key) before it is replaced by a fresh fork (bounds its heap)
RESIDENT_JOBS = 1000


def prepare(cfg: ZygoteConfig) -> None:
    """Z, before it forks T: the namespaces every sample's fork enters (``PIDNS``, ``NETNS``)."""
    global PIDNS, NETNS
    if cfg.get("sample_ns") and cfg.get("uid_base") is not None:
        PIDNS = own_pid_namespace()
    if PIDNS is not None and cfg.get("sample_netns", True):
        with contextlib.suppress(OSError):  # else a namespace per sample (fork_standby)
            NETNS = slot_network_namespaces(int(cfg["slots"]))


class Standby:
    """A worker or judge forked ahead of its job, isolated and waiting for it on ``sock``.

    Why: namespaces, mounts and a fork cost milliseconds; done before the job arrives they
    are off its path. A standby holds nothing but its socket to T (it was forked from T, whose
    memory has no request in it) and is root until its job says go.
    """

    def __init__(self, role: str, slot: int, scratch_mb: int, pid: int, sock: socket.socket):
        self.role, self.slot, self.scratch_mb, self.pid, self.sock = (
            role,
            slot,
            scratch_mb,
            pid,
            sock,
        )
        #: a judge's key once it has a job (see judge_key): the only jobs it may take next
        self.key: str | None = None


def fork_standby(
    role: str, slot: int, cfg: ZygoteConfig, cgroups: SlotCgroups | None, scratch_mb: int
) -> Standby | None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if role == "w" and cfg.get("sample_ns") and PIDNS is not None:
        # the fast layout: the sample is T's own child and pid 1 of its namespace
        try:
            pid, workdir = fork_sample(
                PIDNS,
                scratch_mb=scratch_mb,
                keep=list(cfg.get("keep") or []),
                uid=slot_uid(cfg, slot, judge=False),
                # its slot's network namespace (or one of its own): in one shared with the
                # samples of other slots, /proc/net (socket counts, unix socket tables, the
                # ports a send autobinds) would be a channel between samples running together
                net=not NETNS and bool(cfg.get("sample_netns", True)),
                netns=NETNS[slot] if NETNS else None,
            )
        except OSError:
            pid, workdir = None, None
        if pid == 0:
            mine.close()
            worker_standby(theirs, slot, cfg, cgroups, scratch_mb, workdir=workdir)
        theirs.close()
        if pid is None:
            mine.close()
            return None
        _background(pid)
        return Standby(role, slot, scratch_mb, pid, mine)
    pid = fork_or_none()
    if pid == 0:
        mine.close()
        if role == "w":
            worker_standby(theirs, slot, cfg, cgroups, scratch_mb)
        judge_standby(theirs, slot, cfg, cgroups)
    theirs.close()
    if pid is None:
        mine.close()
        return None
    _background(pid)
    return Standby(role, slot, scratch_mb, pid, mine)


def _background(pid: int) -> None:
    """A standby sets itself up (namespaces, mounts, cgroups, the judge's warm-up) at
    ``STANDBY_NICE``: the next job's processes must not take CPU from the samples running now.
    It returns to the samples' priority itself when it is ready (``_ready``)."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid, STANDBY_NICE)


def fork_or_none() -> int | None:
    try:
        return os.fork()
    except OSError:
        return None


def _stdio(out: int, err: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(out if out >= 0 else null, 1)
    os.dup2(err if err >= 0 else null, 2)


def _only_fd(keep: int) -> None:
    """Stdio on /dev/null and every other inherited descriptor closed (T's, other standbys')."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if fd != keep:
            os.dup2(null, fd)
    if null > 2 and null != keep:
        os.close(null)
    os.closerange(3, keep)
    os.closerange(keep + 1, MAXFD)


def _die_with_t() -> None:
    """PR_SET_PDEATHSIG: if T dies, this process dies too (a judge busy computing would not
    notice its socket closing, and must not outlive the sandbox)."""
    with contextlib.suppress(Exception):  # libc as loaded once by T's parent (a fresh CDLL
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # costs a judge ~0.6 ms of CPU)
    if os.getppid() == 1:  # T died before the call above took effect
        os._exit(0)


def _ready() -> None:
    """A standby's setup is done: back from ``STANDBY_NICE`` (still root) to wait for its job
    at the samples' own priority, so it wakes as fast as they do."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def _go(sock: socket.socket, nfds: int) -> tuple[Header, list[int]]:
    """Block until T hands over this process's job header and descriptors."""
    msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, nfds)
    if not msg or len(fds) != nfds:
        os._exit(0)  # T (or the whole sandbox) is gone: nothing to do
    sock.close()
    return json.loads(msg), fds


def worker_standby(
    sock: socket.socket,
    slot: int,
    cfg: ZygoteConfig,
    cgroups: SlotCgroups | None,
    scratch_mb: int,
    *,
    workdir: str | None = None,
) -> None:
    """W: isolate this fork, wait for a job, then serve the judge. Never returns."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        os.setsid()
        _only_fd(sock.fileno())
        uid = slot_uid(cfg, slot, judge=False)
        if cgroups is not None:
            # joined now, ahead of the job: a cgroup v1 attach can wait milliseconds for RCU.
            # A standby is small, so an OOM kill in the running sample's cgroup picks the
            # sample, and T replaces a standby that died before its job.
            cgroups.enter(slot)
        if cfg.get("sample_ns") and workdir is None:  # no setns here: three processes
            workdir = enter_sample_namespaces(
                scratch_mb=scratch_mb, keep=list(cfg.get("keep") or []), uid=uid
            )
        if cfg.get("sample_ns"):  # joined: now the slots' usage files (a channel) are covered
            cover_cgroup_files()
        codec.worker_side()
        _ready()
        hdr, (chan, out_w, err_w) = _go(sock, 3)
        _stdio(out_w, err_w)
        os.dup2(chan, 3)
        os.closerange(4, MAXFD)  # every inherited fd but the channel to the judge
        lim = hdr["limits"]
        drop_privileges(uid)
        set_limits(lim)
        os.chdir(workdir or hdr["workdir"])
        os.umask(0o077)
        os.environ.clear()
        install_seccomp()
        job = cast("WorkerJob", read_frame(3))  # from Z or J, both trusted here
        run_worker(3, job)
        sys.stdout.flush()
    except BaseException:
        pass
    finally:
        os._exit(0)


def _judge_boot(sock: socket.socket) -> None:
    """A judge's first steps after T forked it: its own session, tied to T, only ``sock``,
    and a codec that takes no class-maker from a worker."""
    codec.judge_side()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    _die_with_t()
    _only_fd(sock.fileno())


def _judge_confine(cfg: ZygoteConfig, slot: int, limits: WireLimits, shared: bool) -> None:
    """The slot's judge uid (the shared judge's, or a request's), ``limits``, no environment,
    the seccomp filter."""
    drop_privileges(slot_uid(cfg, slot, judge=True, shared=shared))
    with contextlib.suppress(Exception):  # already so after the uid change; said, not assumed:
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no judge-uid process may
        # read or write this one's memory
    set_limits(limits)
    os.chdir("/")
    os.environ.clear()
    install_seccomp()


#: what a standby judge evaluates before its job exists (constants of ours: see warm_judge)
WARM_SETUP = "import math"
WARM_TEST = "assert f(1) == [2, (1,), {'k': 1.5}] and math.isclose(f(1)[2]['k'], 1.5)"
WARM_VALUE = [2, (1,), {"k": 1.5}, {1, 2}, "s", None, True, 2**70, float("inf")]


def warm_judge() -> None:
    """Run the judge's own code once on constants of ours, while the standby waits for a job.

    Why: a fresh judge's first job would otherwise pay, page by page, for copying every page
    of T's memory that judging touches (refcounts are writes): the parser and compiler, the
    evaluation loop, the codec, JSON. Touched here, that cost is off the job's path. Nothing
    of a request exists yet, so what this leaves behind is as clean as T.
    """
    with contextlib.suppress(Exception):
        ns, _ = trusted_namespace(WARM_SETUP)
        code, _names, _bases = assert_uses(WARM_TEST)
        wire = json.loads(encode_frame(codec.to_wire(WARM_VALUE))[4:])
        value = codec.from_wire(wire)
        ns["f"] = lambda x: value[:1] and [x + 1, (x,), {"k": 1.5}]
        eval(code, ns)
        values_equal(value, codec.from_wire(wire), 0.0)
        brief_repr(value)


def judge_standby(
    sock: socket.socket, slot: int, cfg: ZygoteConfig, cgroups: SlotCgroups | None
) -> None:
    """J: a second uid, no sample code; judge the jobs Z sends and answer Z. Never returns.

    Its first job's ``judge_key`` (see :func:`.sharing.judge_key`) is the only key it serves: it
    takes that key's next jobs from T over ``sock`` and exits on any other (T kills it
    first), after ``RESIDENT_JOBS`` jobs, or at once where the key is None (no uid of its own).
    Why reuse at all: a fresh process per sample costs its fork and cold-page faults.
    """
    try:
        _judge_boot(sock)
        if cgroups is not None:  # ahead of the job: a cgroup v1 attach can take milliseconds
            with contextlib.suppress(OSError):
                cgroups.enter_judge(slot)
        warm_judge()
        _ready()
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        if not msg or len(fds) != 2:
            os._exit(0)  # T (or the whole sandbox) is gone: nothing to do
        hdr: Header = json.loads(msg)
        key = hdr.get("judge_key") if hdr.get("uid") is not None else None
        # one job: the job's own CPU bound; a key's jobs add up, so Z's deadline bounds each
        # (the shared data judge's room is the sandbox's; a request's, its first job's)
        if key is None:
            limits = judge_limits(hdr["limits"])
        elif key == DATA_KEY:
            limits = resident_limits(cfg)
        else:
            limits = {**judge_limits(hdr["limits"]), "cpu_s": MAX_CPU_S}
        _judge_confine(cfg, slot, limits, shared=key == DATA_KEY)
        shared = key == DATA_KEY
        for _ in range(RESIDENT_JOBS):
            wchan, zchan = fds
            try:
                judged = _judge_one(zchan, wchan, shared=shared)
            finally:
                os.close(wchan)
                os.close(zchan)
            if not judged or key is None:
                break
            if shared:  # answered: whatever the job left in cycles is freed before the next
                gc.collect()
            msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
            if not msg or len(fds) != 2 or json.loads(msg).get("judge_key") != key:
                break
    except BaseException:
        pass
    finally:
        os._exit(0)


def _judge_one(zfd: int, wfd: int, shared: bool = False) -> bool:
    """Judge one job; False (nothing judged) if ``shared`` (this is the judge that serves
    every request's data jobs) and the job is not one that can leave it unchanged."""
    job = cast("JudgeJob", read_frame(zfd))  # Z's (shareable checks it all the same)
    if shared and not shareable(job):
        return False
    result = run_judge(zfd, wfd, job)
    outputs = result.pop("outputs", None)
    if outputs is not None:
        result["has_outputs"] = True
    data = encode_frame(result)
    if outputs is not None:
        data += encode_frame(outputs)
    write_all(zfd, data)
    return True
