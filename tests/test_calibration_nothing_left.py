"""What `firstpass calibrate` says when nothing is left to calibrate on, and how it names the
levels and the score of a study: what the user sees, from the command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from firstpass import cli
from tests.test_db_chains import write_log


@pytest.fixture(autouse=True)
def only_calibrate_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "COMMANDS", ("calibrate",))


def calibrate(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["calibrate", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_a_route_the_log_does_not_hold_names_the_routes_it_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--route demo` on shadow receipts of route `code` said "no labelled shadow receipts
    (... another route)" and told the user to run shadow mode, which they had done. It says the
    labelled receipts are of another route, names the routes there are, and what to pass."""
    log = write_log(tmp_path / "shadow.jsonl", 30, route="code")
    code, out, err = calibrate(capsys, "--receipts", str(log), "--route", "demo")
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("firstpass calibrate: ")
    assert (
        "30 labelled shadow receipts are of another route than --route 'demo': 'code' (30)" in err
    )
    assert "pass one of these, or leave --route out" in err
    assert 'mode = "shadow"' not in err
    code, out, _ = calibrate(capsys, "--receipts", str(log), "--route", "code")
    assert code == 0 and "data: 30 labelled rows" in out


def test_a_model_the_log_was_not_drawn_from_names_the_ones_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(tmp_path / "shadow.jsonl", 12)
    probe = json.loads(log.read_text("utf-8").splitlines()[0])["probe"]
    model = f"{probe['provider']}/{probe['model']}"  # as --model names it
    code, _, err = calibrate(capsys, "--receipts", str(log), "--model", "other/model")
    assert code == 2
    assert "12 labelled shadow receipts are drawn from another model or temperature" in err
    assert f"the log has {model} at temperature" in err and "--model/--temperature" in err


def test_a_log_without_shadow_labels_still_says_to_collect_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(tmp_path / "shadow.jsonl", 3)
    lines = [json.loads(line) for line in log.read_text("utf-8").splitlines()]
    cascade = tmp_path / "cascade.jsonl"
    for record in lines:
        record["mode"] = "cascade"
    from tests.test_receipts_cli import write_log as write_receipts

    write_receipts(cascade, [{k: v for k, v in r.items() if k not in ("prev_hash", "hash")}
                             for r in lines])  # fmt: skip
    code, _, err = calibrate(capsys, "--receipts", str(cascade), "--route", "code")
    assert code == 2 and "no labelled shadow receipts in" in err
    assert 'run the proxy with [escalation.elastic] mode = "shadow"' in err


#: the study example of docs/calibration.md ("Study file")
STUDY = [
    {"k": 5, "pass_count": 3, "label": True},
    {"k": 5, "pass_count": 5, "label": False, "route": "code"},
    {"score": 0.6, "levels": [0, 0.2, 0.4, 0.6, 0.8, 1], "label": True},
]


def test_the_docs_study_example_names_its_score_and_its_levels_as_c_over_k(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example printed `score = score` and levels `1/1` and `0/1` beside `4/5`; its
    declared levels are k = 5's, so they read 5/5 … 0/5, and the score is named for what it is."""
    study = tmp_path / "study.jsonl"
    study.write_text("".join(json.dumps(r) + "\n" for r in STUDY), encoding="utf-8")
    code, out, err = calibrate(capsys, "--study", str(study), "--alpha", "0.05", "--delta",
                               "0.05", "--out", str(tmp_path / "calibration.json"))  # fmt: skip
    assert code == 0, err
    first = out.splitlines()[0]
    assert first.endswith('score: the study\'s own ("score" on its "levels")'), first
    assert "score = score" not in out
    labels = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and
              len(line.split()) == 8 and line.split()[-1] in ("yes", "no")]  # fmt: skip
    assert labels == ["5/5", "4/5", "3/5", "2/5", "1/5", "0/5"], out
    assert "1/1" not in out.replace("failure rate of 1/1", "") and "0/1" not in out
    assert "The strictest level 5/5 (λ = 1)" in out


def test_declared_levels_no_k_gives_are_named_by_their_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [{"score": s, "levels": [0, 0.3, 0.9, 1], "label": True} for s in (0.3, 0.9, 1)]
    study = tmp_path / "study.jsonl"
    study.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    code, out, err = calibrate(capsys, "--study", str(study))
    assert code == 0, err
    labels = [line.split()[0] for line in out.splitlines() if line.startswith("  ") and
              len(line.split()) == 8 and line.split()[-1] in ("yes", "no")]  # fmt: skip
    assert labels == ["1", "0.9", "0.3", "0"], out
