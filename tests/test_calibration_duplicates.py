"""The same receipts passed twice are refused, not counted twice: a copy, the same path again, or
an earlier snapshot beside the full log would double n and certify what one copy cannot."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from firstpass.calibration.cli import main
from tests.test_calibration_receipts import shadow, write_chain


def _records(n_pass: int, start: int = 0) -> list[dict[str, object]]:
    """``n_pass`` requests at 5/5 that pass the gate (each with its own id), and a failing tail."""
    rows = [shadow(5, 5, True) for _ in range(n_pass)] + [shadow(5, 1, False)] * 20
    return [{**row, "id": f"r{start + i}"} for i, row in enumerate(rows)]


def _calibrate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main([*argv, "--json"])
    out, err = capsys.readouterr()
    return code, out, err


def test_one_copy_certifies_nothing_and_two_copies_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """40 passing requests do not certify 5/5 at δ_1 (0.95⁴⁰ = 0.13); the same log and its copy
    would count 80 (0.95⁸⁰ = 0.017 < δ_1 = 0.030) and certify: refused, naming both files."""
    log = write_chain(tmp_path / "shadow.jsonl", _records(40))
    copy = tmp_path / "copy.jsonl"
    shutil.copyfile(log, copy)
    code, out, _ = _calibrate(capsys, "--receipts", str(log))
    assert code == 0 and json.loads(out)["lambda"] is None
    code, out, err = _calibrate(capsys, "--receipts", str(log), str(copy))
    assert code == 2 and not out
    assert f"{log} and {copy}" in err and "counted twice" in err and "once" in err


def test_the_same_path_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = write_chain(tmp_path / "shadow.jsonl", _records(40))
    code, _, err = _calibrate(capsys, "--receipts", str(log), str(log))
    assert code == 2 and f"{log} is given twice" in err


def test_an_earlier_snapshot_beside_the_full_log_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prefix of the log (a snapshot taken earlier) shares its first receipts: the prefix's
    rows would be counted twice."""
    records = _records(40)
    full = write_chain(tmp_path / "full.jsonl", records)
    snapshot = tmp_path / "snapshot.jsonl"
    snapshot.write_text("".join(full.read_text().splitlines(keepends=True)[:30]))
    for order in ((snapshot, full), (full, snapshot)):
        code, _, err = _calibrate(capsys, "--receipts", *map(str, order))
        assert code == 2, err
        assert f"{order[0]} and {order[1]}" in err and "earlier snapshot" in err


def test_a_rotated_log_given_in_order_is_not_an_overlap(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A rotated file continues the chain of the file before it: both are read, once each."""
    whole = write_chain(tmp_path / "whole.jsonl", _records(40))
    lines = whole.read_text().splitlines(keepends=True)
    first, second = tmp_path / "receipts.jsonl", tmp_path / "receipts.000002.jsonl"
    first.write_text("".join(lines[:25]))
    second.write_text("".join(lines[25:]))
    code, out, err = _calibrate(capsys, "--receipts", str(first), str(second))
    assert code == 0, err
    assert json.loads(out)["source"]["used"] == 60


def test_unverified_logs_sharing_receipt_ids_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --allow-unverified a copy with one edited line no longer shares a verified chain
    with the original; it still shares receipt ids, and is refused naming one."""
    log = write_chain(tmp_path / "shadow.jsonl", _records(40))
    edited = tmp_path / "edited.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    record = json.loads(lines[0])
    record["route"] = "other"
    edited.write_text(json.dumps(record) + "\n" + "".join(lines[1:]))
    code, _, err = _calibrate(capsys, "--receipts", str(log), str(edited), "--allow-unverified")
    assert code == 2 and f"{log} and {edited}" in err and "receipt id 'r0'" in err
    # logs of distinct receipts, one of them unverified, are read
    other = write_chain(tmp_path / "other.jsonl", _records(40, start=1000))
    code, _, err = _calibrate(capsys, "--receipts", str(other), str(edited), "--allow-unverified")
    assert code == 0, err
