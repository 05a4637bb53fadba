"""Resource limits for one sample run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, cast

from firstpass.errors import ConfigError

if TYPE_CHECKING:
    from ._child.frames import WireLimits

__all__ = ["Limits"]


#: the longest time limit: a day (beyond it the zygote's select() timeout overflows at ~1e9 s)
MAX_SECONDS = 86_400.0
#: how far ``wall_s`` stretches, at most, for a sample that waited for a CPU (others' load):
#: the zygote's hard deadline is ``WALL_STRETCH × wall_s``, whatever the sample and the host do
WALL_STRETCH = 3.0


@dataclass(frozen=True, kw_only=True)
class Limits:
    """What one sample may use. Every limit is enforced by the kernel (rlimits) or the zygote.

    ``cpu_s`` (RLIMIT_CPU per process, and where the host has a CPU controller the sample's
    processes together) and ``wall_s`` (the zygote's deadline, which kills the whole uid; it
    stretches by the time the sample waited for a CPU, up to ``WALL_STRETCH × wall_s``) bound
    time; each test also gets a quarter of ``min(cpu_s, wall_s)`` of CPU time when there are
    several, so one hanging test does not hide the others. ``memory_mb`` is the address-space
    limit (the interpreter itself takes ~30 MB of it); where the host has a writable memory
    cgroup, the sample's processes *together*, its scratch files included, are also held to
    ``memory_mb + scratch_mb`` (``Sandbox.memory_bound`` says which applies).
    ``scratch_mb`` sizes the one private tmpfs that backs the sample's ``/tmp``, ``/var/tmp``,
    ``/dev/shm`` and work directory. ``output_bytes`` caps stdout+stderr together.
    ``site_packages`` runs the sample in an interpreter that can import installed packages.
    """

    cpu_s: float = 5.0
    wall_s: float = 10.0
    memory_mb: int = 1024
    file_size_mb: float = 16.0
    nproc: int = 32
    nofile: int = 64
    output_bytes: int = 1_000_000
    scratch_mb: int = 64
    site_packages: bool = False

    def __post_init__(self) -> None:
        for name, most in (("cpu_s", MAX_SECONDS), ("wall_s", MAX_SECONDS), ("file_size_mb", 1e6)):
            value = getattr(self, name)
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not 0 < value <= most
            ):
                raise ConfigError(
                    f"limits.{name}", f"must be a number in (0, {most:g}], got {value!r}"
                )
        for name, least in (
            ("memory_mb", 64),
            ("nproc", 1),
            ("nofile", 8),
            ("output_bytes", 1),
            ("scratch_mb", 1),
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < least:
                raise ConfigError(f"limits.{name}", f"must be an integer >= {least}, got {value!r}")
        if not isinstance(self.site_packages, bool):
            raise ConfigError("limits.site_packages", "must be true or false")

    def to_wire(self) -> WireLimits:
        """The form the zygote reads."""
        return cast("WireLimits", asdict(self))  # its fields are the record's keys
