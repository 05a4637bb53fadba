"""Records on their way into a chain: encoded on the caller's side, linked in batches.

``Chain`` is one writer's view of its chain: the head the next line links to, and what its
signed checkpoints vouch for. ``ReceiptBatch`` is what a writer hands its store: records linked
after the head, with a checkpoint at the end when one is due. Linking never moves the head;
``Chain.advance`` does, once the store has kept the batch, so a batch that failed can be linked
again (or, once sent somewhere it may have landed, kept exactly as linked).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator, Mapping
from typing import Protocol

import msgspec
import structlog

from firstpass.receipts._canonical import GENESIS_HASH, EncodedRecord, encode_record
from firstpass.receipts._chain import link

__all__ = ["Chain", "Checkpointer", "Pending", "ReceiptBatch", "pending_record"]

log = structlog.get_logger("firstpass.receipts")


class Checkpointer(Protocol):
    """Signs the chain head now and then (``firstpass.receipts.CheckpointSigner``).

    ``checkpoint(head)`` is called in the writer's thread, with ``head`` the hash of the last
    line written; it returns a complete record (``id``, ``kind="checkpoint"``, ``mode``,
    ``time``, what it signed) that the writer links right after ``head``.

    ``begin(head)`` says from which head the next checkpoint vouches: the writer calls it once
    at start, with the chain head it inherited (after any gap marker it writes at start, before
    any record of its own), so its checkpoints never vouch for lines it did not write; each
    later checkpoint vouches from the head the one before it signed. The writer calls it again
    only if a checkpoint it was handed never reached the log (a failed write), with the head the
    last one kept signed. A checkpointer without ``begin`` is still accepted (its checkpoints
    carry no ``since``).
    """

    interval_s: float

    def begin(self, head: str) -> None: ...

    def checkpoint(self, head: str) -> Mapping[str, object]: ...


class Pending:
    """A record taken from a caller: encoded, its ``time`` and ``kind`` (a table's side
    columns) and, for a durable write, the future its caller waits on."""

    __slots__ = ("encoded", "future", "kind", "time")

    def __init__(self, encoded: EncodedRecord, time: object, kind: str | None) -> None:
        self.encoded = encoded
        self.time = time
        self.kind = kind
        self.future: asyncio.Future[None] | None = None


def pending_record(record: Mapping[str, object] | msgspec.Struct) -> Pending:
    """Validate and encode ``record`` now, on the caller's side (a bad value raises here).

    A ``msgspec.Struct`` is turned into builtins first, so it gives the bytes the equivalent
    dict gives; any other mapping is copied into a dict."""
    data: Mapping[str, object]
    if isinstance(record, msgspec.Struct):
        data = msgspec.to_builtins(record)  # a Struct's builtins: a dict
    elif isinstance(record, Mapping) and not isinstance(record, dict):
        data = dict(record)
    else:
        data = record
    encoded = encode_record(data)  # refuses anything but a dict
    kind = data.get("kind")
    return Pending(encoded, data.get("time"), kind if isinstance(kind, str) else None)


class Chain:
    """One writer's chain: the head and line count so far, and its checkpoints' state.

    ``vouched`` is the head the last checkpoint kept signed (the inherited head before one):
    where the next checkpoint vouches from; ``None`` until ``begin``, so a gap marker written
    at start is never signed by a checkpoint of this writer."""

    def __init__(self, checkpointer: Checkpointer | None, log_fields: Mapping[str, str]) -> None:
        self.checkpointer = checkpointer
        self.head = GENESIS_HASH
        self.seq = 0
        self.vouched: str | None = None
        self.since_checkpoint = 0  # lines kept since the last checkpoint
        self.last_checkpoint = time.monotonic()
        self.checkpoints = 0
        self._signer_from: str | None = None  # where the checkpointer believes it vouches from
        self._log_fields = dict(log_fields)

    def reset(self, head: str, seq: int) -> None:
        """Continue after ``head``, line ``seq`` of the chain (what the store found)."""
        self.head, self.seq = head, seq
        self.last_checkpoint = time.monotonic()

    def begin(self, head: str) -> None:
        """Tell the checkpointer its next checkpoint vouches from ``head``."""
        self.vouched = head
        begin = getattr(self.checkpointer, "begin", None)
        if begin is None:
            return
        try:
            begin(head)
            self._signer_from = head
        except Exception:  # a signer fault must not stop receipts
            self._signer_from = None
            log.exception("receipt_checkpoint_failed", **self._log_fields)

    def checkpoint_due(self, incoming: int, *, forced: bool) -> bool:
        if self.checkpointer is None or self.vouched is None:
            return False
        if self.since_checkpoint + incoming == 0:
            return False
        return forced or time.monotonic() - self.last_checkpoint >= self.checkpointer.interval_s

    def checkpoint_line(self, head: str) -> tuple[bytes, str, object] | None:
        """A checkpoint linked after ``head``: its line, hash and ``time``; ``None`` if the
        checkpointer failed (logged: a missed checkpoint must not stop receipts). When the last
        one made never reached the log, the checkpointer first starts again from ``vouched``."""
        assert self.checkpointer is not None and self.vouched is not None
        try:
            if self._signer_from != self.vouched:
                self.begin(self.vouched)
            self._signer_from = None  # unknown until this checkpoint is made
            record = self.checkpointer.checkpoint(head)
            self._signer_from = head
            line, digest = link(encode_record(record), head)
        except Exception:
            log.exception("receipt_checkpoint_failed", **self._log_fields)
            return None
        return line, digest, record.get("time")

    def advance(self, batch: ReceiptBatch) -> None:
        """``batch`` was kept: the chain goes on after it."""
        assert batch.linked
        self.head, self.seq = batch.head, batch.seq
        if batch.checkpoint_head is not None:
            self.since_checkpoint = 0
            self.last_checkpoint = time.monotonic()
            self.checkpoints += 1
            self.vouched = batch.checkpoint_head
        else:
            self.since_checkpoint += len(batch)


class ReceiptBatch:
    """Records to append in one go: a gap marker first (``marked`` records dropped before it),
    then the callers' ``items``; ``link()`` adds a checkpoint after them when one is due
    (``forced``: whenever lines came since the last). Iterating gives the encoded records.

    ``sent``: a store handed the linked lines somewhere they may have landed (an insert whose
    outcome is unknown); from then on they are the chain's next lines and the writer retries
    this very batch instead of linking its records again."""

    def __init__(
        self,
        chain: Chain,
        items: list[Pending],
        *,
        marker: Pending | None = None,
        marked: int = 0,
        forced: bool = False,
    ) -> None:
        self.chain = chain
        self.items = items
        self.marker = marker
        self.marked = marked  # how many dropped records ``marker`` records
        self.forced = forced
        self.sent = False
        self.linked = False
        self.lines: list[bytes] = []
        self.hashes: list[str] = []
        self.prev = chain.head  # what the first line links to (set again by ``link``)
        self.first_seq = chain.seq + 1
        self.head = chain.head
        self.seq = chain.seq
        self.data = b""
        self.checkpoint_head: str | None = None  # the head a checkpoint in this batch signed
        self.checkpoint_time: object = None

    def __len__(self) -> int:
        return len(self.items) + (self.marker is not None)

    def __iter__(self) -> Iterator[EncodedRecord]:
        if self.marker is not None:
            yield self.marker.encoded
        for item in self.items:
            yield item.encoded

    @property
    def size(self) -> int:
        """Bytes of the records' lines (a checkpoint not included)."""
        return sum(record.size for record in self)

    def link(self) -> bytes:
        """Link the records after the chain's head (once; CPU work: call it in the store's
        thread) and return the lines as one byte string."""
        if self.linked:
            return self.data
        chain = self.chain
        prev = self.prev = chain.head
        self.first_seq = chain.seq + 1
        for record in self:
            line, prev = link(record, prev)
            self.lines.append(line)
            self.hashes.append(prev)
        if chain.checkpoint_due(len(self), forced=self.forced):
            checkpoint = chain.checkpoint_line(prev)
            if checkpoint is not None:
                line, digest, self.checkpoint_time = checkpoint
                self.checkpoint_head = prev
                self.lines.append(line)
                self.hashes.append(digest)
                prev = digest
        self.head = prev
        self.seq = chain.seq + len(self.lines)
        self.data = b"".join(self.lines)
        self.linked = True
        return self.data

    def entries(self) -> Iterator[tuple[int, bytes, str, str, object, str | None]]:
        """Each linked line as ``(seq, line, hash, prev_hash, time, kind)``."""
        sides: list[tuple[object, str | None]] = [
            (p.time, p.kind) for p in ([self.marker] if self.marker else []) + self.items
        ]
        if self.checkpoint_head is not None:
            sides.append((self.checkpoint_time, "checkpoint"))
        prev = self.prev
        for offset, (line, digest, side) in enumerate(
            zip(self.lines, self.hashes, sides, strict=True)
        ):
            yield self.first_seq + offset, line, digest, prev, side[0], side[1]
            prev = digest
