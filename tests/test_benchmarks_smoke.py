"""CI's smoke run of the real-data benchmarks: each script on 5 MBPP+ tasks, end to end.

Needs ``../shared/data`` (or ``$FIRSTPASS_DATA``); skipped with a message when it is absent.
The converted 5-task data and the program cache are made once per module in a temp directory.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import (
    ablation,
    checks_bench,
    datasets,
    elastic_vs_uniform,
    probe_study,
    revision_study,
)

pytestmark = [pytest.mark.data, pytest.mark.timeout(240)]

CHEAP = "qwen2.5-coder-32b"
TOP = "deepseek-v3"


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = datasets.data_dir()
    if not (root / "mbppplus" / "MbppPlus.jsonl.gz").exists():
        pytest.skip(
            f"shared data not found at {root}: set FIRSTPASS_DATA to run the benchmark smoke tests"
        )
    out = tmp_path_factory.mktemp("data")
    assert datasets.main(["--out", str(out), "--limit", "5"]) == 0
    return out


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_converter_writes_task_and_sample_sets_in_the_documented_format(converted: Path) -> None:
    """The converter writes tasks.jsonl and one samples-<model>.jsonl per model, documented fields."""
    tasks = _rows(converted / "tasks.jsonl")
    assert 1 <= len(tasks) <= 5
    for row in tasks:
        assert {"task_id", "prompt", "entry_point", "visible_tests", "hidden_tests"} <= set(row)
        assert row["visible_tests"][0].startswith("assert")
        assert row["hidden_tests"]["cases"], "every kept task has hidden cases"
        assert all("expected" in c for c in row["hidden_tests"]["cases"])
    for model in datasets.MODELS:
        samples = _rows(converted / f"samples-{model}.jsonl")
        assert samples and all(r["model"] == model and r["samples"] for r in samples)
    parsed = datasets.load_tasks(converted / "tasks.jsonl")
    assert [t.task_id for t in parsed] == [r["task_id"] for r in tasks]


def test_visible_test_is_the_assert_the_models_were_shown(converted: Path) -> None:
    """Mbpp/2's visible test is the set-based assert from the SpecFix prompt, not MBPP+'s first."""
    tasks = {r["task_id"]: r for r in _rows(converted / "tasks.jsonl")}
    assert tasks["Mbpp/2"]["visible_tests"] == [
        "assert set(similar_elements((3, 4, 5, 6),(5, 7, 4, 10))) == set((4, 5))"
    ]
    assert tasks["Mbpp/2"]["source"]["visible_is_mbppplus_first_assert"] is False


def test_probe_study_json_has_the_regime_table_and_both_aucs(
    converted: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """probe_study writes regimes 0/middle/k with share and correct, shares summing to 1, and AUCs."""
    out = tmp_path / "probe.json"
    study = tmp_path / "study.jsonl"
    argv = [
        "--tasks",
        str(converted / "tasks.jsonl"),
        "--samples",
        str(converted / f"samples-{TOP}.jsonl"),
        "--k",
        "5",
        "--draws",
        "20",
        "--seed",
        "0",
        "--json",
        str(out),
        "--study-out",
        str(study),
        "--no-md",
        "--cache-dir",
        str(cache_dir),
    ]
    assert probe_study.main(argv) == 0
    doc = json.loads(out.read_text())
    assert set(doc["regimes"]) == {"0", "middle", "k"}
    assert sum(r["share"] for r in doc["regimes"].values()) == pytest.approx(1.0)
    for r in doc["regimes"].values():
        assert {"share", "correct"} <= set(r)
    assert "auc_entropy" in doc and "auc_pass_share" in doc
    rows = _rows(study)
    assert len(rows) == doc["n_tasks"]
    assert all(set(r) >= {"k", "pass_count", "label"} and 0 <= r["pass_count"] <= 5 for r in rows)
    # a rerun is answered from the program cache: nothing new runs in the sandbox
    assert probe_study.main(argv) == 0
    assert json.loads(out.read_text())["programs"]["ran"] == 0, sorted(
        p.name for p in cache_dir.iterdir()
    )


def _e2e_argv(converted: Path, cache_dir: Path, out: Path) -> list[str]:
    return [
        "--tasks",
        str(converted / "tasks.jsonl"),
        "--cheap-samples",
        str(converted / f"samples-{CHEAP}.jsonl"),
        "--top-samples",
        str(converted / f"samples-{TOP}.jsonl"),
        "--splits",
        "2",
        "--timing-tasks",
        "2",
        "--json",
        str(out),
        "--no-md",
        "--cache-dir",
        str(cache_dir),
    ]


def test_elastic_vs_uniform_runs_the_pipeline_and_reports_every_baseline(
    converted: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """elastic_vs_uniform reports the three baselines per split, λ per α, and wall-time percentiles."""
    out = tmp_path / "evu.json"
    assert elastic_vs_uniform.main(_e2e_argv(converted, cache_dir, out)) == 0
    doc = json.loads(out.read_text())
    assert len(doc["splits"]) == 2
    for split in doc["splits"]:
        assert {"always-cheap", "always-top", "cascade"} <= set(split["policies"])
        assert set(split["lambda"]) == {"elastic@0.05", "elastic@0.1"}
        assert split["shadow_labels"] == split["n_calibration"], "every shadow receipt is labelled"
        top = split["policies"]["always-top"]
        assert top["gate_runs"] == 0 and top["model_calls"] == 1
        assert split["policies"]["cascade"]["gate_runs"] >= 0.5
    assert {"p50_ms", "p95_ms"} <= set(doc["timing"]["cascade"])


def test_ablation_reports_each_step_against_the_one_before(
    converted: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """ablation runs A, B and C on every split and pairs B with A and C with B."""
    out = tmp_path / "ablation.json"
    assert ablation.main([*_e2e_argv(converted, cache_dir, out), "--no-timing"]) == 0
    doc = json.loads(out.read_text())
    for split in doc["splits"]:
        assert {"A model only", "B + visible tests", "C + gate"} <= set(split["policies"])
        assert split["policies"]["B + visible tests"]["gate_runs"] == 0
        assert {"B + visible tests - A model only", "C + gate - B + visible tests"} <= set(
            split["paired"]
        )
    assert "E + revision loop" in doc["steps"]


def test_revision_study_walks_the_ladder_for_every_r_under_both_check_settings(
    converted: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """revision_study reports r = 0..2 per check setting, paired: more retries never lower the
    cheap rung's pass chance, the gate-as-oracle setting serves nothing wrong as verified."""
    out = tmp_path / "revision.json"
    argv = [
        "--converted",
        str(converted),
        "--ladder",
        f"{CHEAP},{TOP}",
        "--max-r",
        "2",
        "--draws",
        "20",
        "--seed",
        "0",
        "--json",
        str(out),
        "--cache-dir",
        str(cache_dir),
    ]
    assert revision_study.main(argv) == 0
    doc = json.loads(out.read_text())
    (ladder,) = doc["ladders"]
    assert ladder["ladder"] == [CHEAP, TOP] and ladder["n_tasks"] >= 1
    table = ladder["table"]
    every, cheap = revision_study.RETRIES
    assert set(table) == {
        f"{s}|{how}|{r}"
        for s in revision_study.SETTINGS
        for how in revision_study.RETRIES
        for r in range(3)
        if how == every or r > 0
    }
    for setting in revision_study.SETTINGS:
        rows = [table[f"{setting}|{every}|{r}"] for r in range(3)]
        assert rows[0]["served_retry"] == 0 and rows[0]["d_correct"] == 0
        assert rows[0]["rung0_verified"] == rows[0]["first_verified"]
        within = [row["rung0_verified"] for row in rows]
        assert within == sorted(within), "a further attempt on rung 0 can only add passes"
        assert all(1 <= row["calls"] <= 2 * (1 + r) for r, row in enumerate(rows))
        for r in (1, 2):  # the cheap rung retries the same way whether the top rung does or not
            assert table[f"{setting}|{cheap}|{r}"]["rung0_verified"] == rows[r]["rung0_verified"]
    assert all(
        row["wrong_verified"] == 0 for k, row in table.items() if k.startswith("visible+gate")
    )
    assert all(row["gate_runs"] == 0 for k, row in table.items() if k.startswith("visible|"))


@pytest.mark.slow
def test_checks_bench_times_every_kind_and_the_paired_proxy_paths(tmp_path: Path) -> None:
    """checks_bench gives every check its expected verdict, and each end-to-end path is answered
    200 the way it is meant to be (pass-through vs. served after checks)."""
    out = tmp_path / "checks.json"
    argv = [
        "--iters",
        "20",
        "--command-iters",
        "2",
        "--requests",
        "40",
        "--rounds",
        "2",
        "--concurrency",
        "1,4",
        "--json",
        str(out),
    ]
    assert checks_bench.main(argv) == 0
    doc = json.loads(out.read_text())
    assert len(doc["micro"]) >= 8
    for row in doc["micro"]:
        assert row["verdict"] == row["expected"], row["case"]
        assert row["n"] >= 1 and row["p50_us"] > 0
    assert doc["e2e_seen"]["passthrough"] == "200 passthrough"
    for path in checks_bench.PATHS[2:]:
        assert doc["e2e_seen"][path] == "200 served", path
    for by_path in doc["e2e"].values():
        assert set(by_path) == set(checks_bench.PATHS)
        assert all(set(r["statuses"]) == {"200"} for r in by_path.values())


def test_sql_verifier_study_labels_checks_and_reports_every_section(tmp_path: Path) -> None:
    """sql_verifier_study on 5 Spider questions labels all 8 systems, runs the ten checks and
    writes the per-check, cascade, injection and cost sections."""
    from benchmarks import sql_verifier_study

    root = datasets.data_dir()
    if not (root / "spider" / "questions.jsonl").exists():
        pytest.skip(
            f"shared data not found at {root}: set FIRSTPASS_DATA to run the benchmark smoke tests"
        )
    out = tmp_path / "sql.json"
    assert sql_verifier_study.main(["--limit", "5", "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["n_pairs"] == 5 * len(sql_verifier_study.SYSTEMS)
    assert set(doc["checks"]) == set(sql_verifier_study.CHECK_NAMES)
    assert all(row["check_errors"] == 0 for row in doc["checks"].values())
    assert set(doc["cascades"]) == {f"{a} -> {b}" for a, b in sql_verifier_study.CASCADES}
    assert doc["numbers"]["injected"] >= 1
    assert doc["cost"]["off"]["p50_ms"] > 0 and doc["cost"]["on"]["p50_ms"] > 0


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_guarantee_field_quick_calibrates_revokes_on_shift_and_stays_within_its_level(
    tmp_path: Path,
) -> None:
    """guarantee_field --quick, through the real server: a certificate from shadow traffic, every
    shifted repetition revoked (then gating every request) or reported as not revoked, the
    no-shift revoked share and the recalibration exceedance within their levels' CIs, and audits
    that cost gate runs only at a nonzero audit rate. Needs no shared data."""
    from benchmarks import guarantee_field

    out = tmp_path / "guarantee.json"
    assert guarantee_field.main(["--quick", "--seed", "0", "--json", str(out), "--no-md"]) == 0
    doc = json.loads(out.read_text())
    assert {"calibration", "shift", "no_shift", "recalibration", "cost", "runtime_s"} <= set(doc)
    cal = doc["calibration"]
    assert cal["alpha"] == guarantee_field.ALPHA and 0 < cal["lambda"] <= 1
    assert cal["skips"] > 0 and cal["risk_bound"] <= cal["alpha"]
    shift = doc["shift"]
    assert shift["true_rate"] > cal["alpha"]
    server = shift["server"]
    assert server["reps"] == len(server["rows"]) >= 1
    assert server["revoked"] == sum(row["revoked"] for row in server["rows"])
    for row in server["rows"]:
        assert isinstance(row["revoked"], bool)
        if row["revoked"]:
            assert 0 < row["audited_until"] <= row["audited_total"]
            assert row["tail"] > 0 and row["tail_licensed"] == 0, "a revoked licence gates all"
    if server["revoked"]:
        assert server["audited_until_median"] <= server["audited_until_p90"]
    calm = doc["no_shift"]
    assert {row["source"] for row in calm["rows"]} == {"server", "monitor simulation"}
    for row in calm["rows"]:
        assert row["true_rate"] <= cal["alpha"] + 1e-12
        assert row["revoked_ci"][0] <= calm["level"], row
    recal = doc["recalibration"]
    assert recal["ledger"]["ci"][0] <= recal["delta"]
    audited, plain = doc["cost"]["rows"]
    assert audited["audit_rate"] > 0 and plain["audit_rate"] == 0 and plain["audited"] == 0
    assert audited["gate_runs_per_1000"] >= plain["gate_runs_per_1000"]
    assert doc["cost"]["monitor"]["cpu_us_per_update"] > 0


async def test_live_study_revises_with_feedback_retries_without_it_and_pairs_the_arms(
    converted: Path, cache_dir: Path, tmp_path: Path
) -> None:
    """live_study through a real Firstpass against a scripted upstream that answers right only
    when shown its own wrong answer and the feedback: the revision arms succeed, the no-revision
    and retry-without-feedback arms fail on the same tasks (paired Δ +100 points, 2 wins), every
    retry went out without feedback, and the probe lands every task in 0/k."""
    from benchmarks import live_study
    from tests.stub_upstream import Reply, StubUpstream

    # two tasks whose reference answers the hidden tests deterministically (Mbpp/2's returns a
    # tuple in set order, which string hashing changes from process to process)
    rows = [r for r in _rows(converted / "tasks.jsonl") if r["task_id"] != "Mbpp/2"][:2]
    task_ids = [r["task_id"] for r in rows]
    task_file = tmp_path / "tasks.jsonl"
    task_file.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reference = {t.task_id: t.canonical_solution for t in datasets.load_mbppplus()}

    def respond(body: dict[str, Any]) -> Reply:
        msgs = body["messages"]
        if any(m["role"] == "assistant" for m in msgs):  # a revision: shown its failure
            prompt = msgs[0]["content"]
            return Reply.ok(next(reference[t] for t in task_ids if prompts[t] == prompt))
        return Reply.ok("def wrong():\n    return None\n")

    prompts = {r["task_id"]: r["prompt"] for r in rows}
    out = tmp_path / "live.md"
    async with StubUpstream(responder=respond, honours_n=False, models=("m",)) as stub:
        argv = [
            "--base-url", stub.url, "--model", "m", "--honours-n", "no",
            "--task-file", str(task_file), "--order", "file", "--tasks", "2",
            "--k", "2", "--retries", "2", "--cache-dir", str(cache_dir), "--out", str(out),
        ]  # fmt: skip
        assert await asyncio.to_thread(live_study.main, argv) == 0
        sent = [r.body for r in stub.completions]
    doc = json.loads(out.with_suffix(".json").read_text())
    arms = doc["summary"]["arms"]
    assert {a: arms[a]["successes"] for a in live_study.ARMS} == {
        "none": 0, "retry": 0, "revise1": 2, "revise2": 2,
    }  # fmt: skip
    for arm in ("revise1", "revise2"):
        assert arms[arm]["d_success"] == 1.0 and arms[arm]["wins_losses"] == [2, 0]
        assert arms[arm]["revisions"] == 1.0  # one revision, then it passed
        assert arms[arm]["later_verified"] == arms[arm]["later_correct"] == 2
        assert arms[arm]["tokens_out"] > 0 and arms[arm]["cost_usd"] > 0
    assert arms["retry"]["requests"] == 2 * 3 and arms["retry"]["d_success"] == 0.0
    assert arms["retry"]["later_verified"] == arms["none"]["later_verified"] == 0
    without_feedback = [b for b in sent if len(b["messages"]) == 1]
    with_feedback = [b for b in sent if len(b["messages"]) > 1]
    # none/retry: 3 requests a task, revise1/2: a first answer each, probe: k = 2 samples
    assert len(without_feedback) == 2 * (3 + 2 + 2) and len(with_feedback) == 2 * 2
    probe = doc["summary"]["probe"]
    assert probe["k"] == 2 and probe["rows"]["0/k"]["tasks"] == 2
    md = out.read_text()
    assert "Newcombe" in md and doc["meta"]["n_tasks"] == 2 and "m" in json.dumps(doc["meta"])
    # the per-task records are enough to summarise the run again without the model
    again = tmp_path / "again.md"
    assert live_study.main(["--from-json", str(out.with_suffix(".json")), "--out", str(again)]) == 0
    redone = json.loads(again.with_suffix(".json").read_text())
    assert redone["summary"] == doc["summary"]
    assert doc["meta"]["command"] in again.read_text()


def test_live_study_paired_interval_reproduces_the_published_newcombe_example() -> None:
    """The paired success interval is Newcombe's hybrid score interval: Fagerland, Lydersen and
    Laake (2014) report −0.507 to −0.026 for 1 both / 1 first only / 7 second only / 12 neither,
    and McNemar's exact p for 1 vs 7 discordant pairs is 0.0703."""
    from benchmarks.live_study import mcnemar_exact, newcombe_paired

    x = [True] * 2 + [False] * 19
    y = [True, False] + [True] * 7 + [False] * 12
    diff, lo, hi = newcombe_paired(x, y)
    assert (round(diff, 4), round(lo, 3), round(hi, 3)) == (-0.2857, -0.507, -0.026)
    assert round(mcnemar_exact(x, y), 4) == 0.0703


@pytest.mark.parametrize(
    ("flag", "said"),
    [
        (["--tasks", "0"], "--tasks: expected a whole number >= 1"),
        (["--max-tokens", "0"], "--max-tokens: expected a whole number >= 1"),
        (["--price", "garbage"], "--price: expected IN,OUT"),
        (["--base-url", "not-a-url"], "--base-url: expected an http(s) URL"),
        (["--k", "-1"], "--k: expected a whole number >= 0"),
    ],
)
def test_live_study_refuses_a_bad_flag_in_one_line_before_any_run(
    flag: list[str], said: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--tasks 0` once meant every task and `--max-tokens 0` a study of 400s: each bad flag
    is argparse's one-line error now, before a task or a server starts."""
    from benchmarks import live_study

    with pytest.raises(SystemExit) as done:
        live_study.main(["--base-url", "http://127.0.0.1:9/v1", "--model", "m", *flag])
    assert done.value.code == 2
    assert said in capsys.readouterr().err


def test_live_study_names_an_unreadable_file_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from benchmarks import live_study

    (tmp_path / "run.json").write_text("not json")
    assert live_study.main(["--from-json", str(tmp_path / "run.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: JSONDecodeError") and "Traceback" not in err
