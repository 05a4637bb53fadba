"""File systems the sandbox mounts: the zygote's covers and each sample's own scratch and /proc.

Why: the host's /tmp, /var/tmp, /dev/shm and lock dirs are world-writable and never cleaned
(a channel between runs), /run holds host service sockets, ``hide`` paths hold secrets, and
the host's /proc shows every process. Root only, in a mount namespace of the caller's own.
Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import sys

from .syscalls import check, libc

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000

#: the world-writable scratch dirs; each sample gets one fresh tmpfs for all of them
SCRATCH_DIRS = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")
#: host service sockets (PostgreSQL, D-Bus, ...) live here: the zygote covers it
RUN_DIR = "/run"
#: tmpfs sources the sandbox mounts; ``import_path_is_safe`` knows them by this prefix
SOURCE_PREFIX = "fp-"


def mount(src: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    rc = libc.mount(
        src.encode() if src is not None else None,
        target.encode(),
        fstype.encode() if fstype else None,
        flags,
        data.encode() if data else None,
    )
    check(rc, f"mount {target}")


def _ro_bind_remount(target: str, extra: int = 0) -> None:
    mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | extra)


def under(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip("/") + "/")


def _minimal(paths: list[str]) -> list[str]:
    """The paths no other one contains, shallowest first (a recursive bind brings the rest)."""
    uniq = sorted(set(paths), key=lambda p: (p.count("/"), p))
    out: list[str] = []
    for p in uniq:
        if not any(under(p, q) for q in out):
            out.append(p)
    return out


def _makedirs_root(path: str) -> None:
    """mkdir -p with every created directory root-owned mode 0755, whatever the umask.

    In a sticky 1777 tmpfs a root-owned 0755 parent cannot be renamed or filled by a sample,
    so nobody can swap what lies under a kept path's mount point.
    """
    missing = []
    cur = path
    while not os.path.lexists(cur):
        missing.append(cur)
        cur = os.path.dirname(cur)
    for d in reversed(missing):
        os.mkdir(d, 0o755)
        os.chmod(d, 0o755)


def _mountpoint_like(target: str, source_fd: int) -> None:
    """Create what a bind of ``source_fd`` needs at ``target``: a directory or an empty file."""
    if os.path.lexists(target):
        return
    _makedirs_root(os.path.dirname(target))
    if stat.S_ISDIR(os.fstat(source_fd).st_mode):
        os.mkdir(target, 0o755)
        os.chmod(target, 0o755)
    else:
        os.close(os.open(target, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o444))


def _open_paths(paths: list[str], what: str) -> list[tuple[str, int]]:
    """O_PATH fds for ``paths`` taken *before* anything covers them: bind sources for later.

    ``mount --bind /proc/self/fd/N`` reaches the original (mount, dentry) even once a tmpfs
    lies over the path, so no staging directory outside the covered dirs is needed.
    """
    out: list[tuple[str, int]] = []
    try:
        for p in paths:
            try:
                out.append((p, os.open(p, os.O_PATH | os.O_CLOEXEC)))
            except FileNotFoundError:
                raise FileNotFoundError(
                    errno.ENOENT, f"{what} path does not exist: {p}", p
                ) from None
    except BaseException:
        for _, fd in out:
            os.close(fd)
        raise
    return out


def _bind_back(kept: list[tuple[str, int]]) -> None:
    """Bind each opened path back at its own place, read-only, nosuid, nodev."""
    for path, fd in kept:
        _mountpoint_like(path, fd)
        mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        _ro_bind_remount(path)


def _unescape(field: str) -> str:
    """mountinfo octal escapes (space, tab, newline, backslash) back to characters."""
    for code, ch in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, ch)
    return field


def mountinfo() -> list[tuple[str, str, str, str, str, str, str]]:
    """(major:minor, root, mount point, per-mount options, fstype, source, super options)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, _, right = line.rstrip("\n").partition(" - ")
            a, b = left.split(), right.split()
            if len(a) < 6 or len(b) < 3:
                continue
            out.append((a[2], _unescape(a[3]), _unescape(a[4]), a[5], b[0], _unescape(b[1]), b[2]))
    return out


def sample_filesystem(scratch_mb: int, keep: list[str], uid: int | None) -> str:
    """In the sample (pid 2, still root): its own /proc, one scratch tmpfs, keeps, work dir."""
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    _mount_proc()
    targets: list[str] = []
    for d in SCRATCH_DIRS:  # realpath now, before anything covers the symlinks' targets
        real = os.path.realpath(d)
        if os.path.isdir(real) and not any(under(real, t) for t in targets):
            targets.append(real)
    if not targets or targets[0] != os.path.realpath("/tmp"):
        raise OSError(errno.ENOENT, "no /tmp directory to mount the sample's scratch on")
    kept = _open_paths(
        [
            k
            for k in _minimal([os.path.realpath(k) for k in keep])
            if any(under(k, t) for t in targets)
        ],
        "keep",
    )
    try:
        inodes = max(1024, 256 * scratch_mb)  # inodes cost kernel memory the size= does not see
        mount(
            f"{SOURCE_PREFIX}scratch",
            targets[0],
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"size={scratch_mb}m,nr_inodes={inodes},mode=1777",
        )
        for t in targets[1:]:
            mount(targets[0], t, None, MS_BIND)
        if os.path.isdir("/dev/mqueue"):  # the host's mqueue mount shows the host's queues
            mount("mqueue", "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        _bind_back(kept)
    finally:
        for _, fd in kept:
            os.close(fd)
    work = os.path.join(targets[0], "work")
    os.mkdir(work, 0o700)
    os.chmod(work, 0o700)
    if uid is not None:
        os.chown(work, uid, uid)
    return work


def private_mounts(
    hide: list[str],
    keep: list[str],
    *,
    default_hide: list[str] | tuple[str, ...] = (),
    tmp_mb: int = 256,
) -> None:
    """In the zygote's new mount namespace: fresh tmpfs over the host's writable and service
    dirs, ``hide`` covered, and every ``keep`` path bound back read-only wherever it lies.

    Why: the host's /tmp, /var/tmp, /dev/shm and lock dirs are world-writable and never cleaned
    (a channel between runs), /run holds host service sockets (PostgreSQL, D-Bus), and ``hide``
    paths hold secrets. A Python installation or this package under a covered dir (any venv in
    /tmp) must come back read-only: left on the empty, world-writable tmpfs, its import path
    would be a place where a sample could plant modules.

    - /tmp, /var/tmp, /dev/shm, /run/lock (/var/lock when it is a real dir): each a private
      ``tmp_mb`` MiB tmpfs, mode 1777. /run: an empty tmpfs, read-only once set up.
    - ``hide`` dirs: an empty read-only tmpfs; ``hide`` files: an empty, mode-0000, root-owned
      file, read-only. A ``hide`` path that does not exist raises ``FileNotFoundError`` naming
      it, before anything is mounted; ``default_hide`` paths that do not exist are skipped.
    - ``keep``: absolute paths that must exist; those under a covered path are bound back.
    """
    hides: list[str] = []
    for h, required in [*((h, True) for h in hide), *((h, False) for h in default_hide)]:
        if not os.path.isabs(h):
            raise ValueError(f"hide path is not absolute: {h!r}")
        if not os.path.exists(h):
            if required:
                raise FileNotFoundError(errno.ENOENT, f"hide path does not exist: {h}", h)
            continue
        real = os.path.realpath(h)
        if real == "/":
            raise ValueError(f"cannot hide the root directory: {h!r}")
        hides.append(real)
    for k in keep:
        if not os.path.isabs(k):
            raise ValueError(f"keep path is not absolute: {k!r}")
    scratch: list[str] = []
    for d in SCRATCH_DIRS:  # /var/lock is often a symlink to /run/lock: cover it once
        real = os.path.realpath(d)
        if os.path.isdir(real) and real not in scratch:
            scratch.append(real)
    run = [RUN_DIR] if os.path.isdir(RUN_DIR) else []
    fresh = [*run, *scratch]
    candidates = [*fresh, *dict.fromkeys(hides)]
    keeps = [
        k
        for k in _minimal([os.path.realpath(k) for k in keep])
        if any(under(k, c) for c in candidates)
    ]

    def redundant(h: str) -> bool:  # already hidden by an outer cover that no keep undoes
        return any(
            c != h and under(h, c) and not any(under(h, k) and under(k, c) for k in keeps)
            for c in candidates
        )

    covers = [(p, "run") for p in run] + [(p, "scratch") for p in scratch]
    covers += [
        (h, "hide" if os.path.isdir(h) else "hidefile")
        for h in dict.fromkeys(hides)
        if h not in fresh and not redundant(h)  # a fresh tmpfs starts out empty anyway
    ]
    covers.sort(key=lambda c: (c[0].count("/"), c[0]))
    # a cover inside a kept path goes on top of the bound-back keep, or the bind would undo it
    late = [c for c in covers if any(under(c[0], k) and c[0] != k for k in keeps)]
    early = [c for c in covers if c not in late]

    kept = _open_paths(keeps, "keep")  # before anything covers them
    empty_fd = -1
    try:
        mount(None, "/", None, MS_REC | MS_PRIVATE)
        if any(kind == "hidefile" for _, kind in covers):
            empty_fd = _stage_empty_file(scratch[0] if scratch else "/tmp")
        for path, kind in early:
            _cover(path, kind, empty_fd, tmp_mb)
        _bind_back(kept)
        for path, kind in late:
            _cover(path, kind, empty_fd, tmp_mb)
        for path, kind in covers:
            if kind in ("run", "hide"):
                _ro_bind_remount(path)
        _private_proc()
    finally:
        for _, fd in kept:
            os.close(fd)
        if empty_fd >= 0:
            os.close(empty_fd)


def _mount_proc(flags: int = MS_NOSUID | MS_NODEV | MS_NOEXEC) -> None:
    """A procfs instance on /proc in which a non-root process sees only its own uid's
    processes (hidepid): no other process's command line, no other judge to find."""
    try:
        mount("proc", "/proc", "proc", flags, "hidepid=invisible")
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
        mount("proc", "/proc", "proc", flags, "hidepid=2")  # kernels before 5.8


def _private_proc() -> None:
    """The zygote's /proc with hidepid: judges (test code, in the zygote's PID namespace) see
    no host process; the zygote and its template are root and still see every one."""
    with contextlib.suppress(OSError):  # without it, docs/sandbox.md says what a judge sees
        _mount_proc()


def _cover(path: str, kind: str, empty_fd: int, tmp_mb: int) -> None:
    """Mount one cover: a scratch tmpfs, the empty /run or hide tmpfs, or the empty file."""
    if kind in ("scratch", "run") and not os.path.lexists(path):
        _makedirs_root(path)  # /run/lock in the fresh /run, /var/tmp in a hidden /var
    if kind == "scratch":
        inodes = max(1024, 256 * tmp_mb)
        mount(
            f"{SOURCE_PREFIX}scratch",
            path,
            "tmpfs",
            MS_NOSUID | MS_NODEV,
            f"size={tmp_mb}m,nr_inodes={inodes},mode=1777",
        )
    elif kind in ("run", "hide"):
        mount(f"{SOURCE_PREFIX}{kind}", path, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    else:
        mount(f"/proc/self/fd/{empty_fd}", path, None, MS_BIND)
        _ro_bind_remount(path, MS_NOEXEC)


def _stage_empty_file(where: str) -> int:
    """An O_PATH fd on an empty, mode-0000, root-owned file in a private staging tmpfs.

    The staging tmpfs is mounted on ``where`` (a scratch dir about to get its own tmpfs on
    top), so once covered it is reachable only through the returned fd.
    """
    mount(
        f"{SOURCE_PREFIX}stage",
        where,
        "tmpfs",
        MS_NOSUID | MS_NODEV | MS_NOEXEC,
        "mode=0700,size=4k",
    )
    path = os.path.join(where, "empty")
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY | os.O_CLOEXEC, 0)
    os.fchmod(fd, 0)
    os.fchown(fd, 0, 0)
    os.close(fd)
    return os.open(path, os.O_PATH | os.O_CLOEXEC)


def keep_paths(hide: tuple[str, ...], site_packages: bool, package_dir: str) -> tuple[str, ...]:
    """Paths the zygote must still read that a cover would hide: its interpreter, this package.

    Why: covers are not only ``hide`` but also the scratch dirs and /run that every zygote
    gets; an interpreter or a venv in /tmp must be bound back (read-only) like one in /root.
    Blocking (``realpath`` stats the file system): call it in a thread from async code.
    """
    wanted = {
        os.path.realpath(sys.base_prefix),
        os.path.realpath(package_dir),
        os.path.realpath(os.path.dirname(sys.executable)),
        os.path.dirname(os.path.realpath(sys.executable)),
    }
    if site_packages:
        wanted.add(os.path.realpath(sys.prefix))
    covers = {os.path.realpath(h) for h in hide} | {os.path.realpath(d) for d in SCRATCH_DIRS}
    covers.add(os.path.realpath(RUN_DIR))
    inside = [p for p in wanted if any(under(p, c) for c in covers)]
    return tuple(sorted(_minimal(inside)))
