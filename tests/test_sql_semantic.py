"""``sql_evidence``'s semantic checks: wrong SQL that runs, caught from the query's logic and the
database's values on a schema unlike Spider's (parcels, depots, couriers).

Each check gets a failing case and a passing twin through the public check kind, on one small
SQLite database with a declared foreign key and an undeclared one named like a key.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from firstpass.checks._sql import RULES
from tests.sql_checking import build_db, check, part

SCHEMA = """
CREATE TABLE depot(depot_id INTEGER PRIMARY KEY, city TEXT);
CREATE TABLE parcel(parcel_id INTEGER PRIMARY KEY, depot_id INTEGER REFERENCES depot(depot_id),
                    sender TEXT, weight REAL, status TEXT);
CREATE TABLE courier(courier_id INTEGER PRIMARY KEY, name TEXT, home_city TEXT, age INTEGER,
                     base_depot INTEGER);
CREATE TABLE scan(scan_id INTEGER PRIMARY KEY, parcel_id INTEGER REFERENCES parcel(parcel_id),
                  place TEXT, reading TEXT);
"""
ROWS: dict[str, list[tuple[object, ...]]] = {
    "depot": [(1, "Porto"), (2, "Lille")],
    "parcel": [
        (10, 1, "Ines", 1.5, "DELIVERED"),
        (11, 1, "Ines", 7.0, "in transit"),
        (12, 2, "Marc", 3.2, "DELIVERED"),
    ],
    "courier": [(1, "Rui", "Lyon", 29, 1), (2, "Zoe", "Lille", 41, 2), (3, "Ana", "Porto", 35, 1)],
    # readings are numbers stored as text, one missing ('null'); parcel 10 is scanned twice
    "scan": [(1, 10, "Porto", "1.5"), (2, 10, "Lille", "2"), (3, 11, "Porto", "null"),
             (4, 12, "Lille", "3")],
}  # fmt: skip


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return build_db(tmp_path / "parcels.sqlite", SCHEMA, ROWS)


def test_every_result_names_the_eleven_semantic_checks_with_their_severities(db: Path) -> None:
    result = check(db, "Which depots are there?", "SELECT city FROM depot")
    severities = {p.name: p.severity for p in result.parts}
    assert {n: severities[n] for n, _ in RULES[10:21]} == {
        "filter_value_exists": "error",
        "filter_satisfiable": "error",
        "join_keys_related": "warning",
        "order_matches_superlative": "error",
        "result_not_empty": "warning",
        "distinct_when_asked": "warning",
        "both_conditions_met": "error",
        "one_answer_one_row": "error",
        "count_not_fanned_out": "error",
        "ranking_value_not_asked": "warning",
        "exclusion_per_entity": "error",
    }
    assert result.passed


# -- filter_value_exists -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT parcel_id FROM parcel JOIN depot USING (depot_id) WHERE depot.city = 'Lyon'",
        "SELECT parcel_id FROM parcel JOIN depot USING (depot_id) WHERE city IN ('Porto', 'Lyon')",
        "SELECT parcel_id FROM parcel JOIN depot USING (depot_id) WHERE city LIKE '%Lyo%'",
        "SELECT parcel_id FROM parcel WHERE status <> 'lost'",
    ],
)
def test_a_filter_value_no_row_of_its_column_holds_fails_hard(db: Path, sql: str) -> None:
    result = check(db, "Which parcels went through the depot?", sql)
    found = part(result, "filter_value_exists")
    assert not found.passed and found.category == "sql_filter_value_exists"
    assert not result.passed


def test_a_value_the_question_names_and_no_column_holds_passes(db: Path) -> None:
    # "none" is the answer: the value is the question's own, not invented nor misplaced
    sql = "SELECT parcel_id FROM parcel WHERE sender = 'Olga'"
    assert part(check(db, "Which parcels did Olga send?", sql), "filter_value_exists").passed
    found = part(check(db, "Which parcels did she send?", sql), "filter_value_exists")
    assert not found.passed


def test_the_failure_names_the_column_that_does_hold_the_value(db: Path) -> None:
    sql = "SELECT depot_id FROM depot JOIN courier ON base_depot = depot_id WHERE city = 'Lyon'"
    reasons = part(check(db, "Depots of couriers from Lyon?", sql), "filter_value_exists").reasons
    assert "courier.home_city holds it" in reasons[0]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT parcel_id FROM parcel JOIN depot USING (depot_id) WHERE depot.city = 'Porto'",
        "SELECT parcel_id FROM parcel WHERE status IN ('DELIVERED', 'in transit')",
        "SELECT parcel_id FROM parcel WHERE sender LIKE 'In%'",
        # another casing of a value that exists is string_filter_case's finding, not this one's
        "SELECT parcel_id FROM parcel WHERE status = 'delivered'",
    ],
)
def test_a_filter_value_that_some_row_holds_passes(db: Path, sql: str) -> None:
    assert part(check(db, "Which parcels?", sql), "filter_value_exists").passed


# -- filter_satisfiable --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT sender FROM parcel WHERE weight < 2 AND weight > 5",
        "SELECT sender FROM parcel WHERE status = 'DELIVERED' AND status = 'in transit'",
        "SELECT sender FROM parcel WHERE weight BETWEEN 1 AND 2 AND weight >= 3",
    ],
)
def test_conditions_no_single_row_can_meet_fail_hard(db: Path, sql: str) -> None:
    found = part(check(db, "Senders of both light and heavy parcels?", sql), "filter_satisfiable")
    assert not found.passed and "no single row" in found.reasons[0]


@pytest.mark.parametrize(
    "sql",
    [
        # a self-join compares two rows: each alias is its own row
        "SELECT DISTINCT a.sender FROM parcel a JOIN parcel b ON a.sender = b.sender "
        "WHERE a.weight < 2 AND b.weight > 5",
        "SELECT sender FROM parcel WHERE weight > 2 AND weight <= 7",
        "SELECT sender FROM parcel WHERE weight < 2 OR weight > 5",
    ],
)
def test_conditions_some_rows_can_meet_pass(db: Path, sql: str) -> None:
    assert part(check(db, "Senders of both?", sql), "filter_satisfiable").passed


@pytest.mark.parametrize(
    "sql",
    [
        # the ON's own column, and the table's primary key (probed: no parcel has a NULL id)
        "SELECT depot.city FROM depot LEFT JOIN parcel ON depot.depot_id = parcel.depot_id "
        "WHERE parcel.status = 'DELIVERED' AND parcel.depot_id IS NULL",
        "SELECT d.city FROM depot AS d LEFT JOIN parcel AS p ON d.depot_id = p.depot_id "
        "WHERE p.parcel_id IS NULL AND p.weight > 5",
    ],
)
def test_an_anti_join_whose_filter_reads_the_missing_row_fails_hard(db: Path, sql: str) -> None:
    result = check(db, "Which depots have no delivered parcel?", sql)
    got = part(result, "filter_satisfiable")
    assert not got.passed and not result.passed
    assert "put it in the LEFT JOIN's ON" in got.reasons[0]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT d.city FROM depot AS d LEFT JOIN parcel AS p ON d.depot_id = p.depot_id "
        "AND p.status = 'DELIVERED' WHERE p.parcel_id IS NULL",
        # a filter on the kept table, not the missing one
        "SELECT d.city FROM depot AS d LEFT JOIN parcel AS p ON d.depot_id = p.depot_id "
        "WHERE p.parcel_id IS NULL AND d.city = 'Porto'",
        # another outer join's ON says nothing of s.place in a matched scan (attack review)
        "SELECT p.parcel_id FROM parcel AS p LEFT JOIN scan AS s ON s.parcel_id = p.parcel_id "
        "LEFT JOIN depot AS d ON s.place = d.city WHERE s.place IS NULL AND s.reading = '2'",
        # under an OR in the ON a matched row may hold the NULL
        "SELECT d.city FROM depot AS d LEFT JOIN parcel AS p ON d.depot_id = p.depot_id "
        "OR p.sender = 'Ines' WHERE p.depot_id IS NULL AND p.status = 'lost'",
    ],
)
def test_an_anti_join_filtering_in_its_on_or_on_the_kept_table_passes(db: Path, sql: str) -> None:
    assert part(
        check(db, "Which depots have no delivered parcel?", sql), "filter_satisfiable"
    ).passed


def test_two_patterns_rows_meet_apart_but_none_together_fail_hard(db: Path) -> None:
    # scans in Porto and scans in Lille exist, no single scan is in both: the result is empty
    sql = "SELECT parcel_id FROM scan WHERE place LIKE '%Porto%' AND place LIKE '%Lille%'"
    result = check(db, "Which parcels were scanned in Porto and Lille?", sql)
    found = part(result, "filter_satisfiable")
    assert not found.passed and "no single row meets both" in found.reasons[0]
    assert not result.passed
    # no scan is in Paris at all: the empty result may be the answer, and it passes
    paris = sql.replace("Lille", "Paris")
    assert part(
        check(db, "Which parcels were scanned in Porto and Paris?", paris), "filter_satisfiable"
    ).passed


# -- join_keys_related ---------------------------------------------------------------------------


def test_a_join_on_two_unrelated_keys_warns(db: Path) -> None:
    sql = "SELECT name FROM parcel JOIN courier ON parcel.parcel_id = courier.courier_id"
    found = part(check(db, "Who carried each parcel?", sql), "join_keys_related")
    assert not found.passed and found.severity == "warning"
    assert "parcel.parcel_id with courier.courier_id" in found.reasons[0]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT city FROM parcel JOIN depot ON parcel.depot_id = depot.depot_id",  # declared
        "SELECT city FROM courier JOIN depot ON courier.base_depot = depot.depot_id",  # named
        "SELECT city FROM parcel, depot WHERE depot.depot_id = parcel.depot_id",
    ],
)
def test_a_join_on_a_foreign_key_or_a_key_named_like_one_passes(db: Path, sql: str) -> None:
    assert part(check(db, "Which cities?", sql), "join_keys_related").passed


# -- order_matches_superlative ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "sql"),
    [
        ("Who sent the heaviest parcel?", "SELECT sender FROM parcel ORDER BY weight LIMIT 1"),
        ("Name the youngest courier.", "SELECT name FROM courier ORDER BY age DESC LIMIT 1"),
    ],
)
def test_an_order_against_the_superlative_fails_hard(db: Path, question: str, sql: str) -> None:
    found = part(check(db, question, sql), "order_matches_superlative")
    assert not found.passed and "the other end" in found.reasons[0]


@pytest.mark.parametrize(
    ("question", "sql"),
    [
        ("Who sent the heaviest parcel?", "SELECT sender FROM parcel ORDER BY weight DESC LIMIT 1"),
        ("Name the youngest courier.", "SELECT name FROM courier ORDER BY age ASC LIMIT 1"),
        # "at least" is a threshold, not an order; both directions named: nothing to compare
        ("Couriers at least 30, by age", "SELECT name FROM courier ORDER BY age DESC LIMIT 2"),
        ("The lightest and the heaviest?", "SELECT sender FROM parcel ORDER BY weight LIMIT 1"),
    ],
)
def test_an_order_in_the_superlatives_direction_passes(db: Path, question: str, sql: str) -> None:
    assert part(check(db, question, sql), "order_matches_superlative").passed


# -- result_not_empty and distinct_when_asked (warnings) -----------------------------------------


def test_an_empty_result_for_a_question_asking_for_rows_warns(db: Path) -> None:
    sql = "SELECT name FROM courier WHERE age > 60"
    result = check(db, "Which couriers are over 60?", sql)
    found = part(result, "result_not_empty")
    assert not found.passed and found.severity == "warning"
    assert part(check(db, "How many couriers are over 60?", sql), "result_not_empty").passed
    assert part(
        check(db, "Which couriers are over 30?", sql.replace("60", "30")), "result_not_empty"
    ).passed


def test_repeated_rows_when_the_question_asks_for_different_values_warn(db: Path) -> None:
    question = "What are the different senders of parcels?"
    found = part(check(db, question, "SELECT sender FROM parcel"), "distinct_when_asked")
    assert not found.passed and found.severity == "warning"
    assert part(
        check(db, question, "SELECT DISTINCT sender FROM parcel"), "distinct_when_asked"
    ).passed
    assert part(
        check(db, "List the senders.", "SELECT sender FROM parcel"), "distinct_when_asked"
    ).passed


# -- no_sum_over_text (check 4): the data decides, not the declared type -------------------------


def test_a_sum_over_numbers_stored_as_text_passes_and_over_words_fails(db: Path) -> None:
    # SQLite sums '1.5' and '2' as numbers; 'null' is a missing value, not a word
    summed = check(db, "What is the total reading?", "SELECT sum(reading) FROM scan")
    assert part(summed, "no_sum_over_text").passed
    words = part(
        check(db, "Total of senders?", "SELECT sum(sender) FROM parcel"), "no_sum_over_text"
    )
    assert not words.passed and "'Ines'" in words.reasons[0]


def test_an_average_over_date_text_passes_and_over_words_mixed_with_dates_fails(
    db: Path,
) -> None:
    # SQLite reads '1988-04-30 01:19:47' as 1988 and '12 kg' as 12: not the silent zero of a word
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE log(log_id INTEGER PRIMARY KEY, stamp TEXT, note TEXT)")
    conn.executemany(
        "INSERT INTO log VALUES (?, ?, ?)",
        [(1, "1988-04-30 01:19:47", "12 kg"), (2, "2001-01-02", "pending"), (3, "n/a", "3")],
    )
    conn.commit()
    conn.close()
    dates = check(db, "What is the average log date?", "SELECT avg(stamp) FROM log")
    assert part(dates, "no_sum_over_text").passed
    words = part(check(db, "Total of notes?", "SELECT sum(note) FROM log"), "no_sum_over_text")
    assert (
        not words.passed and "'pending'" in words.reasons[0] and "'12 kg'" not in words.reasons[0]
    )


# -- both_conditions_met -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT DISTINCT parcel_id FROM scan WHERE place IN ('Porto', 'Lille')",
        "SELECT parcel_id FROM scan WHERE place = 'Porto' OR place = 'Lille'",
    ],
)
def test_both_asked_and_either_answered_fails_hard(db: Path, sql: str) -> None:
    result = check(db, "Which parcels were scanned in Porto and Lille?", sql)
    found = part(result, "both_conditions_met")
    assert not found.passed and "meeting either" in found.reasons[0]
    assert not result.passed


def test_both_answered_with_intersect_or_and_meaning_either_passes(db: Path) -> None:
    both = (
        "SELECT parcel_id FROM scan WHERE place = 'Porto' "
        "INTERSECT SELECT parcel_id FROM scan WHERE place = 'Lille'"
    )
    question = "Which parcels were scanned in Porto and Lille?"
    assert part(check(db, question, both), "both_conditions_met").passed
    # no courier lives in two cities: "and" lists either, and the OR is right
    either = "SELECT name FROM courier WHERE home_city IN ('Lyon', 'Lille')"
    assert part(
        check(db, "Couriers living in Lyon and Lille?", either), "both_conditions_met"
    ).passed


# -- one_answer_one_row --------------------------------------------------------------------------


def test_one_superlative_answered_by_every_groups_row_fails_hard(db: Path) -> None:
    sql = "SELECT sender, min(weight) FROM parcel GROUP BY sender"
    found = part(check(db, "Which sender sent the lightest parcel?", sql), "one_answer_one_row")
    assert not found.passed and "one per group" in found.reasons[0]


@pytest.mark.parametrize(
    ("question", "sql"),
    [
        (
            "Which sender sent the lightest parcel?",
            "SELECT sender FROM parcel GROUP BY sender ORDER BY min(weight) LIMIT 1",
        ),
        ("What is the lightest parcel of each sender?", "SELECT sender, min(weight) FROM parcel "
         "GROUP BY sender"),
    ],
)  # fmt: skip
def test_a_superlative_picked_or_asked_per_group_passes(db: Path, question: str, sql: str) -> None:
    assert part(check(db, question, sql), "one_answer_one_row").passed


# -- count_not_fanned_out -----------------------------------------------------------------------


def test_a_count_of_join_rows_for_how_many_things_fails_hard(db: Path) -> None:
    sql = "SELECT count(*) FROM parcel JOIN scan ON parcel.parcel_id = scan.parcel_id"
    found = part(check(db, "How many parcels were scanned?", sql), "count_not_fanned_out")
    assert not found.passed and "counts 4 join rows" in found.reasons[0]
    assert "3 different parcel" in found.reasons[0]


def test_a_count_the_join_does_not_repeat_passes(db: Path) -> None:
    sql = "SELECT count(*) FROM scan JOIN parcel ON parcel.parcel_id = scan.parcel_id"
    question = "How many scans were of parcels from Ines?"
    assert part(check(db, question, sql + " WHERE sender = 'Ines'"), "count_not_fanned_out").passed
    distinct = sql.replace("count(*)", "count(DISTINCT parcel.parcel_id)")
    assert part(
        check(db, "How many parcels were scanned?", distinct), "count_not_fanned_out"
    ).passed


def test_a_question_counting_two_things_ties_each_count_to_its_own_noun(db: Path) -> None:
    # 2 parcels in Porto's one depot: the count of parcels is right, not a fanned-out depot count
    question = "How many depots are in Porto, and how many parcels do they hold?"
    sql = (
        "SELECT count(*) AS parcels FROM parcel p JOIN depot d ON d.depot_id = p.depot_id "
        "WHERE d.city = 'Porto'"
    )
    assert part(check(db, question, sql), "count_not_fanned_out").passed
    # no alias and both nouns name a table the query reads: it cannot tell, and passes
    bare = sql.replace(" AS parcels", "")
    assert part(check(db, question, bare), "count_not_fanned_out").passed
    # the alias names the parcels, and the scans join repeats parcel 10: 3 rows, 2 parcels
    scanned = (
        "SELECT count(*) AS parcels FROM parcel p JOIN scan s ON s.parcel_id = p.parcel_id "
        "JOIN depot d ON d.depot_id = p.depot_id WHERE d.city = 'Porto'"
    )
    found = part(
        check(db, "How many depots are in Porto, and how many parcels were scanned?", scanned),
        "count_not_fanned_out",
    )
    assert not found.passed and "counts 3 join rows" in found.reasons[0]
    assert "2 different parcel" in found.reasons[0]


# -- ranking_value_not_asked (warning) ------------------------------------------------------------


def test_the_ranking_aggregate_returned_unasked_warns(db: Path) -> None:
    sql = "SELECT sender, count(*) FROM parcel GROUP BY sender ORDER BY count(*) DESC LIMIT 1"
    found = part(check(db, "Which sender sent the most parcels?", sql), "ranking_value_not_asked")
    assert not found.passed and found.severity == "warning"
    asked = check(db, "Which sender sent the most parcels, and how many?", sql)
    assert part(asked, "ranking_value_not_asked").passed
    alone = sql.replace("sender, count(*)", "sender")
    assert part(
        check(db, "Which sender sent the most parcels?", alone), "ranking_value_not_asked"
    ).passed


def test_the_count_ranked_by_warns_when_the_question_says_least_number_of(db: Path) -> None:
    # "the least number of parcels" says how the sender is ranked; it asks for no count
    sql = "SELECT sender, count(*) AS n FROM parcel GROUP BY sender ORDER BY n ASC LIMIT 1"
    question = "Which sender sent the least number of parcels?"
    found = part(check(db, question, sql), "ranking_value_not_asked")
    assert not found.passed and "count(*) as n" in found.reasons[0].lower()
    asked = "Which sender sent the fewest parcels, and what is the number of them?"
    assert part(check(db, asked, sql), "ranking_value_not_asked").passed


# -- exclusion_per_entity -------------------------------------------------------------------------

ANTI = (
    "SELECT depot.city FROM depot LEFT JOIN parcel ON depot.depot_id = parcel.depot_id "
    "WHERE parcel.{col} != '{value}' OR parcel.{col} IS NULL"
)


def test_a_left_join_unequal_keeping_an_excluded_thing_through_other_rows_fails_hard(
    db: Path,
) -> None:
    # both depots have a delivered parcel; Porto comes back through its parcel in transit
    sql = ANTI.format(col="status", value="DELIVERED")
    result = check(db, "Which depots have no delivered parcel?", sql)
    found = part(result, "exclusion_per_entity")
    assert not found.passed and "kept through other rows" in found.reasons[0]
    assert not result.passed


def test_an_exclusion_that_keeps_nothing_excluded_or_asks_for_rows_passes(db: Path) -> None:
    # Porto's parcels are all from Ines: the LEFT JOIN form happens to be right for Marc
    sql = ANTI.format(col="sender", value="Marc")
    assert part(
        check(db, "Which depots have no parcel from Marc?", sql), "exclusion_per_entity"
    ).passed
    # no "OR ... IS NULL": the rows with another status are what the question asks for
    rows = ANTI.format(col="status", value="DELIVERED").split(" OR ")[0]
    assert part(
        check(db, "Which depots hold a parcel that is not delivered?", rows),
        "exclusion_per_entity",
    ).passed
