"""Behaviour of ``summarize``: counts, pass rates, costs and latency percentiles over receipts."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstpass.receipts import LineTally, ReceiptSummary, read_lines
from firstpass.receipts import summarize as summarize_receipts
from firstpass.receipts._summary import percentile
from tests.receipt_fixtures import complete


def summarize(records: list[dict[str, Any]], *, raw: bool = False) -> ReceiptSummary:
    """The summary of ``records`` read as lines of a log are (``raw``: as given, else each
    completed into a whole receipt first)."""
    tally = LineTally()
    lines = (
        (f"line {i}", json.dumps(r if raw else complete(r)).encode())
        for i, r in enumerate(records, 1)
    )
    summary = summarize_receipts(read_lines(lines, tally), markers=tally.markers)
    return dataclasses.replace(
        summary, unreadable=tally.unreadable, first_unreadable=tally.first_unreadable
    )


def check(kind: str, passed: bool) -> dict[str, Any]:
    return {
        "rung": 0,
        "sample": 0,
        "kind": kind,
        "passed": passed,
        "n_passed": int(passed),
        "n_total": 1,
        "category": None if passed else "assertion_failed",
        "ms": 5.0,
    }


def receipt(
    action: str,
    checks: list[dict[str, Any]],
    total_ms: float | None,
    cost: float,
    top: float,
    **extra: Any,
) -> dict[str, Any]:
    record: dict[str, Any] = {
        "id": f"rcpt_{action}_{total_ms}",
        "mode": extra.pop("mode", "cascade"),
        "decision": {"action": action, "steps": [], "counterfactual": None, "gate_label": None},
        "checks": checks,
        "cost": {"total_usd": cost, "top_rung_usd": top, "probe_usd": 0.0},
        "probe": None,
    }
    if total_ms is not None:
        record["timings_ms"] = {"total": total_ms}
    record.update(extra)
    return record


RECORDS = [
    receipt("served", [check("visible", True), check("gate", True)], 10.0, 0.001, 0.01),
    receipt(
        "escalated",
        [check("visible", True), check("gate", False), check("visible", True), check("gate", True)],
        30.0,
        0.011,
        0.01,
    ),
    receipt(
        "exhausted_unverified",
        [check("visible", False), check("visible", False)],
        50.0,
        0.011,
        0.01,
    ),
    receipt(
        "upstream_error",
        [],
        20.0,
        0.0,
        0.0,
        error={"status": 502, "type": "upstream_error", "message": "boom"},
    ),
    receipt(
        "served",
        [check("visible", True)],
        40.0,
        0.002,
        0.01,
        mode="shadow",
        probe={"k": 5, "pass_count": 5, "regime": "serve", "cost_usd": 0.0005},
        decision={"action": "served", "counterfactual": "serve_without_gate", "gate_label": True},
    ),
    receipt(
        "escalated",
        [check("visible", True)],
        100.0,
        0.012,
        0.01,
        mode="shadow",
        probe={"k": 5, "pass_count": 2, "regime": "gate", "cost_usd": 0.0005},
        decision={
            "action": "escalated",
            "counterfactual": "escalate_after_gate",
            "gate_label": False,
        },
    ),
]


def test_summary_counts_actions_modes_and_check_pass_rates():
    """Actions and modes are counted; visible and gate pass rates come from checks[] by kind."""
    summary = summarize(RECORDS)
    assert summary.n == 6
    assert summary.actions == {
        "served": 2,
        "escalated": 2,
        "exhausted_unverified": 1,
        "upstream_error": 1,
    }
    assert summary.modes == {"cascade": 4, "shadow": 2}
    assert (summary.visible.passed, summary.visible.total) == (5, 7)
    assert (summary.gate.passed, summary.gate.total) == (2, 3)
    assert summary.gate.rate == pytest.approx(2 / 3)


def test_summary_totals_cost_against_the_top_rung_counterfactual():
    """Cost sums cost.total_usd and sets it beside the always-top-rung cost."""
    summary = summarize(RECORDS)
    assert summary.cost_usd == pytest.approx(0.001 + 0.011 + 0.011 + 0.002 + 0.012)
    assert summary.top_rung_usd == pytest.approx(0.05)


def test_summary_latency_percentiles_match_numpy():
    """p50/p95 of timings_ms.total equal numpy's default (linear) percentiles."""
    summary = summarize(RECORDS)
    totals = [10.0, 30.0, 50.0, 20.0, 40.0, 100.0]
    assert summary.latency_p50_ms == pytest.approx(np.percentile(totals, 50))
    assert summary.latency_p95_ms == pytest.approx(np.percentile(totals, 95))
    assert summary.n_timed == 6


def test_summary_reports_probe_regimes_and_labels_when_present():
    """With elastic receipts: counts by probe.regime, counterfactuals and gate labels."""
    summary = summarize(RECORDS)
    assert summary.regimes == {"serve": 1, "gate": 1}
    assert summary.counterfactuals == {"serve_without_gate": 1, "escalate_after_gate": 1}
    assert (summary.labelled, summary.label_passed) == (2, 1)
    plain = summarize(RECORDS[:4])
    assert plain.regimes == {} and plain.labelled == 0


def test_a_line_missing_a_field_is_left_out_whole_and_named():
    """A line with only id/mode/hash/prev_hash is not a receipt: it counts toward nothing but
    the unreadable lines, and the warning names it and the field it lacks; nothing is guessed."""
    minimal = {"id": "rcpt_1", "mode": "passthrough", "prev_hash": "x", "hash": "y"}
    summary = summarize([minimal, RECORDS[0]], raw=True)
    assert summary.n == 0 and summary.unreadable == 2
    assert summary.first_unreadable is not None
    assert summary.first_unreadable.startswith("line 1: not a receipt (Object missing required")
    assert summary.warning is not None and "2 lines were not a receipt" in summary.warning
    assert summary.visible.total == summary.gate.total == 0 and summary.visible.rate is None
    assert summary.latency_p50_ms is None and summary.n_timed == 0


def test_empty_input_gives_an_empty_summary():
    """No receipts: n is 0, rates and percentiles are None, and it still serialises to JSON."""
    summary = summarize([])
    assert summary.n == 0 and summary.latency_p95_ms is None
    data: dict[str, Any] = summary.to_dict()  # nested JSON data
    assert data["checks"]["gate"]["rate"] is None


@given(
    st.lists(st.floats(min_value=-1e6, max_value=1e6), min_size=1, max_size=50),
    st.floats(min_value=0, max_value=1),
)
def test_percentile_matches_numpy_linear(values: list[float], q: float):
    """The percentile used for latencies is numpy's default linear interpolation."""
    assert percentile(sorted(values), q) == pytest.approx(
        float(np.percentile(values, q * 100)), rel=1e-9, abs=1e-6
    )


@pytest.mark.e2e
def test_a_reader_that_goes_away_ends_the_command_quietly(tmp_path: Path) -> None:
    """`firstpass receipts summary LOG | head` ends without a BrokenPipe traceback."""
    import subprocess
    import sys

    from firstpass.demo.runner import run_demo

    log = tmp_path / "receipts.jsonl"
    run_demo(receipts=log, out=io.StringIO())
    proc = subprocess.Popen(
        [sys.executable, "-m", "firstpass", "receipts", "summary", str(log)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the reader is gone before a byte is written
    err = proc.stderr.read().decode()
    assert proc.wait(60) == 0, err
    assert "Traceback" not in err and "BrokenPipe" not in err


# --- the summary command checks the hash chain -------------------------------------------------


def _write_log(path: Path, records: list[dict[str, Any]]) -> Path:
    import asyncio

    from firstpass.receipts import ReceiptWriter

    async def run() -> None:
        async with ReceiptWriter(path) as writer:
            for record in records:
                await writer.write(complete(record))

    asyncio.run(run())
    return path


def _summary_command(
    path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, *args: str
) -> tuple[int, str, str]:
    from firstpass import cli

    monkeypatch.setattr(cli, "COMMANDS", ("receipts",))
    status = cli.main(["receipts", "summary", str(path), *args])
    out, err = capsys.readouterr()
    return status, out, err


@pytest.fixture
def log(tmp_path: Path) -> Path:
    """Three receipts written by the real writer: 0.001, 0.011 and 0.001 dollars."""
    records = [
        receipt("served", [check("visible", True)], 10.0, 0.001, 0.01),
        receipt("escalated", [check("visible", False)], 20.0, 0.011, 0.01),
        receipt("served", [check("visible", True)], 30.0, 0.001, 0.01),
    ]
    for i, record in enumerate(records):
        record["id"] = f"rcpt_{i}"
    return _write_log(tmp_path / "receipts.jsonl", records)


def _edit_line(path: Path, line_no: int, old: bytes, new: bytes) -> None:
    lines = path.read_bytes().splitlines(keepends=True)
    assert old in lines[line_no - 1]
    lines[line_no - 1] = lines[line_no - 1].replace(old, new)
    path.write_bytes(b"".join(lines))


def test_summary_of_an_intact_log_says_the_chain_verified(
    log: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No warning on stderr; the text names the verified head, the JSON says verified."""
    status, out, err = _summary_command(log, capsys, monkeypatch)
    assert status == 0 and err == ""
    assert "3 receipts" in out and "hash chain: verified (head sha256:" in out
    status, out, err = _summary_command(log, capsys, monkeypatch, "--json")
    data = json.loads(out)
    assert data["chain"]["verified"] is True and data["chain"]["receipts_verified"] == 3
    assert data["chain"]["first_bad_line"] is None and data["warning"] is None and err == ""


def test_summary_of_an_edited_log_warns_naming_the_first_bad_line(
    log: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Someone lowers line 2's cost: the summary still prints (with the edited number, as the
    log now stands), and stderr warns that the chain breaks at line 2."""
    _edit_line(log, 2, b'"total_usd":0.011', b'"total_usd":0.001')
    status, out, err = _summary_command(log, capsys, monkeypatch)
    assert status == 0
    assert "3 receipts" in out and "cost: $0.0030" in out
    assert "hash chain: DOES NOT VERIFY from line 2" in out
    assert err.startswith("warning: ")
    assert "the hash chain does not verify: line 2: hash mismatch" in err
    assert "only the receipt before it is vouched for" in err


def test_summary_json_of_an_edited_log_carries_the_warning(
    log: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--json``: ``chain`` names the first bad line and why, ``warning`` says it in words, and
    stdout stays pure JSON (the warning also goes to stderr)."""
    _edit_line(log, 2, b'"escalated"', b'"served"')
    status, out, err = _summary_command(log, capsys, monkeypatch, "--json")
    assert status == 0
    data = json.loads(out)
    assert data["n"] == 3 and data["actions"] == {"served": 3}
    assert data["chain"]["verified"] is False
    assert data["chain"]["first_bad_line"] == 2 and data["chain"]["receipts_verified"] == 1
    assert "hash mismatch" in data["chain"]["reason"]
    assert "line 2" in data["warning"] and "line 2" in err


def test_summary_of_a_log_with_a_torn_last_line_counts_the_rest_and_warns(
    log: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A crash mid-write leaves half a line: the summary counts the two whole receipts, leaves
    the torn one out, and says both things instead of failing."""
    data = log.read_bytes()
    log.write_bytes(data[: len(data) - 40])
    status, out, err = _summary_command(log, capsys, monkeypatch)
    assert status == 0 and "2 receipts" in out
    assert "line 3: truncated" in err
    assert "1 line was not a receipt and left out (the first: line 3: not JSON)" in err


def test_summary_shows_failures_by_category_and_skips_by_certificate() -> None:
    """Failed check runs are counted by category per kind; served answers by how they were
    vouched for, and gate skips by the certificate (of the serving rung) that licensed them."""
    records: list[dict[str, Any]] = [
        {
            "checks": [
                {"kind": "visible", "passed": False, "category": "timeout"},
                {"kind": "visible", "passed": False, "category": "timeout"},
                {"kind": "gate", "passed": False, "category": "wrong_output"},
                {"kind": "gate", "passed": True, "category": None},
            ],
            "served": {"rung": 0, "verification": "verified"},
        },
        {
            "probe": {"rung": 0, "certificate": "cal_a"},
            "served": {"rung": 0, "verification": "gate_skipped"},
        },
        {
            "probe": {
                "rung": 0,
                "certificate": "cal_a",
                "later": [{"rung": 1, "certificate": "cal_b"}],
            },
            "served": {"rung": 1, "verification": "gate_skipped"},
        },
    ]
    summary = summarize(records)
    assert summary.failures == {"visible": {"timeout": 2}, "gate": {"wrong_output": 1}}
    assert summary.verifications == {"gate_skipped": 2, "verified": 1}
    assert summary.skips_by_certificate == {"cal_a": 1, "cal_b": 1}
    data: dict[str, Any] = summary.to_dict()  # nested JSON data
    assert data["checks"]["gate"]["failures"] == {"wrong_output": 1}
    assert data["skips_by_certificate"] == {"cal_a": 1, "cal_b": 1}


# --- listed checks, the failure taxonomy, revisions ---------------------------------------------


def stage(
    kind: str,
    passed: bool,
    n_passed: int,
    n_total: int,
    category: str | None,
    results: list[dict[str, Any]] | None = None,
    purpose: str | None = None,
) -> dict[str, Any]:
    """One ``checks[]`` entry as ``Trace.check`` writes it."""
    entry: dict[str, Any] = {
        "rung": 0,
        "sample": 0,
        "kind": kind,
        "passed": passed,
        "n_passed": n_passed,
        "n_total": n_total,
        "category": category,
        "isolation": "netns+uid",
        "ms": 5.0,
    }
    if purpose is not None:
        entry["purpose"] = purpose
    if results is not None:
        entry["results"] = results
    return entry


def listed(name: str, passed: bool, category: str | None = None, **extra: Any) -> dict[str, Any]:
    """One listed check's result as ``CheckResult.to_dict`` writes it."""
    return {
        "name": name,
        "kind": extra.pop("kind", "regex"),
        "verdict": "pass" if passed else "fail",
        "passed": passed,
        "score": float(passed),
        "category": category,
        "severity": "error",
        "needs_revision": not passed,
        **extra,
    }


#: a request whose schema failure was revised away and served revised; one whose tests and
#: judge failed, revision running out; a shadow request with a label run
CHECKED = [
    {
        "id": "rcpt_revised",
        "mode": "cascade",
        "checks": [
            stage(
                "visible", False, 4, 5, "schema_violation",
                [listed("schema", False, "schema_violation", kind="json_schema"),
                 listed("request:regex", True)],
            ),
            stage(
                "visible", True, 5, 5, None,
                [listed("schema", True, kind="json_schema"), listed("request:regex", True)],
                purpose="revision:1",
            ),
            stage("gate", True, 10, 10, None, purpose="revision:1"),
        ],
        "revisions": [
            {
                "rung": 0,
                "attempts": [
                    {"revision": 1, "stage": "visible", "feedback_chars": 80, "passed": True,
                     "cost_usd": 0.001},
                ],
                "stopped": None,
            }
        ],
        "served": {"rung": 0, "verification": "verified", "revision": 1},
        "cost": {"total_usd": 0.003, "top_rung_usd": 0.01, "probe_usd": 0.0, "checks_usd": 0.0005},
    },
    {
        "id": "rcpt_exhausted",
        "mode": "cascade",
        "checks": [
            stage("visible", False, 1, 2, "wrong_output"),
            stage("visible", False, 0, 2, "timeout", purpose="revision:1"),
            stage(
                "gate", False, 2, 5, "assertion_failed",
                [listed("judge", False, "judge_rejected", kind="judge", cost_usd=0.002)],
            ),
        ],
        "revisions": [
            {
                "rung": 0,
                "attempts": [{"revision": 1, "stage": "visible", "feedback_chars": 50,
                              "passed": False, "cost_usd": 0.001}],
                "stopped": "max_revisions",
            },
            {"rung": 1, "attempts": [], "stopped": "not_revisable"},
        ],
        "served": {"rung": 1, "verification": "unverified"},
        "cost": {"total_usd": 0.02, "top_rung_usd": 0.01, "probe_usd": 0.0, "checks_usd": 0.002},
    },
    {
        "id": "rcpt_shadow",
        "mode": "shadow",
        "checks": [
            stage("gate", False, 0, 3, "memory_limit", purpose="label"),
            stage("gate", True, 3, 3, None),
        ],
        "served": {"rung": 0, "verification": "verified"},
        "cost": {"total_usd": 0.001, "top_rung_usd": 0.01, "probe_usd": 0.0},
    },
]  # fmt: skip


def test_failed_check_runs_are_counted_in_the_one_taxonomy_per_stage() -> None:
    """Tests failures map through category_of_test_run (wrong_output → tests_failed,
    memory_limit → sandbox_violation), listed checks count under their own category, a stage
    whose tests and a listed check both failed counts both, and label runs count too; the
    per-kind sandbox categories stay as they were."""
    summary = summarize(CHECKED)
    assert summary.category_failures == {
        "visible": {"schema_violation": 1, "tests_failed": 1, "timeout": 1},
        "gate": {"tests_failed": 1, "judge_rejected": 1, "sandbox_violation": 1},
    }
    assert summary.failures == {
        "visible": {"schema_violation": 1, "wrong_output": 1, "timeout": 1},
        "gate": {"assertion_failed": 1, "memory_limit": 1},
    }
    assert (summary.visible.passed, summary.visible.total) == (1, 4)
    assert (summary.gate.passed, summary.gate.total) == (2, 4)


def test_pass_rate_per_check_counts_revision_runs_and_keeps_label_runs_apart() -> None:
    """Per check name: a stage's tests as ``tests`` / ``hidden tests`` (read from the counts when
    the stage also lists checks), listed checks by name; revision runs count, shadow label runs
    are counted on their own."""
    summary = summarize(CHECKED)
    rates = {name: (r.passed, r.total) for name, r in summary.by_check.items()}
    assert rates == {
        "tests": (2, 4),
        "schema": (1, 2),
        "request:regex": (2, 2),
        "hidden tests": (2, 3),
        "judge": (0, 1),
    }
    assert summary.by_check["schema"].rate == pytest.approx(0.5)
    label = {name: (r.passed, r.total) for name, r in summary.by_check_label.items()}
    assert label == {"hidden tests": (0, 1)}


def test_revision_rate_attempts_served_revised_and_stops() -> None:
    """Two of three requests made a revision attempt (two attempts, one passed); one served a
    revised answer; the loops that ended without a pass are counted by why."""
    summary = summarize(CHECKED)
    assert (summary.revised, summary.revision_attempts) == (2, 2)
    assert summary.revision_rate == pytest.approx(2 / 3)
    assert summary.revision_attempts_passed == 1
    assert summary.served_revised == 1
    assert summary.revision_stops == {"max_revisions": 1, "not_revisable": 1}
    assert summarize(RECORDS).revised == 0 and summarize([]).revision_rate is None


def test_checks_cost_is_the_sum_of_cost_checks_usd() -> None:
    """What judges spent is summed apart from (and still inside) the total."""
    summary = summarize(CHECKED)
    assert summary.checks_usd == pytest.approx(0.0025)
    assert summary.cost_usd == pytest.approx(0.024)
    assert summarize(RECORDS).checks_usd == 0.0


def test_to_dict_carries_the_taxonomy_per_check_rates_revisions_and_checks_cost() -> None:
    """``--json`` has every new number, and stays strict JSON."""
    data = json.loads(json.dumps(summarize(CHECKED).to_dict(), allow_nan=False))
    assert data["failures_by_category"]["gate"] == {
        "tests_failed": 1, "judge_rejected": 1, "sandbox_violation": 1
    }  # fmt: skip
    assert data["by_check"]["hidden tests"] == {
        "passed": 2, "total": 3, "rate": pytest.approx(2 / 3)
    }  # fmt: skip
    assert data["by_check_label"] == {"hidden tests": {"passed": 0, "total": 1, "rate": 0.0}}
    assert data["revisions"] == {
        "requests": 2,
        "rate": pytest.approx(2 / 3),
        "attempts": 2,
        "attempts_passed": 1,
        "served_revised": 1,
        "stops": {"max_revisions": 1, "not_revisable": 1},
    }
    assert data["cost"]["checks_usd"] == pytest.approx(0.0025)
    empty: dict[str, Any] = summarize([]).to_dict()  # nested JSON data
    assert empty["failures_by_category"] == {"visible": {}, "gate": {}}
    assert empty["by_check"] == {} and empty["revisions"]["rate"] is None


def test_malformed_results_revisions_and_costs_leave_their_line_out_whole() -> None:
    """A ``results`` that is not a list, results entries that are not checks, counts that are
    not numbers, revisions of the wrong shape, a non-numeric ``served.revision`` or
    ``cost.checks_usd``, an unknown stage: each makes its line no receipt of the schema, so
    the line is left out whole (never half counted) and the first is named by field."""
    malformed: list[dict[str, Any]] = [
        {"checks": [{"kind": "gate", "passed": False, "category": "timeout", "results": "x"}]},
        {"checks": [stage("visible", False, 4, 5, "wrong_output",
                          [listed("schema", False, "schema_violation"), None])]},  # type: ignore[list-item]  # on purpose: a result that is not a check
        {"checks": [stage("visible", False, 4, 5, None) | {"n_total": "5"}]},
        {"checks": [{"kind": "probe", "passed": False, "category": "timeout"}]},
        {"checks": [{"kind": "visible"}]},
        {"revisions": "many"},
        {"revisions": [{"rung": 0, "attempts": [None], "stopped": None}]},
        {"revisions": [{"rung": 0, "attempts": [], "stopped": 7}]},
        {"served": {"revision": True}},
        {"served": {"revision": "2"}},
        {"cost": {"checks_usd": "0.1"}},
        {"cost": {"checks_usd": True}},
        {"served": "revised"},
        {"cost": []},
    ]  # fmt: skip
    summary = summarize([*malformed, RECORDS[0]])
    assert summary.n == 1 and summary.unreadable == len(malformed)
    assert summary.first_unreadable is not None
    assert summary.first_unreadable.startswith("line 1: not a receipt")
    assert "$.checks[0].results" in summary.first_unreadable
    assert summary.actions == {"served": 1}
    json.dumps(summary.to_dict(), allow_nan=False)


def test_implausible_costs_are_left_out_of_the_sums() -> None:
    """A cost that parses but is no measurement (1e300) does not make the sums infinite."""
    summary = summarize([{"cost": {"total_usd": 1e300, "top_rung_usd": 0.0, "probe_usd": 0.0,
                                   "checks_usd": 1e300}}, RECORDS[0]])  # fmt: skip
    assert summary.n == 2 and summary.cost_usd == pytest.approx(0.001)
    assert summary.checks_usd == 0.0
    json.dumps(summary.to_dict(), allow_nan=False)


# -- operations figures: rate, errors, skip rate, served failure (issue 15) ----------------------


def timed(i: int, seconds: float, **extra: Any) -> dict[str, Any]:
    whole, millis = divmod(round(seconds * 1000), 1000)
    minutes, secs = divmod(whole, 60)
    return {
        "id": f"rcpt_{i}",
        "mode": "cascade",
        "time": f"2026-01-31T12:{minutes:02d}:{secs:02d}.{millis:03d}Z",
        "decision": {"action": "served"},
        **extra,
    }


def shadow(i: int, regime: str, label: bool | None) -> dict[str, Any]:
    counterfactual = {"serve": "serve_without_gate", "gate": "serve_after_gate"}.get(regime)
    return {
        "id": f"rcpt_s{i}",
        "mode": "shadow",
        "decision": {"action": "served", "counterfactual": counterfactual, "gate_label": label},
        "probe": {"rung": 0, "regime": regime},
    }


def test_requests_per_minute_over_the_receipts_time_span() -> None:
    records = [timed(0, 0.0), timed(1, 30.0), timed(2, 59.5), timed(3, 60.0)]
    summary = summarize(records)
    assert summary.first_time == "2026-01-31T12:00:00.000Z"
    assert summary.last_time == "2026-01-31T12:01:00.000Z"
    assert summary.span_s == pytest.approx(60.0)
    assert summary.requests_per_minute == pytest.approx(4.0)
    assert summarize([timed(0, 1.0)]).requests_per_minute is None  # one receipt: no span


def test_error_rate_counts_receipts_answered_with_an_error_by_type() -> None:
    records = [
        timed(0, 0.0),
        timed(1, 1.0, error={"status": 502, "type": "upstream_error", "message": "x"}),
        timed(2, 2.0, error={"status": 400, "type": "invalid_request_error", "message": "y"}),
        timed(3, 3.0, error={"status": 502, "type": "upstream_error", "message": "z"}),
    ]
    summary = summarize(records)
    assert summary.error_rate == pytest.approx(0.75)
    assert summary.errors == {"upstream_error": 2, "invalid_request_error": 1}
    assert summary.to_dict()["errors"] == {"rate": 0.75, "by_type": dict(summary.errors)}


def test_gap_and_checkpoint_lines_are_not_requests() -> None:
    records = [
        timed(0, 0.0),
        {"id": "g", "mode": "gap", "kind": "gap", "time": "2026-01-31T13:00:00.000Z"},
        {"id": "c", "mode": "checkpoint", "kind": "checkpoint", "time": "2026-01-31T14:00:00.000Z"},
        timed(1, 60.0),
    ]
    summary = summarize(records)
    assert summary.n == 2 and summary.actions == {"served": 2}
    assert summary.markers == {"gap": 1, "checkpoint": 1}
    assert summary.last_time == "2026-01-31T12:01:00.000Z"  # a marker's time is not traffic


def test_skip_rate_and_served_failure_come_from_probes_and_shadow_labels() -> None:
    records = [
        shadow(0, "serve", True),
        shadow(1, "serve", False),
        shadow(2, "serve", True),
        shadow(3, "serve", True),
        shadow(4, "gate", False),  # gated anyway: its failure was never going to be served
        shadow(5, "escalate", None),
        timed(6, 0.0),  # cascade: no probe, in neither figure
    ]
    summary = summarize(records)
    assert summary.skip_rate == pytest.approx(4 / 6)
    assert (summary.skip_labels, summary.skip_label_failures) == (4, 1)
    assert summary.served_failure == pytest.approx(0.25)
    out = summary.to_dict()
    assert out["served_failure"] == {"labelled_skips": 4, "failed": 1, "rate": 0.25}
    assert out["skip_rate"] == pytest.approx(4 / 6)


def test_summary_text_states_rate_errors_regime_shares_skips_and_served_failure() -> None:
    from firstpass.commands.receipts import format_summary

    records = [
        timed(0, 0.0),
        timed(1, 30.0, error={"status": 502, "type": "upstream_error", "message": "x"}),
        {**shadow(2, "serve", False), "time": "2026-01-31T12:01:00.000Z"},
        {**shadow(3, "gate", True), "time": "2026-01-31T12:01:00.000Z"},
    ]
    text = format_summary(summarize(records), Path("r.jsonl"))
    assert "rate: 4.0 requests/minute over 60.0 s" in text
    assert "errors: 1 of 4 (25.0%): upstream_error 1" in text
    assert "probe regimes: serve 1 (50.0%), gate 1 (50.0%)" in text
    assert "skip rate: 50.0% of probes" in text
    assert "served failure (shadow labels): 1 of 1" in text


def test_summary_without_such_figures_says_so_rather_than_inventing_them() -> None:
    summary = summarize([{"id": "a", "mode": "cascade"}])
    assert summary.requests_per_minute is None and summary.skip_rate is None
    assert summary.served_failure is None and summary.error_rate == 0.0
    json.dumps(summary.to_dict(), allow_nan=False)


def test_a_marker_whose_kind_is_not_text_is_counted_not_a_crash() -> None:
    """A hand-made line with ``"kind": [..]`` or ``{..}`` is a marker of that (odd) kind."""
    summary = summarize([{"id": "g", "kind": ["gap"]}, {"id": "h", "kind": {"a": 1}}], raw=True)
    assert summary.n == 0 and summary.markers == {"['gap']": 1, "{'a': 1}": 1}


def test_non_finite_or_huge_latencies_and_costs_are_left_out_and_the_json_stays_json() -> None:
    """``NaN``/``Infinity`` (which JSON readers accept), 1e308 and a 400-digit integer are no
    measurements: out of the percentiles and sums, never an ``Infinity`` in ``--json``."""
    big = 10**400
    records = [
        {"timings_ms": {"total": float("nan"), "upstream": 0.0, "sandbox": 0.0, "overhead": 0.0}},
        {"timings_ms": {"total": float("inf"), "upstream": 0.0, "sandbox": 0.0, "overhead": 0.0}},
        {"timings_ms": {"total": 1e308, "upstream": 0.0, "sandbox": 0.0, "overhead": 0.0}},
        {"cost": {"total_usd": big, "top_rung_usd": 1e308, "probe_usd": float("nan")}},
        {"timings_ms": {"total": 12.0, "upstream": 0.0, "sandbox": 0.0, "overhead": 0.0}},
    ]
    lines = [(f"line {i}", json.dumps(complete(r)).encode()) for i, r in enumerate(records, 1)]
    tally = LineTally()
    summary = summarize_receipts(read_lines(lines, tally), markers=tally.markers)
    assert summary.n == 5 and tally.unreadable == 0
    assert summary.n_timed == 2 and summary.latency_p95_ms is not None
    assert summary.cost_usd == 0.0 and summary.top_rung_usd == 0.0
    json.dumps(summary.to_dict(), allow_nan=False)
