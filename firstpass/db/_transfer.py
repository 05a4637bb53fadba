"""Moving chains between the table and JSONL files: ``export`` copies a replica's lines into
``<replica>.jsonl`` byte for byte (so the file verifier checks it), ``import`` appends a
verified file chain to a replica's rows.

Import refuses what would make the table's chain break: a file chain that does not verify, or
one that does not continue the replica's rows exactly (from the row its first line links to, or
from the genesis hash, its lines up to the replica's head must be those rows). Re-importing a
file chain already imported (whole, or a later fragment) is a no-op, and a file that grew since
is appended from where the table ends. It also refuses a chain already in the table under
another replica id, and appending to an id a live process holds (``_claim.holder``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from firstpass.db._chains import (
    ReplicaChain,
    TableReport,
    check_replica_id,
    check_table,
    list_chains,
    shown_id,
)
from firstpass.db._claim import holder
from firstpass.db._rows import INSERT_ROWS, ReceiptRow, insert_params, receipt_row
from firstpass.errors import DatabaseError, ReceiptError
from firstpass.receipts import GENESIS_HASH, VerifyReport, verify_chain

__all__ = [
    "ImportPlan",
    "ImportRefused",
    "export_chain",
    "import_chain",
    "make_out_dir",
    "plan_import",
]


class ImportRefused(DatabaseError):
    """The file chain cannot be imported as asked (it is broken, or does not continue the
    replica's rows): nothing was written."""


#: rows per INSERT round trip
INSERT_BATCH = 2000


def export_chain(
    conn: psycopg.Connection[tuple[object, ...]],
    chain: ReplicaChain,
    out_dir: Path,
    *,
    strict: bool = False,
) -> tuple[Path, TableReport]:
    """Write ``chain``'s lines to ``out_dir/<replica>.jsonl`` (mode 0600), byte for byte, while
    ``check_table`` checks them (the check ``receipts verify`` makes): the file and that
    check's verdict. Refuses to overwrite a file; a failed export leaves no partial file."""
    path = out_dir / f"{check_replica_id(chain.replica)}.jsonl"
    make_out_dir(out_dir)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise DatabaseError(f"{path} exists: refusing to overwrite it") from None
    except OSError as exc:
        raise DatabaseError(f"cannot create {path}: {exc.strerror or exc}") from exc
    try:
        with os.fdopen(fd, "wb") as out:
            report = check_table(conn, chain, strict=strict, copy_to=out)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path, report


def make_out_dir(out_dir: Path) -> None:
    """Create ``out_dir`` (mode 0700) unless it is a directory; ``DatabaseError`` saying why
    when it cannot be one (a file, under a file, not creatable)."""
    try:
        out_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    except FileExistsError:
        raise DatabaseError(f"{out_dir} exists and is not a directory") from None
    except OSError as exc:
        raise DatabaseError(
            f"cannot create the directory {out_dir}: {exc.strerror or exc}"
        ) from None


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
    when it cannot be imported (broken, not a continuation of the replica's chain, already in
    the table under another replica, or the replica held by a live process)."""
    check_replica_id(replica)
    listed = list_chains(conn, [replica])
    current = listed[0] if listed else None
    head = current.stored_head if current is not None else GENESIS_HASH
    if current is not None and current.seq_problem is not None:
        raise ImportRefused(f"replica {replica}: {current.seq_problem}; not appending to it")
    if files:
        _refuse_if_elsewhere(conn, replica, files[0])
    first_prev = _first_field(files[0], "prev_hash") if files else None
    # the seq whose line the file chain's first line links to: 0 for the genesis hash
    anchor = 0
    if current is not None and first_prev is not None and first_prev != GENESIS_HASH:
        if first_prev == head:
            anchor = current.rows
        else:
            found = _seq_of(conn, replica, first_prev)
            anchor = found if found is not None else 0
    prev = first_prev if anchor and first_prev is not None else GENESIS_HASH
    overlap = current.rows - anchor if current is not None else 0  # lines already in the table
    reports: list[VerifyReport] = []
    found_at: set[int] = set()
    total = 0
    for path in files:
        report = verify_chain(path, prev=prev, find=(head,) if overlap else ())
        reports.append(report)
        if not report.ok:
            raise ImportRefused(
                f"{path}: line {report.first_bad_line}: {report.reason}; refusing to import a "
                "chain that does not verify"
            )
        found_at.update(total + line for line, _ in report.found)
        total += report.n_lines
        if report.n_lines:
            prev = report.head
    skip = 0
    if overlap:
        if total <= overlap:  # all in the table already, if its line at anchor + total is ours
            same = total == 0 or _hash_at(conn, replica, anchor + total) == prev
        else:  # the table's head must be the file chain's line `overlap`
            same = overlap in found_at
        if not same:
            assert current is not None
            raise ImportRefused(
                f"replica {replica} already has {current.rows} rows (head {head}) and this file "
                "chain does not continue them: import it under another --replica"
            )
        skip = min(total, overlap)
    plan = ImportPlan(
        replica=replica,
        files=tuple(files),
        reports=tuple(reports),
        existing=current.rows if current is not None else 0,
        skip=skip,
        total=total,
    )
    if plan.n_new:
        _refuse_if_held(conn, replica)
    return plan


def _seq_of(conn: psycopg.Connection[tuple[object, ...]], replica: str, hash_: str) -> int | None:
    row = conn.execute(
        "SELECT seq FROM firstpass_receipts WHERE replica = %s AND hash = %s", (replica, hash_)
    ).fetchone()
    return int(row[0]) if row is not None else None  # type: ignore[call-overload]


def _hash_at(conn: psycopg.Connection[tuple[object, ...]], replica: str, seq: int) -> str | None:
    row = conn.execute(
        "SELECT hash FROM firstpass_receipts WHERE replica = %s AND seq = %s", (replica, seq)
    ).fetchone()
    return str(row[0]) if row is not None else None


#: the replicas other than %(replica)s holding a line whose hash is %(hash)s: one index probe
#: per replica (the replicas found by a loose scan of the primary key), no scan of the rows
_ELSEWHERE = """
WITH RECURSIVE ids(replica) AS (
    (SELECT replica FROM firstpass_receipts ORDER BY replica LIMIT 1)
    UNION ALL
    SELECT (SELECT f.replica FROM firstpass_receipts f WHERE f.replica > ids.replica
            ORDER BY f.replica LIMIT 1)
    FROM ids WHERE ids.replica IS NOT NULL
)
SELECT ids.replica, r.seq FROM ids
JOIN firstpass_receipts r ON r.replica = ids.replica AND r.hash = %(hash)s
WHERE ids.replica IS NOT NULL AND ids.replica <> %(replica)s
ORDER BY ids.replica LIMIT 1
"""


def _refuse_if_elsewhere(
    conn: psycopg.Connection[tuple[object, ...]], replica: str, first: Path
) -> None:
    """``ImportRefused`` when the file chain's first line is already another replica's (the
    same chain under two ids would be counted twice by ``calibrate``)."""
    hash_ = _first_field(first, "hash")
    if hash_ is None:
        return
    row = conn.execute(_ELSEWHERE, {"hash": hash_, "replica": replica}).fetchone()
    if row is not None:
        raise ImportRefused(
            f"the first line of {first} ({hash_}) is already seq {row[1]} of replica "
            f"{shown_id(str(row[0]))}: this chain is in the table under that id, and importing it "
            f"again as {replica} would count its receipts twice"
        )


def _refuse_if_held(conn: psycopg.Connection[tuple[object, ...]], replica: str) -> None:
    """``ImportRefused`` when a live process (a ``firstpass serve``) holds ``replica``: its
    writer appends to the same chain and would stop at the rows this import added."""
    who = holder(conn, replica)
    if who is not None:
        raise ImportRefused(
            f"replica {replica} is held by a running process ({who}), which writes to its "
            "chain: stop that replica first, or import under another --replica"
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


def _first_field(path: Path, field: str) -> str | None:
    """The first line's ``field`` (``prev_hash``, ``hash``) as written (a quick look;
    verification decides)."""
    try:
        with open(path, "rb") as fh:
            record = json.loads(fh.readline() or b"null")
    except (OSError, ValueError, RecursionError):
        return None
    value = record.get(field) if isinstance(record, dict) else None
    return value if isinstance(value, str) else None
