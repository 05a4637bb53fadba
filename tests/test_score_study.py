"""The score study's pure parts, the program cache's probe support, and the aligned-gate Task set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import datasets
from benchmarks._draws import SCORE_NAMES, ProbeDraw, aucs, probe_draw
from benchmarks._programs import CachingSandbox, _compact, _expand, result_key
from benchmarks.score_study import (
    NOT_CERTIFIED,
    SplitResult,
    combine,
    level_table,
    ltt_cells,
    run_split,
    summarise_splits,
)
from firstpass.probe import ProbeInputs
from firstpass.sandbox import Limits, parse_spec

T, F = True, False
SPEC = parse_spec(["assert add(1, 2) == 3"], entry_point="add")
INPUTS = ProbeInputs(entry_point="add", args=((0, 5), (2, 2), (-1, 1)), per_input_s=0.1)
ADD = "def add(a, b):\n    return a + b\n"
CONST = "def add(a, b):\n    return 3\n"


# -- one probe ---------------------------------------------------------------------------------


def _probe(
    passed: list[bool],
    gate: list[bool],
    behaviours: list[str | None],
    *,
    n_inputs: int,
    code_keys: str = "abcde",
    shares: list[float] | None = None,
) -> ProbeDraw:
    """One probe of five samples; by default distinct code and a visible share of 1 or 0."""
    if shares is None:
        shares = [1.0 if ok else 0.0 for ok in passed]
    return probe_draw(passed, shares, gate, list(code_keys), behaviours, n_inputs)


def test_agreement_takes_its_candidate_from_the_largest_behaviour_cluster() -> None:
    """All pass, behaviours b,a,a,c,a: agreement 3/5 with candidate 1 (first of cluster a);
    pass_share keys distinct code hashes, so its candidate is sample 0, which the gate rejects."""
    p = _probe([T] * 5, [F, T, T, T, T], ["b", "a", "a", "c", "a"], n_inputs=16)
    assert (p.c, p.g, p.clusters) == (5, 3, (3, 1, 1))
    assert p.scores == pytest.approx(
        {"pass_share": 1.0, "agreement": 0.6, "unanimous_agreement": 0.6}
    )
    assert p.candidates == {"pass_share": 0, "agreement": 1, "unanimous_agreement": 1}
    assert p.labels == {"pass_share": F, "agreement": T, "unanimous_agreement": T}


def test_pass_share_candidate_is_keyed_by_the_code_hash_not_the_behaviour() -> None:
    """Two samples with the same code outrank three with the same behaviour under pass_share."""
    p = _probe([T] * 5, [T, F, F, T, T], ["a", "b", "c", "a", "a"], n_inputs=4, code_keys="xyyzw")
    assert p.candidates["pass_share"] == 1
    assert p.candidates["agreement"] == 0
    assert p.labels["pass_share"] is F and p.labels["agreement"] is T


def test_unanimous_agreement_is_zero_unless_every_sample_passes() -> None:
    """c = 4 of 5 with all four agreeing: agreement 4/5, unanimous 0, failing sample in no cluster."""
    p = _probe([T, T, F, T, T], [T] * 5, ["a"] * 5, n_inputs=8)
    assert p.scores == pytest.approx(
        {"pass_share": 0.8, "agreement": 0.8, "unanimous_agreement": 0.0}
    )
    assert p.clusters == (4,)


def test_without_probe_inputs_all_passing_samples_agree() -> None:
    """No probe input (nothing recorded): every passing sample shares the empty output vector."""
    p = _probe([T, T, F, T, F], [T] * 5, [None] * 5, n_inputs=0)
    assert p.g == 3
    assert p.scores["agreement"] == pytest.approx(0.6)


def test_an_unrecorded_behaviour_agrees_with_nobody() -> None:
    """With probe inputs, a passing sample without a behaviour digest is a cluster of its own."""
    p = _probe([T, T, T, F, F], [T] * 5, [None, None, "a", None, None], n_inputs=5)
    assert p.clusters == (1, 1, 1)
    assert p.scores["agreement"] == pytest.approx(0.2)


def test_with_no_passing_sample_the_candidate_passes_the_most_visible_tests() -> None:
    """c = 0: every score is 0 and the candidate is the best failing sample, ties to the lowest."""
    shares = [0.0, 0.5, 0.5, 0.0, 0.0]
    p = _probe([F] * 5, [F, T, F, F, F], list("abcde"), n_inputs=3, shares=shares)
    assert p.c == 0 and set(p.scores.values()) == {0.0}
    assert set(p.candidates.values()) == {1}


# -- tables ------------------------------------------------------------------------------------


def test_level_table_separates_escalation_and_counts_skips_from_each_level_up() -> None:
    """Escalate = c = 0; level i/k rows are c > 0 draws; skip share at λ counts levels >= λ."""
    c = np.array([[0, 5, 5, 3]])
    score = np.array([[0.0, 1.0, 1.0, 0.6]])
    ok = np.array([[F, T, F, T]])
    rows = level_table(c, score, ok, k=5, reps=50)
    assert rows["escalate"]["share"] == pytest.approx(0.25)
    assert rows["5/5"]["share"] == pytest.approx(0.5) and rows["5/5"]["gate_pass"] == pytest.approx(
        0.5
    )
    assert rows["3/5"]["gate_pass"] == pytest.approx(1.0)
    assert rows["3/5"]["skip_share_at_lambda"] == pytest.approx(0.75)
    assert rows["3/5"]["failure_among_skips_at_lambda"] == pytest.approx(1 / 3)
    assert rows["0/5"]["n"] == 0


def test_auc_over_passing_draws_leaves_out_escalated_ones() -> None:
    """A perfectly separating score among c > 0 draws has AUC 1 there, whatever c = 0 draws do."""
    c = np.array([[0, 5, 5, 2, 2]])
    score = np.array([[0.0, 1.0, 1.0, 0.4, 0.4]])
    ok = np.array([[T, T, T, F, F]])
    a = aucs(c, score, ok)
    assert a["auc_c_pos"] == pytest.approx(1.0)
    assert a["auc"] < 1.0


def test_probe_study_levels_are_the_pass_share_levels_of_the_score_study() -> None:
    """probe_study's c = i rows are score_study's pass_share rows (0/k being "escalate"), with the
    same intervals: one table, two names for the rate."""
    from benchmarks.probe_study import summarise

    rng = np.random.default_rng(3)
    c = rng.integers(0, 6, size=(8, 30))
    ok = rng.random((8, 30)) < 0.3 + 0.1 * c
    probe = summarise(c, ok, k=5, reps=50)["levels"]
    score = level_table(c, c / 5, ok, k=5, reps=50)
    for i in range(6):
        row = score["escalate" if i == 0 else f"{i}/5"]
        mine = probe[f"{i}/5"]
        assert (mine["n"], mine["share"], mine["share_ci"]) == (
            row["n"],
            row["share"],
            row["share_ci"],
        )
        assert (mine["correct"], mine["correct_ci"]) == (row["gate_pass"], row["gate_pass_ci"])


# -- Learn then Test on one split, and over splits -------------------------------------------


def _rows(
    score: list[float], ok: list[bool], c: list[int]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.array(score), np.array(ok, dtype=bool), np.array(c, dtype=np.int64)


def test_a_certified_lambda_is_applied_to_the_held_out_half() -> None:
    """50 clean 5/5 calibration rows certify λ = 1 at α = 0.2; on the test half 6 of 10 skip, one
    of them wrong, the 4 others are gated: 0.4 gate runs against 1.0 uniform."""
    calib = _rows([1.0] * 50 + [0.6] * 10, [T] * 50 + [F] * 10, [5] * 50 + [3] * 10)
    test = _rows([1.0] * 6 + [0.6] * 4, [F] + [T] * 9, [5] * 6 + [3] * 4)
    r = run_split(calib, test, k=5, alpha=0.2, delta=0.05)
    assert r.lam == pytest.approx(1.0) and r.lam_label == "5/5"
    assert r.skip_share == pytest.approx(0.6)
    assert r.served_failure_skips == pytest.approx(1 / 6)
    assert r.served_failure_overall == pytest.approx(0.1)
    assert (r.gate_runs_elastic, r.gate_runs_uniform) == pytest.approx((0.4, 1.0))
    assert r.gate_runs_saved == pytest.approx(0.6)


def test_escalated_requests_never_skip_and_are_never_gated() -> None:
    """c = 0 rows neither skip (whatever their score) nor count as gate runs for either policy."""
    calib = _rows([1.0] * 50, [T] * 50, [5] * 50)
    test = _rows([1.0, 1.0, 0.0, 0.0], [T, T, F, F], [5, 5, 0, 0])
    r = run_split(calib, test, k=5, alpha=0.2, delta=0.05)
    assert r.skip_share == pytest.approx(0.5)
    assert (r.gate_runs_elastic, r.gate_runs_uniform) == pytest.approx((0.0, 0.5))


def test_when_nothing_is_certified_elastic_gates_like_uniform() -> None:
    """A calibration half with 30% failures at 5/5 certifies nothing at α = 0.05: no skip, no saving."""
    calib = _rows([1.0] * 100, [T] * 70 + [F] * 30, [5] * 100)
    test = _rows([1.0] * 10, [T] * 10, [5] * 10)
    r = run_split(calib, test, k=5, alpha=0.05, delta=0.05)
    assert r.lam is None and r.skip_share == 0.0 and r.served_failure_skips is None
    assert r.gate_runs_elastic == r.gate_runs_uniform == 1.0


def _split(lam: float | None, fail: float | None, skip: float = 0.5) -> SplitResult:
    return SplitResult(
        lam=lam,
        lam_label=None if lam is None else f"{round(lam * 5)}/5",
        n_test=100,
        skip_share=skip if lam is not None else 0.0,
        served_failure_skips=fail,
        served_failure_overall=(fail or 0.0) * skip,
        gate_runs_elastic=1.0 - skip if lam is not None else 1.0,
        gate_runs_uniform=1.0,
    )


def test_split_summary_averages_over_certified_splits_and_keeps_the_worst() -> None:
    """2 of 3 splits certified: mean and worst served failure over those two; over all splits the
    uncertified one saves nothing."""
    s = summarise_splits([_split(1.0, 0.1), _split(None, None), _split(0.8, 0.3)])
    assert (s["certified"], s["splits"]) == (2, 3)
    assert s["lambdas"] == {"5/5": 1, "4/5": 1}
    assert s["served_failure_skips_mean"] == pytest.approx(0.2)
    assert s["served_failure_skips_worst"] == pytest.approx(0.3)
    assert s["gate_runs_saved_mean"] == pytest.approx(0.5)
    assert s["gate_runs_saved_all_splits"] == pytest.approx(1 / 3)
    cells = ltt_cells(s)
    assert cells[0] == "2/3" and "30.0%" in cells[3] and NOT_CERTIFIED not in cells


def test_no_certified_split_is_rendered_as_a_result() -> None:
    """With no λ certified in any split the row says so instead of showing numbers."""
    cells = ltt_cells(summarise_splits([_split(None, None)] * 4))
    assert cells[0] == "0/4"
    assert cells[1] == NOT_CERTIFIED
    assert cells[-1] == "0%"


def test_combined_report_has_one_row_per_setting_model_and_score() -> None:
    """The side-by-side report lists strict before aligned and says "not certified" per α."""
    c = np.array([[5, 5, 0, 3]])
    score = np.array([[1.0, 1.0, 0.0, 0.6]])
    ok = np.array([[T, F, F, T]])
    per_score = {**aucs(c, score, ok), "levels": level_table(c, score, ok, k=5, reps=20)}
    summary = summarise_splits([_split(None, None)] * 2)

    def doc(setting: str, model: str) -> dict[str, Any]:
        return {
            "setting": setting,
            "model": model,
            "n_tasks": 1,
            "k": 5,
            "draws": 4,
            "splits": 2,
            "delta": 0.05,
            "alphas": [0.1],
            "pass_at_1": 0.5,
            "visible_pass_but_gate_fails": 0.3,
            "scores": {s: per_score for s in SCORE_NAMES},
            "ltt": {s: {"0.1": summary} for s in SCORE_NAMES},
        }

    md = combine([doc("aligned", "m"), doc("strict", "m")], "cmd")
    rows = [
        ln
        for ln in md.splitlines()
        if ln.startswith("| strict | m |") or ln.startswith("| aligned | m |")
    ]
    ltt_rows = [r for r in rows if NOT_CERTIFIED in r]
    assert len(ltt_rows) == 6
    assert ltt_rows[0].startswith("| strict | m | pass_share |")
    assert ltt_rows[-1].startswith("| aligned | m | unanimous_agreement |")


# -- the program cache with probe inputs ----------------------------------------------------


def test_probe_inputs_change_the_cache_key_and_runs_without_keep_theirs() -> None:
    """A run with probe inputs gets its own key (their digest and limit); one without keeps the old key."""
    plain = result_key(ADD, SPEC)
    assert plain.count(":") == 2  # "<answer sha>:sha256:<spec digest>", as before
    with_probe = result_key(ADD, SPEC, INPUTS)
    assert with_probe.startswith(plain + ":probe:")
    slower = ProbeInputs(entry_point="add", args=INPUTS.args, per_input_s=0.2)
    assert result_key(ADD, SPEC, slower) != with_probe


async def test_cached_results_keep_their_behaviour(tmp_path: Path) -> None:
    """A probe run's behaviour digest survives the cache; a rerun is a hit with the same digest."""
    async with CachingSandbox(
        cache_dir=tmp_path, concurrency=2, limits=Limits(cpu_s=4, wall_s=6)
    ) as sb:
        first = await sb.run_many([ADD, CONST], SPEC, probe=INPUTS)
        plain = await sb.run(ADD, SPEC)
        again = await sb.run_many([ADD, CONST], SPEC, probe=INPUTS)
        assert sb.stats.misses == 3 and sb.stats.hits == 2
    assert first[0].behaviour is not None and first[0].behaviour != first[1].behaviour
    assert [r.behaviour for r in again] == [r.behaviour for r in first]
    assert plain.behaviour is None
    assert _expand(_compact(first[0])).behaviour == first[0].behaviour
    assert "behaviour" not in _compact(plain)


# -- the aligned-gate Task set (needs ../shared/data) -----------------------------------------


@pytest.fixture(scope="module")
def mbpp_root() -> Path:
    root = datasets.data_dir()
    if not (root / "mbpp" / "mbpp.jsonl.gz").exists():
        pytest.skip(
            f"shared data not found at {root}: set FIRSTPASS_DATA to run the aligned-conversion tests"
        )
    return root


@pytest.mark.data
async def test_aligned_tasks_show_two_original_asserts_and_gate_on_all_three(
    mbpp_root: Path,
) -> None:
    """Mbpp/2 is kept with MBPP's asserts 1-2 visible and 1-3 as the gate; Mbpp/596's asserts use
    sys without importing it, so the row's setup imports it; Mbpp/16 (MBPP+ changed the expected
    values) is dropped because the MBPP+ reference fails the original asserts."""
    from firstpass.sandbox import Sandbox

    async with Sandbox(concurrency=2) as sb:
        conv = await datasets.convert_aligned(
            sb, root=mbpp_root, task_ids=["Mbpp/2", "Mbpp/16", "Mbpp/596"]
        )
    rows = {r["task_id"]: r for r in conv.rows}
    assert set(rows) == {"Mbpp/2", "Mbpp/596"}
    original = datasets.load_mbpp_original(mbpp_root)[2]
    assert rows["Mbpp/2"]["visible_tests"] == list(original.asserts[:2])
    assert rows["Mbpp/2"]["hidden_tests"] == list(original.asserts[:3])
    assert rows["Mbpp/2"]["entry_point"] == "similar_elements"
    assert rows["Mbpp/596"]["setup"] == "import sys"
    assert conv.dropped["Mbpp/16"][0] == "reference_fails_original_asserts"
    assert conv.counts() == {
        "not_in_mbpp": 0,
        "fewer_than_3_asserts": 0,
        "reference_fails_original_asserts": 1,
    }
    task = datasets.parse_task(rows["Mbpp/2"])
    assert task.visible.n_tests == 2 and task.hidden.n_tests == 3


@pytest.mark.data
@pytest.mark.timeout(240)
def test_score_study_runs_end_to_end_on_both_settings_and_combines(
    mbpp_root: Path, tmp_path: Path
) -> None:
    """On 3 tasks per setting: per-run JSON with every score's AUC, levels and LTT summary, and a
    combined report with one LTT row per (setting, model, score) and α."""
    from benchmarks import score_study

    data, cache = tmp_path / "data", tmp_path / "cache"
    assert datasets.main(["--out", str(data), "--limit", "3"]) == 0
    assert datasets.main(["--out", str(data), "--limit", "3", "--setting", "aligned"]) == 0
    assert json.loads((data / "conversion-aligned.json").read_text())["setting"] == "aligned"
    outs = []
    for setting, tasks in (("strict", "tasks.jsonl"), ("aligned", "tasks-aligned.jsonl")):
        out = tmp_path / f"{setting}.json"
        argv = [
            "--tasks",
            str(data / tasks),
            "--samples",
            str(data / "samples-deepseek-v3.jsonl"),
            "--setting-name",
            setting,
            "--splits",
            "2",
            "--draws",
            "10",
            "--alphas",
            "0.1,0.2",
            "--json",
            str(out),
            "--no-md",
            "--cache-dir",
            str(cache),
        ]
        assert score_study.main(argv) == 0
        doc = json.loads(out.read_text())
        assert doc["setting"] == setting and doc["n_tasks"] >= 1
        assert set(doc["scores"]) == set(doc["ltt"]) == set(SCORE_NAMES)
        for s in SCORE_NAMES:
            assert set(doc["ltt"][s]) == {"0.1", "0.2"}
            assert doc["ltt"][s]["0.1"]["splits"] == 2
            shares = sum(r["share"] for r in doc["scores"][s]["levels"].values())
            assert shares == pytest.approx(1.0)
        outs.append(out)
    md = tmp_path / "combined.md"
    argv = ["--combine", *map(str, outs), "--md", str(md)]
    assert score_study.main(argv) == 0
    text = md.read_text()
    assert text.count("| strict | deepseek-v3 | agreement |") == 2  # one row per α
    assert text.count("| aligned | deepseek-v3 | unanimous_agreement |") == 2
