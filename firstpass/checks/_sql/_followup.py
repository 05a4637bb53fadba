"""What the pipeline's follow-up calls need from an ``sql_evidence`` result (docs/checks.md,
"Follow-up calls"): the reruns that disagreed with the recorded rows (for the corrective
re-ask, and the evidence its answer is checked against), the recorded results and the warnings
(for the self-check), and the numeric comparison of a second answer with the first.

Blocking (SQLite): the check runs these on its own threads (``off_loop``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from firstpass.checks._base import Options
from firstpass.checks._result import CheckResult
from firstpass.checks._sql._db import Database, RerunError
from firstpass.checks._sql._evidence import MAX_ROWS, Cell, Evidence
from firstpass.checks._sql._evidence import _cell as to_cell
from firstpass.checks._sql._numbers import holds, stated_numbers
from firstpass.checks._taxonomy import register_category

__all__ = ["AGREE", "Reconciled", "answers_agree", "reconcile", "strict_facts", "with_agreement"]

#: the part a second answer's result gains: its numbers against the first answer's
AGREE = "answers_agree"
register_category(f"sql_{AGREE}", "a follow-up answer states other numbers than the first")

#: the most rows of one rerun a re-ask may quote to the model (``reask_rows`` is at most this),
#: and characters of all the facts together
ROWS_SHOWN = 30
FACTS_CHARS = 12_000
#: numbers compared per answer (the comparison is quadratic in them)
NUMBERS_COMPARED = 200


@dataclass(frozen=True, kw_only=True, slots=True)
class Reconciled:
    """What a re-ask states (``facts``: each query whose rerun disagreed, and what the check
    reported of it, or, when the operator opted in, the rows it returns now) and the SQL
    evidence the reconciled answer is checked against: the recorded evidence with those
    queries' rows replaced by the rerun's when they were shown, else left out (the model was
    not told them), and a query that fails now left out (it supports nothing)."""

    facts: str
    evidence: tuple[Mapping[str, object], ...]


def _rows_text(
    columns: Sequence[str], rows: Sequence[Sequence[object]], most: int = ROWS_SHOWN
) -> str:
    shown = [json.dumps(list(r), ensure_ascii=False, default=str) for r in rows[:most]]
    more = f"\n    ... and {len(rows) - most} more rows" if len(rows) > most else ""
    head = f"    columns: {json.dumps(list(columns), ensure_ascii=False)}\n" if columns else ""
    return head + "\n".join(f"    {line}" for line in shown) + more


def _cut(text: str) -> str:
    return text if len(text) <= FACTS_CHARS else text[: FACTS_CHARS - 3] + "..."


def _as_item(e: Evidence) -> dict[str, object]:
    item: dict[str, object] = {"sql": e.sql, "columns": list(e.columns), "truncated": e.truncated}
    if e.rows is not None:
        item["rows"] = [list(r) for r in e.rows]
    if e.elapsed_ms is not None:
        item["elapsed_ms"] = e.elapsed_ms
    return item


def _part(result: CheckResult, name: str) -> CheckResult | None:
    return next((p for p in result.parts if p.name == name), None)


def _reported(part: CheckResult, i: int) -> str:
    """What ``rerun_matches`` reported of query ``i`` (its reason, without the query's
    number): all a re-ask that shows no rows states of it."""
    prefix = f"query {i} "
    said = [r[len(prefix) :] for r in part.reasons if r.startswith(prefix)]
    return "; ".join(said) or "returned other rows when rerun"


def reconcile(
    db: Database,
    items: Sequence[Evidence],
    result: CheckResult,
    budget_s: float,
    rows_shown: int = 0,
) -> Reconciled | None:
    """The queries ``rerun_matches`` found disagreeing (``details["disagreed"]``); None when
    it did not fail, names no query, or no query is left to support an answer (no reconciled
    answer could pass, so no call is made for one).

    ``rows_shown`` 0 (the default): the facts state only what the check reported (each
    query's SQL, its recorded row count, the rerun's row count or error) and nothing is rerun:
    the SQL came from the client, so its rerun rows may be data the client may not read, and
    the re-ask's answer is served to the client. Above 0 (the operator's ``reask_rows``): each
    query is rerun now and at most that many of its rows (``ROWS_SHOWN`` at most) are stated."""
    part = _part(result, "rerun_matches")
    if part is None or part.passed:
        return None
    named = part.details.get("disagreed")
    failed = sorted(
        {i for i in (named if isinstance(named, list) else ()) if isinstance(i, int)}
        & set(range(len(items)))
    )
    if not failed:
        return None
    most = max(0, min(rows_shown, ROWS_SHOWN))
    blocks: list[str] = []
    evidence: list[Mapping[str, object]] = []
    for i, e in enumerate(items):
        if i not in failed:
            evidence.append(_as_item(e))
            continue
        recorded = "no rows recorded" if e.rows is None else f"{len(e.rows)} rows recorded"
        head = f"Query {i} ({recorded}):\n    {e.sql}\n"
        if not most:
            blocks.append(f"{head}  {_reported(part, i)} (its rows now are not shown)")
            continue
        t0 = time.perf_counter()
        try:
            rows = db.run(e.sql, budget_s=budget_s, max_rows=MAX_ROWS)
        except RerunError as exc:
            blocks.append(f"{head}  now fails: {exc}")
            continue
        ms = (time.perf_counter() - t0) * 1000.0
        cells: list[list[Cell]] = [[to_cell(c) for c in r] for r in rows]
        blocks.append(
            f"{head}  returns now {len(cells)} rows:\n" + _rows_text(e.columns, cells, most)
        )
        evidence.append(
            {
                "sql": e.sql,
                "columns": list(e.columns),
                "rows": cells,
                "elapsed_ms": ms,
                "truncated": len(cells) >= MAX_ROWS,
            }
        )
    if not evidence:
        return None
    return Reconciled(facts=_cut("\n\n".join(blocks)), evidence=tuple(evidence))


def strict_facts(question: str, items: Sequence[Evidence], result: CheckResult) -> str | None:
    """The question, each query with its recorded rows, and the reasons of the warnings that
    failed: what a self-check states; None when no warning failed."""
    warnings = [
        f"{p.name}: {reason}"
        for p in result.parts
        if p.severity == "warning" and not p.passed and p.name != AGREE
        for reason in (p.reasons or ("failed",))
    ]
    if not warnings:
        return None
    queries = [
        f"Query {i}:\n    {e.sql}\n  "
        + (
            "no rows recorded"
            if e.rows is None
            else f"returned {len(e.rows)} rows:\n" + _rows_text(e.columns, e.rows)
        )
        for i, e in enumerate(items)
    ]
    text = (
        f"Question: {question}\n\nWarnings:\n"
        + "\n".join(f"- {w}" for w in warnings)
        + "\n\n"
        + "\n\n".join(queries)
    )
    return _cut(text)


def answers_agree(first: str, second: str) -> CheckResult:
    """A second answer's numbers against the first's (each as written, to its digits): a number
    only one of them states is a disagreement, reported as a ``warning`` part; it never decides
    a verdict (deterministic verification does)."""
    a = stated_numbers(first)[:NUMBERS_COMPARED]
    b = stated_numbers(second)[:NUMBERS_COMPARED]
    added = [n.text for n in b if not holds(n, [m.value for m in a])]
    dropped = [m.text for m in a if not holds(m, [n.value for n in b])]
    problems = [f"the second answer states {t}, which the first did not" for t in added[:5]]
    problems += [f"the first answer stated {t}, which the second does not" for t in dropped[:5]]
    options = Options(name=AGREE, severity="warning")
    details: dict[str, object] = {"agree": not problems, "first": len(a), "second": len(b)}
    if not problems:
        return options.result("sql_evidence", verdict="pass", score=1.0, details=details)
    return options.result(
        "sql_evidence",
        verdict="fail",
        score=0.0,
        reasons=tuple(problems),
        category=f"sql_{AGREE}",
        details=details,
    )


def with_agreement(result: CheckResult, agree: CheckResult) -> CheckResult:
    """``result`` with the ``answers_agree`` part added (a warning: the verdict stays)."""
    return replace(
        result,
        parts=(*result.parts, agree),
        reasons=(*result.reasons, *(f"{agree.name}: {r}" for r in agree.reasons)),
    )
