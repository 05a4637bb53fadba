"""Moving chains between the table and JSONL files: ``export`` copies a replica's lines into
``<replica>.jsonl`` byte for byte (so the file verifier checks it), ``import`` appends a
verified file chain to a replica's rows.

Import refuses what would make the table's chain break: a file chain that does not verify, or
one that does not continue the replica's rows exactly (its lines up to the replica's head must
be those rows, or its first line must link to that head). Re-importing a file already imported
is a no-op, and a file that grew since is appended from where the table ends.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from firstpass.db._chains import ReplicaChain, check_replica_id, list_chains, open_chain
from firstpass.db._rows import INSERT_ROWS, ReceiptRow, insert_params, receipt_row
from firstpass.errors import DatabaseError, ReceiptError
from firstpass.receipts import GENESIS_HASH, VerifyReport, verify_chain

__all__ = ["ImportPlan", "ImportRefused", "export_chain", "import_chain", "plan_import"]


class ImportRefused(DatabaseError):
    """The file chain cannot be imported as asked (it is broken, or does not continue the
    replica's rows): nothing was written."""


#: rows per INSERT round trip
INSERT_BATCH = 2000


def export_chain(
    conn: psycopg.Connection[tuple[object, ...]], chain: ReplicaChain, out_dir: Path
) -> Path:
    """Write ``chain``'s lines to ``out_dir/<replica>.jsonl`` (mode 0600), byte for byte.
    Refuses to overwrite a file; a failed export leaves no partial file behind."""
    out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    path = out_dir / f"{check_replica_id(chain.replica)}.jsonl"
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise DatabaseError(f"{path} exists: refusing to overwrite it") from None
    except OSError as exc:
        raise DatabaseError(f"cannot create {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as out, open_chain(conn, chain) as src:
            while block := src.read(1 << 20):
                out.write(block)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


@dataclass(frozen=True, kw_only=True)
class ImportPlan:
    """What importing a verified file chain into ``replica`` does: append its lines after line
    ``skip`` (those are the replica's rows already) from seq ``existing + 1``. ``reports``: each
    file's verification, in chain order."""

    replica: str
    files: tuple[Path, ...]
    reports: tuple[VerifyReport, ...]
    existing: int  # the replica's rows before the import
    skip: int  # lines of the file chain already in the table
    total: int  # lines of the file chain

    @property
    def n_new(self) -> int:
        return self.total - self.skip


def plan_import(
    conn: psycopg.Connection[tuple[object, ...]], replica: str, files: Sequence[Path]
) -> ImportPlan:
    """Verify the file chain and match it to the replica's rows; ``ImportRefused`` saying why
    when it cannot be imported (broken, or not a continuation of the replica's chain)."""
    check_replica_id(replica)
    listed = list_chains(conn, [replica])
    current = listed[0] if listed else None
    head = current.stored_head if current is not None else GENESIS_HASH
    if current is not None and current.seq_problem is not None:
        raise ImportRefused(f"replica {replica}: {current.seq_problem}; not appending to it")
    first_prev = _first_prev(files[0]) if files else None
    continues = current is not None and first_prev == head and head != GENESIS_HASH
    prev = head if continues else GENESIS_HASH
    reports: list[VerifyReport] = []
    found_at: int | None = None
    total = 0
    for path in files:
        report = verify_chain(path, prev=prev, find=(head,) if current is not None else ())
        reports.append(report)
        if not report.ok:
            raise ImportRefused(
                f"{path}: line {report.first_bad_line}: {report.reason}; refusing to import a "
                "chain that does not verify"
            )
        for line, _ in report.found:
            found_at = total + line
        total += report.n_lines
        if report.n_lines:
            prev = report.head
    skip = 0
    if current is not None and not continues:
        if found_at != current.rows:
            raise ImportRefused(
                f"replica {replica} already has {current.rows} rows (head {head}) and this file "
                "chain does not continue them: import it under another --replica"
            )
        skip = current.rows
    return ImportPlan(
        replica=replica,
        files=tuple(files),
        reports=tuple(reports),
        existing=current.rows if current is not None else 0,
        skip=skip,
        total=total,
    )


def import_chain(conn: psycopg.Connection[tuple[object, ...]], plan: ImportPlan) -> int:
    """Append the plan's new lines in one transaction (all or none); the rows inserted.
    ``DatabaseError`` when another writer appended to the replica meanwhile."""
    inserted = 0
    seq = plan.existing
    try:
        with conn.transaction(), conn.cursor() as cur:
            batch: list[ReceiptRow] = []
            for line in _lines(plan.files, plan.skip):
                seq += 1
                batch.append(receipt_row(plan.replica, seq, line))
                if len(batch) >= INSERT_BATCH:
                    inserted += _insert(cur, plan.replica, batch)
                    batch = []
            if batch:
                inserted += _insert(cur, plan.replica, batch)
    except psycopg.Error as exc:
        raise DatabaseError(
            f"import into replica {plan.replica} failed, nothing was written: {exc}"
        ) from exc
    return inserted


def _insert(cur: psycopg.Cursor[tuple[object, ...]], replica: str, rows: list[ReceiptRow]) -> int:
    cur.execute(INSERT_ROWS, insert_params(replica, rows))
    if cur.rowcount != len(rows):
        raise DatabaseError(
            f"replica {replica}: rows from seq {rows[0].seq} exist already (another writer "
            "appended meanwhile); nothing was written"
        )
    return len(rows)


def _lines(files: Sequence[Path], skip: int) -> Iterator[bytes]:
    n = 0
    for path in files:
        try:
            with open(path, "rb", buffering=1 << 20) as fh:
                for line in fh:
                    n += 1
                    if n > skip:
                        yield line
        except OSError as exc:
            raise ReceiptError(f"{path}: cannot read the receipt log: {exc}") from exc


def _first_prev(path: Path) -> str | None:
    """The first line's ``prev_hash`` as written (a quick look; verification decides)."""
    try:
        with open(path, "rb") as fh:
            record = json.loads(fh.readline() or b"null")
    except (OSError, ValueError, RecursionError):
        return None
    value = record.get("prev_hash") if isinstance(record, dict) else None
    return value if isinstance(value, str) else None
