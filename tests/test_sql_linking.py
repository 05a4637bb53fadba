"""``sql_evidence``'s linking checks: a query that runs but reads the wrong thing (a join on
columns that share no value, a filter on a table other than the one holding the question's
value, a shorter sibling of the column the question names, ``NOT IN`` over a list holding
``NULL``), on a schema unlike Spider's (a library: authors, books, genres, loans).

Each check gets a failing case and a passing twin through the public check kind.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from firstpass.checks._sql import RULES
from tests.sql_checking import build_db, check, part

SCHEMA = """
CREATE TABLE author(author_id INTEGER PRIMARY KEY, name TEXT, birth_name TEXT, country TEXT,
                    AuthorKind TEXT);
CREATE TABLE book(book_id INTEGER PRIMARY KEY, author_id INTEGER REFERENCES author(author_id),
                  title TEXT, genre_code TEXT, shelf INTEGER, author_name TEXT);
CREATE TABLE genre(genre_code TEXT PRIMARY KEY, description TEXT);
CREATE TABLE loan(loan_id INTEGER PRIMARY KEY, book_id INTEGER, reader TEXT, "order" INTEGER);
"""
ROWS: dict[str, list[tuple[object, ...]]] = {
    # two authors share a name (a heteronym's books filed under it)
    "author": [(1, "George Eliot", "Mary Ann Evans", "UK", "heteronym"),
               (2, "Pessoa", "Fernando Pessoa", "PT", "orthonym"),
               (3, "Pessoa", "Ricardo Reis", "PT", "heteronym")],
    "book": [(1, 1, "Middlemarch", "NOV", 4, "George Eliot"), (2, 2, "Mensagem", "POE", 7, "Pessoa"),
             (3, 2, "Livro do Desassossego", "PRO", 7, "Pessoa"), (4, 3, "Odes", "POE", 9, "Pessoa")],
    "genre": [("NOV", "Novel"), ("POE", "Poetry"), ("PRO", "Prose")],
    # a loan whose book is not recorded: book_id NULL
    "loan": [(1, 1, "Ines", 1), (2, None, "Marc", 2), (3, 2, "Ines", 3)],
}  # fmt: skip


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return build_db(tmp_path / "library.sqlite", SCHEMA, ROWS)


def test_every_result_names_the_four_linking_checks_as_errors(db: Path) -> None:
    result = check(db, "Which books are there?", "SELECT title FROM book")
    severities = {p.name: p.severity for p in result.parts}
    assert {n: severities[n] for n, _ in RULES[21:]} == {
        "join_keys_share_values": "error",
        "column_the_question_names": "error",
        "not_in_list_without_null": "error",
        "groups_by_the_entity": "error",
    }


# -- a join on columns that share no value ----------------------------------------------------


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT b.title FROM book AS b JOIN genre AS g ON b.shelf = g.genre_code",
        "SELECT b.title FROM book b, genre g WHERE g.genre_code = b.author_id",
        'SELECT l.reader FROM loan AS l JOIN genre AS g ON l."order" = g.genre_code',
        "SELECT title FROM book WHERE shelf IN (SELECT genre_code FROM genre)",
        # a key against an attribute that shares no value with it: failed, though "none" could
        # be right (docs/checks.md names this false alarm; on Spider every such join was wrong)
        "SELECT a.name FROM author AS a JOIN genre AS g ON a.AuthorKind = g.genre_code",
    ],
)
def test_a_join_on_columns_that_share_no_value_fails_hard(db: Path, sql: str) -> None:
    result = check(db, "Which books belong to a genre?", sql)
    got = part(result, "join_keys_share_values")
    assert not got.passed and not result.passed
    assert "pairs no rows" in got.reasons[0]


@pytest.mark.parametrize(
    "sql",
    [
        # undeclared but sharing values; a declared foreign key; a self-join
        "SELECT b.title, g.description FROM book AS b JOIN genre AS g ON b.genre_code = g.genre_code",
        "SELECT a.name, b.title FROM author AS a JOIN book AS b ON a.author_id = b.author_id",
        "SELECT x.title FROM book AS x JOIN book AS y ON x.shelf = y.shelf AND x.book_id < y.book_id",
        # found by the attack review: no pair meeting is the point of an anti-join
        "SELECT DISTINCT reader FROM loan AS l WHERE NOT EXISTS "
        "(SELECT 1 FROM genre AS g WHERE g.genre_code = l.book_id)",
        "SELECT l.reader FROM loan AS l LEFT JOIN genre AS g ON g.genre_code = l.book_id "
        "WHERE g.genre_code IS NULL",
        "SELECT reader FROM loan EXCEPT SELECT l.reader FROM loan AS l JOIN genre AS g "
        "ON g.genre_code = l.book_id",
        # two names that never meet: "none" may be right ("readers who are authors")
        "SELECT DISTINCT l.reader FROM loan AS l JOIN author AS a ON a.name = l.reader",
        # an alias reused in a subquery for another table; a CTE's column named like a table's
        "SELECT b.title FROM book AS b JOIN genre AS g ON b.genre_code = g.genre_code "
        "WHERE b.book_id IN (SELECT b.loan_id FROM loan AS b)",
        "WITH c AS (SELECT genre_code AS code FROM genre) "
        "SELECT b.title FROM book AS b JOIN c ON b.genre_code = code",
        "SELECT description FROM genre WHERE genre_code IN (SELECT genre_code FROM book)",
        "SELECT description FROM genre WHERE genre_code NOT IN (SELECT genre_code FROM book)",
        # found by the second attack review: NOT IN a list sharing no value rightly excludes
        # nothing ("customers in a zip code where no store is"); an IN needs a declared key
        "SELECT description FROM genre WHERE genre_code NOT IN "
        "(SELECT book_id FROM loan WHERE book_id IS NOT NULL)",
        "SELECT title FROM book WHERE genre_code IN (SELECT reader FROM loan)",
    ],
)
def test_a_join_on_columns_that_share_values_passes(db: Path, sql: str) -> None:
    assert part(check(db, "Which books have a genre?", sql), "join_keys_share_values").passed


# -- the question's value, held only by a table the query does not read ----------------------


def test_a_quoted_value_only_a_table_the_query_does_not_read_holds_passes(db: Path) -> None:
    """ "none" is the right answer: no author is called 'Poetry', though a genre's description is
    (found by the attack review: a city or a code the question names is often held elsewhere)."""
    result = check(
        db,
        "Which authors are called 'Poetry'?",
        "SELECT author_id FROM author WHERE name = 'Poetry'",
    )
    assert part(result, "filter_value_exists").passed


# -- the column the question names ------------------------------------------------------------


@pytest.mark.parametrize(
    "question",
    [
        "What are the birth names of the authors from PT?",
        "Show the name at birth, that is the name of the birth, of authors from PT.",
        "Give the name and the country of birth of the authors from PT.",
    ],
)
def test_a_shorter_sibling_of_the_column_the_question_names_fails_hard(
    db: Path, question: str
) -> None:
    result = check(db, question, "SELECT name FROM author WHERE country = 'PT'")
    got = part(result, "column_the_question_names")
    assert not got.passed and not result.passed
    assert "author.birth_name" in got.reasons[0]


@pytest.mark.parametrize(
    ("question", "sql"),
    [
        ("What are the birth names of the authors from PT?",
         "SELECT birth_name FROM author WHERE country = 'PT'"),
        ("What are the names of the authors from PT?",
         "SELECT name FROM author WHERE country = 'PT'"),
        # both asked, both read
        ("Give the name and the birth name of the authors from PT.",
         "SELECT name, birth_name FROM author WHERE country = 'PT'"),
        # "birth" and "name" said apart, not as the column's phrase
        ("What is the name of the author whose birth year is unknown?",
         "SELECT name FROM author"),
        # the phrase's rest is the returned column's own table: the author's name, not
        # book.author_name (found by the attack review)
        ("What is the name of the author of 'Odes'?",
         "SELECT a.name FROM book AS b JOIN author AS a ON a.author_id = b.author_id "
         "WHERE b.title = 'Odes'"),
        # "birth" begins a compound ("birth certificate"), not the column's phrase (attack review)
        ("Give the name for every birth certificate holder.", "SELECT name FROM author"),
        # a qualified name: the author's, though "of birth" follows
        ("Show the author name and the place of birth of authors from PT.",
         "SELECT name, country FROM author WHERE country = 'PT'"),
    ],
)  # fmt: skip
def test_the_column_the_question_names_or_a_name_not_asked_as_a_phrase_passes(
    db: Path, question: str, sql: str
) -> None:
    assert part(check(db, question, sql), "column_the_question_names").passed


# -- NOT IN over a list holding NULL ----------------------------------------------------------


def test_not_in_over_a_subquery_returning_null_fails_hard(db: Path) -> None:
    result = check(
        db,
        "Which books were never loaned?",
        "SELECT title FROM book WHERE book_id NOT IN (SELECT book_id FROM loan)",
    )
    got = part(result, "not_in_list_without_null")
    assert not got.passed and not result.passed
    assert "never true" in got.reasons[0]


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT title FROM book WHERE book_id NOT IN "
        "(SELECT book_id FROM loan WHERE book_id IS NOT NULL)",
        "SELECT title FROM book AS b WHERE NOT EXISTS "
        "(SELECT 1 FROM loan AS l WHERE l.book_id = b.book_id)",
        "SELECT title FROM book WHERE book_id NOT IN (SELECT author_id FROM author)",
        # correlated: the subquery does not run alone, and nothing is claimed
        "SELECT title FROM book AS b WHERE b.book_id NOT IN "
        "(SELECT l.book_id FROM loan AS l WHERE l.reader = b.title)",
        "SELECT title FROM book WHERE book_id IN (SELECT book_id FROM loan)",
        # found by the attack review: under another NOT or an OR, rows come from elsewhere
        "SELECT title FROM book WHERE NOT (book_id NOT IN (SELECT book_id FROM loan))",
        "SELECT title FROM book WHERE book_id NOT IN (SELECT book_id FROM loan) OR shelf = 7",
    ],
)
def test_not_in_over_a_list_without_null_or_in_passes(db: Path, sql: str) -> None:
    assert part(check(db, "Which books were never loaned?", sql), "not_in_list_without_null").passed


# -- "for each <thing>" grouped by a value things share ---------------------------------------


def test_for_each_thing_grouped_by_a_name_two_things_share_fails_hard(db: Path) -> None:
    result = check(
        db,
        "For each author, how many books are there?",
        "SELECT a.name, count(*) FROM author AS a JOIN book AS b ON a.author_id = b.author_id "
        "GROUP BY a.name",
    )
    got = part(result, "groups_by_the_entity")
    assert not got.passed and not result.passed
    assert "2 groups; by author.author_id too, 3" in got.reasons[0]


@pytest.mark.parametrize(
    ("question", "sql"),
    [
        ("For each author, how many books are there?",
         "SELECT a.name, count(*) FROM author AS a JOIN book AS b ON a.author_id = b.author_id "
         "GROUP BY a.author_id"),
        # grouped by the foreign key a condition equates with the key
        ("For each author, how many books are there?",
         "SELECT a.name, count(*) FROM author AS a JOIN book AS b ON a.author_id = b.author_id "
         "GROUP BY b.author_id"),
        # a name no two things share
        ("For each genre, how many books are there?",
         "SELECT g.description, count(*) FROM genre AS g JOIN book AS b "
         "ON g.genre_code = b.genre_code GROUP BY g.description"),
        # grouped by what the question says, not by the thing
        # "each author kind" is AuthorKind (read lower-cased: "authorkind", no word break)
        ("How many authors are there for each author kind?",
         "SELECT AuthorKind, count(*) FROM author GROUP BY AuthorKind"),
        ("How many books does each author name have?",
         "SELECT a.name, count(*) FROM author AS a JOIN book AS b ON a.author_id = b.author_id "
         "GROUP BY a.name"),
    ],
)  # fmt: skip
def test_for_each_thing_grouped_by_its_key_or_an_unshared_value_passes(
    db: Path, question: str, sql: str
) -> None:
    assert part(check(db, question, sql), "groups_by_the_entity").passed


# -- an exclusion of things written as "<>" on their rows (exclusion_per_entity) ---------------


def test_things_that_do_not_have_a_value_answered_by_unequal_rows_fail_hard(db: Path) -> None:
    """Pessoa wrote poetry and prose: "<> 'POE'" keeps him through his prose."""
    result = check(
        db,
        "List the authors who have no 'POE' book.",
        "SELECT DISTINCT a.author_id FROM author AS a JOIN book AS b "
        "ON a.author_id = b.author_id WHERE b.genre_code <> 'POE'",
    )
    got = part(result, "exclusion_per_entity")
    assert not got.passed and not result.passed


@pytest.mark.parametrize(
    ("question", "sql"),
    [
        # the negation belongs to the book, whose table holds the "<>"
        ("Which authors wrote a book that is not poetry?",
         "SELECT DISTINCT a.author_id FROM author AS a JOIN book AS b "
         "ON a.author_id = b.author_id WHERE b.genre_code <> 'POE'"),
        ("List the authors who have not written poetry.",
         "SELECT author_id FROM author EXCEPT SELECT author_id FROM book WHERE genre_code = 'POE'"),
        # no author kept has poetry too
        ("List the authors who are not from 'PT'.",
         "SELECT author_id FROM author WHERE country <> 'PT'"),
        # found by the attack review: a noun that names no table ("staff"), a value the
        # negation does not reach, a LIMIT the twin would drop
        ("Which authors have staff that are not on 'POE' books?",
         "SELECT DISTINCT a.author_id FROM author AS a JOIN book AS b "
         "ON a.author_id = b.author_id WHERE b.genre_code <> 'POE'"),
        ("List authors who are not dead and whose books are in genres other than 'POE'.",
         "SELECT DISTINCT a.author_id FROM author AS a JOIN book AS b "
         "ON a.author_id = b.author_id WHERE b.genre_code <> 'POE'"),
        ("Which author with the largest id has no 'POE' book?",
         "SELECT DISTINCT a.author_id FROM author AS a JOIN book AS b "
         "ON a.author_id = b.author_id WHERE b.genre_code <> 'POE' ORDER BY a.author_id LIMIT 1"),
    ],
)  # fmt: skip
def test_an_unequal_whose_negation_is_its_own_rows_or_keeps_nothing_excluded_passes(
    db: Path, question: str, sql: str
) -> None:
    assert part(check(db, question, sql), "exclusion_per_entity").passed
