"""Whether the zygote's import path is one no uid but root can change (checked before it starts).

Stdlib only.
"""

from __future__ import annotations

import contextlib
import os
import stat

from .mounts import SOURCE_PREFIX, mountinfo, under


def import_path_is_safe(paths: list[str]) -> str | None:
    """None if no uid but root can change what these import paths load, else why one can.

    Why: a module planted in any directory the zygote imports from would run in every later
    sample (and in Z). A path is unsafe if it, or any directory above it, is writable by a
    non-root uid: owned by one, or group/other-writable (a root-owned sticky dir is fine as an
    *ancestor*, not as the entry itself, where anyone may create names), or the entry sits on a
    writable tmpfs the sandbox mounted. Anything on a read-only mount is safe. A missing entry
    (python311.zip) is judged by its nearest existing ancestor, where it could be created. Both
    the path as written and its resolved form are checked.
    """
    try:
        mounts = mountinfo()
    except OSError:
        mounts = []
    trusted = _trusted_owners()
    for entry in paths:
        absolute = os.path.abspath(entry or os.getcwd())
        for candidate in dict.fromkeys([absolute, os.path.realpath(absolute)]):
            try:
                why = _path_unsafe(candidate, mounts, trusted)
            except OSError as exc:
                why = f"cannot inspect {candidate}: {exc.strerror}"
            if why is not None:
                return f"import path {entry!r}: {why}"
    return None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _trusted_owners() -> set[int]:
    """Root; in a user namespace also the overflow uid, the owner shown for unmapped uids
    (real root among them), whose files nobody in the namespace can write but through mode."""
    trusted = {0}
    with contextlib.suppress(OSError, ValueError):
        if _read("/proc/self/uid_map").split() != ["0", "0", "4294967295"]:
            trusted.add(int(_read("/proc/sys/kernel/overflowuid")))
    return trusted


_Mounts = list[tuple[str, str, str, str, str, str, str]]


def _path_unsafe(path: str, mounts: _Mounts, trusted: set[int]) -> str | None:
    cur = path
    while not os.path.lexists(cur):
        cur = os.path.dirname(cur)
    first = True
    while True:
        st = os.lstat(cur)
        if not stat.S_ISLNK(st.st_mode) and not os.statvfs(cur).f_flag & os.ST_RDONLY:
            mode = stat.S_IMODE(st.st_mode)
            if st.st_uid not in trusted:
                return f"{cur} is owned by uid {st.st_uid}"
            if mode & 0o022 and (first or not mode & stat.S_ISVTX):
                return f"{cur} is writable by group or others (mode {mode:04o})"
            if first and _on_our_tmpfs(cur, st.st_dev, mounts):
                return f"{cur} is on a writable tmpfs the sandbox mounted"
        first = False
        if cur == "/":
            return None
        cur = os.path.dirname(cur)


def _on_our_tmpfs(path: str, dev: int, mounts: _Mounts) -> bool:
    devs = f"{os.major(dev)}:{os.minor(dev)}"
    best: tuple[str, str, str, str, str, str, str] | None = None
    for m in mounts:  # later lines are newer mounts: on a tie, the one on top wins
        if m[0] == devs and under(path, m[2]) and (best is None or len(m[2]) >= len(best[2])):
            best = m
    return (
        best is not None
        and best[4] == "tmpfs"
        and best[5].startswith(SOURCE_PREFIX)
        and "rw" in best[3].split(",")
    )
