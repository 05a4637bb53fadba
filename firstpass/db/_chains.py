"""Reading the chains of ``firstpass_receipts``: which replicas there are, and one replica's
lines in ``seq`` order as a binary stream.

The stream is what a JSONL file of that chain would hold, byte for byte, so the table is
verified by the file verifier's own line loop (``verify_stream``) and exported by copying the
stream: one code path for both stores. Lines come from a server-side cursor a few thousand at
a time: a million rows cost a few hundred round trips, and neither side holds the chain in
memory.
"""

from __future__ import annotations

import io
import re
import shutil
from collections.abc import Generator, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import BinaryIO

import psycopg

from firstpass.config import REPLICA_RE, REPLICA_RULE
from firstpass.db._prefetch import Prefetch
from firstpass.errors import DatabaseError
from firstpass.receipts import GENESIS_HASH, VerifyReport
from firstpass.receipts._chain import verify_stream

__all__ = [
    "ReplicaChain",
    "TableReport",
    "check_replica_id",
    "check_table",
    "connect",
    "list_chains",
    "open_chain",
    "shown_id",
    "verify_replica",
]

#: rows fetched per round trip (~2.6 KB a shadow receipt: ~5 MB a chunk)
CHUNK_ROWS = 2000

_LIST = """
SELECT replica, count(*), min(seq), max(seq) FROM firstpass_receipts
{where} GROUP BY replica ORDER BY replica
"""
_HEAD = "SELECT hash FROM firstpass_receipts WHERE replica = %s AND seq = %s"
_LINES = """
SELECT seq, line FROM firstpass_receipts WHERE replica = %s AND seq <= %s ORDER BY seq
"""


def shown_id(replica: str) -> str:
    """``replica`` as printed: non-printable characters escaped, at most 80 characters (an id
    read from the table has passed no check)."""
    shown = ascii(replica)[1:-1]
    return shown if len(shown) <= 80 else shown[:77] + "..."


def check_replica_id(replica: str) -> str:
    """``replica`` when it can name a chain and its exported file (``<replica>.jsonl``); else
    ``DatabaseError`` saying why not. The config's rule (``REPLICA_RE``), so every id a
    replica can run under is one the commands accept and the other way round."""
    if not REPLICA_RE.fullmatch(replica):
        shown = replica[:60].encode("unicode_escape").decode()
        raise DatabaseError(
            f"replica id {shown!r} is not a replica id: {REPLICA_RULE} (it names a chain and, "
            "exported, a file)"
        )
    return replica


@dataclass(frozen=True, kw_only=True)
class ReplicaChain:
    """One replica's rows as listed: ``rows`` lines, seq ``first_seq``..``last_seq``, and the
    ``hash`` column of the last (unverified: the head a verification must arrive at)."""

    replica: str
    rows: int
    first_seq: int
    last_seq: int
    stored_head: str

    @property
    def seq_problem(self) -> str | None:
        """Why the seq numbers are not 1..rows (rows deleted where no link shows it: at the
        start, or the table's own numbering broken), or ``None``."""
        if self.first_seq == 1 and self.last_seq == self.rows:
            return None
        missing = self.last_seq - self.first_seq + 1 - self.rows
        return (
            f"seq runs {self.first_seq}..{self.last_seq} over {self.rows} rows, not 1..{self.rows}"
            f" ({self.first_seq - 1} row(s) missing before it, {missing} within it)"
        )


@dataclass(frozen=True, kw_only=True)
class TableReport:
    """One replica's chain checked from the table: the ``VerifyReport`` of its lines, and
    ``problem`` when the rows do not hold a chain even though its lines may verify: a row that
    is not exactly one line (empty, part of a line, several lines; always reported, first),
    or, when the lines verify, seq numbers that are not 1..rows, a count of lines that is not
    the count of rows, or a last row whose ``hash`` column is not the head. When ``problem`` is
    ``None``, line N is seq N. ``seq_note``: the seq numbers' problem when the lines do not
    verify either (their line numbers are then not seq numbers)."""

    chain: ReplicaChain
    report: VerifyReport
    problem: str | None = None
    seq_note: str | None = None

    @property
    def ok(self) -> bool:
        return self.report.ok and self.problem is None


def connect(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    """A read-consistent connection (one snapshot for every query of a command: rows appended
    meanwhile are not half seen). ``DatabaseError`` without the DSN when it cannot connect."""
    try:
        conn = psycopg.connect(dsn, connect_timeout=10)
    except psycopg.Error as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        text = re.sub(r"(://[^:/@\s\"]*:)[^@\s\"]*@", r"\1***@", text.replace(dsn, "<the DSN>"))
        raise DatabaseError(
            f"cannot connect to PostgreSQL: {text} (check the DSN's host, port, user and "
            "database, and that the server is running)"
        ) from None
    conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
    return conn


def list_chains(
    conn: psycopg.Connection[tuple[object, ...]], replicas: Sequence[str] = ()
) -> list[ReplicaChain]:
    """The replicas in the table (only ``replicas`` when given), by id. ``DatabaseError`` when
    the table is missing (run ``firstpass db migrate``)."""
    where = "WHERE replica = ANY(%s)" if replicas else ""
    params = (list(replicas),) if replicas else ()
    try:
        rows = conn.execute(_LIST.format(where=where).encode(), params).fetchall()
        chains = []
        for replica, count, first, last in rows:
            head = conn.execute(_HEAD, (replica, last)).fetchone()
            chains.append(
                ReplicaChain(
                    replica=str(replica),
                    rows=int(count),  # type: ignore[call-overload]
                    first_seq=int(first),  # type: ignore[call-overload]
                    last_seq=int(last),  # type: ignore[call-overload]
                    stored_head=str(head[0]) if head else GENESIS_HASH,
                )
            )
    except psycopg.errors.UndefinedTable:
        raise DatabaseError(
            "no firstpass_receipts table in this database: run `firstpass db migrate` first"
        ) from None
    except psycopg.Error as exc:
        raise DatabaseError(f"reading the receipt chains failed: {exc}") from exc
    return chains


def open_chain(
    conn: psycopg.Connection[tuple[object, ...]],
    chain: ReplicaChain,
    *,
    chunk_rows: int = CHUNK_ROWS,
    rows: _RowCheck | None = None,
) -> io.BufferedReader:
    """``chain``'s lines up to its listed ``last_seq``, in seq order, as a binary file: iterate
    it for lines, ``read`` it for bytes. Rows appended after the listing are not read.
    ``rows``: records the first row that is not exactly one line (``check_table``)."""
    chunks = _chunks(conn, chain, chunk_rows, rows)
    return io.BufferedReader(_ChunkReader(Prefetch(chunks)), 1 << 20)


def verify_replica(
    conn: psycopg.Connection[tuple[object, ...]], chain: ReplicaChain, *, strict: bool = False
) -> TableReport:
    """Verify one replica's chain from the table (``check_table`` without a copy)."""
    return check_table(conn, chain, strict=strict)


def check_table(
    conn: psycopg.Connection[tuple[object, ...]],
    chain: ReplicaChain,
    *,
    strict: bool = False,
    copy_to: BinaryIO | None = None,
) -> TableReport:
    """The one check of a replica's chain in the table, shared by ``receipts verify``,
    ``export`` and ``calibrate --dsn-env`` so that they accept the same tables: every row holds
    exactly one line, the lines verify with the file verifier's own loop from the genesis hash
    (as a log's first file does), their count is the row count, the seq numbers run 1..rows
    and the last row's ``hash`` column is the head. ``copy_to``: also write every row's bytes
    there, in seq order, whatever the verdict (an export)."""
    rows = _RowCheck()
    with open_chain(conn, chain, rows=rows) as fh:
        lines: Iterator[bytes] = _tee(fh, copy_to) if copy_to is not None else iter(fh)
        report = verify_stream(lines, strict=strict, name=f"replica {shown_id(chain.replica)}")
        for _ in lines:  # the rest: copied, and every row checked
            pass
    seq_problem = chain.seq_problem
    problem: str | None = None
    if rows.bad is not None:
        problem = _row_problem(*rows.bad)
    elif report.ok:
        if seq_problem is not None:
            problem = seq_problem
        elif report.n_lines != chain.rows:
            problem = f"{report.n_lines} lines verify in {chain.rows} rows"
        elif report.head != chain.stored_head:
            problem = (
                f"the hash column of seq {chain.last_seq} ({chain.stored_head}) is not the head"
            )
    note = seq_problem if not report.ok and problem is None else None
    return TableReport(chain=chain, report=report, problem=problem, seq_note=note)


def copy_rows(
    conn: psycopg.Connection[tuple[object, ...]], chain: ReplicaChain, out: BinaryIO
) -> str | None:
    """Copy ``chain``'s rows to ``out`` byte for byte, checking the rows only (one line each,
    seq 1..rows): ``check_table``'s problem for them, or ``None``. For a reader that verifies
    the copy's lines itself with the file verifier and then compares the head it reaches with
    ``chain.stored_head`` (``calibrate --dsn-env``): together, ``check_table``'s checks, with
    each line hashed once instead of twice."""
    rows = _RowCheck()
    with open_chain(conn, chain, rows=rows) as fh:
        shutil.copyfileobj(fh, out, 1 << 20)
    if rows.bad is not None:
        return _row_problem(*rows.bad)
    return chain.seq_problem


def _row_problem(seq: int, why: str) -> str:
    return (
        f"the row at seq {seq} {why}, not exactly one line: the rows do not hold the chain "
        "one line each"
    )


class _RowCheck:
    """The first row (seq, why) that is not exactly one line, found while streaming."""

    def __init__(self) -> None:
        self.bad: tuple[int, str] | None = None


def _one_line_problem(line: bytes) -> str | None:
    if not line:
        return "is empty"
    first = line.find(b"\n")
    if first < 0:
        return "does not end with a newline"
    if first != len(line) - 1:
        return "holds more than one line"
    return None


def _tee(fh: Iterable[bytes], out: BinaryIO) -> Iterator[bytes]:
    for line in fh:
        out.write(line)
        yield line


def _chunks(
    conn: psycopg.Connection[tuple[object, ...]],
    chain: ReplicaChain,
    chunk_rows: int,
    rows: _RowCheck | None,
) -> Generator[bytes, None, None]:
    """The lines, ``chunk_rows`` at a time, joined: a server-side cursor streams them in seq
    order without holding the chain in memory on either side. ``rows``: where the first row
    that is not exactly one line is recorded."""
    try:
        with conn.cursor(name="firstpass_chain", binary=True) as cur:
            cur.execute(_LINES, (chain.replica, chain.last_seq))
            while batch := cur.fetchmany(chunk_rows):
                lines = [_bytes(row[1]) for row in batch]
                joined = b"".join(lines)
                # fast path: each row ends with its newline and there are no others
                if (
                    rows is not None
                    and rows.bad is None
                    and not (
                        joined.count(b"\n") == len(lines)
                        and all(line.endswith(b"\n") for line in lines)
                    )
                ):
                    for row, line in zip(batch, lines, strict=True):
                        why = _one_line_problem(line)
                        if why is not None:
                            rows.bad = (int(row[0]), why)  # type: ignore[call-overload]
                            break
                yield joined
    except psycopg.Error as exc:
        raise DatabaseError(
            f"replica {shown_id(chain.replica)}: reading rows failed: {exc}"
        ) from exc


def _bytes(value: object) -> bytes:
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    raise DatabaseError(f"a line is {type(value).__name__}, not bytea")


class _ChunkReader(io.RawIOBase):
    """Raw binary reader over an iterator of byte chunks (``BufferedReader`` adds lines)."""

    def __init__(self, chunks: Prefetch) -> None:
        self._chunks = chunks
        self._view = memoryview(b"")

    def close(self) -> None:
        self._chunks.close()
        super().close()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._view:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._view = memoryview(chunk)
        n = min(len(buffer), len(self._view))
        buffer[:n] = self._view[:n]
        self._view = self._view[n:]
        return n
