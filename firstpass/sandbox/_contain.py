"""Containment the zygote adds around each sample: namespaces, seccomp, cgroups, mounts.

Stdlib only (``ctypes`` for the syscalls Python 3.11 lacks) and importable as a top-level module
by the zygote (``python -I -S``, ``import _contain`` from this directory): no firstpass imports.

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
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import os
import resource
import signal
import stat
import sys
import time
from typing import Any

__all__ = [
    "SCRATCH_DIRS",
    "SlotCgroups",
    "enter_sample_namespaces",
    "fork_sample",
    "import_path_is_safe",
    "install_seccomp",
    "keep_paths",
    "own_pid_namespace",
    "private_mounts",
    "seccomp_supported",
]

# --------------------------------------------------------------------------- syscalls

_libc = ctypes.CDLL(None, use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.unshare.argtypes = [ctypes.c_int]
_libc.setns.argtypes = [ctypes.c_int, ctypes.c_int]
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]
_libc.syscall.restype = ctypes.c_long

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS = 38
PR_SET_SECCOMP = 22

#: the world-writable scratch dirs; each sample gets one fresh tmpfs for all of them
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")
#: host service sockets (PostgreSQL, D-Bus, ...) live here: the zygote covers it
RUN_DIR = "/run"
#: tmpfs sources the sandbox mounts; ``import_path_is_safe`` knows them by this prefix
SOURCE_PREFIX = "fp-"
#: whether W, once it only waits, drops to the sample's uid (so that a uid sweep kills it
#: directly). Off: W is unreachable from the sample anyway (another PID namespace, no
#: descriptors), it ends as soon as the sample does (a sweep kills the sample, the namespace
#: empties, W exits), it then does not count against the sample's RLIMIT_NPROC, and a W
#: prepared ahead of its job (a standby) is not killed by the sweep of the job before it.
DROP_WAITER_TO_UID = False
_NR_CLOSE_RANGE = 436  # the same on x86_64 and aarch64 (and every arch since 5.9)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _mount(src: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    rc = _libc.mount(
        src.encode() if src is not None else None,
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    _check(rc, f"mount {target}")


def _ro_bind_remount(target: str, extra: int = 0) -> None:
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra)


def _under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _minimal(paths: list[str]) -> list[str]:
    """The paths no other one contains, shallowest first (a recursive bind brings the rest)."""
    uniq = sorted(set(paths), key=lambda p: (p.count("/"), p))
    out: list[str] = []
    for p in uniq:
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


def _makedirs_root(path: str) -> None:
    """mkdir -p with every created directory root-owned mode 0755, whatever the umask.

    In a sticky 1777 tmpfs a root-owned 0755 parent cannot be renamed or filled by a sample,
    so nobody can swap what lies under a kept path's mount point.
    """
    missing = []
    cur = path
    while not os.path.lexists(cur):
        missing.append(cur)
        cur = os.path.dirname(cur)
    for d in reversed(missing):
        os.mkdir(d, 0o755)
        os.chmod(d, 0o755)


def _mountpoint_like(target: str, source_fd: int) -> None:
    """Create what a bind of ``source_fd`` needs at ``target``: a directory or an empty file."""
    if os.path.lexists(target):
        return
    _makedirs_root(os.path.dirname(target))
    if stat.S_ISDIR(os.fstat(source_fd).st_mode):
        os.mkdir(target, 0o755)
        os.chmod(target, 0o755)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444))


def _open_paths(paths: list[str], what: str) -> list[tuple[str, int]]:
    """O_PATH fds for ``paths`` taken *before* anything covers them: bind sources for later.

    ``mount --bind /proc/self/fd/N`` reaches the original (mount, dentry) even once a tmpfs
    lies over the path, so no staging directory outside the covered dirs is needed.
    """
    out: list[tuple[str, int]] = []
    try:
        for p in paths:
            try:
                out.append((p, os.open(p, os.O_PATH | os.O_CLOEXEC)))
            except FileNotFoundError:
                raise FileNotFoundError(
                    errno.ENOENT, f"{what} path does not exist: {p}", p
                ) from None
    except BaseException:
        for _, fd in out:
            os.close(fd)
        raise
    return out


def _bind_back(kept: list[tuple[str, int]]) -> None:
    """Bind each opened path back at its own place, read-only, nosuid, nodev."""
    for path, fd in kept:
        _mountpoint_like(path, fd)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _ro_bind_remount(path)


def _above_stdio(fd: int) -> int:
    """``fd`` moved to a number >= 3 (stdio is replaced by /dev/null later), close-on-exec."""
    if fd >= 3:
        return fd
    high = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    os.close(fd)
    return high


def _drop(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def _null_stdio_and_close_rest(keep_fd: int) -> None:
    """/dev/null on 0-2; every other descriptor but ``keep_fd`` (>= 3) closed."""
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        if null != fd:
            os.dup2(null, fd)
    for lo, hi in ((3, keep_fd - 1), (keep_fd + 1, 0xFFFFFFFF)):
        if lo > hi:
            continue
        rc = _libc.syscall(
            ctypes.c_long(_NR_CLOSE_RANGE), ctypes.c_uint(lo), ctypes.c_uint(hi), ctypes.c_uint(0)
        )
        if rc != 0:  # before Linux 5.9: close what /proc says is open
            for name in os.listdir("/proc/self/fd"):
                if lo <= int(name) <= hi:
                    with contextlib.suppress(OSError):
                        os.close(int(name))


# --------------------------------------------------------------------------- 1. namespaces


def own_pid_namespace() -> int | None:
    """A descriptor on this process's PID namespace when it can return there with setns (root),
    for :func:`fork_sample`; None otherwise (use :func:`enter_sample_namespaces`)."""
    try:
        fd = os.open("/proc/self/ns/pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    if _libc.setns(fd, CLONE_NEWPID) != 0:  # a no-op when allowed: we are already there
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
                ok = _libc.unshare(CLONE_NEWNET) == 0
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
    _check(_libc.unshare(CLONE_NEWPID), "unshare(pid)")
    try:
        pid = os.fork()
    finally:
        if os.getpid() != 1:  # the caller: its later children stay in its own namespace
            _check(_libc.setns(pidns, CLONE_NEWPID), "setns(pid)")
    if pid:
        return pid, None
    try:
        os.close(pidns)
        _check(
            _libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | (CLONE_NEWNET if net else 0)),
            "unshare(mount, ipc)",
        )
        if netns is not None:
            _check(_libc.setns(netns, CLONE_NEWNET), "setns(net)")
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        return 0, _sample_setup(scratch_mb, keep, uid)
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
    _check(
        _libc.unshare(CLONE_NEWPID | CLONE_NEWNS | CLONE_NEWIPC | CLONE_NEWNET),
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
        return _sample_setup(scratch_mb, keep, uid)
    _outer_main(sample, init, alive_w, uid if DROP_WAITER_TO_UID else None)
    raise AssertionError("unreachable")  # pragma: no cover


def _init_main(alive_r: int, alive_w: int) -> None:
    """Pid 1 of the sample's namespace: hold it open until W is gone, reaping orphans."""
    try:
        os.close(alive_w)
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
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
            _drop(uid)
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


def _sample_setup(scratch_mb: int, keep: list[str], uid: int | None) -> str:
    """In the sample (pid 2, still root): its own /proc, one scratch tmpfs, keeps, work dir."""
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount_proc()
    targets: list[str] = []
    for d in SCRATCH_DIRS:  # realpath now, before anything covers the symlinks' targets
        real = os.path.realpath(d)
        if os.path.isdir(real) and not any(_under(real, t) for t in targets):
            targets.append(real)
    if not targets or targets[0] != os.path.realpath("/tmp"):
        raise OSError(errno.ENOENT, "no /tmp directory to mount the sample's scratch on")
    kept = _open_paths(
        [
            k
            for k in _minimal([os.path.realpath(k) for k in keep])
            if any(_under(k, t) for t in targets)
        ],
        "keep",
    )
    try:
        inodes = max(1024, 256 * scratch_mb)  # inodes cost kernel memory the size= does not see
        _mount(
            f"{SOURCE_PREFIX}scratch",
            targets[0],
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"size={scratch_mb}m,nr_inodes={inodes},mode=1777",
        )
        for t in targets[1:]:
            _mount(targets[0], t, None, MS_BIND)
        if os.path.isdir("/dev/mqueue"):  # the host's mqueue mount shows the host's queues
            _mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _bind_back(kept)
    finally:
        for _, fd in kept:
            os.close(fd)
    work = os.path.join(targets[0], "work")
    os.mkdir(work, 0o700)
    os.chmod(work, 0o700)
    if uid is not None:
        os.chown(work, uid, uid)
    return work


#: uids per concurrency slot and lane: the sample's, its request's judge's, and the shared
#: judge's (two judge uids, so that no request's test code can signal the shared judge)
UIDS_PER_SLOT = 3

CGROUP_ROOT = "/sys/fs/cgroup"


def cover_cgroup_files() -> None:
    """Cover the cgroup tree in this process's own mount namespace (root, a sample's last step
    before its job): every slot's memory and CPU usage is world-readable there, a channel
    from one sample to another. The process has joined its cgroups already."""
    if os.path.isdir(CGROUP_ROOT):
        _mount(
            f"{SOURCE_PREFIX}cover",
            CGROUP_ROOT,
            "tmpfs",
            MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
            "size=4k,nr_inodes=2,mode=0555",
        )


# --------------------------------------------------------------------------- 2. seccomp

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_AARCH64 = 0xC00000B7
X32_SYSCALL_BIT = 0x40000000

#: syscalls refused with EPERM, checked against asm/unistd_64.h (x86_64) and
#: asm-generic/unistd.h (aarch64); tests/test_sandbox_contain.py re-checks both when present
#: fcntl's record-lock commands: F_GETLK, F_SETLK, F_SETLKW and their open-file variants
FCNTL_LOCK_COMMANDS = (5, 6, 7, 36, 37, 38)
_DENY_NAMES = (
    # no server sockets: samples share the zygote's (empty) network namespace, where a bound
    # port would be a channel from one sample to another; with no interface up, nothing
    # could connect to it anyway
    "bind",
    "listen",
    # file locks reach across namespaces: two samples locking one world-readable host file
    # (/etc/hostname) could signal each other; fcntl's lock commands are refused below
    "flock",
    # kernel keyrings persist per uid across runs: a channel from one run to the next
    "add_key",
    "request_key",
    "keyctl",
    # reading or steering other processes
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    # leaving or rearranging the namespaces we built (belt and braces: needs caps anyway)
    "mount",
    "umount2",
    "pivot_root",
    "unshare",
    "setns",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    # large kernel attack surface that no test of a function needs
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    # watching file events shows which host files other processes open, and two samples
    # watching one world-readable file could signal each other through it
    "inotify_init",
    "inotify_init1",
    "fanotify_init",
)
SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {
        "add_key": 248, "request_key": 249, "keyctl": 250, "ptrace": 101,
        "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
        "pivot_root": 155, "unshare": 272, "setns": 308, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "bpf": 321, "perf_event_open": 298, "userfaultfd": 323, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 246,
        "kexec_file_load": 320, "init_module": 175, "finit_module": 313, "delete_module": 176,
        "reboot": 169, "swapon": 167, "swapoff": 168,
        "socket": 41, "socketpair": 53, "clone": 56, "clone3": 435, "seccomp": 317,
        "flock": 73, "fcntl": 72, "bind": 49, "listen": 50, "setsockopt": 54,
        "inotify_init": 253, "inotify_init1": 294, "fanotify_init": 300,
    },
    "aarch64": {
        "add_key": 217, "request_key": 218, "keyctl": 219, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40, "umount2": 39,
        "pivot_root": 41, "unshare": 97, "setns": 268, "open_tree": 428, "move_mount": 429,
        "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442,
        "bpf": 280, "perf_event_open": 241, "userfaultfd": 282, "io_uring_setup": 425,
        "io_uring_enter": 426, "io_uring_register": 427, "kexec_load": 104,
        "kexec_file_load": 294, "init_module": 105, "finit_module": 273, "delete_module": 106,
        "reboot": 142, "swapon": 224, "swapoff": 225,
        "socket": 198, "socketpair": 199, "clone": 220, "clone3": 435, "seccomp": 277,
        "flock": 32, "fcntl": 25, "bind": 200, "listen": 201, "setsockopt": 208,
        "inotify_init1": 26, "fanotify_init": 262,  # aarch64 has no inotify_init
    },
}  # fmt: skip
_AUDIT_ARCH = {"x86_64": AUDIT_ARCH_X86_64, "aarch64": AUDIT_ARCH_AARCH64}
#: socket() domains a sample may create: inet ones reach nothing (no interface is up). Every
#: other family is refused: AF_UNIX (host socket files, abstract names), AF_NETLINK, and
#: AF_VSOCK (the hypervisor's host, which no network namespace separates), AF_ALG, AF_PACKET...
SOCKET_DOMAINS_ALLOWED = (2, 10)  # AF_INET, AF_INET6
#: setsockopt(SOL_SOCKET, ...) options refused: asking for credentials makes the kernel
#: autobind a unix socket to an abstract name (no bind() needed), which another process of
#: the same network namespace could then send to, so a socketpair could become a channel
SOL_SOCKET = 1
SOCKOPTS_DENIED = (16, 76)  # SO_PASSCRED, SO_PASSPIDFD
_CLONE_NS_FLAGS = (
    CLONE_NEWNS | CLONE_NEWCGROUP | CLONE_NEWUTS | CLONE_NEWIPC | CLONE_NEWUSER | CLONE_NEWPID
    | CLONE_NEWNET
)  # fmt: skip

SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
SECCOMP_SET_MODE_FILTER = 1
SECCOMP_MODE_FILTER = 2
SECCOMP_FILTER_FLAG_TSYNC = 1
_BPF_LD_W_ABS = 0x20
_BPF_JEQ_K = 0x15
_BPF_JSET_K = 0x45
_BPF_RET_K = 0x06


class _SockFilter(ctypes.Structure):
    _fields_ = [
        ("code", ctypes.c_ushort),
        ("jt", ctypes.c_ubyte),
        ("jf", ctypes.c_ubyte),
        ("k", ctypes.c_uint),
    ]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


def _native_arch() -> str | None:
    machine = os.uname().machine
    if machine not in SYSCALLS or ctypes.sizeof(ctypes.c_void_p) != 8:
        return None  # a 32-bit or x32 interpreter on a 64-bit kernel has another syscall ABI
    return machine


def seccomp_program(arch: str) -> list[tuple[int, int, int, int]]:
    """The filter as (code, jt, jf, k) instructions: exposed so that tests can read it."""
    nr = SYSCALLS[arch]
    # (op, k, label): op is ld (k = seccomp_data offset), ret, label, or a jump to label
    prog: list[tuple[str, int, str]] = [
        ("ld", 4, ""),  # seccomp_data.arch
        ("jne", _AUDIT_ARCH[arch], "kill"),
        ("ld", 0, ""),  # seccomp_data.nr
    ]
    if arch == "x86_64":
        prog.append(("jset", X32_SYSCALL_BIT, "kill"))
    prog += [("jeq", nr[name], "deny") for name in _DENY_NAMES if name in nr]
    prog += [
        ("jeq", nr["socket"], "socket"),
        ("jeq", nr["setsockopt"], "setsockopt"),
        ("jeq", nr["clone"], "clone"),
        ("jeq", nr["fcntl"], "fcntl"),
        ("jeq", nr["clone3"], "enosys"),  # flags in memory BPF cannot read; libc falls back
        ("ret", SECCOMP_RET_ALLOW, ""),
        ("label", 0, "socket"),
        ("ld", 16, ""),  # args[0], low 32 bits (both ABIs are little-endian): the domain
        *[("jeq", d, "allow") for d in SOCKET_DOMAINS_ALLOWED],
        ("ret", SECCOMP_RET_ERRNO | errno.EPERM, ""),
        ("label", 0, "setsockopt"),
        ("ld", 24, ""),  # args[1], low 32 bits: the level
        ("jne", SOL_SOCKET, "allow"),
        ("ld", 32, ""),  # args[2], low 32 bits: the option
        *[("jeq", opt, "deny") for opt in SOCKOPTS_DENIED],
        ("ret", SECCOMP_RET_ALLOW, ""),
        ("label", 0, "clone"),
        ("ld", 16, ""),  # args[0] is the flags on both ABIs
        ("jset", _CLONE_NS_FLAGS, "deny"),
        ("ret", SECCOMP_RET_ALLOW, ""),
        ("label", 0, "fcntl"),
        ("ld", 24, ""),  # args[1], low 32 bits: the command
        *[("jeq", cmd, "deny") for cmd in FCNTL_LOCK_COMMANDS],
        ("label", 0, "allow"),
        ("ret", SECCOMP_RET_ALLOW, ""),
        ("label", 0, "deny"),
        ("ret", SECCOMP_RET_ERRNO | errno.EPERM, ""),
        ("label", 0, "enosys"),
        ("ret", SECCOMP_RET_ERRNO | errno.ENOSYS, ""),
        ("label", 0, "kill"),
        ("ret", SECCOMP_RET_KILL_PROCESS, ""),
    ]
    labels: dict[str, int] = {}
    n = 0
    for op, _, name in prog:
        if op == "label":
            labels[name] = n
        else:
            n += 1
    out: list[tuple[int, int, int, int]] = []
    for op, k, name in prog:
        if op == "label":
            continue
        if op == "ld":
            out.append((_BPF_LD_W_ABS, 0, 0, k))
        elif op == "ret":
            out.append((_BPF_RET_K, 0, 0, k))
        else:
            off = labels[name] - (len(out) + 1)  # jumps count from the next instruction
            if not 0 <= off <= 255:
                raise ValueError("seccomp program too long for a BPF jump")
            if op == "jeq":
                out.append((_BPF_JEQ_K, off, 0, k))
            elif op == "jne":
                out.append((_BPF_JEQ_K, 0, off, k))
            else:
                out.append((_BPF_JSET_K, off, 0, k))
    return out


_PREPARED: dict[str, Any] = {}


def prepare_seccomp(arch: str | None = None) -> Any:
    """Build the filter once (the zygote calls this before forking), so that installing it in
    each fresh process is two system calls and no ctypes construction."""
    arch = arch or _native_arch()
    if arch is None:
        return None
    if arch not in _PREPARED:
        prog = seccomp_program(arch)
        filters = (_SockFilter * len(prog))(*[_SockFilter(*ins) for ins in prog])
        _PREPARED[arch] = (_SockFprog(len(prog), filters), filters)  # filters: kept alive
    return _PREPARED[arch][0]


def seccomp_supported() -> bool:
    """Whether :func:`install_seccomp` would install a filter on this interpreter."""
    return _native_arch() is not None


def install_seccomp() -> bool:
    """Refuse the syscalls untrusted code has no use for; True once the filter is installed.

    Why: a uid and namespaces still leave the whole kernel API reachable. This closes cross-run
    channels (keyrings outlive processes, per uid), host unix sockets (files and the abstract
    namespace) and other socket families (vsock reaches the hypervisor's host), tracing, new
    namespaces (user namespaces above all: unprivileged root-in-a-namespace) and the large,
    bug-prone subsystems (bpf, perf, io_uring, userfaultfd). socketpair stays allowed: asyncio
    and multiprocessing use it and it reaches nothing. A foreign audit arch (i386 int 0x80) or
    an x32 syscall kills the process. clone3 answers ENOSYS so that libc falls back to clone,
    whose flags the filter can inspect.

    Call after privileges are dropped, just before untrusted code runs (sets NO_NEW_PRIVS;
    applies to every thread). Returns False on an architecture other than x86_64/aarch64
    without installing anything; raises OSError if the kernel refuses the filter.
    """
    arch = _native_arch()
    if arch is None:
        return False
    fprog = prepare_seccomp(arch)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    rc = _libc.syscall(
        ctypes.c_long(SYSCALLS[arch]["seccomp"]),
        ctypes.c_ulong(SECCOMP_SET_MODE_FILTER),
        ctypes.c_ulong(SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(fprog),
    )
    if rc != 0 and ctypes.get_errno() == errno.ENOSYS:  # kernels before 3.17: this thread only
        rc = _libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0)
    _check(int(rc), "install the seccomp filter")
    return True


# --------------------------------------------------------------------------- 3. cgroups


def _unescape(field: str) -> str:
    """mountinfo octal escapes (space, tab, newline, backslash) back to characters."""
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, ch)
    return field


def _mountinfo() -> list[tuple[str, str, str, str, str, str, str]]:
    """(major:minor, root, mount point, per-mount options, fstype, source, super options)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            a, b = left.split(), right.split()
            if len(a) < 6 or len(b) < 3:
                continue
            out.append((a[2], _unescape(a[3]), _unescape(a[4]), a[5], b[0], _unescape(b[1]), b[2]))
    return out


def _own_cgroup_dirs(controller: str = "memory") -> list[tuple[str, str]]:
    """(kind, directory) candidates for our own cgroup of ``controller``, cgroup v2 first (the
    v2 candidate is the same for every controller: whether it has it is the caller's check)."""
    with open("/proc/self/cgroup") as f:
        lines = [ln.rstrip("\n").split(":", 2) for ln in f if ln.count(":") >= 2]
    v2_path = next((p for h, c, p in lines if h == "0" and c == ""), None)
    v1_path = next((p for h, c, p in lines if h != "0" and controller in c.split(",")), None)
    found: list[tuple[str, str]] = []
    mounts = _mountinfo()
    for kind, path in (("cgroup2", v2_path), ("cgroup1", v1_path)):
        if path is None:
            continue
        for _dev, root, mnt, _opts, fstype, _src, sopts in mounts:
            if kind == "cgroup2" and fstype != "cgroup2":
                continue
            if kind == "cgroup1" and (fstype != "cgroup" or controller not in sopts.split(",")):
                continue
            if not _under(path, root):
                continue  # a mount of another part of the hierarchy
            rel = path[len(root.rstrip("/")) :].lstrip("/")
            found.append((kind, os.path.join(mnt, rel) if rel else mnt))
    return found


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


#: the controllers the slot cgroups use: memory (a sample's processes together), cpu (one
#: scheduling entity per sample and per judge) and, on cgroup v1, cpuacct (the CPU time a
#: sample's processes used together; cgroup v2's cpu controller counts it itself)
CONTROLLERS = ("memory", "cpu", "cpuacct")
#: the CPUs a sample's processes may use together (the cpu controller's quota), at most one:
#: a sample that forks spinners takes one CPU, never the host
SAMPLE_CPUS = 1.0
#: cgroup v1 cpu.shares and v2 cpu.weight of one slot's sample or judge (the defaults), and
#: per slot of the sandbox's own group: each slot weighs what one host session weighs
V1_SHARES, V2_WEIGHT = 1024, 100
#: the "cpu.max"/"cpu.cfs_period_us" period the quota is set in, microseconds
CPU_PERIOD_US = 100_000


class _Tree:
    """The slot cgroups in one hierarchy: ``<base>/slot-<i>`` (a sample and everything it forks)
    and ``<base>/judge-<i>`` (the slot's judges) for each slot; ``controllers`` says which of
    :data:`CONTROLLERS` this hierarchy carries (cgroup v2: memory and cpu in one tree)."""

    def __init__(self, kind: str, base: str, slots: int, controllers: set[str]) -> None:
        self.kind, self.base, self.controllers = kind, base, controllers
        self.slot_dirs = [os.path.join(base, f"slot-{i}") for i in range(slots)]
        self.judge_dirs = [os.path.join(base, f"judge-{i}") for i in range(slots)]
        self.quota = False  # whether the slots' CPU quota was set

    def remove(self, deadline: float) -> None:
        for d in [*self.slot_dirs, *self.judge_dirs, self.base]:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                        break
                    time.sleep(0.01)


def _make_tree(kind: str, own: str, name: str, slots: int, want: set[str]) -> _Tree | None:
    """``<own>/<name>`` with a slot and a judge cgroup per slot, for those of ``want`` this
    hierarchy can give; None when it gives none of them. Raises OSError half-way (the caller
    removes what was made)."""
    if kind == "cgroup2":
        have = set(_read(os.path.join(own, "cgroup.controllers")).split()) & want
        sub = os.path.join(own, "cgroup.subtree_control")
        for c in sorted(have - set(_read(sub).split())):
            try:
                _write(sub, f"+{c}")
            except OSError:  # our cgroup holds processes ("no internal processes")
                have.discard(c)
        if not have:
            return None
    else:
        if not os.access(own, os.W_OK):
            return None
        have = set(want)
    base = os.path.join(own, name)
    os.makedirs(base, exist_ok=True)
    tree = _Tree(kind, base, slots, have)
    try:
        if kind == "cgroup2":
            for c in sorted(have):
                _write(os.path.join(base, "cgroup.subtree_control"), f"+{c}")
        for d in [*tree.slot_dirs, *tree.judge_dirs]:
            os.makedirs(d, exist_ok=True)
        if "memory" in have:
            probe = "memory.max" if kind == "cgroup2" else "memory.limit_in_bytes"
            if not os.path.exists(os.path.join(tree.slot_dirs[0], probe)):
                raise OSError(errno.ENOENT, f"no {probe} in {tree.slot_dirs[0]}")
            if kind == "cgroup2":
                for d in tree.slot_dirs:  # an OOM kill takes the whole sample, not one process
                    with contextlib.suppress(OSError):
                        _write(os.path.join(d, "memory.oom.group"), "1")
        if "cpu" in have:
            _cpu_weights(tree, slots)
        usage = os.path.join(tree.slot_dirs[0], "cpuacct.usage")
        if "cpuacct" in have and kind == "cgroup1" and not os.path.exists(usage):
            raise OSError(errno.ENOENT, f"no cpuacct.usage in {tree.slot_dirs[0]}")
    except OSError:
        tree.remove(0)
        raise
    return tree


def _cpu_weights(tree: _Tree, slots: int) -> None:
    """Equal weights for every slot's sample and judge, the sandbox's group weighing one
    default per slot, and the sample's quota of :data:`SAMPLE_CPUS` where the kernel has one."""
    quota = int(SAMPLE_CPUS * CPU_PERIOD_US)
    if tree.kind == "cgroup2":
        _write(os.path.join(tree.base, "cpu.weight"), str(min(10_000, V2_WEIGHT * slots)))
        for d in [*tree.slot_dirs, *tree.judge_dirs]:
            _write(os.path.join(d, "cpu.weight"), str(V2_WEIGHT))
        with contextlib.suppress(OSError):
            for d in tree.slot_dirs:
                _write(os.path.join(d, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
            tree.quota = True
        return
    _write(os.path.join(tree.base, "cpu.shares"), str(min(262_144, V1_SHARES * slots)))
    for d in [*tree.slot_dirs, *tree.judge_dirs]:
        _write(os.path.join(d, "cpu.shares"), str(V1_SHARES))
    with contextlib.suppress(OSError):  # no CONFIG_CFS_BANDWIDTH: weights only
        for d in tree.slot_dirs:
            _write(os.path.join(d, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            _write(os.path.join(d, "cpu.cfs_quota_us"), str(quota))
        tree.quota = True


class SlotCgroups:
    """Per concurrency slot, cgroups for the sample and, beside them, for the slot's judges.

    Why memory: RLIMIT_AS bounds each process alone; a sample that forks ``nproc`` processes
    could use ``nproc × memory_mb``. A slot cgroup caps the total, and the kernel's OOM killer
    (counted by ``oom_kills``) tells the zygote when a sample died of it. A judge decoding a
    sample's huge value is held to its own limit, in its own cgroup (``judge-<i>``), so that
    its memory never counts against the sample's.

    Why cpu: without it, a sample that forks spinners, each in its own session (its own
    scheduler autogroup), gets one share of the CPUs per process and starves every other
    sample on the host into a wall-clock timeout. In its slot's cpu cgroup a sample, all its
    processes together, is one scheduling entity of the same weight as any other slot's
    sample or judge, with a quota of :data:`SAMPLE_CPUS`; ``cpu_usage`` is the CPU time its
    processes used together, which the zygote and the judge measure budgets in.

    Each controller lives where the host has it (cgroup v2 first, else v1); any of them may be
    missing: ``kind`` (memory) and ``cpu_kind`` are None then.
    """

    def __init__(self, trees: list[_Tree], slots: int) -> None:
        self.trees = trees
        self.slots = slots
        mem = self._tree("memory")
        cpu = self._tree("cpu")
        acct = cpu if cpu is not None and cpu.kind == "cgroup2" else self._tree("cpuacct")
        self.kind: str | None = mem.kind if mem is not None else None
        self.base = mem.base if mem is not None else trees[0].base
        self.dirs = mem.slot_dirs if mem is not None else []
        self.judge_dirs = mem.judge_dirs if mem is not None else []
        self.cpu_kind: str | None = cpu.kind if cpu is not None else None
        #: how much CPU a slot's processes can use per second of wall clock, at most
        self.cpu_rate = SAMPLE_CPUS if cpu is not None and cpu.quota else float(os.cpu_count() or 1)
        #: per slot, (file, unit): the sample's CPU time so far is in it ("ns": cgroup v1's
        #: cpuacct.usage; "usec": the usage_usec line of cgroup v2's cpu.stat)
        self.usage: list[tuple[str, str]] | None = None
        if acct is not None:
            file, unit = ("cpu.stat", "usec") if acct.kind == "cgroup2" else ("cpuacct.usage", "ns")
            self.usage = [(os.path.join(d, file), unit) for d in acct.slot_dirs]
        self._procs = [
            [os.path.join(t.slot_dirs[i], "cgroup.procs") for t in trees] for i in range(slots)
        ]
        self._judge_procs = [
            [
                os.path.join(t.judge_dirs[i], "cgroup.procs")
                for t in trees
                if t.controllers & {"memory", "cpu"}
            ]
            for i in range(slots)
        ]

    def _tree(self, controller: str) -> _Tree | None:
        return next((t for t in self.trees if controller in t.controllers), None)

    @classmethod
    def create(cls, name: str, slots: int) -> SlotCgroups | None:
        """``<our cgroup>/<name>/{slot,judge}-<i>`` in the hierarchies of the memory, cpu and
        cpuacct controllers that we can write; None where none of them can be had.

        A cgroup v2 controller is used only if our cgroup has it and it can be enabled for
        children (not possible while our own cgroup holds processes, unless it is the root);
        otherwise cgroup v1's hierarchy of that controller at our own path. ``name`` is the
        caller's to make unique (a pid, say): a leftover of the same name is reused.
        """
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"bad cgroup name {name!r}")
        if slots < 1:
            raise ValueError("slots must be at least 1")
        trees: list[_Tree] = []
        try:
            for controller in CONTROLLERS:
                if any(controller in t.controllers for t in trees):
                    continue
                if controller == "cpuacct" and any(
                    t.kind == "cgroup2" and "cpu" in t.controllers for t in trees
                ):
                    continue  # v2's cpu.stat counts the usage
                for kind, own in _own_cgroup_dirs(controller):
                    if kind == "cgroup2" and any(t.kind == "cgroup2" for t in trees):
                        continue  # the v2 tree was made with every controller it could have
                    base = os.path.join(own, name)
                    same = next((t for t in trees if t.base == base), None)
                    if same is not None:  # v1 co-mounted controllers ("cpu,cpuacct")
                        same.controllers.add(controller)
                        if controller == "cpu":
                            _cpu_weights(same, slots)
                        break
                    want = {"memory", "cpu"} if kind == "cgroup2" else {controller}
                    with contextlib.suppress(OSError):
                        tree = _make_tree(kind, own, name, slots, want)
                        if tree is not None:
                            trees.append(tree)
                            if controller in tree.controllers:
                                break
        except OSError:
            pass
        if not trees:
            return None
        return cls(trees, slots)

    @classmethod
    def remove_stale(cls, prefix: str) -> int:
        """Remove ``<our cgroup>/<prefix><pid>`` trees whose pid is gone (a zygote that was
        killed cannot clean up after itself); return how many were removed. Busy ones stay."""
        removed = 0
        owns: list[str] = []
        for controller in CONTROLLERS:
            with contextlib.suppress(OSError):
                owns += [own for _, own in _own_cgroup_dirs(controller) if own not in owns]
        for own in owns:
            try:
                entries = os.listdir(own)
            except OSError:
                continue
            for entry in entries:
                tail = entry[len(prefix) :]
                if not entry.startswith(prefix) or not tail.isdigit():
                    continue
                if os.path.exists(f"/proc/{tail}"):
                    continue
                base = os.path.join(own, entry)
                with contextlib.suppress(OSError):
                    for sub in os.listdir(base):
                        if os.path.isdir(os.path.join(base, sub)):
                            os.rmdir(os.path.join(base, sub))
                    os.rmdir(base)
                    removed += 1
        return removed

    def set_limit(self, slot: int, nbytes: int) -> None:
        """Cap the slot's sample memory (and swap: none) at ``nbytes``."""
        if self.dirs:
            self._set_memory(self.dirs[slot], nbytes)

    def set_judge_limit(self, slot: int, nbytes: int) -> None:
        """Cap the memory of the slot's judges (together) at ``nbytes``."""
        if self.judge_dirs:
            self._set_memory(self.judge_dirs[slot], nbytes)

    def _set_memory(self, d: str, nbytes: int) -> None:
        if self.kind == "cgroup2":
            _write(os.path.join(d, "memory.max"), str(int(nbytes)))
            swap = os.path.join(d, "memory.swap.max")
            if os.path.exists(swap):
                _write(swap, "0")
            return
        limit = os.path.join(d, "memory.limit_in_bytes")
        memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
        if not os.path.exists(memsw):
            _write(limit, str(int(nbytes)))
            return
        # v1 keeps memsw >= limit at every step: raise memsw first, lower it last
        if int(nbytes) >= int(_read(limit)):
            _write(memsw, str(int(nbytes)))
            _write(limit, str(int(nbytes)))
        else:
            _write(limit, str(int(nbytes)))
            _write(memsw, str(int(nbytes)))

    def enter(self, slot: int) -> None:
        """Move the calling process into the slot's sample cgroups (one write per hierarchy:
        "0" means the writer, in any PID namespace). Call in W before dropping privileges;
        children inherit them."""
        for procs in self._procs[slot]:
            _write(procs, "0")

    def enter_judge(self, slot: int) -> None:
        """Move the calling process into the slot's judge cgroups (memory and cpu)."""
        for procs in self._judge_procs[slot]:
            _write(procs, "0")

    def cpu_usage(self, slot: int) -> float | None:
        """The CPU seconds the slot's sample processes used so far (monotonic); None without
        CPU accounting or when it cannot be read."""
        if self.usage is None:
            return None
        return read_cpu_usage(*self.usage[slot])

    def oom_kills(self, slot: int) -> int:
        """How many processes the kernel OOM-killed in this slot so far (monotonic)."""
        return self._oom_kills(self.dirs[slot]) if self.dirs else 0

    def judge_oom_kills(self, slot: int) -> int:
        """How many of the slot's judge processes the kernel OOM-killed so far (monotonic)."""
        return self._oom_kills(self.judge_dirs[slot]) if self.judge_dirs else 0

    def _oom_kills(self, d: str) -> int:
        if self.kind == "cgroup2":
            return _field(_read(os.path.join(d, "memory.events")), "oom_kill")
        with contextlib.suppress(OSError, KeyError):
            return _field(_read(os.path.join(d, "memory.oom_control")), "oom_kill")
        return int(_read(os.path.join(d, "memory.failcnt")))  # kernels before 4.13: hits

    def close(self, wait_s: float = 2.0) -> None:
        """Remove the slot cgroups and their parents, retrying while processes still exit."""
        deadline = time.monotonic() + wait_s
        for tree in self.trees:
            tree.remove(deadline)


def read_cpu_usage(path: str, unit: str) -> float | None:
    """A cgroup's CPU seconds from its usage file (see ``SlotCgroups.usage``); None when it
    cannot be read."""
    try:
        text = _read(path)
        if unit == "ns":
            return int(text) / 1e9
        return _field(text, "usage_usec") / 1e6
    except (OSError, ValueError, KeyError):
        return None


def _field(text: str, key: str) -> int:
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    raise KeyError(key)


# --------------------------------------------------------------------------- 4. zygote mounts


def private_mounts(
    hide: list[str],
    keep: list[str],
    *,
    default_hide: list[str] | tuple[str, ...] = (),
    tmp_mb: int = 256,
) -> None:
    """In the zygote's new mount namespace: fresh tmpfs over the host's writable and service
    dirs, ``hide`` covered, and every ``keep`` path bound back read-only wherever it lies.

    Why: the host's /tmp, /var/tmp, /dev/shm and lock dirs are world-writable and never cleaned
    (a channel between runs), /run holds host service sockets (PostgreSQL, D-Bus), and ``hide``
    paths hold secrets. A Python installation or this package under a covered dir (any venv in
    /tmp) must come back read-only: left on the empty, world-writable tmpfs, its import path
    would be a place where a sample could plant modules.

    - /tmp, /var/tmp, /dev/shm, /run/lock (/var/lock when it is a real dir): each a private
      ``tmp_mb`` MiB tmpfs, mode 1777. /run: an empty tmpfs, read-only once set up.
    - ``hide`` dirs: an empty read-only tmpfs; ``hide`` files: an empty, mode-0000, root-owned
      file, read-only. A ``hide`` path that does not exist raises ``FileNotFoundError`` naming
      it, before anything is mounted; ``default_hide`` paths that do not exist are skipped.
    - ``keep``: absolute paths that must exist; those under a covered path are bound back.
    """
    hides: list[str] = []
    for h, required in [*((h, True) for h in hide), *((h, False) for h in default_hide)]:
        if not os.path.isabs(h):
            raise ValueError(f"hide path is not absolute: {h!r}")
        if not os.path.exists(h):
            if required:
                raise FileNotFoundError(errno.ENOENT, f"hide path does not exist: {h}", h)
            continue
        real = os.path.realpath(h)
        if real == "/":
            raise ValueError(f"cannot hide the root directory: {h!r}")
        hides.append(real)
    for k in keep:
        if not os.path.isabs(k):
            raise ValueError(f"keep path is not absolute: {k!r}")
    scratch: list[str] = []
    for d in SCRATCH_DIRS:  # /var/lock is often a symlink to /run/lock: cover it once
        real = os.path.realpath(d)
        if os.path.isdir(real) and real not in scratch:
            scratch.append(real)
    run = [RUN_DIR] if os.path.isdir(RUN_DIR) else []
    fresh = [*run, *scratch]
    candidates = [*fresh, *dict.fromkeys(hides)]
    keeps = [
        k
        for k in _minimal([os.path.realpath(k) for k in keep])
        if any(_under(k, c) for c in candidates)
    ]

    def redundant(h: str) -> bool:  # already hidden by an outer cover that no keep undoes
        return any(
            c != h and _under(h, c) and not any(_under(h, k) and _under(k, c) for k in keeps)
            for c in candidates
        )

    covers = [(p, "run") for p in run] + [(p, "scratch") for p in scratch]
    covers += [
        (h, "hide" if os.path.isdir(h) else "hidefile")
        for h in dict.fromkeys(hides)
        if h not in fresh and not redundant(h)  # a fresh tmpfs starts out empty anyway
    ]
    covers.sort(key=lambda c: (c[0].count("/"), c[0]))
    # a cover inside a kept path goes on top of the bound-back keep, or the bind would undo it
    late = [c for c in covers if any(_under(c[0], k) and c[0] != k for k in keeps)]
    early = [c for c in covers if c not in late]

    kept = _open_paths(keeps, "keep")  # before anything covers them
    empty_fd = -1
    try:
        _mount(None, "/", None, MS_REC | MS_PRIVATE)
        if any(kind == "hidefile" for _, kind in covers):
            empty_fd = _stage_empty_file(scratch[0] if scratch else "/tmp")
        for path, kind in early:
            _cover(path, kind, empty_fd, tmp_mb)
        _bind_back(kept)
        for path, kind in late:
            _cover(path, kind, empty_fd, tmp_mb)
        for path, kind in covers:
            if kind in ("run", "hide"):
                _ro_bind_remount(path)
        _private_proc()
    finally:
        for _, fd in kept:
            os.close(fd)
        if empty_fd >= 0:
            os.close(empty_fd)


def _mount_proc(flags: int = MS_NOSUID | MS_NODEV | MS_NOEXEC) -> None:
    """A procfs instance on /proc in which a non-root process sees only its own uid's
    processes (hidepid): no other process's command line, no other judge to find."""
    try:
        _mount("proc", "/proc", "proc", flags, "hidepid=invisible")
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        _mount("proc", "/proc", "proc", flags, "hidepid=2")  # kernels before 5.8


def _private_proc() -> None:
    """The zygote's /proc with hidepid: judges (test code, in the zygote's PID namespace) see
    no host process; the zygote and its template are root and still see every one."""
    with contextlib.suppress(OSError):  # without it, docs/sandbox.md says what a judge sees
        _mount_proc()


def _cover(path: str, kind: str, empty_fd: int, tmp_mb: int) -> None:
    """Mount one cover: a scratch tmpfs, the empty /run or hide tmpfs, or the empty file."""
    if kind in ("scratch", "run") and not os.path.lexists(path):
        _makedirs_root(path)  # /run/lock in the fresh /run, /var/tmp in a hidden /var
    if kind == "scratch":
        inodes = max(1024, 256 * tmp_mb)
        _mount(
            f"{SOURCE_PREFIX}scratch",
            path,
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"size={tmp_mb}m,nr_inodes={inodes},mode=1777",
        )
    elif kind in ("run", "hide"):
        _mount(f"{SOURCE_PREFIX}{kind}", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    else:
        _mount(f"/proc/self/fd/{empty_fd}", path, None, MS_BIND)
        _ro_bind_remount(path, MS_NOEXEC)


def _stage_empty_file(where: str) -> int:
    """An O_PATH fd on an empty, mode-0000, root-owned file in a private staging tmpfs.

    The staging tmpfs is mounted on ``where`` (a scratch dir about to get its own tmpfs on
    top), so once covered it is reachable only through the returned fd.
    """
    _mount(
        f"{SOURCE_PREFIX}stage",
        where,
        "tmpfs",
        MS_NOSUID | MS_NODEV | MS_NOEXEC,
        "mode=0700,size=4k",
    )
    path = os.path.join(where, "empty")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0)
    os.fchmod(fd, 0)
    os.fchown(fd, 0, 0)
    os.close(fd)
    return os.open(path, os.O_PATH | os.O_CLOEXEC)


def keep_paths(hide: tuple[str, ...], site_packages: bool, package_dir: str) -> tuple[str, ...]:
    """Paths the zygote must still read that a cover would hide: its interpreter, this package.

    Why: covers are not only ``hide`` but also the scratch dirs and /run that every zygote
    gets; an interpreter or a venv in /tmp must be bound back (read-only) like one in /root.
    Blocking (``realpath`` stats the file system): call it in a thread from async code.
    """
    wanted = {
        os.path.realpath(sys.base_prefix),
        os.path.realpath(package_dir),
        os.path.realpath(os.path.dirname(sys.executable)),
        os.path.dirname(os.path.realpath(sys.executable)),
    }
    if site_packages:
        wanted.add(os.path.realpath(sys.prefix))
    covers = {os.path.realpath(h) for h in hide} | {os.path.realpath(d) for d in SCRATCH_DIRS}
    covers.add(os.path.realpath(RUN_DIR))
    inside = [p for p in wanted if any(_under(p, c) for c in covers)]
    return tuple(sorted(_minimal(inside)))


def import_path_is_safe(paths: list[str]) -> str | None:
    """None if no uid but root can change what these import paths load, else why one can.

    Why: a module planted in any directory the zygote imports from would run in every later
    sample (and in Z). A path is unsafe if it, or any directory above it, is writable by a
    non-root uid: owned by one, or group/other-writable (a root-owned sticky dir is fine as an
    *ancestor*, not as the entry itself, where anyone may create names), or the entry sits on a
    writable tmpfs the sandbox mounted. Anything on a read-only mount is safe. A missing entry
    (python311.zip) is judged by its nearest existing ancestor, where it could be created. Both
    the path as written and its resolved form are checked.
    """
    try:
        mounts = _mountinfo()
    except OSError:
        mounts = []
    trusted = _trusted_owners()
    for entry in paths:
        absolute = os.path.abspath(entry or os.getcwd())
        for candidate in dict.fromkeys([absolute, os.path.realpath(absolute)]):
            try:
                why = _path_unsafe(candidate, mounts, trusted)
            except OSError as exc:
                why = f"cannot inspect {candidate}: {exc.strerror}"
            if why is not None:
                return f"import path {entry!r}: {why}"
    return None


def _trusted_owners() -> set[int]:
    """Root; in a user namespace also the overflow uid, the owner shown for unmapped uids
    (real root among them), whose files nobody in the namespace can write but through mode."""
    trusted = {0}
    with contextlib.suppress(OSError, ValueError):
        if _read("/proc/self/uid_map").split() != ["0", "0", "4294967295"]:
            trusted.add(int(_read("/proc/sys/kernel/overflowuid")))
    return trusted


_Mounts = list[tuple[str, str, str, str, str, str, str]]


def _path_unsafe(path: str, mounts: _Mounts, trusted: set[int]) -> str | None:
    cur = path
    while not os.path.lexists(cur):
        cur = os.path.dirname(cur)
    first = True
    while True:
        st = os.lstat(cur)
        if not stat.S_ISLNK(st.st_mode) and not os.statvfs(cur).f_flag & os.ST_RDONLY:
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid not in trusted:
                return f"{cur} is owned by uid {st.st_uid}"
            if mode & 0o022 and (first or not mode & stat.S_ISVTX):
                return f"{cur} is writable by group or others (mode {mode:04o})"
            if first and _on_our_tmpfs(cur, st.st_dev, mounts):
                return f"{cur} is on a writable tmpfs the sandbox mounted"
        first = False
        if cur == "/":
            return None
        cur = os.path.dirname(cur)


def _on_our_tmpfs(path: str, dev: int, mounts: _Mounts) -> bool:
    devs = f"{os.major(dev)}:{os.minor(dev)}"
    best: tuple[str, str, str, str, str, str, str] | None = None
    for m in mounts:  # later lines are newer mounts: on a tie, the one on top wins
        if m[0] == devs and _under(path, m[2]) and (best is None or len(m[2]) >= len(best[2])):
            best = m
    return (
        best is not None
        and best[4] == "tmpfs"
        and best[5].startswith(SOURCE_PREFIX)
        and "rw" in best[3].split(",")
    )
