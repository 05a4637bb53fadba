"""The public surface of ``firstpass.receipts`` is exactly its ``__all__``."""

from __future__ import annotations

import firstpass.receipts as receipts

PUBLIC = {
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
    # signed checkpoints
    "CHECKPOINT_KIND",
    "CheckpointSigner",
    "KeyFiles",
    "SignatureProblem",
    "SignatureReport",
    "key_id",
    "load_public_key",
    "load_signing_key",
    "verify_checkpoints",
    "write_key_files",
    # durable logs: gaps, rotation, chains across files (docs/receipts.md)
    "Checkpointer",
    "ChainFiles",
    "ChainReport",
    "FileReport",
    "Gap",
    "discover_chains",
    "find_by_answer",
    "is_special",
    "verify_files",
    # the licence monitor's revocation line (firstpass.monitor), and the lines' time format
    "REVOCATION_KIND",
    "FEEDBACK_KIND",
    "feedback_record",
    "is_receipt_id",
    "receipt_id_ms",
    "parse_time",
    "revocation_record",
    "utc_now",
    # what the server needs of a sink (the file writer, or firstpass.db's PostgreSQL one)
    "ReceiptLog",
    # the writer core both sinks are built from, and what a store implements for it
    "ReceiptBatch",
    "ReceiptStore",
    "StoreHead",
    "WriterCore",
    # the receipt as typed values (docs/receipts.md, "Schema"), and reading logs into them
    "SCHEMA_VERSION",
    "UNSET",
    "Action",
    "AuditRecord",
    "BudgetRecord",
    "CheckEntry",
    "CheckResultRecord",
    "Content",
    "Cost",
    "Counterfactual",
    "Dialect",
    "Decision",
    "DroppedCase",
    "ErrorBrief",
    "ErrorRecord",
    "FollowUp",
    "FollowUpKind",
    "FollowUpStop",
    "GivenRecord",
    "Mode",
    "ProbeRecord",
    "ProbeSample",
    "Purpose",
    "Receipt",
    "Regime",
    "RequestInfo",
    "RevisionAttempt",
    "RevisionLoop",
    "RevisionStop",
    "ScoreRecord",
    "ServedRecord",
    "Stage",
    "Timings",
    "UnsetType",
    "UpstreamCall",
    "Verdict",
    "Verification",
    "receipt_from_builtins",
    "LineTally",
    "iter_lines",
    "read_lines",
    "valid_strings",
    "valid_text",
}


def test_all_lists_exactly_the_public_names():
    """``__all__`` is the documented public API, and every name in it is importable."""
    assert set(receipts.__all__) == PUBLIC
    for name in receipts.__all__:
        assert getattr(receipts, name) is not None


def test_no_other_public_names_leak_from_the_package():
    """Module attributes without a leading underscore are the public API (plus submodules)."""
    leaked = {
        name
        for name in vars(receipts)
        if not name.startswith("_") and name not in PUBLIC and name != "annotations"
    }
    assert leaked == set()
