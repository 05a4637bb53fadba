"""The zygote: a long-lived ``python -I -S`` inside the sandbox that runs samples on request.

Processes (docs/sandbox.md has the picture):

* **Z** (this loop): reads requests from the proxy on stdin, answers on stdout (length-prefixed
  JSON), supervises each sample (deadline, output cap, exit status) and relays the judge's
  verdicts. It runs no sample code and no test code, and never decodes what a sample sent.
* **T** (template): forked from Z *before the first request*, so its memory holds no test data,
  no expected values and no other sample's code. It forks, per sample, a worker and a judge
  (their sockets arrive over a unix socket) and sweepers, and reports exit statuses. It is a
  child subreaper, so orphaned grandchildren are reaped rather than left as zombies.
* **W** (worker, one per sample): forked from T; its own PID, mount, IPC and network
  namespaces (where the level allows), its own scratch tmpfs, the slot's memory cgroup and uid,
  rlimits and a seccomp filter; then loads the sample and answers the judge
  (``_harness.run_worker``).
* **J** (judge, one per sample): forked from T; a second uid; evaluates every test itself and
  asks W only for values (``_judge.run_judge``). It sends Z the verdicts.
* **R** (sweeper): forked from T, becomes a slot's uid and ``kill(-1, SIGKILL)``s everything
  running as it, including grandchildren that left the process group.

Stdlib only, and started with ``-I -S``: this file must not import firstpass.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import resource
import selectors
import shutil
import signal
import socket
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _codec
import _compare
import _contain
import _harness as H
import _judge

sys.dont_write_bytecode = True  # no trusted process writes bytecode: nothing on its path changes

MAXFD = 4096
#: one network namespace per slot, as descriptors (see _contain.slot_network_namespaces)
NETNS: list[int] = []
#: T's own PID namespace, to return to after forking a sample into a new one (root only)
PIDNS: int | None = None
#: stdlib modules imported once here, so samples neither pay for nor need to find them
PRELOAD = (
    "array",
    "ast",
    "bisect",
    "collections",
    "copy",
    "dataclasses",
    "datetime",
    "decimal",
    "fractions",
    "functools",
    "heapq",
    "itertools",
    "math",
    "cmath",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "types",
    "typing",
)
#: a worker job (the sample's code) up to this size is written into W's socket by Z itself
W_JOB_INLINE = 96 << 10
#: jobs a judge serves (for its key) before it is replaced by a fresh fork (bounds its heap)
RESIDENT_JOBS = 1000
#: the job modes whose judging runs no client code in the judge (a call of the entry point
#: on decoded arguments and a comparison of decoded values): only these share a judge
#: across requests
RESIDENT_MODES = frozenset({"cases", "outputs"})
#: the judge key of those modes; every other job's key names its request (see judge_key)
DATA_KEY = "data"


def judge_key(mode: str, request_key: Any, job_id: int, closed: bool = False) -> str:
    """Which jobs may share a judge process with this one: the judge's whole isolation rule.

    A judge serves one key for its life, and T kills it before a job of another key reaches
    its slot. Jobs whose judging cannot change the judge share ``DATA_KEY`` across requests:
    cases and outputs jobs (no client code runs in the judge) and asserts specs written in the
    closed language (``closed``, from ``_judge.closed_spec``; the shared judge checks it again
    on the job, see ``shareable``). Any other asserts spec runs client code that can change
    its judge, so its key is its request's (the samples of one ``run_many``), else its own:
    such a spec never runs in a process that judges another request's sample.
    """
    if mode in RESIDENT_MODES or (mode == "asserts" and closed):
        return DATA_KEY
    if type(request_key) is str and request_key:
        return "req:" + request_key[:200]
    return f"job:{job_id}"
#: "no limit" for the CPU rlimit of a judge that serves several jobs
MAX_CPU_S = 86_400.0
#: how long an answered sample's worker may take to exit before its uid is swept
EXIT_GRACE_S = 0.1
#: how long a killed worker's exit status may take before its slot is freed regardless
EXIT_WAIT_S = 5.0
#: how long the judge may take past the sample's deadline to report
JUDGE_GRACE_S = 3.0
#: a standby's scheduling niceness until its job arrives: forking and warming the next
#: request's judge must not take CPU from the samples running now
STANDBY_NICE = 19
#: the most the wall-clock deadline stretches, as a multiple of ``wall_s``, for a sample that
#: waited for a CPU (other samples', other processes' load): the one deadline that always
#: holds, whatever the sample and the host do (the proxy's cfg may set it: "wall_stretch")
WALL_STRETCH = 3.0
#: what a sample's processes may use together past ``cpu_s`` where a CPU controller counts
#: it (the harness around its calls, the codec, the next sample's standby joining the slot)
CPU_TOTAL_SLACK_S = 0.5
#: a judge cgroup holds the slot's idle judges (a standby, one waiting for its key's next
#: job) beside the judging one: room for them above the judging one's memory limit
JUDGE_IDLE_MB = 128
#: the slot cgroups (see _contain.SlotCgroups), for the judges forked from T
CGROUPS: Any = None
#: the largest verdict frame a judge may send (reference outputs travel in a second frame)
MAX_VERDICT_FRAME = 16 << 20


# --------------------------------------------------------------------------- T, W, J, R


def slot_uid(cfg: dict[str, Any], slot: int, *, judge: bool, shared: bool = False) -> int | None:
    """The uid a slot's worker (or judge: its request's, or the ``shared`` one) runs as;
    None without uid isolation.

    Each zygote of a sandbox has its own lane of uids: one zygote's cleanup after it has
    answered must never hit a job another zygote started on the same slot meanwhile.
    """
    base = cfg.get("uid_base")
    if base is None:
        return None
    slots = int(cfg["slots"])
    if not 0 <= slot < slots:
        raise ValueError("slot out of range")
    per_slot: int = _contain.UIDS_PER_SLOT
    first = int(base) + per_slot * (int(cfg.get("lane", 0)) * slots + slot)
    return first + (0 if not judge else 2 if shared else 1)


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
    role: str, slot: int, cfg: dict[str, Any], cgroups: Any, scratch_mb: int
) -> Standby | None:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    if role == "w" and cfg.get("sample_ns") and PIDNS is not None:
        # the fast layout: the sample is T's own child and pid 1 of its namespace
        try:
            pid, workdir = _contain.fork_sample(
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
    pid = _fork_or_none()
    if pid == 0:
        mine.close()
        if role == "w":
            worker_standby(theirs, slot, cfg, cgroups, scratch_mb)
        judge_standby(theirs, slot, cfg)
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


def template_main(sock: socket.socket, cfg: dict[str, Any], cgroups: Any) -> None:
    """T: start workers and judges (kept one ahead per slot), sweepers; report exit statuses.

    Never returns. Forks happen here rather than in Z so that Z's loop, the sandbox's one
    serial path, does not pay for them.
    """
    # the judge's code run once here, on constants of ours: every judge forked from T finds
    # its caches filled (compiled code, regexes, classes), so a request's judge does not
    # compute them again; what that leaves in T is ours, as clean as T was
    warm_judge()
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER: orphans come to us, we reap them
    except Exception:  # without it orphans go to init, which reaps them too
        pass
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    children: dict[int, tuple[str, Any]] = {}
    standby: dict[tuple[str, int], Standby] = {}
    #: (slot, shared) -> the slot's judge that has a key, between jobs: the shared one, and one
    #: for a request's key (each its own uid, so neither can signal the other)
    resident: dict[tuple[int, bool], Standby] = {}
    #: pid -> uid of every judge that has had a job (and so runs as the slot's judge uid)
    judges: dict[int, int] = {}
    judge_uid = {
        (s, sh): slot_uid(cfg, s, judge=True, shared=sh)
        for s in range(int(cfg["slots"]))
        for sh in (False, True)
    }
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)

    def take(role: str, slot: int, scratch_mb: int) -> Standby | None:
        ready = standby.pop((role, slot), None)
        if ready is not None and ready.scratch_mb != scratch_mb:  # made for other limits
            with contextlib.suppress(OSError):
                os.kill(ready.pid, signal.SIGKILL)
            ready.sock.close()
            ready = None
        return ready or fork_standby(role, slot, cfg, cgroups, scratch_mb)

    def retire(slot: int) -> None:
        """Kill the slot's judge before a job of another key is judged under the same uid.

        A SIGKILLed process runs no more user code once the signal is queued (a task on
        another CPU is interrupted at once), so whatever it still ran (a test of its
        request's spec) has ended; the loop below reaps it without this job waiting for its
        memory to be torn down.
        """
        old = resident.pop((slot, False), None)
        if old is None:
            return
        children[old.pid] = ("retired", slot)
        old.sock.close()
        with contextlib.suppress(OSError):  # its exit (freeing its pages) is its own CPU
            os.setpriority(os.PRIO_PROCESS, old.pid, STANDBY_NICE)
        with contextlib.suppress(OSError):
            os.kill(old.pid, signal.SIGKILL)

    while True:
        for key, _ in sel.select():
            if key.fileobj is sock:
                try:
                    msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 8)
                except OSError:
                    os._exit(0)
                if not msg:
                    os._exit(0)  # Z is gone
                hdr = json.loads(msg)
                if "sweep" in hdr:
                    # a judge is one process (it cannot fork) and T's child: killed by pid,
                    # as root. No sweeper ever becomes a judge's uid, so test code still
                    # running there has no process of its own uid to race or signal
                    uids = [u for u in hdr["sweep"] if u not in judge_uid.values()]
                    for jpid, juid in list(judges.items()):
                        if juid in hdr["sweep"]:
                            with contextlib.suppress(OSError):
                                os.kill(jpid, signal.SIGKILL)
                    for rkey in [k for k in resident if judge_uid.get(k) in hdr["sweep"]]:
                        resident.pop(rkey).sock.close()  # killed: the next job forks anew
                    rpid = _fork_or_none() if uids or hdr.get("remove") else None
                    if rpid == 0:
                        sweeper_main(uids, hdr.get("remove", []))
                    if rpid:
                        children[rpid] = ("swept", hdr["token"])
                    else:  # nothing to fork for, or could not fork: here, the slow way
                        for uid in uids:
                            sweep(uid)
                        for path in hdr.get("remove", []):
                            shutil.rmtree(path, ignore_errors=True)
                        sock.send(json.dumps({"swept": hdr["token"]}).encode())
                    continue
                slot, scratch = int(hdr["slot"]), int(hdr["limits"]["scratch_mb"])
                started = {}
                # a judge lives on for its key's next job only where it has a uid of its own
                jkey = hdr.get("judge_key") if hdr["uid"] is not None else None
                rkey = (slot, jkey == DATA_KEY)
                if rkey[1] and (slot, False) in resident:
                    # the shared judge's turn: a request's judge waiting between its jobs goes,
                    # so its test code (a timer's handler, say) cannot run beside the shared
                    # judge in the slot's judge cgroup; its request's next job forks a new one
                    retire(slot)
                if jkey is not None and rkey in resident:
                    if resident[rkey].key != jkey:
                        retire(slot)  # a request's judge: the shared one's key never changes
                    else:
                        try:
                            socket.send_fds(resident[rkey].sock, [msg], fds[3:5])
                            started["j"] = resident[rkey].pid
                        except OSError:
                            if rkey[1]:
                                resident.pop(rkey).sock.close()
                            else:
                                retire(slot)
                for role, mine in (("w", fds[:3]), ("j", fds[3:5])):
                    if role in started:
                        continue
                    for _attempt in range(2):  # a standby that died meanwhile: a fresh one
                        ready = take(role, slot, scratch)
                        if ready is None:
                            break
                        try:
                            socket.send_fds(ready.sock, [msg], mine)
                        except OSError:
                            with contextlib.suppress(OSError):
                                os.kill(ready.pid, signal.SIGKILL)
                            ready.sock.close()
                            continue
                        if role == "j" and hdr["judge_uid"] is not None:
                            judges[ready.pid] = hdr["judge_uid"]
                        if role == "j" and jkey is not None:  # it stays for its key's jobs
                            ready.key = jkey
                            resident[rkey] = ready
                            children[ready.pid] = ("resident", rkey)
                        else:
                            ready.sock.close()
                            children[ready.pid] = (role, hdr["job"])
                        started[role] = ready.pid
                        break
                for fd in fds:
                    os.close(fd)
                if len(started) < 2:
                    for pid in started.values():
                        with contextlib.suppress(OSError):
                            os.kill(pid, signal.SIGKILL)
                    sock.send(json.dumps({"job": hdr["job"], "error": "fork failed"}).encode())
                else:  # Z kills by process group without a uid, and reads W's and J's
                    # schedstat (time spent waiting for a CPU stretches the wall deadline)
                    sock.send(json.dumps({"job": hdr["job"], "pids": started}).encode())
                for role in ("w", "j"):  # the next job on this slot finds its processes ready
                    if (role, slot) in standby:
                        continue
                    nxt = fork_standby(role, slot, cfg, cgroups, scratch)
                    if nxt is not None:
                        standby[(role, slot)] = nxt
                        children[nxt.pid] = ("standby", (role, slot))
            else:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
                while True:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    kind, ident = children.pop(pid, ("", 0))
                    judges.pop(pid, None)
                    if kind in ("w", "j"):
                        sock.send(json.dumps({"job": ident, kind: status}).encode())
                    elif kind == "swept":
                        sock.send(json.dumps({"swept": ident}).encode())
                    elif kind == "resident":  # the slot's next job takes a standby
                        rk = (int(ident[0]), bool(ident[1]))
                        if resident.get(rk) is not None and resident[rk].pid == pid:
                            resident.pop(rk).sock.close()
                    elif kind == "standby":  # died before its job: the next job forks anew
                        gone = standby.get(tuple(ident))
                        if gone is not None and gone.pid == pid:
                            del standby[tuple(ident)]
                            gone.sock.close()


def _fork_or_none() -> int | None:
    try:
        return os.fork()
    except OSError:
        return None


def set_limits(lim: dict[str, Any]) -> None:
    mb = 1 << 20
    cpu = max(1, int(lim["cpu_s"] + 0.999))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (lim["memory_mb"] * mb, lim["memory_mb"] * mb))
    fsize = int(lim["file_size_mb"] * mb)
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    resource.setrlimit(resource.RLIMIT_NOFILE, (lim["nofile"], lim["nofile"]))
    resource.setrlimit(resource.RLIMIT_NPROC, (lim["nproc"], lim["nproc"]))
    stack = 8 * mb  # a C-stack overflow then crashes fast instead of eating the address space
    resource.setrlimit(resource.RLIMIT_STACK, (stack, stack))


def judge_limits(lim: dict[str, Any]) -> dict[str, Any]:
    """J holds decoded sample values and runs the client's test code: room for both, no forks."""
    return {
        **lim,
        "cpu_s": float(lim["cpu_s"]) + 2 * JUDGE_GRACE_S,
        "memory_mb": max(2 * int(lim["memory_mb"]), 1024),
        "nproc": 1,  # J never forks, so nothing of its uid outlives it
        "nofile": 64,
        "file_size_mb": 1,
    }


def drop_privileges(uid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


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
        _contain._libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # costs a judge ~0.6 ms of CPU)
    if os.getppid() == 1:  # T died before the call above took effect
        os._exit(0)


def _ready() -> None:
    """A standby's setup is done: back from ``STANDBY_NICE`` (still root) to wait for its job
    at the samples' own priority, so it wakes as fast as they do."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)


def _go(sock: socket.socket, nfds: int) -> tuple[dict[str, Any], list[int]]:
    """Block until T hands over this process's job header and descriptors."""
    msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, nfds)
    if not msg or len(fds) != nfds:
        os._exit(0)  # T (or the whole sandbox) is gone: nothing to do
    sock.close()
    return json.loads(msg), fds


def worker_standby(
    sock: socket.socket,
    slot: int,
    cfg: dict[str, Any],
    cgroups: Any,
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
            workdir = _contain.enter_sample_namespaces(
                scratch_mb=scratch_mb, keep=list(cfg.get("keep") or []), uid=uid
            )
        if cfg.get("sample_ns"):  # joined: now the slots' usage files (a channel) are covered
            _contain.cover_cgroup_files()
        _codec.worker_side()
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
        _contain.install_seccomp()
        job = H.read_frame(3)
        H.run_worker(3, job)
        sys.stdout.flush()
    except BaseException:
        pass
    finally:
        os._exit(0)


def _judge_boot(sock: socket.socket) -> None:
    """A judge's first steps after T forked it: its own session, tied to T, only ``sock``,
    and a codec that takes no class-maker from a worker."""
    _codec.judge_side()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    os.setsid()
    _die_with_t()
    _only_fd(sock.fileno())


def _judge_confine(cfg: dict[str, Any], slot: int, limits: dict[str, Any], shared: bool) -> None:
    """The slot's judge uid (the shared judge's, or a request's), ``limits``, no environment,
    the seccomp filter."""
    drop_privileges(slot_uid(cfg, slot, judge=True, shared=shared))
    with contextlib.suppress(Exception):  # already so after the uid change; said, not assumed:
        _contain._libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no judge-uid process may
        # read or write this one's memory
    set_limits(limits)
    os.chdir("/")
    os.environ.clear()
    _contain.install_seccomp()


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
        ns, _ = _judge.trusted_namespace(WARM_SETUP)
        code, _names, _bases = _judge.assert_uses(WARM_TEST)
        wire = json.loads(H.encode_frame(_codec.to_wire(WARM_VALUE))[4:])
        value = _codec.from_wire(wire)
        ns["f"] = lambda x: value[:1] and [x + 1, (x,), {"k": 1.5}]
        eval(code, ns)
        _compare.values_equal(value, _codec.from_wire(wire), 0.0)
        _judge.brief_repr(value)


def judge_standby(sock: socket.socket, slot: int, cfg: dict[str, Any]) -> None:
    """J: a second uid, no sample code; judge the jobs Z sends and answer Z. Never returns.

    Its first job's ``judge_key`` (see :func:`judge_key`) is the only key it serves: it
    takes that key's next jobs from T over ``sock`` and exits on any other (T kills it
    first), after ``RESIDENT_JOBS`` jobs, or at once where the key is None (no uid of its own).
    Why reuse at all: a fresh process per sample costs its fork and cold-page faults.
    """
    try:
        _judge_boot(sock)
        if CGROUPS is not None:  # ahead of the job: a cgroup v1 attach can take milliseconds
            with contextlib.suppress(OSError):
                CGROUPS.enter_judge(slot)
        warm_judge()
        _ready()
        msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 2)
        if not msg or len(fds) != 2:
            os._exit(0)  # T (or the whole sandbox) is gone: nothing to do
        hdr = json.loads(msg)
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
    job = H.read_frame(zfd)
    if shared and not shareable(job):
        return False
    result = _judge.run_judge(zfd, wfd, job)
    outputs = result.pop("outputs", None)
    if outputs is not None:
        result["has_outputs"] = True
    data = H.encode_frame(result)
    if outputs is not None:
        data += H.encode_frame(outputs)
    H.write_all(zfd, data)
    return True


def shareable(job: Any) -> bool:
    """A job whose judging cannot change the judge: a cases or outputs job (no client code in
    the judge), or an asserts spec in the closed language (``_judge.closed_spec``), checked
    here on the job itself, whatever Z decided."""
    if type(job) is not dict:
        return False
    mode = job.get("mode")
    if mode in RESIDENT_MODES:
        return True
    tests, setup = job.get("tests"), job.get("setup")
    return (
        mode == "asserts"
        and type(tests) is list
        and all(type(t) is str for t in tests)
        and (setup is None or type(setup) is str)
        and _judge.closed_spec(tuple(tests), setup)
    )


def resident_limits(cfg: dict[str, Any]) -> dict[str, Any]:
    """The shared judge's limits: no CPU rlimit (it adds up over jobs; Z's deadline kills a
    stuck one), room for decoded values, no forks."""
    lim = dict(cfg["limits"])
    return {
        **judge_limits(lim),
        "cpu_s": MAX_CPU_S,
    }


def sweeper_main(uids: list[int], remove: list[str]) -> None:
    """R's parent: kill every process of each uid (one child per uid), then remove the files.

    Off Z's loop: a sample that left a million hard links delays only its own slot.
    """
    code = 0
    for uid in uids[1:]:
        try:
            sweep(uid)
        except OSError:
            code = 2
    if uids and not remove:
        reap_as(uids[0])  # the last (usually only) uid: this process becomes it
    if uids:
        try:
            sweep(uids[0])
        except OSError:
            code = 2
    for path in remove:
        shutil.rmtree(path, ignore_errors=True)
    os._exit(code)


def reap_as(uid: int) -> None:
    """R: become ``uid`` and SIGKILL every process running as it. Never returns.

    One ``kill(-1)`` is complete: the kernel walks the task list under the lock that ``fork``
    needs, and a fork racing with it is aborted by the pending SIGKILL. The second call is
    belt and braces.
    """
    code = 0
    try:
        os.setresuid(uid, uid, uid)
        os.kill(-1, signal.SIGKILL)
        os.kill(-1, signal.SIGKILL)
    except BaseException:
        code = 2
    os._exit(code)


def _run_delay(pid: int | None) -> int | None:
    """How long (ns) process ``pid`` has waited on a run queue so far: runnable, not running
    (``/proc/<pid>/schedstat``, second field); None when unknown."""
    if pid is None:
        return None
    try:
        with open(f"/proc/{pid}/schedstat", "rb") as f:
            return int(f.read().split()[1])
    except (OSError, ValueError, IndexError):
        return None


def sweep(uid: int) -> None:
    """Fork R for ``uid`` and wait for it (the synchronous path: start, shutdown, sweepers)."""
    pid = os.fork()
    if pid == 0:
        reap_as(uid)
    os.waitpid(pid, 0)


# --------------------------------------------------------------------------- Z


class Job:
    """One sample being run: its pipes, the judge's answer and the reason it ended."""

    def __init__(self, req: dict[str, Any], zygote: Zygote) -> None:
        self.req = req
        self.id: int = req["id"]
        self.slot: int = req["slot"]
        self.limits: dict[str, Any] = req["limits"]
        self.mode: str = req["mode"]
        self.n = len(req["tests"])
        self.start = time.monotonic()
        self.deadline = self.start + float(self.limits["wall_s"])
        self.j_deadline = self.deadline + JUDGE_GRACE_S
        #: the wall deadline stretches by the time W and J waited for a CPU, never past this
        stretch = float(zygote.cfg.get("wall_stretch") or WALL_STRETCH)
        self.hard_deadline = self.start + float(self.limits["wall_s"]) * max(1.0, stretch)
        #: W's and J's run-queue wait (ns, from /proc/<pid>/schedstat) when their pids came
        self.waited0: dict[str, int] = {}
        #: the slot's CPU time (s) when the job started, and when to look at it next
        self.cpu0: float | None = None
        self.cpu_check = float("inf")
        self.uid = zygote.uid(self.slot, judge=False)
        self.key = judge_key(self.mode, req.get("judge_key"), self.id, req.get("closed") is True)
        self.judge_uid = slot_uid(zygote.cfg, self.slot, judge=True, shared=self.key == DATA_KEY)
        self.workdir = ""
        self.zsock: socket.socket | None = None
        self.pipes: dict[int, str] = {}
        self.frames = H.FrameBuffer(MAX_VERDICT_FRAME)
        self.result: dict[str, Any] | None = None
        self.outputs_raw: bytes | None = None
        self.judged = False  # the judge's answer (and outputs) arrived, or never will
        self.finished = False
        self.w_status: int | None = None
        self.j_status: int | None = None
        self.pids: dict[str, int] = {}
        self.end: str | None = None  # output | timeout | cpu | start
        self.end_msg = ""
        self.out_bytes = 0
        self.oom_before = 0
        self.judge_oom_before = 0
        self.killed = False
        self.exit_deadline = 0.0
        self.sweeps_pending = 0  # sweeps of this job's uid that T has not finished
        self.aborted = False  # ended by the sandbox closing: no verdict, not the sample's
        self.marks: dict[str, float] = {}

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, round((time.monotonic() - self.start) * 1000, 3))


class Zygote:
    def __init__(
        self,
        cfg: dict[str, Any],
        chan_in: int,
        chan_out: int,
        tsock: socket.socket,
        root: str,
        cgroups: Any,
    ) -> None:
        self.cfg = cfg
        self.chan_in, self.chan_out, self.tsock, self.root = chan_in, chan_out, tsock, root
        self.cgroups = cgroups
        self.sel = selectors.DefaultSelector()
        self.registered = self.sel.get_map()  # a live view: fd -> its current key
        self.jobs: dict[int, Job] = {}
        self.inbuf = H.FrameBuffer()
        self.closing = False
        self.used_slots: set[int] = set()
        self.sweeps = 0
        self.sweeping: dict[str, Job | None] = {}  # token -> job whose slot waits for it
        self.busy_slots: set[int] = set()  # slots whose sweep has not finished
        self.waiting: dict[int, list[dict[str, Any]]] = {}  # slot -> requests queued behind it
        self.exiting: dict[int, Job] = {}  # answered jobs whose worker has not exited yet
        self.slot_limits: dict[int, int] = {}  # slot -> memory cgroup limit last written
        self.judge_limits: dict[int, int] = {}  # slot -> its judges' memory cgroup limit
        os.set_blocking(chan_in, False)
        self.sel.register(chan_in, selectors.EVENT_READ, ("in", None))
        self.sel.register(tsock, selectors.EVENT_READ, ("t", None))

    def uid(self, slot: int, *, judge: bool, shared: bool = False) -> int | None:
        return slot_uid(self.cfg, slot, judge=judge, shared=shared)

    def all_uids(self, slot: int) -> list[int]:
        """The slot's uids: its samples', its requests' judges', its shared judge's."""
        uids = [self.uid(slot, judge=j, shared=sh) for j, sh in ((False, False), (True, False))]
        uids.append(self.uid(slot, judge=True, shared=True))
        return [u for u in uids if u is not None]

    # ---- I/O with the proxy

    def send(self, obj: dict[str, Any], raw: bytes | None = None) -> None:
        data = H.encode_frame(obj)
        if raw is not None:
            data += H.raw_frame(raw)
        H.write_all(self.chan_out, data)

    def loop(self) -> None:
        if self.cfg.get("sweep_at_start") and self.cfg.get("uid_base") is not None:
            for slot in range(int(self.cfg["slots"])):
                for uid in self.all_uids(slot):
                    sweep(uid)
        self.send(
            {
                "ready": True,
                "pid": os.getpid(),
                "root": self.root,
                "memory_bound": (self.cgroups.kind if self.cgroups is not None else None)
                or "per-process",
            }
        )
        while not (self.closing and not self.jobs):
            for key, _ in self.sel.select(self.next_timeout()):
                if self.registered.get(key.fd) is not key:
                    # unregistered (and closed) by an earlier event of this batch: its number
                    # may already be another pipe's, so reading it would steal that pipe's data
                    continue
                kind, job = key.data
                try:
                    self.dispatch(kind, job, key.fileobj)
                except Exception as exc:  # a bug here must not take every other job down
                    if job is not None and job.id in self.jobs:
                        self.fail_job(job, f"internal error: {type(exc).__name__}: {exc}")
                    else:
                        print(f"zygote: {type(exc).__name__}: {exc}", file=sys.stderr)
            now = time.monotonic()
            self.check_exits(now)
            for job in list(self.jobs.values()):
                try:
                    self.check_deadlines(job, now)
                except Exception as exc:
                    self.fail_job(job, f"internal error: {type(exc).__name__}: {exc}")
        self.shutdown()

    def check_deadlines(self, job: Job, now: float) -> None:
        if job.end is None and now >= job.cpu_check and not job.finished:
            self.check_cpu(job, now)
        stale = job.end is None and now >= job.deadline and not job.finished
        if stale and not self.stretch(job, now):
            job.end, job.end_msg = "timeout", "wall-clock limit reached"
            self.kill_worker(job)
        if not job.judged and now >= job.j_deadline:
            self.read_judge(job)  # an answer that came in since select() still counts
            if not job.judged:
                job.judged = True
                self.stop_judge(job)
        if (
            job.judged
            and not job.finished
            and job.end is not None
            and job.w_status is None
            and now >= job.j_deadline
        ):  # the worker's status never came: do not wait for it
            job.w_status = -1
        self.maybe_finish(job)

    def check_cpu(self, job: Job, now: float) -> None:
        """End the job once its sample's processes together used ``cpu_s`` of CPU time (where
        the slot's cpu cgroup counts it); else look again when they next could have."""
        used = self.cgroups.cpu_usage(job.slot) if job.cpu0 is not None else None
        if used is None:
            job.cpu_check = float("inf")
            return
        left = float(job.limits["cpu_s"]) + CPU_TOTAL_SLACK_S - (used - job.cpu0)
        if left <= 0:
            job.end = "cpu"
            job.end_msg = f"CPU limit of {job.limits['cpu_s']} s reached (all its processes)"
            self.kill_worker(job)
            return
        job.cpu_check = now + max(0.01, left / self.cgroups.cpu_rate)

    def stretch(self, job: Job, now: float) -> bool:
        """Move the wall deadline past ``now`` by the time the job's W and J spent waiting for
        a CPU (runnable, not running: starved by others' load), up to its hard deadline; True
        if it moved. A sample that sleeps or blocks does not wait for a CPU: its deadline
        stays ``wall_s``, and a sample that makes itself wait (its own processes competing)
        uses CPU meanwhile, which ``cpu_s`` bounds."""
        waited = 0
        for role, before in job.waited0.items():
            after = _run_delay(job.pids.get(role))
            if after is not None and after > before:
                waited += after - before
        deadline = min(job.start + float(job.limits["wall_s"]) + waited / 1e9, job.hard_deadline)
        if deadline <= now:
            return False
        job.deadline = deadline
        job.j_deadline = deadline + JUDGE_GRACE_S
        return True

    def next_timeout(self) -> float | None:
        deadlines = [j.exit_deadline for j in self.exiting.values()]
        for j in self.jobs.values():
            deadlines.append(min(j.deadline, j.cpu_check) if j.end is None else j.j_deadline)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def dispatch(self, kind: str, job: Job | None, fileobj: Any) -> None:
        if kind == "in":
            self.read_requests()
        elif kind == "t":
            self.read_template()
        elif job is not None and kind == "pipe":
            self.read_pipe(job, fileobj)
        elif job is not None and kind == "judge":
            self.read_judge(job)

    def read_requests(self) -> None:
        try:
            data = os.read(self.chan_in, 1 << 20)
        except BlockingIOError:
            return
        if not data:
            self.closing = True
            self.sel.unregister(self.chan_in)
            for job in list(self.jobs.values()):
                if job.end is None:
                    job.end, job.end_msg = "start", "the sandbox is shutting down"
                    job.aborted = True
                    self.kill_worker(job)
            return
        for req in self.inbuf.feed(data):
            if req.get("op") == "run":
                self.start_job(req)

    def read_template(self) -> None:
        msg = self.tsock.recv(1 << 16)
        if not msg:
            print("zygote: the template process died", file=sys.stderr)
            os._exit(3)
        info = json.loads(msg)
        if "swept" in info:
            self.swept(info["swept"])
            return
        job = self.jobs.get(info["job"]) or self.exiting.get(info["job"])
        if job is None:
            return
        if "pids" in info:
            job.pids = {k: int(v) for k, v in info["pids"].items()}
            for role, pid in job.pids.items():
                waited = _run_delay(pid)
                if waited is not None:
                    job.waited0[role] = waited
        elif "w" in info:
            job.w_status = info["w"]
            job.mark("w_exit")
        elif "j" in info:
            job.j_status = info["j"]
            job.mark("j_exit")
            if not job.judged:  # J exited; its last bytes may still be in the socket
                self.read_judge(job)
        elif "error" in info:
            job.end, job.end_msg = "start", f"could not start the sample: {info['error']}"
            job.judged = True
            job.w_status = -1
            job.j_status = -1  # T killed whatever it had started of this job
        if job.id in self.exiting:
            self.check_exits(time.monotonic())
        else:
            self.maybe_finish(job)

    # ---- starting a job

    def start_job(self, req: dict[str, Any]) -> None:
        if req["slot"] in self.busy_slots:  # its last sample is still being swept
            self.waiting.setdefault(req["slot"], []).append(req)
            return
        job = Job(req, self)
        self.jobs[job.id] = job
        self.used_slots.add(job.slot)
        self.send({"id": job.id, "ack": True})  # from here on the sample may be what kills us
        if req.get("sweep_first") and job.uid is not None and job.judge_uid is not None:
            for uid in self.all_uids(job.slot):  # a previous zygote may have died with this
                sweep(uid)  # slot's processes alive
        lim = job.limits
        budget = min(float(lim["cpu_s"]), float(lim["wall_s"]))
        n = job.n
        per_test = (
            budget if n <= 1 else max(0.1, min(budget, float(lim.get("test_s") or budget / 4)))
        )
        wjob = {
            "code": req["code"],
            "setup_imports": req.get("setup_imports"),
            "load_s": budget,
            "prefetch": req.get("prefetch") or [],
        }
        jjob = {
            "mode": job.mode,
            "setup_imports": req.get("setup_imports"),
            "setup": req.get("setup"),
            "entry_point": req.get("entry_point"),
            "tests": req["tests"],
            "expected": req.get("expected"),
            "atol": req.get("atol"),
            "per_test_s": per_test,
            "load_s": budget,
            "allowance": req.get("allowance"),
            "prefetch": req.get("prefetch") or [],
        }
        if isinstance(req.get("probe"), list):  # behaviour: outputs on the probe inputs
            jjob["probe"] = req["probe"]
            jjob["probe_s"] = float(req.get("probe_s") or 0.05)
            jjob["probe_entry"] = req.get("probe_entry")
        if self.cgroups is not None:
            job.oom_before = self.cgroups.oom_kills(job.slot)
            job.judge_oom_before = self.cgroups.judge_oom_kills(job.slot)
            job.cpu0 = self.cgroups.cpu_usage(job.slot)
            if job.cpu0 is not None:  # the judge measures each test's budget there too
                jjob["cpu_usage"] = list(self.cgroups.usage[job.slot])
                job.cpu_check = job.start + float(lim["cpu_s"]) / self.cgroups.cpu_rate
            jwant = (int(judge_limits(lim)["memory_mb"]) + JUDGE_IDLE_MB) << 20
            if self.judge_limits.get(job.slot) != jwant:
                with contextlib.suppress(OSError):
                    self.cgroups.set_judge_limit(job.slot, jwant)
                self.judge_limits[job.slot] = jwant
        sample_ns = bool(self.cfg.get("sample_ns"))
        if not sample_ns:
            job.workdir = os.path.join(self.root, f"s{job.slot}-{job.id}")
            os.mkdir(job.workdir, 0o700)
            if job.uid is not None:
                os.chown(job.workdir, job.uid, job.uid)
        job.mark("planned")
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        w_end, j_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        zsock, jz_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        hdr = {
            "job": job.id,
            "slot": job.slot,
            "uid": job.uid,
            "judge_uid": job.judge_uid,
            "workdir": job.workdir,
            "limits": lim,
            "judge_key": job.key,
        }
        want = (int(lim["memory_mb"]) + int(lim["scratch_mb"])) << 20
        if self.cgroups is not None and self.slot_limits.get(job.slot) != want:
            # only when it changes (a request with other limits), with the slot idle: its
            # standby worker has joined the cgroup already and can no longer see the file
            with contextlib.suppress(OSError):
                self.cgroups.set_limit(job.slot, want)
            self.slot_limits[job.slot] = want
        wframe = H.encode_frame(wjob)
        if len(wframe) <= W_JOB_INLINE:  # fits an empty socket: W starts without waiting for J
            j_end.sendall(wframe)
            jjob["w_job_sent"] = True
        else:
            jjob["code"] = req["code"]
        try:
            socket.send_fds(
                self.tsock,
                [json.dumps(hdr).encode()],
                [w_end.fileno(), out_w, err_w, j_end.fileno(), jz_end.fileno()],
            )
        finally:
            for s in (w_end, j_end, jz_end):
                s.close()
            os.close(out_w)
            os.close(err_w)
        job.mark("fds_sent")
        job.zsock = zsock
        for fd, name in ((out_r, "out"), (err_r, "err")):
            os.set_blocking(fd, False)
            job.pipes[fd] = name
            self.sel.register(fd, selectors.EVENT_READ, ("pipe", job))
        if job.mode == "outputs":
            job.frames.raw = {1}
            job.frames.max_frame = H.MAX_FRAME
        try:
            zsock.settimeout(5.0)
            zsock.sendall(H.encode_frame(jjob))
        except OSError as exc:
            job.end, job.end_msg = "start", f"could not send the job to the judge: {exc}"
            self.kill_worker(job)
        zsock.setblocking(False)
        self.sel.register(zsock, selectors.EVENT_READ, ("judge", job))
        job.mark("sent")

    # ---- while it runs

    def read_judge(self, job: Job) -> None:
        if job.zsock is None or job.judged:
            return
        while True:
            try:
                data = job.zsock.recv(1 << 20)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self.stop_judge(job)
                job.judged = True
                job.mark("judged")
                self.maybe_finish(job)
                return
            try:
                frames = job.frames.feed(data)
            except ValueError:
                frames = []
                self.stop_judge(job)
                job.judged = True
            for frame in frames:
                if job.result is None:
                    job.result = frame if type(frame) is dict else {}
                else:
                    job.outputs_raw = frame
            if job.result is not None and (
                not job.result.get("has_outputs") or job.outputs_raw is not None
            ):
                job.judged = True
                job.mark("judged")
                self.stop_judge(job)
            if job.judged:
                self.maybe_finish(job)
                return

    def stop_judge(self, job: Job) -> None:
        """Stop reading the judge (its process ends by itself, or by a sweep of its uid)."""
        if job.zsock is not None:
            self.sel.unregister(job.zsock)
            job.zsock.close()
            job.zsock = None

    def read_pipe(self, job: Job, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.close_pipe(job, fd)
            return
        job.out_bytes += len(data)
        if job.out_bytes > int(job.limits["output_bytes"]) and job.end is None:
            job.end = "output"
            job.end_msg = f"stdout/stderr exceeded {job.limits['output_bytes']} bytes"
            self.kill_worker(job)  # pipes stay drained until it is dead: no EPIPE to report

    def close_pipe(self, job: Job, fd: int) -> None:
        self.sel.unregister(fd)
        os.close(fd)
        job.pipes.pop(fd, None)

    def kill_worker(self, job: Job) -> None:
        """Kill the sample's processes now (by uid off this loop, else by process group)."""
        if job.killed:
            return
        job.killed = True
        if job.uid is not None:
            self.sweep_later([job.uid], job)
        elif "w" in job.pids:
            for target in (-job.pids["w"], job.pids["w"]):
                with contextlib.suppress(OSError):
                    os.kill(target, signal.SIGKILL)

    # ---- ending a job

    def maybe_finish(self, job: Job) -> None:
        """Answer once the judge has spoken, and, when a verdict is missing, the worker's
        exit status (or the reason Z ended it) says why."""
        if job.finished or not job.judged:
            return
        tests = (job.result or {}).get("tests")
        complete = (
            isinstance(tests, list)
            and len(tests) == job.n
            and all(isinstance(v, dict) and isinstance(v.get("passed"), bool) for v in tests)
        )
        if not complete and job.w_status is None and job.end is None:
            return  # T reports the worker's exit status next
        self.finish(job)

    def finish(self, job: Job) -> None:
        """Fill in what the judge could not say, answer, then sweep the slot's uids."""
        if job.finished:
            return
        job.finished = True
        job.mark("finish")
        self.stop_judge(job)
        for fd in list(job.pipes):
            self.close_pipe(job, fd)
        verdicts = self.verdicts(job)
        self.respond(job, verdicts)
        # a J that answered is waiting for its request's next job, or exits by itself (it
        # cannot fork), and T kills it before another request's job reaches this slot: only
        # a J that did not answer needs its uid swept
        uids = [job.uid] if job.result is not None else [job.uid, job.judge_uid]
        if job.uid is not None and job.judge_uid is not None and not self.closing:
            if self.cfg.get("sample_ns"):
                # the sample had a PID namespace of its own: once its worker has exited,
                # nothing of it is left (the kernel empties a namespace with its init), so
                # the slot is free then, and not before (its memory cgroup is empty too)
                if job.result is None:
                    self.sweep_later(uids, job)  # type: ignore[arg-type]
                self.await_exit(job)
            else:
                self.sweep_later(uids, job)  # type: ignore[arg-type]
        else:
            if job.uid is not None:
                sweep(job.uid)
                sweep(job.judge_uid)  # type: ignore[arg-type]
            else:
                for pid in job.pids.values():
                    for target in (-pid, pid):
                        with contextlib.suppress(OSError):
                            os.kill(target, signal.SIGKILL)
            if job.workdir:
                shutil.rmtree(job.workdir, ignore_errors=True)

    def verdicts(self, job: Job) -> list[dict[str, Any]]:
        result = job.result or {}
        tests = result.get("tests")
        if not isinstance(tests, list) or len(tests) != job.n:
            if job.end is not None or job.w_status is not None:
                why = self.missing_cause(job)
                if job.end is None and why[0] == "runtime_error" and job.j_status is not None:
                    why = ("runtime_error", "the judge ended without a verdict")
                return [H.verdict(False, *why)] * job.n
            return [H.verdict(False, "runtime_error", "the judge ended without a verdict")] * job.n
        if job.end == "output":  # the whole sample failed: nothing it printed past that counts
            return [H.verdict(False, "output_limit", job.end_msg)] * job.n
        out = []
        cause: tuple[str, str] | None = None
        for v in tests:
            if isinstance(v, dict) and isinstance(v.get("passed"), bool):
                cat = v.get("error_type")
                if not v["passed"] and cat not in H.CATEGORIES:
                    cat = "runtime_error"
                msg = v.get("message")
                out.append(
                    H.verdict(v["passed"], cat, H.short(msg) if isinstance(msg, str) else None)
                )
            else:
                cause = cause or self.missing_cause(job)
                out.append(H.verdict(False, *cause))
        return out

    def missing_cause(self, job: Job) -> tuple[str, str]:
        if self.cgroups is not None and self.cgroups.oom_kills(job.slot) > job.oom_before:
            mb = int(job.limits["memory_mb"]) + int(job.limits["scratch_mb"])
            return "memory_limit", f"the sample's processes together exceeded {mb} MB"
        cg = self.cgroups
        if cg is not None and cg.judge_oom_kills(job.slot) > job.judge_oom_before:
            mb = int(judge_limits(job.limits)["memory_mb"])
            return "memory_limit", f"the judge exceeded {mb} MB holding the sample's values"
        if job.end == "output":
            return "output_limit", job.end_msg
        if job.end == "timeout":
            return "timeout", (
                f"no result before the {job.limits['wall_s']} s wall-clock limit (not counting "
                "time spent waiting for a CPU)"
            )
        if job.end == "cpu":
            return "timeout", job.end_msg
        if job.end == "start":
            return "runtime_error", job.end_msg
        st = job.w_status
        if st is not None and st >= 0 and os.WIFSIGNALED(st):
            sig = os.WTERMSIG(st)
            elapsed = time.monotonic() - job.start
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and elapsed >= job.limits["cpu_s"]):
                return "timeout", f"CPU limit of {job.limits['cpu_s']} s reached"
            return "runtime_error", f"the sample's process was killed by {signal.Signals(sig).name}"
        code = os.WEXITSTATUS(st) if st is not None and st >= 0 and os.WIFEXITED(st) else "?"
        return "runtime_error", f"the sample's process exited (status {code}) before reporting"

    def await_exit(self, job: Job) -> None:
        """Hold the job's slot until its worker has exited and every sweep of its uid is done.

        Both matter: a sweep still queued would kill the slot's next sample (same uid), and a
        worker still exiting would share the slot's memory cgroup with it.
        """
        self.busy_slots.add(job.slot)
        job.exit_deadline = time.monotonic() + (EXIT_WAIT_S if job.killed else EXIT_GRACE_S)
        self.exiting[job.id] = job
        self.try_release(job)

    def try_release(self, job: Job) -> None:
        if job.sweeps_pending:
            return
        if job.id in self.exiting:
            if job.w_status is None:
                return
            del self.exiting[job.id]
        self.release(job.slot)

    def check_exits(self, now: float) -> None:
        for job in list(self.exiting.values()):
            if job.w_status is not None:
                self.try_release(job)
            elif now >= job.exit_deadline and not job.killed:
                job.killed = True  # it did not exit after its answer: kill it, keep waiting
                job.exit_deadline = now + EXIT_WAIT_S
                self.sweep_later([job.uid], job)  # type: ignore[list-item]
            elif now >= job.exit_deadline and not job.sweeps_pending:
                del self.exiting[job.id]  # its status never came: free the slot all the same
                print(f"zygote: the worker of job {job.id} did not exit", file=sys.stderr)
                self.release(job.slot)

    def release(self, slot: int) -> None:
        self.busy_slots.discard(slot)
        for req in self.waiting.pop(slot, []):
            self.start_job(req)

    def sweep_later(self, uids: list[int], job: Job | None) -> None:
        """Have T kill the uids (and remove the job's files); the job's slot waits for it."""
        self.sweeps += 1
        token = f"{self.sweeps}"
        self.sweeping[token] = job
        remove = []
        if job is not None:
            job.sweeps_pending += 1
            self.busy_slots.add(job.slot)
            if job.workdir and job.finished:
                remove.append(job.workdir)
        self.tsock.send(json.dumps({"sweep": uids, "token": token, "remove": remove}).encode())

    def swept(self, token: str) -> None:
        job = self.sweeping.pop(token, None)
        if job is None:
            return
        job.sweeps_pending -= 1
        if job.finished:  # a sweep while the job runs (its deadline) frees nothing yet
            self.try_release(job)

    def respond(self, job: Job, verdicts: list[dict[str, Any]]) -> None:
        self.jobs.pop(job.id, None)
        result = job.result or {}
        msg: dict[str, Any] = {
            "id": job.id,
            "tests": verdicts,
            "wall_ms": (time.monotonic() - job.start) * 1000,
        }
        behaviour = result.get("behaviour")
        if isinstance(behaviour, dict):
            msg["behaviour"] = behaviour
        if self.cfg.get("trace"):
            msg["trace"] = {**job.marks, "round_trips": result.get("round_trips")}
        raw = None
        if job.aborted:
            msg["aborted"] = True
        if result.get("ready") is False:  # the worker died before the sample's first line
            msg["fault"] = "the sandbox could not start this sample's worker"
        if job.mode == "outputs":
            msg["has_outputs"] = job.outputs_raw is not None
            raw = job.outputs_raw
        self.send(msg, raw)

    def fail_job(self, job: Job, msg: str) -> None:
        if job.finished:
            self.jobs.pop(job.id, None)
            return
        job.end, job.end_msg = "start", msg
        job.judged = True
        job.result = None
        with contextlib.suppress(Exception):
            self.kill_worker(job)
        try:
            self.finish(job)
        except Exception:
            self.jobs.pop(job.id, None)
            self.send({"id": job.id, "tests": [H.verdict(False, "runtime_error", msg)] * job.n})

    def shutdown(self) -> None:
        self.tsock.close()
        for job in [*self.sweeping.values(), *self.exiting.values()]:
            if job is not None:
                self.used_slots.add(job.slot)
        if self.cfg.get("uid_base") is not None:  # only our slots: a one-shot shares the block
            for slot in sorted(self.used_slots):
                for uid in self.all_uids(slot):
                    sweep(uid)
        if self.cgroups is not None:
            self.cgroups.close()
        shutil.rmtree(self.root, ignore_errors=True)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("mounts"):
        m = cfg["mounts"]
        _contain.private_mounts(m["hide"], m["keep"], default_hide=m.get("default_hide", []))
    if cfg.get("probe"):
        return
    chan_in, chan_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    unsafe = _contain.import_path_is_safe([os.path.dirname(os.path.abspath(__file__)), *sys.path])
    if unsafe:
        H.write_all(chan_out, H.encode_frame({"ready": False, "error": unsafe}))
        sys.exit(4)
    root = os.path.join(cfg.get("tmp") or "/tmp", f"firstpass-sandbox-{os.getpid()}")
    os.mkdir(root, 0o711)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    cgroups = None
    if cfg.get("uid_base") is not None and cfg.get("cgroups", True):
        try:
            _contain.SlotCgroups.remove_stale("firstpass-")  # left by zygotes that were killed
            cgroups = _contain.SlotCgroups.create(f"firstpass-{os.getpid()}", int(cfg["slots"]))
        except OSError:
            cgroups = None
    global PIDNS, CGROUPS
    CGROUPS = cgroups  # judges join their slot's judge cgroups (see judge_standby)
    if cfg.get("sample_ns") and cfg.get("uid_base") is not None:
        PIDNS = _contain.own_pid_namespace()
    if PIDNS is not None and cfg.get("sample_netns", True):
        global NETNS
        with contextlib.suppress(OSError):  # else a namespace per sample (fork_standby)
            NETNS = _contain.slot_network_namespaces(int(cfg["slots"]))
    _contain.prepare_seccomp()  # built once here; each worker and judge only installs it
    zsock, tsock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    gc.collect()
    gc.freeze()  # forked children must not touch (copy) every page to scan old objects
    pid = os.fork()
    if pid == 0:  # T, before any request reached this process
        os.close(chan_in)
        os.close(chan_out)
        zsock.close()
        template_main(tsock, cfg, cgroups)
    tsock.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _ = (_codec, _compare)  # imported so that workers and judges find them preloaded
    Zygote(cfg, chan_in, chan_out, zsock, root, cgroups).loop()


if __name__ == "__main__":
    main()
