"""``ReceiptLog``: what the server needs of a receipt sink, whichever holds the chain.

Two implement it: ``ReceiptWriter`` (a JSONL file, the embedded default) and
``firstpass.db.PostgresReceiptWriter`` (one replica's chain in a shared PostgreSQL table).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import msgspec

from firstpass.receipts._writer import WriterStats

__all__ = ["ReceiptLog"]


class ReceiptLog(Protocol):
    """A started receipt sink: ``write`` may wait for durability (``fsync = "durable"``),
    ``enqueue`` never does; ``healthy`` is ``False`` while a receipt could not be kept (the
    server then refuses verified traffic with 503)."""

    @property
    def healthy(self) -> bool: ...

    @property
    def stats(self) -> WriterStats: ...

    async def start(self) -> None: ...

    async def write(self, record: Mapping[str, object] | msgspec.Struct) -> None: ...

    async def enqueue(self, record: Mapping[str, object] | msgspec.Struct) -> None: ...

    async def flush(self) -> None: ...

    async def close(self) -> None: ...
