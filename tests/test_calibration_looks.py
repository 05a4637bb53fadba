"""Calibrating again without fooling yourself: every calibration that tests a (route, rung) is
a look recorded in the looks ledger, look j is tested at δ_j = δ·6/(π² j²) (Σ δ_j ≤ δ), and the
certificate records its look; repeated looks are warned about."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import recalibration_exceedance as sim
from firstpass.calibration import stats
from firstpass.calibration._looks import delta_at_look
from firstpass.calibration.cli import main
from firstpass.calibration.fit import Settings, calibrate

DELTA = 0.05


def _study(path: Path, top_pass: int, top_fail: int = 0, route: str | None = None) -> Path:
    """A study: ``top_pass``/``top_fail`` rows at 5/5, and a failing tail at 1/5 that never
    certifies (so only 5/5 can)."""
    rows = [(5, True)] * top_pass + [(5, False)] * top_fail + [(1, False)] * 20
    with path.open("w", encoding="utf-8") as fh:
        for c, label in rows:
            row: dict[str, object] = {"k": 5, "pass_count": c, "label": label}
            if route is not None:
                row["route"] = route
            fh.write(json.dumps(row) + "\n")
    return path


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, Any], str]:
    assert main([*argv, "--json"]) == 0
    out, err = capsys.readouterr()
    doc = json.loads(out)
    assert isinstance(doc, dict)
    return doc, err


def _ledger(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_the_looks_share_delta_and_never_spend_more_than_delta() -> None:
    """δ_j = δ·6/(π² j²): the first look gets 0.61·δ, and any number of looks spends ≤ δ."""
    assert delta_at_look(DELTA, 1) == pytest.approx(DELTA * 6 / math.pi**2)
    assert math.fsum(delta_at_look(DELTA, j) for j in range(1, 1_000_001)) <= DELTA
    with pytest.raises(ValueError):
        delta_at_look(DELTA, 0)


def test_calibrating_again_into_the_same_file_is_look_2_at_its_share_of_delta(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """80 passing requests at 5/5 (p = 0.95⁸⁰ = 0.017) certify at a first look (δ_1 = 0.030) but
    not as the second look of a ledger (δ_2 = 0.0076): without the ledger, calibrating again
    after a failed look would certify them at δ."""
    out = tmp_path / "cal.json"
    first, _ = _run(capsys, "--study", str(_study(tmp_path / "a.jsonl", 31)), "--out", str(out))
    assert first["lambda"] is None
    second, err = _run(capsys, "--study", str(_study(tmp_path / "b.jsonl", 80)), "--out", str(out))
    assert second["lambda"] is None and "REPEATED" not in err
    looks = second["looks"]
    assert isinstance(looks, list) and looks[0]["look"] == 2
    assert looks[0]["delta_spent"] == pytest.approx(delta_at_look(DELTA, 2))
    assert looks[0]["spent_before"] == pytest.approx(delta_at_look(DELTA, 1))
    assert second["delta"] == DELTA and second["delta_tested"] == looks[0]["delta_spent"]
    lines = _ledger(tmp_path / "cal.json.looks.jsonl")
    assert [line["look"] for line in lines] == [1, 2]
    assert lines[1]["prev"] == lines[0]["hash"] and lines[1]["certified"] is False
    # the same 80 requests as a first look of a fresh ledger do certify
    fresh, _ = _run(
        capsys, "--study", str(tmp_path / "b.jsonl"), "--out", str(tmp_path / "fresh.json")
    )
    assert fresh["lambda"] == 1.0


def test_the_certificate_records_its_look_and_the_ledger_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A certificate names the look that issued it, the δ it spent, the nominal δ and the hash of
    its ledger line, so a reviewer sees how many looks the 1 − δ was shared among."""
    out = tmp_path / "cal.json"
    _run(capsys, "--study", str(_study(tmp_path / "a.jsonl", 31)), "--out", str(out))
    doc, _ = _run(capsys, "--study", str(_study(tmp_path / "b.jsonl", 200)), "--out", str(out))
    (cert,) = doc["certificates"]
    line = _ledger(tmp_path / "cal.json.looks.jsonl")[1]
    assert cert["looks"] == {
        "look": 2,
        "delta": DELTA,
        "delta_spent": delta_at_look(DELTA, 2),
        "spent_before": delta_at_look(DELTA, 1),
        "spending": "delta * 6 / (pi^2 * look^2)",
        "ledger": str(tmp_path / "cal.json.looks.jsonl"),
        "ledger_line": line["hash"],
        "data": {  # a study: no window, no filters, no times
            "since": None,
            "until": None,
            "route": None,
            "replicas": [],
            "model": None,
            "temperature": None,
            "use_feedback": False,
            "holdout": None,
            "seed": None,
            "data_until": None,
        },
    }
    assert cert["delta"] == DELTA  # what the config compares with the block's delta


def test_rerunning_the_same_calibration_is_the_same_look_and_spends_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The same rows and flags again are the same test with the same outcome: the same look
    number, the same id, and no new ledger line."""
    study, out = _study(tmp_path / "a.jsonl", 200), tmp_path / "cal.json"
    first, _ = _run(capsys, "--study", str(study), "--out", str(out))
    again, err = _run(capsys, "--study", str(study), "--out", str(out))
    assert again["id"] == first["id"] and "look 1 repeated" in err
    assert len(_ledger(tmp_path / "cal.json.looks.jsonl")) == 1


def test_another_seed_on_the_same_rows_is_a_repeated_look_warned_in_report_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--holdout --seed s`` on rows a look already tested is a new look at a smaller δ_j, and
    both the report and the JSON (and stderr, under --json) say it is a repeated look."""
    study, out = _study(tmp_path / "a.jsonl", 200), tmp_path / "cal.json"
    _run(capsys, "--study", str(study), "--out", str(out), "--holdout", "0.3", "--seed", "0")
    doc, err = _run(
        capsys, "--study", str(study), "--out", str(out), "--holdout", "0.3", "--seed", "1"
    )
    (look,) = doc["looks"]
    assert look["look"] == 2 and look["same_data_as"] == [1] and "REPEATED LOOK" in err
    assert main(["--study", str(study), "--out", str(out), "--holdout", "0.3", "--seed", "2"]) == 0
    report = capsys.readouterr().out
    assert "look 3 in" in report and "tested at δ_3 = 0.00338" in report
    assert "WARNING: REPEATED LOOK: look 3 tests the very rows look(s) 1, 2 tested" in report


def test_looks_are_counted_per_route(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With --by-route each route's certificate counts the looks at that route only."""
    a, b = (
        _study(tmp_path / "a.jsonl", 200, route="a"),
        _study(tmp_path / "b.jsonl", 200, route="b"),
    )
    both = tmp_path / "ab.jsonl"
    both.write_text(a.read_text() + b.read_text())
    out = tmp_path / "cal.json"
    _run(capsys, "--study", str(a), "--by-route", "--out", str(out))
    doc, _ = _run(capsys, "--study", str(both), "--by-route", "--out", str(out))
    looks = {entry["route"]: entry["look"] for entry in doc["looks"]}
    assert looks == {"a": 2, "b": 1}


def test_an_edited_ledger_is_refused_naming_the_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ledger line edited (a look's δ or outcome rewritten) or removed stops the run."""
    study, out = _study(tmp_path / "a.jsonl", 31), tmp_path / "cal.json"
    _run(capsys, "--study", str(study), "--out", str(out))
    _run(capsys, "--study", str(_study(tmp_path / "b.jsonl", 40)), "--out", str(out))
    ledger = tmp_path / "cal.json.looks.jsonl"
    lines = ledger.read_text(encoding="utf-8").splitlines()
    ledger.write_text(lines[1] + "\n", encoding="utf-8")  # look 1 removed
    assert main(["--study", str(study), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"looks ledger {ledger} line 1" in err and "does not link" in err


def test_another_delta_on_the_same_ledger_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Raising δ after a failed look would spend more than the ledger planned: refused."""
    out = tmp_path / "cal.json"
    _run(capsys, "--study", str(_study(tmp_path / "a.jsonl", 31)), "--out", str(out))
    argv = ["--study", str(tmp_path / "a.jsonl"), "--out", str(out), "--delta", "0.1"]
    assert main(argv) == 2
    assert "spends δ = 0.05" in capsys.readouterr().err


def test_without_a_ledger_the_run_says_it_is_counted_nowhere(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --out and no --looks: tested as a first look, recorded nowhere, and it says so."""
    monkeypatch.chdir(tmp_path)
    doc, err = _run(capsys, "--study", str(_study(tmp_path / "a.jsonl", 200)))
    (look,) = doc["looks"]
    assert look["look"] is None and look["delta_spent"] == delta_at_look(DELTA, 1)
    assert "no looks ledger" in err and not list(tmp_path.glob("*.looks.jsonl"))


def test_looks_flag_keeps_one_ledger_across_output_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--looks FILE: dated calibration files still share one ledger."""
    ledger = tmp_path / "code.looks.jsonl"
    for i, n in enumerate((31, 40)):
        out = tmp_path / f"cal-{i}.json"
        study = _study(tmp_path / f"s{i}.jsonl", n)
        doc, _ = _run(capsys, "--study", str(study), "--out", str(out), "--looks", str(ledger))
    assert doc["looks"][0]["look"] == 2
    assert not list(tmp_path.glob("cal-*.json.looks.jsonl"))


def test_a_second_look_under_crc_is_warned(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Conformal risk control has no δ to spend: calibrating again with it is warned."""
    out = tmp_path / "cal.json"
    for n in (31, 40):
        study = _study(tmp_path / f"s{n}.jsonl", n)
        _, err = _run(capsys, "--study", str(study), "--out", str(out), "--method", "crc")
    assert "under conformal risk control" in err and "Use --method ltt" in err


def test_calibrate_at_a_look_certifies_as_learn_then_test_at_its_delta() -> None:
    """``fit.calibrate`` with a planned look tests at δ_j (what the simulation's counts do)."""
    rng = np.random.default_rng(7)
    agree = 0
    for j in (1, 2, 5):
        for _ in range(20):
            c, failed = sim._draw(rng, 1500)
            data = sim.labelled(c, failed)
            ledger = sim._ledger()
            for i in range(1, j + 1):
                ref = sim._look(ledger, f"rows:{i}", Settings(), data.n)
            fit = calibrate(data, Settings(), looks={None: ref}).overall
            assert fit.delta == pytest.approx(delta_at_look(DELTA, j))
            n_skip, m_skip = sim._counts(c, failed)
            assert fit.delta is not None
            tests = stats.learn_then_test(n_skip, m_skip, alpha=0.05, delta=fit.delta)
            assert (fit.lam is None) == (tests.selected is None)
            agree += 1
    assert agree == 60


def test_calibrating_every_100_receipts_until_certified_exceeds_delta_naively() -> None:
    """The simulation sees the problem: at a true rate of 0.053 > α, 50 looks at δ each certify
    a wrong λ far more often than δ (the lower end of the 95% interval is above δ)."""
    rate = sim.run("naive", 200, 0, lambda r: sim.every_100(r, ledger=False))
    assert rate.ci[0] > DELTA


def test_calibrating_every_100_receipts_with_the_ledger_keeps_delta() -> None:
    """The documented workflow (each look at its δ_j) certifies a wrong λ at most δ of the time
    (the upper end of the 95% interval is below δ)."""
    rate = sim.run("ledger", 200, 0, lambda r: sim.every_100(r, ledger=True))
    assert rate.ci[1] <= DELTA


# -- every slice that covers a route counts its looks (F4) ------------------------------------


def _mixed(path: Path, rows: list[tuple[str, int, bool]]) -> Path:
    """A study of (route, pass count of 5, label) rows."""
    with path.open("w", encoding="utf-8") as fh:
        for route, c, label in rows:
            fh.write(json.dumps({"k": 5, "pass_count": c, "label": label, "route": route}) + "\n")
    return path


def test_the_same_routes_in_another_order_are_the_same_pooled_slice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Pooled routes are one slice whatever order the data lists them in: inputs reordered are
    look 2, not a fresh look 1."""
    out = tmp_path / "cal.json"
    first = _mixed(tmp_path / "ab.jsonl", [("a", 5, True)] * 20 + [("b", 1, False)] * 20)
    _run(capsys, "--study", str(first), "--out", str(out))
    second = _mixed(tmp_path / "ba.jsonl", [("b", 5, True)] * 30 + [("a", 1, False)] * 20)
    doc, _ = _run(capsys, "--study", str(second), "--out", str(out))
    assert doc["looks"][0]["look"] == 2


def test_a_routes_look_counts_every_pooled_look_that_covered_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A pooled look tested every route it pooled: --by-route afterwards is look 2 of each, and
    pooling again is look 4 (a certificate of route a, pooled or not, is one of the looks at a)."""
    out = tmp_path / "cal.json"
    rows = [("a", 5, True)] * 40 + [("b", 5, True)] * 40 + [("a", 1, False)] * 20
    study = _mixed(tmp_path / "s.jsonl", rows)
    _run(capsys, "--study", str(study), "--out", str(out))
    doc, err = _run(capsys, "--study", str(study), "--out", str(out), "--by-route")
    assert {entry["route"]: entry["look"] for entry in doc["looks"]} == {"a": 2, "b": 2}
    assert "REPEATED LOOK" in err  # the very rows the pooled look tested
    more = _mixed(tmp_path / "t.jsonl", [*rows, ("b", 5, True)])
    doc, _ = _run(capsys, "--study", str(more), "--out", str(out))
    assert doc["looks"][0]["look"] == 4
    assert [line["look"] for line in _ledger(tmp_path / "cal.json.looks.jsonl")] == [1, 2, 2, 4]


def test_a_ledger_cut_behind_the_calibration_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The calibration file records the ledger's head: a ledger whose last lines were cut (or
    that was deleted) no longer holds it, and calibrating into that file again is refused."""
    out = tmp_path / "cal.json"
    _run(capsys, "--study", str(_study(tmp_path / "a.jsonl", 31)), "--out", str(out))
    doc, _ = _run(capsys, "--study", str(_study(tmp_path / "b.jsonl", 40)), "--out", str(out))
    ledger = tmp_path / "cal.json.looks.jsonl"
    lines = ledger.read_text(encoding="utf-8").splitlines(keepends=True)
    assert doc["ledger"] == {"path": str(ledger), "head": json.loads(lines[1])["hash"], "lines": 2}
    again = ["--study", str(_study(tmp_path / "c.jsonl", 80)), "--out", str(out)]
    for cut in (lines[:1], []):
        ledger.write_text("".join(cut), encoding="utf-8")
        assert main(again) == 2
        err = capsys.readouterr().err
        assert f"{out} records 2 looks in {ledger}" in err and "cut" in err


# -- windows and filters on a slice that has looks (F5) ---------------------------------------


def _timed_log(path: Path, day: int, n_pass: int) -> Path:
    """Shadow receipts of route "code", one an hour on 2026-01-<day>: ``n_pass`` at 5/5 that pass
    and 20 at 1/5 that fail."""
    from tests.test_calibration_receipts import shadow, write_chain

    rows = [shadow(5, 5, True)] * n_pass + [shadow(5, 1, False)] * 20
    stamped = [
        {**row, "time": f"2026-01-{day:02d}T{i // 60 % 24:02d}:{i % 60:02d}:00.000Z"}
        for i, row in enumerate(rows)
    ]
    return write_chain(path, stamped)


def test_a_window_on_a_slice_with_looks_must_hold_new_data_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Look j holds at δ_j only for data fixed before its labels are seen: after a look, a
    window (--since/--until, which could be chosen by its labels) is refused unless it starts
    after the newest row every earlier look used."""
    out = tmp_path / "cal.json"
    old = _timed_log(tmp_path / "old.jsonl", 1, 31)
    _run(capsys, "--receipts", str(old), "--out", str(out))
    both = tmp_path / "both.jsonl"
    rows = (
        old.read_text().splitlines()
        + _timed_log(tmp_path / "new.jsonl", 2, 80).read_text().splitlines()
    )
    from tests.test_calibration_receipts import write_chain

    write_chain(both, [{k: v for k, v in json.loads(r).items() if "hash" not in k} for r in rows])
    newest = "2026-01-01T00:50:00.000Z"
    for window in (
        ["--since", "2026-01-01T00:10:00Z"],
        ["--until", "2026-01-02T00:40:00Z"],
        ["--since", newest],  # that row was look 1's
    ):
        assert main(["--receipts", str(both), "--out", str(out), *window]) == 2
        err = capsys.readouterr().err
        assert "new data only" in err and f"--since later than {newest}" in err, err
    doc, _ = _run(capsys, "--receipts", str(both), "--out", str(out), "--since", "2026-01-02")
    assert doc["looks"][0]["look"] == 2
    # all labels up to now is fixed before they are seen: no window, no refusal
    doc, _ = _run(capsys, "--receipts", str(both), "--out", str(out))
    assert doc["looks"][0]["look"] == 3


def test_the_window_and_filters_are_recorded_in_the_ledger_the_json_and_the_certificate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Which rows a look chose (window, route, holdout and seed) and the newest of them are
    written wherever the look is, so a reviewer sees what each look's data was."""
    out = tmp_path / "cal.json"
    log = _timed_log(tmp_path / "log.jsonl", 1, 300)
    argv = ["--receipts", str(log), "--out", str(out), "--route", "code"]
    doc, _ = _run(capsys, *argv, "--since", "2026-01-01T00:05:00Z", "--until", "2026-01-02")
    expected: dict[str, object] = {
        "since": "2026-01-01T00:05:00Z",
        "until": "2026-01-02T00:00:00Z",
        "route": "code",
        "replicas": [],
        "model": None,
        "temperature": None,
        "use_feedback": False,
        "holdout": None,
        "seed": None,
        "data_until": "2026-01-01T05:19:00.000Z",
    }
    (line,) = _ledger(tmp_path / "cal.json.looks.jsonl")
    assert line["data"] == expected
    assert doc["looks"][0]["data"] == expected
    (cert,) = doc["certificates"]
    assert cert["looks"]["data"] == expected


def test_the_readme_states_the_requests_a_first_look_needs() -> None:
    """With 0 failures, a level certifies at look 1 once (1 − α)^n ≤ δ_1: the README's number."""
    from scipy.stats import binom

    need = next(n for n in range(1, 1000) if binom.cdf(0, n, 0.05) <= delta_at_look(DELTA, 1))
    readme = (Path(__file__).parent.parent / "README.md").read_text(encoding="utf-8")
    assert need == 69 and " ".join(readme.split()).count(f"needs at least {need} skipped") == 1


def test_other_replica_chains_after_a_look_need_new_data_too(tmp_path: Path) -> None:
    """--replica picks rows as a window does: the chains earlier looks read may be read again,
    other ones only for rows newer than every earlier look's."""
    from firstpass.calibration._looks import Scope, SliceKey, open_ledger
    from firstpass.errors import CalibrationError

    key, settings = SliceKey(route="code", routes=("code",), rung=0), Settings()
    seen = Scope(replicas=("a",), data_until="2026-01-01T12:00:00.000Z")
    with open_ledger(tmp_path / "looks.jsonl") as ledger:
        ref = ledger.plan(key, "sha256:1", settings, "pass_share", seen)
        ledger.record(
            ref,
            data_digest="sha256:1",
            settings=settings,
            score="pass_share",
            n=1,
            source={},
            lam=None,
        )
    with open_ledger(tmp_path / "looks.jsonl") as ledger:
        assert ledger.plan(key, "sha256:2", settings, "pass_share", seen).look == 2
        with pytest.raises(CalibrationError, match="other --replica chains"):
            ledger.plan(key, "sha256:2", settings, "pass_share", Scope(replicas=("b",)))
        later = Scope(replicas=("b",), since="2026-01-01T12:00:01Z")
        assert ledger.plan(key, "sha256:2", settings, "pass_share", later).look == 2
