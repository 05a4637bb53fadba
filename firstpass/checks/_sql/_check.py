"""The ``sql_evidence`` check kind: the twenty checks of ``_rules`` (ten, and ten semantic
ones from ``_semantic``) over an answer's evidence.

The database is named by the route's config (a request never names a file); evidence comes from
the request's ``firstpass.evidence`` when it sends one, else from its conversation's tool calls
to ``tool``. No evidence at all fails (``sql_no_evidence``): an analytics answer that cites no
query is not verified. Everything runs on the checks' own threads (SQLite and sqlglot are
blocking and CPU work).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from firstpass.checks._base import CheckRequest, Options
from firstpass.checks._offload import off_loop
from firstpass.checks._result import CheckResult, combine
from firstpass.checks._sql._db import Database, DatabaseBusy
from firstpass.checks._sql._evidence import (
    Evidence,
    Support,
    evidence_from_list,
    evidence_from_messages,
    support_from_list,
)
from firstpass.checks._sql._followup import (
    ROWS_SHOWN,
    Reconciled,
    answers_agree,
    reconcile,
    strict_facts,
    with_agreement,
)
from firstpass.checks._sql._rules import CHECKS, RULES, Facts, parse_evidence
from firstpass.checks._taxonomy import register_category
from firstpass.errors import CheckSpecError

__all__ = ["SQL_CATEGORIES", "SqlEvidenceCheck"]

SQL_CATEGORIES = {
    "sql_no_evidence": "the answer cites no SQL query (no tool call, no firstpass.evidence)",
    "sql_tables_exist": "the SQL reads a table the database does not have",
    "sql_rerun_matches": "a cheap query rerun returned other rows, or failed",
    "sql_numbers_in_evidence": "the answer states a number no result holds",
    "sql_no_sum_over_text": "SUM/AVG/TOTAL over a text column",
    "sql_string_filter_case": "an exact-case filter misses values in another casing",
    "sql_aggregate_matches_question": "the SQL's aggregate is not the question's",
    "sql_question_columns_used": "a column the question names is not in the SQL",
    "sql_join_when_two_tables": "the question spans two tables, the SQL reads one",
    "sql_date_group_not_null": "grouping by a date expression gave a NULL key",
    "sql_aggregates_attributed": "a value is told under the wrong aggregate",
    "sql_filter_value_exists": "the SQL filters on a value no row of that column holds",
    "sql_filter_satisfiable": "conditions joined by AND that no single row can meet",
    "sql_join_keys_related": "a join on columns that are no foreign key and not named like one",
    "sql_order_matches_superlative": "ORDER BY ... LIMIT runs against the question's superlative",
    "sql_result_not_empty": "the result is empty though the question asks for rows",
    "sql_distinct_when_asked": "the question asks for different values; the result repeats rows",
    "sql_both_conditions_met": "the question asks for both conditions; the SQL keeps either",
    "sql_one_answer_one_row": "one superlative answer asked; the SQL returns every group's row",
    "sql_count_not_fanned_out": "a count of join rows where the question counts distinct things",
    "sql_ranking_value_not_asked": "the result carries the aggregate it ranks by, not asked for",
    "sql_exclusion_per_entity": "a LEFT JOIN's <> keeps what the question excludes, through its "
    "other rows",
    "sql_join_keys_share_values": "a join on two columns that share no value pairs no rows",
    "sql_column_the_question_names": "the question names a column; the SQL returns a shorter "
    "sibling",
    "sql_not_in_list_without_null": "NOT IN over a subquery that returns NULL keeps no row",
    "sql_groups_by_the_entity": '"for each" thing grouped by a value things share, not its key',
}
for _name, _text in SQL_CATEGORIES.items():
    register_category(_name, _text)


@dataclass(frozen=True, kw_only=True)
class SqlEvidenceCheck:
    """``database``: the SQLite file (read-only); ``tool``/``argument``: the SQL tool's name
    and the argument holding its SQL; ``rerun_ms``: queries recorded at most this long are
    rerun; ``budget_ms``: the time one rerun (or probe of the database) may take, and half
    of what all of one run's reruns and probes may take together (past it they abstain)."""

    options: Options
    database: str | Path
    tool: str = "sql"
    argument: str = "sql"
    rerun_ms: float = 500.0
    budget_ms: float = 2000.0
    #: ``cheap``: rerun the queries the evidence says were cheap (``rerun_ms``, not
    #: truncated), as the harness reports them; ``all``: rerun every query within
    #: ``budget_ms`` whatever the evidence claims (a client that writes the evidence cannot
    #: then dodge the rerun by claiming a query was slow)
    rerun: str = "cheap"
    #: the pipeline's follow-up calls (docs/checks.md, "Follow-up calls"): a corrective
    #: re-ask when a rerun disagrees, a self-check when a warning remains
    reask: bool = True
    self_check: bool = True
    #: rows of each disagreeing rerun the re-ask shows the model (0: none, only what the
    #: check reports); the answer is served to the client, so above 0 the route's clients must
    #: be allowed to read the database (docs/checks.md, "Follow-up calls")
    reask_rows: int = 0
    kind: str = "sql_evidence"

    def __post_init__(self) -> None:
        if not isinstance(self.database, str | Path) or not str(self.database):
            raise CheckSpecError(
                "database", f"expected the SQLite file's path, got {self.database!r}"
            )
        path = Path(self.database)
        if not path.is_file():
            raise CheckSpecError("database", f"{self.database!r} is not a SQLite file")
        if not os.access(path, os.R_OK):
            raise CheckSpecError("database", f"{path} is not readable")
        for key in ("reask", "self_check"):
            if not isinstance(getattr(self, key), bool):
                raise CheckSpecError(key, f"expected true or false, got {getattr(self, key)!r}")
        rows = self.reask_rows
        if isinstance(rows, bool) or not isinstance(rows, int) or not 0 <= rows <= ROWS_SHOWN:
            raise CheckSpecError("reask_rows", f"expected 0 to {ROWS_SHOWN} rows, got {rows!r}")
        if self.rerun not in ("cheap", "all"):
            raise CheckSpecError("rerun", f'expected "cheap" or "all", got {self.rerun!r}')
        for key in ("tool", "argument"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise CheckSpecError(key, "expected a non-empty string")
        for key, most in (("rerun_ms", 60_000.0), ("budget_ms", 60_000.0)):
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= most:
                raise CheckSpecError(key, f"expected a number in (0, {most:g}], got {v!r}")
        db = Database(path, lock_wait_s=self.budget_ms / 1000.0)
        try:
            db.schema()
        except DatabaseBusy:
            pass  # a writer holds it now: the schema is read at the first run
        except Exception as exc:  # not a database, or unreadable: refuse at build
            raise CheckSpecError("database", f"{path} cannot be opened: {exc}") from exc
        object.__setattr__(self, "_db", db)

    @property
    def name(self) -> str:
        return self.options.name

    def evidence(self, request: CheckRequest) -> tuple[Evidence, ...]:
        if request.evidence:
            return evidence_from_list(list(request.evidence))
        return evidence_from_messages(request.messages, tool=self.tool, argument=self.argument)

    def support(self, request: CheckRequest) -> tuple[Support, ...]:
        """The request's support items (Python output, summaries): numbers, never rerun."""
        return support_from_list(list(request.evidence)) if request.evidence else ()

    async def run(self, answer: str, request: CheckRequest) -> CheckResult:
        return await off_loop(self.run_blocking, answer, request)

    async def reconcile(self, request: CheckRequest, result: CheckResult) -> Reconciled | None:
        """The reruns that disagreed in ``result``, rerun now, for a corrective re-ask (on a
        view of its own: its reruns and lock waits share one run's budget, as the check's do)."""
        budget_s = self.budget_ms / 1000.0
        root: Database = self.__dict__["_db"]
        db = root.for_run(budget_s)
        items = self.evidence(request)
        return await off_loop(reconcile, db, items, result, budget_s, self.reask_rows)

    async def strict_facts(self, request: CheckRequest, result: CheckResult) -> str | None:
        """What a self-check states when ``result`` holds a failed warning (else None)."""
        return await off_loop(strict_facts, request.prompt, self.evidence(request), result)

    def compared(self, result: CheckResult, first: str, second: str) -> CheckResult:
        """``result`` (of ``second``) with its numbers compared to ``first``'s."""
        return with_agreement(result, answers_agree(first, second))

    def run_blocking(self, answer: str, request: CheckRequest) -> CheckResult:
        """The check, synchronously (the CLI and the benchmarks call it so)."""
        try:
            items = self.evidence(request)
        except CheckSpecError as exc:
            return self._fail(f"the evidence is malformed: {exc}", "sql_no_evidence")
        if not items:
            return self._fail(
                f"no SQL evidence: no call to the {self.tool!r} tool in the conversation and "
                "no firstpass.evidence",
                "sql_no_evidence",
            )
        # one run's view: its waits on a writer's lock add up to one budget at most
        root: Database = self.__dict__["_db"]
        db = root.for_run(self.budget_ms / 1000.0)
        try:
            schema = db.schema()
        except DatabaseBusy as exc:
            return self._locked(str(exc))
        facts = Facts(
            question=request.prompt,
            answer=answer,
            items=parse_evidence(items),
            db=db,
            schema=schema,
            rerun_ms=self.rerun_ms,
            budget_s=self.budget_ms / 1000.0,
            rerun_all=self.rerun == "all",
            support=self.support(request),
        )
        parts = []
        for (name, severity), rule in zip(RULES, CHECKS, strict=True):
            try:
                parts.append(rule(facts))
            except Exception as exc:  # a rule that cannot run abstains at its own severity:
                # a hard check that cannot run fails closed, never a 500, never a pass
                parts.append(
                    Options(name=name, severity=severity).result(
                        self.kind,
                        verdict="abstain",
                        score=0.0,
                        reasons=(f"could not run: {type(exc).__name__}: {exc}"[:300],),
                        category="check_error",
                    )
                )
        result = combine(
            self.name,
            parts,
            kind=self.kind,
            on_abstain=self.options.on_abstain,
            severity=self.options.severity,
        )
        return result

    def _locked(self, reason: str) -> CheckResult:
        """A writer held the database past the budget before anything could be read: nothing
        was checked, and what could not be checked does not pass (every check abstains)."""
        parts = tuple(
            Options(name=name, severity=severity).result(
                self.kind,
                verdict="abstain",
                score=0.0,
                reasons=(f"could not check: {reason}",),
                category="check_error",
                details={"database_locked": True},
            )
            for name, severity in RULES
        )
        return combine(
            self.name,
            parts,
            kind=self.kind,
            on_abstain=self.options.on_abstain,
            severity=self.options.severity,
        )

    def _fail(self, reason: str, category: str) -> CheckResult:
        """A failure before any check could run: every check is listed, each skipped, so every
        result names all twenty."""
        skipped = tuple(
            Options(name=name, severity=severity).result(
                self.kind,
                verdict="pass",
                score=1.0,
                reasons=("skipped: no evidence to check",),
                details={"skipped": True},
            )
            for name, severity in RULES
        )
        return self.options.result(
            self.kind,
            verdict="fail",
            score=0.0,
            reasons=(reason,),
            category=category,
            needs_revision=True,
            parts=skipped,
        )
