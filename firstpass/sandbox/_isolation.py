"""Which isolation this host allows, and the command that starts a zygote inside it.

Levels, strongest first (every result carries the one in force):

* ``netns+uid`` — root: a new network and mount namespace (``unshare``), private tmpfs on
  ``/tmp``, ``/var/tmp``, ``/dev/shm``, and each sample under its own unprivileged uid.
* ``netns`` — not root but unprivileged user namespaces work: the same namespaces, one uid.
* ``uid`` — root without ``unshare``: per-sample uids, but the host network.
* ``none`` — a plain child process with rlimits only; a warning is logged once.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

from firstpass.errors import SandboxError

if TYPE_CHECKING:
    from ._child.frames import ZygoteConfig

__all__ = ["Isolation", "detect_isolation"]

LEVELS = ("netns+uid", "netns", "uid", "none")
#: how a zygote starts: ``python -I -S ZYGOTE <cfg>`` (see _child/boot.py)
ZYGOTE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_child", "boot.py")

#: hidden from samples unless a kept path is inside: homes hold keys and configs
#: covered by default: home directories, and the host's pty pool (a sample opening /dev/ptmx
#: takes ptys from the host's limit, shared with everything on it)
DEFAULT_HIDE = ("/root", "/home", "/dev/ptmx", "/dev/pts")


@dataclass(frozen=True, kw_only=True)
class Isolation:
    """A level and how to get it: ``prefix`` goes before the zygote's own command line."""

    level: str
    prefix: tuple[str, ...]
    drop_uid: bool
    private_tmp: bool

    def command(self, python_args: list[str]) -> list[str]:
        """The argv that starts a zygote at this level."""
        return [*self.prefix, *python_args]


_PROBES: dict[str, Isolation | None] = {}
_warned = False


async def _works(argv: list[str]) -> bool:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.DEVNULL,
            env={},
        )
        return await asyncio.wait_for(proc.wait(), 10) == 0
    except (OSError, TimeoutError):
        return False


async def detect_isolation(requested: str = "auto") -> Isolation:
    """The strongest level that actually works here (probed once per process), or ``requested``."""
    global _warned
    if requested not in ("auto", *LEVELS):
        raise SandboxError(f"unknown isolation level {requested!r}; use auto or one of {LEVELS}")
    if requested in _PROBES and _PROBES[requested] is not None:
        return _PROBES[requested]  # type: ignore[return-value]
    root = os.geteuid() == 0
    unshare = await asyncio.to_thread(shutil.which, "unshare")  # stat()s PATH: off the loop
    candidates: list[Isolation] = []
    if unshare and root:
        candidates.append(
            Isolation(
                level="netns+uid",
                drop_uid=True,
                private_tmp=True,
                prefix=(unshare, "--net", "--mount", "--propagation", "private"),
            )
        )
    if unshare:
        candidates.append(
            Isolation(
                level="netns",
                drop_uid=False,
                private_tmp=True,
                prefix=(
                    unshare,
                    "--user",
                    "--map-root-user",
                    "--net",
                    "--mount",
                    "--propagation",
                    "private",
                ),
            )
        )
    if root:
        candidates.append(Isolation(level="uid", drop_uid=True, private_tmp=False, prefix=()))
    candidates.append(Isolation(level="none", drop_uid=False, private_tmp=False, prefix=()))
    chosen = None
    for iso in candidates:
        if requested not in ("auto", iso.level):
            continue
        cfg: ZygoteConfig = {"probe": True}
        if iso.private_tmp:
            cfg["mounts"] = {"hide": [], "keep": []}
        probe = iso.command([sys.executable, "-I", "-S", ZYGOTE, json.dumps(cfg)])
        if not iso.prefix or await _works(probe):
            chosen = iso
            break
    if chosen is None:
        raise SandboxError(f"isolation level {requested!r} is not available on this host")
    _PROBES[requested] = chosen
    if chosen.level in ("uid", "none") and not _warned:
        _warned = True
        warnings.warn(
            f"firstpass sandbox: no network namespace on this host ({sys.platform}); samples run "
            f"with isolation {chosen.level!r} and can reach the network",
            RuntimeWarning,
            stacklevel=2,
        )
    return chosen
