"""Where the monitor's counts and revocations outlive a process: the store protocol, and the
file store every worker and replica sharing a receipts directory reads
(``<receipts dir>/licences.json``). PostgreSQL's is ``firstpass.db.PostgresLicenceStore``.

The file holds each replica's counts per licence (a replica writes only its own) and the
revocations. Every change is read, changed and written back under an exclusive ``flock`` on
``licences.json.lock``, and written atomically (a temporary file, fsync, ``os.replace``), so a
reader sees either the old file or the new one; the lock also makes the store's states a single
sequence, each holding every count of the one before (the order the monitor's e-process runs
in). All file I/O runs in a thread, off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from firstpass._json import JSON
from firstpass.errors import ReceiptError
from firstpass.monitor._licences import LicenceKey, Revocation, Tally
from firstpass.monitor._recorded import Recorded, directory_logs, read_recorded

__all__ = ["LICENCES_FILE", "FileLicenceStore", "LicenceStore", "Snapshot"]

#: the state file's name, in the receipt log's directory
LICENCES_FILE = "licences.json"
_VERSION = 1


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One state of the store: every replica's counts per licence, and the revocations."""

    replicas: Mapping[str, Mapping[LicenceKey, Tally]] = field(default_factory=dict)
    revocations: Mapping[LicenceKey, Revocation] = field(default_factory=dict)


class LicenceStore(Protocol):
    """The persistence the monitor needs; every call is a coroutine that never blocks the loop."""

    async def load(self) -> Snapshot:
        """The current state (at start: to resume from; later: to see other replicas)."""
        ...

    async def exchange(self, replica: str, mine: Mapping[LicenceKey, Tally]) -> Snapshot:
        """Store ``replica``'s counts (replacing its earlier ones) and return the state just
        written, atomically: the e-process is decided on exactly that state."""
        ...

    async def revoke(self, revocation: Revocation) -> bool:
        """Record a revocation; False when the licence was revoked already (by anyone)."""
        ...

    async def recorded(self, certificates: Collection[str]) -> Recorded:
        """What the receipts record (read at start): every revocation line of the chains this
        store's replicas write, and which of ``certificates`` the receipts mention. The store's
        own state can be deleted or edited; the chain is the record."""
        ...

    async def aclose(self) -> None: ...


class FileLicenceStore:
    """``licences.json`` beside the receipt logs (module docstring)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock_path = path.with_name(path.name + ".lock")
        #: (mtime_ns, size) of the file last read, and what it held: polls stat, not read
        self._seen: tuple[int, int] | None = None
        self._cached = Snapshot()

    async def load(self) -> Snapshot:
        return await asyncio.to_thread(self._load)

    async def exchange(self, replica: str, mine: Mapping[LicenceKey, Tally]) -> Snapshot:
        return await asyncio.to_thread(self._exchange, replica, dict(mine))

    async def revoke(self, revocation: Revocation) -> bool:
        return await asyncio.to_thread(self._revoke, revocation)

    async def recorded(self, certificates: Collection[str]) -> Recorded:
        """The revocation lines of every log beside ``licences.json`` (each worker's chain,
        rotated files included), and which of ``certificates`` they mention."""
        return await asyncio.to_thread(
            lambda: read_recorded(directory_logs(self.path.parent), certificates)
        )

    async def aclose(self) -> None:
        return None

    # -- in a thread ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise ReceiptError(f"{self._lock_path}: cannot open the licence lock ({exc})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # closing releases the lock

    def _load(self, *, fresh: bool = False) -> Snapshot:
        """The file's state; unchanged (same mtime and size) → the copy read last, unless
        ``fresh`` (under the lock, where a same-size rewrite in the same tick must be seen)."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._seen, self._cached = None, Snapshot()
            return self._cached
        except OSError as exc:
            raise ReceiptError(f"{self.path}: cannot read the licence state ({exc})") from exc
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._seen and not fresh:
            return self._cached
        try:
            text = self.path.read_text("utf-8")
        except OSError as exc:
            raise ReceiptError(f"{self.path}: cannot read the licence state ({exc})") from exc
        self._cached = _parse(text, self.path)
        self._seen = stamp
        return self._cached

    def _write(self, snapshot: Snapshot) -> None:
        doc: dict[str, JSON] = {
            "version": _VERSION,
            "replicas": {
                name: {key.text(): tally.to_dict() for key, tally in sorted(tallies.items())}
                for name, tallies in sorted(snapshot.replicas.items())
            },
            "revocations": {
                key.text(): rev.to_dict() for key, rev in sorted(snapshot.revocations.items())
            },
        }
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=1, sort_keys=True)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            st = os.stat(self.path)
        except OSError as exc:
            raise ReceiptError(f"{self.path}: cannot write the licence state ({exc})") from exc
        self._seen, self._cached = (st.st_mtime_ns, st.st_size), snapshot

    def _exchange(self, replica: str, mine: dict[LicenceKey, Tally]) -> Snapshot:
        with self._locked():
            now = self._load(fresh=True)
            replicas = {name: dict(t) for name, t in now.replicas.items()}
            replicas[replica] = mine
            written = Snapshot(replicas=replicas, revocations=dict(now.revocations))
            self._write(written)
            return written

    def _revoke(self, revocation: Revocation) -> bool:
        with self._locked():
            now = self._load(fresh=True)
            if revocation.key in now.revocations:
                return False
            revocations = {**now.revocations, revocation.key: revocation}
            self._write(Snapshot(replicas=now.replicas, revocations=revocations))
            return True


def _parse(text: str, path: Path) -> Snapshot:
    """The state file; one that does not read is an error (a fresh start would be a new look)."""
    advice = (
        "it holds the licence monitor's counts and revocations; restore it from a backup (a "
        "fresh start would make the monitor's test invalid and forget revocations), or remove "
        "it only together with citing new certificates"
    )
    try:
        doc = json.loads(text)
    except ValueError as exc:
        raise ReceiptError(f"{path}: not JSON ({exc}); {advice}") from exc
    if not isinstance(doc, dict) or doc.get("version") != _VERSION:
        raise ReceiptError(f"{path}: not a licence state file of version {_VERSION}; {advice}")
    replicas: dict[str, dict[LicenceKey, Tally]] = {}
    revocations: dict[LicenceKey, Revocation] = {}
    try:
        for name, tallies in dict(doc.get("replicas") or {}).items():
            mine = replicas.setdefault(str(name), {})
            for key, raw in dict(tallies).items():
                try:
                    mine[LicenceKey.parse(key)] = Tally.from_dict(raw)
                except (TypeError, ValueError, AttributeError) as exc:
                    raise ValueError(f"replica {name!r}, licence {key!r}: {exc}") from exc
        for raw in dict(doc.get("revocations") or {}).values():
            rev = Revocation.from_dict(raw)
            if rev is None:
                raise ValueError(f"a revocation does not read: {raw!r}")
            revocations[rev.key] = rev
    except (TypeError, ValueError, AttributeError) as exc:
        raise ReceiptError(f"{path}: {exc}; {advice}") from exc
    return Snapshot(replicas=replicas, revocations=revocations)
