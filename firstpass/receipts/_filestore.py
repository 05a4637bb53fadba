"""The JSONL receipt log as a ``ReceiptStore``: one file, locked, appended to by one thread.

Everything that touches the file runs in one dedicated thread (``firstpass-receipts``), never on
the event loop: a batch is linked, written with one ``os.write`` (looping on short writes) and
fsynced in a single hand-over. A failed batch is cut back off the file (``ftruncate`` to its
size before the batch), so no partial line stays and the same records can be written again.
Rotation happens between batches: the full file becomes the next numbered sibling, closed by a
checkpoint when signing, and the chain goes on in a fresh file.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import structlog

from firstpass.errors import ReceiptError
from firstpass.receipts._aside import fsync_dir, move_aside
from firstpass.receipts._batch import Chain, ReceiptBatch
from firstpass.receipts._canonical import GENESIS_HASH
from firstpass.receipts._chain import BadLine, check_line, check_link, read_tail_hash, verify_chain
from firstpass.receipts._rotate import next_rotated_name, rotated_siblings
from firstpass.receipts._store import FsyncPolicy, ReceiptStore, StoreHead

try:  # advisory lock so two processes never interleave lines in one chain
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

__all__ = ["WRITER_THREAD", "FileStore"]

log = structlog.get_logger("firstpass.receipts")

#: the name of the one thread that touches the log
WRITER_THREAD = "firstpass-receipts"


class FileStore(ReceiptStore):
    """The receipt log at ``path`` (the active file) and its rotated siblings."""

    deferred_sync = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        fsync: FsyncPolicy,
        rotate_bytes: int | None,
        rotate_s: float | None,
    ) -> None:
        if rotate_bytes is not None and rotate_bytes < 1:
            raise ReceiptError(f"rotate_bytes must be positive, not {rotate_bytes!r}")
        if rotate_s is not None and rotate_s <= 0:
            raise ReceiptError(f"rotate_s must be positive, not {rotate_s!r}")
        self.path = Path(path)
        self.name = str(self.path)
        self.log_fields = {"path": str(self.path)}
        self._fsync = fsync
        self._rotate_bytes = rotate_bytes
        self._rotate_s = rotate_s
        self._executor: ThreadPoolExecutor | None = None
        # writer thread side
        self._fd = -1
        self._file_bytes = 0  # the active file's size when every line so far is whole
        self._file_opened = 0.0
        self._needs_cut = False  # a failed batch may have left bytes past ``_file_bytes``
        self._rotations = 0

    async def open(self, wake: Callable[[], None]) -> StoreHead:
        """Open (or create, mode 0600) the log, lock it, verify it and find its head.

        ``ReceiptError`` if the file cannot be opened, another process is writing it, or it is
        damaged other than by a torn last line (run ``firstpass receipts verify``)."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=WRITER_THREAD)
        try:
            head = await asyncio.get_running_loop().run_in_executor(executor, self._open)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        self._executor = executor
        return head

    async def append(self, batch: ReceiptBatch, sync: bool) -> None:
        assert self._executor is not None
        await asyncio.get_running_loop().run_in_executor(
            self._executor, self._write_batch, batch, sync
        )

    async def sync(self) -> None:
        assert self._executor is not None
        await asyncio.get_running_loop().run_in_executor(self._executor, self._sync)

    async def close(self, clean: bool) -> None:
        """Close the file in its thread; after a hung write (``clean`` false) leave the thread
        be: waiting for it could take forever."""
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            if clean:
                await asyncio.get_running_loop().run_in_executor(executor, self._close_fd)
        finally:
            executor.shutdown(wait=False)

    def stats(self) -> dict[str, int]:
        return {"rotations": self._rotations}

    # -- the writer thread -------------------------------------------------------------------

    def _open(self) -> StoreHead:
        """Open for append (creating 0600), lock, verify, cut a torn tail, find the head."""
        path = self.path
        self._file_opened = time.monotonic()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            existed = path.exists()
            fd = self._open_active()
        except OSError as exc:
            raise ReceiptError(f"{path}: cannot open the receipt log: {exc}") from exc
        if not existed and self._fsync == "durable":
            # a log created just now must survive a crash with the receipts acknowledged in
            # it: its directory entry is made durable too (as rotation does for its new files)
            fsync_dir(path.parent)
        try:
            self._lock(fd)
            self._fd = fd
            return self._verified_head(fd)
        except BaseException:
            self._fd = -1
            os.close(fd)
            raise

    def _open_active(self) -> int:
        flags = os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o600)
            os.fchmod(fd, 0o600)  # whatever the umask: receipts are audit data
        except FileExistsError:
            fd = os.open(self.path, flags)
        return fd

    def _lock(self, fd: int) -> None:
        if fcntl is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ReceiptError(
                f"{self.path}: another receipt writer has this log open (another firstpass "
                "serve?); two writers would break the chain. Stop the other process, or "
                "give this one its own log ([receipts] path or FIRSTPASS_RECEIPTS)"
            ) from None

    def _verified_head(self, fd: int) -> StoreHead:
        """Where the chain goes on (the newest rotated sibling's last line for an empty active
        file), after any repair of a torn last line."""
        path = self.path
        try:
            siblings = rotated_siblings(path)
            anchor = read_tail_hash(siblings[-1]) if siblings else GENESIS_HASH
            if os.fstat(fd).st_size == 0:
                self._file_bytes = 0
                return StoreHead(head=anchor)
            report = verify_chain(path, prev=None)
        except OSError as exc:
            raise ReceiptError(f"{path}: cannot read the receipt log: {exc}") from exc
        head = report.head if report.n_lines else anchor
        if report.ok:
            self._file_bytes = report.good_bytes
            return StoreHead(head=head)
        if not report.torn:
            raise ReceiptError(
                f"{path}: line {report.first_bad_line} does not verify ({report.reason});"
                f" refusing to extend the chain. Run `firstpass receipts verify {path}` to see"
                " where it breaks"
            )
        try:
            completed = self._complete_torn(fd, head, report.good_bytes)
            return completed or self._cut_torn(fd, head, report.good_bytes)
        except OSError as exc:
            raise ReceiptError(f"{path}: cannot repair the torn last line: {exc}") from exc

    def _complete_torn(self, fd: int, head: str, good: int) -> StoreHead | None:
        """A last line that lacks only its newline (a write cut short by one byte) is a whole
        receipt: it hashes and links to ``head``. End it with its newline instead of moving it
        aside (nothing was lost); ``None`` for a truly torn line."""
        with open(self.path, "rb") as fh:
            fh.seek(good)
            tail = fh.read()
        try:
            record = check_line(tail + b"\n")
            check_link(record, head, 2)
        except BadLine:
            return None
        _write_all(fd, b"\n")
        os.fsync(fd)
        log.warning("receipt_log_completed", path=str(self.path), line_bytes=len(tail))
        self._file_bytes = good + len(tail) + 1
        return StoreHead(head=str(record["hash"]))

    def _cut_torn(self, fd: int, head: str, good: int) -> StoreHead:
        """Move the incomplete last line aside and cut it off; the writer links a gap marker
        in its place."""
        with open(self.path, "rb") as fh:
            fh.seek(good)
            torn = fh.read()
        aside = move_aside(self.path, torn)
        os.ftruncate(fd, good)
        self._file_bytes = good
        log.warning(
            "receipt_log_repaired", path=str(self.path), lost_bytes=len(torn), moved_to=str(aside)
        )
        return StoreHead(
            head=head,
            torn={
                "lost_bytes": len(torn),
                "lost_sha256": "sha256:" + hashlib.sha256(torn).hexdigest(),
                "moved_to": aside.name,
            },
        )

    def _write_batch(self, batch: ReceiptBatch, sync: bool) -> int:
        """Rotate first when due, link, write whole lines with one ``os.write``, fsync. On
        ``OSError`` the file is cut back to its size before the batch: nothing half-written
        stays, and the chain's head has not moved."""
        start = self._file_bytes
        try:
            if self._needs_cut:  # an earlier attempt failed and could not cut itself off
                os.ftruncate(self._fd, start)
                self._needs_cut = False
            if batch and self._rotation_due(batch.size):
                self._rotate(batch.chain)
                start = self._file_bytes
            data = batch.link()
            _write_all(self._fd, data)
            if sync:
                os.fsync(self._fd)
        except OSError:
            self._file_bytes = start  # a rotation's checkpoint is cut off with the batch
            self._needs_cut = True
            try:
                os.ftruncate(self._fd, start)
                self._needs_cut = False
            except OSError:
                pass  # tried again before the next write
            raise
        self._file_bytes += len(data)
        return len(data)

    def _sync(self) -> None:
        os.fsync(self._fd)

    def _close_fd(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def _rotation_due(self, incoming: int) -> bool:
        if self._file_bytes == 0:
            return False
        if self._rotate_bytes is not None and self._file_bytes + incoming > self._rotate_bytes:
            return True
        return self._rotate_s is not None and time.monotonic() - self._file_opened >= self._rotate_s

    def _rotate(self, chain: Chain) -> None:
        """Close the active file (with a checkpoint, when lines came since the last) as the next
        numbered sibling and open a fresh one: its first line links to the old file's last."""
        closing = None
        if chain.checkpoint_due(0, forced=True):
            closing = ReceiptBatch(chain, [], forced=True)
            line = closing.link()
            _write_all(self._fd, line)
            self._file_bytes += len(line)
        os.fsync(self._fd)
        target = next_rotated_name(self.path)
        os.rename(self.path, target)
        try:
            fd = self._open_active()
        except OSError:
            os.rename(target, self.path)
            raise
        try:
            self._lock(fd)
            fsync_dir(self.path.parent)
        except BaseException:
            os.close(fd)
            raise
        old, self._fd = self._fd, fd
        os.close(old)
        if closing is not None:  # in the rotated file for good: the chain goes on after it
            chain.advance(closing)
        self._file_bytes = 0
        self._file_opened = time.monotonic()
        self._rotations += 1
        log.info("receipt_log_rotated", path=str(self.path), rotated_to=str(target))


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
