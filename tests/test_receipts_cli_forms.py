"""``firstpass receipts``: every action takes the log the same ways, its help states the exit
codes it really uses, its errors carry the usual prefix, and ``summary`` reads the table too."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path
from typing import Any

import pytest

from firstpass import cli
from firstpass.db import migrate
from tests.test_db_chains import write_log as write_chain
from tests.test_receipts_cli import make, write_log

PREFIX = "firstpass receipts: "


@pytest.fixture(autouse=True)
def only_receipts_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMANDS", ("receipts",))


@pytest.fixture
def records() -> list[dict[str, Any]]:
    return [make("served", 10.0), make("escalated", 20.0, visible=False, cost=0.011)]


@pytest.fixture
def log(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    path = tmp_path / "receipts.jsonl"
    write_log(path, records)
    return path


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_verify_help_states_the_exit_codes_verify_uses(
    tmp_path: Path, log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The help says a missing file exits 2 (it said 1), and each code it names is the one a
    user meets: 0 intact, 1 a bad line, 2 a missing file, no *.jsonl, or no PATH."""
    with pytest.raises(SystemExit):
        cli.main(["receipts", "verify", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert re.search(r"Exit 0 when they hold .*; 1 naming the first bad line", text), text
    assert re.search(r"; 2 when the log cannot be read \(no such file, no \*\.jsonl", text), text
    assert "or a missing file." not in text

    assert run(capsys, "receipts", "verify", str(log))[0] == 0
    broken = tmp_path / "broken.jsonl"
    broken.write_bytes(log.read_bytes().replace(b'"escalated"', b'"served"'))
    assert run(capsys, "receipts", "verify", str(broken))[0] == 1
    assert run(capsys, "receipts", "verify", str(tmp_path / "missing.jsonl"))[0] == 2
    (tmp_path / "empty").mkdir()
    assert run(capsys, "receipts", "verify", str(tmp_path / "empty"))[0] == 2
    assert run(capsys, "receipts", "verify")[0] == 2


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["verify"], "give a receipt log PATH (or --dsn-env VAR"),
        (["summary"], "give a receipt log PATH (or --dsn-env VAR"),
        (["verify", "a.jsonl", "--dsn-env", "X"], "give a receipt log PATH or --dsn-env VAR"),
        (["summary", "--path", "a.jsonl", "--dsn-env", "X"], "PATH or --dsn-env VAR, not both"),
        (["verify", "a.jsonl", "--path", "b.jsonl"], "give the receipt log once"),
        (["find", "--answer-sha256", "zz", "a.jsonl"], "--answer-sha256: 'zz' is not 64 hex"),
        (["show", "rcpt_x"], "no receipt log at receipts.jsonl"),
    ],
    ids=["verify-no-path", "summary-no-path", "path-and-dsn", "flag-and-dsn", "two-paths",
         "bad-hex", "show-no-log"],
)  # fmt: skip
def test_usage_errors_are_one_line_with_the_commands_prefix_exit_2(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    says: str,
) -> None:
    """Usage mistakes read like every other error of the command: `firstpass receipts: ...`."""
    monkeypatch.chdir(tmp_path)
    code, out, err = run(capsys, "receipts", *argv)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith(PREFIX) and says in err, err


@pytest.mark.parametrize("form", ["positional", "flag"])
def test_every_action_takes_the_log_as_path_or_as_dash_dash_path(
    log: Path, records: list[dict[str, Any]], capsys: pytest.CaptureFixture[str], form: str
) -> None:
    """verify/summary took PATH and show/find --path; each now takes both, the old forms too."""

    def where(*argv: str) -> list[str]:
        return [*argv, str(log)] if form == "positional" else [*argv, "--path", str(log)]

    code, out, _ = run(capsys, *where("receipts", "verify"))
    assert code == 0 and out.startswith("ok: 2 receipts")
    code, out, _ = run(capsys, *where("receipts", "summary"))
    assert code == 0 and "2 receipts (cascade 2)" in out
    code, out, _ = run(capsys, *where("receipts", "show", records[1]["id"]))
    assert code == 0 and json.loads(out)["id"] == records[1]["id"]
    sha = "0" * 64
    code, _, err = run(capsys, *where("receipts", "find", "--answer-sha256", sha))
    assert code == 1 and f"no receipt in {log}" in err
    # the same path twice is not a conflict
    code, out, _ = run(capsys, "receipts", "verify", str(log), "--path", str(log))
    assert code == 0


@pytest.mark.e2e
def test_summary_reads_the_tables_chains_with_dsn_env(
    pg_database: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`summary --dsn-env VAR` (which `verify` and `calibrate` had) summarises every replica's
    chain, or `--replica`'s, as it would their exported files."""
    asyncio.run(migrate(pg_database))
    monkeypatch.setenv("FP_TEST_SUMMARY_DSN", pg_database)
    for seed, (replica, n) in enumerate({"r1": 12, "r2": 5}.items()):
        path = write_chain(tmp_path / f"{replica}.jsonl", n, seed=seed)
        code, out, err = run(capsys, "receipts", "import", "--dsn-env", "FP_TEST_SUMMARY_DSN",
                             str(path))  # fmt: skip
        assert code == 0, out + err
    code, out, err = run(capsys, "receipts", "summary", "--dsn-env", "FP_TEST_SUMMARY_DSN")
    assert code == 0, err
    # 17 lines, 2 of them (pass count 0: "candidate": null) not of the receipt schema
    name = "firstpass_receipts (2 replica chain(s), $FP_TEST_SUMMARY_DSN)"
    assert out.startswith(f"{name}: 15 receipts (shadow 15)\nhash chain: verified"), out
    assert err.startswith(f"warning: {name}: 2 lines were not a receipt and left out (the "
                          "first: replica r1.jsonl: line 1: not a receipt"), err  # fmt: skip
    assert "firstpass-summary-" not in err  # the temporary export is not named
    code, out, err = run(capsys, "receipts", "summary", "--dsn-env", "FP_TEST_SUMMARY_DSN",
                         "--replica", "r2", "--json")  # fmt: skip
    assert code == 0, err
    data = json.loads(out)
    assert data["n"] + data["unreadable_lines"] == 5 and data["chain"]["verified"] is True
    code, out, _ = run(capsys, "receipts", "summary", "--dsn-env", "FP_TEST_SUMMARY_DSN",
                       "--replica", "nope")  # fmt: skip
    assert code == 1 and "no rows for replica(s) nope" in out
