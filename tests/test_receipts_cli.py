"""Behaviour of ``firstpass receipts verify|show|summary``: output and exit codes."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from firstpass import cli
from firstpass.receipts import ReceiptWriter, new_receipt_id
from tests.receipt_fixtures import complete


@pytest.fixture(autouse=True)
def only_receipts_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Build the parser with just this subcommand, so these tests do not depend on the others."""
    monkeypatch.setattr(cli, "COMMANDS", ("receipts",))


def make(
    action: str, total_ms: float, *, visible: bool = True, cost: float = 0.001
) -> dict[str, Any]:
    return complete(
        {
            "id": new_receipt_id(),
            "mode": "cascade",
            "decision": {"action": action, "steps": [], "counterfactual": None, "gate_label": None},
            "checks": [
                {"kind": "visible", "passed": visible, "n_passed": int(visible), "n_total": 1}
            ],
            "cost": {"total_usd": cost, "top_rung_usd": 0.01, "probe_usd": 0.0},
            "timings_ms": {"total": total_ms},
        }
    )


def write_log(path: Path, records: list[dict[str, Any]]) -> None:
    async def run() -> None:
        async with ReceiptWriter(path) as writer:
            for record in records:
                await writer.write(complete(record))

    asyncio.run(run())


@pytest.fixture
def records() -> list[dict[str, Any]]:
    return [
        make("served", 10.0),
        make("escalated", 20.0, visible=False, cost=0.011),
        make("served", 30.0),
    ]


@pytest.fixture
def log(tmp_path: Path, records: list[dict[str, Any]]) -> Path:
    path = tmp_path / "receipts.jsonl"
    write_log(path, records)
    return path


def test_verify_prints_ok_with_count_and_head_and_exits_0(log: Path, capsys):
    """An intact log prints ``ok: N receipts, head sha256:…`` and exits 0."""
    assert cli.main(["receipts", "verify", str(log)]) == 0
    head = json.loads(log.read_bytes().splitlines()[-1])["hash"]
    assert capsys.readouterr().out.strip() == f"ok: 3 receipts, head {head}"


def test_verify_names_the_first_bad_line_and_exits_1(log: Path, capsys):
    """A tampered log prints ``line L: <reason>`` first and exits 1."""
    lines = log.read_bytes().splitlines(keepends=True)
    lines[1] = lines[1].replace(b'"escalated"', b'"served"')
    log.write_bytes(b"".join(lines))
    assert cli.main(["receipts", "verify", str(log)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("line 2: hash mismatch")
    assert out[1].startswith("the 1 receipts before it verify")


def test_verify_reports_a_truncated_last_line(log: Path, capsys):
    """A crash-cut last line is reported as truncated on its line, exit 1."""
    log.write_bytes(log.read_bytes()[:-20])
    assert cli.main(["receipts", "verify", "--strict", str(log)]) == 1
    assert capsys.readouterr().out.startswith("line 3: truncated")


def test_verify_of_a_missing_file_is_a_one_line_error_exit_2(tmp_path: Path, capsys):
    """An unreadable path gives a one-line message on stderr and exit 2, no traceback."""
    assert cli.main(["receipts", "verify", str(tmp_path / "none.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("firstpass receipts:") and "none.jsonl" in err
    assert "Traceback" not in err


def test_show_prints_the_receipt_as_indented_json(log: Path, records, capsys):
    """``show ID --path P`` prints that receipt, indented, with its chain keys; exit 0."""
    assert cli.main(["receipts", "show", records[1]["id"], "--path", str(log)]) == 0
    out = capsys.readouterr().out
    shown = json.loads(out)
    assert shown["id"] == records[1]["id"]
    assert shown["decision"]["action"] == "escalated"
    assert shown["hash"].startswith("sha256:")
    assert out.startswith('{\n  "')


def test_show_of_an_unknown_id_exits_1(log: Path, capsys):
    """An id that is not in the log prints why on stderr and exits 1."""
    assert cli.main(["receipts", "show", "rcpt_NOPE", "--path", str(log)]) == 1
    assert "no receipt rcpt_NOPE" in capsys.readouterr().err


def test_show_defaults_to_receipts_jsonl_in_the_working_directory(
    tmp_path: Path, records, monkeypatch: pytest.MonkeyPatch, capsys
):
    """Without ``--path`` and without a config file, ``show`` reads ./receipts.jsonl."""
    write_log(tmp_path / "receipts.jsonl", records)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FIRSTPASS_CONFIG", raising=False)
    assert cli.main(["receipts", "show", records[0]["id"]]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == records[0]["id"]


def test_summary_prints_actions_rates_cost_and_latency(log: Path, capsys):
    """The text summary shows counts by action, visible pass rate, cost and p50/p95."""
    assert cli.main(["receipts", "summary", str(log)]) == 0
    out = capsys.readouterr().out
    assert "3 receipts (cascade 3)" in out
    assert "actions: served 2, escalated 1" in out
    assert "visible checks: 2/3 passed (66.7%)" in out
    assert "gate checks: none" in out
    assert "cost: $0.0130 vs $0.0300 always calling the top rung (56.7% saved)" in out
    assert "p50 20.0 ms, p95 29.0 ms" in out


def test_summary_json_is_machine_readable(log: Path, capsys):
    """``summary --json`` prints the same numbers as JSON."""
    assert cli.main(["receipts", "summary", str(log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["n"] == 3
    assert data["actions"] == {"served": 2, "escalated": 1}
    assert data["checks"]["visible"] == {
        "passed": 2, "total": 3, "rate": pytest.approx(2 / 3), "failures": {"(missing)": 1}
    }  # fmt: skip
    assert data["latency_ms"]["p50"] == pytest.approx(20.0)
    assert data["cost"]["top_rung_usd"] == pytest.approx(0.03)


def test_receipts_without_an_action_prints_usage_and_exits_2(capsys):
    """``firstpass receipts`` alone prints the actions it offers and exits 2."""
    assert cli.main(["receipts"]) == 2
    assert "verify" in capsys.readouterr().err


def test_show_without_a_log_here_says_to_pass_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --path, no config and no ./receipts.jsonl: one line naming where it looked and --path."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["receipts", "show", "rcpt_x"]) == 2
    err = capsys.readouterr().err
    assert "no receipt log at receipts.jsonl" in err and "--path LOG" in err


@pytest.mark.parametrize(
    ("line", "action"),
    [
        ("[" * 100_000, "summary"),
        ("[" * 100_000, "verify"),
        (
            '{"id": "rcpt_s", "mode": "\\udc00", "cost": {"total_usd": 1' + "0" * 400 + "}}",
            "summary",
        ),
        (
            '{"id": "a", "cost": {"total_usd": 1e308}}\n{"id": "b", "cost": {"total_usd": 1e308}}',
            "summary",
        ),
    ],
    ids=["deep-summary", "deep-verify", "surrogate-and-huge-int", "sum-overflow"],
)
def test_hostile_log_lines_give_a_verdict_not_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, action: str
) -> None:
    """A log nested 100,000 deep, a lone surrogate, a 401-digit cost, or costs whose sum
    overflows: verify says the chain is broken, summary prints (valid JSON too), no traceback."""
    log = tmp_path / "r.jsonl"
    log.write_text(line + "\n", encoding="utf-8", errors="surrogatepass")
    code = cli.main(["receipts", action, str(log)] + (["--json"] if action == "summary" else []))
    out = capsys.readouterr().out
    if action == "verify":
        assert code == 1
    else:
        assert code == 0
        data = json.loads(out)  # strict JSON: no Infinity
        assert data["cost"]["total_usd"] is not None


def test_summary_shows_taxonomy_failures_per_check_rates_revisions_and_checks_cost(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A log with listed checks, a label run and a revision: the text and the JSON show the
    failures in the one taxonomy per stage, the pass rate per check (label runs apart), the
    revision rate with its stops, and what the checks cost."""
    revised = make("served", 10.0)
    revised["checks"] = [
        {"kind": "visible", "passed": False, "n_passed": 1, "n_total": 2,
         "category": "schema_violation",
         "results": [{"name": "schema", "passed": False, "category": "schema_violation"}]},
        {"kind": "visible", "passed": True, "n_passed": 2, "n_total": 2, "category": None,
         "purpose": "revision:1",
         "results": [{"name": "schema", "passed": True, "category": None}]},
        {"kind": "gate", "passed": False, "n_passed": 0, "n_total": 3,
         "category": "memory_limit", "purpose": "label"},
    ]  # fmt: skip
    revised["revisions"] = [
        {"rung": 0, "attempts": [{"revision": 1, "stage": "visible", "passed": True}],
         "stopped": None},
        {"rung": 1, "attempts": [], "stopped": "budget"},
    ]  # fmt: skip
    revised["served"] = {"rung": 0, "verification": "verified", "revision": 1}
    revised["cost"]["checks_usd"] = 0.002
    log = tmp_path / "receipts.jsonl"
    write_log(log, [revised, make("escalated", 20.0, visible=False)])
    assert cli.main(["receipts", "summary", str(log)]) == 0
    out = capsys.readouterr().out
    assert "visible failures by taxonomy category: schema_violation 1, (missing) 1" in out
    assert "gate failures by taxonomy category: sandbox_violation 1" in out
    assert "  tests: 2/3 passed (66.7%)" in out
    assert "  schema: 1/2 passed (50.0%)" in out
    assert "  hidden tests: no runs; shadow label runs 0/1 passed (0.0%)" in out
    assert (
        "revisions: 1 of 2 requests revised (50.0%), 1 attempt (1 passed), "
        "1 served a revised answer; stopped: budget 1"
    ) in out
    assert "; checks $0.0020" in out
    assert cli.main(["receipts", "summary", str(log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["failures_by_category"]["gate"] == {"sandbox_violation": 1}
    assert data["by_check"]["schema"] == {"passed": 1, "total": 2, "rate": 0.5}
    assert data["by_check_label"] == {"hidden tests": {"passed": 0, "total": 1, "rate": 0.0}}
    assert data["revisions"]["requests"] == 1 and data["revisions"]["stops"] == {"budget": 1}
    assert data["cost"]["checks_usd"] == pytest.approx(0.002)


def test_a_hostile_check_name_cannot_forge_a_summary_line(tmp_path: Path) -> None:
    """A name from a receipt with a newline and an escape code prints escaped, on its line."""
    from firstpass.commands.receipts import format_summary
    from firstpass.receipts import receipt_from_builtins, summarize

    name = "x\nhash chain: verified (head sha256:forged)\x1b[2J"
    record = {
        "id": "rcpt_1",
        "mode": "cascade",
        "checks": [
            {
                "kind": "visible",
                "passed": False,
                "n_passed": 0,
                "n_total": 1,
                "category": "pattern",
                "results": [{"name": name, "passed": False, "category": "pattern"}],
            }
        ],
    }
    text = format_summary(
        summarize([receipt_from_builtins(complete(record))]), tmp_path / "r.jsonl"
    )
    assert not any(line.startswith("hash chain") for line in text.splitlines())
    assert "\x1b" not in text and "\\x1b[2J" in text
