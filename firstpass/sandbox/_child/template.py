"""T, the template: forked from Z before any request, it forks every worker, judge and sweeper.

Why a template: its memory holds no test, no expected value and no other sample's code, and
so does every process it forks; and Z's loop, the sandbox's one serial path, does not pay for
the forks. Stdlib only.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import signal
import socket
from typing import TYPE_CHECKING, Any

from .sharing import DATA_KEY
from .standby import STANDBY_NICE, Standby, fork_or_none, fork_standby, warm_judge
from .uids import slot_uid, sweep, sweeper_main

if TYPE_CHECKING:
    from .cgroups import SlotCgroups
    from .frames import ZygoteConfig


def template_main(sock: socket.socket, cfg: ZygoteConfig, cgroups: SlotCgroups | None) -> None:
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
    #: pid -> (kind, what it is of): a job's id, a sweep's token, a slot's key...; unchecked:
    #: the kind says which (a tagged union mypy cannot follow through the unpacking below)
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
                    rpid = fork_or_none() if uids or hdr.get("remove") else None
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
