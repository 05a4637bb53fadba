"""Linking checks of ``sql_evidence``: whether a query that runs reads what the question and the
data point to, on any schema.

Four mistakes that no schema's names are needed to see:

* a join on two columns that share no value (``area_code_state.area_code = votes.state``): the
  pair is not a key pair, whatever the names say, and the join pairs nothing;
* a column the question names and the query leaves for a shorter sibling ("the song names"
  answered by ``singer.Name`` beside ``singer.Song_Name``);
* ``NOT IN`` over a subquery whose list holds ``NULL``: ``x NOT IN (..., NULL)`` is never true,
  so the condition drops every row;
* "for each concert" grouped by ``concert_name`` where two concerts share a name: the groups
  merge things the question counts apart.

Each probe is one bounded query (an ``EXISTS``, a ``count(*)``) within the check's time budget;
a probe that cannot run finds nothing and passes (``Unprobed``, a writer's lock or the run's
time spent, abstains).
Imports ``_semantic`` for the shared parsing helpers; ``_rules`` imports this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

from sqlglot import exp

from firstpass.checks._result import CheckResult, Severity
from firstpass.checks._sql._db import RerunError, Unprobed, quote
from firstpass.checks._sql._parts import part_result
from firstpass.checks._sql._semantic import (
    MAX_PROBES,
    MAX_TWINS,
    FactsLike,
    _conjuncts,
    _Keys,
    _keys,
    _parsed,
    _resolve,
)

__all__ = ["LINKING_CHECKS", "LINKING_RULES"]

#: names and severities of the linking checks, after ``_semantic``'s
LINKING_RULES: tuple[tuple[str, Severity], ...] = (
    ("join_keys_share_values", "error"),
    ("column_the_question_names", "error"),
    ("not_in_list_without_null", "error"),
    ("groups_by_the_entity", "error"),
)


def _result(name: str, problems: list[str], *, skipped: str | None = None) -> CheckResult:
    return part_result(name, dict(LINKING_RULES)[name], problems[:5], skipped=skipped)


def _probe(f: FactsLike, sql: str) -> tuple[object, ...] | None:
    """One row of a probe, or None when it cannot run (an error, its budget)."""
    try:
        rows = f.db.run_params(sql, (), budget_s=f.budget_s)
    except Unprobed:
        raise
    except RerunError:
        return None
    return rows[0] if rows else None


# -- 22. a join pairs rows on columns that share a value --------------------------------------


#: words that make a column a key's (``area_code``, ``template_id``, ``flight_no``)
_KEY_WORDS = frozenset({"id", "code", "key", "no", "num", "number"})


def _scope(f: FactsLike, select: exp.Select, ctes: set[str]) -> dict[str, str] | None:
    """This ``SELECT``'s own tables (alias → lower-cased real name); None when it also reads a
    derived table, a CTE or a table the schema lacks (an unqualified column might be theirs)."""
    origin = select.args.get("from_") or select.args.get("from")  # sqlglot renamed it
    sources = [origin.this] if isinstance(origin, exp.From) else []
    sources += [j.this for j in select.args.get("joins") or []]
    scope: dict[str, str] = {}
    for source in sources:
        name = source.name.lower() if isinstance(source, exp.Table) else ""
        if not name or name in ctes or name not in f.schema.tables:
            return None
        scope[source.alias_or_name.lower()] = name
    return scope


def _in_scope(column: exp.Column, scope: Mapping[str, str], f: FactsLike) -> str | None:
    name = column.name.lower()
    if column.table:
        real = scope.get(column.table.lower())
        return real if real is not None and name in f.schema.columns.get(real, {}) else None
    owners = {t for t in scope.values() if name in f.schema.columns.get(t, {})}
    return next(iter(owners)) if len(owners) == 1 else None


def _must_meet(select: exp.Select) -> Iterator[exp.Expr]:
    """Conditions every result row meets: the ``ON`` of inner joins and the ``WHERE``, ``AND``-ed
    at the top level (not a ``LEFT JOIN``'s ``ON``, an ``OR``'s side or a ``NOT``)."""
    for join in select.args.get("joins") or []:
        inner = not join.side and (join.kind or "").upper() in ("", "INNER", "CROSS")
        if inner and join.args.get("on") is not None:
            yield from _conjuncts(join.args["on"])
    where = select.args.get("where")
    if where is not None:
        yield from _conjuncts(where.this)


def _asserted(select: exp.Select) -> bool:
    """The ``SELECT``'s rows are claimed to exist: it sits under no ``NOT`` (``NOT EXISTS``,
    ``NOT IN``) and is not what an ``EXCEPT`` takes away."""
    node: exp.Expr = select
    while node.parent is not None:
        parent = node.parent
        if isinstance(parent, exp.Not):
            return False
        if isinstance(parent, exp.Except) and parent.expression is node:
            return False
        node = parent
    return True


def _linked(
    f: FactsLike, select: exp.Select, scope: Mapping[str, str], ctes: set[str]
) -> Iterator[tuple[exp.Expr, exp.Column, str, exp.Column, str]]:
    """The column pairs a ``SELECT``'s rows are linked on: ``a.x = b.y`` that every row must
    meet, and ``a.x IN (SELECT b.y FROM b …)`` (the subquery's column resolved in its own
    tables), as ``(condition, column, its table, column, its table)``."""
    for cond in _must_meet(select):
        if isinstance(cond, exp.EQ):
            a, b = cond.this, cond.expression
            if isinstance(a, exp.Column) and isinstance(b, exp.Column):
                ta, tb = _in_scope(a, scope, f), _in_scope(b, scope, f)
                if ta is not None and tb is not None and ta != tb:
                    yield cond, a, ta, b, tb
            continue
        member = cond  # NOT IN is left alone: a zip code no store has rightly excludes nothing
        sub = member.args.get("query") if isinstance(member, exp.In) else None
        inner = sub.this if isinstance(sub, exp.Subquery) else sub
        if not isinstance(inner, exp.Select) or not isinstance(member.this, exp.Column):
            continue
        if len(inner.expressions) != 1 or not isinstance(inner.expressions[0], exp.Column):
            continue
        inner_scope = _scope(f, inner, ctes)
        ta = _in_scope(member.this, scope, f)
        tb = _in_scope(inner.expressions[0], inner_scope, f) if inner_scope else None
        if ta is not None and tb is not None and ta != tb:
            yield cond, member.this, ta, inner.expressions[0], tb


def _keyish(table: str, column: str, keys: _Keys) -> bool:
    return column in keys.primary.get(table, ()) or bool(_KEY_WORDS & set(_name_words(column)))


def join_keys_share_values(f: FactsLike) -> CheckResult:
    """Two tables joined on key columns that hold values but none in common: no row of one
    meets a row of the other, so the join pairs nothing (a text code joined to an integer id,
    an area code to a state). Only a condition every result row must meet (an inner join's
    ``ON``, a ``WHERE`` conjunct) of a ``SELECT`` whose rows are claimed (no ``NOT EXISTS``, no
    ``EXCEPT``'s right side), resolved in that ``SELECT``'s own tables, with one side a key (a
    primary key, or a column named ``…_id``/``…_code``): two names that never meet ("readers
    who are authors") may rightly give "none". A declared foreign key is left alone. One probe
    per pair: ``EXISTS`` a value on each side, and ``EXISTS`` a pair that meets."""
    items = _parsed(f)
    if not items:
        return _result("join_keys_share_values", [], skipped="no query parses")
    keys = _keys(f.db, f.schema)
    problems: list[str] = []
    seen: set[frozenset[tuple[str, str]]] = set()
    for _, _p, tree in items:
        ctes = {c.alias_or_name.lower() for c in tree.find_all(exp.CTE)}
        for select in tree.find_all(exp.Select):
            scope = _scope(f, select, ctes) if _asserted(select) else None
            if not scope:
                continue
            for node, a, ta, b, tb in _linked(f, select, scope, ctes):
                ca_, cb_ = a.name.lower(), b.name.lower()
                pair = frozenset({(ta, ca_), (tb, cb_)})
                if pair in keys.foreign or pair in seen or len(seen) >= MAX_PROBES:
                    continue
                declared = ca_ in keys.primary.get(ta, ()) or cb_ in keys.primary.get(tb, ())
                if not declared and (
                    isinstance(node, exp.In)
                    or not (_keyish(ta, ca_, keys) or _keyish(tb, cb_, keys))
                ):
                    continue  # an IN needs a declared key: "zip codes where a store is"
                seen.add(pair)
                real_a, real_b = f.schema.tables[ta], f.schema.tables[tb]
                ca, cb = quote(a.name), quote(b.name)
                row = _probe(
                    f,
                    f"SELECT EXISTS (SELECT 1 FROM {quote(real_a)} WHERE {ca} IS NOT NULL), "
                    f"EXISTS (SELECT 1 FROM {quote(real_b)} WHERE {cb} IS NOT NULL), "
                    f"EXISTS (SELECT 1 FROM {quote(real_a)} AS x JOIN {quote(real_b)} AS y "
                    f"ON x.{ca} = y.{cb})",
                )
                if row is not None and row[0] and row[1] and not row[2]:
                    problems.append(
                        f"{node.sql()}: no value of {ta}.{a.name} equals any value of "
                        f"{tb}.{b.name}, so the condition pairs no rows; they are not a key "
                        "pair (join on a foreign key)"
                    )
    if not seen:
        return _result("join_keys_share_values", [], skipped="no join on a pair to probe")
    return _result("join_keys_share_values", problems)


# -- 23. the column the question names, not a shorter sibling ----------------------------------


def _stem(word: str) -> str:
    """A plural's singular, enough to meet a column's words ("names", "countries", "boxes")."""
    for plural, singular in (("ies", "y"), ("ches", "ch"), ("shes", "sh"), ("xes", "x"), ("s", "")):
        if word.endswith(plural) and not word.endswith("ss") and len(word) - len(plural) >= 2:
            return word[: -len(plural)] + singular
    return word


def _name_words(name: str) -> list[str]:
    """A column's name as stemmed words (``Song_release_year`` → song, release, year)."""
    spaced = re.sub(r"([a-z])([A-Z])", r"\1 \2", name)
    return [_stem(w) for w in re.findall(r"[a-z]+|[0-9]+", spaced.lower())]


#: words before a name that leave it unqualified ("the name", "and name"), unlike "stadium name"
_UNQUALIFIED = frozenset(
    ("the", "a", "an", "its", "their", "his", "her", "all", "and", "or", "what", "which", "show",
     "list", "give", "return", "find")
)  # fmt: skip


#: words that may follow a noun phrase's head: a possessive "s" or another noun may not
_CLAUSE_WORDS = frozenset(
    ("by", "of", "in", "on", "at", "for", "from", "with", "and", "or", "that", "which", "who",
     "whose", "where", "when", "is", "are", "was", "were", "has", "have", "had", "did", "do",
     "does", "sorted", "ordered", "order", "released", "ranked", "to", "as", "than")
)  # fmt: skip


def _says(question: list[str], longer: list[str], shorter: list[str]) -> bool:
    """The question says the longer name as a phrase: its words in order ("song names",
    "release year"), or the shorter's words, then (within six words, the first "of" or "for")
    "of [the|a|each|all|every] <the rest>" ("the name of the song", "the name and the release
    year of the song", "the names and release years for all the songs")."""
    n = len(longer)
    if any(question[i : i + n] == longer for i in range(len(question) - n + 1)):
        return True
    rest = [w for w in longer if w not in shorter]
    m = len(shorter)
    for i in range(len(question) - m + 1):
        if question[i : i + m] != shorter or (i and question[i - 1] not in _UNQUALIFIED):
            continue  # "the stadium name ... of concerts": the name is the stadium's
        after = question[i + m : i + m + 7]
        linked = [k for k, w in enumerate(after) if w in ("of", "for")]
        if not linked:
            continue
        j = i + m + linked[0] + 1
        while j < len(question) and question[j] in ("the", "a", "an", "each", "all", "every"):
            j += 1
        end = j + len(rest)
        if question[j:end] == rest and (end == len(question) or question[end] in _CLAUSE_WORDS):
            return True  # not "the name for every concert's stadium", "song writer"
    return False


def column_the_question_names(f: FactsLike) -> CheckResult:
    """The question names a column ("the song names", "the name of the song": ``Song_Name``)
    and the query returns a shorter sibling whose words are a part of it (``Name``), never
    reading the named one: a singer's name for the song's. Only columns of tables the query
    reads are candidates, and only a name of two or more words said as a phrase."""
    items = _parsed(f)
    if not items:
        return _result("column_the_question_names", [], skipped="no query parses")
    question = [_stem(w) for w in re.findall(r"[a-z0-9]+", f.question.lower())]
    problems: list[str] = []
    checked = 0
    for _, p, tree in items:
        if not isinstance(tree, exp.Select):
            continue
        read = {c.name.lower() for c in tree.find_all(exp.Column)}
        tables = sorted({t.lower() for t in p.tables.values()})
        for projected in tree.expressions:
            column = projected.unalias()
            if not isinstance(column, exp.Column) or not column.name:
                continue
            shorter = _name_words(column.name)
            if not shorter:
                continue
            checked += 1
            own = _resolve(p, column, f.schema)
            own_words = set(_name_words(f.schema.tables.get(own, own))) if own else set()
            for table in tables:
                for name in f.schema.columns.get(table, {}):
                    longer = _name_words(name)
                    if (
                        name in read
                        or len(longer) <= len(shorter)
                        or not set(shorter) < set(longer)
                        or longer[-len(shorter) :] != shorter  # the same head noun
                        or not _says(question, longer, shorter)
                        or set(longer) - set(shorter) <= own_words  # "the customer's name"
                    ):
                        continue
                    problems.append(
                        f"the question names {table}.{name}; the query returns "
                        f"{column.sql()} and never reads {name}"
                    )
    if not checked:
        return _result("column_the_question_names", [], skipped="no column returned")
    return _result("column_the_question_names", list(dict.fromkeys(problems)))


# -- 24. NOT IN over a list without NULL -------------------------------------------------------


def not_in_list_without_null(f: FactsLike) -> CheckResult:
    """``x NOT IN (SELECT y ...)`` where the subquery returns a ``NULL``: ``x NOT IN`` a list
    holding ``NULL`` is never true, so the condition drops every row (``NOT EXISTS`` or ``WHERE
    y IS NOT NULL`` is what was meant). One probe: the subquery's twin that keeps only its
    ``NULL`` values (a correlated subquery does not run alone, and passes)."""
    items = _parsed(f)
    if not items:
        return _result("not_in_list_without_null", [], skipped="no query parses")
    problems: list[str] = []
    checked = 0
    for _, _p, tree in items:
        conjuncts = {
            id(c)
            for select in tree.find_all(exp.Select)
            if select.args.get("where") is not None
            for c in _conjuncts(select.args["where"].this)
        }
        for node in tree.find_all(exp.In):
            sub = node.args.get("query")
            if not isinstance(node.parent, exp.Not) or sub is None or checked >= MAX_PROBES:
                continue
            if id(node.parent) not in conjuncts:
                continue  # under an OR or another NOT: the rows may come from elsewhere
            select = sub.this if isinstance(sub, exp.Subquery) else sub
            if not isinstance(select, exp.Select) or len(select.expressions) != 1:
                continue
            if select.args.get("group") or select.args.get("limit"):
                continue
            value = select.expressions[0].unalias()
            if value.find(exp.AggFunc) is not None:
                continue
            checked += 1
            twin = select.copy()
            twin.set("expressions", [exp.Literal.number(1)])
            twin.set("order", None)
            twin.where(exp.Is(this=value.copy(), expression=exp.Null()), copy=False)
            row = _probe(f, f"SELECT EXISTS ({twin.sql(dialect='sqlite')})")
            if row is not None and row[0]:
                fix = (
                    ""
                    if isinstance(value, exp.Null)
                    else f"add WHERE {value.sql()} IS NOT NULL, or "
                )
                problems.append(
                    f"{node.parent.sql()}: the subquery returns NULL, and NOT IN a list "
                    f"holding NULL is never true: the condition keeps no row ({fix}use NOT "
                    "EXISTS)"
                )
    if not checked:
        return _result("not_in_list_without_null", [], skipped="no NOT IN over a subquery")
    return _result("not_in_list_without_null", problems)


# -- 25. "for each <thing>" grouped by the thing, not by a name it shares ---------------------

_EACH = re.compile(r"\b(?:each|every|per)\s+([a-z]+)(?:\s+([a-z]+))?")


def _table_named(noun: str, tables: Mapping[str, str]) -> str | None:
    """The alias of the one table the query reads whose name is the noun ("stadium")."""
    hits = [alias for alias, real in tables.items() if _name_words(real) == [noun]]
    return hits[0] if len(set(tables[a].lower() for a in hits)) == 1 else None


def groups_by_the_entity(f: FactsLike) -> CheckResult:
    """ "For each concert, ..." grouped by ``concert.concert_name``, where two concerts share a
    name: the groups merge things the question counts apart. Only when the question says "each
    <noun>" (or "every", "per") of a table the query reads, and the ``GROUP BY`` reads that
    table's columns but neither its key nor a column the query equates with it. One probe: the
    query's twin grouped by the key too; more groups than the query's own means merged things."""
    said = {
        (_stem(m.group(1)), _stem(m.group(2) or ""))
        for m in _EACH.finditer(" ".join(f.question.lower().split()))
    }
    if not said:
        return _result("groups_by_the_entity", [], skipped='the question says no "each"')
    keys: _Keys | None = None
    problems: list[str] = []
    checked = 0
    for i, p, tree in _parsed(f):
        group = tree.args.get("group") if isinstance(tree, exp.Select) else None
        if group is None or checked >= MAX_TWINS or tree.find(exp.SetOperation) is not None:
            continue
        columns = [g for g in group.expressions if isinstance(g, exp.Column)]
        if len(columns) != len(group.expressions):
            continue
        for noun, then in sorted(said):
            alias = _table_named(noun, p.tables)
            if alias is None:
                continue
            real = p.tables[alias].lower()
            if then and any(
                then in _name_words(c) or then in c.replace("_", "")  # names are lower-cased
                for c in f.schema.columns.get(real, {})
            ):
                continue  # "each author name", "each pet type": that is what is grouped by
            keys = keys or _keys(f.db, f.schema)
            key = keys.primary.get(real, frozenset())
            if len(key) != 1:
                continue
            (pk,) = key
            same: set[tuple[str | None, str]] = {
                (real, pk)
            }  # the key, and every column a condition equates with it
            for eq in tree.find_all(exp.EQ):
                a, b = eq.this, eq.expression
                if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
                    continue
                pa = (_resolve(p, a, f.schema), a.name.lower())
                pb = (_resolve(p, b, f.schema), b.name.lower())
                if pa in same or pb in same:
                    same |= {pa, pb}
            grouped = {(_resolve(p, c, f.schema), c.name.lower()) for c in columns}
            if grouped & same or not any(t == real for t, _ in grouped):
                continue
            checked += 1
            base = tree.copy()
            base.set("order", None)
            base.set("limit", None)
            twin = base.copy()
            twin.set(
                "group",
                exp.Group(expressions=[*(c.copy() for c in columns), exp.column(pk, table=alias)]),
            )
            counts = _probe(
                f,
                f"SELECT (SELECT count(*) FROM ({base.sql(dialect='sqlite')})), "
                f"(SELECT count(*) FROM ({twin.sql(dialect='sqlite')}))",
            )
            if (
                counts is not None
                and isinstance(counts[0], int)
                and isinstance(counts[1], int)
                and counts[1] > counts[0]
            ):
                problems.append(
                    f"query {i}: GROUP BY {', '.join(c.sql() for c in columns)} merges "
                    f"{real} that share those values ({counts[0]} groups; by "
                    f"{real}.{pk} too, {counts[1]}): the question asks per {noun} "
                    f"(GROUP BY {alias}.{pk})"
                )
            break
    if not checked:
        return _result("groups_by_the_entity", [], skipped='no group of an "each" by a non-key')
    return _result("groups_by_the_entity", problems)


LINKING_CHECKS: tuple[Callable[[FactsLike], CheckResult], ...] = (
    join_keys_share_values,
    column_the_question_names,
    not_in_list_without_null,
    groups_by_the_entity,
)
