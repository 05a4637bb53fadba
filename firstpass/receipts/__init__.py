"""Receipts: one hash-chained JSONL line per request, written off the request path.

    writer = ReceiptWriter(path, fsync="batch", queue_size=10_000)   # "durable": write() waits
    await writer.start(); await writer.write(record); await writer.close()
    report = verify_chain(path)   # VerifyReport(ok, n_lines, head, first_bad_line, reason, gaps)
    for chain in discover_chains(path_or_directory): verify_files(chain)   # rotated files too

The schema and the canonical form are documented in ``docs/receipts.md``.
"""

from __future__ import annotations

from firstpass.receipts._batch import ReceiptBatch
from firstpass.receipts._canonical import (
    GENESIS_HASH,
    canonical_bytes,
    record_hash,
    sha256_text,
    valid_strings,
    valid_text,
)
from firstpass.receipts._chain import Gap, VerifyReport, verify_chain
from firstpass.receipts._core import WriterCore
from firstpass.receipts._discover import (
    ChainFiles,
    ChainReport,
    FileReport,
    discover_chains,
    verify_files,
)
from firstpass.receipts._ids import new_receipt_id
from firstpass.receipts._log import ReceiptLog
from firstpass.receipts._read import find_by_answer, find_receipt, iter_lines, iter_receipts
from firstpass.receipts._schema import (
    SCHEMA_VERSION,
    UNSET,
    Action,
    AuditRecord,
    BudgetRecord,
    CheckEntry,
    CheckResultRecord,
    Content,
    Cost,
    Counterfactual,
    Decision,
    DroppedCase,
    ErrorBrief,
    ErrorRecord,
    GivenRecord,
    Mode,
    ProbeRecord,
    ProbeSample,
    Purpose,
    Receipt,
    Regime,
    RequestInfo,
    RevisionAttempt,
    RevisionLoop,
    RevisionStop,
    ScoreRecord,
    ServedRecord,
    Stage,
    Timings,
    UnsetType,
    UpstreamCall,
    Verdict,
    Verification,
    receipt_from_builtins,
)
from firstpass.receipts._signing import (
    CHECKPOINT_KIND,
    CheckpointSigner,
    KeyFiles,
    SignatureProblem,
    SignatureReport,
    key_id,
    load_public_key,
    load_signing_key,
    verify_checkpoints,
    write_key_files,
)
from firstpass.receipts._special import is_special
from firstpass.receipts._store import ReceiptStore, StoreHead
from firstpass.receipts._summary import (
    CheckRate,
    LineTally,
    ReceiptSummary,
    read_lines,
    summarize,
)
from firstpass.receipts._writer import Checkpointer, FsyncPolicy, ReceiptWriter, WriterStats

__all__ = [
    "CHECKPOINT_KIND",
    "GENESIS_HASH",
    "SCHEMA_VERSION",
    "UNSET",
    "Action",
    "AuditRecord",
    "BudgetRecord",
    "ChainFiles",
    "ChainReport",
    "CheckEntry",
    "CheckRate",
    "CheckResultRecord",
    "CheckpointSigner",
    "Checkpointer",
    "Content",
    "Cost",
    "Counterfactual",
    "Decision",
    "DroppedCase",
    "ErrorBrief",
    "ErrorRecord",
    "FileReport",
    "FsyncPolicy",
    "Gap",
    "GivenRecord",
    "KeyFiles",
    "LineTally",
    "Mode",
    "ProbeRecord",
    "ProbeSample",
    "Purpose",
    "Receipt",
    "ReceiptBatch",
    "ReceiptLog",
    "ReceiptStore",
    "ReceiptSummary",
    "ReceiptWriter",
    "Regime",
    "RequestInfo",
    "RevisionAttempt",
    "RevisionLoop",
    "RevisionStop",
    "ScoreRecord",
    "ServedRecord",
    "SignatureProblem",
    "SignatureReport",
    "Stage",
    "StoreHead",
    "Timings",
    "UnsetType",
    "UpstreamCall",
    "Verdict",
    "Verification",
    "VerifyReport",
    "WriterCore",
    "WriterStats",
    "canonical_bytes",
    "discover_chains",
    "find_by_answer",
    "find_receipt",
    "is_special",
    "iter_lines",
    "iter_receipts",
    "key_id",
    "load_public_key",
    "load_signing_key",
    "new_receipt_id",
    "read_lines",
    "receipt_from_builtins",
    "record_hash",
    "sha256_text",
    "summarize",
    "valid_strings",
    "valid_text",
    "verify_chain",
    "verify_checkpoints",
    "verify_files",
    "write_key_files",
]
