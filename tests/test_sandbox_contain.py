"""firstpass/sandbox/_child/: per-sample namespaces, seccomp, slot cgroups, zygote mounts.

The namespace and mount tests run their snippet in a throwaway ``unshare --net --mount
--propagation private python -I -S`` (the zygote's own setup), where each "sample" is a fork
that calls ``enter_sample_namespaces``, drops to a test uid and runs a body, like W does.
Nothing mounted there outlives that process; cgroups are removed and processes checked after
every test.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from firstpass.sandbox._child import (
    boot,
    cgroups,
    import_path,
    mounts,
    namespaces,
    seccomp,
)
from tests.sandbox_helpers import processes_of

#: slow: containment scenarios that wait out real limits and kills (~12 s together)
pytestmark = pytest.mark.slow

#: the sandbox package directory: what the front keeps visible in the zygote (keep_paths)
PKG = str(Path(mounts.__file__).resolve().parents[1])
UNSHARE = shutil.which("unshare")
UID, UID2 = 60_990_001, 60_990_002
TEST_UIDS = range(UID, UID2 + 1)

needs_root_unshare = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0 or UNSHARE is None,
    reason="needs Linux, root and util-linux unshare",
)

PRELUDE = r'''
import ctypes, errno, json, os, resource, signal, socket, sys, time, traceback
import importlib, runpy
runpy.run_path(BOOT)["load"]()  # the zygote's package, as boot.py loads it
cgroups, import_path, mounts, namespaces, seccomp, syscalls = (
    importlib.import_module(f"{PACKAGE}.{name}")
    for name in ("cgroups", "import_path", "mounts", "namespaces", "seccomp", "syscalls")
)
install_seccomp = seccomp.install_seccomp  # start() has a parameter of that module's name

if ZYGOTE_MOUNTS is not None:  # what the zygote does at start: the interpreter stays readable
    mounts.private_mounts(
        [], [*mounts.keep_paths(("/root", "/home"), False, PKG), *ZYGOTE_MOUNTS],
        default_hide=["/root", "/home"],
    )

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def emit(obj):
    sys.stdout.write("\nRESULT " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def drop(uid):
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)


def start(body, *, uid=UID, scratch_mb=8, keep=(), seccomp=False):
    """Fork W: enter the sample's namespaces, drop to uid, run body(workdir), send its result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            wd = namespaces.enter_sample_namespaces(scratch_mb=scratch_mb, keep=list(keep), uid=uid)
            drop(uid)
            os.chdir(wd)
            if seccomp and not install_seccomp():
                raise RuntimeError("seccomp was not installed")
            out = {"ok": body(wd)}
        except BaseException:
            out = {"error": traceback.format_exc()}
        try:
            os.write(w, json.dumps(out).encode())
        finally:
            os._exit(0)
    os.close(w)
    return pid, r


def finish(pid, r):
    data = b""
    while chunk := os.read(r, 1 << 16):
        data += chunk
    os.close(r)
    _, st = os.waitpid(pid, 0)
    res = json.loads(data) if data else None
    if res is not None and "error" in res:
        raise AssertionError(res["error"])
    return status(st), (res or {}).get("ok")


def sample(body, **kw):
    return finish(*start(body, **kw))


def status(st):
    if os.WIFEXITED(st):
        return {"exit": os.WEXITSTATUS(st)}
    if os.WIFSIGNALED(st):
        return {"signal": signal.Signals(os.WTERMSIG(st)).name}
    return {"raw": st}


def in_pidns(link):
    """Live pids (seen from outside) whose PID namespace is ``link`` ("pid:[...]")."""
    found = []
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                if os.readlink(f"/proc/{e}/ns/pid") == link:
                    found.append(int(e))
            except OSError:
                pass
    return found


def fill(path, chunk=1 << 16):
    """Write to path until the file system is full: (bytes written, errno name)."""
    n = 0
    buf = b"x" * chunk
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                n += f.write(buf)
            except OSError as exc:
                return n, errno.errorcode[exc.errno]
'''


def run_inner(code: str, timeout: float = 60, zygote_mounts: tuple[str, ...] | None = ()) -> Any:
    """Run ``code`` in a zygote-like process (new net + mount namespace, root); return what it
    emits. Unless ``zygote_mounts`` is None, ``private_mounts`` first ran as the zygote runs
    it (default hides, interpreter kept), keeping those extra paths too."""
    assert UNSHARE is not None
    head = f"PKG = {PKG!r}\nBOOT = {boot.__file__!r}\nPACKAGE = {boot.PACKAGE!r}\nUID = {UID}\nUID2 = {UID2}\nZYGOTE_MOUNTS = {list(zygote_mounts) if zygote_mounts is not None else None!r}\n"
    src = head + PRELUDE + textwrap.dedent(code)
    proc = subprocess.run(
        [UNSHARE, "--net", "--mount", "--propagation", "private", sys.executable, "-I", "-S"],
        input=src.encode(),
        capture_output=True,
        timeout=timeout,
        env={},
        cwd="/",
    )
    out, err = proc.stdout.decode(), proc.stderr.decode()
    assert proc.returncode == 0, f"inner snippet failed ({proc.returncode}):\n{err}\n{out}"
    lines = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
    assert lines, f"no result from the inner snippet:\n{err}\n{out}"
    return json.loads(lines[-1][len("RESULT ") :])


@pytest.fixture(autouse=True)
def _nothing_left_behind() -> Iterator[None]:
    yield
    deadline = time.monotonic() + 30  # they are killed at once; a loaded machine is slow
    while processes_of(TEST_UIDS) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_of(TEST_UIDS) == [], "a test left processes of its uids running"


# --------------------------------------------------------------------------- namespaces


@needs_root_unshare
def test_sample_sees_only_itself_in_proc() -> None:
    """A sample lists only its own pid in /proc and cannot open pid 1's or the host's cmdline."""
    res = run_inner(
        f"""
        def body(wd):
            try:
                open("/proc/1/cmdline").read()
                other = "readable"
            except OSError as exc:
                other = errno.errorcode[exc.errno]
            return {{"pids": sorted(e for e in os.listdir("/proc") if e.isdigit()),
                     "me": os.getpid(), "other": other,
                     "host": os.path.exists("/proc/{os.getpid()}")}}
        emit(sample(body))
        """
    )
    st, out = res
    assert st == {"exit": 0}
    assert out["pids"] == [str(out["me"])]
    assert out["other"] == "ENOENT"
    assert out["host"] is False


@needs_root_unshare
def test_sysv_shm_segment_does_not_reach_the_host_or_outlive_the_sample() -> None:
    """A SysV shm segment a sample creates is invisible to the host and gone after it exits."""
    size = 7_340_033  # a size nothing else uses, to find the segment in /proc/sysvipc/shm
    res = run_inner(
        f"""
        SIZE = {size}
        def sizes():
            with open("/proc/sysvipc/shm") as f:
                return [int(ln.split()[3]) for ln in f.readlines()[1:]]
        go_r, go_w = os.pipe()
        made_r, made_w = os.pipe()
        def body(wd):
            libc.shmget.restype = ctypes.c_int
            shmid = libc.shmget(0, ctypes.c_size_t(SIZE), 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
            inside = SIZE in sizes()
            os.write(made_w, b"1")
            os.read(go_r, 1)
            return {{"shmid": shmid, "inside": inside}}
        pid, r = start(body)
        os.read(made_r, 1)
        during = SIZE in sizes()
        os.write(go_w, b"1")
        st, out = finish(pid, r)
        emit({{"st": st, "out": out, "during": during, "after": SIZE in sizes()}})
        """
    )
    assert res["st"] == {"exit": 0}
    assert res["out"]["shmid"] >= 0 and res["out"]["inside"] is True
    assert res["during"] is False
    assert res["after"] is False


@needs_root_unshare
def test_posix_message_queue_does_not_reach_the_host() -> None:
    """A POSIX message queue a sample creates cannot be opened from the host, during or after."""
    res = run_inner(
        """
        NAME = b"/fp-contain-test-mq"
        libc.mq_open.restype = ctypes.c_int
        go_r, go_w = os.pipe()
        made_r, made_w = os.pipe()
        def host_open():
            fd = libc.mq_open(NAME, os.O_RDONLY)
            e = ctypes.get_errno()
            if fd >= 0:
                libc.mq_unlink(NAME)
                return "opened"
            return errno.errorcode[e]
        def body(wd):
            fd = libc.mq_open(NAME, os.O_CREAT | os.O_RDWR, 0o600, None)
            e = ctypes.get_errno()
            os.write(made_w, b"1")
            os.read(go_r, 1)
            return {"fd": fd, "err": errno.errorcode.get(e)}
        pid, r = start(body)
        os.read(made_r, 1)
        during = host_open()
        os.write(go_w, b"1")
        st, out = finish(pid, r)
        emit({"st": st, "out": out, "during": during, "after": host_open()})
        """
    )
    if res["out"]["fd"] < 0 and res["out"]["err"] == "ENOSYS":
        pytest.skip("the kernel has no POSIX message queues")
    assert res["out"]["fd"] >= 0
    assert res["during"] == "ENOENT"
    assert res["after"] == "ENOENT"


@needs_root_unshare
def test_loopback_is_unreachable_without_interfaces() -> None:
    """A sample's TCP connect and UDP send to 127.0.0.1 fail: no interface is up."""
    st, out = run_inner(
        """
        def body(wd):
            res = {}
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.connect(("127.0.0.1", 9))
                res["tcp"] = "connected"
            except OSError as exc:
                res["tcp"] = errno.errorcode[exc.errno]
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            try:
                u.sendto(b"x", ("127.0.0.1", 9))
                res["udp"] = "sent"
            except OSError as exc:
                res["udp"] = errno.errorcode[exc.errno]
            return res
        emit(sample(body, seccomp=True))
        """
    )
    assert st == {"exit": 0}
    assert out == {"tcp": "ENETUNREACH", "udp": "ENETUNREACH"}


@needs_root_unshare
def test_each_sample_has_its_own_scratch_capped_at_scratch_mb() -> None:
    """Two live samples see separate /tmp; each fills at scratch_mb (ENOSPC), across all dirs."""
    res = run_inner(
        """
        filled_r, filled_w = os.pipe()
        go_r, go_w = os.pipe()
        def a(wd):
            open("/tmp/mine-a", "w").write("a")
            n, err = fill("/tmp/big")
            os.write(filled_w, b"1")
            os.read(go_r, 1)
            more = {}
            for d in ("/var/tmp", "/dev/shm", "/run/lock"):
                if os.path.isdir(d):
                    more[d] = fill(d + "/more")[1]
            return {"n": n, "err": err, "more": more}
        def b(wd):
            seen = sorted(os.listdir("/tmp"))
            n, err = fill("/dev/shm/big")
            return {"seen": seen, "n": n, "err": err}
        pa, ra = start(a, scratch_mb=8)
        os.read(filled_r, 1)
        stb, outb = sample(b, uid=UID2, scratch_mb=4)
        os.write(go_w, b"1")
        sta, outa = finish(pa, ra)
        emit({"a": [sta, outa], "b": [stb, outb]})
        """
    )
    (sta, a), (stb, b) = res["a"], res["b"]
    mib = 1 << 20
    assert sta == stb == {"exit": 0}
    assert a["err"] == "ENOSPC" and 7.5 * mib <= a["n"] <= 8 * mib
    assert set(a["more"].values()) == {"ENOSPC"}  # one tmpfs: the other dirs are full too
    assert b["seen"] == ["work"]  # nothing of A's, though A still runs
    assert b["err"] == "ENOSPC" and 3.5 * mib <= b["n"] <= 4 * mib


@needs_root_unshare
@pytest.mark.parametrize(
    ("how", "expected"),
    [
        ("os._exit(3)", {"exit": 3}),
        (
            "resource.setrlimit(resource.RLIMIT_CPU, (1, 3))\n    while True: pass",
            {"signal": "SIGXCPU"},
        ),
        ("os.kill(os.getpid(), signal.SIGKILL)", {"signal": "SIGKILL"}),
        ("os.abort()", {"signal": "SIGABRT"}),
    ],
    ids=["exit3", "sigxcpu", "sigkill", "sigabrt"],
)
def test_exit_status_is_mirrored_exactly(how: str, expected: dict[str, Any]) -> None:
    """The process T waits for ends exactly as the sample did: same code or same signal."""
    st, _ = run_inner(f"def body(wd):\n    {how}\nemit(sample(body))\n")
    assert st == expected


@needs_root_unshare
def test_setsid_grandchildren_die_with_the_sample() -> None:
    """A grandchild that called setsid() is gone by the time the sample's exit status arrives."""
    res = run_inner(
        """
        def body(wd):
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    time.sleep(60)
                os._exit(0)
            time.sleep(0.2)
            return os.readlink("/proc/self/ns/pid")
        st, link = sample(body)
        emit({"st": st, "link": link, "left": in_pidns(link)})
        """
    )
    assert res["st"] == {"exit": 0}
    assert res["link"].startswith("pid:[")
    assert res["left"] == []


@needs_root_unshare
def test_killing_the_worker_kills_the_whole_sample() -> None:
    """SIGKILL to the process T waits for takes the sample and its setsid grandchildren down."""
    res = run_inner(
        """
        ready_r, ready_w = os.pipe()
        def body(wd):
            if os.fork() == 0:
                os.setsid()
                time.sleep(60)
                os._exit(0)
            os.write(ready_w, os.readlink("/proc/self/ns/pid").encode())
            time.sleep(60)
        pid, r = start(body)
        link = os.read(ready_r, 100).decode()
        before = in_pidns(link)
        with open(f"/proc/{pid}/status") as f:
            waiter_uid = int(next(ln for ln in f if ln.startswith("Uid:")).split()[1])
        os.kill(pid, signal.SIGKILL)
        st, _ = finish(pid, r)
        deadline = time.monotonic() + 30
        while in_pidns(link) and time.monotonic() < deadline:
            time.sleep(0.02)
        emit({"st": st, "before": len(before), "left": in_pidns(link), "waiter_uid": waiter_uid})
        """
    )
    assert res["st"] == {"signal": "SIGKILL"}
    assert res["waiter_uid"] == (UID if namespaces.DROP_WAITER_TO_UID else 0)
    assert res["before"] == 3  # init, the sample, its grandchild
    assert res["left"] == []


@needs_root_unshare
def test_kept_path_under_tmp_is_readable_but_not_writable(tmp_path: Path) -> None:
    """A keep path under /tmp (a venv, say) is visible read-only in the sample's fresh /tmp."""
    venv = tmp_path / "venv"
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "mod.py").write_text("X = 1\n")
    os.chmod(tmp_path, 0o755)
    res = run_inner(
        f"""
        VENV = {str(venv)!r}
        def body(wd):
            res = {{"read": open(VENV + "/lib/mod.py").read()}}
            for what, fn in (("write", lambda: open(VENV + "/lib/mod.py", "a")),
                             ("create", lambda: open(VENV + "/lib/evil.py", "w")),
                             ("rename", lambda: os.rename({str(tmp_path.parents[-3])!r}, "/tmp/moved"))):
                try:
                    fn()
                    res[what] = "ok"
                except OSError as exc:
                    res[what] = errno.errorcode[exc.errno]
            res["tmp"] = sorted(os.listdir("/tmp"))
            res["ro"] = bool(os.statvfs(VENV + "/lib").f_flag & os.ST_RDONLY)
            res["safe"] = import_path.import_path_is_safe([VENV + "/lib"])
            res["tmp_safe"] = import_path.import_path_is_safe(["/tmp"])
            return res
        emit(sample(body, keep=[VENV]))
        """,
        zygote_mounts=(str(venv),),
    )
    st, out = res
    assert st == {"exit": 0}
    assert out["read"] == "X = 1\n"
    assert out["write"] != "ok" and out["create"] != "ok"
    assert out["ro"] is True  # a read-only mount, not only permissions
    assert out["rename"] == "EPERM"  # the root-owned dir above the keep, in sticky /tmp
    assert out["tmp"] == sorted([tmp_path.parts[2], "work"])
    assert out["safe"] is None
    assert out["tmp_safe"] is not None and "/tmp" in out["tmp_safe"]


@needs_root_unshare
def test_enter_rejects_bad_arguments_before_touching_anything() -> None:
    """A relative keep path or a non-positive scratch size raises ValueError in the caller."""
    res = run_inner(
        """
        out = []
        for kw in ({"scratch_mb": 0, "keep": []}, {"scratch_mb": 8, "keep": ["rel/path"]}):
            try:
                namespaces.enter_sample_namespaces(uid=None, **kw)
                out.append("entered")
            except ValueError as exc:
                out.append(str(exc))
        emit({"out": out, "pid": os.readlink("/proc/self/ns/pid_for_children")
              == os.readlink("/proc/self/ns/pid")})
        """
    )
    assert "scratch_mb" in res["out"][0] and "rel/path" in res["out"][1]
    assert res["pid"] is True


@needs_root_unshare
def test_namespace_entry_costs_a_few_milliseconds() -> None:
    """Entering the sample's namespaces adds milliseconds, not tens of them, to a plain fork:
    in CPU time (the child's, from wait4), which a loaded machine does not inflate as it does
    the wall times printed beside it."""
    res = run_inner(
        """
        import statistics
        def once(ns):
            r, w = os.pipe()
            t0 = time.perf_counter()
            pid = os.fork()
            if pid == 0:
                try:
                    if ns:
                        namespaces.enter_sample_namespaces(scratch_mb=64, keep=[], uid=UID)
                    drop(UID)
                    os.write(w, b"x")
                finally:
                    os._exit(0)
            os.close(w)
            os.read(r, 1)
            ready = time.perf_counter() - t0
            _, _, usage = os.wait4(pid, 0)
            os.close(r)
            cpu = usage.ru_utime + usage.ru_stime
            return ready * 1e3, (time.perf_counter() - t0) * 1e3, cpu * 1e3
        out = {}
        for ns in (False, True):
            runs = [once(ns) for _ in range(50)]
            out["ns" if ns else "fork"] = [statistics.median(x) for x in zip(*runs)]
        emit(out)
        """
    )
    print(
        f"\nmedian ms (ready, round trip, child CPU): plain fork {res['fork']}, "
        f"with namespaces {res['ns']}"
    )
    assert res["ns"][2] - res["fork"][2] < 30


# --------------------------------------------------------------------------- seccomp

needs_seccomp_arch = pytest.mark.skipif(
    seccomp._native_arch() is None, reason="seccomp filter only for x86_64 and aarch64"
)


@needs_root_unshare
@needs_seccomp_arch
def test_keyrings_are_refused() -> None:
    """add_key, request_key and keyctl fail with EPERM under the filter (no cross-run keys)."""
    st, out = run_inner(
        """
        NR = seccomp.SYSCALLS[seccomp._native_arch()]
        def body(wd):
            calls = {
                "add_key": (NR["add_key"], b"user", b"fp", b"x", 1, -3),  # session keyring
                "request_key": (NR["request_key"], b"user", b"fp", None, 0),
                "keyctl": (NR["keyctl"], 0, -3, 0),  # KEYCTL_GET_KEYRING_ID
            }
            res = {}
            for name, args in calls.items():
                rc = libc.syscall(*[ctypes.c_long(a) if isinstance(a, int) else a for a in args])
                res[name] = errno.errorcode.get(ctypes.get_errno()) if rc == -1 else rc
            return res
        emit(sample(body, seccomp=True))
        """
    )
    assert st == {"exit": 0}
    assert out == {"add_key": "EPERM", "request_key": "EPERM", "keyctl": "EPERM"}


@needs_root_unshare
@needs_seccomp_arch
def test_unix_and_other_socket_families_are_refused_but_socketpair_works() -> None:
    """socket(AF_UNIX / AF_NETLINK / AF_VSOCK) fail with EPERM; socketpair and AF_INET work."""
    st, out = run_inner(
        """
        def body(wd):
            res = {}
            for name, fam in (("unix", socket.AF_UNIX), ("netlink", 16), ("vsock", 40)):
                try:
                    socket.socket(fam, socket.SOCK_DGRAM).close()
                    res[name] = "created"
                except OSError as exc:
                    res[name] = errno.errorcode[exc.errno]
            a, b = socket.socketpair()
            a.sendall(b"ping")
            res["pair"] = b.recv(4).decode()
            socket.socket(socket.AF_INET, socket.SOCK_STREAM).close()
            socket.socket(socket.AF_INET6, socket.SOCK_STREAM).close()
            res["inet"] = "created"
            return res
        emit(sample(body, seccomp=True))
        """
    )
    assert st == {"exit": 0}
    assert out == {
        "unix": "EPERM",
        "netlink": "EPERM",
        "vsock": "EPERM",
        "pair": "ping",
        "inet": "created",
    }


@needs_root_unshare
@needs_seccomp_arch
def test_tracing_namespaces_and_risky_subsystems_are_refused() -> None:
    """ptrace, unshare, clone(CLONE_NEWUSER), mount, bpf, io_uring and friends get EPERM."""
    res = run_inner(
        """
        NR = seccomp.SYSCALLS[seccomp._native_arch()]
        def probe():
            L = ctypes.c_long
            calls = {
                "ptrace": (NR["ptrace"], L(0), L(0), L(0), L(0)),  # PTRACE_TRACEME
                "unshare": (NR["unshare"], L(syscalls.CLONE_NEWUSER)),
                "clone_newuser": (NR["clone"], L(syscalls.CLONE_NEWUSER | signal.SIGCHLD), L(0), L(0), L(0), L(0)),
                "setns": (NR["setns"], L(-1), L(0)),
                "mount": (NR["mount"], b"none", b"/tmp", b"tmpfs", L(0), None),
                "bpf": (NR["bpf"], L(0), None, L(0)),
                "perf_event_open": (NR["perf_event_open"], None, L(0), L(-1), L(-1), L(0)),
                "userfaultfd": (NR["userfaultfd"], L(0)),
                "io_uring_setup": (NR["io_uring_setup"], L(1), None),
                "process_vm_readv": (NR["process_vm_readv"], L(1), None, L(0), None, L(0), L(0)),
            }
            out = {}
            for name, args in calls.items():
                pid = os.fork()
                if pid == 0:  # one child per call: a call that works (clone) must not go on
                    rc = libc.syscall(*args)
                    e = ctypes.get_errno()
                    os._exit(0 if rc == 0 else 200 if e == errno.EPERM else 100 + min(e, 99))
                _, st = os.waitpid(pid, 0)
                code = os.WEXITSTATUS(st) if os.WIFEXITED(st) else -1
                out[name] = "EPERM" if code == 200 else "ok" if code in (0, 1) else code
            return out
        def filtered(wd):
            return probe()
        def unfiltered(wd):
            return probe()
        emit({"with": sample(filtered, seccomp=True), "without": sample(unfiltered)})
        """
    )
    st, out = res["with"]
    assert st == {"exit": 0}
    assert set(out.values()) == {"EPERM"}, out
    _, control = res["without"]
    assert control["ptrace"] == "ok"  # the filter, not the uid, refused it above


@needs_root_unshare
@needs_seccomp_arch
def test_threads_forks_and_subprocesses_still_work_under_the_filter() -> None:
    """Threads (clone3 -> ENOSYS -> clone), fork and subprocess run normally under the filter."""
    st, out = run_inner(
        """
        def body(wd):
            import subprocess, threading
            box = []
            t = threading.Thread(target=lambda: box.append(1))
            t.start()
            t.join()
            pid = os.fork()
            if pid == 0:
                os._exit(7)
            _, fst = os.waitpid(pid, 0)
            true = "/bin/true" if os.path.exists("/bin/true") else "/usr/bin/true"
            return {"thread": box, "fork": os.WEXITSTATUS(fst),
                    "spawn": subprocess.run([true]).returncode}
        emit(sample(body, seccomp=True))
        """
    )
    assert st == {"exit": 0}
    assert out == {"thread": [1], "fork": 7, "spawn": 0}


@needs_root_unshare
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x32 exists only on x86_64")
def test_x32_syscall_kills_the_process() -> None:
    """A syscall with the x32 bit set kills the sample (SIGSYS) instead of reaching the kernel."""
    st, _ = run_inner(
        """
        def body(wd):
            libc.syscall(ctypes.c_long(0x40000000 | 39))  # x32 getpid
            return "survived"
        emit(sample(body, seccomp=True))
        """
    )
    assert st == {"signal": "SIGSYS"}


def _header_numbers(path: str) -> dict[str, int]:
    nums: dict[str, int] = {}
    for m in re.finditer(r"^#define __NR(?:3264)?_(\w+)\s+(\d+)\s*$", Path(path).read_text(), re.M):
        nums.setdefault(m.group(1), int(m.group(2)))
    return nums


@pytest.mark.parametrize(
    ("arch", "header"),
    [
        ("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
        ("x86_64", "/usr/include/asm/unistd_64.h"),
        ("aarch64", "/usr/include/asm-generic/unistd.h"),
        ("aarch64", "/usr/include/aarch64-linux-gnu/asm/unistd.h"),
    ],
)
def test_syscall_numbers_match_the_kernel_headers(arch: str, header: str) -> None:
    """Every number in the filter's table is the one the kernel's own header gives."""
    if not os.path.exists(header) or "__NR_" not in Path(header).read_text():
        pytest.skip(f"{header} is not installed")
    nums = _header_numbers(header)
    table = seccomp.SYSCALLS[arch]
    present = {name: nums[name] for name in table if name in nums}
    assert len(present) >= len(table) - 8, "the header is too old to check most of the table"
    assert present == {name: table[name] for name in present}


def test_filter_checks_the_arch_first_and_is_refused_elsewhere(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The program kills on a foreign audit arch; on another machine nothing is installed."""
    for arch, audit in (
        ("x86_64", seccomp.AUDIT_ARCH_X86_64),
        ("aarch64", seccomp.AUDIT_ARCH_AARCH64),
    ):
        prog = seccomp.seccomp_program(arch)
        assert prog[0] == (0x20, 0, 0, 4)  # load seccomp_data.arch
        code, jt, jf, k = prog[1]
        assert (code, jt, k) == (0x15, 0, audit)
        assert prog[2 + jf] == (0x06, 0, 0, seccomp.SECCOMP_RET_KILL_PROCESS)
    real = os.uname()
    fake = os.uname_result(("Linux", real.nodename, real.release, real.version, "riscv64"))
    monkeypatch.setattr(os, "uname", lambda: fake)
    assert seccomp.install_seccomp() is False


# --------------------------------------------------------------------------- cgroups


@pytest.fixture
def slot_cgroups() -> Iterator[cgroups.SlotCgroups]:
    if os.geteuid() != 0:
        pytest.skip("needs root to create cgroups")
    cg = cgroups.SlotCgroups.create(f"fp-contain-test-{os.getpid()}", 2)
    if cg is None:
        pytest.skip("no writable memory cgroup on this host")
    try:
        yield cg
    finally:
        cg.close()
        assert not os.path.exists(cg.base), "the test's cgroups were not removed"


def _in_slot(cg: cgroups.SlotCgroups, slot: int, code: str, as_limit_mb: int) -> int:
    """Fork a child into ``slot`` with RLIMIT_AS ``as_limit_mb`` above what this process already
    maps (earlier tests leave threads and modules behind), run ``code``, return its wait status."""
    pid = os.fork()
    if pid == 0:
        try:
            cg.enter(slot)
            with open("/proc/self/statm") as statm:
                mapped = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            lim = mapped + (as_limit_mb << 20)
            resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
            exec(code, {"os": os, "time": time})
        finally:
            os._exit(0)
    return os.waitpid(pid, 0)[1]


def test_slot_cgroup_oom_kills_a_sample_whose_processes_together_exceed_the_limit(
    slot_cgroups: cgroups.SlotCgroups,
) -> None:
    """Eight forks of 200 MB each under a 512 MB slot are OOM-killed, though each fits RLIMIT_AS."""
    cg = slot_cgroups
    cg.set_limit(0, 512 << 20)
    alone = _in_slot(cg, 0, "x = b'x' * (200 << 20); time.sleep(0.1)", as_limit_mb=400)
    assert os.WIFEXITED(alone) and os.WEXITSTATUS(alone) == 0  # one such process is fine
    before = cg.oom_kills(0)
    code = textwrap.dedent(
        """
        kids = []
        for _ in range(8):
            pid = os.fork()
            if pid == 0:
                try:
                    x = b'x' * (200 << 20)
                    time.sleep(3)
                finally:
                    os._exit(0)
            kids.append(pid)
        killed = sum(os.WIFSIGNALED(os.waitpid(p, 0)[1]) for p in kids)
        os._exit(min(killed, 100))
        """
    )
    st = _in_slot(cg, 0, code, as_limit_mb=400)
    killed = os.WEXITSTATUS(st) if os.WIFEXITED(st) else 8  # the parent itself may be the victim
    assert killed >= 1
    assert cg.oom_kills(0) > before
    assert cg.oom_kills(1) == 0  # the other slot is untouched


def test_slot_cgroup_limits_enter_and_close(slot_cgroups: cgroups.SlotCgroups) -> None:
    """Limits go up and down in either order, a child lands in its slot, close removes all."""
    cg = slot_cgroups
    assert cg.kind in ("cgroup1", "cgroup2")
    limit_file = "memory.max" if cg.kind == "cgroup2" else "memory.limit_in_bytes"
    for nbytes in (64 << 20, 1 << 30, 32 << 20):
        cg.set_limit(1, nbytes)
        assert int(Path(cg.dirs[1], limit_file).read_text()) == nbytes
    text = _child_in(lambda: cg.enter(1))
    assert f"/{os.path.basename(cg.base)}/slot-1" in text


def _child_in(enter: Any, spin_s: float = 0.0) -> str:
    """Fork a child that joins cgroups with ``enter()``, spins ``spin_s`` of CPU time, and
    returns its /proc/self/cgroup."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            enter()
            end = time.process_time() + spin_s
            while time.process_time() < end:
                pass
            os.write(w, Path("/proc/self/cgroup").read_bytes())
        finally:
            os._exit(0)
    os.close(w)
    text = os.read(r, 65536).decode()
    os.close(r)
    os.waitpid(pid, 0)
    return text


def test_slot_cgroups_count_a_sample_s_cpu_and_keep_judges_apart(
    slot_cgroups: cgroups.SlotCgroups,
) -> None:
    """A slot's CPU time is its own processes'; the judge cgroup is another; equal weights, and
    the sample's quota is one CPU."""
    cg = slot_cgroups
    if cg.cpu_kind is None or cg.usage is None:
        pytest.skip("no writable cpu cgroup on this host")
    before = [cg.cpu_usage(0), cg.cpu_usage(1)]
    text = _child_in(lambda: cg.enter(1), spin_s=0.2)
    after = [cg.cpu_usage(0), cg.cpu_usage(1)]
    assert after[0] == before[0]
    assert after[1] is not None and before[1] is not None and after[1] - before[1] >= 0.15
    cpu_lines = [ln for ln in text.splitlines() if "cpu" in ln.split(":")[1].split(",")]
    assert cpu_lines and all(ln.endswith("/slot-1") for ln in cpu_lines), text
    judged = _child_in(lambda: cg.enter_judge(1))
    assert "/judge-1" in judged and "/slot-1" not in judged, judged
    assert cg.cpu_usage(1) == after[1]  # a judge's CPU is not the sample's
    tree = next(t for t in cg.trees if "cpu" in t.controllers)
    if tree.kind == "cgroup1":
        assert Path(tree.slot_dirs[0], "cpu.shares").read_text().strip() == "1024"
        assert Path(tree.judge_dirs[0], "cpu.shares").read_text().strip() == "1024"
        if tree.quota:
            quota = int(Path(tree.slot_dirs[0], "cpu.cfs_quota_us").read_text())
            period = int(Path(tree.slot_dirs[0], "cpu.cfs_period_us").read_text())
            assert quota == period * cgroups.SAMPLE_CPUS
    else:
        assert Path(tree.slot_dirs[0], "cpu.weight").read_text().strip() == "100"


def test_slot_cgroups_on_a_cgroup2_host_use_one_tree_for_memory_and_cpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """cgroup v2 (simulated: the interface files in a directory): memory and cpu in one tree,
    weights on every cgroup, the sample's quota in cpu.max, its usage from cpu.stat."""
    files = {
        "cgroup.controllers": "cpuset cpu io memory pids\n",
        "cgroup.subtree_control": "\n",
        "cgroup.procs": "",
        "memory.max": "max\n",
        "memory.swap.max": "max\n",
        "memory.oom.group": "0\n",
        "memory.events": "oom 0\noom_kill 0\n",
        "cpu.weight": "100\n",
        "cpu.max": "max 100000\n",
        "cpu.stat": "usage_usec 2500000\nuser_usec 2000000\n",
    }

    def populate(d: str) -> None:
        for name, text in files.items():
            if not os.path.exists(os.path.join(d, name)):
                Path(d, name).write_text(text)

    real_makedirs = os.makedirs

    def makedirs(d: str, mode: int = 0o777, exist_ok: bool = False) -> None:
        real_makedirs(d, mode, exist_ok)
        populate(d)

    own = tmp_path / "own"
    own.mkdir()
    populate(str(own))
    monkeypatch.setattr(
        cgroups, "_own_cgroup_dirs", lambda controller="memory": [("cgroup2", str(own))]
    )
    monkeypatch.setattr(os, "makedirs", makedirs)  # the os module cgroups calls
    cg = cgroups.SlotCgroups.create("fp-v2", 2)
    assert cg is not None
    assert [t.kind for t in cg.trees] == ["cgroup2"]
    assert cg.trees[0].controllers == {"memory", "cpu"}
    assert cg.kind == "cgroup2" and cg.cpu_kind == "cgroup2"
    base = own / "fp-v2"
    assert (base / "cpu.weight").read_text().strip() == "200"  # one default weight per slot
    assert (base / "slot-1" / "cpu.max").read_text().split() == [
        str(int(cgroups.SAMPLE_CPUS * 100_000)),
        "100000",
    ]
    assert (base / "judge-1" / "cpu.max").read_text().startswith("max")  # judges: weight only
    assert (base / "slot-0" / "memory.oom.group").read_text().strip() == "1"
    assert cg.cpu_rate == cgroups.SAMPLE_CPUS
    assert cg.cpu_usage(1) == pytest.approx(2.5)
    cg.set_judge_limit(0, 3 << 30)
    assert (base / "judge-0" / "memory.max").read_text().strip() == str(3 << 30)
    assert cg.judge_oom_kills(0) == 0
    assert cg._judge_procs[1] == [str(base / "judge-1" / "cgroup.procs")]


# --------------------------------------------------------------------------- zygote mounts


@needs_root_unshare
def test_zygote_mounts_bind_a_tmp_install_back_read_only(tmp_path: Path) -> None:
    """A venv under /tmp survives the zygote's tmpfs read-only and its import path checks safe."""
    venv = tmp_path / "venv"
    (venv / "lib").mkdir(parents=True)
    (venv / "lib" / "mod.py").write_text("X = 1\n")
    os.chmod(tmp_path, 0o755)
    res = run_inner(
        f"""
        VENV = {str(venv)!r}
        missing_before = import_path.import_path_is_safe([VENV + "/nothing-here"])
        mounts.private_mounts([], [VENV])
        out = {{"read": open(VENV + "/lib/mod.py").read(), "tmp": sorted(os.listdir("/tmp")),
                "safe": import_path.import_path_is_safe([VENV + "/lib", VENV + "/lib/missing.zip"]),
                "scratch_entry": import_path.import_path_is_safe(["/tmp/not-there"])}}
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            drop(UID)
            res = {{}}
            for name, target in (("venv", VENV + "/lib/evil.py"), ("tmp_root", "/tmp/evil.py"),
                                 ("rename", None)):
                try:
                    if target is None:
                        os.rename({str(tmp_path.parents[-3])!r}, "/tmp/moved")
                    else:
                        open(target, "w").close()
                    res[name] = "ok"
                except OSError as exc:
                    res[name] = errno.errorcode[exc.errno]
            os.write(w, json.dumps(res).encode())
            os._exit(0)
        os.close(w)
        out["sample"] = json.loads(os.read(r, 4096))
        os.waitpid(pid, 0)
        out["root_write"] = None
        try:
            open(VENV + "/lib/evil.py", "w")
        except OSError as exc:
            out["root_write"] = errno.errorcode[exc.errno]
        out["missing_before"] = missing_before
        emit(out)
        """,
        zygote_mounts=None,
    )
    assert res["read"] == "X = 1\n"
    assert res["tmp"] == [tmp_path.parts[2]]
    assert res["safe"] is None
    assert res["root_write"] == "EROFS"
    # a sample's uid: nothing in the venv, anything in /tmp itself, and the dirs above stay put
    assert res["sample"] == {"venv": "EROFS", "tmp_root": "ok", "rename": "EPERM"}
    assert res["missing_before"] is None  # on the host's disk, before the tmpfs
    assert res["scratch_entry"] is not None and "/tmp" in res["scratch_entry"]


@needs_root_unshare
def test_zygote_mounts_cover_run_and_the_lock_dirs() -> None:
    """/run is an empty read-only tmpfs but for a fresh writable /run/lock; host sockets vanish."""
    res = run_inner(
        """
        host_run = sorted(os.listdir("/run"))
        mounts.private_mounts([], [])
        out = {"host_run": host_run, "run": sorted(os.listdir("/run"))}
        try:
            os.mkdir("/run/x")
            out["mkdir"] = "ok"
        except OSError as exc:
            out["mkdir"] = errno.errorcode[exc.errno]
        st = os.stat("/run/lock")
        out["lock_mode"] = oct(st.st_mode & 0o7777)
        out["lock_empty"] = os.listdir("/run/lock") == []
        out["var_lock"] = os.path.realpath("/var/lock")
        out["shm_empty"] = os.listdir("/dev/shm") == []
        emit(out)
        """,
        zygote_mounts=None,
    )
    assert res["run"] == ["lock"]
    assert res["mkdir"] == "EROFS"
    assert res["lock_mode"] == "0o1777" and res["lock_empty"] is True
    assert res["shm_empty"] is True
    if "postgresql" in res["host_run"]:
        assert "postgresql" not in res["run"]


@needs_root_unshare
def test_hidden_file_shows_as_an_empty_unreadable_file() -> None:
    """A hidden file reads as empty to root, is mode 0000 and unreadable to a sample's uid."""
    target = "/etc/hostname"
    if not os.path.isfile(target):
        pytest.skip(f"{target} does not exist here")
    res = run_inner(
        f"""
        T = {target!r}
        mounts.private_mounts([T], [])
        st = os.stat(T)
        out = {{"size": st.st_size, "mode": st.st_mode & 0o7777, "uid": st.st_uid,
                "root_reads": open(T).read()}}
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            drop(UID)
            try:
                open(T).read()
                os.write(w, b"read")
            except OSError as exc:
                os.write(w, errno.errorcode[exc.errno].encode())
            os._exit(0)
        os.close(w)
        out["sample"] = os.read(r, 100).decode()
        os.waitpid(pid, 0)
        try:
            open(T, "w")
            out["root_write"] = "ok"
        except OSError as exc:
            out["root_write"] = errno.errorcode[exc.errno]
        emit(out)
        """,
        zygote_mounts=None,
    )
    assert res == {
        "size": 0,
        "mode": 0,
        "uid": 0,
        "root_reads": "",
        "sample": "EACCES",
        "root_write": "EROFS",
    }


@needs_root_unshare
def test_hidden_dir_is_empty_but_keeps_a_kept_subdir() -> None:
    """A hidden directory is an empty read-only tmpfs, with a kept path inside bound back."""
    base = "/usr/share/doc"
    subs = (
        sorted(d for d in os.listdir(base) if os.path.isdir(f"{base}/{d}"))
        if os.path.isdir(base)
        else []
    )
    if not subs:
        pytest.skip(f"{base} has no subdirectory here")
    kept = f"{base}/{subs[0]}"
    res = run_inner(
        f"""
        mounts.private_mounts([{base!r}], [{kept!r}])
        emit({{"listing": os.listdir({base!r}), "kept": sorted(os.listdir({kept!r})),
               "hidden_safe": import_path.import_path_is_safe([{base!r}])}})
        """,
        zygote_mounts=None,
    )
    assert res["listing"] == [subs[0]]
    assert res["kept"] == sorted(os.listdir(kept))
    assert res["hidden_safe"] is None  # read-only: nothing can be planted there


@needs_root_unshare
def test_hide_inside_a_kept_path_stays_hidden(tmp_path: Path) -> None:
    """A hidden file inside a kept venv under /tmp is still hidden after the keep is bound back."""
    venv = tmp_path / "venv"
    venv.mkdir()
    (venv / "secret.txt").write_text("s3cret")
    (venv / "mod.py").write_text("X = 1\n")
    res = run_inner(
        f"""
        V = {str(venv)!r}
        mounts.private_mounts([V + "/secret.txt"], [V])
        emit({{"secret": open(V + "/secret.txt").read(), "mode": os.stat(V + "/secret.txt").st_mode & 0o777,
               "mod": open(V + "/mod.py").read()}})
        """,
        zygote_mounts=None,
    )
    assert res == {"secret": "", "mode": 0, "mod": "X = 1\n"}


@needs_root_unshare
def test_missing_hide_path_raises_naming_it_and_missing_defaults_are_skipped() -> None:
    """A hide path that does not exist raises before any mount; a missing default is skipped."""
    res = run_inner(
        """
        before = open("/proc/self/mountinfo").read()
        try:
            mounts.private_mounts(["/no/such/secret"], [])
            raised = None
        except OSError as exc:
            raised = [type(exc).__name__, str(exc)]
        untouched = open("/proc/self/mountinfo").read() == before
        mounts.private_mounts([], [], default_hide=["/no/such/default"])
        emit({"raised": raised, "untouched": untouched})
        """,
        zygote_mounts=None,
    )
    assert res["raised"][0] == "FileNotFoundError"
    assert "/no/such/secret" in res["raised"][1]
    assert res["untouched"] is True


# --------------------------------------------------------------------------- import paths


def test_import_path_check_flags_writable_dirs(tmp_path: Path) -> None:
    """World-writable, non-root-owned or missing-under-writable entries are flagged; 0755 root is not."""
    if os.geteuid() != 0:
        pytest.skip("needs root to own the test directories")
    os.chmod(tmp_path, 0o755)
    ok = tmp_path / "ok"
    ok.mkdir(mode=0o755)
    ww = tmp_path / "ww"
    ww.mkdir()
    os.chmod(ww, 0o777)
    owned = tmp_path / "owned"
    owned.mkdir(mode=0o755)
    os.chown(owned, UID, UID)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    os.chmod(sticky, 0o1777)
    (sticky / "inner").mkdir(mode=0o755)
    assert import_path.import_path_is_safe([str(ok), str(ok / "missing.zip")]) is None
    flagged = import_path.import_path_is_safe([str(ok), str(ww)])
    assert flagged is not None and str(ww) in flagged and "writable" in flagged
    assert str(owned) in (import_path.import_path_is_safe([str(owned / "pkg")]) or "")
    assert import_path.import_path_is_safe([str(ww / "lib" / "missing")]) is not None
    assert (
        import_path.import_path_is_safe([str(sticky)]) is not None
    )  # anyone may create names in it
    assert (
        import_path.import_path_is_safe([str(sticky / "inner")]) is None
    )  # a root-owned sticky ancestor
    link = tmp_path / "link"
    link.symlink_to(ww)
    assert import_path.import_path_is_safe([str(link)]) is not None  # judged by its target too


def test_keep_paths_include_installs_under_tmp_and_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """An interpreter or package under /tmp, /run or a hide path must be kept; /usr need not."""
    monkeypatch.setattr(sys, "base_prefix", "/tmp/fp-fake-python")
    monkeypatch.setattr(sys, "prefix", "/run/fp-fake-venv")
    monkeypatch.setattr(sys, "executable", "/tmp/fp-fake-python/bin/python3")
    assert mounts.keep_paths((), False, "/usr/lib/fp-fake/firstpass/sandbox") == (
        "/tmp/fp-fake-python",
    )
    assert mounts.keep_paths(("/srv",), True, "/srv/app/firstpass/sandbox") == (
        "/run/fp-fake-venv",
        "/srv/app/firstpass/sandbox",
        "/tmp/fp-fake-python",
    )
    monkeypatch.setattr(sys, "base_prefix", "/usr")
    monkeypatch.setattr(sys, "executable", "/usr/bin/python3")
    assert mounts.keep_paths((), False, "/usr/lib/fp-fake") == ()


def test_containment_loads_the_zygote_s_way_under_isolated_mode() -> None:
    """The zygote's ``python -I -S`` loads the containment modules through boot.py, stdlib only."""
    code = (
        f"import runpy; runpy.run_path({boot.__file__!r})['load']()\n"
        f"from {boot.PACKAGE} import cgroups, namespaces\n"
        "print(namespaces.enter_sample_namespaces.__name__, cgroups.SlotCgroups.__name__)"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True, check=True, env={}
    ).stdout
    assert "enter_sample_namespaces" in out and "SlotCgroups" in out
