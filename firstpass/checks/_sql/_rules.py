"""The ten checks of ``sql_evidence``, each a named sub-result: pure functions over the question,
the answer, the evidence and the database (read-only).

Hard checks (severity ``error``) fail on something concrete: a table that does not exist, a
rerun that returns other rows, a number the evidence does not hold, SUM over text, a filter
whose exact casing matches nothing while another casing does, a NULL date group, a value told
under the wrong aggregate. Heuristics (severity ``warning``) compare the SQL with the question's
wording; they warn on valid SQL and miss semantic mistakes. A rerun proves repeatability, not
truth.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from firstpass.checks._base import Options
from firstpass.checks._result import CheckResult, Severity
from firstpass.checks._sql._db import Database, RerunError, Schema, quote
from firstpass.checks._sql._evidence import Evidence
from firstpass.checks._sql._numbers import evidence_numbers, holds, stated_numbers

__all__ = ["RULES", "Facts", "Parsed", "parse_evidence"]

#: names and severities of the ten checks, in the issue's order
RULES: tuple[tuple[str, Severity], ...] = (
    ("tables_exist", "error"),
    ("rerun_matches", "error"),
    ("numbers_in_evidence", "error"),
    ("no_sum_over_text", "error"),
    ("string_filter_case", "error"),
    ("aggregate_matches_question", "warning"),
    ("question_columns_used", "warning"),
    ("join_when_two_tables", "warning"),
    ("date_group_not_null", "error"),
    ("aggregates_attributed", "error"),
)

_AGG_WORDS: dict[str, tuple[str, ...]] = {
    "avg": ("average", "mean", "avg"),
    "max": ("maximum", "max", "highest", "largest", "biggest", "most", "oldest", "latest"),
    "min": ("minimum", "min", "lowest", "smallest", "least", "fewest", "youngest", "earliest"),
    "sum": ("total", "sum"),
    "count": ("how many", "number of", "count"),
}
_AGG_OF = {exp.Avg: "avg", exp.Max: "max", exp.Min: "min", exp.Sum: "sum", exp.Count: "count"}
_WORD = re.compile(r"[a-z0-9]+")
#: the longest SQL text parsed (a query an analyst writes is far shorter; parsing is CPU work)
MAX_SQL_CHARS = 20_000
#: rows compared value by value (with rounding) at most; above it, the multisets must be equal
MAX_ROUNDED_ROWS = 500
_STOP_COLUMNS = frozenset({"id", "the", "of", "and", "in", "is", "to", "a"})


@dataclass(frozen=True, kw_only=True)
class Parsed:
    """One evidence item with its SQL parsed (``tree`` None: sqlglot could not parse it)."""

    evidence: Evidence
    tree: exp.Expr | None
    error: str | None = None
    #: alias or name → real table name, for the tables the query reads (CTEs left out)
    tables: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Facts:
    """What every check reads."""

    question: str
    answer: str
    items: tuple[Parsed, ...]
    db: Database
    schema: Schema
    rerun_ms: float
    budget_s: float
    #: rerun every query, whatever the evidence claims of its time (``rerun = "all"``)
    rerun_all: bool = False


def parse_evidence(items: Iterable[Evidence]) -> tuple[Parsed, ...]:
    out: list[Parsed] = []
    for item in items:
        if len(item.sql) > MAX_SQL_CHARS:
            out.append(Parsed(evidence=item, tree=None, error="too long to parse"))
            continue
        try:
            trees = [t for t in sqlglot.parse(item.sql, read="sqlite") if t is not None]
        except RecursionError:
            out.append(Parsed(evidence=item, tree=None, error="nested too deeply to parse"))
            continue
        except (sqlglot.errors.ParseError, sqlglot.errors.TokenError, ValueError) as exc:
            out.append(Parsed(evidence=item, tree=None, error=str(exc).splitlines()[0][:200]))
            continue
        if len(trees) != 1:
            out.append(Parsed(evidence=item, tree=None, error=f"{len(trees)} statements"))
            continue
        tree = trees[0]
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        tables = {
            t.alias_or_name.lower(): t.name
            for t in tree.find_all(exp.Table)
            if t.name and t.name.lower() not in ctes
        }
        out.append(Parsed(evidence=item, tree=tree, tables=tables))
    return tuple(out)


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def _result(
    name: str, severity: Severity, problems: list[str], *, skipped: str | None = None
) -> CheckResult:
    options = Options(name=name, severity=severity)
    if skipped is not None:
        return options.result(
            "sql_evidence", verdict="pass", score=1.0, reasons=(f"skipped: {skipped}",),
            details={"skipped": True},
        )  # fmt: skip
    if not problems:
        return options.result("sql_evidence", verdict="pass", score=1.0)
    return options.result(
        "sql_evidence",
        verdict="fail",
        score=0.0,
        reasons=tuple(problems),
        category=f"sql_{name}",
        needs_revision=True,
    )


# -- 1. tables exist -----------------------------------------------------------------------------


def tables_exist(f: Facts) -> CheckResult:
    parsed = [p for p in f.items if p.tree is not None]
    if not parsed:
        return _result("tables_exist", "error", [], skipped="no query parses")
    missing = sorted(
        {t for p in parsed for t in p.tables.values() if t.lower() not in f.schema.tables}
    )
    problems = [f"table {t!r} does not exist in the database" for t in missing]
    return _result("tables_exist", "error", problems)


# -- 2. cheap queries rerun to the same rows -----------------------------------------------------


def _cell(v: object) -> object:
    """A cell as compared across a rerun: numbers (and numeric text, as a harness may send
    them) as floats to 9 significant digits, bytes as hex."""
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, int | float):
        try:
            number = float(v)
        except OverflowError:  # an integer past a float's range: compared as its digits
            return str(v)
        return float(f"{number:.9g}") if math.isfinite(number) else None
    if isinstance(v, str) and v.strip() and len(v) < 40:
        try:
            number = float(v.replace(",", ""))
        except ValueError:
            return v
        return float(f"{number:.9g}") if math.isfinite(number) else v
    if isinstance(v, bytes):
        return v.hex()
    return v


def _same_rows(recorded: Sequence[Sequence[object]], rerun: Sequence[Sequence[object]]) -> bool:
    """The same rows as multisets; a number recorded with fewer digits (a harness rounding
    1496.1875 to 1496.19) matches within half a unit of its last digit."""
    if Counter(tuple(map(_cell, r)) for r in recorded) == Counter(
        tuple(map(_cell, r)) for r in rerun
    ):
        return True
    if len(recorded) != len(rerun) or len(recorded) > MAX_ROUNDED_ROWS:
        return False
    left = sorted((tuple(map(_cell, r)) for r in rerun), key=repr)
    pending = [tuple(r) for r in recorded]
    for row in left:
        match = next((i for i, rec in enumerate(pending) if _rounded_equal(rec, row)), None)
        if match is None:
            return False
        pending.pop(match)
    return True


def _rounded_equal(recorded: Sequence[object], rerun: Sequence[object]) -> bool:
    if len(recorded) != len(rerun):
        return False
    for rec, value in zip(recorded, rerun, strict=True):
        if _cell(rec) == value:
            continue
        numbers = stated_numbers(str(rec)) if isinstance(rec, int | float | str) else []
        if not (
            len(numbers) == 1
            and isinstance(value, float)
            and holds(numbers[0], [value])
            and not numbers[0].percent
        ):
            return False
    return True


def rerun_matches(f: Facts) -> CheckResult:
    problems: list[str] = []
    skipped: list[str] = []
    reran = 0
    for i, p in enumerate(f.items):
        e = p.evidence
        why_not = None
        if e.rows is None:
            why_not = "no recorded rows"
        elif e.truncated:
            why_not = "its result was truncated"
        elif f.rerun_all:
            pass
        elif e.elapsed_ms is None or e.elapsed_ms > f.rerun_ms:
            took = "no recorded time" if e.elapsed_ms is None else f"{e.elapsed_ms:.0f} ms"
            why_not = f"not cheap ({took}; reruns at most {f.rerun_ms:.0f} ms)"
        if (
            (why_not is not None or e.rows is None)
            and p.tree is not None
            and not isinstance(p.tree, exp.Query)
        ):
            problems.append(f"query {i} is not a query (only SELECT and WITH are accepted)")
            continue
        if why_not is not None or e.rows is None:
            # not rerun, but it must at least compile (EXPLAIN prepares it, runs nothing)
            error = f.db.compile_error(e.sql, budget_s=f.budget_s)
            if error is not None:
                problems.append(f"query {i} does not run on this database: {error}")
            else:
                skipped.append(f"query {i}: {why_not}; it compiles")
            continue
        reran += 1
        if p.tree is not None and not isinstance(p.tree, exp.Query):
            problems.append(f"query {i} is not a query (only SELECT and WITH are rerun)")
            continue
        try:
            rows = f.db.run(e.sql, budget_s=f.budget_s)
        except RerunError as exc:
            problems.append(f"query {i} failed when rerun: {exc}")
            continue
        if not _same_rows(e.rows, rows):
            what = "other values" if len(rows) == len(e.rows) else f"{len(rows)} rows"
            problems.append(
                f"query {i} returned {what} when rerun than the {len(e.rows)} rows recorded"
            )
    if not reran and not problems:
        return _result("rerun_matches", "error", [], skipped="; ".join(skipped) or "no queries")
    return _result("rerun_matches", "error", problems)


# -- 3. every stated number is in the evidence --------------------------------------------------


def numbers_in_evidence(f: Facts) -> CheckResult:
    with_rows = [p.evidence for p in f.items if p.evidence.rows is not None]
    if not with_rows:
        return _result("numbers_in_evidence", "error", [], skipped="no recorded result rows")
    cells = [c for e in with_rows for row in e.rows or () for c in row]
    values = evidence_numbers(cells)
    # numbers inside text cells count too ("mazda rx-7 gs", "ford galaxie 500")
    values += [n.value for c in cells if isinstance(c, str) for n in stated_numbers(c)]
    values += [float(len(e.rows or ())) for e in with_rows]  # "there are 3 ..." counts rows
    values += [n.value for n in stated_numbers(f.question)]  # restating the question is fine
    missing = [n.text for n in stated_numbers(f.answer) if not holds(n, values)]
    problems = [f"the answer states {t}, which no result cell holds" for t in missing[:10]]
    return _result("numbers_in_evidence", "error", problems)


# -- helpers over parsed SQL --------------------------------------------------------------------


def _column_table(p: Parsed, column: exp.Column, schema: Schema) -> str | None:
    """The real table a column reference reads, when it can be told."""
    if column.table:
        return p.tables.get(column.table.lower())
    owners = [
        t for t in p.tables.values() if column.name.lower() in schema.columns.get(t.lower(), {})
    ]
    return owners[0] if len(owners) == 1 else None


def _text_type(declared: str | None) -> bool:
    return declared is not None and any(k in declared for k in ("CHAR", "TEXT", "CLOB"))


# -- 4. SUM / AVG / TOTAL not over a text column -------------------------------------------------


def no_sum_over_text(f: Facts) -> CheckResult:
    problems: list[str] = []
    for p in f.items:
        if p.tree is None:
            continue
        calls: list[exp.Expr] = [*p.tree.find_all(exp.Sum), *p.tree.find_all(exp.Avg)]
        calls += [a for a in p.tree.find_all(exp.Anonymous) if str(a.this).lower() == "total"]
        for call in calls:
            arg = (
                call.this
                if not isinstance(call, exp.Anonymous)
                else (call.expressions or [None])[0]
            )
            if not isinstance(arg, exp.Column):
                continue
            table = _column_table(p, arg, f.schema)
            if table is None or not _text_type(f.schema.column_type(table, arg.name)):
                continue
            col = quote(arg.name)
            wordy = f.db.count(
                f"SELECT count(*) FROM {quote(table)} WHERE typeof({col}) = 'text' "
                f"AND trim({col}) <> '' AND {col} NOT GLOB '*[0-9]*'",
                (),
                budget_s=f.budget_s,
            )
            if wordy:
                problems.append(
                    f"{call.sql(dialect='sqlite')} adds up {table}.{arg.name}, a text column "
                    f"with {wordy} non-numeric values"
                )
    return _result("no_sum_over_text", "error", problems)


# -- 5. exact-case string filters ----------------------------------------------------------------


def string_filter_case(f: Facts) -> CheckResult:
    problems: list[str] = []
    for p in f.items:
        if p.tree is None:
            continue
        for eq in p.tree.find_all(exp.EQ):
            column, literal = eq.this, eq.expression
            if isinstance(literal, exp.Column) and isinstance(column, exp.Literal):
                column, literal = literal, column
            if not (
                isinstance(column, exp.Column)
                and isinstance(literal, exp.Literal)
                and literal.is_string
            ):
                continue
            table = _column_table(p, column, f.schema)
            if table is None or column.name.lower() not in f.schema.columns.get(table.lower(), {}):
                continue
            value = literal.this
            where = f"SELECT count(*) FROM {quote(table)} WHERE {quote(column.name)} = ?"
            exact = f.db.count(where, (value,), budget_s=f.budget_s)
            other = f.db.count(where + " COLLATE NOCASE", (value,), budget_s=f.budget_s)
            if exact == 0 and other:
                problems.append(
                    f"{column.sql()} = {literal.sql()} matches no row, but {other} rows have "
                    "that value in another casing"
                )
    return _result("string_filter_case", "error", problems)


# -- 6. the aggregate matches the question's wording ---------------------------------------------


def _aggregates(tree: exp.Expr) -> set[str]:
    found = {kind for cls, kind in _AGG_OF.items() if any(True for _ in tree.find_all(cls))}
    for order in tree.find_all(exp.Order):
        limited = tree.args.get("limit") is not None
        if limited:
            descending = any(o.args.get("desc") for o in order.expressions)
            found.add("max" if descending else "min")
    return found


def aggregate_matches_question(f: Facts) -> CheckResult:
    parsed = [p for p in f.items if p.tree is not None]
    if not parsed:
        return _result("aggregate_matches_question", "warning", [], skipped="no query parses")
    question = " " + " ".join(_words(f.question)) + " "
    used = set().union(*(_aggregates(p.tree) for p in parsed if p.tree is not None))
    # an aggregate word that names a column the SQL reads ("number of products" for
    # Number_products, "average attendance" for a column Average) is the column, not a request
    column_words = {
        w
        for p in parsed
        if p.tree is not None
        for c in p.tree.find_all(exp.Column)
        for w in c.name.lower().split("_")
    }
    problems: list[str] = []
    for kind in ("avg", "count"):
        said = [
            w
            for w in _AGG_WORDS[kind]
            if f" {w} " in question and not set(w.split()) & column_words
        ]
        if said and kind not in used:
            problems.append(f"the question says {said[0]!r} but the SQL has no {kind.upper()}")
    if (
        " average " in question
        and "average" not in column_words
        and "sum" in used
        and ("avg" not in used)
    ):
        problems.append("the question asks for an average but the SQL sums")
    return _result("aggregate_matches_question", "warning", problems)


# -- 7. a column the question names is used -------------------------------------------------------


def question_columns_used(f: Facts) -> CheckResult:
    parsed = [p for p in f.items if p.tree is not None]
    if not parsed:
        return _result("question_columns_used", "warning", [], skipped="no query parses")
    asked = set(_words(f.question))
    used = {
        w
        for p in parsed
        if p.tree is not None
        for c in p.tree.find_all(exp.Column)
        for w in c.name.lower().split("_")
    }
    stars = any(any(True for _ in p.tree.find_all(exp.Star)) for p in parsed if p.tree is not None)
    problems: list[str] = []
    for table in sorted({t.lower() for p in parsed for t in p.tables.values()}):
        for column in f.schema.columns.get(table, {}):
            tokens = [w for w in column.split("_") if w]
            if len(tokens) != 1 or len(tokens[0]) < 4 or tokens[0] in _STOP_COLUMNS:
                continue  # one meaningful word: "age", "country"; not "singer_id"
            word = tokens[0]
            if _named(word, set(f.schema.tables)):
                continue  # the word names a table: the question names the table
            if word in asked and word not in used and not stars:
                problems.append(
                    f"the question names {word!r} ({table}.{column}); the SQL never uses it"
                )
    return _result("question_columns_used", "warning", problems[:5])


# -- 8. a join when the question spans two tables --------------------------------------------------


def _named(table: str, words: set[str]) -> bool:
    t = table.lower()
    return t in words or t.rstrip("s") in words or f"{t}s" in words


def join_when_two_tables(f: Facts) -> CheckResult:
    parsed = [p for p in f.items if p.tree is not None]
    if not parsed:
        return _result("join_when_two_tables", "warning", [], skipped="no query parses")
    words = set(_words(f.question.replace("_", " ")))
    named = [real for low, real in f.schema.tables.items() if _named(low, words)]
    read = {t.lower() for p in parsed for t in p.tables.values()}
    problems: list[str] = []
    lowered = {n.lower() for n in named}
    # only when the table read is one the question names: a link table read alone (has_pet
    # for "students with pets") may answer for both
    if len(named) >= 2 and len(read) == 1 and next(iter(read)) in lowered:
        only = next(iter(read))
        real = f.schema.tables.get(only, only)
        for other in named:
            if other.lower() == only:
                continue
            shared = set(f.schema.columns.get(only, {})) & set(
                f.schema.columns.get(other.lower(), {})
            )
            if shared:
                problems.append(
                    f"the question names {real!r} and {other!r}, which share "
                    f"{', '.join(sorted(shared)[:3])}; the SQL reads only {real!r}"
                )
    return _result("join_when_two_tables", "warning", problems)


# -- 9. grouping by a date expression gives no NULL key --------------------------------------------


def date_group_not_null(f: Facts) -> CheckResult:
    problems: list[str] = []
    checked = 0
    for i, p in enumerate(f.items):
        if p.tree is None or p.evidence.rows is None:
            continue
        group = p.tree.args.get("group")
        if group is None or not isinstance(p.tree, exp.Select):
            continue
        raw_selects = list(p.tree.selects)
        selects = [s.unalias() if isinstance(s, exp.Alias) else s for s in raw_selects]
        aliases = {s.alias.lower(): j for j, s in enumerate(raw_selects) if s.alias}
        for g in group.expressions:
            # the key as grouped: an expression, a select alias, or a select position
            position: int | None = None
            if isinstance(g, exp.Literal) and g.is_int and 1 <= int(g.this) <= len(selects):
                position = int(g.this) - 1
            elif isinstance(g, exp.Column) and not g.table and g.name.lower() in aliases:
                position = aliases[g.name.lower()]
            elif not isinstance(g, exp.Column | exp.Literal):
                text = g.sql(dialect="sqlite")
                position = next(
                    (j for j, s in enumerate(selects) if s.sql(dialect="sqlite") == text), None
                )
            if position is None or isinstance(selects[position], exp.Column | exp.Literal):
                continue  # a plain column is no date expression
            checked += 1
            nulls = sum(
                1 for row in p.evidence.rows if position < len(row) and row[position] is None
            )
            if nulls:
                problems.append(
                    f"query {i} groups by {selects[position].sql(dialect='sqlite')}, and "
                    f"{nulls} result row(s) have a NULL key: some values did not parse as dates"
                )
    if not checked and not problems:
        return _result("date_group_not_null", "error", [], skipped="no selected expression grouped")
    return _result("date_group_not_null", "error", problems)


# -- 10. values of a multi-aggregate row are told under the right aggregate ----------------------


def _kind_of(select: exp.Expr) -> str | None:
    node = select.unalias() if isinstance(select, exp.Alias) else select
    for cls, kind in _AGG_OF.items():
        if isinstance(node, cls):
            return kind
    return None


def aggregates_attributed(f: Facts) -> CheckResult:
    problems: list[str] = []
    checked = 0
    stated = stated_numbers(f.answer)
    low = f.answer.lower()
    for p in f.items:
        if p.tree is None or not p.evidence.rows or not isinstance(p.tree, exp.Select):
            continue
        kinds = [_kind_of(s) for s in p.tree.selects]
        if sum(1 for k in kinds if k) < 2 or len({k for k in kinds if k}) < 2:
            continue
        checked += 1
        row = p.evidence.rows[0]
        for j, kind in enumerate(kinds):
            if kind is None or j >= len(row):
                continue
            values = evidence_numbers([row[j]])
            for k, number in enumerate(stated):
                if not values or not holds(number, values):
                    continue
                # the words said of this number: since the previous number or clause
                begin = stated[k - 1].start + len(stated[k - 1].text) if k else 0
                begin = max(begin, number.start - 40)
                clause = max(low.rfind(sep, begin, number.start) for sep in (",", ";", " and "))
                window = " " + " ".join(_words(low[max(begin, clause + 1) : number.start])) + " "
                said = {k for k, ws in _AGG_WORDS.items() if any(f" {w} " in window for w in ws)}
                if said and kind not in said:
                    other = sorted(said)[0]
                    problems.append(
                        f"{number.text} is the {kind.upper()} column's value, but the answer "
                        f"calls it the {other}"
                    )
    if not checked:
        return _result(
            "aggregates_attributed", "error", [], skipped="no row with several aggregates"
        )
    return _result("aggregates_attributed", "error", problems)


CHECKS: tuple[Callable[[Facts], CheckResult], ...] = (
    tables_exist,
    rerun_matches,
    numbers_in_evidence,
    no_sum_over_text,
    string_filter_case,
    aggregate_matches_question,
    question_columns_used,
    join_when_two_tables,
    date_group_not_null,
    aggregates_attributed,
)
