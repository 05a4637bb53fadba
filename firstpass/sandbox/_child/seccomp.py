"""The seccomp filter every worker and judge installs before untrusted code runs.

Stdlib only (``ctypes`` for the filter program and the system call).
"""

from __future__ import annotations

import ctypes
import errno
import os
from typing import cast

from .syscalls import (
    CLONE_NEWCGROUP,
    CLONE_NEWIPC,
    CLONE_NEWNET,
    CLONE_NEWNS,
    CLONE_NEWPID,
    CLONE_NEWUSER,
    CLONE_NEWUTS,
    PR_SET_NO_NEW_PRIVS,
    PR_SET_SECCOMP,
    check,
    libc,
)

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


#: arch -> the filter program, and the array of its instructions (kept alive with it)
_PREPARED: dict[str, tuple[_SockFprog, ctypes.Array[_SockFilter]]] = {}


def prepare_seccomp(arch: str | None = None) -> _SockFprog | None:
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
    fprog = cast("_SockFprog", prepare_seccomp(arch))  # built: arch is known
    check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
    rc = libc.syscall(
        ctypes.c_long(SYSCALLS[arch]["seccomp"]),
        ctypes.c_ulong(SECCOMP_SET_MODE_FILTER),
        ctypes.c_ulong(SECCOMP_FILTER_FLAG_TSYNC),
        ctypes.byref(fprog),
    )
    if rc != 0 and ctypes.get_errno() == errno.ENOSYS:  # kernels before 3.17: this thread only
        rc = libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(fprog), 0, 0)
    check(int(rc), "install the seccomp filter")
    return True
