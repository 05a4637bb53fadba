"""What the SQL check tests share: a small SQLite database built from DDL and rows, one answer
checked against it through the public check kind, and one named part of the result."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from firstpass.checks import CheckRequest, CheckResult, Options
from firstpass.checks._sql import SqlEvidenceCheck


def build_db(path: Path, schema: str, rows: dict[str, list[tuple[object, ...]]]) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(schema)
    for table, values in rows.items():
        marks = ", ".join("?" * len(values[0]))
        conn.executemany(f'INSERT INTO "{table}" VALUES ({marks})', values)
    conn.commit()
    conn.close()
    return path


def check(db: Path, question: str, sql: str, rows: list[list[Any]] | None = None) -> CheckResult:
    """``sql_evidence`` on an answer citing ``sql`` with its rows (run here when not given)."""
    if rows is None:
        conn = sqlite3.connect(db)
        rows = [list(r) for r in conn.execute(sql)]
        conn.close()
    evidence = {"sql": sql, "columns": [], "rows": rows, "elapsed_ms": 1.0}
    checker = SqlEvidenceCheck(options=Options(name="sql"), database=db)
    return checker.run_blocking(
        "See the rows.", CheckRequest(prompt=question, evidence=(evidence,))
    )


def part(result: CheckResult, name: str) -> CheckResult:
    (found,) = [p for p in result.parts if p.name == name]
    return found
