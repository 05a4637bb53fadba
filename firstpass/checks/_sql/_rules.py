"""The checks of ``sql_evidence`` (ten here, ten semantic ones in ``_semantic``), each a named
sub-result: pure functions over the question, the answer, the evidence and the database
(read-only).

Hard checks (severity ``error``) fail on something concrete: a table that does not exist, a
rerun that returns other rows, a number the evidence does not hold, SUM over text, a filter
whose exact casing matches nothing while another casing does, a NULL date group, a value told
under the wrong aggregate. Heuristics (severity ``warning``) compare the SQL with the question's
wording; they warn on valid SQL and miss semantic mistakes. A rerun proves repeatability, not
truth.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import sqlglot
from sqlglot import exp

from firstpass.checks._base import Options
from firstpass.checks._result import CheckResult, Severity
from firstpass.checks._sql._db import (
    Database,
    DatabaseBusy,
    RerunError,
    Schema,
    Unprobed,
    quote,
)
from firstpass.checks._sql._evidence import Evidence, Support
from firstpass.checks._sql._linking import LINKING_CHECKS, LINKING_RULES
from firstpass.checks._sql._numbers import (
    MAX_STATED,
    Stated,
    Values,
    evidence_numbers,
    holds,
    stated_numbers,
)
from firstpass.checks._sql._parts import part_result
from firstpass.checks._sql._semantic import SEMANTIC_CHECKS, SEMANTIC_RULES

__all__ = ["RULES", "Facts", "Parsed", "parse_evidence"]

#: names and severities of every check: the ten in the issue's order, then ``_semantic``'s
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
    *SEMANTIC_RULES,  # 11-21: mistakes in SQL that runs (``_semantic``)
    *LINKING_RULES,  # 22-24: what the query reads, against the question and data (``_linking``)
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
    #: work beside the SQL whose numbers count as held, never rerun (Python output, summaries)
    support: tuple[Support, ...] = ()


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
    return part_result(name, severity, problems, skipped=skipped)


# -- 1. tables exist -----------------------------------------------------------------------------


#: tables every SQLite database has without listing them in its schema
_BUILTIN_TABLES = frozenset(
    {"sqlite_master", "sqlite_schema", "sqlite_temp_master", "sqlite_temp_schema"}
)


def _index_names(tree: exp.Expr) -> set[str]:
    """Names after ``INDEXED BY``: indexes, not tables (sqlglot parses them as tables)."""
    return {
        ix.name.lower()
        for t in tree.find_all(exp.Table)
        if isinstance(ix := t.args.get("indexed"), exp.Table)
    }


def tables_exist(f: Facts) -> CheckResult:
    parsed = [p for p in f.items if p.tree is not None]
    if not parsed:
        return _result("tables_exist", "error", [], skipped="no query parses")
    missing: set[str] = set()
    for p in parsed:
        known = f.schema.tables.keys() | _BUILTIN_TABLES | _index_names(p.tree or exp.Select())
        missing.update(t for t in p.tables.values() if t.lower() not in known)
    problems = [f"table {t!r} does not exist in the database" for t in sorted(missing)]
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


def _same_rows(
    recorded: Sequence[Sequence[object]],
    rerun: Sequence[Sequence[object]],
    *,
    part: bool = False,
) -> bool:
    """The same rows as multisets (``part``: the recorded rows are a sub-multiset of the
    rerun's, as a truncated result is a part of the whole); a number recorded with fewer
    digits (a harness rounding 1496.1875 to 1496.19) matches within half a unit of its last
    digit. Near-linear: rows are matched by keys in dicts, never pairwise."""
    want = Counter(tuple(map(_cell, r)) for r in recorded)
    have = Counter(tuple(map(_cell, r)) for r in rerun)
    if (want <= have) if part else (want == have):
        return True
    if len(recorded) > MAX_ROUNDED_ROWS or (len(recorded) != len(rerun) and not part):
        return False
    if part and len(rerun) < len(recorded):
        return False
    # the rows not matched exactly (the recorded ones as sent: their digits matter), matched
    # again with each recorded number's own digits
    spare = have - want
    common = want & have
    unmatched: list[tuple[object, ...]] = []
    for r in recorded:
        key = tuple(map(_cell, r))
        if common[key] > 0:
            common[key] -= 1
        else:
            unmatched.append(tuple(r))
    return _rounded_match(unmatched, list(spare.elements()))


#: how a recorded cell is compared: exactly (None), or rounded to a unit (``unit``, and
#: whether the integer part of a value also matches: ``7`` for 7.6, as harnesses truncate)
_Spec = tuple[float, bool] | None
#: rerun rows' keys tried per recorded pattern at most (ties at half a unit make two each)
_MAX_KEYS = 16
#: a number as a harness writes a cell: digits, a point, digits
_PLAIN_NUMBER = re.compile(r"-?\d{1,300}(?:\.(\d{0,300}))?")
#: distinct rounding patterns (the digits each column was recorded with) tried at most
_MAX_PATTERNS = 32


def _spec(rec: object) -> tuple[_Spec, object]:
    """A recorded cell's way of comparing and its key: a number written with few digits is
    its value in units of its last digit (``1496.19``: 149619 hundredths); anything else,
    a percentage, or a number of 9 or more significant digits (compared to 9 digits by
    ``_cell`` already) is compared exactly."""
    exact = _cell(rec)
    if not isinstance(rec, int | float | str) or isinstance(rec, bool):
        return None, exact
    text = str(rec).strip()
    plain = _PLAIN_NUMBER.fullmatch(text)
    if plain is not None:  # "1496.19", "-7": the common case, read without the full scan
        decimals = len(plain.group(1) or "")
        value, unit = float(text), 10.0**-decimals
        if unit < 1e-9 * abs(value):
            return None, exact
        return (unit, decimals == 0), round(value / unit)
    numbers = stated_numbers(text)
    if len(numbers) != 1 or numbers[0].percent or numbers[0].text != text:
        return None, exact  # "12 kg", "42%", "3, 4": compared as they are
    n = numbers[0]
    unit = 2.0 * n.tolerance
    if unit <= 0.0 or unit < 1e-9 * abs(n.value):
        return None, exact
    truncates = n.decimals == 0 and n.tolerance == 0.5
    return (unit, truncates), round(n.value / unit)


def _keys(value: object, spec: _Spec) -> list[object]:
    """The keys a rerun cell has under a recorded cell's ``spec``: its value rounded to the
    unit (both neighbours at a tie: the recorded digits may have rounded either way)."""
    if spec is None:
        return [value]
    if not isinstance(value, float):
        return []
    unit, truncates = spec
    t = value / unit
    slack = 1e-9 * max(1.0, abs(t))
    keys: list[object] = list(range(math.ceil(t - 0.5 - slack), math.floor(t + 0.5 + slack) + 1))
    if truncates and math.trunc(value) not in keys:
        keys.append(math.trunc(value))  # 7 for 7.6: the integer part, as harnesses truncate
    return keys


def _rounded_match(recorded: list[tuple[object, ...]], rerun: list[tuple[object, ...]]) -> bool:
    """Every recorded row matched by a distinct rerun row, cell by cell exactly or within half
    a unit of the recorded digits: recorded rows indexed by (pattern, key), each rerun row
    looked up under each pattern (a handful), so the cost is rows x patterns, not rows^2."""
    index: dict[tuple[tuple[_Spec, ...], tuple[object, ...]], list[int]] = {}
    patterns: dict[tuple[_Spec, ...], None] = {}
    for i, row in enumerate(recorded):
        specs, key = zip(*map(_spec, row), strict=True) if row else ((), ())
        patterns[specs] = None
        index.setdefault((specs, key), []).append(i)
    if len(patterns) > _MAX_PATTERNS:
        return False
    matched = 0
    for row in rerun:
        for specs in patterns:
            if len(specs) != len(row):
                continue
            per_cell = [_keys(v, s) for v, s in zip(row, specs, strict=True)]
            hit = _first_hit(index, specs, per_cell)
            if hit is not None:
                matched += 1
                break
    return matched == len(recorded)


def _first_hit(
    index: dict[tuple[tuple[_Spec, ...], tuple[object, ...]], list[int]],
    specs: tuple[_Spec, ...],
    per_cell: list[list[object]],
) -> int | None:
    """Pop and return a recorded row (its index) whose key is one of the rerun row's keys."""
    if any(not keys for keys in per_cell):
        return None
    for n, key in enumerate(itertools.product(*per_cell)):
        if n >= _MAX_KEYS:
            break
        found = index.get((specs, key))
        if found:
            return found.pop()
    return None


def _support_notes(f: Facts) -> list[str]:
    said = (
        'so under rerun = "all" its numbers support nothing'
        if f.rerun_all
        else "its numbers are taken on the harness's word"
    )
    return [
        f"evidence {s.where} ({'Python output' if s.kind == 'python' else s.kind}): not SQL, "
        f"never rerun; {said}"
        for s in f.support
    ]


def _rerun_result(
    problems: list[str],
    notes: list[str],
    *,
    reran: int,
    busy: str | None,
    disagreed: Sequence[int] = (),
) -> CheckResult:
    """Problems fail; a database locked past the wait, or the run's probe time spent,
    abstains (nothing is known of the query: a hard check that cannot check does not pass);
    what was not rerun, and why, is said beside a rerun that matched."""
    options = Options(name="rerun_matches", severity="error")
    said = tuple(f"skipped: {n}" for n in notes)
    if problems:
        return options.result(
            "sql_evidence", verdict="fail", score=0.0, reasons=(*problems, *said),
            category="sql_rerun_matches", needs_revision=True,
            # the queries whose rerun failed or returned other rows, by index: what a
            # corrective re-ask (``_followup.reconcile``) states to the model
            details={"disagreed": list(disagreed)},
        )  # fmt: skip
    if busy is not None:
        return options.result(
            "sql_evidence", verdict="abstain", score=0.0,
            reasons=(f"could not rerun: {busy}", *said), category="check_error",
            details={"database_locked": True} if "locked" in busy else {"out_of_time": True},
        )  # fmt: skip
    if not reran:
        return _result("rerun_matches", "error", [], skipped="; ".join(notes) or "no queries")
    return options.result("sql_evidence", verdict="pass", score=1.0, reasons=said)


def rerun_matches(f: Facts) -> CheckResult:
    """Rerun what the evidence says was cheap: a query recorded in at most ``rerun_ms`` (or
    with no time recorded: nothing says it was slow) whose result was not truncated. Under
    ``rerun = "all"`` every query is rerun, a truncated one too: its recorded rows must be a
    part of the rerun's (a claim of truncation dodges nothing)."""
    problems: list[str] = []
    skipped: list[str] = []
    busy: str | None = None
    reran = 0
    disagreed: list[int] = []
    for i, p in enumerate(f.items):
        e = p.evidence
        why_not = None
        if e.rows is None:
            why_not = "no recorded rows"
        elif e.truncated and not f.rerun_all:
            why_not = "its result was truncated"
        elif not f.rerun_all and e.elapsed_ms is not None and e.elapsed_ms > f.rerun_ms:
            why_not = f"not cheap ({e.elapsed_ms:.0f} ms; reruns at most {f.rerun_ms:.0f} ms)"
        if why_not is not None and p.tree is not None and not isinstance(p.tree, exp.Query):
            problems.append(f"query {i} is not a query (only SELECT and WITH are accepted)")
            continue
        if why_not is not None or e.rows is None:
            # not rerun, but it must at least compile (EXPLAIN prepares it, runs nothing)
            try:
                error = f.db.compile_error(e.sql, budget_s=f.budget_s)
            except Unprobed as exc:
                busy = str(exc)
                skipped.append(f"query {i}: {why_not}; not compiled ({_why_unprobed(exc)})")
                continue
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
        except Unprobed as exc:
            busy = str(exc)
            skipped.append(f"query {i}: not rerun ({_why_unprobed(exc)})")
            continue
        except RerunError as exc:
            problems.append(f"query {i} failed when rerun: {exc}")
            disagreed.append(i)
            continue
        if e.truncated:  # rerun = "all": the recorded part must be in the whole
            if not _same_rows(e.rows, rows, part=True):
                disagreed.append(i)
                problems.append(
                    f"query {i}'s {len(e.rows)} recorded rows (a truncated result) are not "
                    f"among the {len(rows)} rows it returned when rerun"
                )
        elif not _same_rows(e.rows, rows):
            disagreed.append(i)
            what = "other values" if len(rows) == len(e.rows) else f"{len(rows)} rows"
            problems.append(
                f"query {i} returned {what} when rerun than the {len(e.rows)} rows recorded"
            )
    return _rerun_result(
        problems, skipped + _support_notes(f), reran=reran, busy=busy, disagreed=disagreed
    )


def _why_unprobed(exc: Unprobed) -> str:
    """Why a query was not rerun or compiled: a writer's lock, or the run's time spent."""
    if isinstance(exc, DatabaseBusy):
        return "the database was locked"
    return "the run's time was spent"


# -- 3. every stated number is in the evidence --------------------------------------------------

#: text cells scanned for numbers inside them at most (distinct cells holding a digit), and the
#: characters read of each
MAX_TEXT_CELLS = 20_000
MAX_CELL_CHARS = 1_000
_HAS_DIGIT = re.compile(r"\d")


def _literal_value(node: exp.Expr) -> float | None:
    """A numeric literal's value (``7``, ``-7``, ``'7'``), else None."""
    negative = isinstance(node, exp.Neg)
    if negative:
        node = node.this
    if isinstance(node, exp.Paren):
        return _literal_value(node.this)
    if not isinstance(node, exp.Literal):
        return None
    try:
        value = float(str(node.this).replace(",", ""))
    except ValueError:
        return None
    if not math.isfinite(value):
        return None
    return -value if negative else value


#: functions whose value may be one of their arguments, as given
_PASS_THROUGH = (exp.Coalesce, exp.Greatest, exp.Least, exp.Nullif, exp.If, exp.Case)


def _copied_literals(projection: exp.Expr) -> set[float]:
    """Literals a projection may output as they are: itself, or an argument of COALESCE,
    IFNULL, scalar MAX/MIN, NULLIF, IIF, a CASE branch (``max(999, count(*))``)."""
    node = projection.unalias() if isinstance(projection, exp.Alias) else projection
    found: set[float] = set()
    todo = [node]
    while todo:
        current = todo.pop()
        value = _literal_value(current)
        if value is not None:
            found.add(value)
            continue
        if isinstance(current, exp.Paren):
            todo.append(current.this)
        elif isinstance(current, _PASS_THROUGH):
            for key, arg in current.args.items():
                if key == "this" and isinstance(current, exp.If | exp.Case):
                    continue  # a condition, not a value
                todo.extend(a for a in (arg if isinstance(arg, list) else [arg])
                            if isinstance(a, exp.Expr))  # fmt: skip
    return found


def _data_free(projection: exp.Expr) -> bool:
    """A projection that reads no column and aggregates nothing: its value is in the SQL."""
    kinds = (exp.Column, exp.Star, exp.AggFunc, exp.Subquery, exp.Window)
    return not any(True for _ in projection.find_all(*kinds))


def _branches(node: exp.Expr) -> list[exp.Select]:
    """The SELECTs whose rows a query returns (both sides of a UNION)."""
    if isinstance(node, exp.SetOperation):
        return _branches(node.left) + _branches(node.right)
    if isinstance(node, exp.Subquery):
        return _branches(node.this)
    return [node] if isinstance(node, exp.Select) else []


@dataclass(frozen=True)
class _Sourced:
    """A query's numbers split by where they come from: the database, or the SQL's text."""

    held: list[float]
    constant: list[float]
    why_constant: str = ""


def _split_constants(i: int, p: Parsed) -> _Sourced:
    """A result's numbers; those the SQL's own literals supply are kept apart (a query that
    reads no table, a column that is a constant, a literal passed through COALESCE or a
    scalar MAX): ``SELECT 999`` is not evidence that something is 999."""
    rows = p.evidence.rows or ()
    all_cells = [c for row in rows for c in row]
    if p.tree is None or not isinstance(p.tree, exp.Query):
        return _Sourced(held=evidence_numbers(all_cells), constant=[])
    if not p.tables:
        return _Sourced(
            held=[], constant=[*evidence_numbers(all_cells), float(len(rows))],
            why_constant=f"query {i} (it reads no table)",
        )  # fmt: skip
    branches = _branches(p.tree)
    if not branches or any(any(isinstance(s, exp.Star) for s in b.selects) for b in branches):
        return _Sourced(held=evidence_numbers(all_cells), constant=[])
    width = max(len(b.selects) for b in branches)
    constant_columns = {j for j in range(width) if all(
        j < len(b.selects) and _data_free(b.selects[j]) for b in branches)}  # fmt: skip
    copied: dict[int, set[float]] = {
        j: set().union(*(_copied_literals(b.selects[j]) for b in branches if j < len(b.selects)))
        for j in range(width)
    }
    held: list[float] = []
    constant: list[float] = []
    for row in rows:
        for j, cell in enumerate(row):
            for v in evidence_numbers([cell]):
                if j in constant_columns or v in copied.get(j, ()):
                    constant.append(v)
                else:
                    held.append(v)
    return _Sourced(held=held, constant=constant,
                    why_constant=f"a constant in the SQL of query {i}")  # fmt: skip


def _text_numbers(cells: Iterable[object]) -> list[float]:
    """Numbers inside text cells ("mazda rx-7 gs"), from distinct cells holding a digit."""
    seen: set[str] = set()
    out: list[float] = []
    for c in cells:
        if not isinstance(c, str) or c in seen or not _HAS_DIGIT.search(c[:MAX_CELL_CHARS]):
            continue
        seen.add(c)
        if len(seen) > MAX_TEXT_CELLS:
            break
        for n in stated_numbers(c[:MAX_CELL_CHARS]):
            out.append(n.value)
            out.extend(a.value for a in n.alternatives)
    return out


def _cannot_check(stated: list[Stated]) -> CheckResult:
    shown = ", ".join(n.text for n in stated[:5]) + (" ..." if len(stated) > 5 else "")
    return Options(name="numbers_in_evidence", severity="error").result(
        "sql_evidence",
        verdict="abstain",
        score=0.0,
        reasons=(
            f"cannot check: the answer states {shown}, and no query's result rows were "
            "recorded (a tool result that is not JSON with rows, or evidence without rows)",
        ),
        category="check_error",
        details={"cannot_check": True, "stated": len(stated)},
    )


def numbers_in_evidence(f: Facts) -> CheckResult:
    """Every number the answer states is held by a result cell, a row count, a number inside
    a text cell, the question, or a support item's text (Python output, a summary); never by a
    constant of the SQL alone. Under ``rerun = "all"`` support items hold nothing: the client
    writes them and nothing reruns them, so they would launder any number past the rerun.
    Lookups go through one index (``Values``): near-linear in the numbers stated plus the
    evidence's cells."""
    all_stated = stated_numbers(f.answer)
    stated = all_stated[:MAX_STATED]
    with_rows = [(i, p) for i, p in enumerate(f.items) if p.evidence.rows is not None]
    support = () if f.rerun_all else f.support
    if not with_rows and not support:
        if stated:
            return _cannot_check(stated)
        return _result("numbers_in_evidence", "error", [], skipped="no recorded result rows")
    held: list[float] = []
    constant: list[float] = []
    why: list[str] = []
    for i, p in with_rows:
        sourced = _split_constants(i, p)
        held += sourced.held
        constant += sourced.constant
        if sourced.constant:
            why.append(sourced.why_constant)
        if p.tree is not None and isinstance(p.tree, exp.Query) and not p.tables:
            continue  # a query that reads no table: its text cells and row count are its own
        cells = [c for row in p.evidence.rows or () for c in row]
        held += _text_numbers(cells)  # numbers inside text cells count too
        held.append(float(len(p.evidence.rows or ())))  # "there are 3 ..." counts rows
    # the question's numbers may be restated ("older than 40", "the 3 oldest", "of the 4"):
    # tying each to the SQL's use of it failed right answers (age >= 41 for "older than 40",
    # HAVING count(*) > 1 for "at least 2") and stopped no echo a LIMIT 10 would not launder
    for n in stated_numbers(f.question):
        held += [n.value, *(a.value for a in n.alternatives)]
    for s in support:
        for n in stated_numbers(s.text):
            held += [n.value, *(a.value for a in n.alternatives)]
    index = Values(held)
    constants = Values(constant) if constant else None
    problems: list[str] = []
    for n in stated:
        if holds(n, index):
            continue
        if constants is not None and holds(n, constants):
            problems.append(
                f"the answer states {n.text}, which only {why[0]} supplies (a number the SQL "
                "writes itself is no evidence)"
            )
        elif f.support and f.rerun_all:
            problems.append(
                f"the answer states {n.text}, which no result cell holds (under rerun = "
                '"all", Python output and summaries support no number: they are never rerun)'
            )
        else:
            problems.append(f"the answer states {n.text}, which no result cell holds")
    details: dict[str, object] = {}
    if len(all_stated) > len(stated):
        details["unchecked_numbers"] = len(all_stated) - len(stated)
    if index.dropped:
        details["evidence_values_not_considered"] = index.dropped
    if f.support:
        details["not_rerun"] = [f"{s.where} ({s.kind})" for s in f.support]
    if f.support and f.rerun_all:
        details["support_not_counted"] = [f"{s.where} ({s.kind})" for s in f.support]
    result = _result("numbers_in_evidence", "error", problems[:10])
    if details:
        return Options(name="numbers_in_evidence", severity="error").result(
            "sql_evidence", verdict=result.verdict, score=result.score, reasons=result.reasons,
            category=result.category, needs_revision=result.needs_revision, details=details,
        )  # fmt: skip
    return result


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

#: text values read as a missing value, not as text a sum would misread
_MISSING = frozenset({"", "null", "none", "nan", "na", "n/a", "-", "--", "?", "unknown", "missing"})
#: distinct text values of a summed column looked at, at most
MAX_SUM_VALUES = 200


#: the numeric prefix SQLite reads from a text (``'1988-04-30 01:19'`` → 1988, ``'12 kg'`` → 12)
_NUMERIC_PREFIX = re.compile(r"\s*[+-]?(\d|\.\d)")


def _words_in(f: Facts, table: str, column: str) -> list[str]:
    """Text values of the column that SQLite's SUM/AVG read as 0: no numeric prefix and no
    missing-value marker. Numeric text (``'18'``) and text that starts with a number (a date,
    ``'12 kg'``) are read as that number, not the silent zero this check is for. Data decides,
    not the declared type; one bounded probe (``CAST(... AS REAL) = 0`` is SQLite's own reading)
    of at most ``MAX_SUM_VALUES`` distinct values; a probe whose SQL cannot run finds none,
    and one that did not run (``Unprobed``: a writer's lock, the run's time spent) raises, so
    the check abstains rather than passes."""
    col = quote(column)
    try:
        rows = f.db.run_params(
            f"SELECT DISTINCT {col} FROM {quote(table)} WHERE typeof({col}) = 'text' "
            f"AND CAST({col} AS REAL) = 0 LIMIT {MAX_SUM_VALUES}",
            (),
            budget_s=f.budget_s,
        )
    except Unprobed:
        raise
    except RerunError:
        return []
    values = [str(r[0]) for r in rows if r]
    return [v for v in values if v.strip().lower() not in _MISSING and not _NUMERIC_PREFIX.match(v)]


def no_sum_over_text(f: Facts) -> CheckResult:
    """SUM / AVG / TOTAL over a column whose values include words: SQLite reads each as 0 and
    the total looks plausible. Text that starts with a number (a date reads as its year) is
    read as that number and passes."""
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
            if table is None or f.schema.column_type(table, arg.name) is None:
                continue
            words = _words_in(f, table, arg.name)
            if words:
                shown = ", ".join(repr(w) for w in words[:3])
                problems.append(
                    f"{call.sql(dialect='sqlite')} adds up {table}.{arg.name}, a text column "
                    f"with {len(words)} non-numeric values ({shown}): SQLite reads each as 0"
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


def _said_of(low: str, stated: Sequence[Stated], k: int) -> set[str]:
    """The aggregate words said of the ``k``-th number: since the previous number or clause."""
    number = stated[k]
    begin = stated[k - 1].start + len(stated[k - 1].text) if k else 0
    begin = max(begin, number.start - 40)
    clause = max(low.rfind(sep, begin, number.start) for sep in (",", ";", " and "))
    window = " " + " ".join(_words(low[max(begin, clause + 1) : number.start])) + " "
    return {kind for kind, ws in _AGG_WORDS.items() if any(f" {w} " in window for w in ws)}


def aggregates_attributed(f: Facts) -> CheckResult:
    """A number told under an aggregate's word must be the value of an aggregate of that
    kind: when MIN and MAX are both 30, "the maximum is 30" is right, whichever column the
    number is found in first."""
    problems: list[str] = []
    checked = 0
    stated = stated_numbers(f.answer)[:MAX_STATED]
    low = f.answer.lower()
    for p in f.items:
        if p.tree is None or not p.evidence.rows or not isinstance(p.tree, exp.Select):
            continue
        kinds = [_kind_of(s) for s in p.tree.selects]
        if sum(1 for k in kinds if k) < 2 or len({k for k in kinds if k}) < 2:
            continue
        checked += 1
        row = p.evidence.rows[0]
        columns = [
            (kind, Values(evidence_numbers([row[j]])))
            for j, kind in enumerate(kinds)
            if kind is not None and j < len(row)
        ]
        for k, number in enumerate(stated):
            held_by = {kind for kind, values in columns if len(values) and holds(number, values)}
            if not held_by:
                continue
            said = _said_of(low, stated, k)
            if said and not said & held_by:
                problems.append(
                    f"{number.text} is the {'/'.join(sorted(held_by)).upper()} column's value, "
                    f"but the answer calls it the {sorted(said)[0]}"
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
    *SEMANTIC_CHECKS,
    *LINKING_CHECKS,
)
