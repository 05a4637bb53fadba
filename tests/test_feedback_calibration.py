"""Feedback lines in calibration: skipped as requests, and with ``--use-feedback`` the client's
label overrides the gate's on the very answer it was served, never adding a row."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from firstpass.calibration import cli
from firstpass.calibration._rows import NOT_A_REQUEST
from firstpass.calibration.data import read_receipts
from firstpass.receipts import feedback_record
from tests.test_calibration_receipts_fast import shadow_receipt, write_log


def _shadow(i: int, *, label: bool | None = True, candidate: int = 0, **over: Any) -> Any:
    """A shadow receipt served rung 0's sample 0; the gate labelled ``candidate``."""
    record = shadow_receipt(i, 5, label, **over)
    record["probe"]["candidate"] = candidate
    record["served"] = {"rung": 0, "sample": 0, "model": "demo-cheap"}
    return record


def _feedback(i: int, passed: bool, n: int = 0) -> dict[str, object]:
    return feedback_record(
        feedback_id=f"rcpt_9{n:025d}",
        receipt=f"rcpt_{i:026d}",
        passed=passed,
        reason=None,
        reason_sha256=None,
        client_key=None,
    )


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """Ten passing shadow rows; feedback says row 0 failed, row 1's client got another answer
    than the labelled one, and one names no row."""
    records = [_shadow(i, candidate=2 if i == 1 else 0) for i in range(10)]
    records += [_feedback(0, False, 0), _feedback(1, False, 1), _feedback(77, False, 2)]
    return write_log(tmp_path / "receipts.jsonl", records)


def test_feedback_lines_are_not_rows_on_either_read_path(log: Path) -> None:
    """Without the flag the labels are the gate's, and the three feedback lines are skipped as
    lines that are not requests, by the one-pass read and by the parsed read (a window) alike."""
    from firstpass.calibration._window import RowWindow

    fast = read_receipts([log])
    parsed = read_receipts([log], window=RowWindow(route="code"))
    for labelled in (fast, parsed):
        assert labelled.source.used == 10
        assert labelled.source.skipped == {NOT_A_REQUEST: 3}
        assert not labelled.failed.any()
        assert labelled.source.feedback is None


def test_feedback_overrides_the_gates_label_of_the_answer_served(log: Path) -> None:
    """Row 0's label becomes the client's; row 1's stays the gate's (another answer)."""
    labelled = read_receipts([log], use_feedback=True)
    assert labelled.source.used == 10
    assert np.flatnonzero(labelled.failed).tolist() == [0]
    assert labelled.source.feedback == {
        "lines": 3,
        "used": 1,
        "changed": 1,
        "other_answer": 1,
        "no_row": 1,
    }
    assert labelled.source.to_dict()["feedback"] == labelled.source.feedback


def test_the_last_feedback_for_a_receipt_wins(tmp_path: Path) -> None:
    """A client that corrects itself: its later line is the label."""
    records = [_shadow(0), _feedback(0, False, 0), _feedback(0, True, 1)]
    labelled = read_receipts([write_log(tmp_path / "r.jsonl", records)], use_feedback=True)
    assert not labelled.failed.any()
    assert labelled.source.feedback is not None
    assert labelled.source.feedback["used"] == 1 and labelled.source.feedback["changed"] == 0


def test_feedback_never_supplies_a_label_the_gate_did_not_give(tmp_path: Path) -> None:
    """A receipt without a gate label stays out of the data, feedback or not: which receipts
    clients label is their choice, not a random sample."""
    records = [_shadow(0), _shadow(1, label=None), _feedback(1, False)]
    labelled = read_receipts([write_log(tmp_path / "r.jsonl", records)], use_feedback=True)
    assert labelled.source.used == 1
    assert labelled.source.feedback is not None and labelled.source.feedback["no_row"] == 1


def test_a_feedback_in_a_later_file_applies(tmp_path: Path) -> None:
    """A label arrives after its receipt, maybe in a log given after it."""
    first = write_log(tmp_path / "a.jsonl", [_shadow(0), _shadow(1)])
    second = write_log(tmp_path / "b.jsonl", [_feedback(1, False)])
    labelled = read_receipts([first, second], use_feedback=True)
    assert np.flatnonzero(labelled.failed).tolist() == [1]


def test_calibrate_reports_how_many_labels_came_from_feedback(
    log: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``calibrate --use-feedback`` says how many labels were the clients' and what was not
    used; without the flag it says nothing of feedback."""
    assert cli.main(["--receipts", str(log), "--use-feedback"]) == 0
    out = capsys.readouterr().out
    assert "feedback: 1 labels from client feedback (1 differ from the gate's), of 3" in out
    assert cli.main(["--receipts", str(log)]) == 0
    assert "client feedback" not in capsys.readouterr().out


def test_use_feedback_is_refused_on_a_study_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A study file has no feedback lines: the flag is a mistake there, said so."""
    study = tmp_path / "s.jsonl"
    study.write_text('{"k": 5, "pass_count": 5, "label": true}\n')
    assert cli.main(["--study", str(study), "--use-feedback"]) == 2
    assert "--use-feedback applies to receipts" in capsys.readouterr().err
