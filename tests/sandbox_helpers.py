"""Shared helpers for the sandbox tests: host-health checks and the data path."""

from __future__ import annotations

import os
from pathlib import Path

from firstpass.sandbox import Sandbox

REPO = Path(__file__).resolve().parent.parent


def data_dir() -> Path:
    """``$FIRSTPASS_DATA`` or ``<repo>/../shared/data``."""
    env = os.environ.get("FIRSTPASS_DATA")
    return Path(env) if env else REPO.parent / "shared" / "data"


def processes_of(uids: range | frozenset[int]) -> list[int]:
    """Pids of live (non-zombie) processes whose real uid is in ``uids``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            status = Path(f"/proc/{entry}/status").read_text()
        except OSError:
            continue
        fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
        uid = int(fields.get("Uid", "-1").split()[0])
        if uid in uids and not fields.get("State", "").strip().startswith("Z"):
            found.append(int(entry))
    return found


def leftover_files(sb: Sandbox) -> list[str]:
    """Entries left in the zygote's work root and private /tmp (seen through /proc/<pid>/root)."""
    pid = sb.zygote_pid
    if pid is None:
        return []
    tmp = Path(f"/proc/{pid}/root/tmp")
    # an install under /tmp (a venv, a CI clone) is bound back read-only over the zygote's
    # tmpfs: the directories leading to it are the sandbox's own, not a sample's leftovers
    mounts = sb._mounts.get(False)
    kept = {
        Path(k).relative_to("/tmp").parts[0]
        for k in (mounts["keep"] if mounts is not None else [])
        if k.startswith("/tmp/")
    }
    left: list[str] = []
    for entry in tmp.iterdir():
        if entry.name in kept:
            continue
        if entry.name == f"firstpass-sandbox-{pid}":
            left.extend(str(p) for p in entry.iterdir())
        else:
            left.append(str(entry))
    return left
