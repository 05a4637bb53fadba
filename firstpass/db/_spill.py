"""The spill file: a replica's chain lines that could not reach PostgreSQL yet, on local disk.

While the database is slow or gone, the writer links receipts as usual and appends the lines
here (fsynced), so a request's receipt is safe before the database has it; when the database is
back the lines are shipped in order and the file is emptied. The file is itself a valid chain
fragment (its first line links to the last line the table held when it started), so
``firstpass receipts verify <spill>`` reads it, and a replica that was killed mid-outage ships
it at its next start. Every method runs in the writer's one spill thread, never on the loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from firstpass.errors import ReceiptError
from firstpass.receipts import verify_chain
from firstpass.receipts._aside import move_aside

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["SpillFile", "SpillState", "TornTail"]


@dataclass(frozen=True, kw_only=True)
class TornTail:
    """An incomplete last line found at start (a kill mid-append), moved aside."""

    lost_bytes: int
    lost_sha256: str
    moved_to: str


@dataclass(frozen=True, kw_only=True)
class SpillState:
    """What a spill file held when it was opened: ``n_lines`` whole lines, the first one's
    ``prev_hash`` (``None`` when empty), the last one's hash, and any torn tail cut off."""

    n_lines: int
    first_prev: str | None
    head: str | None
    size: int
    torn: TornTail | None = None


class SpillFile:
    """One replica's spill file: append, read back from an offset, empty once shipped."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        self._fd = -1
        self._needs_cut = False
        self.size = 0

    def open(self) -> SpillState:
        """Open (creating 0600), lock against a second writer, verify what is there and cut a
        torn last line off (kept beside it as ``<spill>.torn-<time>``)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
        except OSError as exc:
            raise ReceiptError(f"{self.path}: cannot open the receipt spill file: {exc}") from exc
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    raise ReceiptError(
                        f"{self.path}: another firstpass process holds this spill file: give "
                        "each replica its own ([receipts] spill_path) and its own replica id"
                    ) from None
            os.fchmod(fd, 0o600)
            state = self._verified(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.size = state.size
        return state

    def _verified(self, fd: int) -> SpillState:
        size = os.fstat(fd).st_size
        if size == 0:
            return SpillState(n_lines=0, first_prev=None, head=None, size=0)
        report = verify_chain(self.path, prev=None)
        if not report.ok and not report.torn:
            raise ReceiptError(
                f"{self.path}: line {report.first_bad_line} of the spill file does not verify "
                f"({report.reason}); it holds receipts not yet in the database, so firstpass "
                f"will not ship or extend it. Inspect it with `firstpass receipts verify "
                f"{self.path}`"
            )
        torn = None
        if report.torn:
            torn = self._cut(fd, report.good_bytes)
        return SpillState(
            n_lines=report.n_lines,
            first_prev=report.first_prev,
            head=report.head if report.n_lines else None,
            size=report.good_bytes,
            torn=torn,
        )

    def _cut(self, fd: int, good: int) -> TornTail:
        with open(self.path, "rb") as fh:
            fh.seek(good)
            tail = fh.read()
        aside = move_aside(self.path, tail)
        os.ftruncate(fd, good)
        os.fsync(fd)
        return TornTail(
            lost_bytes=len(tail),
            lost_sha256="sha256:" + hashlib.sha256(tail).hexdigest(),
            moved_to=aside.name,
        )

    def append(self, data: bytes) -> None:
        """Append whole lines and fsync; on ``OSError`` the file is cut back to what it was,
        so a failed append leaves no partial line."""
        start = self.size
        try:
            if self._needs_cut:  # an earlier failed append could not cut itself off
                os.ftruncate(self._fd, start)
                self._needs_cut = False
            os.lseek(self._fd, start, os.SEEK_SET)
            _write_all(self._fd, data)
            if self._fsync:
                os.fsync(self._fd)
        except OSError:
            self._needs_cut = True
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, start)
                self._needs_cut = False
            raise
        self.size = start + len(data)

    def read(self, offset: int, max_bytes: int) -> list[bytes]:
        """Whole lines from ``offset``, at least one and about ``max_bytes`` in all."""
        lines: list[bytes] = []
        taken = 0
        with open(self.path, "rb") as fh:
            fh.seek(offset)
            while offset + taken < self.size:
                line = fh.readline()
                if not line.endswith(b"\n"):
                    break  # only whole lines: anything else is not ours yet
                lines.append(line)
                taken += len(line)
                if taken >= max_bytes:
                    break
        return lines

    def clear(self) -> None:
        """Empty the file once everything in it is in the database."""
        os.ftruncate(self._fd, 0)
        if self._fsync:
            os.fsync(self._fd)
        self.size = 0

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
