"""``receipts summary``'s cost line: the saving from the unrounded sums, figures that show the
difference it is computed from, and a log that cost more said in words, not as "-218% saved"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstpass import cli
from tests.test_receipts_cli import make, write_log


@pytest.fixture(autouse=True)
def only_receipts_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMANDS", ("receipts",))


def summary(tmp_path: Path, capsys: pytest.CaptureFixture[str], *costs: tuple[float, float]) -> str:
    """The cost line of the summary of receipts costing ``(total, top rung)`` each; checks
    that ``--json`` carries the same saving, unrounded."""
    records = []
    for total, top in costs:
        record = make("escalated", 10.0, cost=total)
        record["cost"]["top_rung_usd"] = top
        records.append(record)
    log = tmp_path / "receipts.jsonl"
    write_log(log, records)
    assert cli.main(["receipts", "summary", str(log), "--json"]) == 0
    saved = json.loads(capsys.readouterr().out)["cost"]["saved_share"]
    spent, baseline = sum(c for c, _ in costs), sum(t for _, t in costs)
    assert saved == (None if baseline == 0 else pytest.approx(1 - spent / baseline))
    assert cli.main(["receipts", "summary", str(log)]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("cost: ")]
    return line


@pytest.mark.parametrize(
    ("costs", "line"),
    [
        # an escalation: the cheap rung and the top rung, against the top rung alone
        ([(0.0007432, 0.0007)],
         "cost: $0.000743 vs $0.000700 always calling the top rung (6.2% more than that)"),
        ([(0.0003182, 0.0001)],
         "cost: $0.000318 vs $0.000100 always calling the top rung (218.2% more than that)"),
        # a baseline of almost nothing: a ratio, not a percentage in the tens of thousands
        ([(0.0042, 0.000001)],
         "cost: $0.00420 vs $0.00000100 always calling the top rung (4.2e+03× that)"),
        ([(0.013, 0.03)], "cost: $0.0130 vs $0.0300 always calling the top rung (56.7% saved)"),
        ([(0.00007, 0.0)], "cost: $0.0000700"),
    ],
    ids=["6%-more", "218%-more", "tiny-baseline", "saved", "no-baseline"],
)  # fmt: skip
def test_the_cost_line_reads_as_the_figures_it_shows(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    costs: list[tuple[float, float]],
    line: str,
) -> None:
    """Costs that printed as $0.0007 vs $0.0007 (-6.2% saved) now show their difference, and
    a saving below zero says how much more the log cost."""
    assert summary(tmp_path, capsys, *costs) == line
