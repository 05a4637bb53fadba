"""``firstpass check --kind KIND``: every check kind from the command line, as a user debugging
a gate runs it: per-sub-check output, the ``--json`` shape, exit status 0/1/2, one-line errors.

Most tests run the real CLI in a subprocess; the JSON Schema Test Suite sample runs a handful that
way and every case in-process through ``firstpass.cli.main`` (the same code path, without an
interpreter start per case).
"""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from firstpass.checks._sql import RULES
from firstpass.cli import main
from tests.stub_upstream import Reply, StubUpstream

#: e2e: the tests run `firstpass check` as its own process (the JSON Schema suite's in-process run rides along)
pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "tests" / "data" / "json_schema_suite_sample.json"

ORDER_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "items": {"type": "array", "items": {"type": "string"}},
        "odd: key": {"type": "string"},
    },
    "required": ["id", "items"],
}

#: the fields every --json object has (the result type's), besides `checks`
RESULT_FIELDS = {"name", "kind", "verdict", "passed", "score", "category", "reasons"}


def check(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "firstpass", "check", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )


def as_json(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(proc.stdout)
    assert set(data) >= RESULT_FIELDS, data
    assert "needs_revision" in data and isinstance(data["checks"], list), data
    for entry in data["checks"]:
        assert set(entry) == {"name", "passed", "severity", "reason"}, entry
    return data


def one_line_error(proc: subprocess.CompletedProcess[str], *parts: str) -> None:
    """Exit 2 with one line on stderr naming every part, and no traceback."""
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("firstpass check: "), lines[0]
    for part in parts:
        assert part in lines[0], lines[0]


def write(path: Path, content: object) -> str:
    path.write_text(content if isinstance(content, str) else json.dumps(content), "utf-8")
    return str(path)


# -- tests (the default kind) ----------------------------------------------------------------


def test_tests_kind_takes_answer_as_code_and_adds_the_common_fields_beside_the_old_ones(
    tmp_path: Path,
) -> None:
    """--answer is --code's synonym; --json keeps the sandbox's fields (category stays its finer
    one) and adds the result type's, check_category and one `checks` entry per test."""
    tests = write(tmp_path / "tests.json", ["assert f(1) == 2", "assert f(2) == 2"])
    proc = check("--answer", "-", "--tests", tests, "--json", stdin="def f(x):\n    return x\n")
    assert proc.returncode == 1, proc.stderr
    data = as_json(proc)
    assert (data["kind"], data["verdict"], data["passed"]) == ("tests", "fail", False)
    assert (data["category"], data["check_category"]) == ("assertion_failed", "tests_failed")
    assert (data["n_passed"], data["n_total"], data["score"]) == (1, 2, 0.5)
    assert data["checks"] == [
        {
            "name": "test 0",
            "passed": False,
            "severity": "error",
            "reason": "assertion_failed: assertion failed: f(1) -> 1",
        },
        {"name": "test 1", "passed": True, "severity": "error", "reason": ""},
    ]


def test_code_and_answer_together_are_a_usage_error(tmp_path: Path) -> None:
    answer = write(tmp_path / "a.py", "def f(x): return x")
    tests = write(tmp_path / "t.json", ["assert f(1) == 1"])
    proc = check("--code", answer, "--answer", answer, "--tests", tests)
    one_line_error(proc, "--answer", "not both")


def test_a_missing_answer_or_spec_is_a_usage_error_naming_the_flag(tmp_path: Path) -> None:
    one_line_error(check("--tests", write(tmp_path / "t.json", [])), "--answer: required")
    one_line_error(check("--answer", "-", stdin="x"), "--tests: required with --kind tests")


# -- json_schema -----------------------------------------------------------------------------


def test_a_valid_answer_passes_with_a_parse_and_a_schema_entry(tmp_path: Path) -> None:
    schema = write(tmp_path / "order.schema.json", ORDER_SCHEMA)
    answer = 'Here it is:\n```json\n{"id": 7, "items": ["tea"]}\n```\n'
    proc = check(
        "--kind", "json_schema", "--schema", schema, "--answer", "-", "--json", stdin=answer
    )
    assert proc.returncode == 0, proc.stderr
    data = as_json(proc)
    assert (data["verdict"], data["passed"], data["category"]) == ("pass", True, None)
    assert [(c["name"], c["passed"]) for c in data["checks"]] == [("parse", True), ("schema", True)]


def test_each_violation_is_a_sub_check_named_by_its_json_path(tmp_path: Path) -> None:
    """One entry per violation, named by its path even when a key holds ": "; text mode prints
    one line each and the verdict; exit 1."""
    schema = write(tmp_path / "order.schema.json", ORDER_SCHEMA)
    answer = write(tmp_path / "a.json", {"id": "7", "items": ["tea", 3], "odd: key": 1})
    proc = check("--kind", "json_schema", "--schema", schema, "--answer", answer, "--json")
    assert proc.returncode == 1, proc.stderr
    data = as_json(proc)
    assert (data["verdict"], data["category"], data["needs_revision"]) == (
        "fail",
        "schema_violation",
        True,
    )
    assert data["checks"] == [
        {"name": "parse", "passed": True, "severity": "error", "reason": ""},
        {
            "name": "$.id",
            "passed": False,
            "severity": "error",
            "reason": "'7' is not of type 'integer'",
        },
        {
            "name": "$.items[1]",
            "passed": False,
            "severity": "error",
            "reason": "3 is not of type 'string'",
        },
        {
            "name": "$['odd: key']",
            "passed": False,
            "severity": "error",
            "reason": "1 is not of type 'string'",
        },
    ]
    text = check("--kind", "json_schema", "--schema", schema, "--answer", answer)
    assert text.returncode == 1
    assert text.stdout.splitlines() == [
        "parse: PASS",
        "$.id: FAIL - '7' is not of type 'integer'",
        "$.items[1]: FAIL - 3 is not of type 'string'",
        "$['odd: key']: FAIL - 1 is not of type 'string'",
        "failed (schema_violation): json_schema check 'json_schema', score 0.00",
    ]


def test_an_answer_that_is_not_json_fails_its_parse_entry_only(tmp_path: Path) -> None:
    schema = write(tmp_path / "s.json", {"type": "object"})
    proc = check("--kind", "json_schema", "--schema", schema, "--answer", "-", "--json", stdin="no")
    assert proc.returncode == 1
    data = as_json(proc)
    assert data["category"] == "invalid_format"
    assert [(c["name"], c["passed"]) for c in data["checks"]] == [("parse", False)]


@pytest.mark.parametrize(
    ("schema", "parts"),
    [
        ({"type": "strnig"}, ("--schema: schema.type: not a valid JSON Schema",)),
        ({"properties": {"id": {"minimum": "one"}}}, ("schema.properties.id.minimum",)),
        ({"$schema": "https://example.com/mine"}, ("schema.$schema", "unknown dialect")),
        ("{not json", ("--schema:", "is not JSON")),
    ],
    ids=["bad type", "bad nested keyword", "unknown dialect", "not json"],
)
def test_a_bad_schema_is_a_one_line_error_naming_where(
    tmp_path: Path, schema: object, parts: tuple[str, ...]
) -> None:
    path = write(tmp_path / "bad.schema.json", schema)
    proc = check("--kind", "json_schema", "--schema", path, "--answer", "-", stdin="{}")
    one_line_error(proc, *parts)


# -- basic, regex, context -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "args", "code", "line"),
    [
        ("a long enough answer", ["--min-length", "5"], 0, "basic: PASS"),
        (
            "hi",
            ["--min-length", "5"],
            1,
            "basic: FAIL - the answer has 2 characters; at least 5 needed",
        ),
        ("   \n", [], 1, "basic: FAIL - the answer is empty"),
    ],
    ids=["long enough", "too short", "empty"],
)
def test_basic_checks_length_and_emptiness(
    answer: str, args: list[str], code: int, line: str
) -> None:
    proc = check("--kind", "basic", *args, "--answer", "-", stdin=answer)
    assert proc.returncode == code, proc.stderr
    assert proc.stdout.splitlines()[0] == line


def test_regex_patterns_repeat_and_ignore_case_applies_to_all() -> None:
    answer = "def f():\n    return 1  # todo\n"
    args = ["--kind", "regex", "--must-match", "^def ", "--must-match", "return"]
    passing = check(*args, "--must-not-match", "TODO", "--answer", "-", stdin=answer)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    failing = check(
        *args, "--must-not-match", "TODO", "--ignore-case", "--answer", "-", "--json", stdin=answer
    )
    assert failing.returncode == 1
    data = as_json(failing)
    assert data["category"] == "pattern"
    assert data["checks"] == [
        {
            "name": "regex",
            "passed": False,
            "severity": "error",
            "reason": "matches the forbidden pattern 'TODO'",
        }
    ]


def test_regex_without_a_pattern_or_with_a_broken_one_is_a_usage_error() -> None:
    one_line_error(check("--kind", "regex", "--answer", "-", stdin="x"), "--must-match")
    proc = check("--kind", "regex", "--must-match", "(", "--answer", "-", stdin="x")
    one_line_error(proc, "--must-match: must_match[0]: not a valid regular expression")


def test_context_compares_the_answer_with_each_passage_file(tmp_path: Path) -> None:
    one = write(tmp_path / "p1.txt", "The Eiffel Tower is in Paris and opened in 1889.")
    two = write(tmp_path / "p2.txt", "It is made of wrought iron.")
    ok = check(
        "--kind", "context", "--context", one, "--context", two, "--answer", "-",
        stdin="The Eiffel Tower, in Paris, is wrought iron.",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    off = check(
        "--kind", "context", "--context", one, "--min-overlap", "0.9", "--answer", "-", "--json",
        stdin="The Eiffel Tower is made of cheese from Normandy.",
    )  # fmt: skip
    assert off.returncode == 1
    data = as_json(off)
    assert data["category"] == "context_mismatch"
    assert "normandy" in data["checks"][0]["reason"]


def test_context_without_passages_is_a_usage_error() -> None:
    proc = check("--kind", "context", "--answer", "-", stdin="x")
    one_line_error(proc, "--context: required with --kind context")


# -- command ---------------------------------------------------------------------------------

GRADER = """\
import json, sys
doc = json.load(sys.stdin)
ok = "42" in doc["answer"]
print(json.dumps({"verdict": "pass" if ok else "fail",
                  "reason": "asked: " + doc["request"]["prompt"].strip()}))
"""


def test_command_runs_one_shell_string_or_repeated_arguments_and_sees_the_prompt(
    tmp_path: Path,
) -> None:
    grader = write(tmp_path / "grader.py", GRADER)
    prompt = write(tmp_path / "task.txt", "what is six times seven?\n")
    one_string = shlex.join([sys.executable, "-I", grader])
    ok = check(
        "--kind", "command", "--command", one_string, "--prompt", prompt, "--answer", "-",
        stdin="It is 42.",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines()[0] == "command: PASS - asked: what is six times seven?"
    no = check(
        "--kind", "command", "--command", sys.executable, "--command", grader, "--json",
        "--answer", "-", stdin="It is 41.",
    )  # fmt: skip
    assert no.returncode == 1
    data = as_json(no)
    assert (data["verdict"], data["category"]) == ("fail", "command_rejected")


def test_a_command_that_crashes_abstains_and_so_fails_closed(tmp_path: Path) -> None:
    crash = write(tmp_path / "crash.py", "raise SystemExit(3)\n")
    proc = check(
        "--kind", "command", "--command", sys.executable, "--command", crash, "--answer", "-",
        stdin="x",
    )  # fmt: skip
    assert proc.returncode == 1
    assert proc.stdout.splitlines()[-1].startswith(
        "abstained (check_error; fail_closed, so it counts as a fail)"
    )


@pytest.mark.parametrize(
    ("args", "parts"),
    [
        (["--command", "no-such-grader-anywhere"], ("--command: argv[0]", "not an executable")),
        (["--command", 'grade "unclosed'], ("--command: cannot split",)),
        (["--command", "true", "--timeout", "0"], ("--timeout: expected a number in (0, 3600]",)),
        ([], ("--command: required for a command check",)),
    ],
    ids=["not executable", "unbalanced quote", "bad timeout", "no command"],
)
def test_command_spec_errors_name_the_flag(args: list[str], parts: tuple[str, ...]) -> None:
    one_line_error(check("--kind", "command", *args, "--answer", "-", stdin="x"), *parts)


# -- options of another kind ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--kind", "regex", "--must-match", "x", "--schema", "s.json"], "--schema"),
        (["--must-match", "x"], "--must-match"),
        (["--kind", "basic", "--prompt", "p.txt"], "--prompt"),
        (["--kind", "json_schema", "--schema", "s.json", "--timeout", "3"], "--timeout"),
        (["--kind", "judge", "--judge", "p/m", "--rubric", "r", "--tests", "t.json"], "--tests"),
    ],
    ids=[
        "schema with regex",
        "must-match with tests",
        "prompt with basic",
        "timeout with schema",
        "tests with judge",
    ],
)
def test_an_option_of_another_kind_is_a_usage_error_naming_it(args: list[str], flag: str) -> None:
    proc = check(*args, "--answer", "-", stdin="x")
    one_line_error(proc, f"{flag}: does not apply to")


# -- composite and other definitions from --check ------------------------------------------


def test_a_composite_from_check_gives_one_entry_per_part(tmp_path: Path) -> None:
    """A warning part is shown but does not fail the whole; a failing error part does."""
    gate = write(
        tmp_path / "gate.json",
        {
            "kind": "composite",
            "name": "gate",
            "checks": [
                {"kind": "basic", "min_length": 5},
                {
                    "kind": "regex",
                    "name": "no-todo",
                    "must_not_match": "TODO",
                    "severity": "warning",
                },
                {"kind": "json_schema", "name": "order", "schema": ORDER_SCHEMA},
            ],
        },
    )
    ok = check("--check", gate, "--answer", "-", stdin='{"id": 1, "items": [], "note": "TODO"}')
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.splitlines() == [
        "basic: PASS",
        "no-todo: WARN - matches the forbidden pattern 'TODO'",
        "order: PASS",
        "passed: composite check 'gate', score 0.67",
    ]
    bad = check(
        "--check", gate, "--kind", "composite", "--answer", "-", "--json", stdin='{"id": 1}'
    )
    assert bad.returncode == 1
    data = as_json(bad)
    assert (data["name"], data["kind"], data["category"]) == (
        "gate",
        "composite",
        "schema_violation",
    )
    assert [(c["name"], c["passed"], c["severity"]) for c in data["checks"]] == [
        ("basic", True, "error"),
        ("no-todo", True, "warning"),
        ("order", False, "error"),
    ]
    assert data["checks"][2]["reason"] == "$: 'items' is a required property"


def test_a_single_schema_definition_from_check_gets_the_schema_entries(tmp_path: Path) -> None:
    defn = write(
        tmp_path / "s.json", {"kind": "json_schema", "name": "order", "schema": ORDER_SCHEMA}
    )
    proc = check("--check", defn, "--answer", "-", "--json", stdin='{"id": 1}')
    assert proc.returncode == 1
    assert [c["name"] for c in as_json(proc)["checks"]] == ["parse", "$"]


@pytest.mark.parametrize(
    ("defn", "args", "parts"),
    [
        (
            {"kind": "composite", "checks": [{"kind": "json_schema", "schema": {"type": 5}}]},
            [],
            ("gate.json: checks[0].schema.type: not a valid JSON Schema",),
        ),
        ({"kind": "regex", "must_match": "x"}, ["--kind", "basic"], ("--kind: basic given",)),
        ({"kind": "tests"}, [], ("--check: tests run with --tests FILE",)),
        ({"kind": "basic", "min_lenght": 3}, [], ('did you mean "min_length"',)),
    ],
    ids=["bad nested schema", "kind mismatch", "tests kind", "misspelt option"],
)
def test_a_bad_check_definition_is_a_one_line_error(
    tmp_path: Path, defn: object, args: list[str], parts: tuple[str, ...]
) -> None:
    path = write(tmp_path / "gate.json", defn)
    one_line_error(check("--check", path, *args, "--answer", "-", stdin="x"), *parts)


def test_kind_composite_needs_a_check_file() -> None:
    proc = check("--kind", "composite", "--answer", "-", stdin="x")
    one_line_error(proc, "--check: required with --kind composite")


# -- judge, against a stub upstream ----------------------------------------------------------

JUDGE_CONFIG = """
[[provider]]
id = "stub"
kind = "openai"
base_url = "{url}"
retries = 0

[[route]]
name = "code"
ladder = ["stub/cheap"]

[[price]]
model = "stub/cheap"
input_per_mtok = 0.1
output_per_mtok = 0.1

[[price]]
model = "stub/grader"
input_per_mtok = 1.0
output_per_mtok = 2.0
"""


async def acheck(*args: str, stdin: str = "") -> tuple[int, str, str]:
    """The CLI in a subprocess without blocking the loop the stub upstream serves on."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "firstpass", "check", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE, cwd=ROOT,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), 60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_judge_grades_through_the_configured_provider_and_prints_its_cost(
    tmp_path: Path,
) -> None:
    """The judge's provider and price come from --config; the rubric, the --prompt task and the
    answer reach the stub; the cost (1000 in at $1/M + 200 out at $2/M) is on the result."""
    async with StubUpstream() as stub:
        config = write(tmp_path / "firstpass.toml", JUDGE_CONFIG.format(url=stub.url))
        prompt = write(tmp_path / "task.txt", "Name the capital of France.")
        judge = ["--kind", "judge", "--config", config, "--judge", "stub/grader"]
        judge += ["--rubric", "Names Paris", "--prompt", prompt, "--answer", "-"]
        stub.script(Reply.ok('{"score": 0.9, "reason": "names Paris"}', usage=(1000, 200)))
        code, out, err = await acheck(*judge, "--json", stdin="Paris.")
        assert code == 0, out + err
        data = json.loads(out)
        assert (data["kind"], data["verdict"], data["score"]) == ("judge", "pass", 0.9)
        assert data["cost_usd"] == pytest.approx(0.0014)
        assert data["checks"][0]["name"] == "judge" and data["checks"][0]["passed"] is True
        (request,) = stub.completions
        assert request.model == "grader" and request.body["temperature"] == 0
        user = request.body["messages"][1]["content"]
        assert "Names Paris" in user and "capital of France" in user and "Paris." in user

        stub.script(Reply.ok('{"score": 0.2, "reason": "wrong city"}', usage=(1000, 200)))
        code, out, err = await acheck(*judge, "--min-score", "0.5", stdin="Lyon.")
        assert code == 1, out + err
        assert out.splitlines() == [
            "judge: FAIL - judged 0.2 (at least 0.5 passes): wrong city",
            "failed (judge_rejected): judge check 'judge', score 0.20",
            "judge cost: $0.001400",
        ]


async def test_a_judge_whose_upstream_fails_abstains_and_exits_one(tmp_path: Path) -> None:
    async with StubUpstream() as stub:
        config = write(tmp_path / "firstpass.toml", JUDGE_CONFIG.format(url=stub.url))
        stub.script(Reply.error(500))
        code, out, err = await acheck(
            "--kind", "judge", "--config", config, "--judge", "stub/grader", "--rubric", "r",
            "--answer", "-", stdin="x",
        )  # fmt: skip
        assert code == 1, out + err
        assert "abstained (model_error" in out and "Traceback" not in err


def test_a_judge_on_an_unknown_provider_or_without_a_rubric_is_a_usage_error(
    tmp_path: Path,
) -> None:
    config = write(tmp_path / "firstpass.toml", JUDGE_CONFIG.format(url="http://127.0.0.1:1/v1"))
    base = ["--kind", "judge", "--config", config, "--answer", "-"]
    proc = check(*base, "--judge", "nope/m", "--rubric", "r", stdin="x")
    one_line_error(proc, '--judge: nope/m: no [[provider]] "nope"', "known: stub")
    one_line_error(check(*base, "--judge", "stub/m", stdin="x"), "--rubric: required")
    one_line_error(check(*base, "--judge", "grader", "--rubric", "r", stdin="x"), "--judge:")


# -- the JSON Schema Test Suite (draft 2020-12) sample ---------------------------------------


def suite_cases() -> list[tuple[str, object, object, bool]]:
    groups = json.loads(SUITE.read_text("utf-8"))
    return [
        (f"{g['description']} / {t['description']}", g["schema"], t["data"], t["valid"])
        for g in groups
        for t in g["tests"]
    ]


def test_the_suite_sample_covers_the_keywords_it_claims() -> None:
    text = SUITE.read_text("utf-8")
    for keyword in (
        "type", "required", "properties", "additionalProperties", "enum", "const", "minimum",
        "pattern", "items", "prefixItems", "$ref", "$defs", "anyOf", "oneOf", "not",
        "unevaluatedProperties",
    ):  # fmt: skip
        assert f'"{keyword}"' in text, keyword
    assert len(suite_cases()) >= 100


def run_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], schema: object, data: object
) -> tuple[int, dict[str, Any]]:
    schema_file = write(tmp_path / "schema.json", schema)
    answer_file = write(tmp_path / "answer.json", json.dumps(data))
    argv = ["check", "--kind", "json_schema", "--schema", schema_file]
    code = main([*argv, "--answer", answer_file, "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out else {"error": err})


def test_every_suite_case_gets_the_suites_verdict_in_process(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """All cases through `firstpass check` (cli.main, in-process): exit 0 and a passing `schema`
    entry for valid data, exit 1 with a violation entry per JSON path for invalid data."""
    wrong = []
    for name, schema, data, valid in suite_cases():
        code, result = run_in_process(tmp_path, capsys, schema, data)
        checks = result.get("checks", [])
        if valid:
            ok = code == 0 and [c["name"] for c in checks] == ["parse", "schema"]
        else:
            ok = (
                code == 1
                and result["category"] == "schema_violation"
                and checks[0]
                == {"name": "parse", "passed": True, "severity": "error", "reason": ""}
                and len(checks) > 1
                and all(c["name"].startswith("$") and not c["passed"] for c in checks[1:])
            )
        if not ok:
            wrong.append(f"{name}: exit {code}, {result}")
    assert not wrong, "\n".join(wrong)


def test_a_unicode_property_escape_in_a_pattern_is_accepted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The metaschema's `format: regex` is judged by the engine that runs the patterns, which
    has \\p{Letter} (Python's `re` would refuse the schema)."""
    group = "pattern with Unicode property escape requires unicode mode"
    cases = [c for c in suite_cases() if c[0].split(" / ")[0] == group]
    assert cases
    for _, schema, data, valid in cases:
        code, _ = run_in_process(tmp_path, capsys, schema, data)
        assert code == (0 if valid else 1)


@pytest.mark.parametrize(
    "name",
    [
        "integer type matches integers / a float with zero fractional part is an integer",
        "additionalProperties being false does not allow other properties / an additional property is invalid",
        "items and subitems / wrong sub-item",
        "Recursive references between schemas / invalid tree",
        "remote ref, containing refs itself / remote ref invalid",
        "unevaluatedProperties with if/then/else / when if is false and has unevaluated properties",
    ],
)
def test_suite_cases_as_a_real_subprocess(tmp_path: Path, name: str) -> None:
    """A handful of the cases through the installed entry point, answer on stdin (the remote
    $ref is the draft's own metaschema, which resolves offline)."""
    (case,) = [c for c in suite_cases() if c[0] == name]
    _, schema, data, valid = case
    path = write(tmp_path / "schema.json", schema)
    proc = check(
        "--kind", "json_schema", "--schema", path, "--answer", "-", "--json", stdin=json.dumps(data)
    )
    assert proc.returncode == (0 if valid else 1), proc.stdout + proc.stderr
    assert as_json(proc)["passed"] is valid


# -- sql_evidence ----------------------------------------------------------------------------

#: every check of the kind, in order (the kind's own list: a check added shows up here)
SQL_CHECKS = [name for name, _ in RULES]
COUNT_SINGERS = "SELECT count(*) FROM singer"


def music_db(tmp_path: Path) -> str:
    import sqlite3

    path = tmp_path / "music.sqlite"
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    conn.executescript(
        "CREATE TABLE singer(singer_id INTEGER, name TEXT, country TEXT, age INTEGER);"
        "INSERT INTO singer VALUES (1, 'Ana', 'France', 31), (2, 'Ben', 'France', 45),"
        " (3, 'Cy', 'Spain', 27), (4, 'Dee', 'Spain', 52);"
    )
    conn.commit()
    conn.close()
    return str(path)


def sql_item(sql: str, rows: list[list[object]], elapsed_ms: float = 2.0) -> dict[str, object]:
    return {"sql": sql, "columns": [], "rows": rows, "elapsed_ms": elapsed_ms}


def sql_check(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    answer: str,
    evidence: object,
    *extra: str,
    question: str = "How many singers are there?",
) -> tuple[int, dict[str, Any], str]:
    """`firstpass check --kind sql_evidence ... --json` in-process: (exit, JSON or {}, stderr)."""
    argv = [
        "check", "--kind", "sql_evidence", "--db", music_db(tmp_path), "--question", question,
        "--answer", write(tmp_path / "answer.md", answer),
        "--evidence", write(tmp_path / "evidence.json", evidence), "--json", *extra,
    ]  # fmt: skip
    code = main(argv)
    out, err = capsys.readouterr()
    return code, (json.loads(out) if out.strip() else {}), err


def assert_ten(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    assert set(data) >= RESULT_FIELDS and data["kind"] == "sql_evidence", data
    assert [c["name"] for c in data["checks"]] == SQL_CHECKS
    for entry in data["checks"]:
        assert set(entry) == {"name", "passed", "severity", "reason"}, entry
    return {c["name"]: c for c in data["checks"]}


def test_sql_evidence_lists_all_ten_checks_and_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data, err = sql_check(tmp_path, capsys, "There are 4.", [sql_item(COUNT_SINGERS, [[4]])])
    assert code == 0, err
    checks = assert_ten(data)
    assert data["passed"] is True and data["verdict"] == "pass"
    assert all(c["passed"] for c in checks.values())
    assert checks["tables_exist"] == {
        "name": "tables_exist", "passed": True, "severity": "error", "reason": "",
    }  # fmt: skip
    assert checks["date_group_not_null"]["reason"] == "skipped: no selected expression grouped"
    assert checks["aggregates_attributed"]["reason"].startswith("skipped: ")
    assert checks["aggregate_matches_question"]["severity"] == "warning"


def test_sql_evidence_a_hard_fail_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data, _ = sql_check(tmp_path, capsys, "There are 7.", [sql_item(COUNT_SINGERS, [[4]])])
    assert code == 1
    checks = assert_ten(data)
    assert (data["passed"], data["category"]) == (False, "sql_numbers_in_evidence")
    assert checks["numbers_in_evidence"] == {
        "name": "numbers_in_evidence",
        "passed": False,
        "severity": "error",
        "reason": "the answer states 7, which no result cell holds",
    }
    assert [c["name"] for c in checks.values() if not c["passed"]] == ["numbers_in_evidence"]


def test_sql_evidence_a_warning_alone_exits_0_and_prints_warn(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The question says "average", the SQL sums: a warning, so the check still passes."""
    evidence = [sql_item("SELECT sum(age) FROM singer", [[155]])]
    code, data, _ = sql_check(
        tmp_path, capsys, "155", evidence, question="What is the average age?"
    )
    assert code == 0
    checks = assert_ten(data)
    warned = checks["aggregate_matches_question"]
    assert (warned["passed"], warned["severity"]) == (False, "warning")
    assert "the SQL sums" in warned["reason"]
    # the text output marks it WARN, one line per check and a verdict line
    argv = [
        "check", "--kind", "sql_evidence", "--db", music_db(tmp_path),
        "--question", "What is the average age?", "--answer", str(tmp_path / "answer.md"),
        "--evidence", str(tmp_path / "evidence.json"),
    ]  # fmt: skip
    assert main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(SQL_CHECKS) + 1
    assert lines[5].startswith("aggregate_matches_question: WARN - the question says 'average'")
    assert lines[-1].startswith("passed: sql_evidence check 'sql_evidence'")


def test_sql_evidence_rerun_ms_decides_what_is_rerun(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A recorded 5 where the database says 4, recorded as slow: not rerun by default (the
    sub-check says so), caught with a higher --rerun-ms."""
    evidence = [sql_item(COUNT_SINGERS, [[5]], elapsed_ms=900)]
    code, data, _ = sql_check(tmp_path, capsys, "There are 5.", evidence)
    assert code == 0
    rerun = assert_ten(data)["rerun_matches"]
    assert rerun["passed"] and "skipped: query 0: not cheap (900 ms" in rerun["reason"]
    code, data, _ = sql_check(tmp_path, capsys, "There are 5.", evidence, "--rerun-ms", "1000")
    assert code == 1
    rerun = assert_ten(data)["rerun_matches"]
    assert not rerun["passed"] and "when rerun" in rerun["reason"]


def test_sql_evidence_reads_a_conversations_tool_calls(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    sql = "SELECT count(*) FROM singer WHERE country = 'France'"
    call = {"id": "c1", "type": "function",
            "function": {"name": "sql", "arguments": json.dumps({"sql": sql})}}  # fmt: skip
    conversation: dict[str, list[dict[str, Any]]] = {
        "messages": [
            {"role": "user", "content": "How many singers are from France?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1",
             "content": json.dumps({"columns": ["n"], "rows": [[2]], "elapsed_ms": 1})},
        ]
    }  # fmt: skip
    argv = [
        "check", "--kind", "sql_evidence", "--db", music_db(tmp_path),
        "--answer", write(tmp_path / "a.md", "Two: 2 singers."),
        "--evidence", write(tmp_path / "conv.json", conversation), "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    checks = assert_ten(json.loads(capsys.readouterr().out))
    assert checks["rerun_matches"]["reason"] == ""  # rerun, and matched
    # the same conversation with a lie in the tool's answer
    conversation["messages"][2]["content"] = json.dumps({"rows": [[3]], "elapsed_ms": 1})
    write(tmp_path / "conv.json", conversation)
    assert main(argv) == 1
    assert not assert_ten(json.loads(capsys.readouterr().out))["rerun_matches"]["passed"]


def test_sql_evidence_without_queries_fails_as_no_evidence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, data, _ = sql_check(tmp_path, capsys, "There are 4.", [])
    assert code == 1
    assert (data["passed"], data["category"]) == (False, "sql_no_evidence")
    assert any("no SQL evidence" in r for r in data["reasons"])
    # every check is still named, each saying why it did not run
    assert [c["name"] for c in data["checks"]] == SQL_CHECKS
    assert all(c["reason"] == "skipped: no evidence to check" for c in data["checks"])


@pytest.mark.parametrize(
    ("change", "parts"),
    [
        ({"db": "missing.sqlite"}, ("--db:", "missing.sqlite", "is not a SQLite file")),
        ({"db": None}, ("--db: required with --kind sql_evidence",)),
        ({"evidence": None}, ("--evidence: required with --kind sql_evidence",)),
        ({"evidence_text": "[{"}, ("--evidence:", "is not JSON")),
        ({"evidence_text": '[{"sql": ""}]'}, ("--evidence: [0].sql: expected the query's SQL",)),
        ({"evidence_text": '[{"sql": "SELECT 1", "rows": 3}]'}, ("--evidence: [0].rows:",)),
        ({"evidence_text": '{"queries": []}'}, ("--evidence: unknown key 'queries'",)),
        ({"evidence_text": '"SELECT 1"'}, ("--evidence:", "expected a list")),
        ({"rerun_ms": "-1"}, ("--rerun-ms: expected a number in (0, 60000]",)),
        ({"extra": ["--schema", "x.json"]}, ("--schema: does not apply to --kind sql_evidence",)),
        ({"extra": ["--prompt", "q.txt"]}, ("--question", "not both")),
    ],
)
def test_sql_evidence_bad_input_is_a_one_line_usage_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    change: dict[str, Any],
    parts: tuple[str, ...],
) -> None:
    db: str | None = music_db(tmp_path)
    if "db" in change:
        db = None if change["db"] is None else str(tmp_path / change["db"])
    evidence: str | None = write(tmp_path / "ev.json", [sql_item(COUNT_SINGERS, [[4]])])
    if "evidence" in change:
        evidence = None
    if "evidence_text" in change:
        evidence = write(tmp_path / "ev.json", change["evidence_text"])
    write(tmp_path / "q.txt", "How many singers?")
    argv = ["check", "--kind", "sql_evidence", "--question", "How many singers?",
            "--answer", write(tmp_path / "a.md", "4")]  # fmt: skip
    argv += ["--db", db] if db is not None else []
    argv += ["--evidence", evidence] if evidence is not None else []
    argv += ["--rerun-ms", change["rerun_ms"]] if "rerun_ms" in change else []
    argv += [a if a != "q.txt" else str(tmp_path / a) for a in change.get("extra", [])]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("firstpass check: "), err
    for part in parts:
        assert part in lines[0], lines[0]


def test_sql_evidence_from_a_check_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    definition = write(
        tmp_path / "gate.json", {"kind": "sql_evidence", "database": music_db(tmp_path)}
    )
    argv = [
        "check", "--check", definition, "--question", "How many singers?",
        "--answer", write(tmp_path / "a.md", "There are 4."),
        "--evidence", write(tmp_path / "ev.json", [sql_item(COUNT_SINGERS, [[4]])]), "--json",
    ]  # fmt: skip
    assert main(argv) == 0
    assert_ten(json.loads(capsys.readouterr().out))


def test_sql_evidence_as_a_real_subprocess_with_evidence_on_stdin(tmp_path: Path) -> None:
    sql = "SELECT count(*) FROM singer WHERE country = 'france'"
    proc = check(
        "--kind", "sql_evidence", "--db", music_db(tmp_path),
        "--question", "How many singers are from France?",
        "--answer", write(tmp_path / "a.md", "None: 0 singers."),
        "--evidence", "-", "--json",
        stdin=json.dumps([sql_item(sql, [[0]])]),
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    data = as_json(proc)
    checks = assert_ten(data)
    assert data["category"] == "sql_string_filter_case"
    assert checks["string_filter_case"]["passed"] is False
    assert "matches no row, but 2 rows" in checks["string_filter_case"]["reason"]
