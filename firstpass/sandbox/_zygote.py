"""The zygote: a long-lived ``python -I -S`` inside the sandbox that runs samples on request.

Processes (docs/sandbox.md has the picture):

* **Z** (this loop): reads requests from the proxy on stdin, answers on stdout (length-prefixed
  JSON), plans each test, supervises workers (pipes, caps, deadlines), cleans up, judges.
  It runs no sample code and no client test code.
* **T** (template): forked from Z *before the first request*, so its memory holds no test data,
  no expected values and no other sample's code. It only forks workers on Z's behalf (the pipes
  arrive over a unix socket) and reports their exit status. It is a child subreaper, so
  orphaned grandchildren of a sample are reaped rather than left as zombies.
* **W** (worker, one per sample): forked from T; drops to the slot's uid, rlimits, work dir,
  then loads the sample and ships test *values* back (``_harness.run_worker``).
* **J** (judge, only when an assert needs setup code): forked from Z, drops to a second uid,
  evaluates assert skeletons over the values. Cases and simple asserts are judged in Z.
* **R** (reaper): forked from Z, becomes the slot's uid and ``kill(-1, SIGKILL)``s everything
  running as it, including grandchildren that left the process group.

Stdlib only, and started with ``-I -S``: this file must not import firstpass.
"""

from __future__ import annotations

import ast
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
import _harness as H

MAXFD = 4096
#: stdlib modules imported once here, so samples neither pay for nor need to find them
PRELOAD = (
    "array",
    "bisect",
    "collections",
    "copy",
    "datetime",
    "decimal",
    "fractions",
    "functools",
    "heapq",
    "itertools",
    "operator",
    "random",
    "re",
    "statistics",
    "string",
    "typing",
)
STRAY_DIRS = ("/tmp", "/var/tmp", "/dev/shm")


# --------------------------------------------------------------------------- T and W


def template_main(sock: socket.socket) -> None:
    """T: fork workers and reapers on Z's behalf; report pids, exit statuses and finished sweeps.

    Never returns. Reapers are forked here rather than in Z so that Z's loop, the sandbox's one
    serial path, does not pay for a fork per sample.
    """
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
    children: dict[int, tuple[str, int]] = {}
    sel = selectors.DefaultSelector()
    sel.register(sock, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in sel.select():
            if key.fileobj is sock:
                try:
                    msg, fds, _, _ = socket.recv_fds(sock, 1 << 16, 4)
                except OSError:
                    os._exit(0)
                if not msg:
                    os._exit(0)  # Z is gone
                hdr = json.loads(msg)
                if "sweep" in hdr:
                    try:
                        pid = os.fork()
                    except OSError:
                        pid = -1
                    if pid == 0:
                        reap_as(hdr["sweep"])
                    if pid > 0:
                        children[pid] = ("sweep", hdr["token"])
                    else:  # could not fork: do it here, the slow way
                        sweep(hdr["sweep"])
                        sock.send(json.dumps({"swept": hdr["token"]}).encode())
                    continue
                try:
                    pid = os.fork()
                except OSError as exc:
                    for fd in fds:
                        os.close(fd)
                    sock.send(json.dumps({"job": hdr["job"], "error": str(exc)}).encode())
                    continue
                if pid == 0:
                    worker_boot(hdr, fds)
                for fd in fds:
                    os.close(fd)
                children[pid] = ("job", hdr["job"])
                if hdr["uid"] is None:  # Z kills by process group then, so it needs the pid
                    sock.send(json.dumps({"job": hdr["job"], "pid": pid}).encode())
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
                    if kind == "job":
                        sock.send(json.dumps({"job": ident, "status": status}).encode())
                    elif kind == "sweep":
                        sock.send(json.dumps({"swept": ident}).encode())


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


def drop_privileges(uid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def worker_boot(hdr: dict[str, Any], fds: list[int]) -> None:
    """W: isolate this fresh fork, then read the job and run it. Never returns."""
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        ctl, out_w, err_w = fds
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.dup2(ctl, 3)
        os.closerange(4, MAXFD)  # every inherited fd but the result channel
        drop_privileges(hdr["uid"])
        set_limits(hdr["limits"])
        os.chdir(hdr["workdir"])
        os.umask(0o077)
        os.environ.clear()
        job = H.read_frame(3)
        H.run_worker(3, job)
        sys.stdout.flush()
    except BaseException:
        pass
    finally:
        os._exit(0)


# --------------------------------------------------------------------------- Z


class Job:
    """One sample being run: its pipes, received records and the reason it ended."""

    def __init__(self, req: dict[str, Any], zygote: Zygote) -> None:
        self.req = req
        self.id: int = req["id"]
        self.slot: int = req["slot"]
        self.limits: dict[str, Any] = req["limits"]
        self.mode: str = req["mode"]
        self.start = time.monotonic()
        self.deadline = self.start + float(self.limits["wall_s"])
        self.uid = zygote.uid(self.slot, judge=False)
        self.judge_uid = zygote.uid(self.slot, judge=True)
        self.workdir = ""
        self.ctl: socket.socket | None = None
        self.pipes: dict[int, str] = {}
        self.frames = H.FrameBuffer()
        self.records: list[dict[str, Any] | None] = []
        self.load: dict[str, Any] | None = None
        self.done = False
        self.finished = False  # finish() ran: the verdict is decided (maybe still in J)
        self.ctl_eof = False
        self.w_pid: int | None = None
        self.w_status: int | None = None
        self.end: str | None = None  # violation | output | timeout | start
        self.end_msg = ""
        self.out_bytes = 0
        self.plans: list[H.Plan] = []
        self.modules: frozenset[str] = frozenset()
        self.n = 0
        self.j_pid: int | None = None
        self.j_fd: int | None = None
        self.j_buf = H.FrameBuffer()
        self.j_deadline = 0.0
        self.marks: dict[str, float] = {}
        probe = req.get("probe")
        self.n_probe: int | None = len(probe) if isinstance(probe, list) else None
        self.probe_outs: list[Any] | None = None
        self.behaviour: dict[str, Any] | None = None

    def mark(self, name: str) -> None:
        self.marks.setdefault(name, round((time.monotonic() - self.start) * 1000, 3))


class Zygote:
    def __init__(
        self, cfg: dict[str, Any], chan_in: int, chan_out: int, tsock: socket.socket, root: str
    ) -> None:
        self.cfg = cfg
        self.chan_in, self.chan_out, self.tsock, self.root = chan_in, chan_out, tsock, root
        self.sel = selectors.DefaultSelector()
        self.registered = self.sel.get_map()  # a live view: fd -> its current key
        self.jobs: dict[int, Job] = {}
        self.inbuf = H.FrameBuffer()
        self.closing = False
        self.used_slots: set[int] = set()
        self.sweeping: dict[int, Job] = {}  # job id -> job whose uid T is sweeping
        self.busy_slots: set[int] = set()  # slots whose sweep has not finished
        self.waiting: dict[int, list[dict[str, Any]]] = {}  # slot -> requests queued behind it
        os.set_blocking(chan_in, False)
        self.sel.register(chan_in, selectors.EVENT_READ, ("in", None))
        self.sel.register(tsock, selectors.EVENT_READ, ("t", None))

    def uid(self, slot: int, *, judge: bool) -> int | None:
        base = self.cfg.get("uid_base")
        if base is None:
            return None
        slots = int(self.cfg["slots"])
        if not 0 <= slot < slots:
            raise ValueError("slot out of range")
        # each zygote of a sandbox has its own lane of uids: one zygote's cleanup after it has
        # answered must never hit a job another zygote started on the same slot meanwhile
        return int(base) + 2 * (int(self.cfg.get("lane", 0)) * slots + slot) + (1 if judge else 0)

    # ---- I/O with the proxy

    def send(self, obj: dict[str, Any]) -> None:
        H.write_all(self.chan_out, H.encode_frame(obj))

    def loop(self) -> None:
        if self.cfg.get("sweep_at_start") and self.cfg.get("uid_base") is not None:
            for slot in range(int(self.cfg["slots"])):
                sweep(self.uid(slot, judge=False))  # type: ignore[arg-type]
                sweep(self.uid(slot, judge=True))  # type: ignore[arg-type]
        self.send({"ready": True, "pid": os.getpid(), "root": self.root})
        while not (self.closing and not self.jobs):
            timeout = self.next_timeout()
            for key, _ in self.sel.select(timeout):
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
            for job in list(self.jobs.values()):
                if not job.finished and now >= job.deadline:
                    job.end, job.end_msg = "timeout", "wall-clock limit reached"
                    self.finish(job)
                elif job.j_pid is not None and now >= job.j_deadline:
                    self.read_judge(job)  # an answer that came in since select() still counts
                    if job.j_pid is not None:
                        self.judge_done(job, timed_out=True)
        self.shutdown()

    def next_timeout(self) -> float | None:
        deadlines = [
            j.j_deadline if j.j_pid is not None else j.deadline for j in self.jobs.values()
        ]
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - time.monotonic())

    def dispatch(self, kind: str, job: Job | None, fileobj: Any) -> None:
        if kind == "in":
            self.read_requests()
        elif kind == "t":
            self.read_template()
        elif job is not None and kind == "ctl":
            self.read_ctl(job)
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
                if not job.finished:  # one being judged gets its verdict from J
                    job.end, job.end_msg = "start", "the sandbox is shutting down"
                    self.finish(job)
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
        job = self.jobs.get(info["job"])
        if job is None:
            return
        if "pid" in info:
            job.w_pid = info["pid"]
            job.mark("forked")
        elif "status" in info:
            job.w_status = info["status"]
            job.mark("status")
            self.maybe_finish(job)
        elif "error" in info:
            job.end, job.end_msg = "start", f"could not start the worker: {info['error']}"
            self.finish(job)

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
            sweep(job.uid)  # a previous zygote may have died with this slot's processes alive
            sweep(job.judge_uid)
        n = len(req["tests"])
        job.n = n
        job.records = [None] * n
        try:
            tree = ast.parse(req["code"])
        except (SyntaxError, ValueError, RecursionError, MemoryError) as exc:
            line = f" (line {exc.lineno})" if isinstance(exc, SyntaxError) and exc.lineno else ""
            msg = H.short(f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}{line}")
            self.respond(job, [H.verdict(False, "syntax_error", msg)] * n)
            return
        if job.mode == "asserts":
            setup_tree = ast.parse(req["setup"]) if req.get("setup") else None
            sample_b = H.bindings(tree)
            setup_b = H.bindings(setup_tree) if setup_tree else None
            job.plans = H.plan_asserts(
                req["tests"], sample_b, setup_b, H.setup_is_simple(setup_tree)
            )
            job.modules = sample_b.safe_imports
            wtests: list[Any] = [list(p.leaves) for p in job.plans]
        else:
            wtests = req["tests"]
        lim = job.limits
        budget = min(float(lim["cpu_s"]), float(lim["wall_s"]))
        per_test = (
            budget if n <= 1 else max(0.1, min(budget, float(lim.get("test_s") or budget / 4)))
        )
        wjob = {
            "mode": "cases" if job.mode != "asserts" else "asserts",
            "code": req["code"],
            "setup": req.get("setup"),
            "entry_point": req.get("entry_point"),
            "tests": wtests,
            "per_test_s": per_test,
            "load_s": budget,
        }
        if job.n_probe is not None:  # behaviour: outputs on the probe inputs, recorded only
            wjob["probe"] = req["probe"]
            wjob["probe_s"] = float(req.get("probe_s") or 0.05)
            wjob["probe_entry"] = req.get("probe_entry")
        job.mark("planned")
        job.workdir = os.path.join(self.root, f"s{job.slot}-{job.id}")
        os.mkdir(job.workdir, 0o700)
        if job.uid is not None:
            os.chown(job.workdir, job.uid, job.uid)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        ctl, ctl_w = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        hdr = {"job": job.id, "uid": job.uid, "workdir": job.workdir, "limits": lim}
        try:
            socket.send_fds(self.tsock, [json.dumps(hdr).encode()], [ctl_w.fileno(), out_w, err_w])
        finally:
            ctl_w.close()
            os.close(out_w)
            os.close(err_w)
        job.mark("fds_sent")
        job.ctl = ctl
        for fd, name in ((out_r, "out"), (err_r, "err")):
            os.set_blocking(fd, False)
            job.pipes[fd] = name
            self.sel.register(fd, selectors.EVENT_READ, ("pipe", job))
        try:
            ctl.settimeout(5.0)
            ctl.sendall(H.encode_frame(wjob))
        except OSError as exc:
            job.end, job.end_msg = "start", f"could not send the job to the worker: {exc}"
            self.finish(job)
            return
        ctl.setblocking(False)
        self.sel.register(ctl, selectors.EVENT_READ, ("ctl", job))
        job.mark("sent")

    # ---- while it runs

    def read_ctl(self, job: Job) -> None:
        assert job.ctl is not None
        try:
            data = job.ctl.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            job.ctl_eof = True
            job.mark("eof")
            self.sel.unregister(job.ctl)
            if job.frames.partial:
                self.violation(job, "the result channel ended in the middle of a record")
            else:
                self.maybe_finish(job)
            return
        try:
            frames = job.frames.feed(data)
        except ValueError:
            self.violation(job, "the result channel carried bytes that are not a record")
            return
        for frame in frames:
            problem = self.accept(job, frame)
            if problem:
                self.violation(job, problem)
                return
        if job.done:
            job.mark("done")
            self.maybe_finish(job)

    def accept(self, job: Job, frame: Any) -> str | None:
        """Check one worker record against the protocol; return what is wrong with it."""
        if type(frame) is not dict or job.done:
            return "a record arrived after the end of the run"
        kind = frame.get("t")
        if job.load is None:
            if kind != "load":
                return "a test record arrived before the sample was loaded"
            job.load = frame
            if "cat" in frame:
                if frame["cat"] not in H.CATEGORIES:
                    return "unknown failure category"
                job.done = True
            return None
        if "cat" in job.load:
            return "a record arrived after the sample failed to load"
        if kind == "done":
            job.done = True
            return None
        index = sum(1 for r in job.records if r is not None)
        if kind == "probe":
            if job.n_probe is None or job.probe_outs is not None or index != job.n:
                return "a probe record arrived unasked, early or twice"
            outs = frame.get("outs")
            if not isinstance(outs, list) or len(outs) != job.n_probe:
                return "a malformed probe record"
            job.probe_outs = outs
            return None
        if kind != "test":
            return "a record of unknown kind"
        if frame.get("i") != index or index >= job.n:
            return "a test record arrived out of order or twice"
        if "cat" in frame:
            if frame["cat"] not in (*H.CATEGORIES, "nondata") or not isinstance(
                frame.get("msg"), str
            ):
                return "a malformed failure record"
        elif not isinstance(frame.get("values"), list):
            return "a malformed value record"
        job.records[index] = frame
        return None

    def violation(self, job: Job, msg: str) -> None:
        job.end, job.end_msg = "violation", msg
        self.finish(job)

    def read_pipe(self, job: Job, fd: int) -> None:
        try:
            data = os.read(fd, 1 << 16)
        except BlockingIOError:
            return
        if not data:
            self.sel.unregister(fd)
            os.close(fd)
            job.pipes.pop(fd, None)
            return
        job.out_bytes += len(data)
        if job.out_bytes > int(job.limits["output_bytes"]) and job.end is None:
            job.end = "output"
            job.end_msg = f"stdout/stderr exceeded {job.limits['output_bytes']} bytes"
            self.finish(job)

    def maybe_finish(self, job: Job) -> None:
        """End when the worker exited or closed the channel, with ``done`` or the other one.

        (A grandchild holding the channel open after the worker said ``done`` and exited does
        not keep the run going.)
        """
        if job.finished:  # e.g. T reports the exit status while J judges the records
            return
        exited = job.w_status is not None
        if (job.ctl_eof and (job.done or exited)) or (job.done and exited):
            self.finish(job)

    # ---- ending a job

    def finish(self, job: Job) -> None:
        """Judge and answer, then kill everything of the job's uid and remove its files.

        Answering first is safe: the verdict rests only on records already received, and this
        loop reads the next request (perhaps for the same slot) only after the cleanup.

        Runs once per job: a job judged in J stays in ``jobs`` until J answers, and events
        arriving meanwhile (the worker's exit status, a failure) must not start a second J.
        """
        if job.finished:
            return
        job.finished = True
        if job.ctl is not None:
            if not job.ctl_eof:
                self.sel.unregister(job.ctl)
            job.ctl.close()
            job.ctl = None
        for fd in list(job.pipes):
            self.sel.unregister(fd)
            os.close(fd)
        job.pipes.clear()
        job.mark("finish")
        raws = self.raw_results(job)
        self.record_behaviour(job)
        try:
            self.judge(job, raws)
        finally:
            if job.uid is not None and not self.closing:
                self.sweep_later(job)
            else:
                self.kill_worker(job)
                self.remove_files(job)

    def record_behaviour(self, job: Job) -> None:
        """The sample's output vector on the probe inputs, digested here where it cannot reach.

        Only for a sample that loaded and whose channel was not tampered with; outputs that
        never arrived (killed mid-probe) count as lost. Never touches the tests' verdicts.
        """
        if job.n_probe is None or job.end == "violation" or job.load is None:
            return
        if "cat" in job.load:
            return
        try:
            job.behaviour = H.behaviour(job.probe_outs, job.n_probe)
        except (ValueError, TypeError, RecursionError):
            job.behaviour = None  # a malformed record: the sample agrees with nobody

    def sweep_later(self, job: Job) -> None:
        """Have T kill the job's uid; its slot takes no new sample until T says it is done."""
        self.sweeping[job.id] = job
        self.busy_slots.add(job.slot)
        self.tsock.send(json.dumps({"sweep": job.uid, "token": job.id}).encode())

    def swept(self, token: int) -> None:
        job = self.sweeping.pop(token, None)
        if job is None:
            return
        self.remove_files(job)
        self.busy_slots.discard(job.slot)
        for req in self.waiting.pop(job.slot, []):
            self.start_job(req)

    def judge(self, job: Job, raws: list[dict[str, Any]]) -> None:
        """Records -> verdicts: here when only data is compared, in J when setup code must run."""
        if job.end == "violation":
            self.respond(job, [H.verdict(False, "sandbox_violation", job.end_msg)] * job.n)
        elif job.mode == "outputs":
            self.respond(
                job,
                [H.verdict("values" in r, r.get("cat"), r.get("msg")) for r in raws],
                outputs=[r["values"][0] if "values" in r else None for r in raws],
            )
        elif job.mode == "cases":
            self.respond(
                job, H.judge_cases(job.req["expected"], float(job.req.get("atol") or 0), raws)
            )
        elif all(p.simple for p in job.plans):
            self.respond(job, H.judge_asserts(job.plans, raws, H.simple_namespace()))
        else:
            self.start_judge(job, raws)

    def kill_worker(self, job: Job) -> None:
        if job.uid is not None:
            sweep(job.uid)
        elif job.w_pid is not None:
            for target in (-job.w_pid, job.w_pid):
                with contextlib.suppress(OSError):
                    os.kill(target, signal.SIGKILL)

    def remove_files(self, job: Job) -> None:
        if job.workdir:
            shutil.rmtree(job.workdir, ignore_errors=True)
        if job.uid is None or not self.cfg.get("private_tmp"):
            return
        for base in STRAY_DIRS:  # private tmpfs: whatever the uid left there goes too
            try:
                entries = list(os.scandir(base))
            except OSError:
                continue
            for entry in entries:
                try:
                    if entry.stat(follow_symlinks=False).st_uid != job.uid:
                        continue
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        os.unlink(entry.path)
                except OSError:
                    pass

    def raw_results(self, job: Job) -> list[dict[str, Any]]:
        """One record per test; a missing record becomes a failure saying why it is missing."""
        if job.load is not None and "cat" in job.load:
            return [{"cat": job.load["cat"], "msg": job.load.get("msg", "")}] * job.n
        cause = self.missing_cause(job)
        return [r if r is not None else {"cat": cause[0], "msg": cause[1]} for r in job.records]

    def missing_cause(self, job: Job) -> tuple[str, str]:
        if job.end == "output":
            return "output_limit", job.end_msg
        if job.end == "timeout":
            return "timeout", f"no result before the {job.limits['wall_s']} s wall-clock limit"
        if job.end == "start":
            return "runtime_error", job.end_msg
        st = job.w_status
        if st is not None and os.WIFSIGNALED(st):
            sig = os.WTERMSIG(st)
            elapsed = time.monotonic() - job.start
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and elapsed >= job.limits["cpu_s"]):
                return "timeout", f"CPU limit of {job.limits['cpu_s']} s reached"
            return "runtime_error", f"the sample's process was killed by {signal.Signals(sig).name}"
        code = os.WEXITSTATUS(st) if st is not None and os.WIFEXITED(st) else "unknown"
        return "runtime_error", f"the sample's process exited (status {code}) before reporting"

    # ---- the judge process (asserts whose skeleton needs the setup code)

    def start_judge(self, job: Job, raws: list[dict[str, Any]]) -> None:
        assert job.j_fd is None and job.j_pid is None, "one judge per job"
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            os.close(r)
            os.close(w)
            msg = f"could not start the test code's judge: {exc}"
            self.respond(job, [H.verdict(False, "runtime_error", msg)] * job.n)
            return
        if pid == 0:
            try:
                os.setsid()
                null = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):
                    os.dup2(null, fd)
                os.dup2(w, 3)
                os.closerange(4, MAXFD)
                drop_privileges(job.judge_uid)
                set_limits(job.limits)
                os.chdir("/")
                os.environ.clear()
                ns, _ = H.judge_namespace(job.req.get("setup"), job.modules)
                H.write_all(3, H.encode_frame(H.judge_asserts(job.plans, raws, ns)))
            finally:
                os._exit(0)
        os.close(w)
        os.set_blocking(r, False)
        job.j_pid, job.j_fd = pid, r
        job.j_deadline = time.monotonic() + float(job.limits["wall_s"])
        self.sel.register(r, selectors.EVENT_READ, ("judge", job))

    def read_judge(self, job: Job) -> None:
        assert job.j_fd is not None
        try:
            data = os.read(job.j_fd, 1 << 20)
        except BlockingIOError:
            return
        if data:
            try:
                frames = job.j_buf.feed(data)
            except ValueError:
                frames = [None]
            if frames:
                self.judge_done(job, result=frames[0])
            return
        self.judge_done(job)

    def stop_judge(self, job: Job) -> None:
        """Unregister and close J's pipe, then kill and reap J (a no-op when none runs)."""
        if job.j_fd is not None:
            self.sel.unregister(job.j_fd)
            os.close(job.j_fd)
            job.j_fd = None
        if job.j_pid is not None:
            if job.judge_uid is not None:
                sweep(job.judge_uid)
            else:
                with contextlib.suppress(OSError):
                    os.killpg(job.j_pid, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(job.j_pid, 0)
            job.j_pid = None

    def judge_done(self, job: Job, result: Any = None, timed_out: bool = False) -> None:
        assert job.j_fd is not None and job.j_pid is not None
        self.stop_judge(job)
        ok = (
            isinstance(result, list)
            and len(result) == job.n
            and all(isinstance(v, dict) and isinstance(v.get("passed"), bool) for v in result)
        )
        if not ok:
            why = "timed out" if timed_out else "crashed"
            result = [
                H.verdict(
                    False,
                    "timeout" if timed_out else "runtime_error",
                    f"evaluating the test code {why}",
                )
            ] * job.n
        self.respond(job, result)

    def respond(
        self, job: Job, verdicts: list[dict[str, Any]], outputs: list[Any] | None = None
    ) -> None:
        self.jobs.pop(job.id, None)
        msg: dict[str, Any] = {
            "id": job.id,
            "tests": verdicts,
            "wall_ms": (time.monotonic() - job.start) * 1000,
        }
        if outputs is not None:
            msg["outputs"] = outputs
        if job.behaviour is not None:
            msg["behaviour"] = job.behaviour
        if self.cfg.get("trace"):
            msg["trace"] = job.marks
        self.send(msg)

    def fail_job(self, job: Job, msg: str) -> None:
        if not job.finished:
            job.end, job.end_msg = "start", msg
            try:
                self.finish(job)
                return
            except Exception:
                pass
        with contextlib.suppress(Exception):
            self.stop_judge(job)
        self.respond(job, [H.verdict(False, "runtime_error", msg)] * job.n)

    def shutdown(self) -> None:
        self.tsock.close()
        for job in self.sweeping.values():
            self.used_slots.add(job.slot)
        if self.cfg.get("uid_base") is not None:  # only our slots: a one-shot shares the block
            for slot in sorted(self.used_slots):
                sweep(self.uid(slot, judge=False))  # type: ignore[arg-type]
                sweep(self.uid(slot, judge=True))  # type: ignore[arg-type]
        shutil.rmtree(self.root, ignore_errors=True)


def reap_as(uid: int) -> None:
    """R: become ``uid`` and SIGKILL every process running as it. Never returns.

    One ``kill(-1)`` is complete: the kernel walks the task list under the lock that ``fork``
    needs, and a fork racing with it is aborted by the pending SIGKILL. (Its return value
    cannot say "none left": it is 0 whenever any other process exists.) The second call is
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


def sweep(uid: int) -> None:
    """Fork R for ``uid`` and wait for it (the synchronous path: start, shutdown, judges)."""
    pid = os.fork()
    if pid == 0:
        reap_as(uid)
    os.waitpid(pid, 0)


def private_mounts(hide: list[str], keep: list[str]) -> None:
    """In our new mount namespace: private tmpfs on the tmp dirs; ``hide`` covered by empty
    read-only tmpfs, except the ``keep`` paths inside them, bind-mounted back read-only."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    ms_rdonly, ms_nosuid, ms_nodev, ms_remount, ms_bind, ms_rec = 1, 2, 4, 32, 4096, 16384

    def mount(src: str, target: str, fstype: str | None, flags: int, data: str = "") -> None:
        rc = libc.mount(
            src.encode(),
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        )
        if rc != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"mount {target}: {os.strerror(err)}")

    for d in STRAY_DIRS:
        if os.path.isdir(d):
            mount("fp-sandbox", d, "tmpfs", ms_nosuid | ms_nodev, "mode=1777,size=256m")
    staging = "/tmp/.fp-keep"
    os.mkdir(staging, 0o700)
    kept = []
    for i, path in enumerate(keep):
        os.mkdir(f"{staging}/{i}")
        mount(path, f"{staging}/{i}", None, ms_bind | ms_rec)
        kept.append((path, f"{staging}/{i}"))
    hidden = [h for h in hide if os.path.isdir(h)]
    for path in hidden:
        mount("fp-hidden", path, "tmpfs", ms_nosuid | ms_nodev, "mode=0755,size=1m")
    for path, stage in kept:
        os.makedirs(path, exist_ok=True)
        mount(stage, path, None, ms_bind | ms_rec)
        mount("none", path, None, ms_remount | ms_bind | ms_rdonly)
        libc.umount2(stage.encode(), 2)  # MNT_DETACH
        os.rmdir(stage)
    os.rmdir(staging)
    for path in hidden:
        mount("none", path, None, ms_remount | ms_rdonly | ms_nosuid | ms_nodev)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    if cfg.get("mounts"):
        private_mounts(cfg["mounts"]["hide"], cfg["mounts"]["keep"])
    if cfg.get("probe"):
        return
    chan_in, chan_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    root = os.path.join(cfg.get("tmp") or "/tmp", f"firstpass-sandbox-{os.getpid()}")
    os.mkdir(root, 0o711)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    zsock, tsock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    gc.collect()
    gc.freeze()  # forked children must not touch (copy) every page to scan old objects
    pid = os.fork()
    if pid == 0:  # T, before any request reached this process
        os.close(chan_in)
        os.close(chan_out)
        zsock.close()
        template_main(tsock)
    tsock.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    _ = _codec  # imported so that workers find it preloaded
    Zygote(cfg, chan_in, chan_out, zsock, root).loop()


if __name__ == "__main__":
    main()
