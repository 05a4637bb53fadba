"""The bundled demo data set is what it claims: checked by running every answer, not by trust.

Code runs in a plain ``python -I -S`` subprocess (never in the test process), independent of the
sandbox module, so these checks hold even while the sandbox changes.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
import subprocess
import sys
from typing import Any

import pytest

from tests import demo_dataset as dataset
from tests.demo_dataset import CHEAP, STRONG, TASKS, DemoTask

#: runs in the child: exec each code in a fresh namespace, then the visible asserts and the cases
_HARNESS = r"""
import copy, json, sys

def strict_eq(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(strict_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(strict_eq(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b

job = json.load(sys.stdin)
results = []
for code in job["codes"]:
    ns = {"__name__": "__demo__"}
    res = {"visible": [], "hidden": [], "outputs": []}
    try:
        if job["setup"]:
            exec(job["setup"], ns)
        exec(code, ns)
    except BaseException as exc:
        res["error"] = repr(exc)
        res["visible"] = [False] * len(job["visible"])
        res["hidden"] = [False] * len(job["cases"])
        results.append(res)
        continue
    for line in job["visible"]:
        try:
            exec(line, dict(ns))
            res["visible"].append(True)
        except BaseException:
            res["visible"].append(False)
    fn = ns.get(job["entry_point"])
    for case in job["cases"]:
        try:
            got = json.loads(json.dumps(fn(*copy.deepcopy(case["args"]))))
        except BaseException as exc:
            res["outputs"].append({"raised": repr(exc)})
            res["hidden"].append(False)
            continue
        res["outputs"].append(got)
        res["hidden"].append(strict_eq(got, case["expected"]))
    results.append(res)
json.dump(results, sys.stdout)
"""

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract(answer: str, entry_point: str) -> str | None:
    """The fenced block defining the entry point, else the first block, else None."""
    blocks = _FENCE.findall(answer)
    for block in blocks:
        if re.search(rf"\bdef {re.escape(entry_point)}\b", block):
            return str(block)
    return str(blocks[0]) if blocks else None


def run_task(task: DemoTask, codes: list[str]) -> list[dict[str, Any]]:
    """Run each code against the task's tests in one isolated child interpreter."""
    job = {
        "setup": task.setup,
        "visible": list(task.visible_tests),
        "entry_point": task.entry_point,
        "cases": task.hidden_tests["cases"],
        "codes": codes,
    }
    proc = subprocess.run(
        [sys.executable, "-I", "-S", "-c", _HARNESS],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        timeout=60,
        env={},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    results: list[dict[str, Any]] = json.loads(proc.stdout)
    return results


def _ids(task: DemoTask) -> str:
    return f"{task.task_id}:{task.entry_point}"


@pytest.fixture(scope="module")
def outcomes() -> dict[str, list[dict[str, Any]]]:
    """Reference first, then demo-cheap's answers, then demo-strong's, per task."""
    out = {}
    for task in TASKS:
        codes = [task.reference]
        for sample in (*task.cheap, *task.strong):
            code = extract(sample.text, task.entry_point)
            codes.append(code if code is not None else "")
        out[task.task_id] = run_task(task, codes)
    return out


def test_shipped_files_equal_the_generator_output() -> None:
    """tasks.jsonl and samples.jsonl are exactly what `--write` would produce now."""
    assert dataset.TASKS_PATH.read_text("utf-8") == dataset.render_tasks()
    assert dataset.SAMPLES_PATH.read_text("utf-8") == dataset.render_samples()
    assert dataset.main(["--check"]) == 0


@pytest.mark.parametrize("task", TASKS, ids=_ids)
def test_every_expected_value_is_what_the_reference_returns(
    task: DemoTask, outcomes: dict[str, list[dict[str, Any]]]
) -> None:
    """Each hidden case's expected value equals the reference solution's output (strict types)."""
    reference = outcomes[task.task_id][0]
    assert "error" not in reference
    expected = [case["expected"] for case in task.hidden_tests["cases"]]
    assert reference["outputs"] == expected
    assert all(reference["hidden"]), reference["outputs"]


@pytest.mark.parametrize("task", TASKS, ids=_ids)
def test_the_reference_passes_the_visible_tests(
    task: DemoTask, outcomes: dict[str, list[dict[str, Any]]]
) -> None:
    """The asserts shown in the prompt hold for the reference solution."""
    assert all(outcomes[task.task_id][0]["visible"])


@pytest.mark.parametrize("task", TASKS, ids=_ids)
def test_each_answer_passes_and_fails_as_labelled(
    task: DemoTask, outcomes: dict[str, list[dict[str, Any]]]
) -> None:
    """correct passes all; hidden_fail passes visible only; visible_fail, no_code pass neither."""
    samples = [(CHEAP, s) for s in task.cheap] + [(STRONG, s) for s in task.strong]
    for index, ((model, sample), result) in enumerate(
        zip(samples, outcomes[task.task_id][1:], strict=True)
    ):
        where = f"{task.task_id} {model} sample {index % 8} ({sample.label})"
        visible, hidden = all(result["visible"]), all(result["hidden"])
        wanted = {
            "correct": (True, True),
            "hidden_fail": (True, False),
            "visible_fail": (False, False),
            "no_code": (False, False),
        }[sample.label]
        assert (visible, hidden) == wanted, f"{where}: outputs {result['outputs']}"


@pytest.mark.parametrize("task", TASKS, ids=_ids)
def test_no_code_answers_hold_no_code_and_code_answers_hold_one_block(task: DemoTask) -> None:
    """Prose answers have no fence and do not parse as Python; the others define the entry point."""
    for sample in (*task.cheap, *task.strong):
        code = extract(sample.text, task.entry_point)
        if sample.label == "no_code":
            assert code is None
            with pytest.raises(SyntaxError):
                ast.parse(sample.text)
        else:
            assert code is not None
            assert len(_FENCE.findall(sample.text)) == 1
            assert f"def {task.entry_point}(" in code
            assert sample.text.strip() != code.strip(), "a chat answer has prose around the code"


def test_task_rows_carry_the_documented_fields() -> None:
    """Each task row has a demo/N id, a prompt showing its visible asserts, 6–15 hidden cases."""
    rows = dataset.read_tasks()
    assert [row["task_id"] for row in rows] == [f"demo/{i}" for i in range(1, len(rows) + 1)]
    assert 10 <= len(rows) <= 15
    for row in rows:
        assert set(row) <= {
            "task_id", "prompt", "entry_point", "visible_tests", "hidden_tests", "setup",
            "demo_note",
        }  # fmt: skip
        assert 1 <= len(row["visible_tests"]) <= 2
        for line in row["visible_tests"]:
            assert line.startswith("assert ") and line in row["prompt"]
        assert "```python" in row["prompt"]
        hidden = row["hidden_tests"]
        assert hidden["entry_point"] == row["entry_point"] and hidden["atol"] == 0
        assert 6 <= len(hidden["cases"]) <= 15
        assert row["demo_note"].startswith("cascade: ")


def test_the_reference_solution_is_never_in_a_prompt() -> None:
    """What the demo client sends a model never contains our reference solution."""
    for task in TASKS:
        assert task.reference.strip() not in task.prompt


def test_sample_rows_find_their_task_by_id_and_by_prompt_hash() -> None:
    """samples.jsonl has ≥ 8 answers per (task, model), keyed by task id and prompt SHA-256."""
    tasks = {row["task_id"]: row for row in dataset.read_tasks()}
    with dataset.SAMPLES_PATH.open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh]
    assert {(r["task_id"], r["model"]) for r in rows} == {
        (t, m) for t in tasks for m in (CHEAP, STRONG)
    }
    for row in rows:
        assert len(row["samples"]) >= 8
        prompt = tasks[row["task_id"]]["prompt"]
        assert row["prompt_sha256"] == hashlib.sha256(prompt.strip().encode()).hexdigest()


def _cheap_regime(task: DemoTask, k: int = 5) -> str:
    """The elastic regime every k-draw (without replacement) from demo-cheap's answers gets."""
    n = len(task.cheap)
    passing = sum(s.label in ("correct", "hidden_fail") for s in task.cheap)
    low, high = max(0, k - (n - passing)), min(k, passing)
    if high == 0:
        return "0/k"
    if low == k:
        return "k/k"
    assert low >= 1 and high <= k - 1, f"{task.task_id}: pass count not fixed by the labels"
    return "middle"


def test_labels_give_each_task_the_outcome_its_note_states() -> None:
    """The label arrangement forces the regime and cascade outcome each task's intent names."""
    for task in TASKS:
        cheap = {s.label for s in task.cheap}
        strong = {s.label for s in task.strong}
        regime = _cheap_regime(task)
        if task.intent == "serve":
            assert cheap == {"correct"} and regime == "k/k"
        elif task.intent == "escalate_visible":
            assert cheap <= {"visible_fail", "no_code"} and strong == {"correct"}
        elif task.intent == "escalate_gate":
            assert cheap == {"hidden_fail"} and strong == {"correct"} and regime == "k/k"
        elif task.intent == "mixed_gate_pass":
            passing = {s.label for s in task.cheap if s.label in ("correct", "hidden_fail")}
            assert passing == {"correct"} and regime == "middle" and strong == {"correct"}
        elif task.intent == "mixed_gate_fail":
            passing = {s.label for s in task.cheap if s.label in ("correct", "hidden_fail")}
            assert passing == {"hidden_fail"} and regime == "middle" and strong == {"correct"}
        else:
            assert task.intent == "exhausted" and "correct" not in cheap | strong
            assert "hidden_fail" in strong, "exhaustion should still have an answer to serve"


def test_the_demo_shows_every_cascade_outcome_and_every_elastic_regime() -> None:
    """Cheap serves, both kinds of escalation, exhaustion, and 0/k, middle and k/k all occur."""
    intents = {task.intent for task in TASKS}
    assert {"serve", "escalate_visible", "escalate_gate", "exhausted"} <= intents
    assert {"mixed_gate_pass", "mixed_gate_fail"} <= intents
    assert {_cheap_regime(task) for task in TASKS} == {"0/k", "middle", "k/k"}
    labels = {s.label for task in TASKS for s in (*task.cheap, *task.strong)}
    assert labels == set(dataset.LABELS)


def test_the_data_says_it_is_demo_data_written_by_firstpass() -> None:
    """Nobody can mistake the set for a benchmark: the module says what it is."""
    assert dataset.__doc__ is not None
    assert "DEMO DATA WRITTEN BY FIRSTPASS, NOT A BENCHMARK" in dataset.__doc__
