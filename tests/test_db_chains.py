"""Receipt chains in PostgreSQL, through the CLI as users run it: ``receipts verify --dsn-env``
checks every replica's chain with the file verifier's loop and names what was tampered with,
``export`` writes files the file verifier accepts, ``import`` takes only verified chains that
continue a replica's rows, and ``calibrate --dsn-env`` gives the certificate the files give."""

from __future__ import annotations

import asyncio
import json
import stat
from pathlib import Path
from typing import Any

import psycopg
import pytest

from benchmarks.calibration_bench import shadow_receipt
from firstpass import cli
from firstpass.db import migrate
from firstpass.receipts import GENESIS_HASH, write_key_files
from firstpass.receipts._canonical import encode_record
from firstpass.receipts._chain import link

#: e2e: every test uses a real PostgreSQL (tests/pg_server.py)
pytestmark = pytest.mark.e2e

ENV = "FP_TEST_CHAINS_DSN"


@pytest.fixture
def dsn(pg_database: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """A migrated database whose DSN is in ``ENV``, as a user would export it."""
    asyncio.run(migrate(pg_database))
    monkeypatch.setenv(ENV, pg_database)
    return pg_database


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    """``firstpass ARGV``: its exit code and what it printed (stdout then stderr)."""
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out + out.err


def write_log(path: Path, n: int, *, seed: int = 0, route: str = "code") -> Path:
    """``n`` chained shadow receipts (a mix of pass counts and labels, one a minute), written
    with the writer's own encoding and linking."""
    prev = GENESIS_HASH
    with path.open("wb") as fh:
        for i in range(n):
            c, label = (i * 7 + seed) % 6, (i * 11 + seed) % 10 < 8 or (i * 7 + seed) % 6 == 5
            record: dict[str, Any] = shadow_receipt(c, label)
            record["id"] = f"rcpt_{seed:06d}{i:020d}"
            record["route"] = route
            record["time"] = f"2026-11-30T{i // 60 % 24:02d}:{i % 60:02d}:00.000Z"
            line, prev = link(encode_record(record), prev)
            fh.write(line)
    return path


def imported(capsys: pytest.CaptureFixture[str], tmp_path: Path, sizes: dict[str, int]) -> None:
    for seed, (replica, n) in enumerate(sizes.items()):
        log = write_log(tmp_path / f"{replica}.jsonl", n, seed=seed)
        code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, str(log))
        assert code == 0, out
        assert f"replica {replica}: imported {n} lines (seq 1..{n})" in out


SIZES = {"r1": 40, "r2": 25, "r3": 7}


def test_verify_checks_every_replica_and_one_on_request(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    imported(capsys, tmp_path, SIZES)
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV)
    assert code == 0, out
    for replica, n in SIZES.items():
        assert f"replica {replica}: ok: {n} receipts, head sha256:" in out
    assert "3 replica chain(s): all ok" in out
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV, "--replica", "r2")
    assert code == 0 and "replica r2: ok: 25 receipts" in out and "r1" not in out
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV, "--replica", "nope")
    assert code == 1 and "no rows for replica(s) nope" in out


def _line(conn: psycopg.Connection[Any], replica: str, seq: int) -> bytes:
    row = conn.execute(
        "SELECT line FROM firstpass_receipts WHERE replica = %s AND seq = %s", (replica, seq)
    ).fetchone()
    assert row is not None
    return bytes(row[0])


def _set_line(conn: psycopg.Connection[Any], replica: str, seq: int, line: bytes) -> None:
    conn.execute(
        "UPDATE firstpass_receipts SET line = %s WHERE replica = %s AND seq = %s",
        (line, replica, seq),
    )


def _edit(conn: psycopg.Connection[Any]) -> None:
    line = _line(conn, "r2", 5)
    _set_line(conn, "r2", 5, line.replace(b'"route":"code"', b'"route":"hack"'))


def _delete(conn: psycopg.Connection[Any]) -> None:
    conn.execute("DELETE FROM firstpass_receipts WHERE replica = 'r2' AND seq = 5")


def _reorder(conn: psycopg.Connection[Any]) -> None:
    fifth, sixth = _line(conn, "r2", 5), _line(conn, "r2", 6)
    _set_line(conn, "r2", 5, sixth)
    _set_line(conn, "r2", 6, fifth)


@pytest.mark.parametrize(
    ("tamper", "why"),
    [
        (_edit, "hash mismatch"),
        (_delete, "broken link"),
        (_reorder, "broken link"),
    ],
)
def test_a_tampered_table_is_caught_naming_the_replica_and_line(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: Any, why: str
) -> None:
    imported(capsys, tmp_path, SIZES)
    with psycopg.connect(dsn) as conn:
        tamper(conn)
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV)
    assert code == 1, out
    assert f"replica r2: line 5: {why}" in out
    assert "the 4 receipts before it verify" in out
    assert "replica r1: ok: 40 receipts" in out and "replica r3: ok: 7 receipts" in out
    assert "NOT all ok" in out


def test_rows_missing_at_the_start_are_caught(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Deleting the first rows leaves no link to break but the genesis one."""
    imported(capsys, tmp_path, {"r1": 10})
    with psycopg.connect(dsn) as conn:
        conn.execute("DELETE FROM firstpass_receipts WHERE seq <= 2")
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV)
    assert code == 1 and "replica r1: line 1: broken link" in out and "genesis" in out


def test_export_writes_files_the_file_verifier_accepts_byte_for_byte(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    imported(capsys, tmp_path, SIZES)
    out_dir = tmp_path / "export"
    code, out = run(capsys, "receipts", "export", "--dsn-env", ENV, "--out", str(out_dir))
    assert code == 0, out
    for replica, n in SIZES.items():
        exported = out_dir / f"{replica}.jsonl"
        assert f"replica {replica}: {n} lines to {exported}, verified" in out
        assert exported.read_bytes() == (tmp_path / f"{replica}.jsonl").read_bytes()
        assert stat.S_IMODE(exported.stat().st_mode) == 0o600
        code, out_v = run(capsys, "receipts", "verify", str(exported))
        assert code == 0 and f"ok: {n} receipts" in out_v
    code, out = run(capsys, "receipts", "export", "--dsn-env", ENV, "--out", str(out_dir))
    assert code == 1 and "refusing to overwrite" in out
    one = tmp_path / "one"
    code, out = run(
        capsys, "receipts", "export", "--dsn-env", ENV, "--out", str(one), "--replica", "r3"
    )
    assert code == 0 and [p.name for p in one.iterdir()] == ["r3.jsonl"]


def test_import_refuses_a_broken_file_and_writes_nothing(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(tmp_path / "r1.jsonl", 12)
    lines = log.read_bytes().splitlines(keepends=True)
    lines[3] = lines[3].replace(b'"route":"code"', b'"route":"hack"')
    log.write_bytes(b"".join(lines))
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, str(log))
    assert code == 1, out
    assert "replica r1: refused:" in out and "line 4: hash mismatch" in out
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM firstpass_receipts").fetchone() == (0,)


def test_import_is_idempotent_appends_a_grown_file_and_refuses_another_chain(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = write_log(tmp_path / "full.jsonl", 30)
    part = tmp_path / "part.jsonl"
    part.write_bytes(b"".join(full.read_bytes().splitlines(keepends=True)[:18]))
    args = ("receipts", "import", "--dsn-env", ENV, "--replica", "a")
    code, out = run(capsys, *args, str(part))
    assert code == 0 and "imported 18 lines (seq 1..18)" in out
    code, out = run(capsys, *args, str(part))
    assert code == 0 and "already holds these 18 lines" in out and "nothing to do" in out
    code, out = run(capsys, *args, str(full))
    assert code == 0 and "imported 12 lines (seq 19..30)" in out
    other = write_log(tmp_path / "other.jsonl", 30, seed=3)
    code, out = run(capsys, *args, str(other))
    assert code == 1 and "does not continue them" in out
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV)
    assert code == 0 and "replica a: ok: 30 receipts" in out
    export = tmp_path / "out"
    assert run(capsys, "receipts", "export", "--dsn-env", ENV, "--out", str(export))[0] == 0
    assert (export / "a.jsonl").read_bytes() == full.read_bytes()


def test_import_appends_a_file_whose_first_line_links_to_the_replicas_head(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A later rotated file on its own continues the replica (and only that replica)."""
    full = write_log(tmp_path / "full.jsonl", 30)
    lines = full.read_bytes().splitlines(keepends=True)
    first, rest = tmp_path / "first.jsonl", tmp_path / "rest.jsonl"
    first.write_bytes(b"".join(lines[:18]))
    rest.write_bytes(b"".join(lines[18:]))
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, str(rest))
    assert code == 1 and "line 1: broken link" in out and "genesis" in out
    args = ("receipts", "import", "--dsn-env", ENV, "--replica", "a")
    assert run(capsys, *args, str(first))[0] == 0
    code, out = run(capsys, *args, str(rest))
    assert code == 0 and "imported 12 lines (seq 19..30)" in out
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV, "--replica", "a")
    assert code == 0 and "replica a: ok: 30 receipts" in out


@pytest.mark.parametrize("replica", ["", "../etc", "a/b", "x\ny", "z" * 201, ".."])
def test_a_replica_id_that_cannot_be_a_file_name_is_refused(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], replica: str
) -> None:
    log = write_log(tmp_path / "r.jsonl", 3)
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, "--replica", replica, str(log))
    assert code == 2 and "replica id" in out


def test_calibrating_from_the_table_gives_the_certificate_the_exported_files_give(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    imported(capsys, tmp_path, {"r1": 900, "r2": 700})
    export = tmp_path / "export"
    assert run(capsys, "receipts", "export", "--dsn-env", ENV, "--out", str(export))[0] == 0
    from_table, from_files = tmp_path / "table.json", tmp_path / "files.json"
    code, out = run(capsys, "calibrate", "--dsn-env", ENV, "--out", str(from_table))
    assert code == 0, out
    files = [str(export / "r1.jsonl"), str(export / "r2.jsonl")]
    code, out = run(capsys, "calibrate", "--receipts", *files, "--out", str(from_files))
    assert code == 0, out
    table_doc = json.loads(from_table.read_text(encoding="utf-8"))
    files_doc = json.loads(from_files.read_text(encoding="utf-8"))
    source = table_doc.pop("source")
    assert source["replicas"] == ["r1", "r2"]
    assert source["paths"] == ["firstpass_receipts:r1", "firstpass_receipts:r2"]
    assert source["chain_heads"] == files_doc["source"]["chain_heads"]
    assert source["used"] == files_doc["source"]["used"] == 1600
    files_doc.pop("source")
    table_doc.pop("id"), files_doc.pop("id")
    for doc in (table_doc, files_doc):  # when it was made, not what it says
        doc.pop("created_at", None)
        doc.pop("looks")  # each is look 1 of its own ledger (beside its own --out)
        doc.pop("ledger")
        for cert in doc["certificates"]:
            cert.pop("looks")
    assert table_doc == files_doc
    assert table_doc["lambda"] is not None


def test_calibrating_one_replica_a_route_and_a_time_window(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The filters keep verified rows only; the rest are counted as skipped, by reason."""
    imported(capsys, tmp_path, {"r1": 900, "r2": 700})
    out = tmp_path / "cal.json"
    code, text = run(
        capsys,
        "calibrate",
        "--dsn-env",
        ENV,
        "--replica",
        "r1",
        "--route",
        "code",
        "--since",
        "2026-11-30T02:00:00Z",
        "--until",
        "2026-11-30T12:00",
        "--out",
        str(out),
    )
    assert code == 0, text
    source = json.loads(out.read_text(encoding="utf-8"))["source"]
    assert source["replicas"] == ["r1"]
    assert source["used"] == 600  # minutes 120..719 of the 900
    assert source["skipped"] == {"outside the time window (--since/--until)": 300}
    code, text = run(capsys, "calibrate", "--dsn-env", ENV, "--route", "nope", "--out", str(out))
    assert code == 2 and "no labelled shadow receipts" in text
    code, text = run(capsys, "calibrate", "--dsn-env", ENV, "--replica", "r9")
    assert code == 2 and "no rows for replica(s) r9" in text


def test_a_tampered_table_is_refused_by_calibrate_naming_the_chain(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    imported(capsys, tmp_path, {"r1": 300})
    with psycopg.connect(dsn) as conn:
        line = _line(conn, "r1", 9)  # a label flipped: the calibration's own input
        flipped = line.replace(b'"gate_label":true', b'"gate_label":false')
        if flipped == line:
            flipped = line.replace(b'"gate_label":false', b'"gate_label":true')
        _set_line(conn, "r1", 9, flipped)
    code, text = run(capsys, "calibrate", "--dsn-env", ENV)
    assert code == 2
    assert "firstpass_receipts:r1: hash chain does not verify at line 9" in text


def test_verify_with_pubkey_checks_each_replicas_signed_checkpoints(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.test_receipts_signing import write_signed

    key = write_key_files(tmp_path / "keys" / "signing.key")
    log = tmp_path / "signed.jsonl"
    write_signed(log, key, [3, 2])
    assert run(capsys, "receipts", "import", "--dsn-env", ENV, str(log))[0] == 0
    args = ("receipts", "verify", "--dsn-env", ENV, "--pubkey", str(key.public))
    code, out = run(capsys, *args)
    assert code == 0, out
    assert "replica signed: ok: 5 receipts, 2 checkpoint(s), head" in out
    assert f"signatures ok: 2 checkpoint(s) verify with {key.key_id}" in out
    other = write_key_files(tmp_path / "other" / "signing.key")
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV, "--pubkey", str(other.public))
    assert code == 1 and "signatures FAIL" in out


def _renumber_from(conn: psycopg.Connection[Any], replica: str, seq: int, by: int) -> None:
    """Shift the rows from ``seq`` on by ``by`` (through a far range: the key is unique)."""
    conn.execute(
        "UPDATE firstpass_receipts SET seq = seq + 1000000 WHERE replica = %s AND seq >= %s",
        (replica, seq),
    )
    conn.execute(
        "UPDATE firstpass_receipts SET seq = seq - 1000000 + %s WHERE replica = %s"
        " AND seq >= 1000000",
        (by, replica),
    )


def _empty_row(conn: psycopg.Connection[Any]) -> None:
    _renumber_from(conn, "r1", 10, 1)
    conn.execute(
        "INSERT INTO firstpass_receipts (replica, seq, hash, prev_hash, line)"
        " VALUES ('r1', 10, 'junk', 'junk', '')"
    )


def _split_row(conn: psycopg.Connection[Any]) -> None:
    line = _line(conn, "r1", 7)
    _renumber_from(conn, "r1", 8, 1)
    _set_line(conn, "r1", 7, line[:100])
    conn.execute(
        "INSERT INTO firstpass_receipts (replica, seq, hash, prev_hash, line)"
        " VALUES ('r1', 8, 'x', 'x', %s)",
        (line[100:],),
    )


def _merged_rows(conn: psycopg.Connection[Any]) -> None:
    _set_line(conn, "r1", 20, _line(conn, "r1", 20) + _line(conn, "r1", 21))
    conn.execute("DELETE FROM firstpass_receipts WHERE replica = 'r1' AND seq = 21")
    _renumber_from(conn, "r1", 22, -1)


@pytest.mark.parametrize(
    ("tamper", "seq", "why"),
    [
        (_empty_row, 10, "is empty"),
        (_split_row, 7, "does not end with a newline"),
        (_merged_rows, 20, "holds more than one line"),
    ],
)
def test_rows_that_do_not_hold_one_line_each_are_refused_by_verify_export_and_calibrate(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: Any, seq: int, why: str
) -> None:
    """The byte stream still verifies, but line numbers would no longer be seq numbers."""
    imported(capsys, tmp_path, {"r1": 40})
    with psycopg.connect(dsn) as conn:
        tamper(conn)
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV)
    assert code == 1, out
    assert f"replica r1: the row at seq {seq} {why}, not exactly one line" in out
    code, out = run(capsys, "receipts", "export", "--dsn-env", ENV, "--out", str(tmp_path / "x"))
    assert code == 1 and "do NOT verify" in out and f"seq {seq} {why}" in out
    code, out = run(capsys, "calibrate", "--dsn-env", ENV, "--out", str(tmp_path / "c.json"))
    assert code == 2 and f"firstpass_receipts:r1: the row at seq {seq} {why}" in out


def _hole(conn: psycopg.Connection[Any]) -> None:
    _renumber_from(conn, "r1", 30, 5)  # the lines still link: only the numbering is broken


def _wrong_head(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "UPDATE firstpass_receipts SET hash = 'sha256:forged' WHERE replica = 'r1' AND seq = 40"
    )


@pytest.mark.parametrize(
    ("tamper", "why"),
    [(_hole, "seq runs 1..45 over 40 rows"), (_wrong_head, "the hash column of seq 40")],
)
def test_export_and_calibrate_refuse_the_tables_verify_refuses(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: Any, why: str
) -> None:
    imported(capsys, tmp_path, {"r1": 40})
    with psycopg.connect(dsn) as conn:
        tamper(conn)
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV)
    assert code == 1 and why in out, out
    code, out = run(capsys, "receipts", "export", "--dsn-env", ENV, "--out", str(tmp_path / "x"))
    assert code == 1 and "do NOT verify" in out and why in out, out
    code, out = run(capsys, "calibrate", "--dsn-env", ENV, "--out", str(tmp_path / "c.json"))
    assert code == 2 and f"firstpass_receipts:r1: {why}" in out, out


def test_import_refuses_a_replica_a_live_process_holds(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A running server writes that replica's chain: rows imported under it would stop it."""
    import os
    import socket

    log = write_log(tmp_path / "web-1.jsonl", 5)
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "INSERT INTO firstpass_replicas (replica, owner, host, pid, seen)"
            " VALUES ('web-1', 'other', %s, %s, now())",
            (socket.gethostname(), os.getppid()),  # alive, and not this process
        )
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, str(log))
    assert code == 1, out
    assert "replica web-1 is held by a running process" in out
    assert "stop that replica first, or import under another --replica" in out
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM firstpass_receipts").fetchone() == (0,)
        conn.execute("UPDATE firstpass_replicas SET seen = now() - interval '1 hour'")
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, str(log))
    assert code == 1, out  # on this host, a running pid holds it however long unseen
    with psycopg.connect(dsn) as conn:  # a holder on another host, silent past the lease
        conn.execute("UPDATE firstpass_replicas SET host = 'elsewhere.example'")
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, str(log))
    assert code == 0 and "imported 5 lines" in out


def test_reimporting_a_continuation_fragment_already_imported_is_a_no_op(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    full = write_log(tmp_path / "full.jsonl", 30)
    lines = full.read_bytes().splitlines(keepends=True)
    first, middle, rest = (tmp_path / f"{n}.jsonl" for n in ("first", "middle", "rest"))
    first.write_bytes(b"".join(lines[:10]))
    middle.write_bytes(b"".join(lines[10:20]))
    rest.write_bytes(b"".join(lines[20:]))
    args = ("receipts", "import", "--dsn-env", ENV, "--replica", "a")
    for part in (first, middle, rest):
        assert run(capsys, *args, str(part))[0] == 0
    for part in (middle, rest, first):
        code, out = run(capsys, *args, str(part))
        assert code == 0 and "already holds these 10 lines" in out, out
    overlapping = tmp_path / "overlap.jsonl"  # lines 16..30 then more: only the new ones go in
    more = write_log(tmp_path / "more.jsonl", 35).read_bytes().splitlines(keepends=True)
    overlapping.write_bytes(b"".join(more[15:]))
    code, out = run(capsys, *args, str(overlapping))
    assert code == 0 and "imported 5 lines (seq 31..35)" in out, out
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV)
    assert code == 0 and "replica a: ok: 35 receipts" in out


def test_import_refuses_a_chain_already_in_the_table_under_another_replica(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(tmp_path / "web.jsonl", 12)
    assert run(capsys, "receipts", "import", "--dsn-env", ENV, str(log))[0] == 0
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, "--replica", "b", str(log))
    assert code == 1 and "already seq 1 of replica web" in out and "twice" in out, out
    tail = tmp_path / "tail.jsonl"
    tail.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[4:]))
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, "--replica", "c", str(tail))
    assert code == 1 and "already seq 5 of replica web" in out, out


def test_export_to_a_path_that_cannot_be_a_directory_is_a_clean_error(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    imported(capsys, tmp_path, {"r1": 3})
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for out_dir, why in ((a_file, "is not a directory"), (a_file / "sub", "cannot create")):
        code, out = run(capsys, "receipts", "export", "--dsn-env", ENV, "--out", str(out_dir))
        assert code == 2 and why in out and "Traceback" not in out, out


def test_ids_from_the_table_are_checked_before_export_and_escaped_by_verify(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    imported(capsys, tmp_path, {"r1": 3})
    with psycopg.connect(dsn) as conn:
        for bad in ("a" * 5000, "\x1b[31mRED"):
            conn.execute(
                "INSERT INTO firstpass_receipts (replica, seq, hash, prev_hash, line)"
                " SELECT %s, seq, hash, prev_hash, line FROM firstpass_receipts"
                " WHERE replica = 'r1'",
                (bad,),
            )
    code, out = run(capsys, "receipts", "verify", "--dsn-env", ENV)
    assert "\x1b" not in out and "replica \\x1b[31mRED: ok" in out
    assert "a" * 81 not in out and "3 replica chain(s)" in out
    out_dir = tmp_path / "x"
    code, out = run(capsys, "receipts", "export", "--dsn-env", ENV, "--out", str(out_dir))
    assert code == 2 and "is not a replica id" in out and "Traceback" not in out, out
    assert not out_dir.exists() or not list(out_dir.iterdir())


def test_a_directory_import_that_fails_prints_nothing_as_imported(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    logs = tmp_path / "logs"
    logs.mkdir()
    write_log(logs / "aa.jsonl", 5)
    write_log(logs / "zz.jsonl", 5, seed=1)
    with psycopg.connect(dsn) as conn:
        conn.execute(
            "CREATE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF "
            "new.replica = 'zz' THEN RAISE EXCEPTION 'boom'; END IF; RETURN new; END $$"
        )
        conn.execute(
            "CREATE TRIGGER boom BEFORE INSERT ON firstpass_receipts"
            " FOR EACH ROW EXECUTE FUNCTION boom()"
        )
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, str(logs))
    assert code == 2 and "nothing was written" in out and "imported" not in out, out
    with psycopg.connect(dsn) as conn:
        assert conn.execute("SELECT count(*) FROM firstpass_receipts").fetchone() == (0,)


def test_importing_an_empty_file_says_there_is_nothing_to_import(
    dsn: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "e.jsonl"
    empty.write_bytes(b"")
    code, out = run(capsys, "receipts", "import", "--dsn-env", ENV, str(empty))
    assert code == 0 and "holds no lines: nothing to import" in out, out
