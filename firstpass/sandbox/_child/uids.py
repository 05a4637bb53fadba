"""The uids a slot's processes run as, and the sweep that kills everything of one uid.

Stdlib only.
"""

from __future__ import annotations

import os
import shutil
import signal
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .frames import ZygoteConfig

#: uids per concurrency slot and lane: the sample's, its request's judge's, and the shared
#: judge's (two judge uids, so that no request's test code can signal the shared judge)
UIDS_PER_SLOT = 3


def slot_uid(cfg: ZygoteConfig, slot: int, *, judge: bool, shared: bool = False) -> int | None:
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
    per_slot: int = UIDS_PER_SLOT
    first = int(base) + per_slot * (int(cfg.get("lane", 0)) * slots + slot)
    return first + (0 if not judge else 2 if shared else 1)


def drop_privileges(uid: int | None) -> None:
    if uid is None:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


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


def sweep(uid: int) -> None:
    """Fork R for ``uid`` and wait for it (the synchronous path: start, shutdown, sweepers)."""
    pid = os.fork()
    if pid == 0:
        reap_as(uid)
    os.waitpid(pid, 0)
