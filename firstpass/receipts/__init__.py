"""Receipts: one hash-chained JSONL line per request, written off the request path.

    writer = ReceiptWriter(path, fsync="batch", queue_size=10_000)
    await writer.start(); await writer.write(record); await writer.close()
    report = verify_chain(path)   # VerifyReport(ok, n_lines, head, first_bad_line, reason)

The schema and the canonical form are documented in ``docs/receipts.md``.
"""

from __future__ import annotations

from firstpass.receipts._canonical import (
    GENESIS_HASH,
    canonical_bytes,
    record_hash,
    sha256_text,
)
from firstpass.receipts._chain import VerifyReport, verify_chain
from firstpass.receipts._ids import new_receipt_id
from firstpass.receipts._read import find_receipt, iter_receipts
from firstpass.receipts._summary import CheckRate, ReceiptSummary, summarize
from firstpass.receipts._writer import FsyncPolicy, ReceiptWriter, WriterStats

__all__ = [
    "GENESIS_HASH",
    "CheckRate",
    "FsyncPolicy",
    "ReceiptSummary",
    "ReceiptWriter",
    "VerifyReport",
    "WriterStats",
    "canonical_bytes",
    "find_receipt",
    "iter_receipts",
    "new_receipt_id",
    "record_hash",
    "sha256_text",
    "summarize",
    "verify_chain",
]
