"""Each check kind's passing and failing shapes, through the public ``firstpass.checks`` API."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from firstpass.checks import (
    BasicCheck,
    CheckRequest,
    CheckResult,
    CommandCheck,
    Composite,
    ContextCheck,
    JsonSchemaCheck,
    Options,
    RegexCheck,
    _schema,
    build_check,
    combine,
    extract_json,
    parse_check,
    pattern_cost_problem,
    request_patterns_problem,
)
from firstpass.errors import CheckSpecError

REQ = CheckRequest(prompt="task")


@pytest.fixture(autouse=True)
def _loop_never_blocks(request: pytest.FixtureRequest) -> object:
    """Every async test here fails if a check blocks the event loop (``blockbuster``)."""
    code = getattr(request.node.obj, "__code__", None)
    if not request.node.get_closest_marker("asyncio") and not (
        code is not None and code.co_flags & 0x80
    ):  # not a coroutine function: nothing runs on a loop
        return None
    return request.getfixturevalue("blockbuster")


def opts(name: str = "c", **kw: object) -> Options:
    return Options(name=name, **kw)  # type: ignore[arg-type]


# -- the result type -------------------------------------------------------------------------


def test_an_abstention_passes_only_when_the_check_fails_open() -> None:
    closed = CheckResult(name="x", kind="command", verdict="abstain", score=0.0)
    opened = CheckResult(
        name="x", kind="command", verdict="abstain", score=0.0, on_abstain="fail_open"
    )
    assert not closed.passed and opened.passed


@pytest.mark.parametrize("score", [float("nan"), -0.1, 1.5])
def test_a_score_outside_zero_to_one_is_refused(score: float) -> None:
    with pytest.raises(ValueError, match="score"):
        CheckResult(name="x", kind="basic", verdict="pass", score=score)


def test_an_unknown_category_is_refused() -> None:
    with pytest.raises(ValueError, match="category"):
        CheckResult(name="x", kind="basic", verdict="fail", score=0.0, category="bad_vibes")


def test_thousands_of_reasons_are_capped_for_receipts_and_prompts() -> None:
    r = CheckResult(
        name="x", kind="json_schema", verdict="fail", score=0.0, reasons=("y" * 900,) * 50
    )
    assert len(r.reasons) == 21 and r.reasons[-1] == "... and 30 more"
    assert all(len(x) <= 500 for x in r.reasons)


def _result(passed: bool, severity: str = "error", score: float = 0.5) -> CheckResult:
    return CheckResult(
        name=f"p{score}",
        kind="basic",
        verdict="pass" if passed else "fail",
        score=score,
        category=None if passed else "empty",
        severity=severity,  # type: ignore[arg-type]
        reasons=() if passed else ("why",),
    )


@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from(["error", "warning"])), min_size=1, max_size=6
    )
)
def test_all_mode_passes_exactly_when_no_error_severity_part_fails(
    parts: list[tuple[bool, str]],
) -> None:
    results = [_result(p, s) for p, s in parts]
    combined = combine("all", results)
    expected = all(p for p, s in parts if s == "error")  # warnings never fail it
    assert combined.passed is expected
    assert combined.score == pytest.approx(sum(r.score for r in results) / len(results))
    assert len(combined.parts) == len(results)


def test_any_mode_passes_when_one_part_passes_and_reasons_concatenate() -> None:
    combined = combine("either", [_result(False), _result(True, score=1.0)], mode="any")
    assert combined.passed and combined.reasons == ("p0.5: why",)
    assert not combine("either", [_result(False), _result(False)], mode="any").passed


# -- basic and regex -------------------------------------------------------------------------


async def test_basic_fails_an_empty_and_a_short_answer_with_their_categories() -> None:
    check = BasicCheck(options=opts(), min_length=10)
    assert (await check.run("   \n", REQ)).category == "empty"
    short = await check.run("tiny", REQ)
    assert short.category == "too_short" and short.score == pytest.approx(0.4)
    assert (await check.run("long enough answer", REQ)).passed


async def test_regex_must_and_must_not_match() -> None:
    check = RegexCheck(
        options=opts(), must_match=[r"^\d{4}-\d{2}-\d{2}$"], must_not_match="1999", multiline=True
    )
    assert (await check.run("date:\n2024-01-31", REQ)).passed
    bad = await check.run("1999-01-01", REQ)
    assert not bad.passed and bad.category == "pattern" and "forbidden" in bad.reason


async def test_a_catastrophic_pattern_abstains_within_its_time_limit() -> None:
    """Unguarded, the search would run for ages; it stops at its time limit with a timeout
    verdict, having used about that much CPU (CPU time: a loaded machine cannot trip it)."""
    check = RegexCheck(options=opts(), must_match=r"^(a|aa)+$")
    cpu = time.process_time()
    result = await check.run("a" * 64 + "b", REQ)
    assert time.process_time() - cpu < 5
    assert result.verdict == "abstain" and result.category == "timeout" and not result.passed


# -- context ---------------------------------------------------------------------------------


async def test_context_passes_an_answer_grounded_in_its_context() -> None:
    req = CheckRequest(context=("The Eiffel Tower is 330 metres tall and stands in Paris.",))
    check = ContextCheck(options=opts())
    assert (await check.run("The Eiffel Tower stands 330 metres tall, in Paris.", req)).passed
    off = await check.run("Bananas contain potassium and grow in tropical plantations.", req)
    assert not off.passed and off.category == "context_mismatch" and "bananas" in off.reason


async def test_context_without_context_passes_and_says_it_verified_nothing() -> None:
    result = await ContextCheck(options=opts()).run("anything", REQ)
    assert result.passed and "not a verification" in result.reason
    strict = await ContextCheck(options=opts(), require_context=True).run("anything", REQ)
    assert not strict.passed and strict.category == "no_context"


# -- json_schema -----------------------------------------------------------------------------


def test_extract_json_takes_the_whole_answer_or_its_one_fenced_block() -> None:
    assert extract_json('{"a": 1}') == (True, {"a": 1})
    assert extract_json('Here:\n```json\n{"b": 2}\n```\nDone.') == (True, {"b": 2})
    assert extract_json("no json") == (
        False,
        "the answer is not JSON (nor does a fenced block hold JSON)",
    )
    # two blocks: which one is the answer is ambiguous, so neither is
    found, why = extract_json('```\n[1]\n```\nor\n```json\n{"b": 2}\n```')
    assert isinstance(why, str)  # a reason, not a value
    assert not found and "2 fenced blocks" in why


@pytest.mark.parametrize(
    ("answer", "words"),
    [
        ('{"price": NaN}', "NaN is not JSON"),
        ('{"price": Infinity}', "Infinity is not JSON"),
        ('{"id": 1, "id": "x"}', "appears twice"),
    ],
)
async def test_text_python_parses_but_json_forbids_is_invalid_format(
    answer: str, words: str
) -> None:
    """NaN passes every numeric bound and a duplicate key hides its first value."""
    check = JsonSchemaCheck(options=opts(), schema={"properties": {"price": {"maximum": 10}}})
    result = await check.run(answer, REQ)
    assert not result.passed and result.category == "invalid_format" and words in result.reason


async def test_schema_violations_each_get_a_reason_with_its_json_path() -> None:
    schema = {
        "type": "object",
        "properties": {"rows": {"type": "array", "items": {"type": "integer"}}},
        "required": ["rows", "total"],
    }
    check = JsonSchemaCheck(options=opts(), schema=schema)
    result = await check.run('{"rows": [1, "two", 3.5]}', REQ)
    assert result.category == "schema_violation" and result.needs_revision
    assert sorted(result.reasons) == sorted(
        [
            "$: 'total' is a required property",
            "$.rows[1]: 'two' is not of type 'integer'",
            "$.rows[2]: 3.5 is not of type 'integer'",
        ]
    )


async def test_the_schemas_own_dialect_decides_the_rules() -> None:
    # draft 4: exclusiveMaximum is a boolean modifier; in 2020-12 it would be invalid as one
    draft4 = {
        "$schema": "http://json-schema.org/draft-04/schema#",
        "maximum": 5,
        "exclusiveMaximum": True,
    }
    check = JsonSchemaCheck(options=opts(), schema=draft4)
    assert not (await check.run("5", REQ)).passed and (await check.run("4", REQ)).passed
    with pytest.raises(CheckSpecError, match="not a valid JSON Schema"):
        JsonSchemaCheck(options=opts(), schema={"maximum": 5, "exclusiveMaximum": True})


async def test_2020_12_keywords_are_enforced_by_default() -> None:
    schema = {"prefixItems": [{"type": "string"}], "items": False}
    check = JsonSchemaCheck(options=opts(), schema=schema)
    assert (await check.run('["a"]', REQ)).passed
    assert not (await check.run('["a", 1]', REQ)).passed


@pytest.mark.parametrize("scheme", ["https://example.invalid/s.json", "file"])
async def test_a_ref_outside_the_schema_is_never_fetched_and_the_check_abstains(
    tmp_path: Path, scheme: str
) -> None:
    """Neither the network nor a local file: a client's schema must not read the server's."""
    secret = tmp_path / "secret.json"
    await asyncio.to_thread(secret.write_text, '{"const": "TOP-SECRET"}')
    ref = secret.as_uri() if scheme == "file" else scheme
    check = JsonSchemaCheck(options=opts(), schema={"$ref": ref})
    result = await check.run('"x"', REQ)
    assert result.verdict == "abstain" and result.category == "check_error"
    assert "TOP-SECRET" not in result.reason


async def test_additional_properties_beside_a_catastrophic_pattern_does_not_hang(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """jsonschema matches patternProperties inside additionalProperties with re: it gets the
    time-limited engine too. The pattern limit counts CPU time (the regex engine's), so on a
    loaded machine the validation's wall-clock backstop could end the check first: it is moved
    out of the way, so that what ends the search is the pattern limit this test is about."""
    monkeypatch.setattr(_schema, "VALIDATE_TIMEOUT_S", 600.0)
    schema = {"additionalProperties": False, "patternProperties": {"^(a|a)+$": {}}}
    check = JsonSchemaCheck(options=opts(), schema=schema)
    cpu = time.process_time()
    result = await check.run(json.dumps({"a" * 40 + "!": 1}), REQ)
    assert time.process_time() - cpu < 4
    assert result.verdict == "abstain" and result.category == "timeout" and "0.5 s" in result.reason


async def test_pattern_properties_with_inline_flags_are_applied_not_a_crash() -> None:
    schema = {"patternProperties": {"^x": {}, "(?i)^y": {}}, "additionalProperties": False}
    check = JsonSchemaCheck(options=opts(), schema=schema)
    assert (await check.run('{"x1": 1, "Y2": 2}', REQ)).passed
    assert not (await check.run('{"z": 1}', REQ)).passed


@pytest.mark.parametrize(
    "pattern",
    [
        "(?:(?:a{1000}){1000}){10}",
        "((a{400}){400})",
        "x" * 5000,
        "a{99999}" * 120,  # siblings add up: each is cheap, together seconds and gigabytes
        "(?:(?:a{1000}(?#()){1000}(?#()){10}",  # an inline comment hiding a parenthesis
        "[[:alpha:](](?:(?:a{1000}){1000}){10}",  # a POSIX class ending the class "early"
        "(?x)(?:(?:a{10 00}){1000}){10}",  # verbose mode: spaces inside a bound
        "a(?V1)b",  # the engine's version flag (regex raised ValueError: a 500)
    ],
)
def test_a_pattern_too_costly_to_compile_is_refused_before_compiling(pattern: str) -> None:
    """Refused by the cost scan: compiling the worst of them takes ~10 s of CPU."""
    cpu = time.process_time()
    with pytest.raises(CheckSpecError, match=r"too costly|longer than|not accepted"):
        parse_check({"kind": "regex", "must_match": pattern}, origin="request")
    with pytest.raises(CheckSpecError, match="not a valid JSON Schema"):
        parse_check({"kind": "json_schema", "schema": {"pattern": pattern}}, origin="request")
    assert time.process_time() - cpu < 1


def test_jsonschema_still_matches_patterns_through_the_guarded_engine() -> None:
    """If a jsonschema release moves its pattern matching, this fails instead of the guard
    silently falling away."""
    import importlib

    from firstpass.checks._patterns import JSONSCHEMA_MODULES

    for name in JSONSCHEMA_MODULES:
        assert type(importlib.import_module(name).re).__name__ == "_TimedRe", name


async def test_a_catastrophic_schema_pattern_does_not_hang_validation() -> None:
    check = JsonSchemaCheck(options=opts(), schema={"type": "string", "pattern": "^(a|aa)+$"})
    cpu = time.process_time()
    result = await check.run(json.dumps("a" * 64 + "b"), REQ)
    assert time.process_time() - cpu < 6 and not result.passed


def test_formats_are_asserted_only_when_asked() -> None:
    parse_check(
        {"kind": "json_schema", "schema": {"format": "email"}, "assert_formats": True},
        origin="request",
    )
    with pytest.raises(CheckSpecError, match="assert_formats"):
        parse_check(
            {"kind": "json_schema", "schema": {}, "assert_formats": "yes"}, origin="request"
        )


async def test_format_assertion_rejects_a_bad_date() -> None:
    check = JsonSchemaCheck(options=opts(), schema={"format": "date"}, assert_formats=True)
    assert not (await check.run('"2024-13-45"', REQ)).passed
    lenient = JsonSchemaCheck(options=opts(), schema={"format": "date"})
    assert (await lenient.run('"2024-13-45"', REQ)).passed


# -- command ---------------------------------------------------------------------------------


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "grade.py"
    path.write_text(f"#!{sys.executable}\n{body}", "utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


async def command_check(**kw: Any) -> CommandCheck:
    """Built off the loop, as the server builds it at start (it resolves ``argv[0]``)."""
    return await asyncio.to_thread(lambda: CommandCheck(**kw))


async def script(tmp_path: Path, body: str) -> str:
    """An executable Python grader (written off the loop: the tests run under blockbuster)."""
    return await asyncio.to_thread(_script, tmp_path, body)


GRADER = """
import json, os, sys
doc = json.load(sys.stdin)
ok = "42" in doc["answer"]
print(json.dumps({"verdict": "pass" if ok else "fail", "score": 1.0 if ok else 0.25,
                  "reason": f"env={sorted(os.environ)} prompt={doc['request']['prompt']}"}))
"""


async def test_a_command_decides_from_the_answer_and_the_request_on_stdin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    check = await command_check(options=opts(), argv=[await script(tmp_path, GRADER)])
    good = await check.run("the answer is 42", CheckRequest(prompt="p"))
    assert good.passed and good.score == 1.0
    bad = await check.run("no", CheckRequest(prompt="p"))
    assert not bad.passed and bad.category == "command_rejected" and bad.score == 0.25
    # an empty environment: no API keys, no PATH (a Python grader coerces its own LC_CTYPE)
    assert "env=[] " in good.reason or "env=['LC_CTYPE'] " in good.reason, good.reason
    assert "prompt=p" in good.reason


async def test_a_command_that_hangs_is_killed_with_everything_it_started(tmp_path: Path) -> None:
    """A timeout verdict, and the command's child is gone too. The test needs the grader to
    have started its child before the timeout: when a loaded machine has not got that far, it
    tries again with a longer timeout (2 s, then 8 s, then 30 s). Unhonoured, a timeout would
    make the run take the grader's 120 s sleep: the bound on it is 60 s, which load cannot
    reach."""
    marker = tmp_path / "child.pid"
    body = f"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
open({str(marker)!r}, "w").write(str(child.pid))
time.sleep(120)
"""
    grader = await script(tmp_path, body)
    for timeout_s in (2.0, 8.0, 30.0):
        check = await command_check(options=opts(), argv=[grader], timeout_s=timeout_s)
        t0 = time.monotonic()
        result = await check.run("x", REQ)
        assert time.monotonic() - t0 < timeout_s + 60
        assert result.verdict == "abstain" and result.category == "timeout" and not result.passed
        if await asyncio.to_thread(marker.exists):
            break
    assert await asyncio.to_thread(marker.exists), "the grader never started its child"
    assert await asyncio.to_thread(_reaped, marker), "the command's child outlived the timeout"


def _reaped(marker: Path) -> bool:
    """The process whose pid ``marker`` holds is gone (or a zombie: killed, not yet reaped),
    within a deadline generous enough for a loaded machine."""
    pid = int(marker.read_text())
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        try:
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except FileNotFoundError:  # reaped between the two looks
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize(
    ("body", "words"),
    [
        ("import sys; sys.exit(3)", "exited with 3"),
        ("print('pass')", "JSON object"),
        ('print(\'{"verdict": "maybe"}\')', '"verdict"'),
        ('print(\'{"verdict": "pass", "score": 7}\')', "score"),
        ("import sys; sys.stdout.write('x' * 200000)", "more than"),
    ],
)
async def test_a_command_that_gives_no_verdict_abstains(
    tmp_path: Path, body: str, words: str
) -> None:
    check = await command_check(
        options=opts(on_abstain="fail_closed"), argv=[await script(tmp_path, body)]
    )
    result = await check.run("x", REQ)
    assert result.verdict == "abstain" and not result.passed and words in result.reason


async def test_a_fail_open_command_passes_when_it_abstains(tmp_path: Path) -> None:
    check = await command_check(
        options=opts(on_abstain="fail_open"), argv=[await script(tmp_path, "raise SystemExit(1)")]
    )
    assert (await check.run("x", REQ)).passed


async def test_a_command_cannot_use_more_memory_than_its_limit(tmp_path: Path) -> None:
    body = 'x = bytearray(900 * 1024 * 1024)\nprint(\'{"verdict": "pass"}\')'
    check = await command_check(options=opts(), argv=[await script(tmp_path, body)], memory_mb=256)
    assert (await check.run("x", REQ)).verdict == "abstain"


# -- composite and definitions ----------------------------------------------------------------


async def test_a_composite_from_a_definition_names_each_part() -> None:
    defn = parse_check(
        {
            "kind": "composite",
            "name": "shape",
            "checks": [
                {"kind": "basic", "min_length": 5},
                {
                    "kind": "regex",
                    "name": "polite",
                    "must_not_match": "(?i)stupid",
                    "severity": "warning",
                },
            ],
        },
        origin="request",
    )
    check = build_check(defn)
    assert isinstance(check, Composite)
    result = await check.run("that is a stupid question, but: 42", REQ)
    assert result.passed  # the failing part is only a warning
    assert [(p.name, p.passed, p.severity) for p in result.parts] == [
        ("basic", True, "error"),
        ("polite", False, "warning"),
    ]
    assert result.reasons == ("polite: matches the forbidden pattern '(?i)stupid'",)


def test_a_composite_nests_only_so_deep() -> None:
    inner: dict[str, object] = {"kind": "basic"}
    for _ in range(5):
        inner = {"kind": "composite", "checks": [inner]}
    with pytest.raises(CheckSpecError, match="nest at most"):
        parse_check(inner, origin="request")


def test_an_unknown_option_is_named_with_a_suggestion() -> None:
    with pytest.raises(CheckSpecError) as info:
        parse_check({"kind": "regex", "must_mach": "x"}, origin="config")
    assert info.value.field == "must_mach" and 'did you mean "must_match"' in str(info.value)


@pytest.mark.parametrize(
    "pattern", [r"^\d{3}-\d{4}$", r"(?:\w{1,64}\.){1,10}", r"[[:alpha:]]{5}", r"^\p{Letter}+$"]
)
def test_ordinary_patterns_are_well_under_the_cost_cap(pattern: str) -> None:
    assert pattern_cost_problem(pattern) is None


def test_a_requests_patterns_are_budgeted_together() -> None:
    many = [{"kind": "regex", "must_match": "a{5000}"}] * 11
    assert "together are too costly" in (request_patterns_problem(many) or "")
    assert request_patterns_problem([{"kind": "regex", "must_match": "a{5000}"}]) is None


def test_a_long_unclosed_fence_is_scanned_in_linear_time() -> None:
    cpu = time.process_time()
    assert extract_json("```" + "x" * 300_000)[0] is False
    assert time.process_time() - cpu < 0.5  # quadratic would be ~10^10 steps


@pytest.mark.parametrize(
    "answer",
    [
        '```json\n{"a": NaN}\n```\n```json\n{"a": 1}\n```',  # a lenient block still counts
        '{"a": 1e400}',  # infinite once parsed
    ],
)
def test_json_only_a_lenient_parser_takes_never_passes(answer: str) -> None:
    assert extract_json(answer)[0] is False


@pytest.mark.parametrize("name", ["a\nb", "x\x1b[2J", "tests", "hidden tests"])
def test_a_check_name_must_be_printable_and_not_a_stage_name(name: str) -> None:
    with pytest.raises(CheckSpecError) as info:
        parse_check({"kind": "basic", "name": name}, origin="request")
    assert info.value.field == "name"
