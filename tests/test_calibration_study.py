"""Study files are read and validated line by line, and calibrate into the λ their data supports."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from firstpass.calibration import Labelled, Settings, Source, calibrate, read_study
from firstpass.calibration.fit import level_label
from firstpass.errors import CalibrationError


def _write(path: Path, rows: list[dict[str, object] | str]) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows), encoding="utf-8"
    )
    return path


def _rows(
    counts: dict[tuple[int, int], tuple[int, int]], route: str | None = None
) -> list[dict[str, object] | str]:
    """{(k, c): (passed, failed)} -> study rows."""
    out: list[dict[str, object] | str] = []
    for (k, c), (ok, bad) in counts.items():
        for label in [True] * ok + [False] * bad:
            row: dict[str, object] = {"k": k, "pass_count": c, "label": label}
            if route is not None:
                row["route"] = route
            out.append(row)
    return out


def test_study_rows_become_pass_share_scores(tmp_path: Path) -> None:
    """Each row's score is c/k, its failure is label false, blank lines are ignored."""
    path = _write(
        tmp_path / "s.jsonl",
        [
            {"k": 5, "pass_count": 3, "label": True},
            "",
            {"k": 5, "pass_count": 5, "label": False, "task_id": "x"},
        ],
    )
    data = read_study(path)
    assert data.score.tolist() == [0.6, 1.0]
    assert data.failed.tolist() == [False, True]
    assert data.levels().tolist() == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert data.source.lines == 2 and data.score_name == "pass_share"


def test_mixed_k_merges_equal_shares_into_one_level(tmp_path: Path) -> None:
    """With k = 2 and k = 4, 1/2 and 2/4 are one level, and every i/k is a candidate."""
    path = _write(
        tmp_path / "s.jsonl",
        [{"k": 2, "pass_count": 1, "label": True}, {"k": 4, "pass_count": 2, "label": True}],
    )
    data = read_study(path)
    assert data.levels().tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert data.score[0] == data.score[1]
    assert data.single_k() is None


def test_score_rows_use_their_declared_levels(tmp_path: Path) -> None:
    """A row may give a score with its achievable levels instead of a pass count."""
    path = _write(
        tmp_path / "s.jsonl",
        [
            {"score": 0.3333333333, "levels": [0, 1 / 3, 2 / 3, 1], "label": True},
            {"score": 1, "levels": [0, 1 / 3, 2 / 3, 1], "label": False, "k": 3, "pass_count": 3},
        ],
    )
    data = read_study(path)
    assert data.score.tolist() == [1 / 3, 1.0]  # snapped to the declared level
    assert data.pass_count.tolist() == [-1, 3]
    assert data.score_name == "score"


def test_gzip_study_files_are_read(tmp_path: Path) -> None:
    """A .gz study file reads like the plain one."""
    path = tmp_path / "s.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write(json.dumps({"k": 3, "pass_count": 1, "label": False}) + "\n")
    assert read_study(path).failed.tolist() == [True]


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"k": 5, "pass_count": 3, "label": tru}', "line 2: not valid JSON"),
        ("[1, 2]", "line 2: each line must be a JSON object"),
        ('{"k": 5, "pass_count": 3}', 'line 2: "label" must be true or false'),
        ('{"k": 5, "pass_count": 3, "label": "yes"}', 'line 2: "label" must be true or false'),
        (
            '{"k": 0, "pass_count": 0, "label": true}',
            'line 2: "k" must be an integer in [1, 10000]',
        ),
        (
            '{"k": 5, "pass_count": 6, "label": true}',
            'line 2: "pass_count" must be an integer in [0, k=5]',
        ),
        ('{"k": 5, "pass_count": 2.0, "label": true}', 'line 2: "pass_count" must be an integer'),
        ('{"score": 0.5, "label": true}', 'line 2: "score" needs "levels"'),
        (
            '{"score": 0.55, "levels": [0, 0.5, 1], "label": true}',
            'line 2: "score" 0.55 is not one of its',
        ),
        (
            '{"score": 1.5, "levels": [0, 1], "label": true}',
            'line 2: "score" must be a number in [0, 1]',
        ),
        (
            '{"k": 5, "pass_count": 1, "label": true, "route": 7}',
            'line 2: "route" must be a string',
        ),
    ],
)
def test_malformed_rows_are_refused_with_their_line_number(
    tmp_path: Path, line: str, message: str
) -> None:
    """Every malformed row is reported with the file and its 1-based line number."""
    path = _write(tmp_path / "bad.jsonl", [{"k": 5, "pass_count": 3, "label": True}, line])
    with pytest.raises(CalibrationError, match=re.escape("bad.jsonl, " + message)):
        read_study(path)


def test_a_bad_line_deep_in_a_large_file_is_named(tmp_path: Path) -> None:
    """The chunked fast parser still names the exact line of a late error (blank lines counted)."""
    rows: list[dict[str, object] | str] = [{"k": 5, "pass_count": 1, "label": True}] * 150_000
    rows = [*rows[:120_000], "", *rows[120_000:]]
    rows.append('{"k": 5, "pass_count": 1, "label": true')
    path = _write(tmp_path / "big.jsonl", rows)
    with pytest.raises(CalibrationError, match=r"big.jsonl, line 150002: not valid JSON"):
        read_study(path)


def test_an_empty_study_is_refused(tmp_path: Path) -> None:
    """A study file with no rows is an error that says so."""
    path = _write(tmp_path / "empty.jsonl", [""])
    with pytest.raises(CalibrationError, match="no labelled rows"):
        read_study(path)


def test_a_missing_study_file_is_a_clear_error(tmp_path: Path) -> None:
    """A path that does not exist becomes a CalibrationError, not an OSError."""
    with pytest.raises(CalibrationError, match="cannot open"):
        read_study(tmp_path / "nope.jsonl")


def test_lambda_is_the_loosest_level_of_the_certified_prefix(tmp_path: Path) -> None:
    """With many clean k/k and 4/5 rows and a dirty 3/5, λ̂ = 4/5 and the per-level table
    counts skips and failures cumulatively from the strictest level."""
    rows = _rows({(5, 5): (300, 0), (5, 4): (100, 1), (5, 3): (20, 20), (5, 0): (0, 30)})
    fit = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings()).overall
    assert fit.lam == 0.8 and fit.lam_label == "4/5"
    table = {lv.label: (lv.n, lv.failures, lv.certified) for lv in fit.levels}
    assert table["5/5"] == (300, 0, True)
    assert table["4/5"] == (401, 1, True)
    assert table["3/5"] == (441, 21, False)
    assert fit.skipped == 401 and fit.skip_share == pytest.approx(401 / 471)
    assert fit.escalated == 30 and fit.escalate_share == pytest.approx(30 / 471)
    assert "3/5 is not certified" in fit.explanation


def test_nothing_is_certified_without_enough_data_and_the_reason_is_given(tmp_path: Path) -> None:
    """31 clean k/k rows cannot certify α = δ = 0.05: the message says 59 are needed."""
    rows = _rows({(5, 5): (31, 0), (5, 2): (5, 5)})
    fit = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings()).overall
    assert fit.lam is None and fit.skipped == 0
    assert "n ≥ 59 requests at this level are needed for α = 0.05, δ = 0.05" in fit.explanation
    assert "you have 31" in fit.explanation
    assert "keep the verified cascade" in fit.explanation


def test_all_labels_true_certifies_the_loosest_level(tmp_path: Path) -> None:
    """When the gate passes every candidate, every level is certified (0/k still escalates)."""
    rows = _rows({(5, 5): (100, 0), (5, 2): (40, 0), (5, 0): (10, 0)})
    fit = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings()).overall
    assert all(lv.certified for lv in fit.levels)
    # λ̂ stops at the loosest level any calibration row reached: 0/k rows escalate at once
    # (never skip the gate), and 1/5 has no rows, so 2/5 it is
    assert fit.lam == 0.4
    assert fit.skipped == 140


def test_all_labels_false_certifies_nothing(tmp_path: Path) -> None:
    """When the gate rejects every candidate, no level is certified and the AUC is undefined."""
    rows = _rows({(5, 5): (0, 200), (5, 3): (0, 50)})
    fit = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings()).overall
    assert fit.lam is None
    assert fit.auc_one_minus_score.auc is None


def test_a_single_level_can_be_certified(tmp_path: Path) -> None:
    """A score with one achievable level (always 1) certifies λ = 1 with enough clean rows."""
    rows: list[dict[str, object] | str] = [{"score": 1.0, "levels": [1.0], "label": True}] * 60
    fit = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings()).overall
    assert [lv.lam for lv in fit.levels] == [1.0]
    assert fit.lam == 1.0


def test_tied_scores_are_served_or_gated_as_a_block(tmp_path: Path) -> None:
    """λ̂ is always a level, so rows sharing a score all skip the gate or none does."""
    rows = _rows({(4, 4): (200, 2), (4, 3): (150, 6), (4, 2): (30, 15)})
    data = read_study(_write(tmp_path / "s.jsonl", rows))
    fit = calibrate(data, Settings()).overall
    assert fit.lam in data.levels().tolist()
    assert fit.lam is not None
    skip = data.score >= fit.lam
    for level in np.unique(data.score):
        assert len(set(skip[data.score == level].tolist())) == 1


def test_mixed_k_calibrates_on_pass_shares(tmp_path: Path) -> None:
    """Rows with k = 5 and k = 10 calibrate together; levels are labelled as reduced fractions."""
    rows = _rows(
        {(5, 5): (200, 0), (10, 10): (200, 1), (10, 9): (50, 0), (5, 4): (60, 1), (10, 5): (20, 20)}
    )
    fit = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings()).overall
    assert fit.k is None
    assert fit.lam == 0.8 and fit.lam_label == "4/5"
    names = [row.name for row in fit.by_level]
    assert "9/10" in names and "4/5" in names and "5/10" in names  # per pass count, per k


def test_crc_gives_its_own_lambda_and_bound(tmp_path: Path) -> None:
    """CRC admits a level when (m + 1)/(N + 1) ≤ α and reports no p-value."""
    rows = _rows({(5, 5): (90, 1), (5, 3): (5, 4)})
    fit = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings(method="crc")).overall
    assert fit.lam == 1.0  # (1 + 1)/(100 + 1) ≤ 0.05; with the 3/5 rows (5 + 1)/101 > 0.05
    assert fit.levels[0].p_value is None
    assert fit.levels[0].risk_bound == pytest.approx(2 / 101)


def test_holdout_reports_served_failure_on_the_held_out_rows(tmp_path: Path) -> None:
    """With --holdout the λ̂ is learnt on one part and checked on the other, with intervals."""
    rows = _rows({(5, 5): (900, 10), (5, 2): (50, 40)})
    data = read_study(_write(tmp_path / "s.jsonl", rows))
    fit = calibrate(data, Settings(holdout=0.25, seed=3)).overall
    h = fit.holdout
    assert h is not None and fit.n + h.n == data.n and h.n == round(0.25 * data.n)
    assert fit.lam == 1.0
    assert h.skipped == pytest.approx(h.skip_share * h.n)
    assert (
        h.served_failure is not None
        and h.served_failure_ci[0] <= h.served_failure <= h.served_failure_ci[1]
    )
    again = calibrate(data, Settings(holdout=0.25, seed=3)).overall.holdout
    assert again == h  # the split is a function of the seed


def test_by_route_calibrates_each_route_on_its_own_rows(tmp_path: Path) -> None:
    """A route with clean data gets a λ̂, a route with dirty data gets none."""
    rows = _rows({(5, 5): (300, 0)}, route="clean") + _rows({(5, 5): (100, 30)}, route="dirty")
    cal = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings(by_route=True))
    by_name = {fit.route: fit for fit in cal.routes}
    assert by_name["clean"].lam == 1.0 and by_name["clean"].n == 300
    assert by_name["dirty"].lam is None


def test_pass_share_predicts_failure_where_entropy_cannot(tmp_path: Path) -> None:
    """Failures at 0/k and passes at k/k: 1 − c/k separates them perfectly, entropy not at all."""
    rows = _rows({(5, 0): (0, 50), (5, 5): (50, 0)})
    fit = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings()).overall
    assert fit.auc_one_minus_score.auc == 1.0
    assert fit.auc_entropy.auc == 0.5


def test_regimes_describe_zero_middle_and_full_traffic(tmp_path: Path) -> None:
    """The regime table has the 0/k, middle and k/k shares and gate-pass rates."""
    rows = _rows({(5, 0): (1, 9), (5, 3): (15, 5), (5, 5): (69, 1)})
    fit = calibrate(read_study(_write(tmp_path / "s.jsonl", rows)), Settings()).overall
    assert [(r.name, r.n, r.passed) for r in fit.regimes] == [
        ("0/k", 10, 1),
        ("middle", 20, 15),
        ("k/k", 70, 69),
    ]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"method": "bayes"}, "unknown method 'bayes'"),
        ({"alpha": 0.0}, "--alpha must be strictly between 0 and 1"),
        ({"alpha": 1.5}, "--alpha must be strictly between 0 and 1"),
        ({"delta": 1.0}, "--delta must be strictly between 0 and 1"),
        ({"holdout": 1.0}, "--holdout must be a fraction"),
    ],
)
def test_bad_settings_are_refused(settings: dict[str, object], message: str) -> None:
    """Unknown methods and parameters outside (0, 1) raise CalibrationError naming the flag."""
    with pytest.raises(CalibrationError, match=message):
        Settings(**settings)  # type: ignore[arg-type]


def test_level_labels_read_as_fractions() -> None:
    """Levels print as c/k for a known k, reduced fractions otherwise, else as numbers."""
    assert level_label(0.6, 5) == "3/5"
    assert level_label(0.5, None) == "1/2"
    assert level_label(2 / 3, None) == "2/3"
    assert level_label(0.123456789, None) == "0.1235"


def test_data_digest_changes_when_a_label_changes(tmp_path: Path) -> None:
    """The digest identifies the data: same rows same digest, one flipped label a new one."""
    a = _write(tmp_path / "a.jsonl", _rows({(5, 5): (3, 1)}))
    b = _write(tmp_path / "b.jsonl", _rows({(5, 5): (3, 1)}))
    c = _write(tmp_path / "c.jsonl", _rows({(5, 5): (2, 2)}))
    assert read_study(a).digest() == read_study(b).digest() != read_study(c).digest()


def _labelled(cs: list[int], failed: list[bool], k: int) -> Labelled:
    n = len(cs)
    c = np.asarray(cs, dtype=np.int64)
    return Labelled(
        score=c / k,
        failed=np.asarray(failed, dtype=bool),
        k=np.full(n, k, dtype=np.int64),
        pass_count=c,
        route=np.zeros(n, dtype=np.int64),
        route_names=(None,),
        level_set=np.zeros(n, dtype=np.int64),
        level_sets=(tuple(float(v) for v in np.arange(k + 1) / k),),
        score_name="pass_share",
        source=Source(kind="study", paths=("mem",), file_sha256=("",), lines=n, used=n),
    )


@given(
    rows=st.lists(st.tuples(st.integers(0, 4), st.booleans()), min_size=1, max_size=400),
    flip=st.integers(0, 399),
    method=st.sampled_from(["ltt", "crc"]),
    alpha=st.sampled_from([0.05, 0.1, 0.2]),
)
@settings(max_examples=80, deadline=None)
def test_failing_one_more_candidate_never_loosens_the_calibrated_lambda(
    rows: list[tuple[int, bool]], flip: int, method: str, alpha: float
) -> None:
    """End to end (levels, escalation, the no-empty-tail rule): turning one passing row into a
    failing one never gives a looser λ̂."""
    cs = [c for c, _ in rows]
    failed = [f for _, f in rows]
    i = flip % len(rows)
    if failed[i]:
        return
    worse = [*failed[:i], True, *failed[i + 1 :]]
    before = calibrate(_labelled(cs, failed, 4), Settings(method=method, alpha=alpha)).overall.lam
    after = calibrate(_labelled(cs, worse, 4), Settings(method=method, alpha=alpha)).overall.lam
    assert after is None or (before is not None and after >= before)
