"""The slot cgroups: a sample's processes together under one memory limit and one CPU share.

Stdlib only.
"""

from __future__ import annotations

import contextlib
import errno
import os
import time

from .mounts import (
    MS_NODEV,
    MS_NOEXEC,
    MS_NOSUID,
    MS_RDONLY,
    SOURCE_PREFIX,
    mount,
    mountinfo,
    under,
)

CGROUP_ROOT = "/sys/fs/cgroup"


def cover_cgroup_files() -> None:
    """Cover the cgroup tree in this process's own mount namespace (root, a sample's last step
    before its job): every slot's memory and CPU usage is world-readable there, a channel
    from one sample to another. The process has joined its cgroups already."""
    if os.path.isdir(CGROUP_ROOT):
        mount(
            f"{SOURCE_PREFIX}cover",
            CGROUP_ROOT,
            "tmpfs",
            MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
            "size=4k,nr_inodes=2,mode=0555",
        )


def _own_cgroup_dirs(controller: str = "memory") -> list[tuple[str, str]]:
    """(kind, directory) candidates for our own cgroup of ``controller``, cgroup v2 first (the
    v2 candidate is the same for every controller: whether it has it is the caller's check)."""
    with open("/proc/self/cgroup") as f:
        lines = [ln.rstrip("\n").split(":", 2) for ln in f if ln.count(":") >= 2]
    v2_path = next((p for h, c, p in lines if h == "0" and c == ""), None)
    v1_path = next((p for h, c, p in lines if h != "0" and controller in c.split(",")), None)
    found: list[tuple[str, str]] = []
    mounts = mountinfo()
    for kind, path in (("cgroup2", v2_path), ("cgroup1", v1_path)):
        if path is None:
            continue
        for _dev, root, mnt, _opts, fstype, _src, sopts in mounts:
            if kind == "cgroup2" and fstype != "cgroup2":
                continue
            if kind == "cgroup1" and (fstype != "cgroup" or controller not in sopts.split(",")):
                continue
            if not under(path, root):
                continue  # a mount of another part of the hierarchy
            rel = path[len(root.rstrip("/")) :].lstrip("/")
            found.append((kind, os.path.join(mnt, rel) if rel else mnt))
    return found


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


#: the controllers the slot cgroups use: memory (a sample's processes together), cpu (one

#: scheduling entity per sample and per judge) and, on cgroup v1, cpuacct (the CPU time a
#: sample's processes used together; cgroup v2's cpu controller counts it itself)
CONTROLLERS = ("memory", "cpu", "cpuacct")
#: the CPUs a sample's processes may use together (the cpu controller's quota), at most one:
#: a sample that forks spinners takes one CPU, never the host
SAMPLE_CPUS = 1.0
#: cgroup v1 cpu.shares and v2 cpu.weight of one slot's sample or judge (the defaults), and
#: per slot of the sandbox's own group: each slot weighs what one host session weighs
V1_SHARES, V2_WEIGHT = 1024, 100
#: the "cpu.max"/"cpu.cfs_period_us" period the quota is set in, microseconds
CPU_PERIOD_US = 100_000


class _Tree:
    """The slot cgroups in one hierarchy: ``<base>/slot-<i>`` (a sample and everything it forks)
    and ``<base>/judge-<i>`` (the slot's judges) for each slot; ``controllers`` says which of
    :data:`CONTROLLERS` this hierarchy carries (cgroup v2: memory and cpu in one tree)."""

    def __init__(self, kind: str, base: str, slots: int, controllers: set[str]) -> None:
        self.kind, self.base, self.controllers = kind, base, controllers
        self.slot_dirs = [os.path.join(base, f"slot-{i}") for i in range(slots)]
        self.judge_dirs = [os.path.join(base, f"judge-{i}") for i in range(slots)]
        self.quota = False  # whether the slots' CPU quota was set

    def remove(self, deadline: float) -> None:
        for d in [*self.slot_dirs, *self.judge_dirs, self.base]:
            while True:
                try:
                    os.rmdir(d)
                    break
                except FileNotFoundError:
                    break
                except OSError as exc:
                    if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                        break
                    time.sleep(0.01)


def _make_tree(kind: str, own: str, name: str, slots: int, want: set[str]) -> _Tree | None:
    """``<own>/<name>`` with a slot and a judge cgroup per slot, for those of ``want`` this
    hierarchy can give; None when it gives none of them. Raises OSError half-way (the caller
    removes what was made)."""
    if kind == "cgroup2":
        have = set(_read(os.path.join(own, "cgroup.controllers")).split()) & want
        sub = os.path.join(own, "cgroup.subtree_control")
        for c in sorted(have - set(_read(sub).split())):
            try:
                _write(sub, f"+{c}")
            except OSError:  # our cgroup holds processes ("no internal processes")
                have.discard(c)
        if not have:
            return None
    else:
        if not os.access(own, os.W_OK):
            return None
        have = set(want)
    base = os.path.join(own, name)
    os.makedirs(base, exist_ok=True)
    tree = _Tree(kind, base, slots, have)
    try:
        if kind == "cgroup2":
            for c in sorted(have):
                _write(os.path.join(base, "cgroup.subtree_control"), f"+{c}")
        for d in [*tree.slot_dirs, *tree.judge_dirs]:
            os.makedirs(d, exist_ok=True)
        if "memory" in have:
            probe = "memory.max" if kind == "cgroup2" else "memory.limit_in_bytes"
            if not os.path.exists(os.path.join(tree.slot_dirs[0], probe)):
                raise OSError(errno.ENOENT, f"no {probe} in {tree.slot_dirs[0]}")
            if kind == "cgroup2":
                for d in tree.slot_dirs:  # an OOM kill takes the whole sample, not one process
                    with contextlib.suppress(OSError):
                        _write(os.path.join(d, "memory.oom.group"), "1")
        if "cpu" in have:
            _cpu_weights(tree, slots)
        usage = os.path.join(tree.slot_dirs[0], "cpuacct.usage")
        if "cpuacct" in have and kind == "cgroup1" and not os.path.exists(usage):
            raise OSError(errno.ENOENT, f"no cpuacct.usage in {tree.slot_dirs[0]}")
    except OSError:
        tree.remove(0)
        raise
    return tree


def _cpu_weights(tree: _Tree, slots: int) -> None:
    """Equal weights for every slot's sample and judge, the sandbox's group weighing one
    default per slot, and the sample's quota of :data:`SAMPLE_CPUS` where the kernel has one."""
    quota = int(SAMPLE_CPUS * CPU_PERIOD_US)
    if tree.kind == "cgroup2":
        _write(os.path.join(tree.base, "cpu.weight"), str(min(10_000, V2_WEIGHT * slots)))
        for d in [*tree.slot_dirs, *tree.judge_dirs]:
            _write(os.path.join(d, "cpu.weight"), str(V2_WEIGHT))
        with contextlib.suppress(OSError):
            for d in tree.slot_dirs:
                _write(os.path.join(d, "cpu.max"), f"{quota} {CPU_PERIOD_US}")
            tree.quota = True
        return
    _write(os.path.join(tree.base, "cpu.shares"), str(min(262_144, V1_SHARES * slots)))
    for d in [*tree.slot_dirs, *tree.judge_dirs]:
        _write(os.path.join(d, "cpu.shares"), str(V1_SHARES))
    with contextlib.suppress(OSError):  # no CONFIG_CFS_BANDWIDTH: weights only
        for d in tree.slot_dirs:
            _write(os.path.join(d, "cpu.cfs_period_us"), str(CPU_PERIOD_US))
            _write(os.path.join(d, "cpu.cfs_quota_us"), str(quota))
        tree.quota = True


class SlotCgroups:
    """Per concurrency slot, cgroups for the sample and, beside them, for the slot's judges.

    Why memory: RLIMIT_AS bounds each process alone; a sample that forks ``nproc`` processes
    could use ``nproc × memory_mb``. A slot cgroup caps the total, and the kernel's OOM killer
    (counted by ``oom_kills``) tells the zygote when a sample died of it. A judge decoding a
    sample's huge value is held to its own limit, in its own cgroup (``judge-<i>``), so that
    its memory never counts against the sample's.

    Why cpu: without it, a sample that forks spinners, each in its own session (its own
    scheduler autogroup), gets one share of the CPUs per process and starves every other
    sample on the host into a wall-clock timeout. In its slot's cpu cgroup a sample, all its
    processes together, is one scheduling entity of the same weight as any other slot's
    sample or judge, with a quota of :data:`SAMPLE_CPUS`; ``cpu_usage`` is the CPU time its
    processes used together, which the zygote and the judge measure budgets in.

    Each controller lives where the host has it (cgroup v2 first, else v1); any of them may be
    missing: ``kind`` (memory) and ``cpu_kind`` are None then.
    """

    def __init__(self, trees: list[_Tree], slots: int) -> None:
        self.trees = trees
        self.slots = slots
        mem = self._tree("memory")
        cpu = self._tree("cpu")
        acct = cpu if cpu is not None and cpu.kind == "cgroup2" else self._tree("cpuacct")
        self.kind: str | None = mem.kind if mem is not None else None
        self.base = mem.base if mem is not None else trees[0].base
        self.dirs = mem.slot_dirs if mem is not None else []
        self.judge_dirs = mem.judge_dirs if mem is not None else []
        self.cpu_kind: str | None = cpu.kind if cpu is not None else None
        #: how much CPU a slot's processes can use per second of wall clock, at most
        self.cpu_rate = SAMPLE_CPUS if cpu is not None and cpu.quota else float(os.cpu_count() or 1)
        #: per slot, (file, unit): the sample's CPU time so far is in it ("ns": cgroup v1's
        #: cpuacct.usage; "usec": the usage_usec line of cgroup v2's cpu.stat)
        self.usage: list[tuple[str, str]] | None = None
        if acct is not None:
            file, unit = ("cpu.stat", "usec") if acct.kind == "cgroup2" else ("cpuacct.usage", "ns")
            self.usage = [(os.path.join(d, file), unit) for d in acct.slot_dirs]
        self._procs = [
            [os.path.join(t.slot_dirs[i], "cgroup.procs") for t in trees] for i in range(slots)
        ]
        self._judge_procs = [
            [
                os.path.join(t.judge_dirs[i], "cgroup.procs")
                for t in trees
                if t.controllers & {"memory", "cpu"}
            ]
            for i in range(slots)
        ]

    def _tree(self, controller: str) -> _Tree | None:
        return next((t for t in self.trees if controller in t.controllers), None)

    @classmethod
    def create(cls, name: str, slots: int) -> SlotCgroups | None:
        """``<our cgroup>/<name>/{slot,judge}-<i>`` in the hierarchies of the memory, cpu and
        cpuacct controllers that we can write; None where none of them can be had.

        A cgroup v2 controller is used only if our cgroup has it and it can be enabled for
        children (not possible while our own cgroup holds processes, unless it is the root);
        otherwise cgroup v1's hierarchy of that controller at our own path. ``name`` is the
        caller's to make unique (a pid, say): a leftover of the same name is reused.
        """
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"bad cgroup name {name!r}")
        if slots < 1:
            raise ValueError("slots must be at least 1")
        trees: list[_Tree] = []
        try:
            for controller in CONTROLLERS:
                if any(controller in t.controllers for t in trees):
                    continue
                if controller == "cpuacct" and any(
                    t.kind == "cgroup2" and "cpu" in t.controllers for t in trees
                ):
                    continue  # v2's cpu.stat counts the usage
                for kind, own in _own_cgroup_dirs(controller):
                    if kind == "cgroup2" and any(t.kind == "cgroup2" for t in trees):
                        continue  # the v2 tree was made with every controller it could have
                    base = os.path.join(own, name)
                    same = next((t for t in trees if t.base == base), None)
                    if same is not None:  # v1 co-mounted controllers ("cpu,cpuacct")
                        same.controllers.add(controller)
                        if controller == "cpu":
                            _cpu_weights(same, slots)
                        break
                    want = {"memory", "cpu"} if kind == "cgroup2" else {controller}
                    with contextlib.suppress(OSError):
                        tree = _make_tree(kind, own, name, slots, want)
                        if tree is not None:
                            trees.append(tree)
                            if controller in tree.controllers:
                                break
        except OSError:
            pass
        if not trees:
            return None
        return cls(trees, slots)

    @classmethod
    def remove_stale(cls, prefix: str) -> int:
        """Remove ``<our cgroup>/<prefix><pid>`` trees whose pid is gone (a zygote that was
        killed cannot clean up after itself); return how many were removed. Busy ones stay."""
        removed = 0
        owns: list[str] = []
        for controller in CONTROLLERS:
            with contextlib.suppress(OSError):
                owns += [own for _, own in _own_cgroup_dirs(controller) if own not in owns]
        for own in owns:
            try:
                entries = os.listdir(own)
            except OSError:
                continue
            for entry in entries:
                tail = entry[len(prefix) :]
                if not entry.startswith(prefix) or not tail.isdigit():
                    continue
                if os.path.exists(f"/proc/{tail}"):
                    continue
                base = os.path.join(own, entry)
                with contextlib.suppress(OSError):
                    for sub in os.listdir(base):
                        if os.path.isdir(os.path.join(base, sub)):
                            os.rmdir(os.path.join(base, sub))
                    os.rmdir(base)
                    removed += 1
        return removed

    def set_limit(self, slot: int, nbytes: int) -> None:
        """Cap the slot's sample memory (and swap: none) at ``nbytes``."""
        if self.dirs:
            self._set_memory(self.dirs[slot], nbytes)

    def set_judge_limit(self, slot: int, nbytes: int) -> None:
        """Cap the memory of the slot's judges (together) at ``nbytes``."""
        if self.judge_dirs:
            self._set_memory(self.judge_dirs[slot], nbytes)

    def _set_memory(self, d: str, nbytes: int) -> None:
        if self.kind == "cgroup2":
            _write(os.path.join(d, "memory.max"), str(int(nbytes)))
            swap = os.path.join(d, "memory.swap.max")
            if os.path.exists(swap):
                _write(swap, "0")
            return
        limit = os.path.join(d, "memory.limit_in_bytes")
        memsw = os.path.join(d, "memory.memsw.limit_in_bytes")
        if not os.path.exists(memsw):
            _write(limit, str(int(nbytes)))
            return
        # v1 keeps memsw >= limit at every step: raise memsw first, lower it last
        if int(nbytes) >= int(_read(limit)):
            _write(memsw, str(int(nbytes)))
            _write(limit, str(int(nbytes)))
        else:
            _write(limit, str(int(nbytes)))
            _write(memsw, str(int(nbytes)))

    def enter(self, slot: int) -> None:
        """Move the calling process into the slot's sample cgroups (one write per hierarchy:
        "0" means the writer, in any PID namespace). Call in W before dropping privileges;
        children inherit them."""
        for procs in self._procs[slot]:
            _write(procs, "0")

    def enter_judge(self, slot: int) -> None:
        """Move the calling process into the slot's judge cgroups (memory and cpu)."""
        for procs in self._judge_procs[slot]:
            _write(procs, "0")

    def cpu_usage(self, slot: int) -> float | None:
        """The CPU seconds the slot's sample processes used so far (monotonic); None without
        CPU accounting or when it cannot be read."""
        if self.usage is None:
            return None
        return read_cpu_usage(*self.usage[slot])

    def oom_kills(self, slot: int) -> int:
        """How many processes the kernel OOM-killed in this slot so far (monotonic)."""
        return self._oom_kills(self.dirs[slot]) if self.dirs else 0

    def judge_oom_kills(self, slot: int) -> int:
        """How many of the slot's judge processes the kernel OOM-killed so far (monotonic)."""
        return self._oom_kills(self.judge_dirs[slot]) if self.judge_dirs else 0

    def _oom_kills(self, d: str) -> int:
        if self.kind == "cgroup2":
            return _field(_read(os.path.join(d, "memory.events")), "oom_kill")
        with contextlib.suppress(OSError, KeyError):
            return _field(_read(os.path.join(d, "memory.oom_control")), "oom_kill")
        return int(_read(os.path.join(d, "memory.failcnt")))  # kernels before 4.13: hits

    def close(self, wait_s: float = 2.0) -> None:
        """Remove the slot cgroups and their parents, retrying while processes still exit."""
        deadline = time.monotonic() + wait_s
        for tree in self.trees:
            tree.remove(deadline)


def read_cpu_usage(path: str, unit: str) -> float | None:
    """A cgroup's CPU seconds from its usage file (see ``SlotCgroups.usage``); None when it
    cannot be read."""
    try:
        text = _read(path)
        if unit == "ns":
            return int(text) / 1e9
        return _field(text, "usage_usec") / 1e6
    except (OSError, ValueError, KeyError):
        return None


def _field(text: str, key: str) -> int:
    for line in text.splitlines():
        k, _, v = line.partition(" ")
        if k == key:
            return int(v)
    raise KeyError(key)
