"""The rlimits of a worker and of a judge: what each process alone may use.

Stdlib only.
"""

from __future__ import annotations

import resource
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .frames import WireLimits, ZygoteConfig

#: "no limit" for the CPU rlimit of a judge that serves several jobs
MAX_CPU_S = 86_400.0
#: how long the judge may take past the sample's deadline to report
JUDGE_GRACE_S = 3.0


def set_limits(lim: WireLimits) -> None:
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


def judge_limits(lim: WireLimits) -> WireLimits:
    """J holds decoded sample values and runs the client's test code: room for both, no forks."""
    return {
        **lim,
        "cpu_s": float(lim["cpu_s"]) + 2 * JUDGE_GRACE_S,
        "memory_mb": max(2 * int(lim["memory_mb"]), 1024),
        "nproc": 1,  # J never forks, so nothing of its uid outlives it
        "nofile": 64,
        "file_size_mb": 1,
    }


def resident_limits(cfg: ZygoteConfig) -> WireLimits:
    """The shared judge's limits: no CPU rlimit (it adds up over jobs; Z's deadline kills a
    stuck one), room for decoded values, no forks."""
    lim = cfg["limits"].copy()
    return {
        **judge_limits(lim),
        "cpu_s": MAX_CPU_S,
    }
