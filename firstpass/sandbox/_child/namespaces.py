"""Each sample's own PID, mount, IPC and network namespaces, and each slot's network namespace.

Per sample, ``enter_sample_namespaces`` turns the worker W into three processes::

    T ── W (the process T waits for; mirrors the sample's exit status)
          ├── init: pid 1 of the sample's PID namespace, root, does nothing but wait for W
          └── S: pid 2, the sample (returns from enter_sample_namespaces)

The sample is *not* pid 1: a PID-namespace init ignores every signal it has no handler for
unless it is SIGKILL/SIGSTOP from an ancestor namespace, *including the kernel's own SIGXCPU from
RLIMIT_CPU* (measured: a pid-1 spinner under RLIMIT_CPU (1, 3) dies of SIGKILL after 3 s, never
of SIGXCPU), and ``abort()`` would end as SIGSEGV. As pid 2 the sample dies of exactly what it
would die of outside, and W, its real parent, sees that status and mirrors it. The init holds
the namespace open while the sample runs; when W goes (the sample ended, or W was killed by a
uid sweep or by Z), the init sees its pipe close (or gets PR_SET_PDEATHSIG) and exits, and the
kernel then kills everything left in the namespace: nothing of a sample outlives W.

Stdlib only.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import resource
import signal

from .mounts import sample_filesystem
from .syscalls import (
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    PR_SET_PDEATHSIG,
    check,
    libc,
)
from .uids import drop_privileges

#: whether W, once it only waits, drops to the sample's uid (so that a uid sweep kills it
#: directly). Off: W is unreachable from the sample anyway (another PID namespace, no
#: descriptors), it ends as soon as the sample does (a sweep kills the sample, the namespace
#: empties, W exits), it then does not count against the sample's RLIMIT_NPROC, and a W
#: prepared ahead of its job (a standby) is not killed by the sweep of the job before it.
DROP_WAITER_TO_UID = False
_NR_CLOSE_RANGE = 436  # the same on x86_64 and aarch64 (and every arch since 5.9)


def _above_stdio(fd: int) -> int:
    """``fd`` moved to a number >= 3 (stdio is replaced by /dev/null later), close-on-exec."""
    if fd >= 3:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return high


def _null_stdio_and_close_rest(keep_fd: int) -> None:
    """/dev/null on 0-2; every other descriptor but ``keep_fd`` (>= 3) closed."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if null != fd:
            os.dup2(null, fd)
    for lo, hi in ((3, keep_fd - 1), (keep_fd + 1, 0xFFFFFFFF)):
        if lo > hi:
            continue
        rc = libc.syscall(
            ctypes.c_long(_NR_CLOSE_RANGE), ctypes.c_uint(lo), ctypes.c_uint(hi), ctypes.c_uint(0)
        )
        if rc != 0:  # before Linux 5.9: close what /proc says is open
            for name in os.listdir("/proc/self/fd"):
                if lo <= int(name) <= hi:
                    with contextlib.suppress(OSError):
                        os.close(int(name))


def own_pid_namespace() -> int | None:
    """A descriptor on this process's PID namespace when it can return there with setns (root),
    for :func:`fork_sample`; None otherwise (use :func:`enter_sample_namespaces`)."""
    try:
        fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if libc.setns(fd, CLONE_NEWPID) != 0:  # a no-op when allowed: we are already there
        os.close(fd)
        return None
    return fd


def slot_network_namespaces(n: int) -> list[int]:
    """``n`` new network namespaces (no interface up), as descriptors that keep them alive.

    Why one per slot, not per sample: samples that run at the same time are on different
    slots, so each sees only its own slot's sockets in /proc/net; a sample's sockets die with
    its processes, so the next sample of the slot inherits nothing; and entering a namespace
    (``setns``) costs microseconds where making and tearing down one per sample cost about a
    tenth of a sample's time (benchmarks/results/sandbox_bench.md). Root only.
    """
    fds: list[int] = []
    for _ in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a child makes the namespace and holds it until we have opened it
            try:
                os.close(r)
                ok = libc.unshare(CLONE_NEWNET) == 0
                os.write(w, b"1" if ok else b"0")
                signal.pause()
            finally:
                os._exit(0)
        os.close(w)
        try:
            if os.read(r, 1) != b"1":
                raise OSError(errno.EPERM, "unshare(net) failed")
            fds.append(os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC))
        finally:
            os.close(r)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return fds


def fork_sample(
    pidns: int,
    *,
    scratch_mb: int,
    keep: list[str],
    uid: int | None,
    net: bool,
    netns: int | None = None,
) -> tuple[int, str | None]:
    """Fork the sample as pid 1 of a new PID namespace, with its own mount and IPC namespaces.

    Why: one process per sample instead of three (:func:`enter_sample_namespaces`): the caller
    (T) is the sample's parent and reads its exit status itself, and a fork of a Python process
    is most of a sample's cost. ``unshare(CLONE_NEWPID)`` only moves the caller's *next* child;
    ``setns`` right after the fork puts the caller back. As pid 1 the sample's death empties the
    namespace (the kernel kills what is left), and signals it sends itself without a handler
    are ignored: the harness handles SIGXCPU and SIGALRM, and RLIMIT_CPU's hard limit is a
    SIGKILL, which is delivered. ``net``: also a new network namespace (when seccomp cannot
    refuse unix sockets, the abstract socket namespace must be per sample); ``netns``: enter
    this one instead (its slot's: see :func:`slot_network_namespaces`).

    Returns ``(pid, None)`` in the caller and ``(0, work_dir)`` in the sample, still root.
    """
    if isinstance(scratch_mb, bool) or not isinstance(scratch_mb, int) or scratch_mb < 1:
        raise ValueError(f"scratch_mb must be a positive int, got {scratch_mb!r}")
    check(libc.unshare(CLONE_NEWPID), "unshare(pid)")
    try:
        pid = os.fork()
    finally:
        if os.getpid() != 1:  # the caller: its later children stay in its own namespace
            check(libc.setns(pidns, CLONE_NEWPID), "setns(pid)")
    if pid:
        return pid, None
    try:
        os.close(pidns)
        check(
            libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | (CLONE_NEWNET if net else 0)),
            "unshare(mount, ipc)",
        )
        if netns is not None:
            check(libc.setns(netns, CLONE_NEWNET), "setns(net)")
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        return 0, sample_filesystem(scratch_mb, keep, uid)
    except BaseException:
        os._exit(70)


def enter_sample_namespaces(*, scratch_mb: int, keep: list[str], uid: int | None) -> str:
    """Give this one sample its own PID, mount, IPC and network namespace; return its work dir.

    Why: a uid and rlimits alone leave the sample seeing every host process and cmdline, sharing
    SysV/POSIX IPC and the abstract unix-socket namespace with other samples and runs, and its
    grandchildren able to outlive it; the zygote-wide tmpfs is shared by all samples.

    Call in W right after the fork, as root, inside the zygote's namespaces, before dropping
    privileges. Returns only in the sample process (pid 2 of the new PID namespace; see the
    module docstring for why not pid 1), where ``/proc`` shows only the namespace (hidepid:
    once dropped, only its own processes), one tmpfs of ``scratch_mb`` MiB is ``/tmp``,
    ``/var/tmp``, ``/dev/shm`` and the lock dirs together, each ``keep`` path under them is
    bound back read-only, the network namespace has no interface up, and the work dir
    ``/tmp/work`` (0700, owned by ``uid``) exists. Mount errors raise here, in the sample.

    The calling process never returns: it closes all its descriptors (stdio on /dev/null),
    waits for the sample and then for the namespace to empty, and exits with the sample's
    status mirrored exactly (exit code, or death by the same signal). It stays root unless
    ``DROP_WAITER_TO_UID`` (see there for why); killing it kills the whole sample.
    """
    if isinstance(scratch_mb, bool) or not isinstance(scratch_mb, int) or scratch_mb < 1:
        raise ValueError(f"scratch_mb must be a positive int, got {scratch_mb!r}")
    for p in keep:
        if not os.path.isabs(p):
            raise ValueError(f"keep path is not absolute: {p!r}")
    check(
        libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET),
        "unshare(pid, mount, ipc, net)",
    )
    # only W keeps alive_w open: its EOF tells the init that W is gone
    alive_r, alive_w = (_above_stdio(fd) for fd in os.pipe())
    try:
        init = os.fork()
    except BaseException:
        os.close(alive_r)
        os.close(alive_w)
        raise
    if init == 0:
        _init_main(alive_r, alive_w)
    os.close(alive_r)
    try:
        sample = os.fork()
    except BaseException:
        os.close(alive_w)  # the init exits on EOF; reap it and let the caller see the error
        with contextlib.suppress(ChildProcessError):
            os.waitpid(init, 0)
        raise
    if sample == 0:
        os.close(alive_w)
        return sample_filesystem(scratch_mb, keep, uid)
    _outer_main(sample, init, alive_w, uid if DROP_WAITER_TO_UID else None)
    raise AssertionError("unreachable")  # pragma: no cover


def _init_main(alive_r: int, alive_w: int) -> None:
    """Pid 1 of the sample's namespace: hold it open until W is gone, reaping orphans."""
    try:
        os.close(alive_w)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # orphans are reaped by the kernel
        _null_stdio_and_close_rest(alive_r)
        with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
            f.write("-1000")  # a memory-cgroup OOM kill should pick the sample, not us
        while os.read(alive_r, 64):  # EOF when W exits or is killed (PDEATHSIG as well)
            pass
    except BaseException:
        pass
    os._exit(0)


def _outer_main(sample: int, init: int, alive_w: int, uid: int | None) -> None:
    """W after the forks: wait for the sample, then for its namespace, then mirror its status."""
    status = 255 << 8
    try:
        with contextlib.suppress(ValueError, OSError):
            signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        _null_stdio_and_close_rest(alive_w)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # we re-raise the sample's signal
        if uid is not None:
            drop_privileges(uid)
        _, status = os.waitpid(sample, 0)
        os.close(alive_w)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(init, 0)  # returns once the kernel has emptied the namespace
    except BaseException:
        pass
    _mirror(status)


def _mirror(status: int) -> None:
    """Exit exactly as a process with wait status ``status`` did. Never returns."""
    if os.WIFEXITED(status):
        os._exit(os.WEXITSTATUS(status))
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            if sig not in (signal.SIGKILL, signal.SIGSTOP):
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
            os.kill(os.getpid(), sig)
        except (OSError, ValueError):
            pass
        os._exit(128 + sig)  # a signal whose default is not to terminate: cannot happen
    os._exit(255)
