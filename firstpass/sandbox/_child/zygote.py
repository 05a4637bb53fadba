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
  (:mod:`.worker`).
* **J** (judge, one per sample): forked from T; a second uid; evaluates every test itself and
  asks W only for values (:mod:`.judge`). It sends Z the verdicts.
* **R** (sweeper): forked from T, becomes a slot's uid and ``kill(-1, SIGKILL)``s everything
  running as it, including grandchildren that left the process group.

Z's loop and the process's start are here; T is :mod:`.template`, W and J :mod:`.standby`.
Stdlib only, started by ``boot.py`` with ``-I -S``: nothing here may import firstpass.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import sys
import time
from typing import TYPE_CHECKING, cast

from . import standby, template
from .cgroups import SlotCgroups
from .frames import MAX_FRAME, FrameBuffer, encode_frame, raw_frame, write_all
from .import_path import import_path_is_safe
from .job import Job
from .mounts import private_mounts
from .rlimits import JUDGE_GRACE_S, judge_limits
from .seccomp import prepare_seccomp
from .uids import slot_uid, sweep
from .verdicts import Verdict, verdict

if TYPE_CHECKING:
    from .frames import (
        Header,
        Hello,
        JudgeJob,
        Response,
        RunRequest,
        WorkerJob,
        ZygoteConfig,
    )

sys.dont_write_bytecode = True  # no trusted process writes bytecode: nothing on its path changes

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
#: how long an answered sample's worker may take to exit before its uid is swept
EXIT_GRACE_S = 0.1
#: how long a killed worker's exit status may take before its slot is freed regardless
EXIT_WAIT_S = 5.0
#: what a sample's processes may use together past ``cpu_s`` where a CPU controller counts
#: it (the harness around its calls, the codec, the next sample's standby joining the slot)
CPU_TOTAL_SLACK_S = 0.5
#: a judge cgroup holds the slot's idle judges (a standby, one waiting for its key's next
#: job) beside the judging one: room for them above the judging one's memory limit
JUDGE_IDLE_MB = 128


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


# --------------------------------------------------------------------------- Z


class Zygote:
    def __init__(
        self,
        cfg: ZygoteConfig,
        chan_in: int,
        chan_out: int,
        tsock: socket.socket,
        root: str,
        cgroups: SlotCgroups | None,
    ) -> None:
        self.cfg = cfg
        self.chan_in, self.chan_out, self.tsock, self.root = chan_in, chan_out, tsock, root
        self.cgroups = cgroups
        self.sel = selectors.DefaultSelector()
        self.registered = self.sel.get_map()  # a live view: fd -> its current key
        self.jobs: dict[int, Job] = {}
        self.inbuf = FrameBuffer()
        self.closing = False
        self.used_slots: set[int] = set()
        self.sweeps = 0
        self.sweeping: dict[str, Job | None] = {}  # token -> job whose slot waits for it
        self.busy_slots: set[int] = set()  # slots whose sweep has not finished
        self.waiting: dict[int, list[RunRequest]] = {}  # slot -> requests queued behind it
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

    def send(self, obj: Hello | Response, raw: bytes | None = None) -> None:
        data = encode_frame(obj)
        if raw is not None:
            data += raw_frame(raw)
        write_all(self.chan_out, data)

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
        cgroups = cast(SlotCgroups, self.cgroups)  # job.cpu0 was read from them, else None
        used = cgroups.cpu_usage(job.slot) if job.cpu0 is not None else None
        if used is None:
            job.cpu_check = float("inf")
            return
        left = float(job.limits["cpu_s"]) + CPU_TOTAL_SLACK_S - (used - cast(float, job.cpu0))
        if left <= 0:
            job.end = "cpu"
            job.end_msg = f"CPU limit of {job.limits['cpu_s']} s reached (all its processes)"
            self.kill_worker(job)
            return
        job.cpu_check = now + max(0.01, left / cgroups.cpu_rate)

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

    def dispatch(self, kind: str, job: Job | None, fileobj: object) -> None:
        if kind == "in":
            self.read_requests()
        elif kind == "t":
            self.read_template()
        elif job is not None and kind == "pipe":
            self.read_pipe(job, cast(int, fileobj))  # a pipe is registered by its fd
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
        for frame in self.inbuf.feed(data):
            req = cast("RunRequest", frame)  # the proxy's (trusted) request
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

    def start_job(self, req: RunRequest) -> None:
        if req["slot"] in self.busy_slots:  # its last sample is still being swept
            self.waiting.setdefault(req["slot"], []).append(req)
            return
        job = Job(req, self.cfg)
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
        wjob: WorkerJob = {
            "code": req["code"],
            "setup_imports": req.get("setup_imports"),
            "load_s": budget,
            "prefetch": req.get("prefetch") or [],
        }
        jjob: JudgeJob = {
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
                usage = cast("list[tuple[str, str]]", self.cgroups.usage)  # cpu0 was read there
                jjob["cpu_usage"] = list(usage[job.slot])
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
        hdr: Header = {
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
        wframe = encode_frame(wjob)
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
            job.frames.max_frame = MAX_FRAME
        try:
            zsock.settimeout(5.0)
            zsock.sendall(encode_frame(jjob))
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
        verdicts = job.verdicts(self.cgroups)
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

    def respond(self, job: Job, verdicts: list[Verdict]) -> None:
        self.jobs.pop(job.id, None)
        result = job.result or {}
        msg: Response = {
            "id": job.id,
            "tests": verdicts,
            "wall_ms": (time.monotonic() - job.start) * 1000,
        }
        behaviour = result.get("behaviour")
        if isinstance(behaviour, dict):
            msg["behaviour"] = behaviour
        if self.cfg.get("trace"):
            msg["trace"] = {**job.marks, "round_trips": result.get("round_trips")}
        raw: bytes | None = None
        if job.aborted:
            msg["aborted"] = True
        if result.get("ready") is False:  # the worker died before the sample's first line
            msg["fault"] = "the sandbox could not start this sample's worker"
        if job.mode == "outputs":
            msg["has_outputs"] = job.outputs_raw is not None
            raw = cast("bytes | None", job.outputs_raw)  # an outputs job's frame 1 is raw
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
            self.send({"id": job.id, "tests": [verdict(False, "runtime_error", msg)] * job.n})

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
    cfg: ZygoteConfig = json.loads(sys.argv[1])  # the front's
    if cfg.get("mounts"):
        m = cfg["mounts"]
        private_mounts(m["hide"], m["keep"], default_hide=m.get("default_hide", []))
    if cfg.get("probe"):
        return
    chan_in, chan_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(null, 1)
    os.close(null)
    unsafe = import_path_is_safe([os.path.dirname(os.path.abspath(__file__)), *sys.path])
    if unsafe:
        write_all(chan_out, encode_frame({"ready": False, "error": unsafe}))
        sys.exit(4)
    root = os.path.join(cfg.get("tmp") or "/tmp", f"firstpass-sandbox-{os.getpid()}")
    os.mkdir(root, 0o711)
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            __import__(name)
    cgroups = None
    if cfg.get("uid_base") is not None and cfg.get("cgroups", True):
        try:
            SlotCgroups.remove_stale("firstpass-")  # left by zygotes that were killed
            cgroups = SlotCgroups.create(f"firstpass-{os.getpid()}", int(cfg["slots"]))
        except OSError:
            cgroups = None
    standby.prepare(cfg)
    prepare_seccomp()  # built once here; each worker and judge only installs it
    zsock, tsock = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    gc.collect()
    gc.freeze()  # forked children must not touch (copy) every page to scan old objects
    pid = os.fork()
    if pid == 0:  # T, before any request reached this process
        os.close(chan_in)
        os.close(chan_out)
        zsock.close()
        template.template_main(tsock, cfg, cgroups)
    tsock.close()
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    Zygote(cfg, chan_in, chan_out, zsock, root, cgroups).loop()
