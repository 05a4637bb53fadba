"""Semantic checks of ``sql_evidence``: mistakes in SQL that runs, found from the query's own
logic and the database's values, never from one schema's names.

A query that runs can still be wrong. These checks look for mistakes that are wrong on any
schema: a filter value that no row holds (the value lives in another column, or the model
invented a code), a conjunction no row can satisfy (``x < 1945 AND x > 1955``), a join on a
key pair that is neither a declared foreign key nor named like one, an ``ORDER BY ... LIMIT``
whose direction is the opposite of the question's superlative, "both" answered by rows meeting
either (``OR``/``IN``), one superlative answered by every group's row, a count of join rows
where the question counts things, and (warnings) an empty result, duplicate rows where the
question asks for different values, and the ranking aggregate returned though not asked for.
Each probe of the database is one bounded query within the check's time budget (``EXISTS``
probes, a ``count(*)`` of a twin query); a probe that cannot run finds nothing and passes.

The checks read the question, the parsed evidence and the database only (``FactsLike``: the
shape of ``_rules.Facts``, which imports this module, not the other way round).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from sqlglot import exp

from firstpass.checks._result import CheckResult, Severity
from firstpass.checks._sql._db import Database, RerunError, Schema, Unprobed, quote
from firstpass.checks._sql._evidence import Evidence
from firstpass.checks._sql._parts import part_result

__all__ = ["SEMANTIC_CHECKS", "SEMANTIC_RULES", "FactsLike"]

#: names and severities of the semantic checks, after the ten of ``_rules``
SEMANTIC_RULES: tuple[tuple[str, Severity], ...] = (
    ("filter_value_exists", "error"),
    ("filter_satisfiable", "error"),
    ("join_keys_related", "warning"),
    ("order_matches_superlative", "error"),
    ("result_not_empty", "warning"),
    ("distinct_when_asked", "warning"),
    ("both_conditions_met", "error"),
    ("one_answer_one_row", "error"),
    ("count_not_fanned_out", "error"),
    ("ranking_value_not_asked", "warning"),
    ("exclusion_per_entity", "error"),
)

#: filter values probed per query at most, and text columns searched for a misplaced value
MAX_PROBES = 12
MAX_OTHER_COLUMNS = 24
#: twin queries (the query rewritten as a probe) run per check and answer at most
MAX_TWINS = 4


class ParsedLike(Protocol):
    @property
    def evidence(self) -> Evidence: ...
    @property
    def tree(self) -> exp.Expr | None: ...
    @property
    def tables(self) -> dict[str, str]: ...


class FactsLike(Protocol):
    @property
    def question(self) -> str: ...
    @property
    def items(self) -> Sequence[ParsedLike]: ...
    @property
    def db(self) -> Database: ...
    @property
    def schema(self) -> Schema: ...
    @property
    def budget_s(self) -> float: ...


def _result(name: str, problems: list[str], *, skipped: str | None = None) -> CheckResult:
    """At most five problems told (a probe can find many of one kind)."""
    return part_result(name, dict(SEMANTIC_RULES)[name], problems[:5], skipped=skipped)


def _resolve(p: ParsedLike, column: exp.Column, schema: Schema) -> str | None:
    """The real table (lower-cased) a column reference reads, when it can be told."""
    name = column.name.lower()
    if column.table:
        real = p.tables.get(column.table.lower())
        return (
            real.lower()
            if real is not None and name in schema.columns.get(real.lower(), {})
            else None
        )
    owners = {t.lower() for t in p.tables.values() if name in schema.columns.get(t.lower(), {})}
    return next(iter(owners)) if len(owners) == 1 else None


def _parsed(f: FactsLike) -> list[tuple[int, ParsedLike, exp.Expr]]:
    return [(i, p, p.tree) for i, p in enumerate(f.items) if p.tree is not None]


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


# -- 11. a filter value some row holds -----------------------------------------------------------


@dataclass(frozen=True)
class _Filter:
    column: exp.Column
    value: str | int | float
    op: str  # "=", "<>", "IN", "NOT IN", "LIKE"


def _literal(node: exp.Expr) -> str | int | float | None:
    if not isinstance(node, exp.Literal):
        return None
    if node.is_string:
        return str(node.this)
    with contextlib.suppress(ValueError):
        return int(node.this)
    with contextlib.suppress(ValueError):
        return float(node.this)
    return None


def _filters(tree: exp.Expr) -> Iterator[_Filter]:
    """Column-versus-literal comparisons: ``=``, ``<>``, ``IN (...)``, ``LIKE``."""
    for node in tree.find_all(exp.EQ, exp.NEQ, exp.In, exp.Like):
        negated = isinstance(node.parent, exp.Not)
        if isinstance(node, exp.In):
            if not isinstance(node.this, exp.Column) or node.args.get("query") is not None:
                continue
            for e in node.expressions:
                value = _literal(e)
                if value is not None:
                    yield _Filter(node.this, value, "NOT IN" if negated else "IN")
            continue
        left, right = node.this, node.expression
        if isinstance(right, exp.Column) and isinstance(left, exp.Literal):
            left, right = right, left
        value = _literal(right)
        if not isinstance(left, exp.Column) or value is None:
            continue
        if isinstance(node, exp.Like):
            if isinstance(value, str):
                yield _Filter(left, value, "NOT LIKE" if negated else "LIKE")
        elif isinstance(value, str):  # a number filters a range of ids, years: often absent
            yield _Filter(left, value, "<>" if isinstance(node, exp.NEQ) else "=")


def _exists(f: FactsLike, probes: Sequence[tuple[str, str, str]], value: object) -> list[bool]:
    """For each ``(table, column, match)`` whether some row's column matches ``value``: one
    query of ``EXISTS`` probes (each stops at its first row, an index serves ``=``); all False
    when its SQL cannot run within the budget. ``Unprobed`` (a writer's lock, the run's time
    spent) raises: a probe that did not run found nothing, and the check abstains."""
    if not probes:
        return []
    parts = [
        f"EXISTS (SELECT 1 FROM {quote(t)} WHERE {quote(c) + ' ' if c else ''}{m})"
        for t, c, m in probes
    ]
    params = tuple(value for _, _, m in probes if "?" in m)
    try:
        rows = f.db.run_params("SELECT " + ", ".join(parts), params, budget_s=f.budget_s)
    except Unprobed:
        raise
    except RerunError:
        return [False] * len(probes)
    return [bool(v) for v in rows[0]] if rows else [False] * len(probes)


def _misplaced(f: FactsLike, p: ParsedLike, flt: _Filter, table: str) -> str:
    """Where the value does occur: another text column of a table the query reads. (Not of the
    rest of the schema: a city, a country or a code the question names is often held by some
    other table while the right answer is "none", and the search would scan every table.)"""
    col = flt.column.name.lower()
    match = "LIKE ?" if flt.op in ("LIKE", "NOT LIKE") else "= ? COLLATE NOCASE"
    probes = [
        (other, name, match)
        for other in sorted({t.lower() for t in p.tables.values()})
        for name, declared in f.schema.columns.get(other, {}).items()
        if (other, name) != (table, col) and any(k in declared for k in ("CHAR", "TEXT", "CLOB"))
    ][:MAX_OTHER_COLUMNS]
    found = [
        f"{t}.{c}"
        for (t, c, _), hit in zip(probes, _exists(f, probes, flt.value), strict=True)
        if hit
    ]
    return f"; {', '.join(found[:3])} {'holds' if len(found) == 1 else 'hold'} it" if found else ""


def _quoted(value: object, question: str) -> bool:
    """The question itself says the value (a ``LIKE`` pattern without its wildcards)."""
    text = " ".join(str(value).replace("%", " ").replace("_", " ").lower().split())
    return bool(text) and text in " ".join(question.lower().split())


def filter_value_exists(f: FactsLike) -> CheckResult:
    """A text value the SQL filters on (``=``, ``<>``, ``IN``, ``LIKE``) that no row of its
    column holds: the filter selects nothing (or, negated, excludes nothing). A model invents a
    code (``'APT'``), a spelling (``'French'`` for ``'France'``) or looks in the wrong column.
    It fails when the value is not the question's own words (invented), when another column
    holds it (the wrong column), or when the filter is negated (it excludes nothing); a value
    the question itself names and no column holds may have "none" for its answer, and passes.
    An ``=`` that another casing matches is ``string_filter_case``'s, not this check's."""
    items = _parsed(f)
    if not items:
        return _result("filter_value_exists", [], skipped="no query parses")
    problems: list[str] = []
    probed = 0
    seen: set[tuple[str, str, object, bool]] = set()
    for _, p, tree in items:
        for flt in _filters(tree):
            table = _resolve(p, flt.column, f.schema)
            like = flt.op in ("LIKE", "NOT LIKE")
            key = (table or "", flt.column.name.lower(), flt.value, like)
            if table is None or key in seen or probed >= MAX_PROBES:
                continue
            seen.add(key)
            probed += 1
            name = flt.column.name
            probes = [(table, "", "1"), (table, name, "LIKE ?" if like else "= ?")]
            if not like:
                probes.append((table, name, "= ? COLLATE NOCASE"))
            found = _exists(f, probes, flt.value)
            if not found[0] or any(found[1:]):
                continue  # an empty table holds no value; the value, in some casing, is there
            elsewhere = _misplaced(f, p, flt, table)
            negated = flt.op in ("<>", "NOT IN", "NOT LIKE")
            if not (negated or elsewhere or not _quoted(flt.value, f.question)):
                continue  # the question's own value, held nowhere: "none" may be the answer
            problems.append(
                f"{flt.column.sql()} {flt.op} {flt.value!r}: no row of {table}.{name} "
                f"holds that value{elsewhere or ''}"
                + ("; the condition excludes nothing" if negated else "")
            )
    return _result("filter_value_exists", problems)


# -- 12. a conjunction some row can satisfy ------------------------------------------------------


def _conjuncts(node: exp.Expr) -> Iterator[exp.Expr]:
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.And):
        yield from _conjuncts(node.this)
        yield from _conjuncts(node.expression)
    else:
        yield node


@dataclass
class _Bounds:
    equal: set[object]
    low: tuple[float, bool] | None = None  # (value, inclusive)
    high: tuple[float, bool] | None = None

    def tighten(self, op: str, value: float) -> None:
        if op in (">", ">="):
            new = (value, op == ">=")
            if self.low is None or value > self.low[0] or (value == self.low[0] and not new[1]):
                self.low = new
        else:
            new = (value, op == "<=")
            if self.high is None or value < self.high[0] or (value == self.high[0] and not new[1]):
                self.high = new

    def empty(self) -> bool:
        if len(self.equal) > 1:
            return True
        numbers = [v for v in self.equal if isinstance(v, int | float)]
        for v in numbers:
            if self.low is not None and (v < self.low[0] or (v == self.low[0] and not self.low[1])):
                return True
            if self.high is not None and (
                v > self.high[0] or (v == self.high[0] and not self.high[1])
            ):
                return True
        if self.low is not None and self.high is not None:
            lo, hi = self.low, self.high
            return lo[0] > hi[0] or (lo[0] == hi[0] and not (lo[1] and hi[1]))
        return False


_FLIP = {">": "<", ">=": "<=", "<": ">", "<=": ">="}
_OPS: dict[type[exp.Expr], str] = {exp.GT: ">", exp.GTE: ">=", exp.LT: "<", exp.LTE: "<="}


def _unsatisfiable(where: exp.Expr, p: ParsedLike, schema: Schema) -> list[str]:
    bounds: dict[str, _Bounds] = {}
    for c in _conjuncts(where):
        op: str | None = None
        left, right = (c.this, c.expression) if isinstance(c, exp.Binary) else (None, None)
        if isinstance(c, exp.EQ):
            op = "="
        elif type(c) in _OPS:
            op = _OPS[type(c)]
        elif isinstance(c, exp.Between) and isinstance(c.this, exp.Column):
            low, high = _literal(c.args["low"]), _literal(c.args["high"])
            if isinstance(low, int | float) and isinstance(high, int | float):
                key = _key(c.this, p, schema)
                b = bounds.setdefault(key, _Bounds(set()))
                b.tighten(">=", float(low))
                b.tighten("<=", float(high))
            continue
        if op is None or left is None or right is None:
            continue
        if isinstance(right, exp.Column) and isinstance(left, exp.Literal):
            left, right = right, left
            op = _FLIP.get(op, op)
        value = _literal(right) if isinstance(right, exp.Expr) else None
        if not isinstance(left, exp.Column) or value is None:
            continue
        b = bounds.setdefault(_key(left, p, schema), _Bounds(set()))
        if op == "=":
            b.equal.add(float(value) if isinstance(value, int | float) else value)
        elif isinstance(value, int | float):
            b.tighten(op, float(value))
    return [k for k, b in bounds.items() if b.empty()]


def _key(column: exp.Column, p: ParsedLike, schema: Schema) -> str:
    """The column as one row sees it: by its alias when it has one (a self-join's ``a.x`` and
    ``b.x`` are two rows' values), else by the table it resolves to."""
    table = (column.table or "").lower() or _resolve(p, column, schema) or ""
    return f"{table}.{column.name.lower()}" if table else column.name.lower()


def _likes_met_apart(
    f: FactsLike, p: ParsedLike, tree: exp.Expr
) -> Iterator[tuple[str, exp.Like, exp.Like]]:
    """Two ``LIKE``s on one column of one row, ``AND``-ed at the top level of a query whose
    result is empty, each pattern said in the question, and each alone met by some row: the
    data holds no row with both (``text LIKE '%Brazil%' AND text LIKE '%Ireland%'``)."""
    where = tree.args.get("where") if isinstance(tree, exp.Select) else None
    if where is None or p.evidence.rows is None or p.evidence.rows or p.evidence.truncated:
        return
    text = " ".join(f.question.lower().split())
    likes: dict[str, list[exp.Like]] = {}
    for c in _conjuncts(where.this):
        if (
            isinstance(c, exp.Like)
            and isinstance(c.this, exp.Column)
            and isinstance(c.expression, exp.Literal)
            and c.expression.is_string
            and _said(c.expression.this, text) is not None
        ):
            likes.setdefault(_key(c.this, p, f.schema), []).append(c)
    for column, found in likes.items():
        if len(found) != 2 or found[0].expression.this == found[1].expression.this:
            continue
        alone = []
        for keep in found:
            twin = tree.copy()
            rest = [c.copy() for c in _conjuncts(where.this) if c not in found]
            twin.set("where", exp.Where(this=exp.and_(*rest, keep.copy())))
            alone.append(
                f.db.count(
                    f"SELECT count(*) FROM ({twin.sql(dialect='sqlite')})", (), budget_s=f.budget_s
                )
            )
        if all(alone):
            yield column, found[0], found[1]


_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.Like, exp.Between, exp.In)


def _absent_yet_compared(f: FactsLike, p: ParsedLike, select: exp.Select) -> list[str]:
    """``LEFT JOIN x ON … WHERE x.<key> IS NULL AND x.<col> = 'v'``: the key (a column the
    ``ON`` equates with another table's, or ``x``'s primary key) is NULL only where no row of
    ``x`` is joined, and then ``x.<col>`` is NULL too, so the comparison fails: the anti-join's
    filter belongs in the ``ON`` (or a ``NOT IN``). A primary key is probed once per alias: that
    no row has it NULL (SQLite lets some keys hold NULL). Only ``x``'s own ``ON`` proves a
    column non-NULL in a matched row."""
    where = select.args.get("where")
    left = {
        j.this.alias_or_name.lower(): j.this.name.lower()
        for j in select.args.get("joins") or []
        if (j.side or "").upper() == "LEFT" and isinstance(j.this, exp.Table)
    }
    if where is None or not left:
        return []
    conjuncts = list(_conjuncts(where.this))
    keys = _keys(f.db, f.schema)
    joined_on: set[tuple[str, str]] = set()  # a matched x row holds these non-NULL
    for j in select.args.get("joins") or []:
        alias = j.this.alias_or_name.lower() if isinstance(j.this, exp.Table) else ""
        if alias not in left or j.args.get("on") is None:
            continue
        for eq in _conjuncts(j.args["on"]):  # x's own ON only: another outer join's is no proof
            if not isinstance(eq, exp.EQ):
                continue  # under an OR a matched row may hold NULL
            sides = [x for x in (eq.this, eq.expression) if isinstance(x, exp.Column)]
            if len(sides) == 2 and sides[0].table.lower() != sides[1].table.lower():
                joined_on |= {
                    (x.table.lower(), x.name.lower()) for x in sides if x.table.lower() == alias
                }
    absent: dict[str, tuple[exp.Column, bool]] = {}  # alias → (its NULL column, a key to probe)
    for c in conjuncts:
        if isinstance(c, exp.Is) and isinstance(c.expression, exp.Null):
            col = c.this
            alias = col.table.lower() if isinstance(col, exp.Column) else ""
            if alias not in left:
                continue
            if (alias, col.name.lower()) in joined_on:
                absent[alias] = (col, False)
            elif col.name.lower() in keys.primary.get(left[alias], ()):
                absent.setdefault(alias, (col, True))
    found: list[str] = []
    null_keys: dict[str, int | None] = {}  # alias → its table holds a NULL key (probed once)
    for c in conjuncts:
        if not isinstance(c, _COMPARISONS) or (isinstance(c, exp.In) and c.args.get("query")):
            continue
        columns = [x for x in (c.this, c.args.get("expression")) if isinstance(x, exp.Column)]
        others = [x for x in c.iter_expressions() if not isinstance(x, exp.Column)]
        if len(columns) != 1 or any(x.find(exp.Column) for x in others):
            continue
        alias = columns[0].table.lower()
        if alias not in absent:
            continue
        key, probe = absent[alias]
        table = f.schema.tables.get(left[alias], left[alias])
        if alias not in null_keys:
            null_keys[alias] = (
                f.db.count(
                    f"SELECT EXISTS (SELECT 1 FROM {quote(table)} WHERE {quote(key.name)} IS NULL)",
                    (),
                    budget_s=f.budget_s,
                )
                if probe
                else 0
            )
        if null_keys[alias] == 0:
            found.append(
                f"{key.sql()} IS NULL keeps only rows where no {table} is joined, where "
                f"{columns[0].sql()} is NULL too, so {c.sql()} keeps none (put it in the LEFT "
                "JOIN's ON, or use NOT IN)"
            )
    return found


def filter_satisfiable(f: FactsLike) -> CheckResult:
    """A ``WHERE`` whose ``AND``-ed conditions no single row can meet (``year < 1945 AND year >
    1955``, ``name = 'a' AND name = 'b'``): the question's "both X and Y" asked of one row; the
    result is empty whatever the data. Two ``LIKE`` patterns on one column that the question
    names, which some rows meet apart and none together (the result is empty), are the same
    mistake told by the data."""
    items = _parsed(f)
    if not items:
        return _result("filter_satisfiable", [], skipped="no query parses")
    problems: list[str] = []
    for i, p, tree in items:
        for select in tree.find_all(exp.Select):
            where = select.args.get("where")
            if where is None:
                continue
            for column in _unsatisfiable(where.this, p, f.schema):
                problems.append(
                    f"query {i}: no single row can meet the conditions on {column} joined by "
                    "AND (a question's 'both ... and ...' asks for rows, or groups, of each)"
                )
        for select in tree.find_all(exp.Select):
            if select is tree and p.evidence.rows:
                continue  # the rows say it keeps some: a reading this check missed
            problems.extend(f"query {i}: {found}" for found in _absent_yet_compared(f, p, select))
        for column, first, second in _likes_met_apart(f, p, tree):
            problems.append(
                f"query {i}: rows meet {first.sql()} and rows meet {second.sql()}, but no "
                f"single row meets both on {column}, so the result is empty (a question's "
                "'X and Y' asks for rows, or groups, of each: INTERSECT)"
            )
    return _result("filter_satisfiable", problems)


# -- 13. joins on a key pair that is a foreign key, or named like one ---------------------------


@dataclass(frozen=True)
class _Keys:
    primary: Mapping[str, frozenset[str]]  # table → primary-key columns (lower-cased)
    foreign: frozenset[frozenset[tuple[str, str]]]  # {(table, column), (table, column)}


_KEYS: dict[tuple[str, int], _Keys] = {}


def _keys(db: Database, schema: Schema) -> _Keys:
    """Declared primary and foreign keys, read once per database file version."""
    try:
        stamp = db.path.stat().st_mtime_ns
    except OSError:
        stamp = 0
    cached = _KEYS.get((str(db.path), stamp))
    if cached is not None:
        return cached
    primary: dict[str, frozenset[str]] = {}
    foreign: set[frozenset[tuple[str, str]]] = set()
    with contextlib.closing(db.connect()) as conn:
        for low, real in schema.tables.items():
            info = conn.execute(f"PRAGMA table_info({quote(real)})").fetchall()
            primary[low] = frozenset(str(r[1]).lower() for r in info if r[5])
        for low, real in schema.tables.items():
            for row in conn.execute(f"PRAGMA foreign_key_list({quote(real)})").fetchall():
                target, src, dst = str(row[2]).lower(), str(row[3]).lower(), row[4]
                targets = [str(dst).lower()] if dst else sorted(primary.get(target, ()))
                for t in targets:
                    foreign.add(frozenset({(low, src), (target, t)}))
    keys = _Keys(primary=primary, foreign=frozenset(foreign))
    if len(_KEYS) > 64:
        _KEYS.clear()
    _KEYS[(str(db.path), stamp)] = keys
    return keys


def _stem(word: str) -> str:
    w = word.lower()
    for suffix in ("ies", "es", "s"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3:
            return w[: -len(suffix)] + ("y" if suffix == "ies" else "")
    return w


def _tokens(name: str) -> set[str]:
    parts = re.findall(r"[a-z]+|[0-9]+", re.sub(r"([a-z])([A-Z])", r"\1_\2", name).lower())
    return {_stem(t) for t in parts if t not in ("id", "code", "no", "num", "number", "key")}


def _related(a: tuple[str, str], b: tuple[str, str], keys: _Keys) -> bool:
    """A declared foreign key, or the names of a key pair: the same column name (not a bare
    ``id`` of two tables), or one side a table's key whose name the other column carries."""
    if frozenset({a, b}) in keys.foreign or a[0] == b[0]:
        return True
    (ta, ca), (tb, cb) = a, b
    if (
        ca == cb
        and ca != "id"
        and not (
            ca in keys.primary.get(ta, ())
            and cb in keys.primary.get(tb, ())
            and len(keys.primary.get(ta, ())) == 1
            and len(keys.primary.get(tb, ())) == 1
            and _tokens(ca) & (_tokens(ta) | _tokens(tb)) == set()
        )
    ):
        return True
    if ca == cb:
        return False
    for (tk, ck), (_, co) in ((a, b), (b, a)):
        # one side is a key of its table; the other column names that table (or that key)
        if ck in keys.primary.get(tk, ()) or ck == "id":
            named = _tokens(tk) | _tokens(ck)
            if named & _tokens(co):
                return True
    return False


def join_keys_related(f: FactsLike) -> CheckResult:
    """Two tables joined on columns that are no declared foreign key and not named like one
    (``battle.id = death.caused_by_ship_id``): the rows paired are unrelated, and the result
    looks plausible."""
    items = _parsed(f)
    if not items:
        return _result("join_keys_related", [], skipped="no query parses")
    keys = _keys(f.db, f.schema)
    problems: list[str] = []
    checked = 0
    for _, p, tree in items:
        for eq in tree.find_all(exp.EQ):
            a, b = eq.this, eq.expression
            if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
                continue
            ta, tb = _resolve(p, a, f.schema), _resolve(p, b, f.schema)
            if ta is None or tb is None or ta == tb:
                continue
            checked += 1
            pa, pb = (ta, a.name.lower()), (tb, b.name.lower())
            if not _related(pa, pb, keys):
                problems.append(
                    f"{a.sql()} = {b.sql()} pairs {ta}.{a.name} with {tb}.{b.name}: no declared "
                    "foreign key links them and neither names the other's table"
                )
    if not checked:
        return _result("join_keys_related", [], skipped="no join between two tables")
    return _result("join_keys_related", problems)


# -- 14. ORDER BY ... LIMIT in the question's direction ------------------------------------------

_MOST = frozenset(
    [
        "most",
        "highest",
        "largest",
        "biggest",
        "greatest",
        "maximum",
        "longest",
        "heaviest",
        "tallest",
        "latest",
        "newest",
        "richest",
        "top",
    ]
)
_LEAST = frozenset(
    [
        "least",
        "lowest",
        "smallest",
        "fewest",
        "minimum",
        "shortest",
        "lightest",
        "earliest",
        "cheapest",
        "poorest",
    ]
)
_DATE_WORDS = frozenset({"year", "date", "birth", "born", "dob", "time", "day"})


def _direction_words(question: str) -> tuple[set[str], set[str]]:
    words = _words(question)
    text = " ".join(words)
    most = {w for w in words if w in _MOST}
    least = {w for w in words if w in _LEAST}
    # "at least" / "at most" / "the most common" are thresholds or modes, not an order
    if re.search(r"\bat (least|most)\b", text):
        most.discard("most")
        least.discard("least")
    for young, old in (("youngest", "oldest"),):
        if young in words:
            least.add(young)
        if old in words:
            most.add(old)
    return most, least


def order_matches_superlative(f: FactsLike) -> CheckResult:
    """A superlative ("highest", "most", "oldest") answered by an ascending ``ORDER BY ...
    LIMIT`` (or "lowest", "fewest" by a descending one): the query returns the other end. Only
    when the question's superlatives all point one way and the top-level query orders by one
    key."""
    items = _parsed(f)
    if not items:
        return _result("order_matches_superlative", [], skipped="no query parses")
    most, least = _direction_words(f.question)
    if bool(most) == bool(least):
        return _result("order_matches_superlative", [], skipped="no one-way superlative")
    problems: list[str] = []
    checked = 0
    for i, _, tree in items:
        if not isinstance(tree, exp.Select) or tree.args.get("limit") is None:
            continue
        order = tree.args.get("order")
        if order is None or len(order.expressions) != 1:
            continue
        ordered = order.expressions[0]
        key = ordered.this
        names = {w for c in key.find_all(exp.Column) for w in _tokens(c.name)} | (
            {_stem(key.name)} if isinstance(key, exp.Column) else set()
        )
        said = most or least
        if said <= {"youngest", "oldest"}:
            # young/old: by age ascending = youngest; by a birth date or year, the reverse
            if names & _DATE_WORDS:
                said_most = bool(least)
            elif "age" in names:
                said_most = bool(most)
            else:
                continue
        elif {"latest", "earliest", "newest"} & said and not names & _DATE_WORDS:
            continue
        else:
            said_most = bool(most)
        checked += 1
        descending = bool(ordered.args.get("desc"))
        if descending != said_most:
            word = sorted(most or least)[0]
            problems.append(
                f"query {i}: the question says {word!r} but the SQL orders "
                f"{'descending' if descending else 'ascending'} by {key.sql()} and keeps the "
                "first rows: the other end"
            )
    if not checked:
        return _result("order_matches_superlative", [], skipped="no ORDER BY ... LIMIT to compare")
    return _result("order_matches_superlative", problems)


# -- 15. an empty result where the question asks for rows ----------------------------------------

_COUNTING = re.compile(r"\b(how many|number of|count|is there|are there|any)\b")


def result_not_empty(f: FactsLike) -> CheckResult:
    """Every recorded result is empty while the question asks for something (not a count):
    most often a filter that matches nothing. A warning: "which X have both ..." may be none."""
    with_rows = [p.evidence for p in f.items if p.evidence.rows is not None]
    if not with_rows:
        return _result("result_not_empty", [], skipped="no recorded result rows")
    if any(e.rows for e in with_rows) or _COUNTING.search(f.question.lower()):
        return _result("result_not_empty", [])
    return _result(
        "result_not_empty",
        ["every query returned no rows, but the question asks for some: check its filters"],
    )


# -- 16. different values when the question asks for them --------------------------------------

_DIFFERENT = re.compile(r"\b(different|distinct|unique)\b")


def distinct_when_asked(f: FactsLike) -> CheckResult:
    """The question asks for different (distinct, unique) values, and the result repeats a row:
    a join fanned the rows out and the SQL has no ``DISTINCT`` or ``GROUP BY``."""
    if not _DIFFERENT.search(f.question.lower()):
        return _result("distinct_when_asked", [])
    problems: list[str] = []
    for i, p in enumerate(f.items):
        rows = p.evidence.rows
        if not rows or len(rows) < 2 or p.evidence.truncated:
            continue
        repeated = len(rows) - len(set(rows))
        if repeated:
            problems.append(
                f"query {i} returns {repeated} repeated row(s), but the question asks for "
                "different values (no DISTINCT?)"
            )
    return _result("distinct_when_asked", problems)


# -- 17. both conditions met, not either ---------------------------------------------------------

_BOTH = re.compile(r"\b(both|shared by|in common|as well as)\b")


def _said(value: object, text: str) -> int | None:
    """Where the question says ``value`` (a ``LIKE`` pattern without its wildcards), or None."""
    words = " ".join(str(value).replace("%", " ").replace("_", " ").lower().split())
    if not words:
        return None
    found = re.search(rf"(?<![a-z0-9]){re.escape(words)}(?![a-z0-9])", text)
    return found.start() if found else None


def _either(select: exp.Select) -> Iterator[tuple[exp.Expr, exp.Expr, exp.Expr, list[object]]]:
    """``WHERE`` conjuncts that accept a row meeting either of two conditions on literals:
    ``a = 'x' OR b = 'y'``, ``x > 40 OR x < 30``, ``c IN ('x', 'y')``; each as (conjunct, the
    first condition, the second, the two literal values)."""
    where = select.args.get("where")
    if where is None:
        return
    for c in _conjuncts(where.this):
        if isinstance(c, exp.In) and isinstance(c.this, exp.Column):
            values = [e for e in c.expressions if isinstance(e, exp.Literal)]
            if len(values) == len(c.expressions) == 2 and c.args.get("query") is None:
                yield (
                    c,
                    exp.EQ(this=c.this.copy(), expression=values[0].copy()),
                    exp.EQ(this=c.this.copy(), expression=values[1].copy()),
                    [_literal(v) for v in values],
                )
        elif isinstance(c, exp.Or):
            sides = [x.unnest() if isinstance(x, exp.Paren) else x for x in (c.this, c.expression)]
            said: list[object] = []
            for side in sides:
                if (
                    isinstance(side, exp.EQ | exp.Like | exp.GT | exp.GTE | exp.LT | exp.LTE)
                    and isinstance(side.this, exp.Column)
                    and isinstance(side.expression, exp.Literal)
                ):
                    said.append(_literal(side.expression))
            if len(said) == 2:
                yield c, sides[0], sides[1], said


def _asks_both(question: str, values: Sequence[object], *, numbers_equal: bool) -> bool:
    """The question wants rows (or groups) meeting both conditions: it says "both", "shared
    by", "in common", or it names the two values joined by "and" (not "or"). Two numbers
    each matched by ``=`` ("cars made in 1970 and 1980") list either, and need "both"."""
    text = " ".join(question.lower().split())
    if _BOTH.search(text):
        return True
    if numbers_equal:
        return False
    where = [_said(v, text) for v in values]
    if None in where or len(where) != 2:
        return False
    (a, va), (b, _) = sorted(zip(where, values, strict=True), key=lambda t: t[0] or 0)
    between = text[(a or 0) + len(" ".join(str(va).replace("%", " ").split())) : b or 0]
    return bool(re.search(r"\band\b", between)) and not re.search(r"\bor\b", between)


def both_conditions_met(f: FactsLike) -> CheckResult:
    """The question asks for what meets two conditions ("the document with paragraphs 'Brazil'
    and 'Ireland'", "citizenships shared by singers born before 1945 and after 1955") and the
    SQL keeps rows meeting either (``OR``, ``IN``). One probe runs the query's twin that
    meets both (the two conditions' ``INTERSECT``): when what meets both exists and the result
    holds more rows than it, the result adds rows that meet only one. When nothing meets both
    ("singers from France and Spain": no row is both) the "and" meant either, and it passes."""
    items = _parsed(f)
    if not items:
        return _result("both_conditions_met", [], skipped="no query parses")
    problems: list[str] = []
    checked = 0
    for i, p, tree in items:
        rows = p.evidence.rows
        if not isinstance(tree, exp.Select) or not rows or p.evidence.truncated:
            continue
        if any(True for _ in tree.find_all(exp.SetOperation)) or tree.args.get("having"):
            continue
        if any(e.find(exp.AggFunc) for e in tree.expressions):
            continue  # an aggregate of rows meeting either is not a set of rows to intersect
        for conjunct, first, second, values in _either(tree):
            numbers_equal = all(isinstance(v, int | float) for v in values) and not isinstance(
                first, exp.GT | exp.GTE | exp.LT | exp.LTE
            )
            if not _asks_both(f.question, values, numbers_equal=numbers_equal):
                continue
            if checked >= MAX_TWINS:
                break
            checked += 1
            twins = []
            for side in (first, second):
                twin = tree.copy()
                rest = [c.copy() for c in _conjuncts(tree.args["where"].this) if c is not conjunct]
                twin.set("where", exp.Where(this=exp.and_(*rest, side.copy())))
                twin.set("order", None)
                twin.set("limit", None)
                twins.append(twin.sql(dialect="sqlite"))
            both = f.db.count(
                f"SELECT count(*) FROM ({twins[0]} INTERSECT {twins[1]})", (), budget_s=f.budget_s
            )
            distinct = len({tuple(map(repr, r)) for r in rows})
            if both and (distinct > both or len(rows) > distinct):
                found = f"{distinct} distinct rows" if distinct > both else "repeated rows"
                problems.append(
                    f"query {i}: the question asks for what meets both {first.sql()} and "
                    f"{second.sql()}, but {conjunct.sql()} keeps rows meeting either: "
                    f"{found} where {both} meet both (INTERSECT, or GROUP BY ... HAVING "
                    "count(DISTINCT ...) = 2)"
                )
    if not checked:
        return _result("both_conditions_met", [], skipped="no 'both' asked and 'either' answered")
    return _result("both_conditions_met", problems)


# -- 18. one answer asked, one row given --------------------------------------------------------

_SUPERLATIVE = re.compile(
    r"\b("
    + "|".join(sorted((_MOST | _LEAST | {"youngest", "oldest", "max", "min"}) - {"top"}))
    + r")\b"
)
#: words that ask for one answer per group, or several answers
_MANY = re.compile(
    r"\b(each|per|every|all|by|their|within|different|various|for which|top|ones|order|"
    r"ordered|sort|sorted|rank|\d+|two|"
    r"three|four|five|six|seven|eight|nine|ten)\b"
)


def one_answer_one_row(f: FactsLike) -> CheckResult:
    """A superlative asked once ("the lowest version number and its type", "which year had
    the most concerts") answered by a query that groups and never picks: ``GROUP BY`` with
    no ``LIMIT`` and no ``HAVING``, and more than one row. The rows are every group's value,
    not the one answer. Questions that ask per group or for several ("each", "per", "by",
    "all", "top 3", "ordered") pass."""
    text = " ".join(f.question.lower().split())
    if not _SUPERLATIVE.search(text) or re.search(r"\bat (least|most)\b", text):
        return _result("one_answer_one_row", [], skipped="no superlative")
    if _MANY.search(text):
        return _result("one_answer_one_row", [], skipped="the question asks for several")
    problems: list[str] = []
    for i, p, tree in _parsed(f):
        rows = p.evidence.rows
        if not isinstance(tree, exp.Select) or rows is None or len(rows) < 2:
            continue
        if tree.args.get("group") is None or tree.args.get("limit") or tree.args.get("having"):
            continue
        problems.append(
            f"query {i} returns {len(rows)} rows, one per group, but the question asks for one "
            "superlative answer (ORDER BY ... LIMIT 1, or no GROUP BY)"
        )
    return _result("one_answer_one_row", problems)


# -- 19. a count of the entities asked, not of join rows ----------------------------------------

_HOW_MANY = re.compile(
    r"\b(?:how many|number of|count the|count of)\s+(?:different |distinct |unique )?([a-z_]+)"
)


def _counted_table(p: ParsedLike, noun: str) -> tuple[str, str] | None:
    """The one table the query reads (alias, real name) that the counted noun names."""
    word = _stem(noun)
    found = {
        (alias, real)
        for alias, real in p.tables.items()
        if word in (_stem(real.lower()), _stem(re.split(r"[_\W]+", real.lower())[-1]))
    }
    return next(iter(found)) if len(found) == 1 else None


def _count_target(
    p: ParsedLike, projected: exp.Expr, nouns: Sequence[str]
) -> tuple[str, str] | None:
    """The table whose things this ``COUNT`` counts. One counted noun: that noun's table. Several
    ("how many singers ..., and how many concerts ..."): the noun the ``COUNT``'s alias names,
    else the one noun that names a table the query reads; None when it cannot tell."""
    if len(nouns) == 1:
        return _counted_table(p, nouns[0])
    alias = projected.alias.lower() if isinstance(projected, exp.Alias) else ""
    if alias:
        said = [n for n in nouns if _stem(n) == _stem(re.split(r"[_\W]+", alias)[-1])]
        if said:
            return _counted_table(p, said[0])
    tables = {t for t in (_counted_table(p, n) for n in nouns) if t is not None}
    return next(iter(tables)) if len(tables) == 1 else None


def count_not_fanned_out(f: FactsLike) -> CheckResult:
    """ "How many <things>" answered by ``COUNT(*)`` (or ``COUNT(column)``) over a join, where
    the join repeats a thing: one probe runs the query's twin that counts the thing's own key
    (``COUNT(DISTINCT <table>.<key>)``) and the two counts differ. The count is of join rows,
    not of the things the question counts. A question counting several things ties each
    ``COUNT`` to its own noun, and passes when it cannot tell which."""
    nouns = list(
        dict.fromkeys(m.group(1) for m in _HOW_MANY.finditer(" ".join(f.question.lower().split())))
    )
    if not nouns:
        return _result("count_not_fanned_out", [], skipped="the question counts nothing")
    keys: _Keys | None = None
    problems: list[str] = []
    checked = 0
    for i, p, tree in _parsed(f):
        rows = p.evidence.rows
        if not isinstance(tree, exp.Select) or not rows or len(rows) != 1 or tree.args.get("group"):
            continue
        if len({real.lower() for real in p.tables.values()}) < 2:
            continue
        counts = [
            (k, e)
            for k, e in enumerate(tree.expressions)
            if isinstance(e.unalias(), exp.Count)
            and not e.unalias().args.get("distinct")
            and not isinstance(e.unalias().this, exp.Distinct)
        ]
        if len(counts) != 1 or len(rows[0]) != len(tree.expressions):
            continue
        k, projected = counts[0]
        table = _count_target(p, projected, nouns)
        if table is None:
            continue
        keys = keys or _keys(f.db, f.schema)
        key = keys.primary.get(table[1].lower(), frozenset())
        if len(key) != 1 or checked >= MAX_TWINS:
            continue
        checked += 1
        twin = tree.copy()
        twin.set(
            "expressions",
            [
                exp.Count(
                    this=exp.Distinct(expressions=[exp.column(next(iter(key)), table=table[0])])
                )
            ],
        )
        twin.set("order", None)
        twin.set("limit", None)
        distinct = f.db.count(twin.sql(dialect="sqlite"), (), budget_s=f.budget_s)
        said = rows[0][k]
        if distinct is not None and isinstance(said, int) and said != distinct:
            problems.append(
                f"query {i}: {projected.sql()} counts {said} join rows, but they hold {distinct} "
                f"different {table[1]} ({table[0]}.{next(iter(key))}): the join repeats them "
                "(COUNT(DISTINCT ...))"
            )
    if not checked:
        return _result("count_not_fanned_out", [], skipped="no count over a join of the counted")
    return _result("count_not_fanned_out", problems)


# -- 20. the value ranked by, not asked for (warning) -------------------------------------------

_ASKS_VALUE = re.compile(
    r"\b(how many|count|number|total|average|amount|along with|as well as|and (its|the|their)|"
    r"with (its|the|their))\b"
)


#: "the most number of", "the fewest number of": the ranking said, not a value asked for
_RANKED_BY = re.compile(
    r"\b(most|least|fewest|highest|lowest|largest|smallest|greatest|biggest|maximum|minimum)"
    r" (total )?(number|amount|count) of\b"
)


def ranking_value_not_asked(f: FactsLike) -> CheckResult:
    """``SELECT name, COUNT(*) ... ORDER BY COUNT(*) DESC LIMIT 1`` for "which name is the most
    common": the result carries the aggregate it was ranked by, which the question does not
    ask for. A warning: the extra column is often harmless, and a benchmark's convention."""
    text = _RANKED_BY.sub(" ", " ".join(f.question.lower().split()))
    if _ASKS_VALUE.search(text):
        return _result("ranking_value_not_asked", [], skipped="the question asks for a value")
    problems: list[str] = []
    for i, _, tree in _parsed(f):
        if not isinstance(tree, exp.Select) or tree.args.get("limit") is None:
            continue
        order = tree.args.get("order")
        if order is None or len(tree.expressions) < 2:
            continue
        aliases = {
            e.alias.lower(): e.unalias() for e in tree.expressions if isinstance(e, exp.Alias)
        }
        ranked = [
            aliases.get(o.this.name.lower(), o.this)
            if isinstance(o.this, exp.Column) and not o.this.table
            else o.this
            for o in order.expressions
        ]
        extra = [
            e
            for e in tree.expressions
            if isinstance(e.unalias(), exp.AggFunc) and any(e.unalias() == r for r in ranked)
        ]
        if extra:
            problems.append(
                f"query {i} returns {extra[0].sql()}, the value it ranks by, which the question "
                "does not ask for"
            )
    return _result("ranking_value_not_asked", problems)


# -- 21. an exclusion of things, not of join rows ------------------------------------------------

_NEGATED = re.compile(r"\b(not|no|never|without|except|excluding|[a-z]+n't)\b")


def _unequal(node: exp.Expr) -> exp.NEQ | None:
    """``col <> 'x'`` (or ``NOT col = 'x'``) as one ``NEQ`` of a column and a literal."""
    node = node.unnest() if isinstance(node, exp.Paren) else node
    if isinstance(node, exp.Not):
        inner = node.this.unnest() if isinstance(node.this, exp.Paren) else node.this
        if isinstance(inner, exp.EQ):
            node = exp.NEQ(this=inner.this.copy(), expression=inner.expression.copy())
    if isinstance(node, exp.NEQ) and isinstance(node.expression, exp.Column):
        node = exp.NEQ(this=node.expression.copy(), expression=node.this.copy())
    if (
        isinstance(node, exp.NEQ)
        and isinstance(node.this, exp.Column)
        and isinstance(node.expression, exp.Literal)
    ):
        return node
    return None


def _left_unequal(conjunct: exp.Or, left: set[str]) -> exp.NEQ | None:
    """``<col> <> 'x' OR <col'> IS NULL`` on one ``LEFT JOIN``-ed table: its ``<>``."""
    sides = [
        x.unnest() if isinstance(x, exp.Paren) else x for x in (conjunct.this, conjunct.expression)
    ]
    unequal = next((u for u in map(_unequal, sides) if u is not None), None)
    if unequal is None or unequal.this.table.lower() not in left:
        return None
    if not any(
        isinstance(x, exp.Is)
        and isinstance(x.this, exp.Column)
        and x.this.table.lower() == unequal.this.table.lower()
        and isinstance(x.expression, exp.Null)
        for x in sides
    ):
        return None  # no "OR ... IS NULL": rows with another value are what it asks for
    return unequal


#: "<noun> that/which/who ... not": a negated relative clause, its noun and what follows
_NEGATED_CLAUSE = re.compile(
    r"\b([a-z]+)\s+(?:that|which|who|whose|where)\s+(?:[a-z]+\s+){0,3}?"
    r"(?:not|never|no|[a-z]+n't)\s+((?:\S+\s*){1,5})"
)


def _negates_another(question: str, unequal: exp.NEQ, p: ParsedLike, schema: Schema) -> bool:
    """The question's negated clause belongs to a thing other than the ``<>`` column's table
    and negates the ``<>``'s own value ("countries that do not speak English" with ``language
    <> 'English'``): the ``<>`` should exclude things, not rows. The clause's noun must name a
    table of the schema (not "those", "staff"), and the value must follow the negation within
    five words; "depots holding a parcel that is not delivered" negates the parcel, whose table
    holds the ``<>``, and is left alone."""
    table = _resolve(p, unequal.this, schema)
    value = _literal(unequal.expression)
    if table is None or value is None:
        return False
    own = _tokens(table) | {table}
    tables = {t: _tokens(t) | {t} for t in schema.tables}
    for m in _NEGATED_CLAUSE.finditer(" ".join(question.lower().split())):
        noun = _stem(m.group(1))
        named = any(noun in words for t, words in tables.items() if t != table)
        if named and noun not in own and _said(value, m.group(2)) is not None:
            return True
    return False


def exclusion_per_entity(f: FactsLike) -> CheckResult:
    """ "Stadiums that had no concert in 2014" answered by ``stadium LEFT JOIN concert ...
    WHERE concert.year <> 2014 OR concert.year IS NULL``: the ``<>`` drops the join rows with
    the value, and keeps the stadium through its other rows. One probe runs the query's twin
    with ``=`` for ``<>`` and intersects it with the query: a result row that is also a row of
    what has the value is what the question excludes (``NOT IN``, ``NOT EXISTS``, ``EXCEPT``).
    For ``<> ... OR ... IS NULL`` on a ``LEFT JOIN``-ed table (the query keeps the unmatched, so
    it means the things without the value, not the rows with another one), and for a plain
    ``<>`` when the question's negated clause belongs to another noun than the ``<>``'s table
    ("countries that do not speak English": ``language <> 'English'``)."""
    if not _NEGATED.search(" ".join(f.question.lower().split())):
        return _result("exclusion_per_entity", [], skipped="the question excludes nothing")
    problems: list[str] = []
    checked = 0
    for i, p, tree in _parsed(f):
        if not isinstance(tree, exp.Select) or not p.evidence.rows or p.evidence.truncated:
            continue
        if tree.args.get("group") or any(True for _ in tree.find_all(exp.SetOperation)):
            continue
        if tree.args.get("limit") is not None:
            continue  # the twin drops the LIMIT: rows past it would be counted
        left = {
            j.this.alias_or_name.lower()
            for j in tree.args.get("joins") or []
            if (j.side or "").upper() == "LEFT" and isinstance(j.this, exp.Table)
        }
        where = tree.args.get("where")
        if where is None:
            continue
        aggregated = any(e.find(exp.AggFunc) is not None for e in tree.expressions)
        for conjunct in _conjuncts(where.this):
            plain = None if aggregated else _unequal(conjunct)
            unequal: exp.NEQ | None = None
            if plain is not None and _negates_another(f.question, plain, p, f.schema):
                unequal = plain
            elif isinstance(conjunct, exp.Or) and left:
                unequal = _left_unequal(conjunct, left)
            if unequal is None:
                continue
            if checked >= MAX_TWINS:
                break
            checked += 1
            base = tree.copy()
            base.set("order", None)
            base.set("limit", None)
            twin = base.copy()
            rest = [c.copy() for c in _conjuncts(where.this) if c is not conjunct]
            equal = exp.EQ(this=unequal.this.copy(), expression=unequal.expression.copy())
            twin.set("where", exp.Where(this=exp.and_(*rest, equal)))
            kept = f.db.count(
                f"SELECT count(*) FROM ({base.sql(dialect='sqlite')} INTERSECT "
                f"{twin.sql(dialect='sqlite')})",
                (),
                budget_s=f.budget_s,
            )
            if kept:
                problems.append(
                    f"query {i}: {unequal.sql()} drops only the join rows with "
                    f"{equal.sql()}; {kept} result row(s) are also rows of what has it, kept "
                    "through other rows, though the question excludes them (NOT IN, NOT "
                    "EXISTS or EXCEPT)"
                )
    if not checked:
        return _result("exclusion_per_entity", [], skipped="no <> that excludes things")
    return _result("exclusion_per_entity", problems)


SEMANTIC_CHECKS: tuple[Callable[[FactsLike], CheckResult], ...] = (
    filter_value_exists,
    filter_satisfiable,
    join_keys_related,
    order_matches_superlative,
    result_not_empty,
    distinct_when_asked,
    both_conditions_met,
    one_answer_one_row,
    count_not_fanned_out,
    ranking_value_not_asked,
    exclusion_per_entity,
)
