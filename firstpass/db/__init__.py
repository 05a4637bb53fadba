"""PostgreSQL for several replicas: the connection (a DSN read from a named environment
variable, never from a file) and the versioned schema (``firstpass db migrate``).

    dsn = dsn_from_env("FIRSTPASS_DSN")          # DatabaseError naming the variable if unset
    applied = await migrate(dsn)                  # idempotent; safe from many replicas at once

The driver is psycopg 3: one library for the server's async path and the CLI's sync one, with
COPY, pipeline mode and binary wheels.
"""

from __future__ import annotations

from firstpass.db._chains import (
    ReplicaChain,
    check_replica_id,
    connect,
    copy_rows,
    list_chains,
    shown_id,
    verify_replica,
)
from firstpass.db._connect import dsn_from_env
from firstpass.db._licences import PostgresLicenceStore
from firstpass.db._migrate import MIGRATIONS, Migration, current_version, migrate
from firstpass.db._receipt_writer import ChainForked, PostgresReceiptWriter
from firstpass.db._spend import SharedHold, SharedLedger, shared_ledger_for
from firstpass.db._transfer import (
    ImportPlan,
    ImportRefused,
    export_chain,
    import_chain,
    make_out_dir,
    plan_import,
)

__all__ = [
    "MIGRATIONS",
    "ChainForked",
    "ImportPlan",
    "ImportRefused",
    "Migration",
    "PostgresLicenceStore",
    "PostgresReceiptWriter",
    "ReplicaChain",
    "SharedHold",
    "SharedLedger",
    "check_replica_id",
    "connect",
    "copy_rows",
    "current_version",
    "dsn_from_env",
    "export_chain",
    "import_chain",
    "list_chains",
    "make_out_dir",
    "migrate",
    "plan_import",
    "shared_ledger_for",
    "shown_id",
    "verify_replica",
]
