"""``sql_evidence``: an analytics answer checked against the SQL work it stands on.

Each of the ten named checks gets a failing case and a passing twin over one small SQLite
database; then the rerun policy, tolerant number matching, where evidence comes from (the
request's list, or the conversation's tool calls), a database no hostile SQL string can change,
a runaway query stopped within its budget, and the config-only refusals.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from firstpass.checks import CheckRequest, CheckResult, Options, parse_check
from firstpass.checks._sql import RULES, SqlEvidenceCheck, holds, stated_numbers
from firstpass.errors import CheckSpecError

NAMES = [name for name, _ in RULES]
SEVERITY = dict(RULES)

SCHEMA = """
CREATE TABLE singer(singer_id INTEGER, name TEXT, country TEXT, age INTEGER, joined TEXT);
CREATE TABLE concert(concert_id INTEGER, singer_id INTEGER, city TEXT, year INTEGER, revenue REAL);
"""
SINGERS = [
    (1, "Ana", "France", 31, "2019-05-01"),
    (2, "Ben", "France", 45, "2020-07-15"),
    (3, "Cy", "Spain", 27, "2020-11-30"),
    (4, "Dee", "spain", 52, "sometime in spring"),  # unparsable date; lower-case "spain"
]
CONCERTS = [
    (1, 1, "Paris", 2019, 1234.5),
    (2, 1, "Lyon", 2020, 800.0),
    (3, 2, "Paris", 2020, 3000.25),
    (4, 3, "Madrid", 2021, 950.0),
]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "music.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(SCHEMA)
    conn.executemany("INSERT INTO singer VALUES (?, ?, ?, ?, ?)", SINGERS)
    conn.executemany("INSERT INTO concert VALUES (?, ?, ?, ?, ?)", CONCERTS)
    conn.commit()
    conn.close()
    return path


def make(db: Path, **kw: Any) -> SqlEvidenceCheck:
    return SqlEvidenceCheck(options=Options(name="sql"), database=db, **kw)


def ev(
    sql: str, rows: list[list[object]] | None, elapsed_ms: float | None = 1.0, **kw: Any
) -> dict[str, Any]:
    return {"sql": sql, "columns": [], "rows": rows, "elapsed_ms": elapsed_ms, **kw}


def run(
    db: Path, question: str, answer: str, evidence: Sequence[Mapping[str, Any]], **kw: Any
) -> CheckResult:
    return make(db, **kw).run_blocking(
        answer, CheckRequest(prompt=question, evidence=tuple(evidence))
    )


def part(result: CheckResult, name: str) -> CheckResult:
    (found,) = [p for p in result.parts if p.name == name]
    return found


def assert_all_ten(result: CheckResult) -> None:
    assert [p.name for p in result.parts] == NAMES
    for p in result.parts:
        assert p.severity == SEVERITY[p.name], p


def failed(result: CheckResult, name: str, reason: str) -> None:
    """``name`` failed with its severity and a reason holding ``reason``; the whole fails
    exactly when that severity is ``error`` (and nothing else failed blockingly)."""
    assert_all_ten(result)
    p = part(result, name)
    assert (p.passed, p.verdict, p.severity) == (False, "fail", SEVERITY[name]), p
    assert p.category == f"sql_{name}"
    assert any(reason in r for r in p.reasons), p.reasons
    if SEVERITY[name] == "error":
        assert not result.passed and result.category is not None
    else:
        assert result.passed, result.reasons


def passed(result: CheckResult, name: str) -> None:
    assert_all_ten(result)
    p = part(result, name)
    assert (p.passed, p.verdict, p.severity) == (True, "pass", SEVERITY[name]), p
    assert not any(r for r in p.reasons if not r.startswith("skipped: ")), p.reasons


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the ten checks: a failing case and its passing twin ------------------------------------------

COUNT_SINGERS = "SELECT count(*) FROM singer"


def test_tables_exist(db: Path) -> None:
    bad = run(db, "How many singers?", "There are 4.", [ev("SELECT count(*) FROM singers", [[4]])])
    failed(bad, "tables_exist", "table 'singers' does not exist")
    good = run(db, "How many singers?", "There are 4.", [ev(COUNT_SINGERS, [[4]])])
    passed(good, "tables_exist")
    assert good.passed


def test_tables_exist_sees_through_aliases_and_ctes(db: Path) -> None:
    sql = (
        "WITH fr AS (SELECT * FROM singer s WHERE s.country = 'France') "
        "SELECT count(*) FROM fr JOIN concert c ON c.singer_id = fr.singer_id"
    )
    passed(run(db, "How many concerts?", "3", [ev(sql, [[3]])]), "tables_exist")


def test_rerun_matches(db: Path) -> None:
    bad = run(db, "How many singers?", "There are 5.", [ev(COUNT_SINGERS, [[5]])])
    failed(bad, "rerun_matches", "when rerun")
    good = run(db, "How many singers?", "There are 4.", [ev(COUNT_SINGERS, [[4]])])
    passed(good, "rerun_matches")
    assert good.passed


def test_rerun_matches_ignores_row_order_and_float_noise(db: Path) -> None:
    sql = "SELECT city, sum(revenue) FROM concert GROUP BY city"
    rows: list[list[object]] = [["Paris", 4234.75 + 1e-12], ["Madrid", 950], ["Lyon", 800.0]]
    passed(run(db, "Revenue per city?", "Paris 4234.75", [ev(sql, rows)]), "rerun_matches")


def test_numbers_in_evidence(db: Path) -> None:
    bad = run(db, "How many singers?", "There are 7 singers.", [ev(COUNT_SINGERS, [[4]])])
    failed(bad, "numbers_in_evidence", "the answer states 7, which no result cell holds")
    good = run(db, "How many singers?", "There are 4 singers.", [ev(COUNT_SINGERS, [[4]])])
    passed(good, "numbers_in_evidence")
    assert good.passed


def test_numbers_in_evidence_accepts_row_counts_and_the_questions_own_numbers(db: Path) -> None:
    sql = "SELECT name FROM singer WHERE age > 30"
    rows: list[list[object]] = [["Ana"], ["Ben"], ["Dee"]]
    result = run(db, "Which singers are over 30?", "3 singers are over 30: Ana, Ben, Dee.",
                 [ev(sql, rows)])  # fmt: skip
    passed(result, "numbers_in_evidence")


def test_no_sum_over_text(db: Path) -> None:
    bad = run(
        db, "What is the total of the names?", "0", [ev("SELECT sum(name) FROM singer", [[0]])]
    )
    failed(bad, "no_sum_over_text", "a text column with 4 non-numeric values")
    sql = "SELECT sum(age) FROM singer"
    good = run(db, "What is the total of the ages?", "155", [ev(sql, [[155]])])
    passed(good, "no_sum_over_text")
    assert good.passed


def test_no_sum_over_text_catches_avg_and_total_too(db: Path) -> None:
    for sql in ("SELECT avg(s.country) FROM singer s", "SELECT total(country) FROM singer"):
        result = run(db, "The total of countries?", "0", [ev(sql, [[0]])])
        failed(result, "no_sum_over_text", "singer.country")


def test_string_filter_case(db: Path) -> None:
    """'France' is stored capitalised: 'france' matches nothing while 'FRANCE' rows exist in
    another casing. 'spain' matches one row exactly, so it passes though 'Spain' exists too."""
    sql = "SELECT count(*) FROM singer WHERE country = '{}'"
    bad = run(db, "How many singers are from France?", "0", [ev(sql.format("france"), [[0]])])
    failed(bad, "string_filter_case", "country = 'france' matches no row, but 2 rows")
    good = run(db, "How many singers are from France?", "2", [ev(sql.format("France"), [[2]])])
    passed(good, "string_filter_case")
    assert good.passed
    exact = run(db, "How many singers are from spain?", "1", [ev(sql.format("spain"), [[1]])])
    passed(exact, "string_filter_case")


def test_aggregate_matches_question_is_a_warning(db: Path) -> None:
    question = "What is the average age of singers?"
    bad = run(db, question, "155", [ev("SELECT sum(age) FROM singer", [[155]])])
    failed(bad, "aggregate_matches_question", "the question asks for an average but the SQL sums")
    assert any(
        "'average' but the SQL has no AVG" in r
        for r in part(bad, "aggregate_matches_question").reasons
    )
    good = run(db, question, "38.75", [ev("SELECT avg(age) FROM singer", [[38.75]])])
    passed(good, "aggregate_matches_question")


def test_aggregate_matches_question_wants_a_count_for_how_many(db: Path) -> None:
    sql = "SELECT name FROM singer WHERE age > 40"
    bad = run(db, "How many singers are over 40?", "Ben and Dee", [ev(sql, [["Ben"], ["Dee"]])])
    failed(
        bad, "aggregate_matches_question", "the question says 'how many' but the SQL has no COUNT"
    )


def test_question_columns_used_is_a_warning(db: Path) -> None:
    question = "What is the country of the singer named Ana?"
    bad = run(db, question, "Ana", [ev("SELECT name FROM singer WHERE singer_id = 1", [["Ana"]])])
    failed(bad, "question_columns_used", "the question names 'country' (singer.country)")
    sql = "SELECT country FROM singer WHERE name = 'Ana'"
    good = run(db, "What is the country of Ana?", "France", [ev(sql, [["France"]])])
    passed(good, "question_columns_used")


def test_question_columns_used_does_not_read_a_table_name_as_its_id_column(db: Path) -> None:
    sql = "SELECT country FROM singer WHERE name = 'Ana'"
    result = run(
        db, "What is the country of the singer named Ana?", "France", [ev(sql, [["France"]])]
    )
    passed(result, "question_columns_used")


def test_join_when_two_tables_is_a_warning(db: Path) -> None:
    question = "How many concerts did each singer give?"
    bad = run(db, question, "4", [ev("SELECT count(*) FROM concert", [[4]])])
    failed(bad, "join_when_two_tables", "the question names 'concert' and 'singer'")
    sql = (
        "SELECT s.name, count(*) FROM singer s JOIN concert c ON c.singer_id = s.singer_id "
        "GROUP BY s.name"
    )
    good = run(db, question, "Ana 2, Ben 1, Cy 1", [ev(sql, [["Ana", 2], ["Ben", 1], ["Cy", 1]])])
    passed(good, "join_when_two_tables")
    assert good.passed


def test_date_group_not_null(db: Path) -> None:
    """'sometime in spring' does not parse: strftime gives a NULL year group."""
    question = "How many singers joined each year?"
    sql = "SELECT strftime('%Y', joined), count(*) FROM singer {}GROUP BY strftime('%Y', joined)"
    bad = run(
        db,
        question,
        "2019: 1, 2020: 2",
        [ev(sql.format(""), [[None, 1], ["2019", 1], ["2020", 2]])],
    )
    failed(bad, "date_group_not_null", "1 result row(s) have a NULL key")
    where = "WHERE joined GLOB '[0-9][0-9][0-9][0-9]-*' "
    good = run(
        db, question, "2019: 1, 2020: 2", [ev(sql.format(where), [["2019", 1], ["2020", 2]])]
    )
    passed(good, "date_group_not_null")
    assert not part(good, "date_group_not_null").reasons  # checked, not skipped
    assert good.passed


@pytest.mark.parametrize("group", ["y", "1"])
def test_date_group_not_null_follows_an_alias_or_a_position(db: Path, group: str) -> None:
    sql = f"SELECT strftime('%Y', joined) AS y, count(*) FROM singer GROUP BY {group}"
    rows: list[list[object]] = [[None, 1], ["2019", 1], ["2020", 2]]
    result = run(db, "How many singers joined each year?", "2019: 1, 2020: 2", [ev(sql, rows)])
    failed(result, "date_group_not_null", "NULL key")


def test_aggregates_attributed(db: Path) -> None:
    question = "What are the youngest and oldest ages?"
    sql = "SELECT min(age), max(age) FROM singer"
    bad = run(db, question, "The oldest is 27 and the youngest is 52.", [ev(sql, [[27, 52]])])
    failed(
        bad,
        "aggregates_attributed",
        "27 is the MIN column's value, but the answer calls it the max",
    )
    good = run(db, question, "The youngest is 27 and the oldest is 52.", [ev(sql, [[27, 52]])])
    passed(good, "aggregates_attributed")
    assert not part(good, "aggregates_attributed").reasons  # checked, not skipped
    assert good.passed


def test_aggregates_attributed_reads_each_numbers_own_words(db: Path) -> None:
    sql = "SELECT min(age), max(age) FROM singer"
    answer = "The oldest is 52 and the youngest is 52."  # the second 52 is no MIN
    result = run(db, "What are the youngest and oldest ages?", answer, [ev(sql, [[27, 52]])])
    failed(result, "aggregates_attributed", "52 is the MAX column's value")


def test_checks_that_do_not_apply_say_skipped(db: Path) -> None:
    result = run(db, "How many singers?", "4", [ev(COUNT_SINGERS, [[4]])])
    assert result.passed
    assert part(result, "date_group_not_null").reasons == (
        "skipped: no selected expression grouped",
    )
    assert part(result, "aggregates_attributed").reasons == (
        "skipped: no row with several aggregates",
    )
    unparsable = run(db, "How many singers?", "4", [ev("SELEKT nonsense ((", [[4]])])
    assert_all_ten(unparsable)
    assert part(unparsable, "tables_exist").reasons == ("skipped: no query parses",)


# -- the rerun policy -----------------------------------------------------------------------------


def test_a_slow_query_is_not_rerun_and_the_sub_result_says_so(db: Path) -> None:
    result = run(db, "How many singers?", "5", [ev(COUNT_SINGERS, [[5]], elapsed_ms=900)])
    p = part(result, "rerun_matches")
    assert p.passed
    assert p.reasons == (
        "skipped: query 0: not cheap (900 ms; reruns at most 500 ms); it compiles",
    )
    # the same evidence, cheap enough under a higher rerun_ms: rerun, and caught
    again = run(
        db, "How many singers?", "5", [ev(COUNT_SINGERS, [[5]], elapsed_ms=900)], rerun_ms=1000
    )
    failed(again, "rerun_matches", "when rerun")


def test_a_query_without_a_time_is_rerun(db: Path) -> None:
    """Nothing says it was slow (issue 29: forged rows without ``elapsed_ms`` once passed)."""
    result = run(db, "How many?", "5", [ev(COUNT_SINGERS, [[5]], elapsed_ms=None)])
    failed(result, "rerun_matches", "query 0 returned other values when rerun")
    honest = run(db, "How many?", "4", [ev(COUNT_SINGERS, [[4]], elapsed_ms=None)])
    assert part(honest, "rerun_matches").passed
    assert not part(honest, "rerun_matches").reasons  # rerun, not skipped


def test_a_truncated_result_is_not_rerun(db: Path) -> None:
    sql = "SELECT name FROM singer"
    result = run(db, "Name the singers.", "Ana", [ev(sql, [["Ana"]], truncated=True)])
    p = part(result, "rerun_matches")
    assert p.passed and p.reasons == ("skipped: query 0: its result was truncated; it compiles",)


def test_a_changed_rerun_is_caught_among_others(db: Path) -> None:
    """Evidence rows that differ from what the database returns, beside a query that matches."""
    sql = "SELECT city FROM concert WHERE year = 2020"
    items = [ev(COUNT_SINGERS, [[4]]), ev(sql, [["Lyon"], ["Nice"]])]
    result = run(db, "How many singers, and where were the 2020 concerts?", "4", items)
    failed(result, "rerun_matches", "query 1 returned other values when rerun")
    assert not any("query 0" in r for r in part(result, "rerun_matches").reasons)


# -- tolerant numbers -----------------------------------------------------------------------------


def values(text: str) -> list[float]:
    return [n.value for n in stated_numbers(text)]


def test_stated_numbers_reads_separators_signs_and_percentages() -> None:
    assert values("1,234 rows, 3.14 mean, 42% share, −5 and -5 change") == [1234, 3.14, 42, -5, -5]
    (pct,) = stated_numbers("about 42 %")
    assert pct.percent and pct.value == 42
    (pi,) = stated_numbers("pi is 3.14")
    assert (pi.text, pi.decimals, pi.percent) == ("3.14", 2, False)


def test_dates_times_and_digits_in_words_are_not_numbers() -> None:
    assert values("on 2021-03-04 at 10:30, or 3/4/2021, in T2") == []
    assert values("on 2021-03-04 there were 3") == [3]


def test_digits_after_a_hyphen_inside_a_word_are_not_numbers() -> None:
    assert values("COVID-19 cases") == []


@pytest.mark.parametrize(
    ("text", "evidence", "ok"),
    [
        ("3.14", 3.14159, True),  # rounded
        ("3.1416", 3.14159, True),
        ("3.15", 3.14159, False),
        ("3", 3.7, True),  # truncated
        ("4", 3.7, True),  # rounded
        ("5", 3.7, False),
        ("1,234", 1234, True),
        ("1,234", 1235, False),
        ("42%", 0.42, True),  # a share
        ("42%", 42, True),  # already a percentage
        ("42", 0.42, False),  # no percent sign: not a share
        ("−5", -5, True),
        ("-5", -5, True),
        ("-5", 5, False),
        ("0.5", 0.5, True),
    ],
)
def test_holds_is_tolerant_the_way_people_write_numbers(
    text: str, evidence: float, ok: bool
) -> None:
    (number,) = stated_numbers(text)
    assert holds(number, [evidence]) is ok


def test_tolerant_numbers_through_the_check(db: Path) -> None:
    sql = "SELECT avg(revenue), sum(revenue), count(*) FROM concert"
    rows: list[list[object]] = [[1496.1875, 5984.75, 4]]
    answer = "Over 4 concerts on 2021-03-04 the mean was 1,496.19 and the total 5,984.75."
    result = run(db, "What is the mean and total revenue?", answer, [ev(sql, rows)])
    passed(result, "numbers_in_evidence")
    # (queries that read a table: a constant-only SELECT is no evidence since issue 29)
    french = "SELECT avg(country = 'France') FROM singer"
    share = run(db, "What share of singers are French?", "50% of them, and −2 fewer than 4? No: 50%.",
                [ev(french, [[0.5]])])  # fmt: skip
    failed(share, "numbers_in_evidence", "the answer states −2")
    change = "SELECT min(age) - 32 FROM singer"
    negative = run(db, "What is the change?", "It fell by −5.", [ev(change, [[-5]])])
    passed(negative, "numbers_in_evidence")
    mean = "SELECT avg(revenue) FROM concert"
    rounded = run(db, "What is the mean?", "1,496.19", [ev(mean, [[1496.1875]])])
    passed(rounded, "numbers_in_evidence")
    wrong = run(db, "What is the mean?", "1,496.3", [ev(mean, [[1496.1875]])])
    failed(wrong, "numbers_in_evidence", "1,496.3")


# -- where evidence comes from --------------------------------------------------------------------


def test_no_evidence_fails_as_sql_no_evidence(db: Path) -> None:
    result = run(db, "How many singers?", "There are 4.", [])
    assert (result.verdict, result.passed, result.category) == ("fail", False, "sql_no_evidence")
    assert "no SQL evidence" in result.reason and "'sql'" in result.reason
    assert result.needs_revision


def test_malformed_evidence_fails_as_sql_no_evidence(db: Path) -> None:
    result = run(db, "How many singers?", "4", [{"sql": "", "rows": []}])
    assert (result.passed, result.category) == (False, "sql_no_evidence")
    assert "malformed" in result.reason and "[0].sql" in result.reason


def conversation(
    sql: str, result: object, *, tool: str = "sql", call_id: str = "call_1"
) -> tuple[dict[str, Any], ...]:
    content = result if isinstance(result, str) else json.dumps(result)
    return (
        {"role": "user", "content": "How many singers are from France?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps({"sql": sql})},
                }
            ],
        },
        {"role": "tool", "tool_call_id": call_id, "content": content},
    )


FRANCE = "SELECT count(*) FROM singer WHERE country = 'France'"


def test_evidence_from_the_conversations_tool_calls(db: Path) -> None:
    check = make(db)
    good = CheckRequest.from_messages(
        conversation(FRANCE, {"columns": ["n"], "rows": [[2]], "elapsed_ms": 3})
    )
    (item,) = check.evidence(good)
    assert (item.sql, item.rows, item.elapsed_ms) == (FRANCE, ((2,),), 3.0)
    result = check.run_blocking("Two singers are from France.", good)
    assert result.passed and not part(result, "rerun_matches").reasons
    lied = CheckRequest.from_messages(
        conversation(FRANCE, {"columns": ["n"], "rows": [[3]], "elapsed_ms": 3})
    )
    failed(check.run_blocking("3 singers", lied), "rerun_matches", "when rerun")
    # a result that is not JSON: the query counts, without rows
    plain = CheckRequest.from_messages(conversation(FRANCE, "2"))
    (item,) = check.evidence(plain)
    assert item.rows is None
    result = check.run_blocking("Two singers are from France.", plain)
    assert part(result, "numbers_in_evidence").reasons == ("skipped: no recorded result rows",)


def test_calls_to_another_tool_are_not_evidence(db: Path) -> None:
    request = CheckRequest.from_messages(conversation(FRANCE, {"rows": [[2]]}, tool="search"))
    result = make(db).run_blocking("2", request)
    assert (result.passed, result.category) == (False, "sql_no_evidence")
    # unless the route names that tool
    assert make(db, tool="search").run_blocking("2", request).passed


def test_explicit_evidence_wins_over_the_conversation(db: Path) -> None:
    messages = conversation(FRANCE, {"rows": [[2]], "elapsed_ms": 1})
    request = CheckRequest.from_messages(messages, evidence=[ev(COUNT_SINGERS, [[4]])])
    (item,) = make(db).evidence(request)
    assert item.sql == COUNT_SINGERS


def test_the_async_run_gives_the_same_result(db: Path) -> None:
    check = make(db)
    request = CheckRequest(prompt="How many singers?", evidence=(ev(COUNT_SINGERS, [[4]]),))
    result = asyncio.run(check.run("4", request))
    assert result == check.run_blocking("4", request)
    assert result.passed and result.kind == "sql_evidence" and result.name == "sql"


# -- the database is read-only and bounded --------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "DELETE FROM singer",
        "DROP TABLE singer",
        "UPDATE singer SET age = 0",
        "INSERT INTO singer VALUES (9, 'X', 'Y', 1, '2020-01-01')",
        "CREATE TABLE x(a)",
        "PRAGMA query_only=OFF; DELETE FROM singer",
        "PRAGMA user_version = 7",
        "VACUUM",
        "PRAGMA journal_mode = WAL",
        "SELECT load_extension('/tmp/nothing')",
    ],
)
def test_hostile_sql_cannot_change_the_database(db: Path, sql: str) -> None:
    before = sha(db)
    files = sorted(db.parent.iterdir())
    result = run(db, "How many singers?", "Done.", [ev(sql, [])])
    assert sha(db) == before
    assert sorted(db.parent.iterdir()) == files  # no journal, no WAL, no new file
    # refused before it runs (not a query) or by SQLite (read-only): never applied
    part = next(p for p in result.parts if p.name == "rerun_matches")
    assert not part.passed and part.severity == "error"
    assert "failed when rerun" in part.reason or "is not a query" in part.reason
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT count(*) FROM singer").fetchone() == (4,)


@pytest.mark.parametrize("statement", ["ATTACH DATABASE '{}' AS x", "VACUUM INTO '{}'"])
def test_hostile_sql_cannot_create_files(db: Path, tmp_path: Path, statement: str) -> None:
    target = tmp_path / "elsewhere" / "created.db"
    target.parent.mkdir()
    before = sha(db)
    result = run(db, "How many singers?", "Done.", [ev(statement.format(target), [])])
    assert sha(db) == before
    assert not target.exists(), "the rerun created a file"
    part = next(p for p in result.parts if p.name == "rerun_matches")
    assert not part.passed
    assert "failed when rerun" in part.reason or "is not a query" in part.reason


def test_attach_never_changes_the_database(db: Path, tmp_path: Path) -> None:
    """The database's bytes stay, and no exception, whatever ATTACH tries."""
    before = sha(db)
    result = run(db, "How many?", "Done.", [ev(f"ATTACH DATABASE '{tmp_path / 'a.db'}' AS x", [])])
    assert sha(db) == before
    assert_all_ten(result)


def test_a_runaway_query_stops_within_the_budget(db: Path) -> None:
    sql = (
        "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < 1000000000) "
        "SELECT count(*) FROM c"
    )
    cpu = time.process_time()  # CPU time: the budget is wall time, so load only lowers it
    result = run(db, "How many?", "1000000000", [ev(sql, [[1000000000]])], budget_ms=300)
    took = time.process_time() - cpu
    failed(result, "rerun_matches", "took over 300 ms")
    assert took < 0.3 + 1.5, took


# -- config only ----------------------------------------------------------------------------------


def test_a_config_builds_it(db: Path) -> None:
    defn = parse_check(
        {"kind": "sql_evidence", "database": str(db), "rerun_ms": 50}, origin="config"
    )
    assert defn.kind == "sql_evidence" and isinstance(defn.built, SqlEvidenceCheck)
    assert defn.built.rerun_ms == 50


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({}, "database"),
        ({"rerun_ms": 0}, "rerun_ms"),
        ({"budget_ms": True}, "budget_ms"),
        ({"tool": ""}, "tool"),
    ],
)
def test_bad_options_are_refused_naming_the_option(
    db: Path, extra: dict[str, Any], field: str
) -> None:
    raw: dict[str, Any] = {"kind": "sql_evidence", "database": str(db), **extra}
    if field == "database":
        raw["database"] = str(db.parent / "missing.sqlite")
    with pytest.raises(CheckSpecError) as info:
        parse_check(raw, origin="config")
    assert info.value.field == field


@pytest.mark.parametrize("database", [5, None, ["a.db"]])
def test_a_database_that_is_not_a_path_is_refused_naming_it(database: object) -> None:
    with pytest.raises(CheckSpecError) as info:
        parse_check({"kind": "sql_evidence", "database": database}, origin="config")
    assert info.value.field == "database"


def test_a_missing_or_non_sqlite_database_is_refused(tmp_path: Path) -> None:
    with pytest.raises(CheckSpecError, match=r"missing\.sqlite") as info:
        parse_check(
            {"kind": "sql_evidence", "database": str(tmp_path / "missing.sqlite")}, origin="config"
        )
    assert info.value.field == "database"
    text = tmp_path / "notes.txt"
    text.write_text("not a database at all, just some words " * 100)
    with pytest.raises(CheckSpecError, match="cannot be opened") as info:
        parse_check({"kind": "sql_evidence", "database": str(text)}, origin="config")
    assert info.value.field == "database"
    with pytest.raises(CheckSpecError) as info:
        parse_check({"kind": "sql_evidence"}, origin="config")
    assert info.value.field == "database" and "required" in str(info.value)


def test_a_request_cannot_name_a_database(db: Path) -> None:
    with pytest.raises(CheckSpecError, match="config only") as info:
        parse_check({"kind": "sql_evidence", "database": str(db)}, origin="request")
    assert info.value.field == "kind"
    nested = {"kind": "composite", "checks": [{"kind": "sql_evidence", "database": str(db)}]}
    with pytest.raises(CheckSpecError, match="config only"):
        parse_check(nested, origin="request")


@pytest.mark.parametrize("recorded", [[["4"]], [[4.0]], [["4.00"]]])
def test_a_harness_that_sends_numbers_as_text_or_floats_still_reruns_equal(
    db: Path, recorded: list[list[object]]
) -> None:
    result = run(db, "How many singers?", "There are 4.", [ev(COUNT_SINGERS, recorded)])
    assert part(result, "rerun_matches").passed


def test_a_harness_that_rounds_a_value_still_reruns_equal(db: Path) -> None:
    """The database says 36.25; a harness that sends 36.3 rounded it, it did not change it."""
    sql = "SELECT avg(age) FROM singer"
    with sqlite3.connect(db) as conn:
        (exact,) = conn.execute(sql).fetchone()
    shown = round(exact, 1)
    assert shown != exact
    result = run(db, "Average age?", f"{shown}", [ev(sql, [[shown]])])
    assert part(result, "rerun_matches").passed
    wrong = run(db, "Average age?", f"{shown + 1}", [ev(sql, [[shown + 1]])])
    assert not part(wrong, "rerun_matches").passed


def test_a_query_that_was_not_rerun_must_still_compile(db: Path) -> None:
    """A slow, truncated or unrecorded query is not rerun, but EXPLAIN must prepare it: a
    query naming a column the table lacks fails even without its rows."""
    bad = run(db, "Ages?", "Done.", [ev("SELECT agez FROM singer", None)])
    failed(bad, "rerun_matches", "query 0 does not run on this database: no such column: agez")
    slow = run(db, "Ages?", "Done.", [ev("SELECT age FROM singer", [[1]], elapsed_ms=9000)])
    assert part(slow, "rerun_matches").passed


# -- from a breaking pass ---------------------------------------------------------------------------


def test_a_huge_integer_in_the_evidence_cannot_turn_hard_checks_into_warnings(db: Path) -> None:
    """10**400 once crashed two hard rules, and a crashed rule became a passing warning."""
    result = run(db, "How many singers?", "There are 77777.", [ev(COUNT_SINGERS, [[10**400]])])
    assert not result.passed
    for p in result.parts:
        if p.name in ("numbers_in_evidence", "rerun_matches"):
            assert p.severity == "error" and not p.passed, p


def test_rerun_all_reruns_a_query_the_evidence_claims_was_slow(db: Path) -> None:
    """A client writing the evidence could dodge the rerun by claiming 600 ms; not with
    rerun = "all"."""
    forged = [ev(COUNT_SINGERS, [[9999]], elapsed_ms=600)]
    trusting = run(db, "How many singers?", "There are 9999.", forged)
    assert part(trusting, "rerun_matches").passed  # the harness's word is taken
    strict = run(db, "How many singers?", "There are 9999.", forged, rerun="all")
    failed(strict, "rerun_matches", "query 0 returned other values when rerun")


@pytest.mark.parametrize(
    "sql",
    [
        "PRAGMA hard_heap_limit=20000",
        "PRAGMA temp_store_directory='/tmp'",
        "SELECT * FROM pragma_table_info('singer')",
    ],
)
def test_a_pragma_never_runs_not_even_while_explain_prepares_it(db: Path, sql: str) -> None:
    result = run(db, "Columns?", "Done.", [ev(sql, None)])
    assert not part(result, "rerun_matches").passed
    # the process is unharmed: the next check reruns normally
    after = run(db, "How many singers?", "There are 4.", [ev(COUNT_SINGERS, [[4]])])
    assert part(after, "rerun_matches").passed


def test_one_slow_step_is_stopped_by_the_length_limit_and_the_watchdog(db: Path) -> None:
    import time

    cpu = time.process_time()  # CPU time: the budget is wall time, so load only lowers it
    sql = "SELECT instr(printf('%.*c', 50000000, 'a'), 'b')"
    result = run(db, "?", "Done.", [ev(sql, [[0]])], budget_ms=500)
    assert time.process_time() - cpu < 5
    assert not part(result, "rerun_matches").passed


def test_sql_nested_too_deeply_for_the_parser_is_a_result_not_a_crash(db: Path) -> None:
    sql = "SELECT " + "(" * 400 + "1" + ")" * 400
    result = run(db, "?", "Done.", [ev(sql, [[1]])])
    assert "tables_exist" in {p.name for p in result.parts}


@pytest.mark.parametrize(
    ("text", "value"),
    [("3e2", 300.0), ("250k", 250_000.0), ("1.2M", 1_200_000.0), ("2.5bn", 2.5e9)],
)
def test_numbers_with_an_exponent_or_a_suffix_are_read_whole(text: str, value: float) -> None:
    (n,) = stated_numbers(text)
    assert n.value == value
    assert not holds(n, [1.0, 2.0, 3.0])  # never read as their leading digits


@pytest.mark.parametrize(
    ("elapsed", "ok"),
    [(1e9, True), (0, True), (10**400, False), (float("inf"), False), (float("nan"), False)],
    ids=["a_long_query", "zero", "past_a_float", "infinity", "nan"],
)
def test_evidence_run_time_is_any_finite_number_a_float_holds(elapsed: float, ok: bool) -> None:
    """``elapsed_ms`` is refused only when no float holds it (an integer past float's range
    once raised OverflowError, a 500): a long query's run time is not second-guessed."""
    from firstpass.checks._sql import evidence_from_list

    item = {"sql": "select 1", "columns": ["a"], "rows": [[1]], "elapsed_ms": elapsed}
    if ok:
        assert evidence_from_list([item])[0].elapsed_ms == float(elapsed)
    else:
        with pytest.raises(CheckSpecError, match="elapsed_ms"):
            evidence_from_list([item])
