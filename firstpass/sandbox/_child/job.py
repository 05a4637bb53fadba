"""One sample being run in Z, and the verdicts its end implies when the judge cannot say.

Apart from Z's loop: what a job holds, and what its exit status, deadline or OOM kill mean for
its verdicts, is logic on its state, not I/O. Stdlib only.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from typing import TYPE_CHECKING, cast

from .frames import FrameBuffer
from .rlimits import JUDGE_GRACE_S, judge_limits
from .sharing import DATA_KEY, judge_key
from .uids import slot_uid
from .verdicts import CATEGORIES, Verdict, short, verdict

if TYPE_CHECKING:
    from .cgroups import SlotCgroups
    from .codec import Wire
    from .frames import RunRequest, WireLimits, ZygoteConfig

#: the most the wall-clock deadline stretches, as a multiple of ``wall_s``, for a sample that
#: waited for a CPU (other samples', other processes' load): the one deadline that always
#: holds, whatever the sample and the host do (the proxy's cfg may set it: "wall_stretch")
WALL_STRETCH = 3.0
#: the largest verdict frame a judge may send (reference outputs travel in a second frame)
MAX_VERDICT_FRAME = 16 << 20


class Job:
    """One sample being run: its pipes, the judge's answer and the reason it ended."""

    def __init__(self, req: RunRequest, cfg: ZygoteConfig) -> None:
        self.req = req
        self.id: int = req["id"]
        self.slot: int = req["slot"]
        self.limits: WireLimits = req["limits"]
        self.mode: str = req["mode"]
        self.n = len(req["tests"])
        self.start = time.monotonic()
        self.deadline = self.start + float(self.limits["wall_s"])
        self.j_deadline = self.deadline + JUDGE_GRACE_S
        #: the wall deadline stretches by the time W and J waited for a CPU, never past this
        stretch = float(cfg.get("wall_stretch") or WALL_STRETCH)
        self.hard_deadline = self.start + float(self.limits["wall_s"]) * max(1.0, stretch)
        #: W's and J's run-queue wait (ns, from /proc/<pid>/schedstat) when their pids came
        self.waited0: dict[str, int] = {}
        #: the slot's CPU time (s) when the job started, and when to look at it next
        self.cpu0: float | None = None
        self.cpu_check = float("inf")
        self.uid = slot_uid(cfg, self.slot, judge=False)
        self.key = judge_key(self.mode, req.get("judge_key"), self.id, req.get("closed") is True)
        self.judge_uid = slot_uid(cfg, self.slot, judge=True, shared=self.key == DATA_KEY)
        self.workdir = ""
        self.zsock: socket.socket | None = None
        self.pipes: dict[int, str] = {}
        self.frames = FrameBuffer(MAX_VERDICT_FRAME)
        #: the judge's result as it sent it (plain wire: J ran client code), and the frame after
        #: it (the reference's outputs, raw bytes in an outputs job: see ``frames.raw``)
        self.result: dict[str, Wire] | None = None
        self.outputs_raw: Wire | bytes = None
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

    def verdicts(self, cgroups: SlotCgroups | None) -> list[Verdict]:
        """One verdict per test: the judge's, or what its absence says (``missing_cause``)."""
        result = self.result or {}
        tests = result.get("tests")
        if not isinstance(tests, list) or len(tests) != self.n:
            if self.end is not None or self.w_status is not None:
                why = self.missing_cause(cgroups)
                if self.end is None and why[0] == "runtime_error" and self.j_status is not None:
                    why = ("runtime_error", "the judge ended without a verdict")
                return [verdict(False, *why)] * self.n
            return [verdict(False, "runtime_error", "the judge ended without a verdict")] * self.n
        if self.end == "output":  # the whole sample failed: nothing it printed past that counts
            return [verdict(False, "output_limit", self.end_msg)] * self.n
        out = []
        cause: tuple[str, str] | None = None
        for v in tests:
            if isinstance(v, dict) and isinstance(v.get("passed"), bool):
                cat = v.get("error_type")
                if not v["passed"] and cat not in CATEGORIES:
                    cat = "runtime_error"
                msg = v.get("message")
                # passed: a bool (checked); cat: one of CATEGORIES on a failure, dropped on a pass
                passed, cat_ = cast(bool, v["passed"]), cast("str | None", cat)
                out.append(verdict(passed, cat_, short(msg) if isinstance(msg, str) else None))
            else:
                cause = cause or self.missing_cause(cgroups)
                out.append(verdict(False, *cause))
        return out

    def missing_cause(self, cgroups: SlotCgroups | None) -> tuple[str, str]:
        """Why a verdict is missing: the slot's OOM kills, Z's reason for ending the job, or
        the worker's exit status."""
        if cgroups is not None and cgroups.oom_kills(self.slot) > self.oom_before:
            mb = int(self.limits["memory_mb"]) + int(self.limits["scratch_mb"])
            return "memory_limit", f"the sample's processes together exceeded {mb} MB"
        if cgroups is not None and cgroups.judge_oom_kills(self.slot) > self.judge_oom_before:
            mb = int(judge_limits(self.limits)["memory_mb"])
            return "memory_limit", f"the judge exceeded {mb} MB holding the sample's values"
        if self.end == "output":
            return "output_limit", self.end_msg
        if self.end == "timeout":
            return "timeout", (
                f"no result before the {self.limits['wall_s']} s wall-clock limit (not counting "
                "time spent waiting for a CPU)"
            )
        if self.end == "cpu":
            return "timeout", self.end_msg
        if self.end == "start":
            return "runtime_error", self.end_msg
        st = self.w_status
        if st is not None and st >= 0 and os.WIFSIGNALED(st):
            sig = os.WTERMSIG(st)
            elapsed = time.monotonic() - self.start
            if sig == signal.SIGXCPU or (sig == signal.SIGKILL and elapsed >= self.limits["cpu_s"]):
                return "timeout", f"CPU limit of {self.limits['cpu_s']} s reached"
            return "runtime_error", f"the sample's process was killed by {signal.Signals(sig).name}"
        code = os.WEXITSTATUS(st) if st is not None and st >= 0 and os.WIFEXITED(st) else "?"
        return "runtime_error", f"the sample's process exited (status {code}) before reporting"
